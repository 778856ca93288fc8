"""A real two-node Ray cluster on this machine: `ray start --head` and `ray start --address`
on loopback (127.0.0.2 and 127.0.0.3), `onnx-tts serve --ray --ray-address` deploying to it,
one replica per node; bounded in time, every process stopped by id at the end, even on failure.
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from benchmarks.live_server import LiveServer
from benchmarks.ray_cluster import RayCluster
from tests.test_ray_serve import TEXT, _on_two_replicas, _replica_processes, _wait_for_replicas
from tests.waiting import wait_until

NODES = ("127.0.0.2", "127.0.0.3")


def test_two_node_cluster_places_replicas_on_both_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = RayCluster(tmp_path / "cluster", workers=1, cpus=1)
    server = None
    replicas: dict[int, str | None] = {}
    try:
        for name, value in cluster.env.items():
            if os.environ.get(name) != value:
                monkeypatch.setenv(name, value)
        server = LiveServer(
            tmp_path / "driver",
            *("--ray", "--ray-address", cluster.address, "--replicas", "2"),
            *("--replica-cpus", "1"),
        )

        def on_our_nodes() -> bool:  # /health answers once one replica is up
            replicas.clear()
            for process in _replica_processes():
                if (node := _node_of(process)) in NODES:
                    replicas[process.pid] = node
            return len(replicas) == 2

        wait_until(on_our_nodes, "two replicas run on the cluster's nodes", poll_seconds=1)
        assert sorted(replicas.values()) == sorted(NODES), server.log()[-2000:]
        _wait_for_replicas(server, 2)  # both routed to, not only started
        answers = _on_two_replicas(server, input=TEXT, response_format="pcm", seed=21)
        first, second = (r.content for r in answers.values())
        assert first == second
    finally:
        if server is not None:
            server.stop()
        cluster.stop()
    assert not [pid for pid in replicas if psutil.pid_exists(pid)]
    assert not [p for p in _replica_processes() if _node_of(p) in NODES]


def _node_of(replica: psutil.Process) -> str | None:
    """The node IP of the raylet a replica runs under."""
    try:
        raylet = psutil.Process(replica.ppid()).cmdline()
    except psutil.NoSuchProcess:
        return None
    flags = [a.split("=", 1)[1] for a in raylet if a.startswith("--node_ip_address=")]
    return flags[0] if flags else None

"""A real Ray cluster on this machine for tests and `bench scale`: a head and more nodes
started with `ray start` on loopback, each in its own process group, every process stopped by
id when the cluster closes (even after a failure), never `ray stop` (which would end every Ray
on the machine).

Every node gets its own ports (nodes on one machine share an IP), a small object store and no
dashboard; the proxies run on the head only (one HTTP port per IP).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.live_server import free_port
from onnx_tts.deploy.ray import PROXY_CHECK_SECONDS

OBJECT_STORE_BYTES = 80 * 1000 * 1000  # Ray's minimum is 75 MB
# A bound on the wait for the nodes, not a speed claim (Ray starts slowly on busy cores).
START_SECONDS = 600
HEAD_IP_LAST = 2  # the head is 127.0.0.2, the next node 127.0.0.3, ...
STOP_SECONDS = 20


class RayCluster:
    """`ray start --head` plus `workers` more nodes, `cpus` CPUs each, on loopback."""

    def __init__(self, workdir: Path, workers: int = 1, cpus: float = 1) -> None:
        self.workdir = workdir
        self.temp_dir = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # short: socket paths
        self.port = free_port()
        self.head_ip = f"127.0.0.{HEAD_IP_LAST}"
        self.address = f"{self.head_ip}:{self.port}"
        self.processes: list[subprocess.Popen] = []
        workdir.mkdir(parents=True, exist_ok=True)
        # Ray's token authentication, with a token of this cluster's own that every node and
        # driver is given (as a real cluster distributes it), never the user's ~/.ray one.
        token = workdir / "ray_auth_token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        self.env = {
            **os.environ,
            "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": "onnx_tts.deploy.proxy:middlewares",
            # One proxy (on the head) spreads requests over every node's replicas, instead of
            # filling the head's first.
            "RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING": "0",
            **PROXY_CHECK_SECONDS,  # as `serve --ray` gives a cluster it starts
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token),
        }
        try:
            self._start_node(head=True, cpus=cpus)
            self._wait_for_nodes(1)
            for _ in range(workers):
                self._start_node(head=False, cpus=cpus)
            self._wait_for_nodes(1 + workers)
        except BaseException:
            self.stop()
            raise

    def _start_node(self, head: bool, cpus: float) -> None:
        # Ray's own CLI module, run by this interpreter (no console script on PATH needed).
        command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block"]
        command += ["--num-cpus", str(cpus), "--object-store-memory", str(OBJECT_STORE_BYTES)]
        command += ["--disable-usage-stats"]
        ports = {
            "--node-manager-port": free_port(),
            "--object-manager-port": free_port(),
            "--metrics-export-port": free_port(),
            "--dashboard-agent-listen-port": free_port(),
            "--dashboard-agent-grpc-port": free_port(),
            "--runtime-env-agent-port": free_port(),
        }
        # Each node its own loopback address, as machines have their own: Ray would turn
        # 127.0.0.1 itself into the machine's outward address, and any other 127.x stays.
        command += ["--node-ip-address", f"127.0.0.{HEAD_IP_LAST + len(self.processes)}"]
        if head:
            command += ["--head", "--port", str(self.port), "--include-dashboard", "false"]
            command += ["--ray-client-server-port", str(free_port())]
            command += ["--temp-dir", str(self.temp_dir)]
        else:
            command += ["--address", self.address]
        for flag, port in ports.items():
            command += [flag, str(port)]
        name = "head" if head else f"worker-{len(self.processes)}"
        log = open(self.workdir / f"ray-{name}.log", "wb")  # noqa: SIM115 - the child keeps it
        with log:
            self.processes.append(
                subprocess.Popen(
                    command, stdout=log, stderr=log, env=self.env, start_new_session=True
                )
            )

    def _wait_for_nodes(self, count: int) -> None:
        deadline = time.monotonic() + START_SECONDS
        last: list[str] = []
        probe = (
            f"import ray; ray.init(address={self.address!r}, _node_ip_address={self.head_ip!r}, "
            "logging_level='error'); print(sum(1 for n in ray.nodes() if n['Alive']))"
        )
        while time.monotonic() < deadline:
            for process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(
                        f"a Ray node exited with {process.returncode}:\n{self.log()}"
                    )
            result = subprocess.run(
                [sys.executable, "-c", probe],
                capture_output=True,
                text=True,
                env=self.env,
                timeout=START_SECONDS,
            )
            if result.returncode == 0 and result.stdout.strip().splitlines()[-1:] == [str(count)]:
                return
            last = result.stderr.strip().splitlines()[-1:]
            time.sleep(1)
        raise RuntimeError(f"the Ray cluster did not reach {count} nodes ({last}):\n{self.log()}")

    def log(self) -> str:
        return "\n".join(
            f"== {path.name}\n{path.read_text(errors='replace')[-3000:]}"
            for path in sorted(self.workdir.glob("ray-*.log"))
        )

    def stop(self) -> None:
        """Stop every node: SIGTERM to each node's process group, SIGKILL what is left (Ray's
        workers, which run in groups of their own, found as descendants before anything
        stops)."""
        import psutil

        descendants = []
        for process in self.processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                descendants += psutil.Process(process.pid).children(recursive=True)
        for process in reversed(self.processes):
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + STOP_SECONDS
        for process in reversed(self.processes):
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.1, deadline - time.monotonic()))
        for process in self.processes:
            _signal_group(process, signal.SIGKILL)
            if process.poll() is None:
                process.wait(5)
        _, alive = psutil.wait_procs(descendants, timeout=5)
        for child in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        psutil.wait_procs(alive, timeout=5)
        self.processes.clear()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)

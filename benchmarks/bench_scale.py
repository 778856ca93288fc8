"""Scale-out benchmark (issue 31): the `bench serve` load on one process and on Ray Serve.

``onnx-tts bench scale`` wraps :func:`main`; it also runs as ``python benchmarks/bench_scale.py``.

Setups, each a live server on a free loopback port and the same clients as `bench serve`
(streaming pcm, default voice, every client a real-time player): ``single`` (`onnx-tts serve`,
the baseline), ``ray-1`` (`--ray`, one replica of 2 CPUs), ``ray-2`` (two replicas of 1 CPU)
and ``ray-2-nodes`` (two replicas on a two-node `ray start` cluster on loopback). Every Ray
setup shares one Redis (result cache, voices). Per setup and client count: audio s/s, time to
first audio p50/p95, underruns, errors; per setup: the proxy's cost on first audio (TTFA p50 at
one client minus `single`'s) and the cross-replica result-cache hit rate (a seeded text through
one replica, then the same request until another replica answers it: hits counted by the
replicas' own /metrics). On this 2-core machine every setup shares the same two cores, so
throughput cannot grow with replicas here; the JSON says what was measured, docs/DEPLOYMENT.md turns
streams per core into a capacity model.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

if __package__ in (None, ""):  # run as a script: make `benchmarks` and `onnx_tts` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import live_server
from benchmarks.bench_cache import redis_for_benchmark
from benchmarks.bench_serve import run_level, warm_up
from benchmarks.live_server import LiveServer
from benchmarks.ray_cluster import RayCluster
from benchmarks.results_io import load_average, machine_info, save_figure, write_json

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPLICA_HEADER = "x-onnx-tts-replica"
SETUPS = ("single", "ray-1", "ray-2", "ray-2-nodes")
CACHE_TEXTS = 6
MAX_TRIES = 30


def start(
    setup: str, work: Path, redis_url: str | None, stack: ExitStack, result_cache: bool = False
) -> LiveServer:
    """The setup's server; the load runs with no result cache (every request synthesised, as
    in `bench serve`), the cache probe with one only in Redis (shared, nothing per replica)."""
    common = ["--log-level", "warning"]
    if redis_url and setup != "single":
        common += ["--redis", redis_url]
    if result_cache:
        common += ["--result-cache-mb", "0", "--result-cache-dir", "none"]
    if setup == "single":
        server = LiveServer(work / setup, *common)
    elif setup == "ray-1":
        server = LiveServer(
            work / setup, *common, "--ray", "--replicas", "1", "--replica-cpus", "2"
        )
    elif setup == "ray-2":
        server = LiveServer(
            work / setup, *common, "--ray", "--replicas", "2", "--replica-cpus", "1"
        )
    else:
        cluster = RayCluster(work / "cluster", workers=1, cpus=1)
        stack.callback(cluster.stop)
        saved = dict(os.environ)
        os.environ.update(cluster.env)  # the driver joins with the cluster's token
        try:
            server = LiveServer(
                work / setup, *common, "--ray", "--ray-address", cluster.address,
                "--replicas", "2", "--replica-cpus", "1",
            )  # fmt: skip
        finally:
            os.environ.clear()
            os.environ.update(saved)
    stack.callback(server.stop)
    return server


def replica_metric(url: str, name: str, **labels: str) -> dict[str, float]:
    """One metric as each replica reports it (GET /metrics until every replica answered)."""
    from tests.test_server import metric

    seen: dict[str, float] = {}
    misses = 0
    with httpx.Client(timeout=30) as client:
        while misses < 12:
            page = client.get(url + "/metrics")
            tag = page.headers.get(REPLICA_HEADER, "single")
            if tag in seen:
                misses += 1
                continue
            seen[tag] = metric(page.text, name, **labels)
    return seen


def cross_replica_hits(url: str) -> dict[str, Any]:
    """Seeded texts through one replica (A), then the same request until another replica (B)
    answers: the share of B's answers that came from the shared Redis tier."""
    name, labels = "onnx_tts_result_cache_lookups_total", {"model": "onnx-tts-voice"}
    crossed = hits = 0
    seconds = {"first": [], "other_replica": []}
    with httpx.Client(timeout=120) as client:
        for index in range(CACHE_TEXTS):
            body = {"input": f"Cache probe number {index}, said once.", "seed": 1000 + index}
            began = time.perf_counter()
            first = client.post(url + "/v1/audio/speech", json=body).headers.get(REPLICA_HEADER)
            seconds["first"].append(time.perf_counter() - began)
            before = replica_metric(url, name, tier="redis", **labels)
            for _ in range(MAX_TRIES):
                began = time.perf_counter()
                again = client.post(url + "/v1/audio/speech", json=body)
                other = again.headers.get(REPLICA_HEADER)
                if other != first:
                    seconds["other_replica"].append(time.perf_counter() - began)
                    crossed += 1
                    after = replica_metric(url, name, tier="redis", **labels)
                    hits += after.get(other, 0.0) > before.get(other, 0.0)
                    break
    return {
        "texts": CACHE_TEXTS,
        "crossed_replicas": crossed,
        "hits_on_other_replica": hits,
        "hit_rate": hits / crossed if crossed else None,
        "mean_s": {k: sum(v) / len(v) for k, v in seconds.items() if v},
    }


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name, setup in results["setups"].items():
        clients = [lv["clients"] for lv in setup["levels"]]
        left.plot(clients, [lv["audio_s_per_s"] for lv in setup["levels"]], "o-", label=name)
        right.plot(
            clients, [1000 * (lv["ttfa_p95_s"] or 0) for lv in setup["levels"]], "s-", label=name
        )
    left.set_xlabel("concurrent streaming clients")
    left.set_ylabel("audio seconds per wall second")
    left.set_ylim(bottom=0)
    right.set_xlabel("concurrent streaming clients")
    right.set_ylabel("time to first audio p95 (ms)")
    right.set_ylim(bottom=0)
    for axis in (left, right):
        axis.legend(fontsize=8)
    figure.suptitle(f"onnx-tts on Ray Serve vs one process, {os.cpu_count()} shared cores")
    save_figure(figure, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 and 4 clients, 1 request each")
    parser.add_argument("--clients", default="1,4,8", help="client counts (1,4,8)")
    parser.add_argument(
        "--seconds", type=float, default=10.0, help="each level's window, seconds (10)"
    )
    parser.add_argument("--setups", default=",".join(SETUPS), help=f"of {', '.join(SETUPS)}")
    parser.add_argument("--redis-url", help="a Redis to share (default: a throwaway one)")
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "scale.json")
    parser.add_argument("--plot", type=Path, default=RESULTS_DIR / "scale.png")
    args = parser.parse_args(argv)
    # A Ray cluster on shared, loaded cores can take minutes to come up.
    live_server.STARTUP_SECONDS = max(live_server.STARTUP_SECONDS, 300)
    try:
        levels = [int(c) for c in args.clients.split(",")]
    except ValueError:
        parser.error("--clients takes a comma-separated list of integers")
    setups = args.setups.split(",")
    if set(setups) - set(SETUPS):
        parser.error(f"--setups takes some of {', '.join(SETUPS)}")
    if args.quick:
        levels, args.seconds = [c for c in levels if c <= 4], 4.0
    if not levels or min(levels) < 1 or max(levels) > 64 or not 1 <= args.seconds <= 3600:
        parser.error("client counts must be 1-64 and --seconds 1-3600")

    results: dict[str, Any] = {
        "benchmark": "scale",
        "machine": machine_info(),
        "window_s": args.seconds,
        "setups": {},
    }
    with tempfile.TemporaryDirectory(prefix="onnx-tts-bench-scale-") as tmp, ExitStack() as keep:
        work = Path(tmp)
        redis_url = keep.enter_context(redis_for_benchmark(args.redis_url, work / "redis"))
        for setup in setups:
            began = time.perf_counter()
            with ExitStack() as stack:
                server = start(setup, work, redis_url, stack)
                startup = time.perf_counter() - began
                warm_up(server.url)
                entry: dict[str, Any] = {"startup_s": startup, "levels": []}
                for clients in levels:
                    level = run_level(server.url, clients, args.seconds)
                    entry["levels"].append(level)
                    print(
                        f"{setup:12s} {clients:2d} clients: {level['audio_s_per_s']:5.1f} audio "
                        f"s/s  TTFA p50 {1000 * (level['ttfa_p50_s'] or 0):6.1f} ms p95 "
                        f"{1000 * (level['ttfa_p95_s'] or 0):6.1f} ms  underruns "
                        f"{level['underruns']}  errors {level['errors']}",
                        flush=True,
                    )
            if setup in ("ray-2", "ray-2-nodes") and redis_url:
                with ExitStack() as stack:
                    server = start(setup, work / "cache", redis_url, stack, result_cache=True)
                    entry["cross_replica_cache"] = cross_replica_hits(server.url)
                print(f"{setup:12s} cross-replica cache: {entry['cross_replica_cache']}")
            results["setups"][setup] = entry
    single = results["setups"].get("single")
    for name, entry in results["setups"].items():
        if single and name != "single":
            entry["proxy_ttfa_p50_overhead_s"] = (
                entry["levels"][0]["ttfa_p50_s"] - single["levels"][0]["ttfa_p50_s"]
            )
        best = max(lv["audio_s_per_s"] for lv in entry["levels"])
        entry["streams_per_core"] = best / (os.cpu_count() or 1)  # real-time streams per core
    results["machine"]["loadavg_end"] = load_average()
    write_json(args.json, results)
    plot(results, args.plot)
    print(f"results: {args.json}, {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

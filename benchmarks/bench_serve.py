"""Load benchmark of `onnx-tts serve` (issue 15): concurrent streaming HTTP clients.

``onnx-tts bench serve`` wraps :func:`main`; it also runs as ``python benchmarks/bench_serve.py``.

A live server process on a free port (or ``--url`` of a running one); for each client count
(1, 4, 8, 16) every client thread sends ``--requests`` streaming requests one after another
(``response_format: pcm``, ``stream_format: audio``, the default voice) and reads the bytes as
they come. Per request, on the client side: time to first audio (request sent -> first audio
byte), underruns (a chunk that arrives after a player that started at the first byte has
played everything before it: onnx_tts.request.PlaybackClock) and errors (a status other
than 200, a broken stream, or audio of the wrong length). Per level: audio seconds delivered per
wall second, TTFA p50/p95. Goals (issue 15): TTFA p95 <= 150 ms, no underruns and no errors
at 8 clients.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

if __package__ in (None, ""):  # run as a script: make `benchmarks` and `onnx_tts` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_streaming import machine_info, write_atomically
from benchmarks.live_server import LiveServer
from onnx_tts.request import PlaybackClock

RESULTS_DIR = Path(__file__).resolve().parent / "results"
TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "A rainbow is a division of white light into many beautiful colors.",
    "When the sunlight strikes raindrops in the air, they act as a prism and form a rainbow.",
)
GOAL_TTFA_P95_S = 0.150
GOAL_CLIENTS = 8


def stream_once(client: httpx.Client, url: str, text: str, expected_bytes: int) -> dict[str, Any]:
    body = {"input": text, "response_format": "pcm", "stream_format": "audio"}
    clock = PlaybackClock()
    start = time.perf_counter()
    first: float | None = None
    received = 0
    error = None
    rate = 1
    try:
        with client.stream("POST", url + "/v1/audio/speech", json=body) as response:
            if response.status_code != 200:
                response.read()
                error = f"HTTP {response.status_code}: {response.text[:120]}"
            else:
                rate = int(response.headers["x-sample-rate"])
                for chunk in response.iter_bytes():
                    now = time.perf_counter()
                    if first is None:
                        first = now - start
                    received += len(chunk)
                    clock.chunk(now, len(chunk) / 2 / rate)
    except httpx.HTTPError as failure:
        error = f"{type(failure).__name__}: {failure}"
    if error is None and received != expected_bytes:
        error = f"got {received} bytes of audio, expected {expected_bytes}"
    return {
        "ttfa_s": first,
        "total_s": time.perf_counter() - start,
        "audio_s": received / 2 / rate,
        "underruns": clock.underruns,
        "underrun_s": clock.stalled,
        "error": error,
    }


def run_level(url: str, clients: int, requests: int, expected: dict[str, int]) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(clients)

    def client_thread(index: int) -> None:
        with httpx.Client(timeout=120) as client:
            barrier.wait()
            for n in range(requests):
                text = TEXTS[(index + n) % len(TEXTS)]
                outcome = stream_once(client, url, text, expected[text])
                with lock:
                    results.append(outcome)

    threads = [threading.Thread(target=client_thread, args=(i,)) for i in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    ttfa = sorted(r["ttfa_s"] for r in results if r["ttfa_s"] is not None)
    errors = [r["error"] for r in results if r["error"]]
    return {
        "clients": clients,
        "requests": len(results),
        "wall_s": wall,
        "audio_s": sum(r["audio_s"] for r in results),
        "audio_s_per_s": sum(r["audio_s"] for r in results) / wall,
        "ttfa_p50_s": statistics.median(ttfa) if ttfa else None,
        "ttfa_p95_s": _percentile(ttfa, 0.95),
        "ttfa_max_s": ttfa[-1] if ttfa else None,
        "underruns": sum(r["underruns"] for r in results),
        "underrun_s": sum(r["underrun_s"] for r in results),
        "streams_with_underrun": sum(1 for r in results if r["underruns"]),
        "errors": len(errors),
        "error_examples": errors[:3],
    }


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    # Nearest rank: the value at or above q of the samples (no interpolation).
    rank = max(0, min(len(values) - 1, int(-(-q * len(values) // 1)) - 1))
    return values[rank]


def reference_lengths(url: str) -> dict[str, int]:
    """Bytes of pcm each text produces (non-streamed); also warms the server up."""
    out = {}
    with httpx.Client(timeout=120) as client:
        for text in TEXTS:
            body = {"input": text, "response_format": "pcm"}
            response = client.post(url + "/v1/audio/speech", json=body)
            response.raise_for_status()
            out[text] = len(response.content)
    return out


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = results["levels"]
    clients = [level["clients"] for level in levels]
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(clients, [1000 * (lv["ttfa_p50_s"] or 0) for lv in levels], "o-", label="p50")
    left.plot(clients, [1000 * (lv["ttfa_p95_s"] or 0) for lv in levels], "s-", label="p95")
    left.axhline(1000 * GOAL_TTFA_P95_S, color="grey", ls="--", label="goal p95 (8 clients)")
    left.set_xlabel("concurrent streaming clients")
    left.set_ylabel("time to first audio (ms)")
    left.set_xticks(clients)
    left.legend()
    right.plot(clients, [lv["audio_s_per_s"] for lv in levels], "o-")
    for level in levels:
        if level["underruns"] or level["errors"]:
            right.annotate(
                f"{level['underruns']} underruns, {level['errors']} errors",
                (level["clients"], level["audio_s_per_s"]),
                fontsize=8,
            )
    right.set_xlabel("concurrent streaming clients")
    right.set_ylabel("audio seconds per wall second")
    right.set_ylim(bottom=0)
    right.set_xticks(clients)
    figure.suptitle(f"onnx-tts serve: streaming pcm, default voice, {os.cpu_count()} cores")
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    plt.close(figure)
    write_atomically(path, buffer.getvalue())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1, 4, 8 clients, 1 request each")
    parser.add_argument("--clients", default="1,4,8,16", help="client counts (1,4,8,16)")
    parser.add_argument("--requests", type=int, default=4, help="requests per client (4)")
    parser.add_argument("--url", help="benchmark a running server instead of starting one")
    parser.add_argument("--server-args", default="", help="extra `serve` arguments, quoted")
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "serve.json")
    parser.add_argument("--plot", type=Path, default=RESULTS_DIR / "serve.png")
    args = parser.parse_args(argv)
    try:
        levels = [int(c) for c in args.clients.split(",")]
    except ValueError:
        parser.error("--clients takes a comma-separated list of integers")
    if args.quick:
        levels, args.requests = [c for c in levels if c <= 8], 1
    if not levels or min(levels) < 1 or max(levels) > 256 or args.requests < 1:
        parser.error("client counts must be 1-256 and --requests >= 1")

    workdir = tempfile.TemporaryDirectory(prefix="onnx-tts-bench-serve-")
    server = None
    if not args.url:
        server = LiveServer(Path(workdir.name), "--log-level", "warning", *args.server_args.split())
    url = args.url or server.url  # type: ignore[union-attr]
    try:
        expected = reference_lengths(url)
        results: dict[str, Any] = {
            "benchmark": "serve",
            "machine": machine_info(),
            "server_args": args.server_args,
            "requests_per_client": args.requests,
            "texts": list(TEXTS),
            "levels": [],
        }
        for clients in levels:
            level = run_level(url, clients, args.requests, expected)
            results["levels"].append(level)
            print(
                f"{clients:3d} clients: {level['audio_s_per_s']:6.1f} audio s/s   "
                f"TTFA p50 {1000 * (level['ttfa_p50_s'] or 0):6.1f} ms "
                f"p95 {1000 * (level['ttfa_p95_s'] or 0):6.1f} ms   "
                f"underruns {level['underruns']}   errors {level['errors']}",
                flush=True,
            )
    finally:
        if server is not None:
            server.stop()
        workdir.cleanup()
    results["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    goal = next((lv for lv in results["levels"] if lv["clients"] == GOAL_CLIENTS), None)
    if goal is not None:
        results["goal_8_clients"] = {
            "ttfa_p95_ok": goal["ttfa_p95_s"] is not None and goal["ttfa_p95_s"] <= GOAL_TTFA_P95_S,
            "no_underruns": goal["underruns"] == 0,
            "no_errors": goal["errors"] == 0,
        }
    write_atomically(args.json, (json.dumps(results, indent=2) + "\n").encode("utf-8"))
    plot(results, args.plot)
    print(f"results: {args.json}, {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

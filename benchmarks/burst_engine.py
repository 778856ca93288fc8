"""A burst without HTTP: `--clients` threads call `stream()` on one engine at the same moment
(issue 43, item 11: what the engine alone takes for 8 listeners that start together).

``python -m benchmarks.burst_engine [--model DIR] [--clients 8] [--bursts 12]``
``    [--first-chunk-frames N] [--json PATH]``

Each burst speaks its own held-out sentences (bench api's), `cache=False` so no result is
replayed; one warm-up burst first. Printed and written: time to first audio (the call to the
first non-empty chunk) p50 / p95 / max over every stream, and the median of each burst's
slowest stream (what a p95 of one burst of 8 is).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_api import SENTENCES
from benchmarks.bench_serve import percentile
from benchmarks.results_io import machine_info, write_json


def burst(engine: Any, texts: list[str], options: dict[str, Any]) -> list[float]:
    """Every text streamed by its own thread, the threads released together; their times to
    first audio in seconds."""
    gate = threading.Barrier(len(texts))
    firsts: list[float] = []
    lock = threading.Lock()

    def listener(index: int) -> None:
        gate.wait()
        started = time.perf_counter()
        first = None
        for chunk in engine.stream(texts[index], seed=index, cache=False, **options):
            if first is None and len(chunk):
                first = time.perf_counter() - started
        with lock:
            firsts.append(first if first is not None else float("nan"))

    threads = [threading.Thread(target=listener, args=(i,)) for i in range(len(texts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return firsts


def run(args: argparse.Namespace) -> dict[str, Any]:
    import onnx_tts

    engine = onnx_tts.load(args.model) if args.model else onnx_tts.load()
    options = {"first_chunk_frames": args.first_chunk_frames} if args.first_chunk_frames else {}
    try:
        burst(engine, SENTENCES[: args.clients], options)  # warm-up
        every: list[float] = []
        slowest: list[float] = []
        for index in range(args.bursts):
            shift = (index + 1) * args.clients
            texts = [SENTENCES[(shift + i) % len(SENTENCES)] for i in range(args.clients)]
            firsts = burst(engine, texts, options)
            every += firsts
            slowest.append(max(firsts))
    finally:
        engine.close()
    ms = {
        "p50": 1000 * statistics.median(every),
        "p95": 1000 * (percentile(every, 0.95) or 0.0),
        "max": 1000 * max(every),
        "median_burst_slowest": 1000 * statistics.median(slowest),
    }
    return {
        "benchmark": "burst_engine",
        "machine": machine_info(),
        "clients": args.clients,
        "bursts": args.bursts,
        "first_chunk_frames": args.first_chunk_frames or "the model's",
        "ttfa_ms": {k: round(v, 1) for k, v in ms.items()},
        "ttfa_s": sorted(every),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model directory (default: the voice)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--bursts", type=int, default=12)
    parser.add_argument("--first-chunk-frames", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if not 1 <= args.clients <= 64 or not 1 <= args.bursts <= 1000:
        parser.error("--clients must be 1-64 and --bursts 1-1000")
    result = run(args)
    ttfa = result["ttfa_ms"]
    print(
        f"{args.clients} streams at once, {args.bursts} bursts: time to first audio p50 "
        f"{ttfa['p50']:.0f} / p95 {ttfa['p95']:.0f} / max {ttfa['max']:.0f} ms, each burst's "
        f"slowest (median) {ttfa['median_burst_slowest']:.0f} ms"
    )
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

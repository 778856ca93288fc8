"""Continuous-batching benchmark (issue 14): concurrent requests as threads each running their
own batch-1 decode loop ("threads", today's path before the scheduler) against the same
requests as rows of one batched decode ("batched"), side by side in one run.

``onnx-tts bench batch [--quick] [--json PATH] [--plot PATH] [--shapes voice turbo]``

Two workloads at concurrency 1, 2, 4, 8, 16:

* ``voice``: the default bundle through ``Engine.stream()``: ``max_batch=1`` engines for the
  thread path, one ``max_batch=16`` engine for the batched path. Reported: audio seconds per
  wall second, per-stream real-time factor, time to first audio p50/p95, peak RSS.
* ``turbo``: the bare Turbo-shape LM of ``bench kv`` (24 layers, hidden 1024, GQA in place,
  random weights): each request prefills ``--prompt`` tokens and decodes ``--tokens`` greedy
  tokens, on its own ``KVCache('inplace')`` per thread, or as a row of one ``KVSlots``.
  Reported: generated tokens per second, time to first token p50/p95, peak RSS.

The machine is shared, so its load average is recorded before and after, and every ratio
compares numbers measured in this same run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.results_io import save_figure, write_json  # noqa: E402

RESULTS_DIR = ROOT / "benchmarks" / "results"
CONCURRENCY = (1, 2, 4, 8, 16)
TEXT = "The quick brown fox jumps over the lazy dog, and then it takes a nap."


class PeakRss:
    """Samples the process RSS every 20 ms while active; `.peak` in bytes."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        process = psutil.Process()
        while not self._stop.is_set():
            self.peak = max(self.peak, process.memory_info().rss)
            self._stop.wait(0.02)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join()


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def run_concurrent(concurrency: int, requests: int, job: Callable[[int], dict]) -> dict:
    """`requests` jobs on `concurrency` client threads; wall time, peak RSS, job records."""
    with PeakRss() as rss, ThreadPoolExecutor(concurrency) as pool:
        start = time.perf_counter()
        records = list(pool.map(job, range(requests)))
        wall = time.perf_counter() - start
    return {"wall_s": wall, "peak_rss_mb": rss.peak / 2**20, "records": records}


# -- default voice --------------------------------------------------------------------------
def voice_job(engine: Any) -> Callable[[int], dict]:
    def job(index: int) -> dict:
        start = time.perf_counter()
        first = None
        samples = 0
        for chunk in engine.stream(TEXT, seed=index):
            if first is None and len(chunk):
                first = time.perf_counter() - start
            samples += len(chunk)
        total = time.perf_counter() - start
        audio = samples / engine.sample_rate
        return {"ttfa_s": first, "total_s": total, "audio_s": audio, "rtf": total / audio}

    return job


def bench_voice(levels: tuple[int, ...], per_stream: int, threads: int) -> list[dict]:
    import onnx_tts

    rows = []
    solo = onnx_tts.load(None, cache_dir=None, threads=threads, max_batch=1)
    batched = onnx_tts.load(None, cache_dir=None, threads=threads, max_batch=max(levels))
    for engine in (solo, batched):
        run_concurrent(2, 4, voice_job(engine))  # warm-up
    for concurrency in levels:
        for path, engine in (("threads", solo), ("batched", batched)):
            steps_before = engine.stats().get("steps", 0)
            rows_before = engine.stats().get("row_steps", 0)
            result = run_concurrent(concurrency, concurrency * per_stream, voice_job(engine))
            records = result.pop("records")
            audio = sum(r["audio_s"] for r in records)
            steps = engine.stats().get("steps", 0) - steps_before
            row_steps = engine.stats().get("row_steps", 0) - rows_before
            rows.append(
                {
                    "workload": "voice",
                    "path": path,
                    "concurrency": concurrency,
                    "requests": len(records),
                    "audio_s_per_s": audio / result["wall_s"],
                    "rtf_p50": percentile([r["rtf"] for r in records], 50),
                    "ttfa_p50_ms": 1000 * percentile([r["ttfa_s"] for r in records], 50),
                    "ttfa_p95_ms": 1000 * percentile([r["ttfa_s"] for r in records], 95),
                    "mean_batch": row_steps / steps if steps else 1.0,
                    **result,
                }
            )
            print(_line(rows[-1]), flush=True)
    batched.close()
    return rows


# -- bare Turbo-shape LM --------------------------------------------------------------------
def bench_turbo(
    levels: tuple[int, ...], shape_name: str, prompt: int, tokens: int, threads: int
) -> list[dict]:
    from benchmarks import lm_graphs
    from onnx_tts.session import KVCache, KVSlots, Session, SessionOptions

    shape = lm_graphs.shape_by_name(shape_name)
    graphs = lm_graphs.ensure_graphs(shape, log=print)
    session = Session(graphs.gqa_path, SessionOptions(intra_op_threads=threads))
    capacity = prompt + tokens + 1
    rng = np.random.default_rng(0)
    prompts = rng.integers(0, shape.vocab, size=(max(levels) * 2, prompt))

    def thread_job(index: int) -> dict:
        start = time.perf_counter()
        cache = KVCache(session, "inplace", capacity=capacity)
        logits = cache.step(
            {"input_ids": prompts[index % len(prompts)][None]}, output_names=["logits"]
        )
        token = int(np.argmax(logits["logits"][0, -1]))
        first = time.perf_counter() - start
        for _ in range(tokens - 1):
            logits = cache.step({"input_ids": np.array([[token]])}, output_names=["logits"])
            token = int(np.argmax(logits["logits"][0, -1]))
        return {"ttft_s": first, "total_s": time.perf_counter() - start}

    def batched_run(concurrency: int, requests: int) -> dict:
        """Requests join rows as rows free up (continuous batching), on one worker."""
        slots = KVSlots(session, concurrency, capacity)
        lengths = np.zeros(concurrency, np.int64)
        remaining = np.zeros(concurrency, np.int64)
        last = np.zeros(concurrency, np.int64)
        started: dict[int, float] = {}
        firsts, totals = [], []
        owner = [-1] * concurrency
        queue = list(range(requests))
        with PeakRss() as rss:
            start = time.perf_counter()
            while queue or any(o >= 0 for o in owner):
                for row in range(concurrency):
                    if owner[row] < 0 and queue:
                        index = queue.pop(0)
                        owner[row], started[index] = index, time.perf_counter()
                        ids = prompts[index % len(prompts)][None]
                        out = slots.step({"input_ids": ids}, row, np.zeros(1, np.int64), ["logits"])
                        last[row] = int(np.argmax(out["logits"][0, -1]))
                        lengths[row], remaining[row] = prompt, tokens - 1
                        firsts.append(time.perf_counter() - started[index])
                active = [r for r in range(concurrency) if owner[r] >= 0 and remaining[r] > 0]
                if active:
                    first, final = active[0], active[-1]
                    span = np.arange(first, final + 1)
                    idle = np.array([owner[r] < 0 or remaining[r] <= 0 for r in span])
                    step_lengths = np.where(idle, 0, lengths[span])
                    ids = np.where(idle, 0, last[span])[:, None]
                    out = slots.step({"input_ids": ids}, first, step_lengths, ["logits"])
                    picked = np.argmax(out["logits"][:, -1], axis=-1)
                    for offset, row in enumerate(span):
                        if not idle[offset]:
                            last[row] = picked[offset]
                            lengths[row] += 1
                            remaining[row] -= 1
                for row in range(concurrency):
                    if owner[row] >= 0 and remaining[row] <= 0:
                        totals.append(time.perf_counter() - started[owner[row]])
                        owner[row] = -1
                        lengths[row] = 0
            wall = time.perf_counter() - start
        return {"wall_s": wall, "peak_rss_mb": rss.peak / 2**20, "firsts": firsts, "totals": totals}

    thread_job(0)  # warm-up
    rows = []
    for concurrency in levels:
        requests = concurrency * 2
        threaded = run_concurrent(concurrency, requests, thread_job)
        records = threaded.pop("records")
        rows.append(
            _turbo_row(
                "threads",
                concurrency,
                requests,
                tokens,
                threaded,
                [r["ttft_s"] for r in records],
            )
        )
        print(_line(rows[-1]), flush=True)
        batched = batched_run(concurrency, requests)
        firsts = batched.pop("firsts")
        batched.pop("totals")
        rows.append(_turbo_row("batched", concurrency, requests, tokens, batched, firsts))
        print(_line(rows[-1]), flush=True)
    return rows


def _turbo_row(
    path: str, concurrency: int, requests: int, tokens: int, result: dict, firsts: list[float]
) -> dict:
    return {
        "workload": "turbo",
        "path": path,
        "concurrency": concurrency,
        "requests": requests,
        "tokens_per_s": requests * tokens / result["wall_s"],
        "ttft_p50_ms": 1000 * percentile(firsts, 50),
        "ttft_p95_ms": 1000 * percentile(firsts, 95),
        **result,
    }


def _line(row: dict) -> str:
    rate = (
        f"{row['audio_s_per_s']:7.1f} audio s/s  TTFA p50 {row['ttfa_p50_ms']:7.1f} ms "
        f"p95 {row['ttfa_p95_ms']:7.1f} ms"
        if row["workload"] == "voice"
        else f"{row['tokens_per_s']:7.1f} tok/s    TTFT p50 {row['ttft_p50_ms']:7.1f} ms "
        f"p95 {row['ttft_p95_ms']:7.1f} ms"
    )
    return (
        f"[bench-batch] {row['workload']:5s} {row['path']:7s} c={row['concurrency']:2d} "
        f"{rate}  peak {row['peak_rss_mb']:6.0f} MB"
    )


def summarize(rows: list[dict]) -> dict:
    """The issue's goals, as ratios within this run."""

    def value(workload: str, path: str, concurrency: int, key: str) -> float:
        for row in rows:
            if (row["workload"], row["path"], row["concurrency"]) == (workload, path, concurrency):
                return row[key]
        return float("nan")

    top = max(r["concurrency"] for r in rows)
    c8 = 8 if any(r["concurrency"] == 8 for r in rows) else top
    summary: dict[str, Any] = {"at_concurrency": c8}
    if any(r["workload"] == "turbo" for r in rows):
        summary["turbo_tokens_c8_over_c1_batched"] = value(
            "turbo", "batched", c8, "tokens_per_s"
        ) / value("turbo", "batched", 1, "tokens_per_s")
        summary["turbo_tokens_c8_over_c1_threads"] = value(
            "turbo", "threads", c8, "tokens_per_s"
        ) / value("turbo", "threads", 1, "tokens_per_s")
    if any(r["workload"] == "voice" for r in rows):
        summary["voice_audio_c8_over_c1_batched"] = value(
            "voice", "batched", c8, "audio_s_per_s"
        ) / value("voice", "batched", 1, "audio_s_per_s")
        summary["voice_audio_c8_over_c1_threads"] = value(
            "voice", "threads", c8, "audio_s_per_s"
        ) / value("voice", "threads", 1, "audio_s_per_s")
        summary["voice_ttfa_p95_c8_over_c1_batched"] = value(
            "voice", "batched", c8, "ttfa_p95_ms"
        ) / value("voice", "batched", 1, "ttfa_p95_ms")
    return summary


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["rows"]
    workloads = [w for w in ("voice", "turbo") if any(r["workload"] == w for r in rows)]
    figure, axes = plt.subplots(2, len(workloads), figsize=(6 * len(workloads), 8), squeeze=False)
    for column, workload in enumerate(workloads):
        rate_key, unit = (
            ("audio_s_per_s", "audio s / s") if workload == "voice" else ("tokens_per_s", "tok/s")
        )
        latency_key = "ttfa_p95_ms" if workload == "voice" else "ttft_p95_ms"
        for route, style in (("threads", "o--"), ("batched", "s-")):
            picked = [r for r in rows if r["workload"] == workload and r["path"] == route]
            levels = [r["concurrency"] for r in picked]
            axes[0][column].plot(levels, [r[rate_key] for r in picked], style, label=route)
            axes[1][column].plot(levels, [r[latency_key] for r in picked], style, label=route)
        axes[0][column].set_title(f"{workload}: throughput")
        axes[0][column].set_ylabel(unit)
        axes[1][column].set_title(f"{workload}: first output p95")
        axes[1][column].set_ylabel("ms")
        for axis in (axes[0][column], axes[1][column]):
            axis.set_xscale("log", base=2)
            axis.set_xlabel("concurrent requests")
            axis.grid(alpha=0.3)
            axis.legend()
    save_figure(figure, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (turbo-small LM)")
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "batch.json")
    parser.add_argument("--plot", type=Path, default=RESULTS_DIR / "batch.png")
    parser.add_argument(
        "--shapes", nargs="+", choices=("voice", "turbo"), default=["voice", "turbo"]
    )
    parser.add_argument("--threads", type=int, default=2, help="ORT intra-op threads per session")
    parser.add_argument("--prompt", type=int, default=64, help="turbo: prompt tokens")
    parser.add_argument("--tokens", type=int, default=64, help="turbo: generated tokens")
    args = parser.parse_args(argv)
    levels = (1, 2, 4, 8) if args.quick else CONCURRENCY
    load_before = os.getloadavg()
    rows: list[dict] = []
    if "voice" in args.shapes:
        rows += bench_voice(levels, 1 if args.quick else 3, args.threads)
    if "turbo" in args.shapes:
        shape = "turbo-small" if args.quick else "turbo"
        tokens = 16 if args.quick else args.tokens
        rows += bench_turbo(levels, shape, args.prompt, tokens, args.threads)
    results = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_before": load_before,
            "load_after": os.getloadavg(),
        },
        "quick": args.quick,
        "rows": rows,
        "summary": summarize(rows),
    }
    write_json(args.json, results)
    plot(results, args.plot)
    print(json.dumps(results["summary"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

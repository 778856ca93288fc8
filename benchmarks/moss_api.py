"""`onnx-tts bench moss --api`: MOSS-TTS-Nano speed through the plain public call, as a user's
harness measures it (issue 43), against the published loop at 1, 2 and 4 threads.

Each run is a fresh process that does only what such a harness does:

    engine = onnx_tts.load(DIR, max_batch=8)                  # every other setting default
    engine.synthesize(TEXT, seed=i, max_new_frames=FRAMES)    # 1 thread, then 8 at once

beside `tests/moss_published_loop.py` (a paraphrase of the published onnxruntime loop) with
1, 2 and 4 intra-op threads calling its `synthesize(TEXT, seed=i, max_new_frames=FRAMES)`.
Nothing is warmed up before the first measurement: a run measures every contender
`--repeats` times in an order rotated from run to run, and the first measurement of each
(`cold`) is reported apart from the rest (`warm`, their median). A contender's audio s/s is
the audio of its requests over their wall time; the speed-ups are the Engine's audio s/s over
the best published setting's in the same run (the published loop serves one request at a
time, so it is the baseline at 8 requests too), summarised over runs as the median with the
spread.

With `--before-python PY --before-repo DIR` (and `--before-model-dir`, default the same
directory) the runs of that checkout alternate with this tree's.

Default model: `bench moss`'s int8 directory (the published-shape stand-in converted for the
in-place cache, then `onnx-tts quantize --weights int8` with its defaults; every request makes
exactly FRAMES frames) and, for the
published loop, its float source; `--model-dir` / `--published-dir` measure others (e.g. a
directory made by `onnx-tts quantize` with its defaults).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PUBLISHED_THREADS = (1, 2, 4)
ENGINE_CONCURRENCY = (1, 8)
MAX_BATCH = 8


def _log(message: str) -> None:
    print(f"[bench-moss --api] {message}", file=sys.stderr, flush=True)


# -- one run (a fresh process) --------------------------------------------------------------
def worker(model: Path, published: Path, text: str, frames: int, repeats: int, run: int) -> int:
    """One run: load as a user does, measure every contender `repeats` times (rotated by
    `run`), print the records as JSON."""
    import onnx_tts
    from tests.moss_published_loop import PublishedLoop

    started = time.perf_counter()
    engine = onnx_tts.load(model, max_batch=MAX_BATCH)
    load_s = time.perf_counter() - started
    loops = {threads: PublishedLoop(published, threads=threads) for threads in PUBLISHED_THREADS}
    seeds = iter(range(1_000_000))

    def engine_call(seed: int) -> float:
        audio = engine.synthesize(text, seed=seed, max_new_frames=frames)
        return len(audio.samples) / audio.sample_rate

    def published_call(loop: Any, seed: int) -> float:
        waveform = loop.synthesize(text, seed=seed, max_new_frames=frames)["waveform"]
        return len(waveform) / 48000

    contenders: list[tuple[str, int, Any]] = [
        (f"published, {t} thread{'s' * (t > 1)}", 1, lambda s, loop=loop: published_call(loop, s))
        for t, loop in loops.items()
    ]
    contenders += [("engine", count, engine_call) for count in ENGINE_CONCURRENCY]
    shift = run % len(contenders)
    order = contenders[shift:] + contenders[:shift]
    records = []
    for repeat in range(repeats):
        for name, count, call in order:
            wall, audio = _concurrent(call, [next(seeds) for _ in range(count)])
            records.append(
                {
                    "contender": name,
                    "requests": count,
                    "repeat": repeat,
                    "audio_s": audio,
                    "wall_s": wall,
                    "load_1m": os.getloadavg()[0],
                }
            )
    stats = engine.stats()
    engine.close()
    print(json.dumps({"run": run, "load_s": load_s, "records": records, "engine_stats": stats}))
    return 0


def _concurrent(call: Any, seeds: list[int]) -> tuple[float, float]:
    """(wall seconds, audio seconds) of one call per seed, each in a thread of its own,
    started together (one seed: in this thread)."""
    if len(seeds) == 1:
        start = time.perf_counter()
        audio = call(seeds[0])
        return time.perf_counter() - start, audio
    results: list[float | None] = [None] * len(seeds)
    gate = threading.Barrier(len(seeds) + 1)

    def one(index: int) -> None:
        gate.wait()
        results[index] = call(seeds[index])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(seeds))]
    for thread in threads:
        thread.start()
    gate.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    if any(r is None for r in results):
        raise RuntimeError("a concurrent request failed")
    return wall, float(sum(results))  # type: ignore[arg-type]


# -- the runs --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tree:
    """A checkout whose Engine is measured: its interpreter, its directory, the model
    directory its Engine loads."""

    label: str
    python: str
    repo: Path
    model: Path


def run_all(
    trees: list[Tree], published: Path, text: str, frames: int, runs: int, repeats: int
) -> dict[str, Any]:
    """`runs` fresh processes per tree, the trees alternating (this file runs as the worker
    with the tree's interpreter and its `onnx_tts`)."""
    outputs: dict[str, list[dict[str, Any]]] = {tree.label: [] for tree in trees}
    for run in range(runs):
        for tree in trees if run % 2 == 0 else trees[::-1]:
            load = os.getloadavg()
            command = [tree.python, str(Path(__file__).resolve()), "--repo", str(tree.repo)]
            command += ["--run", str(run), "--model-dir", str(tree.model)]
            command += ["--published-dir", str(published), "--frames", str(frames)]
            command += ["--repeats", str(repeats), "--text", text]
            done = subprocess.run(
                command, cwd=tree.repo, capture_output=True, text=True, check=False, timeout=3600
            )
            if done.returncode != 0:
                raise RuntimeError(f"{tree.label} run {run} failed:\n{done.stderr[-3000:]}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            result["load_before"] = load
            result["load_after"] = os.getloadavg()
            outputs[tree.label].append(result)
            _log(f"{tree.label} run {run + 1} of {runs}: {_run_line(result)}")
    return {
        "trees": {
            t.label: {"python": t.python, "repo": str(t.repo), "model": str(t.model)} for t in trees
        },
        "runs": outputs,
        "summary": {label: summarize(results) for label, results in outputs.items()},
    }


def _rate(records: list[dict[str, Any]]) -> float:
    return sum(r["audio_s"] for r in records) / sum(r["wall_s"] for r in records)


def per_run(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    """{phase: {contender key: audio s/s}} of one run; phase cold = the first measurement,
    warm = the median of the others."""
    out: dict[str, dict[str, float]] = {"cold": {}, "warm": {}}
    keys = {(r["contender"], r["requests"]) for r in result["records"]}
    for name, count in keys:
        mine = [r for r in result["records"] if (r["contender"], r["requests"]) == (name, count)]
        key = f"{name} x{count}"
        out["cold"][key] = _rate([r for r in mine if r["repeat"] == 0])
        warm = [_rate([r]) for r in mine if r["repeat"] > 0]
        if warm:
            out["warm"][key] = statistics.median(warm)
    return out


def ratios(rates: dict[str, float]) -> dict[str, float]:
    """The Engine at 1 and 8 requests over the best published setting."""
    best = max(v for k, v in rates.items() if k.startswith("published"))
    return {
        f"engine x{count}": rates[f"engine x{count}"] / best
        for count in ENGINE_CONCURRENCY
        if f"engine x{count}" in rates
    }


def summarize(outputs: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for phase in ("cold", "warm"):
        runs = [per_run(result)[phase] for result in outputs]
        runs = [rates for rates in runs if rates]
        if not runs:
            continue
        speedups = [ratios(rates) for rates in runs]
        summary[phase] = {
            "audio_s_per_s": {k: statistics.median(r[k] for r in runs) for k in runs[0]},
            "speedup_vs_best_published": {
                k: {
                    "median": statistics.median(s[k] for s in speedups),
                    "spread": [min(s[k] for s in speedups), max(s[k] for s in speedups)],
                }
                for k in speedups[0]
            },
        }
    return summary


def _run_line(result: dict[str, Any]) -> str:
    parts = []
    for phase, rates in per_run(result).items():
        if rates:
            shown = ", ".join(f"{k} {v:.2f}x" for k, v in ratios(rates).items())
            parts.append(f"{phase}: {shown}")
    return f"load {result['load_s']:.1f} s; " + "; ".join(parts)


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "| tree | phase | contender | audio s/s (median of runs) | x best published (spread) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for label, summary in results["summary"].items():
        for phase, data in summary.items():
            for key, rate in sorted(data["audio_s_per_s"].items()):
                speed = data["speedup_vs_best_published"].get(key)
                shown = (
                    f"{speed['median']:.2f} ({speed['spread'][0]:.2f}-{speed['spread'][1]:.2f})"
                    if speed
                    else ""
                )
                lines.append(f"| {label} | {phase} | {key} | {rate:.2f} | {shown} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """The worker: one run in a fresh process, with the `onnx_tts` of `--repo`."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--run", type=int, required=True)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--published-dir", type=Path, required=True)
    parser.add_argument("--frames", type=int, required=True)
    parser.add_argument("--repeats", type=int, required=True)
    parser.add_argument("--text", required=True)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(args.repo))
    return worker(
        args.model_dir, args.published_dir, args.text, args.frames, args.repeats, args.run
    )


__all__ = ["Tree", "markdown", "run_all", "summarize", "worker"]


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

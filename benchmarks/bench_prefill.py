"""Prefill beside the decode step (issue 37): do rows already streaming keep their cadence while
new requests' prompts run? The scheduler's prefill modes side by side in one run.

``onnx-tts bench prefill [--quick] [--rounds 3] [--seconds 30] [--clients 4]``
``    [--modes inline,apart,chunked] [--chunk-tokens 16] [--json PATH] [--plot PATH]``
``    [--markdown docs/BENCHMARKS.md]``

Model: the synthetic Turbo-shape Chatterbox bundle with a 200-position voice prefix
(`bench_prefix.prefix_bundle("turbo")`: 24 layers, hidden 1024, 16 heads, fp32, random
weights, converted for the in-place KV cache). Every request has a voice of its own (a cloned
voice: its prefix misses the prefix cache, which is on, so its whole ~210-position prompt
runs: about 25 steps' worth of work) and decodes up to 120 tokens.

Workload: `--clients` closed-loop clients, each submitting its next request when the last one
ended, so new prompts keep arriving while other rows decode. Requests are submitted as the
server submits a stream (a first-audio deadline, then a listener's playback clock fed one
frame's audio per frame: what the deadline policy paces by). What is measured is the LM stage
(the scheduler's frames; the vocoder is not part of it).

Modes: `inline` (the prompt in the decode worker's round, before the step: the loop before this
change), `apart` (on a prefill worker thread beside the step), `chunked` (`--chunk-tokens`
positions per round, between steps). Each mode gets a fresh scheduler over the one loaded model
(same sessions, same threads as `onnx-tts serve`: decode 1 intra-op thread on 2 cores, 2
prefill workers); the modes alternate, their order reversed every round, so they share the
machine's load.

Per mode: the cadence of rows decoding (gaps between consecutive frames of one request after
its first: p50/p95/p99/max; a gap may be the deadline policy pacing a row whose listener holds
over a second of audio), the listeners' underruns and stalled seconds (a player starting 100 ms
after a request's first frame, fed each frame's audio), time to first frame
(submit -> first frame, p50/p95: the prompt's wait and run), frames per second of all rows.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_prefix import PREFIX_TOKENS, SAMPLE_RATE, prefix_bundle, reference_voice
from benchmarks.bench_prefix import TEXTS as PROMPTS
from benchmarks.results_io import load_average, machine_info, save_figure, write_json

RESULTS_DIR = Path(__file__).resolve().parent / "results"
TEXTS = PROMPTS[:6]  # bench_prefix's short prompts; six, as the results so far were run with
STALL_FACTOR = 3.0
PLAYER_BUFFER_S = 0.1  # the listener: playback starts 100 ms after the first frame


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return float(np.percentile(np.asarray(values), q))


def voices(engine: Any, count: int, seconds: float) -> list[dict[str, np.ndarray]]:
    """`count` different voices (the reference clip with its own noise each), encoded."""
    base = reference_voice(seconds)
    out = []
    for index in range(count):
        noise = np.random.default_rng(100 + index).standard_normal(len(base)).astype(np.float32)
        out.append(engine.voice(base + 0.01 * noise))
    return out


def run_mode(
    engine: Any,
    mode: str,
    chunk_tokens: int,
    clients: int,
    seconds: float,
    voice_pool: list[dict[str, np.ndarray]],
) -> dict[str, Any]:
    """`clients` closed-loop clients on a fresh scheduler in `mode` for `seconds`."""
    from onnx_tts.cache.prefix import PrefixCache
    from onnx_tts.decoding.request import PlaybackClock, Request
    from onnx_tts.decoding.scheduler import DecodeScheduler
    from onnx_tts.pipeline import available_cores
    from onnx_tts.pipeline.stages import threads_per_stage

    model = engine.model
    frame_seconds = model.hop_length / model.sample_rate
    scheduler = DecodeScheduler(
        model.program,
        model.pool,
        max_batch=8,
        prefix_cache=PrefixCache(),
        # as `onnx-tts serve` sets it up: one prefill worker per decode stage's threads
        prefill_workers=max(1, available_cores() // threads_per_stage(available_cores())["decode"]),
        prefill=mode,
        chunk_tokens=chunk_tokens,
    )
    records: list[dict[str, Any]] = []
    lock = threading.Lock()
    voice_index = iter(range(1_000_000))
    stop_at = time.perf_counter() + seconds

    def client(index: int) -> None:
        n = 0
        while time.perf_counter() < stop_at:
            with lock:
                voice = voice_pool[next(voice_index) % len(voice_pool)]
            text = TEXTS[(index + n) % len(TEXTS)]
            n += 1
            [chunk] = model.text.chunks(text, {})
            sampling = model.sampling_defaults().with_overrides({"seed": index * 1000 + n})
            submitted = time.perf_counter()
            # As the server submits a stream: its first audio due soon, then its listener's
            # clock (fed one frame of audio per frame) says when it runs dry.
            clock, player = PlaybackClock(), PlaybackClock(PLAYER_BUFFER_S)
            request = Request(chunk, voice, sampling, {}, deadline=submitted + 0.2, clock=clock)
            times = []
            for _ in scheduler.submit(request):
                times.append(time.perf_counter())
                clock.chunk(times[-1], frame_seconds)
                player.chunk(times[-1], frame_seconds)
            with lock:
                records.append(
                    {
                        "submitted": submitted,
                        "frames": times,
                        "underruns": player.underruns,
                        "stalled": player.stalled,
                    }
                )

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    stats = scheduler.stats()
    scheduler.close()
    gaps = [b - a for r in records for a, b in zip(r["frames"], r["frames"][1:], strict=False)]
    first = [r["frames"][0] - r["submitted"] for r in records if r["frames"]]
    median = statistics.median(gaps) if gaps else 0.0
    return {
        "mode": mode,
        "chunk_tokens": chunk_tokens if mode == "chunked" else None,
        "requests": len(records),
        "frames": sum(len(r["frames"]) for r in records),
        "frames_per_s": sum(len(r["frames"]) for r in records) / wall,
        "gap_p50_ms": 1000 * median,
        "gap_p95_ms": 1000 * (percentile(gaps, 95) or 0),
        "gap_p99_ms": 1000 * (percentile(gaps, 99) or 0),
        "gap_max_ms": 1000 * max(gaps, default=0.0),
        "listener_underruns": sum(r["underruns"] for r in records),
        "listener_stall_s": sum(r["stalled"] for r in records),
        "stalls": sum(g > STALL_FACTOR * median for g in gaps),
        "stall_s": sum(g - median for g in gaps if g > STALL_FACTOR * median),
        "first_frame_p50_ms": 1000 * (percentile(first, 50) or 0),
        "first_frame_p95_ms": 1000 * (percentile(first, 95) or 0),
        "mean_batch": stats["mean_batch"],
        "prefill_turns": stats["prefill_turns"],
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }


def summarize(rounds: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Per mode: the median over rounds of each number, and its spread (min-max)."""
    by_mode: dict[str, list[dict[str, Any]]] = {}
    for round_results in rounds:
        for result in round_results:
            key = result["mode"] + (f"-{result['chunk_tokens']}" if result["chunk_tokens"] else "")
            by_mode.setdefault(key, []).append(result)
    keys = (
        "frames_per_s",
        "gap_p50_ms",
        "gap_p95_ms",
        "gap_p99_ms",
        "gap_max_ms",
        "listener_underruns",
        "listener_stall_s",
        "stalls",
        "stall_s",
        "first_frame_p50_ms",
        "first_frame_p95_ms",
        "mean_batch",
    )
    return {
        mode: {
            key: {
                "median": statistics.median(r[key] for r in results),
                "min": min(r[key] for r in results),
                "max": max(r[key] for r in results),
            }
            for key in keys
        }
        for mode, results in by_mode.items()
    }


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = results["summary"]
    modes = list(summary)
    figure, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    panels = (
        ("gap_p99_ms", "gap_max_ms", "decoding rows: frame gap p99 / max (ms)"),
        ("first_frame_p50_ms", "first_frame_p95_ms", "new requests: first frame p50 / p95 (ms)"),
        ("frames_per_s", None, "all rows: frames per second"),
    )
    x = np.arange(len(modes))
    for axis, (low, high, title) in zip(axes, panels, strict=True):
        for offset, key in ((-0.2, low), (0.2, high)):
            if key is None:
                continue
            values = [summary[m][key]["median"] for m in modes]
            spread = [
                [summary[m][key]["median"] - summary[m][key]["min"] for m in modes],
                [summary[m][key]["max"] - summary[m][key]["median"] for m in modes],
            ]
            width = 0.4 if high is not None else 0.6
            axis.bar(x + (offset if high else 0), values, width, yerr=spread, capsize=3, label=key)
        axis.set_xticks(x, modes)
        axis.set_title(title)
        axis.grid(alpha=0.3, axis="y")
        axis.legend(fontsize=7)
    figure.suptitle(
        f"prefill beside the step: Turbo-shape LM, {results['clients']} closed-loop clients, "
        f"{results['rounds']} rounds (bars: median, whiskers: spread), "
        f"{os.cpu_count()} shared cores"
    )
    save_figure(figure, path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 round of 10 s")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=30.0, help="window per mode and round")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--modes", default="inline,apart,chunked")
    parser.add_argument("--chunk-tokens", default="16", help="chunked: positions per turn (list)")
    parser.add_argument("--shape", default="turbo", choices=("turbo", "medium", "turbo-small"))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    parser.add_argument(
        "--markdown", type=Path, help="write the Serving section of this file (serve_report.py)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.seconds = 1, 10.0
    arms = []
    for mode in args.modes.split(","):
        if mode == "chunked":
            arms += [(mode, int(c)) for c in args.chunk_tokens.split(",")]
        else:
            arms.append((mode, 16))
    suffix = "_quick" if args.quick else ""
    args.json = args.json or RESULTS_DIR / f"prefill{suffix}.json"
    args.plot = args.plot or args.json.with_suffix(".png")

    import onnx_tts

    bundle = prefix_bundle(args.shape)
    engine = onnx_tts.load(bundle, cache_dir=None, result_cache_dir=None)
    pool = voices(engine, 64, PREFIX_TOKENS * 960 / SAMPLE_RATE + 1.0)
    warm = run_mode(engine, "apart", 16, 2, 5.0, pool[:2])  # sessions, shapes
    print(f"[bench-prefill] warm-up: {warm['requests']} requests", flush=True)
    rounds: list[list[dict[str, Any]]] = []
    machine = machine_info()
    for index in range(args.rounds):
        order = arms if index % 2 == 0 else arms[::-1]
        results = []
        for mode, chunk in order:
            result = run_mode(engine, mode, chunk, args.clients, args.seconds, pool)
            result["round"] = index
            results.append(result)
            print(
                f"[bench-prefill] round {index} {mode:8s}"
                f"{'' if mode != 'chunked' else f'-{chunk}':4s} {result['requests']:3d} requests "
                f"{result['frames_per_s']:6.1f} frames/s  gaps p50/p99/max "
                f"{result['gap_p50_ms']:5.0f}/{result['gap_p99_ms']:5.0f}/"
                f"{result['gap_max_ms']:5.0f} ms  underruns "
                f"{result['listener_underruns']:3d} "
                f"({result['listener_stall_s']:5.1f} s)  first frame "
                f"p50/p95 {result['first_frame_p50_ms']:5.0f}/{result['first_frame_p95_ms']:5.0f}"
                f" ms  batch {result['mean_batch']:.1f}  load {result['loadavg_1m']}",
                flush=True,
            )
        rounds.append(results)
    engine.close()
    machine["loadavg_end"] = load_average()
    output = {
        "benchmark": "prefill",
        "machine": machine,
        "model": f"synthetic Chatterbox Turbo shape ({args.shape}), {PREFIX_TOKENS}-position "
        "voice prefix, a voice of its own per request",
        "clients": args.clients,
        "rounds": args.rounds,
        "seconds_per_mode": args.seconds,
        "rounds_results": rounds,
        "summary": summarize(rounds),
    }
    write_json(args.json, output)
    plot(output, args.plot)
    if args.markdown:
        from benchmarks.serve_report import write_serving_section

        write_serving_section(args.markdown, args.json.parent)
    print(f"results: {args.json}, {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

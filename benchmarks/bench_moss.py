"""MOSS-TTS-Nano benchmark (issue 27): the published onnxruntime loop against onnx-tts on
graphs with the published shapes, side by side in one run.

``onnx-tts bench moss [--quick] [--json PATH] [--plot PATH] [--frames N] [--repeats N]``

The graphs are the project's stand-in (export/moss_tts_nano, random weights): 12 global layers,
hidden 768, 12 x 64 heads, one local layer, 16 x 1024 codebooks, the codec with its published
contexts (``--quick``: the small test sizes). The stand-in's continue bias is set so no run
stops early: every run makes exactly ``--frames`` frames (``max_new_frames``). Built once into
the user cache directory (keyed by the builder's sources), reused afterwards.

Contenders, each streaming one text as published (codec decode_step while generating, the
published frame budget):

* ``published``: tests/moss_published_loop.py, a paraphrase of the published runtime on the
  onnxruntime Python API (present -> past copied through numpy each step, local paths one run
  per graph call, host sampling in Python);
* ``copy``: onnx-tts with the published host copies kept (KV and codec state fetched to the host
  and fed back by the core): isolates what the loop itself costs;
* ``chain``: onnx-tts, KV present -> past and the codec state chained by IO binding in the core;
* ``inplace``: onnx-tts on the same graphs after ``onnx-tts convert --inplace-kv`` (decode_step
  with GroupQueryAttention over fixed [batch, heads, capacity, head_dim] buffers).

Each in sample mode ``fixed`` (the published default: the local frame graph, one run per
frame) and ``full`` (host sampling through ``local_cached_step``: 17 local runs per frame).
Reported per contender: ms per frame, real-time factor and audio seconds per wall second (all
from the wall time of generation with streaming decode), time to first audio (runs alternate
between contenders, medians kept; the machine is shared, so its load is recorded), and peak RSS
of a separate process that loads only that contender and streams once (the published runtime
loads every graph at start, onnx-tts the ones a request uses).

Batched (``bench_batched``): ``batched`` is the Engine (``onnx_tts.load`` on the converted
graphs, ``max_batch=8``): 1, 4 and 8 streams at once (each a thread calling ``Engine.stream()``
with its own seed and reading every chunk as it comes, as a server does), the prompts of
streams that arrive together through the prefill graph side by side (one per core), the global
decode rows of all streams in one in-place run per step, the local frame graph for all rows in
one run, each stream's codec decode_step with its own state on the vocoder stage's thread (two
streams at once while the decode scheduler idles). Rounds alternate it with one published run
(the published runtime serves one request at a time, so its audio s/s at N streams is its
one-stream rate); reported:
audio s/s, the speed-up in audio s/s over the published loop within the round, ms per frame
(wall per frame of one stream), RTF, time to first audio (median over streams) and peak RSS of a
process streaming 8 at once.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_streaming import write_atomically  # noqa: E402

RESULTS_DIR = ROOT / "benchmarks" / "results"
TEXT = "The quick brown fox jumps over the lazy dog, and then it takes a long nap in the sun."
CONTENDERS = ("published", "copy", "chain", "inplace")
MODES = ("fixed", "full")
# Concurrent streams of the batched Engine contender.
STREAMS = (1, 4, 8)
MAX_BATCH = 8
NEVER_STOP = 1000.0  # stand-in continue bias: no run ends before max_new_frames


def stand_in_dir(quick: bool) -> Path:
    """The stand-in model directory for this benchmark, built on first use."""
    from export import moss_tts_nano
    from export.moss_tts_nano import stand_in

    spec = moss_tts_nano.small() if quick else moss_tts_nano.published()
    spec = replace(spec, tts=replace(spec.tts, continue_bias=NEVER_STOP))
    sources = sorted(Path(stand_in.__file__).parent.glob("*.py"))
    digest = hashlib.sha256(repr(spec).encode())
    for source in sources:
        digest.update(source.read_bytes())
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "onnx-tts"
    target = cache / "bench-moss" / digest.hexdigest()[:16]
    if not (target / stand_in.TTS_DIR / stand_in.MANIFEST).is_file():
        print(f"building the stand-in graphs into {target} ...", file=sys.stderr)
        stand_in.build(target, spec)
    return target


def converted_dir(source: Path) -> Path:
    """The stand-in with decode_step converted for the in-place KV cache, made on first use."""
    from onnx_tts.tools.convert.inplace_kv import convert_moss_inplace_kv

    target = source.parent / (source.name + "-inplace")
    if not target.is_dir():
        print(f"converting decode_step into {target} ...", file=sys.stderr)
        convert_moss_inplace_kv(source, target)
    return target


def run_published(loop, mode: str, frames: int) -> dict[str, Any]:
    loop.generation.update(sample_mode=mode, do_sample=True, max_new_frames=frames)
    loop.rng = np.random.default_rng(0)
    codes = loop.manifest["builtin_voices"][0]["prompt_audio_codes"]
    rows = loop.rows(codes, loop.encode_text(TEXT))
    rate = int(loop.codec_meta["codec_config"]["sample_rate"])
    state = loop.initial_codec_state()
    pending: list[list[int]] = []
    clock: dict[str, Any] = {"first": None, "samples": 0}
    start = time.perf_counter()

    def drain(force: bool) -> None:
        if not pending:
            return
        if clock["first"] is None:
            budget = 1
        else:
            lead = clock["samples"] / rate - (time.perf_counter() - clock["first"])
            budget = 1 if lead < 0.2 else 2 if lead < 0.55 else 4 if lead < 1.1 else 8
        if not force and len(pending) < budget:
            return
        take = len(pending) if force else min(len(pending), budget)
        audio = loop.decode_stream(pending[:take], state)
        del pending[:take]
        if clock["first"] is None:
            clock["first"] = time.perf_counter()
        clock["samples"] += len(audio)

    made = loop.generate(rows, lambda frame: (pending.append(frame), drain(False)))
    drain(True)
    total = time.perf_counter() - start
    return _record(len(made), clock["samples"] / rate, total, clock["first"] - start)


def run_engine(model, mode: str, frames: int) -> dict[str, Any]:
    start = time.perf_counter()
    first = None
    samples = 0
    for piece in model.stream(TEXT, seed=0, sample_mode=mode, max_new_frames=frames):
        if first is None and len(piece):
            first = time.perf_counter() - start
        samples += len(piece)
    total = time.perf_counter() - start
    made = samples // model.hop_length
    return _record(made, samples / model.sample_rate, total, first or total)


def _record(frames: int, audio: float, total: float, first: float) -> dict:
    return {"frames": frames, "audio_s": audio, "wall_s": total, "first_audio_s": first}


def run_batched(engine, mode: str, frames: int, streams: int) -> dict[str, Any]:
    """`streams` threads streaming the text at once through one Engine (seeds 0..streams-1)."""
    import threading

    records: list[dict | None] = [None] * streams
    start_line = threading.Barrier(streams + 1)

    def one(index: int) -> None:
        start_line.wait()
        start = time.perf_counter()
        first, samples = None, 0
        stream = engine.stream(TEXT, seed=index, sample_mode=mode, max_new_frames=frames)
        for piece in stream:
            if first is None and len(piece):
                first = time.perf_counter() - start
            samples += len(piece)
        total = time.perf_counter() - start
        made = samples // engine.model.hop_length
        records[index] = _record(made, samples / engine.sample_rate, total, first or total)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    for thread in threads:
        thread.start()
    start_line.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    done = [r for r in records if r is not None]
    return {
        "frames": int(np.median([r["frames"] for r in done])),
        "audio_s": float(sum(r["audio_s"] for r in done)),
        "wall_s": wall,
        "first_audio_s": float(np.median([r["first_audio_s"] for r in done])),
        "stream_wall_s": float(np.median([r["wall_s"] for r in done])),
    }


def bench_batched(
    contenders: dict, engine, mode: str, frames: int, repeats: int, memory: float | None
) -> list[dict]:
    """The batched Engine at 1/4/8 streams against the published loop, alternating within each
    round (see the module docstring)."""
    rows = []
    for streams in STREAMS:
        ratios, records, published = [], [], []
        for round_index in range(repeats):
            order = ("published", "batched") if round_index % 2 == 0 else ("batched", "published")
            for name in order:
                if name == "published":
                    published.append(run_published(contenders["published"], mode, frames))
                else:
                    records.append(run_batched(engine, mode, frames, streams))
            base = published[-1]["audio_s"] / published[-1]["wall_s"]
            ratios.append(records[-1]["audio_s"] / records[-1]["wall_s"] / base)
        wall = float(np.median([r["wall_s"] for r in records]))
        audio = float(np.median([r["audio_s"] for r in records]))
        count = int(np.median([r["frames"] for r in records]))
        stream_wall = float(np.median([r["stream_wall_s"] for r in records]))
        base_rate = float(np.median([r["audio_s"] / r["wall_s"] for r in published]))
        rows.append(
            {
                "contender": "batched",
                "mode": mode,
                "streams": streams,
                "frames": count,
                "ms_per_frame": 1000 * stream_wall / max(count, 1),
                "rtf": stream_wall / max(audio / streams, 1e-9),
                "audio_s_per_s": audio / wall,
                "published_audio_s_per_s": base_rate,
                "first_audio_ms": 1000 * float(np.median([r["first_audio_s"] for r in records])),
                "peak_rss_mib": memory if streams == MAX_BATCH else None,
                "speedup_vs_published": float(np.median(ratios)),
                "speedup_range": [float(min(ratios)), float(max(ratios))],
                "runs": len(records),
            }
        )
    return rows


def load_engine(directory: Path, threads: int):
    import onnx_tts

    return onnx_tts.load(
        converted_dir(directory), threads=threads, cache_dir=None, max_batch=MAX_BATCH
    )


def load_contender(name: str, directory: Path, threads: int):
    from onnx_tts.families.moss_tts_nano import open_model
    from tests.moss_published_loop import PublishedLoop

    if name == "published":
        return PublishedLoop(directory, threads=threads)
    if name == "batched":
        return load_engine(directory, threads)
    if name == "inplace":
        return open_model(converted_dir(directory), kv="inplace", threads=threads)
    return open_model(directory, kv=name, threads=threads)


def run_contender(name: str, contender, mode: str, frames: int) -> dict[str, Any]:
    if name == "batched":
        return run_batched(contender, mode, frames, MAX_BATCH)
    if name == "published":
        return run_published(contender, mode, frames)
    return run_engine(contender, mode, frames)


def peak_rss_mib(name: str, directory: Path, mode: str, frames: int, threads: int) -> float:
    """Peak RSS of a fresh process that loads `name` and streams once."""
    probe = [sys.executable, __file__, "--probe", name, "--graphs", str(directory)]
    probe += ["--mode", mode, "--frames", str(frames), "--threads", str(threads)]
    result = subprocess.run(probe, capture_output=True, text=True, timeout=3600, check=True)
    return float(result.stdout.strip().splitlines()[-1])


def bench_streams(
    contenders: dict, mode: str, frames: int, repeats: int, memory: dict[str, float]
) -> list[dict]:
    """One stream per contender, in rounds (every contender once per round, the order rotated),
    `repeats` rounds; medians per contender, and the speed-up as the median over rounds of the
    ratio within a round (neighbours in time share the machine's load)."""
    runs: dict[str, list[dict]] = {name: [] for name in CONTENDERS}
    for round_index in range(repeats):
        shift = round_index % len(CONTENDERS)
        for name in CONTENDERS[shift:] + CONTENDERS[:shift]:
            runs[name].append(run_contender(name, contenders[name], mode, frames))
    base = [r["wall_s"] / max(r["frames"], 1) for r in runs["published"]]
    rows = []
    for name, records in runs.items():
        ratios = [
            b / (r["wall_s"] / max(r["frames"], 1)) for b, r in zip(base, records, strict=True)
        ]
        wall = float(np.median([r["wall_s"] for r in records]))
        audio = float(np.median([r["audio_s"] for r in records]))
        count = int(np.median([r["frames"] for r in records]))
        rows.append(
            {
                "contender": name,
                "mode": mode,
                "streams": 1,
                "frames": count,
                "ms_per_frame": 1000 * wall / max(count, 1),
                "rtf": wall / max(audio, 1e-9),
                "audio_s_per_s": audio / wall,
                "first_audio_ms": 1000 * float(np.median([r["first_audio_s"] for r in records])),
                "peak_rss_mib": memory.get(name),
                "speedup_vs_published": float(np.median(ratios)),
                "speedup_range": [float(min(ratios)), float(max(ratios))],
                "runs": len(records),
            }
        )
    return rows


def _step_timer(run) -> Any:
    """A callable that runs `run()` and returns its wall time."""

    def timed() -> float:
        start = time.perf_counter()
        run()
        return time.perf_counter() - start

    return timed


def bench_components(contenders: dict, context: int, steps: int) -> list[dict]:
    """The parts onnx-tts changes, each timed alone, contenders alternating step by step
    (medians): a global decode step at `context` cached positions (KV fed back from numpy,
    copied by the core, chained, in place), and one-frame codec decode_step pushes (state fed
    back from numpy, copied by the core, chained). The local frame graph is the same run in
    every contender."""
    loop = contenders["published"]
    rng = np.random.default_rng(0)
    width = int(loop.config["n_vq"]) + 1
    prompt = rng.integers(0, 1024, (1, context, width)).astype(np.int32)
    prompt[..., 0] = rng.integers(10, 1000, (1, context))
    feeds = {"input_ids": prompt, "attention_mask": np.ones((1, context), np.int32)}
    row = prompt[:, :1].copy()
    names = loop.tts_meta["onnx"]
    out = loop._run(loop.sessions["prefill"], feeds)
    past = {n.replace("present_", "past_"): out[n] for n in names["prefill_output_names"][1:]}
    state = {"length": context}

    def published_step() -> None:
        step = {"input_ids": row, "past_valid_lengths": np.array([state["length"]], np.int32)}
        step.update({n: past[n] for n in names["decode_input_names"][2:]})
        out = loop._run(loop.sessions["decode"], step)
        past.update(
            {n.replace("present_", "past_"): out[n] for n in names["decode_output_names"][1:]}
        )
        state["length"] += 1

    timers = {"published": _step_timer(published_step)}
    caches = []
    for name in ("copy", "chain", "inplace"):
        model = contenders[name]
        cache = model.pool.acquire(context + steps + 1)
        cache.prefill(model.program.prefill_lm, feeds, ["global_hidden"])
        caches.append((model, cache))

        def engine_step(cache=cache) -> None:
            lengths = np.array([cache.length], np.int32)
            step = {"input_ids": row, "past_valid_lengths": lengths}
            cache.step(step, output_names=["global_hidden"])

        timers[name] = _step_timer(engine_step)
    codes = rng.integers(0, 1024, (1, int(loop.config["n_vq"])))
    codec_state = loop.initial_codec_state()
    codec_timers = {
        "published": _step_timer(lambda: loop.decode_stream(codes.tolist(), codec_state))
    }
    streams = []
    for name in ("copy", "chain"):
        stream = contenders[name].codec.stream()
        streams.append(stream)
        codec_timers[name] = _step_timer(lambda stream=stream: stream.push(codes))
    samples: dict[tuple[str, str], list[float]] = {}
    try:
        for _ in range(steps):
            for part, group in (("global step", timers), ("codec push", codec_timers)):
                for name, timer in group.items():
                    samples.setdefault((part, name), []).append(timer())
    finally:
        for model, cache in caches:
            model.pool.release(cache)
        for stream in streams:
            stream.close()
    rows = []
    for (part, name), times in samples.items():
        base = float(np.median(samples[(part, "published")]))
        rows.append(
            {
                "part": part,
                "contender": name,
                "context": context,
                "ms": 1000 * float(np.median(times)),
                "speedup_vs_published": base / float(np.median(times)),
            }
        )
    return rows


def summarize(rows: list[dict]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for mode in MODES:
        picked = {r["contender"]: r for r in rows if r["mode"] == mode}
        if "published" not in picked:
            continue
        summary[mode] = {
            name: {
                "speedup_vs_published": row["speedup_vs_published"],
                "ms_per_frame": row["ms_per_frame"],
                "first_audio_ms": row["first_audio_ms"],
            }
            for name, row in picked.items()
        }
    return summary


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["rows"]
    figure, axes = plt.subplots(1, 3, figsize=(16, 4))
    width = 0.2
    for index, name in enumerate(CONTENDERS):
        picked = [next(r for r in rows if r["mode"] == m and r["contender"] == name) for m in MODES]
        positions = np.arange(len(MODES)) + (index - 1.5) * width
        axes[0].bar(positions, [r["ms_per_frame"] for r in picked], width, label=name)
        axes[1].bar(positions, [r["first_audio_ms"] for r in picked], width, label=name)
    batched = results.get("batched", [])
    if batched:
        streams = [r["streams"] for r in batched]
        axes[2].plot(streams, [r["audio_s_per_s"] for r in batched], "o-", label="batched engine")
        axes[2].plot(
            streams, [r["published_audio_s_per_s"] for r in batched], "s--", label="published"
        )
        axes[2].set_xticks(streams)
        axes[2].set_xlabel("concurrent streams (sample_mode fixed)")
        axes[2].set_title("audio seconds per second (higher is better)")
        axes[2].grid(alpha=0.3)
        axes[2].legend()
    titles = ("ms per frame, one stream (lower is better)", "time to first audio, ms")
    for axis, title in zip(axes[:2], titles, strict=True):
        axis.set_xticks(np.arange(len(MODES)), [f"sample_mode {m}" for m in MODES])
        axis.set_title(title)
        axis.grid(axis="y", alpha=0.3)
        axis.legend()
    shape = "small stand-in" if results["quick"] else "published shapes"
    figure.suptitle(f"MOSS-TTS-Nano, {results['frames']} frames per stream, {shape}")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small stand-in graphs, few frames")
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "moss.json")
    parser.add_argument("--plot", type=Path, default=RESULTS_DIR / "moss.png")
    parser.add_argument("--frames", type=int, help="frames per run (default 40, quick 24)")
    parser.add_argument("--repeats", type=int, help="rounds of runs (default 5, quick 1)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="ONNX Runtime intra-op threads (1: steadiest on a shared machine)",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-RSS processes")
    parser.add_argument("--probe", choices=(*CONTENDERS, "batched"), help=argparse.SUPPRESS)
    parser.add_argument("--graphs", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, default="fixed", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:  # a memory probe: load one contender, stream once, print the peak RSS
        contender = load_contender(args.probe, args.graphs, args.threads)
        run_contender(args.probe, contender, args.mode, args.frames or 24)
        # VmHWM: this process image's own peak (ru_maxrss would carry the parent's over exec).
        status = Path("/proc/self/status").read_text().splitlines()
        peak_kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
        print(peak_kib / 1024)
        return 0
    frames = args.frames or (24 if args.quick else 40)
    repeats = args.repeats or (1 if args.quick else 5)

    directory = stand_in_dir(args.quick)
    converted_dir(directory)
    load_before = os.getloadavg()
    memory: dict[str, dict[str, float]] = {mode: {} for mode in MODES}
    if not args.no_memory:
        for mode in MODES:
            for name in CONTENDERS:
                memory[mode][name] = peak_rss_mib(name, directory, mode, frames, args.threads)
    contenders = {name: load_contender(name, directory, args.threads) for name in CONTENDERS}
    for mode in MODES:  # warm-up: first runs allocate and plan
        for name, contender in contenders.items():
            run_contender(name, contender, mode, 2)
    engine = load_engine(directory, args.threads)
    batched_memory = None
    if not args.no_memory:
        batched_memory = peak_rss_mib("batched", directory, "fixed", frames, args.threads)
    run_batched(engine, "fixed", 2, MAX_BATCH)  # warm-up: slot buffers, codec states
    rows = []
    for mode in MODES:
        rows += bench_streams(contenders, mode, frames, repeats, memory[mode])
    batched = bench_batched(contenders, engine, "fixed", frames, repeats, batched_memory)
    components = []
    for context in (64, 256) if args.quick else (150, 600):
        components += bench_components(contenders, context, 10 if args.quick else 40)
    results = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_before": load_before,
            "load_after": os.getloadavg(),
        },
        "quick": args.quick,
        "frames": frames,
        "threads": args.threads,
        "graphs": str(directory),
        "rows": rows,
        "batched": batched,
        "components": components,
        "summary": {
            **summarize(rows),
            "batched_fixed": {
                f"{r['streams']} streams": {
                    "audio_s_per_s": r["audio_s_per_s"],
                    "speedup_vs_published": r["speedup_vs_published"],
                }
                for r in batched
            },
        },
    }
    write_atomically(args.json, (json.dumps(results, indent=2) + "\n").encode("utf-8"))
    plot(results, args.plot)
    print(json.dumps(results["summary"], indent=2))
    for row in batched:
        print(
            f"batched {row['streams']} stream(s): {row['audio_s_per_s']:.2f} audio s/s "
            f"(published {row['published_audio_s_per_s']:.2f}, x{row['speedup_vs_published']:.2f})"
            f", {row['ms_per_frame']:.1f} ms/frame, first audio {row['first_audio_ms']:.0f} ms"
        )
    for row in components:
        print(
            f"{row['part']:12s} context {row['context']:4d} {row['contender']:10s} "
            f"{row['ms']:7.2f} ms  x{row['speedup_vs_published']:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

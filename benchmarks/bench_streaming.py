"""Streaming benchmark (issue 5): time to first audio and real-time factor, streaming vs
one-shot, on the default bundle, in one run.

``python benchmarks/bench_streaming.py [--model DIR] [--repeats N] [--threads N]``
(``onnx-tts bench streaming`` may wrap :func:`main`).

Per repeat, the same text and seed go through ``Engine.synthesize()`` (one-shot: the first
audio is there when all of it is) and ``Engine.stream()`` with the bundle's window defaults
(first audio = first chunk), interleaved so that load from other users hits both alike.
Reported: the median over repeats of

* TTFA, time to first audio: from the call to the first samples in hand;
* RTF, real-time factor: total wall time / audio duration (< 1 is faster than real time);

plus TTFA for a few ``first_chunk_frames`` values, and how close the stream is to the one-shot
waveform (SNR) as the overlap shrinks below the vocoder's receptive field. The machine's load
average is recorded before and after, since the machine is shared.

Results: ``benchmarks/results/streaming.json`` and ``benchmarks/results/streaming.png``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make `onnx_tts` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnx_tts
from benchmarks.results_io import load_average, machine_info, save_figure, write_json
from onnx_tts.errors import InputError
from onnx_tts.pipeline import Engine

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
TEXT = (
    "Streaming lets a listener hear the first words while the rest is still being generated. "
    "This benchmark compares it with waiting for the whole utterance. "
    "Both paths use the same text, the same voice and the same seed."
)
SEED = 11
FIRST_CHUNK_SWEEP = (4, 8, 16, 32)
OVERLAP_SWEEP = (0, 1, 2, 3, 4, 5, 6, 7, 8)


def time_one_shot(engine: Engine, text: str, **options: Any) -> tuple[float, float, np.ndarray]:
    """(time to first audio, total time, samples); one-shot audio arrives all at once."""
    start = time.perf_counter()
    samples = engine.synthesize(text, seed=SEED, **options).samples
    total = time.perf_counter() - start
    return total, total, samples


def time_stream(engine: Engine, text: str, **options: Any) -> tuple[float, float, np.ndarray]:
    """(time to first audio, total time, samples) for Engine.stream()."""
    start = time.perf_counter()
    first_audio: float | None = None
    chunks = []
    for chunk in engine.stream(text, seed=SEED, **options):
        if first_audio is None:
            first_audio = time.perf_counter() - start
        chunks.append(chunk)
    total = time.perf_counter() - start
    return (first_audio or total), total, np.concatenate(chunks)


def snr_db(reference: np.ndarray, estimate: np.ndarray) -> float:
    error = float(np.sum((reference.astype(np.float64) - estimate) ** 2))
    power = float(np.sum(reference.astype(np.float64) ** 2))
    return 999.0 if error == 0 else float(10 * np.log10(power / error))  # 999: bit-exact


def summarize(values: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


def run(model: str | None, repeats: int, threads: int) -> dict[str, Any]:
    machine = machine_info()
    engine = onnx_tts.load(model, threads=threads, cache_dir=None)
    defaults = dict(engine.model.streaming_defaults)
    sample_rate = engine.sample_rate

    # Warm-up (session initialisation, allocator growth) is not part of either measurement.
    _, _, reference = time_one_shot(engine, TEXT)
    time_stream(engine, TEXT)
    duration = len(reference) / sample_rate

    modes: dict[str, dict[str, list[float]]] = {
        name: {"ttfa_s": [], "total_s": [], "rtf": []} for name in ("one_shot", "stream")
    }
    max_difference = 0.0
    for repeat in range(repeats):
        order = ("one_shot", "stream") if repeat % 2 == 0 else ("stream", "one_shot")
        for name in order:
            timer = time_one_shot if name == "one_shot" else time_stream
            ttfa, total, samples = timer(engine, TEXT)
            if len(samples) != len(reference):
                raise RuntimeError(f"{name}: {len(samples)} samples, expected {len(reference)}")
            max_difference = max(max_difference, float(np.abs(samples - reference).max()))
            modes[name]["ttfa_s"].append(ttfa)
            modes[name]["total_s"].append(total)
            modes[name]["rtf"].append(total / duration)

    first_chunk: dict[str, dict[str, float]] = {}
    for frames in FIRST_CHUNK_SWEEP:
        # A first window must be longer than the bundle's hold-back (the default voice holds
        # back 14 frames); sizes the bundle's window cannot take are left out, not errors.
        try:
            engine.streaming_options(first_chunk_frames=frames)
        except InputError:
            continue
        ttfas = [time_stream(engine, TEXT, first_chunk_frames=frames)[0] for _ in range(repeats)]
        first_chunk[str(frames)] = summarize(ttfas)

    hop = engine.model.hop_length
    quality = []
    for overlap in OVERLAP_SWEEP:
        crossfade = min(defaults["crossfade_samples"], overlap * hop)
        stride = max(defaults["stride_frames"], overlap)
        _, _, samples = time_stream(
            engine, TEXT, overlap_frames=overlap, crossfade_samples=crossfade, stride_frames=stride
        )
        quality.append(
            {
                "overlap_frames": overlap,
                "crossfade_samples": crossfade,
                "snr_db": snr_db(reference, samples),
            }
        )

    results: dict[str, Any] = {
        "benchmark": "streaming",
        "model": engine.info()["name"],
        "kv_mode": engine.model.kv_mode,
        "threads": threads,
        "repeats": repeats,
        "text_chars": len(TEXT),
        "audio_seconds": duration,
        "sample_rate": sample_rate,
        "hop_length": hop,
        "first_chunk_seconds": (
            (defaults["first_chunk_frames"] - defaults["holdback_frames"]) * hop
            - defaults["crossfade_samples"]
        )
        / sample_rate,
        "streaming_defaults": defaults,
        "receptive_field_frames": vocoder_settings(engine).get("receptive_field_frames"),
        "stream_equals_one_shot_max_abs_difference": max_difference,
        "modes": {
            name: {key: summarize(values) | {"all": values} for key, values in measured.items()}
            for name, measured in modes.items()
        },
        "ttfa_by_first_chunk_frames": first_chunk,
        "snr_by_overlap": quality,
        "machine": machine | {"loadavg_end": load_average()},
    }
    return results


def vocoder_settings(engine: Engine) -> dict[str, Any]:
    bundle = getattr(engine.model, "bundle", None)
    return dict(bundle.manifest.get("vocoder", {})) if bundle is not None else {}


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    names = ("one_shot", "stream")
    labels = ("one-shot", "streaming")
    colors = ("#888888", "#2a7ab9")
    for axis, key, title, scale in (
        (axes[0], "ttfa_s", "Time to first audio (ms)", 1000.0),
        (axes[1], "rtf", "Real-time factor (lower is faster)", 1.0),
    ):
        medians = [results["modes"][n][key]["median"] * scale for n in names]
        axis.bar(labels, medians, color=colors)
        for index, name in enumerate(names):
            points = [v * scale for v in results["modes"][name][key]["all"]]
            axis.scatter([index] * len(points), points, color="black", s=10, zorder=3)
            axis.annotate(
                f"{medians[index]:.3g}",
                (index, medians[index]),
                ha="center",
                va="bottom",
                xytext=(0, 3),
                textcoords="offset points",
            )
        axis.set_title(title)
    sweep = results["snr_by_overlap"]
    finite = [min(item["snr_db"], 120.0) for item in sweep]
    axes[2].plot([item["overlap_frames"] for item in sweep], finite, marker="o")
    axes[2].axhline(30, color="red", linestyle="--", linewidth=1, label="30 dB")
    field = results.get("receptive_field_frames")
    if field is not None:
        crossfade_frames = (
            results["streaming_defaults"]["crossfade_samples"] / results["hop_length"]
        )
        axes[2].axvline(
            field + crossfade_frames,
            color="gray",
            linestyle=":",
            label="receptive field + crossfade",
        )
    axes[2].set_xlabel("overlap_frames")
    axes[2].set_ylabel("SNR vs one-shot (dB, exact capped at 120)")
    axes[2].set_title("Stream vs one-shot waveform")
    axes[2].legend(loc="upper left")
    load = results["machine"]
    figure.suptitle(
        f"{results['model']}: {results['audio_seconds']:.1f} s of audio, "
        f"{results['repeats']} repeats (median), threads={results['threads']}, "
        f"load avg {load['loadavg_start'][0]} -> {load['loadavg_end'][0]} "
        f"on {load['cpu_count']} CPUs"
    )
    save_figure(figure, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model directory (default: bundled)")
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats per mode")
    parser.add_argument("--threads", type=int, default=1, help="ORT intra-op threads (0 = all)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="results directory")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    results = run(args.model, args.repeats, args.threads)
    write_json(args.out / "streaming.json", results)
    plot(results, args.out / "streaming.png")
    for name in ("one_shot", "stream"):
        mode = results["modes"][name]
        print(
            f"{name:9s} TTFA {mode['ttfa_s']['median'] * 1000:8.1f} ms   "
            f"RTF {mode['rtf']['median']:.3f}"
        )
    print(f"audio {results['audio_seconds']:.2f} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

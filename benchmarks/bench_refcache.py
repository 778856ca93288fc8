"""Reference-cache benchmark (issue 4): what a cache hit saves, in one run.

``python benchmarks/bench_refcache.py [--model DIR] [--redis-url URL]``, or
``onnx-tts bench refcache -- [options]``. Two measurements on the bundle's real encoder graph:

1. Per-call cost on one voice of ``--seconds`` seconds (medians; ``--repeats`` encodes,
   10x as many hits): the canonical batch-of-1 encode; computing the content key alone
   (validation + sha256 of the samples); a memory-tier hit; a disk-tier hit; and, with
   ``--redis-url``, a Redis-tier hit. A hit includes everything a request pays on the cached
   path: validation, the content key, the lookup and, below memory, reading and
   checksumming the entry.
2. Throughput of ``--requests`` requests over ``--voices`` voices (round robin, voice files
   on disk as WAV and FLAC at 44.1 kHz): each request decodes its file, resamples to the
   encoder rate and encodes, without a cache and with a fresh (empty) memory+disk cache. Run
   sequentially and with ``--threads`` concurrent workers.

Results: ``benchmarks/results/refcache.json`` and ``benchmarks/results/refcache.png``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import soundfile as sf

if __package__ in (None, ""):  # run as a script: make `onnx_tts` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results_io import machine_info, save_figure, write_json
from onnx_tts.cache.reference import ReferenceCache
from onnx_tts.encoder import VoiceEncoder
from onnx_tts.errors import InputError, ModelError
from onnx_tts.session import Session, SessionOptions, ort_version

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
# Voice files are written at a common recording rate, so each request also resamples.
FILE_RATE = 44100


def load_encoder(model_dir: Path, threads: int) -> VoiceEncoder:
    manifest_path = model_dir / "bundle.json"
    try:
        manifest = json.loads(manifest_path.read_text())
        graph = model_dir / manifest["graphs"]["encoder"]
        sample_rate = int(manifest["sample_rate"])
        hop_length = int(manifest["codec"]["hop_length"])
    except (OSError, ValueError, KeyError) as exc:
        raise ModelError(f"cannot read the encoder settings from {manifest_path}: {exc}") from exc
    session = Session(graph, SessionOptions(intra_op_threads=threads, inter_op_threads=1))
    encoder = VoiceEncoder(
        session,
        f"{manifest['name']}@{manifest['version']}",
        sample_rate,
        manifest.get("encoder", {}),
        graph_path=graph,
        hop_length=hop_length,
    )
    return encoder


def synthetic_voice(seed: int, seconds: float, rate: int) -> np.ndarray:
    """Voice-like test signal: harmonics of a wobbling pitch, syllable envelope, some noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    f0 = (100.0 + 25.0 * seed) * (1.0 + 0.05 * np.sin(2 * np.pi * 0.7 * t))
    phase = 2 * np.pi * np.cumsum(f0) / rate
    signal = sum(np.sin(h * phase) / h for h in range(1, 8))
    envelope = 0.55 + 0.45 * np.sin(2 * np.pi * 3.5 * t + seed) ** 2
    signal = signal * envelope + 0.02 * rng.standard_normal(t.shape)
    return (0.5 * signal / np.max(np.abs(signal))).astype(np.float32)


def decode_file(path: Path, sample_rate: int) -> np.ndarray:
    """onnx_tts.audio.load_audio when available (the engine's path), else soundfile + soxr."""
    try:
        from onnx_tts.audio import load_audio
    except ImportError:
        import soxr

        samples, rate = sf.read(path, dtype="float32", always_2d=True)
        mono = samples.mean(axis=1)
        if rate != sample_rate:
            mono = soxr.resample(mono, rate, sample_rate, quality="HQ")
        return np.ascontiguousarray(mono, dtype=np.float32)
    return load_audio(path, sample_rate)


def median_seconds(call: Callable[[], object], repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def per_call_costs(
    encoder: VoiceEncoder, audio: np.ndarray, repeats: int, redis_url: str | None
) -> dict:
    encode_s = median_seconds(lambda: encoder.encode(audio), repeats)
    key_s = median_seconds(lambda: encoder.key(audio), repeats * 10)
    memory_cache = ReferenceCache(disk_dir=None)
    encoder.encode_cached(audio, memory_cache)
    memory_hit_s = median_seconds(lambda: encoder.encode_cached(audio, memory_cache), repeats * 10)
    with tempfile.TemporaryDirectory() as tmp:
        disk_cache = ReferenceCache(memory_bytes=0, disk_dir=tmp)  # every lookup reads the file
        encoder.encode_cached(audio, disk_cache)
        disk_hit_s = median_seconds(lambda: encoder.encode_cached(audio, disk_cache), repeats * 10)
        disk_stats = disk_cache.stats()
    assert disk_stats["misses"] == 1, disk_stats  # all timed calls were disk hits
    redis_hit_s = None
    if redis_url is not None:
        redis_cache = ReferenceCache(
            memory_bytes=0, disk_dir=None, redis_url=redis_url, namespace="onnx-tts-bench"
        )
        redis_cache.clear(tiers=["redis"])
        encoder.encode_cached(audio, redis_cache)
        redis_hit_s = median_seconds(
            lambda: encoder.encode_cached(audio, redis_cache), repeats * 10
        )
        redis_stats = redis_cache.stats()
        redis_cache.clear(tiers=["redis"])
        if redis_stats["misses"] != 1 or redis_stats["redis"]["errors"]:
            raise InputError(f"the redis tier at {redis_url} did not serve the hits; is it up?")
    return {
        "audio_seconds": audio.size / encoder.sample_rate,
        "encode_ms": encode_s * 1e3,
        "key_ms": key_s * 1e3,
        "memory_hit_ms": memory_hit_s * 1e3,
        "disk_hit_ms": disk_hit_s * 1e3,
        "redis_hit_ms": None if redis_hit_s is None else redis_hit_s * 1e3,
        "encode_over_memory_hit": encode_s / memory_hit_s,
        "encode_over_disk_hit": encode_s / disk_hit_s,
        "entry_bytes": disk_stats["disk"]["bytes"],
    }


def run_requests(
    paths: list[Path],
    encoder: VoiceEncoder,
    cache: ReferenceCache | None,
    requests: int,
    threads: int,
) -> dict:
    order = [paths[i % len(paths)] for i in range(requests)]

    def serve(path: Path) -> dict[str, np.ndarray]:
        audio = decode_file(path, encoder.sample_rate)
        return encoder.encode(audio) if cache is None else encoder.encode_cached(audio, cache)

    start = time.perf_counter()
    if threads <= 1:
        for path in order:
            serve(path)
    else:
        cursor = iter(order)
        lock = threading.Lock()

        def worker() -> None:
            while True:
                with lock:
                    path = next(cursor, None)
                if path is None:
                    return
                serve(path)

        pool = [threading.Thread(target=worker) for _ in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
    elapsed = time.perf_counter() - start
    result = {
        "threads": threads,
        "requests": requests,
        "seconds": elapsed,
        "requests_per_second": requests / elapsed,
    }
    if cache is not None:
        stats = cache.stats()
        result.update(
            {
                "misses": stats["misses"],
                "hits": stats["hits"],
                "merged": stats["merged"],
                "compute_seconds": stats["compute_seconds"],
            }
        )
    return result


def throughput(encoder: VoiceEncoder, args: argparse.Namespace, work: Path) -> list[dict]:
    paths = []
    for index in range(args.voices):
        audio = synthetic_voice(index, args.seconds + 0.5 * index, FILE_RATE)
        suffix = ".wav" if index % 2 == 0 else ".flac"
        path = work / f"voice{index}{suffix}"
        sf.write(path, audio, FILE_RATE, subtype="PCM_16")
        paths.append(path)

    runs = []
    for threads in sorted({1, args.threads}):
        without = run_requests(paths, encoder, None, args.requests, threads)
        cache_dir = work / f"cache-{threads}"
        cache = ReferenceCache(disk_dir=cache_dir)
        with_cache = run_requests(paths, encoder, cache, args.requests, threads)
        runs.append(
            {
                "threads": threads,
                "without_cache": without,
                "with_cache": with_cache,
                "speedup": with_cache["requests_per_second"] / without["requests_per_second"],
            }
        )
    return runs


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    costs = result["per_call"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.5, 4.4))
    labels = ["encode\n(batch of 1)", "content key only\n(sha256)", "disk hit", "memory hit"]
    values = [costs["encode_ms"], costs["key_ms"], costs["disk_hit_ms"], costs["memory_hit_ms"]]
    colors = ["#c0504d", "#b0b0b0", "#4f81bd", "#9bbb59"]
    if costs.get("redis_hit_ms") is not None:
        labels.insert(2, "redis hit")
        values.insert(2, costs["redis_hit_ms"])
        colors.insert(2, "#8064a2")
    bars = left.bar(labels, values, color=colors)
    left.set_ylabel("ms per reference (median)")
    left.set_title(
        f"{costs['audio_seconds']:.1f} s reference: encode / memory hit = "
        f"x{costs['encode_over_memory_hit']:.1f}"
    )
    for bar, value in zip(bars, values, strict=True):
        left.annotate(
            f"{value:.3g} ms",
            (bar.get_x() + bar.get_width() / 2, value),
            ha="center",
            va="bottom",
        )
    left.tick_params(axis="x", labelsize=8)

    runs = result["throughput"]
    x = np.arange(len(runs))
    width = 0.38
    no_cache = [r["without_cache"]["requests_per_second"] for r in runs]
    cached = [r["with_cache"]["requests_per_second"] for r in runs]
    right.bar(x - width / 2, no_cache, width, label="no cache", color="#c0504d")
    right.bar(x + width / 2, cached, width, label="cache (memory + disk)", color="#9bbb59")
    right.set_xticks(x, [f"{r['threads']} thread(s)" for r in runs])
    right.set_ylabel("requests / s (decode + resample + encode)")
    settings = result["settings"]
    right.set_title(f"{settings['requests']} requests over {settings['voices']} voices")
    for i, run in enumerate(runs):
        right.annotate(
            f"x{run['speedup']:.1f}", (x[i] + width / 2, cached[i]), ha="center", va="bottom"
        )
    right.set_ylim(0, 1.25 * max(no_cache + cached))
    right.legend(loc="upper left")
    save_figure(fig, path)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model",
        type=Path,
        help="bundle directory (default: the codec-lm bundle, built on first use)",
    )
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--voices", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=6.0, help="length of voice 0")
    parser.add_argument("--repeats", type=int, default=10, help="timed encodes per median")
    parser.add_argument("--threads", type=int, default=4, help="concurrent request workers")
    parser.add_argument("--intra-op-threads", type=int, default=1)
    parser.add_argument(
        "--redis-url", help="also time Redis-tier hits against this server (keys are removed)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "refcache.json")
    args = parser.parse_args(argv)
    for name in ("requests", "voices", "repeats", "threads", "intra_op_threads"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be >= 1")
    if args.seconds <= 0:
        raise InputError("--seconds must be > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.model is None:
        from export.build_codec_lm import codec_lm_bundle

        args.model = codec_lm_bundle()
    encoder = load_encoder(args.model, args.intra_op_threads)
    audio = synthetic_voice(0, args.seconds, encoder.sample_rate)
    print(f"encoder: {encoder.bundle_identity}, {args.seconds:g} s reference", flush=True)
    per_call = per_call_costs(encoder, audio, args.repeats, args.redis_url)
    print(
        f"encode {per_call['encode_ms']:.2f} ms | key {per_call['key_ms']:.3f} ms | "
        f"memory hit {per_call['memory_hit_ms']:.3f} ms "
        f"(x{per_call['encode_over_memory_hit']:.1f}) | disk hit "
        f"{per_call['disk_hit_ms']:.3f} ms (x{per_call['encode_over_disk_hit']:.1f})"
        + (
            ""
            if per_call["redis_hit_ms"] is None
            else f" | redis hit {per_call['redis_hit_ms']:.3f} ms"
        ),
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        runs = throughput(encoder, args, Path(tmp))
    for run in runs:
        print(
            f"{run['threads']} thread(s): no cache "
            f"{run['without_cache']['requests_per_second']:.1f} req/s, cache "
            f"{run['with_cache']['requests_per_second']:.1f} req/s (x{run['speedup']:.1f}; "
            f"misses {run['with_cache']['misses']}, hits {run['with_cache']['hits']}, "
            f"merged {run['with_cache']['merged']})",
            flush=True,
        )
    result = {
        "benchmark": "refcache",
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "bundle": encoder.bundle_identity,
        "encoder_sha256": encoder.graph_sha256,
        "onnxruntime": ort_version(),
        "machine": machine_info(),
        "settings": {
            "requests": args.requests,
            "voices": args.voices,
            "voice_seconds": [args.seconds + 0.5 * i for i in range(args.voices)],
            "file_rate": FILE_RATE,
            "encoder_rate": encoder.sample_rate,
            "repeats": args.repeats,
            "intra_op_threads": args.intra_op_threads,
        },
        "per_call": per_call,
        "throughput": runs,
    }
    write_json(args.out, result)
    plot(result, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

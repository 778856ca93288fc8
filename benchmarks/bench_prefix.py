"""Voice-prefix KV cache benchmark (issue 16), part of ``onnx-tts bench cache``.

Time to first audio of streamed requests on a Chatterbox Turbo bundle whose LM has the Turbo
shape (24 layers, hidden 1024, 16 heads; ``turbo-small``: 4 layers, hidden 256) and whose
voice prefix (``audio_features``) is 200 tokens, with and without the prefix cache, side by
side in one run (requests alternate between the two engines; each text is asked of both). The
bundle is the project's synthetic Chatterbox export (random weights, published I/O) converted
for the in-place KV cache, built once into the benchmark graph cache. Both engines' first
chunks are compared: the prefix cache must not change a sample.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import onnx_tts
from benchmarks.bench_batch import percentile
from benchmarks.lm_graphs import cache_root

PREFIX_TOKENS = 200
SAMPLE_RATE = 24000  # the Chatterbox encoder's rate; 960 samples per prefix token
SHAPES = {
    "turbo": {"layers": 24, "hidden": 1024, "heads": 16},
    "medium": {"layers": 12, "hidden": 768, "heads": 12},  # (bench prefill)
    "turbo-small": {"layers": 4, "hidden": 256, "heads": 4},
}
TEXTS = (
    "Please hold.",
    "Your call is important to us.",
    "Press one for billing.",
    "The office opens at nine.",
    "Thank you for waiting.",
    "Your order has shipped.",
    "Say yes or no.",
    "Goodbye for now.",
)


def prefix_bundle(shape: str, log: Any = print) -> Path:
    """A synthetic Turbo bundle at `shape` with a PREFIX_TOKENS voice prefix, converted for
    the in-place KV cache; built once (atomically) into the benchmark graph cache."""
    from export import synthetic_chatterbox as synthetic
    from onnx_tts.tools.convert import convert_bundle_inplace_kv

    config = synthetic.SyntheticConfig(
        variant="turbo",
        **SHAPES[shape],
        prompt_tokens=PREFIX_TOKENS,
        stop_after=PREFIX_TOKENS + 120,  # speech tokens after the prompt before the stop wins
        precisions=("fp32",),
    )
    tag = hashlib.sha256(repr(config).encode()).hexdigest()[:16]
    final = cache_root() / f"chatterbox-prefix-{shape}-{tag}"
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    log(f"building the synthetic Turbo bundle ({shape}) into {final} (once)", flush=True)
    with tempfile.TemporaryDirectory(dir=final.parent) as tmp:
        source, converted = Path(tmp) / "source", Path(tmp) / "converted"
        synthetic.export(config, source)
        convert_bundle_inplace_kv(source, converted, check=False)
        shutil.rmtree(source)
        os.replace(converted, final)
    return final


def reference_voice(seconds: float) -> np.ndarray:
    """Voiced, amplitude-modulated synthetic speech, long enough for a full prefix."""
    rng = np.random.default_rng(7)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    phase = 2 * np.pi * np.cumsum(120 + 20 * np.sin(2 * np.pi * 0.5 * t)) / SAMPLE_RATE
    voiced = sum(np.sin(k * phase) / k for k in range(1, 8))
    envelope = 0.5 * (1 + np.sin(2 * np.pi * 3.0 * t))
    return (0.12 * voiced * envelope + 0.02 * rng.standard_normal(len(t))).astype(np.float32)


def first_chunk(engine: Any, text: str, voice: np.ndarray, seed: int) -> tuple[float, np.ndarray]:
    """Seconds to the first streamed chunk, and the chunk; the rest is cancelled."""
    started = time.perf_counter()
    stream = engine.stream(text, voice=voice, seed=seed)
    try:
        chunk = next(stream)
        return time.perf_counter() - started, chunk
    finally:
        stream.close()


def run(shape: str, rounds: int, threads: int) -> dict[str, Any]:
    """TTFA with and without the prefix cache over `rounds` passes of TEXTS."""
    bundle = prefix_bundle(shape)
    voice = reference_voice(PREFIX_TOKENS * 960 / SAMPLE_RATE + 1.0)
    settings = {"cache_dir": None, "threads": threads}
    engines = {
        "no_prefix_cache": onnx_tts.load(bundle, prefix_cache_bytes=0, **settings),
        "prefix_cache": onnx_tts.load(bundle, **settings),
    }
    prefix = len(engines["prefix_cache"].voice(voice)["audio_features"])
    for engine in engines.values():  # warm-up: sessions, the voice encode, the prefix entry
        first_chunk(engine, "Warm up.", voice, 0)
    times: dict[str, list[float]] = {name: [] for name in engines}
    identical = True
    for round_index in range(rounds):
        for index, text in enumerate(TEXTS):
            order = list(engines.items())
            if (round_index + index) % 2:
                order.reverse()  # neither arm always runs first
            chunks = {}
            for name, engine in order:
                seconds, chunks[name] = first_chunk(engine, text, voice, index)
                times[name].append(seconds)
            identical &= bool(np.array_equal(*chunks.values()))
    arms = {
        name: {
            "requests": len(values),
            "mean_ms": 1000 * statistics.fmean(values),
            "p50_ms": 1000 * percentile(values, 50),
            "p95_ms": 1000 * percentile(values, 95),
        }
        for name, values in times.items()
    }
    stats = engines["prefix_cache"].cache_stats()["prefix"]
    lm = engines["prefix_cache"].info()
    return {
        "shape": shape,
        "lm": SHAPES[shape],
        "prefix_tokens": prefix,
        "prefix_entry_bytes": stats["bytes"],
        "batched": lm["batching"]["batched"],
        **arms,
        "ttfa_mean_ratio": arms["no_prefix_cache"]["mean_ms"] / arms["prefix_cache"]["mean_ms"],
        "ttfa_p50_ratio": arms["no_prefix_cache"]["p50_ms"] / arms["prefix_cache"]["p50_ms"],
        "first_chunks_identical": identical,
        "prefix_hits": stats["hits"],
        "prefix_misses": stats["misses"],
    }

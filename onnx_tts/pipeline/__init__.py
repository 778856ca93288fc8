"""The pipeline: text + optional reference voice -> waveform, through encoder, LM and vocoder.

`load()` builds an `Engine` from a model directory and typed settings (`onnx_tts.config`);
the engine's parts live beside it: `planner` (text and options), `voices` (references),
`execution` (requests through the scheduler and the vocoder), `caching` (result cache).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from onnx_tts.bundle import resolve_model_dir
from onnx_tts.cache.codec import resolve_cache_secret
from onnx_tts.cache.prefix import PrefixCache
from onnx_tts.cache.reference import ReferenceCache
from onnx_tts.cache.result import ResultCache
from onnx_tts.config import DEFAULT_RESULT_MEMORY_BYTES, CacheConfig, EngineConfig, checked
from onnx_tts.errors import InputError
from onnx_tts.families import detect, family_of, load_model
from onnx_tts.families.base import SENTENCE_PAUSE_SECONDS, LoadSettings
from onnx_tts.pipeline.engine import Audio, Engine
from onnx_tts.pipeline.planner import Plan, Planner, Timing
from onnx_tts.pipeline.stages import threads_per_stage
from onnx_tts.pipeline.voices import VoiceLike
from onnx_tts.session import SessionOptions, available_cores

ENGINE_FIELDS = tuple(f.name for f in dataclasses.fields(EngineConfig))
CACHE_FIELDS = tuple(f.name for f in dataclasses.fields(CacheConfig))


def _path_or_none(name: str, value: Any) -> str | None:
    """A directory keyword: None, or the string "none" as the flags and ONNX_TTS_* variables
    take it (no directory; write "./none" for a directory of that name), else its path."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise InputError(f"{name} must be a directory path or None, got {value!r}")
    return os.fspath(value)


def load(
    model: str | os.PathLike[str] | None = None,
    *,
    providers: tuple[str, ...] = ("CPUExecutionProvider",),
    **settings: Any,
) -> Engine:
    """Load a model directory (default: the bundled trained voice) into an Engine.

    `settings`: any field of `onnx_tts.config.EngineConfig` (kv, threads, max_batch,
    slot_bytes, max_waiting) or `CacheConfig` (cache_dir, cache_memory_bytes,
    cache_disk_bytes, redis_url, redis_ttl_seconds, result_cache_bytes, result_cache_dir,
    result_cache_disk_bytes, prefix_cache_bytes), each checked against the bounds written
    there once; any other keyword is a load option of the model's family (`onnx-tts info`
    lists them, e.g. a precision or an expressiveness control). `providers`: ONNX
    Runtime execution providers in order of preference.
    """
    if isinstance(providers, str) or not all(isinstance(p, str) for p in providers):
        raise InputError(f"providers must be a sequence of provider names, got {providers!r}")
    engine_given = {k: settings.pop(k) for k in ENGINE_FIELDS if k in settings}
    cache_given = {k: settings.pop(k) for k in CACHE_FIELDS if k in settings}
    family_options = settings
    engine_given["model"] = _path_or_none("model", model)
    for name in ("cache_dir", "result_cache_dir"):
        if name in cache_given:
            cache_given[name] = _path_or_none(name, cache_given[name])
    config = checked(EngineConfig(**engine_given))
    caches = checked(CacheConfig(**cache_given))
    return build_engine(config, caches, providers, family_options)


def build_engine(
    config: EngineConfig,
    caches: CacheConfig,
    providers: tuple[str, ...] = ("CPUExecutionProvider",),
    family_options: dict[str, Any] | None = None,
) -> Engine:
    """An Engine from checked configs (the CLI and the server build theirs from flags)."""
    family_options = dict(family_options or {})
    root = resolve_model_dir(config.model)
    detection = detect(root, family_options)
    session_options = SessionOptions(providers=tuple(providers), intra_op_threads=config.threads)
    # --threads 0: each stage's share of the cores (explicit threads: every session that many).
    stages = threads_per_stage(available_cores()) if config.threads == 0 else None
    settings = LoadSettings(config.kv, session_options, stages)
    model = load_model(detection, settings, family_options)
    secret = resolve_cache_secret(caches.cache_secret)
    reference = ReferenceCache(
        memory_bytes=caches.cache_memory_bytes,
        disk_dir=caches.cache_dir,
        redis_url=caches.redis_url,
        redis_ttl_seconds=caches.redis_ttl_seconds,
        disk_max_bytes=caches.cache_disk_bytes,
        secret=secret,
    )
    results = None
    result_bytes = caches.result_cache_bytes
    if result_bytes is None and caches.result_cache_dir not in (None, "default"):
        result_bytes = DEFAULT_RESULT_MEMORY_BYTES  # a directory alone turns the cache on
    if result_bytes is not None:
        results = ResultCache(
            result_bytes,
            disk_dir=caches.result_cache_dir,
            redis_url=caches.redis_url,
            redis_ttl_seconds=caches.redis_ttl_seconds,
            disk_max_bytes=caches.result_cache_disk_bytes,
            secret=secret,
            sample_rate=model.sample_rate,
            channels=model.channels,
        )
    prefixes = PrefixCache(caches.prefix_cache_bytes) if caches.prefix_cache_bytes else None
    # Prompts run on prefill workers beside the decode step, each with the decode stage's
    # threads (decoding/prefill.py).
    decode_threads = stages["decode"] if stages is not None else config.threads
    prefill_workers = max(1, min(config.max_batch, available_cores() // max(1, decode_threads)))
    return Engine(
        model,
        reference,
        family_of(detection),
        config.max_batch,
        results,
        prefixes,
        slot_bytes=config.slot_bytes,
        max_waiting=config.max_waiting,
        lookahead=config.lookahead,
        prefill_workers=prefill_workers,
        policy=config.policy,
        prefill=config.prefill,
    )


__all__ = [
    "SENTENCE_PAUSE_SECONDS",
    "Audio",
    "Engine",
    "Plan",
    "Planner",
    "Timing",
    "VoiceLike",
    "build_engine",
    "load",
]

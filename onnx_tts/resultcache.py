"""Cache of finished syntheses: the same model, text, voice and options give the same audio.

Real TTS traffic repeats itself ("Please hold.", menu options, the same few voices), and a
deterministic request (greedy, or seeded) always produces the same samples, so its audio can
be stored once and served from then on. The tiers, entry format, checksums, single flight and
failure handling are those of the reference cache (:class:`onnx_tts.refcache.TieredCache`):
memory (a byte budget), disk (atomic, checksummed files) and an optional Redis shared by
several servers ("replicas"); a tier that fails is logged and skipped, never failing a request.

Values are format-independent: float32 mono PCM plus its sample rate (encoding to WAV, FLAC
or OGG happens on the way out). The memory tier evicts least-frequently-used entries with
aging: on the Zipf(1.1) workload of benchmarks/bench_cache.py it keeps more hits than LRU when
the budget is tight (see the policy table that benchmark writes).

The key (:func:`result_key`) is a sha256 over the model's identity (:func:`model_identity`:
family, graph hashes and load settings), the text as the model consumes it (the normalised
token chunks), the encoded voice's content, and every option that changes the audio (seed
included).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from onnx_tts.bundle import file_sha256
from onnx_tts.errors import CacheError, InputError
from onnx_tts.refcache import ReferenceCache, TieredCache, _cli_cache, cache_root

__all__ = [
    "CACHES",
    "DEFAULT_RESULT_MEMORY_BYTES",
    "MAX_RESULT_SECONDS",
    "RESULT_MARKER_NAME",
    "ResultCache",
    "all_cache_stats",
    "clear_caches",
    "default_result_dir",
    "model_identity",
    "replay_chunks",
    "request_digest",
    "result_key",
]

DEFAULT_RESULT_MEMORY_BYTES = 64 << 20
RESULT_MARKER_NAME = ".onnx-tts-resultcache"
# Bound on a stored result: longer than any request the text limit allows, far below what
# would let a hostile entry allocate gigabytes.
MAX_RESULT_SECONDS = 3600
_MIN_RATE, _MAX_RATE = 1000, 384000
_KEY_DOMAIN = b"onnx-tts/resultcache/v1\x00"
_REQUEST_DOMAIN = b"onnx-tts/resultcache/request/v1\x00"
# Remembered request -> key aliases (per process, least recently used dropped first).
MAX_ALIASES = 1 << 16


def default_result_dir() -> Path:
    """``$XDG_CACHE_HOME/onnx-tts/resultcache``, or ``~/.cache/onnx-tts/resultcache``."""
    return cache_root() / "resultcache"


class ResultCache(TieredCache):
    """Memory / disk / Redis cache of synthesised audio (see the module docstring).

    Same arguments as :class:`onnx_tts.refcache.ReferenceCache`; ``disk_dir="default"`` is
    :func:`default_result_dir`. Values are ``{"samples": float32 [n], "sample_rate": int64
    []}``; use :meth:`get_audio` / :meth:`put_audio`.
    """

    label = "result cache"
    redis_segment = "resultcache"
    marker_name = RESULT_MARKER_NAME
    memory_policy = "lfu"

    def __init__(
        self, memory_bytes: int = DEFAULT_RESULT_MEMORY_BYTES, *args: Any, **kwargs: Any
    ) -> None:
        super().__init__(memory_bytes, *args, **kwargs)
        # A hit must cost far less than text processing, so a request seen before is mapped
        # straight to its key (the phonemiser and voice encoder are skipped on a repeat).
        self._aliases: OrderedDict[str, str] = OrderedDict()
        self._alias_lock = threading.Lock()
        self._sentence_counts = {"hits": 0, "misses": 0, "stored": 0}

    def get_sentence(self, key: str) -> np.ndarray | None:
        """The samples of one sentence of an earlier text (see Engine.synthesize), or None;
        counted apart from whole results in ``stats()["sentences"]``."""
        value = self.get(key)
        with self._alias_lock:
            self._sentence_counts["hits" if value is not None else "misses"] += 1
        return None if value is None else value["samples"]

    def put_sentence(self, key: str, samples: np.ndarray, sample_rate: int) -> None:
        self.put_audio(key, samples, sample_rate)
        with self._alias_lock:
            self._sentence_counts["stored"] += 1

    def stats(self) -> dict:
        with self._alias_lock:
            sentences = dict(self._sentence_counts)
        return {**super().stats(), "sentences": sentences}

    def remember(self, request: str | None, key: str) -> None:
        """Map a request digest (:func:`request_digest`) to its result key."""
        if request is None:
            return
        with self._alias_lock:
            self._aliases[request] = key
            self._aliases.move_to_end(request)
            if len(self._aliases) > MAX_ALIASES:
                self._aliases.popitem(last=False)

    def recall(self, request: str | None) -> dict[str, np.ndarray] | None:
        """The value of a remembered request if the memory tier holds it (counted as a memory
        hit), else None without counting: the caller then takes the full path."""
        if request is None:
            return None
        with self._alias_lock:
            key = self._aliases.get(request)
        return None if key is None else self.memory_lookup(key)

    @staticmethod
    def default_dir() -> Path:
        return default_result_dir()

    def get_audio(self, key: str) -> tuple[np.ndarray, int] | None:
        """(samples, sample_rate) stored under ``key`` in any tier, or None (a counted miss).
        The samples are read-only."""
        value = self.lookup(key)
        if value is None:
            return None
        return value["samples"], int(value["sample_rate"])

    def put_audio(self, key: str, samples: np.ndarray, sample_rate: int) -> None:
        """Store one result in every tier; non-finite or mis-shaped audio is refused
        (CacheError) and nothing is stored."""
        self.put(
            key,
            {
                "samples": np.asarray(samples, dtype=np.float32),
                "sample_rate": np.asarray(sample_rate, dtype=np.int64),
            },
        )

    def _check_value(self, arrays: Mapping[str, np.ndarray]) -> None:
        problem = self._value_problem(arrays)
        if problem is not None:
            raise CacheError(f"refusing to cache this result: {problem}")

    def _value_problem(self, arrays: Mapping[str, np.ndarray]) -> str | None:
        if set(arrays) != {"samples", "sample_rate"}:
            return f"holds arrays {sorted(arrays)}, expected samples and sample_rate"
        samples, rate = arrays["samples"], arrays["sample_rate"]
        if rate.shape != () or rate.dtype.kind not in "iu":
            return f"sample_rate has shape {rate.shape} and dtype {rate.dtype}, expected an int"
        if not _MIN_RATE <= int(rate) <= _MAX_RATE:
            return f"sample rate {int(rate)} is outside [{_MIN_RATE}, {_MAX_RATE}]"
        if samples.ndim != 1 or samples.dtype != np.float32:
            return f"samples are {samples.dtype} {samples.shape}, expected 1-D float32"
        if samples.shape[0] > MAX_RESULT_SECONDS * int(rate):
            return f"{samples.shape[0]} samples is longer than {MAX_RESULT_SECONDS} s"
        if not np.isfinite(samples).all():
            return "samples hold NaN or infinite values"
        return None


CACHES = ("reference", "result", "prefix")


def _cli_caches(
    reference_dir: str | os.PathLike[str] | None,
    result_dir: str | os.PathLike[str] | None,
    redis_url: str | None,
) -> dict[str, TieredCache]:
    from onnx_tts.decoding.prefix_cache import PrefixCache

    return {
        "reference": _cli_cache(reference_dir, redis_url, ReferenceCache),
        "result": _cli_cache(result_dir, redis_url, ResultCache),
        # Memory only: its entries live (and are counted) in each serving process.
        "prefix": PrefixCache(memory_bytes=0),
    }


def all_cache_stats(
    reference_dir: str | os.PathLike[str] | None = "default",
    result_dir: str | os.PathLike[str] | None = "default",
    redis_url: str | None = None,
) -> dict[str, dict]:
    """``{"reference": ..., "result": ..., "prefix": ...}``: the shared tiers of every cache,
    for ``onnx-tts cache stats``; creates nothing on disk. (Hit counters, and the prefix
    cache's entries, live in each serving process: see its /metrics.)"""
    caches = _cli_caches(reference_dir, result_dir, redis_url)
    return {name: cache.stats() for name, cache in caches.items()}


def clear_caches(
    which: str | None = None,
    reference_dir: str | os.PathLike[str] | None = "default",
    result_dir: str | os.PathLike[str] | None = "default",
    redis_url: str | None = None,
) -> dict[str, dict[str, int]]:
    """Empty the disk and Redis tiers of one cache (``which``: "reference", "result" or
    "prefix", which has none: it empties with its process) or of all of them, for ``onnx-tts
    cache clear [--tier ...]``; entries removed per cache and tier. A disk directory without
    the cache's marker file is refused (CacheError)."""
    if which is not None and which not in CACHES:
        raise InputError(f"unknown cache {which!r}; choose from {', '.join(CACHES)}")
    caches = _cli_caches(reference_dir, result_dir, redis_url)
    chosen = CACHES if which is None else (which,)
    return {name: caches[name].clear(tiers=("disk", "redis")) for name in chosen}


def model_identity(backend: Any) -> str:
    """A stable fingerprint of a loaded model: its family, the sha256 of each graph (from the
    bundle manifest when there is one, else hashed here once) and its load settings
    (``info()``: KV mode, precision, ...), so two processes loading the same files with the
    same settings agree, and any change of graph or setting gives another identity."""
    info = dict(backend.info())
    info.pop("batching", None)  # how requests are grouped, not what they sound like
    bundle = getattr(backend, "bundle", None)
    hashes = dict(getattr(bundle, "manifest", {}).get("sha256", {}) or {}) if bundle else {}
    root = info.get("path")
    if not hashes and root and Path(root).is_dir():
        hashes = {
            str(path.relative_to(root)): file_sha256(path)
            for path in sorted(Path(root).rglob("*"))
            if path.is_file() and path.suffix in (".onnx", ".data", ".json", ".bin")
        }
    info.pop("path", None)  # the same files elsewhere are the same model
    text = json.dumps(
        {"family": backend.family, "graphs": hashes, "info": info},
        sort_keys=True,
        default=str,
        separators=(",", ":"),
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def request_digest(
    identity: str, text: Any, voice: Any, seed: Any, options: Mapping[str, Any]
) -> str | None:
    """Digest of a request as given (before text processing), or None when it cannot be keyed
    that way: a voice given as a file path (the file may change; its decoded content is keyed
    later) or option values that are not plain data."""
    digest = hashlib.sha256(_REQUEST_DOMAIN)
    if voice is None:
        digest.update(b"default-voice\x00")
    elif isinstance(voice, np.ndarray):
        _update_arrays(digest, {"": voice})
    elif isinstance(voice, Mapping) and all(isinstance(v, np.ndarray) for v in voice.values()):
        _update_arrays(digest, voice)
    else:
        return None
    text_part = text.hex() if isinstance(text, bytes) else text
    try:
        settings = json.dumps(
            [identity, type(text).__name__, text_part, seed, dict(options)],
            sort_keys=True,
            default=_json_default,
        )
    except (TypeError, ValueError):
        return None
    digest.update(settings.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def _update_arrays(digest: Any, arrays: Mapping[str, np.ndarray]) -> None:
    for name in sorted(arrays):
        array = np.ascontiguousarray(arrays[name])
        header = f"{name}|{array.dtype.str}|{array.shape}\x00".encode()
        digest.update(struct.pack("<Q", len(header)) + header)
        digest.update(memoryview(array).cast("B") if array.nbytes else b"")


def result_key(
    identity: str,
    chunks: list[Any],
    voice: Mapping[str, np.ndarray],
    sampling: Any,
    options: Mapping[str, Any],
) -> str | None:
    """Key of one request: model identity, the text chunks the model consumes (so texts that
    normalise alike share an entry), the encoded voice's content, the sampling options (seed
    included) and the family's request options. None when a part is not plain data."""
    digest = hashlib.sha256(_KEY_DOMAIN)
    settings = {"model": identity, "chunks": chunks, "sampling": sampling, "options": options}
    try:
        text = json.dumps(settings, sort_keys=True, separators=(",", ":"), default=_json_default)
    except (TypeError, ValueError):
        return None  # an option or chunk that is not plain data: not cacheable
    digest.update(text.encode("utf-8", "surrogatepass"))
    _update_arrays(digest, voice)
    return digest.hexdigest()


def _json_default(value: Any) -> Any:
    """JSON form of the non-JSON parts of a key; anything else is refused (TypeError) rather
    than keyed by a repr that might not capture it."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, np.ndarray):
        return {"dtype": value.dtype.str, "shape": value.shape, "values": value.tolist()}
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot key a result on a {type(value).__name__}")


def replay_chunks(samples: np.ndarray, first: int, stride: int) -> Iterator[np.ndarray]:
    """A cached result as a stream: writable float32 chunks of `first`, then `stride` samples
    (the sizes a live stream emits), all available at once."""
    if first < 1 or stride < 1:
        raise InputError(f"chunk sizes must be >= 1 sample, got {first} and {stride}")
    start = 0
    size = first
    while start < len(samples):
        yield np.array(samples[start : start + size], dtype=np.float32)
        start += size
        size = stride

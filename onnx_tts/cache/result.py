"""Cache of finished syntheses: the same model, text, voice and options give the same audio.

Real TTS traffic repeats itself ("Please hold.", menu options, the same few voices), and a
deterministic request (greedy, or seeded) always produces the same samples, so its audio can
be stored once and served from then on. Tiers, entry format, single flight and failure
handling are those of every typed cache (:mod:`onnx_tts.cache.typed`): memory (a byte budget,
LFU with aging: on the Zipf(1.1) workload of benchmarks/bench_cache.py it keeps more hits than
LRU when the budget is tight), disk and an optional Redis shared by several servers
("replicas").

Values are format-independent: float32 PCM plus its sample rate (encoding to WAV, FLAC or OGG
happens on the way out). A value read back must be float32 samples of the model's channels
within +-MAX_SAMPLE_PEAK at the model's sample rate, at most MAX_RESULT_SECONDS long.

The key (:func:`result_key`) is a sha256 over the model's identity (:func:`model_identity`:
family, graph hashes and load settings), the text as the model consumes it (the normalised
token chunks), the encoded voice's content, and every option that changes the audio (seed
included).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import struct
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from onnx_tts.audio import MAX_REFERENCE_PEAK
from onnx_tts.bundle import file_sha256
from onnx_tts.cache.schema import ArraySpec, Schema
from onnx_tts.cache.typed import TypedCache
from onnx_tts.errors import InputError

__all__ = [
    "DEFAULT_RESULT_MEMORY_BYTES",
    "MAX_RESULT_SECONDS",
    "MAX_SAMPLE_PEAK",
    "RESULT_MARKER_NAME",
    "ResultCache",
    "directory_hashes",
    "model_identity",
    "replay_chunks",
    "request_digest",
    "result_key",
    "result_schema",
]

DEFAULT_RESULT_MEMORY_BYTES = 64 << 20
RESULT_MARKER_NAME = ".onnx-tts-resultcache"
# Bound on a stored result: longer than any request the text limit allows, far below what
# would let a hostile entry allocate gigabytes.
MAX_RESULT_SECONDS = 3600
_MIN_RATE, _MAX_RATE = 1000, 384000
# Bound on stored samples: full scale is 1.0, and the models' outputs stay near it (peaks of
# 0.2-0.3 on the bundled voices). 24 dB above full scale is a broken or scaled buffer, not
# speech: the same limit as for reference audio (audio.MAX_REFERENCE_PEAK). An entry scaled
# x1000 peaks in the hundreds and is refused.
MAX_SAMPLE_PEAK = MAX_REFERENCE_PEAK
_KEY_DOMAIN = b"onnx-tts/resultcache/v1\x00"
_REQUEST_DOMAIN = b"onnx-tts/resultcache/request/v1\x00"
# Remembered request -> key aliases (per process, least recently used dropped first).
MAX_ALIASES = 1 << 16


def result_schema(sample_rate: int | None = None, channels: int = 1) -> Schema:
    """A result: float32 samples ([n] for mono, [n, channels] otherwise) within
    +-MAX_SAMPLE_PEAK and an int64 sample rate equal to ``sample_rate`` (the model's; None:
    any rate in [1000, 384000] Hz)."""
    low, high = (_MIN_RATE, _MAX_RATE) if sample_rate is None else (sample_rate, sample_rate)
    return Schema(
        arrays={
            "samples": ArraySpec(
                ("float32",),
                (None,) if channels == 1 else (None, channels),
                -MAX_SAMPLE_PEAK,
                MAX_SAMPLE_PEAK,
                max_size=MAX_RESULT_SECONDS * high * channels,
            ),
            "sample_rate": ArraySpec(("int64",), (), low, high),
        }
    )


class ResultCache(TypedCache):
    """Memory / disk / Redis cache of synthesised audio (see the module docstring).

    Arguments: those of :class:`onnx_tts.cache.typed.TypedCache` (memory 64 MiB by default;
    default directory ``~/.cache/onnx-tts/resultcache``), plus ``sample_rate`` and
    ``channels``: the model's, which every value read back must have (sample_rate None: any
    plausible rate, for maintenance tools). Values are ``{"samples": float32 [n] or [n,
    channels], "sample_rate": int64 []}``; use :meth:`get_audio` / :meth:`put_audio`.
    """

    label = "result cache"
    redis_segment = "resultcache"
    marker_name = RESULT_MARKER_NAME
    dir_name = "resultcache"
    memory_policy = "lfu"

    def __init__(
        self,
        memory_bytes: int = DEFAULT_RESULT_MEMORY_BYTES,
        *args: Any,
        sample_rate: int | None = None,
        channels: int = 1,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("schema", result_schema(sample_rate, channels))
        super().__init__(memory_bytes, *args, **kwargs)
        self.sample_rate = sample_rate
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

    def get_audio(self, key: str) -> tuple[np.ndarray, int] | None:
        """(samples, sample_rate) stored under ``key`` in any tier, or None (a counted miss).
        The samples are read-only."""
        value = self.lookup(key)
        if value is None:
            return None
        return value["samples"], int(value["sample_rate"])

    def put_audio(self, key: str, samples: np.ndarray, sample_rate: int) -> None:
        """Store one result in every tier; audio that is not a valid result (non-finite,
        mis-shaped, another rate than the model's) is refused (CacheError), nothing stored."""
        self.put(
            key,
            {
                "samples": np.asarray(samples, dtype=np.float32),
                "sample_rate": np.asarray(sample_rate, dtype=np.int64),
            },
        )


def model_identity(model: Any) -> str:
    """A stable fingerprint of a loaded model (a family's `Model`): its family, the sha256 of
    each of its files (`model.file_hashes()`) and its load settings (``info()``: KV mode,
    precision, ...), so two processes loading the same files with the same settings agree,
    and any change of graph or setting gives another identity."""
    info = dict(model.info())
    info.pop("batching", None)  # how requests are grouped, not what they sound like
    hashes = model.file_hashes()
    info.pop("path", None)  # the same files elsewhere are the same model
    text = json.dumps(
        {"family": model.family, "graphs": hashes, "info": info},
        sort_keys=True,
        default=str,
        separators=(",", ":"),
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def directory_hashes(root: str | Path) -> dict[str, str]:
    """sha256 of every model file (.onnx .data .json .bin) under `root`, by relative path."""
    root = Path(root)
    return {
        str(path.relative_to(root)): file_sha256(path)
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.suffix in (".onnx", ".data", ".json", ".bin")
    }


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

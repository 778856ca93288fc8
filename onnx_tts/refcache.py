"""Content-addressed cache of reference-encoder outputs.

The cache promises one thing: the same audio content, encoded by the same encoder, always
yields the same value, whatever the arrival order of requests. Keys are therefore a hash of
the encoder identity and of the decoded audio samples (see :func:`make_key`), and values are
the outputs of a canonical batch-of-1 encode supplied by the caller's ``compute`` function.

Tiers, looked up in order:

* memory: an LRU bounded in bytes (per process);
* disk: one file per key, written atomically, with a checksum so that a corrupt or truncated
  file is detected, logged, removed and recomputed; optionally bounded in bytes (LRU by
  file mtime, refreshed on hits), shared by every process that uses the directory;
* redis (optional): the same checksummed blobs, shared by several servers. A Redis that is
  down is logged and skipped; it never fails a request.

Concurrent requests for one key that misses every tier run ``compute`` exactly once per
process; the others wait for it ("merged" in the stats). A hit in a lower tier is copied into
the tiers above it (Redis -> disk -> memory).

Values are dicts of numpy arrays. Returned arrays are read-only views of an immutable buffer,
so callers cannot corrupt the cache through them; copy them if you need to write.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import re
import struct
import tempfile
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from onnx_tts.audio import as_mono_float32
from onnx_tts.errors import CacheError, InputError

__all__ = [
    "DEFAULT_MEMORY_BYTES",
    "MARKER_NAME",
    "TIERS",
    "ReferenceCache",
    "TieredCache",
    "cache_stats",
    "clear_cache",
    "decode_value",
    "default_disk_dir",
    "encode_value",
    "format_stats",
    "make_key",
]

log = logging.getLogger(__name__)

DEFAULT_MEMORY_BYTES = 256 * 1024 * 1024
TIERS = ("memory", "disk", "redis")

# Blob layout: MAGIC | u32 LE header length | JSON header | zero padding | array payloads
# (each starting on a 64-byte boundary) | sha256 of everything before it (32 bytes).
_MAGIC = b"OTTSRC1\n"
_DIGEST_BYTES = 32
_ALIGN = 64
# Only plain numeric dtypes: no object arrays, so decoding never unpickles anything.
_ALLOWED_DTYPE_KINDS = frozenset("biufc")
_KEY_PATTERN = re.compile(r"^[0-9a-f]{64}$")
_KEY_DOMAIN = b"onnx-tts/refcache/v1\x00"
_DISK_SUFFIX = ".otc"
_TMP_PREFIX = ".tmp-"
# Written into a directory the cache created (or found empty): `clear` deletes only there.
MARKER_NAME = ".onnx-tts-refcache"
# Bounds on what a stored entry may describe (a checksum only proves the writer's intent).
_MAX_ARRAYS = 64
_MAX_NDIM = 8
_MAX_DIM = 2**31 - 1
# After a Redis failure the tier is skipped for this long, so that a dead server costs one
# connect timeout per interval instead of one per request.
_REDIS_RETRY_SECONDS = 30.0
# LFU-with-aging memory tier: every this many lookups all frequencies are halved, so that
# yesterday's popular entries cannot squat forever; frequencies of keys not in memory are kept
# for at most this many keys (a bound on the bookkeeping, whatever the traffic).
_LFU_AGING_PERIOD = 1000
_LFU_MAX_TRACKED = 1 << 16
MEMORY_POLICIES = ("lru", "lfu")


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/onnx-tts``, or ``~/.cache/onnx-tts``: home of every disk cache."""
    base = os.environ.get("XDG_CACHE_HOME") or ""
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".cache"
    return root / "onnx-tts"


def default_disk_dir() -> Path:
    """``$XDG_CACHE_HOME/onnx-tts/refcache``, or ``~/.cache/onnx-tts/refcache``."""
    return cache_root() / "refcache"


def make_key(encoder_identity: str, audio: np.ndarray) -> str:
    """Cache key of ``audio`` (mono samples at the encoder's rate) for one encoder.

    sha256 over the encoder identity, the dtype and shape, and the float32 little-endian bytes
    of the samples. Two files that decode to the same samples (WAV and FLAC, say) share a key;
    two encoders with different identities never do.
    """
    if not isinstance(encoder_identity, str) or not encoder_identity:
        raise InputError("encoder_identity must be a non-empty string (VoiceEncoder.identity)")
    samples = as_mono_float32(audio, dtype="<f4")
    digest = hashlib.sha256()
    digest.update(_KEY_DOMAIN)
    identity_bytes = encoder_identity.encode("utf-8")
    digest.update(struct.pack("<Q", len(identity_bytes)))
    digest.update(identity_bytes)
    digest.update(f"<f4|{samples.shape[0]}\x00".encode("ascii"))
    digest.update(memoryview(samples).cast("B"))
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# Serialisation


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def encode_value(key: str, arrays: Mapping[str, np.ndarray]) -> bytes:
    """Serialise ``arrays`` into a self-describing blob that carries ``key`` and a sha256."""
    if not isinstance(arrays, Mapping) or not arrays:
        raise CacheError(
            "the cache's compute function must return a non-empty dict of numpy arrays, "
            f"got {type(arrays).__name__}"
        )
    specs = []
    payloads = []
    for name, value in arrays.items():
        if not isinstance(name, str) or not isinstance(value, np.ndarray):
            raise CacheError(
                f"cache values must map str -> numpy.ndarray; entry {name!r} is "
                f"{type(value).__name__}"
            )
        if value.dtype.kind not in _ALLOWED_DTYPE_KINDS:
            raise CacheError(
                f"cache array {name!r} has dtype {value.dtype}; only numeric dtypes can be cached"
            )
        # np.require keeps 0-d arrays 0-d (ascontiguousarray would make them 1-d).
        little = np.require(value, dtype=value.dtype.newbyteorder("<"), requirements="C")
        specs.append({"name": name, "dtype": little.dtype.str, "shape": list(little.shape)})
        payloads.append(memoryview(little).cast("B") if little.nbytes else b"")
    header = json.dumps({"format": 1, "key": key, "arrays": specs}, separators=(",", ":"))
    header_bytes = header.encode("utf-8")

    out = bytearray(_MAGIC)
    out += struct.pack("<I", len(header_bytes))
    out += header_bytes
    for payload in payloads:
        out += b"\x00" * (_aligned(len(out)) - len(out))
        out += payload
    out += hashlib.sha256(out).digest()
    return bytes(out)


class _CorruptEntry(Exception):
    """A blob failed validation; the message says why."""


def decode_value(blob: bytes, expected_key: str | None = None) -> dict[str, np.ndarray]:
    """Parse a blob from :func:`encode_value`; arrays are read-only views into ``blob``.

    Raises ``CacheError`` when the blob is truncated, corrupt, or stored under another key.
    """
    try:
        return _decode(blob, expected_key)
    except _CorruptEntry as exc:
        raise CacheError(f"corrupt reference-cache entry: {exc}") from None


def _decode(blob: bytes, expected_key: str | None) -> dict[str, np.ndarray]:
    # The arrays must view an immutable buffer; bytes(bytes_obj) does not copy.
    blob = bytes(blob)
    min_len = len(_MAGIC) + 4 + _DIGEST_BYTES
    if len(blob) < min_len:
        raise _CorruptEntry(f"{len(blob)} bytes is shorter than the smallest entry")
    if not blob.startswith(_MAGIC):
        raise _CorruptEntry("bad magic (not a reference-cache entry)")
    body_end = len(blob) - _DIGEST_BYTES
    if hashlib.sha256(memoryview(blob)[:body_end]).digest() != blob[body_end:]:
        raise _CorruptEntry("checksum mismatch (truncated or modified)")
    (header_len,) = struct.unpack_from("<I", blob, len(_MAGIC))
    header_start = len(_MAGIC) + 4
    if header_start + header_len > body_end:
        raise _CorruptEntry("header runs past the end of the entry")
    try:
        header = json.loads(blob[header_start : header_start + header_len])
        specs = header["arrays"]
        stored_key = header["key"]
    except (ValueError, KeyError, TypeError) as exc:
        raise _CorruptEntry(f"unreadable header ({exc})") from None
    if not isinstance(header, dict) or header.get("format") != 1:
        raise _CorruptEntry(
            f"unknown format {header.get('format') if isinstance(header, dict) else header!r}"
        )
    if not isinstance(specs, list) or not 1 <= len(specs) <= _MAX_ARRAYS:
        raise _CorruptEntry(f"holds {len(specs) if isinstance(specs, list) else 'no'} arrays")
    if expected_key is not None and stored_key != expected_key:
        raise _CorruptEntry(f"entry holds key {stored_key!r}, expected {expected_key!r}")

    arrays: dict[str, np.ndarray] = {}
    offset = header_start + header_len
    for spec in specs:
        name, dtype, shape = _array_spec(spec)
        if name in arrays:
            raise _CorruptEntry(f"array {name!r} appears twice")
        # Python ints: a declared [2**32, 2**32] must not wrap around to a small count.
        count = math.prod(shape)
        offset = _aligned(offset)
        end = offset + count * dtype.itemsize
        if end > body_end:
            raise _CorruptEntry(f"array {name!r} {list(shape)} runs past the end of the entry")
        array = np.frombuffer(blob, dtype=dtype, count=count, offset=offset).reshape(shape)
        if dtype.kind in "fc" and not np.isfinite(array).all():
            raise _CorruptEntry(f"array {name!r} holds NaN or infinite values")
        arrays[name] = array
        offset = end
    return arrays


def _array_spec(spec: object) -> tuple[str, np.dtype, tuple[int, ...]]:
    """(name, dtype, shape) of one header entry, each checked for type and bounds."""
    if not isinstance(spec, dict):
        raise _CorruptEntry(f"bad array description {spec!r}")
    name, dtype_text, shape = spec.get("name"), spec.get("dtype"), spec.get("shape")
    if not isinstance(name, str) or not name or not isinstance(dtype_text, str):
        raise _CorruptEntry(f"bad array description {spec!r}")
    try:
        dtype = np.dtype(dtype_text)
    except (TypeError, ValueError):
        raise _CorruptEntry(f"array {name!r} has unknown dtype {dtype_text!r}") from None
    if dtype.kind not in _ALLOWED_DTYPE_KINDS or dtype.str != dtype_text:
        raise _CorruptEntry(f"array {name!r} has dtype {dtype_text!r}; numeric only")
    if (
        not isinstance(shape, list)
        or len(shape) > _MAX_NDIM
        or not all(type(d) is int and 0 <= d <= _MAX_DIM for d in shape)
    ):
        raise _CorruptEntry(f"array {name!r} has an impossible shape {shape!r}")
    return name, dtype, tuple(shape)


def check_finite_value(arrays: Mapping[str, np.ndarray]) -> None:
    """InputError when a value to cache holds NaN or infinity: it would poison every later
    request for that voice."""
    for name, array in arrays.items():
        finite = not isinstance(array, np.ndarray) or array.dtype.kind not in "fc"
        if not finite and not np.isfinite(array).all():
            raise InputError(
                f"the voice encoder produced NaN or infinite values ({name!r}) for this "
                "reference audio; nothing was cached. Check the audio (extremely loud or "
                "corrupt?) and the encoder graph"
            )


# ---------------------------------------------------------------------------------------------
# The cache


@dataclass
class _Flight:
    """One in-progress lookup/compute that concurrent requests for the same key join."""

    done: threading.Event = field(default_factory=threading.Event)
    value: dict[str, np.ndarray] | None = None
    error: BaseException | None = None


@dataclass
class _Counters:
    requests: int = 0
    hits_memory: int = 0
    hits_disk: int = 0
    hits_redis: int = 0
    misses: int = 0
    merged: int = 0
    compute_errors: int = 0
    compute_seconds: float = 0.0
    evictions_memory: int = 0
    evictions_disk: int = 0
    corrupt_disk: int = 0
    corrupt_redis: int = 0
    errors_disk: int = 0
    errors_redis: int = 0


class TieredCache:
    """Memory / disk / Redis cache of dicts of numeric arrays, with single flight.

    Subclasses say what they cache through the class attributes below (log label, Redis key
    segment, marker file, default directory, memory policy) and may check values before
    they are stored (:meth:`_check_value`).

    Args:
        memory_bytes: bound of the in-process tier, counted in serialised bytes; 0 disables it.
            Evicts by ``memory_policy``: ``"lru"`` (least recently used) or ``"lfu"`` (least
            frequently used, frequencies halved every 1,000 lookups; ties go to the least
            recently used).
        disk_dir: directory of the disk tier. The default (``"default"``) is
            :func:`default_disk_dir`; ``None`` disables the tier.
        redis_url: ``redis://host:port/db`` (or ``unix://``) of a shared Redis; ``None``
            disables the tier.
        namespace: prefix of the Redis keys, so that several deployments can share a server.
        redis_ttl_seconds: expiry of Redis entries; ``None`` keeps them until evicted.
        disk_max_bytes: bound of the disk tier; when a write takes it over, the least recently
            used files (by mtime, refreshed on every hit) are removed down to 90 % of it.
            ``None``: unbounded. Shared by every process using the directory.
        create_disk_dir: create the directory (and its marker) if missing; False for
            read-only uses such as ``cache stats``, which must not create directories.
    """

    label = "cache"  # in log lines and errors
    redis_segment = "cache"  # Redis keys are <namespace>:<segment>:<key>
    marker_name = ".onnx-tts-cache"
    memory_policy = "lru"

    @staticmethod
    def default_dir() -> Path:
        raise NotImplementedError

    def _check_value(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Raise if ``arrays`` must not be stored (called on every computed value)."""

    def _value_problem(self, arrays: Mapping[str, np.ndarray]) -> str | None:
        """Why a checksum-valid stored value cannot be this cache's value (wrong arrays or
        shapes), or None; such entries are dropped and recomputed like corrupt ones."""
        return None

    def _load(self, blob: bytes, key: str) -> dict[str, np.ndarray]:
        value = _decode(blob, key)
        problem = self._value_problem(value)
        if problem is not None:
            raise _CorruptEntry(problem)
        return value

    def __init__(
        self,
        memory_bytes: int = DEFAULT_MEMORY_BYTES,
        disk_dir: str | os.PathLike[str] | None = "default",
        redis_url: str | None = None,
        namespace: str = "onnx-tts",
        redis_ttl_seconds: int | None = None,
        disk_max_bytes: int | None = None,
        *,
        create_disk_dir: bool = True,
    ) -> None:
        if not isinstance(memory_bytes, int) or memory_bytes < 0:
            raise InputError(f"memory_bytes must be an int >= 0 (0 disables), got {memory_bytes!r}")
        if redis_ttl_seconds is not None and (
            not isinstance(redis_ttl_seconds, int) or redis_ttl_seconds <= 0
        ):
            raise InputError(
                f"redis_ttl_seconds must be a positive int or None, got {redis_ttl_seconds!r}"
            )
        if disk_max_bytes is not None and (
            not isinstance(disk_max_bytes, int) or disk_max_bytes <= 0
        ):
            raise InputError(
                f"disk_max_bytes must be a positive int or None, got {disk_max_bytes!r}"
            )
        if not namespace or not isinstance(namespace, str):
            raise InputError("namespace must be a non-empty string")
        if self.memory_policy not in MEMORY_POLICIES:
            raise InputError(f"memory_policy must be one of {MEMORY_POLICIES}")
        self._memory_limit = memory_bytes
        self._memory: OrderedDict[str, tuple[dict[str, np.ndarray], int]] = OrderedDict()
        self._memory_used = 0
        self._frequency: dict[str, int] = {}  # lfu policy only
        self._lookups = 0
        self._flights: dict[str, _Flight] = {}
        self._lock = threading.Lock()
        self._counters = _Counters()
        self._namespace = namespace
        self._disk_dir = self._init_disk_dir(disk_dir, create_disk_dir)
        self._redis_url = redis_url
        self._redis_ttl = redis_ttl_seconds
        self._redis = self._init_redis(redis_url)
        self._redis_down_until = 0.0
        self._disk_max_bytes = disk_max_bytes
        self._disk_lock = threading.Lock()
        self._disk_used: int | None = None  # estimate, (re)measured when pruning

    # -- setup ---------------------------------------------------------------------------------

    def _init_disk_dir(self, disk_dir: str | os.PathLike[str] | None, create: bool) -> Path | None:
        if disk_dir is None:
            return None
        use_default = isinstance(disk_dir, str) and disk_dir == "default"
        path = self.default_dir() if use_default else Path(disk_dir).expanduser()
        if not create:
            return path
        try:
            if path.is_dir():
                # An empty directory holds nothing to lose: the cache may adopt it.
                if not any(path.iterdir()):
                    self._write_marker(path)
            else:
                path.mkdir(parents=True, exist_ok=True)
                self._write_marker(path)
        except OSError as exc:
            if use_default:
                # A read-only home must not stop synthesis; the cache just stays in memory.
                log.warning("%s: disk tier disabled, cannot create %s: %s", self.label, path, exc)
                return None
            raise CacheError(
                f"cannot create the {self.label} directory {path}: {exc}; pass a writable "
                "disk_dir, or disk_dir=None to disable the disk tier"
            ) from exc
        return path

    @staticmethod
    def _init_redis(redis_url: str | None):  # -> redis.Redis | None
        if redis_url is None:
            return None
        try:
            import redis
        except ImportError as exc:
            raise CacheError(
                "redis_url was given but the 'redis' package is not installed; "
                "pip install redis, or leave redis_url unset"
            ) from exc
        try:
            # Short timeouts: a slow or dead Redis must cost little and is then skipped.
            return redis.Redis.from_url(redis_url, socket_connect_timeout=1.0, socket_timeout=2.0)
        except ValueError as exc:
            raise CacheError(
                f"invalid redis_url {_redact(redis_url)!r}: {exc}; expected e.g. "
                "redis://127.0.0.1:6379/0 or unix:///path/to/redis.sock"
            ) from exc

    def _write_marker(self, directory: Path) -> None:
        marker = directory / self.marker_name
        if not marker.exists():
            marker.write_text(
                f"This directory is an onnx-tts {self.label}; `onnx-tts cache clear` empties it.\n"
            )

    # -- public API ----------------------------------------------------------------------------

    @property
    def disk_dir(self) -> Path | None:
        """Directory of the disk tier, or ``None`` when it is disabled."""
        return self._disk_dir

    def get(self, key: str) -> dict[str, np.ndarray] | None:
        """Look ``key`` up in every tier without computing; ``None`` when absent."""
        _check_key(key)
        with self._lock:
            value = self._memory_get(key)
        if value is not None:
            return value
        found = self._lower_tiers_get(key)
        return None if found is None else dict(found[0])

    def lookup(self, key: str) -> dict[str, np.ndarray] | None:
        """Like :meth:`get`, but counted in the stats as a request (hit or miss), and a hit in
        a lower tier is copied into the tiers above it. A miss computes nothing; store the
        value with :meth:`put`."""
        _check_key(key)
        with self._lock:
            value = self._memory_request(key)
        if value is not None:
            return value
        found = self._lower_tiers_get(key)
        if found is None:
            with self._lock:
                self._counters.misses += 1
            return None
        return dict(self._promote(key, *found))

    def memory_lookup(self, key: str) -> dict[str, np.ndarray] | None:
        """The memory tier's value of ``key`` (counted as a hit), or None without counting."""
        with self._lock:
            return self._memory_request(key) if key in self._memory else None

    def put(self, key: str, arrays: Mapping[str, np.ndarray]) -> None:
        """Store a value computed outside :meth:`get_or_compute` in every tier."""
        _check_key(key)
        blob = encode_value(key, arrays)
        self._check_value(arrays)
        value = self._load(blob, key)
        with self._lock:
            self._memory_put(key, value, len(blob))
        self._disk_put(key, blob)
        self._redis_put(key, blob)

    def get_or_compute(
        self, key: str, compute: Callable[[], Mapping[str, np.ndarray]]
    ) -> dict[str, np.ndarray]:
        """Return the cached value of ``key``, running ``compute()`` once if no tier has it.

        ``compute`` must return a dict of numeric numpy arrays: the canonical (batch-of-1)
        encoder outputs for the audio that ``key`` was made from. Concurrent callers with the
        same key share one lookup and one compute; if it raises, they all get the exception
        and nothing is stored.
        """
        _check_key(key)
        with self._lock:
            value = self._memory_request(key)
            if value is not None:
                return value
            flight = self._flights.get(key)
            leader = flight is None
            if leader:
                flight = _Flight()
                self._flights[key] = flight
            else:
                self._counters.merged += 1

        if not leader:
            flight.done.wait()
            if flight.error is not None:
                raise flight.error
            assert flight.value is not None
            return dict(flight.value)

        try:
            flight.value = self._lead(key, compute)
            return dict(flight.value)
        except BaseException as exc:
            flight.error = exc
            with self._lock:
                self._counters.compute_errors += 1
            raise
        finally:
            with self._lock:
                del self._flights[key]
            flight.done.set()

    def stats(self) -> dict:
        """Counters (per process) and tier contents (entries, bytes).

        ``requests = hits + misses + merged + compute_errors`` (``merged``: requests that
        joined another's in-flight lookup; ``compute_errors``: failed lookups/computes, whose
        joiners get the same exception); ``hits`` is the sum over tiers. Disk and Redis
        entries/bytes are measured on the spot, so they include other processes' entries.
        Top-level ``entries``/``bytes`` are those of the largest tier; ``tiers`` lists the
        enabled ones.
        """
        with self._lock:
            c = _Counters(**vars(self._counters))
            memory_entries = len(self._memory)
            memory_used = self._memory_used
        hits = c.hits_memory + c.hits_disk + c.hits_redis
        result: dict = {
            "requests": c.requests,
            "hits": hits,
            "misses": c.misses,
            "merged": c.merged,
            "hit_rate": (hits + c.merged) / c.requests if c.requests else 0.0,
            "compute_errors": c.compute_errors,
            "compute_seconds": round(c.compute_seconds, 6),
            "memory": {
                "enabled": self._memory_limit > 0,
                "hits": c.hits_memory,
                "entries": memory_entries,
                "bytes": memory_used,
                "max_bytes": self._memory_limit,
                "evictions": c.evictions_memory,
            },
            "disk": {
                "enabled": self._disk_dir is not None,
                "dir": str(self._disk_dir) if self._disk_dir is not None else None,
                "hits": c.hits_disk,
                "corrupt": c.corrupt_disk,
                "errors": c.errors_disk,
                "max_bytes": self._disk_max_bytes,
                "evictions": c.evictions_disk,
                **self._disk_usage(),
            },
            "redis": {
                "enabled": self._redis is not None,
                "url": _redact(self._redis_url) if self._redis_url else None,
                "hits": c.hits_redis,
                "corrupt": c.corrupt_redis,
                "errors": c.errors_redis,
                "evictions": None,  # Redis evicts by its own maxmemory policy; not visible here
                **self._redis_usage(),
            },
        }
        # Whole-cache size: the largest tier (each lower tier holds what the upper ones hold,
        # give or take evictions), so an operator reads one number per cache.
        enabled = [tier for tier in TIERS if result[tier]["enabled"]]
        result["tiers"] = enabled
        sizes = [result[t] for t in enabled if result[t]["entries"] is not None]
        result["entries"] = max((t["entries"] for t in sizes), default=0)
        result["bytes"] = max((t["bytes"] for t in sizes), default=0)
        return result

    def clear(self, tiers: Iterable[str] = TIERS) -> dict[str, int]:
        """Remove every entry from the given tiers; returns the number removed per tier.

        Counters are kept; in-flight computes are not interrupted.
        """
        tiers = tuple(tiers)
        unknown = [t for t in tiers if t not in TIERS]
        if unknown:
            raise InputError(f"unknown cache tier(s) {unknown}; choose from {list(TIERS)}")
        removed: dict[str, int] = {}
        if "memory" in tiers:
            with self._lock:
                removed["memory"] = len(self._memory)
                self._memory.clear()
                self._memory_used = 0
                self._frequency.clear()
        if "disk" in tiers and self._disk_dir is not None and self._disk_dir.exists():
            if not (self._disk_dir / self.marker_name).is_file():
                raise CacheError(
                    f"refusing to clear {self._disk_dir}: it has no {self.marker_name} file, so "
                    "onnx-tts did not create it as a cache; check the path (or delete the "
                    "files yourself)"
                )
            with self._disk_lock:
                removed["disk"] = self._disk_clear()
                self._disk_used = None
        if "redis" in tiers and self._redis is not None:
            removed["redis"] = self._redis_clear()
        return removed

    # -- leader path ---------------------------------------------------------------------------

    def _lead(
        self, key: str, compute: Callable[[], Mapping[str, np.ndarray]]
    ) -> dict[str, np.ndarray]:
        found = self._lower_tiers_get(key)
        if found is not None:
            return self._promote(key, *found)

        started = time.perf_counter()
        arrays = compute()
        elapsed = time.perf_counter() - started
        blob = encode_value(key, arrays)
        self._check_value(arrays)
        # Hand out exactly what a later hit would return: read-only views of the blob.
        value = self._load(blob, key)
        with self._lock:
            self._counters.misses += 1
            self._counters.compute_seconds += elapsed
            self._memory_put(key, value, len(blob))
        self._disk_put(key, blob)
        self._redis_put(key, blob)
        return value

    def _promote(
        self, key: str, value: dict[str, np.ndarray], blob: bytes, tier: str
    ) -> dict[str, np.ndarray]:
        """Count a lower-tier hit and copy it into the tiers above."""
        with self._lock:
            setattr(self._counters, f"hits_{tier}", getattr(self._counters, f"hits_{tier}") + 1)
            self._memory_put(key, value, len(blob))
        if tier == "redis":
            self._disk_put(key, blob)
        return value

    def _lower_tiers_get(self, key: str) -> tuple[dict[str, np.ndarray], bytes, str] | None:
        found = self._disk_get(key)
        if found is not None:
            return found[0], found[1], "disk"
        found = self._redis_get(key)
        if found is not None:
            return found[0], found[1], "redis"
        return None

    # -- memory tier (callers hold self._lock) -------------------------------------------------

    def _memory_request(self, key: str) -> dict[str, np.ndarray] | None:
        """Count a request and look it up in memory, counting a hit."""
        self._counters.requests += 1
        value = self._memory_get(key)
        if value is not None:
            self._counters.hits_memory += 1
        return value

    def _memory_get(self, key: str) -> dict[str, np.ndarray] | None:
        if self.memory_policy == "lfu" and self._memory_limit:
            self._count_lookup(key)
        entry = self._memory.get(key)
        if entry is None:
            return None
        self._memory.move_to_end(key)
        return dict(entry[0])

    def _memory_put(self, key: str, value: dict[str, np.ndarray], nbytes: int) -> None:
        if nbytes > self._memory_limit:
            return  # larger than the whole tier (or the tier is disabled)
        old = self._memory.pop(key, None)
        if old is not None:
            self._memory_used -= old[1]
        self._memory[key] = (value, nbytes)
        self._memory_used += nbytes
        while self._memory_used > self._memory_limit:
            victim = self._memory_victim(key)
            _, evicted_bytes = self._memory.pop(victim)
            self._memory_used -= evicted_bytes
            self._counters.evictions_memory += 1

    def _memory_victim(self, newcomer: str) -> str:
        """The entry to evict: the least recently used one, or under "lfu" the least
        frequently used (the least recently used among equals); never the newcomer."""
        if self.memory_policy == "lru":
            return next(iter(self._memory))
        frequency = self._frequency
        # The OrderedDict runs from least to most recently used, and min() keeps the first of
        # equals. O(entries) per eviction: entries are whole utterances, so a few thousand.
        return min((k for k in self._memory if k != newcomer), key=lambda k: frequency.get(k, 0))

    def _count_lookup(self, key: str) -> None:
        self._frequency[key] = self._frequency.get(key, 0) + 1
        self._lookups += 1
        if self._lookups % _LFU_AGING_PERIOD == 0 or len(self._frequency) > _LFU_MAX_TRACKED:
            self._frequency = {k: f // 2 for k, f in self._frequency.items() if f > 1}

    # -- disk tier -----------------------------------------------------------------------------

    def _disk_path(self, key: str) -> Path:
        assert self._disk_dir is not None
        return self._disk_dir / key[:2] / f"{key}{_DISK_SUFFIX}"

    def _disk_get(self, key: str) -> tuple[dict[str, np.ndarray], bytes] | None:
        if self._disk_dir is None:
            return None
        path = self._disk_path(key)
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("%s: cannot read %s: %s; recomputing", self.label, path, exc)
            with self._lock:
                self._counters.errors_disk += 1
            return None
        try:
            value = self._load(blob, key)
        except _CorruptEntry as exc:
            log.warning(
                "%s: corrupt disk entry %s (%s); removed, recomputing", self.label, path, exc
            )
            with self._lock:
                self._counters.corrupt_disk += 1
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recency for the size bound's LRU
        return value, blob

    def _disk_put(self, key: str, blob: bytes) -> None:
        if self._disk_dir is None:
            return
        if self._disk_max_bytes is not None and len(blob) > self._disk_max_bytes:
            return  # larger than the whole tier
        path = self._disk_path(key)
        tmp_name = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=path.parent)
            # No fsync: after a crash a torn file fails its checksum and is recomputed, so
            # durability is not worth a disk flush per new voice.
            with os.fdopen(fd, "wb") as handle:
                handle.write(blob)
            os.replace(tmp_name, path)
            tmp_name = None
            self._disk_account(len(blob))
        except OSError as exc:
            log.warning("%s: cannot write %s: %s; entry not stored on disk", self.label, path, exc)
            with self._lock:
                self._counters.errors_disk += 1
        finally:
            if tmp_name is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp_name)

    def _disk_account(self, added: int) -> None:
        if self._disk_max_bytes is None:
            return
        with self._disk_lock:
            if self._disk_used is None:
                self._disk_used = self._disk_usage()["bytes"]
            else:
                self._disk_used += added
            if self._disk_used > self._disk_max_bytes:
                self._disk_prune()

    def _disk_prune(self) -> None:
        """Remove least recently used files down to 90 % of the bound (caller holds lock)."""
        assert self._disk_max_bytes is not None
        entries = []
        for path in self._disk_files():
            if path.name.endswith(_DISK_SUFFIX):
                try:
                    info = path.stat()
                except OSError:
                    continue  # removed concurrently
                entries.append((info.st_mtime_ns, path.name, info.st_size, path))
        entries.sort()
        used = sum(entry[2] for entry in entries)
        target = self._disk_max_bytes * 9 // 10
        evicted = 0
        for _, _, size, path in entries:
            if used <= target:
                break
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                evicted += 1
            used -= size
        self._disk_used = used
        with self._lock:
            self._counters.evictions_disk += evicted

    def _disk_files(self) -> list[Path]:
        if self._disk_dir is None:
            return []
        files = []
        for sub in self._disk_dir.iterdir() if self._disk_dir.is_dir() else ():
            if sub.is_dir() and len(sub.name) == 2:
                files.extend(
                    p
                    for p in sub.iterdir()
                    if p.name.endswith(_DISK_SUFFIX) or p.name.startswith(_TMP_PREFIX)
                )
        return files

    def _disk_usage(self) -> dict[str, int]:
        entries = 0
        used = 0
        for path in self._disk_files():
            if path.name.endswith(_DISK_SUFFIX):
                try:
                    used += path.stat().st_size
                    entries += 1
                except OSError:
                    pass  # removed concurrently
        return {"entries": entries, "bytes": used}

    def _disk_clear(self) -> int:
        removed = 0
        for path in self._disk_files():
            try:
                path.unlink()
                removed += path.name.endswith(_DISK_SUFFIX)
            except OSError:
                pass
        return removed

    # -- redis tier ----------------------------------------------------------------------------

    def _redis_key(self, key: str) -> str:
        return f"{self._namespace}:{self.redis_segment}:{key}"

    def _redis_available(self) -> bool:
        return self._redis is not None and time.monotonic() >= self._redis_down_until

    def _redis_failed(self, action: str, exc: Exception) -> None:
        log.warning(
            "%s: redis %s failed (%s: %s); skipping the redis tier for %.0f s",
            self.label,
            action,
            type(exc).__name__,
            exc,
            _REDIS_RETRY_SECONDS,
        )
        with self._lock:
            self._counters.errors_redis += 1
        self._redis_down_until = time.monotonic() + _REDIS_RETRY_SECONDS

    def _redis_get(self, key: str) -> tuple[dict[str, np.ndarray], bytes] | None:
        if not self._redis_available():
            return None
        import redis

        rkey = self._redis_key(key)
        try:
            blob = self._redis.get(rkey)
        except redis.RedisError as exc:
            self._redis_failed("get", exc)
            return None
        if blob is None:
            return None
        blob = bytes(blob)
        try:
            value = self._load(blob, key)
        except _CorruptEntry as exc:
            log.warning(
                "%s: corrupt redis entry %s (%s); removed, recomputing", self.label, rkey, exc
            )
            with self._lock:
                self._counters.corrupt_redis += 1
            try:
                self._redis.delete(rkey)
            except redis.RedisError as del_exc:
                self._redis_failed("delete", del_exc)
            return None
        return value, blob

    def _redis_put(self, key: str, blob: bytes) -> None:
        if not self._redis_available():
            return
        import redis

        try:
            self._redis.set(self._redis_key(key), blob, ex=self._redis_ttl)
        except redis.RedisError as exc:
            self._redis_failed("set", exc)

    def _redis_scan(self) -> list[bytes]:
        return list(
            self._redis.scan_iter(match=f"{self._namespace}:{self.redis_segment}:*", count=500)
        )

    def _redis_usage(self) -> dict[str, int | None]:
        if self._redis is None:
            return {"entries": 0, "bytes": 0}
        import redis

        try:
            keys = self._redis_scan()
            pipe = self._redis.pipeline(transaction=False)
            for rkey in keys:
                pipe.strlen(rkey)
            sizes = pipe.execute() if keys else []
        except redis.RedisError as exc:
            log.warning("%s: redis stats failed: %s", self.label, exc)
            return {"entries": None, "bytes": None}
        return {"entries": len(keys), "bytes": int(sum(sizes))}

    def _redis_clear(self) -> int:
        import redis

        try:
            keys = self._redis_scan()
            for start in range(0, len(keys), 500):
                self._redis.delete(*keys[start : start + 500])
        except redis.RedisError as exc:
            raise CacheError(
                f"cannot clear the redis tier at {_redact(self._redis_url)}: {exc}"
            ) from exc
        return len(keys)


class ReferenceCache(TieredCache):
    """The tiered cache of reference-encoder outputs (values: the encoder's output arrays)."""

    label = "reference cache"
    redis_segment = "refcache"
    marker_name = MARKER_NAME
    memory_policy = "lru"

    @staticmethod
    def default_dir() -> Path:
        return default_disk_dir()

    def _check_value(self, arrays: Mapping[str, np.ndarray]) -> None:
        check_finite_value(arrays)


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not _KEY_PATTERN.match(key):
        raise InputError(
            f"cache key must be 64 lowercase hex characters (use make_key), got {key!r}"
        )


def _redact(url: str | None) -> str | None:
    """The URL without its password, for logs and stats."""
    if url is None:
        return None
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urllib.parse.urlunsplit(parts._replace(netloc=user + netloc))


def _human_bytes(value: int | None) -> str:
    if value is None:
        return "?"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


def format_stats(stats: Mapping) -> str:
    """A short human-readable table of :meth:`ReferenceCache.stats` (for ``cache stats``)."""
    lines = [
        f"requests {stats['requests']}  hits {stats['hits']}  misses {stats['misses']}  "
        f"merged {stats['merged']}  hit rate {100 * stats['hit_rate']:.1f}%",
        f"{'tier':<8}{'enabled':>9}{'hits':>8}{'entries':>9}{'bytes':>12}{'evictions':>11}"
        f"{'corrupt':>9}{'errors':>8}  location",
    ]
    for tier in TIERS:
        info = stats[tier]
        location = {"memory": "", "disk": info.get("dir") or "", "redis": info.get("url") or ""}[
            tier
        ]
        if info.get("max_bytes") is not None:
            location = f"{location} (max {_human_bytes(info['max_bytes'])})".strip()
        lines.append(
            f"{tier:<8}{'yes' if info['enabled'] else 'no':>9}{info['hits']:>8}"
            f"{'?' if info['entries'] is None else info['entries']:>9}"
            f"{_human_bytes(info['bytes']):>12}{_or_dash(info['evictions']):>11}"
            f"{info.get('corrupt', 0):>9}{info.get('errors', 0):>8}  {location or '-'}"
        )
    return "\n".join(lines)


def _cli_cache(
    disk_dir: str | os.PathLike[str] | None,
    redis_url: str | None,
    kind: type[TieredCache] = ReferenceCache,
) -> TieredCache:
    # Read-only use: no memory tier, no directory created.
    return kind(memory_bytes=0, disk_dir=disk_dir, redis_url=redis_url, create_disk_dir=False)


def cache_stats(
    disk_dir: str | os.PathLike[str] | None = "default", redis_url: str | None = None
) -> dict:
    """Stats of the shared tiers for ``onnx-tts cache stats``; creates nothing on disk."""
    return _cli_cache(disk_dir, redis_url).stats()


def clear_cache(
    disk_dir: str | os.PathLike[str] | None = "default", redis_url: str | None = None
) -> dict[str, int]:
    """Empty the shared tiers for ``onnx-tts cache clear``. The disk tier is only touched in
    a directory that carries the cache's marker file (CacheError otherwise); a missing
    directory is already clear."""
    return _cli_cache(disk_dir, redis_url).clear(tiers=("disk", "redis"))

"""Hostile cache entries for the tests: what the attack of issue 30 stored, as checksum-valid
blobs or as in-memory values, and how to plant them in a tier."""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from onnx_tts.cache.codec import MAGIC
from onnx_tts.cache.tier import Entry

Value = Mapping[str, np.ndarray]


def forge_blob(key: str, arrays: Value) -> bytes:
    """``arrays`` in the entry format with a valid checksum and no signature, whatever their
    dtype (complex, big-endian) or shape: what a writer that skips the cache's checks stores."""
    specs = [{"name": n, "dtype": a.dtype.str, "shape": list(a.shape)} for n, a in arrays.items()]
    header = json.dumps({"format": 1, "key": key, "arrays": specs}).encode()
    body = bytearray(MAGIC + struct.pack("<I", len(header)) + header)
    for array in arrays.values():
        body += b"\x00" * (-len(body) % 64)
        body += np.ascontiguousarray(array).tobytes()
    return bytes(body + hashlib.sha256(body).digest())


# Results: what the attack got served as audio.
RESULT_ATTACKS: dict[str, Callable[[Value], dict[str, np.ndarray]]] = {
    "scaled_x1000": lambda v: {**v, "samples": np.asarray(v["samples"]) * np.float32(1000)},
    "rate_8000": lambda v: {**v, "sample_rate": np.asarray(8000, np.int64)},
    "complex64": lambda v: {**v, "samples": np.asarray(v["samples"]).astype(np.complex64)},
}


def _first_float(value: Value) -> str:
    return next(name for name, a in value.items() if a.dtype.kind == "f")


def _mis_shaped(value: Value) -> dict[str, np.ndarray]:
    """Checksum-valid, every name present, but one output's shape is not the encoder's."""
    name = _first_float(value)
    return {**value, name: np.asarray(value[name]).reshape(-1)[: value[name].size // 2]}


# Reference (voice encoder) values: what the attack got served as a voice.
REFERENCE_ATTACKS: dict[str, Callable[[Value], dict[str, np.ndarray]]] = {
    "big_endian": lambda v: {**v, _first_float(v): np.asarray(v[_first_float(v)]).astype(">f4")},
    "embedding_1e30": lambda v: {**v, _first_float(v): np.full_like(v[_first_float(v)], 1e30)},
    "mis_shaped": _mis_shaped,
}
# Not an entry at all (a shared tier only): a corrupt reference entry in Redis was answered
# with a 400 that blamed the client.
GARBAGE = b"OTTSRC1\n" + b"\x07" * 100


def plant(
    tier: str,
    key: str,
    value: Value | None,
    *,
    cache: object = None,
    disk_dir: Path | None = None,
    redis_client: object = None,
    redis_key: str | None = None,
) -> None:
    """Store ``value`` (None: GARBAGE) under ``key`` in one tier, bypassing every check."""
    blob = GARBAGE if value is None else forge_blob(key, value)
    if tier == "memory":
        assert value is not None, "the memory tier holds values, not bytes"
        cache.tier("memory").put(key, Entry(dict(value), blob))
    elif tier == "disk":
        (disk_dir / key[:2] / f"{key}.otc").write_bytes(blob)
    else:
        redis_client.set(redis_key, blob)

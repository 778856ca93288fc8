"""The one serialisation of cache values: dicts of numeric arrays as checksummed, optionally
signed blobs (what the disk and Redis tiers store).

Blob layout::

    MAGIC | u32 LE header length | JSON header | zero padding | array payloads (each starting on
    a 64-byte boundary) | [HMAC-SHA256, signed entries only] | sha256 of everything before it

The header names the key the entry was written under and each array's name, little-endian
dtype and shape. The sha256 detects torn or damaged files; it proves nothing about who wrote
the entry. With a secret (``cache_secret``), entries also carry an HMAC over the key they were
written under and everything before the MAC, so that a reader holding the same secret refuses
entries forged by anyone without it, or copied under another key.

Decoding checks structure only (sizes, dtypes, key, checksum, signature); what a value may hold
(names, shapes, magnitudes) is the cache's schema (:mod:`onnx_tts.cache.schema`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import struct
from collections.abc import Mapping

import numpy as np

from onnx_tts.errors import CacheError, InputError

__all__ = [
    "SECRET_ENV",
    "CorruptEntry",
    "decode_value",
    "encode_value",
    "resolve_cache_secret",
    "sign",
    "signature_matches",
]

MAGIC = b"OTTSRC1\n"
_DIGEST_BYTES = 32
_MAC_BYTES = 32
_ALIGN = 64
# Only plain numbers (bool, signed/unsigned ints, floats): no object arrays, so decoding never
# unpickles anything, and no complex values, which no cache of this project holds.
ALLOWED_DTYPE_KINDS = frozenset("biuf")
# Bounds on what a stored entry may describe (a checksum only proves the writer's intent).
_MAX_ARRAYS = 64
_MAX_NDIM = 8
_MAX_DIM = 2**31 - 1
_MAC_DOMAIN = b"onnx-tts/cache/mac/v1\x00"
SECRET_ENV = "ONNX_TTS_CACHE_SECRET"
_MIN_SECRET_BYTES = 16
_MAX_SECRET_BYTES = 4096


class CorruptEntry(Exception):
    """A blob is not a valid entry for its key (damaged, forged, unsigned); says why."""


def resolve_cache_secret(secret: str | bytes | None) -> bytes | None:
    """The HMAC key of the shared tiers: ``secret``, else ``$ONNX_TTS_CACHE_SECRET``, else
    None (entries unsigned). InputError when it is too short to be a secret or absurdly long."""
    if secret is None:
        secret = os.environ.get(SECRET_ENV) or None
        if secret is None:
            return None
    if isinstance(secret, str):
        secret = secret.encode("utf-8")
    if not isinstance(secret, bytes):
        raise InputError(f"cache_secret must be a string or bytes, got {type(secret).__name__}")
    if not _MIN_SECRET_BYTES <= len(secret) <= _MAX_SECRET_BYTES:
        raise InputError(
            f"cache_secret must be {_MIN_SECRET_BYTES} to {_MAX_SECRET_BYTES} bytes long, got "
            f"{len(secret)}; make one with "
            "python -c 'import secrets; print(secrets.token_hex(32))'"
        )
    return secret


def _mac(secret: bytes, key: str, body: bytes | memoryview) -> bytes:
    signer = hmac.new(secret, _MAC_DOMAIN, hashlib.sha256)
    key_bytes = key.encode("utf-8")
    signer.update(struct.pack("<Q", len(key_bytes)) + key_bytes)
    signer.update(body)
    return signer.digest()


def sign(secret: bytes, key: str, body: bytes) -> bytes:
    """The HMAC-SHA256 that binds `body` to `key` under `secret`: what a signed entry carries,
    and what the project's other shared records (uploaded voices) are signed with."""
    return _mac(secret, key, body)


def signature_matches(secret: bytes, key: str, body: bytes, mac: bytes) -> bool:
    """Whether `mac` is :func:`sign` of `body` under `key` and `secret` (constant time)."""
    return hmac.compare_digest(mac, _mac(secret, key, body))


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def encode_value(key: str, arrays: Mapping[str, np.ndarray], secret: bytes | None = None) -> bytes:
    """Serialise ``arrays`` into a blob that carries ``key``, a sha256 and, with ``secret``, an
    HMAC. CacheError for anything but a non-empty dict of numeric numpy arrays."""
    if not isinstance(arrays, Mapping) or not arrays:
        raise CacheError(
            f"a cache value must be a non-empty dict of numpy arrays, got {type(arrays).__name__}"
        )
    specs = []
    payloads = []
    for name, value in arrays.items():
        if not isinstance(name, str) or not isinstance(value, np.ndarray):
            raise CacheError(
                f"cache values must map str -> numpy.ndarray; entry {name!r} is "
                f"{type(value).__name__}"
            )
        if value.dtype.kind not in ALLOWED_DTYPE_KINDS:
            raise CacheError(
                f"cache array {name!r} has dtype {value.dtype}; only bool, integer and real "
                "float arrays can be cached (numeric)"
            )
        # np.require keeps 0-d arrays 0-d (ascontiguousarray would make them 1-d).
        little = np.require(value, dtype=value.dtype.newbyteorder("<"), requirements="C")
        specs.append({"name": name, "dtype": little.dtype.str, "shape": list(little.shape)})
        payloads.append(memoryview(little).cast("B") if little.nbytes else b"")
    header: dict = {"format": 1, "key": key, "arrays": specs}
    if secret is not None:
        header["signed"] = True
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")

    out = bytearray(MAGIC)
    out += struct.pack("<I", len(header_bytes))
    out += header_bytes
    for payload in payloads:
        out += b"\x00" * (_aligned(len(out)) - len(out))
        out += payload
    if secret is not None:
        out += _mac(secret, key, out)
    out += hashlib.sha256(out).digest()
    return bytes(out)


def decode_value(
    blob: bytes, expected_key: str | None = None, secret: bytes | None = None
) -> dict[str, np.ndarray]:
    """Parse a blob from :func:`encode_value`; arrays are read-only views into ``blob``.

    CacheError when the blob is truncated, corrupt, stored under another key, or (with
    ``secret``) unsigned or signed with another secret or for another key.
    """
    try:
        return decode_entry(blob, expected_key, secret)
    except CorruptEntry as exc:
        raise CacheError(f"corrupt cache entry: {exc}") from None


def decode_entry(
    blob: bytes, expected_key: str | None, secret: bytes | None = None
) -> dict[str, np.ndarray]:
    """:func:`decode_value` raising :class:`CorruptEntry` (the tiers' internal form)."""
    # The arrays must view an immutable buffer; bytes(bytes_obj) does not copy.
    blob = bytes(blob)
    min_len = len(MAGIC) + 4 + _DIGEST_BYTES
    if len(blob) < min_len:
        raise CorruptEntry(f"{len(blob)} bytes is shorter than the smallest entry")
    if not blob.startswith(MAGIC):
        raise CorruptEntry("bad magic (not an onnx-tts cache entry)")
    body_end = len(blob) - _DIGEST_BYTES
    if hashlib.sha256(memoryview(blob)[:body_end]).digest() != blob[body_end:]:
        raise CorruptEntry("checksum mismatch (truncated or modified)")
    (header_len,) = struct.unpack_from("<I", blob, len(MAGIC))
    header_start = len(MAGIC) + 4
    if header_start + header_len > body_end:
        raise CorruptEntry("header runs past the end of the entry")
    try:
        header = json.loads(blob[header_start : header_start + header_len])
        specs = header["arrays"]
        stored_key = header["key"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptEntry(f"unreadable header ({exc})") from None
    if not isinstance(header, dict) or header.get("format") != 1:
        raise CorruptEntry(
            f"unknown format {header.get('format') if isinstance(header, dict) else header!r}"
        )
    if not isinstance(specs, list) or not 1 <= len(specs) <= _MAX_ARRAYS:
        raise CorruptEntry(f"holds {len(specs) if isinstance(specs, list) else 'no'} arrays")
    if expected_key is not None and stored_key != expected_key:
        raise CorruptEntry(f"entry holds key {stored_key!r}, expected {expected_key!r}")
    signed = header.get("signed", False) is True
    if signed:
        body_end -= _MAC_BYTES
        if body_end < header_start + header_len:
            raise CorruptEntry("signed entry too short for its signature")
    if secret is not None:
        if not signed:
            raise CorruptEntry("unsigned entry, but this cache has a cache_secret")
        mac = blob[body_end : body_end + _MAC_BYTES]
        # stored_key is the expected key (checked above): the MAC binds the value to it.
        if not hmac.compare_digest(mac, _mac(secret, stored_key, memoryview(blob)[:body_end])):
            raise CorruptEntry("signature does not match (another secret, or another key)")

    arrays: dict[str, np.ndarray] = {}
    offset = header_start + header_len
    for spec in specs:
        name, dtype, shape = _array_spec(spec)
        if name in arrays:
            raise CorruptEntry(f"array {name!r} appears twice")
        # Python ints: a declared [2**32, 2**32] must not wrap around to a small count.
        count = math.prod(shape)
        offset = _aligned(offset)
        end = offset + count * dtype.itemsize
        if end > body_end:
            raise CorruptEntry(f"array {name!r} {list(shape)} runs past the end of the entry")
        array = np.frombuffer(blob, dtype=dtype, count=count, offset=offset).reshape(shape)
        if not dtype.isnative:  # a big-endian host: hand out native numbers, read-only
            array = array.astype(dtype.newbyteorder("="))
            array.setflags(write=False)
        arrays[name] = array
        offset = end
    return arrays


def _array_spec(spec: object) -> tuple[str, np.dtype, tuple[int, ...]]:
    """(name, dtype, shape) of one header entry, each checked for type and bounds."""
    if not isinstance(spec, dict):
        raise CorruptEntry(f"bad array description {spec!r}")
    name, dtype_text, shape = spec.get("name"), spec.get("dtype"), spec.get("shape")
    if not isinstance(name, str) or not name or not isinstance(dtype_text, str):
        raise CorruptEntry(f"bad array description {spec!r}")
    try:
        dtype = np.dtype(dtype_text)
    except (TypeError, ValueError):
        raise CorruptEntry(f"array {name!r} has unknown dtype {dtype_text!r}") from None
    if dtype.kind not in ALLOWED_DTYPE_KINDS or dtype.str != dtype_text:
        raise CorruptEntry(f"array {name!r} has dtype {dtype_text!r}; numeric only")
    # The writer stores little-endian; a big-endian dtype is not an entry it wrote.
    if dtype_text[0] not in "<|":
        raise CorruptEntry(f"array {name!r} has byte order {dtype_text!r}; little-endian only")
    if (
        not isinstance(shape, list)
        or len(shape) > _MAX_NDIM
        or not all(type(d) is int and 0 <= d <= _MAX_DIM for d in shape)
    ):
        raise CorruptEntry(f"array {name!r} has an impossible shape {shape!r}")
    return name, dtype, tuple(shape)

"""Content-addressed cache of reference-encoder outputs.

The cache promises one thing: the same audio content, encoded by the same encoder, always
yields the same value, whatever the arrival order of requests. Keys are therefore a hash of
the encoder identity and of the decoded audio samples (:func:`make_key`), and values are the
outputs of a canonical batch-of-1 encode (``VoiceEncoder.encode_cached``). A value read back
must be that encoder's outputs: the names, dtypes and ranks its graph declares
(:func:`encoder_schema`), finite and bounded.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

import numpy as np

from onnx_tts.audio import as_mono_float32
from onnx_tts.cache.schema import ArraySpec, Schema
from onnx_tts.cache.typed import TypedCache
from onnx_tts.errors import InputError

__all__ = ["MARKER_NAME", "ReferenceCache", "encoder_schema", "make_key"]

MARKER_NAME = ".onnx-tts-refcache"
_KEY_DOMAIN = b"onnx-tts/refcache/v1\x00"


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


def encoder_schema(outputs: Sequence[object], names: Sequence[str] = ()) -> Schema:
    """The value of an encoder whose graph declares ``outputs`` (``TensorSpec``-like: name,
    dtype, shape with the batch axis first): each output by name, its dtype, its rank less the
    batch axis and its fixed dimensions. Outputs known only by ``names`` are checked for
    dtype kind, finiteness and bounds; with neither, any numeric arrays."""
    arrays: dict[str, ArraySpec] = {}
    for spec in outputs:
        declared = tuple(getattr(spec, "shape", ()))
        # A rank-0 declaration means "shape unknown": an encoder output always has a batch axis.
        shape = (
            tuple(d if isinstance(d, int) and d >= 0 else None for d in declared[1:])
            if declared
            else None
        )
        arrays[spec.name] = ArraySpec(dtypes=(np.dtype(spec.dtype).name,), shape=shape)
    for name in names:
        arrays.setdefault(name, ArraySpec())
    return Schema(arrays=arrays)


class ReferenceCache(TypedCache):
    """The tiered cache of reference-encoder outputs (values: the encoder's output arrays).

    Arguments: see :class:`onnx_tts.cache.typed.TypedCache`; memory is LRU, 256 MiB by
    default; the default directory is ``~/.cache/onnx-tts/refcache``. Lookups through
    ``VoiceEncoder.encode_cached`` check values against that encoder's outputs; other lookups
    against any finite, bounded numeric arrays.
    """

    label = "reference cache"
    redis_segment = "refcache"
    marker_name = MARKER_NAME
    dir_name = "refcache"
    memory_policy = "lru"

    def _unstorable(self, problem: str) -> Exception:
        # A computed encode that is not a valid value is a fault of this reference audio (or
        # of the encoder graph): the request fails clearly, and it poisons nothing.
        return InputError(
            f"the voice encoder's output for this reference audio cannot be used: {problem}; "
            "nothing was cached. Check the audio (extremely loud or corrupt?) and the encoder "
            "graph"
        )

"""Voice resolution: a reference given as a file, samples or an encoded dict -> the encoder's
outputs, through the content-addressed reference cache."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from onnx_tts.audio import load_audio
from onnx_tts.cache.reference import ReferenceCache
from onnx_tts.errors import AudioError, InputError
from onnx_tts.families.base import Backend

VoiceLike = str | os.PathLike[str] | np.ndarray | Mapping[str, np.ndarray] | None
# An encoded voice given as a dict: at most this many values per array.
MAX_VOICE_VALUES = 1 << 24


class Voices:
    """The voices of one model: its default, references encoded once (batch of 1, cached)."""

    def __init__(self, backend: Backend, cache: ReferenceCache | None) -> None:
        self.backend, self.cache = backend, cache

    def resolve(self, voice: VoiceLike = None) -> dict[str, np.ndarray]:
        """Encoder outputs for a reference: a file path, mono samples at the encoder's rate, or
        an already-encoded dict (checked). None is the model's default voice."""
        if voice is None:
            return self.backend.default_voice()
        own = getattr(self.backend, "voice", None)
        if own is not None:  # the family resolves its voices (builtin names, stereo references)
            return own(voice, self.cache)
        if isinstance(voice, Mapping):
            return self._encoded(voice)
        encoder = self.backend.encoder
        if isinstance(voice, np.ndarray):
            audio = voice
        elif isinstance(voice, (str, os.PathLike)):
            audio = load_audio(
                voice,
                encoder.sample_rate,
                min_seconds=encoder.min_seconds,
                max_seconds=encoder.max_seconds,
            )
        else:
            raise InputError(
                f"voice must be a file path, mono float samples or a dict from Engine.voice(), "
                f"got {type(voice).__name__}"
            )
        if self.cache is None:
            return encoder.encode(audio)
        return encoder.encode_cached(audio, self.cache)

    def _encoded(self, voice: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """An already-encoded voice, checked: the encoder's outputs, numeric, finite."""
        expected = set(self.backend.encoder.output_names)
        missing = sorted(expected - set(voice))
        if missing:
            raise AudioError(
                f"encoded voice lacks {', '.join(missing)} (this model's encoder gives "
                f"{', '.join(sorted(expected))}); pass a file or samples, or a dict that "
                "Engine.voice() returned for this model"
            )
        arrays: dict[str, np.ndarray] = {}
        for name in sorted(expected):
            try:
                array = np.asarray(voice[name])
            except (TypeError, ValueError):
                array = np.asarray(None)
            if array.dtype.kind not in "iuf" or array.size > MAX_VOICE_VALUES:
                raise AudioError(f"encoded voice value {name!r} is not a numeric array")
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                raise AudioError(f"encoded voice value {name!r} holds NaN or infinite numbers")
            arrays[name] = array
        return arrays


__all__ = ["MAX_VOICE_VALUES", "VoiceLike", "Voices"]

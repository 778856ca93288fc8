"""Voice resolution, the same for every family: a voice given as nothing, a builtin name, a
file, samples or an encoded dict -> the conditioning its model's program takes. References are
encoded through the content-addressed reference cache (the canonical batch-of-1 encode), so
the same audio gives the same codes whatever arrives with it."""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from onnx_tts.cache.reference import ReferenceCache
from onnx_tts.errors import AudioError, InputError
from onnx_tts.families.base import MAX_VOICE_VALUES, Voices

VoiceLike = str | os.PathLike[str] | np.ndarray | Mapping[str, np.ndarray] | None


class VoiceResolver:
    """The voices of one model (its family's `Voices`) behind one resolution rule."""

    def __init__(self, voices: Voices, cache: ReferenceCache | None) -> None:
        self.voices, self.cache = voices, cache

    def resolve(self, voice: VoiceLike = None) -> dict[str, np.ndarray]:
        """None: the model's default voice. A builtin voice's name. A file path (read as the
        family reads references). Samples at the encoder's rate ([N], or [channels, N] for a
        multichannel encoder). A dict `Engine.voice()` returned (checked)."""
        voices = self.voices
        if voice is None:
            return voices.default()
        if isinstance(voice, str) and voice in voices.builtin:
            return dict(voices.builtin[voice])
        if isinstance(voice, Mapping):
            return voices.check_encoded(voice)
        if isinstance(voice, (str, os.PathLike)):
            if voices.builtin and not os.path.exists(voice):
                names = ", ".join(voices.names)
                raise AudioError(
                    f"voice {os.fspath(voice)!r} is neither a builtin voice ({names}) nor a file"
                )
            audio = voices.read(voice)
        elif isinstance(voice, np.ndarray):
            audio = voice
        else:
            kinds = "a builtin voice name, " if voices.builtin else ""
            raise InputError(
                f"voice must be {kinds}a file path, samples or a dict from Engine.voice(), "
                f"got {type(voice).__name__}"
            )
        encoder = voices.encoder
        if self.cache is None:
            return encoder.encode(audio)
        return encoder.encode_cached(audio, self.cache)


__all__ = ["MAX_VOICE_VALUES", "VoiceLike", "VoiceResolver"]

"""The "phoneme-mel" family, the project's trained default voice: an LM that walks a pointer
along espeak-ng phonemes and emits mel frames, and a Griffin-Lim vocoder graph (`model`)."""

from __future__ import annotations

from onnx_tts.families.phoneme_mel.model import (
    REGISTRY_ENTRY,
    MelVocoder,
    PhonemeChunk,
    PhonemeMelModel,
    PhonemeMelProgram,
    PhonemeText,
    phoneme_windows,
)

__all__ = [
    "REGISTRY_ENTRY",
    "MelVocoder",
    "PhonemeChunk",
    "PhonemeMelModel",
    "PhonemeMelProgram",
    "PhonemeText",
    "phoneme_windows",
]

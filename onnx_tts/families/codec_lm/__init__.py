"""The "codec-lm" family: a text + audio-code LM over K codebooks in a delay pattern, an
encoder giving prompt codes and a speaker embedding, and a causal codes -> waveform vocoder
(`model`). The project's random-weight test bundle (export/build_codec_lm.py) is one."""

from __future__ import annotations

from onnx_tts.families.codec_lm.model import (
    REGISTRY_ENTRY,
    CodecLMModel,
    CodecLMProgram,
    CodecLMText,
    CodecVocoder,
    DelayPattern,
)

__all__ = [
    "REGISTRY_ENTRY",
    "CodecLMModel",
    "CodecLMProgram",
    "CodecLMText",
    "CodecVocoder",
    "DelayPattern",
]

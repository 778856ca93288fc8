"""The "higgs" family: Higgs Audio v2 (Llama-3.2-3B + DualFFN) and Higgs TTS 3 (Qwen3-4B), from
model directories written by `onnx-tts export higgs` (export/higgs/): a reference encoder, the
embedding sum, the backbone LM-with-past, the audio head and the codec decoder (`model`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from onnx_tts.families.base import Detection, Family, LoadSettings, Option
from onnx_tts.families.higgs.files import model_files
from onnx_tts.families.higgs.layout import FAMILY, SECTIONS
from onnx_tts.families.higgs.text import MAX_CHUNK_TOKENS


def load(detection: Detection, settings: LoadSettings, options: Mapping[str, Any]):
    from onnx_tts.families.higgs.model import HiggsModel

    return HiggsModel(detection, settings, **options)


OPTIONS = (
    Option(
        "reference_text",
        str,
        "transcript of the cloned voice's reference audio (Higgs: part of the prompt)",
        "both",
    ),
    Option("scene", str, "scene description of the prompt (Higgs v2)", "both"),
    Option(
        "max_chunk_tokens",
        int,
        "longest text chunk in tokens; longer texts are cut at sentence ends",
        "both",
        8,
        MAX_CHUNK_TOKENS,
    ),
    Option("max_new_tokens", int, "most delayed rows generated per chunk", "both", 1, 1 << 16),
    Option(
        "ras_window",
        int,
        "repetition-aware resampling window in rows (Higgs v2; 0 = off)",
        "both",
        0,
        1024,
    ),
    Option(
        "ras_max_repeat",
        int,
        "repeats in the window that trigger a resample (Higgs v2)",
        "both",
        1,
        1024,
    ),
)

REGISTRY_ENTRY = Family(
    name=FAMILY,
    summary="Higgs Audio v2 / Higgs TTS 3, exported by `onnx-tts export higgs`",
    loader=load,
    options=OPTIONS,
    manifest_sections=SECTIONS,
    files=model_files,
)

__all__ = ["FAMILY", "OPTIONS", "REGISTRY_ENTRY"]

"""MOSS-TTS (OpenMOSS: Local-Transformer v1.5, Local-Transformer v1, Delay): model directories
written by `onnx-tts export moss-tts` (export/moss_tts/) from the published checkpoints.
`layout` reads bundle.json, `text` builds the published prompts, `tables` sums the input rows
on the host, `local` and `delay` are the releases' per-frame parts, `program` drives them in
the engine's scheduler, `sampling` keeps the published options and orders, `reference` prepares
and encodes a reference through the codec, `model` holds the parts. It runs like every family:

    import onnx_tts
    engine = onnx_tts.load("exported-model/")  # written by onnx-tts export
    audio = engine.synthesize("Hello.", voice="reference.wav", seed=1)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from onnx_tts.families.base import Detection, Family, LoadSettings, Option
from onnx_tts.families.moss_tts.delay import STOPS
from onnx_tts.families.moss_tts.files import model_files
from onnx_tts.families.moss_tts.layout import FAMILY, SECTIONS, read_layout
from onnx_tts.families.moss_tts.sampling import MAX_PENALTY, MAX_TEMPERATURE, MAX_TOP_K
from onnx_tts.families.moss_tts.text import MAX_CHUNK_CHARS

MAX_NEW_FRAMES = 1 << 17
FIELD_HELP = "the prompt template's {} field (default: None, as published)"


def load(detection: Detection, settings: LoadSettings, options: Mapping[str, Any]) -> Any:
    from onnx_tts.families.moss_tts.model import MossTTS

    return MossTTS(read_layout(detection.inspected), settings, **options)


def _fields() -> tuple[Option, ...]:
    names = ("language", "instruction", "quality", "sound_event", "ambient_sound")
    text = tuple(Option(n, str, FIELD_HELP.format(n), "both") for n in names)
    return (
        *text,
        Option("tokens", int, FIELD_HELP.format("tokens (duration)"), "both", 1, 1 << 20),
    )


_OPTIONS = (
    Option("greedy", bool, "greedy decoding for every channel (no sampling)", "both"),
    Option(
        "text_temperature",
        float,
        "text channel / continue-stop temperature",
        "both",
        0.0,
        MAX_TEMPERATURE,
    ),
    Option("text_top_p", float, "text channel nucleus", "both", 0.0, 1.0),
    Option("text_top_k", int, "text channel top-k", "both", 0, MAX_TOP_K),
    Option(
        "audio_temperature", float, "codebook temperature (0: greedy)", "both", 0.0, MAX_TEMPERATURE
    ),
    Option("audio_top_p", float, "codebook nucleus", "both", 0.0, 1.0),
    Option("audio_top_k", int, "codebook top-k", "both", 0, MAX_TOP_K),
    Option(
        "audio_repetition_penalty",
        float,
        "penalty on codes already made",
        "both",
        1e-6,
        MAX_PENALTY,
    ),
    Option(
        "max_new_frames",
        int,
        "LM steps per text chunk (Local: frames, 12.5 per second)",
        "both",
        1,
        MAX_NEW_FRAMES,
    ),
    Option(
        "n_vq_for_inference",
        int,
        "Local v1: codebooks to generate (variable bitrate)",
        "both",
        1,
        64,
    ),
    Option(
        "stop_at",
        str,
        "Delay: stop at im_end (published) or at the end of its audio",
        "both",
        choices=STOPS,
    ),
    Option(
        "max_chunk_chars", int, "longest text chunk generated at once", "both", 16, MAX_CHUNK_CHARS
    ),
    Option(
        "continuation",
        bool,
        "the reference voice is the start of the speech (needs reference_text)",
        "both",
    ),
    Option(
        "reference_text",
        str,
        "transcript of the reference a continuation starts from (prepended to the text)",
        "both",
    ),
    *_fields(),
)

REGISTRY_ENTRY = Family(
    FAMILY,
    "MOSS-TTS (Local-Transformer v1.5 / v1, Delay) exported from the published checkpoints",
    load,
    _OPTIONS,
    manifest_sections=SECTIONS,
    files=model_files,
)

__all__ = ["FAMILY", "REGISTRY_ENTRY", "load"]

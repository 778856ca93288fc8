"""Chatterbox ONNX exports (Turbo, original English, multilingual), run unmodified: the
layout is recognised from file names and graph I/O (`layout`), the published generation loop
runs as a decode program (`model`), text follows the published scripts (`text`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from onnx_tts.families.base import Detection, Family, LoadSettings, Option
from onnx_tts.families.chatterbox.files import model_files
from onnx_tts.families.chatterbox.layout import (
    FAMILY_MULTILINGUAL,
    FAMILY_ORIGINAL,
    FAMILY_TURBO,
    PRECISIONS,
    ChatterboxLayout,
    available_precisions,
    inspect_layout,
    looks_like_chatterbox,
)
from onnx_tts.families.chatterbox.text import CangjieConverter

MAX_NEW_TOKENS_LIMIT = 10_000  # 400 s of speech in one chunk


def detect(root: Path, options: Mapping[str, Any]) -> Detection | None:
    """A Detection when `root` holds Chatterbox graphs (validated at the requested precision),
    None when it holds none."""
    if not looks_like_chatterbox(root):
        return None
    precision = options.get("precision")
    layout = inspect_layout(root, precision if isinstance(precision, str) else None)
    return Detection(layout.family, root, layout)


def load(detection: Detection, settings: LoadSettings, options: Mapping[str, Any]) -> Any:
    from onnx_tts.families.chatterbox.model import ChatterboxModel

    return ChatterboxModel(detection.inspected, settings, **options)


def _options(*, llama: bool) -> tuple[Option, ...]:
    common = (
        Option("precision", str, "graph variant to run", choices=PRECISIONS),
        Option("language", str, "language code of the text (multilingual models)", "both"),
        Option(
            "max_new_tokens",
            int,
            "speech-token limit per sentence (25 tokens = 1 s)",
            "load",
            1,
            MAX_NEW_TOKENS_LIMIT,
        ),
        Option(
            "max_token_repeat",
            int,
            "stop after this many equal tokens (0 = off)",
            "load",
            0,
            100_000,
        ),
        Option(
            "max_cycle_tokens",
            int,
            "stop when a short cycle spans this many tokens (0 = off)",
            "load",
            0,
            100_000,
        ),
        Option(
            "max_silence_tokens",
            int,
            "stop after this many silence tokens (0 = off)",
            "load",
            0,
            100_000,
        ),
        Option(
            "published_loop",
            bool,
            "run the model cards' scripts' loop exactly: the text as given (no normalisation, "
            "sentence splitting, capital or added period), no stop heuristics, their token cap "
            "(1024 Turbo, 256 original and multilingual) unless --max-new-tokens",
        ),
    )
    if not llama:
        return common
    return (
        *common,
        Option("exaggeration", float, "emotion exaggeration", "load", 0.0, 2.0),
        Option("cfg_weight", float, "classifier-free guidance weight (0 = off)", "load", 0.0, 5.0),
    )


REGISTRY_ENTRIES = (
    Family(
        FAMILY_TURBO,
        "Chatterbox Turbo ONNX (GPT-2 LM, audio-feature prefix)",
        load,
        _options(llama=False),
        files=model_files,
    ),
    Family(
        FAMILY_ORIGINAL,
        "Chatterbox original English ONNX (Llama LM)",
        load,
        _options(llama=True),
        files=model_files,
    ),
    Family(
        FAMILY_MULTILINGUAL,
        "Chatterbox multilingual ONNX (Llama LM, [lang] text)",
        load,
        _options(llama=True),
        files=model_files,
    ),
)

__all__ = [
    "FAMILY_MULTILINGUAL",
    "FAMILY_ORIGINAL",
    "FAMILY_TURBO",
    "REGISTRY_ENTRIES",
    "CangjieConverter",
    "ChatterboxLayout",
    "available_precisions",
    "detect",
    "inspect_layout",
]

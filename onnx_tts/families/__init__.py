"""Model-directory detection: the project's own bundles (bundle.json: the "codec-lm" bundle
and the "phoneme-mel" trained voice) and third-party layouts recognised from file names and
graph I/O (Chatterbox Turbo / original / multilingual)."""

from __future__ import annotations

import json
from pathlib import Path

from onnx_tts.errors import ModelError
from onnx_tts.families import chatterbox

CODEC_LM = "codec-lm"
PHONEME_MEL = "phoneme-mel"
FAMILIES = (CODEC_LM, PHONEME_MEL, *chatterbox.FAMILIES)


def detect(model_dir: Path | str) -> str:
    """Family name of `model_dir`: a bundle.json's "family" ("codec-lm" when absent), else one of
    "chatterbox-turbo", "chatterbox", "chatterbox-multilingual". Raises ModelError naming the
    missing or mismatched files/tensors when the directory is none of these."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelError(
            f"model directory {model_dir} does not exist or is not a directory; pass --model "
            "a directory holding bundle.json or a Chatterbox ONNX download"
        )
    manifest = model_dir / "bundle.json"
    if manifest.is_file():
        try:
            family = json.loads(manifest.read_text(encoding="utf-8")).get("family", CODEC_LM)
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            family = CODEC_LM  # Bundle.load reports what is wrong with the file
        return family if family == PHONEME_MEL else CODEC_LM
    if (
        not chatterbox.looks_like_chatterbox(model_dir)
        and not (model_dir / "tokenizer.json").is_file()
    ):
        raise ModelError(
            f"{model_dir} is not a model directory: it has no bundle.json and no Chatterbox "
            "graphs (onnx/language_model*.onnx, ...). Point --model at an onnx-tts bundle or a "
            "Chatterbox ONNX download."
        )
    return chatterbox.detect_family(model_dir)


def available_precisions(model_dir: Path | str) -> list[str]:
    """Precision variants present in `model_dir`, in default-choice order. A bundle.json
    directory has exactly one ("fp32")."""
    model_dir = Path(model_dir)
    if (model_dir / "bundle.json").is_file():
        return ["fp32"]
    return chatterbox.available_precisions(model_dir)


__all__ = ["CODEC_LM", "FAMILIES", "PHONEME_MEL", "available_precisions", "detect"]

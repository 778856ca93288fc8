"""The "piper" family: Piper's VITS voices as they are published and as wyoming-piper keeps
them (`NAME.onnx` + `NAME.onnx.json`), run as piper-tts runs them (`voice_config` reads the
config, `text` phonemizes, `model` runs the graph). `--model` takes one voice's `.onnx`, or a
directory holding one voice; `folder_voices` lists every voice of a folder for the servers'
`--piper-voices DIR`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from onnx_tts.errors import ModelError
from onnx_tts.families.base import (
    Detection,
    Family,
    FolderModel,
    LoadSettings,
    ModelFiles,
    ModelFolder,
    Option,
)
from onnx_tts.families.files import Check, GraphFile, Hint
from onnx_tts.families.piper.model import FAMILY, PiperModel
from onnx_tts.families.piper.voice_config import VoiceConfig, read_voice_config, voice_files

OPTIONS = (
    Option("noise_scale", float, "Piper generator noise (default: the voice's)", "both", 0.0, 10.0),
    Option(
        "length_scale",
        float,
        "Piper phoneme length: > 1 slower (default: the voice's)",
        "both",
        0.05,
        10.0,
    ),
    Option("noise_w", float, "Piper phoneme width noise (default: the voice's)", "both", 0.0, 10.0),
    Option(
        "normalize_audio", bool, "Piper: scale each sentence to full range (default true)", "both"
    ),
    Option("volume", float, "Piper: multiply the samples (default 1)", "both", 0.0, 10.0),
    Option(
        "english_reader",
        bool,
        "Piper English voices: read numbers, abbreviations, ... first (default true)",
        "both",
    ),
)


def detect(root: Path, options: Mapping[str, Any]) -> Detection | None:
    """A Piper voice: `root` is its `.onnx` (config beside it), or a directory holding exactly
    one voice. A directory of several voices is refused, naming them."""
    if root.is_file():
        if not root.name.endswith(".onnx") or not Path(f"{root}.json").is_file():
            return None
        return Detection(FAMILY, root, read_voice_config(root))
    found = voice_files(root)
    if not found:
        return None
    if len(found) > 1:
        names = ", ".join(path.name[: -len(".onnx")] for path in found[:8])
        raise ModelError(
            f"{root} holds {len(found)} Piper voices ({names}{', ...' if len(found) > 8 else ''}); "
            f"pass --model {root}/NAME.onnx for one, or serve them all with --piper-voices {root}"
        )
    return Detection(FAMILY, found[0], read_voice_config(found[0]))


def folder_voices(root: Path) -> list[FolderModel]:
    """Every voice of a wyoming-piper data folder, described from its config (nothing is
    loaded): its name, language and speakers."""
    if not root.is_dir():
        raise ModelError(f"--piper-voices {root}: not a directory")
    models = []
    for path in voice_files(root):
        config: VoiceConfig = read_voice_config(path)
        models.append(
            FolderModel(
                name=config.name,
                path=path,
                languages=(config.language,),
                speakers=config.speakers,
                description=config.description,
                sample_rate=config.sample_rate,
            )
        )
    if not models:
        raise ModelError(f"--piper-voices {root}: no Piper voice (NAME.onnx + NAME.onnx.json)")
    return models


def voice_files_of(detection: Detection) -> ModelFiles:
    """A voice for the offline tools: its one graph, run once per sentence ("call"), checked
    on random ids of its symbols at noise 0 (its noise is drawn inside the graph)."""
    config: VoiceConfig = detection.inspected
    hints = {
        "input": Hint(low=3, high=config.num_symbols),
        "input_lengths": Hint(length_of=("input", 1)),
        "scales": Hint(value=0.0, shape=(3,)),
    }
    if config.num_speakers > 1:
        hints["sid"] = Hint(high=config.num_speakers)
    check = Check("calls", ("voice",), hints, {"batch_size": 1, "phonemes": 40})
    graph = GraphFile("voice", config.model_path.name, runs="call", check=check)
    return ModelFiles(config.model_path.parent, {"": config.model_path.parent}, (graph,))


def load(detection: Detection, settings: LoadSettings, options: Mapping[str, Any]) -> PiperModel:
    return PiperModel(detection.inspected, settings, options)


REGISTRY_ENTRY = Family(
    name=FAMILY,
    summary="Piper VITS voices (NAME.onnx + NAME.onnx.json), as piper-tts runs them",
    loader=load,
    options=OPTIONS,
    files=voice_files_of,
    folder=ModelFolder(
        "piper_voices",
        "a folder of Piper voices (a wyoming-piper data directory): each voice is a model, "
        "by its file name, loaded when first asked for",
        folder_voices,
    ),
)

__all__ = ["FAMILY", "REGISTRY_ENTRY", "PiperModel", "detect", "folder_voices"]

"""The family registry: one place that maps a family name to its detection, options, manifest
sections and loader. `onnx_tts.load()` and the CLI ask it; adding a family is adding its
directory (a package whose `REGISTRY_ENTRY` is its `Family`) and listing it in `FAMILIES` below.

Detection reads each thing once: a directory with `bundle.json` is parsed and checked as the
family its manifest names; any other directory is offered to the layout detectors of
third-party exports (MOSS-TTS-Nano, Chatterbox, Piper voices), which read its graph
specs (a Piper voice may also be given as its `.onnx` file). The loader gets what detection
read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from onnx_tts.bundle import MANIFEST, Bundle
from onnx_tts.errors import ModelError
from onnx_tts.families import (
    chatterbox,
    codec_lm,
    higgs,
    moss_tts,
    moss_tts_nano,
    phoneme_mel,
    piper,
)
from onnx_tts.families.base import Detection, Family, FolderModel, LoadSettings, Model, Option

FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        codec_lm.REGISTRY_ENTRY,
        phoneme_mel.REGISTRY_ENTRY,
        *chatterbox.REGISTRY_ENTRIES,
        moss_tts_nano.REGISTRY_ENTRY,
        moss_tts.REGISTRY_ENTRY,
        higgs.REGISTRY_ENTRY,
        piper.REGISTRY_ENTRY,
    )
}
# The family of bundle manifests written before "family" existed.
FAMILY_OF_UNNAMED_BUNDLES = codec_lm.REGISTRY_ENTRY.name
# Recognisers of model directories that carry no bundle.json, tried in order.
LAYOUT_DETECTORS: tuple[Callable[[Path, Mapping[str, Any]], Detection | None], ...] = (
    moss_tts_nano.detect,
    chatterbox.detect,
    piper.detect,
)


def detect(model_dir: Path | str, options: Mapping[str, Any] | None = None) -> Detection:
    """What `model_dir` holds. `options` are the load options (a layout detector may need one,
    e.g. the precision whose files it should inspect). Raises ModelError saying what is
    missing or mismatched when the directory is no model this onnx-tts runs."""
    root = Path(model_dir)
    if root.is_file():  # a model that is one file (a Piper voice's .onnx)
        for detector in LAYOUT_DETECTORS:
            detection = detector(root, options or {})
            if detection is not None:
                return detection
        raise ModelError(
            f"{root} is a file no model family reads alone; pass --model a model directory, "
            "or a Piper voice's .onnx (with its .onnx.json beside it)"
        )
    if not root.is_dir():
        raise ModelError(
            f"model directory {root} does not exist or is not a directory; pass --model "
            "a directory holding bundle.json, a Chatterbox ONNX download or MOSS-TTS-Nano's "
            "ONNX directories"
        )
    if (root / MANIFEST).is_file():
        bundle = Bundle.read(root)
        family = FAMILIES.get(bundle.family or FAMILY_OF_UNNAMED_BUNDLES)
        if family is None or family.manifest_sections is None:
            bundled = ", ".join(n for n, f in FAMILIES.items() if f.manifest_sections)
            raise ModelError(
                f"{root / MANIFEST}: family {bundle.family!r} is not one this onnx-tts runs "
                f"({bundled}); upgrade onnx-tts or re-export the bundle"
            )
        bundle.validate(family.manifest_sections)
        return Detection(family.name, root, bundle)
    for detector in LAYOUT_DETECTORS:
        detection = detector(root, options or {})
        if detection is not None:
            return detection
    raise ModelError(
        f"{root} is not a model directory: it has no bundle.json and no Chatterbox graphs "
        "(onnx/language_model*.onnx, ...), nor a MOSS-TTS-Nano browser_poc_manifest.json, nor "
        "a Piper voice (NAME.onnx + NAME.onnx.json). Point --model at an onnx-tts bundle, a "
        "Chatterbox ONNX download, the parent of MOSS-TTS-Nano-100M-ONNX and "
        "MOSS-Audio-Tokenizer-Nano-ONNX, or a Piper voice."
    )


def family_of(detection: Detection) -> Family:
    return FAMILIES[detection.family]


def load_model(detection: Detection, settings: LoadSettings, options: Mapping[str, Any]) -> Model:
    """Load what `detection` found; options the family does not take are an InputError
    naming the ones it does."""
    family = family_of(detection)
    return family.loader(detection, settings, family.check_options(options, "load"))


def folder_scanners() -> dict[str, Callable[[Path], list[FolderModel]]]:
    """Each folder flag families declare (`Family.folder`) -> how its models are listed."""
    return {f.folder.option: f.folder.scan for f in FAMILIES.values() if f.folder is not None}


def all_options() -> dict[str, Option]:
    """Every family option by name (the CLI makes one flag of each)."""
    options: dict[str, Option] = {}
    for family in FAMILIES.values():
        for option in family.options:
            options.setdefault(option.name, option)
    return options


__all__ = [
    "FAMILIES",
    "LAYOUT_DETECTORS",
    "Detection",
    "Family",
    "LoadSettings",
    "Model",
    "Option",
    "all_options",
    "detect",
    "family_of",
    "folder_scanners",
    "load_model",
]

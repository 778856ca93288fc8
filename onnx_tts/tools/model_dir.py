"""A model directory as the offline tools see it: the files its family declares (`ModelFiles`,
onnx_tts/families/files.py), a new output directory built beside its final place, the files a
tool leaves as they are copied into it, and the manifest written again after files changed.
`convert` and `quantize` write every family's models through here, so neither names one."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from onnx_tts.bundle import Bundle, write_manifest
from onnx_tts.errors import InputError, ModelError
from onnx_tts.families import Detection, detect, family_of
from onnx_tts.families.files import GraphFile, ModelFiles


def model_files(source: Path) -> tuple[Detection, ModelFiles]:
    """What `source` holds and its files as its family declares them; a ModelError saying
    what is wrong when it is no model onnx-tts runs, or its family declares no files."""
    detection = detect(source)
    family = family_of(detection)
    if family.files is None:
        raise ModelError(
            f"{source}: the {family.name} family does not declare its files, so the offline "
            "tools cannot rewrite it"
        )
    return detection, family.files(detection)


def check_new_output(destination: Path, what: str = "output") -> Path:
    """`destination` as a new directory to create (for the `what`): InputError when it exists
    or its parent does not."""
    destination = Path(destination)
    if destination.exists():
        raise InputError(f"{destination} already exists: give a new directory for the {what}")
    if not destination.parent.is_dir():
        raise InputError(f"output directory does not exist: {destination.parent}")
    return destination


def files_of(graphs: Iterable[GraphFile]) -> set[str]:
    """Every file the graphs read (graph files and external data), relative to the model."""
    return {path for graph in graphs for path in graph.files()}


def copy_model(files: ModelFiles, out: Path, leave_out: Iterable[str] = ()) -> None:
    """Copy every file of the model's directories into `out` (each directory at its place),
    but the files `leave_out` names (relative to the model: what a tool writes anew or drops).
    A plain copy: onnx refuses external-data files with several hard links."""
    skipped = set(leave_out)
    for place, directory in files.directories.items():

        def ignore(folder: str, names: list[str], place: str = place, top: Path = directory):
            inner = Path(folder).relative_to(top).as_posix()
            prefix = "/".join(part for part in (place, inner) if part and part != ".")
            return [n for n in names if (f"{prefix}/{n}" if prefix else n) in skipped]

        shutil.copytree(directory, out / place if place else out, ignore=ignore, dirs_exist_ok=True)


def rewrite_manifest(
    files: ModelFiles, out: Path, update: Callable[[dict[str, Any]], None] | None = None
) -> None:
    """When the model has a manifest: the source's, changed by `update`, written into `out`
    with the sha256 of `out`'s files (`onnx_tts.bundle.write_manifest`)."""
    if files.manifest is None:
        return
    place = Path(files.manifest).parent
    source = Bundle.read(files.source(files.manifest).parent)
    manifest = {k: v for k, v in source.manifest.items() if k != "sha256"}
    if update is not None:
        update(manifest)
    write_manifest(out / place, manifest)


def place_output(staging: Path, destination: Path) -> None:
    """The finished output (built in `staging`) moved to `destination` in one rename."""
    staging.chmod(0o755)
    os.replace(staging, destination)


__all__ = [
    "check_new_output",
    "copy_model",
    "files_of",
    "model_files",
    "place_output",
    "rewrite_manifest",
]

"""Writing model files: the one bundle writer (`write_bundle`: graphs, then bundle.json with the
sha256 of every file) and graphs that keep their weights in one shared external-data file.

Export recipes (export/onnx_graphs.py re-exports `write_bundle`), the quantizer and the
converter all write through here, so every bundle.json's hashes come from the bytes written.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import onnx
from onnx import TensorProto, external_data_helper

from onnx_tts.errors import ModelError

# Initializers smaller than this stay inside the graph when weights go to a shared file (shape
# constants and the like; as published exports do).
EXTERNAL_THRESHOLD = 1024


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Writes to a temp file in the same directory, then renames over the target."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; bundle files must be readable by all
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_model(model: onnx.ModelProto, path: str | os.PathLike[str]) -> bytes:
    """Serialises deterministically, writes atomically, returns the bytes written."""
    data = model.SerializeToString(deterministic=True)
    atomic_write_bytes(path, data)
    return data


# Files a manifest can name; each one must be written (and hashed) by `write_bundle`.
_BUNDLE_FILE_SUFFIXES = (".onnx", ".onnx_data", ".json", ".txt", ".wav")


def manifest_files(value: object) -> set[str]:
    """Every string in a manifest that names a bundle file."""
    if isinstance(value, str):
        return {value} if value.endswith(_BUNDLE_FILE_SUFFIXES) else set()
    if isinstance(value, Mapping):
        return set().union(*(manifest_files(v) for v in value.values()))
    if isinstance(value, list | tuple):
        return set().union(*(manifest_files(v) for v in value))
    return set()


def write_bundle(
    out_dir: str | os.PathLike[str],
    manifest: Mapping[str, object],
    files: Mapping[str, onnx.ModelProto | bytes],
) -> tuple[dict[str, str], dict[str, int]]:
    """The one bundle writer: every file (graphs serialised deterministically), then
    bundle.json = `manifest` + "sha256" of every file, each written atomically (bundle.json
    last, so a reader never sees a manifest whose files are not there yet).

    Raises ModelError when the manifest names a file that is not in `files` (it would carry no
    hash). Returns ({file: sha256 hex}, {file: size} including bundle.json)."""
    unlisted = sorted(manifest_files(manifest) - set(files))
    if unlisted:
        raise ModelError(
            f"the manifest names {', '.join(unlisted)} but no such file is written: pass it in "
            "`files` so it is hashed"
        )
    if "sha256" in manifest:
        raise ModelError("the manifest must not carry 'sha256': write_bundle computes it")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sha256: dict[str, str] = {}
    sizes: dict[str, int] = {}
    for filename, content in files.items():
        if isinstance(content, bytes):
            atomic_write_bytes(out / filename, content)
            data = content
        else:
            data = save_model(content, out / filename)
        sha256[filename] = hashlib.sha256(data).hexdigest()
        sizes[filename] = len(data)
    text = (json.dumps({**manifest, "sha256": sha256}, indent=2) + "\n").encode("utf-8")
    atomic_write_bytes(out / "bundle.json", text)
    sizes["bundle.json"] = len(text)
    return sha256, sizes


def save_sharing_data(
    graphs: Sequence[tuple[Path, onnx.ModelProto]],
    data_name: str,
    threshold: int = EXTERNAL_THRESHOLD,
) -> dict[Path, int]:
    """Write `graphs` (all in one directory) with every initializer of `threshold` bytes or
    more moved to one `data_name` file beside them, each distinct tensor (by sha256 of its
    bytes) stored once: graphs that share weights keep sharing them. The models are modified
    (their large initializers become external references). Returns the bytes of each graph
    file and of the data file (under its path)."""
    if not graphs:
        return {}
    directory = graphs[0][0].parent
    if any(path.parent != directory for path, _ in graphs):
        raise ModelError("graphs that share an external-data file must be in one directory")
    offsets: dict[str, tuple[int, int]] = {}
    blob = bytearray()
    for _, model in graphs:
        for tensor in model.graph.initializer:
            if tensor.data_location == TensorProto.EXTERNAL:
                raise ModelError(
                    f"initializer {tensor.name!r} still points at external data: load the "
                    "graph with its weights before saving it"
                )
            raw = tensor.raw_data
            if not raw or len(raw) < threshold:
                continue  # typed-field or small tensors stay inline
            digest = hashlib.sha256(raw).hexdigest()
            if digest not in offsets:
                offsets[digest] = (len(blob), len(raw))
                blob.extend(raw)
            offset, length = offsets[digest]
            external_data_helper.set_external_data(tensor, data_name, offset, length)
            tensor.data_location = TensorProto.EXTERNAL
            tensor.ClearField("raw_data")
    sizes = {directory / data_name: len(blob)}
    atomic_write_bytes(directory / data_name, bytes(blob))
    for path, model in graphs:
        sizes[path] = len(save_model(model, path))
    return sizes


__all__ = [
    "EXTERNAL_THRESHOLD",
    "atomic_write_bytes",
    "manifest_files",
    "save_model",
    "save_sharing_data",
    "write_bundle",
]

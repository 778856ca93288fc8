"""Graphs that keep their weights in one shared external-data file (`save_sharing_data`): each
distinct tensor stored once, so graphs that share weights keep sharing them when a tool
rewrites them (export recipes write their stand-ins through it too)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import onnx
from onnx import TensorProto, external_data_helper

from onnx_tts.bundle import save_model, write_file
from onnx_tts.errors import ModelError

# Initializers smaller than this stay inside the graph when weights go to a shared file (shape
# constants and the like; as published exports do).
EXTERNAL_THRESHOLD = 1024


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
    write_file(directory / data_name, bytes(blob))
    for path, model in graphs:
        sizes[path] = len(save_model(model, path))
    return sizes


__all__ = ["EXTERNAL_THRESHOLD", "save_sharing_data"]

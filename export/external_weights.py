"""Graphs whose weights are written to their external-data file as they are added.

A backbone of billions of parameters cannot be built as one in-memory `onnx.ModelProto` (a
protobuf holds at most 2 GB, and a float32 1.7B model is 7 GB): `StreamingBuilder` is the
project's `GraphBuilder` whose large initializers go straight to an open data file (offsets
aligned, so ONNX Runtime can map them) and stay in the graph only as references. Memory is one
tensor at a time; the graph itself is small. Building twice gives identical bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
from onnx import TensorProto, helper

from onnx_tts.bundle import save_model
from onnx_tts.tools.external_data import EXTERNAL_THRESHOLD
from onnx_tts.tools.graph_builder import DEFAULT_OPSET, GraphBuilder

# Tensors of 1 MiB or more start on a page boundary (ONNX Runtime maps aligned external data);
# smaller ones on 64 bytes.
PAGE = 4096
SMALL_ALIGNMENT = 64


class StreamingBuilder(GraphBuilder):
    """A GraphBuilder whose initializers of `threshold` bytes or more are appended to `sink`
    (the file `data_name` beside the graph) as they are added."""

    def __init__(
        self,
        name: str,
        sink: BinaryIO,
        data_name: str,
        opset: int = DEFAULT_OPSET,
        threshold: int = EXTERNAL_THRESHOLD,
    ) -> None:
        super().__init__(name, opset)
        self.sink, self.data_name, self.threshold = sink, data_name, threshold
        self.offset = sink.tell()

    def initializer(self, name: str, array: np.ndarray) -> str:
        array = np.asarray(array, order="C")  # (ascontiguousarray would make a scalar 1-D)
        if array.nbytes < self.threshold:
            return super().initializer(name, array)
        unique = self.unique(name)
        alignment = PAGE if array.nbytes >= (1 << 20) else SMALL_ALIGNMENT
        padding = -self.offset % alignment
        if padding:
            self.sink.write(b"\0" * padding)
            self.offset += padding
        tensor = TensorProto(name=unique, data_type=helper.np_dtype_to_tensor_dtype(array.dtype))
        tensor.dims.extend(array.shape)
        self.sink.write(array.tobytes())
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (
            ("location", self.data_name),
            ("offset", str(self.offset)),
            ("length", str(array.nbytes)),
        ):
            tensor.external_data.add(key=key, value=value)
        self.offset += array.nbytes
        self.initializers.append(tensor)
        return unique


def save_streamed(model: onnx.ModelProto, path: Path) -> int:
    """The graph (its weights already in the data file) written beside its data; its size."""
    return len(save_model(model, path))


__all__ = ["PAGE", "StreamingBuilder", "save_streamed"]

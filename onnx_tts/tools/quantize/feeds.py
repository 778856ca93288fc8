"""Random inputs for any graph, built from its declared inputs: the agreement check runs the
float and the quantized graph on the same feeds.

Integer inputs that index an embedding table (`Gather` on an initializer, directly or through a
Cast) draw from its rows; other integer inputs from [0, 2) unless a `Hint` says otherwise (a
family knows that a channel index goes to 16, a step type to 3, a length equals a dimension).
Float inputs are standard normal (or a hint's scale, a uniform draw, a constant).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx

from onnx_tts.families.files import Hint
from onnx_tts.graph_io import (
    LENGTH_INPUTS,
    PAST_VALID_LENGTHS,
    POSITION_INPUTS,
    TensorSpec,
    parse_kv_name,
)

DEFAULT_LENGTH = 16  # a symbolic dimension without a hint
# Inputs the sequence runner fills from the cache length, never drawn at random.
LENGTH_FEEDS = (*LENGTH_INPUTS, *POSITION_INPUTS, PAST_VALID_LENGTHS)


def gather_sizes(model: onnx.ModelProto) -> dict[str, int]:
    """Graph input -> rows of the embedding table a Gather indexes with it (through Casts)."""
    initializers = {t.name: t for t in model.graph.initializer}
    inputs = {i.name for i in model.graph.input}
    source = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "Cast"}
    sizes: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type != "Gather" or len(node.input) < 2:
            continue
        table = initializers.get(node.input[0])
        if table is None or not table.dims:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if axis != 0:
            continue
        name = node.input[1]
        while name in source and name not in inputs:
            name = source[name]
        if name in inputs:
            rows = int(table.dims[0])
            sizes[name] = min(sizes.get(name, rows), rows)
    return sizes


class RandomFeeds:
    """Feeds for one graph's inputs, from a seeded generator (the same seed gives the float and
    the quantized graph the same inputs)."""

    def __init__(
        self,
        inputs: Mapping[str, TensorSpec],
        gathers: Mapping[str, int],
        hints: Mapping[str, Hint],
        dims: Mapping[str, int],
        seed: int = 0,
    ) -> None:
        self.inputs = dict(inputs)
        self.gathers = dict(gathers)
        self.hints = dict(hints)
        self.dims = dict(dims)
        self.rng = np.random.default_rng(seed)

    def drawn(self) -> list[str]:
        """Inputs drawn at random: all but KV caches and (when the graph has a cache) the
        length inputs the sequence runner fills from the cache."""
        cached = any(parse_kv_name(name) is not None for name in self.inputs)
        return [
            name
            for name in self.inputs
            if parse_kv_name(name) is None and not (cached and name in LENGTH_FEEDS)
        ]

    def sequence_inputs(self) -> list[str]:
        """Drawn inputs with a symbolic second dimension (the new tokens of an LM step)."""
        return [
            name
            for name in self.drawn()
            if len(self.inputs[name].shape) >= 2 and not isinstance(self.inputs[name].shape[1], int)
        ]

    def _shape(self, spec: TensorSpec, tokens: int | None) -> tuple[int, ...]:
        hint = self.hints.get(spec.name)
        if hint is not None and hint.shape is not None:
            return hint.shape
        shape = []
        for axis, dim in enumerate(spec.shape):
            if isinstance(dim, int):
                shape.append(dim)
            elif axis == 0:
                shape.append(1)  # batch
            elif axis == 1 and tokens is not None:
                shape.append(tokens)
            else:
                shape.append(self.dims.get(str(dim), DEFAULT_LENGTH))
        return tuple(shape)

    def make(self, tokens: int | None = None) -> dict[str, np.ndarray]:
        """One set of feeds; `tokens` sizes the second dimension of sequence inputs."""
        feeds: dict[str, Any] = {}
        later = []
        for name in self.drawn():
            spec, hint = self.inputs[name], self.hints.get(name, Hint())
            if hint.length_of is not None:
                later.append(name)
                continue
            shape = self._shape(spec, tokens)
            if hint.value is not None:
                feeds[name] = np.full(shape, hint.value, spec.dtype)
            elif spec.dtype.kind in "iu":
                high = hint.high if hint.high is not None else self.gathers.get(name, 2)
                feeds[name] = self.rng.integers(hint.low, max(high, hint.low + 1), shape).astype(
                    spec.dtype
                )
            elif spec.dtype.kind == "b":
                feeds[name] = self.rng.integers(0, 2, shape).astype(bool)
            elif hint.uniform:
                feeds[name] = self.rng.random(shape).astype(spec.dtype)
            else:
                feeds[name] = (hint.scale * self.rng.standard_normal(shape)).astype(spec.dtype)
        for name in later:
            spec, (other, axis) = self.inputs[name], self.hints[name].length_of
            shape = self._shape(spec, tokens)
            feeds[name] = np.full(shape, feeds[other].shape[axis], spec.dtype)
        return feeds


__all__ = ["DEFAULT_LENGTH", "LENGTH_FEEDS", "Hint", "RandomFeeds", "gather_sizes"]

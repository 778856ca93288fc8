"""Graph I/O: the one tensor-spec type, KV-name parsing and I/O checks for every graph onnx-tts
loads (its own bundles, third-party layouts, the converter) and the C++ core's KV pairing.

A graph's declared I/O is read once, either from the file (`read_graph_spec`, which also
records the operators the graph uses and its external-data files, without loading weights)
or from a loaded session. Everything that asks "which KV tensors pair up", "can this LM keep
its cache in place" or "does this graph match its manifest" asks this module.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from onnx_tts.errors import ModelError

if TYPE_CHECKING:
    import onnx

Dim = int | str | None

# KV tensor names: "past_key_values.N.key|value" in, "present.N.key|value" out (Hugging Face /
# optimum, onnxruntime-genai); "past.N.*" and "present_key_values.N.*" spellings also occur.
PAST_NAME = re.compile(r"^(?:past_key_values|past)[._](\d+)[._](key|value)$")
PRESENT_NAME = re.compile(r"^(?:present|present_key_values)[._](\d+)[._](key|value)$")
# Kind before layer: "past_key_N" / "present_key_N" (some exports; "local_" for the graphs of
# a second, per-frame transformer).
PAST_KIND_FIRST = re.compile(r"^(?:local_)?past_(key|value)_(\d+)$")
PRESENT_KIND_FIRST = re.compile(r"^(?:local_)?present_(key|value)_(\d+)$")

# Inputs an LM step takes besides embeddings/ids and the KV cache; the decode loop fills them.
LENGTH_INPUTS = ("seqlens_k", "total_sequence_length")
POSITION_INPUTS = ("attention_mask", "position_ids")
# The cached tokens per row, which some step graphs take to place new tokens (instead of a mask).
PAST_VALID_LENGTHS = "past_valid_lengths"
GQA_OP = ("com.microsoft", "GroupQueryAttention")


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output as declared: a symbolic dimension is its name, an unnamed one
    is None."""

    name: str
    dtype: np.dtype
    shape: tuple[Dim, ...]

    def dim(self, axis: int) -> int | None:
        """The fixed size of `axis`, or None when it is symbolic or the rank is smaller."""
        if axis >= len(self.shape) or axis < -len(self.shape):
            return None
        value = self.shape[axis]
        return value if isinstance(value, int) else None

    def describe(self) -> str:
        dims = ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name}: {self.dtype} [{dims}]"


@dataclass(frozen=True)
class GraphSpec:
    """The declared interface of one graph. `ops` holds (domain, op_type) of its nodes when it
    was read from the file (empty when built from a session, which does not expose them)."""

    path: Path
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    ops: frozenset[tuple[str, str]] = field(default_factory=frozenset)
    external_data: tuple[str, ...] = ()  # sidecar files the graph's weights live in

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(self.outputs)

    def tensor(self, name: str) -> TensorSpec:
        spec = self.inputs.get(name) or self.outputs.get(name)
        if spec is None:
            raise ModelError(f"{self.path.name} has no tensor named {name!r}")
        return spec

    def uses(self, op: tuple[str, str]) -> bool:
        return op in self.ops


def graph_spec(
    path: str | Path,
    inputs: Iterable[TensorSpec],
    outputs: Iterable[TensorSpec],
    ops: Iterable[tuple[str, str]] = (),
    external_data: Iterable[str] = (),
) -> GraphSpec:
    return GraphSpec(
        Path(path),
        {spec.name: spec for spec in inputs},
        {spec.name: spec for spec in outputs},
        frozenset(ops),
        tuple(external_data),
    )


def read_graph_spec(path: str | Path) -> GraphSpec:
    """Declared I/O, operators and sidecar names of an ONNX file, without loading weights."""
    return graph_spec_of(read_graph_proto(path), path)


def read_graph_proto(path: str | Path) -> onnx.ModelProto:
    """An ONNX file parsed without its external data (for a caller that reads more of it than
    `graph_spec_of` does, so the file is parsed once)."""
    import onnx

    path = Path(path)
    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as error:  # protobuf raises several types for a damaged file
        raise ModelError(f"{path} is not a readable ONNX graph: {error}") from None


def graph_spec_of(model: onnx.ModelProto, path: str | Path) -> GraphSpec:
    """Declared I/O, operators and sidecar names of the graph `model`, read from `path`."""
    import onnx
    from onnx import helper

    path = Path(path)

    def spec(value: onnx.ValueInfoProto) -> TensorSpec:
        tensor_type = value.type.tensor_type
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor_type.elem_type))
        except (KeyError, TypeError, ValueError):
            raise ModelError(
                f"{path.name}: tensor {value.name!r} has an element type onnx-tts does not read"
            ) from None
        dims: list[Dim] = []
        for dim in tensor_type.shape.dim:
            if dim.HasField("dim_value"):
                dims.append(int(dim.dim_value))
            elif dim.HasField("dim_param"):
                dims.append(dim.dim_param)
            else:
                dims.append(None)
        return TensorSpec(value.name, dtype, tuple(dims))

    graph = model.graph
    initializers = {tensor.name for tensor in graph.initializer}
    sidecars: list[str] = []
    for tensor in graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            for entry in tensor.external_data:
                if entry.key == "location" and entry.value not in sidecars:
                    sidecars.append(entry.value)
    return graph_spec(
        path,
        (spec(v) for v in graph.input if v.name not in initializers),
        (spec(v) for v in graph.output),
        ((node.domain or "ai.onnx", node.op_type) for node in graph.node),
        sidecars,
    )


# -- weights ---------------------------------------------------------------------------------
NBITS_OP = ("com.microsoft", "MatMulNBits")
# Operators of dynamic (activation-scaled) integer quantization, as quantize_dynamic writes them.
_INTEGER_OPS = frozenset({"MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv"})
# The node names of `onnx-tts quantize --weights w8a8` (tools/quantize/w8a8.py NODE_PREFIX).
W8A8_PREFIX = "onnx_tts/w8a8/"


def model_bytes(model: onnx.ModelProto) -> int:
    """The model's size as one protobuf message; past protobuf's 2 GiB limit, where
    `ByteSize` raises, the size of its initializers (nearly all of such a model), each one
    past the limit by its data's length (one family's text head alone is 2.5 GB)."""
    from google.protobuf.message import EncodeError

    def tensor_bytes(tensor: onnx.TensorProto) -> int:
        try:
            return tensor.ByteSize()
        except EncodeError:
            return len(tensor.raw_data)

    try:
        return model.ByteSize()
    except EncodeError:
        return sum(tensor_bytes(tensor) for tensor in model.graph.initializer)


def matmul_nbits_settings(model: onnx.ModelProto) -> set[tuple[int, int, int]]:
    """(bits, block_size, accuracy_level) of every com.microsoft.MatMulNBits node."""
    from onnx import helper

    found = set()
    for node in model.graph.node:
        if (node.domain, node.op_type) != NBITS_OP:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        found.add(
            (int(attrs.get("bits", 4)), int(attrs.get("block_size", 0)),
             int(attrs.get("accuracy_level", 0)))
        )  # fmt: skip
    return found


def weights_kind(model: onnx.ModelProto) -> str:
    """How a graph (parsed without its external data) keeps its weights, in words: MatMulNBits
    blocks ("int8 (MatMulNBits, blocks of 32, int8 compute)"), the per-row integer form of
    `quantize --weights w8a8`, dynamic integer quantization ("int8 (dynamic: MatMulInteger)"),
    else the floating type that holds most of its weight values ("float32", "float16",
    "bfloat16"); "no weights" when it has none."""
    import math

    from onnx import TensorProto

    kinds = []
    for bits, block, accuracy in sorted(matmul_nbits_settings(model), reverse=True):
        compute = ", int8 compute" if accuracy == 4 else ""
        kinds.append(f"int{bits} (MatMulNBits, blocks of {block}{compute})")
    w8a8 = [n for n in model.graph.node if n.name.startswith(W8A8_PREFIX)]
    if any(n.op_type == "MatMulInteger" for n in w8a8):
        kinds.append("w8a8 (MatMulInteger, int8 weights per column, int8 activations per row)")
    integer = sorted(
        {
            n.op_type
            for n in model.graph.node
            if n.op_type in _INTEGER_OPS and not n.name.startswith(W8A8_PREFIX)
        }
    )
    if integer:
        kinds.append(f"int8 (dynamic: {', '.join(integer)})")
    if kinds:
        return " + ".join(kinds)
    values: dict[str, int] = {}
    floats = {TensorProto.FLOAT: "float32", TensorProto.FLOAT16: "float16",
              TensorProto.BFLOAT16: "bfloat16", TensorProto.DOUBLE: "float64"}  # fmt: skip
    for tensor in model.graph.initializer:
        name = floats.get(tensor.data_type)
        if name is None:
            continue
        values[name] = values.get(name, 0) + math.prod(max(0, d) for d in tensor.dims)
    if not values:
        return "no weights"
    return max(values, key=lambda name: values[name])


# -- KV cache layout ------------------------------------------------------------------------


def parse_kv_name(name: str) -> tuple[str, int, str] | None:
    """("past" | "present", layer, "key" | "value") for a KV tensor name, else None."""
    for side, pattern in (("past", PAST_NAME), ("present", PRESENT_NAME)):
        match = pattern.match(name)
        if match:
            return side, int(match.group(1)), match.group(2)
    for side, pattern in (("past", PAST_KIND_FIRST), ("present", PRESENT_KIND_FIRST)):
        match = pattern.match(name)
        if match:
            return side, int(match.group(2)), match.group(1)
    return None


def kv_pairs(input_names: Iterable[str], output_names: Iterable[str]) -> list[tuple[str, str]]:
    """(past input, present output) pairs ordered by parsed layer, key before value (so
    ".10" follows ".2"). Raises ModelError naming every unmatched tensor."""
    past: dict[tuple[int, str], str] = {}
    present: dict[tuple[int, str], str] = {}
    for names, side, table in ((input_names, "past", past), (output_names, "present", present)):
        for name in names:
            parsed = parse_kv_name(name)
            if parsed is not None and parsed[0] == side:
                table[(parsed[1], parsed[2])] = name
    if not past:
        raise ModelError(
            "the graph has no KV inputs named like past_key_values.N.key / "
            "past_key_values.N.value: it is not an LM with a KV cache"
        )
    problems = [
        f"input {past[k]!r} has no present output" for k in sorted(past) if k not in present
    ]
    problems += [
        f"output {present[k]!r} has no past input" for k in sorted(present) if k not in past
    ]
    layers = {layer for layer, _ in past}
    problems += [
        f"layer {layer} lacks past_key_values.{layer}.{kind}"
        for layer in range(max(layers) + 1)
        for kind in ("key", "value")
        if (layer, kind) not in past
    ]
    if problems:
        raise ModelError("KV inputs and outputs do not pair up: " + "; ".join(problems))
    return [(past[key], present[key]) for key in sorted(past, key=lambda k: (k[0], k[1] != "key"))]


@dataclass(frozen=True)
class KVLayout:
    """An LM's KV cache as its graph declares it.

    attention:
      "gqa"      GroupQueryAttention with explicit `seqlens_k` / `total_sequence_length` inputs;
      "gqa-mask" GroupQueryAttention inside, lengths derived from `attention_mask`
                 (onnxruntime-genai builds);
      "concat"   the cache grows by Concat (in-place KV impossible).

    sequence_axis: 2 for [batch, heads, sequence, head_dim], 1 for [batch, sequence, heads,
    head_dim].
    """

    pairs: tuple[tuple[str, str], ...]
    layers: int
    kv_heads: int
    head_dim: int
    dtype: np.dtype
    attention: str
    sequence_axis: int = 2

    @property
    def in_place(self) -> bool:
        """Whether one fixed buffer can be bound as both past and present."""
        return self.attention != "concat"

    @property
    def bytes_per_token(self) -> int:
        """KV bytes one cached token costs for one sequence."""
        return len(self.pairs) * self.kv_heads * self.head_dim * self.dtype.itemsize


def kv_layout(spec: GraphSpec) -> KVLayout:
    """Pair the KV tensors of an LM graph, check their shapes and dtypes, and decide once, from
    the graph's I/O (and operators when known), whether it can keep its cache in place."""
    pairs = kv_pairs(spec.input_names, spec.output_names)
    name = spec.path.name
    first = spec.inputs[pairs[0][0]]
    # The sequence is the symbolic one of axes 1 and 2 (as the C++ core decides it).
    sequence_axis = 1 if first.dim(1) is None and first.dim(2) is not None else 2
    heads_axis = 3 - sequence_axis
    heads, head_dim = first.dim(heads_axis), first.dim(3)
    if len(first.shape) != 4 or heads is None or head_dim is None:
        raise ModelError(
            f"{name}: KV input {first.name!r} must be [batch, heads, sequence, head_dim] (or "
            f"[batch, sequence, heads, head_dim]) with fixed heads and head_dim, found "
            f"{list(first.shape)}"
        )
    problems = []
    for past, present in pairs:
        for tensor in (spec.inputs[past], spec.outputs[present]):
            if tensor.dtype != first.dtype:
                problems.append(f"{tensor.name!r} is {tensor.dtype}, {first.name!r} {first.dtype}")
            if len(tensor.shape) != 4 or (tensor.dim(heads_axis), tensor.dim(3)) not in (
                (heads, head_dim),
                (None, None),
            ):
                problems.append(f"{tensor.name!r} has shape {list(tensor.shape)}")
    if problems:
        raise ModelError(f"{name}: KV tensors disagree: " + "; ".join(problems))
    if all(length in spec.inputs for length in LENGTH_INPUTS):
        attention = "gqa"
    elif spec.uses(GQA_OP) and "attention_mask" in spec.inputs:
        attention = "gqa-mask"
    else:
        attention = "concat"
    layers = len({parse_kv_name(past)[1] for past, _ in pairs})  # type: ignore[index]
    return KVLayout(tuple(pairs), layers, heads, head_dim, first.dtype, attention, sequence_axis)


# -- checks against a manifest ----------------------------------------------------------------


def check_graph_io(
    spec: GraphSpec,
    role: str,
    inputs: Mapping[str, tuple[str, Iterable[int | None]]],
    outputs: Mapping[str, tuple[str, Iterable[int | None]]],
    source: str = "bundle.json",
) -> None:
    """Compare a graph's I/O with what its manifest implies; name every mismatch at once.

    `inputs`/`outputs` map tensor name -> (dtype, dims) where a None dim is free.
    """
    problems: list[str] = []
    for kind, expected, actual in (
        ("input", inputs, spec.inputs),
        ("output", outputs, spec.outputs),
    ):
        for name, (dtype, dims) in expected.items():
            info = actual.get(name)
            if info is None:
                problems.append(f"missing {kind} '{name}'")
                continue
            if info.dtype != np.dtype(dtype):
                problems.append(f"{kind} '{name}' is {info.dtype}, expected {dtype}")
            dims = list(dims)
            if len(info.shape) != len(dims):
                problems.append(f"{kind} '{name}' has rank {len(info.shape)}, expected {len(dims)}")
                continue
            for axis, (have, want) in enumerate(zip(info.shape, dims, strict=True)):
                if want is not None and isinstance(have, int) and have != want:
                    problems.append(f"{kind} '{name}' dimension {axis} is {have}, expected {want}")
    if problems:
        raise ModelError(
            f"{role} graph {spec.path} does not match {source}: " + "; ".join(problems)
        )


__all__ = [
    "GQA_OP",
    "LENGTH_INPUTS",
    "NBITS_OP",
    "PAST_VALID_LENGTHS",
    "POSITION_INPUTS",
    "GraphSpec",
    "KVLayout",
    "TensorSpec",
    "check_graph_io",
    "graph_spec",
    "graph_spec_of",
    "kv_layout",
    "kv_pairs",
    "matmul_nbits_settings",
    "parse_kv_name",
    "read_graph_proto",
    "read_graph_spec",
    "weights_kind",
]

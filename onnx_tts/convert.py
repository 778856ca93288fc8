"""Rewrite a Concat-KV decoder LM into one whose attention is com.microsoft GroupQueryAttention.

    onnx-tts convert --inplace-kv IN.onnx OUT.onnx [--no-check] [--check-steps N]
    onnx-tts convert --inplace-kv MODEL_DIR NEW_DIR     (every language_model*.onnx + copies)

Third-party LM exports (Chatterbox, Hugging Face / optimum) grow the KV cache with
``present = Concat(past, new)`` and compute attention with explicit MatMul/Softmax nodes, so
their cache can only be chained, never written in place. This module finds, for every layer,

* the Concat nodes that produce ``present.N.key`` / ``present.N.value`` from
  ``past_key_values.N.*`` and the new key/value [B, Hkv, S, Dh] (rotary already applied),
* the score MatMul that meets the (transposed, possibly head-repeated) present key, the query
  tensor [B, H, S, Dh] on its other side and the scalar factors on both paths (the scale),
* the Softmax after it (masks added or selected on the way are dropped) and the context MatMul
  with the present value,

and replaces that subgraph with one GroupQueryAttention node (``do_rotary=0``, the source's
scale) that reads ``past_key_values.N.*`` and writes ``present.N.*``. Nodes that only fed the
old attention (causal masks, repeat-kv shapes) are removed. The converted graph keeps every
input of the source (``attention_mask`` may become unused: GroupQueryAttention is causal and
assumes no padding, which is how Chatterbox runs) and adds ``seqlens_k`` (int32 [B], total
length - 1) and ``total_sequence_length`` (int32 scalar), which `KVCache` fills in.

Nothing is trusted from names alone: before rewriting, the source is run once on random inputs
with the matched tensors as extra outputs, which gives the head counts and the scale and checks
that each matched block really computes causal ``softmax(scale * Q K^T) V``. With ``check``
(the default) the converted graph is then run next to the source (prefill + decode steps, source
with numpy-fed growing cache, converted with `KVCache` in ``inplace`` and ``chain`` mode) and the
logits must agree; the output files are only moved into place after that.

Precision: the GroupQueryAttention node runs in the dtype of the graph's KV inputs. Graphs
with fp16 weights but fp32 KV I/O (``keep_io_types`` exports) get Casts on Q/K/V and on the
attention output, so the fp32 cache buffers are still written in place; graphs with fp16 KV run
the fp16 kernel (ONNX Runtime 1.31's CPU GroupQueryAttention accepts float16).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx_tts.errors import InputError, ModelError

MS_DOMAIN = "com.microsoft"
IR_VERSION = 10  # onnx 1.23 writes IR 14 by default; ORT 1.31 reads at most 13
SEQLENS_INPUT = "seqlens_k"
TOTAL_LENGTH_INPUT = "total_sequence_length"
_PAST_RE = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
_PRESENT_RE = re.compile(r"^present\.(\d+)\.(key|value)$")
# Ops that only move, repeat or cast K/V between the present tensor and the attention MatMuls.
_KV_LAYOUT_OPS = frozenset(
    {"Transpose", "Unsqueeze", "Squeeze", "Expand", "Reshape", "Tile", "Cast", "Identity"}
)
_SCALE_OPS = frozenset({"Mul", "Div"})
_PROBS_PASSTHROUGH = frozenset({"Cast", "Where", "Identity", "Dropout"})
_SIDE_CONSUMERS = frozenset({"Shape", "Size"})  # read only the shape; dead after the rewrite
_SHAPE_DERIVED_DEPTH = 64
_EXTERNAL_DATA_THRESHOLD = 1 << 30  # inline graphs above 1 GiB are written with a sidecar
_PROTOBUF_LIMIT = (1 << 31) - (1 << 26)  # leave headroom under protobuf's 2 GiB

_FLOAT_TYPES = {
    TensorProto.FLOAT: np.dtype(np.float32),
    TensorProto.FLOAT16: np.dtype(np.float16),
}


# ---------------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerAttention:
    """What one rewritten attention block computes."""

    layer: int
    num_heads: int
    kv_num_heads: int
    head_dim: int
    scale: float
    probe_max_abs_diff: float  # matched block vs numpy causal attention, on the probe run


@dataclass(frozen=True)
class LogitsCheck:
    """Source vs converted logits over one prefill + `decode_steps` single-token steps."""

    prefill_tokens: int
    decode_steps: int
    max_abs_diff_inplace: float
    max_abs_diff_chain: float
    max_abs_diff_unmasked: (
        float  # both modes, entries with |logit| <= 100 x median (no -1e4 biases)
    )
    typical_abs_logit: float  # median |logit| of the source
    tolerance: float  # allowed |diff| beyond rtol x |logit|

    @property
    def max_abs_diff(self) -> float:
        return max(self.max_abs_diff_inplace, self.max_abs_diff_chain)


@dataclass(frozen=True)
class ConvertReport:
    source: Path
    destination: Path
    layers: tuple[LayerAttention, ...]
    kv_dtype: str  # dtype of the KV I/O; GroupQueryAttention runs in it
    nodes_before: int
    nodes_after: int
    unused_inputs: tuple[str, ...]
    external_data: bool
    check: LogitsCheck | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def summary(self) -> str:
        first = self.layers[0]
        scales = sorted({round(layer.scale, 6) for layer in self.layers})
        lines = [
            f"converted {self.source} -> {self.destination}",
            f"  {len(self.layers)} attention blocks -> GroupQueryAttention "
            f"(heads {first.num_heads}, kv heads {first.kv_num_heads}, head dim "
            f"{first.head_dim}, scale {', '.join(f'{s:g}' for s in scales)}, "
            f"{self.kv_dtype})",
            f"  nodes {self.nodes_before} -> {self.nodes_after}; external data: "
            f"{'yes' if self.external_data else 'no'}",
        ]
        if self.unused_inputs:
            lines.append(f"  inputs kept but no longer read: {', '.join(self.unused_inputs)}")
        if self.check is not None:
            c = self.check
            lines.append(
                f"  logits check ({c.prefill_tokens}-token prefill + {c.decode_steps} steps): "
                f"max |diff| inplace {c.max_abs_diff_inplace:.3g}, chain "
                f"{c.max_abs_diff_chain:.3g}, without masking biases {c.max_abs_diff_unmasked:.3g} "
                f"(median |logit| {c.typical_abs_logit:.3g}, tolerance {c.tolerance:.3g})"
            )
        else:
            lines.append("  logits check: skipped")
        lines.extend(f"  note: {note}" for note in self.notes)
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Graph index
# ---------------------------------------------------------------------------------------------
def _subgraph_inputs(node: onnx.NodeProto) -> set[str]:
    """Outer-scope names read by a node's subgraphs (If/Loop/Scan bodies)."""
    names: set[str] = set()
    for attribute in node.attribute:
        graphs = list(attribute.graphs)
        if attribute.HasField("g"):
            graphs.append(attribute.g)
        for graph in graphs:
            local = {i.name for i in graph.input} | {t.name for t in graph.initializer}
            for inner in graph.node:
                local.update(inner.output)
            for inner in graph.node:
                names.update(n for n in inner.input if n and n not in local)
                names.update(_subgraph_inputs(inner) - local)
    return names


def _node_inputs(node: onnx.NodeProto) -> list[str]:
    return [name for name in node.input if name] + sorted(_subgraph_inputs(node))


class _GraphIndex:
    """Producers, consumers and constant values of one graph."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self.inputs = {i.name: i for i in graph.input}
        self.outputs = {o.name: o for o in graph.output}
        self.initializers = {t.name: t for t in graph.initializer}
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in node.output:
                if name:
                    self.producer[name] = node
            for name in _node_inputs(node):
                self.consumers.setdefault(name, []).append(node)
        self._shape_derived: dict[str, bool] = {}

    def constant_value(self, name: str) -> np.ndarray | None:
        if name in self.initializers:
            tensor = self.initializers[name]
            if tensor.data_location == TensorProto.EXTERNAL and not tensor.raw_data:
                return None
            return numpy_helper.to_array(tensor)
        node = self.producer.get(name)
        if node is not None and node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value":
                    return numpy_helper.to_array(attribute.t)
                if attribute.name in ("value_float", "value_int"):
                    return np.asarray(helper.get_attribute_value(attribute))
        return None

    def is_shape_derived(self, name: str, depth: int = 0) -> bool:
        """True if the tensor depends on graph inputs only through their shapes (a constant,
        or a computation on Shape/Size outputs): a scale factor, never activations."""
        if name in self._shape_derived:
            return self._shape_derived[name]
        if name in self.initializers:
            result = True
        elif name in self.inputs or depth > _SHAPE_DERIVED_DEPTH:
            result = False
        else:
            node = self.producer.get(name)
            if node is None:
                result = False
            elif node.op_type in _SIDE_CONSUMERS or node.op_type == "Constant":
                result = True
            else:
                result = all(self.is_shape_derived(i, depth + 1) for i in _node_inputs(node))
        self._shape_derived[name] = result
        return result

    def is_scalar_candidate(self, name: str) -> bool:
        """Could be a scalar scale factor (checked to be one on the probe run)."""
        value = self.constant_value(name)
        if value is not None:
            return value.size == 1
        return self.is_shape_derived(name)

    def real_consumers(self, name: str) -> list[onnx.NodeProto]:
        return [n for n in self.consumers.get(name, []) if n.op_type not in _SIDE_CONSUMERS]


# ---------------------------------------------------------------------------------------------
# Pattern matching
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _ScaleFactor:
    tensor: str
    divides: bool  # the path tensor is divided by it


@dataclass
class _AttentionMatch:
    layer: int
    past: dict[str, str]  # kind -> graph input name
    present: dict[str, str]  # kind -> graph output name
    inner: dict[str, str]  # kind -> Concat output (present in the graph's compute dtype)
    new: dict[str, str]  # kind -> new key/value [B, Hkv, S, Dh]
    replaced: list[onnx.NodeProto]  # Concat nodes and Casts to present outputs
    query: str
    factors: list[_ScaleFactor]
    context_node: onnx.NodeProto


def _layer_error(layer: int, what: str) -> ModelError:
    return ModelError(
        f"layer {layer}: {what}; this graph's attention does not match the Concat-KV pattern "
        "that `onnx-tts convert --inplace-kv` rewrites (present = Concat(past, new) -> "
        "MatMul(Q, K^T) -> [scale, mask] -> Softmax -> MatMul(probs, V)); nothing was written"
    )


def _kv_names(index: _GraphIndex) -> tuple[dict[int, dict[str, str]], dict[int, dict[str, str]]]:
    past: dict[int, dict[str, str]] = {}
    present: dict[int, dict[str, str]] = {}
    for name in index.inputs:
        match = _PAST_RE.match(name)
        if match:
            past.setdefault(int(match.group(1)), {})[match.group(2)] = name
    for name in index.outputs:
        match = _PRESENT_RE.match(name)
        if match:
            present.setdefault(int(match.group(1)), {})[match.group(2)] = name
    if not past:
        raise ModelError(
            "the graph has no 'past_key_values.N.key|value' inputs: not a decoder LM with a KV "
            "cache, so there is nothing to convert"
        )
    for layer in sorted(past):
        for kind in ("key", "value"):
            if kind not in past[layer]:
                raise ModelError(f"missing input 'past_key_values.{layer}.{kind}'")
            if kind not in present.get(layer, {}):
                raise ModelError(f"missing output 'present.{layer}.{kind}'")
    return past, present


def _trace_back_through(index: _GraphIndex, name: str, ops: frozenset[str]) -> str:
    while True:
        node = index.producer.get(name)
        if node is None or node.op_type not in ops:
            return name
        name = node.input[0]


def _match_concat(
    index: _GraphIndex, layer: int, kind: str, past: str, present: str
) -> tuple[str, str, list[onnx.NodeProto]]:
    """(Concat output, new tensor, nodes to replace) for one present output."""
    replaced: list[onnx.NodeProto] = []
    name = present
    node = index.producer.get(name)
    while node is not None and node.op_type in ("Cast", "Identity"):
        replaced.append(node)
        name = node.input[0]
        node = index.producer.get(name)
    if node is not None and node.op_type == "GroupQueryAttention":
        raise ModelError(
            f"{present!r} already comes from GroupQueryAttention: the graph keeps its KV cache "
            "in place as it is; use it with --kv inplace, no conversion needed"
        )
    if node is None or node.op_type != "Concat":
        found = "a graph input" if node is None else f"a {node.op_type} node"
        raise _layer_error(layer, f"output {present!r} comes from {found}, not a Concat")
    axis = next((a.i for a in node.attribute if a.name == "axis"), None)
    if len(node.input) != 2 or axis not in (2, -2):
        raise _layer_error(
            layer,
            f"{present!r} is a Concat of {len(node.input)} inputs on axis {axis}, expected "
            "Concat(past, new) on the sequence axis (2)",
        )
    if _trace_back_through(index, node.input[0], frozenset({"Cast", "Identity"})) != past:
        raise _layer_error(layer, f"the Concat producing {present!r} does not start with {past!r}")
    replaced.append(node)
    return name, node.input[1], replaced


def _find_score_matmul(
    index: _GraphIndex, layer: int, key: str
) -> tuple[onnx.NodeProto, list[_ScaleFactor]]:
    """Follow the present key through layout ops and scalar scales to MatMul(Q, K^T)."""
    found: list[tuple[onnx.NodeProto, list[_ScaleFactor]]] = []
    unexpected: list[str] = []
    stack: list[tuple[str, list[_ScaleFactor]]] = [(key, [])]
    seen: set[str] = set()
    while stack:
        tensor, factors = stack.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        for node in index.real_consumers(tensor):
            if node.op_type == "MatMul":
                if node.input[1] == tensor:
                    found.append((node, factors))
                else:
                    unexpected.append(f"MatMul {node.name!r} with the key as its first input")
            elif node.op_type in _KV_LAYOUT_OPS and node.input[0] == tensor:
                stack.append((node.output[0], factors))
            elif node.op_type in _SCALE_OPS:
                other = node.input[1] if node.input[0] == tensor else node.input[0]
                divides = node.op_type == "Div"
                if (divides and node.input[0] != tensor) or not index.is_scalar_candidate(other):
                    unexpected.append(f"{node.op_type} {node.name!r}")
                    continue
                stack.append((node.output[0], [*factors, _ScaleFactor(other, divides)]))
            else:
                unexpected.append(f"{node.op_type} {node.name!r}")
    if len(found) != 1:
        detail = f" (other consumers: {', '.join(unexpected)})" if unexpected else ""
        raise _layer_error(
            layer,
            f"expected one MatMul(Q, K^T) reading present key {key!r}, found {len(found)}{detail}",
        )
    return found[0]


def _trace_query(index: _GraphIndex, layer: int, name: str) -> tuple[str, list[_ScaleFactor]]:
    """Walk back from the score MatMul's first input over scalar scales to the query."""
    factors: list[_ScaleFactor] = []
    while True:
        node = index.producer.get(name)
        if node is None or node.op_type not in _SCALE_OPS:
            return name, factors
        if node.op_type == "Div":
            if not index.is_scalar_candidate(node.input[1]):
                return name, factors
            factors.append(_ScaleFactor(node.input[1], True))
            name = node.input[0]
            continue
        left, right = node.input[0], node.input[1]
        if index.is_scalar_candidate(right) and not index.is_scalar_candidate(left):
            factors.append(_ScaleFactor(right, False))
            name = left
        elif index.is_scalar_candidate(left) and not index.is_scalar_candidate(right):
            factors.append(_ScaleFactor(left, False))
            name = right
        else:
            return name, factors


def _follow_scores(
    index: _GraphIndex, layer: int, scores: str
) -> tuple[onnx.NodeProto, list[_ScaleFactor]]:
    """From QK^T to the Softmax: scalar scales are kept, masks (Add / Where) dropped."""
    factors: list[_ScaleFactor] = []
    tensor = scores
    for _ in range(32):
        consumers = index.real_consumers(tensor)
        if len(consumers) != 1:
            kinds = ", ".join(n.op_type for n in consumers) or "nothing"
            raise _layer_error(
                layer, f"attention scores {tensor!r} feed {kinds}; expected one path to Softmax"
            )
        node = consumers[0]
        if node.op_type == "Softmax":
            return node, factors
        if node.op_type in _SCALE_OPS:
            other = node.input[1] if node.input[0] == tensor else node.input[0]
            if node.op_type == "Div" and node.input[0] != tensor:
                raise _layer_error(layer, f"scores are a divisor in {node.name!r}")
            if not index.is_scalar_candidate(other):
                raise _layer_error(layer, f"scores are scaled by a non-scalar in {node.name!r}")
            factors.append(_ScaleFactor(other, node.op_type == "Div"))
        elif node.op_type == "Add" or node.op_type == "Where":
            pass  # attention mask / causal bias: GroupQueryAttention is causal itself
        elif node.op_type not in ("Cast", "Identity"):
            raise _layer_error(
                layer, f"unsupported {node.op_type} {node.name!r} between QK^T and Softmax"
            )
        tensor = node.output[0]
    raise _layer_error(layer, "no Softmax within 32 nodes of the score MatMul")


def _find_context_matmul(index: _GraphIndex, layer: int, probs: str) -> onnx.NodeProto:
    found: list[onnx.NodeProto] = []
    stack, seen = [probs], set()
    while stack:
        tensor = stack.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        for node in index.consumers.get(tensor, []):
            if node.op_type == "MatMul" and node.input[0] == tensor:
                found.append(node)
            elif node.op_type in _PROBS_PASSTHROUGH and tensor in node.input[:3]:
                stack.append(node.output[0])
    if len(found) != 1:
        raise _layer_error(
            layer,
            f"expected one MatMul(probs, V) after Softmax output {probs!r}, found {len(found)}",
        )
    return found[0]


def _match_layer(
    index: _GraphIndex, layer: int, past: Mapping[str, str], present: Mapping[str, str]
) -> _AttentionMatch:
    inner, new, replaced = {}, {}, []
    for kind in ("key", "value"):
        inner[kind], new[kind], nodes = _match_concat(index, layer, kind, past[kind], present[kind])
        replaced.extend(nodes)
    score_node, key_factors = _find_score_matmul(index, layer, inner["key"])
    query, query_factors = _trace_query(index, layer, score_node.input[0])
    softmax, score_factors = _follow_scores(index, layer, score_node.output[0])
    context_node = _find_context_matmul(index, layer, softmax.output[0])
    value_path = _trace_back_through(index, context_node.input[1], _KV_LAYOUT_OPS)
    if value_path != inner["value"]:
        raise _layer_error(
            layer,
            f"the context MatMul reads {context_node.input[1]!r}, which does not come from "
            f"present value {present['value']!r} through layout ops",
        )
    return _AttentionMatch(
        layer=layer,
        past=dict(past),
        present=dict(present),
        inner=inner,
        new=new,
        replaced=replaced,
        query=query,
        factors=key_factors + query_factors + score_factors,
        context_node=context_node,
    )


def match_attention(model: onnx.ModelProto) -> list[_AttentionMatch]:
    """Every layer's attention block, or a ModelError naming the layer that does not match."""
    index = _GraphIndex(model.graph)
    past, present = _kv_names(index)
    return [_match_layer(index, layer, past[layer], present[layer]) for layer in sorted(past)]


# ---------------------------------------------------------------------------------------------
# Feeds and the probe run
# ---------------------------------------------------------------------------------------------
def _value_dtype(value: onnx.ValueInfoProto) -> np.dtype:
    elem = value.type.tensor_type.elem_type
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem))


def _value_dims(value: onnx.ValueInfoProto) -> list[int | None]:
    return [
        d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim
    ]


def _vocab_size(model: onnx.ModelProto, input_name: str) -> int:
    """Rows of the embedding table gathered by `input_name` (ids must stay inside it)."""
    initializers = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == input_name:
            table = initializers.get(node.input[0])
            if table is not None and table.dims:
                return int(table.dims[0])
    return 2


@dataclass(frozen=True)
class _FeedSpec:
    """How to build numpy feeds for one LM graph."""

    inputs: tuple[onnx.ValueInfoProto, ...]
    vocab: int

    @classmethod
    def of(cls, model: onnx.ModelProto) -> _FeedSpec:
        vocab = (
            _vocab_size(model, "input_ids")
            if any(i.name == "input_ids" for i in model.graph.input)
            else 0
        )
        return cls(tuple(model.graph.input), vocab)

    def token_inputs(self, rng: np.random.Generator, batch: int, new: int) -> dict[str, Any]:
        """The per-step content: inputs_embeds or input_ids."""
        feeds: dict[str, Any] = {}
        for value in self.inputs:
            if value.name == "inputs_embeds":
                dims = _value_dims(value)
                if len(dims) != 3 or dims[2] is None:
                    raise ModelError(
                        "inputs_embeds must be [batch, sequence, hidden] with fixed hidden"
                    )
                feeds[value.name] = rng.standard_normal((batch, new, dims[2])).astype(
                    _value_dtype(value)
                )
            elif value.name == "input_ids":
                feeds[value.name] = rng.integers(0, max(self.vocab, 1), (batch, new)).astype(
                    _value_dtype(value)
                )
        if not feeds:
            raise ModelError("the graph takes neither 'inputs_embeds' nor 'input_ids'")
        return feeds

    def step_inputs(self, batch: int, past: int, new: int) -> dict[str, np.ndarray]:
        """attention_mask / position_ids as the Chatterbox loop feeds them (no padding)."""
        feeds: dict[str, np.ndarray] = {}
        for value in self.inputs:
            if value.name == "attention_mask":
                feeds[value.name] = np.ones((batch, past + new), _value_dtype(value))
            elif value.name == "position_ids":
                positions = np.arange(past, past + new, dtype=_value_dtype(value))
                feeds[value.name] = np.ascontiguousarray(np.broadcast_to(positions, (batch, new)))
        return feeds

    def kv_shape(self, name: str, batch: int, length: int) -> tuple[int, int, int, int]:
        value = next(v for v in self.inputs if v.name == name)
        dims = _value_dims(value)
        if len(dims) != 4 or dims[1] is None or dims[3] is None:
            raise ModelError(
                f"input {name!r} must be [batch, kv_heads, past, head_dim] with fixed kv_heads "
                f"and head_dim, found {dims}"
            )
        return batch, int(dims[1]), length, int(dims[3])

    def kv_dtype(self, name: str) -> np.dtype:
        return _value_dtype(next(v for v in self.inputs if v.name == name))

    def check_known(self, extra: Iterable[str] = ()) -> None:
        known = {"inputs_embeds", "input_ids", "attention_mask", "position_ids", *extra}
        unknown = [
            v.name for v in self.inputs if v.name not in known and not _PAST_RE.match(v.name)
        ]
        if unknown:
            raise ModelError(
                f"cannot build test inputs for graph input(s) {unknown}: the converter knows "
                "inputs_embeds, input_ids, attention_mask, position_ids and past_key_values.*"
            )


def _ort_session(model: onnx.ModelProto, work_dir: Path) -> Any:
    """An onnxruntime InferenceSession on an in-memory model (saved to `work_dir` if huge)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if model.ByteSize() < _PROTOBUF_LIMIT:
        return ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
    path = work_dir / "probe.onnx"
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    onnx.save_model(copy, path, save_as_external_data=True, location="probe.onnx_data")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _reference_attention(
    query: np.ndarray, key: np.ndarray, value: np.ndarray, scale: float
) -> np.ndarray:
    """Causal softmax(scale Q K^T) V in float64; query i sits at position T - S + i."""
    q, k, v = (np.asarray(a, np.float64) for a in (query, key, value))
    heads, kv_heads = q.shape[1], k.shape[1]
    group = heads // kv_heads
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    scores = scale * q @ np.swapaxes(k, -1, -2)
    new, total = q.shape[2], k.shape[2]
    allowed = np.arange(total)[None, :] <= (total - new + np.arange(new))[:, None]
    scores = np.where(allowed, scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    return probs @ v


def _probe(
    model: onnx.ModelProto, matches: Sequence[_AttentionMatch], work_dir: Path
) -> tuple[list[LayerAttention], dict[str, np.dtype]]:
    """Run the source once with the matched tensors as extra outputs: head counts, scale, and
    a numeric check that each block is causal softmax(scale Q K^T) V."""
    graph = model.graph
    wanted: list[str] = []
    for match in matches:
        wanted += [match.query, match.inner["key"], match.inner["value"]]
        wanted += [match.context_node.output[0], *(f.tensor for f in match.factors)]
    existing = {o.name for o in graph.output}
    extra = [name for name in dict.fromkeys(wanted) if name not in existing]
    index = _GraphIndex(graph)
    for name in extra:
        if name in index.initializers or index.constant_value(name) is not None:
            continue
        graph.output.append(helper.make_empty_tensor_value_info(name))
    spec = _FeedSpec.of(model)
    spec.check_known()
    rng = np.random.default_rng(1234)
    batch, past_len, new_len = 1, 3, 4
    feeds: dict[str, Any] = spec.token_inputs(rng, batch, new_len)
    feeds.update(spec.step_inputs(batch, past_len, new_len))
    for value in spec.inputs:
        if _PAST_RE.match(value.name):
            shape = spec.kv_shape(value.name, batch, past_len)
            feeds[value.name] = rng.standard_normal(shape).astype(_value_dtype(value))
    try:
        session = _ort_session(model, work_dir)
        names = [o.name for o in session.get_outputs()]
        values = dict(zip(names, session.run(names, feeds), strict=True))
    except Exception as error:  # onnxruntime raises its own exception types
        raise ModelError(f"the source graph does not run on onnxruntime: {error}") from None
    finally:
        for _ in range(len(graph.output) - len(existing)):
            graph.output.pop()

    def tensor(name: str) -> np.ndarray:
        if name in values:
            return values[name]
        constant = index.constant_value(name)
        if constant is None:
            raise ModelError(f"probe run did not produce {name!r}")
        return constant

    layers: list[LayerAttention] = []
    dtypes: dict[str, np.dtype] = {}
    for match in matches:
        query = tensor(match.query)
        key, value = tensor(match.inner["key"]), tensor(match.inner["value"])
        context = tensor(match.context_node.output[0])
        if query.ndim != 4 or key.ndim != 4 or query.shape[2] != new_len:
            raise _layer_error(
                match.layer,
                f"query {match.query!r} has shape {query.shape} and present key {key.shape}; "
                "expected [batch, heads, new tokens, head_dim] and [batch, kv_heads, total, "
                "head_dim]",
            )
        heads, head_dim, kv_heads = query.shape[1], query.shape[3], key.shape[1]
        if heads % kv_heads or key.shape[3] != head_dim or key.shape[2] != past_len + new_len:
            raise _layer_error(
                match.layer, f"query {query.shape} and present key {key.shape} do not pair up"
            )
        scale = 1.0
        for factor in match.factors:
            factor_value = np.asarray(tensor(factor.tensor), np.float64)
            if factor_value.size != 1:
                raise _layer_error(
                    match.layer,
                    f"scale factor {factor.tensor!r} is not a scalar {factor_value.shape}",
                )
            number = float(factor_value.ravel()[0])
            scale = scale / number if factor.divides else scale * number
        expected = _reference_attention(query, key, value, scale)
        if context.shape != expected.shape:
            raise _layer_error(
                match.layer,
                f"context {match.context_node.output[0]!r} has shape {context.shape}, expected "
                f"{expected.shape} [batch, heads, new tokens, head_dim]",
            )
        diff = float(np.max(np.abs(context.astype(np.float64) - expected)))
        loose = query.dtype == np.float16 or key.dtype == np.float16
        limit = (2e-2 if loose else 1e-4) * max(1.0, float(np.max(np.abs(expected))))
        if not np.isfinite(diff) or diff > limit:
            raise _layer_error(
                match.layer,
                f"the matched block is not causal softmax({scale:g} * Q K^T) V (max |diff| "
                f"{diff:.3g} on a probe run); masks other than causal, softcapping, ALiBi or "
                "sliding windows are not supported",
            )
        layers.append(LayerAttention(match.layer, heads, kv_heads, head_dim, scale, diff))
        dtypes[match.query] = query.dtype
        dtypes[match.inner["key"]] = key.dtype
        dtypes[match.inner["value"]] = value.dtype
        dtypes[match.context_node.output[0]] = context.dtype
    return layers, dtypes


# ---------------------------------------------------------------------------------------------
# The rewrite
# ---------------------------------------------------------------------------------------------
class _NodeMaker:
    """Appends uniquely named nodes and int64 shape initializers for one rewrite."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self.taken = {n.name for n in graph.node} | {t.name for t in graph.initializer}
        for node in graph.node:
            self.taken.update(node.output)
        self.taken.update(i.name for i in graph.input)

    def unique(self, name: str) -> str:
        candidate, counter = name, 1
        while candidate in self.taken:
            counter += 1
            candidate = f"{name}_{counter}"
        self.taken.add(candidate)
        return candidate

    def shape(self, name: str, values: Sequence[int]) -> str:
        tensor_name = self.unique(name)
        self.graph.initializer.append(
            numpy_helper.from_array(np.asarray(values, dtype=np.int64), tensor_name)
        )
        return tensor_name

    def node(
        self,
        op_type: str,
        inputs: Sequence[str],
        name: str,
        outputs: Sequence[str] | None = None,
        domain: str = "",
        **attributes: Any,
    ) -> onnx.NodeProto:
        outputs = list(outputs) if outputs is not None else [self.unique(f"{name}_output_0")]
        return helper.make_node(
            op_type, list(inputs), outputs, name=self.unique(name), domain=domain, **attributes
        )


def _elem_type(dtype: np.dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _ensure_length_inputs(graph: onnx.GraphProto, batch: int | str) -> None:
    existing = {i.name: i for i in graph.input}
    for name, shape in ((SEQLENS_INPUT, [batch]), (TOTAL_LENGTH_INPUT, [])):
        if name in existing:
            if existing[name].type.tensor_type.elem_type != TensorProto.INT32:
                raise ModelError(f"the graph already has an input {name!r} that is not int32")
            continue
        graph.input.append(helper.make_tensor_value_info(name, TensorProto.INT32, shape))


def _attention_nodes(
    make: _NodeMaker,
    match: _AttentionMatch,
    layer: LayerAttention,
    dtypes: Mapping[str, np.dtype],
    kv_dtype: np.dtype,
) -> list[onnx.NodeProto]:
    """GroupQueryAttention for one layer, with the layout changes around it."""
    prefix = f"/onnx_tts/layers.{match.layer}/gqa"
    nodes: list[onnx.NodeProto] = []

    def packed(tensor: str, heads: int, dtype: np.dtype, part: str) -> str:
        # [B, heads, S, Dh] -> [B, S, heads * Dh], the layout GroupQueryAttention reads.
        transpose = make.node(
            "Transpose", [tensor], f"{prefix}/{part}_transpose", perm=[0, 2, 1, 3]
        )
        shape = make.shape(f"{prefix}/{part}_shape", [0, 0, heads * layer.head_dim])
        reshape = make.node("Reshape", [transpose.output[0], shape], f"{prefix}/{part}_reshape")
        nodes.extend([transpose, reshape])
        result = reshape.output[0]
        if dtype != kv_dtype:
            cast = make.node("Cast", [result], f"{prefix}/{part}_cast", to=_elem_type(kv_dtype))
            nodes.append(cast)
            result = cast.output[0]
        return result

    query = packed(match.query, layer.num_heads, dtypes[match.query], "query")
    key = packed(match.new["key"], layer.kv_num_heads, dtypes[match.inner["key"]], "key")
    value = packed(match.new["value"], layer.kv_num_heads, dtypes[match.inner["value"]], "value")
    attention = make.node(
        "GroupQueryAttention",
        [
            query,
            key,
            value,
            match.past["key"],
            match.past["value"],
            SEQLENS_INPUT,
            TOTAL_LENGTH_INPUT,
        ],
        f"{prefix}/GroupQueryAttention",
        outputs=[
            make.unique(f"{prefix}/attention_output"),
            match.present["key"],
            match.present["value"],
        ],
        domain=MS_DOMAIN,
        num_heads=layer.num_heads,
        kv_num_heads=layer.kv_num_heads,
        scale=float(layer.scale),
        do_rotary=0,
    )
    nodes.append(attention)
    result = attention.output[0]
    context_dtype = dtypes[match.context_node.output[0]]
    if context_dtype != kv_dtype:
        cast = make.node("Cast", [result], f"{prefix}/output_cast", to=_elem_type(context_dtype))
        nodes.append(cast)
        result = cast.output[0]
    # Back to [B, H, S, Dh] under the old context tensor's name, for its consumers.
    shape = make.shape(f"{prefix}/output_shape", [0, 0, layer.num_heads, layer.head_dim])
    reshape = make.node("Reshape", [result, shape], f"{prefix}/output_reshape")
    transpose = make.node(
        "Transpose",
        [reshape.output[0]],
        f"{prefix}/output_transpose",
        outputs=[match.context_node.output[0]],
        perm=[0, 2, 1, 3],
    )
    nodes.extend([reshape, transpose])
    return nodes


def _remove_dead_nodes(graph: onnx.GraphProto) -> None:
    live = {o.name for o in graph.output}
    kept: list[onnx.NodeProto] = []
    for node in reversed(graph.node):
        if any(name in live for name in node.output):
            kept.append(node)
            live.update(_node_inputs(node))
    kept.reverse()
    del graph.node[:]
    graph.node.extend(kept)
    used = [t for t in graph.initializer if t.name in live]
    del graph.initializer[:]
    graph.initializer.extend(used)


def _topological_order(graph: onnx.GraphProto) -> None:
    available = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    pending = list(graph.node)
    ordered: list[onnx.NodeProto] = []
    while pending:
        ready = [n for n in pending if all(i in available for i in _node_inputs(n))]
        if not ready:
            node = pending[0]
            missing = [i for i in _node_inputs(node) if i not in available]
            raise ModelError(
                f"after the rewrite, node {node.name!r} ({node.op_type}) still needs {missing}, "
                "which only the removed attention produced; the graph uses the attention "
                "tensors elsewhere and cannot be converted"
            )
        ready_ids = {id(n) for n in ready}
        ordered.extend(ready)
        for node in ready:
            available.update(node.output)
        pending = [n for n in pending if id(n) not in ready_ids]
    del graph.node[:]
    graph.node.extend(ordered)


def _check_cache_tensors_private(
    graph: onnx.GraphProto, matches: Sequence[_AttentionMatch]
) -> None:
    """In place, past/present are one buffer of the cache's capacity: nothing but the
    GroupQueryAttention node may read them (a Shape of past would see the capacity)."""
    cache_tensors = set()
    for match in matches:
        cache_tensors.update(match.past.values())
        cache_tensors.update(match.present.values())
    for node in graph.node:
        if node.op_type == "GroupQueryAttention" and node.domain == MS_DOMAIN:
            continue
        read = sorted(cache_tensors.intersection(_node_inputs(node)))
        if read:
            raise ModelError(
                f"node {node.name!r} ({node.op_type}) reads {read[0]!r} outside attention "
                "(for example its length); with an in-place cache that tensor is the whole "
                "fixed-capacity buffer, so the converted graph would compute the wrong thing"
            )


def _set_kv_shapes(graph: onnx.GraphProto, matches: Sequence[_AttentionMatch]) -> None:
    """Declared KV lengths are symbolic and independent: in place both are the capacity."""
    renames = {}
    for match in matches:
        for name in match.past.values():
            renames[name] = "past_sequence_length"
        for name in match.present.values():
            renames[name] = "present_sequence_length"
    for value in list(graph.input) + list(graph.output):
        if value.name in renames:
            dims = value.type.tensor_type.shape.dim
            if len(dims) == 4:
                dims[2].Clear()
                dims[2].dim_param = renames[value.name]


def rewrite_inplace_kv(
    model: onnx.ModelProto, work_dir: Path | None = None
) -> tuple[list[LayerAttention], tuple[str, ...], str]:
    """Rewrite `model` in place (the proto is modified). Returns the layers, the inputs that no
    node reads any more, and the dtype the attention runs in."""
    matches = match_attention(model)
    with tempfile.TemporaryDirectory(prefix="onnx-tts-probe-") as scratch:
        layers, dtypes = _probe(model, matches, Path(work_dir or scratch))
    graph = model.graph
    inputs = {i.name: i for i in graph.input}
    kv_dtype = _value_dtype(inputs[matches[0].past["key"]])
    if kv_dtype not in (np.float32, np.float16):
        raise ModelError(
            f"KV inputs are {kv_dtype}; GroupQueryAttention runs float32 (CPU) or float16 "
            "caches only"
        )
    for match in matches:
        for kind in ("key", "value"):
            if _value_dtype(inputs[match.past[kind]]) != kv_dtype:
                raise ModelError(
                    f"{match.past[kind]!r} has a different dtype than the other KV inputs"
                )
    batch_dim = inputs[matches[0].past["key"]].type.tensor_type.shape.dim[0]
    _ensure_length_inputs(
        graph,
        batch_dim.dim_value
        if batch_dim.HasField("dim_value")
        else batch_dim.dim_param or "batch_size",
    )

    make = _NodeMaker(graph)
    # Nodes are keyed by their first output: unique in a valid graph, unlike proto wrappers.
    replacements: dict[str, list[onnx.NodeProto]] = {}
    removed: set[str] = set()
    for match, layer in zip(matches, layers, strict=True):
        replacements[match.context_node.output[0]] = _attention_nodes(
            make, match, layer, dtypes, kv_dtype
        )
        removed.update(node.output[0] for node in match.replaced)
    rebuilt: list[onnx.NodeProto] = []
    for node in graph.node:
        key = node.output[0] if node.output else ""
        if key in replacements:
            rebuilt.extend(replacements[key])
        elif key not in removed:
            rebuilt.append(node)
    del graph.node[:]
    graph.node.extend(rebuilt)
    _remove_dead_nodes(graph)
    _topological_order(graph)
    _check_cache_tensors_private(graph, matches)
    _set_kv_shapes(graph, matches)
    del graph.value_info[:]  # shapes inferred for the old graph may not hold any more

    read = set()
    for node in graph.node:
        read.update(_node_inputs(node))
    unused = tuple(i.name for i in graph.input if i.name not in read)
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    model.ir_version = IR_VERSION
    return layers, unused, str(kv_dtype)


# ---------------------------------------------------------------------------------------------
# Logits check
# ---------------------------------------------------------------------------------------------
def compare_logits(
    source: Path,
    converted: Path,
    *,
    prefill_tokens: int = 8,
    decode_steps: int = 20,
    batch_size: int = 1,
    seed: int = 0,
    tolerance: float | None = None,
) -> LogitsCheck:
    """Run both graphs on the same random token sequence and compare the logits.

    The source runs with numpy-fed growing past tensors (what published scripts do); the
    converted graph runs with `KVCache` in 'inplace' (one fixed buffer) and 'chain' mode.
    Raises ModelError when some |diff| exceeds `tolerance` + rtol x |logit| (rtol 1e-4 for
    float32 graphs, 3e-2 with float16 inside; default tolerance: rtol x median |logit|)."""
    from onnx_tts.session import KVCache, Session

    source_model = onnx.load(str(source), load_external_data=False)
    spec = _FeedSpec.of(source_model)
    spec.check_known()
    past_names = [i.name for i in source_model.graph.input if _PAST_RE.match(i.name)]
    present_of = {name: name.replace("past_key_values.", "present.", 1) for name in past_names}
    half = any(
        t.data_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16)
        for t in source_model.graph.initializer
    ) or any(spec.kv_dtype(name) == np.float16 for name in past_names)
    output_name = "logits" if any(o.name == "logits" for o in source_model.graph.output) else None
    if output_name is None:
        output_name = next(
            o.name for o in source_model.graph.output if not _PRESENT_RE.match(o.name)
        )
    del source_model

    rng = np.random.default_rng(seed)
    lengths = [prefill_tokens] + [1] * decode_steps
    tokens = [spec.token_inputs(rng, batch_size, n) for n in lengths]

    source_session = Session(source)
    pasts = {
        name: np.zeros(spec.kv_shape(name, batch_size, 0), spec.kv_dtype(name))
        for name in past_names
    }
    reference: list[np.ndarray] = []
    length = 0
    for step_tokens, new in zip(tokens, lengths, strict=True):
        feeds = {**step_tokens, **spec.step_inputs(batch_size, length, new), **pasts}
        outputs = source_session.run(feeds, [output_name, *present_of.values()])
        reference.append(outputs[output_name].astype(np.float64))
        pasts = {name: outputs[present_of[name]] for name in past_names}
        length += new
    del source_session

    # Tolerance as in np.allclose: atol from the typical logit size (huge masking biases
    # such as -1e4 would make a max-based scale meaningless), rtol for the large entries.
    typical = max(1.0, float(np.median(np.abs(np.concatenate([r.ravel() for r in reference])))))
    rtol = 3e-2 if half else 1e-4
    limit = tolerance if tolerance is not None else rtol * typical

    converted_session = Session(converted)
    diffs: dict[str, float] = {}
    excess = unmasked = 0.0
    for mode in ("inplace", "chain"):
        capacity = sum(lengths) if mode == "inplace" else None
        cache = KVCache(converted_session, mode, batch_size=batch_size, capacity=capacity)
        worst = 0.0
        for step, (step_tokens, new) in enumerate(zip(tokens, lengths, strict=True)):
            feeds = {**step_tokens, **spec.step_inputs(batch_size, cache.length, new)}
            logits = cache.step(feeds, output_names=[output_name])[output_name]
            if not np.all(np.isfinite(logits)):
                worst = excess = math.inf
                break
            diff = np.abs(logits.astype(np.float64) - reference[step])
            worst = max(worst, float(np.max(diff)))
            ordinary = np.abs(reference[step]) <= 100.0 * typical
            if np.any(ordinary):
                unmasked = max(unmasked, float(np.max(diff[ordinary])))
            excess = max(excess, float(np.max(diff - rtol * np.abs(reference[step]))))
        diffs[mode] = worst
    check = LogitsCheck(
        prefill_tokens=prefill_tokens,
        decode_steps=decode_steps,
        max_abs_diff_inplace=diffs["inplace"],
        max_abs_diff_chain=diffs["chain"],
        max_abs_diff_unmasked=unmasked,
        typical_abs_logit=typical,
        tolerance=limit,
    )
    if not excess <= limit:
        raise ModelError(
            f"the converted graph's logits differ from the source's: max |diff| "
            f"{check.max_abs_diff_inplace:.3g} (inplace) / {check.max_abs_diff_chain:.3g} (chain), "
            f"allowed {limit:.3g} + {rtol:g} x |logit|; nothing was written"
        )
    return check


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------
def _has_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer)


def _save(model: onnx.ModelProto, path: Path, external: bool) -> list[Path]:
    """Save `model` as `path` (+ `path.name`_data sidecar when `external`). Returns files."""
    if external:
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=path.name + "_data",
            size_threshold=1024,
        )
        return [path.with_name(path.name + "_data"), path]
    onnx.save_model(model, str(path))
    return [path]


def _resolve_paths(src: Path, dst: Path) -> tuple[Path, Path]:
    src, dst = Path(src), Path(dst)
    if not src.is_file():
        raise InputError(f"source graph not found: {src}")
    if dst.is_dir():
        dst = dst / src.name
    if dst.resolve() == src.resolve():
        raise InputError(
            f"refusing to overwrite the source {src}: write the converted graph to another path"
        )
    if dst.suffix != ".onnx":
        raise InputError(f"the output must be an .onnx file, got {dst}")
    if not dst.parent.is_dir():
        raise InputError(f"output directory does not exist: {dst.parent}")
    return src, dst


def convert_inplace_kv(
    src: Path,
    dst: Path,
    *,
    check: bool = True,
    check_steps: int = 20,
    external_data: bool | None = None,
) -> ConvertReport:
    """Convert the Concat-KV LM `src` into a GroupQueryAttention LM at `dst` (a file, or a
    directory to write `src`'s file name into). Files are written atomically; with `check`
    they are only moved into place once the converted logits match the source's.

    `external_data`: None writes a `.onnx_data` sidecar when the source had one or the graph
    is over 1 GiB."""
    src, dst = _resolve_paths(src, dst)
    try:
        model = onnx.load(str(src), load_external_data=True)
    except Exception as error:  # onnx raises DecodeError, OSError, ...
        raise ModelError(f"cannot read {src} as an ONNX graph: {error}") from None
    nodes_before = len(model.graph.node)
    had_external = _has_external_data(onnx.load(str(src), load_external_data=False))
    notes: list[str] = []

    staging = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    try:
        layers, unused, kv_dtype = rewrite_inplace_kv(model, staging)
        if external_data is None:
            external_data = had_external or model.ByteSize() > _EXTERNAL_DATA_THRESHOLD
        staged = _save(model, staging / dst.name, external_data)
        del model
        try:
            onnx.checker.check_model(str(staging / dst.name))
        except onnx.checker.ValidationError as error:
            raise ModelError(f"the converted graph is not valid ONNX: {error}") from None
        result = None
        if check:
            result = compare_logits(src, staging / dst.name, decode_steps=check_steps)
        if "attention_mask" in unused:
            notes.append(
                "attention_mask is no longer read: GroupQueryAttention attends causally to all "
                "cached tokens (no padding), as the Chatterbox loop runs"
            )
        for path in staged:  # sidecar first, so the graph never points at a missing file
            path.chmod(0o644)
            os.replace(path, dst.parent / path.name)
        stale = dst.with_name(dst.name + "_data")
        if not external_data and stale.exists():
            stale.unlink()
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    converted = onnx.load(str(dst), load_external_data=False)
    return ConvertReport(
        source=src,
        destination=dst,
        layers=tuple(layers),
        kv_dtype=kv_dtype,
        nodes_before=nodes_before,
        nodes_after=len(converted.graph.node),
        unused_inputs=unused,
        external_data=bool(external_data),
        check=result,
        notes=tuple(notes),
    )


_LM_FILE_RE = re.compile(r"^language_model(_[a-z0-9]+)?\.onnx$")


def _external_locations(path: Path) -> set[str]:
    model = onnx.load(str(path), load_external_data=False)
    locations = set()
    for tensor in model.graph.initializer:
        if tensor.data_location == TensorProto.EXTERNAL:
            locations.update(e.value for e in tensor.external_data if e.key == "location")
    return locations


def convert_bundle_inplace_kv(
    src: Path, dst: Path, *, check: bool = True, check_steps: int = 20
) -> list[ConvertReport]:
    """Convert every ``language_model*.onnx`` of a Chatterbox-style model directory and write
    a complete copy of the directory to `dst` (the other files copied as they are).

    `dst` must not exist yet; it appears in one rename once every graph has converted (and
    passed the logits check), so a failure leaves nothing behind."""
    src, dst = Path(src), Path(dst)
    if not src.is_dir():
        raise InputError(f"model directory not found: {src}")
    if dst.exists():
        raise InputError(f"{dst} already exists: give a new directory for the converted model")
    if not dst.parent.is_dir():
        raise InputError(f"output directory does not exist: {dst.parent}")
    graphs = sorted(p for p in src.rglob("*.onnx") if _LM_FILE_RE.match(p.name))
    if not graphs:
        raise ModelError(
            f"{src} has no language_model*.onnx graph; pass the LM graph file itself to convert "
            "another layout"
        )
    lm_sidecars = {g.parent / loc for g in graphs for loc in _external_locations(g)}
    shared = {
        p.parent / loc
        for p in src.rglob("*.onnx")
        if p not in graphs
        for loc in _external_locations(p)
    }
    staging = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    reports: list[ConvertReport] = []
    try:
        for graph in graphs:
            target = staging / graph.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            report = convert_inplace_kv(graph, target, check=check, check_steps=check_steps)
            reports.append(report)
        for path in sorted(src.rglob("*")):
            if path.is_dir() or path in graphs or (path in lm_sidecars and path not in shared):
                continue
            # A plain copy: onnx refuses external data files with several hard links.
            target = staging / path.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        staging.chmod(0o755)
        os.replace(staging, dst)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [
        dataclasses.replace(r, destination=dst / r.destination.relative_to(staging))
        for r in reports
    ]


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------
def add_convert_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--inplace-kv",
        action="store_true",
        required=True,
        help="rewrite Concat-KV attention into GroupQueryAttention (KV cache written in place)",
    )
    parser.add_argument(
        "source",
        type=Path,
        help="LM graph with a Concat KV cache (.onnx), or a Chatterbox model directory",
    )
    parser.add_argument(
        "output",
        type=Path,
        help="converted .onnx file (or a directory to put it in); for a model directory, a "
        "new directory that receives the converted model",
    )
    parser.add_argument(
        "--no-check", action="store_true", help="skip the source-vs-converted logits comparison"
    )
    parser.add_argument(
        "--check-steps", type=int, default=20, help="decode steps compared after the prefill"
    )
    parser.add_argument(
        "--external-data",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="write weights to a .onnx_data sidecar (default: if the source had one)",
    )


def run_convert(args: argparse.Namespace) -> int:
    if args.check_steps < 1:
        raise InputError(f"--check-steps must be at least 1, got {args.check_steps}")
    if Path(args.source).is_dir():
        reports = convert_bundle_inplace_kv(
            args.source, args.output, check=not args.no_check, check_steps=args.check_steps
        )
        for report in reports:
            print(report.summary())
        print(f"wrote {args.output}: the model directory with converted language models")
        return 0
    report = convert_inplace_kv(
        args.source,
        args.output,
        check=not args.no_check,
        check_steps=args.check_steps,
        external_data=args.external_data,
    )
    print(report.summary())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`onnx-tts convert ...` as a standalone entry point (python -m onnx_tts.convert)."""
    from onnx_tts.errors import OnnxTTSError

    parser = argparse.ArgumentParser(
        prog="onnx-tts convert",
        description="Convert a Concat-KV LM graph so its KV cache can be written in place.",
    )
    add_convert_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_convert(args)
    except OnnxTTSError as error:
        print(f"onnx-tts: error: {error}", file=sys.stderr)
        return 2


__all__ = [
    "ConvertReport",
    "LayerAttention",
    "LogitsCheck",
    "add_convert_arguments",
    "compare_logits",
    "convert_bundle_inplace_kv",
    "convert_inplace_kv",
    "main",
    "match_attention",
    "rewrite_inplace_kv",
    "run_convert",
]

if __name__ == "__main__":
    raise SystemExit(main())

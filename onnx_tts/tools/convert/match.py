"""Find, layer by layer, the Concat-KV attention block an in-place rewrite replaces.

For every ``past_key_values.N.*`` / ``present.N.*`` pair (paired by graph_io, the project's
one KV-name parser) this follows the graph from the Concat that grows the cache to the score
MatMul(Q, K^T), the scalar scale factors on the way, the Softmax (masks added or selected on
the way are dropped) and the context MatMul(probs, V). Matching is structural only; whether a
matched block really is causal attention is checked numerically by `verify.probe`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx_tts.errors import ModelError
from onnx_tts.graph_io import kv_pairs, parse_kv_name

# Ops that only move, repeat or cast K/V between the present tensor and the attention MatMuls.
KV_LAYOUT_OPS = frozenset(
    {"Transpose", "Unsqueeze", "Squeeze", "Expand", "Reshape", "Tile", "Cast", "Identity"}
)
_SCALE_OPS = frozenset({"Mul", "Div"})
_PROBS_PASSTHROUGH = frozenset({"Cast", "Where", "Identity", "Dropout"})
_SIDE_CONSUMERS = frozenset({"Shape", "Size"})  # read only the shape; dead after the rewrite
_SHAPE_DERIVED_DEPTH = 64


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


def node_inputs(node: onnx.NodeProto) -> list[str]:
    return [name for name in node.input if name] + sorted(_subgraph_inputs(node))


class GraphIndex:
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
            for name in node_inputs(node):
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
                result = all(self.is_shape_derived(i, depth + 1) for i in node_inputs(node))
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
class ScaleFactor:
    tensor: str
    divides: bool  # the path tensor is divided by it


@dataclass
class AttentionMatch:
    layer: int
    past: dict[str, str]  # kind -> graph input name
    present: dict[str, str]  # kind -> graph output name
    inner: dict[str, str]  # kind -> Concat output (present in the graph's compute dtype)
    new: dict[str, str]  # kind -> new key/value [B, Hkv, S, Dh] (or [B, S, Hkv, Dh])
    replaced: list[onnx.NodeProto]  # Concat nodes and Casts to present outputs
    query: str
    factors: list[ScaleFactor]
    context_node: onnx.NodeProto
    # 2: KV laid out [batch, heads, sequence, head_dim]; 1: [batch, sequence, heads, head_dim]
    # (some published exports). The rewrite writes [batch, heads, capacity, head_dim] either way.
    sequence_axis: int = 2


def layer_error(layer: int, what: str) -> ModelError:
    return ModelError(
        f"layer {layer}: {what}; this graph's attention does not match the Concat-KV pattern "
        "that `onnx-tts convert --inplace-kv` rewrites (present = Concat(past, new) -> "
        "MatMul(Q, K^T) -> [scale, mask] -> Softmax -> MatMul(probs, V)); nothing was written"
    )


def _kv_names(index: GraphIndex) -> tuple[dict[int, dict[str, str]], dict[int, dict[str, str]]]:
    """{layer: {kind: name}} of the past inputs and present outputs, paired by graph_io."""
    past: dict[int, dict[str, str]] = {}
    present: dict[int, dict[str, str]] = {}
    for past_name, present_name in kv_pairs(index.inputs, index.outputs):
        _, layer, kind = parse_kv_name(past_name)  # type: ignore[misc]
        past.setdefault(layer, {})[kind] = past_name
        present.setdefault(layer, {})[kind] = present_name
    return past, present


def trace_back_through(index: GraphIndex, name: str, ops: frozenset[str]) -> str:
    while True:
        node = index.producer.get(name)
        if node is None or node.op_type not in ops:
            return name
        name = node.input[0]


def _match_concat(
    index: GraphIndex, layer: int, kind: str, past: str, present: str
) -> tuple[str, str, list[onnx.NodeProto], int]:
    """(Concat output, new tensor, nodes to replace, sequence axis) for one present output."""
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
        raise layer_error(layer, f"output {present!r} comes from {found}, not a Concat")
    axis = next((a.i for a in node.attribute if a.name == "axis"), None)
    # Axis 2 of [B, H, S, D], or axis 1 of [B, S, H, D].
    sequence_axis = {2: 2, -2: 2, 1: 1, -3: 1}.get(axis)  # type: ignore[arg-type]
    if len(node.input) != 2 or sequence_axis is None:
        raise layer_error(
            layer,
            f"{present!r} is a Concat of {len(node.input)} inputs on axis {axis}, expected "
            "Concat(past, new) on the sequence axis (2 of [B, H, S, D] or 1 of [B, S, H, D])",
        )
    if trace_back_through(index, node.input[0], frozenset({"Cast", "Identity"})) != past:
        raise layer_error(layer, f"the Concat producing {present!r} does not start with {past!r}")
    replaced.append(node)
    return name, node.input[1], replaced, sequence_axis


def _find_score_matmul(
    index: GraphIndex, layer: int, key: str
) -> tuple[onnx.NodeProto, list[ScaleFactor]]:
    """Follow the present key through layout ops and scalar scales to MatMul(Q, K^T)."""
    found: list[tuple[onnx.NodeProto, list[ScaleFactor]]] = []
    unexpected: list[str] = []
    stack: list[tuple[str, list[ScaleFactor]]] = [(key, [])]
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
            elif node.op_type in KV_LAYOUT_OPS and node.input[0] == tensor:
                stack.append((node.output[0], factors))
            elif node.op_type in _SCALE_OPS:
                other = node.input[1] if node.input[0] == tensor else node.input[0]
                divides = node.op_type == "Div"
                if (divides and node.input[0] != tensor) or not index.is_scalar_candidate(other):
                    unexpected.append(f"{node.op_type} {node.name!r}")
                    continue
                stack.append((node.output[0], [*factors, ScaleFactor(other, divides)]))
            else:
                unexpected.append(f"{node.op_type} {node.name!r}")
    if len(found) != 1:
        detail = f" (other consumers: {', '.join(unexpected)})" if unexpected else ""
        raise layer_error(
            layer,
            f"expected one MatMul(Q, K^T) reading present key {key!r}, found {len(found)}{detail}",
        )
    return found[0]


def _grouped_heads(index: GraphIndex, node: onnx.NodeProto) -> bool:
    """A Reshape of the query to 5 dims [B, kv heads, groups, S, D] (grouped-query exports
    attend per kv head); the probe checks numerically that the heads group as
    GroupQueryAttention groups them."""
    shape = index.constant_value(node.input[1]) if len(node.input) > 1 else None
    return shape is not None and np.asarray(shape).size == 5


def _trace_query(index: GraphIndex, layer: int, name: str) -> tuple[str, list[ScaleFactor]]:
    """Walk back from the score MatMul's first input over scalar scales to the query."""
    factors: list[ScaleFactor] = []
    while True:
        node = index.producer.get(name)
        if node is not None and node.op_type == "Reshape" and _grouped_heads(index, node):
            name = node.input[0]  # [B, H, S, D] viewed as [B, kv heads, groups, S, D]
            continue
        if node is None or node.op_type not in _SCALE_OPS:
            return name, factors
        if node.op_type == "Div":
            if not index.is_scalar_candidate(node.input[1]):
                return name, factors
            factors.append(ScaleFactor(node.input[1], True))
            name = node.input[0]
            continue
        left, right = node.input[0], node.input[1]
        if index.is_scalar_candidate(right) and not index.is_scalar_candidate(left):
            factors.append(ScaleFactor(right, False))
            name = left
        elif index.is_scalar_candidate(left) and not index.is_scalar_candidate(right):
            factors.append(ScaleFactor(left, False))
            name = right
        else:
            return name, factors


def _follow_scores(
    index: GraphIndex, layer: int, scores: str
) -> tuple[onnx.NodeProto, list[ScaleFactor]]:
    """From QK^T to the Softmax: scalar scales are kept, masks (Add / Where) dropped."""
    factors: list[ScaleFactor] = []
    tensor = scores
    for _ in range(32):
        consumers = index.real_consumers(tensor)
        if len(consumers) != 1:
            kinds = ", ".join(n.op_type for n in consumers) or "nothing"
            raise layer_error(
                layer, f"attention scores {tensor!r} feed {kinds}; expected one path to Softmax"
            )
        node = consumers[0]
        if node.op_type == "Softmax":
            return node, factors
        if node.op_type in _SCALE_OPS:
            other = node.input[1] if node.input[0] == tensor else node.input[0]
            if node.op_type == "Div" and node.input[0] != tensor:
                raise layer_error(layer, f"scores are a divisor in {node.name!r}")
            if not index.is_scalar_candidate(other):
                raise layer_error(layer, f"scores are scaled by a non-scalar in {node.name!r}")
            factors.append(ScaleFactor(other, node.op_type == "Div"))
        elif node.op_type == "Add" or node.op_type == "Where":
            pass  # attention mask / causal bias: GroupQueryAttention is causal itself
        elif node.op_type not in ("Cast", "Identity"):
            raise layer_error(
                layer, f"unsupported {node.op_type} {node.name!r} between QK^T and Softmax"
            )
        tensor = node.output[0]
    raise layer_error(layer, "no Softmax within 32 nodes of the score MatMul")


def _find_context_matmul(index: GraphIndex, layer: int, probs: str) -> onnx.NodeProto:
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
        raise layer_error(
            layer,
            f"expected one MatMul(probs, V) after Softmax output {probs!r}, found {len(found)}",
        )
    return found[0]


def _match_layer(
    index: GraphIndex, layer: int, past: Mapping[str, str], present: Mapping[str, str]
) -> AttentionMatch:
    inner, new, replaced, axes = {}, {}, [], set()
    for kind in ("key", "value"):
        inner[kind], new[kind], nodes, axis = _match_concat(
            index, layer, kind, past[kind], present[kind]
        )
        replaced.extend(nodes)
        axes.add(axis)
    if len(axes) != 1:
        raise layer_error(layer, "key and value grow along different axes")
    score_node, key_factors = _find_score_matmul(index, layer, inner["key"])
    query, query_factors = _trace_query(index, layer, score_node.input[0])
    softmax, score_factors = _follow_scores(index, layer, score_node.output[0])
    context_node = _find_context_matmul(index, layer, softmax.output[0])
    value_path = trace_back_through(index, context_node.input[1], KV_LAYOUT_OPS)
    if value_path != inner["value"]:
        raise layer_error(
            layer,
            f"the context MatMul reads {context_node.input[1]!r}, which does not come from "
            f"present value {present['value']!r} through layout ops",
        )
    return AttentionMatch(
        layer=layer,
        past=dict(past),
        present=dict(present),
        inner=inner,
        new=new,
        replaced=replaced,
        query=query,
        factors=key_factors + query_factors + score_factors,
        context_node=context_node,
        sequence_axis=axes.pop(),
    )


def match_attention(model: onnx.ModelProto) -> list[AttentionMatch]:
    """Every layer's attention block, or a ModelError naming the layer that does not match."""
    index = GraphIndex(model.graph)
    past, present = _kv_names(index)
    return [_match_layer(index, layer, past[layer], present[layer]) for layer in sorted(past)]

"""Replace each matched attention block with one com.microsoft GroupQueryAttention node.

The node (``do_rotary=0``, the source's scale) reads ``past_key_values.N.*`` and writes
``present.N.*``. Nodes that only fed the old attention (causal masks, repeat-kv shapes) are
removed. Every input of the source is kept (``attention_mask`` may become unused:
GroupQueryAttention is causal and assumes no padding, as the published loops run) and
``seqlens_k`` (int32 [B], total length - 1) and ``total_sequence_length`` (int32 scalar) are
added, which `KVCache` fills in.

Precision: the node runs in the dtype of the graph's KV inputs. Graphs with fp16 weights but
fp32 KV I/O (``keep_io_types`` exports) get Casts on Q/K/V and on the attention output, so the
fp32 cache buffers are still written in place; graphs with fp16 KV run the fp16 kernel (ONNX
Runtime 1.31's CPU GroupQueryAttention accepts float16).
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from onnx_tts.errors import ModelError
from onnx_tts.graph_io import LENGTH_INPUTS
from onnx_tts.tools.convert.match import AttentionMatch, match_attention, node_inputs
from onnx_tts.tools.convert.verify import LayerAttention, probe, value_dtype
from onnx_tts.tools.graph_builder import IR_VERSION, MS_DOMAIN, GraphBuilder, reserved_names

SEQLENS_INPUT, TOTAL_LENGTH_INPUT = LENGTH_INPUTS


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
    b: GraphBuilder,
    match: AttentionMatch,
    layer: LayerAttention,
    dtypes: Mapping[str, np.dtype],
    kv_dtype: np.dtype,
) -> list[onnx.NodeProto]:
    """GroupQueryAttention for one layer, with the layout changes around it (the nodes are
    returned in order; their shape constants stay in `b.initializers`)."""
    prefix = f"/onnx_tts/layers.{match.layer}/gqa"
    first = len(b.nodes)

    def packed(tensor: str, heads: int, dtype: np.dtype, part: str, axis: int = 2) -> str:
        # [B, heads, S, Dh] (or [B, S, heads, Dh] for axis 1) -> [B, S, heads * Dh], the
        # layout GroupQueryAttention reads.
        if axis == 2:
            tensor = b.node(
                "Transpose", [tensor], name=f"{prefix}/{part}_transpose", perm=[0, 2, 1, 3]
            )
        shape = b.const([0, 0, heads * layer.head_dim])
        result = b.node("Reshape", [tensor, shape], name=f"{prefix}/{part}_reshape")
        if dtype != kv_dtype:
            result = b.node("Cast", [result], name=f"{prefix}/{part}_cast", to=_elem_type(kv_dtype))
        return result

    query = packed(match.query, layer.num_heads, dtypes[match.query], "query")
    axis = match.sequence_axis
    key = packed(match.new["key"], layer.kv_num_heads, dtypes[match.inner["key"]], "key", axis)
    value = packed(
        match.new["value"], layer.kv_num_heads, dtypes[match.inner["value"]], "value", axis
    )
    result = b.node(
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
        name=f"{prefix}/GroupQueryAttention",
        output_names=[
            b.unique(f"{prefix}/attention_output"),
            match.present["key"],
            match.present["value"],
        ],
        domain=MS_DOMAIN,
        num_heads=layer.num_heads,
        kv_num_heads=layer.kv_num_heads,
        scale=float(layer.scale),
        do_rotary=0,
    )[0]
    context_dtype = dtypes[match.context_node.output[0]]
    if context_dtype != kv_dtype:
        result = b.node(
            "Cast", [result], name=f"{prefix}/output_cast", to=_elem_type(context_dtype)
        )
    # Back to [B, H, S, Dh] under the old context tensor's name, for its consumers.
    shape = b.const([0, 0, layer.num_heads, layer.head_dim])
    reshaped = b.node("Reshape", [result, shape], name=f"{prefix}/output_reshape")
    b.node(
        "Transpose",
        [reshaped],
        name=f"{prefix}/output_transpose",
        output_names=[match.context_node.output[0]],
        perm=[0, 2, 1, 3],
    )
    return b.nodes[first:]


def _remove_dead_nodes(graph: onnx.GraphProto) -> None:
    live = {o.name for o in graph.output}
    kept: list[onnx.NodeProto] = []
    for node in reversed(graph.node):
        if any(name in live for name in node.output):
            kept.append(node)
            live.update(node_inputs(node))
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
        ready = [n for n in pending if all(i in available for i in node_inputs(n))]
        if not ready:
            node = pending[0]
            missing = [i for i in node_inputs(node) if i not in available]
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


def _check_cache_tensors_private(graph: onnx.GraphProto, matches: Sequence[AttentionMatch]) -> None:
    """In place, past/present are one buffer of the cache's capacity: nothing but the
    GroupQueryAttention node may read them (a Shape of past would see the capacity)."""
    cache_tensors = set()
    for match in matches:
        cache_tensors.update(match.past.values())
        cache_tensors.update(match.present.values())
    for node in graph.node:
        if node.op_type == "GroupQueryAttention" and node.domain == MS_DOMAIN:
            continue
        read = sorted(cache_tensors.intersection(node_inputs(node)))
        if read:
            raise ModelError(
                f"node {node.name!r} ({node.op_type}) reads {read[0]!r} outside attention "
                "(for example its length); with an in-place cache that tensor is the whole "
                "fixed-capacity buffer, so the converted graph would compute the wrong thing"
            )


def _set_kv_shapes(
    graph: onnx.GraphProto, matches: Sequence[AttentionMatch], layers: Sequence[LayerAttention]
) -> None:
    """Declared KV lengths are symbolic and independent: in place both are the capacity. KV
    laid out [B, S, H, D] becomes [B, H, S, D], the layout GroupQueryAttention keeps."""
    renames = {}
    for match, layer in zip(matches, layers, strict=True):
        for name in match.past.values():
            renames[name] = ("past_sequence_length", layer.kv_num_heads)
        for name in match.present.values():
            renames[name] = ("present_sequence_length", layer.kv_num_heads)
    for value in list(graph.input) + list(graph.output):
        if value.name in renames:
            dims = value.type.tensor_type.shape.dim
            if len(dims) == 4:
                length, heads = renames[value.name]
                dims[1].Clear()
                dims[1].dim_value = heads
                dims[2].Clear()
                dims[2].dim_param = length


def rewrite_inplace_kv(
    model: onnx.ModelProto, work_dir: Path | None = None
) -> tuple[list[LayerAttention], tuple[str, ...], str]:
    """Rewrite `model` in place (the proto is modified). Returns the layers, the inputs that no
    node reads any more, and the dtype the attention runs in."""
    matches = match_attention(model)
    with tempfile.TemporaryDirectory(prefix="onnx-tts-probe-") as scratch:
        layers, dtypes = probe(model, matches, Path(work_dir or scratch))
    graph = model.graph
    inputs = {i.name: i for i in graph.input}
    kv_dtype = value_dtype(inputs[matches[0].past["key"]])
    if kv_dtype not in (np.float32, np.float16):
        raise ModelError(
            f"KV inputs are {kv_dtype}; GroupQueryAttention runs float32 (CPU) or float16 "
            "caches only"
        )
    for match in matches:
        for kind in ("key", "value"):
            if value_dtype(inputs[match.past[kind]]) != kv_dtype:
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

    # New nodes and constants never take a name the source graph already uses.
    builder = GraphBuilder(graph.name, reserved=reserved_names(graph))
    # Nodes are keyed by their first output: unique in a valid graph, unlike proto wrappers.
    replacements: dict[str, list[onnx.NodeProto]] = {}
    removed: set[str] = set()
    for match, layer in zip(matches, layers, strict=True):
        replacements[match.context_node.output[0]] = _attention_nodes(
            builder, match, layer, dtypes, kv_dtype
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
    graph.initializer.extend(builder.initializers)
    _remove_dead_nodes(graph)
    _topological_order(graph)
    _check_cache_tensors_private(graph, matches)
    _set_kv_shapes(graph, matches, layers)
    del graph.value_info[:]  # shapes inferred for the old graph may not hold any more

    read = set()
    for node in graph.node:
        read.update(node_inputs(node))
    unused = tuple(i.name for i in graph.input if i.name not in read)
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    model.ir_version = IR_VERSION
    return layers, unused, str(kv_dtype)

"""Quantized graphs whose rows do not depend on each other, so requests can share a batched
step: what `convert --inplace-kv` does to published q8 / q4 variants of an LM.

* q8 files (`quantize_dynamic`): `DynamicQuantizeLinear` picks ONE activation scale and zero
  point for the whole [batch, tokens, hidden] tensor, so a row's int8 values (and its logits)
  change with the rows beside it. Each such node becomes the same formula per row (max/min over
  the last axis, scale = (max(0, max) - min(0, min)) / 255, zero point round(-min / scale)), and
  each MatMulInteger it feeds takes the row's zero point as a correction
  (`acc - zp_row * column sums of (W - W_zero)`, since ONNX Runtime's MatMulInteger takes only
  a scalar zero point for its first input). At batch 1 with one new token (a decode step) the
  per-row and the per-tensor values are the same numbers.
* q4 files (`MatMulNBits`, `accuracy_level` unset: float compute): the CPU kernel takes another
  path for one row than for several, so a row's bits differ alone and in a batch (measured);
  with `accuracy_level` 4 (int8 compute) and blocks of 32 they do not. The attribute is set;
  activations are then quantized per row and block of 32 (a numeric change, measured by the
  converter against the source).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx_tts.tools.graph_builder import MS_DOMAIN, builder_into, reduce_op
from onnx_tts.tools.quantize.weights import BATCH_INVARIANT_BLOCK, INT8_COMPUTE


@dataclass
class RowChanges:
    """What `independent_rows` changed (and what it had to leave)."""

    per_row_activations: int = 0  # DynamicQuantizeLinear nodes made per row
    int8_compute: int = 0  # MatMulNBits nodes given accuracy_level 4
    left: list[str] = field(default_factory=list)  # why some rows stay dependent

    @property
    def changed(self) -> bool:
        return bool(self.per_row_activations or self.int8_compute)

    def describe(self) -> str:
        parts = []
        if self.per_row_activations:
            parts.append(
                f"{self.per_row_activations} dynamic activation quantizations made per row"
            )
        if self.int8_compute:
            parts.append(f"{self.int8_compute} MatMulNBits given int8 compute (accuracy_level 4)")
        return "; ".join(parts + self.left)


def _attribute(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((a.i for a in node.attribute if a.name == name), default)


def _nbits_int8_compute(model: onnx.ModelProto, changes: RowChanges) -> None:
    for node in model.graph.node:
        if node.op_type != "MatMulNBits" or node.domain != MS_DOMAIN:
            continue
        if _attribute(node, "accuracy_level", 0) == INT8_COMPUTE:
            continue
        block = _attribute(node, "block_size", 0)
        if block != BATCH_INVARIANT_BLOCK:
            changes.left.append(
                f"{node.name}: MatMulNBits with blocks of {block} (rows batch-invariant only "
                f"with {BATCH_INVARIANT_BLOCK})"
            )
            continue
        kept = [a for a in node.attribute if a.name != "accuracy_level"]
        del node.attribute[:]
        node.attribute.extend([*kept, helper.make_attribute("accuracy_level", INT8_COMPUTE)])
        changes.int8_compute += 1


def _consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    found: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            found.setdefault(name, []).append(node)
    return found


def _column_sums(weights: np.ndarray, zero: np.ndarray) -> np.ndarray:
    """Per output column: sum over the input rows of (W - W_zero), int32."""
    centred = weights.astype(np.int64) - zero.astype(np.int64).reshape(1, -1)
    return centred.sum(axis=0).astype(np.int32)


def _per_row_dql(model: onnx.ModelProto, changes: RowChanges) -> None:
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    consumers = _consumers(graph)
    b = builder_into(model)
    rebuilt: list[onnx.NodeProto] = []
    corrections: dict[str, list[onnx.NodeProto]] = {}  # MatMulInteger output -> after it

    for node in graph.node:
        if node.op_type != "DynamicQuantizeLinear" or node.domain not in ("", "ai.onnx"):
            rebuilt.append(node)
            continue
        quantized, scale, zero = node.output
        users = consumers.get(quantized, [])
        plain = all(
            u.op_type == "MatMulInteger"
            and u.input[0] == quantized
            and len(u.input) > 2
            and u.input[2] == zero
            and u.input[1] in inits
            and (len(u.input) < 4 or not u.input[3] or u.input[3] in inits)
            for u in users
        ) and all(u.op_type == "MatMulInteger" for u in consumers.get(zero, []))
        if not users or not plain:
            changes.left.append(f"{node.name}: DynamicQuantizeLinear feeds other nodes; left")
            rebuilt.append(node)
            continue
        x, p = node.input[0], b.unique(f"{node.name}/per_row")

        def op(kind: str, inputs: list[str], out: str | None = None, p=p, **attrs) -> str:
            if out is None:
                return b.node(kind, inputs, name=f"{p}/{kind}", **attrs)
            b.node(kind, inputs, name=f"{p}/{kind}", output_names=[out], **attrs)
            return out

        zero_f = b.const(0.0, np.float32)
        high = reduce_op(b, "ReduceMax", x, [-1], True, name=f"{p}/ReduceMax")
        low = reduce_op(b, "ReduceMin", x, [-1], True, name=f"{p}/ReduceMin")
        span = op("Sub", [op("Max", [high, zero_f]), op("Min", [low, zero_f])])
        row_scale = op("Div", [span, b.const(255.0, np.float32)])
        # An all-zero row would divide by zero: any scale quantizes it to the zero point.
        row_scale = op("Max", [row_scale, b.const(1e-30, np.float32)], scale)
        bounds = [zero_f, b.const(255.0, np.float32)]
        zero_point = op(
            "Clip",
            [op("Round", [op("Div", [op("Neg", [op("Min", [low, zero_f])]), row_scale])]), *bounds],
        )
        values = op(
            "Clip", [op("Add", [op("Round", [op("Div", [x, row_scale])]), zero_point]), *bounds]
        )
        op("Cast", [values], quantized, to=TensorProto.UINT8)
        zero_i32 = op("Cast", [zero_point], to=TensorProto.INT32)
        rebuilt.extend(b.take_nodes())
        for user in users:
            weights = numpy_helper.to_array(inits[user.input[1]])
            w_zero = (
                numpy_helper.to_array(inits[user.input[3]])
                if len(user.input) > 3 and user.input[3]
                else np.zeros((), weights.dtype)
            )
            sums = b.initializer(
                f"{p}/column_sums",
                _column_sums(weights, np.broadcast_to(w_zero, weights.shape[1:])),
            )
            user.input[2] = ""  # the row's zero point comes back through the correction
            accumulated = b.unique(f"{user.output[0]}/uncorrected")
            correction = op("Mul", [zero_i32, sums])
            op("Sub", [accumulated, correction], user.output[0])
            corrections[accumulated] = b.take_nodes()
            user.output[0] = accumulated
        changes.per_row_activations += 1
    ordered: list[onnx.NodeProto] = []
    for node in rebuilt:
        ordered.append(node)
        ordered.extend(corrections.get(node.output[0], []) if node.output else [])
    del graph.node[:]
    graph.node.extend(ordered)
    graph.initializer.extend(b.initializers)


def independent_rows(model: onnx.ModelProto) -> RowChanges:
    """Rewrite `model` (in place) so each row of a batch computes as if alone; returns what
    changed. Graphs without dynamic activation quantization or float-compute MatMulNBits are
    left as they are."""
    changes = RowChanges()
    _nbits_int8_compute(model, changes)
    _per_row_dql(model, changes)
    return changes


__all__ = ["RowChanges", "independent_rows"]

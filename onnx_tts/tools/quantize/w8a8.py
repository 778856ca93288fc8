"""`--weights w8a8`: int8 weights and int8 activations through ONNX Runtime's integer GEMM
(`MatMulInteger`), with every row quantized on its own, so a row computes the same bits alone
or in a batch of any size.

Why: on CPUs without VNNI, 8-bit `MatMulNBits` (int8 compute) is compute-bound at about 25 G
multiply-adds/s per thread from 8 rows up, and batching does not raise that rate; the integer
GEMM behind `MatMulInteger` reaches about 2x that at 8 rows and 2-3x for a prompt's rows (and
1.3x at one row), measured on these machines (docs/BENCHMARKS.md). `quantize_dynamic`'s form of
it picks one activation scale for the whole tensor, which mixes the rows (rows.py).

Each constant-weight MatMul `x @ W` (W [K, N]) becomes:
* W: symmetric, one scale per output column (max |W[:, n]| / 127), stored as uint8 with zero
  point 128 (uint8 x uint8 is the kernel form whose pair sums do not saturate on AVX2);
* x: symmetric per row, scale max |x_row| / 127 (ReduceMax over the last axis), rounded, + 128,
  uint8 with zero point 128; one such quantization per activation, shared by the MatMuls that
  read it (a layer's q/k/v, its gate/up);
* the int32 product (exact: |(qx - 128)(qw - 128)| <= 127^2 per term), cast to float, times
  the row's scale and the column's scale.

The rewrite marks its nodes (`NODE_PREFIX`) and each product's node carries the weights it
replaced (`doc_string`), so a w8a8 graph can be read back to float (`dequantize_w8a8`) and
quantized another way.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx_tts.graph_io import W8A8_PREFIX as NODE_PREFIX
from onnx_tts.tools.graph_builder import (
    GraphBuilder,
    add_initializer,
    builder_into,
    reduce_op,
)

ZERO_POINT = 128
LEVELS = 127.0
# A row of zeros has no scale: any positive one quantizes it to the zero point.
TINY = 1e-30


def quantize_weight(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """W [K, N] float -> (uint8 [K, N] around 128, float32 scale per column [N])."""
    weight = np.asarray(weight, np.float32)
    scale = np.abs(weight).max(axis=0) / LEVELS
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
    levels = np.clip(np.rint(weight / scale), -LEVELS, LEVELS)
    return (levels + ZERO_POINT).astype(np.uint8), scale


def _rows(b: GraphBuilder, x: str) -> tuple[str, str]:
    """Nodes quantizing activation `x` per row: (uint8 values, float row scales)."""
    hint = f"{NODE_PREFIX}rows/{x}"
    peak = reduce_op(b, "ReduceMax", b.node("Abs", [x], name=hint), [-1], True, name=hint)
    floor = b.node("Max", [peak, b.const(TINY, np.float32)], name=hint)
    scale = b.node("Div", [floor, b.const(LEVELS, np.float32)], name=hint)
    rounded = b.node("Round", [b.node("Div", [x, scale], name=hint)], name=hint)
    shifted = b.node("Add", [rounded, b.const(ZERO_POINT, np.float32)], name=hint)
    bounds = [b.const(0.0, np.float32), b.const(255.0, np.float32)]
    clipped = b.node("Clip", [shifted, *bounds], name=hint)
    return b.node("Cast", [clipped], name=hint, to=TensorProto.UINT8), scale


def rewrite_w8a8(
    model: onnx.ModelProto, targets: set[str], weights: dict[str, onnx.TensorProto]
) -> int:
    """The MatMuls named in `targets` (input 1 a float [K, N] initializer in `weights`) as
    w8a8 (module docstring), in place; returns how many. A float weight no other node reads
    is emptied as soon as it is quantized (the caller drops the initializers no node reads)."""
    graph = model.graph
    b = builder_into(model)
    zero = b.const(ZERO_POINT, np.uint8)
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    rebuilt: list[onnx.NodeProto] = []
    shared: dict[str, tuple[str, str]] = {}
    count = 0
    for node in graph.node:
        if node.name not in targets:
            rebuilt.append(node)
            continue
        x, weight_name = node.input[0], node.input[1]
        if x not in shared:
            shared[x] = _rows(b, x)
        values, row_scale = shared[x]
        float_weight = weights[weight_name]
        quantized, column_scale = quantize_weight(numpy_helper.to_array(float_weight))
        if readers[weight_name] == 1:  # its float bytes go now, not when the graph is done
            float_weight.ClearField("raw_data")
        hint = f"{NODE_PREFIX}{node.name}"
        q_name = b.initializer(f"{hint}/weight", quantized)
        s_name = b.initializer(f"{hint}/column_scale", column_scale)
        product = b.node("MatMulInteger", [values, q_name, zero, zero], name=hint)
        b.nodes[-1].doc_string = json.dumps(
            {"input": x, "weight": q_name, "scale": s_name, "output": node.output[0]}
        )
        real = b.node("Cast", [product], name=hint, to=TensorProto.FLOAT)
        by_row = b.node("Mul", [real, row_scale], name=hint)
        b.node("Mul", [by_row, s_name], name=hint, output_names=[node.output[0]])
        rebuilt.extend(b.take_nodes())  # in graph order: right where the MatMul was
        count += 1
    del graph.node[:]
    graph.node.extend(rebuilt)
    graph.initializer.extend(b.initializers)
    return count


def is_w8a8(node: onnx.NodeProto) -> bool:
    return node.op_type == "MatMulInteger" and node.name.startswith(NODE_PREFIX)


def dequantize_w8a8(model: onnx.ModelProto) -> int:
    """Every w8a8 product back to a float32 MatMul with the weight it computes with; the
    rewrite's other nodes go (their initializers stay: the caller drops what no node reads).
    Returns how many. In place; the model's weights must be loaded."""
    inits = {t.name: t for t in model.graph.initializer}
    products = [n for n in model.graph.node if is_w8a8(n)]
    if not products:
        return 0
    replacements: dict[str, onnx.NodeProto] = {}
    for node in products:
        marks = json.loads(node.doc_string)
        levels = numpy_helper.to_array(inits[marks["weight"]]).astype(np.float32) - ZERO_POINT
        scale = numpy_helper.to_array(inits[marks["scale"]]).astype(np.float32)
        weight = add_initializer(model.graph, levels * scale, f"{marks['weight']}/dequantized")
        replacements[marks["output"]] = helper.make_node(
            "MatMul", [marks["input"], weight.name], [marks["output"]], name=marks["output"]
        )
    rebuilt = []
    for node in model.graph.node:
        if not node.name.startswith(NODE_PREFIX):
            rebuilt.append(node)
        elif node.output and node.output[0] in replacements:  # a product's last Mul
            rebuilt.append(replacements[node.output[0]])
    del model.graph.node[:]
    model.graph.node.extend(rebuilt)
    return len(products)


__all__ = ["NODE_PREFIX", "dequantize_w8a8", "is_w8a8", "quantize_weight", "rewrite_w8a8"]

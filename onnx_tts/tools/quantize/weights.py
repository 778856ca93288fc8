"""Weight quantization of one graph: every MatMul with a constant 2-D weight becomes ONNX
Runtime's `com.microsoft.MatMulNBits` (8- or 4-bit blocks, symmetric, one float scale per
block) or, with `w8a8`, an integer product with activations quantized per row (w8a8.py); and
the way back (`dequantize_products`) for graphs that arrive quantized.

Why MatMulNBits for int8 (the default), not `quantize_dynamic`'s MatMulInteger: measured on
these CPUs (benchmarks/bench_quant.py, Turbo-shape MatMul stack, 1 thread) dynamic per-channel
int8 is the fastest kernel (0.30x fp32 at 1 row against 0.39x for 8-bit MatMulNBits at block
32), but `DynamicQuantizeLinear` picks one activation scale for the whole tensor, so a request
decodes differently beside others, and the engine must then run every request on its own cache
(no batching: 8 requests cost 8 weight reads per step instead of one). With `accuracy_level` 4
(int8 compute) MatMulNBits quantizes activations per row and block; at block 32 a row's result
is bit-identical alone or in a batch of any size (blocks of 64 and 128 are not, measured: see
`BATCH_INVARIANT_BLOCK`). `w8a8` keeps MatMulInteger's speed and makes the rows independent
by quantizing each row in the graph; its one scale per row is coarser than MatMulNBits' per
block of 32, which is why it is asked for, not the default.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx_tts.errors import InputError, ModelError
from onnx_tts.tools.graph_builder import MS_DOMAIN, add_initializer
from onnx_tts.tools.quantize.w8a8 import dequantize_w8a8, is_w8a8, rewrite_w8a8

WEIGHT_KINDS = {"int8": 8, "int4": 4, "w8a8": 8}
W8A8 = "w8a8"  # int8 weights and activations per row through MatMulInteger (w8a8.py)
BLOCK_SIZES = (32, 64, 128)
# The only block size whose MatMulNBits rows are batch-invariant on ONNX Runtime's CPU kernels
# (int8 compute): 64 and 128 give a row other bits beside other rows (bench_quant measures it).
BATCH_INVARIANT_BLOCK = 32
INT8_COMPUTE = 4  # MatMulNBits accuracy_level: int8 activations per row and block
# MatMuls whose weight is smaller than this stay float: nothing to gain, only rounding.
MIN_WEIGHT_ELEMENTS = 4096


@dataclass(frozen=True)
class WeightsSpec:
    """How weights are quantized: `kind` int8 or int4, blocks of `block_size` input rows."""

    kind: str
    block_size: int = BATCH_INVARIANT_BLOCK

    def __post_init__(self) -> None:
        if self.kind not in WEIGHT_KINDS:
            raise InputError(
                f"unknown weights kind {self.kind!r}; choose {', '.join(WEIGHT_KINDS)}"
            )
        if self.kind == W8A8 and self.block_size != BATCH_INVARIANT_BLOCK:
            raise InputError(
                "--block-size is for int8 and int4 (MatMulNBits blocks); w8a8 scales each "
                "weight column and each activation row: drop --block-size"
            )
        if self.block_size not in BLOCK_SIZES:
            raise InputError(
                f"--block-size must be one of {', '.join(map(str, BLOCK_SIZES))}, got "
                f"{self.block_size}"
            )

    @property
    def bits(self) -> int:
        return WEIGHT_KINDS[self.kind]

    @property
    def batch_invariant(self) -> bool:
        return self.kind == W8A8 or self.block_size == BATCH_INVARIANT_BLOCK

    def describe(self) -> dict[str, object]:
        if self.kind == W8A8:
            return {
                "kind": self.kind,
                "op": "MatMulInteger",
                "bits": 8,
                "weights": "symmetric, one scale per output column",
                "activations": "symmetric, one scale per row",
                "batch_invariant": True,
            }
        return {
            "kind": self.kind,
            "op": "com.microsoft.MatMulNBits",
            "bits": self.bits,
            "block_size": self.block_size,
            "symmetric": True,
            "accuracy_level": INT8_COMPUTE,
            "batch_invariant": self.batch_invariant,
        }


@dataclass(frozen=True)
class QuantizedGraph:
    model: onnx.ModelProto
    quantized: int  # MatMuls now MatMulNBits
    float_matmuls: int  # constant-weight MatMuls left float (too small)


@contextlib.contextmanager
def quiet_quantizer() -> Iterator[None]:
    """ORT's quantizers log every node at INFO and nag at WARNING; keep the CLI readable."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(previous)


def _initializers(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in model.graph.initializer}


def gemm_as_matmul(model: onnx.ModelProto) -> int:
    """Gemm nodes with a constant weight (alpha 1, no transposed A) as MatMul (+ Add of the
    bias), which the quantizer handles; returns how many were rewritten. In place."""
    inits = _initializers(model)
    rebuilt: list[onnx.NodeProto] = []
    count = 0
    for node in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        weight = inits.get(node.input[1]) if node.op_type == "Gemm" else None
        plain = (
            weight is not None
            and node.domain in ("", "ai.onnx")
            and attrs.get("alpha", 1.0) == 1.0
            and attrs.get("beta", 1.0) == 1.0
            and not attrs.get("transA", 0)
            and len(weight.dims) == 2
            and weight.data_type == TensorProto.FLOAT
        )
        if not plain:
            rebuilt.append(node)
            continue
        if attrs.get("transB", 0):
            transposed = add_initializer(
                model.graph,
                numpy_helper.to_array(weight).T,
                f"{weight.name}/transposed_for_matmul",
            )
            inits[transposed.name] = transposed
            weight_name = transposed.name
        else:
            weight_name = weight.name
        bias = node.input[2] if len(node.input) > 2 else ""
        rebuilt.extend(_matmul_and_bias(node, weight_name, bias))
        count += 1
    if count:
        _set_nodes(model, rebuilt)
    return count


def read_weights_directly(model: onnx.ModelProto) -> int:
    """Nodes that read a weight through `Identity(initializer)` read the initializer itself;
    returns how many inputs changed. In place. (torch's exporter shares a weight used in an
    unrolled loop that way: a local frame graph that runs its layer 17 times, where only the
    first MatMul would see a constant weight.)"""
    inits = {t.name for t in model.graph.initializer}
    aliases = {
        n.output[0]: n.input[0]
        for n in model.graph.node
        if n.op_type == "Identity" and n.input[0] in inits
    }
    outputs = {o.name for o in model.graph.output}
    changed = 0
    for node in model.graph.node:
        for index, name in enumerate(node.input):
            if name in aliases:
                node.input[index] = aliases[name]
                changed += 1
    if changed:
        kept = [
            n
            for n in model.graph.node
            if not (
                n.op_type == "Identity" and n.output[0] in aliases and n.output[0] not in outputs
            )
        ]
        del model.graph.node[:]
        model.graph.node.extend(kept)
    return changed


def _matmul_and_bias(node: onnx.NodeProto, weight: str, bias: str) -> list[onnx.NodeProto]:
    """`node`'s first input times `weight` (+ `bias`), under `node`'s output name."""
    product = f"{node.output[0]}/matmul" if bias else node.output[0]
    nodes = [helper.make_node("MatMul", [node.input[0], weight], [product], name=node.name)]
    if bias:
        nodes.append(
            helper.make_node("Add", [product, bias], [node.output[0]], name=f"{node.name}/bias")
        )
    return nodes


def _set_nodes(model: onnx.ModelProto, nodes: list[onnx.NodeProto]) -> None:
    """The graph's nodes become `nodes`; initializers no node reads any more are dropped."""
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    _drop_unused_initializers(model)


def _drop_unused_initializers(model: onnx.ModelProto) -> None:
    """In place, one by one: rebuilding the list would copy every weight kept (a transient
    second copy of a large model)."""
    used = {name for node in model.graph.node for name in node.input}
    used.update(o.name for o in model.graph.output)
    initializers = model.graph.initializer
    for index in range(len(initializers) - 1, -1, -1):
        if initializers[index].name not in used:
            del initializers[index]


def constant_matmuls(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """MatMul nodes whose second input is a 2-D float initializer (what can be quantized)."""
    inits = _initializers(model)
    found = []
    for node in model.graph.node:
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx"):
            continue
        weight = inits.get(node.input[1])
        floating = weight is not None and weight.data_type in (
            TensorProto.FLOAT,
            TensorProto.FLOAT16,
        )
        if floating and len(weight.dims) == 2:
            found.append(node)
    return found


def _weight_elements(model: onnx.ModelProto, node: onnx.NodeProto) -> int:
    dims = _initializers(model)[node.input[1]].dims
    return int(dims[0]) * int(dims[1])


def quantize_weights(
    model: onnx.ModelProto, spec: WeightsSpec, *, consume: bool = False
) -> QuantizedGraph:
    """`model` (weights loaded) with its constant-weight MatMuls quantized as `spec` says.
    Quantized products already in the graph are turned back into float MatMuls first, so a
    graph quantized one way can be re-quantized another (the rounding of both adds up).
    `consume=True` rewrites `model` itself (the caller no longer reads it): no copy of its
    weights, which for a 1.7B backbone is 7 GB less at the peak."""
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    # The quantizer edits its input: a copy (not a serialized round trip, which a graph with
    # more than 2 GB of weights cannot make).
    work = model if consume else copy.deepcopy(model)
    dequantize_products(work)
    read_weights_directly(work)
    gemm_as_matmul(work)
    candidates = constant_matmuls(work)
    unnamed = [n for n in work.graph.node if not n.name]
    for index, node in enumerate(unnamed):  # the quantizer selects nodes by name
        node.name = f"onnx_tts/unnamed_{node.op_type}_{index}"
    small = [n.name for n in candidates if _weight_elements(work, n) < MIN_WEIGHT_ELEMENTS]
    if len(small) == len(candidates):
        return QuantizedGraph(work, 0, len(candidates))
    if spec.kind == W8A8:
        inits = _initializers(work)
        targets = {
            n.name
            for n in candidates
            if n.name not in small and inits[n.input[1]].data_type == TensorProto.FLOAT
        }
        count = rewrite_w8a8(work, targets, inits)
        _drop_unused_initializers(work)
        return QuantizedGraph(work, count, len(candidates) - count)
    settings = {
        "block_size": spec.block_size,
        "is_symmetric": True,
        "accuracy_level": INT8_COMPUTE,
        "bits": spec.bits,
    }
    quantizer = MatMulNBitsQuantizer(
        work,
        **settings,
        nodes_to_exclude=small,
        algo_config=DefaultWeightOnlyQuantConfig(**settings),
    )
    with quiet_quantizer():
        quantizer.process()
    quantized = quantizer.model.model
    count = sum(1 for n in quantized.graph.node if n.op_type == "MatMulNBits")
    if not any(o.domain == MS_DOMAIN for o in quantized.opset_import):
        quantized.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    quantized.ir_version = model.ir_version
    return QuantizedGraph(quantized, count, len(candidates) - count)


# -- back to float -----------------------------------------------------------------------------
def has_quantized_products(model: onnx.ModelProto) -> bool:
    return any(
        is_w8a8(n) or (n.op_type == "MatMulNBits" and n.domain == MS_DOMAIN)
        for n in model.graph.node
    )


def dequantize_products(model: onnx.ModelProto) -> int:
    """Every quantized product (MatMulNBits, w8a8) as a float32 MatMul; returns how many."""
    products = dequantize_w8a8(model)
    if products:
        _drop_unused_initializers(model)
    return dequantize_matmul_nbits(model) + products


def _unpack(blob: np.ndarray, bits: int) -> np.ndarray:
    """[N, blocks, bytes] uint8 -> [N, blocks, values] (low nibble first for 4 bits)."""
    if bits == 8:
        return blob.astype(np.int32)
    if bits == 4:
        low, high = blob & 0x0F, blob >> 4
        return np.stack([low, high], axis=-1).reshape(*blob.shape[:2], -1).astype(np.int32)
    raise ModelError(f"MatMulNBits with {bits} bits cannot be read back (4 and 8 can)")


def _zero_points(
    node_inputs: list[str], values: dict, n: int, blocks: int, bits: int
) -> np.ndarray:
    name = node_inputs[3] if len(node_inputs) > 3 else ""
    if not name:
        return np.full((n, blocks), 1 << (bits - 1), np.float32)
    zp = values[name]
    if zp.dtype != np.uint8:  # float zero points, one per block
        return zp.astype(np.float32).reshape(n, blocks)
    if bits == 8:
        return zp.astype(np.float32).reshape(n, blocks)
    per_row = (blocks + 1) // 2
    packed = zp.reshape(n, per_row)
    unpacked = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(n, -1)[:, :blocks]
    return unpacked.astype(np.float32)


def dequantize_matmul_nbits(model: onnx.ModelProto) -> int:
    """Every MatMulNBits node as a float32 MatMul with the weight it computes with (+ Add of its
    bias); returns how many. In place; the model's weights must be loaded."""
    inits = _initializers(model)
    rebuilt: list[onnx.NodeProto] = []
    count = 0
    for node in model.graph.node:
        if node.op_type != "MatMulNBits" or node.domain != MS_DOMAIN:
            rebuilt.append(node)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        inputs = list(node.input)
        if len(inputs) > 4 and inputs[4]:
            raise ModelError(f"{node.name}: MatMulNBits with g_idx cannot be read back")
        missing = [name for name in inputs[1:4] if name and name not in inits]
        if missing:
            raise ModelError(f"{node.name}: MatMulNBits input {missing[0]!r} is not a constant")
        values = {name: numpy_helper.to_array(inits[name]) for name in inputs[1:4] if name}
        k, n, bits = int(attrs["K"]), int(attrs["N"]), int(attrs["bits"])
        blob = values[inputs[1]]
        blocks = blob.shape[1]
        q = _unpack(blob.reshape(n, blocks, -1), bits)
        scales = values[inputs[2]].astype(np.float32).reshape(n, blocks)
        zero = _zero_points(inputs, values, n, blocks, bits)
        weight = ((q - zero[..., None]) * scales[..., None]).reshape(n, -1)[:, :k]
        name = f"{inputs[1]}/dequantized"
        add_initializer(model.graph, weight.T.astype(np.float32), name)
        rebuilt.extend(_matmul_and_bias(node, name, inputs[5] if len(inputs) > 5 else ""))
        count += 1
    if count:
        _set_nodes(model, rebuilt)
    return count


__all__ = [
    "BATCH_INVARIANT_BLOCK",
    "BLOCK_SIZES",
    "W8A8",
    "WEIGHT_KINDS",
    "QuantizedGraph",
    "WeightsSpec",
    "constant_matmuls",
    "dequantize_matmul_nbits",
    "dequantize_products",
    "gemm_as_matmul",
    "quantize_weights",
    "read_weights_directly",
]

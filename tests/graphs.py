"""Tiny LM-with-past graphs written with onnx.helper, for tests of the session core.

Both take `inputs_embeds` [B, S, D] and return `logits` [B, S, D] plus KV:
- `concat_lm`: third-party style, present = Concat(past, new) along the sequence axis.
- `gqa_lm`: com.microsoft GroupQueryAttention, which accepts a growing cache as well as one
  fixed-capacity buffer bound as both past and present.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _weight(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
    scale = 1.0 / np.sqrt(shape[0])
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _save(graph: onnx.GraphProto, path: Path, opsets: list[tuple[str, int]]) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    model.ir_version = 10  # onnx 1.23 writes IR 14; ORT 1.31 reads at most 13
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def concat_lm(
    path: Path, layers: int = 2, heads: int = 2, head_dim: int = 8, seed: int = 0
) -> Path:
    rng = np.random.default_rng(seed)
    hidden = heads * head_dim
    nodes, inits = [], []
    inputs = [helper.make_tensor_value_info("inputs_embeds", TensorProto.FLOAT, ["b", "s", hidden])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", "s", hidden])]
    inits.append(numpy_helper.from_array(np.array([0, 0, heads, head_dim], np.int64), "split4"))
    inits.append(numpy_helper.from_array(np.array([0, 0, hidden], np.int64), "merge3"))
    x = "inputs_embeds"
    for i in range(layers):
        for kind in ("key", "value"):
            inputs.append(
                helper.make_tensor_value_info(
                    f"past_key_values.{i}.{kind}", TensorProto.FLOAT, ["b", heads, "p", head_dim]
                )
            )
            outputs.append(
                helper.make_tensor_value_info(
                    f"present.{i}.{kind}", TensorProto.FLOAT, ["b", heads, "t", head_dim]
                )
            )
        proj = {}
        for part in ("q", "k", "v", "o"):
            inits.append(_weight(rng, f"w{part}{i}", (hidden, hidden)))
        for part in ("q", "k", "v"):
            nodes += [
                helper.make_node("MatMul", [x, f"w{part}{i}"], [f"{part}{i}_flat"]),
                helper.make_node("Reshape", [f"{part}{i}_flat", "split4"], [f"{part}{i}_4d"]),
                helper.make_node(
                    "Transpose", [f"{part}{i}_4d"], [f"{part}{i}_bhsd"], perm=[0, 2, 1, 3]
                ),
            ]
            proj[part] = f"{part}{i}_bhsd"
        nodes += [
            helper.make_node(
                "Concat", [f"past_key_values.{i}.key", proj["k"]], [f"present.{i}.key"], axis=2
            ),
            helper.make_node(
                "Concat", [f"past_key_values.{i}.value", proj["v"]], [f"present.{i}.value"], axis=2
            ),
            helper.make_node("Transpose", [f"present.{i}.key"], [f"kt{i}"], perm=[0, 1, 3, 2]),
            helper.make_node("MatMul", [proj["q"], f"kt{i}"], [f"scores{i}"]),
            helper.make_node("Softmax", [f"scores{i}"], [f"probs{i}"], axis=-1),
            helper.make_node("MatMul", [f"probs{i}", f"present.{i}.value"], [f"ctx{i}"]),
            helper.make_node("Transpose", [f"ctx{i}"], [f"ctx{i}_bshd"], perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", [f"ctx{i}_bshd", "merge3"], [f"ctx{i}_flat"]),
            helper.make_node("MatMul", [f"ctx{i}_flat", f"wo{i}"], [f"attn{i}"]),
            helper.make_node("Add", [x, f"attn{i}"], [f"h{i}"]),
        ]
        x = f"h{i}"
    nodes.append(helper.make_node("Identity", [x], ["logits"]))
    graph = helper.make_graph(nodes, "concat_lm", inputs, outputs, inits)
    return _save(graph, path, [("", 17)])


def gqa_lm(
    path: Path,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 8,
    seed: int = 0,
) -> Path:
    rng = np.random.default_rng(seed)
    hidden = heads * head_dim
    kv_hidden = kv_heads * head_dim
    nodes, inits = [], []
    inputs = [
        helper.make_tensor_value_info("inputs_embeds", TensorProto.FLOAT, ["b", "s", hidden]),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["b"]),
        helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
    ]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", "s", hidden])]
    x = "inputs_embeds"
    for i in range(layers):
        for kind in ("key", "value"):
            inputs.append(
                helper.make_tensor_value_info(
                    f"past_key_values.{i}.{kind}", TensorProto.FLOAT, ["b", kv_heads, "p", head_dim]
                )
            )
            outputs.append(
                helper.make_tensor_value_info(
                    f"present.{i}.{kind}", TensorProto.FLOAT, ["b", kv_heads, "t", head_dim]
                )
            )
        inits += [
            _weight(rng, f"wq{i}", (hidden, hidden)),
            _weight(rng, f"wk{i}", (hidden, kv_hidden)),
            _weight(rng, f"wv{i}", (hidden, kv_hidden)),
            _weight(rng, f"wo{i}", (hidden, hidden)),
        ]
        nodes += [
            helper.make_node("MatMul", [x, f"wq{i}"], [f"q{i}"]),
            helper.make_node("MatMul", [x, f"wk{i}"], [f"k{i}"]),
            helper.make_node("MatMul", [x, f"wv{i}"], [f"v{i}"]),
            helper.make_node(
                "GroupQueryAttention",
                [
                    f"q{i}",
                    f"k{i}",
                    f"v{i}",
                    f"past_key_values.{i}.key",
                    f"past_key_values.{i}.value",
                    "seqlens_k",
                    "total_sequence_length",
                ],
                [f"ctx{i}", f"present.{i}.key", f"present.{i}.value"],
                domain="com.microsoft",
                num_heads=heads,
                kv_num_heads=kv_heads,
            ),
            helper.make_node("MatMul", [f"ctx{i}", f"wo{i}"], [f"attn{i}"]),
            helper.make_node("Add", [x, f"attn{i}"], [f"h{i}"]),
        ]
        x = f"h{i}"
    nodes.append(helper.make_node("Identity", [x], ["logits"]))
    graph = helper.make_graph(nodes, "gqa_lm", inputs, outputs, inits)
    return _save(graph, path, [("", 17), ("com.microsoft", 1)])

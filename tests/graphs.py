"""Tiny LM-with-past graphs for tests of the session core, written with the project's graph
builder (onnx_tts.tools.graph_builder).

Both take `inputs_embeds` [B, S, D] and return `logits` [B, S, D] plus KV:
- `concat_lm`: third-party style, present = Concat(past, new) along the sequence axis.
- `gqa_lm`: com.microsoft GroupQueryAttention, which accepts a growing cache as well as one
  fixed-capacity buffer bound as both past and present.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from onnx_tts.tools.graph_builder import FLOAT, INT32, MS_DOMAIN, GraphBuilder


def _weight(b: GraphBuilder, rng: np.random.Generator, name: str, shape: tuple[int, int]) -> str:
    scale = 1.0 / np.sqrt(shape[0])
    return b.initializer(name, (rng.standard_normal(shape) * scale).astype(np.float32))


def _kv_io(b: GraphBuilder, layer: int, kv_heads: int, head_dim: int) -> None:
    for kind in ("key", "value"):
        b.add_input(f"past_key_values.{layer}.{kind}", FLOAT, ("b", kv_heads, "p", head_dim))
        b.add_output(f"present.{layer}.{kind}", FLOAT, ("b", kv_heads, "t", head_dim))


def _save(b: GraphBuilder, x: str, hidden: int, path: Path) -> Path:
    b.identity(x, "logits")
    b.outputs.insert(0, onnx.helper.make_tensor_value_info("logits", FLOAT, ["b", "s", hidden]))
    model = b.build()
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def concat_lm(
    path: Path, layers: int = 2, heads: int = 2, head_dim: int = 8, seed: int = 0
) -> Path:
    rng = np.random.default_rng(seed)
    hidden = heads * head_dim
    b = GraphBuilder("concat_lm")
    x = b.add_input("inputs_embeds", FLOAT, ("b", "s", hidden))
    split4, merge3 = b.const([0, 0, heads, head_dim]), b.const([0, 0, hidden])
    for i in range(layers):
        _kv_io(b, i, heads, head_dim)
        weights = {part: _weight(b, rng, f"w{part}{i}", (hidden, hidden)) for part in "qkvo"}
        proj = {}
        for part in "qkv":
            flat = b.node("MatMul", [x, weights[part]])
            proj[part] = b.node("Transpose", [b.node("Reshape", [flat, split4])], perm=[0, 2, 1, 3])
        key, value = (
            b.node(
                "Concat",
                [f"past_key_values.{i}.{kind}", proj[kind[0]]],
                output_names=[f"present.{i}.{kind}"],
                axis=2,
            )[0]
            for kind in ("key", "value")
        )
        scores = b.node("MatMul", [proj["q"], b.node("Transpose", [key], perm=[0, 1, 3, 2])])
        context = b.node("MatMul", [b.node("Softmax", [scores], axis=-1), value])
        merged = b.node("Reshape", [b.node("Transpose", [context], perm=[0, 2, 1, 3]), merge3])
        x = b.node("Add", [x, b.node("MatMul", [merged, weights["o"]])])
    return _save(b, x, hidden, path)


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
    b = GraphBuilder("gqa_lm")
    x = b.add_input("inputs_embeds", FLOAT, ("b", "s", hidden))
    b.add_input("seqlens_k", INT32, ("b",))
    b.add_input("total_sequence_length", INT32, ())
    for i in range(layers):
        _kv_io(b, i, kv_heads, head_dim)
        wq = _weight(b, rng, f"wq{i}", (hidden, hidden))
        wk = _weight(b, rng, f"wk{i}", (hidden, kv_hidden))
        wv = _weight(b, rng, f"wv{i}", (hidden, kv_hidden))
        wo = _weight(b, rng, f"wo{i}", (hidden, hidden))
        context = b.node(
            "GroupQueryAttention",
            [
                b.node("MatMul", [x, wq]),
                b.node("MatMul", [x, wk]),
                b.node("MatMul", [x, wv]),
                f"past_key_values.{i}.key",
                f"past_key_values.{i}.value",
                "seqlens_k",
                "total_sequence_length",
            ],
            domain=MS_DOMAIN,
            output_names=[f"ctx{i}", f"present.{i}.key", f"present.{i}.value"],
            num_heads=heads,
            kv_num_heads=kv_heads,
        )[0]
        x = b.node("Add", [x, b.node("MatMul", [context, wo])])
    return _save(b, x, hidden, path)

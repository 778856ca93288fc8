"""Decoder-only LM graphs and bundle files for the export recipes.

Graphs are written with the project's one builder, `onnx_tts.tools.graph_builder` (which also
holds the small op helpers: linear, norms, rotary tables); everything is deterministic, so
building the same graph twice gives identical bytes.

The decoder-only LM builders (:func:`build_gqa_lm`, :func:`build_concat_lm`) are general
(layers, heads, kv_heads, head_dim, norm type, rotary or not) so the benchmarks can reuse them
with random weights from :func:`random_lm_weights`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import onnx

# The one bundle writer (onnx_tts.bundle, beside the reader), re-exported for the recipes.
from onnx_tts.bundle import save_model as save_model
from onnx_tts.bundle import write_bundle as write_bundle
from onnx_tts.errors import ModelError
from onnx_tts.tools.graph_builder import (
    BOOL,
    FLOAT,
    INT32,
    INT64,
    MS_DOMAIN,
    GraphBuilder,
    layer_norm,
    linear,
    rms_norm,
    rotary_inv_freq,
    rotary_tables,
    silu,
)


# decoder-only LM ---------------------------------------------------------------------------
@dataclass(frozen=True)
class DecoderLMSpec:
    """Shape of a pre-norm decoder-only transformer with a SwiGLU MLP."""

    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn_size: int
    vocab_size: int
    output_heads: int | None = None  # None: logits [B,S,V]; K: logits [B,S,K,V]
    norm: Literal["rms", "layer"] = "rms"
    rotary: bool = True
    rope_theta: float = 10000.0
    max_positions: int = 4096
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.heads % self.kv_heads != 0:
            raise ModelError(
                f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})"
            )
        if self.rotary and self.head_dim % 2 != 0:
            raise ModelError(f"rotary needs an even head_dim, got {self.head_dim}")
        if self.norm not in ("rms", "layer"):
            raise ModelError(f"norm must be 'rms' or 'layer', got {self.norm!r}")

    @property
    def logits_width(self) -> int:
        return self.vocab_size * (self.output_heads or 1)


@dataclass
class LayerWeights:
    """One decoder layer; matrices are [in, out] (x @ W)."""

    attn_norm: np.ndarray
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    o: np.ndarray
    mlp_norm: np.ndarray
    gate: np.ndarray
    up: np.ndarray
    down: np.ndarray
    attn_norm_bias: np.ndarray | None = None  # only for norm="layer"
    mlp_norm_bias: np.ndarray | None = None


@dataclass
class LMWeights:
    layers: list[LayerWeights]
    final_norm: np.ndarray
    head: np.ndarray  # [hidden, logits_width]
    final_norm_bias: np.ndarray | None = None
    extra: dict[str, np.ndarray] = field(default_factory=dict)


def random_lm_weights(spec: DecoderLMSpec, seed: int = 0) -> LMWeights:
    """Random weights of the right shapes (for benchmark graphs; not a trained model)."""
    rng = np.random.default_rng(seed)

    def mat(n_in: int, n_out: int) -> np.ndarray:
        return (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)

    def norm_pair() -> tuple[np.ndarray, np.ndarray | None]:
        weight = (1.0 + 0.1 * rng.standard_normal(spec.hidden_size)).astype(np.float32)
        bias = np.zeros(spec.hidden_size, np.float32) if spec.norm == "layer" else None
        return weight, bias

    d, q_width, kv_width = (
        spec.hidden_size,
        spec.heads * spec.head_dim,
        spec.kv_heads * spec.head_dim,
    )
    layers = []
    for _ in range(spec.layers):
        attn_norm, attn_bias = norm_pair()
        mlp_norm, mlp_bias = norm_pair()
        layers.append(
            LayerWeights(
                attn_norm=attn_norm,
                q=mat(d, q_width),
                k=mat(d, kv_width),
                v=mat(d, kv_width),
                o=mat(q_width, d),
                mlp_norm=mlp_norm,
                gate=mat(d, spec.ffn_size),
                up=mat(d, spec.ffn_size),
                down=mat(spec.ffn_size, d),
                attn_norm_bias=attn_bias,
                mlp_norm_bias=mlp_bias,
            )
        )
    final_norm, final_bias = norm_pair()
    return LMWeights(layers, final_norm, mat(d, spec.logits_width), final_bias)


def check_lm_weights(spec: DecoderLMSpec, weights: LMWeights) -> None:
    """Raises ModelError naming the first tensor whose shape does not fit the spec."""
    d, q, kv, ff = (
        spec.hidden_size,
        spec.heads * spec.head_dim,
        spec.kv_heads * spec.head_dim,
        spec.ffn_size,
    )
    if len(weights.layers) != spec.layers:
        raise ModelError(f"spec has {spec.layers} layers but weights have {len(weights.layers)}")
    expected: list[tuple[str, np.ndarray, tuple[int, ...]]] = []
    for i, layer in enumerate(weights.layers):
        expected += [
            (f"layers.{i}.attn_norm", layer.attn_norm, (d,)),
            (f"layers.{i}.q", layer.q, (d, q)),
            (f"layers.{i}.k", layer.k, (d, kv)),
            (f"layers.{i}.v", layer.v, (d, kv)),
            (f"layers.{i}.o", layer.o, (q, d)),
            (f"layers.{i}.mlp_norm", layer.mlp_norm, (d,)),
            (f"layers.{i}.gate", layer.gate, (d, ff)),
            (f"layers.{i}.up", layer.up, (d, ff)),
            (f"layers.{i}.down", layer.down, (ff, d)),
        ]
    expected += [
        ("final_norm", weights.final_norm, (d,)),
        ("head", weights.head, (d, spec.logits_width)),
    ]
    for name, array, shape in expected:
        if tuple(array.shape) != shape or array.dtype != np.float32:
            raise ModelError(
                f"LM weight {name} is {array.dtype}{tuple(array.shape)}, expected float32{shape} "
                "([in, out] matrices: transpose torch Linear weights)"
            )


def _norm(
    b: GraphBuilder, spec: DecoderLMSpec, x: str, w: np.ndarray, bias: np.ndarray | None, name: str
) -> str:
    if spec.norm == "rms":
        return rms_norm(b, x, w, spec.norm_eps, name)
    if bias is None:
        raise ModelError(f"{name}: norm='layer' needs a bias; set LayerWeights.*_norm_bias")
    return layer_norm(b, x, w, bias, spec.norm_eps, name)


def _mlp(b: GraphBuilder, x: str, layer: LayerWeights, name: str) -> str:
    gate = silu(b, linear(b, x, layer.gate, None, f"{name}.gate"), f"{name}/silu")
    up = linear(b, x, layer.up, None, f"{name}.up")
    return linear(
        b, b.node("Mul", [gate, up], name=f"{name}/GateUp"), layer.down, None, f"{name}.down"
    )


def _lm_head(b: GraphBuilder, spec: DecoderLMSpec, x: str, weights: LMWeights) -> None:
    normed = _norm(b, spec, x, weights.final_norm, weights.final_norm_bias, "final_norm")
    flat = linear(b, normed, weights.head, None, "lm_head")
    if spec.output_heads is None:
        b.identity(flat, "logits")
        b.add_output("logits", FLOAT, ("batch", "sequence", spec.vocab_size))
    else:
        b.node(
            "Reshape",
            [flat, b.const([0, 0, spec.output_heads, spec.vocab_size])],
            output_names=["logits"],
            name="logits/Reshape",
        )
        b.add_output("logits", FLOAT, ("batch", "sequence", spec.output_heads, spec.vocab_size))


def _kv_io(b: GraphBuilder, spec: DecoderLMSpec, past_dim: str, present_dim: str) -> None:
    for i in range(spec.layers):
        for kind in ("key", "value"):
            b.add_input(
                f"past_key_values.{i}.{kind}",
                FLOAT,
                ("batch", spec.kv_heads, past_dim, spec.head_dim),
            )
    for i in range(spec.layers):
        for kind in ("key", "value"):
            b.add_output(
                f"present.{i}.{kind}", FLOAT, ("batch", spec.kv_heads, present_dim, spec.head_dim)
            )


def build_gqa_lm(spec: DecoderLMSpec, weights: LMWeights, name: str = "lm") -> onnx.ModelProto:
    """LM whose attention is com.microsoft GroupQueryAttention (KV cache written in place).

    Inputs: inputs_embeds [B,S,D], seqlens_k int32 [B] (total length - 1), total_sequence_length
    int32 scalar, past_key_values.{i}.key|value [B,Hkv,P,Dh]. Outputs: logits, present.{i}.*.
    Works with a growing cache (present has P+S positions) and with one buffer of fixed capacity
    bound as both past and present (ORT CPU detects the shared buffer by pointer).
    """
    check_lm_weights(spec, weights)
    b = GraphBuilder(name)
    x = b.add_input("inputs_embeds", FLOAT, ("batch", "sequence", spec.hidden_size))
    seqlens_k = b.add_input("seqlens_k", INT32, ("batch",))
    total_len = b.add_input("total_sequence_length", INT32, ())
    _kv_io(b, spec, "past_sequence", "present_sequence")
    rotary_inputs: list[str] = []
    if spec.rotary:
        cos, sin = rotary_tables(spec.max_positions, spec.head_dim, spec.rope_theta)
        rotary_inputs = [b.initializer("cos_cache", cos), b.initializer("sin_cache", sin)]
    for i, layer in enumerate(weights.layers):
        prefix = f"layers.{i}"
        h = _norm(b, spec, x, layer.attn_norm, layer.attn_norm_bias, f"{prefix}.attn_norm")
        q = linear(b, h, layer.q, None, f"{prefix}.q_proj")
        k = linear(b, h, layer.k, None, f"{prefix}.k_proj")
        v = linear(b, h, layer.v, None, f"{prefix}.v_proj")
        past_names = [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
        attn = b.node(
            "GroupQueryAttention",
            [q, k, v, *past_names, seqlens_k, total_len, *rotary_inputs],
            domain=MS_DOMAIN,
            name=f"{prefix}.attn/GroupQueryAttention",
            output_names=[f"{prefix}.attn/out", f"present.{i}.key", f"present.{i}.value"],
            num_heads=spec.heads,
            kv_num_heads=spec.kv_heads,
            scale=float(1.0 / np.sqrt(spec.head_dim)),
            do_rotary=int(spec.rotary),
            rotary_interleaved=0,
        )[0]
        x = b.node(
            "Add",
            [x, linear(b, attn, layer.o, None, f"{prefix}.o_proj")],
            name=f"{prefix}/AttnResidual",
        )
        h = _norm(b, spec, x, layer.mlp_norm, layer.mlp_norm_bias, f"{prefix}.mlp_norm")
        x = b.node("Add", [x, _mlp(b, h, layer, f"{prefix}.mlp")], name=f"{prefix}/MlpResidual")
    _lm_head(b, spec, x, weights)
    return b.build(doc_string=f"decoder-only LM, GroupQueryAttention, {spec}")


def _rotate(b: GraphBuilder, x: str, cos: str, sin: str, half: int, name: str) -> str:
    """Half-split rotary: x * cos + rotate_half(x) * sin; cos/sin are [B,1,S,Dh]."""
    first, second = b.node(
        "Split", [x, b.const([half, half])], num_outputs=2, axis=-1, name=f"{name}/Split"
    )
    rotated = b.node(
        "Concat",
        [b.node("Neg", [second], name=f"{name}/Neg"), first],
        axis=-1,
        name=f"{name}/Concat",
    )
    return b.node(
        "Add",
        [
            b.node("Mul", [x, cos], name=f"{name}/MulCos"),
            b.node("Mul", [rotated, sin], name=f"{name}/MulSin"),
        ],
        name=f"{name}/Add",
    )


def _split_heads(b: GraphBuilder, x: str, heads: int, head_dim: int, name: str) -> str:
    """[B,S,heads*head_dim] -> [B,heads,S,head_dim]."""
    x = b.node("Reshape", [x, b.const([0, 0, heads, head_dim])], name=f"{name}Reshape")
    return b.node("Transpose", [x], perm=[0, 2, 1, 3], name=f"{name}Transpose")


def build_concat_lm(
    spec: DecoderLMSpec, weights: LMWeights, name: str = "lm_concat"
) -> onnx.ModelProto:
    """The same LM in the layout third-party exports use: explicit Concat of past and new K/V.

    Inputs: inputs_embeds [B,S,D], attention_mask i64 [B,P+S], position_ids i64 [B,S] (only when
    rotary), past_key_values.{i}.key|value [B,Hkv,P,Dh]. Outputs: logits, present.{i}.* with
    P+S positions. Query i sits at cache position P+i and sees keys j <= P+i with mask 1.
    """
    check_lm_weights(spec, weights)
    b = GraphBuilder(name)
    groups = spec.heads // spec.kv_heads
    x = b.add_input("inputs_embeds", FLOAT, ("batch", "sequence", spec.hidden_size))
    mask = b.add_input("attention_mask", INT64, ("batch", "total_sequence"))
    if spec.rotary:
        position_ids = b.add_input("position_ids", INT64, ("batch", "sequence"))
    _kv_io(b, spec, "past_sequence", "total_sequence")

    # Mask [B,1,1,S,T] shared by all layers (scores are [B,Hkv,G,S,T]).
    total = b.node("Squeeze", [b.node("Shape", [mask], start=1, end=2)], name="mask/T")
    seq = b.node("Squeeze", [b.node("Shape", [x], start=1, end=2)], name="mask/S")
    one, zero = b.const(1), b.const(0)
    q_pos = b.node("Range", [b.node("Sub", [total, seq]), total, one], name="mask/QueryPositions")
    k_pos = b.node("Range", [zero, total, one], name="mask/KeyPositions")
    causal = b.node(
        "LessOrEqual",
        [b.node("Unsqueeze", [k_pos, b.const([0])]), b.node("Unsqueeze", [q_pos, b.const([1])])],
        name="mask/Causal",
    )
    keep = b.node("Cast", [mask], to=BOOL, name="mask/Cast")
    keep = b.node("Unsqueeze", [keep, b.const([1, 2, 3])], name="mask/Unsqueeze")
    allowed = b.node("And", [keep, causal], name="mask/Allowed")
    masked_value = b.const(np.finfo(np.float32).min, np.float32)

    cos = sin = ""
    if spec.rotary:
        inv_freq = b.initializer("rotary.inv_freq", rotary_inv_freq(spec.head_dim, spec.rope_theta))
        positions = b.node("Cast", [position_ids], to=FLOAT, name="rotary/Cast")
        angles = b.node(
            "Mul", [b.node("Unsqueeze", [positions, b.const([-1])]), inv_freq], name="rotary/Angles"
        )
        angles = b.node("Concat", [angles, angles], axis=-1, name="rotary/Full")
        angles = b.node("Unsqueeze", [angles, b.const([1])], name="rotary/Unsqueeze")  # [B,1,S,Dh]
        cos = b.node("Cos", [angles], name="rotary/Cos")
        sin = b.node("Sin", [angles], name="rotary/Sin")

    scale = b.const(1.0 / np.sqrt(spec.head_dim), np.float32)
    for i, layer in enumerate(weights.layers):
        p = f"layers.{i}"
        h = _norm(b, spec, x, layer.attn_norm, layer.attn_norm_bias, f"{p}.attn_norm")

        q = _split_heads(
            b, linear(b, h, layer.q, None, f"{p}.q_proj"), spec.heads, spec.head_dim, f"{p}/q"
        )
        k = _split_heads(
            b, linear(b, h, layer.k, None, f"{p}.k_proj"), spec.kv_heads, spec.head_dim, f"{p}/k"
        )
        v = _split_heads(
            b, linear(b, h, layer.v, None, f"{p}.v_proj"), spec.kv_heads, spec.head_dim, f"{p}/v"
        )
        if spec.rotary:
            q = _rotate(b, q, cos, sin, spec.head_dim // 2, f"{p}/q_rotary")
            k = _rotate(b, k, cos, sin, spec.head_dim // 2, f"{p}/k_rotary")
        k = b.node(
            "Concat",
            [f"past_key_values.{i}.key", k],
            axis=2,
            output_names=[f"present.{i}.key"],
            name=f"{p}/KeyConcat",
        )[0]
        v = b.node(
            "Concat",
            [f"past_key_values.{i}.value", v],
            axis=2,
            output_names=[f"present.{i}.value"],
            name=f"{p}/ValueConcat",
        )[0]
        # Query head h uses kv head h // groups: [B,Hkv,G,S,Dh] against [B,Hkv,1,T,Dh].
        q5 = b.node(
            "Reshape", [q, b.const([0, spec.kv_heads, groups, -1, spec.head_dim])], name=f"{p}/q5"
        )
        k5 = b.node("Unsqueeze", [k, b.const([2])], name=f"{p}/k5")
        v5 = b.node("Unsqueeze", [v, b.const([2])], name=f"{p}/v5")
        k5t = b.node("Transpose", [k5], perm=[0, 1, 2, 4, 3], name=f"{p}/k5T")
        scores = b.node(
            "Mul", [b.node("MatMul", [q5, k5t], name=f"{p}/QK"), scale], name=f"{p}/Scale"
        )
        scores = b.node("Where", [allowed, scores, masked_value], name=f"{p}/Mask")
        probs = b.node("Softmax", [scores], axis=-1, name=f"{p}/Softmax")
        ctx = b.node("MatMul", [probs, v5], name=f"{p}/PV")
        ctx = b.node(
            "Reshape", [ctx, b.const([0, spec.heads, -1, spec.head_dim])], name=f"{p}/ctx4"
        )
        ctx = b.node("Transpose", [ctx], perm=[0, 2, 1, 3], name=f"{p}/ctxT")
        ctx = b.node(
            "Reshape", [ctx, b.const([0, 0, spec.heads * spec.head_dim])], name=f"{p}/ctx3"
        )
        x = b.node(
            "Add", [x, linear(b, ctx, layer.o, None, f"{p}.o_proj")], name=f"{p}/AttnResidual"
        )
        h = _norm(b, spec, x, layer.mlp_norm, layer.mlp_norm_bias, f"{p}.mlp_norm")
        x = b.node("Add", [x, _mlp(b, h, layer, f"{p}.mlp")], name=f"{p}/MlpResidual")
    _lm_head(b, spec, x, weights)
    return b.build(doc_string=f"decoder-only LM, Concat KV cache, {spec}")


# int8 weights ------------------------------------------------------------------------------
INT8_BLOCK = 32  # weights share one scale per 32 input rows of one output column


def quantize_matmul_weights_int8(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every MatMul with a constant weight as ORT's MatMulNBits: 8-bit symmetric weights with a
    scale per block of INT8_BLOCK input rows, and int8 compute (accuracy level 4), which
    quantizes the activations per row and block. A batch-1 decode step then reads a quarter of
    the weight bytes, which is what bounds it; and a row's result never depends on the other
    rows of a batch (a per-tensor activation scale, as in dynamic MatMulInteger, would make
    batched decoding differ from solo). GroupQueryAttention and the norms stay float."""
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    settings = {"block_size": INT8_BLOCK, "is_symmetric": True, "accuracy_level": 4, "bits": 8}
    quantizer = MatMulNBitsQuantizer(
        onnx.ModelProto.FromString(model.SerializeToString()),  # it rewrites what it is given
        **settings,
        algo_config=DefaultWeightOnlyQuantConfig(**settings),
    )
    quantizer.process()
    return quantizer.model.model


def dequantized_initializers(values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Initializers by name with each 8-bit MatMulNBits weight (W_Q8 [N, blocks, block] uint8
    with an implied zero point of 128, W_scales [N, blocks]) turned back into the float
    W [K, N] the graph computes with (K = blocks x block: the LMs here have no padded block)."""
    out = dict(values)
    for name in [n for n in values if n.endswith("_Q8")]:
        base = name[: -len("_Q8")]
        scales = values.get(base + "_scales")
        if scales is None:
            continue
        q = values[name].astype(np.float32) - 128.0
        weight = (q * scales.astype(np.float32)[..., None]).reshape(q.shape[0], -1)
        out[base] = np.ascontiguousarray(weight.T)
        del out[name], out[base + "_scales"]
    return out


# manifests ---------------------------------------------------------------------------------
def kv_manifest(cfg: Any, capacity: int) -> dict[str, object]:
    """bundle.json's "kv" section for an LM built by build_gqa_lm (`cfg` has layers, heads,
    kv_heads and head_dim): GroupQueryAttention, float32, in place by default."""
    return {
        "layers": cfg.layers,
        "heads": cfg.heads,
        "kv_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim,
        "dtype": "float32",
        "attention": "gqa",
        "default_mode": "inplace",
        "capacity": capacity,
        "past_names": ["past_key_values.{i}.key", "past_key_values.{i}.value"],
        "present_names": ["present.{i}.key", "present.{i}.value"],
    }

"""The Qwen3 decoder backbone, family-neutral: a torch module loaded by tensor name from a
published checkpoint, and its ONNX export as an LM-with-past that takes input embeddings.

Math (Hugging Face `Qwen3Model`, float32): RMSNorm (x * rsqrt(mean(x^2) + eps) * w); attention
with per-head RMSNorm on q and k before a NeoX rotate-half RoPE (inv_freq = 1 / theta^(2i/D),
angle = position * inv_freq in float32, cos/sin of [angle, angle]), grouped-query heads (query
head h reads kv head h // (H / Hkv)), scale 1/sqrt(D), causal plus a key mask; SwiGLU MLP
down(silu(gate(x)) * up(x)); a final RMSNorm. The output is the last hidden state after the
final norm (heads are the family's own graphs).

The rotary tables are computed once in torch for positions 0..max_positions-1 and gathered by
`position_ids`, in the module and in the graph alike, so both see the same cos/sin to the bit.
`RopeTables` optionally rounds them through a narrower dtype, as published runtimes that cast
cos/sin to their activation dtype (bf16) do.

ONNX (`export_backbone`): inputs `inputs_embeds` [B, S, hidden] float32, `attention_mask`
int64 [B, P+S], `position_ids` int64 [B, S], `past_key_values.{i}.key|value` [B, Hkv, P, D];
outputs `last_hidden_state` [B, S, hidden], `present.{i}.key|value` [B, Hkv, P+S, D], the cache
grown by Concat (keys stored after RoPE), so `onnx-tts convert --inplace-kv` rewrites each
block into GroupQueryAttention and `onnx-tts quantize` turns the MatMuls into MatMulNBits.
Weights stream to one external-data file as the graph is built (`StreamingBuilder`): memory is
one tensor at a time. `check_backbone` runs the graph beside the module and returns the max
absolute differences.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from torch import nn

from export.checkpoint import Checkpoint, CheckpointError
from export.external_weights import StreamingBuilder, save_streamed
from onnx_tts.tools.graph_builder import BOOL, FLOAT, INT64, linear, rms_norm, silu

ROPE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
ROPE_ROUNDINGS = ("nearest", "truncate")
# Bounds on what a checkpoint's config may ask for (far beyond any published Qwen3).
MAX_HIDDEN = 1 << 16
MAX_LAYERS = 256
MAX_HEADS = 256
MAX_POSITIONS = 1 << 20


@dataclass(frozen=True)
class RopeTables:
    """How the rotary cos/sin tables are rounded: not at all (`dtype` None, float32), or
    through `dtype` ("bfloat16"/"float16") to the nearest value (as `tensor.to(dtype)` does)
    or, for bfloat16, by truncating the low 16 bits."""

    dtype: str | None = None
    rounding: str = "nearest"

    def __post_init__(self) -> None:
        if self.dtype is not None and self.dtype not in ROPE_DTYPES:
            raise ValueError(f"rope table dtype must be one of {sorted(ROPE_DTYPES)} or None")
        if self.rounding not in ROPE_ROUNDINGS:
            raise ValueError(f"rope rounding must be one of {ROPE_ROUNDINGS}")
        if self.rounding == "truncate" and self.dtype != "bfloat16":
            raise ValueError("truncated rope tables are bfloat16 only")

    def apply(self, table: torch.Tensor) -> torch.Tensor:
        if self.dtype is None:
            return table
        if self.rounding == "truncate":
            bits = table.contiguous().view(torch.int32) & ~0xFFFF
            return bits.view(torch.float32)
        return table.to(ROPE_DTYPES[self.dtype]).to(torch.float32)

    def describe(self) -> str:
        return "float32" if self.dtype is None else f"{self.dtype} ({self.rounding})"


def _number(config: Mapping[str, Any], key: str, kind: type, low: float, high: float, what: str):
    value = config.get(key)
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int:
        ok = ok and float(value).is_integer()
    if not ok or not (low <= float(value) <= high) or not math.isfinite(float(value)):
        raise CheckpointError(
            f"{what}: {key} must be a number in [{low:g}, {high:g}], got {value!r}"
        )
    return kind(value)


@dataclass(frozen=True)
class Qwen3Config:
    """The backbone's sizes, read from a Hugging Face Qwen3 config (a dict)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    attention_bias: bool = False
    max_position_embeddings: int = 40960

    @classmethod
    def from_dict(cls, config: Mapping[str, Any], what: str = "Qwen3 config") -> Qwen3Config:
        """The sizes of `config`, checked (CheckpointError naming the key that is wrong)."""
        if not isinstance(config, Mapping):
            raise CheckpointError(f"{what} must be a JSON object")
        hidden = _number(config, "hidden_size", int, 1, MAX_HIDDEN, what)
        heads = _number(config, "num_attention_heads", int, 1, MAX_HEADS, what)
        kv_heads = _number(
            {"num_key_value_heads": heads, **config}, "num_key_value_heads", int, 1, heads, what
        )
        if heads % kv_heads:
            raise CheckpointError(
                f"{what}: num_attention_heads {heads} is not a multiple of "
                f"num_key_value_heads {kv_heads}"
            )
        head_dim = config.get("head_dim") or hidden // heads
        head_dim = _number({"head_dim": head_dim}, "head_dim", int, 2, 1024, what)
        if head_dim % 2:
            raise CheckpointError(f"{what}: head_dim {head_dim} must be even for RoPE")
        theta = config.get("rope_theta")
        parameters = config.get("rope_parameters") or {}
        if theta is None and isinstance(parameters, Mapping):
            theta = parameters.get("rope_theta")
        scaling = config.get("rope_scaling") or (
            parameters if isinstance(parameters, Mapping) else {}
        )
        kind = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
        if kind != "default":
            raise CheckpointError(
                f"{what}: rope scaling {kind!r} is not supported (only plain RoPE)"
            )
        if config.get("use_sliding_window"):
            raise CheckpointError(f"{what}: sliding-window attention is not supported")
        if config.get("hidden_act", "silu") != "silu":
            raise CheckpointError(f"{what}: hidden_act {config.get('hidden_act')!r} is not silu")
        return cls(
            hidden_size=hidden,
            num_hidden_layers=_number(config, "num_hidden_layers", int, 1, MAX_LAYERS, what),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=_number(config, "intermediate_size", int, 1, 1 << 20, what),
            rms_norm_eps=_number(
                {"rms_norm_eps": 1e-6, **config}, "rms_norm_eps", float, 0.0, 1.0, what
            ),
            rope_theta=_number(
                {"rope_theta": theta or 10000.0}, "rope_theta", float, 1.0, 1e12, what
            ),
            attention_bias=bool(config.get("attention_bias", False)),
            max_position_embeddings=_number(
                {"max_position_embeddings": 40960, **config},
                "max_position_embeddings",
                int,
                1,
                MAX_POSITIONS,
                what,
            ),
        )

    @property
    def groups(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    def parameters(self) -> int:
        """Weights of the backbone (no embedding table)."""
        d, q, kv = self.hidden_size, self.num_attention_heads * self.head_dim, 0
        kv = self.num_key_value_heads * self.head_dim
        attention = d * q + 2 * d * kv + q * d + 2 * self.head_dim + d
        mlp = 3 * d * self.intermediate_size + d
        return self.num_hidden_layers * (attention + mlp) + d


def rotary_tables(config: Qwen3Config, rope: RopeTables, positions: int | None = None):
    """cos, sin [positions, head_dim] float32 for positions 0..positions-1 (default: the
    config's max_position_embeddings), computed as Hugging Face's Qwen3 rotary embedding does
    (float32 angle position * inv_freq, then cos/sin of [angle, angle]) and rounded by `rope`."""
    count = config.max_position_embeddings if positions is None else positions
    dim = config.head_dim
    inv_freq = 1.0 / (
        config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
    )
    angles = torch.arange(count, dtype=torch.int64).float()[:, None] * inv_freq[None, :]
    full = torch.cat((angles, angles), dim=-1)
    return rope.apply(full.cos()), rope.apply(full.sin())


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


class Attention(nn.Module):
    def __init__(self, c: Qwen3Config) -> None:
        super().__init__()
        self.c = c
        q_width, kv_width = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, q_width, bias=c.attention_bias)
        self.k_proj = nn.Linear(c.hidden_size, kv_width, bias=c.attention_bias)
        self.v_proj = nn.Linear(c.hidden_size, kv_width, bias=c.attention_bias)
        self.o_proj = nn.Linear(q_width, c.hidden_size, bias=c.attention_bias)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)

    def forward(self, x, cos, sin, allowed, past):
        c = self.c
        batch, steps, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(batch, steps, c.num_attention_heads, c.head_dim))
        k = self.k_norm(self.k_proj(x).view(batch, steps, c.num_key_value_heads, c.head_dim))
        v = self.v_proj(x).view(batch, steps, c.num_key_value_heads, c.head_dim)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if cos is not None:
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        keys = k.repeat_interleave(c.groups, dim=1)
        values = v.repeat_interleave(c.groups, dim=1)
        scores = torch.matmul(q, keys.transpose(-1, -2)) * (c.head_dim**-0.5)
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        context = torch.matmul(torch.softmax(scores, dim=-1), values)
        context = context.transpose(1, 2).reshape(batch, steps, -1)
        return self.o_proj(context), (k, v)


class MLP(nn.Module):
    def __init__(self, c: Qwen3Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c: Qwen3Config) -> None:
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, cos, sin, allowed, past):
        attended, present = self.self_attn(self.input_layernorm(x), cos, sin, allowed, past)
        x = x + attended
        return x + self.mlp(self.post_attention_layernorm(x)), present


def causal_allowed(attention_mask: torch.Tensor, steps: int) -> torch.Tensor:
    """[B, 1, S, T] bool: query i (at cache position T - S + i) sees key j <= that position
    whose mask is 1."""
    total = attention_mask.shape[1]
    query = torch.arange(total - steps, total)[:, None]
    key = torch.arange(total)[None, :]
    return (key <= query)[None, None] & attention_mask.bool()[:, None, None, :]


class Qwen3Backbone(nn.Module):
    """Qwen3 decoder layers and final norm (tensor names as Hugging Face's `Qwen3Model`).

    Inputs are embeddings; `vocab_size` adds the model's `embed_tokens` table (for families
    that embed their text channel with it). `rotary` False leaves positions out entirely (a
    Qwen3 stack used without positions, e.g. a depth transformer)."""

    def __init__(
        self,
        config: Qwen3Config,
        rope: RopeTables | None = None,
        *,
        vocab_size: int | None = None,
        rotary: bool = True,
    ) -> None:
        super().__init__()
        self.config = config
        self.rope = rope or RopeTables()
        self.rotary = rotary
        if vocab_size is not None:
            self.embed_tokens = nn.Embedding(vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if rotary:
            cos, sin = rotary_tables(config, self.rope)
            self.register_buffer("cos_table", cos, persistent=False)
            self.register_buffer("sin_table", sin, persistent=False)

    def load(self, checkpoint: Checkpoint, prefix: str) -> None:
        """Every weight from `checkpoint` under `prefix` (e.g. "model.language_model.")."""
        checkpoint.load_into(self, prefix)

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        past: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """(last hidden state after the final norm [B, S, hidden], presents per layer)."""
        if self.rotary:
            cos = self.cos_table[position_ids].unsqueeze(1)
            sin = self.sin_table[position_ids].unsqueeze(1)
        else:
            cos, sin = None, None
        allowed = causal_allowed(attention_mask, inputs_embeds.shape[1])
        x, presents = inputs_embeds, []
        for index, layer in enumerate(self.layers):
            x, present = layer(x, cos, sin, allowed, None if past is None else past[index])
            presents.append(present)
        return self.norm(x), presents


# -- ONNX -------------------------------------------------------------------------------------
PAST = "past_key_values.{i}.{kind}"
PRESENT = "present.{i}.{kind}"
HIDDEN = "last_hidden_state"


def state_weights(module: nn.Module) -> Callable[[str], np.ndarray]:
    """Weights by Hugging Face name from a loaded module (for `export_backbone`)."""
    state = module.state_dict()
    return lambda name: state[name].detach().to(torch.float32).numpy()


def checkpoint_weights(checkpoint: Checkpoint, prefix: str) -> Callable[[str], np.ndarray]:
    """Weights by name read one at a time from `checkpoint` under `prefix` (a big backbone
    is never in memory whole)."""
    return lambda name: checkpoint.tensor(prefix + name).numpy()


def _heads(b, x: str, heads: int, head_dim: int, name: str) -> str:
    return b.node("Reshape", [x, b.const([0, 0, heads, head_dim])], name=f"{name}/Reshape")


def _to_heads_first(b, x: str, name: str) -> str:
    return b.node("Transpose", [x], perm=[0, 2, 1, 3], name=f"{name}/Transpose")


def _rotate(b, x: str, cos: str, sin: str, half: int, name: str) -> str:
    first, second = b.node(
        "Split", [x, b.const([half, half])], num_outputs=2, axis=-1, name=f"{name}/Split"
    )
    turned = b.node(
        "Concat",
        [b.node("Neg", [second], name=f"{name}/Neg"), first],
        axis=-1,
        name=f"{name}/Concat",
    )
    return b.node(
        "Add",
        [
            b.node("Mul", [x, cos], name=f"{name}/MulCos"),
            b.node("Mul", [turned, sin], name=f"{name}/MulSin"),
        ],
        name=f"{name}/Add",
    )


def _linear(b, x: str, weights, name: str, bias: bool) -> str:
    weight = np.ascontiguousarray(weights(f"{name}.weight").T)
    return linear(b, x, weight, weights(f"{name}.bias") if bias else None, name)


@dataclass(frozen=True)
class AttentionContext:
    """What every layer's attention reads: the allowed-keys mask [B, 1, 1, S, T], the masked
    score value, the rotary cos/sin [B, 1, S, D] of the positions, the score scale."""

    allowed: str
    lowest: str
    cos: str
    sin: str
    scale: str


def declare_io(
    b,
    config: Qwen3Config,
    input_width: int | None = None,
    *,
    rotary: bool = True,
    output: str = HIDDEN,
) -> tuple[str, str, str]:
    """The LM-with-past inputs and outputs (module docstring); `input_width` the width of
    `inputs_embeds` when it carries more than the hidden state; `rotary` False: no
    `position_ids` input; `output` names the hidden-state output. Returns the names of the
    embeddings, the attention mask and the position ids ("" without them)."""
    c = config
    x = b.add_input("inputs_embeds", FLOAT, ("batch", "sequence", input_width or c.hidden_size))
    mask = b.add_input("attention_mask", INT64, ("batch", "total_sequence"))
    position_ids = b.add_input("position_ids", INT64, ("batch", "sequence")) if rotary else ""
    for i in range(c.num_hidden_layers):
        for kind in ("key", "value"):
            b.add_input(
                PAST.format(i=i, kind=kind),
                FLOAT,
                ("batch", c.num_key_value_heads, "past_sequence", c.head_dim),
            )
    b.add_output(output, FLOAT, ("batch", "sequence", c.hidden_size))
    for i in range(c.num_hidden_layers):
        for kind in ("key", "value"):
            b.add_output(
                PRESENT.format(i=i, kind=kind),
                FLOAT,
                ("batch", c.num_key_value_heads, "total_sequence", c.head_dim),
            )
    return x, mask, position_ids


def attention_context(
    b, config: Qwen3Config, x: str, mask: str, position_ids: str, tables
) -> AttentionContext:
    """Causal + key mask [B, 1, 1, S, T] (scores are [B, Hkv, G, S, T]) and the rotary cos/sin
    gathered from `tables` (cos, sin [positions, D]) by position: shared by all layers.
    `tables` None: no rotary (cos and sin "")."""
    c = config
    total = b.node("Squeeze", [b.node("Shape", [mask], start=1, end=2)], name="mask/T")
    steps = b.node("Squeeze", [b.node("Shape", [x], start=1, end=2)], name="mask/S")
    one, zero = b.const(1), b.const(0)
    query = b.node("Range", [b.node("Sub", [total, steps]), total, one], name="mask/Queries")
    key = b.node("Range", [zero, total, one], name="mask/Keys")
    causal = b.node(
        "LessOrEqual",
        [b.node("Unsqueeze", [key, b.const([0])]), b.node("Unsqueeze", [query, b.const([1])])],
        name="mask/Causal",
    )
    keep = b.node(
        "Unsqueeze",
        [b.node("Cast", [mask], to=BOOL, name="mask/Cast"), b.const([1, 2, 3])],
        name="mask/Unsqueeze",
    )
    allowed = b.node("And", [keep, causal], name="mask/Allowed")
    lowest = b.const(np.finfo(np.float32).min, np.float32)

    scale = b.const(c.head_dim**-0.5, np.float32)
    if tables is None:
        return AttentionContext(allowed, lowest, "", "", scale)
    cos_table, sin_table = (np.asarray(t, np.float32) for t in tables)
    cos = b.node(
        "Gather",
        [b.initializer("rotary.cos", cos_table), position_ids],
        axis=0,
        name="rotary/GatherCos",
    )
    sin = b.node(
        "Gather",
        [b.initializer("rotary.sin", sin_table), position_ids],
        axis=0,
        name="rotary/GatherSin",
    )
    cos = b.node("Unsqueeze", [cos, b.const([1])], name="rotary/CosHeads")  # [B, 1, S, D]
    sin = b.node("Unsqueeze", [sin, b.const([1])], name="rotary/SinHeads")
    return AttentionContext(allowed, lowest, cos, sin, scale)


def grow_cache(b, i: int, k: str, v: str, name: str) -> tuple[str, str]:
    """Layer `i`'s new keys and values [B, Hkv, S, D] appended to its past by Concat; the
    results are the graph's `present.{i}.*` outputs."""
    grown = []
    for kind, new in (("key", k), ("value", v)):
        grown.append(
            b.node(
                "Concat",
                [PAST.format(i=i, kind=kind), new],
                axis=2,
                output_names=[PRESENT.format(i=i, kind=kind)],
                name=f"{name}/{kind.capitalize()}Concat",
            )[0]
        )
    return grown[0], grown[1]


def attention_block(
    b, config: Qwen3Config, weights, i: int, h: str, ctx: AttentionContext, qk_norm: bool = True
) -> str:
    """Layer `i`'s self-attention of the normed `h` (Hugging Face names under
    `layers.{i}.self_attn`): projections, per-head q/k RMSNorm (`qk_norm`, Qwen3), rotary,
    the cache grown by Concat into `present.{i}.*`, grouped-query attention; returns the
    output projection."""
    c = config
    a = f"layers.{i}.self_attn"
    half = c.head_dim // 2
    q = _heads(
        b,
        _linear(b, h, weights, f"{a}.q_proj", c.attention_bias),
        c.num_attention_heads,
        c.head_dim,
        f"{a}/q",
    )
    k = _heads(
        b,
        _linear(b, h, weights, f"{a}.k_proj", c.attention_bias),
        c.num_key_value_heads,
        c.head_dim,
        f"{a}/k",
    )
    v = _heads(
        b,
        _linear(b, h, weights, f"{a}.v_proj", c.attention_bias),
        c.num_key_value_heads,
        c.head_dim,
        f"{a}/v",
    )
    if qk_norm:
        q = rms_norm(b, q, weights(f"{a}.q_norm.weight"), c.rms_norm_eps, f"{a}.q_norm")
        k = rms_norm(b, k, weights(f"{a}.k_norm.weight"), c.rms_norm_eps, f"{a}.k_norm")
    q = _to_heads_first(b, q, f"{a}/q")
    k = _to_heads_first(b, k, f"{a}/k")
    v = _to_heads_first(b, v, f"{a}/v")
    if ctx.cos:
        q = _rotate(b, q, ctx.cos, ctx.sin, half, f"{a}/q_rotary")
        k = _rotate(b, k, ctx.cos, ctx.sin, half, f"{a}/k_rotary")
    k, v = grow_cache(b, i, k, v, a)
    # Query head h reads kv head h // G: [B, Hkv, G, S, D] against [B, Hkv, 1, T, D].
    q5 = b.node(
        "Reshape",
        [q, b.const([0, c.num_key_value_heads, c.groups, -1, c.head_dim])],
        name=f"{a}/q5",
    )
    k5 = b.node("Unsqueeze", [k, b.const([2])], name=f"{a}/k5")
    v5 = b.node("Unsqueeze", [v, b.const([2])], name=f"{a}/v5")
    k5t = b.node("Transpose", [k5], perm=[0, 1, 2, 4, 3], name=f"{a}/k5T")
    scores = b.node(
        "Mul", [b.node("MatMul", [q5, k5t], name=f"{a}/QK"), ctx.scale], name=f"{a}/Scale"
    )
    scores = b.node("Where", [ctx.allowed, scores, ctx.lowest], name=f"{a}/Mask")
    probs = b.node("Softmax", [scores], axis=-1, name=f"{a}/Softmax")
    context = b.node("MatMul", [probs, v5], name=f"{a}/PV")
    context = b.node(
        "Reshape",
        [context, b.const([0, c.num_attention_heads, -1, c.head_dim])],
        name=f"{a}/context4",
    )
    context = b.node("Transpose", [context], perm=[0, 2, 1, 3], name=f"{a}/contextT")
    context = b.node(
        "Reshape",
        [context, b.const([0, 0, c.num_attention_heads * c.head_dim])],
        name=f"{a}/context3",
    )
    return _linear(b, context, weights, f"{a}.o_proj", c.attention_bias)


def mlp_block(b, weights, m: str, h: str) -> str:
    """SwiGLU MLP `m` (Hugging Face names `{m}.gate_proj` ...) of `h`."""
    gate = silu(b, _linear(b, h, weights, f"{m}.gate_proj", False), f"{m}/silu")
    up = _linear(b, h, weights, f"{m}.up_proj", False)
    return _linear(
        b, b.node("Mul", [gate, up], name=f"{m}/GateUp"), weights, f"{m}.down_proj", False
    )


def build_backbone_graph(
    config: Qwen3Config,
    weights: Callable[[str], np.ndarray],
    sink,
    data_name: str,
    rope: RopeTables,
    name: str = "qwen3_backbone",
    *,
    rotary: bool = True,
    input_size: int | None = None,
    prelude: Callable[[StreamingBuilder, str], str] | None = None,
    output: str = HIDDEN,
) -> onnx.ModelProto:
    """The backbone graph (module docstring); weights by Hugging Face name from `weights`,
    written to `sink` (the file `data_name`) as they are added.

    For a Qwen3 stack used inside a model: `rotary` False drops positions (no `position_ids`
    input), `prelude(builder, inputs_embeds)` maps the input (of `input_size` features) to the
    stack's width first, and `output` names the result."""
    c = config
    b = StreamingBuilder(name, sink, data_name)
    x, mask, position_ids = declare_io(b, c, input_size, rotary=rotary, output=output)
    tables = rotary_tables(c, rope) if rotary else None
    ctx = attention_context(b, c, x, mask, position_ids, tables)
    if prelude is not None:
        x = prelude(b, x)
    for i in range(c.num_hidden_layers):
        p = f"layers.{i}"
        h = rms_norm(
            b, x, weights(f"{p}.input_layernorm.weight"), c.rms_norm_eps, f"{p}.input_layernorm"
        )
        attended = attention_block(b, c, weights, i, h, ctx)
        x = b.node("Add", [x, attended], name=f"{p}/AttnResidual")
        h = rms_norm(
            b,
            x,
            weights(f"{p}.post_attention_layernorm.weight"),
            c.rms_norm_eps,
            f"{p}.post_attention_layernorm",
        )
        x = b.node("Add", [x, mlp_block(b, weights, f"{p}.mlp", h)], name=f"{p}/MlpResidual")
    normed = rms_norm(b, x, weights("norm.weight"), c.rms_norm_eps, "norm")
    b.identity(normed, output)
    return b.build(doc_string=f"Qwen3 backbone, Concat KV cache, rotary tables {rope.describe()}")


@dataclass(frozen=True)
class BackboneFiles:
    graph: Path
    data: Path


def export_backbone(
    config: Qwen3Config,
    weights: Callable[[str], np.ndarray],
    out_dir: Path,
    *,
    name: str = "backbone",
    rope: RopeTables | None = None,
    **graph_options: Any,
) -> BackboneFiles:
    """Write `out_dir/{name}.onnx` and its weights `out_dir/{name}.onnx_data` (module
    docstring); `weights` gives each tensor by Hugging Face name (`state_weights`,
    `checkpoint_weights`); `graph_options` go to `build_backbone_graph`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    graph, data = out_dir / f"{name}.onnx", out_dir / f"{name}.onnx_data"
    with open(data, "wb") as sink:
        model = build_backbone_graph(
            config, weights, sink, data.name, rope or RopeTables(), **graph_options
        )
    save_streamed(model, graph)
    return BackboneFiles(graph, data)


def check_backbone(
    module: Qwen3Backbone,
    graph: Path,
    *,
    batch: int = 2,
    prompt: int = 7,
    steps: int = 3,
    seed: int = 0,
    embeds: Callable[[torch.Generator, int, int], torch.Tensor] | None = None,
) -> dict[str, float]:
    """Run the graph beside `module` on random embeddings (a prefill of `prompt` positions,
    then `steps` single-position steps with the cache): the max |difference| of the hidden
    states and of the cache, over every run. `embeds(generator, batch, new)` draws the inputs
    when the graph takes more than [batch, new, hidden] normal values (e.g. a routing column)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
    c = module.config
    generator = torch.Generator().manual_seed(seed)
    hidden_diff = cache_diff = 0.0
    past: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    feeds_past = {
        PAST.format(i=i, kind=kind): np.zeros(
            (batch, c.num_key_value_heads, 0, c.head_dim), np.float32
        )
        for i in range(c.num_hidden_layers)
        for kind in ("key", "value")
    }
    length = 0
    with torch.no_grad():
        for new in [prompt] + [1] * steps:
            inputs = (
                torch.randn(batch, new, c.hidden_size, generator=generator)
                if embeds is None
                else embeds(generator, batch, new)
            )
            mask = torch.ones(batch, length + new, dtype=torch.int64)
            positions = torch.arange(length, length + new).expand(batch, new).contiguous()
            expected, presents = module(inputs, mask, positions if module.rotary else None, past)
            outputs = session.run(
                None,
                {
                    "inputs_embeds": inputs.numpy(),
                    "attention_mask": mask.numpy(),
                    **({"position_ids": positions.numpy()} if module.rotary else {}),
                    **feeds_past,
                },
            )
            named = dict(zip([o.name for o in session.get_outputs()], outputs, strict=True))
            hidden_diff = max(hidden_diff, float(np.abs(named[HIDDEN] - expected.numpy()).max()))
            for i, (key, value) in enumerate(presents):
                for kind, tensor in (("key", key), ("value", value)):
                    got = named[PRESENT.format(i=i, kind=kind)]
                    cache_diff = max(cache_diff, float(np.abs(got - tensor.numpy()).max()))
                    feeds_past[PAST.format(i=i, kind=kind)] = got
            past, length = presents, length + new
    return {"last_hidden_state": hidden_diff, "present": cache_diff}


__all__ = [
    "HIDDEN",
    "AttentionContext",
    "BackboneFiles",
    "Qwen3Backbone",
    "Qwen3Config",
    "RopeTables",
    "attention_block",
    "attention_context",
    "build_backbone_graph",
    "check_backbone",
    "checkpoint_weights",
    "declare_io",
    "export_backbone",
    "mlp_block",
    "rotary_tables",
    "state_weights",
]

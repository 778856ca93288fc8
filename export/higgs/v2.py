"""Higgs Audio v2 (Llama-3.2-3B + DualFFN audio layers): the checkpoint layouts, the torch
backbone the graph is checked against, and the backbone graph.

Two published layouts are read by name:
* Boson's (`bosonai/higgs-audio-v2-generation-3B-base`, config `model_type` "higgs_audio"):
  `layers.N.*`, `embed_tokens.weight` (or its frozen + trainable halves),
  `audio_codebook_embeddings.weight`, `audio_decoder_proj.audio_lm_head.weight` (or halves);
* the `transformers` one (`model_type` "higgs_audio_v2"): `model.layers.N.*`,
  `model.embed_tokens.weight`, `model.embed_audio_tokens.embed_audio_tokens.weight`,
  `audio_lm_head.weight`.

A DualFFN layer (`layers.N.audio_mlp.*`, `audio_input_layernorm`, `audio_post_attention_layernorm`)
shares attention between text and audio positions and routes each position to the text or the
audio norms and FFN. In the graph each FFN runs only on the rows routed to it (Gather by the
positions' flag, ScatterND back): a decode step, all audio, reads one FFN's weights, not both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch
from torch import nn

from export.backbones.qwen3 import (
    HIDDEN,
    MLP,
    Attention,
    Qwen3Config,
    RMSNorm,
    attention_block,
    attention_context,
    causal_allowed,
    declare_io,
    mlp_block,
)
from export.checkpoint import Checkpoint, CheckpointError
from export.external_weights import StreamingBuilder
from onnx_tts.tools.graph_builder import rms_norm

AUDIO_LAYER_PARTS = ("audio_mlp", "audio_input_layernorm", "audio_post_attention_layernorm")


def _split_halves(checkpoint: Checkpoint, name: str, frozen: str, trainable: str) -> torch.Tensor:
    """A tensor stored whole or as frozen + trainable rows (Boson's partially frozen layers)."""
    if name in checkpoint.names:
        return checkpoint.tensor(name)
    if frozen in checkpoint.names and trainable in checkpoint.names:
        return torch.cat([checkpoint.tensor(frozen), checkpoint.tensor(trainable)], dim=0)
    raise CheckpointError(f"{checkpoint.what} {checkpoint.root} has no tensor {name}")


@dataclass(frozen=True)
class V2Spec:
    """What the exporter needs from a v2 checkpoint: the backbone's sizes (in the shared
    backbone's config type: Llama has the same fields), llama3 rope scaling, which layers are
    DualFFN, codebooks and their size with BOS/EOS, and where each tensor is."""

    dims: Qwen3Config
    rope: Mapping[str, Any]
    dual_layers: frozenset[int]
    codebooks: int
    codebook_size: int  # codes per codebook including stream BOS (1024) and EOS (1025)
    vocab_size: int
    prefix: str  # of backbone tensors ("model." or "")
    layout: str  # "transformers" | "boson"

    def backbone_weights(self, checkpoint: Checkpoint) -> Callable[[str], np.ndarray]:
        return lambda name: checkpoint.tensor(self.prefix + name).numpy()

    def text_table(self, checkpoint: Checkpoint) -> torch.Tensor:
        if self.layout == "transformers":
            return checkpoint.tensor("model.embed_tokens.weight")
        return _split_halves(
            checkpoint,
            "embed_tokens.weight",
            "embed_tokens.embedding_frozen.weight",
            "embed_tokens.embedding_trainable.weight",
        )

    def audio_table(self, checkpoint: Checkpoint) -> torch.Tensor:
        name = (
            "model.embed_audio_tokens.embed_audio_tokens.weight"
            if self.layout == "transformers"
            else "audio_codebook_embeddings.weight"
        )
        return checkpoint.tensor(name, (self.codebooks * self.codebook_size, self.dims.hidden_size))

    def head_weight(self, checkpoint: Checkpoint) -> torch.Tensor:
        if self.layout == "transformers":
            name = "audio_lm_head.weight"
            value = checkpoint.tensor(name)
        else:
            base = "audio_decoder_proj.audio_lm_head"
            value = _split_halves(
                checkpoint,
                f"{base}.weight",
                f"{base}.linear_frozen.weight",
                f"{base}.linear_trainable.weight",
            )
        expected = (self.codebooks * self.codebook_size, self.dims.hidden_size)
        if tuple(value.shape) != expected:
            raise CheckpointError(
                f"{checkpoint.what} {checkpoint.root}: the audio head is {list(value.shape)}, "
                f"expected {list(expected)}"
            )
        return value


def read_v2(checkpoint: Checkpoint) -> V2Spec:
    """The v2 spec of a checkpoint directory in either published layout."""
    config = checkpoint.config
    kind = config.get("model_type")
    if kind == "higgs_audio_v2":
        text, layout, prefix = config, "transformers", "model."
        codebooks = config.get("num_codebooks", 8)
        codebook_size = config.get("codebook_size", 1026)
    elif kind == "higgs_audio":
        text, layout, prefix = config.get("text_config"), "boson", ""
        if not isinstance(text, dict):
            raise CheckpointError(f"{checkpoint.root}/config.json has no text_config")
        if config.get("audio_adapter_type") != "dual_ffn":
            raise CheckpointError(
                f"audio_adapter_type {config.get('audio_adapter_type')!r} is not supported "
                "(the published v2 checkpoint is 'dual_ffn')"
            )
        for flag in ("use_audio_out_self_attention", "audio_embed_avg", "use_rq_transformer"):
            if config.get(flag):
                raise CheckpointError(f"{flag} is set: not part of the published v2 model")
        if not config.get("use_delay_pattern", True):
            raise CheckpointError("use_delay_pattern is false: the engine decodes delayed rows")
        codebooks = config.get("audio_num_codebooks", 8)
        codebook_size = config.get("audio_codebook_size", 1024) + 2
    else:
        raise CheckpointError(
            f"{checkpoint.root}/config.json model_type {kind!r} is not Higgs Audio v2 "
            "('higgs_audio' or 'higgs_audio_v2')"
        )
    if not isinstance(codebooks, int) or not 1 <= codebooks <= 64:
        raise CheckpointError("the number of codebooks must be an integer in [1, 64]")
    if not isinstance(codebook_size, int) or not 3 <= codebook_size <= 1 << 16:
        raise CheckpointError("the codebook size must be an integer in [3, 65536]")
    rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    theta = text.get("rope_theta", rope.get("rope_theta", 500000.0))
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("llama3", "default"):
        raise CheckpointError(f"rope type {kind!r} is not supported (llama3 or default)")
    plain = {k: v for k, v in text.items() if k not in ("rope_scaling", "rope_parameters")}
    dims = Qwen3Config.from_dict({**plain, "rope_theta": theta}, what="v2 text config")
    dual = frozenset(
        i
        for i in range(dims.num_hidden_layers)
        if f"{prefix}layers.{i}.audio_mlp.gate_proj.weight" in checkpoint.names
    )
    return V2Spec(
        dims=dims,
        rope={**rope, "rope_type": kind, "rope_theta": float(theta)},
        dual_layers=dual,
        codebooks=codebooks,
        codebook_size=codebook_size,
        vocab_size=int(text.get("vocab_size", 0)),
        prefix=prefix,
        layout=layout,
    )


def rope_tables(spec: V2Spec, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [positions, head_dim] float32: Llama-3 frequencies (the llama3 rule's
    long-wavelength division and smooth blend), angle = position * inv_freq in float32."""
    dim = spec.dims.head_dim
    inv = 1.0 / (
        spec.rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
    )
    if spec.rope["rope_type"] == "llama3":
        factor = float(spec.rope["factor"])
        low, high = float(spec.rope["low_freq_factor"]), float(spec.rope["high_freq_factor"])
        context = float(spec.rope["original_max_position_embeddings"])
        low_wavelen, high_wavelen = context / low, context / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (context / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv = torch.where(medium, blended, scaled)
    angles = torch.arange(positions, dtype=torch.int64).float()[:, None] * inv[None, :]
    full = torch.cat((angles, angles), dim=-1)
    return full.cos(), full.sin()


# -- torch ------------------------------------------------------------------------------------
class DualFFNLayer(nn.Module):
    def __init__(self, c: Qwen3Config, dual: bool) -> None:
        super().__init__()
        self.self_attn = Attention(c)
        self.self_attn.q_norm = nn.Identity()  # Llama has no per-head q/k norm
        self.self_attn.k_norm = nn.Identity()
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.dual = dual
        if dual:
            self.audio_mlp = MLP(c)
            self.audio_input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
            self.audio_post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, audio, cos, sin, allowed, past):
        h = self.input_layernorm(x)
        if self.dual:
            h = torch.where(audio, self.audio_input_layernorm(x), h)
        attended, present = self.self_attn(h, cos, sin, allowed, past)
        x = x + attended
        out = self.mlp(self.post_attention_layernorm(x))
        if self.dual:
            out = torch.where(audio, self.audio_mlp(self.audio_post_attention_layernorm(x)), out)
        return x + out, present


class DualFFNBackbone(nn.Module):
    """The torch module the v2 backbone graph is checked against (same inputs and outputs)."""

    def __init__(self, spec: V2Spec, positions: int) -> None:
        super().__init__()
        c = spec.dims
        self.config = c
        self.layers = nn.ModuleList(
            DualFFNLayer(c, i in spec.dual_layers) for i in range(c.num_hidden_layers)
        )
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        cos, sin = rope_tables(spec, positions)
        self.register_buffer("cos_table", cos, persistent=False)
        self.register_buffer("sin_table", sin, persistent=False)

    def forward(self, inputs_embeds, attention_mask, position_ids, past=None):
        hidden = self.config.hidden_size
        x, audio = inputs_embeds[..., :hidden], inputs_embeds[..., hidden:] > 0.5
        cos = self.cos_table[position_ids].unsqueeze(1)
        sin = self.sin_table[position_ids].unsqueeze(1)
        allowed = causal_allowed(attention_mask, x.shape[1])
        presents = []
        for index, layer in enumerate(self.layers):
            x, present = layer(x, audio, cos, sin, allowed, None if past is None else past[index])
            presents.append(present)
        return self.norm(x), presents


# -- graph ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Routes:
    """Flat row indices of audio and text positions, and zeros of the flat hidden shape."""

    audio: str
    text: str
    zeros: str
    flat_shape: str


def _routes(b, x: str, audio: str, hidden: int) -> _Routes:
    flat = b.node("Reshape", [x, b.const([-1, hidden])], name="route/Flat")
    flags = b.node("Reshape", [audio, b.const([-1])], name="route/Flags")

    def rows(mask: str, name: str) -> str:  # [n, 1] int64 row indices
        return b.node("Transpose", [b.node("NonZero", [mask], name=f"route/{name}")], perm=[1, 0])

    zeros = b.node("Mul", [flat, b.const(0.0, np.float32)], name="route/Zeros")
    return _Routes(
        rows(flags, "Audio"),
        rows(b.node("Not", [flags], name="route/Not"), "Text"),
        zeros,
        b.node("Shape", [x], name="route/Shape"),
    )


def _routed_ffn(b, c: Qwen3Config, weights, i: int, x: str, routes: _Routes) -> str:
    """Each position's FFN (text or audio norms + MLP) on its own rows only."""
    p = f"layers.{i}"
    flat = b.node("Reshape", [x, b.const([-1, c.hidden_size])], name=f"{p}/route/Flat")
    out = routes.zeros
    for rows, norm, mlp in (
        (routes.text, "post_attention_layernorm", "mlp"),
        (routes.audio, "audio_post_attention_layernorm", "audio_mlp"),
    ):
        picked = b.node("GatherND", [flat, rows], name=f"{p}/{mlp}/Rows")
        h = rms_norm(b, picked, weights(f"{p}.{norm}.weight"), c.rms_norm_eps, f"{p}.{norm}")
        out = b.node(
            "ScatterND", [out, rows, mlp_block(b, weights, f"{p}.{mlp}", h)], name=f"{p}/{mlp}/Put"
        )
    return b.node("Reshape", [out, routes.flat_shape], name=f"{p}/route/Back")


def build_dual_ffn_graph(
    spec: V2Spec, weights: Callable[[str], np.ndarray], sink, data_name: str, positions: int
) -> onnx.ModelProto:
    """The v2 backbone: `inputs_embeds` [B, S, hidden + 1] (the last column each position's
    audio flag), the shared backbone's mask, rotary and attention blocks, DualFFN routing."""
    c = spec.dims
    b = StreamingBuilder("higgs_v2_backbone", sink, data_name)
    x_in, mask, position_ids = declare_io(b, c, input_width=c.hidden_size + 1)
    x = b.node(
        "Slice", [x_in, b.const([0]), b.const([c.hidden_size]), b.const([2])], name="in/Hidden"
    )
    flag = b.node(
        "Slice",
        [x_in, b.const([c.hidden_size]), b.const([c.hidden_size + 1]), b.const([2])],
        name="in/Flag",
    )
    audio = b.node("Greater", [flag, b.const(0.5, np.float32)], name="in/IsAudio")  # [B, S, 1]
    ctx = attention_context(b, c, x, mask, position_ids, rope_tables(spec, positions))
    routes = _routes(b, x, b.node("Squeeze", [audio, b.const([2])]), c.hidden_size)
    for i in range(c.num_hidden_layers):
        p = f"layers.{i}"
        h = rms_norm(
            b, x, weights(f"{p}.input_layernorm.weight"), c.rms_norm_eps, f"{p}.input_layernorm"
        )
        if i in spec.dual_layers:
            audio_h = rms_norm(
                b,
                x,
                weights(f"{p}.audio_input_layernorm.weight"),
                c.rms_norm_eps,
                f"{p}.audio_input_layernorm",
            )
            h = b.node("Where", [audio, audio_h, h], name=f"{p}/InputNorm")
        attended = attention_block(b, c, weights, i, h, ctx, qk_norm=False)
        x = b.node("Add", [x, attended], name=f"{p}/AttnResidual")
        if i in spec.dual_layers:
            ffn = _routed_ffn(b, c, weights, i, x, routes)
        else:
            h = rms_norm(
                b,
                x,
                weights(f"{p}.post_attention_layernorm.weight"),
                c.rms_norm_eps,
                f"{p}.post_attention_layernorm",
            )
            ffn = mlp_block(b, weights, f"{p}.mlp", h)
        x = b.node("Add", [x, ffn], name=f"{p}/MlpResidual")
    normed = rms_norm(b, x, weights("norm.weight"), c.rms_norm_eps, "norm")
    b.identity(normed, HIDDEN)
    return b.build(doc_string="Higgs v2 backbone: Llama-3 + DualFFN, Concat KV cache")


__all__ = [
    "AUDIO_LAYER_PARTS",
    "DualFFNBackbone",
    "V2Spec",
    "build_dual_ffn_graph",
    "read_v2",
    "rope_tables",
]

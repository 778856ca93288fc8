"""The project's own torch modules of the three MOSS-TTS releases, with the published tensor
names, so `Checkpoint.load_into(module)` reads a downloaded checkpoint as it is (float32 math):

* `LocalV15` — `transformer` (Qwen3, with `embed_tokens`), `local_transformer` (GPT-2 style:
  `h.N.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.fc_in, mlp.fc_out}`, `ln_f`, `wpe` when its
  positions are absolute), `audio_embeddings.K` (also the audio heads: tied), and
  `local_text_lm_head` (continue/stop over [assistant slot, audio_end]);
* `LocalV1` — `model.embedding_list.K`, `model.language_model` (Qwen3), `local_transformer`
  (a Qwen3 stack without positions), `speech_embedding_to_local_mlp`,
  `local_to_speech_embedding_mlps.K`, `layer_norm_before_lm_heads.K`, `lm_heads.K`;
* `Delay` — `language_model` (Qwen3, with `embed_tokens`), `emb_ext.K`, `lm_heads.K`.

Each has `embed(ids)` (the backbone input of id rows [B, T, 1 + n_vq], summed in the
published order) and its per-frame part; the generation loops that use them live in the
tests' paraphrase of the published code (tests/moss_tts_published_loop.py).
"""

from __future__ import annotations

import torch
from torch import nn

from export.backbones.qwen3 import Qwen3Backbone, RMSNorm, RopeTables
from export.moss_tts.config import LocalGPT2, MossConfig


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)), no biases (the published MossTTSMLP)."""

    def __init__(self, size_in: int, inner: int, size_out: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(size_in, inner, bias=False)
        self.up_proj = nn.Linear(size_in, inner, bias=False)
        self.down_proj = nn.Linear(inner, size_out, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


# -- Local v1.5's GPT-2 style depth transformer -------------------------------------------------
# Rows of the local rotary table: positions 0..n_vq are all a frame reads; the rest let the
# offline tools step the graph further (quantize's cache check) with the same values.
LOCAL_TABLE_ROWS = 256


def interleaved_rope_tables(local: LocalGPT2, rope: RopeTables) -> tuple[torch.Tensor, ...]:
    """cos, sin [rows, head_dim] of the local block's GPT-J RoPE (pairs (2i, 2i+1) share
    angle position * base^(-2i/D)), computed as published and rounded by `rope`."""
    dim = local.head_dim
    inv_freq = 1.0 / (local.rope_base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    rows = max(local.positions, LOCAL_TABLE_ROWS)
    angles = torch.arange(rows, dtype=torch.int64).float()[:, None] * inv_freq[None]
    return (
        rope.apply(angles.cos().repeat_interleave(2, dim=-1)),
        rope.apply(angles.sin().repeat_interleave(2, dim=-1)),
    )


def rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """Interleaved rotate-half: out[2i] = -x[2i+1], out[2i+1] = x[2i]."""
    even, odd = x[..., ::2], x[..., 1::2]
    return torch.stack((-odd, even), dim=-1).reshape_as(x)


class GPT2Attention(nn.Module):
    def __init__(self, local: LocalGPT2) -> None:
        super().__init__()
        self.local = local
        self.c_attn = nn.Linear(local.hidden, 3 * local.hidden)
        self.c_proj = nn.Linear(local.hidden, local.hidden)


class GPT2MLP(nn.Module):
    def __init__(self, local: LocalGPT2) -> None:
        super().__init__()
        self.fc_in = nn.Linear(local.hidden, local.inner)
        self.fc_out = nn.Linear(local.inner, local.hidden)


class GPT2Block(nn.Module):
    def __init__(self, local: LocalGPT2) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(local.hidden, eps=local.eps)
        self.attn = GPT2Attention(local)
        self.ln_2 = nn.LayerNorm(local.hidden, eps=local.eps)
        self.mlp = GPT2MLP(local)


class GPT2Local(nn.Module):
    """The depth transformer of Local v1.5 over positions 0..n_vq (published
    MossTTSNanoGPT2Model with `wte` = identity), its KV cache [B, heads, t, head_dim] keys after
    RoPE."""

    def __init__(self, local: LocalGPT2, rope: RopeTables | None = None) -> None:
        super().__init__()
        self.local = local
        self.h = nn.ModuleList(GPT2Block(local) for _ in range(local.layers))
        self.ln_f = nn.LayerNorm(local.hidden, eps=local.eps)
        if local.position_type == "absolute":
            self.wpe = nn.Embedding(local.positions, local.hidden)
        cos, sin = interleaved_rope_tables(local, rope or RopeTables())
        self.register_buffer("cos_table", cos, persistent=False)
        self.register_buffer("sin_table", sin, persistent=False)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        past: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """x [B, S, hidden] at `positions` [B, S] after `past`; (ln_f output, presents)."""
        c = self.local
        batch, steps, _ = x.shape
        if c.position_type == "absolute":
            x = x + self.wpe(positions)
        rotary = c.position_type == "rope"
        cos = self.cos_table[positions].unsqueeze(2)  # [B, S, 1, D]
        sin = self.sin_table[positions].unsqueeze(2)
        presents = []
        for index, block in enumerate(self.h):
            q, k, v = block.attn.c_attn(block.ln_1(x)).split(c.hidden, dim=-1)
            q, k, v = (t.view(batch, steps, c.heads, c.head_dim) for t in (q, k, v))
            if rotary:
                q = q * cos + rotate_pairs(q) * sin
                k = k * cos + rotate_pairs(k) * sin
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            if past is not None:
                k = torch.cat([past[index][0], k], dim=2)
                v = torch.cat([past[index][1], v], dim=2)
            total = k.shape[2]
            query = torch.arange(total - steps, total)[:, None]
            allowed = torch.arange(total)[None, :] <= query
            scores = torch.matmul(q, k.transpose(-1, -2)) / (c.head_dim**0.5)
            scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
            context = torch.matmul(torch.softmax(scores, dim=-1), v)
            context = context.transpose(1, 2).reshape(batch, steps, c.hidden)
            x = x + block.attn.c_proj(context)
            inner = nn.functional.silu(block.mlp.fc_in(block.ln_2(x)))
            x = x + block.mlp.fc_out(inner)
            presents.append((k, v))
        return self.ln_f(x), presents


class LocalV15(nn.Module):
    """MOSS-TTS-Local-Transformer-v1.5 (module docstring)."""

    def __init__(self, config: MossConfig, rope: RopeTables | None = None) -> None:
        super().__init__()
        assert config.local_gpt2 is not None
        self.config = config
        self.transformer = Qwen3Backbone(config.backbone, rope, vocab_size=config.vocab)
        self.local_transformer = GPT2Local(config.local_gpt2, rope)
        self.audio_embeddings = nn.ModuleList(
            nn.Embedding(config.codebook, config.hidden) for _ in range(config.n_vq)
        )
        self.local_text_lm_head = nn.Linear(config.hidden, 2, bias=False)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Text embedding plus each code's embedding, pad codes contributing nothing."""
        out = self.transformer.embed_tokens(ids[..., 0])
        for index, table in enumerate(self.audio_embeddings):
            codes = ids[..., index + 1]
            valid = codes.ne(self.config.audio_pad)
            out = out + table(codes.masked_fill(~valid, 0)) * valid.unsqueeze(-1)
        return out

    def audio_logits(self, hidden: torch.Tensor, channel: int) -> torch.Tensor:
        """Channel `channel`'s code logits (the head tied to its embedding)."""
        return hidden @ self.audio_embeddings[channel].weight.T


# -- Local v1 ------------------------------------------------------------------------------------
class _Container(nn.Module):
    """A bare parent module, for the published `model.` prefix."""


class LocalV1(nn.Module):
    """MOSS-TTS-Local-Transformer (v1) (module docstring)."""

    def __init__(self, config: MossConfig, rope: RopeTables | None = None) -> None:
        super().__init__()
        local = config.local_v1
        assert local is not None
        self.config = config
        self.model = _Container()
        self.model.embedding_list = nn.ModuleList(
            [nn.Embedding(config.vocab, config.hidden)]
            + [nn.Embedding(config.codebook + 1, config.hidden) for _ in range(config.n_vq)]
        )
        self.model.language_model = Qwen3Backbone(config.backbone, rope)
        self.local_transformer = Qwen3Backbone(local.qwen3(), rotary=False)
        self.speech_embedding_to_local_mlp = SwiGLU(config.hidden, local.mlp, local.hidden)
        channels = config.channels
        self.local_to_speech_embedding_mlps = nn.ModuleList(
            SwiGLU(local.hidden, local.mlp, config.hidden) for _ in range(channels)
        )
        self.layer_norm_before_lm_heads = nn.ModuleList(
            RMSNorm(config.hidden, 1e-6) for _ in range(channels)
        )
        self.lm_heads = nn.ModuleList(
            [nn.Linear(config.hidden, config.vocab, bias=False)]
            + [
                nn.Linear(config.hidden, config.codebook + 1, bias=False)
                for _ in range(channels - 1)
            ]
        )

    def embed(self, ids: torch.Tensor, channels: int | None = None) -> torch.Tensor:
        """Sum of channels 0..`channels` (n_vq_for_inference; default all), from zero."""
        used = self.config.n_vq if channels is None else channels
        out = torch.zeros(*ids.shape[:-1], self.config.hidden)
        for index in range(1 + used):
            out += self.model.embedding_list[index](ids[..., index])
        return out

    def channel_logits(self, local_hidden: torch.Tensor, channel: int) -> torch.Tensor:
        """Channel `channel`'s logits from the depth transformer's output at its position."""
        h = self.layer_norm_before_lm_heads[channel](
            self.local_to_speech_embedding_mlps[channel](local_hidden)
        )
        return self.lm_heads[channel](h)


# -- Delay ---------------------------------------------------------------------------------------
class Delay(nn.Module):
    """MOSS-TTS (Delay) (module docstring)."""

    def __init__(self, config: MossConfig, rope: RopeTables | None = None) -> None:
        super().__init__()
        self.config = config
        self.language_model = Qwen3Backbone(config.backbone, rope, vocab_size=config.vocab)
        self.emb_ext = nn.ModuleList(
            nn.Embedding(config.codebook + 1, config.hidden) for _ in range(config.n_vq)
        )
        self.lm_heads = nn.ModuleList(
            [nn.Linear(config.hidden, config.vocab, bias=False)]
            + [
                nn.Linear(config.hidden, config.codebook + 1, bias=False)
                for _ in range(config.n_vq)
            ]
        )

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        out = self.language_model.embed_tokens(ids[..., 0])
        for index, table in enumerate(self.emb_ext):
            out = out + table(ids[..., index + 1])
        return out


MODULES = {"local-v1.5": LocalV15, "local-v1": LocalV1, "delay": Delay}


def build_module(config: MossConfig, rope: RopeTables | None = None) -> nn.Module:
    return MODULES[config.variant](config, rope)


__all__ = [
    "MODULES",
    "Delay",
    "GPT2Local",
    "LocalV1",
    "LocalV15",
    "SwiGLU",
    "build_module",
    "interleaved_rope_tables",
    "rotate_pairs",
]

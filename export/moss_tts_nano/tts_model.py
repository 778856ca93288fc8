"""Torch stand-in for the MOSS-TTS-Nano TTS graphs (random weights, published interface).

The modules follow the published export's graph wrappers as documented in
../shared/MOSS_TTS_NANO.md (section 3.1), written here from that description:

* rows `[text_or_slot_id, c0..c15]` are embedded as `wte[text] + sum_c audio_emb_c[c]` with the
  audio pad id (the codebook size) contributing nothing;
* a GPT-2 pre-LN transformer without absolute positions, interleaved-pair RoPE (base 10000),
  gelu_new MLP, keys cached after RoPE in [B, S, H, D] and grown by Concat;
* prefill: positions `cumsum(mask) - 1`, causal & key mask, hidden rows multiplied by the query
  mask after every block and after ln_f; decode: query position = `past_valid_lengths`, a key is
  valid iff `key_pos <= past_valid_lengths`;
* a one-layer local transformer of the same width over 17 positions `[global_hidden, wte(text),
  audio_emb_0(tok0), ..., audio_emb_14(tok14)]`, heads tied to the embeddings;
* the fixed sampled frame: text candidates `[logit 9, logit 7]`, continue iff
  `clip(u) <= softmax[0]`; per channel repetition penalty 1.2 where seen, /0.8, top-k 25 sorted,
  top-p 0.95 on the previous cumulative sum, inverse-CDF draw with `u`.

Stand-in only: `text_bias` adds a constant to the text logit of the assistant slot token (9), so
random weights stop after a controllable number of frames (a large bias never stops).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

PAD_TOKEN_ID = 3
IM_START_TOKEN_ID = 4
IM_END_TOKEN_ID = 5
AUDIO_START_TOKEN_ID = 6
AUDIO_END_TOKEN_ID = 7
AUDIO_USER_SLOT_TOKEN_ID = 8
AUDIO_ASSISTANT_SLOT_TOKEN_ID = 9

# Constants baked into the fixed sampled frame graph (as published).
FIXED_TEXT_TEMPERATURE = 1.0
FIXED_TEXT_TOP_P = 1.0
FIXED_TEXT_TOP_K = 50
FIXED_AUDIO_TEMPERATURE = 0.8
FIXED_AUDIO_TOP_P = 0.95
FIXED_AUDIO_TOP_K = 25
FIXED_AUDIO_REPETITION_PENALTY = 1.2
RANDOM_U_MAX = 0.99999994
ROPE_BASE = 10000.0
LAYER_NORM_EPS = 1e-5


@dataclass(frozen=True)
class TTSDims:
    """Sizes of the TTS graphs; the defaults are the published ones."""

    hidden: int = 768
    global_layers: int = 12
    heads: int = 12
    local_layers: int = 1
    local_heads: int = 12
    n_vq: int = 16
    codebook: int = 1024
    vocab: int = 16384
    # Stand-in: added to the assistant-slot text logit (higher = longer speech).
    continue_bias: float = 4.0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def local_head_dim(self) -> int:
        return self.hidden // self.local_heads

    @property
    def row_width(self) -> int:
        return self.n_vq + 1

    @property
    def audio_pad(self) -> int:
        return self.codebook


def rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """Interleaved rotate-half: out[2i] = -x[2i+1], out[2i+1] = x[2i] (last axis)."""
    odd = (-x[..., 1::2]).unsqueeze(-1)
    even = x[..., ::2].unsqueeze(-1)
    return torch.cat((odd, even), dim=x.dim()).reshape(x.shape)


def rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """RoPE with interleaved pairs on x [B, S, H, D] at positions [B, S]."""
    dim = x.shape[-1]
    inv_freq = 1.0 / (ROPE_BASE ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    freqs = positions.to(torch.float32).unsqueeze(-1) * inv_freq  # [B, S, D/2]
    doubled = torch.cat((freqs.unsqueeze(-1), freqs.unsqueeze(-1)), dim=3).reshape(
        freqs.shape[0], freqs.shape[1], dim
    )
    cos = torch.cos(doubled).unsqueeze(2)
    sin = torch.sin(doubled).unsqueeze(2)
    return x * cos + rotate_pairs(x) * sin


class Block(nn.Module):
    """GPT-2 pre-LN block; attention masks come from the caller."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.ln_1 = nn.LayerNorm(hidden, eps=LAYER_NORM_EPS)
        self.c_attn = nn.Linear(hidden, 3 * hidden)
        self.c_proj = nn.Linear(hidden, hidden)
        self.ln_2 = nn.LayerNorm(hidden, eps=LAYER_NORM_EPS)
        self.fc_in = nn.Linear(hidden, 4 * hidden)
        self.fc_out = nn.Linear(4 * hidden, hidden)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(nn.functional.gelu(self.fc_in(self.ln_2(x)), approximate="tanh"))

    def attend(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Self-attention of x [B, S, hidden] after `past` ([B, P, H, D] keys, values);
        `mask` [B, 1, S, P+S] marks the keys each query sees. Returns (out, keys, values)."""
        batch, steps, hidden = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(hidden, dim=-1)
        q = rope(q.view(batch, steps, self.heads, self.head_dim), positions)
        k = rope(k.view(batch, steps, self.heads, self.head_dim), positions)
        v = v.view(batch, steps, self.heads, self.head_dim)
        if past is not None:
            k = torch.cat([past[0], k], dim=1)
            v = torch.cat([past[1], v], dim=1)
        scores = torch.matmul(q.permute(0, 2, 1, 3), k.permute(0, 2, 3, 1))
        scores = scores / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, dim=-1)
        context = torch.matmul(probs, v.permute(0, 2, 1, 3)).permute(0, 2, 1, 3)
        out = self.c_proj(context.reshape(batch, steps, hidden))
        return out, k, v


class Transformer(nn.Module):
    def __init__(self, hidden: int, heads: int, layers: int) -> None:
        super().__init__()
        self.h = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden, eps=LAYER_NORM_EPS)

    def full(
        self, x: torch.Tensor, valid: torch.Tensor
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Prefill (and the local recompute graph): x [B, S, hidden], valid [B, S] bool."""
        steps = x.shape[1]
        positions = (valid.to(torch.int64).cumsum(dim=-1) - 1).masked_fill(~valid, 0)
        order = torch.arange(steps, dtype=torch.int64)
        causal = order.unsqueeze(0) <= order.unsqueeze(1)  # [query, key]
        mask = causal.unsqueeze(0).unsqueeze(0) & valid[:, None, None, :]
        keep = valid.unsqueeze(-1).to(x.dtype)
        x = x * keep
        presents = []
        for block in self.h:
            out, k, v = block.attend(x, positions, mask, None)
            x = x + out
            x = (x + block.mlp(x)) * keep
            presents.append((k, v))
        return self.ln_f(x) * keep, presents

    def step(
        self,
        x: torch.Tensor,
        past_valid_lengths: torch.Tensor,
        past: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """One new position per row after `past`: x [B, 1, hidden]; the row's query sits at
        position past_valid_lengths and sees keys 0..past_valid_lengths."""
        query = past_valid_lengths.to(torch.int64).view(-1, 1)  # [B, 1]
        total = past[0][0].shape[1] + 1
        keys = torch.arange(total, dtype=torch.int64).view(1, 1, 1, total)
        mask = (keys < query.view(-1, 1, 1, 1) + 1) & (keys <= query.view(-1, 1, 1, 1))
        presents = []
        for block, layer_past in zip(self.h, past, strict=True):
            out, k, v = block.attend(x, query, mask, layer_past)
            x = x + out
            x = x + block.mlp(x)
            presents.append((k, v))
        return self.ln_f(x), presents


class MossTTSStandIn(nn.Module):
    """The weights every TTS graph shares: text and audio embeddings (tied heads), the global
    and the local transformer."""

    def __init__(self, dims: TTSDims) -> None:
        super().__init__()
        self.dims = dims
        std = 2.0 / math.sqrt(dims.hidden)
        self.wte = nn.Embedding(dims.vocab, dims.hidden)
        self.audio_embeddings = nn.ModuleList(
            nn.Embedding(dims.codebook, dims.hidden) for _ in range(dims.n_vq)
        )
        for embedding in (self.wte, *self.audio_embeddings):
            nn.init.normal_(embedding.weight, std=std)
        self.transformer = Transformer(dims.hidden, dims.heads, dims.global_layers)
        self.local_transformer = Transformer(dims.hidden, dims.local_heads, dims.local_layers)
        bias = torch.zeros(dims.vocab)
        bias[AUDIO_ASSISTANT_SLOT_TOKEN_ID] = dims.continue_bias
        self.register_buffer("text_bias", bias)

    # -- embeddings and heads --------------------------------------------------------------
    def embed_rows(self, input_ids: torch.Tensor) -> torch.Tensor:
        ids = input_ids.to(torch.int64)
        x = self.wte(ids[..., 0])
        pad = self.dims.audio_pad
        for channel, embedding in enumerate(self.audio_embeddings):
            codes = ids[..., channel + 1]
            valid = codes != pad
            safe = torch.where(valid, codes, torch.zeros_like(codes))
            x = x + embedding(safe) * valid.unsqueeze(-1).to(x.dtype)
        return x

    def text_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.matmul(hidden, self.wte.weight.t()) + self.text_bias

    def audio_logits(self, hidden: torch.Tensor, channel: int) -> torch.Tensor:
        return torch.matmul(hidden, self.audio_embeddings[channel].weight.t())

    def all_audio_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [B, hidden] -> [B, n_vq, codebook] (every head on the same hidden)."""
        return torch.stack([self.audio_logits(hidden, c) for c in range(self.dims.n_vq)], dim=1)

    def empty_local_past(self, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        shape = (batch, 0, self.dims.local_heads, self.dims.local_head_dim)
        return [(torch.zeros(shape), torch.zeros(shape)) for _ in range(self.dims.local_layers)]


def _flatten(presents: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, ...]:
    return tuple(t for pair in presents for t in pair)


def _pairs(flat: tuple[torch.Tensor, ...]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]


class Prefill(nn.Module):
    def __init__(self, model: MossTTSStandIn) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        hidden, presents = self.model.transformer.full(
            self.model.embed_rows(input_ids), attention_mask.to(torch.bool)
        )
        return (hidden, *_flatten(presents))


class DecodeStep(nn.Module):
    def __init__(self, model: MossTTSStandIn) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, past_valid_lengths: torch.Tensor, *past):
        hidden, presents = self.model.transformer.step(
            self.model.embed_rows(input_ids), past_valid_lengths.reshape(-1), _pairs(past)
        )
        return (hidden, *_flatten(presents))


class LocalDecoder(nn.Module):
    """Recompute graph (static batch 1): all 17 local positions at once."""

    def __init__(self, model: MossTTSStandIn) -> None:
        super().__init__()
        self.model = model

    def forward(self, global_hidden, text_token_id, audio_prefix_token_ids):
        model, dims = self.model, self.model.dims
        pieces = [global_hidden.unsqueeze(1), model.wte(text_token_id.to(torch.int64)).unsqueeze(1)]
        prefix = audio_prefix_token_ids.to(torch.int64)
        for index in range(dims.n_vq - 1):
            codes = prefix[:, index]
            valid = codes != dims.audio_pad
            safe = torch.where(valid, codes, torch.zeros_like(codes))
            embedded = model.audio_embeddings[index](safe) * valid.unsqueeze(-1).to(torch.float32)
            pieces.append(embedded.unsqueeze(1))
        local_inputs = torch.cat(pieces, dim=1)
        valid = torch.ones(local_inputs.shape[:2], dtype=torch.bool)
        hidden, _ = model.local_transformer.full(local_inputs, valid)
        text_logits = model.text_logits(hidden[:, 0])
        audio_logits = torch.stack(
            [model.audio_logits(hidden[:, c + 1], c) for c in range(dims.n_vq)], dim=1
        )
        return text_logits, audio_logits


class LocalCachedStep(nn.Module):
    """One local position per run; step_type 0 = global_hidden, 1 = wte(text), 2 =
    audio_emb[channel_index](audio_token)."""

    def __init__(self, model: MossTTSStandIn) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        global_hidden,
        text_token_id,
        audio_token_id,
        channel_index,
        step_type,
        past_valid_lengths,
        *past,
    ):
        model = self.model
        step = step_type.to(torch.int64).reshape(-1, 1)
        channels = channel_index.to(torch.int64)
        tokens = audio_token_id.to(torch.int64)
        audio = torch.zeros_like(global_hidden)
        for channel, embedding in enumerate(model.audio_embeddings):
            active = channels == channel
            safe = torch.where(active, tokens, torch.zeros_like(tokens))
            audio = audio + embedding(safe) * active.unsqueeze(-1).to(torch.float32)
        text = model.wte(text_token_id.to(torch.int64))
        x = (
            global_hidden * (step == 0).to(torch.float32)
            + text * (step == 1).to(torch.float32)
            + audio * (step == 2).to(torch.float32)
        )
        hidden, presents = model.local_transformer.step(
            x.unsqueeze(1), past_valid_lengths.reshape(-1), _pairs(past)
        )
        last = hidden[:, 0]
        return (model.text_logits(last), model.all_audio_logits(last), *_flatten(presents))


def repetition_penalty(logits, seen, penalty: float):
    penalized = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen.to(torch.bool), penalized, logits)


def sample_top_k_top_p(logits, random_u, temperature: float, top_k: int, top_p: float):
    """Inverse-CDF draw over the sorted top-k of logits / temperature, nucleus on the previous
    cumulative sum; `random_u` [B] in [0, 1)."""
    scores = logits / temperature if temperature != 1.0 else logits
    top_scores, top_indices = torch.topk(scores, k=top_k, dim=1, largest=True, sorted=True)
    if 0.0 < top_p < 1.0:
        probs = torch.softmax(top_scores, dim=1)
        previous = torch.cumsum(probs, dim=1) - probs
        top_scores = top_scores.masked_fill(~(previous < top_p), float("-inf"))
    cdf = torch.cumsum(torch.softmax(top_scores, dim=1), dim=1)
    u = torch.clamp(random_u.reshape(-1, 1), min=0.0, max=RANDOM_U_MAX)
    position = torch.clamp(torch.sum((cdf < u).to(torch.int64), dim=1), max=top_k - 1)
    return top_indices.gather(1, position.unsqueeze(1)).squeeze(1)


class LocalFixedSampledFrame(nn.Module):
    """A whole frame in one run: the continue decision and 16 sampled codes."""

    def __init__(self, model: MossTTSStandIn) -> None:
        super().__init__()
        self.model = model

    def forward(self, global_hidden, repetition_seen_mask, assistant_random_u, audio_random_u):
        model, dims = self.model, self.model.dims
        batch = global_hidden.shape[0]
        lengths = torch.zeros(global_hidden.shape[:1], dtype=torch.int64)
        past = model.empty_local_past(batch)
        hidden, past = model.local_transformer.step(global_hidden.unsqueeze(1), lengths, past)
        text_logits = model.text_logits(hidden[:, 0])
        candidates = torch.stack(
            [text_logits[:, AUDIO_ASSISTANT_SLOT_TOKEN_ID], text_logits[:, AUDIO_END_TOKEN_ID]],
            dim=1,
        )
        if FIXED_TEXT_TEMPERATURE != 1.0:
            candidates = candidates / FIXED_TEXT_TEMPERATURE
        continue_probability = torch.softmax(candidates, dim=1)[:, 0]
        u = torch.clamp(assistant_random_u.reshape(-1), min=0.0, max=RANDOM_U_MAX)
        keep_going = u <= continue_probability
        text_token = torch.where(
            keep_going,
            torch.full_like(lengths, AUDIO_ASSISTANT_SLOT_TOKEN_ID),
            torch.full_like(lengths, AUDIO_END_TOKEN_ID),
        )
        x = model.wte(text_token).unsqueeze(1)
        tokens = []
        for channel in range(dims.n_vq):
            lengths = lengths + 1
            hidden, past = model.local_transformer.step(x, lengths, past)
            logits = repetition_penalty(
                model.audio_logits(hidden[:, 0], channel),
                repetition_seen_mask[:, channel],
                FIXED_AUDIO_REPETITION_PENALTY,
            )
            token = sample_top_k_top_p(
                logits,
                audio_random_u[:, channel],
                FIXED_AUDIO_TEMPERATURE,
                FIXED_AUDIO_TOP_K,
                FIXED_AUDIO_TOP_P,
            )
            tokens.append(token.to(torch.int32))
            if channel + 1 < dims.n_vq:
                x = model.audio_embeddings[channel](token).unsqueeze(1)
        return keep_going.to(torch.int32).reshape(batch, 1), torch.stack(tokens, dim=1)


class LocalGreedyFrame(nn.Module):
    """Not in the official export (its wrapper exists but is never exported); built only on
    request, to exercise the published dispatch order."""

    def __init__(self, model: MossTTSStandIn) -> None:
        super().__init__()
        self.model = model

    def forward(self, global_hidden, repetition_seen_mask, repetition_penalty_value):
        model, dims = self.model, self.model.dims
        batch = global_hidden.shape[0]
        lengths = torch.zeros(global_hidden.shape[:1], dtype=torch.int64)
        past = model.empty_local_past(batch)
        hidden, past = model.local_transformer.step(global_hidden.unsqueeze(1), lengths, past)
        text_logits = model.text_logits(hidden[:, 0])
        keep_going = (
            text_logits[:, AUDIO_ASSISTANT_SLOT_TOKEN_ID] >= text_logits[:, AUDIO_END_TOKEN_ID]
        )
        text_token = torch.where(
            keep_going,
            torch.full_like(lengths, AUDIO_ASSISTANT_SLOT_TOKEN_ID),
            torch.full_like(lengths, AUDIO_END_TOKEN_ID),
        )
        x = model.wte(text_token).unsqueeze(1)
        penalty = repetition_penalty_value.reshape(-1, 1)
        tokens = []
        for channel in range(dims.n_vq):
            lengths = lengths + 1
            hidden, past = model.local_transformer.step(x, lengths, past)
            logits = model.audio_logits(hidden[:, 0], channel)
            penalized = torch.where(logits < 0, logits * penalty, logits / penalty)
            seen = repetition_seen_mask[:, channel].to(torch.bool)
            token = torch.argmax(torch.where(seen, penalized, logits), dim=1)
            tokens.append(token.to(torch.int32))
            if channel + 1 < dims.n_vq:
                x = model.audio_embeddings[channel](token).unsqueeze(1)
        return keep_going.to(torch.int32).reshape(batch, 1), torch.stack(tokens, dim=1)


__all__ = [
    "AUDIO_ASSISTANT_SLOT_TOKEN_ID",
    "AUDIO_END_TOKEN_ID",
    "AUDIO_START_TOKEN_ID",
    "AUDIO_USER_SLOT_TOKEN_ID",
    "IM_END_TOKEN_ID",
    "IM_START_TOKEN_ID",
    "PAD_TOKEN_ID",
    "DecodeStep",
    "LocalCachedStep",
    "LocalDecoder",
    "LocalFixedSampledFrame",
    "LocalGreedyFrame",
    "MossTTSStandIn",
    "Prefill",
    "TTSDims",
]

"""The project's own torch modules of MOSS-Audio-Tokenizer v1 and v2 (read from the published
modeling code, not run from it), with the published parameter names, so a checkpoint loads by
name: `encoder.{i}.…`, `quantizer.…`, `decoder.{i}.…`.

Per transformer layer (pre-norm): x += scale_1 * attn(norm1(x)); x += scale_2 * linear2(gelu(
linear1(norm2(x)))). Attention: fused bias-free qkv `self_attn.in_projs.0`, RoPE on q and k
with interleaved pairs (the published `apply_rope`: frequencies exp(-2i ln(max_period) / D)),
a causal window of `context` steps (a key at distance 0 .. context - 1 before the query).

Tensors are kept time-major [B, T, C] between stages; a patch folds `size` consecutive steps
into channels exactly as the published channel-first reshape does (channel c * size + j holds
step t * size + j of channel c).

Streaming (`decode_step`): every decoder transformer has one position offset per stream and
each attention layer keeps the keys and values of the `context` steps before the chunk; a
chunk attends to those and to itself under the same window, so decoding in any chunking
gives the whole-sequence decode (up to float rounding). The published ring cache of exactly
`context` entries overwrites keys a multi-step chunk still needs (vLLM-Omni's copy adds
head-room for that reason); this cache never does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from export.moss_audio_tokenizer.config import CodecSpec, PatchSpec, QuantizerSpec, TransformerSpec


def rope_frequencies(head_dim: int, max_period: float) -> torch.Tensor:
    steps = torch.arange(head_dim // 2, dtype=torch.float32)
    return torch.exp(steps * (-math.log(max_period) * 2 / head_dim))


def pair_rotation(head_dim: int) -> torch.Tensor:
    """R with (x @ R)[2i] = -x[2i + 1] and (x @ R)[2i + 1] = x[2i]: one matmul that moves
    values exactly (every output is one input, the other terms exact zeros), so
    x * cos + (x @ R) * sin is bit for bit the published pairwise rotation."""
    rotation = torch.zeros(head_dim, head_dim)
    index = torch.arange(0, head_dim, 2)
    rotation[index + 1, index] = -1.0
    rotation[index, index + 1] = 1.0
    return rotation


@dataclass
class Window:
    """What every layer of one transformer shares for one call: sizes, the RoPE tables of the
    queries' positions (cos, sin [B, 1, T, D], each frequency twice) and which keys each query
    sees (`allowed` [B, 1, T, K])."""

    batch: Any
    steps: Any
    cos: torch.Tensor
    sin: torch.Tensor
    allowed: torch.Tensor


class Attention(nn.Module):
    def __init__(self, spec: TransformerSpec) -> None:
        super().__init__()
        d = spec.d_model
        self.heads, self.head_dim, self.context = spec.heads, spec.head_dim, spec.context
        self.in_projs = nn.ModuleList([nn.Linear(d, 3 * d, bias=False)])
        self.out_projs = nn.ModuleList([nn.Linear(d, d, bias=False)])
        self.register_buffer("rotation", pair_rotation(spec.head_dim), persistent=False)

    def forward(
        self,
        x: torch.Tensor,
        window: Window,
        cache: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """x [B, T, d]. With `cache` (keys, values [B, H, context, D] of the `context` steps
        before the queries), also returns the next cache."""
        qkv = self.in_projs[0](x).reshape(window.batch, window.steps, 3, self.heads, -1)
        qkv = qkv.permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        q = q * window.cos + torch.matmul(q, self.rotation) * window.sin
        k = k * window.cos + torch.matmul(k, self.rotation) * window.sin
        next_cache = None
        if cache is not None:
            k = torch.cat([cache[0], k], dim=2)
            v = torch.cat([cache[1], v], dim=2)
            next_cache = (k[:, :, -self.context :], v[:, :, -self.context :])
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~window.allowed, float("-inf"))
        mixed = torch.matmul(torch.softmax(scores, dim=-1), v)
        mixed = mixed.transpose(1, 2).reshape(window.batch, window.steps, -1)
        return self.out_projs[0](mixed), next_cache


class LayerScale(nn.Module):
    def __init__(self, width: int, init: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((width,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class Layer(nn.Module):
    def __init__(self, spec: TransformerSpec) -> None:
        super().__init__()
        d = spec.d_model
        self.self_attn = Attention(spec)
        self.norm1 = nn.LayerNorm(d, eps=1e-5)
        self.norm2 = nn.LayerNorm(d, eps=1e-5)
        self.linear1 = nn.Linear(d, spec.ffn, bias=False)
        self.linear2 = nn.Linear(spec.ffn, d, bias=False)
        scaled = spec.layer_scale is not None
        self.layer_scale_1 = LayerScale(d, spec.layer_scale or 0.0) if scaled else nn.Identity()
        self.layer_scale_2 = LayerScale(d, spec.layer_scale or 0.0) if scaled else nn.Identity()

    def forward(self, x, window: Window, cache=None):
        update, next_cache = self.self_attn(self.norm1(x), window, cache)
        x = x + self.layer_scale_1(update)
        x = x + self.layer_scale_2(self.linear2(F.gelu(self.linear1(self.norm2(x)))))
        return x, next_cache


class Stack(nn.Module):
    """The `transformer` of a ProjectedTransformer (holds `layers.{j}`)."""

    def __init__(self, spec: TransformerSpec) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer(spec) for _ in range(spec.layers))


class ProjectedTransformer(nn.Module):
    def __init__(self, spec: TransformerSpec) -> None:
        super().__init__()
        self.spec = spec
        d = spec.d_model
        self.input_proj = nn.Linear(spec.input_dim, d, bias=False) if spec.input_proj else None
        self.transformer = Stack(spec)
        self.output_proj = nn.Linear(d, spec.output_dim, bias=False) if spec.output_proj else None
        self.register_buffer(
            "freqs", rope_frequencies(spec.head_dim, spec.max_period), persistent=False
        )

    def window(self, x: torch.Tensor, positions: torch.Tensor, cached: bool) -> Window:
        """Positions [B, T] of the queries; with `cached`, the keys are the `context` steps
        before them (positions < 0: none yet) and then the queries themselves."""
        batch, steps = x.shape[0], x.shape[1]
        angles = positions.to(torch.float32).unsqueeze(-1) * self.freqs  # [B, T, D / 2]
        cos, sin = torch.cos(angles), torch.sin(angles)
        cos = torch.stack([cos, cos], dim=-1).reshape(batch, 1, steps, -1)
        sin = torch.stack([sin, sin], dim=-1).reshape(batch, 1, steps, -1)
        keys = positions
        context = self.spec.context
        if cached:
            before = positions[:, :1] + torch.arange(-context, 0, dtype=torch.int64)
            keys = torch.cat([before, positions], dim=1)
        delta = positions.unsqueeze(-1) - keys.unsqueeze(-2)
        allowed = (keys.unsqueeze(-2) >= 0) & (delta >= 0) & (delta < context)
        return Window(batch, steps, cos, sin, allowed.unsqueeze(1))

    def forward(self, x, positions, caches=None):
        """x [B, T, input_dim] at positions [B, T] -> [B, T, output_dim]; with `caches` (one
        per layer) also the next caches."""
        if self.input_proj is not None:
            x = self.input_proj(x)
        window = self.window(x, positions, caches is not None)
        next_caches = []
        for index, layer in enumerate(self.transformer.layers):
            x, cache = layer(x, window, None if caches is None else caches[index])
            next_caches.append(cache)
        if self.output_proj is not None:
            x = self.output_proj(x)
        return x, next_caches


def fold_steps(x: torch.Tensor, size: int) -> torch.Tensor:
    """Encoder patch: [B, T, C] -> [B, T / size, C * size]."""
    batch, steps, width = x.shape
    folded = x.reshape(batch, steps // size, size, width).permute(0, 1, 3, 2)
    return folded.reshape(batch, steps // size, width * size)


def unfold_steps(x: torch.Tensor, size: int) -> torch.Tensor:
    """Decoder patch: [B, L, C * size] -> [B, L * size, C]."""
    batch, steps, width = x.shape
    unfolded = x.reshape(batch, steps, width // size, size).permute(0, 1, 3, 2)
    return unfolded.reshape(batch, steps * size, width // size)


class Patch(nn.Module):
    """A PatchedPretransform: no weights; the entry keeps its index in the module list."""

    def __init__(self, spec: PatchSpec) -> None:
        super().__init__()
        self.size = spec.size


def weight_normed_conv(inputs: int, outputs: int) -> nn.Conv1d:
    """A 1x1 convolution stored as published: `parametrizations.weight.original0` (g, [out,
    1, 1]), `…original1` (v, [out, in, 1]) and `bias`."""
    return nn.utils.parametrizations.weight_norm(nn.Conv1d(inputs, outputs, kernel_size=1))


class LookupQuantizer(nn.Module):
    """One residual stage: project to the codebook space, nearest code (after L2
    normalisation for LFQ), project back."""

    def __init__(self, spec: QuantizerSpec) -> None:
        super().__init__()
        self.normalized = spec.normalized
        dims = (spec.rvq_dim, spec.codebook_dim)
        self.in_proj = weight_normed_conv(*dims) if spec.projected else nn.Identity()
        self.out_proj = weight_normed_conv(*reversed(dims)) if spec.projected else nn.Identity()
        self.codebook = nn.Embedding(spec.codebook_size, spec.codebook_dim)

    def lookup(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, T] -> [B, rvq_dim, T]."""
        return self.out_proj(self.codebook(codes).transpose(1, 2))

    def forward(self, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """residual [B, rvq_dim, T] -> (its quantized value, codes [B, T])."""
        z = self.in_proj(residual)
        flat = z.transpose(1, 2)  # [B, T, codebook_dim]
        book = self.codebook.weight
        if self.normalized:
            flat, book = F.normalize(flat, dim=-1), F.normalize(book, dim=-1)
        distance = flat.pow(2).sum(-1, keepdim=True) - 2 * flat @ book.t() + book.pow(2).sum(-1)
        codes = torch.argmax(-distance, dim=-1)
        picked = self.codebook(codes).transpose(1, 2)
        if self.normalized:  # the published straight-through sum, rounding included
            picked = z + (picked - z)
        return self.out_proj(picked), codes


class ResidualQuantizer(nn.Module):
    def __init__(self, spec: QuantizerSpec) -> None:
        super().__init__()
        self.spec = spec
        self.input_proj = (
            weight_normed_conv(spec.input_dim, spec.rvq_dim)
            if spec.input_dim != spec.rvq_dim
            else nn.Identity()
        )
        self.output_proj = (
            weight_normed_conv(spec.rvq_dim, spec.output_dim)
            if spec.rvq_dim != spec.output_dim
            else nn.Identity()
        )
        self.quantizers = nn.ModuleList(LookupQuantizer(spec) for _ in range(spec.quantizers))
        self.register_buffer("table", None, persistent=False)  # see fold_lookup
        self.register_buffer("offsets", None, persistent=False)

    def encode(self, latent: torch.Tensor, n_q: int) -> torch.Tensor:
        """latent [B, T, input_dim] -> codes [n_q, B, T]."""
        residual = self.input_proj(latent.transpose(1, 2))
        codes = []
        for quantizer in self.quantizers[:n_q]:
            quantized, index = quantizer(residual)
            residual = residual - quantized
            codes.append(index)
        return torch.stack(codes)

    def fold_lookup(self, n_q: int) -> None:
        """Precompute every stage's out_proj(codebook) (weight norm already folded), so a
        decode is one gather over a [n_q x codebook_size, rvq_dim] table and a sum (the export
        does this; the reference keeps the published per-stage lookups)."""
        size = self.spec.codebook_size
        codes = torch.arange(size).unsqueeze(0)
        with torch.no_grad():
            tables = [q.lookup(codes)[0].T for q in self.quantizers[:n_q]]
        self.table = torch.cat(tables)
        self.offsets = torch.arange(n_q, dtype=torch.int64).view(n_q, 1, 1) * size

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [n_q, B, T] -> latent [B, T, output_dim]."""
        if self.table is not None:
            summed = self.table[codes + self.offsets].sum(0)  # [B, T, rvq_dim]
            return self.output_proj(summed.transpose(1, 2)).transpose(1, 2)
        total = self.quantizers[0].lookup(codes[0])
        for index in range(1, codes.shape[0]):
            total = total + self.quantizers[index].lookup(codes[index])
        return self.output_proj(total).transpose(1, 2)


def _stage(spec: PatchSpec | TransformerSpec) -> nn.Module:
    return Patch(spec) if isinstance(spec, PatchSpec) else ProjectedTransformer(spec)


def _positions(batch: int, steps: int, start: torch.Tensor | None = None) -> torch.Tensor:
    positions = torch.arange(steps, dtype=torch.int64).unsqueeze(0).expand(batch, steps)
    return positions if start is None else positions + start.unsqueeze(1)


class AudioTokenizer(nn.Module):
    """encode(wav [B, C, N], n_q) -> codes [n_q, B, N // hop]; decode(codes) -> [B, C, F*hop];
    decode_step(codes, offsets, caches) -> (audio, next offsets, next caches)."""

    def __init__(self, spec: CodecSpec) -> None:
        super().__init__()
        self.spec = spec
        self.encoder = nn.ModuleList(_stage(s) for s in spec.encoder)
        self.quantizer = ResidualQuantizer(spec.quantizer)
        self.decoder = nn.ModuleList(_stage(s) for s in spec.decoder)

    # -- waveform layout ---------------------------------------------------------------------
    def _to_stream(self, wav: torch.Tensor) -> torch.Tensor:
        """[B, C, N] -> time-major [B, N', C'] as the first encoder stage sees it."""
        stream = wav.transpose(1, 2)
        if self.spec.interleave:  # L R L R ... as one signal
            return stream.reshape(wav.shape[0], -1, 1)
        return stream

    def _from_stream(self, stream: torch.Tensor) -> torch.Tensor:
        channels = self.spec.channels
        if self.spec.interleave:
            stream = stream.reshape(stream.shape[0], -1, channels)
        return stream.transpose(1, 2)

    # -- encode --------------------------------------------------------------------------------
    def encode(self, wav: torch.Tensor, n_q: int | None = None) -> torch.Tensor:
        """The codes of the floor(N / hop) whole frames (the published valid length; the
        encoder is causal, so the cut-off tail changes none of them)."""
        hop = self.spec.hop
        frames = wav.shape[-1] // hop
        x = self._to_stream(wav[..., : frames * hop])
        for stage in self.encoder:
            if isinstance(stage, Patch):
                x = fold_steps(x, stage.size)
            else:
                x, _ = stage(x, _positions(x.shape[0], x.shape[1]))
        return self.quantizer.encode(x, n_q or self.spec.quantizer.quantizers)

    # -- decode --------------------------------------------------------------------------------
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        x = self.quantizer.decode(codes)
        for stage in self.decoder:
            if isinstance(stage, Patch):
                x = unfold_steps(x, stage.size)
            else:
                x, _ = stage(x, _positions(x.shape[0], x.shape[1]))
        return self._from_stream(x)

    def decode_step(
        self,
        codes: torch.Tensor,
        offsets: list[torch.Tensor],
        caches: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]]:
        """New frames codes [n_q, B, S] with each decoder transformer's offset [B] (steps
        decoded so far) and each attention layer's cache -> (audio [B, C, S * hop], next
        offsets, next caches)."""
        x = self.quantizer.decode(codes)
        next_offsets, next_caches = [], []
        transformer, layer = 0, 0
        for stage in self.decoder:
            if isinstance(stage, Patch):
                x = unfold_steps(x, stage.size)
                continue
            offset = offsets[transformer]
            count = len(stage.transformer.layers)
            x, new = stage(
                x, _positions(x.shape[0], x.shape[1], offset), caches[layer : layer + count]
            )
            next_offsets.append(offset + x.shape[1])
            next_caches.extend(new)
            transformer, layer = transformer + 1, layer + count
        return self._from_stream(x), next_offsets, next_caches

    def initial_state(
        self, batch: int = 1
    ) -> tuple[list[torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]]:
        """A fresh stream's offsets (0) and caches (zeros: every cached position is < 0)."""
        offsets, caches = [], []
        for _, spec, _ in self.spec.decoder_transformers():
            offsets.append(torch.zeros(batch, dtype=torch.int64))
            shape = (batch, spec.heads, spec.context, spec.head_dim)
            caches.extend((torch.zeros(shape), torch.zeros(shape)) for _ in range(spec.layers))
        return offsets, caches


__all__ = [
    "AudioTokenizer",
    "ProjectedTransformer",
    "ResidualQuantizer",
    "fold_steps",
    "pair_rotation",
    "rope_frequencies",
    "unfold_steps",
]

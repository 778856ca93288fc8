"""Torch stand-in for the MOSS audio tokenizer graphs (random weights, published interface).

Decoder, as described in ../shared/MOSS_TTS_NANO.md section 3.2: residual codebooks (16 x 1024)
summed per frame -> patch x4 -> causal transformer (4 layers, 50 Hz) -> patch x2 -> 2 layers
(100 Hz) -> patch x2 -> 2 layers (200 Hz) -> patch x2 -> 4 layers (400 Hz) -> 240 interleaved
stereo values per step -> [B, 2, frames * 3840]. Attention is windowed: a key is seen iff its
position is >= 0 and 0 <= query - key < context. Streaming keeps, per attention layer, the last
`context` keys/values/positions (initial positions -1, everything else 0) and one position
offset per transformer, so decoding in any chunking equals decoding at once.

The encoder (stand-in) frames the waveform in hops of 3840 stereo samples, projects each frame
and quantises it with the same residual codebooks (16 codes per frame).

`decode_full` computes the windowed attention block-banded (blocks of `context` queries against
their own and the previous block's keys), so memory grows with frames x context, not frames^2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from export.moss_tts_nano.tts_model import rotate_pairs

ROPE_BASE = 10000.0


@dataclass(frozen=True)
class CodecDims:
    """Sizes of the codec graphs; the defaults are the published ones."""

    d_model: int = 256
    heads: int = 4
    layers: tuple[int, ...] = (4, 2, 2, 4)
    contexts: tuple[int, ...] = (500, 800, 1200, 1600)
    patches: tuple[int, ...] = (4, 2, 2, 2)  # upsampling before each transformer
    out_values: int = 240  # interleaved stereo values per step of the last transformer
    n_q: int = 16
    codebook: int = 1024
    sample_rate: int = 48000
    channels: int = 2

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def downsample(self) -> int:
        """Stereo samples per code frame."""
        return math.prod(self.patches) * self.out_values // self.channels

    def cache_layout(self) -> list[tuple[int, int, int]]:
        """(transformer index, layer index, context) of every attention cache, in order."""
        return [
            (t, layer, context)
            for t, (layers, context) in enumerate(zip(self.layers, self.contexts, strict=True))
            for layer in range(layers)
        ]


def codec_rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Interleaved-pair RoPE on x [B, H, S, D] at positions [S]."""
    dim = x.shape[-1]
    inv_freq = 1.0 / (ROPE_BASE ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    freqs = positions.to(torch.float32).unsqueeze(-1) * inv_freq  # [S, D/2]
    doubled = torch.cat((freqs.unsqueeze(-1), freqs.unsqueeze(-1)), dim=2).reshape(
        freqs.shape[0], dim
    )
    return x * torch.cos(doubled) + rotate_pairs(x) * torch.sin(doubled)


class CodecLayer(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, d_model // heads
        self.norm_1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.norm_2 = nn.LayerNorm(d_model)
        self.fc_in = nn.Linear(d_model, 4 * d_model)
        self.fc_out = nn.Linear(4 * d_model, d_model)
        self.scale_1 = nn.Parameter(torch.full((d_model,), 0.5))
        self.scale_2 = nn.Parameter(torch.full((d_model,), 0.5))

    def _heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch, steps, width = x.shape
        q, k, v = self.qkv(self.norm_1(x)).split(width, dim=-1)

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, steps, self.heads, self.head_dim).permute(0, 2, 1, 3)

        return split(q), split(k), split(v)

    def _finish(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        batch, _, steps, _ = context.shape
        merged = context.permute(0, 2, 1, 3).reshape(batch, steps, self.heads * self.head_dim)
        x = x + self.out(merged) * self.scale_1
        mlp = self.fc_out(nn.functional.gelu(self.fc_in(self.norm_2(x))))
        return x + mlp * self.scale_2

    def _attend(self, q, keys, values, query_positions, key_positions, window: int):
        delta = query_positions.unsqueeze(-1) - key_positions.unsqueeze(-2)
        mask = (key_positions.unsqueeze(-2) >= 0) & (delta >= 0) & (delta < window)
        scores = torch.matmul(q, keys.transpose(-1, -2)) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        return torch.matmul(torch.softmax(scores, dim=-1), values)

    def stream(self, x, positions, cache_k, cache_v, cache_pos, window: int):
        """x [1, S, d] at positions [S] after a cache of `window` entries ([1, H, W, D] keys and
        values, [1, W] positions): returns (x, new keys, new values, new positions)."""
        q, k, v = self._heads(x)
        q, k = codec_rope(q, positions), codec_rope(k, positions)
        keys = torch.cat([cache_k, k], dim=2)
        values = torch.cat([cache_v, v], dim=2)
        key_positions = torch.cat([cache_pos, positions.to(torch.int32).unsqueeze(0)], dim=1)
        context = self._attend(q, keys, values, positions, key_positions.to(torch.int64), window)
        return (
            self._finish(x, context),
            keys[:, :, -window:],
            values[:, :, -window:],
            key_positions[:, -window:],
        )

    def banded(self, x, window: int):
        """Windowed causal attention over all of x [1, S, d] from position 0, in blocks of
        `window` queries that see their own and the previous block."""
        q, k, v = self._heads(x)
        steps = x.shape[1]
        positions = torch.arange(steps, dtype=torch.int64)
        q, k = codec_rope(q, positions), codec_rope(k, positions)
        padded = (steps + window - 1) // window * window
        blocks = padded // window

        def pad(t: torch.Tensor) -> torch.Tensor:
            filler = torch.zeros((1, self.heads, padded - steps, self.head_dim))
            return torch.cat([t, filler], dim=2).view(1, self.heads, blocks, window, self.head_dim)

        def with_previous(t: torch.Tensor) -> torch.Tensor:
            first = torch.zeros_like(t[:, :, :1])  # shape-derived: no constant in the graph
            previous = torch.cat([first, t[:, :, :-1]], dim=2)
            return torch.cat([previous, t], dim=3)  # [1, H, blocks, 2W, D]

        q_blocks, k_blocks, v_blocks = pad(q), pad(k), pad(v)
        all_positions = torch.arange(padded, dtype=torch.int64).view(blocks, window)
        previous_positions = torch.cat(
            [torch.full((1, window), -1, dtype=torch.int64), all_positions[:-1]], dim=0
        )
        key_positions = torch.cat([previous_positions, all_positions], dim=1)  # [blocks, 2W]
        context = self._attend(
            q_blocks,
            with_previous(k_blocks),
            with_previous(v_blocks),
            all_positions,
            key_positions,
            window,
        )
        context = context.reshape(1, self.heads, padded, self.head_dim)[:, :, :steps]
        return self._finish(x, context)


class CodecStandIn(nn.Module):
    def __init__(self, dims: CodecDims) -> None:
        super().__init__()
        self.dims = dims
        d = dims.d_model
        self.codebooks = nn.Parameter(torch.randn(dims.n_q, dims.codebook, d) / math.sqrt(d))
        self.encode_in = nn.Linear(dims.channels * dims.downsample, d)
        self.ups = nn.ModuleList(nn.Linear(d, p * d) for p in dims.patches)
        self.stages = nn.ModuleList(
            nn.ModuleList(CodecLayer(d, dims.heads) for _ in range(layers))
            for layers in dims.layers
        )
        self.to_audio = nn.Linear(d, dims.out_values)

    def dequantize(self, codes: torch.Tensor) -> torch.Tensor:
        ids = codes.to(torch.int64)
        x = torch.zeros(ids.shape[0], ids.shape[1], self.dims.d_model)
        for q in range(self.dims.n_q):
            x = x + nn.functional.embedding(ids[..., q], self.codebooks[q])
        return x

    def upsample(self, x: torch.Tensor, stage: int) -> torch.Tensor:
        batch, steps, d = x.shape
        return self.ups[stage](x).reshape(batch, steps * self.dims.patches[stage], d)

    def waveform(self, x: torch.Tensor) -> torch.Tensor:
        """[1, S, d] at the last rate -> [1, channels, S * out_values / channels]."""
        values = torch.tanh(self.to_audio(x)).reshape(x.shape[0], -1, self.dims.channels)
        return values.permute(0, 2, 1)


class DecodeFull(nn.Module):
    def __init__(self, codec: CodecStandIn) -> None:
        super().__init__()
        self.codec = codec

    def forward(self, audio_codes, audio_code_lengths):
        codec = self.codec
        x = codec.dequantize(audio_codes)
        for stage, layers in enumerate(codec.stages):
            x = codec.upsample(x, stage)
            for layer in layers:
                x = layer.banded(x, codec.dims.contexts[stage])
        lengths = audio_code_lengths.to(torch.int32) * codec.dims.downsample
        return codec.waveform(x), lengths


class DecodeStep(nn.Module):
    """Streaming decode: inputs audio_codes, audio_code_lengths, transformer_offset_0..3, then
    per cache (offset, keys, values, positions); outputs in the same order with `_out_`."""

    def __init__(self, codec: CodecStandIn) -> None:
        super().__init__()
        self.codec = codec

    def forward(self, audio_codes, audio_code_lengths, *state):
        codec, dims = self.codec, self.codec.dims
        stages = len(dims.layers)
        offsets, caches = state[:stages], state[stages:]
        x = codec.dequantize(audio_codes)
        new_offsets, new_caches = [], []
        cache_index = 0
        for stage, layers in enumerate(codec.stages):
            x = codec.upsample(x, stage)
            steps = x.shape[1]
            positions = offsets[stage].to(torch.int64) + torch.arange(steps, dtype=torch.int64)
            new_offsets.append(offsets[stage] + steps)
            for layer in layers:
                offset, keys, values, key_positions = caches[4 * cache_index : 4 * cache_index + 4]
                x, keys, values, key_positions = layer.stream(
                    x, positions, keys, values, key_positions, dims.contexts[stage]
                )
                new_caches += [offset + steps, keys, values, key_positions]
                cache_index += 1
        lengths = audio_code_lengths.to(torch.int32) * dims.downsample
        return (codec.waveform(x), lengths, *new_offsets, *new_caches)


class Encode(nn.Module):
    def __init__(self, codec: CodecStandIn) -> None:
        super().__init__()
        self.codec = codec

    def forward(self, waveform, input_lengths):
        codec, dims = self.codec, self.codec.dims
        hop = dims.downsample
        batch, channels, samples = waveform.shape
        frames = (samples + hop - 1) // hop
        filler = torch.zeros((batch, channels, frames * hop - samples))
        framed = torch.cat([waveform, filler], dim=2).reshape(batch, channels, frames, hop)
        x = torch.tanh(codec.encode_in(framed.permute(0, 2, 1, 3).reshape(batch, frames, -1)))
        codes = []
        for q in range(dims.n_q):
            book = codec.codebooks[q]
            distance = (x * x).sum(-1, keepdim=True) - 2 * x @ book.t() + (book * book).sum(-1)
            index = torch.argmin(distance, dim=-1)
            codes.append(index.to(torch.int32))
            x = x - nn.functional.embedding(index, book)
        code_lengths = (input_lengths.to(torch.int64) + hop - 1) // hop
        return torch.stack(codes, dim=-1), code_lengths.to(torch.int32)


__all__ = ["CodecDims", "CodecStandIn", "DecodeFull", "DecodeStep", "Encode"]

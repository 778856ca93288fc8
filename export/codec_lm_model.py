"""The codec-lm family's TTS model in torch: encoder (+ RVQ), embeddings, LM, vocoder.

Weights are random (seeded); the RVQ codebooks are fitted by k-means on encoder latents of
synthetic audio so the quantiser is a real residual one. These modules are the ground truth the
hand-written ONNX graphs (export/build_codec_lm.py) are tested against.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from export.onnx_graphs import DecoderLMSpec
from onnx_tts.tools.graph_builder import rotary_tables


@dataclass(frozen=True)
class CodecLMConfig:
    sample_rate: int = 24000
    hop_length: int = 480  # 50 frames per second
    codebooks: int = 4
    codebook_size: int = 256
    latent_dim: int = 64
    encoder_channels: int = 128
    speaker_dim: int = 128
    text_vocab_size: int = 52  # the character tokenizer's vocabulary (see build_codec_lm)
    hidden_size: int = 256
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    # 512, not 768: lm.onnx and lm_concat.onnx each carry a full copy of the weights and the
    # whole bundle must stay under 25 MB in fp32.
    ffn_size: int = 512
    max_positions: int = 4096
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    vocoder_channels: int = 96
    vocoder_kernel: int = 2
    vocoder_dilations: tuple[int, ...] = (1, 2, 4)

    @property
    def audio_vocab_size(self) -> int:
        return self.codebook_size + 3  # + pad, bos, eos

    @property
    def pad_id(self) -> int:
        return self.codebook_size

    @property
    def bos_id(self) -> int:
        return self.codebook_size + 1

    @property
    def eos_id(self) -> int:
        return self.codebook_size + 2

    @property
    def vocoder_receptive_field_frames(self) -> int:
        """Left context (frames) one output frame depends on."""
        return sum(d * (self.vocoder_kernel - 1) for d in self.vocoder_dilations)

    def lm_spec(self) -> DecoderLMSpec:
        return DecoderLMSpec(
            layers=self.layers,
            hidden_size=self.hidden_size,
            heads=self.heads,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            ffn_size=self.ffn_size,
            vocab_size=self.audio_vocab_size,
            output_heads=self.codebooks,
            norm="rms",
            rotary=True,
            rope_theta=self.rope_theta,
            max_positions=self.max_positions,
            norm_eps=self.norm_eps,
        )


LEAKY_SLOPE = 0.1


class ResidualVectorQuantizer(nn.Module):
    """K stages: nearest codeword of the residual (squared distance), subtract, repeat."""

    def __init__(self, stages: int, size: int, dim: int) -> None:
        super().__init__()
        self.codebooks = nn.Parameter(torch.randn(stages, size, dim) * 0.1)

    def quantize(self, latent: torch.Tensor, stages: int | None = None) -> torch.Tensor:
        """latent [B,F,D] -> codes i64 [B,F,stages]."""
        residual = latent
        codes = []
        for codebook in self.codebooks[: stages or self.codebooks.shape[0]]:
            # ||r - c||^2 without the ||r||^2 term, which does not change the argmin.
            distance = (codebook * codebook).sum(-1) - 2.0 * residual @ codebook.T
            index = distance.argmin(-1)
            codes.append(index)
            residual = residual - codebook[index]
        return torch.stack(codes, dim=-1)

    def dequantize(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B,F,k] (k <= stages) -> sum of the chosen codewords [B,F,D]."""
        return sum(self.codebooks[k][codes[..., k]] for k in range(codes.shape[-1]))

    @torch.no_grad()
    def fit(self, latents: torch.Tensor, iterations: int, generator: torch.Generator) -> None:
        """k-means on each stage's residual, stage after stage. latents [N,D]."""
        residual = latents
        size = self.codebooks.shape[1]
        for stage in range(self.codebooks.shape[0]):
            start = torch.randperm(residual.shape[0], generator=generator)[:size]
            centroids = residual[start].clone()
            for _ in range(iterations):
                distance = (centroids * centroids).sum(-1) - 2.0 * residual @ centroids.T
                assign = distance.argmin(-1)
                sums = torch.zeros_like(centroids).index_add_(0, assign, residual)
                counts = torch.bincount(assign, minlength=size).to(residual.dtype)
                used = counts > 0
                centroids[used] = sums[used] / counts[used, None]
            self.codebooks[stage] = centroids
            distance = (centroids * centroids).sum(-1) - 2.0 * residual @ centroids.T
            residual = residual - centroids[distance.argmin(-1)]


class CodecLMEncoder(nn.Module):
    """audio [B,N] -> codes i64 [B,F,K], speaker_embedding [B,E]; F = N // hop."""

    def __init__(self, cfg: CodecLMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        c = cfg.encoder_channels
        self.frame_proj = nn.Linear(cfg.hop_length, c)
        # Speech at an RMS of ~0.1 should drive the tanh into its useful range, not sit at 0.
        nn.init.normal_(self.frame_proj.weight, std=1.0 / (0.1 * cfg.hop_length**0.5))
        self.context = nn.Conv1d(c, c, kernel_size=3, padding=1)
        self.to_latent = nn.Linear(c, cfg.latent_dim)
        self.rvq = ResidualVectorQuantizer(cfg.codebooks, cfg.codebook_size, cfg.latent_dim)
        self.speaker = nn.Linear(cfg.latent_dim, cfg.speaker_dim)

    def latent(self, audio: torch.Tensor) -> torch.Tensor:
        """audio [B,N] -> continuous latent [B,F,latent_dim] (before quantisation)."""
        hop = self.cfg.hop_length
        frames = audio.shape[1] // hop
        x = audio[:, : frames * hop].reshape(audio.shape[0], frames, hop)
        x = torch.tanh(self.frame_proj(x))
        x = F.leaky_relu(self.context(x.transpose(1, 2)), LEAKY_SLOPE).transpose(1, 2)
        return self.to_latent(x)

    def forward(self, audio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        latent = self.latent(audio)
        codes = self.rvq.quantize(latent)
        speaker = self.speaker(latent.mean(dim=1))
        speaker = speaker / torch.sqrt((speaker * speaker).sum(-1, keepdim=True) + 1e-12)
        return codes, speaker


class CodecLMEmbed(nn.Module):
    """text ids, audio codes (sum over codebooks), speaker embedding -> LM input vectors."""

    def __init__(self, cfg: CodecLMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.text = nn.Parameter(torch.randn(cfg.text_vocab_size, cfg.hidden_size) * 0.5)
        self.audio = nn.Parameter(
            torch.randn(cfg.codebooks, cfg.audio_vocab_size, cfg.hidden_size) * 0.5
        )
        self.speaker = nn.Linear(cfg.speaker_dim, cfg.hidden_size)

    def forward(
        self, text_ids: torch.Tensor, audio_codes: torch.Tensor, speaker_embedding: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        text_embeds = self.text[text_ids]
        audio_embeds = sum(self.audio[k][audio_codes[..., k]] for k in range(self.cfg.codebooks))
        if not isinstance(audio_embeds, torch.Tensor):  # zero codebooks cannot happen; typing
            raise AssertionError("no codebooks")
        return text_embeds, audio_embeds, self.speaker(speaker_embedding).unsqueeze(1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        # Not all ones, so a graph that forgot the scale would fail parity.
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + self.eps) * self.weight


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Half-split rotary on x [B,H,S,Dh] with cos/sin [S or B,S, Dh/2]."""
    half = x.shape[-1] // 2
    cos = torch.cat([cos, cos], dim=-1).unsqueeze(-3)
    sin = torch.cat([sin, sin], dim=-1).unsqueeze(-3)
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class DecoderLayer(nn.Module):
    def __init__(self, cfg: CodecLMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, hd = cfg.hidden_size, cfg.head_dim
        self.attn_norm = RMSNorm(d, cfg.norm_eps)
        self.q_proj = nn.Linear(d, cfg.heads * hd, bias=False)
        self.k_proj = nn.Linear(d, cfg.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, cfg.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.heads * hd, d, bias=False)
        self.mlp_norm = RMSNorm(d, cfg.norm_eps)
        self.gate = nn.Linear(d, cfg.ffn_size, bias=False)
        self.up = nn.Linear(d, cfg.ffn_size, bias=False)
        self.down = nn.Linear(cfg.ffn_size, d, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor],
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        cfg = self.cfg
        b, s, _ = x.shape
        h = self.attn_norm(x)
        q = self.q_proj(h).view(b, s, cfg.heads, cfg.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(b, s, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(b, s, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        k = torch.cat([past[0], k], dim=2)
        v = torch.cat([past[1], v], dim=2)
        total, past_len = k.shape[2], k.shape[2] - s
        groups = cfg.heads // cfg.kv_heads
        scores = q @ k.repeat_interleave(groups, dim=1).transpose(-1, -2) / cfg.head_dim**0.5
        query_pos = torch.arange(past_len, total).unsqueeze(1)
        causal = torch.arange(total).unsqueeze(0) <= query_pos
        scores = scores.masked_fill(~causal, float("-inf"))
        ctx = scores.softmax(-1) @ v.repeat_interleave(groups, dim=1)
        x = x + self.o_proj(ctx.transpose(1, 2).reshape(b, s, cfg.heads * cfg.head_dim))
        h = self.mlp_norm(x)
        x = x + self.down(F.silu(self.gate(h)) * self.up(h))
        return x, (k, v)


class CodecLMDecoder(nn.Module):
    """Pre-norm decoder-only transformer, GQA, RMSNorm, SwiGLU, rotary; K output heads."""

    def __init__(self, cfg: CodecLMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.layers))
        self.final_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.head = nn.Linear(cfg.hidden_size, cfg.codebooks * cfg.audio_vocab_size, bias=False)
        cos, sin = rotary_tables(cfg.max_positions, cfg.head_dim, cfg.rope_theta)
        self.register_buffer("cos_table", torch.from_numpy(cos), persistent=False)
        self.register_buffer("sin_table", torch.from_numpy(sin), persistent=False)

    def empty_cache(self, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        shape = (batch, self.cfg.kv_heads, 0, self.cfg.head_dim)
        return [(torch.zeros(shape), torch.zeros(shape)) for _ in self.layers]

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        past: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """inputs_embeds [B,S,D] after a cache of P positions -> logits [B,S,K,V], presents."""
        b, s, _ = inputs_embeds.shape
        past = past if past is not None else self.empty_cache(b)
        start = past[0][0].shape[2]
        cos, sin = self.cos_table[start : start + s], self.sin_table[start : start + s]
        x = inputs_embeds
        presents = []
        for layer, layer_past in zip(self.layers, past, strict=True):
            x, present = layer(x, layer_past, cos, sin)
            presents.append(present)
        logits = self.head(self.final_norm(x))
        return logits.view(b, s, self.cfg.codebooks, self.cfg.audio_vocab_size), presents


class CausalConvBlock(nn.Module):
    """x + leaky_relu(conv(x)) with left padding only, so frame t sees frames <= t."""

    def __init__(self, channels: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.left_pad = dilation * (kernel - 1)
        self.conv = nn.Conv1d(channels, channels, kernel_size=kernel, dilation=dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.leaky_relu(self.conv(F.pad(x, (self.left_pad, 0))), LEAKY_SLOPE)


class CodecLMVocoder(nn.Module):
    """codes [B,F,K] -> RVQ dequantise -> causal dilated convs -> waveform [B, F*hop]."""

    def __init__(self, cfg: CodecLMConfig, rvq: ResidualVectorQuantizer) -> None:
        super().__init__()
        self.cfg = cfg
        self.rvq = rvq  # shared with the encoder: the codes mean the same thing on both sides
        c = cfg.vocoder_channels
        self.inp = nn.Linear(cfg.latent_dim, c)
        self.blocks = nn.ModuleList(
            CausalConvBlock(c, cfg.vocoder_kernel, d) for d in cfg.vocoder_dilations
        )
        self.out = nn.Linear(c, cfg.hop_length)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        b, frames, _ = codes.shape
        x = F.leaky_relu(self.inp(self.rvq.dequantize(codes)), LEAKY_SLOPE).transpose(1, 2)
        for block in self.blocks:
            x = block(x)
        samples = torch.tanh(self.out(x.transpose(1, 2))) * 0.5
        return samples.reshape(b, frames * self.cfg.hop_length)


class CodecLMModel(nn.Module):
    def __init__(self, cfg: CodecLMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = CodecLMEncoder(cfg)
        self.embed = CodecLMEmbed(cfg)
        self.lm = CodecLMDecoder(cfg)
        self.vocoder = CodecLMVocoder(cfg, self.encoder.rvq)


def synthetic_audio(
    count: int, seconds: float, sample_rate: int, generator: torch.Generator
) -> torch.Tensor:
    """Deterministic speech-like-ish signals (harmonic tones, noise bursts, silence) [count, N]."""
    n = int(seconds * sample_rate)
    t = torch.arange(n, dtype=torch.float64) / sample_rate
    clips = []
    for _ in range(count):
        f0 = 80.0 + 220.0 * torch.rand((), generator=generator, dtype=torch.float64)
        vibrato = 1.0 + 0.05 * torch.sin(2 * np.pi * 5.0 * t)
        phase = 2 * np.pi * torch.cumsum(f0 * vibrato, 0) / sample_rate
        harmonics = sum(torch.sin(h * phase) / h for h in range(1, 6))
        envelope = 0.5 + 0.5 * torch.sin(
            2 * np.pi * (1.0 + 3.0 * torch.rand((), generator=generator, dtype=torch.float64)) * t
        )
        noise = torch.randn(n, generator=generator, dtype=torch.float64)
        mix = torch.rand((), generator=generator, dtype=torch.float64)
        gain = 0.05 + 0.4 * torch.rand((), generator=generator, dtype=torch.float64)
        clip = gain * (mix * harmonics * envelope / 2.0 + (1 - mix) * noise * envelope / 3.0)
        clips.append(clip.float())
    return torch.stack(clips)


def build_codec_lm_model(seed: int = 0, cfg: CodecLMConfig | None = None) -> CodecLMModel:
    """Seeded random init, then k-means RVQ codebooks on synthetic audio latents."""
    cfg = cfg or CodecLMConfig()
    torch.manual_seed(seed)
    model = CodecLMModel(cfg).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    audio = synthetic_audio(48, 2.0, cfg.sample_rate, generator)
    with torch.no_grad():
        latents = model.encoder.latent(audio)
        model.encoder.rvq.fit(latents.reshape(-1, cfg.latent_dim), 10, generator)
        # Whiten the per-clip mean latent before the speaker projection (folded into its
        # weights), so different voices give different directions rather than a shared offset.
        clip_means = latents.mean(dim=1)
        center, spread = clip_means.mean(dim=0), clip_means.std(dim=0) + 1e-6
        speaker = model.encoder.speaker
        speaker.weight.div_(spread)
        speaker.bias.copy_(-(speaker.weight @ center))
    return model

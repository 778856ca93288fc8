"""The Higgs audio tokenizer (higgs-audio-v2-tokenizer) as the project's own torch modules.

Written from the published architecture (boson-ai/higgs-audio `higgs_audio_tokenizer.py`, the
`transformers` 5.23 `higgs_audio_v2_tokenizer`, `dac` and `hubert` models): module and
parameter names follow the checkpoint's tensor names, so weights load by name
(`Checkpoint.load_into`). Nothing here imports `transformers`.

    encode: 24 kHz audio -> sinc resampling to 16 kHz -> HuBERT (mean of every hidden state,
            every second frame) -> semantic conv encoder; DAC acoustic encoder on the 24 kHz
            audio; concat -> fc -> residual VQ (nearest codebook row, N stages) -> codes
    decode: codes -> sum of the stages' project_out(codebook rows) -> fc2 -> DAC decoder
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from export.checkpoint import CheckpointError

# Every size a config can set is bounded far above the published ones.
MAX_CHANNELS = 8192
MAX_LAYERS = 64
MAX_QUANTIZERS = 64
MAX_CODEBOOK = 1 << 16


def _int(config: dict[str, Any], key: str, low: int = 1, high: int = MAX_CHANNELS) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise CheckpointError(f"codec config {key} must be an integer in [{low}, {high}]")
    return value


def _ints(config: dict[str, Any], key: str, high: int = MAX_CHANNELS) -> tuple[int, ...]:
    value = config.get(key)
    if (
        not isinstance(value, list)
        or not 0 < len(value) <= MAX_LAYERS
        or not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= high for v in value)
    ):
        raise CheckpointError(f"codec config {key} must be a list of positive integers")
    return tuple(value)


@dataclass(frozen=True)
class HubertDims:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    conv_dim: tuple[int, ...]
    conv_kernel: tuple[int, ...]
    conv_stride: tuple[int, ...]
    pos_kernel: int
    pos_groups: int
    eps: float
    conv_bias: bool


@dataclass(frozen=True)
class CodecConfig:
    """The codec config.json (the `transformers` layout of higgs-audio-v2-tokenizer)."""

    sample_rate: int
    semantic_rate: int
    downsample_factor: int
    codebook_size: int
    codebook_dim: int
    quantizers: int
    kernel_size: int
    unit_kernel_size: int
    strides: tuple[int, ...]
    channel_ratios: tuple[int, ...]
    block_dilations: tuple[int, ...]
    encoder_hidden: int
    decoder_hidden: int
    acoustic_hidden: int
    ratios: tuple[int, ...]
    up_ratios: tuple[int, ...]
    hubert: HubertDims

    @property
    def hop_length(self) -> int:
        return math.prod(self.ratios)

    @property
    def frame_rate(self) -> int:
        return math.ceil(self.sample_rate / self.hop_length)

    @property
    def hidden(self) -> int:
        return self.acoustic_hidden + self.hubert.hidden

    @property
    def semantic_step(self) -> int:
        """Every how many HuBERT frames one codec frame is taken."""
        return int(
            self.hop_length / (self.sample_rate / self.semantic_rate) / self.downsample_factor
        )

    @classmethod
    def parse(cls, config: dict[str, Any]) -> CodecConfig:
        if config.get("model_type") != "higgs_audio_v2_tokenizer":
            raise CheckpointError(
                "the codec config is not a higgs_audio_v2_tokenizer config.json (the "
                "Hugging Face layout of bosonai/higgs-audio-v2-tokenizer); point --codec at it"
            )
        acoustic, semantic = (
            config.get("acoustic_model_config"),
            config.get("semantic_model_config"),
        )
        if not isinstance(acoustic, dict) or not isinstance(semantic, dict):
            raise CheckpointError("codec config lacks acoustic_model_config/semantic_model_config")
        bandwidths = config.get("target_bandwidths")
        if not isinstance(bandwidths, list) or not bandwidths:
            raise CheckpointError("codec config target_bandwidths must be a non-empty list")
        if semantic.get("feat_extract_norm", "group") != "group" or semantic.get(
            "do_stable_layer_norm", False
        ):
            raise CheckpointError("codec semantic model: only HuBERT-base layouts are supported")
        hubert = HubertDims(
            hidden=_int(semantic, "hidden_size"),
            layers=_int(semantic, "num_hidden_layers", 1, MAX_LAYERS),
            heads=_int(semantic, "num_attention_heads", 1, 256),
            intermediate=_int(semantic, "intermediate_size", 1, 4 * MAX_CHANNELS),
            conv_dim=_ints(semantic, "conv_dim"),
            conv_kernel=_ints(semantic, "conv_kernel", 64),
            conv_stride=_ints(semantic, "conv_stride", 64),
            pos_kernel=_int(semantic, "num_conv_pos_embeddings", 1, 1024),
            pos_groups=_int(semantic, "num_conv_pos_embedding_groups", 1, 1024),
            eps=float(semantic.get("layer_norm_eps", 1e-5)),
            conv_bias=bool(semantic.get("conv_bias", False)),
        )
        if not len(hubert.conv_dim) == len(hubert.conv_kernel) == len(hubert.conv_stride):
            raise CheckpointError(
                "codec semantic conv_dim/conv_kernel/conv_stride differ in length"
            )
        sample_rate = _int(config, "sample_rate", 8000, 192000)
        ratios = _ints(acoustic, "downsampling_ratios", 64)
        frame_rate = math.ceil(sample_rate / math.prod(ratios))
        bits = math.ceil(math.log2(_int(config, "codebook_size", 2, MAX_CODEBOOK)))
        quantizers = int(1000 * float(bandwidths[-1]) // (frame_rate * bits))
        if not 1 <= quantizers <= MAX_QUANTIZERS:
            raise CheckpointError(f"codec config gives {quantizers} quantizers")
        parsed = cls(
            sample_rate=sample_rate,
            semantic_rate=_int(config, "semantic_sample_rate", 8000, 192000),
            downsample_factor=_int(config, "downsample_factor", 1, 4096),
            codebook_size=_int(config, "codebook_size", 2, MAX_CODEBOOK),
            codebook_dim=_int(config, "codebook_dim"),
            quantizers=quantizers,
            kernel_size=_int(config, "kernel_size", 1, 64),
            unit_kernel_size=_int(config, "unit_kernel_size", 1, 64),
            strides=_ints(config, "strides", 64),
            channel_ratios=_ints(config, "channel_ratios", 64),
            block_dilations=_ints(config, "block_dilations", 64),
            encoder_hidden=_int(acoustic, "encoder_hidden_size"),
            decoder_hidden=_int(acoustic, "decoder_hidden_size"),
            acoustic_hidden=_int(acoustic, "hidden_size"),
            ratios=ratios,
            up_ratios=_ints(acoustic, "upsampling_ratios", 64),
            hubert=hubert,
        )
        if parsed.strides != (1,) * len(parsed.strides) or parsed.channel_ratios != (1,) * len(
            parsed.channel_ratios
        ):
            raise CheckpointError("codec semantic encoder: only stride 1, ratio 1 blocks exist")
        if parsed.semantic_step < 1:
            raise CheckpointError("codec config gives no semantic frame step")
        return parsed


# -- resampling -----------------------------------------------------------------------------
def sinc_resample_kernel(orig: int, new: int, zeros: int = 6, rolloff: float = 0.99):
    """Windowed-sinc (Hann) polyphase kernel [new, 1, taps] of a orig -> new resampling and
    its left padding, computed in float32 as the published codec's resampler computes it."""
    gcd = math.gcd(orig, new)
    orig, new = orig // gcd, new // gcd
    base = min(orig, new) * rolloff
    width = math.ceil(zeros * orig / base)
    index = torch.arange(-width, width + orig, dtype=torch.float32)[None, None] / orig
    t = torch.arange(0, -new, -1, dtype=torch.float32)[:, None, None] / new + index
    t *= base
    t = t.clamp(-zeros, zeros)
    window = torch.cos(t * math.pi / zeros / 2) ** 2
    t *= math.pi
    kernel = torch.where(t == 0, torch.tensor(1.0), t.sin() / t)
    kernel *= window * (base / orig)
    return kernel, width, orig, new


class Resampler(nn.Module):
    """[B, N] at `orig` Hz -> [B, ceil(N * new / orig)] at `new` Hz."""

    def __init__(self, orig: int, new: int) -> None:
        super().__init__()
        kernel, self.width, self.orig, self.new = sinc_resample_kernel(orig, new)
        self.register_buffer("kernel", kernel, persistent=False)

    def forward(self, audio: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        padded = F.pad(audio, (self.width, self.width + self.orig))
        out = F.conv1d(padded[:, None], self.kernel, stride=self.orig)
        out = out.transpose(1, 2).reshape(audio.shape[0], -1)
        target = torch.div(length * self.new + self.orig - 1, self.orig, rounding_mode="floor")
        return out[:, :target]


# -- HuBERT ---------------------------------------------------------------------------------
class _ConvLayer(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, stride: int, bias: bool, norm: bool):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride=stride, bias=bias)
        self.layer_norm = nn.GroupNorm(cout, cout, affine=True) if norm else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        return F.gelu(x)


class _FeatureExtractor(nn.Module):
    def __init__(self, d: HubertDims) -> None:
        super().__init__()
        dims = (1, *d.conv_dim)
        self.conv_layers = nn.ModuleList(
            _ConvLayer(
                dims[i], dims[i + 1], d.conv_kernel[i], d.conv_stride[i], d.conv_bias, i == 0
            )
            for i in range(len(d.conv_dim))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, None]
        for layer in self.conv_layers:
            x = layer(x)
        return x


class _FeatureProjection(nn.Module):
    def __init__(self, d: HubertDims) -> None:
        super().__init__()
        self.layer_norm = nn.LayerNorm(d.conv_dim[-1], eps=d.eps)
        self.projection = nn.Linear(d.conv_dim[-1], d.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection(self.layer_norm(x))


class _PositionalConv(nn.Module):
    def __init__(self, d: HubertDims) -> None:
        super().__init__()
        self.conv = nn.Conv1d(
            d.hidden, d.hidden, d.pos_kernel, padding=d.pos_kernel // 2, groups=d.pos_groups
        )
        self.remove = 1 if d.pos_kernel % 2 == 0 else 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x.transpose(1, 2))
        if self.remove:
            y = y[:, :, : -self.remove]
        return F.gelu(y).transpose(1, 2)


class _Attention(nn.Module):
    def __init__(self, d: HubertDims) -> None:
        super().__init__()
        self.heads, self.head_dim = d.heads, d.hidden // d.heads
        self.q_proj = nn.Linear(d.hidden, d.hidden)
        self.k_proj = nn.Linear(d.hidden, d.hidden)
        self.v_proj = nn.Linear(d.hidden, d.hidden)
        self.out_proj = nn.Linear(d.hidden, d.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        shape = (b, t, self.heads, self.head_dim)
        q = self.q_proj(x).view(shape).transpose(1, 2)
        k = self.k_proj(x).view(shape).transpose(1, 2)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(2, 3)) * self.head_dim**-0.5
        ctx = torch.matmul(scores.softmax(-1), v).transpose(1, 2).reshape(b, t, -1)
        return self.out_proj(ctx)


class _FeedForward(nn.Module):
    def __init__(self, d: HubertDims) -> None:
        super().__init__()
        self.intermediate_dense = nn.Linear(d.hidden, d.intermediate)
        self.output_dense = nn.Linear(d.intermediate, d.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output_dense(F.gelu(self.intermediate_dense(x)))


class _EncoderLayer(nn.Module):
    """Post-norm transformer layer (HuBERT-base)."""

    def __init__(self, d: HubertDims) -> None:
        super().__init__()
        self.attention = _Attention(d)
        self.layer_norm = nn.LayerNorm(d.hidden, eps=d.eps)
        self.feed_forward = _FeedForward(d)
        self.final_layer_norm = nn.LayerNorm(d.hidden, eps=d.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer_norm(x + self.attention(x))
        return self.final_layer_norm(x + self.feed_forward(x))


class _Encoder(nn.Module):
    def __init__(self, d: HubertDims) -> None:
        super().__init__()
        self.pos_conv_embed = _PositionalConv(d)
        self.layer_norm = nn.LayerNorm(d.hidden, eps=d.eps)
        self.layers = nn.ModuleList(_EncoderLayer(d) for _ in range(d.layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The mean of every hidden state (the normed input of layer 0 and each output)."""
        x = self.layer_norm(x + self.pos_conv_embed(x))
        total = x
        for layer in self.layers:
            x = layer(x)
            total = total + x
        return total / (len(self.layers) + 1)


class Hubert(nn.Module):
    def __init__(self, d: HubertDims) -> None:
        super().__init__()
        self.feature_extractor = _FeatureExtractor(d)
        self.feature_projection = _FeatureProjection(d)
        self.encoder = _Encoder(d)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        features = self.feature_extractor(audio).transpose(1, 2)
        return self.encoder(self.feature_projection(features))


# -- semantic conv encoder ------------------------------------------------------------------
class _SemanticUnit(nn.Module):
    def __init__(self, channels: int, kernel: int, dilation: int) -> None:
        super().__init__()
        pad = ((kernel - 1) // 2) * dilation
        self.conv1 = nn.Conv1d(
            channels, channels, kernel, padding=pad, dilation=dilation, bias=False
        )
        self.conv2 = nn.Conv1d(channels, channels, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(F.elu(self.conv1(F.elu(x))))


class _SemanticBlock(nn.Module):
    def __init__(self, c: CodecConfig) -> None:
        super().__init__()
        channels = c.hubert.hidden
        self.res_units = nn.ModuleList(
            _SemanticUnit(channels, c.unit_kernel_size, d) for d in c.block_dilations
        )
        self.conv = nn.Conv1d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for unit in self.res_units:
            x = unit(x)
        return self.conv(x)


class SemanticEncoder(nn.Module):
    def __init__(self, c: CodecConfig) -> None:
        super().__init__()
        h = c.hubert.hidden
        self.conv = nn.Conv1d(h, h, c.kernel_size, padding=c.kernel_size // 2, bias=False)
        self.conv_blocks = nn.ModuleList(_SemanticBlock(c) for _ in c.strides)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        for block in self.conv_blocks:
            x = block(x)
        return x


# -- DAC --------------------------------------------------------------------------------------
class Snake(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + (self.alpha + 1e-9).reciprocal() * torch.sin(self.alpha * x).pow(2)


class _ResidualUnit(nn.Module):
    def __init__(self, channels: int, dilation: int) -> None:
        super().__init__()
        self.snake1 = Snake(channels)
        self.conv1 = nn.Conv1d(channels, channels, 7, dilation=dilation, padding=3 * dilation)
        self.snake2 = Snake(channels)
        self.conv2 = nn.Conv1d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.snake2(self.conv1(self.snake1(x))))


class _EncoderBlock(nn.Module):
    def __init__(self, channels: int, stride: int) -> None:
        super().__init__()
        half = channels // 2
        self.res_unit1 = _ResidualUnit(half, 1)
        self.res_unit2 = _ResidualUnit(half, 3)
        self.res_unit3 = _ResidualUnit(half, 9)
        self.snake1 = Snake(half)
        self.conv1 = nn.Conv1d(
            half, channels, 2 * stride, stride=stride, padding=math.ceil(stride / 2)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.res_unit3(self.res_unit2(self.res_unit1(x)))
        return self.conv1(self.snake1(x))


class DacEncoder(nn.Module):
    def __init__(self, c: CodecConfig) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(1, c.encoder_hidden, 7, padding=3)
        self.block = nn.ModuleList(
            _EncoderBlock(c.encoder_hidden * 2 ** (i + 1), stride)
            for i, stride in enumerate(c.ratios)
        )
        top = c.encoder_hidden * 2 ** len(c.ratios)
        self.snake1 = Snake(top)
        self.conv2 = nn.Conv1d(top, c.acoustic_hidden, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        for block in self.block:
            x = block(x)
        return self.conv2(self.snake1(x))

    def frames(self, length: torch.Tensor) -> torch.Tensor:
        """Output length for an input of `length` samples (integer tensor)."""
        for module in self.modules():
            if isinstance(module, nn.Conv1d):
                (k,), (s,), (p,), (d,) = (
                    module.kernel_size,
                    module.stride,
                    module.padding,
                    module.dilation,
                )
                length = torch.div(length + 2 * p - d * (k - 1) - 1, s, rounding_mode="floor") + 1
        return length


class _DecoderBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.snake1 = Snake(cin)
        self.conv_t1 = nn.ConvTranspose1d(
            cin,
            cout,
            2 * stride,
            stride=stride,
            padding=math.ceil(stride / 2),
            output_padding=stride % 2,
        )
        self.res_unit1 = _ResidualUnit(cout, 1)
        self.res_unit2 = _ResidualUnit(cout, 3)
        self.res_unit3 = _ResidualUnit(cout, 9)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_t1(self.snake1(x))
        return self.res_unit3(self.res_unit2(self.res_unit1(x)))


class DacDecoder(nn.Module):
    """DAC decoder without the final tanh (as the Higgs codec uses it)."""

    def __init__(self, c: CodecConfig) -> None:
        super().__init__()
        h = c.decoder_hidden
        self.conv1 = nn.Conv1d(c.acoustic_hidden, h, 7, padding=3)
        self.block = nn.ModuleList(
            _DecoderBlock(h // 2**i, h // 2 ** (i + 1), stride)
            for i, stride in enumerate(c.up_ratios)
        )
        out = h // 2 ** len(c.up_ratios)
        self.snake1 = Snake(out)
        self.conv2 = nn.Conv1d(out, 1, 7, padding=3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        for block in self.block:
            x = block(x)
        return self.conv2(self.snake1(x))


# -- residual VQ ------------------------------------------------------------------------------
class _Codebook(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.register_buffer("embed", torch.zeros(size, dim))


class _Quantizer(nn.Module):
    def __init__(self, c: CodecConfig) -> None:
        super().__init__()
        self.codebook = _Codebook(c.codebook_size, c.codebook_dim)
        self.project_in = nn.Linear(c.hidden, c.codebook_dim)
        self.project_out = nn.Linear(c.codebook_dim, c.hidden)

    def nearest(self, x: torch.Tensor) -> torch.Tensor:
        """Index of the nearest codebook row of each x [B, T, D] (the published distance)."""
        embed = self.codebook.embed.t()
        dist = -(x.pow(2).sum(-1, keepdim=True) - 2 * x @ embed + embed.pow(2).sum(0, keepdim=True))
        return dist.argmax(dim=-1)

    def lookup(self, codes: torch.Tensor) -> torch.Tensor:
        return self.project_out(F.embedding(codes, self.codebook.embed))


class ResidualVQ(nn.Module):
    def __init__(self, c: CodecConfig) -> None:
        super().__init__()
        self.quantizers = nn.ModuleList(_Quantizer(c) for _ in range(c.quantizers))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, hidden] -> codes [B, T, N]."""
        residual, codes = x, []
        for quantizer in self.quantizers:
            index = quantizer.nearest(quantizer.project_in(residual))
            residual = residual - quantizer.lookup(index)
            codes.append(index)
        return torch.stack(codes, dim=-1)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, T, N] -> [B, T, hidden]."""
        total = self.quantizers[0].lookup(codes[..., 0])
        for i, quantizer in enumerate(self.quantizers[1:], start=1):
            total = total + quantizer.lookup(codes[..., i])
        return total


__all__ = [
    "CodecConfig",
    "DacDecoder",
    "DacEncoder",
    "Hubert",
    "HubertDims",
    "Resampler",
    "ResidualVQ",
    "SemanticEncoder",
    "Snake",
    "sinc_resample_kernel",
]

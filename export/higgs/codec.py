"""The Higgs codec's two exported graphs, built from `codec_modules` and loaded by name.

* `ReferenceEncoder`: `audio` [1, N] float32 at 24 kHz -> `codes` [1, F, 8] int64 (batch 1:
  the engine's canonical reference encode). As published, the acoustic encoder gets the
  audio padded by half a hop on each side only when its frame count would otherwise differ
  from the semantic branch's; the HuBERT input is padded by 160 samples on each side.
* `CodeDecoder`: `codes` [B, F, 8] int64 -> `audio` [B, F * 960] float32. The DAC decoder is
  non-causal and stateless: the engine decodes overlapping windows of frames.

The codec's weights come from its own checkpoint (higgs-audio-v2-tokenizer, v2) or from inside
the Higgs TTS 3 checkpoint (prefix `tied.embedding.modality_embeddings.0.model.`).
"""

from __future__ import annotations

import torch
from torch import nn

from export.checkpoint import Checkpoint, CheckpointError
from export.higgs.codec_modules import (
    CodecConfig,
    DacDecoder,
    DacEncoder,
    Hubert,
    Resampler,
    ResidualVQ,
    SemanticEncoder,
)

HUBERT_PAD = 160  # samples of zeros on each side of the 16 kHz HuBERT input
# Weight-norm spellings of a weight in published checkpoints: (magnitude, direction).
WEIGHT_NORM_PARTS = (
    ("parametrizations.weight.original0", "parametrizations.weight.original1"),
    ("weight_g", "weight_v"),
)


class HiggsCodec(nn.Module):
    """All codec modules under their checkpoint names."""

    def __init__(self, config: CodecConfig) -> None:
        super().__init__()
        self.config = config
        self.acoustic_encoder = DacEncoder(config)
        self.acoustic_decoder = DacDecoder(config)
        self.encoder_semantic = SemanticEncoder(config)
        self.semantic_model = Hubert(config.hubert)
        self.fc = nn.Linear(config.hidden, config.hidden)
        self.fc2 = nn.Linear(config.hidden, config.acoustic_hidden)
        self.quantizer = ResidualVQ(config)


class ReferenceEncoder(nn.Module):
    """audio [1, N] at the codec's rate -> codes [1, F, quantizers] (int64)."""

    def __init__(self, codec: HiggsCodec) -> None:
        super().__init__()
        self.codec = codec
        c = codec.config
        self.resample = Resampler(c.sample_rate, c.semantic_rate)
        self.half_hop = c.hop_length // 2

    def _semantic_frames(self, semantic: torch.Tensor) -> torch.Tensor:
        step = self.codec.config.semantic_step
        return semantic[:, ::step] if step > 1 else semantic

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        codec = self.codec
        length = torch._shape_as_tensor(audio)[1]
        wave16 = self.resample(audio, length)
        wave16 = nn.functional.pad(wave16, (HUBERT_PAD, HUBERT_PAD))
        semantic = self._semantic_frames(codec.semantic_model(wave16))
        semantic = codec.encoder_semantic(semantic.transpose(1, 2))
        # Pad the acoustic input by half a hop on each side only when the frame counts differ
        # (as published): slice the padded signal to [pad - p, pad + N + p), p in {0, half}.
        unpadded = codec.acoustic_encoder.frames(length)
        semantic_frames = torch._shape_as_tensor(semantic)[2]
        extra = torch.where(unpadded != semantic_frames, self.half_hop, 0)
        padded = nn.functional.pad(audio, (self.half_hop, self.half_hop))
        start = self.half_hop - extra
        acoustic_in = padded[:, start : start + length + 2 * extra]
        acoustic = codec.acoustic_encoder(acoustic_in[:, None])
        embeddings = torch.cat([acoustic, semantic], dim=1).transpose(1, 2)
        return codec.quantizer.encode(codec.fc(embeddings))


class CodeDecoder(nn.Module):
    """codes [B, F, quantizers] -> audio [B, F * hop]."""

    def __init__(self, codec: HiggsCodec) -> None:
        super().__init__()
        self.codec = codec

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        codec = self.codec
        quantized = codec.quantizer.decode(codes)
        acoustic = codec.fc2(quantized).transpose(1, 2)
        return codec.acoustic_decoder(acoustic)[:, 0]


def _weight_norm_value(checkpoint: Checkpoint, base: str, dim: int) -> torch.Tensor | None:
    """The weight `base`.weight of a weight-normed layer stored as magnitude and direction
    (None when the checkpoint stores the weight itself)."""
    for magnitude, direction in WEIGHT_NORM_PARTS:
        g_name, v_name = f"{base}.{magnitude}", f"{base}.{direction}"
        if g_name in checkpoint.names and v_name in checkpoint.names:
            g, v = checkpoint.tensor(g_name), checkpoint.tensor(v_name)
            dims = [d for d in range(v.dim()) if d != dim]
            return v * (g / v.norm(dim=dims, keepdim=True))
    return None


def load_codec(checkpoint: Checkpoint, config: CodecConfig, prefix: str = "") -> HiggsCodec:
    """The codec of `config` with every weight read by name from `checkpoint` under `prefix`;
    weight-normed layers (magnitude + direction) are folded into plain weights."""
    codec = HiggsCodec(config).eval()
    folded: dict[str, torch.Tensor] = {}
    for key, _ in codec.named_parameters():
        if not key.endswith(".weight") or f"{prefix}{key}" in checkpoint.names:
            continue
        base = f"{prefix}{key[: -len('.weight')]}"
        # HuBERT's positional conv is normalised over its kernel axis (dim 2), others over 0.
        dim = 2 if "pos_conv_embed" in key else 0
        value = _weight_norm_value(checkpoint, base, dim)
        if value is not None:
            folded[key] = value
    checkpoint.load_into(codec, lambda key: None if key in folded else f"{prefix}{key}")
    state = codec.state_dict()
    for key, value in folded.items():
        if tuple(value.shape) != tuple(state[key].shape):
            raise CheckpointError(
                f"{checkpoint.what} {checkpoint.root}: weight-normed {prefix}{key} is "
                f"{list(value.shape)}, expected {list(state[key].shape)}"
            )
        state[key].copy_(value)
    return codec


__all__ = ["CodeDecoder", "HiggsCodec", "ReferenceEncoder", "load_codec"]

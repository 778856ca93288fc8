"""Stand-in MOSS-Audio-Tokenizer checkpoints in the published layout: config.json keys, tensor
names, ranks and weight-norm parametrisations as published, reduced sizes, random weights.

    tiny v1   24 kHz mono, hop 1920 (patch 240 and three patches of 2, as published), the
              published module list with narrow transformers (2 layers, heads of 16), 32
              quantizers of 1024 x 8, 0.4 s attention windows (5 / 10 / 20 / 40 steps), so
              sliding windows show within a few frames; two shards + index (as published).
    tiny v2   48 kHz stereo interleaved, hop 3840 (patches 240, 2, 2, 2, 4), a decoder that
              starts with a patch (as the Nano codec of the same family does), one entry with
              its own `context_duration`; one bf16 file. v2's real sizes are not public: this
              is its inferred layout (see config.py), not its published dims.
    published v1  the published config.json (1.6 B parameters; benchmarks only).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from export.checkpoint import write_checkpoint
from export.moss_audio_tokenizer.config import codec_spec
from export.moss_audio_tokenizer.modules import AudioTokenizer

DIMS = ("tiny", "published")


def _transformer(inputs: int, outputs: int, d_model: int, layers: int, **extra: Any) -> dict:
    return {
        "module_type": "Transformer",
        "causal": True,
        "conv_layout": True,
        "d_model": d_model,
        "dim_feedforward": 4 * d_model,
        "gating": "none",
        "input_dimension": inputs,
        "layer_scale": 0.01,
        "max_period": 10000,
        "norm": "layer_norm",
        "num_heads": d_model // 64 if d_model >= 64 * 12 else d_model // 16,
        "num_layers": layers,
        "output_dimension": outputs,
        "positional_embedding": "rope",
        **extra,
    }


def _patch(size: int) -> dict:
    return {"module_type": "PatchedPretransform", "patch_size": size}


def _quantizer(input_dim: int, rvq_dim: int) -> dict:
    return {
        "codebook_dim": 8,
        "codebook_size": 1024,
        "input_dim": input_dim,
        "num_quantizers": 32,
        "output_dim": input_dim,
        "quantizer_type": "rlfq",
        "rvq_dim": rvq_dim,
    }


def _v1(small: bool) -> dict:
    # Widths of the published stack; the tiny one divides them by 16 (transformers keep the
    # published pattern of which projections exist: only where widths differ).
    w = (lambda n: max(n // 16, 16)) if small else (lambda n: n)
    layers = (2, 2) if small else (12, 32)
    encoder = [
        _patch(240),
        _transformer(240, w(384), w(768), layers[0]),
        _patch(2),
        _transformer(2 * w(384), w(384), w(768), layers[0]),
        _patch(2),
        _transformer(2 * w(384), w(640), w(768), layers[0]),
        _patch(2),
        _transformer(2 * w(640), w(768), w(1280), layers[1]),
    ]
    decoder = [
        _transformer(w(768), w(1280), w(1280), layers[1]),
        _patch(2),
        _transformer(w(640), w(768), w(768), layers[0]),
        _patch(2),
        _transformer(w(384), w(768), w(768), layers[0]),
        _patch(2),
        _transformer(w(384), 240, w(768), layers[0]),
        _patch(240),
    ]
    return {
        "architectures": ["MossAudioTokenizerModel"],
        "auto_map": {
            "AutoConfig": "configuration_moss_audio_tokenizer.MossAudioTokenizerConfig",
            "AutoModel": "modeling_moss_audio_tokenizer.MossAudioTokenizerModel",
        },
        "causal_transformer_context_duration": 0.4 if small else 10,
        "code_dim": w(768),
        "decoder_kwargs": decoder,
        "downsample_rate": 1920,
        "dtype": "float32",
        "encoder_kwargs": encoder,
        "model_type": "speech_tokenizer",
        "quantizer_kwargs": _quantizer(w(768), w(512)),
        "quantizer_type": "rlfq",
        "reversed_decoder_kwargs": copy.deepcopy(encoder),
        "sample_rate": 24000,
        "sampling_rate": 24000,
        "transformers_version": "4.56.0.dev0",
        "version": "4.26.1.a",
    }


def _v2_tiny() -> dict:
    encoder = [
        _patch(240),  # 96 kHz interleaved stream -> 400 steps/s
        _transformer(240, 24, 48, 2),
        _patch(2),
        _transformer(48, 24, 48, 1),  # widths equal: v2 still has both projections
        _patch(2),
        _transformer(48, 40, 48, 1, context_duration=0.1),
        _patch(2),
        _transformer(80, 48, 64, 1),
        _patch(4),
        _transformer(192, 48, 64, 2),  # 12.5 frames/s
    ]
    decoder = [
        _patch(4),  # 50 steps/s
        _transformer(12, 40, 48, 2),
        _patch(2),
        _transformer(20, 48, 48, 1),
        _patch(2),
        _transformer(24, 48, 48, 1),
        _patch(2),
        _transformer(24, 240, 48, 2),
        _patch(240),
    ]
    return {
        "architectures": ["MossAudioTokenizerModel"],
        "attention_implementation": "sdpa",
        "causal_transformer_context_duration": 0.2,
        "codec_weight_dtype": "bfloat16",
        "compute_dtype": "fp32",
        "decoder_kwargs": decoder,
        "downsample_rate": 3840,
        "enable_channel_interleave": True,
        "encoder_kwargs": encoder,
        "model_type": "moss-audio-tokenizer",
        "number_channels": 2,
        "quantizer_kwargs": _quantizer(48, 32),
        "quantizer_type": "rlfq",
        "sampling_rate": 48000,
    }


def codec_config(version: str, dims: str = "tiny") -> dict[str, Any]:
    """The config.json of a stand-in (a new dict each call)."""
    if version not in ("v1", "v2") or dims not in DIMS:
        raise ValueError(f"no stand-in {version!r} {dims!r}; versions v1, v2; dims {DIMS}")
    if version == "v2":
        if dims != "tiny":
            raise ValueError("v2's published sizes are not public: only the tiny stand-in exists")
        return _v2_tiny()
    return _v1(small=dims == "tiny")


def random_weights(module: AudioTokenizer, seed: int) -> dict[str, torch.Tensor]:
    """Every tensor of `module` drawn from `seed`: norms and layer scales away from their
    initial values (so a swapped or ignored tensor shows), weight-norm gains != |v|."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, value in module.state_dict().items():
        shape = value.shape
        if name.endswith("layer_scale_1.scale") or name.endswith("layer_scale_2.scale"):
            tensor = 0.2 + 0.1 * torch.rand(shape, generator=generator)
        elif ".norm" in name and name.endswith(".weight"):
            tensor = 1.0 + 0.2 * torch.randn(shape, generator=generator)
        elif name.endswith("original0"):  # weight-norm gain g [out, 1, 1]
            tensor = 0.5 + torch.rand(shape, generator=generator)
        elif name.endswith("codebook.weight"):
            tensor = torch.randn(shape, generator=generator)
        elif value.dim() >= 2:
            fan_in = value[0].numel()
            tensor = torch.randn(shape, generator=generator) / fan_in**0.5
        else:
            tensor = 0.1 * torch.randn(shape, generator=generator)
        tensors[name] = tensor
    return tensors


def build_codec_checkpoint(root: Path, version: str, dims: str = "tiny", seed: int = 0) -> Path:
    """Write a stand-in codec checkpoint directory at `root` (created); returns it."""
    return write_stand_in(Path(root), codec_config(version, dims), seed)


def write_stand_in(root: Path, config: dict[str, Any], seed: int = 0) -> Path:
    """A checkpoint of `config` with random weights (v1: fp32 in two shards as published; v2:
    one bf16 file)."""
    spec = codec_spec(config)
    with torch.device("meta"):  # names and shapes only: no second copy of the weights
        module = AudioTokenizer(spec)
    tensors = random_weights(module, seed)
    v2 = spec.version == "v2"
    return write_checkpoint(
        root, tensors, config, shards=1 if v2 else 2, dtype=torch.bfloat16 if v2 else None
    )


__all__ = ["DIMS", "build_codec_checkpoint", "codec_config", "random_weights", "write_stand_in"]

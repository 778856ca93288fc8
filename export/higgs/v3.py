"""Higgs TTS 3 (higgs-audio-v3-tts-4b, `model_type` "higgs_multimodal_qwen3"): the checkpoint
layout and what the exporter builds from it.

Tensors (bosonai/higgs-tts-3-4b `model.safetensors`, as SGLang-Omni's weight mapper reads them):
`body.layers.N.*` and `body.norm.weight` (a Qwen3 backbone: the shared exporter,
`export/backbones/qwen3.py`), `tied.embedding.text_embedding.weight`,
`tied.embedding.modality_embeddings.0.embedding.weight` (the fused 8 x 1026 audio table, also
the audio head when `tie_word_embeddings`; else `tied.head.modality_heads.0.weight`), and the
codec under `tied.embedding.modality_embeddings.0.model.` (its config in
`higgs_audio_v2_tokenizer_config.json`).

The model was trained with bf16 rotary tables: SGLang-Omni rounds its float32 cos/sin cache
through bfloat16 (`.to(torch.bfloat16)`, nearest), so the backbone's tables are rounded the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from export.backbones.qwen3 import Qwen3Config, RopeTables
from export.checkpoint import Checkpoint, CheckpointError

BODY = "body."
TEXT_TABLE = "tied.embedding.text_embedding.weight"
AUDIO_TABLE = "tied.embedding.modality_embeddings.0.embedding.weight"
UNTIED_HEAD = "tied.head.modality_heads.0.weight"
CODEC_PREFIX = "tied.embedding.modality_embeddings.0.model."
CODEC_CONFIG = "higgs_audio_v2_tokenizer_config.json"
ROPE = RopeTables("bfloat16", "nearest")


@dataclass(frozen=True)
class V3Spec:
    dims: Qwen3Config
    codebooks: int
    codebook_size: int  # 1024 codes + BOC 1024 + EOC 1025
    tied: bool
    vocab_size: int

    def audio_table(self, checkpoint: Checkpoint) -> torch.Tensor:
        shape = (self.codebooks * self.codebook_size, self.dims.hidden_size)
        return checkpoint.tensor(AUDIO_TABLE, shape)

    def head_weight(self, checkpoint: Checkpoint) -> torch.Tensor:
        if self.tied:
            return self.audio_table(checkpoint)
        shape = (self.codebooks * self.codebook_size, self.dims.hidden_size)
        return checkpoint.tensor(UNTIED_HEAD, shape)

    def text_table(self, checkpoint: Checkpoint) -> torch.Tensor:
        return checkpoint.tensor(TEXT_TABLE)


def _count(config: dict[str, Any], key: str, low: int, high: int) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise CheckpointError(f"audio_encoder_config.{key} must be an integer in [{low}, {high}]")
    return value


def read_v3(checkpoint: Checkpoint) -> V3Spec:
    config = checkpoint.config
    if config.get("model_type") != "higgs_multimodal_qwen3":
        raise CheckpointError(f"{checkpoint.root}/config.json is not a Higgs TTS 3 config")
    text, audio = config.get("text_config"), config.get("audio_encoder_config")
    if not isinstance(text, dict) or not isinstance(audio, dict):
        raise CheckpointError(
            f"{checkpoint.root}/config.json lacks text_config or audio_encoder_config"
        )
    if audio.get("encoder_type", "discrete") != "discrete":
        raise CheckpointError("audio_encoder_config.encoder_type must be 'discrete'")
    if not audio.get("use_delay_pattern", True):
        raise CheckpointError("audio_encoder_config.use_delay_pattern is false: not supported")
    if config.get("audio_token_id", -100) != -100:
        raise CheckpointError("audio_token_id must be -100 (the published placeholder)")
    dims = Qwen3Config.from_dict(text, what="v3 text_config")
    return V3Spec(
        dims=dims,
        codebooks=_count(audio, "num_codebooks", 1, 64),
        codebook_size=_count(audio, "vocab_size", 3, 1 << 16),
        tied=bool(audio.get("tie_word_embeddings", audio.get("tied", True))),
        vocab_size=int(text.get("vocab_size", 0)),
    )


__all__ = [
    "AUDIO_TABLE",
    "BODY",
    "CODEC_CONFIG",
    "CODEC_PREFIX",
    "ROPE",
    "TEXT_TABLE",
    "UNTIED_HEAD",
    "V3Spec",
    "read_v3",
]

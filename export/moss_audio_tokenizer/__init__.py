"""MOSS-Audio-Tokenizer v1 and v2 from their published checkpoints: the project's torch
modules (`load_codec`), stand-in checkpoints in the published layout
(`build_codec_checkpoint`) and the checked ONNX export (`export_codec`)."""

from export.moss_audio_tokenizer.export import export_codec, load_codec
from export.moss_audio_tokenizer.stand_in import build_codec_checkpoint

__all__ = ["build_codec_checkpoint", "export_codec", "load_codec"]

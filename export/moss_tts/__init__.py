"""MOSS-TTS (Local-Transformer v1.5, Local-Transformer v1, Delay): the project's torch modules
of the published checkpoints (`modules`, `config`), their ONNX graphs (`graphs`, the shared
Qwen3 backbone in export/backbones/), the checks against torch (`checks`), the exporter
(`exporter`, `onnx-tts export moss-tts`) and stand-in checkpoints (`stand_in`)."""

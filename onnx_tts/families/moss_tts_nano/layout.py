"""What a MOSS-TTS-Nano ONNX export holds, as the rest of the family uses it: typed, bounded
values read once from the published layout (see `inspect.py`, which reads and checks it).

    models/                                  (or the TTS directory itself, its codec beside it)
      MOSS-TTS-Nano-100M-ONNX/               browser_poc_manifest.json, tts_browser_onnx_meta.json,
                                             tokenizer.model, moss_tts_*.onnx, *_shared.data
      MOSS-Audio-Tokenizer-Nano-ONNX/        codec_browser_onnx_meta.json, moss_audio_tokenizer_*
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from onnx_tts.graph_io import GraphSpec

FAMILY = "moss-tts-nano"
MANIFEST = "browser_poc_manifest.json"
TTS_DIR = "MOSS-TTS-Nano-100M-ONNX"
CODEC_DIR = "MOSS-Audio-Tokenizer-Nano-ONNX"
# Directory names of the first published revision, mapped to the current ones.
LEGACY_DIRS = {
    "MOSS-TTS-Nano-ONNX-CPU": TTS_DIR,
    "MOSS-Audio-Tokenizer-Nano-ONNX-CPU": CODEC_DIR,
}
MANIFEST_CANDIDATES = (MANIFEST, f"{TTS_DIR}/{MANIFEST}", f"MOSS-TTS-Nano-ONNX-CPU/{MANIFEST}")
DOWNLOAD_HINT = (
    "download OpenMOSS-Team/MOSS-TTS-Nano-100M-ONNX and "
    "OpenMOSS-Team/MOSS-Audio-Tokenizer-Nano-ONNX side by side (as published) and point "
    "--model at their parent directory"
)

REQUIRED_TTS_GRAPHS = ("prefill", "decode_step", "local_decoder")
OPTIONAL_TTS_GRAPHS = ("local_cached_step", "local_fixed_sampled_frame", "local_greedy_frame")
CODEC_GRAPHS = ("encode", "decode_full", "decode_step")
SAMPLE_MODES = ("greedy", "fixed", "full")

MAX_JSON_BYTES = 64 << 20  # the published manifest is ~0.5 MB, almost all voice codes
MAX_LAYERS = 256
MAX_HEADS = 256
MAX_WIDTH = 1 << 16
MAX_VOCAB = 1 << 20
MAX_CODEBOOKS = 64
MAX_CODEBOOK_SIZE = 1 << 16
MAX_NEW_FRAMES = 12_000  # 16 minutes at 12.5 frames/s
MAX_VOICES = 4096
MAX_VOICE_FRAMES = 12_000
MAX_TEMPLATE_TOKENS = 4096
MAX_CODEC_STATE_BYTES = 4 << 30
MAX_CONTEXT = 1 << 20


@dataclass(frozen=True)
class TTSConfig:
    """model_config of the TTS meta, typed and bounded."""

    n_vq: int
    hidden: int
    global_layers: int
    global_heads: int
    head_dim: int
    local_layers: int
    local_heads: int
    local_head_dim: int
    vocab: int
    codebook: int
    audio_pad: int
    audio_start: int
    audio_end: int
    user_slot: int
    assistant_slot: int

    @property
    def row_width(self) -> int:
        return self.n_vq + 1


@dataclass(frozen=True)
class CodecConfig:
    sample_rate: int
    channels: int
    downsample: int  # samples per code frame
    quantizers: int

    @property
    def frame_rate(self) -> float:
        return self.sample_rate / self.downsample


@dataclass(frozen=True)
class StateSpec:
    """One streaming-decode state tensor: input and output names, dtype, shape, start value."""

    input: str
    output: str
    dtype: np.dtype
    shape: tuple[int, ...]
    fill: int  # 0, or -1 for cached positions

    def initial(self) -> np.ndarray:
        return np.full(self.shape, self.fill, dtype=self.dtype)


@dataclass(frozen=True)
class GenerationDefaults:
    """generation_defaults of the manifest (the published option names)."""

    max_new_frames: int
    sample_mode: str
    text_temperature: float
    text_top_p: float
    text_top_k: int
    audio_temperature: float
    audio_top_p: float
    audio_top_k: int
    audio_repetition_penalty: float


@dataclass(frozen=True)
class PromptTemplates:
    user_prefix: tuple[int, ...]
    after_reference: tuple[int, ...]
    assistant_prefix: tuple[int, ...]


@dataclass(frozen=True)
class MossLayout:
    root: Path
    tts_dir: Path
    codec_dir: Path
    manifest_path: Path
    tts_meta_path: Path
    codec_meta_path: Path
    tokenizer_path: Path
    config: TTSConfig
    codec: CodecConfig
    templates: PromptTemplates
    defaults: GenerationDefaults
    voices: dict[str, np.ndarray]  # name -> int32 [frames, n_vq]
    tts_graphs: dict[str, GraphSpec]  # role -> declared I/O (present graphs only)
    codec_graphs: dict[str, GraphSpec]
    external_data: dict[str, tuple[str, ...]]  # graph file -> its .data files
    tts_names: dict[str, list[str]]  # the meta's `onnx` name lists
    fixed_frame_constants: dict[str, float]
    state: tuple[StateSpec, ...]

    def graph_files(self, role: str) -> list[Path]:
        """A graph and its external-data files (for identities and hashes)."""
        graphs = {**self.tts_graphs, **{f"codec_{r}": g for r, g in self.codec_graphs.items()}}
        path = graphs[role].path
        return [path] + [path.parent / name for name in self.external_data.get(path.name, ())]


__all__ = [
    "CODEC_DIR",
    "FAMILY",
    "MANIFEST",
    "SAMPLE_MODES",
    "TTS_DIR",
    "CodecConfig",
    "GenerationDefaults",
    "MossLayout",
    "PromptTemplates",
    "StateSpec",
    "TTSConfig",
]

"""MOSS-TTS-Nano ONNX exports (OpenMOSS-Team/MOSS-TTS-Nano-100M-ONNX with its
MOSS-Audio-Tokenizer-Nano-ONNX codec), run unmodified: the published layout is recognised and
checked (`layout`), text is tokenized and chunked as published (`text`), frames come from the
global transformer and the local depth transformer (`program`, `local`, `sampling`), audio from
the codec (`codec`); `model.MossTTSNano` holds the parts. It runs through the engine like
every family:

    import onnx_tts
    engine = onnx_tts.load("models/")                    # the parent of both directories
    audio = engine.synthesize("Hello.", voice="Junhao", seed=1)  # float32 [samples, 2], 48 kHz
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from onnx_tts.families.base import Detection, Family, LoadSettings, Option
from onnx_tts.families.moss_tts_nano.files import model_files
from onnx_tts.families.moss_tts_nano.layout import FAMILY, MAX_NEW_FRAMES, SAMPLE_MODES
from onnx_tts.families.moss_tts_nano.local import PATH_CHOICES
from onnx_tts.families.moss_tts_nano.reader import inspect_layout, looks_like_moss
from onnx_tts.families.moss_tts_nano.sampling import MAX_PENALTY, MAX_TEMPERATURE, MAX_TOP_K
from onnx_tts.families.moss_tts_nano.text import MAX_CHUNK_TOKENS


def detect(root: Path, options: Mapping[str, Any]) -> Detection | None:
    """A Detection when `root` is a MOSS-TTS-Nano layout (the models/ parent or the TTS
    directory), None when it is none; a broken one is a ModelError naming the file."""
    if not looks_like_moss(root):
        return None
    return Detection(FAMILY, root, inspect_layout(root))


def load(detection: Detection, settings: LoadSettings, options: Mapping[str, Any]) -> Any:
    """The backend as `onnx_tts.load` builds it (KV in place when decode_step was converted
    with `onnx-tts convert --inplace-kv`, else chained)."""
    from onnx_tts.families.moss_tts_nano.model import MossTTSNano

    return MossTTSNano(detection.inspected, settings, **options)


_OPTIONS = (
    Option(
        "sample_mode",
        str,
        "greedy, fixed (sampled inside the local frame graph) or full (host sampling)",
        "both",
        choices=SAMPLE_MODES,
    ),
    Option(
        "max_new_frames",
        int,
        "frame limit per text chunk (12.5 frames = 1 s)",
        "both",
        1,
        MAX_NEW_FRAMES,
    ),
    Option(
        "voice_clone_max_text_tokens",
        int,
        "text tokens per chunk (longer text is split at sentences)",
        "both",
        1,
        MAX_CHUNK_TOKENS,
    ),
    Option(
        "local_path",
        str,
        "local depth transformer graph (auto = the published dispatch, the fastest present)",
        "both",
        choices=PATH_CHOICES,
    ),
    Option(
        "parallel_chunks",
        bool,
        "decode the chunks of a text at once (chunk i seeded seed + i) instead of one after "
        "another with one generator, as published",
        "both",
    ),
    Option(
        "text_temperature",
        float,
        "continue/stop temperature (host sampling)",
        "both",
        1e-6,
        MAX_TEMPERATURE,
    ),
    Option("text_top_p", float, "continue/stop nucleus (host sampling)", "both", 0.0, 1.0),
    Option("text_top_k", int, "continue/stop top-k (host sampling)", "both", 0, MAX_TOP_K),
    Option(
        "audio_temperature",
        float,
        "code temperature (host sampling)",
        "both",
        1e-6,
        MAX_TEMPERATURE,
    ),
    Option("audio_top_p", float, "code nucleus (host sampling)", "both", 0.0, 1.0),
    Option("audio_top_k", int, "code top-k (host sampling)", "both", 0, MAX_TOP_K),
    Option(
        "audio_repetition_penalty",
        float,
        "penalty on codes already made in the chunk",
        "both",
        1e-6,
        MAX_PENALTY,
    ),
)

REGISTRY_ENTRY = Family(
    FAMILY,
    "MOSS-TTS-Nano ONNX (global + local depth transformer, 48 kHz stereo codec)",
    load,
    _OPTIONS,
    files=model_files,
)

__all__ = ["FAMILY", "REGISTRY_ENTRY", "detect", "inspect_layout"]

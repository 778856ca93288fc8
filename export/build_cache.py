"""Where recipes keep what they build for tests and benchmarks (no heavy imports here: the
test suite reads it before anything is built)."""

from __future__ import annotations

import os
from pathlib import Path


def build_cache_root() -> Path:
    """$ONNX_TTS_BUILD_CACHE, else onnx-tts/build under $XDG_CACHE_HOME or ~/.cache."""
    explicit = os.environ.get("ONNX_TTS_BUILD_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "onnx-tts" / "build"

"""onnx-tts: fast, trustworthy text-to-speech inference on ONNX Runtime."""

from onnx_tts.errors import (
    AudioError,
    CacheError,
    InputError,
    ModelError,
    OnnxTTSError,
    OutputError,
    SessionError,
)
from onnx_tts.pipeline import Audio, Engine, load

__version__ = "0.1.0"

__all__ = [
    "Audio",
    "AudioError",
    "CacheError",
    "Engine",
    "InputError",
    "ModelError",
    "OnnxTTSError",
    "OutputError",
    "SessionError",
    "__version__",
    "load",
]

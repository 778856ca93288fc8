"""onnx-tts: fast, trustworthy text-to-speech inference on ONNX Runtime."""

from onnx_tts.decoding.request import CancelToken, PlaybackClock
from onnx_tts.errors import (
    AudioError,
    CacheError,
    CancelledError,
    EmptyAudioError,
    InputError,
    ModelError,
    NonFiniteAudioError,
    OnnxTTSError,
    OnnxTTSWarning,
    OutputError,
    ReferenceTrimmedWarning,
    SessionError,
    UnspeakableTextWarning,
)
from onnx_tts.pipeline import Audio, Engine, load

__version__ = "0.1.0"

__all__ = [
    "Audio",
    "AudioError",
    "CacheError",
    "CancelToken",
    "CancelledError",
    "EmptyAudioError",
    "Engine",
    "InputError",
    "ModelError",
    "NonFiniteAudioError",
    "OnnxTTSError",
    "OnnxTTSWarning",
    "OutputError",
    "PlaybackClock",
    "ReferenceTrimmedWarning",
    "SessionError",
    "UnspeakableTextWarning",
    "__version__",
    "load",
]

"""Exception hierarchy: every failure a user can cause maps to one of these, with a message
that says what was wrong and how to fix it."""

from __future__ import annotations


class OnnxTTSError(Exception):
    """Base class of every error onnx-tts raises on purpose."""


class InputError(OnnxTTSError, ValueError):
    """Bad user input: text, options, parameters."""


class AudioError(OnnxTTSError):
    """A reference/voice audio file is missing, unreadable, silent, too short or too long."""


class ModelError(OnnxTTSError):
    """A model directory, bundle manifest or graph is missing or does not match its contract."""


class SessionError(OnnxTTSError):
    """ONNX Runtime refused a graph or a run (names the tensor where it can)."""


class CacheError(OnnxTTSError):
    """The reference cache could not be read or written."""


class OutputError(OnnxTTSError):
    """The output path cannot be written."""


class NonFiniteAudioError(InputError):
    """Audio (to write, or to encode as a voice) holds NaN or infinite samples.

    An InputError because the caller handed the samples in (a voice array, a file to save);
    it is also raised, before anything is written, when a model produces them, so a speaker
    never receives full-scale noise.
    """


class OnnxTTSWarning(UserWarning):
    """Base class of the warnings onnx-tts emits: the request ran, but not exactly as asked."""


class UnspeakableTextWarning(OnnxTTSWarning):
    """Part of the text (letters of another script, emoji) cannot be spoken and was dropped."""

    def __init__(self, message: str, dropped: dict[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.dropped = dropped or {}

"""Exception hierarchy: every failure a user can cause maps to one of these, with a message
that says what was wrong and how to fix it; and the checks of a user's numbers that raise them."""

from __future__ import annotations

import math
import numbers
from typing import Any


class OnnxTTSError(Exception):
    """Base class of every error onnx-tts raises on purpose."""


class InputError(OnnxTTSError, ValueError):
    """Bad user input: text, options, parameters."""


class MarkupError(InputError):
    """Markup in a text (SSML, ``[[ phonemes ]]``) is malformed. The message names the
    place (line and column, both from 1) and how to fix it; `line` and `column` hold it."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None) -> None:
        super().__init__(message)
        self.line, self.column = line, column


class SsmlError(MarkupError):
    """Invalid SSML: an unknown tag or attribute, a bad value, an unclosed tag, a refused
    DTD or entity, a bound exceeded."""


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


class NonFiniteAudioError(AudioError, InputError):
    """Audio (a reference to encode, or samples to write) holds NaN or infinite values.

    Both an AudioError (the audio is unusable, like a silent or truncated clip) and an
    InputError (the caller handed the samples in: a voice array, a file, samples to save), so
    existing ``except`` clauses of either kind catch it and the CLI exits 2 with one line. It
    is raised before anything is written, so a speaker never receives full-scale noise.
    """


class OutputClosedError(OutputError):
    """The reader of a streamed output went away (broken pipe): usually not a failure of the
    run (``| head``), so the CLI may exit quietly."""


class EmptyAudioError(OnnxTTSError):
    """The model ended a sentence without producing any audio (e.g. its first sampled token
    was the stop token). Raised instead of returning or writing an empty utterance."""


class CancelledError(OnnxTTSError):
    """The request's CancelToken fired before its audio was complete. Nothing is returned,
    written or cached: audio cut short is never handed out as if it were whole."""


class OnnxTTSWarning(UserWarning):
    """Base class of the warnings onnx-tts emits: the request ran, but not exactly as asked."""


class UnspeakableTextWarning(OnnxTTSWarning):
    """Part of the text (letters of another script, emoji) cannot be spoken and was dropped."""

    def __init__(self, message: str, dropped: dict[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.dropped = dropped or {}


class ReferenceTrimmedWarning(OnnxTTSWarning):
    """A reference clip was longer than the model takes: only its first `kept` of `seconds`
    seconds were encoded."""

    def __init__(self, message: str, seconds: float = 0.0, kept: float = 0.0) -> None:
        super().__init__(message)
        self.seconds, self.kept = seconds, kept


def shown(value: Any, limit: int = 40) -> str:
    """`value` as an error message quotes it: its repr, cut to `limit` characters (an integer
    of 10,000 digits has no repr at all, and a long one would drown the message)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def checked_number(
    name: str, value: Any, low: float, high: float, *, open_low: bool = False
) -> float:
    """`value` as a float when it is a finite number in [low, high] ((low, high] with
    `open_low`); InputError naming `name` and the range otherwise (a bool is no number, an
    integer too large for a float is out of range)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InputError(f"{name} must be a number, got {shown(value)}")
    try:
        number = float(value)
    except (OverflowError, ValueError):
        number = math.nan
    below = number <= low if open_low else number < low
    if not math.isfinite(number) or below or number > high:
        bracket = "(" if open_low else "["
        raise InputError(f"{name} must be in {bracket}{low:g}, {high:g}], got {shown(value)}")
    return number


def checked_integer(name: str, value: Any, low: int, high: int) -> int:
    """`value` as an int when it is an integer in [low, high]; InputError otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InputError(f"{name} must be an integer, got {shown(value)}")
    if not low <= int(value) <= high:
        raise InputError(f"{name} must be an integer in [{low}, {high}], got {shown(value)}")
    return int(value)

"""What a Wyoming client asks for: the text to speak with its voice, language, markup and
onnx-tts's extensions (`speed`, `sentence_silence`), read from an event's fields; the project's
attribution for `info`; the code of the error event a failed synthesis gets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from wyoming.info import Attribution

from onnx_tts.errors import MarkupError, SsmlError, checked_number
from onnx_tts.pipeline.planner import MAX_SENTENCE_SILENCE
from onnx_tts.pipeline.timestretch import MAX_SPEED, MIN_SPEED
from onnx_tts.server.wyoming_events import SHAPING_FIELDS


def _project_url() -> str:
    """The project's address from the installed package's metadata ([project.urls])."""
    import importlib.metadata

    try:
        urls = importlib.metadata.metadata("onnx-tts").get_all("Project-URL") or []
    except importlib.metadata.PackageNotFoundError:
        return ""
    found = dict(url.split(", ", 1) for url in urls if ", " in url)
    return found.get("Repository") or next(iter(found.values()), "")


ATTRIBUTION = Attribution(name="onnx-tts", url=_project_url())


@dataclass
class Speech:
    """One text to speak for a client: the voice it named and how to read the text."""

    text: str
    voice: str | None = None
    language: str | None = None
    speaker: str | None = None  # a speaker of the voice (a multi-speaker model's builtin voice)
    ssml: bool | None = None  # None: SSML when the text starts with <speak>
    speed: float = 1.0
    sentence_silence: float | None = None


# The ranges of the onnx-tts extensions, as on HTTP.
SHAPING_RANGES = {"speed": (MIN_SPEED, MAX_SPEED), "sentence_silence": (0.0, MAX_SENTENCE_SILENCE)}


def event_options(data: dict[str, Any]) -> dict[str, Any]:
    """What a synthesize or synthesize-start event asks beyond its text: voice, language,
    markup and the onnx-tts extensions (their types checked by `malformed`); InputError naming
    an extension out of its range (an integer of any size included)."""
    voice = data.get("voice") or {}
    options: dict[str, Any] = {
        "voice": voice.get("name"),
        # The library's SynthesizeVoice drops the language when a name is given: read it here.
        "language": voice.get("language"),
        "speaker": voice.get("speaker"),
        "ssml": {"ssml": True, "text": False}.get(data.get("text_format")),  # type: ignore[arg-type]
    }
    for key in SHAPING_FIELDS:
        if data.get(key) is not None:
            options[key] = checked_number(key, data[key], *SHAPING_RANGES[key])
    return options


def error_code(error: BaseException) -> str:
    """The `code` of the error event for a failed synthesis."""
    if isinstance(error, SsmlError):  # the message names the line and column
        return "invalid_ssml"
    if isinstance(error, MarkupError):
        return "invalid_markup"
    return type(error).__name__


__all__ = ["ATTRIBUTION", "Speech", "error_code", "event_options"]

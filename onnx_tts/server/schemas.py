"""Request bodies: OpenAI's speech fields plus onnx-tts extensions, checked into one-line
errors that name the field."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from onnx_tts.pipeline.planner import MAX_SENTENCE_SILENCE
from onnx_tts.pipeline.timestretch import MAX_SPEED, MIN_SPEED
from onnx_tts.server.encoding import FORMATS
from onnx_tts.server.errors import APIError

MAX_INPUT_CHARS = 4096
# OpenAI's built-in voice names: clients (Open WebUI defaults to "alloy") send them; they all
# mean this server's default voice.
OPENAI_VOICES = frozenset(
    "alloy ash ballad coral echo fable nova onyx sage shimmer verse marin cedar".split()
)


# A voice is named by an id or a name of at most this many characters (either form).
MAX_VOICE_REF_CHARS = 200


class VoiceRef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1, max_length=MAX_VOICE_REF_CHARS)


class SpeechRequest(BaseModel):
    """POST /v1/audio/speech. Fields beyond OpenAI's land in `model_extra` and are checked
    against the chosen model's options."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(default="tts-1", min_length=1, max_length=200)
    input: str = Field(min_length=1, max_length=MAX_INPUT_CHARS)
    voice: str | VoiceRef = "default"
    response_format: str = "mp3"
    # Numbers are JSON numbers: "7" is not a seed (strict: no coercion from strings).
    speed: float = Field(default=1.0, ge=MIN_SPEED, le=MAX_SPEED, allow_inf_nan=False, strict=True)
    stream_format: Literal["audio", "sse"] | None = None
    instructions: str | None = Field(default=None, max_length=MAX_INPUT_CHARS)
    seed: int | None = Field(default=None, ge=0, lt=2**63, strict=True)
    # onnx-tts extensions (docs/SERVING.md): markup, pauses and word timings.
    ssml: bool | None = Field(default=None, strict=True)  # None: SSML when it starts <speak>
    sentence_silence: float | None = Field(
        default=None, ge=0, le=MAX_SENTENCE_SILENCE, allow_inf_nan=False, strict=True
    )
    return_timestamps: bool = Field(default=False, strict=True)

    @field_validator("input")
    @classmethod
    def _something_to_say(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("nothing to say (empty or only whitespace); send the text to speak")
        return value

    @field_validator("voice", mode="before")
    @classmethod
    def _voice_name_bounded(cls, value: Any) -> Any:
        if isinstance(value, str) and not 0 < len(value) <= MAX_VOICE_REF_CHARS:
            raise ValueError(f"a voice id or name is 1 to {MAX_VOICE_REF_CHARS} characters")
        return value

    @field_validator("response_format")
    @classmethod
    def _known_format(cls, value: str) -> str:
        if value not in FORMATS:
            raise ValueError(
                f"response_format {value!r} is not supported; use one of {', '.join(FORMATS)}"
            )
        return value

    @property
    def voice_id(self) -> str:
        return self.voice.id if isinstance(self.voice, VoiceRef) else self.voice

    def extensions(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class CaptionedSpeechRequest(SpeechRequest):
    """POST /dev/captioned_speech (Kokoro-FastAPI's shape): the speech body, plus `stream`
    (JSON lines as the audio is made, the default, or one JSON object) and `return_timestamps`
    (on by default). Its answer is JSON, so OpenAI's `stream_format` has no meaning here."""

    stream: bool = Field(default=True, strict=True)
    return_timestamps: bool = Field(default=True, strict=True)

    @field_validator("stream_format")
    @classmethod
    def _no_stream_format(cls, value: str | None) -> str | None:
        if value is not None:
            raise ValueError(
                '/dev/captioned_speech answers JSON; stream it with "stream": true (the '
                "default) instead of stream_format"
            )
        return value


def validation_error(error: ValidationError) -> APIError:
    """The first problem pydantic found, as OpenAI's 400 with `param` set."""
    first = error.errors()[0]
    location = [str(part) for part in first.get("loc", ()) if not isinstance(part, int)]
    param = location[0] if location else None
    message = first.get("msg", "invalid request")
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    if first.get("type") == "missing":
        message = f"'{param}' is required"
    elif param:
        message = f"{'.'.join(location)}: {message}"
    return APIError(400, message, param=param, code="invalid_value")


def nests_deeper_than(value: Any, limit: int) -> bool:
    """Whether parsed JSON `value` nests arrays/objects deeper than `limit` (iterative, so a
    hostile depth cannot exhaust the stack here)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False


def parse_speech_request(body: Any, kind: type[SpeechRequest] = SpeechRequest) -> SpeechRequest:
    """The body of /v1/audio/speech (or, with `kind`, of /dev/captioned_speech), checked."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    try:
        request = kind.model_validate(body)
    except ValidationError as error:
        raise validation_error(error) from None
    if request.return_timestamps and kind is SpeechRequest and request.stream_format != "sse":
        raise APIError(
            400,
            'return_timestamps on /v1/audio/speech needs stream_format "sse" (the words come '
            "as speech.audio.timestamps events); for audio and word timings in JSON use "
            "POST /dev/captioned_speech",
            param="return_timestamps",
            code="invalid_value",
        )
    return request

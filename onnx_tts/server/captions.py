"""POST /dev/captioned_speech: speech with word timings in JSON, in Kokoro-FastAPI's shape.

`stream: false` answers one object once the audio is complete: `{"audio": base64 of the whole
file, "audio_format": its content type, "timestamps": [{"word", "start_time", "end_time",
"estimated"}]}`. `stream: true` (the default, as in Kokoro-FastAPI) answers such objects one
per line as the audio is made: each carries the encoded bytes made since the line before
(their concatenation is the file) and the words completed since then (their concatenation is
every word). Times are seconds in the whole output audio. A failure after the first line is a
last line holding OpenAI's error envelope. See docs/SERVING.md.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from starlette.responses import JSONResponse, Response

from onnx_tts.server.errors import APIError
from onnx_tts.server.jobs import WORDS
from onnx_tts.server.schemas import CaptionedSpeechRequest
from onnx_tts.server.speech import (
    CONTENT_TYPES,
    JobStream,
    Started,
    audio_events,
    b64,
    encode,
    word_json,
)
from onnx_tts.server.threads import blocking


def _line(audio: bytes, audio_format: str, words: list[dict[str, Any]] | None) -> bytes:
    body = {"audio": b64(audio), "audio_format": audio_format, "timestamps": words}
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


async def respond_captioned(
    state: Any, request: Request, speech: CaptionedSpeechRequest, started: Started
) -> Response:
    """The captioned answer of a started request (see the module's docstring)."""
    audio_format = CONTENT_TYPES[speech.response_format]
    wanted = speech.return_timestamps
    headers = {"Cache-Control": "no-cache", **started.headers}
    encoder = started.encoder
    if not speech.stream:
        audio, words = bytearray(), []
        async for kind, payload in audio_events(state, request, started, watch=True):
            if kind == WORDS:
                words += [word_json(word) for word in payload]
            else:
                audio += await encode(encoder, payload)
        if started.record.outcome != "done":  # the client left before the audio was complete
            return Response(status_code=499)
        audio += await blocking(encoder.close)
        body = {
            "audio": b64(bytes(audio)),
            "audio_format": audio_format,
            "timestamps": words if wanted else None,
        }
        return JSONResponse(body, headers=headers)

    async def lines() -> AsyncIterator[bytes]:
        pending: list[dict[str, Any]] = []
        try:
            async for kind, payload in audio_events(state, request, started):
                if kind == WORDS:
                    pending += [word_json(word) for word in payload]
                    continue
                data = await encode(encoder, payload)
                if data:  # a codec that holds samples back gives nothing yet: words wait
                    yield _line(data, audio_format, pending)
                    pending = []
            tail = await blocking(encoder.close)
            if tail or pending:
                yield _line(tail, audio_format, pending)
        except APIError as error:
            yield json.dumps(error.body(), separators=(",", ":")).encode() + b"\n"

    return JobStream(started.job, lines(), media_type="application/json", headers=headers)

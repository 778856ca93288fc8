"""POST /v1/audio/speech: a request checked and planned into a Generation, then streamed back
as it is made (raw audio of the response format, or SSE events), with its metrics."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from onnx_tts.errors import AudioError, InputError, MarkupError, OnnxTTSError, SsmlError
from onnx_tts.pipeline.timings import WordTiming
from onnx_tts.server.encoding import (
    CONTENT_TYPES,
    REQUESTABLE_RATES,
    FormatUnavailable,
    StreamEncoder,
    codec_rates,
    encoded_rate,
)
from onnx_tts.server.engines import DEFAULT_MODEL_ALIASES, ModelRegistry
from onnx_tts.server.errors import APIError, one_line
from onnx_tts.server.instructions import Styling, interpret
from onnx_tts.server.jobs import (
    AUDIO,
    END,
    ERROR,
    START,
    WORDS,
    Busy,
    Generation,
    ServerStopping,
)
from onnx_tts.server.metrics import SynthesisRecord
from onnx_tts.server.schemas import SpeechRequest
from onnx_tts.server.threads import blocking
from onnx_tts.server.voice_names import VoiceNameError
from onnx_tts.server.voices import VoiceStoreError, voice_to_speak

log = logging.getLogger("onnx_tts.server")

# The SSE event that carries word timings (with `return_timestamps`); OpenAI's clients skip
# event types they do not know.
TIMESTAMPS_EVENT = "speech.audio.timestamps"
# How often a request whose answer is not being sent yet is checked for a disconnect.
DISCONNECT_POLL_SECONDS = 0.25
# (kind, payload, arrival time) as the handler saw it.
_Event = tuple[str, Any, float]

# -- speech -------------------------------------------------------------------------------------


def plan_speech(state: Any, request: SpeechRequest, received: float) -> tuple[Generation, Styling]:
    model = state.registry.get(request.model)
    if model is None:
        raise unknown_model(request.model, state.registry)
    options = {k: v for k, v in request.extensions().items() if v is not None}
    sample_rate = _requested_rate(options.pop("sample_rate", None), request.response_format)
    unknown = sorted(set(options) - set(model.options))
    if unknown:
        raise APIError(
            400,
            f"unknown field {unknown[0]!r} for model {model.name!r}; it takes: "
            f"{', '.join(('seed', 'sample_rate', *model.options))}",
            param=unknown[0],
            code="unknown_parameter",
        )
    for key, value in options.items():
        _check_option(key, value, model.options[key])
    styling = interpret(request.instructions, model.options)
    for key, value in styling.options.items():
        options.setdefault(key, value)  # a field in the request wins over the instructions
    try:
        voice_audio = voice_to_speak(state.voices, state.registry, model, request.voice_id)
    except VoiceNameError as error:
        raise name_error(error, "voice") from None
    except VoiceStoreError as error:
        raise store_error(error, "voice") from None
    job = Generation(
        model=model,
        text=request.input,
        voice_audio=voice_audio,
        seed=request.seed,
        options=options,
        speed=styling.speed(request.speed),
        output_rate=encoded_rate(request.response_format, model.sample_rate, sample_rate),
        # OpenAI's pcm is mono (its clients assume it); the other formats say their channels.
        output_channels=1 if request.response_format == "pcm" else model.channels,
        ssml=request.ssml,
        sentence_silence=request.sentence_silence,
        timestamps=request.return_timestamps,
        received_at=received,
    )
    return job, styling


def _plan_and_open(
    state: Any, speech: SpeechRequest, received: float, planned: list[Generation]
) -> tuple[Generation, Styling, StreamEncoder]:
    """(a worker thread) The request planned, its encoder made, and, when the model admits
    it at once, its stream opened: in a burst of 8 clients each trip to the worker pool
    waited for a thread, the GIL and the event loop. `planned` gets the job as soon as it
    exists, so that the caller can give back what a cancelled trip took."""
    job, styling = plan_speech(state, speech, received)
    planned.append(job)
    try:
        encoder = StreamEncoder(speech.response_format, job.output_rate, job.output_channels)
    except FormatUnavailable as error:
        raise APIError(
            400, str(error), param="response_format", code="unsupported_format"
        ) from None
    if job.admit_at_once():
        try:
            job.open_stream()
        except OnnxTTSError as error:
            raise client_error(error) from None
    return job, styling, encoder


@dataclass
class Started:
    """A speech request admitted and running, its first event in hand."""

    job: Generation
    encoder: StreamEncoder
    first: _Event
    record: SynthesisRecord
    headers: dict[str, str]  # what the response says about itself (rate, channels, styling)


async def start_speech(
    state: Any, request: Request, speech: SpeechRequest, received: float
) -> Started | Response:
    """Plan, admit and start `speech`, and wait for its first audio: a Started, or a 499
    Response when the client left first. Refusals are APIErrors (400, 404, 429, ...)."""
    # Off the event loop: resolving a voice reads the voice store (files or Redis), and the
    # stream's start plans the text. One trip to the worker pool when admitted at once.
    planned: list[Generation] = []
    try:
        job, styling, encoder = await blocking(_plan_and_open, state, speech, received, planned)
    except Busy as error:
        raise busy_error(state, error) from None
    except BaseException:
        for job in planned:
            job.abandon()
        raise
    record = SynthesisRecord(
        request_id=request.state.request_id,
        model=job.model.name,
        voice=speech.voice_id,
        characters=len(speech.input),
        response_format=speech.response_format,
    )
    if styling.ignored:
        log.warning(
            "instructions ignored id=%s: %s",
            record.request_id,
            styling.headers()["X-Instructions-Ignored"],
        )
    try:
        await job.admit(state.config.queue_timeout)
    except Busy as error:
        raise busy_error(state, error) from None
    except BaseException:
        job.abandon()
        raise
    job.start()
    try:
        first = await next_event(job, request)
    except BaseException:
        job.cancel()
        raise
    if first is None or first[0] == ERROR:
        job.cancel()
        if first is None:  # the client left before the first audio
            state.metrics.cancelled.inc()
            record.log(job.cache_hit)
            return Response(status_code=499)
        raise client_error(first[1])
    headers = {
        "X-Sample-Rate": str(job.output_rate),
        "X-Channels": str(job.output_channels),
        "X-Bit-Depth": "16",
        **styling.headers(),
    }
    return Started(job, encoder, first, record, headers)


def busy_error(state: Any, error: Busy) -> APIError:
    """No room for a request: counted, and a 429 that says when to retry."""
    state.metrics.refused.inc()
    return APIError(429, str(error), code="busy", headers={"Retry-After": str(error.retry_after)})


def _requested_rate(value: Any, response_format: str) -> int | None:
    """The `sample_rate` extension field: a rate the format can carry, or None (default)."""
    if value is None:
        return None
    rates = codec_rates(response_format) or REQUESTABLE_RATES
    if isinstance(value, bool) or not isinstance(value, int) or value not in rates:
        raise APIError(
            400,
            f"sample_rate for {response_format} must be one of "
            f"{', '.join(map(str, rates))}, got {value!r:.40}",
            param="sample_rate",
            code="invalid_value",
        )
    return value


def _check_option(name: str, value: Any, kind: type) -> None:
    """Extension fields are JSON scalars of the option's type (the engine checks ranges)."""
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**31
    elif kind is float:
        ok = (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
            and abs(value) < 1e6
        )
    else:
        ok = isinstance(value, str) and len(value) <= 64
    if not ok:
        what = {int: "an integer", float: "a finite number", bool: "true or false"}.get(
            kind, "a string of at most 64 characters"
        )
        raise APIError(
            400, f"{name} must be {what}, got {value!r:.40}", param=name, code="invalid_value"
        )


async def respond(
    state: Any, request: Request, speech: SpeechRequest, started: Started
) -> Response:
    """Every response streams as the audio is made (OpenAI does the same for every format):
    raw bytes of `response_format`, or SSE events with base64 audio (and, with
    `return_timestamps`, speech.audio.timestamps events with each sentence's words)."""
    job, encoder = started.job, started.encoder

    async def body() -> AsyncIterator[bytes]:
        async for kind, payload in audio_events(state, request, started):
            if kind == WORDS:
                if speech.stream_format == "sse":
                    words = [word_json(word) for word in payload]
                    yield _sse({"type": TIMESTAMPS_EVENT, "words": words})
                continue
            data = await encode(encoder, payload)
            if speech.stream_format == "sse":
                if data:
                    yield _sse({"type": "speech.audio.delta", "audio": b64(data)})
            elif data:
                yield data
        tail = await blocking(encoder.close)
        if speech.stream_format == "sse":
            if tail:
                yield _sse({"type": "speech.audio.delta", "audio": b64(tail)})
            yield _sse({"type": "speech.audio.done", "usage": _usage(speech, job)})
        elif tail:
            yield tail

    if speech.stream_format == "sse":
        return JobStream(
            job,
            _sse_errors(body()),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", **started.headers},
        )
    return JobStream(
        job, body(), media_type=CONTENT_TYPES[speech.response_format], headers=started.headers
    )


async def encode(encoder: StreamEncoder, samples: np.ndarray) -> bytes:
    """`samples` through the response's encoder: codecs cost real CPU, so off the event loop;
    raw PCM is a copy, and a format sent whole only keeps the samples."""
    if encoder.cheap_feed:
        return encoder.feed(samples)
    return await blocking(encoder.feed, samples)


def word_json(word: WordTiming) -> dict[str, Any]:
    """A timed word as the server sends it (Kokoro-FastAPI's fields, plus `estimated`)."""
    return {
        "word": word.word,
        "start_time": round(word.start, 3),
        "end_time": round(word.end, 3),
        "estimated": word.estimated,
    }


class StreamAborted(Exception):
    """A response whose status was already sent failed mid-body: the connection is closed
    without the final chunk, so the client sees a truncated transfer, not a short file."""


class JobStream(StreamingResponse):
    """A streamed body whose generation stops however the response ends, even when the
    client leaves before the first byte (the body generator then never starts)."""

    def __init__(self, job: Generation, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._job = job

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except APIError as error:
            # Headers are gone: one log line, then end the connection without a last chunk.
            log.error("stream failed after the first byte: %s", error.message)
            raise StreamAborted(error.message) from None
        except OSError:
            # The client went away while we wrote (ASGI 2.4 servers raise this): expected.
            pass
        finally:
            self._job.cancel()  # a no-op once the job has finished


async def next_event(job: Generation, request: Request) -> _Event | None:
    """The job's next event other than START; None when the client left meanwhile (nobody
    reads a body yet, so the request is polled for a disconnect)."""
    while True:
        try:
            kind, payload = await asyncio.wait_for(
                job.events.get(), timeout=DISCONNECT_POLL_SECONDS
            )
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                return None
            continue
        if kind != START:
            return kind, payload, time.perf_counter()


async def audio_events(
    state: Any, request: Request, started: Started, watch: bool = False
) -> AsyncIterator[tuple[str, Any]]:
    """The job's (AUDIO, samples) and (WORDS, timed words) as they come, starting with its
    first event; metrics, the synthesis log line and cancellation in one place. `watch`: no
    body is being sent meanwhile, so poll the client for a disconnect (the events just end
    when it left)."""
    job, record = started.job, started.record
    metrics = state.metrics
    clock = job.clock  # the same clock tells the engine when this listener runs dry
    received = job.received_at
    pending: _Event | None = started.first
    finished = False
    looked = time.perf_counter()  # when the connection was last looked at (watch)
    try:
        while True:
            if pending is not None:
                kind, payload, now = pending
                pending = None
            elif watch:
                # Events may come faster than next_event's idle poll: look at the connection
                # every DISCONNECT_POLL_SECONDS in any case.
                if time.perf_counter() - looked > DISCONNECT_POLL_SECONDS:
                    looked = time.perf_counter()
                    if await request.is_disconnected():
                        return
                event = await next_event(job, request)
                if event is None:
                    return
                kind, payload, now = event
            else:
                kind, payload = await job.events.get()
                now = time.perf_counter()
            if kind == WORDS:
                yield kind, payload
            elif kind == AUDIO:
                seconds = len(payload) / job.output_rate
                if record.first_audio is None:
                    record.first_audio = now - received
                    metrics.time_to_first_audio.observe(now - received)
                    metrics.batch_size.observe(job.model.batch_rows())
                stall = clock.chunk(now, seconds)
                if stall > 0:
                    metrics.underruns.inc()
                    metrics.underrun_seconds.inc(stall)
                record.audio_seconds += seconds
                request.state.audio_seconds = record.audio_seconds
                yield kind, payload
            elif kind == END:
                finished = True
                record.outcome = "done"
                metrics.latency.observe(now - received)
                metrics.audio_seconds.inc(record.audio_seconds)
                if record.audio_seconds > 0:
                    metrics.rtf.observe((now - job.started_at) / record.audio_seconds)
                return
            elif kind == ERROR:
                finished = True
                record.outcome = "error"
                raise client_error(payload)
    finally:
        if not finished:
            job.cancel()
            metrics.cancelled.inc()
            log.info("client went away; generation %s stopped", record.request_id)
        record.log(job.cache_hit)


def _usage(speech: SpeechRequest, job: Generation) -> dict[str, int]:
    # Input tokens: characters of text; output tokens: the model's frames of audio.
    input_tokens = len(speech.input)
    hop = job.model.hop_length or 1
    output_tokens = -(-job.generated_samples // hop)
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "total_tokens": input_tokens + output_tokens,
    }


def _sse(event: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(event, separators=(',', ':'))}\n\n".encode()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


async def _sse_errors(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """An error after the stream started becomes an `error` event, then the stream ends."""
    try:
        async for event in events:
            yield event
    except APIError as error:
        yield _sse({"type": "error", **error.body()})


def client_error(error: BaseException) -> APIError:
    if isinstance(error, APIError):
        return error
    if isinstance(error, ServerStopping):
        return APIError(503, "the server is stopping; retry on another replica", code="stopping")
    if isinstance(error, SsmlError):  # its message names the line and column
        return APIError(400, one_line(error), param="input", code="invalid_ssml")
    if isinstance(error, MarkupError):
        return APIError(400, one_line(error), param="input", code="invalid_markup")
    if isinstance(error, (InputError, AudioError)):
        return APIError(400, one_line(error), code="invalid_value")
    if isinstance(error, OnnxTTSError):
        log.error("generation failed: %s", one_line(error))
        return APIError(500, one_line(error), code="generation_failed")
    log.exception("unexpected error in generation", exc_info=error)
    return APIError(500, f"internal error ({type(error).__name__}); see the server log")


def store_error(error: VoiceStoreError, param: str | None = None) -> APIError:
    """A voice store's refusal as the client's envelope (logged once by the store)."""
    return APIError(error.status, str(error), param=param, code=error.code, headers=error.headers)


def name_error(error: VoiceNameError, param: str) -> APIError:
    """A voice name refused (none or several voices reached, or not one an upload may take)
    as the client's envelope, `param` naming the field."""
    return APIError(error.status, str(error), param=param, code=error.code)


def unknown_model(name: str, registry: ModelRegistry) -> APIError:
    choices = ", ".join(dict.fromkeys([*registry.names(), *DEFAULT_MODEL_ALIASES]))
    return APIError(
        404,
        f"model {name!r} is not loaded; use one of: {choices}",
        param="model",
        code="model_not_found",
    )

"""The ASGI application: OpenAI's speech API over onnx-tts engines.

FastAPI on Starlette: request parsing and routing come with it, StreamingResponse cancels the
body when the client goes away (that is what stops a generation), and uvicorn gives graceful
shutdown on SIGTERM.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import json
import logging
import math
import os
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from onnx_tts.audio import Trimmed
from onnx_tts.config import ServerConfig
from onnx_tts.errors import AudioError, InputError, OnnxTTSError, ReferenceTrimmedWarning
from onnx_tts.request import PlaybackClock
from onnx_tts.server.dispatcher import (
    AUDIO,
    END,
    ERROR,
    START,
    DeadlineGate,
    Dispatcher,
    Generation,
    QueueFull,
)
from onnx_tts.server.encoding import (
    CONTENT_TYPES,
    REQUESTABLE_RATES,
    FormatUnavailable,
    StreamEncoder,
    codec_rates,
    encoded_rate,
)
from onnx_tts.server.engines import DEFAULT_MODEL_ALIASES, ModelRegistry, SpeechModel
from onnx_tts.server.errors import APIError, error_body, one_line
from onnx_tts.server.instructions import Styling, interpret
from onnx_tts.server.metrics import ServerMetrics, SynthesisRecord
from onnx_tts.server.redis_voices import open_voice_store
from onnx_tts.server.schemas import (
    OPENAI_VOICES,
    SpeechRequest,
    nests_deeper_than,
    parse_speech_request,
)
from onnx_tts.server.voices import MAX_NAME_CHARS, VoiceExists
from onnx_tts.server.web import add_routes

log = logging.getLogger("onnx_tts.server")

DEFAULT_MAX_UPLOAD_BYTES = 10 << 20
MAX_JSON_BODY_BYTES = 1 << 20  # a 4096-character input plus options fits many times over
MAX_JSON_DEPTH = 16  # a speech request nests two levels; deeper bodies are refused, not parsed on
DEFAULT_VOICE_NAMES = ("default",)


def default_voices_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or ""
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".local" / "share"
    return root / "onnx-tts" / "voices"


class _State:
    """Everything the handlers share (one per app)."""

    def __init__(self, config: ServerConfig, registry: ModelRegistry) -> None:
        self.config = config
        self.registry = registry
        self.dispatcher = Dispatcher(config.workers, config.max_queue)
        self.gate = DeadlineGate(config.compute_slots or os.cpu_count() or 1)
        # Redis when the server shares one, so every replica sees every upload.
        self.voices = open_voice_store(
            config.voices_dir or default_voices_dir(), registry.caches.redis_url
        )
        self.metrics = ServerMetrics(
            queue_depth=lambda: self.dispatcher.waiting,
            active=lambda: self.dispatcher.active,
            cache_stats=registry.cache_stats,
        )
        self.draining = False
        self._jobs: dict[int, Generation] = {}  # generations whose response is not over

    def track(self, job: Generation) -> None:
        self._jobs[id(job)] = job

    def untrack(self, job: Generation) -> None:
        self._jobs.pop(id(job), None)

    def cancel_all(self) -> int:
        """Stop every generation now (a second stop signal) and end their responses: a
        response still waiting for audio gets 503, a streaming one is cut off. Callable from
        a signal handler; returns how many there were."""
        jobs = list(self._jobs.values())
        for job in jobs:
            job.cancel()
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                job.loop.call_soon_threadsafe(
                    job.events.put_nowait, (ERROR, ServerStopping("the server is stopping"))
                )
        return len(jobs)


class ServerStopping(Exception):
    """A generation stopped because the server was told to stop at once."""


class RequestLog:
    """Pure ASGI middleware: request id, API key check, one log line and the request counter
    per request (after the last byte, so streamed requests log their real duration)."""

    def __init__(self, app: ASGIApp, state: _State) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        request_id = uuid.uuid4().hex[:16]
        scope.setdefault("state", {})
        scope["state"]["request_id"] = request_id
        scope["state"]["audio_seconds"] = 0.0
        status = 500
        path = scope.get("path", "")

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            if self._unauthorized(scope):
                error = APIError(
                    401,
                    "invalid API key: send 'Authorization: Bearer <key>' with the server's "
                    "--api-key",
                    code="invalid_api_key",
                )
                await error.response()(scope, receive, send_with_id)
            else:
                await self.app(scope, receive, send_with_id)
        finally:
            elapsed = time.perf_counter() - start
            route = path if path in _KNOWN_PATHS else _route_label(path)
            self.state.metrics.requests.labels(route, str(status)).inc()
            log.info(
                "request id=%s %s %s status=%d duration=%.3fs audio=%.2fs",
                request_id,
                scope.get("method", ""),
                path,
                status,
                elapsed,
                scope["state"].get("audio_seconds", 0.0),
            )

    def _unauthorized(self, scope: Scope) -> bool:
        key = self.state.config.api_key
        path = scope.get("path", "")
        if not key or not (path.startswith("/v1/") or path == "/metrics"):
            return False
        headers = dict(scope.get("headers", []))
        # Bytes on both sides: a header may hold any octet (non-ASCII ones too), and
        # hmac.compare_digest refuses str with non-ASCII characters.
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        return not (
            scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), key.encode())
        )


_KNOWN_PATHS = {
    "/",
    "/docs",
    "/openapi.json",
    "/v1/audio/speech",
    "/v1/audio/voices",
    "/v1/models",
    "/health",
    "/metrics",
}


def _route_label(path: str) -> str:
    # Bounded label values: ids in paths collapse to their route.
    if path.startswith("/v1/audio/voices/"):
        return "/v1/audio/voices/{id}"
    if path.startswith("/v1/models/"):
        return "/v1/models/{id}"
    if path.startswith("/static/"):
        return "/static/{name}"
    return "other"


def create_app(config: ServerConfig, registry: ModelRegistry | None = None) -> FastAPI:
    """The app; models load in the background when it starts (GET /health is 503 until then)."""
    registry = registry or ModelRegistry(config.models or [None])
    state = _State(config, registry)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loading = None
        if not registry.ready.is_set():
            loading = asyncio.get_running_loop().run_in_executor(None, _load_models, registry)
        yield
        state.draining = True
        if loading is not None:
            await loading  # a stop during loading lets the load finish, then exits cleanly
        await run_in_threadpool(state.dispatcher.shutdown)

    # FastAPI's /docs and /redoc load their assets from a CDN (blank offline): web.py serves
    # a page of ours at /docs instead, beside the web page at /.
    app = FastAPI(
        title="onnx-tts", version=_version(), lifespan=lifespan, docs_url=None, redoc_url=None
    )
    app.state.server = state
    app.add_middleware(RequestLog, state=state)
    _install_error_handlers(app)
    add_routes(app)

    @app.get("/health")
    async def health() -> JSONResponse:
        if registry.error is not None:
            body = {"status": "error", "error": one_line(registry.error)}
            return JSONResponse(body, status_code=503)
        if state.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        if not registry.loaded:
            return JSONResponse({"status": "loading"}, status_code=503)
        return JSONResponse({"status": "ok", "models": registry.names()})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        _require_ready(state)
        cards = [_model_card(m) for m in registry.models.values()]
        default = registry.default
        assert default is not None
        aliases = [
            {**_model_card(default), "id": alias, "alias_of": default.name}
            for alias in DEFAULT_MODEL_ALIASES
            if alias not in registry.models
        ]
        return {"object": "list", "data": cards + aliases}

    @app.get("/v1/models/{model_id}")
    async def get_model(model_id: str) -> dict[str, Any]:
        _require_ready(state)
        model = registry.get(model_id)
        if model is None:
            raise _unknown_model(model_id, registry)
        return _model_card(model)

    @app.get("/v1/audio/voices")
    async def list_voices() -> dict[str, Any]:
        stored = [{"id": v.id, "name": v.name} for v in state.voices.list()]
        return {"voices": [{"id": "default", "name": "default"}, *stored]}

    @app.post("/v1/audio/voices")
    async def upload_voice(request: Request) -> JSONResponse:
        _require_ready(state)
        name, audio_bytes = await _read_voice_upload(request, config.max_upload_bytes)
        model = registry.default
        assert model is not None
        trims: list[ReferenceTrimmedWarning] = []
        audio = await run_in_threadpool(_decode_upload, model, audio_bytes, trims.append)
        try:
            # Encode once now: a clip the encoder rejects fails here, not on first use.
            await run_in_threadpool(model.encode_voice, audio)
            voice, created = state.voices.add(name, audio, model.voice_rate)
        except OverflowError as error:
            raise APIError(400, str(error), code="too_many_voices") from None
        except VoiceExists as error:
            raise APIError(409, str(error), param="name", code="voice_exists") from None
        headers = {}
        if trims:  # a long clip is cut to what the encoder takes: said, never silent
            trim = trims[0]
            headers["X-Reference-Trimmed"] = f"{trim.seconds:.1f} s; kept the first {trim.kept:g} s"
            log.warning(
                "voice %r: audio_sample is %.1f s long; only its first %g s are used",
                name,
                trim.seconds,
                trim.kept,
            )
        return JSONResponse(voice.public(), status_code=201 if created else 200, headers=headers)

    @app.delete("/v1/audio/voices/{voice_id}")
    async def delete_voice(voice_id: str) -> dict[str, Any]:
        if not state.voices.delete(voice_id):
            raise APIError(
                404, f"no voice with id {voice_id!r}", param="voice_id", code="voice_not_found"
            )
        return {"id": voice_id, "object": "audio.voice", "deleted": True}

    @app.post("/v1/audio/speech")
    async def speech(request: Request) -> Response:
        received = time.perf_counter()
        _require_ready(state)
        if state.draining:
            raise APIError(503, "the server is shutting down; retry on another replica")
        body = await _read_json(request)
        speech_request = parse_speech_request(body)
        job, styling = _plan(state, speech_request, received)
        try:
            encoder = await run_in_threadpool(
                StreamEncoder, speech_request.response_format, job.output_rate
            )
        except FormatUnavailable as error:
            raise APIError(
                400, str(error), param="response_format", code="unsupported_format"
            ) from None
        record = SynthesisRecord(
            request_id=request.state.request_id,
            model=job.model.name,
            voice=speech_request.voice_id,
            characters=len(speech_request.input),
            response_format=speech_request.response_format,
        )
        if styling.ignored:
            log.warning(
                "instructions ignored id=%s: %s",
                record.request_id,
                styling.headers()["X-Instructions-Ignored"],
            )
        try:
            state.dispatcher.submit(job.run)  # the job reports through its event queue
        except QueueFull:
            raise APIError(
                429,
                f"the server is busy ({config.max_queue} requests waiting); retry shortly",
                code="queue_full",
                headers={"Retry-After": "1"},
            ) from None
        state.track(job)
        try:
            first = await _next_event(job, request)
        except BaseException:
            job.cancel()
            state.untrack(job)
            raise
        if first is None or first[0] == ERROR:
            job.cancel()
            state.untrack(job)
            if first is None:  # the client left before the first audio
                state.metrics.cancelled.inc()
                record.log(job.cache_hit)
                return Response(status_code=499)
            raise _client_error(first[1])
        return _respond(
            state, request, speech_request, job, encoder, first, record, styling.headers()
        )

    return app


def _version() -> str:
    from onnx_tts import __version__

    return __version__


def _load_models(registry: ModelRegistry) -> None:
    try:
        registry.load_all()
        log.info("models ready: %s", ", ".join(registry.names()))
    except Exception as error:
        log.error("cannot load models: %s", one_line(error))


def _require_ready(state: _State) -> None:
    if state.registry.error is not None:
        raise APIError(503, f"the model failed to load: {one_line(state.registry.error)}")
    if not state.registry.loaded:
        raise APIError(503, "the model is still loading; retry in a moment", code="loading")


def _model_card(model: SpeechModel) -> dict[str, Any]:
    return {
        "id": model.name,
        "object": "model",
        "created": model.created,
        "owned_by": "onnx-tts",
        "sample_rate": model.sample_rate,
        "options": list(model.options),
    }


def _unknown_model(name: str, registry: ModelRegistry) -> APIError:
    choices = ", ".join(dict.fromkeys([*registry.names(), *DEFAULT_MODEL_ALIASES]))
    return APIError(
        404,
        f"model {name!r} is not loaded; use one of: {choices}",
        param="model",
        code="model_not_found",
    )


# -- speech -------------------------------------------------------------------------------------


def _plan(state: _State, request: SpeechRequest, received: float) -> tuple[Generation, Styling]:
    model = state.registry.get(request.model)
    if model is None:
        raise _unknown_model(request.model, state.registry)
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
    voice_audio = None
    name = request.voice_id
    if name not in DEFAULT_VOICE_NAMES and name not in OPENAI_VOICES:
        voice = state.voices.find(name)
        if voice is None:
            raise APIError(
                404,
                f"unknown voice {name!r}; use 'default' or an id from GET /v1/audio/voices",
                param="voice",
                code="voice_not_found",
            )
        voice_audio = state.voices.audio(voice, model.voice_rate)
    job = Generation(
        model=model,
        text=request.input,
        voice_audio=voice_audio,
        seed=request.seed,
        options=options,
        speed=styling.speed(request.speed),
        output_rate=encoded_rate(request.response_format, model.sample_rate, sample_rate),
        loop=asyncio.get_running_loop(),
        gate=state.gate,
        received_at=received,
    )
    return job, styling


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


def _respond(
    state: _State,
    request: Request,
    speech: SpeechRequest,
    job: Generation,
    encoder: StreamEncoder,
    first: _Event,
    record: SynthesisRecord,
    headers: dict[str, str],
) -> Response:
    """Every response streams as the audio is made (OpenAI does the same for every format):
    raw bytes of `response_format`, or SSE events with base64 audio."""
    fmt = speech.response_format
    rate = job.output_rate
    headers = {
        "X-Sample-Rate": str(rate),
        "X-Channels": "1",
        "X-Bit-Depth": "16",
        **headers,
    }

    async def body() -> AsyncIterator[bytes]:
        async for samples in _audio_events(state, request, job, first, record):
            # Codecs cost real CPU: off the event loop; raw PCM is a copy.
            if fmt in ("pcm", "wav"):
                data = encoder.feed(samples)
            else:
                data = await run_in_threadpool(encoder.feed, samples)
            if speech.stream_format == "sse":
                if data:
                    yield _sse({"type": "speech.audio.delta", "audio": _b64(data)})
            elif data:
                yield data
        tail = await run_in_threadpool(encoder.close)
        if speech.stream_format == "sse":
            if tail:
                yield _sse({"type": "speech.audio.delta", "audio": _b64(tail)})
            yield _sse({"type": "speech.audio.done", "usage": _usage(speech, job)})
        elif tail:
            yield tail

    if speech.stream_format == "sse":
        return _JobStream(
            state,
            job,
            _sse_errors(body()),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", **headers},
        )
    return _JobStream(state, job, body(), media_type=CONTENT_TYPES[fmt], headers=headers)


class StreamAborted(Exception):
    """A response whose status was already sent failed mid-body: the connection is closed
    without the final chunk, so the client sees a truncated transfer, not a short file."""


class _JobStream(StreamingResponse):
    """A streamed body whose generation stops however the response ends, even when the
    client leaves before the first byte (the body generator then never starts)."""

    def __init__(self, state: _State, job: Generation, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._state = state
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
            self._state.untrack(self._job)


# (kind, payload, arrival time) as the handler saw it.
_Event = tuple[str, Any, float]


async def _next_event(job: Generation, request: Request) -> _Event | None:
    """The job's next event other than START; None when the client left meanwhile (nobody
    reads a body yet, so the request is polled for a disconnect)."""
    while True:
        try:
            kind, payload = await asyncio.wait_for(job.events.get(), timeout=0.25)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                return None
            continue
        if kind != START:
            return kind, payload, time.perf_counter()


async def _audio_events(
    state: _State,
    request: Request,
    job: Generation,
    first: _Event,
    record: SynthesisRecord,
) -> AsyncIterator[np.ndarray]:
    """The job's audio as it comes, starting with `first`; metrics, the synthesis log line
    and cancellation in one place."""
    metrics = state.metrics
    clock = PlaybackClock()
    received = job.received_at
    pending: _Event | None = first
    finished = False
    try:
        while True:
            if pending is not None:
                kind, payload, now = pending
                pending = None
            else:
                kind, payload = await job.events.get()
                now = time.perf_counter()
            if kind == AUDIO:
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
                yield payload
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
                raise _client_error(payload)
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


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


async def _sse_errors(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """An error after the stream started becomes an `error` event, then the stream ends."""
    try:
        async for event in events:
            yield event
    except APIError as error:
        yield _sse({"type": "error", **error.body()})


def _client_error(error: BaseException) -> APIError:
    if isinstance(error, APIError):
        return error
    if isinstance(error, ServerStopping):
        return APIError(503, "the server is stopping; retry on another replica", code="stopping")
    if isinstance(error, (InputError, AudioError)):
        return APIError(400, one_line(error), code="invalid_value")
    if isinstance(error, OnnxTTSError):
        log.error("generation failed: %s", one_line(error))
        return APIError(500, one_line(error), code="generation_failed")
    log.exception("unexpected error in generation", exc_info=error)
    return APIError(500, f"internal error ({type(error).__name__}); see the server log")


# -- request bodies -----------------------------------------------------------------------------


async def _read_limited(request: Request, limit: int, what: str) -> AsyncIterator[bytes]:
    """The body in chunks: at most `limit` bytes (413), each chunk within the body idle
    timeout and the whole within the body timeout (408), so a client that stops sending
    holds a worker-free connection for a bounded time only."""
    config: ServerConfig = request.app.state.server.config
    length = request.headers.get("content-length")
    if length is not None and length.isascii() and length.isdigit() and int(length) > limit:
        raise _too_large(what, limit)
    total = 0
    deadline = time.monotonic() + config.body_timeout
    chunks = request.stream().__aiter__()
    while True:
        wait = min(config.body_idle_timeout, deadline - time.monotonic())
        try:
            chunk = await asyncio.wait_for(chunks.__anext__(), timeout=max(wait, 0.001))
        except StopAsyncIteration:
            return
        except asyncio.TimeoutError:
            raise APIError(
                408,
                f"{what} did not arrive in time (at most {config.body_idle_timeout:g} s between "
                f"chunks and {config.body_timeout:g} s in all); send the whole body at once",
                code="request_timeout",
                headers={"Connection": "close"},
            ) from None
        total += len(chunk)
        if total > limit:
            raise _too_large(what, limit)
        yield chunk


def _too_large(what: str, limit: int) -> APIError:
    return APIError(
        413, f"{what} is larger than the server's limit of {limit} bytes", code="too_large"
    )


async def _read_json(request: Request) -> Any:
    data = b"".join([c async for c in _read_limited(request, MAX_JSON_BODY_BYTES, "the body")])
    try:
        value = json.loads(data)
    except RecursionError:
        value = None
        deep = True
    except (ValueError, UnicodeDecodeError):
        raise APIError(400, "the request body is not valid JSON", code="invalid_json") from None
    else:
        deep = nests_deeper_than(value, MAX_JSON_DEPTH)
    if deep:
        raise APIError(
            400,
            f"the request body nests deeper than {MAX_JSON_DEPTH} levels; a speech request "
            "needs two (an object and an optional voice object)",
            code="invalid_json",
        )
    return value


async def _read_voice_upload(request: Request, limit: int) -> tuple[str, bytes]:
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith("multipart/form-data"):
        raise APIError(
            400,
            "upload a voice as multipart/form-data with fields 'audio_sample' (file) and 'name'",
            code="invalid_content_type",
        )
    parser = MultiPartParser(
        request.headers,
        _read_limited(request, limit, "the upload"),
        max_files=1,
        max_fields=8,
        max_part_size=MAX_NAME_CHARS * 4,
    )
    try:
        form = await parser.parse()
    except MultiPartException as error:
        raise APIError(
            400, f"bad multipart body: {error.message}", code="invalid_multipart"
        ) from None
    try:
        name = form.get("name")
        sample = form.get("audio_sample")
        if not isinstance(name, str) or not name.strip():
            raise APIError(400, "'name' is required", param="name", code="missing_field")
        if len(name) > MAX_NAME_CHARS:
            raise APIError(
                400, f"name: at most {MAX_NAME_CHARS} characters", param="name", code="too_long"
            )
        if sample is None or isinstance(sample, str):
            raise APIError(
                400,
                "'audio_sample' (a file) is required",
                param="audio_sample",
                code="missing_field",
            )
        return name.strip(), await sample.read()
    finally:
        await form.close()


def _decode_upload(model: SpeechModel, data: bytes, on_trim: Trimmed) -> np.ndarray:
    if not data:
        raise APIError(400, "audio_sample is empty", param="audio_sample", code="invalid_audio")
    with tempfile.TemporaryDirectory(prefix="onnx-tts-upload-") as tmp:
        path = Path(tmp) / "sample"
        path.write_bytes(data)
        try:
            return model.decode_voice(path, on_trim)
        except AudioError as error:
            # The engine names the temp file; the client knows it as audio_sample.
            message = one_line(error).replace(str(path), "audio_sample")
            raise APIError(400, message, param="audio_sample", code="invalid_audio") from None


# -- errors -------------------------------------------------------------------------------------


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(_: Request, error: APIError) -> JSONResponse:
        return error.response()

    @app.exception_handler(OnnxTTSError)
    async def engine_error(_: Request, error: OnnxTTSError) -> JSONResponse:
        return _client_error(error).response()

    @app.exception_handler(RequestValidationError)
    async def validation(_: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        location = [str(p) for p in first.get("loc", ()) if p not in ("body", "path", "query")]
        message = first.get("msg", "invalid request")
        return APIError(400, message, param=location[0] if location else None).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
        message = error.detail if isinstance(error.detail, str) else "request failed"
        if error.status_code == 404:
            message = "no such endpoint; see GET /docs"
        return JSONResponse(
            error_body(error.status_code, message),
            status_code=error.status_code,
            headers=getattr(error, "headers", None),
        )

    @app.exception_handler(Exception)
    async def unexpected(_: Request, error: Exception) -> JSONResponse:
        log.exception("unexpected error", exc_info=error)
        return APIError(
            500, f"internal error ({type(error).__name__}); see the server log"
        ).response()

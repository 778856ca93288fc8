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

from onnx_tts.config import ServerConfig
from onnx_tts.errors import AudioError, InputError, OnnxTTSError
from onnx_tts.request import PlaybackClock
from onnx_tts.server.dispatcher import (
    AUDIO,
    END,
    ERROR,
    DeadlineGate,
    Dispatcher,
    Generation,
    QueueFull,
)
from onnx_tts.server.encoding import CONTENT_TYPES, StreamEncoder, encode_file, encoded_rate
from onnx_tts.server.engines import ModelRegistry, SpeechModel
from onnx_tts.server.errors import APIError, error_body, one_line
from onnx_tts.server.metrics import ServerMetrics
from onnx_tts.server.redis_voices import open_voice_store
from onnx_tts.server.schemas import OPENAI_VOICES, SpeechRequest, parse_speech_request
from onnx_tts.server.voices import MAX_NAME_CHARS

log = logging.getLogger("onnx_tts.server")

DEFAULT_MAX_UPLOAD_BYTES = 10 << 20
MAX_JSON_BODY_BYTES = 1 << 20  # a 4096-character input plus options fits many times over
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
        given = headers.get(b"authorization", b"").decode("latin-1")
        scheme, _, token = given.partition(" ")
        return not (scheme.lower() == "bearer" and hmac.compare_digest(token.strip(), key))


_KNOWN_PATHS = {"/v1/audio/speech", "/v1/audio/voices", "/v1/models", "/health", "/metrics"}


def _route_label(path: str) -> str:
    # Bounded label values: ids in paths collapse to their route.
    if path.startswith("/v1/audio/voices/"):
        return "/v1/audio/voices/{id}"
    if path.startswith("/v1/models/"):
        return "/v1/models/{id}"
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

    app = FastAPI(title="onnx-tts", version=_version(), lifespan=lifespan, docs_url="/docs")
    app.state.server = state
    app.add_middleware(RequestLog, state=state)
    _install_error_handlers(app)

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
        return {"object": "list", "data": [_model_card(m) for m in registry.models.values()]}

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
        audio = await run_in_threadpool(_decode_upload, model, audio_bytes)
        try:
            # Encode once now: a clip the encoder rejects fails here, not on first use.
            await run_in_threadpool(model.encode_voice, audio)
            voice = state.voices.add(name, audio, model.voice_rate)
        except OverflowError as error:
            raise APIError(400, str(error), code="too_many_voices") from None
        return JSONResponse(voice.public(), status_code=201)

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
        job = _plan(state, speech_request, received)
        try:
            future = state.dispatcher.submit(job.run)
        except QueueFull:
            raise APIError(
                429,
                f"the server is busy ({config.max_queue} requests waiting); retry shortly",
                code="queue_full",
                headers={"Retry-After": "1"},
            ) from None
        del future  # the job reports through its event queue
        try:
            kind, payload = await job.events.get()
        except asyncio.CancelledError:
            job.cancel()
            raise
        if kind == ERROR:
            raise _client_error(payload)
        return _respond(state, request, speech_request, job, received)

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
    choices = ", ".join([*registry.names(), "tts-1", "tts-1-hd", "onnx-tts"])
    return APIError(
        404,
        f"model {name!r} is not loaded; use one of: {choices}",
        param="model",
        code="model_not_found",
    )


# -- speech -------------------------------------------------------------------------------------


def _plan(state: _State, request: SpeechRequest, received: float) -> Generation:
    model = state.registry.get(request.model)
    if model is None:
        raise _unknown_model(request.model, state.registry)
    options = {k: v for k, v in request.extensions().items() if v is not None}
    unknown = sorted(set(options) - set(model.options))
    if unknown:
        raise APIError(
            400,
            f"unknown field {unknown[0]!r} for model {model.name!r}; it takes: "
            f"{', '.join(('seed', *model.options))}",
            param=unknown[0],
            code="unknown_parameter",
        )
    for key, value in options.items():
        _check_option(key, value, model.options[key])
    voice_audio = None
    name = request.voice_id
    if name not in DEFAULT_VOICE_NAMES and name not in OPENAI_VOICES:
        voice = state.voices.find(name)
        if voice is None:
            raise APIError(
                400,
                f"unknown voice {name!r}; use 'default' or an id from GET /v1/audio/voices",
                param="voice",
                code="voice_not_found",
            )
        voice_audio = state.voices.audio(voice, model.voice_rate)
    return Generation(
        model=model,
        text=request.input,
        voice_audio=voice_audio,
        seed=request.seed,
        options=options,
        speed=request.speed,
        output_rate=encoded_rate(request.response_format, model.sample_rate),
        loop=asyncio.get_running_loop(),
        gate=state.gate,
        received_at=received,
    )


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
    state: _State, request: Request, speech: SpeechRequest, job: Generation, received: float
) -> Response:
    fmt = speech.response_format
    rate = job.output_rate
    audio_headers = {"X-Sample-Rate": str(rate), "X-Channels": "1", "X-Bit-Depth": "16"}
    if speech.stream_format is None:
        return _WholeFile(state, request, speech, job, received, audio_headers)

    async def body() -> AsyncIterator[bytes]:
        encoder = StreamEncoder(fmt, rate)
        async for samples in _audio_events(state, request, job, received):
            # libsndfile codecs cost real CPU: off the event loop; raw PCM is a copy.
            if fmt in ("pcm", "wav"):
                data = encoder.feed(samples)
            else:
                data = await run_in_threadpool(encoder.feed, samples)
            if speech.stream_format == "sse":
                if data:
                    yield _sse({"type": "speech.audio.delta", "audio": _b64(data)})
            elif data:
                yield data
        tail = encoder.close()
        if speech.stream_format == "sse":
            if tail:
                yield _sse({"type": "speech.audio.delta", "audio": _b64(tail)})
            yield _sse({"type": "speech.audio.done", "usage": _usage(speech, job)})
        elif tail:
            yield tail

    if speech.stream_format == "sse":
        return _JobStream(
            job,
            _sse_errors(body()),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", **audio_headers},
        )
    return _JobStream(job, body(), media_type=CONTENT_TYPES[fmt], headers=audio_headers)


class _JobStream(StreamingResponse):
    """A streamed body whose generation stops however the response ends, even when the
    client leaves before the first byte (the body generator then never starts)."""

    def __init__(self, job: Generation, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._job = job

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._job.cancel()  # a no-op once the job has finished


class _WholeFile(Response):
    """Waits for the whole audio (watching for a disconnect), then sends one file."""

    def __init__(
        self,
        state: _State,
        request: Request,
        speech: SpeechRequest,
        job: Generation,
        received: float,
        headers: dict[str, str],
    ) -> None:
        super().__init__(media_type=CONTENT_TYPES[speech.response_format])
        self._headers = headers
        self._args = (state, request, speech, job, received)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state, request, speech, job, received = self._args
        pieces = []
        try:
            async for samples in _audio_events(state, request, job, received, whole=True):
                pieces.append(samples)
        except APIError as error:
            await error.response()(scope, receive, send)
            return
        samples = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
        data = await run_in_threadpool(
            encode_file, samples, job.output_rate, speech.response_format
        )
        response = Response(data, media_type=self.media_type, headers=self._headers)
        await response(scope, receive, send)


async def _audio_events(
    state: _State, request: Request, job: Generation, received: float, whole: bool = False
) -> AsyncIterator[np.ndarray]:
    """The job's audio as it comes; metrics and cancellation in one place."""
    metrics = state.metrics
    clock = PlaybackClock()
    audio_seconds = 0.0
    first = True
    finished = False
    try:
        while True:
            if whole:
                # Nobody reads a body yet: poll for a disconnect while waiting.
                try:
                    kind, payload = await asyncio.wait_for(job.events.get(), timeout=0.25)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        return
                    continue
            else:
                kind, payload = await job.events.get()
            now = time.perf_counter()
            if kind == AUDIO:
                seconds = len(payload) / job.output_rate
                if first:
                    metrics.time_to_first_audio.observe(now - received)
                    metrics.batch_size.observe(job.model.batch_rows())
                    first = False
                if not whole:
                    stall = clock.chunk(now, seconds)
                    if stall > 0:
                        metrics.underruns.inc()
                        metrics.underrun_seconds.inc(stall)
                audio_seconds += seconds
                request.state.audio_seconds = audio_seconds
                yield payload
            elif kind == END:
                finished = True
                metrics.latency.observe(now - received)
                metrics.audio_seconds.inc(audio_seconds)
                if audio_seconds > 0:
                    metrics.rtf.observe((now - job.started_at) / audio_seconds)
                return
            elif kind == ERROR:
                finished = True
                raise _client_error(payload)
    finally:
        if not finished:
            job.cancel()
            metrics.cancelled.inc()


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
    if isinstance(error, (InputError, AudioError)):
        return APIError(400, one_line(error), code="invalid_value")
    if isinstance(error, OnnxTTSError):
        log.error("generation failed: %s", one_line(error))
        return APIError(500, one_line(error), code="generation_failed")
    log.exception("unexpected error in generation", exc_info=error)
    return APIError(500, f"internal error ({type(error).__name__}); see the server log")


# -- request bodies -----------------------------------------------------------------------------


async def _read_limited(request: Request, limit: int, what: str) -> AsyncIterator[bytes]:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise _too_large(what, limit)
    total = 0
    async for chunk in request.stream():
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
        return json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise APIError(400, "the request body is not valid JSON", code="invalid_json") from None


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


def _decode_upload(model: SpeechModel, data: bytes) -> np.ndarray:
    if not data:
        raise APIError(400, "audio_sample is empty", param="audio_sample", code="invalid_audio")
    with tempfile.TemporaryDirectory(prefix="onnx-tts-upload-") as tmp:
        path = Path(tmp) / "sample"
        path.write_bytes(data)
        try:
            return model.decode_voice(path)
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

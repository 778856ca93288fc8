"""The ASGI application: OpenAI's speech API over onnx-tts engines.

FastAPI on Starlette: request parsing and routing come with it, StreamingResponse cancels the
body when the client goes away (that is what stops a generation), and uvicorn gives graceful
shutdown on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from onnx_tts.cache.codec import resolve_cache_secret
from onnx_tts.config import ServerConfig
from onnx_tts.errors import OnnxTTSError, ReferenceTrimmedWarning
from onnx_tts.server.bodies import decode_upload, read_json, read_voice_upload
from onnx_tts.server.captions import respond_captioned
from onnx_tts.server.engines import DEFAULT_MODEL_ALIASES, ModelRegistry, SpeechModel
from onnx_tts.server.errors import APIError, error_body, one_line
from onnx_tts.server.jobs import ServerStopping
from onnx_tts.server.metrics import ServerMetrics
from onnx_tts.server.middleware import RequestLog
from onnx_tts.server.redis_voices import open_voice_store
from onnx_tts.server.schemas import CaptionedSpeechRequest, SpeechRequest, parse_speech_request
from onnx_tts.server.speech import (
    client_error,
    name_error,
    respond,
    start_speech,
    store_error,
    unknown_model,
)
from onnx_tts.server.threads import blocking, trim_idle_threads
from onnx_tts.server.voice_names import VoiceNameError, check_new_name, reserved_names
from onnx_tts.server.voices import VoiceExists, VoiceStoreError
from onnx_tts.server.web import add_routes

log = logging.getLogger("onnx_tts.server")

DEFAULT_MAX_UPLOAD_BYTES = 10 << 20


def default_voices_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or ""
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".local" / "share"
    return root / "onnx-tts" / "voices"


class _State:
    """Everything the handlers share (one per app)."""

    def __init__(self, config: ServerConfig, registry: ModelRegistry) -> None:
        self.config = config
        self.registry = registry
        # Redis when the server shares one, so every replica sees every upload; with a cache
        # secret every voice is signed and an unsigned one is neither listed nor used.
        self.voices = open_voice_store(
            config.voices_dir or default_voices_dir(),
            registry.caches.redis_url,
            resolve_cache_secret(registry.caches.cache_secret),
        )
        self.metrics = ServerMetrics(
            queue_depth=lambda: sum(m.admission.waiting for m in registry.models.values()),
            active=lambda: sum(m.admission.active for m in registry.models.values()),
            cache_stats=registry.cache_stats,
            stage_stats=registry.stage_stats,
            voices_rejected=lambda: self.voices.rejected,
        )
        self.draining = False

    def cancel_all(self) -> int:
        """Stop every generation now (a second stop signal) and end their responses: a
        response still waiting for audio gets 503, a streaming one is cut off. Callable from
        a signal handler; returns how many there were."""
        jobs = [job for model in self.registry.models.values() for job in model.jobs.values()]
        for job in jobs:
            job.stop(ServerStopping("the server is stopping"))
        return len(jobs)


def create_app(config: ServerConfig, registry: ModelRegistry | None = None) -> FastAPI:
    """The app; models load in the background when it starts (GET /health is 503 until then)."""
    registry = registry or ModelRegistry(
        config.models or [None], max_streams=config.max_streams, max_waiting=config.max_queue
    )
    state = _State(config, registry)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loading = None
        if not registry.ready.is_set():
            loading = asyncio.create_task(blocking(_load_models, registry))
        trimming = asyncio.create_task(trim_idle_threads())
        yield
        state.draining = True
        if loading is not None:
            await loading  # a stop during loading lets the load finish, then exits cleanly
        for model in registry.models.values():  # stop each engine's scheduler and vocoder
            await blocking(model.engine.close)
        trimming.cancel()

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
        cards += [  # a folder's models not loaded yet (loaded when first asked for)
            {"id": name, "object": "model", "created": 0, "owned_by": "onnx-tts", "loaded": False}
            for name in registry.folder_models
            if name not in registry.models
        ]
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
        model = await blocking(registry.get, model_id)  # (a folder's: loaded now)
        if model is None:
            raise unknown_model(model_id, registry)
        return _model_card(model)

    @app.get("/v1/audio/voices")
    async def list_voices() -> dict[str, Any]:
        try:
            listed = await blocking(state.voices.list)
        except VoiceStoreError as error:
            raise store_error(error) from None
        stored = [{"id": v.id, "name": v.name} for v in listed]
        builtin = [
            {"id": name, "name": name, "model": model.name}
            for model in state.registry.models.values()
            for name in model.builtin_voices
        ]
        return {"voices": [{"id": "default", "name": "default"}, *builtin, *stored]}

    @app.post("/v1/audio/voices")
    async def upload_voice(request: Request) -> JSONResponse:
        _require_ready(state)
        name, audio_bytes = await read_voice_upload(request, config.max_upload_bytes)
        model = registry.default
        assert model is not None
        # A name that already reaches a voice is refused before any work (voice_names).
        reserved = reserved_names({m.name: m.builtin_voices for m in registry.models.values()})
        try:
            check_new_name(name, reserved)
        except VoiceNameError as error:
            raise name_error(error, "name") from None
        trims: list[ReferenceTrimmedWarning] = []
        audio = await blocking(decode_upload, model, audio_bytes, trims.append)
        try:
            # Encode once now: a clip the encoder rejects fails here, not on first use.
            await blocking(model.encode_voice, audio)
            voice, created = await blocking(
                state.voices.add, name, audio, model.voice_rate, reserved
            )
        except OverflowError as error:
            raise APIError(400, str(error), code="too_many_voices") from None
        except VoiceNameError as error:
            raise name_error(error, "name") from None
        except VoiceExists as error:
            raise APIError(409, str(error), param="name", code=error.code) from None
        except VoiceStoreError as error:
            raise store_error(error) from None
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

    @app.get("/v1/audio/voices/{voice_id}")
    async def get_voice(voice_id: str) -> dict[str, Any]:
        try:
            voice = await blocking(state.voices.get, voice_id)
        except VoiceStoreError as error:
            raise store_error(error) from None
        if voice is None:
            raise APIError(
                404, f"no voice with id {voice_id!r}", param="voice_id", code="voice_not_found"
            )
        return voice.public()

    @app.delete("/v1/audio/voices/{voice_id}")
    async def delete_voice(voice_id: str) -> dict[str, Any]:
        try:
            deleted = await blocking(state.voices.delete, voice_id)
        except VoiceStoreError as error:
            raise store_error(error) from None
        if not deleted:
            raise APIError(
                404, f"no voice with id {voice_id!r}", param="voice_id", code="voice_not_found"
            )
        return {"id": voice_id, "object": "audio.voice", "deleted": True}

    async def speak(request: Request, kind: type[SpeechRequest], answer: Any) -> Response:
        """A speech request of `kind` checked, started and answered by `answer`."""
        received = time.perf_counter()
        _require_ready(state)
        if state.draining:
            raise APIError(503, "the server is shutting down; retry on another replica")
        speech_request = parse_speech_request(await read_json(request), kind)
        started = await start_speech(state, request, speech_request, received)
        if isinstance(started, Response):
            return started
        return await answer(state, request, speech_request, started)

    @app.post("/v1/audio/speech")
    async def speech(request: Request) -> Response:
        return await speak(request, SpeechRequest, respond)

    @app.post("/dev/captioned_speech")
    async def captioned_speech(request: Request) -> Response:
        return await speak(request, CaptionedSpeechRequest, respond_captioned)

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


# -- errors -------------------------------------------------------------------------------------


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(_: Request, error: APIError) -> JSONResponse:
        return error.response()

    @app.exception_handler(OnnxTTSError)
    async def engine_error(_: Request, error: OnnxTTSError) -> JSONResponse:
        return client_error(error).response()

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

"""Request bodies read within their limits: size (413), time (408: --body-timeout,
--body-idle-timeout) and JSON nesting; voice uploads as multipart. A body cut off (the client
closed the connection, or sent a malformed chunked body) is a 400 and one log line; a full
temporary directory while a large upload spools is a 507 naming it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import tempfile
import time
import unicodedata
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from fastapi import Request
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect

from onnx_tts.audio import Trimmed
from onnx_tts.config import ServerConfig
from onnx_tts.errors import AudioError
from onnx_tts.server.engines import SpeechModel
from onnx_tts.server.errors import NO_SPACE_ERRNOS, APIError, one_line
from onnx_tts.server.schemas import (
    nests_deeper_than,
)
from onnx_tts.server.voice_names import MAX_NAME_CHARS

log = logging.getLogger("onnx_tts.server")

MAX_JSON_BODY_BYTES = 1 << 20  # a 4096-character input plus options fits many times over
MAX_JSON_DEPTH = 16  # a speech request nests two levels; deeper bodies are refused, not parsed on

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
        except ClientDisconnect:
            # The client closed mid-body, or uvicorn dropped a malformed chunked body (and
            # answered 400 itself): an expected end, not a server fault.
            raise APIError(
                400,
                f"{what} did not arrive whole: the connection closed, or its chunked encoding "
                "is malformed",
                code="incomplete_body",
                headers={"Connection": "close"},
            ) from None
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


async def read_json(request: Request) -> Any:
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


async def read_voice_upload(request: Request, limit: int) -> tuple[str, bytes]:
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
    except OSError as error:  # a large part spools to the temporary directory, which is full
        raise _spool_failed(error) from None
    try:
        name = form.get("name")
        sample = form.get("audio_sample")
        if not isinstance(name, str) or not name.strip():
            raise APIError(400, "'name' is required", param="name", code="missing_field")
        if len(name) > MAX_NAME_CHARS:
            raise APIError(
                400, f"name: at most {MAX_NAME_CHARS} characters", param="name", code="too_long"
            )
        if any(unicodedata.category(c) == "Cc" for c in name):
            # NUL, newlines, escapes: a name is shown in lists, logs and the web page.
            raise APIError(
                400,
                "name: no control characters (NUL, newlines, escapes)",
                param="name",
                code="invalid_value",
            )
        if sample is None or isinstance(sample, str):
            raise APIError(
                400,
                "'audio_sample' (a file) is required",
                param="audio_sample",
                code="missing_field",
            )
        try:
            return name, await sample.read()
        except OSError as error:
            raise _spool_failed(error) from None
    finally:
        with contextlib.suppress(OSError):
            await form.close()


def _spool_failed(error: OSError) -> APIError:
    """An upload that could not be spooled (starlette keeps a part over 1 MiB in a temporary
    file): 507 when the temporary directory is full, else 500, one line naming it."""
    where = f"the temporary directory ({tempfile.gettempdir()}; set TMPDIR)"
    reason = error.strerror or str(error)
    log.error("cannot spool an upload to %s: %s", tempfile.gettempdir(), reason)
    if error.errno in NO_SPACE_ERRNOS:
        return APIError(507, f"cannot receive the upload: {where} is full ({reason})",
                        code="insufficient_storage")  # fmt: skip
    return APIError(500, f"cannot receive the upload: {where}: {reason}", code="upload_failed")


def decode_upload(model: SpeechModel, data: bytes, on_trim: Trimmed) -> np.ndarray:
    """The uploaded clip decoded from memory (no temporary file: a full TMPDIR cannot fail
    it), at the model's encoder rate."""
    if not data:
        raise APIError(400, "audio_sample is empty", param="audio_sample", code="invalid_audio")
    try:
        return model.decode_voice(data, on_trim)
    except AudioError as error:
        raise APIError(400, one_line(error), param="audio_sample", code="invalid_audio") from None

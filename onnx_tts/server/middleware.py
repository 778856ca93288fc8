"""The server's outermost ASGI layer: request id, API key check, one log line and the request
counter per request."""

from __future__ import annotations

import hmac
import logging
import time
import uuid
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from onnx_tts.server.errors import APIError

log = logging.getLogger("onnx_tts.server")


class RequestLog:
    """Pure ASGI middleware: request id, API key check, one log line and the request counter
    per request (after the last byte, so streamed requests log their real duration)."""

    def __init__(self, app: ASGIApp, state: Any) -> None:
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
        given = [v for k, v in scope.get("headers", []) if k.lower() == b"authorization"]
        if len(given) != 1:
            # None, or several: which one counts would differ between proxies and servers.
            return True
        # Bytes on both sides: a header may hold any octet (non-ASCII ones too), and
        # hmac.compare_digest refuses str with non-ASCII characters.
        scheme, _, token = given[0].partition(b" ")
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

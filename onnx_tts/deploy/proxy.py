"""Replica failover at Ray Serve's HTTP proxy: a dead replica costs a retry or one clear error.

When a replica dies (its process killed, its node lost), Serve replaces it, but the requests
it was serving end inside the proxy: one that had no response yet gets a bare 500, a stream
that had started is cut. This middleware runs in every proxy (Serve loads it from
``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=onnx_tts.deploy.proxy:middlewares``, which
`onnx-tts serve --ray` sets for the cluster it starts) and makes that explicit:

* nothing sent yet: the request is sent again (its body is kept, up to RETRY_BODY_LIMIT) to a
  live replica, at most ATTEMPTS times; speech and voice uploads are idempotent (same input,
  same seed -> same audio; a voice's id is its content). After the last attempt, or for a body
  too large to keep, the client gets 503 in OpenAI's error envelope with Retry-After.
* a stream already under way: SSE gets a final `error` event (code `replica_failed`) and ends
  cleanly; any other body is left unterminated, so the client sees a broken transfer and never
  mistakes a truncated file for a whole one.
* errors the proxy makes itself (no replica available, back-pressure, timeout) become OpenAI's
  envelope with the same status; responses from the app pass through untouched.
"""

from __future__ import annotations

import asyncio
import json
import logging

from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from onnx_tts.server.errors import error_body

log = logging.getLogger("onnx_tts.deploy.proxy")

ATTEMPTS = 3
BACKOFF_SECONDS = (0.25, 1.0)
RETRY_BODY_LIMIT = 1 << 20  # a speech request is at most 1 MiB of JSON
_PROXY_ERROR_TEXT_LIMIT = 4096
# Requests that are safe to send twice.
_RETRYABLE = {("POST", "/v1/audio/speech"), ("POST", "/v1/audio/voices")}
_RETRYABLE_PROXY_STATUSES = {500, 503}


def middlewares() -> list[Middleware]:
    """Serve's HTTP proxy callback: the middlewares every proxy wraps its app in."""
    return [Middleware(ReplicaFailover)]


class _Attempt:
    """One pass of the request through the proxy: what it sent, what it held back."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False  # a response start went to the client
        self.finished = False  # ... and its last body part
        self.event_stream = False
        self.proxy_status: int | None = None  # an error the proxy made, held back
        self.proxy_text = b""

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start" and not self.started:
            headers = {k.lower(): v for k, v in message.get("headers", [])}
            content_type = headers.get(b"content-type", b"").decode("latin-1")
            if message["status"] >= 400 and not content_type.startswith("application/json"):
                # The app answers errors in JSON; this one comes from Serve itself.
                self.proxy_status = message["status"]
                return
            self.started = True
            self.event_stream = content_type.startswith("text/event-stream")
            message = {**message, "headers": _one_request_id(message.get("headers", []))}
        elif kind == "http.response.body" and self.proxy_status is not None:
            if len(self.proxy_text) < _PROXY_ERROR_TEXT_LIMIT:
                self.proxy_text += message.get("body", b"")[:_PROXY_ERROR_TEXT_LIMIT]
            return
        elif kind == "http.response.body" and not message.get("more_body", False):
            self.finished = True
        await self._send(message)


def _one_request_id(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    # The app names each request, and Serve adds its own id after it: keep the app's, the one
    # its log lines carry.
    kept, seen = [], False
    for name, value in headers:
        if name.lower() == b"x-request-id":
            if seen:
                continue
            seen = True
        kept.append((name, value))
    return kept


class ReplicaFailover:
    def __init__(self, app: ASGIApp, attempts: int = ATTEMPTS) -> None:
        self.app = app
        self.attempts = attempts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = _Client(receive)
        body, whole = await client.read_body(RETRY_BODY_LIMIT)
        method, path = scope.get("method", ""), scope.get("path", "")
        safe = method in ("GET", "HEAD") or (method, path) in _RETRYABLE
        attempts = self.attempts if whole and safe else 1
        attempt = _Attempt(send)
        for number in range(attempts):
            attempt = _Attempt(send)
            failure: BaseException | None = None
            try:
                await self.app(scope, client.replay(body), attempt.send)
            except Exception as error:  # the proxy's own failure: handled like a dead replica
                failure = error
            if attempt.finished or client.disconnected:
                return
            if attempt.started:
                await self._cut(attempt, send, failure)
                return
            if attempt.proxy_status is not None and (
                attempt.proxy_status not in _RETRYABLE_PROXY_STATUSES
            ):
                break  # back-pressure or a timeout: retrying would only add load
            if number + 1 < attempts:
                log.warning(
                    "%s %s: the replica failed before answering; retrying (%d/%d)",
                    method,
                    path,
                    number + 2,
                    attempts,
                )
                await asyncio.sleep(BACKOFF_SECONDS[min(number, len(BACKOFF_SECONDS) - 1)])
        await _answer_error(attempt, send)

    @staticmethod
    async def _cut(attempt: _Attempt, send: Send, failure: BaseException | None) -> None:
        log.warning("a replica failed mid-response (%s)", type(failure).__name__)
        if attempt.event_stream:
            event = {
                "type": "error",
                **error_body(
                    503,
                    "the replica serving this stream failed; send the request again",
                    code="replica_failed",
                ),
            }
            data = f"data: {json.dumps(event, separators=(',', ':'))}\n\n".encode()
            await send({"type": "http.response.body", "body": data, "more_body": False})
        # Any other body stays unterminated: the server closes the connection mid-transfer.


async def _answer_error(attempt: _Attempt, send: Send) -> None:
    status = attempt.proxy_status or 503
    if attempt.proxy_status is None or attempt.proxy_status in _RETRYABLE_PROXY_STATUSES:
        status, code = 503, "replica_unavailable"
        message = "no replica could answer (one failed or none is ready); retry shortly"
    else:
        code = {408: "timeout", 429: "rate_limited"}.get(status, "proxy_error")
        text = attempt.proxy_text.decode("utf-8", "replace").strip().splitlines()
        message = f"Ray Serve: {text[0] if text else 'request refused'}"
    body = json.dumps(error_body(status, message, code=code)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status in (429, 503):
        headers.append((b"retry-after", b"1"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class _Client:
    """The client's side of the request: its body read once, replayed to every attempt."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self.disconnected = False

    async def _next(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.disconnect":
            self.disconnected = True
        return message

    async def read_body(self, limit: int) -> tuple[list[Message], bool]:
        """The body's messages, and whether they are all of it (False past `limit`)."""
        messages: list[Message] = []
        size = 0
        while True:
            message = await self._next()
            messages.append(message)
            if message["type"] != "http.request":
                return messages, True
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                return messages, True
            if size > limit:
                return messages, False

    def replay(self, body: list[Message]) -> Receive:
        pending = list(body)

        async def receive() -> Message:
            if pending:
                return pending.pop(0)
            if self.disconnected:
                return {"type": "http.disconnect"}
            return await self._next()

        return receive

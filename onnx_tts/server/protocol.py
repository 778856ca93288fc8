"""uvicorn's HTTP/1.1 protocol (h11) with a header-read timeout, and its 400 for a request
h11 cannot parse (a malformed request line, header or chunked body) in OpenAI's envelope.

uvicorn bounds the idle time between requests (keep-alive) but not the time a client takes to
send a request's headers: one that sends half a request line holds its connection forever
(slowloris). Here a timer runs from a connection's opening, and from the first byte of each
later request, until the request's headers are complete; when it fires the client gets 408
and the connection closes. Body timeouts are the app's (see app._read_limited).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from onnx_tts.server.errors import error_body

log = logging.getLogger("onnx_tts.server")


def _timeout_response(seconds: float) -> bytes:
    body = json.dumps(
        error_body(
            408,
            f"the request headers did not arrive within {seconds:g} s",
            code="request_timeout",
        )
    ).encode()
    head = (
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


INVALID_REQUEST = "Invalid HTTP request received."  # what uvicorn logs and answers in text


class QuietInvalidRequests(logging.Filter):
    """uvicorn's own line for a request h11 cannot parse: the protocol below logs it (once,
    with the client) or the app's request line does, so it is dropped here."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name.startswith("uvicorn") and record.getMessage() == INVALID_REQUEST)


class HeaderTimeoutProtocol(H11Protocol):
    """H11Protocol whose `header_timeout` (seconds) bounds the wait for a request's headers."""

    header_timeout: float = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            # Bytes of a request whose headers are not complete yet (h11 stays IDLE until
            # they are): the clock runs from the first such byte, not from the last.
            if self._header_timer is None:
                self._arm()
        else:
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # Between requests the keep-alive timer rules; the header clock starts again with
        # the next request's first byte.
        self._disarm()

    def send_400_response(self, msg: str) -> None:
        """A request h11 cannot parse (its line, a header, a chunk size such as `+29` or `0x29`,
        a chunk longer than its size): 400 in OpenAI's envelope, then close. A request whose
        handler already runs logs its own line (its body read fails); otherwise this logs one."""
        in_flight = self.cycle is not None and not self.cycle.response_complete
        if not in_flight:
            client = f"{self.client[0]}:{self.client[1]}" if self.client else "client"
            log.info("closed %s: malformed HTTP request", client)
        if self.conn.our_state is h11.SEND_RESPONSE and not self.transport.is_closing():
            body = json.dumps(
                error_body(
                    400,
                    "malformed HTTP request (request line, header or chunked body); "
                    "check the client",
                    code="invalid_request",
                )
            ).encode()
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ]
            with contextlib.suppress(h11.LocalProtocolError):
                self.transport.write(
                    self.conn.send(
                        h11.Response(status_code=400, headers=headers, reason=b"Bad Request")
                    )
                )
                self.transport.write(self.conn.send(h11.Data(data=body)))
                self.transport.write(self.conn.send(h11.EndOfMessage()))
        self.transport.close()

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout, self._expired)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expired(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "client"
        partial = bool(self.conn.trailing_data[0])
        log.info(
            "closed %s: %s in %g s",
            client,
            "request headers not complete" if partial else "no request",
            self.header_timeout,
        )
        if partial:
            # h11 cannot answer a request it has not parsed; the bytes are written directly.
            self.transport.write(_timeout_response(self.header_timeout))
        self.transport.close()


def protocol_with(header_timeout: float) -> type[HeaderTimeoutProtocol]:
    """A protocol class for uvicorn's `http=` with this header timeout."""
    return type(
        "HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout": header_timeout}
    )

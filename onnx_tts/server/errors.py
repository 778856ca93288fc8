"""OpenAI's error envelope: every failure a client sees is one JSON line, never a traceback.

`{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}`, with the HTTP status
OpenAI uses for the same case (400 bad input, 401 bad key, 404, 413, 429, 503).
"""

from __future__ import annotations

import errno
from typing import Any

from starlette.responses import JSONResponse

# How a write says it found no space (a full disk or quota, a file too large): a 507.
NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)

# OpenAI's error `type` per status.
_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


class APIError(Exception):
    """An error a request handler returns to the client as OpenAI's envelope."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, param=self.param, code=self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error"),
            "param": param,
            "code": code,
        }
    }


def one_line(message: object) -> str:
    """The first line of an error message: clients get one line, never a stack."""
    text = str(message).strip()
    return text.splitlines()[0] if text else "unknown error"

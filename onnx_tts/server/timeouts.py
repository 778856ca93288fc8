"""Connection time limits of the HTTP server (a light module: the CLI reads its defaults)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Timeouts:
    """Connection limits (seconds), so that no client holds a connection by sending slowly.

    header: from a connection's first byte (or its opening) to the end of the request's
    headers; a real client sends them in one packet, 10 s leaves room for a slow mobile link
    and bounds a slowloris client. body_idle / body: longest gap between body chunks, and
    the whole body (a 10 MiB voice upload at 1 Mbit/s takes 84 s). keep_alive: an idle
    connection between requests (clients that reuse connections come back within ms; 5 s is
    uvicorn's default and frees sockets fast)."""

    header: float = 10.0
    body_idle: float = 10.0
    body: float = 120.0
    keep_alive: float = 5.0

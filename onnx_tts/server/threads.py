"""The servers' blocking work (planning a text, encoding audio, voice files, engine calls that
wait) runs on one bounded pool of worker threads: anyio's, which starlette's
`run_in_threadpool` also uses.

A burst of clients grows the pool up to `MAX_BLOCKING_THREADS`; anyio lets a worker that sat
idle for its limit go only when a later call comes, so a server that a burst left, and that
no new request reaches, would keep every thread the burst made. `trim_idle_threads` runs
beside each server and makes one trivial call every `TRIM_SECONDS`, which lets the workers
idle past anyio's limit go: the thread count returns to its resting value on its own.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any, TypeVar

import anyio.to_thread

# Blocking calls of one server that run at once; more wait for a thread (bounded memory).
MAX_BLOCKING_THREADS = 16
TRIM_SECONDS = 5.0

_T = TypeVar("_T")


async def blocking(function: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """`function(*args, **kwargs)` on the server's worker pool (the event loop stays free)."""
    return await anyio.to_thread.run_sync(functools.partial(function, *args, **kwargs))


def _nothing() -> None:
    return None


async def trim_idle_threads() -> None:
    """Bound the pool, then keep it trimmed for as long as the server runs (cancel to stop)."""
    anyio.to_thread.current_default_thread_limiter().total_tokens = MAX_BLOCKING_THREADS
    while True:
        await asyncio.sleep(TRIM_SECONDS)
        await anyio.to_thread.run_sync(_nothing)


__all__ = ["MAX_BLOCKING_THREADS", "TRIM_SECONDS", "blocking", "trim_idle_threads"]

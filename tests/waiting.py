"""Waiting in tests: on a condition, never on time. These machines are shared and loaded, so a
bound on a wait only turns a hang into a failure that says what never happened; it is no
claim about speed, and its size says nothing about how long the thing should take."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# Long enough for anything a test waits on here, on a machine whose cores are all taken.
WAIT_BOUND_SECONDS = 600.0


def wait_until(
    condition: Callable[[], T],
    what: str,
    bound: float = WAIT_BOUND_SECONDS,
    poll_seconds: float = 0.01,
) -> T:
    """Poll `condition` until it returns something true, and return that; AssertionError
    naming `what` when `bound` seconds pass without."""
    deadline = time.monotonic() + bound
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"never so: {what} (waited {bound:.0f} s)")
        time.sleep(poll_seconds)

"""Capacity-aware admission: start no more concurrent streams than the machine sustains in real
time, so that admitted listeners never stall; the excess waits (bounded) or is refused.

The engine measures how busy its two workers are (the decode scheduler's and the vocoder
stage's busy seconds per wall second: each is one thread, so 1.0 is a full core) while `n`
streams are active. If the busiest stage is at utilisation `u`, one stream costs about `u / n`
of it, and `n * target / u` streams fill it to the target (0.85 leaves headroom for a stream's
costlier moments). The estimate is smoothed and, when some active stream is about to run dry
(its player's lead below `min_lead_seconds`), nothing new starts: a stall for an admitted
listener is worse than a wait before the first byte. Until the engine has been busy enough to
measure, streams are admitted up to `max_streams`.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable
from typing import Any

# Utilisation below this says too little about the cost of a stream to extrapolate from.
MIN_MEASURABLE_UTILISATION = 0.15
SAMPLE_SECONDS = 0.5
SMOOTHING = 0.3  # weight of a new estimate


class Admission:
    """Which streams may start now (thread-safe; `try_admit` never blocks)."""

    def __init__(
        self,
        busy_seconds: Callable[[], tuple[float, ...]],
        max_streams: int,
        max_waiting: int,
        target_utilisation: float = 0.85,
        min_lead_seconds: float = 0.3,
        lead: Callable[[], float | None] = lambda: None,
    ) -> None:
        self.busy_seconds, self.lead = busy_seconds, lead
        self.max_streams, self.max_waiting = max_streams, max_waiting
        self.target, self.min_lead = target_utilisation, min_lead_seconds
        self.active = 0
        self.waiting = 0
        self._tickets = itertools.count()
        self._queue: list[int] = []  # waiting tickets, first come first served
        self._admitted_at_once: set[int] = set()
        self._lock = threading.Lock()
        self._sample: tuple[float, tuple[float, ...]] | None = None
        self._utilisation = 0.0
        self._capacity: float | None = None
        self._stats = {"admitted": 0, "refused_queue_full": 0, "refused_timeout": 0}

    # -- measuring ---------------------------------------------------------------------------
    def _measure(self) -> None:
        """(under the lock) refresh the utilisation and the capacity estimate."""
        now = time.monotonic()
        busy = self.busy_seconds()
        if self._sample is None:
            self._sample = (now, busy)
            return
        then, before = self._sample
        if now - then < SAMPLE_SECONDS:
            return
        self._sample = (now, busy)
        used = max((b - a for a, b in zip(before, busy, strict=True)), default=0.0)
        utilisation = min(1.0, max(0.0, used / (now - then)))
        self._utilisation = utilisation
        if utilisation >= MIN_MEASURABLE_UTILISATION and self.active > 0:
            estimate = self.active * self.target / utilisation
            previous = self._capacity
            self._capacity = (
                estimate if previous is None else previous + SMOOTHING * (estimate - previous)
            )

    def capacity(self) -> int:
        """Streams the machine is estimated to sustain in real time (max_streams until
        measured)."""
        with self._lock:
            self._measure()
            return self._capacity_now()

    def _capacity_now(self) -> int:
        if self._capacity is None:
            return self.max_streams
        return max(1, min(self.max_streams, math.floor(self._capacity)))

    # -- admitting ---------------------------------------------------------------------------
    def enqueue(self) -> int | None:
        """A ticket to wait for admission (admitted at once when nobody waits and there is
        room: try_admit then says so), or None when `max_waiting` already wait."""
        with self._lock:
            ticket = next(self._tickets)
            if not self._queue and self._room():
                self._admit()
                self._admitted_at_once.add(ticket)
                return ticket
            if len(self._queue) >= self.max_waiting:
                self._stats["refused_queue_full"] += 1
                return None
            self._queue.append(ticket)
            self.waiting = len(self._queue)
            return ticket

    def try_admit(self, ticket: int) -> bool:
        """Start `ticket`'s stream if it is first in line and the machine has room."""
        with self._lock:
            if ticket in self._admitted_at_once:
                self._admitted_at_once.discard(ticket)
                return True
            if not self._queue or self._queue[0] != ticket or not self._room():
                return False
            self._queue.pop(0)
            self.waiting = len(self._queue)
            self._admit()
            return True

    def _room(self) -> bool:
        """(under the lock) whether one more stream may start now."""
        self._measure()
        if self.active >= self._capacity_now():
            return False
        lead = self.lead()
        # A listener about to run dry is served first.
        return not (self.active and lead is not None and lead < self.min_lead)

    def _admit(self) -> None:
        self.active += 1
        self._stats["admitted"] += 1

    def abandon(self, ticket: int, timed_out: bool = False) -> None:
        """`ticket` stops waiting (its client left, or it waited too long)."""
        with self._lock:
            if ticket in self._queue:
                self._queue.remove(ticket)
                self.waiting = len(self._queue)
                if timed_out:
                    self._stats["refused_timeout"] += 1

    def release(self) -> None:
        """An admitted stream ended."""
        with self._lock:
            self.active = max(0, self.active - 1)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "active": self.active,
                "waiting": len(self._queue),
                "capacity": self._capacity_now(),
                "utilisation": round(self._utilisation, 3),
                **self._stats,
            }


def retry_after_seconds(stream_seconds: float, active: int) -> int:
    """A fair wait before a refused client retries: about when one active stream ends, if
    streams of `stream_seconds` end evenly (1-30 s)."""
    if active < 1 or not math.isfinite(stream_seconds):
        return 1
    return max(1, min(30, math.ceil(stream_seconds / active)))


__all__ = ["Admission", "retry_after_seconds"]

"""Capacity-aware admission: start no more concurrent streams than the machine sustains in real
time, so that admitted listeners never stall; the excess waits (bounded) or is refused.

The engine measures how busy its two workers are (the decode scheduler's and the vocoder
stage's busy seconds) and how much audio they made. Over each sample, a stage's busy seconds
per second of audio made is its cost of one real-time stream (a stream generates faster than
its listener plays, so "busy per active stream" would call one fast stream a full machine). A
stage is one worker thread, so it carries `target / cost` real-time streams; the stages
together carry `cores * target / (sum of costs)`; the capacity is the smaller. The target,
0.65, leaves headroom for what the costs do not see: a stream's start wants audio faster than
real time, and the server's event loop and its clients share the cores (measured with `bench
serve` on 2 cores: 16 concurrent streams of the default voice played without a stall, 22
admitted at 0.85 stalled). The estimate is smoothed and, when some active
stream is about to run dry (the scheduling policy's call: by default a lead below 0.3 s),
nothing new starts: a
stall for an admitted listener is worse than a wait before the first byte. Until the engine has
been busy enough to measure, streams are admitted up to `max_streams`.

The costs do not see everything that shares the cores (the server's event loop, output
encoding, other processes), so the capacity is also capped by what the listeners say: each
sample in which an admitted listener stalled (`stalls`, a running count; the server counts
stalls a player buffering 0.1 s would hear: `PlaybackClock.long_underruns`) lowers a limit to
one below the streams active then; each sample without a stall raises it by one again (prompt
decrease, additive increase: the limit follows the load). It used to rise only while every
listener held more than a second of audio, which short streams arriving all the time never
allow (a new stream always has little audio ahead of it): one stall then held the server
below its capacity for good (measured with `bench serve`, 8 clients: a limit of 4-6 streams
against a capacity estimate of 22, 0.3-0.6 s of the time to first audio spent waiting here).
A listener that just started has little audio ahead of it by nature, so a short lead alone is
no reason to lower the limit (it only holds new streams back for a moment).

A model that cannot make even one real-time stream here (capacity below 1, or no stream ever
seen getting a second of audio per second, alone or batched: a big LM on few cores) stalls
every listener whatever admission does; then nothing is held back, and the
scheduler batches as many streams as it can (most audio per second for everyone), and
`stats()["real_time"]` says so.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from onnx_tts.decoding.policy import SchedulingPolicy, StreamLoad, make_policy

# Utilisation below this says too little about the cost of a stream to extrapolate from.
MIN_MEASURABLE_UTILISATION = 0.15
# Nor does a sample in which less audio than this was made (seconds).
MIN_MEASURABLE_AUDIO_SECONDS = 0.5
SAMPLE_SECONDS = 0.5
SMOOTHING = 0.3  # weight of a new estimate
RATE_SAMPLES = 6  # busy samples before a stream's rate counts (3 s)


class Admission:
    """Which streams may start now (thread-safe; `try_admit` never blocks)."""

    def __init__(
        self,
        busy_seconds: Callable[[], tuple[float, ...]],
        audio_seconds: Callable[[], float],
        max_streams: int,
        max_waiting: int,
        target_utilisation: float = 0.65,
        lead: Callable[[float | None], float | None] = lambda arrived: None,
        cores: int = 1,
        stalls: Callable[[], int] = lambda: 0,
        policy: SchedulingPolicy | None = None,
    ) -> None:
        """`busy_seconds`: each stage's busy seconds so far; `audio_seconds`: seconds of audio
        the stages made so far; `cores`: the CPUs the stages share; `lead(arrived)`: seconds
        until the first listener that was playing at `arrived` (a request's arrival, on the
        listeners' clock; None: any listener) runs dry, None when none plays."""
        self.busy_seconds, self.audio_seconds, self.lead = busy_seconds, audio_seconds, lead
        self.cores = max(1, cores)
        self.max_streams, self.max_waiting = max_streams, max_waiting
        self.target = target_utilisation
        self.policy = make_policy(policy)
        self.active = 0
        self.waiting = 0
        self._tickets = itertools.count()
        self._queue: list[int] = []  # waiting tickets, first come first served
        self._arrived: dict[int, float | None] = {}  # of the waiting tickets
        self._admitted_at_once: set[int] = set()
        self._lock = threading.Lock()
        self._sample: tuple[float, tuple[float, ...], float] | None = None
        self._utilisation = 0.0
        self._capacity: float | None = None
        self._limit: int | None = None  # from the listeners' leads (module docstring)
        self._limit_lowered = 0
        self._stream_rate: float | None = None  # best audio seconds per second of one stream
        self._rate_smoothed: float | None = None
        self._rate_samples = 0
        self.stalls = stalls
        self._stalls_seen = 0
        self._stats = {"admitted": 0, "refused_queue_full": 0, "refused_timeout": 0}

    # -- measuring ---------------------------------------------------------------------------
    def _measure(self) -> None:
        """(under the lock) refresh the utilisation and the capacity estimate."""
        now = time.monotonic()
        if self._sample is not None and now - self._sample[0] < SAMPLE_SECONDS:
            return  # (cheap: waiting requests ask often)
        busy, audio = self.busy_seconds(), self.audio_seconds()
        if self._sample is None:
            self._sample = (now, busy, audio)
            return
        then, before, audio_before = self._sample
        self._sample = (now, busy, audio)
        self._follow_leads()
        used = [max(0.0, b - a) for a, b in zip(before, busy, strict=True)]
        made = audio - audio_before
        self._utilisation = min(1.0, max(used, default=0.0) / (now - then))
        if self._utilisation >= MIN_MEASURABLE_UTILISATION and self.active:
            self._follow_stream_rate(made / (now - then) / self.active)
        if self._utilisation < MIN_MEASURABLE_UTILISATION or made < MIN_MEASURABLE_AUDIO_SECONDS:
            return
        costs = [u / made for u in used]  # each stage's seconds per second of audio
        per_stage = 1.0 / max(costs)
        all_cores = self.cores / sum(costs)
        estimate = self.target * min(per_stage, all_cores)
        previous = self._capacity
        self._capacity = (
            estimate if previous is None else previous + SMOOTHING * (estimate - previous)
        )

    def _follow_stream_rate(self, rate: float) -> None:
        """(under the lock) the best smoothed audio seconds per second one busy stream got
        (audio comes in windows: one sample may hold a whole window, the next none)."""
        self._rate_samples += 1
        previous = self._rate_smoothed
        self._rate_smoothed = rate if previous is None else previous + SMOOTHING * (rate - previous)
        if self._rate_samples >= RATE_SAMPLES:
            self._stream_rate = max(self._stream_rate or 0.0, self._rate_smoothed)

    def _follow_leads(self) -> None:
        """(under the lock, once per sample) lower the limit when a listener stalled, raise it
        when none did."""
        if not self._real_time():
            self._limit = None
            return
        stalls, self._stalls_seen = self.stalls() - self._stalls_seen, self.stalls()
        if stalls > 0 and self.active:
            self._limit = max(1, min(self._limit or self.active, self.active) - 1)
            self._limit_lowered += 1
        elif self._limit is not None:
            self._limit = min(self.max_streams, self._limit + 1)

    def capacity(self) -> int:
        """Streams the machine is estimated to sustain in real time (max_streams until
        measured)."""
        with self._lock:
            self._measure()
            return self._capacity_now()

    def _real_time(self) -> bool:
        if self._stream_rate is not None and self._stream_rate < 1.0:
            return False
        return self._capacity is None or self._capacity >= 1.0

    def _capacity_now(self) -> int:
        limit = self.max_streams if self._limit is None else self._limit
        if self._capacity is None:
            return limit
        if not self._real_time():
            return self.max_streams
        return max(1, min(limit, math.floor(self._capacity)))

    # -- admitting ---------------------------------------------------------------------------
    def enqueue(self, arrived: float | None = None) -> int | None:
        """A ticket to wait for admission (admitted at once when nobody waits and there is
        room: try_admit then says so), or None when `max_waiting` already wait. `arrived`:
        when the request came (the listeners' clock); a listener that started playing after
        it never holds it back: requests that arrive together start together (otherwise each
        stream of a burst waited for the one admitted before it to get ahead of its player:
        the last of 8 clients that started at once heard its first audio ~0.3 s late)."""
        with self._lock:
            ticket = next(self._tickets)
            if not self._queue and self._room(arrived):
                self._admit()
                self._admitted_at_once.add(ticket)
                return ticket
            if len(self._queue) >= self.max_waiting:
                self._stats["refused_queue_full"] += 1
                return None
            self._queue.append(ticket)
            self._arrived[ticket] = arrived
            self.waiting = len(self._queue)
            return ticket

    def try_admit(self, ticket: int) -> bool:
        """Start `ticket`'s stream if it is first in line and the machine has room."""
        with self._lock:
            if ticket in self._admitted_at_once:
                self._admitted_at_once.discard(ticket)
                return True
            if not self._queue or self._queue[0] != ticket:
                return False
            if not self._room(self._arrived.get(ticket)):
                return False
            self._queue.pop(0)
            self._arrived.pop(ticket, None)
            self.waiting = len(self._queue)
            self._admit()
            return True

    def _room(self, arrived: float | None) -> bool:
        """(under the lock) whether one more stream, of a request that arrived at `arrived`,
        may start now."""
        self._measure()
        load = StreamLoad(self.active, self._capacity_now(), self.lead(arrived), self._real_time())
        return self.policy.stream_may_start(load)

    def _admit(self) -> None:
        self.active += 1
        self._stats["admitted"] += 1

    def abandon(self, ticket: int, timed_out: bool = False) -> None:
        """`ticket` stops waiting (its client left, or it waited too long)."""
        with self._lock:
            self._arrived.pop(ticket, None)
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
                "real_time": self._real_time(),
                "stream_rate": None if self._stream_rate is None else round(self._stream_rate, 3),
                "limit_from_leads": self._limit,
                "limit_lowered": self._limit_lowered,
                **self._stats,
            }


def retry_after_seconds(stream_seconds: float, active: int) -> int:
    """A fair wait before a refused client retries: about when one active stream ends, if
    streams of `stream_seconds` end evenly (1-30 s)."""
    if active < 1 or not math.isfinite(stream_seconds):
        return 1
    return max(1, min(30, math.ceil(stream_seconds / active)))


__all__ = ["Admission", "retry_after_seconds"]

"""What every interface submits to the engine: a `Request`, with its timing and its cancel token.

The CLI, the Python API, the HTTP server and the Wyoming server all describe work the same way:
a piece of text (a family's chunk), the voice's conditioning, sampling options (with the
chunk's seed), the family's options, when its first audio is due, the player it feeds (a
stream's playback clock), a priority, a cancel token, and where its frames go. What the
scheduling policy (`policy.py`) weighs is `Request.urgency()`: the priority, when the request
next needs compute (`Request.due()`) and its arrival order.
"""

from __future__ import annotations

import itertools
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from onnx_tts.decoding.policy import Urgency
from onnx_tts.decoding.sampling import SamplingOptions
from onnx_tts.errors import InputError, checked_integer, checked_number, shown

# A request without a deadline waits this long behind requests that have one (a batch job
# yields to a live stream, but is never starved: its urgency still grows with its age).
NO_DEADLINE_SLACK_SECONDS = 10.0
_arrivals = itertools.count()
# A deadline is an instant of time.monotonic(); one further ahead than this is a mistake.
MAX_DEADLINE_AHEAD_SECONDS = 366 * 86400.0
# Priorities are small integers in practice; the bound keeps them machine integers.
MAX_PRIORITY = 2**31 - 1


class CancelToken:
    """Set once when the request's consumer is gone (a closed stream, a disconnected client,
    a failed sibling); every stage checks it before doing more work. `watch` adds a condition
    polled on each check (e.g. a server's "client disconnected")."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._watches: list[Callable[[], bool]] = []

    def cancel(self) -> None:
        self._event.set()

    def watch(self, condition: Callable[[], bool]) -> None:
        self._watches.append(condition)

    @property
    def cancelled(self) -> bool:
        if self._event.is_set():
            return True
        if any(_holds(condition) for condition in self._watches):
            self._event.set()
            return True
        return False

    def __bool__(self) -> bool:  # a token is an object, never falsy by accident
        return True


def _holds(condition: Callable[[], bool]) -> bool:
    """A watch's answer; one that fails cannot vouch for its consumer, so it cancels (the
    scheduler's worker asks every round: a raising watch must never reach it)."""
    try:
        return bool(condition())
    except Exception:
        return True


class PlaybackClock:
    """A player that starts `buffer_seconds` after the first chunk arrives and stalls when its
    buffer runs dry. An underrun is a chunk that arrives after the audio before it has
    finished playing; its length is the time the player sat silent. `runs_dry_at()` is the
    moment the player needs more audio: the request's deadline once audio flows.
    `long_underruns` counts the underruns longer than `long_stall_seconds` (those a player
    that buffers that much before it starts would hear too)."""

    def __init__(self, buffer_seconds: float = 0.0, long_stall_seconds: float = 0.1) -> None:
        self.buffer_seconds = float(buffer_seconds)
        self.long_stall_seconds = float(long_stall_seconds)
        self.start: float | None = None
        self.received = 0.0  # seconds of audio received
        self.stalled = 0.0  # seconds spent waiting with an empty buffer
        self.underruns = 0
        self.long_underruns = 0

    def chunk(self, now: float, seconds: float) -> float:
        """Record a chunk of `seconds` arriving at `now`; returns the stall it caused."""
        stall = 0.0
        if self.start is None:
            self.start = now + self.buffer_seconds
        else:
            played_until = self.start + self.stalled + self.received
            if now > played_until:
                stall = now - played_until
                self.stalled += stall
                self.underruns += 1
                self.long_underruns += stall > self.long_stall_seconds
        self.received += seconds
        return stall

    def runs_dry_at(self) -> float | None:
        """When the audio received so far has played out (None before the first chunk)."""
        if self.start is None:
            return None
        return self.start + self.stalled + self.received


class Handoff:
    """Items from a producer thread to one consumer, then the end or an error (the frames of
    a request to its reader, the samples of a stream to its listener)."""

    _END = object()

    def __init__(self) -> None:
        self._items: queue.SimpleQueue = queue.SimpleQueue()
        self.finished = False  # the end or an error was taken

    def put(self, item: Any) -> None:
        self._items.put(item)

    def end(self, error: BaseException | None = None) -> None:
        self._items.put(self._END if error is None else error)

    def take(self, block: bool = True) -> Any:
        """The next item (None when `block` is false and none is ready); StopIteration at the
        end, the producer's error if it failed."""
        if self.finished:
            raise StopIteration
        try:
            item = self._items.get(block=block)
        except queue.Empty:
            return None
        if item is self._END:
            self.finished = True
            raise StopIteration
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        return item


def checked_timing(
    deadline: Any, priority: Any, cancel: Any, clock: Any
) -> tuple[float | None, int]:
    """A request's timing checked where it is given (the API, a server, a direct submit):
    the scheduler's worker orders and stops requests by these values, so a bad one must fail
    its own call, never the worker (InputError naming it). Returns (deadline, priority)."""
    if deadline is not None:
        latest = time.monotonic() + MAX_DEADLINE_AHEAD_SECONDS
        try:
            deadline = checked_number("deadline", deadline, 0.0, latest)
        except InputError as error:
            raise InputError(
                f"{error} (an instant of time.monotonic(), in seconds; e.g. time.monotonic() "
                "+ 2 for audio within two seconds)"
            ) from None
    priority = checked_integer("priority", priority, -MAX_PRIORITY, MAX_PRIORITY)
    if cancel is not None and not isinstance(cancel, CancelToken):
        raise InputError(f"cancel must be an onnx_tts.CancelToken (or None), got {shown(cancel)}")
    if clock is not None and not isinstance(clock, PlaybackClock):
        raise InputError(f"clock must be an onnx_tts.PlaybackClock (or None), got {shown(clock)}")
    return deadline, priority


@dataclass(eq=False)
class Request:
    """One text chunk to generate and everything the stages need to serve it.

    chunk: an item of the family's `text.chunks()`; voice: encoder outputs; sampling: with
    this chunk's seed; options: the family's request options (checked). deadline: monotonic
    time its first audio is due (None: no deadline, a batch request); clock: the player of a
    streamed request; priority: lower goes first among equally urgent requests; cancel: the
    token every stage checks; sink: where its frames go (set by the scheduler when None);
    generator: the random generator shared by the chunks of one text that decode one after
    another (a family whose published runtime draws the whole text from one generator), None
    for a chunk that draws from its own seed; marks: when word timings are asked for, a list
    the family's program may fill with the text position each emitted frame voices."""

    chunk: Any
    voice: Mapping[str, np.ndarray]
    sampling: SamplingOptions
    options: Mapping[str, Any] = field(default_factory=dict)
    deadline: float | None = None
    clock: PlaybackClock | None = None
    priority: int = 0
    cancel: CancelToken = field(default_factory=CancelToken)
    sink: Any = None
    generator: np.random.Generator | None = None
    marks: list[int] | None = None
    # Frames the vocoder decodes before this chunk's, their audio dropped (`Vocoder.prime_frames`).
    prime: np.ndarray | None = None
    arrival: float = field(default_factory=time.monotonic)
    order: int = field(default_factory=lambda: next(_arrivals))
    # Why the request stopped, when it failed outside the worker's own work (`fail`).
    error: BaseException | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.deadline, self.priority = checked_timing(
            self.deadline, self.priority, self.cancel, self.clock
        )
        if self.cancel is None:
            self.cancel = CancelToken()

    def fail(self, error: BaseException) -> None:
        """Stop this request with `error` (its first): the token is cancelled, and the worker
        ends the request's frames with the error rather than as a normal end."""
        if self.error is None:
            self.error = error
        self.cancel.cancel()

    def due(self) -> float:
        """When this request next needs compute: its player running dry once audio flows,
        else its first-audio deadline, else its arrival plus the no-deadline slack. Never
        raises: a player's clock that fails fails its own request (`fail`), not the stage
        that asked."""
        if self.clock is not None:
            try:
                dry = self.clock.runs_dry_at()
            except Exception as error:
                self.fail(error)
                dry = None
            if dry is not None:
                return dry
        if self.deadline is not None and math.isfinite(self.deadline):
            return self.deadline
        return self.arrival + NO_DEADLINE_SLACK_SECONDS

    def urgency(self) -> Urgency:
        """What the scheduling policy knows of this request: priority, due time, arrival."""
        return Urgency(self.priority, self.due(), self.order)


class FrameStream:
    """The frames of one scheduled request, as the decode scheduler's worker produces them
    (its default sink). Closing it (or dropping it) cancels the request: its row is freed at
    the next round (`scheduler.wake()` has the worker look)."""

    def __init__(self, request: Request, scheduler: Any) -> None:
        self._request, self._scheduler = request, scheduler
        self._items = Handoff()

    # -- producer side (the worker) ------------------------------------------------------------
    def put(self, frame: np.ndarray) -> None:
        self._items.put(frame)

    def end(self, error: BaseException | None = None) -> None:
        self._items.end(error)

    # -- consumer side -------------------------------------------------------------------------
    def __iter__(self) -> Iterator[np.ndarray]:
        return self

    def __next__(self) -> np.ndarray:
        return self._items.take()

    def close(self) -> None:
        if not self._items.finished:
            self._items.finished = True
            self._request.cancel.cancel()
            self._scheduler.wake()

    def __del__(self) -> None:
        if "_items" in vars(self):  # (a stream whose __init__ failed has nothing to close)
            self.close()


def tell_sink(call: Callable[[Any], Any], argument: Any) -> None:
    """Hand frames or the end to a request's sink (`call`: its put or end). A failing consumer
    is its own problem (it is told through its stream) and never stops the loop that serves
    the others."""
    try:
        call(argument)
    except Exception:
        logging.getLogger("onnx_tts.decoding").warning(
            "a request's consumer failed to take its frames", exc_info=True
        )


__all__ = [
    "MAX_DEADLINE_AHEAD_SECONDS",
    "MAX_PRIORITY",
    "NO_DEADLINE_SLACK_SECONDS",
    "CancelToken",
    "FrameStream",
    "Handoff",
    "PlaybackClock",
    "Request",
    "checked_timing",
    "tell_sink",
]

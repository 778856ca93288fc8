"""Requests of a model whose chunks need no decode loop: a `DirectProgram` makes all of a
chunk's frames in one call (a non-autoregressive graph: text in, a sentence's frames out), and
the `DirectScheduler` runs those calls, most urgent first, on one worker thread.

It is the decode stage of such a model, with the `DecodeScheduler`'s face (submit, wake, idle,
stats, close, policy), so the engine, its vocoder stage and the servers treat both alike. A
request alone is a call of one; the program's `workers` calls run at once; calls are not
batched: a family whose graph batches several
chunks exactly would say so here first (none does yet: padded VITS rows differ from the row
alone, see docs/MODELS.md).
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from onnx_tts.decoding.policy import SchedulingPolicy, make_policy
from onnx_tts.decoding.request import FrameStream, Request, tell_sink
from onnx_tts.errors import OnnxTTSError
from onnx_tts.session import close_at_exit

log = logging.getLogger("onnx_tts.decoding")

# Requests waiting beyond this many are refused (as the decode scheduler's queue).
DEFAULT_MAX_WAITING = 1024


class DirectProgram(ABC):
    """A family's generation when one call makes all of a chunk's frames. `workers`: calls
    that may run at once (each on its own thread; e.g. one per core for a graph run with one
    intra-op thread)."""

    workers: int = 1

    @abstractmethod
    def frames(self, request: Request) -> np.ndarray:
        """All frames of `request`'s chunk, [F, ...] (what its vocoder decodes)."""


class DirectScheduler:
    """Runs a DirectProgram for every request of one model (module docstring): `workers`
    threads, each taking the most urgent waiting request."""

    slots = None  # no KV slot buffers: nothing decodes in rows
    batching_unavailable = "one call per chunk: the graph makes a sentence at once"

    def __init__(
        self,
        program: DirectProgram,
        max_waiting: int = DEFAULT_MAX_WAITING,
        policy: SchedulingPolicy | str | None = None,
    ) -> None:
        self.program = program
        self.max_batch = 1
        self.max_waiting = max_waiting
        self.policy = make_policy(policy)
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self._cv = threading.Condition()
        self._closed = False
        self._threads: list[threading.Thread] = []
        self._stats: dict[str, Any] = {
            "requests": 0,
            "steps": 0,
            "row_steps": 0,
            "frames": 0,
            "busy_seconds": 0.0,
        }

    # -- the scheduler's face ----------------------------------------------------------------
    def submit(self, request: Request) -> Any:
        """Queue `request`; its frames go to `request.sink` (a FrameStream when it has none,
        returned). Raises the decode scheduler's QueueFull at the queue's bound."""
        from onnx_tts.decoding.scheduler import QueueFull

        if request.sink is None:
            request.sink = FrameStream(request, self)
        with self._cv:
            if self._closed:
                raise OnnxTTSError("the engine's decode scheduler is closed")
            if len(self.waiting) >= self.max_waiting:
                raise QueueFull(
                    f"{len(self.waiting)} requests are waiting (the limit); retry shortly"
                )
            self.waiting.append(request)
            self._stats["requests"] += 1
            if not self._threads:
                for index in range(max(1, self.program.workers)):
                    thread = threading.Thread(
                        target=self._run, name=f"onnx-tts-direct-{index}", daemon=True
                    )
                    thread.start()
                    self._threads.append(thread)
                close_at_exit(self)
            self._cv.notify()
        return request.sink

    def wake(self) -> None:
        with self._cv:
            self._cv.notify()

    def idle(self) -> bool:
        with self._cv:
            return not self.waiting and not self.running

    def stats(self) -> dict[str, Any]:
        with self._cv:
            steps = self._stats["steps"]
            return {
                "max_batch": 1,
                "slot_capacity": 0,
                "slot_rows": 0,
                "slot_bytes": 0,
                "slot_grows": 0,
                "queued": len(self.waiting),
                "active_rows": len(self.running),
                "prefilling": 0,
                "mean_batch": 1.0 if steps else 0.0,
                **self._stats,
            }

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()

    # -- worker ------------------------------------------------------------------------------
    def _next(self) -> Request | None:
        """(under the lock) the most urgent waiting request still wanted; None when closed."""
        while True:
            while not self._closed and not self.waiting:
                self._cv.wait()
            if self._closed:
                closed = OnnxTTSError("the engine was closed")
                for request in self.waiting:
                    tell_sink(request.sink.end, closed)
                self.waiting.clear()
                return None
            first = self.policy.order([r.urgency() for r in self.waiting])[0]
            request = self.waiting.pop(first)
            if request.cancel.cancelled:
                tell_sink(request.sink.end, None)
                continue
            self.running.append(request)
            return request

    def _run(self) -> None:
        while True:
            with self._cv:
                request = self._next()
            if request is None:
                return
            started = time.perf_counter()
            try:
                frames = self.program.frames(request)
            except Exception as error:  # this request fails alone
                log.info("a chunk failed: %r", error)
                frames, failure = None, error
            else:
                failure = None
            with self._cv:
                self.running.remove(request)
                self._stats["busy_seconds"] += time.perf_counter() - started
                if frames is not None:
                    self._stats["steps"] += 1
                    self._stats["row_steps"] += 1
                    self._stats["frames"] += len(frames)
            if failure is not None:
                tell_sink(request.sink.end, failure)
            elif request.cancel.cancelled:
                tell_sink(request.sink.end, None)
            else:
                if len(frames):
                    tell_sink(request.sink.put, frames)
                tell_sink(request.sink.end, None)

    def __repr__(self) -> str:
        return "DirectScheduler()"


__all__ = ["DirectProgram", "DirectScheduler"]

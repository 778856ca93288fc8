"""Generation off the event loop: a bounded worker pool fed by a bounded FIFO queue.

Each request is one job on one worker thread (the engine is thread-safe and releases the GIL
inside ONNX Runtime). A job that cannot start at once waits in the executor's FIFO queue;
beyond `max_queue` waiting jobs, submit() refuses (the client gets 429). This is the seam where
the batch scheduler plugs in later: it replaces Generation.run's call to SpeechModel.stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import soxr

from onnx_tts.errors import SessionError
from onnx_tts.server.engines import SpeechModel
from onnx_tts.server.timestretch import TimeStretcher


class QueueFull(Exception):
    """More jobs are waiting than --max-queue allows."""


class Dispatcher:
    def __init__(self, workers: int, max_queue: int) -> None:
        self.workers = workers
        self.max_queue = max_queue
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="onnx-tts-gen")
        self._lock = threading.Lock()
        self.waiting = 0
        self.active = 0

    def submit(self, job: Callable[[], Any]) -> Future:
        with self._lock:
            # Jobs beyond the idle workers wait; at most max_queue of them.
            if self.waiting + self.active >= self.workers + self.max_queue:
                raise QueueFull
            self.waiting += 1

        def run() -> Any:
            with self._lock:
                self.waiting -= 1
                self.active += 1
            try:
                return job()
            finally:
                with self._lock:
                    self.active -= 1

        try:
            return self._executor.submit(run)
        except RuntimeError:  # executor shut down (the server is stopping)
            with self._lock:
                self.waiting -= 1
            raise QueueFull from None

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)


class DeadlineGate:
    """At most `slots` engine calls at once, granted earliest deadline first.

    Every request streams to a player that runs dry at a known time (its deadline); a request
    that has sent nothing yet has its arrival time as deadline, so it goes first. With one slot
    per core the CPU does the most urgent chunk instead of time-slicing every stream, which is
    what keeps time to first audio and underruns down when many clients share few cores.
    """

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._free = slots
        self._queue: list[tuple[float, int]] = []
        self._order = itertools.count()
        self._condition = threading.Condition()

    @contextlib.contextmanager
    def slot(self, deadline: float) -> Iterator[None]:
        ticket = (deadline, next(self._order))
        with self._condition:
            heapq.heappush(self._queue, ticket)
            while not (self._free > 0 and self._queue[0] == ticket):
                self._condition.wait()
            heapq.heappop(self._queue)
            self._free -= 1
            if self._free > 0:
                self._condition.notify_all()  # the next in line may take a free slot too
        try:
            yield
        finally:
            with self._condition:
                self._free += 1
                self._condition.notify_all()


# Events a Generation posts to its request's asyncio queue.
START, AUDIO, END, ERROR = "start", "audio", "end", "error"


@dataclass
class Generation:
    """One request's synthesis, run on a worker thread; results go to `events` on `loop`."""

    model: SpeechModel
    text: str
    voice_audio: np.ndarray | None
    seed: int | None
    options: dict[str, Any]
    speed: float
    output_rate: int
    loop: asyncio.AbstractEventLoop
    gate: DeadlineGate
    received_at: float = field(default_factory=time.perf_counter)
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    generated_samples: int = 0  # at the model's rate, before speed (for usage tokens)
    started_at: float = 0.0
    cache_hit: bool | None = None  # the result cache replayed this audio (None: not started)

    def _post(self, kind: str, payload: Any = None) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.cancelled.set()

    def cancel(self) -> None:
        self.cancelled.set()

    def run(self) -> None:
        self.started_at = time.perf_counter()
        if self.cancelled.is_set():
            return
        try:
            voice = self.model.encode_voice(self.voice_audio)
            stream = self.model.stream(self.text, voice, self.seed, self.options)
            self.cache_hit = self.model.replayed(stream)
        except Exception as error:
            self._post(ERROR, error)
            return
        self._post(START)
        stretcher = TimeStretcher(self.speed, self.model.sample_rate)
        resampler = (
            soxr.ResampleStream(self.model.sample_rate, self.output_rate, 1, dtype="float32")
            if self.output_rate != self.model.sample_rate
            else None
        )

        def emit(samples: np.ndarray, last: bool = False) -> None:
            if resampler is not None:
                samples = resampler.resample_chunk(samples, last=last)
            if len(samples):
                self._post(AUDIO, np.asarray(samples, np.float32))

        first_audio_at: float | None = None
        sent_seconds = 0.0
        try:
            while True:
                if self.cancelled.is_set():
                    return
                # When this request's player runs dry (arrival time before any audio).
                deadline = (
                    self.received_at if first_audio_at is None else (first_audio_at + sent_seconds)
                )
                with self.gate.slot(deadline):
                    chunk = next(stream, None)
                if chunk is None:
                    break
                if first_audio_at is None:
                    first_audio_at = time.perf_counter()
                chunk = np.asarray(chunk, np.float32)
                if not np.all(np.isfinite(chunk)):
                    raise SessionError("the model produced non-finite samples; output stopped")
                self.generated_samples += len(chunk)
                sent_seconds += len(chunk) / self.model.sample_rate / self.speed
                emit(stretcher.push(chunk))
            emit(stretcher.finish(), last=True)
            self._post(END)
        except Exception as error:
            self._post(ERROR, error)
        finally:
            stream.close()  # stops the LM loop and returns its KV cache at once

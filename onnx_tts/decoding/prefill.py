"""Prefills beside the decode step: a new request's prompt never holds up the rows decoding.

A prompt can be many step-times of work (a voice prefix of hundreds of positions, a prompt of
a hundred rows through a prefill graph of its own). Run inside the decode worker's round, it
made every row already streaming wait for it. Here a prompt runs apart from the rows (`kv_rows.py`:
`prefill_apart` on a scratch cache, then `join` on the decode worker between steps), in one of
three ways (`PREFILL_MODES`):

- `apart` (the default): on a prefill worker thread of its own, while the decode worker goes on
  stepping the other rows; the request joins the batch at the first round after its prompt is
  done. On 2 cores this measured best (`bench prefill`: docs/BENCHMARKS.md).
- `chunked`: the prompt's LM runs go `chunk_tokens` at a time, each when the decode worker grants
  it a turn (the scheduling policy says which prefills get one this round), the worker waiting
  for it before its step: bounded work per round, no overlap with the step.
- `inline`: the whole prompt in the round, before the step (how the loop ran before; kept as
  the benchmarks' baseline and for machines with one core).

In every mode a prompt of a few positions (`INLINE_PROMPT_POSITIONS`) runs in the round: it is
about a step's work.

A request's frames never depend on the mode, on its neighbours or on when its prompt ran: the
prompt runs at batch 1 in every mode, and chunk boundaries depend only on the prompt
(tests/test_prefill.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

from onnx_tts.cache.prefix import PrefixCache
from onnx_tts.decoding.kv_rows import WHOLE, Prefilled, PrefillRuns, RowHome
from onnx_tts.decoding.policy import Urgency
from onnx_tts.decoding.program import Admission
from onnx_tts.decoding.request import Request
from onnx_tts.errors import InputError, OnnxTTSError, checked_integer

PREFILL_MODES = ("apart", "chunked", "inline")
DEFAULT_PREFILL_MODE = "apart"
# Chunked prefill: prompt positions per turn (about one decode step of a Turbo-size LM here).
DEFAULT_CHUNK_TOKENS = 16
# A prompt of at most this many positions runs in the round whatever the mode: it is about a
# step's work, and handing it to a worker only adds a round and a thread hand-off to its first
# audio (the default voice's prompt is one position).
INLINE_PROMPT_POSITIONS = 4
MAX_CHUNK_TOKENS = 1 << 16


class PrefillAbandoned(OnnxTTSError):
    """The request of a prefill went away (cancelled, failed, the engine closed)."""


def check_prefill_mode(mode: str, chunk_tokens: int) -> None:
    if mode not in PREFILL_MODES:
        raise InputError(f"unknown prefill mode {mode!r}; choose {', '.join(PREFILL_MODES)}")
    checked_integer("chunk_tokens", chunk_tokens, 2, MAX_CHUNK_TOKENS)


class TurnGate:
    """Chunked prefill: the prefill thread runs one LM run at a time, when the decode worker
    grants it a turn; the worker waits until that run is over (`grant`). `on_wait` tells the
    worker that the prefill thread waits for a turn (called without the gate's lock held)."""

    def __init__(self, on_wait: Callable[[], None]) -> None:
        self._cv = threading.Condition()
        self._on_wait = on_wait
        self.waiting = False  # the prefill thread waits for a turn (read without the lock)
        self._granted = False
        self._running = False
        self._abandoned = False

    @contextmanager
    def turn(self) -> Iterator[None]:
        """(the prefill thread) wait for a turn, run the block, hand the turn back."""
        with self._cv:
            self.waiting = True
        self._on_wait()
        with self._cv:
            while not self._granted and not self._abandoned:
                self._cv.wait()
            self.waiting = self._granted = False
            if self._abandoned:
                self._cv.notify_all()
                raise PrefillAbandoned("the request went away during its prefill")
            self._running = True
        try:
            yield
        finally:
            with self._cv:
                self._running = False
                self._cv.notify_all()

    def grant(self) -> bool:
        """(the decode worker) one turn to a prefill waiting for it; returns once its run is
        over (False, at once, when it was not waiting)."""
        with self._cv:
            if not self.waiting or self._abandoned:
                return False
            self._granted = True
            self._cv.notify_all()
            while self._granted or self._running:
                self._cv.wait()
        return True

    def abandon(self) -> None:
        with self._cv:
            self._abandoned = True
            self._granted = False
            self._cv.notify_all()


class PrefillJob:
    """One request's prompt, running apart from its row until it joins (see module docstring).
    `future` is set by the scheduler once the job is on a prefill worker."""

    def __init__(
        self,
        request: Request,
        home: RowHome,
        admission: Admission,
        chunk_tokens: int | None = None,
        on_wait: Callable[[], None] | None = None,
    ) -> None:
        self.request, self.home, self.admission = request, home, admission
        self.gate = TurnGate(on_wait) if on_wait is not None else None
        self.runs = PrefillRuns(chunk_tokens, self.gate.turn) if self.gate is not None else WHOLE
        self.future: Future[Prefilled] | None = None

    def run(self, prefix_cache: PrefixCache | None) -> Prefilled:
        """(a prefill worker) the prompt, away from every row."""
        return self.home.prefill_apart(self.admission, prefix_cache, self.runs)

    def done(self) -> bool:
        return self.future is not None and self.future.done()

    def wants_turn(self) -> bool:
        return self.gate is not None and self.gate.waiting

    def abandon(self) -> None:
        """The request went away: stop at the next turn, and whatever the prompt made goes
        back to its home once it is done (a run in progress cannot be interrupted)."""
        if self.gate is not None:
            self.gate.abandon()
        future = self.future
        if future is None:
            return
        if not future.cancel():
            future.add_done_callback(self._discard)

    def _discard(self, future: Future[Prefilled]) -> None:
        if not future.cancelled() and future.exception() is None:
            self.home.discard(future.result())


class Prefills:
    """The prompts of one decode scheduler that run apart from its step, by row: started,
    given turns, collected when done and abandoned by the decode worker (only its thread
    calls these); `wake` tells the worker that one is done or wants a turn."""

    def __init__(
        self,
        mode: str,
        chunk_tokens: int,
        workers: int,
        prefix_cache: PrefixCache | None,
        wake: Callable[[], None],
    ) -> None:
        check_prefill_mode(mode, chunk_tokens)
        self.mode, self.chunk_tokens = mode, chunk_tokens
        self.prefix_cache, self.wake = prefix_cache, wake
        self.jobs: dict[int, PrefillJob] = {}
        self.started = 0  # prompts that ran on the prefill workers, beside the step
        self.turns = 0  # chunk turns granted
        self.workers = workers
        self._pool = (
            ThreadPoolExecutor(workers, thread_name_prefix="onnx-tts-prefill")
            if mode != "inline"
            else None
        )

    def start_workers(self) -> None:
        """Start every prefill worker now, with the decode worker: the engine's threads are
        all there from its first request, and a burst later starts none (each start waits
        at a barrier of all of them, so the pool must make them all)."""
        if self._pool is not None:
            barrier = threading.Barrier(self.workers)
            for started in [self._pool.submit(barrier.wait) for _ in range(self.workers)]:
                started.result()

    @property
    def inline(self) -> bool:
        return self._pool is None

    def runs_inline(self, admission: Admission) -> bool:
        """Whether this prompt runs in the round (mode `inline`, or a prompt of a few
        positions)."""
        return self.inline or admission.inputs.shape[1] <= INLINE_PROMPT_POSITIONS

    def __contains__(self, row: int) -> bool:
        return row in self.jobs

    def __len__(self) -> int:
        return len(self.jobs)

    def start(self, row: int, request: Request, home: RowHome, admission: Admission) -> None:
        """Run row `row`'s prompt on a prefill worker (not `inline`)."""
        assert self._pool is not None
        chunked = self.mode == "chunked"
        job = PrefillJob(
            request,
            home,
            admission,
            self.chunk_tokens if chunked else None,
            self.wake if chunked else None,
        )
        self.jobs[row] = job
        job.future = self._pool.submit(job.run, self.prefix_cache)
        job.future.add_done_callback(lambda _: self.wake())
        self.started += 1

    def grant(self, rows: list[int]) -> int:
        """Chunked prefill: one turn to each of `rows` that waits for one (the caller waits
        for its chunk); returns the turns granted."""
        granted = 0
        for row in rows:
            job = self.jobs.get(row)
            if job is not None and job.gate is not None and job.gate.grant():
                granted += 1
        self.turns += granted
        return granted

    def ready(self, can_join: Callable[[int, PrefillJob], bool]) -> list[tuple[int, PrefillJob]]:
        """The jobs that are done and whose row can take them now (`can_join`: a slot row
        waits for a buffer grown beside the steps), by row, no longer in flight."""
        done = sorted(row for row, job in self.jobs.items() if job.done() and can_join(row, job))
        return [(row, self.jobs.pop(row)) for row in done]

    def has_news(self, can_join: Callable[[int, PrefillJob], bool]) -> bool:
        """A job is done and can join, waits for a turn, or lost its request (cancelled)."""
        return any(
            (job.done() and can_join(row, job)) or job.wants_turn() or job.request.cancel.cancelled
            for row, job in self.jobs.items()
        )

    def view(self) -> tuple[tuple[int, Urgency, bool], ...]:
        """(row, urgency, waits for a turn) of each job, as the scheduling policy sees it."""
        return tuple(
            (row, job.request.urgency(), job.wants_turn()) for row, job in self.jobs.items()
        )

    def abandon(self, row: int) -> None:
        job = self.jobs.pop(row, None)
        if job is not None:
            job.abandon()

    def abandon_all(self) -> None:
        for row in list(self.jobs):
            self.abandon(row)

    def close(self) -> None:
        """(after the worker stopped) wait for prompts still running; their KV goes back."""
        self.abandon_all()
        if self._pool is not None:
            self._pool.shutdown(wait=True)


__all__ = [
    "DEFAULT_CHUNK_TOKENS",
    "DEFAULT_PREFILL_MODE",
    "INLINE_PROMPT_POSITIONS",
    "PREFILL_MODES",
    "PrefillAbandoned",
    "PrefillJob",
    "Prefills",
    "TurnGate",
    "check_prefill_mode",
]

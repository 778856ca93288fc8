"""The one decode loop: every request, alone or among others, is a row of one scheduler.

Requests (from any thread) wait in a bounded queue. Each round the scheduling policy
(`policy.py`; by default most urgent first: priority, then the earliest due time) decides, as
plain data, which waiting requests enter which free rows and which rows step (`DecodePlan`);
the worker then applies the plan: it prefills the admitted requests (their prompts at once on
the prefill workers when the program has a prefill graph of its own) and runs one decode step
of the chosen rows: rows kept in the shared in-place slot buffer in one LM run, rows with a
cache of their own one run each (`kv_rows.py`), then the family's program consumes all rows'
outputs at once. `max_batch=1` is a solo engine; a graph that cannot batch gets caches of its
own inside the same loop; classifier-free guidance is two LM rows of one request.

A request leaves when its program says it is done, when it is cancelled (its consumer closed
the stream, its cancel token fired, a server client went away: the row is freed at the next
step), or on an error, which fails that request alone. Nothing is copied when rows join or
leave.

Batch invariance: every row has its own sampler and RNG stream and its own KV row, and the
LM's kernels compute rows independently, so a request's frames do not depend on which
requests shared its steps (tests/test_scheduler.py checks this against max_batch=1).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from onnx_tts.cache.prefix import PrefixCache
from onnx_tts.decoding.batch_probe import batch_invariance_problem
from onnx_tts.decoding.kv_pool import KVPool
from onnx_tts.decoding.kv_rows import DEFAULT_SLOT_BYTES, OwnCaches, RowHome, SlotRows, SlotRun
from onnx_tts.decoding.policy import DecodePlan, DecodeView, SchedulingPolicy, make_policy
from onnx_tts.decoding.program import Admission, DecodeProgram
from onnx_tts.decoding.request import Handoff, Request
from onnx_tts.errors import InputError, OnnxTTSError

log = logging.getLogger("onnx_tts.decoding")

MAX_BATCH_LIMIT = 256
# Threads that run the prompts of requests admitted together (bound: far above the cores of
# any machine this runs on).
MAX_PREFILL_WORKERS = 64
# Requests waiting for a row beyond this many are refused (QueueFull) instead of queued.
DEFAULT_MAX_WAITING = 1024
# A scheduler without work for this long lets its slot buffers go: a burst grew them, and a
# long-running server would otherwise hold them until it exits. (None: kept.)
IDLE_RELEASE_SECONDS: float | None = 60.0
MAX_WAITING_LIMIT = 1 << 20
# Schedulers whose worker may be inside an ONNX Runtime run. At interpreter exit a daemon
# worker still in a run aborts the process ("terminate called without an active exception",
# exit 134) when the runtime's statics are destroyed under it: stop them first.
_LIVE: weakref.WeakSet[DecodeScheduler] = weakref.WeakSet()


@atexit.register
def _close_live_schedulers() -> None:
    for scheduler in list(_LIVE):
        scheduler.close()


class QueueFull(OnnxTTSError):
    """More requests wait for a row than the scheduler's queue holds; retry later."""


class FrameStream:
    """The frames of one scheduled request, as the worker produces them (the default sink).
    Closing it (or dropping it) cancels the request: its row is freed at the next step."""

    def __init__(self, request: Request, scheduler: DecodeScheduler) -> None:
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
        self.close()


class DecodeScheduler:
    """Runs a family's DecodeProgram for every request of one model (module docstring)."""

    def __init__(
        self,
        program: DecodeProgram,
        pool: KVPool,
        max_batch: int,
        prefix_cache: PrefixCache | None = None,
        slot_bytes: int = DEFAULT_SLOT_BYTES,
        max_waiting: int = DEFAULT_MAX_WAITING,
        lookahead: bool = False,
        prefill_workers: int = 1,
        policy: SchedulingPolicy | str | None = None,
    ) -> None:
        _check_count("max_batch", max_batch, MAX_BATCH_LIMIT)
        self.policy = make_policy(policy)
        _check_count("prefill_workers", prefill_workers, MAX_PREFILL_WORKERS)
        self.program, self.pool, self.max_batch = program, pool, max_batch
        self.layout = pool.layout
        self.prefix_cache = prefix_cache
        self.max_waiting = max_waiting
        self.batching_unavailable = batching_support(pool)
        if self.batching_unavailable is None and max_batch > 1:  # rows would share steps
            self.batching_unavailable = batch_invariance_problem(program, pool)
        self.slots: SlotRows | None = None
        if self.batching_unavailable is None:
            self.slots = SlotRows(program, self.layout, pool.capacity, max_batch, slot_bytes)
        self.own = OwnCaches(program, pool, self.layout)
        self.state = program.new_state(max_batch)
        self.requests: list[Request | None] = [None] * max_batch
        self.homes: list[RowHome | None] = [None] * max_batch
        self.finishing = np.zeros(max_batch, bool)  # done, frames not yet handed over
        self.waiting: list[Request] = []
        # Lookahead: the LM run of a step goes on in this thread while the frames of the
        # step before are handed over (see _step).
        self._helper = (
            ThreadPoolExecutor(1, thread_name_prefix="onnx-tts-lm") if lookahead else None
        )
        self._pending: tuple[np.ndarray, list[Request | None], Any] | None = None
        # Prompts admitted together run on this many threads at once (see _prefill).
        self._prefill_pool = (
            ThreadPoolExecutor(prefill_workers, thread_name_prefix="onnx-tts-prefill")
            if prefill_workers > 1
            else None
        )
        self._cv = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._stats = {
            "requests": 0,
            "steps": 0,
            "row_steps": 0,
            "prefills": 0,
            "parallel_prefills": 0,  # prompts that ran beside others on the prefill workers
            "own_kv": 0,
            "paced_rows": 0,
            "slot_releases": 0,  # times idle slot buffers were let go
            "busy_seconds": 0.0,
        }

    # -- public ------------------------------------------------------------------------------
    def submit(self, request: Request) -> Any:
        """Queue `request`; its frames go to `request.sink` (`put(frame)`, then `end(error)`)
        as they are made. Without a sink the request gets a FrameStream, returned (and set as
        its sink) for the caller to iterate. Raises QueueFull when the queue is at its
        bound."""
        if request.sink is None:
            request.sink = FrameStream(request, self)
        stream = request.sink
        with self._cv:
            if self._closed:
                raise OnnxTTSError("the engine's decode scheduler is closed")
            if len(self.waiting) >= self.max_waiting:
                raise QueueFull(
                    f"{len(self.waiting)} requests are waiting for a decode row (the limit); "
                    "retry shortly"
                )
            self.waiting.append(request)
            self._stats["requests"] += 1
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="onnx-tts-decode", daemon=True
                )
                self._thread.start()
                _LIVE.add(self)
            self._cv.notify()
        return stream

    def wake(self) -> None:
        """Have the worker look at cancellations now (a consumer went away)."""
        with self._cv:
            self._cv.notify()

    def idle(self) -> bool:
        """Whether no request waits or decodes now (its core is free for other work)."""
        with self._cv:
            return not self.waiting and all(request is None for request in self.requests)

    def stats(self) -> dict[str, Any]:
        with self._cv:
            steps = self._stats["steps"]
            slots = self.slots
            return {
                "max_batch": self.max_batch,
                "slot_capacity": slots.capacity if slots is not None else 0,
                "slot_rows": slots.rows if slots is not None else 0,
                "slot_bytes": slots.allocated_bytes() if slots is not None else 0,
                "slot_grows": slots.grown if slots is not None else 0,
                "queued": len(self.waiting),
                "active_rows": sum(r is not None for r in self.requests),
                "mean_batch": self._stats["row_steps"] / steps if steps else 0.0,
                **self._stats,
            }

    def row_ptrs(self, request: Request) -> list[int]:
        """Where `request`'s KV lives now (for tests: rows never move while they decode)."""
        with self._cv:
            for row, active in enumerate(self.requests):
                home = self.homes[row]
                if active is request and home is not None:
                    return home.row_ptrs(row)
        return []

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        if self._helper is not None:
            self._helper.shutdown(wait=True)
        if self._prefill_pool is not None:
            self._prefill_pool.shutdown(wait=True)

    # -- worker ------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._closed and not self.waiting and not self._active_rows().size:
                    if not self._cv.wait(self._idle_timeout()) and not self.waiting:
                        self._release_idle()  # no work came for IDLE_RELEASE_SECONDS
                if self._closed:
                    self._pending = None
                    closed = OnnxTTSError("the engine was closed")
                    for request in [*self.waiting, *filter(None, self.requests)]:
                        _tell(request.sink.end, closed)
                    self.waiting.clear()
                    return
                plan = self._plan()  # the policy decides, as plain data
                admitted = self._take(plan)
            started = time.perf_counter()
            try:
                if admitted:
                    self._prefill(admitted)
                self._drop_cancelled()
                rows = self._stepping(plan)
                if rows.size:
                    self._step(rows)
                if not self._active_rows().size:
                    self._hand_over_pending()  # nothing to overlap it with
            except Exception as error:  # a fault outside any row's own work: the requests
                # in the scheduler fail, the worker lives on (a dead worker would leave every
                # stream waiting forever)
                log.info("decode step failed, its requests get the error: %r", error)
                self._pending = None
                for row, request in enumerate(self.requests):
                    if request is not None:
                        self._free(row, error)
            with self._cv:  # for admission control: how busy this worker is
                self._stats["busy_seconds"] += time.perf_counter() - started

    def _idle_timeout(self) -> float | None:
        holding = self.slots is not None and self.slots.allocated_bytes() > 0
        return IDLE_RELEASE_SECONDS if holding else None

    def _release_idle(self) -> None:
        if self.slots is not None and self.slots.release_idle():
            self._stats["slot_releases"] += 1

    def _active_rows(self) -> np.ndarray:
        """Rows still decoding (not the ones whose last frames await hand-over)."""
        return np.array(
            [i for i, r in enumerate(self.requests) if r is not None and not self.finishing[i]],
            np.int64,
        )

    def _plan(self) -> DecodePlan:
        """(under the lock) the policy's plan for this round: which waiting requests enter
        which free rows, which rows step and which sit the step out."""
        self.waiting = [r for r in self.waiting if not self._cancelled(r)]
        free = tuple(row for row, active in enumerate(self.requests) if active is None)
        active = tuple(
            (int(row), self.requests[row].urgency())  # type: ignore[union-attr]
            for row in self._active_rows()
        )
        view = DecodeView(tuple(r.urgency() for r in self.waiting), free, active, time.monotonic())
        return self.policy.schedule(view)

    def _take(self, plan: DecodePlan) -> list[int]:
        """(under the lock) apply the plan's admissions: its requests leave the queue for
        their rows; returns those rows."""
        for index, row in plan.admit:
            self.requests[row] = self.waiting[index]
        chosen = {index for index, _ in plan.admit}
        self.waiting = [r for i, r in enumerate(self.waiting) if i not in chosen]
        return [row for _, row in plan.admit]

    def _stepping(self, plan: DecodePlan) -> np.ndarray:
        """The rows of this step: the plan's, still decoding after prefill (a request may
        have failed, finished or been cancelled since)."""
        active = set(self._active_rows().tolist())
        rows = np.array([row for row in plan.step if row in active], np.int64)
        paced = sum(row in active for row in plan.sit_out)
        if paced:
            with self._cv:
                self._stats["paced_rows"] += paced
        return rows

    @staticmethod
    def _cancelled(request: Request) -> bool:
        if request.cancel.cancelled:
            _tell(request.sink.end, None)
            return True
        return False

    def _free(self, row: int, error: BaseException | None = None) -> None:
        request = self.requests[row]
        if request is not None:
            _tell(request.sink.end, error)
        home = self.homes[row]
        if home is not None:
            home.release(row)
        self.requests[row] = None
        self.homes[row] = None
        self.finishing[row] = False

    def _drop_cancelled(self) -> None:
        for row, request in enumerate(self.requests):
            if request is not None and request.cancel.cancelled:
                self._free(row)

    def _prefill(self, rows: list[int]) -> None:
        """Prefill the rows admitted together, then let the program consume all their outputs
        in one call (one batched run of its per-step work, as a step does). Prompts run on
        the prefill workers at once when the program has a prefill graph of its own (each in
        its own slot row; a burst of arrivals otherwise waits for one prompt after another on
        one core while the others idle). A request whose prefill fails fails alone."""
        started: list[tuple[int, Admission]] = []
        for row in rows:
            admission = self._admit(row)
            if admission is not None:
                started.append((row, admission))

        def run(item: tuple[int, Admission]) -> tuple[int, np.ndarray | None, Exception | None]:
            row, admission = item
            try:
                home = self.homes[row]
                assert home is not None
                return row, home.prefill(row, admission, self.prefix_cache), None
            except Exception as error:
                return row, None, error

        parallel = [item for item in started if self._parallel_prefill(item[0])]
        alone = [item for item in started if not self._parallel_prefill(item[0])]
        results = [run(item) for item in alone]
        if len(parallel) > 1 and self._prefill_pool is not None:
            results += self._prefill_pool.map(run, parallel)
            with self._cv:
                self._stats["parallel_prefills"] += len(parallel)
        else:
            results += [run(item) for item in parallel]
        done, outputs = [], []
        for row, output, error in sorted(results, key=lambda result: result[0]):
            if output is None:
                self._free(row, error)
            else:
                done.append(row)
                outputs.append(output)
        if done:
            with self._cv:
                self._stats["prefills"] += len(done)
            self._deliver(np.array(done, np.int64), np.concatenate(outputs, axis=0))

    def _admit(self, row: int) -> Admission | None:
        """The program's admission of row `row`'s request, with its KV home reserved (slot
        buffers grow here, before any prefill runs); None when it was cancelled or failed."""
        request = self.requests[row]
        assert request is not None
        try:
            if request.cancel.cancelled:
                self._free(row)
                return None
            admission = self.program.admit(self.state, row, request)
            if admission.inputs.shape[0] != self.program.lm_rows:
                raise InputError(
                    f"a request must prefill {self.program.lm_rows} LM row(s), got "
                    f"{admission.inputs.shape[0]}"
                )
            home: RowHome = self.own
            if self.slots is not None:
                if self.slots.reserve(row, admission.max_tokens):
                    home = self.slots
                else:  # longer than the slot budget: an in-place cache sized to it
                    with self._cv:
                        self._stats["own_kv"] += 1
            self.homes[row] = home
            return admission
        except Exception as error:  # that request fails alone
            self._free(row, error)
            return None

    def _parallel_prefill(self, row: int) -> bool:
        """Whether row `row` may prefill beside others: its prompt runs through the program's
        own prefill graph (one session run, thread-safe) into its own slot row."""
        return (
            self._prefill_pool is not None
            and self.program.prefill_lm is not None
            and self.slots is not None
            and self.homes[row] is self.slots
        )

    def _lm_positions(self, selected: np.ndarray) -> np.ndarray:
        """LM-row indices (into a step's inputs/outputs) of the selected request indices."""
        lm = self.program.lm_rows
        return (selected[:, None] * lm + np.arange(lm)[None, :]).reshape(-1)

    def _step(self, rows: np.ndarray) -> None:
        """One decode step of `rows`. With lookahead, the frames of the step before are
        handed to their consumers while this step's LM run goes on in the helper thread (the
        run does not need them: its inputs came from the program's state)."""
        in_slots = np.array([self.homes[row] is self.slots for row in rows], bool)
        fits = np.ones(len(rows), bool)
        if in_slots.any():
            fits[in_slots] = self.slots.fits_next_step(rows[in_slots])  # type: ignore[union-attr]
        if (~in_slots).any():
            fits[~in_slots] = self.own.fits_next_step(rows[~in_slots])
        for row in rows[~fits]:  # the program should have ended it; never write past a buffer
            self._free(int(row), InputError("generation reached the KV capacity of its row"))
        rows, in_slots = rows[fits], in_slots[fits]
        if not rows.size:
            self._hand_over_pending()
            return
        try:
            inputs = self.program.step_inputs(self.state, rows)
            prepared = None
            if in_slots.any():
                chosen = np.flatnonzero(in_slots)
                prepared = self.slots.prepare(rows[chosen], inputs[self._lm_positions(chosen)])  # type: ignore[union-attr]
        except Exception as error:  # the program failed: every row of the step fails
            self._hand_over_pending()
            for row in rows:
                self._free(int(row), error)
            return

        def run() -> tuple[list[tuple[np.ndarray, np.ndarray]], list[tuple[int, Exception]]]:
            return self._run_lm(rows, in_slots, inputs, prepared)

        if self._helper is not None and self._pending is not None:
            future = self._helper.submit(run)
            self._hand_over_pending()  # overlapped with the LM run
            parts, failures = future.result()
        else:
            self._hand_over_pending()
            parts, failures = run()
        for row, error in failures:
            self._free(row, error)
        if not parts:
            return
        order = np.concatenate([chosen for chosen, _ in parts])
        outputs = np.concatenate([out for _, out in parts], axis=0)
        ran = np.argsort(order, kind="stable")
        order = order[ran]
        outputs = outputs[self._lm_positions(ran)]
        with self._cv:
            self._stats["steps"] += 1
            self._stats["row_steps"] += int(order.size)
        self._deliver(rows[order], outputs, defer=self._helper is not None)

    def _run_lm(
        self,
        rows: np.ndarray,
        in_slots: np.ndarray,
        inputs: np.ndarray,
        prepared: SlotRun | None,
    ) -> tuple[list[tuple[np.ndarray, np.ndarray]], list[tuple[int, Exception]]]:
        """The LM runs of one step: the slot rows in one run, each other row on its own
        cache. Returns (request indices, their outputs) parts and the rows that failed; frees
        nothing itself (it may run in the helper thread)."""
        parts: list[tuple[np.ndarray, np.ndarray]] = []
        failures: list[tuple[int, Exception]] = []
        if prepared is not None:
            chosen = np.flatnonzero(in_slots)
            try:
                outputs = self.slots.run(prepared)  # type: ignore[union-attr]
                self.slots.commit(prepared)  # type: ignore[union-attr]
                parts.append((chosen, outputs))
            except Exception as error:  # a failed batched run fails the rows in it
                failures.extend((int(row), error) for row in rows[chosen])
        for index in np.flatnonzero(~in_slots):
            chosen = np.array([index])
            try:
                outputs = self.own.step(rows[chosen], inputs[self._lm_positions(chosen)])
                parts.append((chosen, outputs))
            except Exception as error:
                failures.append((int(rows[index]), error))
        return parts, failures

    def _deliver(self, rows: np.ndarray, outputs: np.ndarray, defer: bool = False) -> None:
        """The program consumes the rows' outputs; their frames go to the consumers now, or
        (`defer`, lookahead) during the next step's LM run. Rows that finished leave the
        decode at once either way."""
        try:
            result = self.program.consume(self.state, rows, outputs)
        except Exception as error:
            for row in rows:
                self._free(int(row), error)
            return
        requests = [self.requests[int(row)] for row in rows]
        for index, row in enumerate(rows):
            if result.done[index]:
                self.finishing[int(row)] = True
        if defer:
            self._pending = (rows, requests, result)
        else:
            self._hand_over(rows, requests, result)

    def _hand_over_pending(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._hand_over(*pending)

    def _hand_over(self, rows: np.ndarray, requests: list[Request | None], result: Any) -> None:
        for index, row in enumerate(rows):
            request = requests[index]
            if request is None or self.requests[int(row)] is not request:
                continue  # cancelled meanwhile (and maybe its row already reused)
            for frame in result.frames[index]:
                _tell(request.sink.put, frame)
            if result.done[index]:
                self._free(int(row))

    def __repr__(self) -> str:
        return f"DecodeScheduler(max_batch={self.max_batch}, slots={self.slots is not None})"


def _check_count(name: str, value: Any, limit: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{name} must be an integer, got {value!r}")
    if not 1 <= value <= limit:
        raise InputError(f"{name} must be in [1, {limit}], got {value}")


def _tell(call: Any, argument: Any) -> None:
    """Hand a frame or the end to a request's sink; a failing consumer is its own problem
    (it is told through its stream) and never stops the loop that serves the others."""
    try:
        call(argument)
    except Exception:
        log.warning("a request's consumer failed to take its frames", exc_info=True)


def batching_support(pool: KVPool) -> str | None:
    """None when this model's requests can share one batched LM run, else why not (they then
    run in the same loop on KV caches of their own)."""
    if pool.mode != "inplace":
        return f"KV mode {pool.mode!r} (batched rows need the in-place cache: --kv inplace)"
    if not pool.layout.in_place:
        return "the LM grows its cache by Concat (convert it with `onnx-tts convert --inplace-kv`)"
    return None


__all__ = [
    "DEFAULT_MAX_WAITING",
    "MAX_BATCH_LIMIT",
    "DecodeScheduler",
    "FrameStream",
    "QueueFull",
    "batching_support",
]

"""The one decode loop: every request, alone or among others, is a row of one scheduler.

Requests (from any thread) wait in a bounded queue. Each round the scheduling policy
(`policy.py`: by default most urgent first) decides, as plain data, which waiting requests
enter which free rows, which prefills start or get a chunk turn, and which rows step
(`DecodePlan`); the worker applies the plan. An admitted request's prompt runs apart from the
rows decoding (`prefill.py`: by default on a prefill worker) and the request joins at the first
round after it is done: its KV goes into its row between steps. A step runs the chosen rows:
rows in the shared in-place slot buffer in one LM run, rows with a cache of their own one run
each (`kv_rows.py`), then the family's program consumes all rows' outputs at once.
`max_batch=1` is a solo engine; classifier-free guidance is two LM rows of one request.

A request leaves when its program says it is done, when it is cancelled (the row is freed at
the next round, also during its prefill), or on an error, which fails that request alone.

Batch invariance: every row has its own sampler, RNG stream and KV row, the LM's kernels
compute rows independently and every prompt runs at batch 1, so a request's frames do not
depend on which requests shared its steps (tests/test_scheduler.py, tests/test_prefill.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from onnx_tts.cache.prefix import PrefixCache
from onnx_tts.decoding.batch_probe import batch_invariance_problem, batching_support
from onnx_tts.decoding.kv_pool import KVPool
from onnx_tts.decoding.kv_rows import DEFAULT_SLOT_BYTES, OwnCaches, RowHome, SlotRows, SlotRun
from onnx_tts.decoding.policy import DecodePlan, DecodeView, SchedulingPolicy, make_policy
from onnx_tts.decoding.prefill import DEFAULT_CHUNK_TOKENS, DEFAULT_PREFILL_MODE, Prefills
from onnx_tts.decoding.program import Admission, DecodeProgram
from onnx_tts.decoding.request import FrameStream, Request, tell_sink
from onnx_tts.errors import InputError, OnnxTTSError, checked_integer
from onnx_tts.session import close_at_exit

log = logging.getLogger("onnx_tts.decoding")

MAX_BATCH_LIMIT = 256
MAX_PREFILL_WORKERS = 64  # threads running prompts apart: far above any machine's cores
IDLE_ROUND_SECONDS = 0.005  # after a round that ran nothing, the policy looks again this soon
DEFAULT_MAX_WAITING = 1024  # requests waiting for a row beyond this many are refused (QueueFull)
# A scheduler without work for this long lets its slot buffers go: a burst grew them, and a
# long-running server would otherwise hold them until it exits. (None: kept.)
IDLE_RELEASE_SECONDS: float | None = 60.0


class QueueFull(OnnxTTSError):
    """More requests wait for a row than the scheduler's queue holds; retry later."""


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
        prefill: str = DEFAULT_PREFILL_MODE,
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    ) -> None:
        checked_integer("max_batch", max_batch, 1, MAX_BATCH_LIMIT)
        self.policy = make_policy(policy)
        checked_integer("prefill_workers", prefill_workers, 1, MAX_PREFILL_WORKERS)
        self.program, self.pool, self.max_batch = program, pool, max_batch
        self.layout = pool.layout
        self.prefix_cache = prefix_cache
        self.max_waiting = max_waiting
        self.batching_unavailable, min_span = batching_support(pool), 1
        if self.batching_unavailable is None and max_batch > 1:  # rows would share steps
            self.batching_unavailable, min_span = batch_invariance_problem(program, pool)
        self.slots: SlotRows | None = None
        if self.batching_unavailable is None:
            self.slots = SlotRows(
                program, self.layout, pool.capacity, max_batch, slot_bytes, min_span
            )
            self.slots.on_grown = self.wake
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
        # Prompts run apart from the step, on prefill workers (prefill.py).
        self.prefilling = Prefills(prefill, chunk_tokens, prefill_workers, prefix_cache, self.wake)
        self._cv = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        # Before each step: the vocoder stage's `hold_lm` (a burst's first audio goes first).
        self.hold_steps: Callable[[], None] = lambda: None
        # Whether a core is free for the upper half of a step (the vocoder stage's `idle`).
        self.second_core_free: Callable[[], bool] = lambda: False
        self._stats = {
            "requests": 0,
            "steps": 0,
            "row_steps": 0,
            "prefills": 0,
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
                self.prefilling.start_workers()
                if self.slots is not None:
                    self.slots.start_threads()
                if self._helper is not None:  # (its thread too: a burst starts none)
                    self._helper.submit(time.monotonic)
                self._thread = threading.Thread(
                    target=self._run, name="onnx-tts-decode", daemon=True
                )
                self._thread.start()
                close_at_exit(self)
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
                "prefilling": len(self.prefilling),
                "parallel_prefills": self.prefilling.started,  # on the prefill workers
                "prefill_turns": self.prefilling.turns,  # chunked prefill
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
        self.prefilling.close()
        if self.slots is not None:
            self.slots.close()

    # -- worker ------------------------------------------------------------------------------
    def _run(self) -> None:
        idle = False  # the last round could run nothing: wait a little before the next
        while True:
            with self._cv:
                while not self._closed and not self._has_work():
                    if not self._cv.wait(self._idle_timeout()) and not self._has_work():
                        self._release_idle()  # no work came for IDLE_RELEASE_SECONDS
                if idle and not self._closed:
                    self._cv.wait(IDLE_ROUND_SECONDS)
                if self._closed:
                    self._close_requests()
                    return
            started = time.perf_counter()
            try:
                idle = not self._round()
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
        holding = holding and not self.prefilling.jobs  # a prompt apart joins its slot row
        return IDLE_RELEASE_SECONDS if holding else None

    def _release_idle(self) -> None:
        if self.slots is not None and self.slots.release_idle():
            self._stats["slot_releases"] += 1

    def _round(self) -> bool:
        """Apply one plan: a slot buffer grown beside the steps comes in, prompts done apart
        join their rows, admitted requests start their prefills, chunked prefills get their
        turns, then the chosen rows step. Returns whether anything ran."""
        grown = self._swap_grown()
        joined = self._join_ready()
        with self._cv:
            plan = self._plan()  # the policy decides, as plain data
            admitted = self._take(plan) if plan.admit else []  # (a long queue is not copied)
        if admitted:
            joined += self._start_prefills([row for row in plan.prefill if row in admitted])
        turns = self.prefilling.grant([row for row in plan.prefill if row not in admitted])
        if turns:
            joined += self._join_ready()
        self._drop_cancelled()
        rows = self._stepping(plan, joined)
        if rows.size:
            self.hold_steps()
            self._step(rows)
        if not self._active_rows().size:
            self._hand_over_pending()  # nothing to overlap it with
        return bool(grown or joined or admitted or turns or rows.size)

    def _swap_grown(self) -> bool:
        """A slot buffer grown beside the steps replaces the old one (between steps); if it
        could not be made, the requests waiting for it fail."""
        if self.slots is None:
            return False
        try:
            return self.slots.swap_grown()
        except Exception as error:
            for row, home in enumerate(self.homes):
                if home is self.slots and not self.slots.has_room(row):
                    self._free(row, error)
            return True

    def _has_room(self, row: int, home: RowHome) -> bool:
        return home is not self.slots or self.slots.has_room(row)

    def _can_join(self, row: int, job: Any) -> bool:  # (a slot row waits for a grown buffer)
        return self._has_room(row, job.home)

    def _has_work(self) -> bool:
        """(under the lock) requests wait, rows decode, a prefill is done/waits/lost its request."""
        return (
            bool(self.waiting)
            or bool(self._active_rows().size)
            or self.prefilling.has_news(self._can_join)
            or (self.slots is not None and self.slots.growth_done())
        )

    def _close_requests(self) -> None:
        """(under the lock, the engine closing) every request gets the error."""
        self._pending = None
        closed = OnnxTTSError("the engine was closed")
        self.prefilling.abandon_all()
        for request in [*self.waiting, *filter(None, self.requests)]:
            tell_sink(request.sink.end, closed)
        self.waiting.clear()

    def _active_rows(self) -> np.ndarray:
        """Rows decoding (not the ones whose prompt runs apart, nor the ones whose last frames
        await hand-over)."""
        return np.array(
            [
                i
                for i, r in enumerate(self.requests)
                if r is not None and not self.finishing[i] and i not in self.prefilling
            ],
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
        view = DecodeView(
            tuple(r.urgency() for r in self.waiting),
            free,
            active,
            time.monotonic(),
            self.prefilling.view(),
        )
        return self.policy.schedule(view)

    def _take(self, plan: DecodePlan) -> list[int]:
        """(under the lock) apply the plan's admissions: its requests leave the queue for
        their rows; returns those rows."""
        for index, row in plan.admit:
            self.requests[row] = self.waiting[index]
        chosen = {index for index, _ in plan.admit}
        self.waiting = [r for i, r in enumerate(self.waiting) if i not in chosen]
        return [row for _, row in plan.admit]

    def _stepping(self, plan: DecodePlan, joined: list[int]) -> np.ndarray:
        """The rows of this step: the plan's and the ones that joined this round, still
        decoding (a request may have failed, finished or been cancelled since)."""
        active = set(self._active_rows().tolist())
        rows = np.array(sorted(active & {*plan.step, *joined}), np.int64)
        paced = sum(row in active for row in plan.sit_out)
        if paced:
            with self._cv:
                self._stats["paced_rows"] += paced
        return rows

    @staticmethod
    def _cancelled(request: Request) -> bool:
        if request.cancel.cancelled:
            tell_sink(request.sink.end, request.error)
            return True
        return False

    def _free(self, row: int, error: BaseException | None = None) -> None:
        self.prefilling.abandon(row)  # its prompt's KV, when done, goes back to its home
        request = self.requests[row]
        if request is not None:
            tell_sink(request.sink.end, error)
        home = self.homes[row]
        if home is not None:
            home.release(row)
        self.requests[row], self.homes[row], self.finishing[row] = None, None, False

    def _drop_cancelled(self) -> None:
        for row, request in enumerate(self.requests):
            if request is not None and request.cancel.cancelled:
                self._free(row, request.error)

    def _start_prefills(self, rows: list[int]) -> list[int]:
        """Start the prefills of the rows admitted this round, in the plan's order: admission
        and KV home here (slot buffers grow here or beside the steps, never under a prompt:
        prompts run on scratch caches and join between steps), the prompt on a prefill worker
        (`inline` or a few positions: now, joining at once if its row fits). A request whose
        prefill fails fails alone. Returns the rows joined."""
        done = []
        for row in rows:
            admission = self._admit(row)
            home, request = self.homes[row], self.requests[row]
            if admission is None or home is None or request is None:
                continue
            if not self.prefilling.runs_inline(admission) or not self._has_room(row, home):
                self.prefilling.start(row, request, home, admission)  # (joins once it fits)
                continue
            try:
                done.append((row, home, home.prefill_apart(admission, self.prefix_cache)))
            except Exception as error:
                self._free(row, error)
        return self._join_all(done)

    def _join_ready(self) -> list[int]:
        """Prompts done apart whose rows can take them join (a failed one fails its request
        alone). Returns the rows that joined."""
        done = []
        for row, job in self.prefilling.ready(self._can_join):
            assert job.future is not None
            try:
                done.append((row, job.home, job.future.result()))
            except Exception as error:
                self._free(row, error)
        return self._join_all(done)

    def _join_all(self, done: list[tuple[int, RowHome, Any]]) -> list[int]:
        """Prompts join their rows (between steps: nothing else writes the rows then) and the
        program consumes their first outputs in one call. Returns the rows that joined."""
        rows, outputs = [], []
        for row, home, prefilled in done:
            try:
                home.join(row, prefilled)
            except Exception as error:
                home.discard(prefilled)
                self._free(row, error)
                continue
            rows.append(row)
            outputs.append(prefilled.outputs)
        if rows:
            with self._cv:
                self._stats["prefills"] += len(rows)
            self._deliver(np.array(rows, np.int64), np.concatenate(outputs, axis=0))
        return rows

    def _admit(self, row: int) -> Admission | None:
        """The program's admission of row `row`'s request, with its KV home reserved (slot
        buffers grow here, on the decode worker); None when it was cancelled or failed."""
        request = self.requests[row]
        assert request is not None
        try:
            if request.cancel.cancelled:
                self._free(row, request.error)
                return None
            admission = self.program.admit(self.state, row, request)
            if admission.inputs.shape[0] != self.program.lm_rows:
                raise InputError(
                    f"a request must prefill {self.program.lm_rows} LM row(s), got "
                    f"{admission.inputs.shape[0]}"
                )
            home: RowHome = self.own
            if self.slots is not None:
                # (apart from the step, a buffer that must grow grows beside the steps too)
                if self.slots.reserve(row, admission.max_tokens, wait=self.prefilling.inline):
                    home = self.slots
                else:  # longer than the slot budget: an in-place cache sized to it
                    with self._cv:
                        self._stats["own_kv"] += 1
            self.homes[row] = home
            return admission
        except Exception as error:  # that request fails alone
            self._free(row, error)
            return None

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
                prepared = self.slots.prepare(  # type: ignore[union-attr]
                    rows[chosen], inputs[self._lm_positions(chosen)], self.second_core_free()
                )
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
                tell_sink(request.sink.put, frame)
            if result.done[index]:
                self._free(int(row))

    def __repr__(self) -> str:
        return f"DecodeScheduler(max_batch={self.max_batch}, slots={self.slots is not None})"


__all__ = [
    "DEFAULT_MAX_WAITING",
    "MAX_BATCH_LIMIT",
    "DecodeScheduler",
    "FrameStream",
    "QueueFull",
    "batching_support",
]

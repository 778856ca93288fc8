"""Continuous batching: one LM step for every active request.

Requests (from any thread) queue FIFO; a worker thread admits each into a free row of a
`KVSlots` buffer ([rows, Hkv, capacity, D], allocated once), prefills it at batch 1 in that
row, and from then on runs one LM step over the contiguous range of rows that covers every
active sequence. A request leaves when its program says it is done, when its consumer closes
its stream (cancellation), or on an error, and its row is reused by the next one. Nothing is
copied when rows join or leave: each row's KV stays where it was written.

Batch invariance: every row has its own sampler and RNG stream and its own KV row, and the
LM's kernels compute rows independently, so a request's frames do not depend on which
requests shared its steps (tests/test_scheduler.py checks this against the solo path).
"""

from __future__ import annotations

import atexit
import collections
import queue
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from onnx_tts.cache.prefix import PrefixCache
from onnx_tts.decoding.kv_pool import CapacityPolicy
from onnx_tts.decoding.program import LOGITS, DecodeProgram, Request
from onnx_tts.errors import InputError, OnnxTTSError
from onnx_tts.graph_io import KVLayout
from onnx_tts.session import KVSlots

MAX_BATCH_LIMIT = 256
# The slot buffers of one scheduler hold at most this many bytes; capacity per row shrinks
# to fit (a request that needs more runs on the solo path).
DEFAULT_SLOT_BYTES = 2 << 30
MIN_SLOT_CAPACITY = 256
_DONE = object()
# Schedulers whose worker may be inside an ONNX Runtime run. At interpreter exit a daemon
# worker still in a run aborts the process ("terminate called without an active exception",
# exit 134) when the runtime's statics are destroyed under it: stop them first.
_LIVE: weakref.WeakSet[DecodeScheduler] = weakref.WeakSet()


@atexit.register
def _close_live_schedulers() -> None:
    for scheduler in list(_LIVE):
        scheduler.close()


class RunSolo(Exception):
    """Raised to a request that cannot run as a row (it needs more KV than a slot holds)."""


@dataclass
class _Ticket:
    request: Request
    should_stop: Callable[[], bool] | None
    frames: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    cancelled: bool = False
    row: int = -1

    def stopped(self) -> bool:
        return self.cancelled or (self.should_stop is not None and bool(self.should_stop()))


class FrameStream:
    """The frames of one scheduled request, as the worker produces them. Closing it (or
    dropping it) cancels the request: its row is freed at the next step."""

    def __init__(self, ticket: _Ticket, scheduler: DecodeScheduler) -> None:
        self._ticket, self._scheduler = ticket, scheduler
        self._finished = False

    def __iter__(self) -> Iterator[np.ndarray]:
        return self

    def __next__(self) -> np.ndarray:
        if self._finished:
            raise StopIteration
        item = self._ticket.frames.get()
        if item is _DONE:
            self._finished = True
            raise StopIteration
        if isinstance(item, BaseException):
            self._finished = True
            raise item
        return item

    def close(self) -> None:
        if not self._finished:
            self._finished = True
            self._scheduler.cancel(self._ticket)

    def __del__(self) -> None:
        self.close()


class DecodeScheduler:
    """Runs a family's DecodeProgram for many requests as rows of one LM batch."""

    def __init__(
        self,
        program: DecodeProgram,
        layout: KVLayout,
        capacity: CapacityPolicy,
        max_batch: int,
        slot_bytes: int = DEFAULT_SLOT_BYTES,
        prefix_cache: PrefixCache | None = None,
    ) -> None:
        if isinstance(max_batch, bool) or not isinstance(max_batch, int):
            raise InputError(f"max_batch must be an integer, got {max_batch!r}")
        if not 1 <= max_batch <= MAX_BATCH_LIMIT:
            raise InputError(f"max_batch must be in [1, {MAX_BATCH_LIMIT}], got {max_batch}")
        self.program, self.layout, self.max_batch = program, layout, max_batch
        self.prefix_cache = prefix_cache
        fitting = slot_bytes // max(1, max_batch * layout.bytes_per_token)
        ceiling = capacity.fixed if capacity.fixed is not None else capacity.limit
        self.capacity = int(min(ceiling, max(MIN_SLOT_CAPACITY, fitting)))
        self.slots = KVSlots(program.lm, max_batch, self.capacity, dict(layout.pairs))
        self.state = program.new_state(max_batch)
        self.lengths = np.zeros(max_batch, np.int64)  # cached tokens per row
        self.tickets: list[_Ticket | None] = [None] * max_batch
        self.waiting: collections.deque[_Ticket] = collections.deque()
        self._cv = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._embeds_dtype = np.dtype(program.lm.spec.inputs["inputs_embeds"].dtype)
        self._inputs = set(program.lm.input_names)
        self._pairs = len(layout.pairs)
        self._stats = {"requests": 0, "steps": 0, "row_steps": 0, "prefills": 0, "solo": 0}

    # -- public ------------------------------------------------------------------------------
    def submit(
        self, request: Request, should_stop: Callable[[], bool] | None = None
    ) -> FrameStream:
        """Queue `request`; its frames arrive on the returned stream as they are made."""
        ticket = _Ticket(request, should_stop)
        with self._cv:
            if self._closed:
                raise OnnxTTSError("the engine's decode scheduler is closed")
            self.waiting.append(ticket)
            self._stats["requests"] += 1
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="onnx-tts-decode", daemon=True
                )
                self._thread.start()
                _LIVE.add(self)
            self._cv.notify()
        return FrameStream(ticket, self)

    def cancel(self, ticket: _Ticket) -> None:
        with self._cv:
            ticket.cancelled = True
            if ticket in self.waiting:
                self.waiting.remove(ticket)
            self._cv.notify()

    def stats(self) -> dict[str, Any]:
        with self._cv:
            steps = self._stats["steps"]
            return {
                "max_batch": self.max_batch,
                "slot_capacity": self.capacity,
                "queued": len(self.waiting),
                "active_rows": sum(t is not None for t in self.tickets),
                "mean_batch": self._stats["row_steps"] / steps if steps else 0.0,
                **self._stats,
            }

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    # -- worker ------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._closed and not self.waiting and not self._active_rows().size:
                    self._cv.wait()
                if self._closed:
                    for ticket in [*self.waiting, *filter(None, self.tickets)]:
                        ticket.frames.put(OnnxTTSError("the engine was closed"))
                    return
                admitted = self._take_waiting()
            for ticket in admitted:
                self._prefill(ticket)
            self._drop_stopped()
            rows = self._active_rows()
            if rows.size:
                self._step(rows)

    def _active_rows(self) -> np.ndarray:
        return np.array([i for i, t in enumerate(self.tickets) if t is not None], np.int64)

    def _take_waiting(self) -> list[_Ticket]:
        admitted = []
        for row, ticket in enumerate(self.tickets):
            if ticket is None and self.waiting:
                waiting = self.waiting.popleft()
                waiting.row = row
                self.tickets[row] = waiting
                admitted.append(waiting)
        return admitted

    def _free(self, ticket: _Ticket, final: object = _DONE) -> None:
        ticket.frames.put(final)
        if ticket.row >= 0 and self.tickets[ticket.row] is ticket:
            self.tickets[ticket.row] = None
            self.lengths[ticket.row] = 0

    def _drop_stopped(self) -> None:
        for ticket in self.tickets:
            if ticket is not None and ticket.stopped():
                self._free(ticket)

    def _prefill(self, ticket: _Ticket) -> None:
        row = ticket.row
        try:
            if ticket.stopped():
                self._free(ticket)
                return
            admission = self.program.admit(self.state, row, ticket.request)
            if admission.embeds.shape[0] != 1:
                raise InputError("a batched request must prefill one LM row")
            if admission.max_tokens > self.capacity:
                self._free(ticket, RunSolo())
                with self._cv:
                    self._stats["solo"] += 1
                return
            embeds = admission.embeds.astype(self._embeds_dtype, copy=False)

            def run(part: np.ndarray, cached: int) -> np.ndarray:
                lengths = np.array([cached], np.int64)
                outputs = self.slots.step(
                    self._feeds(part, lengths), row, lengths, output_names=[LOGITS]
                )
                return outputs[LOGITS][:, -1]

            if self.prefix_cache is None:
                logits = run(embeds, 0)
            else:
                logits = self.prefix_cache.prefill(
                    embeds,
                    admission.prefix,
                    run,
                    lambda length: [self.slots.read(i, row, length) for i in range(self._pairs)],
                    lambda values: self.slots.load_prefix(row, values),
                )
            self.lengths[row] = embeds.shape[1]
            with self._cv:
                self._stats["prefills"] += 1
            self._deliver(np.array([row], np.int64), logits)
        except Exception as error:  # that request fails alone
            self._free(ticket, error)

    def _step(self, rows: np.ndarray) -> None:
        fits = self.lengths[rows] < self.capacity
        for row in rows[~fits]:  # the program should have ended it; never write past the buffer
            self._free(
                self.tickets[row],  # type: ignore[arg-type]
                InputError(f"generation reached the KV capacity ({self.capacity} tokens)"),
            )
        rows = rows[fits]
        if not rows.size:
            return
        first, span = int(rows[0]), int(rows[-1] - rows[0]) + 1
        try:
            active = self.program.step_embeds(self.state, rows).astype(
                self._embeds_dtype, copy=False
            )
            # A free row's length is 0 (see _free): inside the span it computes a throwaway
            # token at position 0 of its own buffer.
            lengths = self.lengths[first : first + span].copy()
            if span == rows.size:  # contiguous rows: the usual case, nothing to scatter
                embeds = active
            else:
                embeds = np.zeros((span, *active.shape[1:]), self._embeds_dtype)
                embeds[rows - first] = active
            outputs = self.slots.step(
                self._feeds(embeds, lengths), first, lengths, output_names=[LOGITS]
            )
            self.lengths[rows] += 1
            with self._cv:
                self._stats["steps"] += 1
                self._stats["row_steps"] += int(rows.size)
            self._deliver(rows, outputs[LOGITS][rows - first, -1])
        except Exception as error:  # a failed batch step fails the requests in it
            for row in rows:
                ticket = self.tickets[row]
                if ticket is not None:
                    self._free(ticket, error)

    def _deliver(self, rows: np.ndarray, logits: np.ndarray) -> None:
        result = self.program.consume(self.state, rows, logits)
        for index, row in enumerate(rows):
            ticket = self.tickets[row]
            if ticket is None:
                continue
            for frame in result.frames[index]:
                ticket.frames.put(frame)
            if result.done[index]:
                self._free(ticket)

    def _feeds(self, embeds: np.ndarray, lengths: np.ndarray) -> dict[str, np.ndarray]:
        """LM inputs beside the KV cache for rows with `lengths` cached tokens each."""
        new = embeds.shape[1]
        feeds: dict[str, np.ndarray] = {"inputs_embeds": embeds}
        if "attention_mask" in self._inputs:
            width = int(lengths.max()) + new
            feeds["attention_mask"] = (np.arange(width)[None, :] < (lengths + new)[:, None]).astype(
                np.int64
            )
        if "position_ids" in self._inputs:
            feeds["position_ids"] = (lengths[:, None] + np.arange(new)[None, :]).astype(np.int64)
        return feeds

    def __repr__(self) -> str:
        return f"DecodeScheduler(max_batch={self.max_batch}, capacity={self.capacity})"


def batching_support(program: DecodeProgram, layout: KVLayout, kv_mode: str) -> str | None:
    """None when this model can decode requests as rows of one batch, else why not."""
    if kv_mode != "inplace":
        return f"KV mode {kv_mode!r} (batched rows need the in-place cache: --kv inplace)"
    if not layout.in_place:
        return "the LM grows its cache by Concat (convert it with `onnx-tts convert --inplace-kv`)"
    return None


__all__ = [
    "DEFAULT_SLOT_BYTES",
    "MAX_BATCH_LIMIT",
    "DecodeScheduler",
    "FrameStream",
    "RunSolo",
    "batching_support",
]

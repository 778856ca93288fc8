"""Where each request row of the scheduler keeps its KV cache.

Two homes, one interface (`prefill_apart` + `join`, `step`, `release`):

* `SlotRows`: rows of one shared in-place buffer per KV tensor ([rows, Hkv, capacity, D],
  `KVSlots`), so one LM run steps every slot row at once. The buffer starts at the size the
  first request needs and grows on demand (rows and capacity double) up to a byte budget;
  growing copies the live rows once, steps never copy.
* `OwnCaches`: a KV cache of its own per request (`KVCache` from the `KVPool`), stepped one
  request per LM run: graphs that grow their cache by Concat, `--kv chain|copy`, and a request
  longer than the slot budget allows (an in-place cache sized to it).

A request of `lm_rows` LM rows (classifier-free guidance: 2) takes that many consecutive slot
rows, or one cache of batch `lm_rows`.

A prefill is split in two so that it can run beside the decode step (`scheduler.py`):
`prefill_apart(admission, prefix_cache, runs)` computes a request's prompt away from every row
(any thread: a slot row's prompt runs on a scratch in-place cache of its own, exactly its
length; an own cache is the request's cache, not yet a row's), and `join(row, prefilled)`, on
the decode worker between steps, makes the result the row's: a slot row gets the KV values
copied in (the slot buffer is only ever written by the decode worker, so it never grows or
moves while a prefill writes into it). `PrefillRuns` says how the prompt's LM runs go: whole,
or in chunks of a fixed size, each when the decode worker grants it a turn (chunked prefill).
Chunk boundaries depend only on the prompt, never on timing or neighbours, and no chunk is a
single token (GroupQueryAttention's one-token kernel rounds differently): on GQA LMs a chunked
prefill equals a one-run prefill bit for bit (tests/test_prefill.py).

A program with a separate prefill graph (`DecodeProgram.prefill_lm`) prefills through it: its
presents become the row's first tokens (in a slot row: copied in once, transposed when the
prefill graph lays them out [B, S, H, D]). Its prefixes are not cached (the step graph cannot
continue a cached prefix over several new tokens the way the prefill graph would), and its one
run is never chunked.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace

import numpy as np

from onnx_tts.cache.prefix import PrefixCache, RunPart
from onnx_tts.decoding.kv_pool import CapacityPolicy, KVPool
from onnx_tts.decoding.program import Admission, DecodeProgram, length_feeds
from onnx_tts.graph_io import KVLayout
from onnx_tts.session import KVCache, KVSlots, Session

# Slot buffers never hold less than this many tokens per row (a short sentence fits at once).
MIN_SLOT_CAPACITY = 256
# The slot buffers of one scheduler hold at most this many bytes by default.
DEFAULT_SLOT_BYTES = 2 << 30
# A step of this many rows or more runs as two halves on two cores when one is free
# (`SlotRows.prepare`); fewer gain less than the hand-over to the other thread costs.
SPLIT_MIN_ROWS = 4


@dataclass(frozen=True)
class PrefillRuns:
    """How the LM runs of a prefill go: each whole (`chunk_tokens` None), or split into chunks
    of `chunk_tokens` (the last takes a one-token remainder: never a one-token chunk), each run
    inside `turn()` (chunked prefill: the decode worker's grant; a no-op otherwise)."""

    chunk_tokens: int | None = None
    turn: Callable[[], AbstractContextManager] = nullcontext

    def wrap(self, run: RunPart, splittable: bool = True) -> RunPart:
        """`run(part, cached)` as these runs: chunked when the LM allows (`splittable`)."""

        def chunked(part: np.ndarray, cached: int) -> np.ndarray:
            size = self.chunk_tokens if splittable else None
            outputs = None
            for start, end in chunk_bounds(part.shape[1], size):
                with self.turn():
                    outputs = run(part[:, start:end], cached + start)
            assert outputs is not None
            return outputs

        return chunked


WHOLE = PrefillRuns()


def chunk_bounds(tokens: int, size: int | None) -> Iterator[tuple[int, int]]:
    """[start, end) of each chunk of a `tokens`-long part: `size` each, the last one longer
    rather than a single token; one chunk when `size` is None or the part fits."""
    if size is None or tokens <= size:
        yield 0, tokens
        return
    size = max(2, size)
    start = 0
    while start < tokens:
        end = start + size
        if tokens - end < 2:  # the rest would be one token (or none): this chunk takes it
            end = tokens
        yield start, end
        start = end


@dataclass
class Prefilled:
    """A request's prompt, computed apart from its row (see `prefill_apart`): the last outputs
    [lm_rows, ...], the tokens each LM row holds, and where the KV is: `values` (a slot row's,
    per LM row one array per KV pair) or `cache` (the request's own cache)."""

    outputs: np.ndarray
    length: int
    values: list[list[np.ndarray]] = field(default_factory=list)
    cache: KVCache | None = None


def _power_of_two_at_least(value: int) -> int:
    return 1 << max(0, int(value) - 1).bit_length()


def _last(outputs: dict[str, np.ndarray], name: str) -> np.ndarray:
    return outputs[name][:, -1]


def _prefill_feeds(program: DecodeProgram, inputs: np.ndarray) -> dict[str, np.ndarray]:
    """The feeds of the program's prefill graph for `inputs` [batch, S, ...] on empty rows."""
    prefill = program.prefill_lm
    assert prefill is not None
    dtype = np.dtype(prefill.spec.inputs[program.input_name].dtype)
    feeds = {program.input_name: np.ascontiguousarray(inputs, dtype)}
    feeds.update(length_feeds(prefill, np.zeros(inputs.shape[0], np.int64), inputs.shape[1]))
    return feeds


def _sequence_axis(session: Session, name: str) -> int:
    """Where a KV output lays its sequence out (1: [B, S, H, D], else [B, H, S, D]), from its
    declared shape, as the core decides it."""
    spec = session.spec.outputs[name]
    return 1 if spec.dim(1) is None and spec.dim(2) is not None else 2


def _run_cache(program: DecodeProgram, cache: KVCache, inputs: np.ndarray) -> np.ndarray:
    """One LM run of `inputs` [rows, S, ...] after the tokens `cache` holds; the last outputs."""
    dtype = np.dtype(program.lm.spec.inputs[program.input_name].dtype)
    lengths = np.full(inputs.shape[0], cache.length, np.int64)
    feeds = {program.input_name: inputs.astype(dtype, copy=False)}
    feeds.update(length_feeds(program.lm, lengths, inputs.shape[1]))
    return _last(cache.step(feeds, output_names=[program.output_name]), program.output_name)


def prefill_cache(
    program: DecodeProgram,
    layout: KVLayout,
    cache: KVCache,
    inputs: np.ndarray,
    prefix: int,
    prefix_cache: PrefixCache | None,
    runs: PrefillRuns = WHOLE,
) -> np.ndarray:
    """Run the prompt `inputs` [rows, S, ...] into the empty `cache` (its first `prefix`
    positions through the prefix cache, when there is one); returns the last outputs."""

    def run(part: np.ndarray, cached: int) -> np.ndarray:
        return _run_cache(program, cache, part)

    # GroupQueryAttention refuses several new tokens after a past at batch > 1, so a guided
    # (two-row) request on such a graph prefills in one run, whatever the KV mode; chunks are
    # bit-identical to one run only on GroupQueryAttention (a Concat graph runs each part whole).
    one_run = inputs.shape[0] > 1 and layout.attention != "concat"
    run = runs.wrap(run, splittable=not one_run and layout.attention != "concat")
    if prefix_cache is None or one_run:
        return run(inputs, 0)
    return prefix_cache.prefill(
        inputs,
        prefix,
        run,
        lambda length: [cache.read(i) for i in range(len(cache.pairs))],
        cache.load_prefix,
    )


@dataclass(frozen=True)
class SlotRun:
    """One prepared LM run over a slot span (see SlotRows.prepare)."""

    rows: np.ndarray
    feeds: dict[str, np.ndarray]
    first: int  # first LM row of the span
    lengths: np.ndarray  # cached tokens per LM row of the span
    positions: np.ndarray  # where the step's rows sit in the span
    # The upper rows' run, on the slots' twin in the helper thread (`prepare(halves=True)`).
    upper: SlotRun | None = None


class _RowHomeBase(ABC):
    """What both row homes do alike: a prompt prefilled and joined in one go."""

    @abstractmethod
    def prefill_apart(self, admission: Admission, prefix_cache: PrefixCache | None) -> Prefilled:
        """The prompt's KV and last outputs, computed apart from any row."""

    @abstractmethod
    def join(self, row: int, prefilled: Prefilled) -> None:
        """A prompt computed apart takes its row."""

    def prefill(
        self, row: int, admission: Admission, prefix_cache: PrefixCache | None
    ) -> np.ndarray:
        """`prefill_apart` and `join` in one go; returns the last outputs [lm_rows, ...]."""
        prefilled = self.prefill_apart(admission, prefix_cache)
        self.join(row, prefilled)
        return prefilled.outputs


class SlotRows(_RowHomeBase):
    """Request rows of a growable in-place slot buffer (see the module docstring)."""

    def __init__(
        self,
        program: DecodeProgram,
        layout: KVLayout,
        capacity: CapacityPolicy,
        max_rows: int,
        budget_bytes: int = DEFAULT_SLOT_BYTES,
        min_span: int = 1,
    ) -> None:
        self.program, self.layout, self.policy = program, layout, capacity
        self.max_rows = max_rows  # request rows
        self.budget_bytes = budget_bytes
        self.lm_rows = program.lm_rows
        # Request rows of the smallest LM run: 2 when the LM's kernels compute one row alone
        # differently from a row among others (batch_probe.py), so a lone row steps beside a
        # spare one and every request sees the same kernels alone and in company.
        self.min_span = min_span
        self.slots: KVSlots | None = None
        self.rows = 0  # request rows the buffer holds now
        self.capacity = 0
        self.lengths = np.zeros(max_rows, np.int64)  # cached tokens per request row
        self.live = np.zeros(max_rows, bool)
        self.grown = 0  # reallocations so far (stats)
        self.split_runs = 0  # steps run as two halves (stats)
        self.needed = np.zeros(max_rows, np.int64)  # KV positions each reserved row needs
        # A buffer being grown beside the steps (reserve(wait=False)) and its size; `on_grown`
        # is told when it is ready (the scheduler's wake).
        self._grower: ThreadPoolExecutor | None = None
        self._upper: ThreadPoolExecutor | None = None  # the upper half of a split step
        self._growth: Future[KVSlots] | None = None
        self._growth_size: tuple[int, int] | None = None
        self.on_grown: Callable[[], None] | None = None
        self._dtype = np.dtype(program.lm.spec.inputs[program.input_name].dtype)

    # -- sizing ----------------------------------------------------------------------------------
    def _bytes(self, rows: int, capacity: int) -> int:
        return rows * self.lm_rows * capacity * self.layout.bytes_per_token

    def allocated_bytes(self) -> int:
        return self._bytes(self.rows, self.capacity) if self.slots is not None else 0

    def reserve(self, row: int, needed: int, wait: bool = True) -> bool:
        """Make room for request row `row` needing `needed` KV positions; False when the
        budget (or the model's position limit) cannot hold it: the request then gets a cache
        of its own. A buffer that must grow grows now (`wait`, or the first one), or beside
        the decode steps: the new buffer is allocated on a helper thread (a few hundred MB
        take a few hundred ms, every stream would stall meanwhile) and `swap_grown` puts it
        in between steps; the row may join once `has_room(row)`."""
        ceiling = self.policy.fixed if self.policy.fixed is not None else self.policy.limit
        if needed > ceiling:
            return False
        held_rows, held_capacity = self._growth_size or (self.rows, self.capacity)
        rows = max(
            held_rows, min(self.max_rows, _power_of_two_at_least(max(row + 1, self.min_span)))
        )
        capacity = held_capacity
        if needed > capacity:
            capacity = min(ceiling, max(MIN_SLOT_CAPACITY, _power_of_two_at_least(needed)))
        if self.policy.fixed is not None:
            capacity = self.policy.fixed
        if self._bytes(rows, capacity) > self.budget_bytes:
            return False
        self.needed[row] = needed
        if self.slots is None or wait:
            if rows != self.rows or capacity != self.capacity or self.slots is None:
                self._growth = self._growth_size = None  # (a pending one is dropped)
                self._regrow(rows, capacity)
        elif rows != self.rows or capacity != self.capacity:
            self._grow_beside(rows, capacity)
        return True

    def release_idle(self) -> int:
        """With no row live, let the buffers go (a burst grew them); the next request
        allocates what it needs, as the first did. The bytes let go."""
        if self.slots is None or self.live.any() or self._growth is not None:
            return 0
        freed = self.allocated_bytes()
        self.slots, self.rows, self.capacity = None, 0, 0
        return freed

    def has_room(self, row: int) -> bool:
        """Whether the buffer holds request row `row` as it reserved it."""
        return self.slots is not None and row < self.rows and self.needed[row] <= self.capacity

    def start_threads(self) -> None:
        """Start the threads that grow buffers beside the steps and run the upper half of a
        split step now, with the decode worker (the engine's threads are all there from its
        first request)."""
        if self._grower is None:
            self._grower = ThreadPoolExecutor(1, thread_name_prefix="onnx-tts-grow")
            self._grower.submit(lambda: None).result()
        if self._upper is None:
            self._upper = ThreadPoolExecutor(1, thread_name_prefix="onnx-tts-lm")
            self._upper.submit(lambda: None).result()

    def _grow_beside(self, rows: int, capacity: int) -> None:
        if self._growth_size == (rows, capacity):
            return
        self.start_threads()
        assert self._grower is not None
        self._growth_size = (rows, capacity)
        growth = self._grower.submit(self._allocate, rows, capacity)
        self._growth = growth
        on_grown = self.on_grown
        if on_grown is not None:
            growth.add_done_callback(lambda _: on_grown())

    def growth_done(self) -> bool:
        """A buffer grown beside the steps is ready to be swapped in."""
        return self._growth is not None and self._growth.done()

    def swap_grown(self) -> bool:
        """(the decode worker, between steps) put a buffer grown beside the steps in: the live
        rows' cached tokens are copied into it. Raises what its allocation raised."""
        if not self.growth_done():
            return False
        growth, size = self._growth, self._growth_size
        self._growth = self._growth_size = None
        assert growth is not None and size is not None
        self._move_into(growth.result(), *size)
        return True

    def _allocate(self, rows: int, capacity: int) -> KVSlots:
        return KVSlots(self.program.lm, rows * self.lm_rows, capacity, dict(self.layout.pairs))

    def _regrow(self, rows: int, capacity: int) -> None:
        """New buffers of `rows` x `capacity`, now."""
        self._move_into(self._allocate(rows, capacity), rows, capacity)

    def _move_into(self, fresh: KVSlots, rows: int, capacity: int) -> None:
        """`fresh` becomes the buffer; the live rows' cached tokens are copied once."""
        old, old_lengths = self.slots, self.lengths.copy()
        if old is not None:
            pairs = len(self.layout.pairs)
            for row in np.flatnonzero(self.live & (old_lengths > 0)):
                for lm_row in self._lm_rows(int(row)):
                    values = [old.read(i, lm_row, int(old_lengths[row])) for i in range(pairs)]
                    fresh.load_prefix(lm_row, values)
            self.grown += 1
        self.slots, self.rows, self.capacity = fresh, rows, capacity

    def close(self) -> None:
        """Wait for a buffer being grown (the engine is closing)."""
        for thread in (self._grower, self._upper):
            if thread is not None:
                thread.shutdown(wait=True)

    def _lm_rows(self, row: int) -> range:
        return range(row * self.lm_rows, (row + 1) * self.lm_rows)

    # -- prefilling ------------------------------------------------------------------------------
    def prefill_apart(
        self, admission: Admission, prefix_cache: PrefixCache | None, runs: PrefillRuns = WHOLE
    ) -> Prefilled:
        """The prompt of `admission`, each LM row at batch 1 (so the prefix cache serves guided
        requests too), on a scratch in-place cache of exactly its length: never in the slot
        buffer, so it may run on any thread while the decode worker steps the slot rows."""
        inputs = admission.inputs.astype(self._dtype, copy=False)
        outputs, values = [], []
        for index in range(self.lm_rows):
            row_inputs = inputs[index : index + 1]
            if self.program.prefill_lm is not None:
                with runs.turn():
                    output, kv = self._prefill_graph(row_inputs)
            else:
                scratch = KVCache(
                    self.program.lm, "inplace", 1, row_inputs.shape[1], dict(self.layout.pairs)
                )
                output = prefill_cache(
                    self.program, self.layout, scratch, row_inputs, admission.prefix,
                    prefix_cache, runs,
                )  # fmt: skip
                kv = [scratch.read(i) for i in range(len(self.layout.pairs))]
            outputs.append(output)
            values.append(kv)
        return Prefilled(np.concatenate(outputs, axis=0), inputs.shape[1], values)

    def join(self, row: int, prefilled: Prefilled) -> None:
        """(the decode worker, between steps) request row `row` (reserved) holds the prompt:
        its KV values are copied into the row's slots."""
        assert self.slots is not None
        for lm_row, kv in zip(self._lm_rows(row), prefilled.values, strict=True):
            self.slots.load_prefix(lm_row, kv)
        self.lengths[row] = prefilled.length
        self.live[row] = True

    def discard(self, prefilled: Prefilled) -> None:
        """A prefill that never joined its row (cancelled, failed): nothing to give back."""

    def _prefill_graph(self, inputs: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        """Run the program's prefill graph at batch 1: its last output [1, ...] and its presents
        laid out as the slots hold them ([1, H, S, D])."""
        prefill = self.program.prefill_lm
        assert prefill is not None
        name = self.program.output_name
        presents = [present for _, present in self.layout.pairs]
        result = prefill.run(_prefill_feeds(self.program, inputs), [name, *presents])
        values = []
        for present in presents:
            value = np.asarray(result[present])
            if _sequence_axis(prefill, present) == 1:  # [1, S, H, D] -> the slots' [1, H, S, D]
                value = value.transpose(0, 2, 1, 3)
            values.append(np.ascontiguousarray(value, self.layout.dtype))
        return _last(result, name), values

    # -- decoding --------------------------------------------------------------------------------
    def fits_next_step(self, rows: np.ndarray) -> np.ndarray:
        return self.lengths[rows] < self.capacity

    def prepare(self, rows: np.ndarray, inputs: np.ndarray, halves: bool = False) -> SlotRun:
        """The feeds of one LM run over the slot span covering request `rows` (sorted);
        `inputs` holds lm_rows entries per row. Another row inside the span computes a
        throwaway token (see below). Built before the run, so the run
        itself may go on in another thread while rows that left the step are released.
        `halves` (a core is free): with at least SPLIT_MIN_ROWS rows, the lower and the upper
        half run as two LM runs at once, on two cores (a row's values do not depend on its
        batch: `batch_probe.py`). The spans are disjoint: each half holds min_span rows."""
        lm = self.lm_rows
        half = len(rows) // 2
        if halves and half >= max(self.min_span, SPLIT_MIN_ROWS // 2):
            lower = self.prepare(rows[:half], inputs[: half * lm])
            return replace(lower, upper=self.prepare(rows[half:], inputs[half * lm :]))
        first, last = int(rows[0]), int(rows[-1])
        if last - first + 1 < self.min_span:  # a lone row steps beside a spare one
            last = min(first + self.min_span - 1, self.rows - 1)
            first = max(0, last - self.min_span + 1)
        span = (last - first + 1) * lm
        inputs = inputs.astype(self._dtype, copy=False)
        positions = ((rows - first)[:, None] * lm + np.arange(lm)[None, :]).reshape(-1)
        if span == len(positions):  # contiguous rows: the usual case, nothing to scatter
            batch = inputs
        else:
            batch = np.zeros((span, *inputs.shape[1:]), self._dtype)
            batch[positions] = inputs
        taking_part = np.zeros(last - first + 1, bool)
        taking_part[rows - first] = True
        # A row of the span that sits this step out (paced, or its frames await hand-over)
        # writes its throwaway token where its own next token will go (overwritten then),
        # never over its cached tokens; a free row at position 0.
        held = self.lengths[first : last + 1]
        spare = np.where(self.live[first : last + 1] & (held < self.capacity), held, 0)
        lengths = np.repeat(np.where(taking_part, held, spare), lm)
        feeds = {self.program.input_name: batch}
        feeds.update(length_feeds(self.program.lm, lengths, batch.shape[1]))
        return SlotRun(rows, feeds, first * lm, lengths, positions)

    def run(self, prepared: SlotRun) -> np.ndarray:
        """The prepared LM run (both halves of a split one); returns the last outputs in the
        inputs' order."""
        assert self.slots is not None
        if prepared.upper is None:
            return self._run_on(self.slots, prepared)
        self.start_threads()
        assert self._upper is not None
        self.split_runs += 1
        upper = self._upper.submit(self._run_on, self.slots.twin(), prepared.upper)
        try:
            lower = self._run_on(self.slots, prepared)
        finally:
            outputs = upper.result()  # (never leave a run going on the buffers)
        return np.concatenate([lower, outputs], axis=0)

    def _run_on(self, slots: KVSlots, prepared: SlotRun) -> np.ndarray:
        name = self.program.output_name
        result = slots.step(prepared.feeds, prepared.first, prepared.lengths, [name])
        return _last(result, name)[prepared.positions]

    def commit(self, prepared: SlotRun) -> None:
        """The rows of a run that succeeded hold one more token."""
        self.lengths[prepared.rows] += 1
        if prepared.upper is not None:
            self.commit(prepared.upper)

    def step(self, rows: np.ndarray, inputs: np.ndarray) -> np.ndarray:
        """prepare, run and commit in one go."""
        prepared = self.prepare(rows, inputs)
        outputs = self.run(prepared)
        self.commit(prepared)
        return outputs

    def release(self, row: int) -> None:
        self.lengths[row] = 0
        self.live[row] = False
        self.needed[row] = 0

    def row_ptrs(self, row: int) -> list[int]:
        """Where row `row`'s KV lives (tests check rows do not move while they decode)."""
        assert self.slots is not None
        return self.slots.past_data_ptrs(row * self.lm_rows, self.lm_rows)


class OwnCaches(_RowHomeBase):
    """A KV cache of its own per request row, from the model's pool (see module docstring)."""

    def __init__(self, program: DecodeProgram, pool: KVPool, layout: KVLayout) -> None:
        self.program, self.pool, self.layout = program, pool, layout
        self.caches: dict[int, KVCache] = {}

    def prefill_apart(
        self, admission: Admission, prefix_cache: PrefixCache | None, runs: PrefillRuns = WHOLE
    ) -> Prefilled:
        """The prompt of `admission` in a cache of its own from the pool (any thread: the
        cache becomes a row's only when it joins)."""
        inputs = admission.inputs
        cache = self.pool.acquire(admission.max_tokens, batch=inputs.shape[0])
        try:
            if self.program.prefill_lm is not None:
                feeds = _prefill_feeds(self.program, inputs)
                name = self.program.output_name
                with runs.turn():
                    outputs = _last(cache.prefill(self.program.prefill_lm, feeds, [name]), name)
            else:
                outputs = prefill_cache(
                    self.program, self.layout, cache, inputs, admission.prefix, prefix_cache, runs
                )
        except BaseException:
            self.pool.release(cache)
            raise
        return Prefilled(outputs, inputs.shape[1], cache=cache)

    def join(self, row: int, prefilled: Prefilled) -> None:
        """(the decode worker) request row `row` decodes on the prefilled cache."""
        assert prefilled.cache is not None
        self.caches[row] = prefilled.cache

    def discard(self, prefilled: Prefilled) -> None:
        """A prefill that never joined its row (cancelled, failed): its cache goes back."""
        if prefilled.cache is not None:
            self.pool.release(prefilled.cache)

    def fits_next_step(self, rows: np.ndarray) -> np.ndarray:
        return np.array(
            [
                (cache := self.caches[int(row)]).capacity is None or cache.length < cache.capacity
                for row in rows
            ],
            bool,
        )

    def step(self, rows: np.ndarray, inputs: np.ndarray) -> np.ndarray:
        """One LM run per request row (each on its own cache)."""
        lm = self.program.lm_rows
        outputs = [
            _run_cache(self.program, self.caches[int(row)], inputs[index * lm : (index + 1) * lm])
            for index, row in enumerate(rows)
        ]
        return np.concatenate(outputs, axis=0)

    def release(self, row: int) -> None:
        cache = self.caches.pop(row, None)
        if cache is not None:
            self.pool.release(cache)

    def row_ptrs(self, row: int) -> list[int]:
        return self.caches[row].past_data_ptrs()


RowHome = SlotRows | OwnCaches

__all__ = [
    "DEFAULT_SLOT_BYTES",
    "MIN_SLOT_CAPACITY",
    "WHOLE",
    "OwnCaches",
    "PrefillRuns",
    "Prefilled",
    "RowHome",
    "SlotRows",
    "chunk_bounds",
    "prefill_cache",
]

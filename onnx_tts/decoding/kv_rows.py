"""Where each request row of the scheduler keeps its KV cache.

Two homes, one interface (`prefill`, `step`, `release`):

* `SlotRows`: rows of one shared in-place buffer per KV tensor ([rows, Hkv, capacity, D],
  `KVSlots`), so one LM run steps every slot row at once. The buffer starts at the size the
  first request needs and grows on demand (rows and capacity double) up to a byte budget;
  growing copies the live rows once, steps never copy.
* `OwnCaches`: a KV cache of its own per request (`KVCache` from the `KVPool`), stepped one
  request per LM run: graphs that grow their cache by Concat, `--kv chain|copy`, and a request
  longer than the slot budget allows (an in-place cache sized to it).

A request of `lm_rows` LM rows (classifier-free guidance: 2) takes that many consecutive slot
rows, or one cache of batch `lm_rows`.

A program with a separate prefill graph (`DecodeProgram.prefill_lm`) prefills through it: its
presents become the row's first tokens (in a slot row: copied in once, transposed when the
prefill graph lays them out [B, S, H, D]). Its prefixes are not cached (the step graph cannot
continue a cached prefix over several new tokens the way the prefill graph would).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from onnx_tts.cache.prefix import PrefixCache
from onnx_tts.decoding.kv_pool import CapacityPolicy, KVPool
from onnx_tts.decoding.program import Admission, DecodeProgram, length_feeds
from onnx_tts.graph_io import KVLayout
from onnx_tts.session import KVCache, KVSlots, Session

# Slot buffers never hold less than this many tokens per row (a short sentence fits at once).
MIN_SLOT_CAPACITY = 256
# The slot buffers of one scheduler hold at most this many bytes by default.
DEFAULT_SLOT_BYTES = 2 << 30


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


@dataclass(frozen=True)
class SlotRun:
    """One prepared LM run over a slot span (see SlotRows.prepare)."""

    rows: np.ndarray
    feeds: dict[str, np.ndarray]
    first: int  # first LM row of the span
    lengths: np.ndarray  # cached tokens per LM row of the span
    positions: np.ndarray  # where the step's rows sit in the span


class SlotRows:
    """Request rows of a growable in-place slot buffer (see the module docstring)."""

    def __init__(
        self,
        program: DecodeProgram,
        layout: KVLayout,
        capacity: CapacityPolicy,
        max_rows: int,
        budget_bytes: int = DEFAULT_SLOT_BYTES,
    ) -> None:
        self.program, self.layout, self.policy = program, layout, capacity
        self.max_rows = max_rows  # request rows
        self.budget_bytes = budget_bytes
        self.lm_rows = program.lm_rows
        self.slots: KVSlots | None = None
        self.rows = 0  # request rows the buffer holds now
        self.capacity = 0
        self.lengths = np.zeros(max_rows, np.int64)  # cached tokens per request row
        self.live = np.zeros(max_rows, bool)
        self.grown = 0  # reallocations so far (stats)
        self._dtype = np.dtype(program.lm.spec.inputs[program.input_name].dtype)

    # -- sizing ----------------------------------------------------------------------------------
    def _bytes(self, rows: int, capacity: int) -> int:
        return rows * self.lm_rows * capacity * self.layout.bytes_per_token

    def allocated_bytes(self) -> int:
        return self._bytes(self.rows, self.capacity) if self.slots is not None else 0

    def reserve(self, row: int, needed: int) -> bool:
        """Make room for request row `row` needing `needed` KV positions; False when the
        budget (or the model's position limit) cannot hold it: the request then gets a cache
        of its own."""
        ceiling = self.policy.fixed if self.policy.fixed is not None else self.policy.limit
        if needed > ceiling:
            return False
        rows = max(self.rows, min(self.max_rows, _power_of_two_at_least(row + 1)))
        capacity = self.capacity
        if needed > capacity:
            capacity = min(ceiling, max(MIN_SLOT_CAPACITY, _power_of_two_at_least(needed)))
        if self.policy.fixed is not None:
            capacity = self.policy.fixed
        if self._bytes(rows, capacity) > self.budget_bytes:
            return False
        if rows != self.rows or capacity != self.capacity or self.slots is None:
            self._regrow(rows, capacity)
        return True

    def release_idle(self) -> int:
        """With no row live, let the buffers go (a burst grew them); the next request
        allocates what it needs, as the first did. The bytes let go."""
        if self.slots is None or self.live.any():
            return 0
        freed = self.allocated_bytes()
        self.slots, self.rows, self.capacity = None, 0, 0
        return freed

    def _regrow(self, rows: int, capacity: int) -> None:
        """New buffers of `rows` x `capacity`; the live rows' cached tokens are copied once."""
        old, old_lengths = self.slots, self.lengths.copy()
        self.slots = None  # the old buffers are freed before the new ones fill up, if unused
        fresh = KVSlots(self.program.lm, rows * self.lm_rows, capacity, dict(self.layout.pairs))
        if old is not None:
            pairs = len(self.layout.pairs)
            for row in np.flatnonzero(self.live & (old_lengths > 0)):
                for lm_row in self._lm_rows(int(row)):
                    values = [old.read(i, lm_row, int(old_lengths[row])) for i in range(pairs)]
                    fresh.load_prefix(lm_row, values)
            self.grown += 1
        self.slots, self.rows, self.capacity = fresh, rows, capacity

    def _lm_rows(self, row: int) -> range:
        return range(row * self.lm_rows, (row + 1) * self.lm_rows)

    # -- decoding --------------------------------------------------------------------------------
    def prefill(
        self, row: int, admission: Admission, prefix_cache: PrefixCache | None
    ) -> np.ndarray:
        """Prefill each LM row of request row `row` at batch 1 in its slot row (so the prefix
        cache serves guided requests too); returns the last outputs [lm_rows, ...]."""
        assert self.slots is not None
        slots, pairs = self.slots, len(self.layout.pairs)
        inputs = admission.inputs.astype(self._dtype, copy=False)
        outputs = []
        for index, lm_row in enumerate(self._lm_rows(row)):

            def run(part: np.ndarray, cached: int, lm_row: int = lm_row) -> np.ndarray:
                lengths = np.array([cached], np.int64)
                feeds = {self.program.input_name: part}
                feeds.update(length_feeds(self.program.lm, lengths, part.shape[1]))
                result = slots.step(feeds, lm_row, lengths, [self.program.output_name])
                return _last(result, self.program.output_name)

            row_inputs = inputs[index : index + 1]
            if self.program.prefill_lm is not None:
                outputs.append(self._prefill_graph(lm_row, row_inputs))
            elif prefix_cache is None:
                outputs.append(run(row_inputs, 0))
            else:
                outputs.append(
                    prefix_cache.prefill(
                        row_inputs,
                        admission.prefix,
                        run,
                        lambda length, lm_row=lm_row: [
                            slots.read(i, lm_row, length) for i in range(pairs)
                        ],
                        lambda values, lm_row=lm_row: slots.load_prefix(lm_row, values),
                    )
                )
        self.lengths[row] = inputs.shape[1]
        self.live[row] = True
        return np.concatenate(outputs, axis=0)

    def _prefill_graph(self, lm_row: int, inputs: np.ndarray) -> np.ndarray:
        """Run the program's prefill graph at batch 1 and load its presents as slot row
        `lm_row`'s first tokens; returns the last output [1, ...]."""
        assert self.slots is not None
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
        self.slots.load_prefix(lm_row, values)
        return _last(result, name)

    def fits_next_step(self, rows: np.ndarray) -> np.ndarray:
        return self.lengths[rows] < self.capacity

    def prepare(self, rows: np.ndarray, inputs: np.ndarray) -> SlotRun:
        """The feeds of one LM run over the slot span covering request `rows` (sorted);
        `inputs` holds lm_rows entries per row. Another row inside the span computes a
        throwaway token (see below). Built before the run, so the run
        itself may go on in another thread while rows that left the step are released."""
        lm = self.lm_rows
        first, last = int(rows[0]), int(rows[-1])
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
        """The prepared LM run; returns the last outputs in the inputs' order."""
        assert self.slots is not None
        name = self.program.output_name
        result = self.slots.step(prepared.feeds, prepared.first, prepared.lengths, [name])
        return _last(result, name)[prepared.positions]

    def commit(self, prepared: SlotRun) -> None:
        """The rows of a run that succeeded hold one more token."""
        self.lengths[prepared.rows] += 1

    def step(self, rows: np.ndarray, inputs: np.ndarray) -> np.ndarray:
        """prepare, run and commit in one go."""
        prepared = self.prepare(rows, inputs)
        outputs = self.run(prepared)
        self.commit(prepared)
        return outputs

    def release(self, row: int) -> None:
        self.lengths[row] = 0
        self.live[row] = False

    def row_ptrs(self, row: int) -> list[int]:
        """Where row `row`'s KV lives (tests check rows do not move while they decode)."""
        assert self.slots is not None
        return self.slots.past_data_ptrs(row * self.lm_rows, self.lm_rows)


class OwnCaches:
    """A KV cache of its own per request row, from the model's pool (see module docstring)."""

    def __init__(self, program: DecodeProgram, pool: KVPool, layout: KVLayout) -> None:
        self.program, self.pool, self.layout = program, pool, layout
        self.caches: dict[int, KVCache] = {}
        self._dtype = np.dtype(program.lm.spec.inputs[program.input_name].dtype)

    def _run(self, cache: KVCache, inputs: np.ndarray) -> np.ndarray:
        lengths = np.full(inputs.shape[0], cache.length, np.int64)
        feeds = {self.program.input_name: inputs.astype(self._dtype, copy=False)}
        feeds.update(length_feeds(self.program.lm, lengths, inputs.shape[1]))
        outputs = cache.step(feeds, output_names=[self.program.output_name])
        return _last(outputs, self.program.output_name)

    def prefill(
        self, row: int, admission: Admission, prefix_cache: PrefixCache | None
    ) -> np.ndarray:
        inputs = admission.inputs
        cache = self.pool.acquire(admission.max_tokens, batch=inputs.shape[0])
        self.caches[row] = cache
        if self.program.prefill_lm is not None:
            feeds = _prefill_feeds(self.program, inputs)
            name = self.program.output_name
            return _last(cache.prefill(self.program.prefill_lm, feeds, [name]), name)
        # GroupQueryAttention refuses several new tokens after a past at batch > 1, so a
        # guided (two-row) request on such a graph prefills in one run, whatever the KV mode.
        one_run = inputs.shape[0] > 1 and self.layout.attention != "concat"
        if prefix_cache is None or one_run:
            return self._run(cache, inputs)

        def run(part: np.ndarray, cached: int) -> np.ndarray:
            return self._run(cache, part)

        return prefix_cache.prefill(
            inputs,
            admission.prefix,
            run,
            lambda length: [cache.read(i) for i in range(len(cache.pairs))],
            cache.load_prefix,
        )

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
            self._run(self.caches[int(row)], inputs[index * lm : (index + 1) * lm])
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
Reserve = Callable[[int, int], bool]

__all__ = ["DEFAULT_SLOT_BYTES", "MIN_SLOT_CAPACITY", "OwnCaches", "RowHome", "SlotRows"]

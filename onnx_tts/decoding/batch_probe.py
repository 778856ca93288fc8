"""Whether an LM's request rows may share one batched step: a probe run once at load.

Rows of one batched step are right-padded to the longest: every row gets an `attention_mask`
as wide as the longest total (a rectangular tensor cannot be narrower for one row), and a
GroupQueryAttention graph gets `total_sequence_length` of the longest. A graph that reads only
each row's own mask (sums, cumulative sums) computes every row as if alone; one that reads
the mask's *width* (positions from `Shape(attention_mask)`, say) does not, and would decode a
request differently depending on which others shared its steps.

So before a scheduler batches a model, `batch_invariance_problem` decodes a short row alone,
then the same row beside a longer one, and compares their outputs bit for bit (the longer row
too, against itself alone). If anything differs, the model's requests run on KV caches of
their own in the same scheduler, and `info()["batching"]["why"]` says so.

Some kernels compute a lone row by another path than a row among others (ONNX Runtime's
MatMulNBits on CPUs without VNNI: one vector against the weights, versus a matrix product
whose rows agree bit for bit for any count from two up). Such a model is probed again with
every step at least two rows wide (`min_span` 2: a lone row steps beside a spare one); when
that is invariant, the model batches that way.
"""

from __future__ import annotations

import numpy as np

from onnx_tts.decoding.kv_pool import CapacityPolicy, KVPool
from onnx_tts.decoding.kv_rows import SlotRows
from onnx_tts.decoding.program import Admission, DecodeProgram

# Prefill lengths of the two probe rows (the longer one widens the short row's mask) and the
# KV positions the probe's slot buffers hold (unless the model fixes its capacity).
SHORT_ROW, LONG_ROW = 3, 6
PROBE_CAPACITY = 16
NOT_INVARIANT = (
    "a request decodes differently beside a longer one (the LM reads the attention mask's "
    "width, not only each row's own tokens): each request runs on a KV cache of its own"
)


def _probe_inputs(program: DecodeProgram, lengths: tuple[int, ...]) -> list[np.ndarray] | None:
    """Deterministic LM inputs [lm_rows, length, ...] per length, in the LM's dtype; None when
    the input's trailing dimensions are not fixed numbers."""
    spec = program.lm.spec.inputs[program.input_name]
    trailing = tuple(spec.shape[2:])
    if not all(isinstance(size, int) and size > 0 for size in trailing):
        return None
    rng = np.random.default_rng(0)
    dtype = np.dtype(spec.dtype)
    out = []
    for length in lengths:
        shape = (program.lm_rows, length, *trailing)
        if dtype.kind == "f":
            values = (0.5 * rng.standard_normal(shape)).astype(dtype)
        else:  # token ids: 0 and 1 exist in every vocabulary
            values = rng.integers(0, 2, shape).astype(dtype)
        out.append(values)
    return out


def batch_invariance_problem(program: DecodeProgram, pool: KVPool) -> tuple[str | None, int]:
    """(None, min_span) when a row's LM output does not depend on the rows beside it with LM
    runs at least `min_span` request rows wide (checked bit for bit on one probe step), else
    (why the model's requests must not share a batched step, 1)."""
    inputs = _probe_inputs(program, (SHORT_ROW, 1, LONG_ROW, 1))
    if inputs is None:
        return "the LM's input size is not fixed, so batching cannot be checked", 1
    for min_span in (1, 2):
        problem = _probe(program, pool, inputs, min_span)
        if problem is None:
            return None, min_span
        if problem != NOT_INVARIANT:
            break
    return problem, 1


def _probe(
    program: DecodeProgram, pool: KVPool, inputs: list[np.ndarray], min_span: int
) -> str | None:
    short, short_step, long, long_step = inputs
    policy = pool.capacity
    capacity = CapacityPolicy(policy.fixed or PROBE_CAPACITY, policy.fixed or PROBE_CAPACITY)
    # The two requests in rows 0 and 2 with a free row between them: a lone row's run
    # `min_span` wide takes that spare row, never the other request.
    rows = np.array([0, 2])

    def prefilled() -> SlotRows:
        slots = SlotRows(program, pool.layout, capacity, max_rows=3, min_span=min_span)
        for row, prefill in zip(rows, (short, long), strict=True):
            if not slots.reserve(int(row), capacity.limit):
                raise MemoryError("the probe's slot rows do not fit the byte budget")
            slots.prefill(int(row), Admission(prefill, capacity.limit), None)
        return slots

    try:
        alone = prefilled()
        solo = [
            np.array(alone.step(rows[i : i + 1], step), copy=True)
            for i, step in enumerate((short_step, long_step))
        ]
        together = np.array(
            prefilled().step(rows, np.concatenate([short_step, long_step])), copy=True
        )
    except Exception as error:  # a graph that cannot run two rows at once
        return f"a batched step failed ({type(error).__name__}): each request runs alone"
    lm = program.lm_rows
    for index, alone_output in enumerate(solo):
        if not np.array_equal(together[index * lm : (index + 1) * lm], alone_output, True):
            return NOT_INVARIANT
    return None


def batching_support(pool: KVPool) -> str | None:
    """None when this model's requests can share one batched LM run, else why not (they then
    run in the same loop on KV caches of their own)."""
    if pool.mode != "inplace":
        return f"KV mode {pool.mode!r} (batched rows need the in-place cache: --kv inplace)"
    if not pool.layout.in_place:
        return "the LM grows its cache by Concat (convert it with `onnx-tts convert --inplace-kv`)"
    return None


__all__ = ["NOT_INVARIANT", "batch_invariance_problem", "batching_support"]

"""The seam between generic decoding and a model family.

A family's generation is a `DecodeProgram`: a state machine over rows of arrays (pointer,
delay pattern, token history, sampler state: one entry per sequence), so that one decode
step of many sequences is one embed run, one LM run and vectorised numpy. The generic loops
that drive a program live here (`decode_solo`: one sequence on its own KV cache) and in the
batch scheduler (many sequences as rows of one LM batch); they own the KV cache, the LM runs
and cancellation, the program owns everything the family knows.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from onnx_tts.cache.prefix import PrefixCache
from onnx_tts.decoding.kv_pool import KVPool
from onnx_tts.decoding.sampling import SamplingOptions
from onnx_tts.session import Session

LOGITS = "logits"


@dataclass(frozen=True)
class Request:
    """One text chunk to generate: the family's chunk, the voice conditioning (encoder
    outputs), sampling options (with this chunk's seed) and the family's request options."""

    chunk: Any
    voice: Mapping[str, np.ndarray]
    sampling: SamplingOptions
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Admission:
    """What starting a sequence needs: its prefill embeddings [lm_rows, P, D] (lm_rows is 2
    for classifier-free guidance, else 1), the most KV positions it can use, and how many
    leading positions depend only on the voice (a prefix the prefix cache may reuse)."""

    embeds: np.ndarray
    max_tokens: int
    prefix: int = 0


@dataclass
class StepOutput:
    """Per sequence of the step (in `rows` order): the frames it completed ([F, W], F may be
    0) and whether it has finished."""

    frames: list[np.ndarray]
    done: np.ndarray


class DecodeProgram(ABC):
    """A family's decode state machine over `rows` sequences (see the module docstring).

    Arrays in the state are indexed by row; `rows` arguments are int arrays of the rows taking
    part in a step, in the order of the LM batch (or of `logits`)."""

    lm: Session

    @abstractmethod
    def new_state(self, rows: int) -> Any:
        """Empty state for up to `rows` sequences."""

    @abstractmethod
    def admit(self, state: Any, row: int, request: Request) -> Admission:
        """Start `request` in `row`; returns its prefill."""

    @abstractmethod
    def step_embeds(self, state: Any, rows: np.ndarray) -> np.ndarray:
        """The next LM input of each row: [len(rows) * lm_rows, 1, D] in the LM's dtype."""

    @abstractmethod
    def consume(self, state: Any, rows: np.ndarray, logits: np.ndarray) -> StepOutput:
        """Take the last-position logits of each row ([len(rows) * lm_rows, ...]): sample,
        advance the state machine, return completed frames and which rows finished."""

    def batchable(self, request: Request) -> bool:
        """Whether `request` can decode as one row of a shared LM batch."""
        return True


def lm_feeds(session: Session, embeds: np.ndarray, past_length: int) -> dict[str, np.ndarray]:
    """Inputs beside the KV cache that LM graphs commonly take, derived from the cache length."""
    batch, new = embeds.shape[0], embeds.shape[1]
    feeds: dict[str, np.ndarray] = {"inputs_embeds": embeds}
    names = set(session.input_names)
    if "attention_mask" in names:
        feeds["attention_mask"] = np.ones((batch, past_length + new), dtype=np.int64)
    if "position_ids" in names:
        positions = np.arange(past_length, past_length + new, dtype=np.int64)
        feeds["position_ids"] = np.broadcast_to(positions, (batch, new)).copy()
    return feeds


def decode_solo(
    program: DecodeProgram,
    pool: KVPool,
    request: Request,
    should_stop: Callable[[], bool] | None = None,
    prefix_cache: PrefixCache | None = None,
) -> Iterator[np.ndarray]:
    """Generate one request on a KV cache of its own; yields complete frames as they come.
    Closing the iterator stops generation and returns the cache to the pool."""
    state = program.new_state(1)
    rows = np.zeros(1, np.int64)
    admission = program.admit(state, 0, request)
    cache = pool.acquire(admission.max_tokens, batch=admission.embeds.shape[0])

    def run(embeds: np.ndarray, cached: int) -> np.ndarray:
        outputs = cache.step(lm_feeds(program.lm, embeds, cached), output_names=[LOGITS])
        return outputs[LOGITS][:, -1]

    def read(length: int) -> list[np.ndarray]:
        return [cache.read(i) for i in range(len(cache.pairs))]

    try:
        if should_stop is not None and should_stop():
            return
        # GroupQueryAttention (in place) refuses several new tokens after a past in a batch of
        # more than one row, so guided (two-row) requests prefill in one run there.
        several_rows_in_place = admission.embeds.shape[0] > 1 and cache.mode == "inplace"
        if prefix_cache is None or several_rows_in_place:
            logits = run(admission.embeds, 0)
        else:
            logits = prefix_cache.prefill(
                admission.embeds, admission.prefix, run, read, cache.load_prefix
            )
        while True:
            result = program.consume(state, rows, logits)
            yield from result.frames[0]
            if result.done[0]:
                return
            if should_stop is not None and should_stop():
                return
            logits = run(program.step_embeds(state, rows), cache.length)
    finally:
        pool.release(cache)


__all__ = [
    "LOGITS",
    "Admission",
    "DecodeProgram",
    "Request",
    "StepOutput",
    "decode_solo",
    "lm_feeds",
]

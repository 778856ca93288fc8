"""The seam between generic decoding and a model family.

A family's generation is a `DecodeProgram`: a state machine over rows of arrays (pointer,
delay pattern, token history, sampler state: one entry per request), so that one decode step
of many requests is one LM run and vectorised numpy. The scheduler (`scheduler.py`) drives
every program, for one request or many; it owns the KV caches, the LM runs and cancellation,
the program owns everything the family knows.

A request may take several LM rows (`lm_rows`, e.g. classifier-free guidance runs a
conditional and an unconditional row); arrays the program exchanges with the loop then hold
`lm_rows` consecutive LM rows per request row.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from onnx_tts.session import Session

if TYPE_CHECKING:
    from onnx_tts.decoding.request import Request

LOGITS = "logits"
INPUTS_EMBEDS = "inputs_embeds"


@dataclass(frozen=True)
class Admission:
    """What starting a request needs: its prefill input [lm_rows, P, ...] (the LM's
    `program.input_name`), the most KV positions it can use, and how many leading positions
    depend only on the voice (a prefix the prefix cache may reuse)."""

    inputs: np.ndarray
    max_tokens: int
    prefix: int = 0


@dataclass
class StepOutput:
    """Per request of the step (in `rows` order): the frames it completed ([F, W], F may be
    0) and whether it has finished."""

    frames: list[np.ndarray]
    done: np.ndarray


class DecodeProgram(ABC):
    """A family's decode state machine over request rows (see the module docstring).

    Arrays in the state are indexed by request row; `rows` arguments are int arrays of the rows
    taking part in a step, in the order of the LM batch (or of the outputs)."""

    lm: Session
    # A separate graph that runs the prompt (with the LM's present outputs and no pasts, e.g.
    # prefill graph beside a step graph); None: the LM itself prefills.
    prefill_lm: Session | None = None
    lm_rows: int = 1  # LM rows per request (2 for classifier-free guidance)
    input_name: str = INPUTS_EMBEDS  # the LM input a step feeds (besides KV and lengths)
    output_name: str = LOGITS  # the LM output `consume` reads (its last position)

    @abstractmethod
    def new_state(self, rows: int) -> Any:
        """Empty state for up to `rows` requests."""

    @abstractmethod
    def admit(self, state: Any, row: int, request: Request) -> Admission:
        """Start `request` in `row`; returns its prefill."""

    @abstractmethod
    def step_inputs(self, state: Any, rows: np.ndarray) -> np.ndarray:
        """The next LM input of each row: [len(rows) * lm_rows, 1, ...] in the LM's dtype."""

    @abstractmethod
    def consume(self, state: Any, rows: np.ndarray, outputs: np.ndarray) -> StepOutput:
        """Take the last-position output of each row ([len(rows) * lm_rows, ...]): sample,
        advance the state machine, return completed frames and which rows finished."""


def length_feeds(
    session: Session, lengths: np.ndarray, new: int, width: int | None = None
) -> dict[str, np.ndarray]:
    """Inputs beside the KV cache and the main input that LM graphs derive from how many
    tokens each row holds (`lengths`, before this step's `new` tokens): a right-padded
    `attention_mask` (`width` columns, default the longest total), `position_ids`, and
    `past_valid_lengths` (the cached tokens per row, as some step graphs take them).
    Dtypes follow the graph's declared inputs."""
    lengths = np.asarray(lengths, np.int64)
    feeds: dict[str, np.ndarray] = {}
    if "past_valid_lengths" in session.spec.inputs:
        dtype = session.spec.inputs["past_valid_lengths"].dtype
        feeds["past_valid_lengths"] = lengths.astype(dtype)
    if "attention_mask" in session.spec.inputs:
        totals = lengths + new
        columns = int(totals.max()) if width is None else width
        mask = np.arange(columns)[None, :] < totals[:, None]
        feeds["attention_mask"] = mask.astype(session.spec.inputs["attention_mask"].dtype)
    if "position_ids" in session.spec.inputs:
        positions = lengths[:, None] + np.arange(new)[None, :]
        feeds["position_ids"] = positions.astype(session.spec.inputs["position_ids"].dtype)
    return feeds


__all__ = [
    "INPUTS_EMBEDS",
    "LOGITS",
    "Admission",
    "DecodeProgram",
    "StepOutput",
    "length_feeds",
]

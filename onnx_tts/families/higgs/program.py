"""Higgs generation as a decode program of the engine's scheduler.

  admit(row, request)   -> the prompt rows [P, 1 + K] (family text module) through the embed
                           graph: the LM's `inputs_embeds` [1, P, W] (W = hidden, + 1 for v2's
                           routing column); the positions before the text depend only on the
                           voice (a prefix the prefix cache reuses)
  consume(rows, hidden) -> each row's last hidden state through the audio head graph: logits
                           [n, K, V], one delayed row sampled per request row (sampling.py),
                           the frame it completes, and whether the request is done
  step_inputs(rows)     -> the last sampled row of each request as an audio row through the
                           embed graph: [n, 1, W]

The scheduler keeps the backbone's KV (Concat-grown caches per request, or rows of one in-place
buffer after `onnx-tts convert --inplace-kv`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from onnx_tts.decoding import Admission, DecodeProgram, RowSampler, SamplingOptions, StepOutput
from onnx_tts.decoding.request import Request
from onnx_tts.families.higgs.layout import HiggsLayout
from onnx_tts.families.higgs.sampling import RowState, step_rows
from onnx_tts.families.higgs.text import AUDIO_ROW
from onnx_tts.session import Session

HIDDEN = "last_hidden_state"


@dataclass(frozen=True)
class HiggsRequest:
    """One chunk to speak: its prompt rows, the voice prefix length, the reference's delayed
    rows (v2's repetition window starts from them), sampling, RAS and the row limit."""

    rows: np.ndarray
    prefix: int
    reference_rows: np.ndarray
    sampling: SamplingOptions
    ras_window: int
    ras_max_repeat: int
    max_new_tokens: int


class HiggsProgram(DecodeProgram):
    output_name = HIDDEN

    def __init__(
        self,
        layout: HiggsLayout,
        lm: Session,
        embed: Session,
        head: Session,
        make_request: Callable[[Request], HiggsRequest],
    ) -> None:
        self.layout = layout
        self.lm, self.embed, self.head = lm, embed, head
        self.make_request = make_request

    def _embed(self, rows: np.ndarray) -> np.ndarray:
        return self.embed.run({"input_ids": np.ascontiguousarray(rows, np.int64)})["inputs_embeds"]

    def new_state(self, rows: int) -> tuple[list[RowState | None], RowSampler]:
        return [None] * rows, RowSampler(rows)

    def admit(self, state, row: int, request: Request) -> Admission:
        states, sampler = state
        higgs = request.chunk if isinstance(request.chunk, HiggsRequest) else None
        higgs = higgs or self.make_request(request)
        layout = self.layout
        row_state = RowState(
            version=layout.version,
            books=layout.codebooks,
            begin=layout.begin,
            end=layout.end,
            limit=higgs.max_new_tokens,
            ras_window=higgs.ras_window,
            ras_max_repeat=higgs.ras_max_repeat,
        )
        row_state.start(higgs.reference_rows)
        states[row] = row_state
        sampler.assign(row, higgs.sampling)
        embeds = self._embed(higgs.rows[None])
        return Admission(embeds, len(higgs.rows) + higgs.max_new_tokens, higgs.prefix)

    def consume(self, state, rows: np.ndarray, outputs: np.ndarray) -> StepOutput:
        states, sampler = state
        rows = np.asarray(rows, np.int64)
        hidden = np.ascontiguousarray(outputs, np.float32).reshape(len(rows), -1)
        logits = self.head.run({"hidden_state": hidden})["logits"]
        row_states = [states[r] for r in rows]
        frames = step_rows(row_states, sampler, rows, logits)  # type: ignore[arg-type]
        done = np.array([s.done for s in row_states], bool)  # type: ignore[union-attr]
        return StepOutput(frames=frames, done=done)

    def step_inputs(self, state, rows: np.ndarray) -> np.ndarray:
        states, _ = state
        ids = np.zeros((len(rows), 1, 1 + self.layout.codebooks), np.int64)
        ids[:, 0, 0] = AUDIO_ROW
        for i, row in enumerate(np.asarray(rows, np.int64)):
            ids[i, 0, 1:] = states[row].rows[-1]
        return self._embed(ids)


__all__ = ["HIDDEN", "HiggsProgram", "HiggsRequest"]

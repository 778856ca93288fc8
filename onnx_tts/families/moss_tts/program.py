"""MOSS-TTS generation as a decode program of the engine's scheduler (rows of arrays, one
random generator per row, many requests in one backbone step).

  admit(row, request)   the prompt rows (text.py) summed into `inputs_embeds` [1, P, hidden]
                        by the host tables (tables.py); the backbone prefills them
  consume(rows, hidden) each row's last `last_hidden_state` through the release's part:
                        Local v1.5 / v1 make one frame per step (local.py), Delay one row of
                        its pattern per step (delay.py)
  step_inputs(rows)     the row just made, embedded: [n, 1, hidden]

Stops: Local v1.5 when its continue/stop head says audio_end (no frame); Local v1 after the
frame whose text channel is audio_end (that frame is audio too, as published); Delay at im_end
(or the end of its audio, `stop_at`); every release after `max_new_frames` steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnx_tts.decoding import Admission, DecodeProgram, StepOutput
from onnx_tts.decoding.request import Request
from onnx_tts.families.moss_tts.delay import DelayStep
from onnx_tts.families.moss_tts.layout import MossLayout
from onnx_tts.families.moss_tts.local import FrameRows, LocalV1, LocalV15
from onnx_tts.families.moss_tts.sampling import MossSampling, RowSettings
from onnx_tts.families.moss_tts.tables import InputTables
from onnx_tts.families.moss_tts.text import Prompt
from onnx_tts.session import Session

HIDDEN = "last_hidden_state"


@dataclass(frozen=True)
class MossRequest:
    """One chunk as the program takes it: its prompt, sampling, step limit, the codebooks it
    generates (n_vq_for_inference) and its random generator (None when greedy)."""

    prompt: Prompt
    sampling: MossSampling
    max_new_frames: int
    used: int
    stop_at: str
    generator: np.random.Generator | None


@dataclass
class State:
    settings: RowSettings
    last: np.ndarray  # [rows, 1 + n_vq] the row each request feeds back next
    seen: np.ndarray  # [rows, n_vq, codebook + 1] bool (penalty coverage by codebook)
    steps: np.ndarray  # [rows] steps made
    limit: np.ndarray  # [rows] max steps
    used: np.ndarray  # [rows] codebooks generated
    delay: Any  # Delay's own per-row state


class MossProgram(DecodeProgram):
    """The family's decode program (module docstring)."""

    input_name = "inputs_embeds"
    output_name = HIDDEN

    def __init__(
        self,
        layout: MossLayout,
        backbone: Session,
        tables: InputTables,
        part: LocalV15 | LocalV1 | DelayStep,
        make_request: Callable[[Request], MossRequest],
    ) -> None:
        self.layout, self.lm, self.tables, self.part = layout, backbone, tables, part
        self.make_request = make_request

    def new_state(self, rows: int) -> State:
        c = self.layout
        return State(
            settings=RowSettings(rows),
            last=np.zeros((rows, c.row_width), np.int64),
            seen=np.zeros((rows, c.n_vq, c.codebook + 1), bool),
            steps=np.zeros(rows, np.int64),
            limit=np.zeros(rows, np.int64),
            used=np.full(rows, c.n_vq, np.int64),
            delay=self.part.new_state(rows) if isinstance(self.part, DelayStep) else None,
        )

    def admit(self, state: State, row: int, request: Request) -> Admission:
        moss = request.chunk if isinstance(request.chunk, MossRequest) else None
        moss = moss or self.make_request(request)
        c, prompt = self.layout, moss.prompt
        state.settings.assign(row, moss.sampling, c.variant, moss.generator)
        state.steps[row], state.limit[row], state.used[row] = 0, moss.max_new_frames, moss.used
        state.seen[row] = False
        if c.variant != "local-v1.5":  # the penalty covers the prompt's columns too
            columns = prompt.rows[:, 1:]
            for k in range(c.n_vq):
                state.seen[row, k, np.unique(columns[:, k])] = True
        if isinstance(self.part, DelayStep):
            self.part.admit(state, row, prompt.rows, moss.stop_at)
        embeds = self.tables.embed(prompt.rows[None], np.array([moss.used]))
        return Admission(embeds, len(prompt.rows) + moss.max_new_frames + 1, prompt.prefix)

    def step_inputs(self, state: State, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, np.int64)
        return self.tables.embed(state.last[rows][:, None, :], state.used[rows])

    def consume(self, state: State, rows: np.ndarray, outputs: np.ndarray) -> StepOutput:
        rows = np.asarray(rows, np.int64)
        hidden = np.asarray(outputs, np.float32).reshape(len(rows), -1)
        state.steps[rows] += 1
        if isinstance(self.part, DelayStep):
            frames, done = self.part.step(state, rows, hidden)
        elif isinstance(self.part, LocalV15):
            frames, done = self._local_v15(state, rows, hidden)
        else:
            frames, done = self._local_v1(state, rows, hidden)
        done |= state.steps[rows] >= state.limit[rows]
        return StepOutput(frames=frames, done=done)

    def _frame_rows(self, state: State, rows: np.ndarray, hidden: np.ndarray) -> FrameRows:
        return FrameRows(rows, hidden, state.seen[rows], state.used[rows])

    def _local_v15(self, state, rows, hidden) -> tuple[list[np.ndarray], np.ndarray]:
        c = self.layout
        going, codes = self.part.frames(self._frame_rows(state, rows, hidden), state.settings)
        frames = []
        for i, row in enumerate(rows):
            if going[i]:
                state.seen[row, np.arange(c.n_vq), codes[i]] = True
                state.last[row, 0] = c.tokens.assistant_slot
                state.last[row, 1:] = codes[i]
                frames.append(codes[i][None])
            else:
                frames.append(np.zeros((0, c.n_vq), np.int64))
        return frames, ~going

    def _local_v1(self, state, rows, hidden) -> tuple[list[np.ndarray], np.ndarray]:
        c = self.layout
        tokens = self.part.frames(self._frame_rows(state, rows, hidden), state.settings)
        state.last[rows] = tokens
        for k in range(c.n_vq):
            state.seen[rows, k, tokens[:, k + 1]] = True
        frames = [tokens[i : i + 1, 1:] for i in range(len(rows))]
        return frames, tokens[:, 0] == c.tokens.audio_end


__all__ = ["HIDDEN", "MossProgram", "MossRequest", "State"]

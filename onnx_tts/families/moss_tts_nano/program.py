"""MOSS-TTS-Nano generation as a decode program of the engine's scheduler.

The program is a state machine over rows (arrays indexed by row, one random generator per
row), so that many requests are rows of one batch:

  admit(row, request)    -> the request's prompt rows `input_ids` [1, S, 17] int32, run by the
                            prefill graph (`prefill_lm`), whose presents become the row's KV
  consume(rows, hidden)  -> each row's last `global_hidden` [n, hidden] through the local depth
                            transformer: its frame (16 codes) or its end (`should_continue` 0,
                            text token audio_end, or max_new_frames frames made)
  step_inputs(rows)      -> the next decode_step `input_ids` [n, 1, 17] = [assistant slot,
                            frame codes]; the scheduler's row homes add `past_valid_lengths`

The scheduler keeps the global KV (in place in shared slot rows, or a cache per request
chained present -> past by the core, or copied through the host as published).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from onnx_tts.decoding import Admission, DecodeProgram, StepOutput
from onnx_tts.decoding.request import Request
from onnx_tts.families.moss_tts_nano.layout import MossLayout
from onnx_tts.families.moss_tts_nano.local import LocalPath, LocalRows
from onnx_tts.families.moss_tts_nano.sampling import MossSampling
from onnx_tts.session import Session

GLOBAL_HIDDEN = "global_hidden"
# Positions one sequence may cache (prompt + frames): far beyond a 75-token chunk, a 30 s
# reference and 375 frames.
POSITION_LIMIT = 1 << 15


@dataclass(frozen=True)
class MossRequest:
    """One text chunk to speak: its token ids, the voice's prompt codes [F, n_vq], sampling,
    the frame limit and local path, and the generator its draws come from (the published
    runtime shares one generator across the chunks of a text, used in order)."""

    text_ids: tuple[int, ...]
    prompt_codes: np.ndarray
    sampling: MossSampling
    max_new_frames: int
    path: str
    generator: np.random.Generator | None = None


@dataclass
class FrameState:
    """Per-row state of up to `rows` requests."""

    hidden: np.ndarray  # [rows, hidden] float32: the row's last global hidden state
    seen: np.ndarray  # [rows, n_vq, codebook] bool: codes produced in this chunk
    last: np.ndarray  # [rows, n_vq] int32: the last frame
    frames: np.ndarray  # [rows] frames produced
    limit: np.ndarray  # [rows] max_new_frames
    path: list[str]
    rngs: list[np.random.Generator | None]
    options: dict[str, np.ndarray] = field(default_factory=dict)


SAMPLING_ARRAYS = {
    "text_temperature": np.float64,
    "text_top_k": np.int64,
    "text_top_p": np.float64,
    "audio_temperature": np.float64,
    "audio_top_k": np.int64,
    "audio_top_p": np.float64,
    "audio_repetition_penalty": np.float64,
}


class MossProgram(DecodeProgram):
    """The family's decode program (see the module docstring). `make_request` turns a
    scheduler request (its chunk: text, or an already built MossRequest) into a MossRequest."""

    input_name = "input_ids"
    output_name = GLOBAL_HIDDEN

    def __init__(
        self,
        layout: MossLayout,
        paths: Mapping[str, LocalPath],
        prefill: Session,
        decode: Session,
        make_request: Callable[[Request], MossRequest],
    ) -> None:
        self.layout = layout
        self.config = layout.config
        self.paths = dict(paths)
        self.lm = decode
        self.prefill_lm = prefill
        self.make_request = make_request

    def new_state(self, rows: int) -> FrameState:
        c = self.config
        return FrameState(
            hidden=np.zeros((rows, c.hidden), np.float32),
            seen=np.zeros((rows, c.n_vq, c.codebook), bool),
            last=np.zeros((rows, c.n_vq), np.int32),
            frames=np.zeros(rows, np.int64),
            limit=np.zeros(rows, np.int64),
            path=[""] * rows,
            rngs=[None] * rows,
            options={
                "do_sample": np.zeros(rows, bool),
                **{name: np.zeros(rows, dtype) for name, dtype in SAMPLING_ARRAYS.items()},
            },
        )

    def prompt_rows(self, text_ids, prompt_codes: np.ndarray) -> np.ndarray:
        """The published request rows [S, n_vq + 1]: text rows of the user prefix and
        audio_start, the voice's code rows under the user slot token, then text rows of
        audio_end, the after-reference template, the text, the assistant prefix, audio_start;
        text rows carry the audio pad in every code column."""
        c, t = self.config, self.layout.templates
        prefix = [*t.user_prefix, c.audio_start]
        suffix = [c.audio_end, *t.after_reference, *text_ids, *t.assistant_prefix, c.audio_start]
        codes = np.asarray(prompt_codes, np.int32).reshape(-1, c.n_vq)
        rows = np.full((len(prefix) + len(codes) + len(suffix), c.row_width), c.audio_pad, np.int32)
        rows[: len(prefix), 0] = prefix
        audio = slice(len(prefix), len(prefix) + len(codes))
        rows[audio, 0] = c.user_slot
        rows[audio, 1:] = codes
        rows[audio.stop :, 0] = suffix
        return rows

    def admit(self, state: FrameState, row: int, request: Request) -> Admission:
        """Start `request` in `row`: its prompt rows, and the KV positions it may need."""
        moss = request.chunk if isinstance(request.chunk, MossRequest) else None
        moss = moss or self.make_request(request)
        rows = self.prompt_rows(moss.text_ids, moss.prompt_codes)
        state.seen[row] = False
        state.frames[row] = 0
        state.limit[row] = moss.max_new_frames
        state.path[row] = moss.path
        state.rngs[row] = moss.generator
        for name in SAMPLING_ARRAYS:
            state.options[name][row] = getattr(moss.sampling, name)
        state.options["do_sample"][row] = moss.sampling.do_sample
        return Admission(rows[None], len(rows) + moss.max_new_frames)

    def _local_rows(self, state: FrameState, rows: np.ndarray) -> LocalRows:
        o = state.options
        return LocalRows(
            hidden=state.hidden[rows],
            seen=state.seen[rows],
            rngs=[state.rngs[r] for r in rows],
            do_sample=o["do_sample"][rows],
            text_temperature=o["text_temperature"][rows],
            text_top_k=o["text_top_k"][rows],
            text_top_p=o["text_top_p"][rows],
            audio_temperature=o["audio_temperature"][rows],
            audio_top_k=o["audio_top_k"][rows],
            audio_top_p=o["audio_top_p"][rows],
            penalty=o["audio_repetition_penalty"][rows],
        )

    def consume(self, state: FrameState, rows: np.ndarray, hidden: np.ndarray) -> StepOutput:
        """Frames of `rows` from their last global hidden states [n, hidden]."""
        rows = np.asarray(rows, np.int64)
        state.hidden[rows] = np.asarray(hidden, np.float32).reshape(len(rows), -1)
        going = np.zeros(len(rows), bool)
        codes = np.zeros((len(rows), self.config.n_vq), np.int32)
        for name in dict.fromkeys(state.path[r] for r in rows):
            members = np.flatnonzero([state.path[r] == name for r in rows])
            keep, frame = self.paths[name].frames(self._local_rows(state, rows[members]))
            going[members], codes[members] = keep, frame
        frames = []
        for i, row in enumerate(rows):
            if going[i]:
                state.seen[row, np.arange(self.config.n_vq), codes[i]] = True
                state.last[row] = codes[i]
                state.frames[row] += 1
                frames.append(codes[i][None])
            else:
                frames.append(np.zeros((0, self.config.n_vq), np.int32))
        done = ~going | (state.frames[rows] >= state.limit[rows])
        return StepOutput(frames=frames, done=done)

    def step_inputs(self, state: FrameState, rows: np.ndarray) -> np.ndarray:
        """The decode_step `input_ids` [n, 1, 17] of `rows`: the assistant slot and the row's
        last frame."""
        rows = np.asarray(rows, np.int64)
        ids = np.empty((len(rows), 1, self.config.row_width), np.int32)
        ids[:, 0, 0] = self.config.assistant_slot
        ids[:, 0, 1:] = state.last[rows]
        return ids


__all__ = ["GLOBAL_HIDDEN", "POSITION_LIMIT", "FrameState", "MossProgram", "MossRequest"]

"""MOSS-TTS-Nano generation as a per-row program, and the global transformer it steps.

The program is a state machine over rows (arrays indexed by row, one random generator per
row), so that many requests can later be rows of one batch:

  admit(row, request)  -> the prefill feeds of the request's prompt rows
                          (`input_ids` [1, S, 17] int32, `attention_mask` [1, S] int32)
  consume(rows, hidden)-> each row's last `global_hidden` [n, hidden] through the local depth
                          transformer: its frame (16 codes) or its end (`should_continue` 0,
                          text token audio_end, or max_new_frames frames made)
  step_feeds(rows)     -> the next decode_step feeds: `input_ids` [n, 1, 17] = [assistant
                          slot, frame codes] and `past_valid_lengths` [n] = positions cached

`GlobalLM` runs the prefill graph and the decode_step graph on one KV cache in the core: the
prefill's presents are handed to the step graph's cache (`KVCache.prefill`), then each step
chains present -> past by IO binding ("chain"), or copies them through the host ("copy", as
published). `decode_request` is the solo loop that drives the two.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from onnx_tts.decoding import CapacityPolicy, KVPool, StepOutput
from onnx_tts.errors import ModelError
from onnx_tts.families.moss_tts_nano.layout import FAMILY, MossLayout
from onnx_tts.families.moss_tts_nano.local import LocalPath, LocalRows
from onnx_tts.families.moss_tts_nano.sampling import MossSampling
from onnx_tts.graph_io import KVLayout
from onnx_tts.session import KVCache, Session

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
    length: np.ndarray  # [rows] positions in the row's KV cache
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


class MossProgram:
    """The family's decode program (see the module docstring)."""

    output_name = GLOBAL_HIDDEN
    prefill_inputs = ("input_ids", "attention_mask")
    step_inputs = ("input_ids", "past_valid_lengths")

    def __init__(self, layout: MossLayout, paths: Mapping[str, LocalPath]) -> None:
        self.layout = layout
        self.config = layout.config
        self.paths = dict(paths)

    def new_state(self, rows: int) -> FrameState:
        c = self.config
        return FrameState(
            hidden=np.zeros((rows, c.hidden), np.float32),
            seen=np.zeros((rows, c.n_vq, c.codebook), bool),
            last=np.zeros((rows, c.n_vq), np.int32),
            frames=np.zeros(rows, np.int64),
            limit=np.zeros(rows, np.int64),
            length=np.zeros(rows, np.int64),
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

    def admit(
        self, state: FrameState, row: int, request: MossRequest
    ) -> tuple[dict[str, np.ndarray], int]:
        """Start `request` in `row`: (prefill feeds, KV positions it may need)."""
        if not isinstance(request, MossRequest):
            # The generic decode loop feeds inputs_embeds and reads logits; this family steps
            # input_ids rows on a separate prefill graph and reads global_hidden.
            raise ModelError(
                f"{FAMILY} does not run through the generic decode loop yet: use "
                "onnx_tts.families.moss_tts_nano.open_model(DIR).synthesize() or .stream()"
            )
        rows = self.prompt_rows(request.text_ids, request.prompt_codes)
        state.seen[row] = False
        state.frames[row] = 0
        state.limit[row] = request.max_new_frames
        state.length[row] = len(rows)
        state.path[row] = request.path
        state.rngs[row] = request.generator
        for name in SAMPLING_ARRAYS:
            state.options[name][row] = getattr(request.sampling, name)
        state.options["do_sample"][row] = request.sampling.do_sample
        feeds = {
            "input_ids": rows[None],
            "attention_mask": np.ones((1, len(rows)), np.int32),
        }
        return feeds, len(rows) + request.max_new_frames

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

    def step_feeds(self, state: FrameState, rows: np.ndarray) -> dict[str, np.ndarray]:
        """The decode_step inputs of `rows` (each row's cache then holds one more position)."""
        rows = np.asarray(rows, np.int64)
        ids = np.empty((len(rows), 1, self.config.row_width), np.int32)
        ids[:, 0, 0] = self.config.assistant_slot
        ids[:, 0, 1:] = state.last[rows]
        lengths = state.length[rows].astype(np.int32)
        state.length[rows] += 1
        return {"input_ids": ids, "past_valid_lengths": lengths}


class GlobalLM:
    """The global transformer: prefill graph + decode_step graph on one KV cache each request
    (from a pool, so buffers are reused)."""

    def __init__(self, prefill: Session, decode: Session, layout: KVLayout, mode: str) -> None:
        self.prefill_session = prefill
        self.decode_session = decode
        self.layout = layout
        self.mode = mode
        self.pool = KVPool(decode, layout, mode, CapacityPolicy(None, POSITION_LIMIT))

    def acquire(self, needed: int) -> KVCache:
        return self.pool.acquire(needed)

    def release(self, cache: KVCache) -> None:
        self.pool.release(cache)

    def prefill(self, cache: KVCache, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        """Run the prompt; the cache then holds its positions. Returns the last position's
        global hidden state [batch, hidden]."""
        out = cache.prefill(self.prefill_session, feeds, [GLOBAL_HIDDEN])
        return out[GLOBAL_HIDDEN][:, -1]

    def step(self, cache: KVCache, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        out = cache.step(feeds, output_names=[GLOBAL_HIDDEN])
        return out[GLOBAL_HIDDEN][:, -1]


def decode_request(
    program: MossProgram,
    lm: GlobalLM,
    request: MossRequest,
    should_stop: Callable[[], bool] | None = None,
) -> Iterator[np.ndarray]:
    """Frames [n_vq] int32 of one request, as they are made, on a KV cache of its own.
    Closing the iterator stops generation and returns the cache to the pool."""
    state = program.new_state(1)
    rows = np.zeros(1, np.int64)
    feeds, needed = program.admit(state, 0, request)
    cache = lm.acquire(needed)
    try:
        hidden = lm.prefill(cache, feeds)
        while True:
            result = program.consume(state, rows, hidden)
            yield from result.frames[0]
            if result.done[0] or (should_stop is not None and should_stop()):
                return
            hidden = lm.step(cache, program.step_feeds(state, rows))
    finally:
        lm.release(cache)


__all__ = [
    "GLOBAL_HIDDEN",
    "FrameState",
    "GlobalLM",
    "MossProgram",
    "MossRequest",
    "decode_request",
]

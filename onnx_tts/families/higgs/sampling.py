"""Higgs row sampling: one delayed row of K codes per step, per request row, as published.

Draws: each codebook's code is drawn (temperature -> top-k -> top-p -> one uniform through the
cumulative distribution, the engine's `RowSampler`) from the request's own random generator,
one draw per codebook in codebook order (also for codebooks the delay pattern forces), then
v2's resampling draws; greedy (temperature 0) draws nothing but those.

v2 (`transformers` HiggsAudioV2 generation):
* delay: the first row is all begin codes, codebook k is begin up to row k (the prompt ends
  with <|audio_out_bos|>), so codebook k starts at row k + 1;
* end: once a row holds an end code in any codebook, codebook k is forced to end k + 1 rows
  later; the row whose codes are all end finishes the request (it is not audio);
* repetition-aware resampling (RAS, also when greedy): a code seen at least `ras_max_repeat`
  times among the last `ras_window` rows of the audio so far (the reference's delayed rows,
  then the generated ones; begin/end codes not counted) is drawn again from the softmax of the
  raw logits (no delay mask, no temperature);
* frames: row r completes frame r - K (the first row is all begin), codes clipped to the codec.
v3 (SGLang-Omni `higgs_tts/sampler.py`):
* delay: at step s < K codebooks above s are begin codes; the first row's codebook 0 is drawn;
* end: after the delay window, an end code on codebook 0 starts a countdown of K - 2 rows,
  after which the request is done (that row included);
* frames: row r completes frame r - K + 1, begin/end codes decoded as 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from onnx_tts.decoding.delay import complete_frame
from onnx_tts.decoding.sampling import RowSampler, SamplingOptions

GREEDY_TEMPERATURE = 1e-5  # v3: at or below it the draw is greedy (SGLang-Omni)


@dataclass
class RowState:
    """One request row's generation state."""

    version: str
    books: int
    begin: int
    end: int
    limit: int
    ras_window: int = 0
    ras_max_repeat: int = 2
    rows: list[np.ndarray] = field(default_factory=list)  # generated delayed rows
    history: list[np.ndarray] = field(default_factory=list)  # the RAS window's rows
    end_seen: bool = False  # v2: a row held an end code; the end countdown runs
    end_delay: np.ndarray | None = None  # v2: per codebook, rows until it is forced to end
    countdown: int = -1  # v3: rows left after codebook 0 ended
    done: bool = False

    def start(self, reference_rows: np.ndarray) -> None:
        self.rows, self.done, self.end_seen, self.countdown = [], False, False, -1
        self.end_delay = np.arange(1, self.books + 1)
        window = self.ras_window
        self.history = [np.asarray(r) for r in reference_rows[-window:]] if window else []


def _softmax_draw(logits: np.ndarray, uniform: float) -> int:
    values = np.asarray(logits, np.float64)
    probs = np.exp(values - values.max())
    cdf = np.cumsum(probs)
    return int(min(np.searchsorted(cdf, uniform * cdf[-1], side="right"), len(cdf) - 1))


def _forced(state: RowState) -> np.ndarray:
    """Per codebook: the code the delay pattern forces at this step, or -1."""
    forced = np.full(state.books, -1)
    step = len(state.rows)
    if state.version == "v2":
        forced[np.arange(state.books) >= step] = state.begin
        if state.end_seen:
            forced[state.end_delay <= 0] = state.end
    elif step < state.books:
        forced[np.arange(state.books) > step] = state.begin
    return forced


def step_rows(
    states: list[RowState],
    sampler: RowSampler,
    rows: np.ndarray,
    logits: np.ndarray,
) -> list[np.ndarray]:
    """Sample one delayed row for each request row of `rows` from `logits` [n, K, V]; returns
    the frames each completed ([F, K] int64, F 0 or 1). Updates the states (`done`)."""
    logits = np.asarray(logits, np.float32)
    masked = logits.copy()
    forced = np.stack([_forced(state) for state in states])
    for i, state in enumerate(states):
        if state.version == "v2" and state.end_seen:
            state.end_delay = state.end_delay - 1
            forced[i] = _forced(state)
        for k in np.flatnonzero(forced[i] >= 0):
            masked[i, k] = -np.inf
            masked[i, k, forced[i, k]] = 0.0
    codes = sampler.sample(rows, masked)
    out: list[np.ndarray] = []
    for i, state in enumerate(states):
        row = codes[i].astype(np.int64)
        if state.version == "v2":
            row = _v2_resample(state, sampler, int(rows[i]), logits[i], row)
        out.append(_advance(state, row))
    return out


def _v2_resample(
    state: RowState, sampler: RowSampler, row_index: int, logits: np.ndarray, row: np.ndarray
) -> np.ndarray:
    if state.ras_window and state.history:
        window = np.stack(state.history[-state.ras_window :])
        counted = (window == row[None]) & (window != state.begin) & (window != state.end)
        repeats = np.flatnonzero(counted.sum(axis=0) >= state.ras_max_repeat)
        if len(repeats):
            rng = sampler.rngs[row_index]
            assert rng is not None
            draws = rng.random(len(repeats))
            row = row.copy()
            for k, uniform in zip(repeats, draws, strict=True):
                row[k] = _softmax_draw(logits[k], float(uniform))
    if state.ras_window:
        state.history.append(row)
        del state.history[: -state.ras_window]
    return row


def _advance(state: RowState, row: np.ndarray) -> np.ndarray:
    """Take the sampled `row`; the frame it completes (or none)."""
    empty = np.zeros((0, state.books), np.int64)
    if state.version == "v2":
        if bool((row == state.end).all()):
            state.done = True
            return empty
        if (row == state.end).any():
            state.end_seen = True
        state.rows.append(row)
        frame = _last_frame(state, first_row=1)  # v2's first row is all begin codes
        codes = None if frame is None else np.clip(frame, 0, state.begin - 1)
    else:
        step = len(state.rows)
        if step >= state.books:
            if state.countdown >= 0:
                state.countdown -= 1
                state.done = state.countdown <= 0
            elif row[0] == state.end:
                if state.books <= 2:
                    state.done = True
                else:
                    state.countdown = state.books - 2
        state.rows.append(row)
        frame = _last_frame(state, first_row=0)
        codes = None if frame is None else np.where(frame >= state.begin, 0, frame)
    if len(state.rows) >= state.limit:
        state.done = True
    return empty if codes is None else codes[None].astype(np.int64)


def _last_frame(state: RowState, first_row: int) -> np.ndarray | None:
    """The frame the newest row completes: only the last `books` rows can hold it, so only
    those are stacked (stacking every row each step made a long text quadratic)."""
    tail = state.rows[max(first_row, len(state.rows) - state.books) :]
    return complete_frame(np.stack(tail), len(tail) - 1) if tail else None


def v3_options(options: SamplingOptions) -> SamplingOptions:
    """v3 draws greedily at or below GREEDY_TEMPERATURE (the engine's greedy is 0)."""
    if options.temperature <= GREEDY_TEMPERATURE:
        return SamplingOptions(0.0, options.top_k, options.top_p, 1.0, options.seed)
    return options


__all__ = ["GREEDY_TEMPERATURE", "RowState", "step_rows", "v3_options"]

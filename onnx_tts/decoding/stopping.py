"""Stop rules for runaway token generation, tracked for many rows at once."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from onnx_tts.errors import InputError

MAX_RULE_TOKENS = 100_000


@dataclass(frozen=True)
class StopRules:
    """Heuristics that end a generation which no longer makes speech (0 disables a rule):

    - max_token_repeat: the same non-silence token this many times in a row (a stuck model);
    - max_cycle_tokens: a short cycle (period 2..max_cycle_period) repeating over this many
      tokens (a looping model);
    - max_silence_tokens: this many silence tokens in a row (a pause that never ends).
    Generation stops as soon as a rule fires; tokens already produced are kept (they may
    already have been streamed)."""

    max_token_repeat: int = 30
    max_cycle_tokens: int = 60
    max_cycle_period: int = 8
    max_silence_tokens: int = 50
    silence_tokens: frozenset[int] = frozenset()

    def checked(self) -> StopRules:
        for name in (
            "max_token_repeat",
            "max_cycle_tokens",
            "max_cycle_period",
            "max_silence_tokens",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise InputError(f"stop rule {name} must be an integer, got {value!r}")
            if not 0 <= value <= MAX_RULE_TOKENS:
                raise InputError(f"stop rule {name} must be in [0, {MAX_RULE_TOKENS}], got {value}")
        return self


class StopTracker:
    """The token history each rule needs, for up to `rows` sequences: run lengths and a ring
    of the last `max_cycle_tokens` tokens per row."""

    def __init__(self, rules: StopRules, rows: int) -> None:
        self.rules = rules.checked()
        self.silence = np.array(sorted(rules.silence_tokens), np.int64)
        self.window = max(rules.max_cycle_tokens, 1)
        self.ring = np.zeros((rows, self.window), np.int64)
        self.count = np.zeros(rows, np.int64)
        self.repeat = np.zeros(rows, np.int64)  # trailing run of the last token
        self.silent = np.zeros(rows, np.int64)  # trailing run of silence tokens

    def reset(self, row: int) -> None:
        self.count[row] = self.repeat[row] = self.silent[row] = 0

    def push(self, rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """Record one token per row; returns which rows must stop now."""
        rules = self.rules
        tokens = np.asarray(tokens, np.int64)
        previous = self.ring[rows, (self.count[rows] - 1) % self.window]
        continues = (self.count[rows] > 0) & (previous == tokens)
        self.repeat[rows] = np.where(continues, self.repeat[rows] + 1, 1)
        is_silence = np.isin(tokens, self.silence)
        self.silent[rows] = np.where(is_silence, self.silent[rows] + 1, 0)
        self.ring[rows, self.count[rows] % self.window] = tokens
        self.count[rows] += 1

        stop = np.zeros(len(rows), bool)
        if rules.max_silence_tokens:
            stop |= self.silent[rows] >= rules.max_silence_tokens
        if rules.max_token_repeat:
            stop |= (self.repeat[rows] >= rules.max_token_repeat) & ~is_silence
        if rules.max_cycle_tokens:
            full = np.flatnonzero(self.count[rows] >= self.window)
            if len(full):
                stop[full] |= self._cycling(rows[full])
        return stop

    def _cycling(self, rows: np.ndarray) -> np.ndarray:
        # The last `window` tokens of each row, oldest first.
        order = (self.count[rows, None] + np.arange(self.window)[None, :]) % self.window
        tail = np.take_along_axis(self.ring[rows], order, axis=1)
        found = np.zeros(len(rows), bool)
        for period in range(2, min(self.rules.max_cycle_period, self.window - 1) + 1):
            repeats = np.all(tail[:, period:] == tail[:, :-period], axis=1)
            varied = np.any(tail[:, 1:period] != tail[:, :1], axis=1)
            found |= repeats & varied
        return found


__all__ = ["StopRules", "StopTracker"]

"""Token sampling for every family: checked options, and a sampler that works on a batch of
rows (each with its own options and random stream) in one vectorised pass."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from onnx_tts.errors import InputError, checked_integer, checked_number

MAX_SEED = 2**63 - 1
# Bounds a user cannot sensibly exceed; each is far beyond any useful value.
MAX_TEMPERATURE = 100.0
MAX_TOP_K = 1 << 20
MAX_REPETITION_PENALTY = 100.0

SAMPLING_KEYS = ("temperature", "top_k", "top_p", "repetition_penalty")


def check_seed(seed: Any) -> int | None:
    """A seed is None (random) or an integer in [0, 2**63 - 1]."""
    return None if seed is None else checked_integer("seed", seed, 0, MAX_SEED)


@dataclass(frozen=True)
class SamplingOptions:
    """How one token is drawn. temperature 0 means greedy; top_k 0 disables top-k; the
    repetition penalty divides positive (multiplies negative) logits of tokens already
    produced; seed makes the draw reproducible."""

    temperature: float = 0.8
    top_k: int = 50
    top_p: float = 0.95
    repetition_penalty: float = 1.1
    seed: int | None = None

    def checked(self) -> SamplingOptions:
        return SamplingOptions(
            temperature=checked_number("temperature", self.temperature, 0.0, MAX_TEMPERATURE),
            top_k=checked_integer("top_k", self.top_k, 0, MAX_TOP_K),
            top_p=checked_number("top_p", self.top_p, 0.0, 1.0, open_low=True),
            repetition_penalty=checked_number(
                "repetition_penalty",
                self.repetition_penalty,
                0.0,
                MAX_REPETITION_PENALTY,
                open_low=True,
            ),
            seed=check_seed(self.seed),
        )

    def with_overrides(self, overrides: Mapping[str, Any]) -> SamplingOptions:
        """These options with the non-None `overrides` applied, checked."""
        known = {field.name for field in fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise InputError(
                f"unknown sampling option(s) {', '.join(unknown)}; "
                f"valid: {', '.join(sorted(known))}"
            )
        return replace(self, **{k: v for k, v in overrides.items() if v is not None}).checked()

    def for_chunk(self, index: int) -> SamplingOptions:
        """The options of the index-th text chunk: its own seed (seed + index), so a chunk's
        audio does not depend on how many chunks came before it was generated."""
        return self if self.seed is None else replace(self, seed=self.seed + index)


class RowSampler:
    """Sampling state of up to `rows` sequences: per-row options and random streams.

    `sample(rows, logits)` draws one token per logit row of every listed sequence at once;
    a sequence may contribute several logit rows per step (one per codebook)."""

    def __init__(self, rows: int) -> None:
        self.temperature = np.zeros(rows)
        self.top_k = np.zeros(rows, np.int64)
        self.top_p = np.ones(rows)
        self.penalty = np.ones(rows)
        self.rngs: list[np.random.Generator | None] = [None] * rows

    def assign(self, row: int, options: SamplingOptions) -> None:
        self.temperature[row] = options.temperature
        self.top_k[row] = options.top_k
        self.top_p[row] = options.top_p
        self.penalty[row] = options.repetition_penalty
        self.rngs[row] = np.random.default_rng(options.seed)

    def penalize(self, rows: np.ndarray, logits: np.ndarray, seen: np.ndarray) -> np.ndarray:
        """CTRL-style repetition penalty on the tokens marked in the boolean mask `seen`
        (same shape as `logits`, whose first axis follows `rows`)."""
        penalty = self.penalty[rows].reshape((-1,) + (1,) * (logits.ndim - 1))
        if np.all(penalty == 1.0):
            return logits
        return np.where(seen, np.where(logits > 0, logits / penalty, logits * penalty), logits)

    def sample(self, rows: np.ndarray, logits: np.ndarray) -> np.ndarray:
        """Tokens for `logits` [len(rows), ..., V]: one draw per logit row, as int64
        [len(rows), ...]."""
        rows = np.asarray(rows)
        shape = logits.shape[:-1]
        per_sequence = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
        flat = np.asarray(logits, dtype=np.float64).reshape(-1, logits.shape[-1])
        repeat = np.repeat(np.arange(len(rows)), per_sequence)
        temperature = self.temperature[rows][repeat]
        tokens = flat.argmax(axis=-1)
        sampled = temperature > 0
        if sampled.any():
            index = np.flatnonzero(sampled)
            members = repeat[index]
            draws = np.concatenate(
                [self._draws(int(rows[m]), int((members == m).sum())) for m in np.unique(members)]
            )
            tokens[index] = self._draw(
                flat[index],
                temperature[index],
                self.top_k[rows][members],
                self.top_p[rows][members],
                draws,
            )
        return tokens.reshape(shape)

    def _draws(self, row: int, count: int) -> np.ndarray:
        rng = self.rngs[row]
        if rng is None:
            raise InputError(f"row {row} has no sampling options assigned")
        return rng.random(count)

    @staticmethod
    def _draw(
        logits: np.ndarray,
        temperature: np.ndarray,
        top_k: np.ndarray,
        top_p: np.ndarray,
        draws: np.ndarray,
    ) -> np.ndarray:
        logits = logits / temperature[:, None]
        vocab = logits.shape[-1]
        limited = (top_k > 0) & (top_k < vocab)
        if limited.any():
            # The k-th largest logit of each limited row; rows without a limit keep everything.
            kth = -np.sort(-logits, axis=-1)[np.arange(len(logits)), np.clip(top_k, 1, vocab) - 1]
            keep = (logits >= kth[:, None]) | ~limited[:, None]
            logits = np.where(keep, logits, -np.inf)
        probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        nucleus = np.flatnonzero(top_p < 1.0)
        if len(nucleus):
            # Only rows that ask for it are renormalised: a row's draw must not depend on
            # which other rows share the batch.
            part = probs[nucleus]
            order = np.argsort(-part, axis=-1, kind="stable")
            ranked = np.take_along_axis(part, order, axis=-1)
            # Keep the smallest prefix whose mass reaches top_p (the crossing token included).
            keep_ranked = (np.cumsum(ranked, axis=-1) - ranked) < top_p[nucleus, None]
            keep = np.zeros_like(keep_ranked)
            np.put_along_axis(keep, order, keep_ranked, axis=-1)
            part = np.where(keep, part, 0.0)
            probs[nucleus] = part / part.sum(axis=-1, keepdims=True)
        cdf = np.cumsum(probs, axis=-1)
        targets = draws[:, None] * cdf[:, -1:]
        return np.minimum((cdf < targets).sum(axis=-1), vocab - 1)


__all__ = ["SAMPLING_KEYS", "RowSampler", "SamplingOptions", "check_seed"]

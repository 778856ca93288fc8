"""Per-channel token sampling in the orders published Hugging Face-style generation loops use.

A multi-codebook LM samples one token per channel and row; published loops compose the same
few steps in their own order and variant (`SamplerSteps`):

  penalty       repetition penalty on the tokens a row's channel has seen (a mask): a score
                below zero is multiplied by the penalty, else divided (HF
                RepetitionPenaltyLogitsProcessor and its ports);
  temperature   scores / temperature;
  top_k         scores below the k-th largest are dropped (ties kept; 0 or >= vocabulary: off);
  top_p         "nucleus": sorted descending, a token goes once the probability before it
                exceeds top_p (the first always stays; off unless 0 < top_p < 1);
                "hf": TopPLogitsWarper, sorted ascending, tokens whose cumulative probability
                is <= 1 - top_p go, the likeliest always stays.

then one draw. A greedy row (temperature 0) takes the first maximum, after the penalty when the
published loop applies it before its argmax (`greedy_penalty`).

Draws are explicit: each sampled token takes one uniform u in [0, 1) from its request's own
generator and is the first token, in vocabulary order, whose cumulative probability exceeds
u x total. That is multinomial sampling (the same distribution as `torch.multinomial`), and a
row's token depends only on its logits, its settings and its own draws, never on the other
rows of a batch. Probabilities are float64 softmaxes of the float32 scores; work after top-k
is done on the surviving candidates only (a 150k-token text vocabulary costs one partition).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

STEPS = ("penalty", "temperature", "top_k", "top_p")
TOP_P_RULES = ("nucleus", "hf")


@dataclass(frozen=True)
class SamplerSteps:
    """The order of the steps before the draw, the top-p rule, and whether a greedy channel
    sees the penalty before its argmax."""

    order: tuple[str, ...] = STEPS
    top_p: str = "nucleus"
    greedy_penalty: bool = True

    def __post_init__(self) -> None:
        if sorted(self.order) != sorted(STEPS) or self.top_p not in TOP_P_RULES:
            raise ValueError(f"bad sampler steps {self}")


def penalize(scores: np.ndarray, seen: np.ndarray, penalty: np.ndarray) -> np.ndarray:
    """Scores [n, V] float32 with the penalty [n] on the tokens marked in `seen` [n, V]."""
    factor = penalty.astype(np.float32)[:, None]
    scaled = np.where(scores < 0, scores * factor, scores / factor)
    return np.where(seen & (penalty != 1.0)[:, None], scaled, scores).astype(np.float32)


def _softmax(scores: np.ndarray) -> np.ndarray:
    finite = np.isfinite(scores)
    top = scores[finite].max()
    exps = np.where(finite, np.exp((scores - top).astype(np.float64)), 0.0)
    return exps / exps.sum()


def _draw_one(
    scores: np.ndarray,
    seen: np.ndarray | None,
    steps: SamplerSteps,
    temperature: float,
    top_k: int,
    top_p: float,
    penalty: float,
    u: float,
) -> int:
    """One sampled token of one row's float32 scores [V] (module docstring)."""
    candidates = np.arange(scores.shape[0])
    values = scores
    for step in steps.order:
        if step == "penalty" and seen is not None and penalty != 1.0:
            values = penalize(values[None], seen[candidates][None], np.array([penalty]))[0]
        elif step == "temperature":
            values = (values / np.float32(temperature)).astype(np.float32)
        elif step == "top_k" and 0 < top_k < len(values):
            kth = np.partition(values, len(values) - top_k)[len(values) - top_k]
            keep = values >= kth
            candidates, values = candidates[keep], values[keep]
        elif step == "top_p" and 0.0 < top_p < 1.0:
            keep = _top_p(values, top_p, steps.top_p)
            candidates, values = candidates[keep], values[keep]
    probabilities = _softmax(values)
    cdf = np.cumsum(probabilities)
    index = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    positive = np.flatnonzero(probabilities > 0)
    return int(candidates[min(index, positive[-1])])


def _top_p(values: np.ndarray, top_p: float, rule: str) -> np.ndarray:
    """Which of `values` survive top-p under `rule` (module docstring)."""
    if rule == "nucleus":
        order = np.argsort(-values, kind="stable")
        cumulative = np.cumsum(_softmax(values[order]))
        remove = np.zeros(len(values), bool)
        remove[1:] = cumulative[:-1] > top_p
    else:
        order = np.argsort(values, kind="stable")
        cumulative = np.cumsum(_softmax(values[order]))
        remove = cumulative <= 1.0 - top_p
        remove[-1] = False
    keep = np.ones(len(values), bool)
    keep[order[remove]] = False
    return keep & np.isfinite(values)


def sample_channel(
    logits: np.ndarray,
    steps: SamplerSteps,
    temperature: np.ndarray,
    top_k: np.ndarray,
    top_p: np.ndarray,
    penalty: np.ndarray | None = None,
    seen: np.ndarray | None = None,
    draws: np.ndarray | None = None,
) -> np.ndarray:
    """One token per row of `logits` [n, V]: rows with temperature 0 greedy, the others
    sampled with their own settings ([n] arrays) and uniform `draws` [n] (only the sampled
    rows' entries are read). `seen` [n, V] bool marks the tokens the penalty applies to."""
    scores = np.asarray(logits, np.float32)
    n = scores.shape[0]
    penalty = np.ones(n) if penalty is None else np.asarray(penalty, np.float64)
    greedy = np.asarray(temperature) <= 0
    tokens = np.empty(n, np.int64)
    if greedy.any():
        source = scores[greedy]
        if steps.greedy_penalty and seen is not None:
            source = penalize(source, seen[greedy], penalty[greedy])
        tokens[greedy] = source.argmax(axis=1)
    for row in np.flatnonzero(~greedy):
        tokens[row] = _draw_one(
            scores[row],
            None if seen is None else seen[row],
            steps,
            float(temperature[row]),
            int(top_k[row]),
            float(top_p[row]),
            float(penalty[row]),
            float(draws[row]),  # type: ignore[index]
        )
    return tokens


__all__ = ["STEPS", "TOP_P_RULES", "SamplerSteps", "penalize", "sample_channel"]

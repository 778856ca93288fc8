"""MOSS-TTS-Nano sampling: the published options, and host sampling vectorised over rows that
draws exactly what the published runtime draws.

The published host sampler (`_sample_from_scores` in `ort_cpu_runtime.py`) works on float32
scores: divide by the temperature, keep scores >= the k-th largest (ties kept), drop a nucleus
tail (probabilities of a stable descending sort, accumulated; an item is dropped when the sum
before it exceeds top_p), then one uniform draw `u` minus each probability in index order until
it reaches <= 0 (the argmax when rounding leaves it positive). Softmaxes are taken in float64 of
the float32 differences. Every step here is the same floating-point operation in the same
order (sequential sums as `np.cumsum` / `np.subtract.accumulate`, per-row reductions), so each
row's token equals the published one bit for bit; the tests check it against a paraphrase of
the published loop. Each row has its own generator: a row's draws never depend on its
neighbours.

Greedy (`do_sample` off) picks the first maximum; the audio greedy compares float64 scores with
the repetition penalty applied in float64, as published.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from onnx_tts.errors import InputError, checked_integer, checked_number
from onnx_tts.families.moss_tts_nano.layout import SAMPLE_MODES, GenerationDefaults

RANDOM_U_MAX = 0.99999994  # the published clamp of the frame graphs' uniforms
MAX_TEMPERATURE = 100.0
MAX_TOP_K = 1 << 20
MAX_PENALTY = 100.0


@dataclass(frozen=True)
class MossSampling:
    """The published sampling options (infer_onnx.py names) of one request."""

    sample_mode: str = "fixed"
    text_temperature: float = 1.0
    text_top_p: float = 1.0
    text_top_k: int = 50
    audio_temperature: float = 0.8
    audio_top_p: float = 0.95
    audio_top_k: int = 25
    audio_repetition_penalty: float = 1.2

    @classmethod
    def from_defaults(cls, defaults: GenerationDefaults) -> MossSampling:
        return cls(**{f.name: getattr(defaults, f.name) for f in fields(cls)})

    @property
    def do_sample(self) -> bool:
        return self.sample_mode != "greedy"

    def with_overrides(self, overrides: dict[str, Any]) -> MossSampling:
        return replace(self, **{k: v for k, v in overrides.items() if v is not None}).checked()

    def checked(self) -> MossSampling:
        if self.sample_mode not in SAMPLE_MODES:
            raise InputError(
                f"sample_mode must be one of {', '.join(SAMPLE_MODES)}, got {self.sample_mode!r}"
            )
        for name, high in (
            ("text_temperature", MAX_TEMPERATURE),
            ("audio_temperature", MAX_TEMPERATURE),
            ("audio_repetition_penalty", MAX_PENALTY),
        ):
            checked_number(name, getattr(self, name), 0.0, high, open_low=True)
        for name in ("text_top_p", "audio_top_p"):
            checked_number(name, getattr(self, name), 0.0, 1.0)
        for name in ("text_top_k", "audio_top_k"):
            checked_integer(name, getattr(self, name), 0, MAX_TOP_K)
        return self


def frame_uniforms(rng: np.random.Generator, channels: int) -> tuple[np.float32, np.ndarray]:
    """The fixed frame graph's draws: one for the continue decision, one per channel,
    clamped to [0, 0.99999994] and made float32 (1 + channels draws, in that order)."""
    draws = np.minimum(RANDOM_U_MAX, np.maximum(0.0, rng.random(1 + channels)))
    values = draws.astype(np.float32)
    return values[0], values[1:]


def softmax64(scores: np.ndarray) -> np.ndarray:
    """Row softmax in float64 of the float32 differences from each row's maximum."""
    top = scores.max(axis=-1, keepdims=True)
    exps = np.exp((scores - top).astype(np.float64))
    return exps / np.sum(exps, axis=-1, dtype=np.float64, keepdims=True)


def sample_rows(
    logits: np.ndarray,
    temperature: np.ndarray,
    top_k: np.ndarray,
    top_p: np.ndarray,
    draws: np.ndarray,
) -> np.ndarray:
    """One token per row of float32 `logits` [n, V] with per-row options and uniform `draws`
    [n] (float64 from each row's generator), as the published host sampler picks it."""
    scores = logits.astype(np.float32) / temperature.astype(np.float32)[:, None]
    vocab = scores.shape[1]
    rows = np.arange(len(scores))
    limited = (top_k > 0) & (top_k < vocab)
    if limited.any():
        ranked = -np.sort(-scores[limited], axis=-1)
        threshold = ranked[np.arange(len(ranked)), top_k[limited] - 1]
        part = scores[limited]
        part[part < threshold[:, None]] = -np.inf
        scores[limited] = part
    nucleus = (top_p > 0) & (top_p < 1)
    if nucleus.any():
        part = scores[nucleus]
        order = np.argsort(-part, axis=-1, kind="stable")
        ordered = np.take_along_axis(part, order, axis=-1)
        total = np.cumsum(softmax64(ordered), axis=-1)
        drop = np.zeros_like(total, dtype=bool)
        drop[:, 1:] = total[:, :-1] > top_p[nucleus][:, None]
        np.put_along_axis(part, order, np.where(drop, -np.inf, ordered), axis=-1)
        scores[nucleus] = part
    probabilities = softmax64(scores)
    remaining = np.subtract.accumulate(
        np.concatenate([draws.astype(np.float64)[:, None], probabilities], axis=1), axis=1
    )[:, 1:]
    reached = remaining <= 0
    first = reached.argmax(axis=1)
    return np.where(reached[rows, first], first, scores.argmax(axis=1))


def penalize(logits: np.ndarray, seen: np.ndarray, penalty: np.ndarray) -> np.ndarray:
    """float32 repetition penalty on the tokens marked in `seen` [n, V] (rows whose penalty is
    1 are left alone, as published)."""
    factor = penalty.astype(np.float32)[:, None]
    scaled = np.where(logits < 0, logits * factor, logits / factor)
    return np.where(seen & (penalty != 1.0)[:, None], scaled, logits).astype(np.float32)


def greedy_audio(logits: np.ndarray, seen: np.ndarray, penalty: np.ndarray) -> np.ndarray:
    """First argmax of the float64 scores with the penalty applied in float64."""
    scores = logits.astype(np.float64)
    factor = penalty.astype(np.float64)[:, None]
    scaled = np.where(scores < 0, scores * factor, scores / factor)
    return np.where(seen & (penalty != 1.0)[:, None], scaled, scores).argmax(axis=1)


__all__ = [
    "RANDOM_U_MAX",
    "MossSampling",
    "frame_uniforms",
    "greedy_audio",
    "penalize",
    "sample_rows",
    "softmax64",
]

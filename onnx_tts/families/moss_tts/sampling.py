"""MOSS-TTS sampling: the published options (text_* for channel 0 / the continue-stop head,
audio_* for the codebooks), their defaults from bundle.json, and each release's order.

  local-v1.5  `_sample_next_token`: penalty (the codes this chunk generated) -> temperature
              -> top-k -> top-p (nucleus) -> draw; greedy takes the argmax after the penalty;
              `greedy` turns sampling off for every channel (the published `do_sample`).
  local-v1    HF processors per channel: RepetitionPenalty (codebooks only, over the whole
              column: prompt and generated) -> Temperature -> TopK -> TopP (TopPLogitsWarper)
              -> draw; a channel whose temperature is 0 is greedy with no processor at all.
  delay       `sample_token` on logits already divided by the temperature: penalty (codebook 0
              its own column, codebooks 1.. the union of theirs, prompt included) -> top-k ->
              top-p (nucleus) -> draw; greedy after the penalty.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from onnx_tts.decoding.channel_sampling import SamplerSteps
from onnx_tts.errors import checked_integer, checked_number

STEPS = {
    "local-v1.5": SamplerSteps(("penalty", "temperature", "top_k", "top_p"), "nucleus", True),
    "local-v1": SamplerSteps(("penalty", "temperature", "top_k", "top_p"), "hf", False),
    "delay": SamplerSteps(("temperature", "penalty", "top_k", "top_p"), "nucleus", True),
}
MAX_TEMPERATURE = 100.0
MAX_TOP_K = 1 << 20
MAX_PENALTY = 100.0
NAMES = (
    "text_temperature",
    "text_top_p",
    "text_top_k",
    "audio_temperature",
    "audio_top_p",
    "audio_top_k",
    "audio_repetition_penalty",
)


@dataclass(frozen=True)
class MossSampling:
    """One request's sampling options (published names)."""

    greedy: bool = False
    text_temperature: float = 1.0
    text_top_p: float = 1.0
    text_top_k: int = 50
    audio_temperature: float = 1.7
    audio_top_p: float = 0.8
    audio_top_k: int = 25
    audio_repetition_penalty: float = 1.0

    @classmethod
    def from_defaults(cls, defaults: dict[str, Any]) -> MossSampling:
        return cls(**{f.name: defaults[f.name] for f in fields(cls) if f.name in defaults})

    def with_overrides(self, overrides: dict[str, Any]) -> MossSampling:
        return replace(self, **{k: v for k, v in overrides.items() if v is not None}).checked()

    def checked(self) -> MossSampling:
        for name in ("text_temperature", "audio_temperature"):
            checked_number(name, getattr(self, name), 0.0, MAX_TEMPERATURE)
        checked_number(
            "audio_repetition_penalty",
            self.audio_repetition_penalty,
            0.0,
            MAX_PENALTY,
            open_low=True,
        )
        for name in ("text_top_p", "audio_top_p"):
            checked_number(name, getattr(self, name), 0.0, 1.0)
        for name in ("text_top_k", "audio_top_k"):
            checked_integer(name, getattr(self, name), 0, MAX_TOP_K)
        return self

    def temperatures(self, variant: str) -> tuple[float, float]:
        """(text, audio) temperatures as the sampler takes them: 0 = greedy."""
        if self.greedy:
            return 0.0, 0.0
        if variant == "local-v1.5":  # do_sample is one flag; temperature 0 is refused there
            return self.text_temperature, self.audio_temperature
        return self.text_temperature, self.audio_temperature

    @property
    def sampled(self) -> bool:
        return not self.greedy and (self.text_temperature > 0 or self.audio_temperature > 0)


ROW_FIELDS = {
    "text_temperature": np.float64,
    "text_top_p": np.float64,
    "text_top_k": np.int64,
    "audio_temperature": np.float64,
    "audio_top_p": np.float64,
    "audio_top_k": np.int64,
    "audio_repetition_penalty": np.float64,
}


class RowSettings:
    """Sampling settings and random generators of up to `rows` requests (arrays by row)."""

    def __init__(self, rows: int) -> None:
        self.values = {name: np.zeros(rows, dtype) for name, dtype in ROW_FIELDS.items()}
        self.rngs: list[np.random.Generator | None] = [None] * rows

    def assign(
        self, row: int, sampling: MossSampling, variant: str, rng: np.random.Generator | None
    ) -> None:
        text, audio = sampling.temperatures(variant)
        for name in ROW_FIELDS:
            self.values[name][row] = getattr(sampling, name)
        self.values["text_temperature"][row] = text
        self.values["audio_temperature"][row] = audio
        self.rngs[row] = rng

    def get(self, name: str, rows: np.ndarray) -> np.ndarray:
        return self.values[name][rows]

    def draws(self, rows: np.ndarray, sampled: np.ndarray) -> np.ndarray:
        """One uniform per row of `rows` where `sampled` (in row order; 0 elsewhere)."""
        out = np.zeros(len(rows))
        for i in np.flatnonzero(sampled):
            rng = self.rngs[int(rows[i])]
            assert rng is not None, "a sampled row has no generator"
            out[i] = rng.random()
        return out


__all__ = ["NAMES", "STEPS", "MossSampling", "RowSettings"]

"""Text planning: everything a request gives is checked before any work, then split into the
chunks the model generates one by one (each becomes one `Request` of the scheduler)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnx_tts.decoding import SAMPLING_KEYS, SamplingOptions, check_seed
from onnx_tts.errors import InputError
from onnx_tts.families.base import Backend, Family
from onnx_tts.frontend import check_text
from onnx_tts.request import CancelToken, PlaybackClock, Request


@dataclass(frozen=True)
class Timing:
    """When a request's audio is due and who may cancel it (the same for all its chunks):
    `deadline` (monotonic seconds) for its first audio, the `clock` of a streamed request's
    player, a `priority` (lower first) and the `cancel` token its consumer holds."""

    deadline: float | None = None
    clock: PlaybackClock | None = None
    priority: int = 0
    cancel: CancelToken | None = None

    @staticmethod
    def now() -> float:
        return time.monotonic()


@dataclass(frozen=True)
class Plan:
    """A checked request: the family's text chunks, sampling (seed of chunk 0) and the
    family's request options with the model's defaults filled in."""

    chunks: list[Any]
    sampling: SamplingOptions
    options: dict[str, Any]

    def requests(
        self, voice: Mapping[str, np.ndarray], timing: Timing | None = None
    ) -> list[Request]:
        """One scheduler request per chunk (chunk i samples with seed + i); all share one
        cancel token, so cancelling the text stops every chunk."""
        timing = timing or Timing()
        cancel = timing.cancel or CancelToken()
        return [
            Request(
                chunk,
                voice,
                self.sampling.for_chunk(index),
                self.options,
                deadline=timing.deadline,
                clock=timing.clock,
                priority=timing.priority,
                cancel=cancel,
            )
            for index, chunk in enumerate(self.chunks)
        ]


class Planner:
    """Checks text, seed, sampling and the family's request options of one model."""

    def __init__(self, backend: Backend, family: Family) -> None:
        self.backend, self.family = backend, family

    def plan(self, text: str | bytes, seed: int | None, options: Mapping[str, Any]) -> Plan:
        """An unknown keyword is an InputError naming the valid ones; nothing runs before
        every value is checked."""
        text = check_text(text)
        sampling = {k: v for k, v in options.items() if k in SAMPLING_KEYS}
        family_options = {k: v for k, v in options.items() if k not in SAMPLING_KEYS}
        request_names = {o.name for o in self.family.options_in("request")}
        unknown = sorted(set(family_options) - request_names)
        if unknown:
            valid = sorted({*SAMPLING_KEYS, "seed", *request_names})
            raise InputError(
                f"unknown option(s) {', '.join(unknown)} for the {self.family.name} model; "
                f"valid: {', '.join(valid)}"
            )
        checked = self.backend.request_options(self.family.check_options(family_options, "request"))
        defaults = self.backend.sampling_defaults()
        plan = defaults.with_overrides({**sampling, "seed": check_seed(seed)})
        return Plan(self.backend.text_chunks(text, checked), plan, checked)


__all__ = ["Plan", "Planner", "Timing"]

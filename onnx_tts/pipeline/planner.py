"""Text planning: everything a request gives is checked before any work, then split into the
chunks the model generates one by one (each becomes one `Request` of the scheduler)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnx_tts.decoding import SAMPLING_KEYS, SamplingOptions, check_seed
from onnx_tts.decoding.request import CancelToken, PlaybackClock, Request
from onnx_tts.errors import InputError
from onnx_tts.families.base import ChunkOrder, Family, Model
from onnx_tts.frontend import check_text


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
    """A checked request: the family's text chunks, sampling (seed of chunk 0), the family's
    request options with the model's defaults filled in, and how the chunks are generated
    (`order`, the family's choice: see `Model.chunk_order`)."""

    chunks: list[Any]
    sampling: SamplingOptions
    options: dict[str, Any]
    order: ChunkOrder = "parallel"

    def requests(
        self, voice: Mapping[str, np.ndarray], timing: Timing | None = None
    ) -> list[Request]:
        """One scheduler request per chunk; all share one cancel token, so cancelling the text
        stops every chunk. Parallel order: chunk i samples with seed + i. Sequential order:
        every chunk draws, in order, from one generator seeded with the text's seed."""
        timing = timing or Timing()
        cancel = timing.cancel or CancelToken()
        shared = np.random.default_rng(self.sampling.seed) if self.sequential else None
        return [
            Request(
                chunk,
                voice,
                self.sampling if self.sequential else self.sampling.for_chunk(index),
                self.options,
                deadline=timing.deadline,
                clock=timing.clock,
                priority=timing.priority,
                cancel=cancel,
                generator=shared,
            )
            for index, chunk in enumerate(self.chunks)
        ]

    @property
    def sequential(self) -> bool:
        return self.order == "sequential"


class Planner:
    """Checks text, seed, sampling and the family's request options of one model."""

    def __init__(self, model: Model, family: Family) -> None:
        self.model, self.family = model, family

    def plan(self, text: str | bytes, seed: int | None, options: Mapping[str, Any]) -> Plan:
        """An unknown keyword is an InputError naming the valid ones; nothing runs before
        every value is checked."""
        text = check_text(text)
        honoured = self.model.sampling_keys
        sampling = {k: v for k, v in options.items() if k in honoured}
        family_options = {k: v for k, v in options.items() if k not in honoured}
        request_names = {o.name for o in self.family.options_in("request")}
        unknown = sorted(set(family_options) - request_names)
        if unknown:
            valid = sorted({*honoured, "seed", *request_names})
            ignored = [k for k in unknown if k in SAMPLING_KEYS]
            why = (
                f" (it samples with options of its own: {', '.join(sorted(request_names))})"
                if ignored
                else ""
            )
            raise InputError(
                f"unknown option(s) {', '.join(unknown)} for the {self.family.name} model{why}; "
                f"valid: {', '.join(valid)}"
            )
        checked = self.model.request_options(self.family.check_options(family_options, "request"))
        defaults = self.model.sampling_defaults()
        plan = defaults.with_overrides({**sampling, "seed": check_seed(seed)})
        chunks = self.model.text.chunks(text, checked)
        return Plan(chunks, plan, checked, self.model.chunk_order(checked))


__all__ = ["Plan", "Planner", "Timing"]

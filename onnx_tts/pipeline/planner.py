"""Text planning: everything a request gives is checked before any work, then split into the
chunks the model generates one by one (each becomes one `Request` of the scheduler).

A text may carry markup (SSML when it starts with <speak> or `ssml=True`; inline
``[[ phonemes ]]`` otherwise): its text goes through the family's chunking, its phonemes to
models that take them, its breaks become the pauses after chunks and its prosody rates each
chunk's speed (times the request's `speed`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnx_tts.decoding import SAMPLING_KEYS, SamplingOptions, check_seed
from onnx_tts.decoding.request import CancelToken, PlaybackClock, Request, checked_timing
from onnx_tts.errors import InputError, checked_number
from onnx_tts.families.base import ChunkOrder, Family, Model
from onnx_tts.frontend import Break, Phonemes, Text, check_text, is_ssml, parse_markup
from onnx_tts.frontend.ssml import MAX_TOTAL_BREAK_SECONDS
from onnx_tts.pipeline.timestretch import MAX_SPEED, MIN_SPEED

# Silence a request may ask for between its sentences (`sentence_silence`), seconds.
MAX_SENTENCE_SILENCE = 10.0
# Texts up to this long are planned one at a time per model. Planning is Python under one GIL
# (the phonemizer's library under its own lock): a burst of texts planned at once only
# interleaves, so each finished as late as the last (8 clients starting together: every text
# took 6-19 ms instead of ~1.3 ms, and the slowest stream's first audio came ~15 ms later). A
# longer text plans beside them: it would hold the short ones up for its whole planning.
SERIAL_PLAN_CHARS = 1000


@dataclass(frozen=True)
class Timing:
    """When a request's audio is due and who may cancel it (the same for all its chunks):
    `deadline` (monotonic seconds) for its first audio, the `clock` of a streamed request's
    player, a `priority` (lower first) and the `cancel` token its consumer holds."""

    deadline: float | None = None
    clock: PlaybackClock | None = None
    priority: int = 0
    cancel: CancelToken | None = None

    def __post_init__(self) -> None:
        """Checked at the call: the scheduler's worker orders and stops requests by these, so
        a bad one must never reach it (InputError naming it)."""
        deadline, priority = checked_timing(self.deadline, self.priority, self.cancel, self.clock)
        object.__setattr__(self, "deadline", deadline)
        object.__setattr__(self, "priority", priority)

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
    # Per chunk: its speed (1 = as the model speaks), and the silence after it in seconds
    # (None: the vocoder's pause rule between chunks, none after the last); `lead`: silence
    # before the first chunk (a text that starts with a break).
    rates: tuple[float, ...] = ()
    pauses: tuple[float | None, ...] = ()
    lead: float = 0.0
    timestamps: bool = False

    def requests(
        self,
        voice: Mapping[str, np.ndarray],
        timing: Timing | None = None,
        prime: np.ndarray | None = None,
    ) -> list[Request]:
        """One scheduler request per chunk; all share one cancel token, so cancelling the text
        stops every chunk. Parallel order: chunk i samples with seed + i. Sequential order:
        every chunk draws, in order, from one generator seeded with the text's seed. `prime`:
        the frames each chunk's vocoding starts from (`Vocoder.prime_frames`)."""
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
                marks=[] if self.timestamps else None,
                prime=prime,
            )
            for index, chunk in enumerate(self.chunks)
        ]

    def rate(self, index: int) -> float:
        return self.rates[index] if self.rates else 1.0

    def pause_after(self, index: int) -> float | None:
        """Seconds of silence after chunk `index`, or None for the vocoder's rule (which
        applies between chunks only)."""
        return self.pauses[index] if self.pauses else None

    def key(self) -> dict[str, Any]:
        """What of the plan besides its chunks, sampling and options changes the audio (none
        for the model's own pace and pauses: such a text's key is its chunks', so a one-chunk
        text and the same sentence stored from a longer text are one entry)."""
        plain = all(r == 1.0 for r in self.rates) and all(p is None for p in self.pauses)
        if plain and not self.lead:
            return {}
        return {"rates": self.rates, "pauses": self.pauses, "lead": self.lead}

    @property
    def sequential(self) -> bool:
        return self.order == "sequential"


class Planner:
    """Checks text, seed, sampling and the family's request options of one model."""

    def __init__(self, model: Model, family: Family) -> None:
        self.model, self.family = model, family
        self._one_text = threading.Lock()  # (see SERIAL_PLAN_CHARS)

    def plan(
        self,
        text: str | bytes,
        seed: int | None,
        options: Mapping[str, Any],
        *,
        ssml: bool | None = None,
        speed: float = 1.0,
        sentence_silence: float | None = None,
        timestamps: bool = False,
    ) -> Plan:
        """An unknown keyword is an InputError naming the valid ones; nothing runs before
        every value is checked (markup included: invalid SSML names its position)."""
        text = check_text(text)
        speed = checked_number("speed", speed, MIN_SPEED, MAX_SPEED)
        if sentence_silence is not None:
            sentence_silence = checked_number(
                "sentence_silence", sentence_silence, 0.0, MAX_SENTENCE_SILENCE
            )
        if ssml not in (None, True, False):
            raise InputError(f"ssml must be true, false or unset, got {ssml!r}")
        if not isinstance(timestamps, bool):
            raise InputError(f"timestamps must be true or false, got {timestamps!r}")
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
        serial = self._one_text if len(text) <= SERIAL_PLAN_CHARS else nullcontext()
        with serial:
            chunks, rates, pauses, lead = self._chunks(text, checked, ssml, speed, sentence_silence)
        return Plan(
            chunks,
            plan,
            checked,
            self.model.chunk_order(checked),
            tuple(rates),
            tuple(pauses),
            lead,
            timestamps,
        )

    def _chunks(
        self,
        text: str,
        options: Mapping[str, Any],
        ssml: bool | None,
        speed: float,
        sentence_silence: float | None,
    ) -> tuple[list[Any], list[float], list[float | None], float]:
        """The chunks of a text's segments, each chunk's rate and the pause after it."""
        frontend = self.model.text
        chunks: list[Any] = []
        rates: list[float] = []
        pauses: list[float | None] = []
        lead = 0.0
        segments = parse_markup(text, ssml)  # (checks the spans of a plain text too)
        if frontend.reads_phoneme_spans and not (ssml or (ssml is None and is_ssml(text))):
            segments = (Text(text),)  # the frontend places its [[ ]] spans itself
        for segment in segments:
            if isinstance(segment, Break):
                if not chunks:
                    lead += segment.seconds
                else:
                    pauses[-1] = (pauses[-1] or 0.0) + segment.seconds
                continue
            if isinstance(segment, Phonemes):
                made = frontend.phoneme_chunks(segment.ipa, segment.text, options)
                if made is None:
                    if not segment.text:
                        raise InputError(
                            f"the {self.family.name} model takes words, not phonemes: write the "
                            f"words of [[ {segment.ipa} ]] instead"
                        )
                    made = frontend.chunks(segment.text, options)
            elif sentence_silence is not None:  # a silence between sentences: one each
                made = frontend.sentence_chunks(segment.text, options)
            else:
                made = frontend.chunks(segment.text, options)
            for chunk in made:
                if chunks and pauses[-1] is None and sentence_silence is not None:
                    pauses[-1] = sentence_silence
                chunks.append(chunk)
                rates.append(min(MAX_SPEED, max(MIN_SPEED, speed * segment.rate)))
                pauses.append(None)
        if not chunks:
            raise InputError("text has nothing speakable: its markup holds no words")
        asked = round(lead + sum(p for p in pauses if p is not None), 6)
        if asked > MAX_TOTAL_BREAK_SECONDS:
            raise InputError(
                f"the text asks for {asked:g} s of silence in all (its breaks and "
                f"sentence_silence between its {len(chunks)} sentences); at most "
                f"{MAX_TOTAL_BREAK_SECONDS:g} s: lower sentence_silence or split the text"
            )
        return chunks, rates, pauses, lead


__all__ = ["Plan", "Planner", "Timing"]

"""What a model family is to the engine: its registry entry (`Family`: detection, options,
manifest sections, loader) and the `Backend` a loaded model provides."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from onnx_tts.decoding import DecodeProgram, KVPool, SamplingOptions
from onnx_tts.encoder import VoiceEncoder
from onnx_tts.errors import InputError
from onnx_tts.session import SessionOptions

Scope = Literal["load", "request", "both"]


@dataclass(frozen=True)
class Option:
    """One family option: given to `onnx_tts.load()` (scope "load"), to each
    `synthesize()`/`stream()` call ("request"), or to either ("both"); the CLI makes a flag
    `--name-with-dashes` of it."""

    name: str
    kind: type  # bool, int, float or str
    help: str
    scope: Scope = "load"
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def parse(self, value: Any) -> Any:
        """`value` checked against the option's type and range; InputError naming the option."""
        if self.kind is bool:
            if not isinstance(value, bool):
                raise InputError(f"{self.name} must be true or false, got {value!r}")
            return value
        if self.kind is str:
            if not isinstance(value, str) or not value:
                raise InputError(f"{self.name} must be a non-empty string, got {value!r}")
            if self.choices and value not in self.choices:
                raise InputError(
                    f"{self.name} must be one of {', '.join(self.choices)}, got {value!r}"
                )
            return value
        if self.kind is int and (
            isinstance(value, bool) or not isinstance(value, numbers.Integral)
        ):
            raise InputError(f"{self.name} must be an integer, got {value!r}")
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise InputError(f"{self.name} must be a number, got {value!r}")
        number = self.kind(value)
        if not math.isfinite(number) or (
            (self.low is not None and number < self.low)
            or (self.high is not None and number > self.high)
        ):
            raise InputError(f"{self.name} must be in [{self.low:g}, {self.high:g}], got {value!r}")
        return number


@dataclass(frozen=True)
class Detection:
    """What detection found in a model directory: the family and what it inspected to decide
    (the parsed bundle manifest, or a third-party layout with its graph specs), so the
    loader reads nothing twice."""

    family: str
    root: Path
    inspected: Any


Stage = Literal["decode", "vocoder", "encoder"]


@dataclass(frozen=True)
class LoadSettings:
    """Settings every family takes from `onnx_tts.load()`. `stage_threads` (when set) gives
    each stage's sessions their intra-op threads, so the stages that run at once do not
    oversubscribe the cores: `options_for(stage)`."""

    kv: str | None = None
    session_options: SessionOptions = field(default_factory=SessionOptions)
    stage_threads: Mapping[str, int] | None = None

    def options_for(self, stage: Stage) -> SessionOptions:
        """The session options of a graph of `stage` (decode: the LM and what each step
        runs; vocoder; encoder: reference voices)."""
        if self.stage_threads is None or stage not in self.stage_threads:
            return self.session_options
        return replace(self.session_options, intra_op_threads=self.stage_threads[stage])


class Backend(Protocol):
    """A loaded model, as the engine drives it."""

    family: str
    sample_rate: int
    hop_length: int  # samples per generated frame (streaming windows count frames)
    kv_mode: str
    streaming_defaults: Mapping[str, int]
    encoder: VoiceEncoder
    program: DecodeProgram
    pool: KVPool

    def info(self) -> dict[str, Any]: ...
    def default_voice(self) -> dict[str, np.ndarray]: ...
    def sampling_defaults(self) -> SamplingOptions: ...
    def request_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """Per-request family options, checked, with the model's defaults filled in."""
        ...

    def text_chunks(self, text: str, options: Mapping[str, Any]) -> list[Any]: ...
    def vocode(self, frames: np.ndarray, voice: Mapping[str, np.ndarray]) -> np.ndarray: ...

    # Optional: `vocode_windows(windows, voices) -> list[np.ndarray]`, several streams' windows
    # in fewer runs, equal to vocoding each alone (the vocoder stage batches with it).
    # Optional: `open_stream() -> decoder` (`push(frames) -> samples`, `close()`), a streaming
    # decoder with its own state, one per stream (fed new frames only); `channels` (audio is
    # [N, channels] when > 1); `pause_seconds(chunk)`, the silence after a chunk; `voice(voice,
    # cache)`, the family's own voice resolution (builtin names, multichannel references).


Loader = Callable[[Detection, LoadSettings, Mapping[str, Any]], Backend]


@dataclass(frozen=True)
class Family:
    """A registry entry: everything the engine and the CLI need to know about a family."""

    name: str
    summary: str
    loader: Loader
    options: tuple[Option, ...] = ()
    # Sections its bundle.json must have; None for third-party layouts without a manifest.
    manifest_sections: tuple[str, ...] | None = None

    def option(self, name: str) -> Option | None:
        return next((option for option in self.options if option.name == name), None)

    def options_in(self, scope: Literal["load", "request"]) -> tuple[Option, ...]:
        return tuple(o for o in self.options if o.scope in (scope, "both"))

    def check_options(
        self, given: Mapping[str, Any], scope: Literal["load", "request"]
    ) -> dict[str, Any]:
        """`given` (None values dropped) checked against this family's options of `scope`;
        InputError naming the options it does take for anything else."""
        allowed = {o.name: o for o in self.options_in(scope)}
        present = {k: v for k, v in given.items() if v is not None}
        unknown = sorted(set(present) - set(allowed))
        if unknown:
            takes = ", ".join(sorted(allowed)) if allowed else "none"
            where = "at load time" if scope == "load" else "per request"
            raise InputError(
                f"the {self.name} model takes no option {', '.join(unknown)}; options it "
                f"takes {where}: {takes}"
            )
        return {name: allowed[name].parse(value) for name, value in present.items()}


__all__ = [
    "Backend",
    "Detection",
    "Family",
    "LoadSettings",
    "Loader",
    "Option",
]

"""The family contract: what a model family is to the engine.

A family is a registry entry (`Family`: name, options, manifest sections, loader) whose loader
returns a `Model` built from typed parts, each with one job:

    Model
      text     TextFrontend  normalise and chunk a text into what the LM generates one by one
      voices   Voices        the default voice, builtin names, reading a reference file, and the
                             reference encoder (canonical batch of 1, through the reference cache)
      program  DecodeProgram prefill, what one step consumes and emits per row, stop rules
               (or a DirectProgram: all of a chunk's frames in one call, no decode loop)
      vocoder  Vocoder       frames -> samples, with its capabilities declared
                             (`VocoderCapabilities`: rate, channels, hop, exact batching,
                             a state per stream) and its pause rule between chunks
      graphs   LoadedGraphs  sessions, the KV mode and the KV pool, built once by the shared
                             loader (`families/loader.py`) for every family

and whose `files` declare, for the offline tools, what a detected model's files are
(`ModelFiles`, families/files.py: data only).

The engine, the CLI, the server and Wyoming use only these parts: nothing is probed, no family
is named outside `families/`.
"""

from __future__ import annotations

import math
import numbers
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from onnx_tts.audio import load_audio
from onnx_tts.cache.result import directory_hashes
from onnx_tts.decoding import SAMPLING_KEYS, DecodeProgram, KVPool, SamplingOptions
from onnx_tts.decoding.direct import DirectProgram
from onnx_tts.encoder import VoiceEncoder
from onnx_tts.errors import AudioError, InputError, checked_number, shown
from onnx_tts.families.files import ModelFiles
from onnx_tts.families.loader import LoadedGraphs, LoadSettings, Stage
from onnx_tts.frontend.sentences import UNIT_SPACE
from onnx_tts.graph_io import KVLayout

Scope = Literal["load", "request", "both"]
# How the chunks of one text are generated: "parallel" gives chunk i the seed + i and decodes
# all chunks as rows at once; "sequential" decodes them one after another with one random
# generator for the whole text (as a published runtime may do).
ChunkOrder = Literal["parallel", "sequential"]
# Pause between two chunks generated separately, unless the vocoder has its own rule.
SENTENCE_PAUSE_SECONDS = 0.15
# An encoded voice given as a dict: at most this many values per array.
MAX_VOICE_VALUES = 1 << 24


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
                raise InputError(f"{self.name} must be true or false, got {shown(value)}")
            return value
        if self.kind is str:
            if not isinstance(value, str) or not value:
                raise InputError(f"{self.name} must be a non-empty string, got {shown(value)}")
            if self.choices and value not in self.choices:
                raise InputError(
                    f"{self.name} must be one of {', '.join(self.choices)}, got {shown(value)}"
                )
            return value
        low = -math.inf if self.low is None else self.low
        high = math.inf if self.high is None else self.high
        if self.kind is int:
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise InputError(f"{self.name} must be an integer, got {shown(value)}")
            if not low <= value <= high:  # (exact for integers of any size)
                raise InputError(
                    f"{self.name} must be an integer in [{low:g}, {high:g}], got {shown(value)}"
                )
            return int(value)
        return checked_number(self.name, value, low, high)


@dataclass(frozen=True)
class Detection:
    """What detection found in a model directory: the family and what it inspected to decide
    (the parsed bundle manifest, or a third-party layout with its graph specs), so the
    loader reads nothing twice."""

    family: str
    root: Path
    inspected: Any


# -- the parts ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class WordSpan:
    """A word of a chunk as it is spoken. When the family's program aligns its frames to text
    positions (it appends each frame's position to `Request.marks`), `first`/`last` are the
    positions [first, last) the word covers and its timing is exact; otherwise `weight` (e.g.
    its letters) shares out the chunk's duration and the timing is an estimate."""

    text: str
    first: int | None = None
    last: int | None = None
    weight: float = 1.0
    written: str = ""  # as the sentence writes it, punctuation included (captions); "" = text
    joins_next: bool = False  # it and the next word are one spoken unit ("nine" "thirty")


_WORD_RE = re.compile(r"(\S+)(\s*)")
_AROUND_WORDS = ".,;:!?\"'()[]{}"


def spoken_words(text: str) -> list[WordSpan]:
    """The words of `text` (punctuation around them dropped; kept in `written`), weighted by
    their letters. Words the reader joined as one spoken unit (`normalize_text(...,
    keep_units=True)`: a number, a time, an amount) say so in `joins_next`; punctuation
    standing alone ("-", "—") is written with the word before it."""
    words: list[WordSpan] = []
    lead = ""
    for match in _WORD_RE.finditer(text):
        token, space = match.groups()
        joins = bool(space) and not space.strip(UNIT_SPACE)
        word = token.strip(_AROUND_WORDS)
        if not any(ch.isalnum() for ch in word):  # punctuation on its own
            if words:
                last = words[-1]
                words[-1] = replace(
                    last,
                    written=f"{last.written} {token}",
                    joins_next=last.joins_next and joins,
                )
            else:
                lead += token + " "
            continue
        words.append(
            WordSpan(word, weight=max(1, len(word)), written=lead + token, joins_next=joins)
        )
        lead = ""
    return words


class TextFrontend(ABC):
    """A family's text: normalisation and the chunks its LM generates one by one.

    `reads_phoneme_spans`: a plain text (not SSML) goes to `chunks` whole, its ``[[ ]]``
    phoneme spans included, for a frontend that places them itself (inside the sentence
    around them); otherwise each span is a chunk of its own (`phoneme_chunks`)."""

    reads_phoneme_spans: bool = False

    @abstractmethod
    def chunks(self, text: str, options: Mapping[str, Any]) -> list[Any]:
        """`text` (checked) as chunks, each one request of the scheduler; InputError when
        nothing in it is speakable. `options`: the request's family options (checked)."""

    def sentence_chunks(self, text: str, options: Mapping[str, Any]) -> list[Any]:
        """`text` as chunks that never hold two sentences (a request with a silence of its own
        between sentences: `sentence_silence`). By default `chunks()`, whose chunks are
        sentences (or pieces of a long one); a family that joins sentences into one chunk
        keeps them apart here."""
        return self.chunks(text, options)

    def phoneme_chunks(self, ipa: str, text: str, options: Mapping[str, Any]) -> list[Any] | None:
        """IPA phonemes to speak as given (`text`: what they stand for) as chunks, or None when
        the model takes no phonemes (its words are then spoken from `text`)."""
        return None

    def describe(self, chunk: Any) -> str:
        """A chunk as it reads (error messages quote it; captions show its words)."""
        return chunk if isinstance(chunk, str) else ""

    def words(self, chunk: Any) -> list[WordSpan]:
        """The words of `chunk` for word timings: by default estimated from its text."""
        return spoken_words(self.describe(chunk))


class Voices:
    """A family's voices: its default, builtin voices by name, how a reference file is read,
    and the reference encoder. The engine resolves every voice through these (see
    `pipeline/voices.py`): an encode goes through the canonical batch-of-1 reference cache.

    `channels`: the channels a reference file is read with (1: mono samples [N]; 2: [2, N],
    a mono file duplicated); `min_seconds` / `max_seconds`: the reference's bounds."""

    def __init__(
        self,
        encoder: VoiceEncoder,
        default: Callable[[], dict[str, np.ndarray]],
        builtin: Mapping[str, Mapping[str, np.ndarray]] | None = None,
        channels: int = 1,
    ) -> None:
        self.encoder = encoder
        self._default = default
        self.builtin = dict(builtin or {})
        self.channels = channels

    @property
    def names(self) -> tuple[str, ...]:
        """Builtin voice names, in the model's order."""
        return tuple(self.builtin)

    def default(self) -> dict[str, np.ndarray]:
        return self._default()

    def read(self, path: str | os.PathLike[str]) -> np.ndarray:
        """A reference file as the encoder takes it: mono samples [N] (or [channels, N]) at
        the encoder's rate, cut to its longest reference; AudioError saying what is wrong."""
        encoder = self.encoder
        samples = load_audio(
            path,
            encoder.sample_rate,
            min_seconds=encoder.min_seconds,
            max_seconds=encoder.max_seconds,
            channels=self.channels,
        )
        return samples if samples.ndim == 1 else np.ascontiguousarray(samples.T)

    def check_encoded(self, voice: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """An already-encoded voice (a dict `Engine.voice()` returned), checked: the encoder's
        outputs, numeric, finite, bounded in size."""
        expected = set(self.encoder.output_names)
        missing = sorted(expected - set(voice))
        if missing:
            raise AudioError(
                f"encoded voice lacks {', '.join(missing)} (this model's encoder gives "
                f"{', '.join(sorted(expected))}); pass a file or samples, or a dict that "
                "Engine.voice() returned for this model"
            )
        arrays: dict[str, np.ndarray] = {}
        for name in sorted(expected):
            try:
                array = np.asarray(voice[name])
            except (TypeError, ValueError):
                array = np.asarray(None)
            if array.dtype.kind not in "iuf" or array.size > MAX_VOICE_VALUES:
                raise AudioError(f"encoded voice value {name!r} is not a numeric array")
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                raise AudioError(f"encoded voice value {name!r} holds NaN or infinite numbers")
            arrays[name] = array
        return arrays


@dataclass(frozen=True)
class VocoderCapabilities:
    """What the engine may rely on from a family's vocoder.

    sample_rate, hop_length (samples per generated frame), channels (audio is [N] when 1,
    [N, channels] otherwise); batches_exactly: `vocode_windows` decodes several streams'
    windows in fewer runs and each comes out as it would alone; stateful_streams:
    `open_stream()` gives a decoder with a state of its own per stream, fed new frames only
    (no overlap, hold-back or crossfade needed)."""

    sample_rate: int
    hop_length: int
    channels: int = 1
    batches_exactly: bool = False
    stateful_streams: bool = False


class StreamDecoder(Protocol):
    """A stateful streaming decoder of one stream (`Vocoder.open_stream`)."""

    def push(self, frames: np.ndarray) -> np.ndarray: ...
    def close(self) -> None: ...


class Vocoder(ABC):
    """Frames -> samples, with declared capabilities (`VocoderCapabilities`)."""

    capabilities: VocoderCapabilities

    @abstractmethod
    def vocode(self, frames: np.ndarray, voice: Mapping[str, np.ndarray]) -> np.ndarray:
        """All frames of one chunk [F, ...] -> samples ([N] or [N, channels] float32)."""

    def vocode_windows(
        self, windows: Sequence[np.ndarray], voices: Sequence[Mapping[str, np.ndarray]]
    ) -> list[np.ndarray]:
        """Several streams' windows, each decoded as `vocode` would (a vocoder whose
        capabilities say `batches_exactly` does it in fewer runs)."""
        return [self.vocode(window, voice) for window, voice in zip(windows, voices, strict=True)]

    def open_stream(self) -> StreamDecoder:
        """A decoder with its own state for one stream (only when `stateful_streams`)."""
        raise NotImplementedError(f"{type(self).__name__} has no stateful streaming decoder")

    # Priming: speech that continues a reference's (its frames decoded first, their audio
    # dropped). A vocoder that primes has `stateful_streams`; the others keep these defaults.
    def prime_frames(
        self, voice: Mapping[str, np.ndarray], options: Mapping[str, Any]
    ) -> np.ndarray | None:
        """The frames a request with this voice and these (checked) family options is primed
        with, or None (the default: no priming); InputError when the options ask for priming
        the voice cannot give. Called before any work."""
        return None

    def open_primed_stream(self, prime: np.ndarray) -> StreamDecoder:
        """`open_stream()` whose state has decoded `prime` first (that audio dropped)."""
        raise InputError(f"{type(self).__name__} cannot continue from frames given before")

    def vocode_after(
        self, prime: np.ndarray, frames: np.ndarray, voice: Mapping[str, np.ndarray]
    ) -> np.ndarray:
        """All frames of one chunk as they sound after `prime` (the one-shot priming)."""
        raise InputError(f"{type(self).__name__} cannot continue from frames given before")

    def unheard_frames(self, prime: np.ndarray) -> int:
        """How many of a primed chunk's first frames are decoded but not heard (their audio
        dropped too: a model whose first frames complete the prime's last ones). Default 0."""
        return 0

    def whole_chunks(self, options: Mapping[str, Any]) -> bool:
        """Whether a request with these (checked) family options is vocoded with all of its
        chunk's frames at once even when streamed, because its samples depend on the whole
        chunk (e.g. scaled to the chunk's peak). Default: never (windows as they are due)."""
        return False

    def pause_seconds(self, chunk: Any) -> float:
        """Silence after `chunk` when another chunk follows (the family's pause rule)."""
        return SENTENCE_PAUSE_SECONDS


class Model:
    """A loaded family: its typed parts (module docstring) plus what is the family's own to
    say about requests: sampling defaults, request options, and a description (`info`).

    Subclasses pass every part to `__init__` and override `sampling_defaults`,
    `request_options` and `info` where the family has more to say. `sampling_keys`: the
    generic sampling options (temperature, top_k, top_p, repetition_penalty) the family's
    program honours; a family that samples with options of its own takes none of them, and a
    request that gives one is refused rather than silently ignored."""

    sampling_keys: tuple[str, ...] = SAMPLING_KEYS

    def __init__(
        self,
        *,
        family: str,
        text: TextFrontend,
        voices: Voices,
        program: DecodeProgram | DirectProgram,
        vocoder: Vocoder,
        graphs: LoadedGraphs,
        streaming_defaults: Mapping[str, int],
    ) -> None:
        self.family = family
        self.text = text
        self.voices = voices
        self.program = program
        self.vocoder = vocoder
        self.graphs = graphs
        self.streaming_defaults = dict(streaming_defaults)
        self._file_hashes: dict[str, str] | None = None

    # -- what the parts say ----------------------------------------------------------------
    @property
    def capabilities(self) -> VocoderCapabilities:
        return self.vocoder.capabilities

    @property
    def sample_rate(self) -> int:
        return self.vocoder.capabilities.sample_rate

    @property
    def hop_length(self) -> int:
        return self.vocoder.capabilities.hop_length

    @property
    def channels(self) -> int:
        return self.vocoder.capabilities.channels

    @property
    def kv_mode(self) -> str:
        return self.graphs.kv_mode

    @property
    def kv(self) -> KVLayout | None:
        """The step LM's KV layout (None without a step LM)."""
        return self.graphs.kv

    @property
    def pool(self) -> KVPool | None:
        return self.graphs.pool

    @property
    def encoder(self) -> VoiceEncoder:
        return self.voices.encoder

    # -- the family's own ------------------------------------------------------------------
    def sampling_defaults(self) -> SamplingOptions:
        return SamplingOptions().checked()

    def request_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """Per-request family options (already checked against the option table), with the
        model's defaults filled in; options this returned come back unchanged."""
        return dict(options)

    def chunk_order(self, options: Mapping[str, Any]) -> ChunkOrder:
        """How the chunks of one request (its checked `options`) are generated: "parallel"
        (chunk i seeded with seed + i, all chunks decoding as rows at once) or "sequential"
        (one after another, drawing from one generator seeded with the text's seed)."""
        return "parallel"

    def info(self) -> dict[str, Any]:
        return {"family": self.family, "sample_rate": self.sample_rate, "kv_mode": self.kv_mode}

    def file_hashes(self) -> dict[str, str]:
        """sha256 of the model's files by relative path (part of the result cache's model
        identity): by default every model file under `info()["path"]`, hashed once."""
        if self._file_hashes is None:
            root = self.info().get("path")
            self._file_hashes = directory_hashes(root) if root and Path(root).is_dir() else {}
        return self._file_hashes

    def close(self) -> None:
        """Free what the model holds beyond its sessions (nothing by default)."""


@dataclass(frozen=True)
class FolderModel:
    """One model of a folder that holds many (`ModelFolder`), as a client is told of it before
    it is loaded: its name, what `--model` would take, its languages and its speakers."""

    name: str
    path: Path
    languages: tuple[str, ...]
    speakers: tuple[str, ...] = ()
    description: str = ""
    sample_rate: int = 0


@dataclass(frozen=True)
class ModelFolder:
    """A folder a family's users keep many models in (each file its own model): the servers'
    flag that names it (`--option`, `ONNX_TTS_OPTION`) and how its models are listed."""

    option: str
    help: str
    scan: Callable[[Path], list[FolderModel]]

    @property
    def flag(self) -> str:
        return "--" + self.option.replace("_", "-")


Loader = Callable[[Detection, LoadSettings, Mapping[str, Any]], Model]
# A detected model's files, declared for the offline tools (families/files.py).
FilesOf = Callable[[Detection], ModelFiles]


@dataclass(frozen=True)
class Family:
    """A registry entry: everything the engine, the CLI and the offline tools need to know
    about a family."""

    name: str
    summary: str
    loader: Loader
    options: tuple[Option, ...] = ()
    # Sections its bundle.json must have; None for third-party layouts without a manifest.
    manifest_sections: tuple[str, ...] | None = None
    # Its model files for `convert` and `quantize`; None: the tools cannot rewrite it.
    files: FilesOf | None = None
    # A folder of many of its models the servers can serve (`ModelFolder`), if its users keep one.
    folder: ModelFolder | None = None

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
    "MAX_VOICE_VALUES",
    "SENTENCE_PAUSE_SECONDS",
    "ChunkOrder",
    "Detection",
    "Family",
    "FilesOf",
    "FolderModel",
    "LoadSettings",
    "Loader",
    "Model",
    "ModelFiles",
    "ModelFolder",
    "Option",
    "Stage",
    "StreamDecoder",
    "TextFrontend",
    "Vocoder",
    "VocoderCapabilities",
    "Voices",
    "WordSpan",
    "spoken_words",
]

"""MOSS-Audio-Tokenizer (v1: 24 kHz mono, v2: 48 kHz stereo) as `onnx-tts export` writes it
(export/moss_audio_tokenizer): `codec.json` and three graphs.

    encode.onnx       waveform f32 [B, C, N] -> audio_codes i64 [Q, B, N // hop]
    decode.onnx       audio_codes i64 [Q, B, F] -> audio f32 [B, C, F * hop]
    decode_step.onnx  new frames' audio_codes [Q, B, S] + one stream's state -> audio
                      [B, C, S * hop] + the next state (named in codec.json's `state`)

`codec.json` is read once, bounded and checked (every file directly inside the directory,
every graph's declared I/O what this module feeds it, the state at most MAX_STATE_BYTES).
`AudioTokenizerCodec` runs the loaded sessions: the canonical reference encode (batch of 1,
floor(N / hop) frames, as published), one-shot decode, and streams that each keep their own
state, chained in the core from step to step (no copy).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from onnx_tts.audio import check_finite
from onnx_tts.errors import AudioError, InputError, ModelError
from onnx_tts.families.json_meta import JsonFile, checked_number, inside, listed_graph
from onnx_tts.families.loader import Graph
from onnx_tts.graph_io import GraphSpec, check_graph_io
from onnx_tts.regular_files import real_path
from onnx_tts.session import LazySession, Session, StateChain
from onnx_tts.state_streams import ChainedStream, StatePool

CODEC_JSON = "codec.json"
FORMAT_VERSION = 1
ROLES = ("encode", "decode", "decode_step")
EXPORT_HINT = "export the codec again with `onnx-tts export` (its check report is in codec.json)"
MAX_JSON_BYTES = 4 << 20
MAX_QUANTIZERS = 256
MAX_CODEBOOK = 1 << 20
MAX_HOP = 1 << 20
MAX_SAMPLE_RATE = 768_000
MAX_STATE_TENSORS = 4096
MAX_STATE_DIM = 1 << 22
MAX_STATE_BYTES = 4 << 30  # per stream; the published v1 decoder keeps ~170 MB
MAX_WHOLE_FRAMES = 1 << 16
# A reference encode attends over its whole length (memory grows with its square).
MAX_ENCODE_SECONDS = 60.0
STATE_DTYPES = ("float32", "int64")
# The published processors bring a reference to -20 dBFS, gain clamped to +-3 dB.
LOUDNESS_TARGET_DBFS = -20.0
LOUDNESS_GAIN_DB = 3.0


@dataclass(frozen=True)
class StateSpec:
    """One tensor of a stream's state: its input and output names, dtype, shape (batch 1)
    and the value a fresh stream starts from."""

    input: str
    output: str
    dtype: np.dtype
    shape: tuple[int, ...]
    fill: float

    def initial(self) -> np.ndarray:
        return np.full(self.shape, self.fill, self.dtype)


@dataclass(frozen=True)
class CodecLayout:
    """codec.json, typed and checked, with the declared I/O of its graphs."""

    root: Path
    sample_rate: int
    channels: int
    hop_length: int
    quantizers: int
    codebook_size: int
    whole_decode_frames: int
    graphs: Mapping[str, GraphSpec]
    data: Mapping[str, tuple[str, ...]]  # graph file -> its external-data files
    state: tuple[StateSpec, ...]

    @property
    def frame_rate(self) -> float:
        return self.sample_rate / self.hop_length

    @property
    def state_bytes(self) -> int:
        return sum(math.prod(s.shape) * s.dtype.itemsize for s in self.state)


def _state_specs(meta: JsonFile) -> tuple[StateSpec, ...]:
    entries = meta.get("state")
    if not isinstance(entries, list) or not 1 <= len(entries) <= MAX_STATE_TENSORS:
        raise ModelError(f"{meta.path}: state must list 1 to {MAX_STATE_TENSORS} tensors")
    specs, names = [], set()
    for index, entry in enumerate(entries):
        where = f"{meta.path}: state[{index}]"
        if not isinstance(entry, dict):
            raise ModelError(f"{where} must be an object")
        pair = [entry.get("input"), entry.get("output")]
        if not all(isinstance(n, str) and 0 < len(n) <= 256 for n in pair):
            raise ModelError(f"{where} needs input and output tensor names")
        if entry.get("dtype") not in STATE_DTYPES:
            raise ModelError(f"{where}.dtype must be one of {STATE_DTYPES}")
        shape = entry.get("shape")
        if not isinstance(shape, list) or not 1 <= len(shape) <= 6:
            raise ModelError(f"{where}.shape must list 1 to 6 sizes")
        dims = tuple(checked_number(v, int, 1, MAX_STATE_DIM, f"{where}.shape[]") for v in shape)
        if dims[0] != 1:
            raise ModelError(f"{where}.shape must start with the batch size 1 of one stream")
        if names & set(pair) or pair[0] == pair[1]:
            raise ModelError(f"{where} reuses a tensor name")
        names.update(pair)
        fill = checked_number(entry.get("fill", 0), float, -1e9, 1e9, f"{where}.fill")
        specs.append(StateSpec(pair[0], pair[1], np.dtype(entry["dtype"]), dims, fill))
    total = sum(math.prod(s.shape) * s.dtype.itemsize for s in specs)
    if total > MAX_STATE_BYTES:
        raise ModelError(
            f"{meta.path}: one stream's state would take {total >> 20} MiB; at most "
            f"{MAX_STATE_BYTES >> 20} MiB (are the state shapes right?)"
        )
    return tuple(specs)


def _expected_io(layout: dict[str, Any], state: tuple[StateSpec, ...]) -> dict[str, tuple]:
    codes = ("int64", (layout["quantizers"], None, None))
    audio = ("float32", (None, layout["channels"], None))
    state_in = {s.input: (str(s.dtype), (None, *s.shape[1:])) for s in state}
    state_out = {s.output: (str(s.dtype), (None,) * len(s.shape)) for s in state}
    return {
        "encode": ({"waveform": audio}, {"audio_codes": codes}),
        "decode": ({"audio_codes": codes}, {"audio": audio}),
        "decode_step": ({"audio_codes": codes, **state_in}, {"audio": audio, **state_out}),
    }


def read_codec(codec_dir: str | Path) -> CodecLayout:
    """The exported codec at `codec_dir`: codec.json read (bounded) and checked, each graph's
    declared I/O read without a session. ModelError naming the file and the fix otherwise."""
    root = real_path(codec_dir)
    if (root / CODEC_JSON).is_symlink():
        inside(real_path(root / CODEC_JSON), [root], str(root), CODEC_JSON)
    meta = JsonFile.read(root / CODEC_JSON, EXPORT_HINT, MAX_JSON_BYTES)
    version = meta.get("format_version", None)
    if version != FORMAT_VERSION:
        raise ModelError(
            f"{meta.path}: format_version {version!r:.40} is not {FORMAT_VERSION}; {EXPORT_HINT}"
        )
    values = {
        "sample_rate": meta.number("sample_rate", int, 8000, MAX_SAMPLE_RATE),
        "channels": meta.number("channels", int, 1, 2),
        "hop_length": meta.number("hop_length", int, 1, MAX_HOP),
        "quantizers": meta.number("quantizers", int, 1, MAX_QUANTIZERS),
        "codebook_size": meta.number("codebook_size", int, 2, MAX_CODEBOOK),
        "whole_decode_frames": meta.number("whole_decode_frames", int, 1, MAX_WHOLE_FRAMES),
    }
    state = _state_specs(meta)
    files, external = meta.section("files"), meta.get("external_data", {})
    if not isinstance(external, dict):
        raise ModelError(f"{meta.path}: external_data must map graph files to lists of files")
    expected = _expected_io(values, state)
    graphs: dict[str, GraphSpec] = {}
    data: dict[str, tuple[str, ...]] = {}
    for role in ROLES:
        if not files.get(role):
            raise ModelError(f"{meta.path}: files.{role} is missing; {EXPORT_HINT}")
        name, listed, spec = listed_graph(
            meta, files, external, role, root, f"codec {role}", EXPORT_HINT
        )
        for file in (name, *listed):  # a link may not lead out of the directory
            inside((root / file).resolve(), [root], str(meta.path), f"files.{role}")
        check_graph_io(spec, f"codec {role}", *expected[role], meta.path.name)
        graphs[role], data[name] = spec, listed
    return CodecLayout(root=root, graphs=graphs, data=data, state=state, **values)


def codec_graphs(codec: str | Path | CodecLayout) -> dict[str, Graph]:
    """The codec's graphs by role, for `families.loader.load_graphs`: encode in the "encoder"
    stage, decode and decode_step in the "vocoder" stage, each loaded on first use."""
    layout = codec if isinstance(codec, CodecLayout) else read_codec(codec)
    return {
        role: Graph(spec.path, "encoder" if role == "encode" else "vocoder", lazy=True, spec=spec)
        for role, spec in layout.graphs.items()
    }


def _audio(array: Any, channels: int, samples: int, where: str) -> np.ndarray:
    """A graph's [1, C, samples] output as [samples, C] float32, checked."""
    audio = np.asarray(array)
    if audio.shape != (1, channels, samples) or audio.dtype != np.float32:
        raise ModelError(
            f"{where} returned audio {audio.dtype} {audio.shape}; expected float32 "
            f"[1, {channels}, {samples}]: the codec graph is broken; {EXPORT_HINT}"
        )
    rows = np.ascontiguousarray(audio[0].T)
    check_finite(rows, "the codec's audio")
    return rows


class AudioTokenizerCodec:
    """The codec's loaded graphs (`sessions` by role: encode, decode, decode_step, as
    `codec_graphs` names them). `state_mode` "chain" feeds a stream's state outputs back in
    place; "copy" fetches them to host memory first (the published scripts' way)."""

    def __init__(
        self,
        layout: CodecLayout,
        sessions: Mapping[str, Session | LazySession],
        state_mode: str = "chain",
    ) -> None:
        missing = [role for role in ROLES if role not in sessions]
        if missing:
            raise ModelError(f"the codec needs its {', '.join(missing)} graph(s)")
        self.layout = layout
        self.sample_rate, self.channels = layout.sample_rate, layout.channels
        self.hop_length, self.quantizers = layout.hop_length, layout.quantizers
        self.codebook_size = layout.codebook_size
        self.state_mode = state_mode
        self._encode, self._decode = sessions["encode"], sessions["decode"]
        self._step = sessions["decode_step"]
        self.states = StatePool(
            self._step,
            [(s.input, s.output) for s in layout.state],
            [s.initial() for s in layout.state],
            state_mode,
        )

    # -- codes ---------------------------------------------------------------------------------
    def check_codes(self, codes: Any) -> np.ndarray:
        """`codes` [F, Q] as int64, or InputError saying what is wrong with them."""
        array = np.asarray(codes)
        if array.ndim != 2 or array.shape[1] != self.quantizers:
            raise InputError(
                f"codes must be [frames, {self.quantizers}] (one code per quantizer), got shape "
                f"{array.shape}"
            )
        if array.dtype.kind not in "iu":
            raise InputError(f"codes must be integers, got {array.dtype}")
        if array.size and (array.min() < 0 or array.max() >= self.codebook_size):
            bad = int(array.min()) if array.min() < 0 else int(array.max())
            raise InputError(f"codes must lie in [0, {self.codebook_size}); got {bad}")
        return np.ascontiguousarray(array, np.int64)

    @staticmethod
    def _graph_codes(codes: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(codes.T[:, None, :])  # [F, Q] -> [Q, 1, F]

    # -- encode --------------------------------------------------------------------------------
    def prepare_reference(self, waveform: Any) -> np.ndarray:
        """A reference at the codec's rate made what the published processors encode: its
        channels matched to the codec's (v1: the mean of the channels; v2: mono duplicated,
        past two channels cut) and its loudness brought to -20 dBFS within +-3 dB. [C, N] or
        [N] float in, [channels, N] float32 out."""
        array = np.asarray(waveform, np.float32)
        if array.ndim == 1:
            array = array[None]
        if array.ndim != 2 or not 1 <= array.shape[0] <= 8:
            raise AudioError(f"a reference must be samples [channels, N], got {array.shape}")
        if self.channels == 1:
            array = array.mean(axis=0, keepdims=True)
        elif array.shape[0] == 1:
            array = np.repeat(array, self.channels, axis=0)
        else:
            array = array[: self.channels]
        if array.size:
            power = float(np.mean(np.square(array, dtype=np.float32)))
            gain = LOUDNESS_TARGET_DBFS - 10.0 * math.log10(power + 1e-9)
            gain = max(-LOUDNESS_GAIN_DB, min(gain, LOUDNESS_GAIN_DB))
            array = array * np.float32(10.0 ** (gain / 20.0))
        return np.ascontiguousarray(array, np.float32)

    def encode(self, waveform: Any) -> np.ndarray:
        """The canonical encode of one reference [C, N] float32 at the codec's rate (C its
        channels): codes int64 [N // hop, Q] (the published valid frames)."""
        array = np.asarray(waveform)
        if array.ndim != 2 or array.shape[0] != self.channels or array.dtype.kind != "f":
            raise AudioError(
                f"the codec encodes float samples [{self.channels}, N], got {array.dtype} "
                f"{array.shape}"
            )
        frames = array.shape[1] // self.hop_length
        if frames < 1:
            raise AudioError(
                f"a reference needs at least {self.hop_length} samples ({1 / self.frame_rate:.2f} "
                f"s) at {self.sample_rate} Hz; got {array.shape[1]}"
            )
        if array.shape[1] > MAX_ENCODE_SECONDS * self.sample_rate:
            raise AudioError(
                f"a reference of {array.shape[1] / self.sample_rate:.1f} s is longer than the "
                f"{MAX_ENCODE_SECONDS:g} s the codec encodes at once; cut it"
            )
        if not np.isfinite(array).all():
            raise AudioError("the reference contains NaN or infinite samples")
        feed = np.ascontiguousarray(array[None, :, : frames * self.hop_length], np.float32)
        codes = np.asarray(self._encode.run({"waveform": feed})["audio_codes"])
        if codes.shape != (self.quantizers, 1, frames) or codes.dtype != np.int64:
            raise ModelError(
                f"encode.onnx returned codes {codes.dtype} {codes.shape}; expected int64 "
                f"[{self.quantizers}, 1, {frames}]; {EXPORT_HINT}"
            )
        if codes.min() < 0 or codes.max() >= self.codebook_size:
            raise ModelError(f"encode.onnx returned codes outside [0, {self.codebook_size})")
        return np.ascontiguousarray(codes[:, 0, :].T)

    @property
    def frame_rate(self) -> float:
        return self.layout.frame_rate

    # -- decode --------------------------------------------------------------------------------
    def decode(self, codes: Any) -> np.ndarray:
        """All frames at once: [F, Q] -> [F * hop, C] float32. Up to whole_decode_frames in one
        decode.onnx run; longer inputs go through decode_step in pieces of that size (the same
        audio within float rounding, memory bounded)."""
        checked = self.check_codes(codes)
        frames = checked.shape[0]
        if frames == 0:
            return np.zeros((0, self.channels), np.float32)
        piece = self.layout.whole_decode_frames
        if frames > piece:
            with self.open_stream() as stream:
                return np.concatenate(
                    [stream.push(checked[i : i + piece]) for i in range(0, frames, piece)]
                )
        out = self._decode.run({"audio_codes": self._graph_codes(checked)})
        return _audio(out["audio"], self.channels, frames * self.hop_length, "decode.onnx")

    def open_stream(self, prime: Any = None) -> ChainedStream:
        """A stream with a fresh state: `push(codes [F, Q]) -> [F * hop, C]` as frames come,
        `close()` (or a `with` block) when done. `prime` codes [P, Q], when given, are decoded
        first and their audio dropped (the published streaming worker's continuation: the state
        then carries the prompt's audio), in pieces of whole_decode_frames."""
        stream = ChainedStream(self.states, self._push)
        if prime is not None:
            checked, piece = self.check_codes(prime), self.layout.whole_decode_frames
            try:
                for start in range(0, checked.shape[0], piece):
                    stream.push(checked[start : start + piece])
            except BaseException:
                stream.close()
                raise
        return stream

    def _push(self, chain: StateChain, codes: Any) -> np.ndarray:
        checked = self.check_codes(codes)
        if checked.shape[0] == 0:
            return np.zeros((0, self.channels), np.float32)
        out = chain.step({"audio_codes": self._graph_codes(checked)}, ["audio"])
        samples = checked.shape[0] * self.hop_length
        return _audio(out["audio"], self.channels, samples, "decode_step.onnx")


__all__ = [
    "CODEC_JSON",
    "AudioTokenizerCodec",
    "CodecLayout",
    "StateSpec",
    "codec_graphs",
    "read_codec",
]

"""Recognising and checking a MOSS-TTS-Nano ONNX export in its published layout.

    models/                                  (or the TTS directory itself, its codec beside it)
      MOSS-TTS-Nano-100M-ONNX/               browser_poc_manifest.json, tts_browser_onnx_meta.json,
                                             tokenizer.model, moss_tts_*.onnx, *_shared.data
      MOSS-Audio-Tokenizer-Nano-ONNX/        codec_browser_onnx_meta.json, moss_audio_tokenizer_*

Everything is read once here, before any session exists: the manifest (prompt templates,
generation defaults, builtin voices), both metas (files, external data, model/codec config,
tensor names, streaming state specs), the declared I/O of every graph and the byte ranges of
its external weights. Every value a file controls is typed and bounded, every path stays in
its directory (the codec meta may be in a sibling directory, as published), and any missing
or inconsistent piece is one ModelError line naming the file and the fix.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from onnx_tts.errors import ModelError
from onnx_tts.graph_io import LENGTH_INPUTS, GraphSpec, check_graph_io, read_graph_spec

FAMILY = "moss-tts-nano"
MANIFEST = "browser_poc_manifest.json"
TTS_DIR = "MOSS-TTS-Nano-100M-ONNX"
CODEC_DIR = "MOSS-Audio-Tokenizer-Nano-ONNX"
# Directory names of the first published revision, mapped to the current ones.
LEGACY_DIRS = {
    "MOSS-TTS-Nano-ONNX-CPU": TTS_DIR,
    "MOSS-Audio-Tokenizer-Nano-ONNX-CPU": CODEC_DIR,
}
MANIFEST_CANDIDATES = (MANIFEST, f"{TTS_DIR}/{MANIFEST}", f"MOSS-TTS-Nano-ONNX-CPU/{MANIFEST}")
DOWNLOAD_HINT = (
    "download OpenMOSS-Team/MOSS-TTS-Nano-100M-ONNX and "
    "OpenMOSS-Team/MOSS-Audio-Tokenizer-Nano-ONNX side by side (as published) and point "
    "--model at their parent directory"
)

REQUIRED_TTS_GRAPHS = ("prefill", "decode_step", "local_decoder")
OPTIONAL_TTS_GRAPHS = ("local_cached_step", "local_fixed_sampled_frame", "local_greedy_frame")
CODEC_GRAPHS = ("encode", "decode_full", "decode_step")
SAMPLE_MODES = ("greedy", "fixed", "full")

MAX_JSON_BYTES = 64 << 20  # the published manifest is ~0.5 MB, almost all voice codes
MAX_LAYERS = 256
MAX_HEADS = 256
MAX_WIDTH = 1 << 16
MAX_VOCAB = 1 << 20
MAX_CODEBOOKS = 64
MAX_CODEBOOK_SIZE = 1 << 16
MAX_NEW_FRAMES = 12_000  # 16 minutes at 12.5 frames/s
MAX_VOICES = 4096
MAX_VOICE_FRAMES = 12_000
MAX_TEMPLATE_TOKENS = 4096
MAX_CODEC_STATE_BYTES = 4 << 30
MAX_CONTEXT = 1 << 20


# -- typed JSON access ----------------------------------------------------------------------
@dataclass(frozen=True)
class JsonFile:
    """A parsed JSON object and the file it came from (for messages)."""

    path: Path
    data: dict[str, Any]

    @classmethod
    def read(cls, path: Path, fix: str) -> JsonFile:
        if not path.is_file():
            raise ModelError(f"missing {path}; {fix}")
        try:
            size = path.stat().st_size
            if size > MAX_JSON_BYTES:
                raise ModelError(f"{path} is {size} bytes; at most {MAX_JSON_BYTES} are read")
            data = json.loads(path.read_bytes().decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
            raise ModelError(f"{path} is not valid JSON ({error}); {fix}") from None
        except OSError as error:
            raise ModelError(f"cannot read {path}: {error.strerror or error}") from None
        if not isinstance(data, dict):
            raise ModelError(f"{path} must hold a JSON object; {fix}")
        return cls(path, data)

    def get(self, dotted: str, default: Any = ...) -> Any:
        value: Any = self.data
        for part in dotted.split("."):
            if not isinstance(value, dict) or part not in value:
                if default is ...:
                    raise ModelError(f"{self.path}: {dotted} is missing")
                return default
            value = value[part]
        return value

    def section(self, dotted: str) -> dict[str, Any]:
        value = self.get(dotted)
        if not isinstance(value, dict):
            raise ModelError(f"{self.path}: {dotted} must be a JSON object")
        return value

    def number(self, dotted: str, kind: type, low: float, high: float, default: Any = ...) -> Any:
        value = self.get(dotted, default)
        return checked_number(value, kind, low, high, f"{self.path}: {dotted}")

    def flag(self, dotted: str, default: Any = ...) -> bool:
        value = self.get(dotted, default)
        if not isinstance(value, bool):
            raise ModelError(f"{self.path}: {dotted} must be true or false, got {value!r}")
        return value

    def text(self, dotted: str, default: Any = ...) -> str:
        value = self.get(dotted, default)
        if not isinstance(value, str) or not value:
            raise ModelError(f"{self.path}: {dotted} must be a non-empty string, got {value!r}")
        return value

    def names(self, dotted: str, limit: int = 4096) -> list[str]:
        value = self.get(dotted)
        if (
            not isinstance(value, list)
            or len(value) > limit
            or not all(isinstance(v, str) and v for v in value)
        ):
            raise ModelError(f"{self.path}: {dotted} must be a list of tensor names")
        return list(value)

    def token_ids(self, dotted: str, vocab: int) -> list[int]:
        value = self.get(dotted)
        if not isinstance(value, list) or len(value) > MAX_TEMPLATE_TOKENS:
            raise ModelError(f"{self.path}: {dotted} must be a list of token ids")
        return [checked_number(v, int, 0, vocab - 1, f"{self.path}: {dotted}[]") for v in value]


def checked_number(value: Any, kind: type, low: float, high: float, where: str) -> Any:
    integral = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if kind is int and not integral:
        raise ModelError(f"{where} must be an integer in [{low:g}, {high:g}], got {value!r}")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ModelError(f"{where} must be a number in [{low:g}, {high:g}], got {value!r}")
    number = kind(value)
    if not math.isfinite(number) or number < low or number > high:
        raise ModelError(f"{where} must be in [{low:g}, {high:g}], got {value!r}")
    return number


# -- what a directory holds ------------------------------------------------------------------
@dataclass(frozen=True)
class TTSConfig:
    """model_config of the TTS meta, typed and bounded."""

    n_vq: int
    hidden: int
    global_layers: int
    global_heads: int
    head_dim: int
    local_layers: int
    local_heads: int
    local_head_dim: int
    vocab: int
    codebook: int
    audio_pad: int
    audio_start: int
    audio_end: int
    user_slot: int
    assistant_slot: int

    @property
    def row_width(self) -> int:
        return self.n_vq + 1


@dataclass(frozen=True)
class CodecConfig:
    sample_rate: int
    channels: int
    downsample: int  # samples per code frame
    quantizers: int

    @property
    def frame_rate(self) -> float:
        return self.sample_rate / self.downsample


@dataclass(frozen=True)
class StateSpec:
    """One streaming-decode state tensor: input and output names, dtype, shape, start value."""

    input: str
    output: str
    dtype: np.dtype
    shape: tuple[int, ...]
    fill: int  # 0, or -1 for cached positions

    def initial(self) -> np.ndarray:
        return np.full(self.shape, self.fill, dtype=self.dtype)


@dataclass(frozen=True)
class GenerationDefaults:
    """generation_defaults of the manifest (the published option names)."""

    max_new_frames: int
    sample_mode: str
    text_temperature: float
    text_top_p: float
    text_top_k: int
    audio_temperature: float
    audio_top_p: float
    audio_top_k: int
    audio_repetition_penalty: float


@dataclass(frozen=True)
class PromptTemplates:
    user_prefix: tuple[int, ...]
    after_reference: tuple[int, ...]
    assistant_prefix: tuple[int, ...]


@dataclass(frozen=True)
class MossLayout:
    root: Path
    tts_dir: Path
    codec_dir: Path
    manifest_path: Path
    tts_meta_path: Path
    codec_meta_path: Path
    tokenizer_path: Path
    config: TTSConfig
    codec: CodecConfig
    templates: PromptTemplates
    defaults: GenerationDefaults
    voices: dict[str, np.ndarray]  # name -> int32 [frames, n_vq]
    tts_graphs: dict[str, GraphSpec]  # role -> declared I/O (present graphs only)
    codec_graphs: dict[str, GraphSpec]
    external_data: dict[str, tuple[str, ...]]  # graph file -> its .data files
    tts_names: dict[str, list[str]]  # the meta's `onnx` name lists
    fixed_frame_constants: dict[str, float]
    state: tuple[StateSpec, ...]

    def graph_files(self, role: str) -> list[Path]:
        """A graph and its external-data files (for identities and hashes)."""
        graphs = {**self.tts_graphs, **{f"codec_{r}": g for r, g in self.codec_graphs.items()}}
        path = graphs[role].path
        return [path] + [path.parent / name for name in self.external_data.get(path.name, ())]


def find_manifest(root: Path) -> Path | None:
    """The manifest of `root` (the models/ parent or the TTS directory), as the published
    runtime looks for it."""
    for candidate in MANIFEST_CANDIDATES:
        path = root / candidate
        if path.is_file():
            return path
    return None


def looks_like_moss(root: Path) -> bool:
    return find_manifest(root) is not None


def _plain_name(value: Any, where: str) -> str:
    """A file name without directories (metas name files beside themselves)."""
    if (
        not isinstance(value, str)
        or not value
        or "/" in value
        or "\\" in value
        or "\0" in value
        or value in (".", "..")
    ):
        raise ModelError(f"{where} must be a plain file name in its directory, got {value!r}")
    return value


def _resolve_relative(manifest: JsonFile, key: str, value: Any) -> Path:
    """A manifest-relative path: a relative path, with the published fallback from the
    legacy directory names to the current ones."""
    where = f"{manifest.path}: model_files.{key}"
    if not isinstance(value, str) or not value or "\0" in value or "\\" in value:
        raise ModelError(f"{where} must be a relative path, got {value!r}")
    if os.path.isabs(value):
        raise ModelError(f"{where} {value!r} must be relative to the manifest's directory")
    base = manifest.path.parent
    path = (base / value).resolve()
    if path.exists():
        return path
    for legacy, current in LEGACY_DIRS.items():
        parts = value.split("/")
        if legacy in parts:
            renamed = (base / "/".join(current if p == legacy else p for p in parts)).resolve()
            if renamed.exists():
                return renamed
    return path


def _inside(path: Path, directories: Sequence[Path], where: str, what: str) -> Path:
    """`path` refused unless it lies directly in one of `directories` (after symlinks)."""
    if path.parent not in [d.resolve() for d in directories]:
        allowed = " or ".join(str(d) for d in directories)
        raise ModelError(
            f"{where}: {what} {path} lies outside the model directories ({allowed}); a model "
            "directory must not make onnx-tts open other files: fix the path"
        )
    return path


def _graph(path: Path, what: str) -> GraphSpec:
    if not path.is_file():
        raise ModelError(f"missing graph {path} ({what}); {DOWNLOAD_HINT}")
    try:
        return read_graph_spec(path)
    except ModelError as error:
        raise ModelError(
            f"{path} cannot be read as an ONNX graph (a truncated or damaged download?): "
            f"{str(error).split(': ', 1)[-1]}; download the file again"
        ) from None


def _external_extents(path: Path) -> dict[str, int]:
    """For each external-data file of a graph: the end of the furthest byte its tensors read."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    ends: dict[str, int] = {}
    for tensor in model.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        entry = {e.key: e.value for e in tensor.external_data}
        location = entry.get("location", "")
        try:
            offset, length = int(entry.get("offset", 0)), int(entry.get("length", -1))
        except ValueError:
            raise ModelError(
                f"{path}: tensor {tensor.name!r} has a malformed external-data entry"
            ) from None
        if length < 0:  # no length: the rest of the file, checked by ORT itself
            length = 0
        ends[location] = max(ends.get(location, 0), offset + length)
    return ends


def _check_external_data(graph: GraphSpec, listed: Sequence[str], meta: Path) -> None:
    """The graph's weights are in files beside it, listed by the meta, long enough."""
    path = graph.path
    for name in graph.external_data:
        _plain_name(name, f"{path}: external-data location")
        if name not in listed:
            raise ModelError(
                f"{path.name} keeps its weights in {name!r} but {meta.name} lists "
                f"{list(listed)} for it: the meta and the graph are from different exports; "
                "download both again"
            )
    for name in listed:
        data = path.parent / name
        if not data.is_file():
            raise ModelError(
                f"missing external-data file {data} (weights of {path.name}); download it and "
                "keep it beside the graph under this name"
            )
    for name, end in _external_extents(path).items():
        size = (path.parent / name).stat().st_size
        if end > size:
            raise ModelError(
                f"{path.parent / name} is {size} bytes but {path.name} reads up to byte {end}: "
                "the file is truncated; download it again"
            )


# -- the TTS side ---------------------------------------------------------------------------
def _tts_config(meta: JsonFile) -> TTSConfig:
    c = "model_config"
    n_vq = meta.number(f"{c}.n_vq", int, 1, MAX_CODEBOOKS)
    vocab = meta.number(f"{c}.vocab_size", int, 16, MAX_VOCAB)
    sizes = meta.get(f"{c}.audio_codebook_sizes")
    if not isinstance(sizes, list) or len(sizes) != n_vq:
        raise ModelError(f"{meta.path}: {c}.audio_codebook_sizes must list {n_vq} sizes (n_vq)")
    sizes = [
        checked_number(s, int, 2, MAX_CODEBOOK_SIZE, f"{meta.path}: {c}.audio_codebook_sizes[]")
        for s in sizes
    ]
    if len(set(sizes)) != 1:
        raise ModelError(
            f"{meta.path}: {c}.audio_codebook_sizes differ ({sizes}); the frame graphs need "
            "one size"
        )

    def token(key: str) -> int:
        return meta.number(f"{c}.{key}", int, 0, vocab - 1)

    config = TTSConfig(
        n_vq=n_vq,
        hidden=meta.number(f"{c}.hidden_size", int, 1, MAX_WIDTH),
        global_layers=meta.number(f"{c}.global_layers", int, 1, MAX_LAYERS),
        global_heads=meta.number(f"{c}.global_heads", int, 1, MAX_HEADS),
        head_dim=meta.number(f"{c}.head_dim", int, 1, MAX_WIDTH),
        local_layers=meta.number(f"{c}.local_layers", int, 1, MAX_LAYERS),
        local_heads=meta.number(f"{c}.local_heads", int, 1, MAX_HEADS),
        local_head_dim=meta.number(f"{c}.local_head_dim", int, 1, MAX_WIDTH),
        vocab=vocab,
        codebook=sizes[0],
        audio_pad=meta.number(f"{c}.audio_pad_token_id", int, 0, MAX_CODEBOOK_SIZE),
        audio_start=token("audio_start_token_id"),
        audio_end=token("audio_end_token_id"),
        user_slot=token("audio_user_slot_token_id"),
        assistant_slot=token("audio_assistant_slot_token_id"),
    )
    if config.audio_pad < config.codebook:
        raise ModelError(
            f"{meta.path}: {c}.audio_pad_token_id {config.audio_pad} is a real code (codebook "
            f"size {config.codebook}); the pad id must lie outside the codebook"
        )
    return config


def _check_manifest_config(manifest: JsonFile, config: TTSConfig, meta: Path) -> None:
    """The manifest's tts_config (what the published runtime reads) must agree with the meta."""
    pairs = {
        "n_vq": config.n_vq,
        "audio_pad_token_id": config.audio_pad,
        "audio_start_token_id": config.audio_start,
        "audio_end_token_id": config.audio_end,
        "audio_user_slot_token_id": config.user_slot,
        "audio_assistant_slot_token_id": config.assistant_slot,
    }
    for key, expected in pairs.items():
        value = manifest.number(f"tts_config.{key}", int, 0, MAX_VOCAB)
        if value != expected:
            raise ModelError(
                f"{manifest.path}: tts_config.{key} is {value} but {meta.name} says {expected}: "
                "the manifest and the meta are from different exports; download both again"
            )


def _tts_graph_io(
    config: TTSConfig, names: dict[str, list[str]], in_place: bool = False
) -> dict[str, tuple[dict, dict]]:
    """role -> (inputs, outputs) expected by the meta: name -> (dtype, dims, None = free).
    `in_place`: decode_step converted by `onnx-tts convert --inplace-kv` (GroupQueryAttention,
    KV [batch, heads, capacity, head_dim], seqlens_k and total_sequence_length inputs)."""
    c = config
    kv = ("float32", (None, None, c.global_heads, c.head_dim))
    step_kv = ("float32", (None, c.global_heads, None, c.head_dim)) if in_place else kv
    local_kv = ("float32", (None, None, c.local_heads, c.local_head_dim))
    hidden = ("float32", (None, c.hidden))
    per_row = ("int32", (None,))
    frame_out = {
        "should_continue": ("int32", (None, 1)),
        "frame_token_ids": ("int32", (None, c.n_vq)),
    }
    seen = ("int32", (None, c.n_vq, c.codebook))
    prefill_out = {names["prefill_output_names"][0]: ("float32", (None, None, c.hidden))}
    prefill_out.update({n: kv for n in names["prefill_output_names"][1:]})
    decode_in = {
        "input_ids": ("int32", (None, None, c.row_width)),
        "past_valid_lengths": per_row,
    }
    decode_in.update({n: step_kv for n in names["decode_input_names"][2:]})
    if in_place:
        decode_in.update({LENGTH_INPUTS[0]: ("int32", (None,)), LENGTH_INPUTS[1]: ("int32", ())})
    decode_out = {names["decode_output_names"][0]: ("float32", (None, None, c.hidden))}
    decode_out.update({n: step_kv for n in names["decode_output_names"][1:]})
    cached_in = {"global_hidden": hidden}
    cached_in.update({n: per_row for n in names["local_cached_input_names"][1:6]})
    cached_in.update({n: local_kv for n in names["local_cached_input_names"][6:]})
    cached_out = {
        "text_logits": ("float32", (None, c.vocab)),
        "audio_logits": ("float32", (None, c.n_vq, c.codebook)),
    }
    cached_out.update({n: local_kv for n in names["local_cached_output_names"][2:]})
    return {
        "prefill": (
            {
                "input_ids": ("int32", (None, None, c.row_width)),
                "attention_mask": ("int32", (None, None)),
            },
            prefill_out,
        ),
        "decode_step": (decode_in, decode_out),
        "local_decoder": (
            {
                "global_hidden": ("float32", (1, c.hidden)),
                "text_token_id": ("int32", (1,)),
                "audio_prefix_token_ids": ("int32", (1, c.n_vq - 1)),
            },
            {
                "text_logits": ("float32", (1, c.vocab)),
                "audio_logits": ("float32", (1, c.n_vq, c.codebook)),
            },
        ),
        "local_cached_step": (cached_in, cached_out),
        "local_fixed_sampled_frame": (
            {
                "global_hidden": hidden,
                "repetition_seen_mask": seen,
                "assistant_random_u": ("float32", (None,)),
                "audio_random_u": ("float32", (None, c.n_vq)),
            },
            frame_out,
        ),
        "local_greedy_frame": (
            {
                "global_hidden": hidden,
                "repetition_seen_mask": seen,
                "repetition_penalty": ("float32", (None,)),
            },
            frame_out,
        ),
    }


def _tts_names(meta: JsonFile, config: TTSConfig) -> dict[str, list[str]]:
    names = {
        key: meta.names(f"onnx.{key}")
        for key in (
            "prefill_output_names",
            "decode_input_names",
            "decode_output_names",
            "local_cached_input_names",
            "local_cached_output_names",
        )
    }
    expected = {
        "prefill_output_names": 1 + 2 * config.global_layers,
        "decode_input_names": 2 + 2 * config.global_layers,
        "decode_output_names": 1 + 2 * config.global_layers,
        "local_cached_input_names": 6 + 2 * config.local_layers,
        "local_cached_output_names": 2 + 2 * config.local_layers,
    }
    for key, count in expected.items():
        if len(names[key]) != count:
            raise ModelError(
                f"{meta.path}: onnx.{key} has {len(names[key])} names, but model_config "
                f"(layers) implies {count}: the meta is damaged or from another export"
            )
    if names["prefill_output_names"][0] != "global_hidden" or names["decode_input_names"][:2] != [
        "input_ids",
        "past_valid_lengths",
    ]:
        raise ModelError(
            f"{meta.path}: onnx name lists do not start with global_hidden / input_ids, "
            "past_valid_lengths as published"
        )
    for present_key, past_key, offset in (
        ("decode_output_names", "decode_input_names", 2),
        ("local_cached_output_names", "local_cached_input_names", 6),
    ):
        presents = names[present_key][len(names[present_key]) - len(names[past_key]) + offset :]
        pasts = names[past_key][offset:]
        renamed = [n.replace("present_", "past_") for n in presents]
        if renamed != pasts:
            raise ModelError(
                f"{meta.path}: onnx.{present_key} and onnx.{past_key} do not pair present_* "
                "with past_* in order"
            )
    return names


def _defaults(manifest: JsonFile) -> GenerationDefaults:
    g = "generation_defaults"
    mode = manifest.get(f"{g}.sample_mode", "fixed")
    do_sample = manifest.flag(f"{g}.do_sample", True)
    if mode == "mixed3":  # a legacy alias
        mode = "fixed" if do_sample else "greedy"
    if mode not in SAMPLE_MODES:
        raise ModelError(
            f"{manifest.path}: {g}.sample_mode must be one of {', '.join(SAMPLE_MODES)}, "
            f"got {mode!r}"
        )
    if not do_sample:
        mode = "greedy"
    return GenerationDefaults(
        max_new_frames=manifest.number(f"{g}.max_new_frames", int, 1, MAX_NEW_FRAMES, 375),
        sample_mode=mode,
        text_temperature=manifest.number(f"{g}.text_temperature", float, 1e-6, 100.0, 1.0),
        text_top_p=manifest.number(f"{g}.text_top_p", float, 0.0, 1.0, 1.0),
        text_top_k=manifest.number(f"{g}.text_top_k", int, 0, MAX_VOCAB, 50),
        audio_temperature=manifest.number(f"{g}.audio_temperature", float, 1e-6, 100.0, 0.8),
        audio_top_p=manifest.number(f"{g}.audio_top_p", float, 0.0, 1.0, 0.95),
        audio_top_k=manifest.number(f"{g}.audio_top_k", int, 0, MAX_VOCAB, 25),
        audio_repetition_penalty=manifest.number(
            f"{g}.audio_repetition_penalty", float, 1e-6, 100.0, 1.2
        ),
    )


def _voices(manifest: JsonFile, config: TTSConfig) -> dict[str, np.ndarray]:
    entries = manifest.get("builtin_voices", [])
    if not isinstance(entries, list) or len(entries) > MAX_VOICES:
        raise ModelError(f"{manifest.path}: builtin_voices must be a list of voices")
    voices: dict[str, np.ndarray] = {}
    for index, entry in enumerate(entries):
        where = f"{manifest.path}: builtin_voices[{index}]"
        name = entry.get("voice") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name or len(name) > 256:
            raise ModelError(f"{where}.voice must be a name")
        codes = entry.get("prompt_audio_codes")
        try:
            array = np.asarray(codes, dtype=np.int64)
        except (TypeError, ValueError, OverflowError):
            array = np.zeros((0,))
        if (
            array.ndim != 2
            or not 1 <= array.shape[0] <= MAX_VOICE_FRAMES
            or array.shape[1] != config.n_vq
            or array.min() < 0
            or array.max() >= config.codebook
        ):
            raise ModelError(
                f"{where} ({name}): prompt_audio_codes must be 1 to {MAX_VOICE_FRAMES} frames "
                f"of {config.n_vq} codes in [0, {config.codebook}); the manifest is damaged"
            )
        voices[name] = array.astype(np.int32)
    return voices


def _inspect_tts(manifest: JsonFile, meta: JsonFile, tts_dir: Path) -> tuple:
    version = meta.get("format_version", None)
    if version != 1:
        raise ModelError(
            f"{meta.path}: format_version {version!r} is not one this onnx-tts reads (1); "
            "download the published meta again"
        )
    config = _tts_config(meta)
    _check_manifest_config(manifest, config, meta.path)
    names = _tts_names(meta, config)
    files = meta.section("files")
    external = meta.get("external_data_files", {})
    if not isinstance(external, dict):
        raise ModelError(f"{meta.path}: external_data_files must map graph files to lists")
    graphs: dict[str, GraphSpec] = {}
    data: dict[str, tuple[str, ...]] = {}
    missing = [role for role in REQUIRED_TTS_GRAPHS if not files.get(role)]
    if missing:
        raise ModelError(f"{meta.path}: files lacks {', '.join(missing)}; {DOWNLOAD_HINT}")
    for role in (*REQUIRED_TTS_GRAPHS, *OPTIONAL_TTS_GRAPHS):
        if not files.get(role):
            continue
        name = _plain_name(files[role], f"{meta.path}: files.{role}")
        listed = external.get(name, [])
        if not isinstance(listed, list):
            raise ModelError(f"{meta.path}: external_data_files[{name!r}] must be a list")
        listed = [_plain_name(n, f"{meta.path}: external_data_files[{name!r}]") for n in listed]
        spec = _graph(tts_dir / name, f"{role}, named by {meta.path.name}")
        _check_external_data(spec, listed, meta.path)
        # decode_step may have been converted for the in-place KV cache (it then also takes
        # GroupQueryAttention's length inputs).
        in_place = role == "decode_step" and all(n in spec.inputs for n in LENGTH_INPUTS)
        inputs, outputs = _tts_graph_io(config, names, in_place)[role]
        if role in ("decode_step", "local_cached_step"):
            key = "decode" if role == "decode_step" else "local_cached"
            order = names[f"{key}_input_names"] + (list(LENGTH_INPUTS) if in_place else [])
            if list(spec.inputs) != order:
                raise ModelError(
                    f"{role} graph {spec.path} takes inputs {list(spec.inputs)} but "
                    f"{meta.path.name} lists {order}: the graph and the meta are from different "
                    "exports"
                )
        check_graph_io(spec, role, inputs, outputs, meta.path.name)
        graphs[role] = spec
        data[name] = tuple(listed)
    constants = meta.get("onnx.fixed_sampled_frame_constants", {})
    if not isinstance(constants, dict):
        raise ModelError(f"{meta.path}: onnx.fixed_sampled_frame_constants must be an object")
    fixed = {
        key: checked_number(
            value, float, 0.0, 1e6, f"{meta.path}: onnx.fixed_sampled_frame_constants.{key}"
        )
        for key, value in constants.items()
        if isinstance(key, str)
    }
    return config, names, graphs, data, fixed


# -- the codec side -------------------------------------------------------------------------
def _codec_config(meta: JsonFile) -> CodecConfig:
    c = "codec_config"
    return CodecConfig(
        sample_rate=meta.number(f"{c}.sample_rate", int, 8000, 384_000),
        channels=meta.number(f"{c}.channels", int, 1, 2),
        downsample=meta.number(f"{c}.downsample_rate", int, 1, 1 << 20),
        quantizers=meta.number(f"{c}.num_quantizers", int, 1, MAX_CODEBOOKS),
    )


def _state_specs(meta: JsonFile) -> tuple[StateSpec, ...]:
    section = meta.section("streaming_decode")
    batch = section.get("batch_size", 1)
    if batch != 1:
        raise ModelError(
            f"{meta.path}: streaming_decode.batch_size {batch!r} is not 1 as published"
        )
    offsets, caches = section.get("transformer_offsets"), section.get("attention_caches")
    if (
        not isinstance(offsets, list)
        or not isinstance(caches, list)
        or len(offsets) + len(caches) > 1024
    ):
        raise ModelError(
            f"{meta.path}: streaming_decode needs transformer_offsets and attention_caches lists"
        )

    def shape(value: Any, where: str) -> tuple[int, ...]:
        if not isinstance(value, list) or not 1 <= len(value) <= 4:
            raise ModelError(f"{meta.path}: {where} must be a shape (1 to 4 sizes)")
        return tuple(
            checked_number(v, int, 1, MAX_CONTEXT, f"{meta.path}: {where}[]") for v in value
        )

    def name(entry: dict, key: str, where: str) -> str:
        value = entry.get(key)
        if not isinstance(value, str) or not value:
            raise ModelError(f"{meta.path}: {where}.{key} must be a tensor name")
        return value

    specs: list[StateSpec] = []
    for i, entry in enumerate(offsets):
        where = f"streaming_decode.transformer_offsets[{i}]"
        if not isinstance(entry, dict):
            raise ModelError(f"{meta.path}: {where} must be an object")
        specs.append(
            StateSpec(
                name(entry, "input_name", where),
                name(entry, "output_name", where),
                np.dtype(np.int32),
                shape(entry.get("shape"), f"{where}.shape"),
                0,
            )
        )
    for i, entry in enumerate(caches):
        where = f"streaming_decode.attention_caches[{i}]"
        if not isinstance(entry, dict):
            raise ModelError(f"{meta.path}: {where} must be an object")
        for dtype_key, allowed in (("cache_dtype", "float32"), ("positions_dtype", "int32")):
            if entry.get(dtype_key, allowed) != allowed:
                raise ModelError(
                    f"{meta.path}: {where}.{dtype_key} is {entry[dtype_key]!r}; onnx-tts runs the "
                    f"published {allowed} state"
                )
        cache = shape(entry.get("cache_shape"), f"{where}.cache_shape")
        for kind, dtype, key, fill in (
            ("offset", np.int32, "offset_shape", 0),
            ("cached_keys", np.float32, "cache_shape", 0),
            ("cached_values", np.float32, "cache_shape", 0),
            ("cached_positions", np.int32, "positions_shape", -1),
        ):
            specs.append(
                StateSpec(
                    name(entry, f"{kind}_input_name", where),
                    name(entry, f"{kind}_output_name", where),
                    np.dtype(dtype),
                    cache if key == "cache_shape" else shape(entry.get(key), f"{where}.{key}"),
                    fill,
                )
            )
    total = sum(math.prod(s.shape) * s.dtype.itemsize for s in specs)
    if total > MAX_CODEC_STATE_BYTES:
        raise ModelError(
            f"{meta.path}: the streaming state would take {total >> 20} MiB; at most "
            f"{MAX_CODEC_STATE_BYTES >> 20} MiB (are the cache shapes right?)"
        )
    return tuple(specs)


def _inspect_codec(meta: JsonFile, codec_dir: Path, config: TTSConfig) -> tuple:
    version = meta.get("format_version", None)
    if version not in (1, 2):
        raise ModelError(
            f"{meta.path}: format_version {version!r} is not one this onnx-tts reads (1, 2); "
            "download the published codec meta again"
        )
    codec = _codec_config(meta)
    if codec.quantizers != config.n_vq:
        raise ModelError(
            f"{meta.path}: the codec has {codec.quantizers} quantizers but the TTS model "
            f"speaks {config.n_vq} codebooks (n_vq): this is not the codec of this TTS model; "
            f"pair {TTS_DIR} with its own {CODEC_DIR}"
        )
    files = meta.section("files")
    external = meta.get("external_data_files", {})
    if not isinstance(external, dict):
        raise ModelError(f"{meta.path}: external_data_files must map graph files to lists")
    state = _state_specs(meta)
    step_in = meta.names("onnx.decode_step_input_names")
    step_out = meta.names("onnx.decode_step_output_names")
    codes = ("int32", (None, None, config.n_vq))
    lengths = ("int32", (None,))
    expected = {
        "encode": (
            {
                "waveform": ("float32", (None, codec.channels, None)),
                "input_lengths": lengths,
            },
            {"audio_codes": codes, "audio_code_lengths": lengths},
        ),
        "decode_full": (
            {"audio_codes": codes, "audio_code_lengths": lengths},
            {"audio": ("float32", (None, None, None)), "audio_lengths": lengths},
        ),
        "decode_step": (
            {
                "audio_codes": codes,
                "audio_code_lengths": lengths,
                **{s.input: (str(s.dtype), s.shape) for s in state},
            },
            {
                "audio": ("float32", (None, None, None)),
                "audio_lengths": lengths,
                **{s.output: (str(s.dtype), (None,) * len(s.shape)) for s in state},
            },
        ),
    }
    state_in = {s.input for s in state}
    if (
        set(step_in) != {"audio_codes", "audio_code_lengths"} | state_in
        or len(step_in) != len(state) + 2
    ):
        raise ModelError(
            f"{meta.path}: onnx.decode_step_input_names ({len(step_in)}) do not match the "
            f"streaming_decode state specs ({len(state)} tensors + codes, lengths)"
        )
    if set(step_out) != {"audio", "audio_lengths"} | {s.output for s in state}:
        raise ModelError(
            f"{meta.path}: onnx.decode_step_output_names do not match the streaming_decode specs"
        )
    graphs: dict[str, GraphSpec] = {}
    data: dict[str, tuple[str, ...]] = {}
    for role in CODEC_GRAPHS:
        if not files.get(role):
            raise ModelError(f"{meta.path}: files.{role} is missing; {DOWNLOAD_HINT}")
        name = _plain_name(files[role], f"{meta.path}: files.{role}")
        listed = external.get(name, [])
        if not isinstance(listed, list):
            raise ModelError(f"{meta.path}: external_data_files[{name!r}] must be a list")
        listed = [_plain_name(n, f"{meta.path}: external_data_files[{name!r}]") for n in listed]
        spec = _graph(codec_dir / name, f"codec {role}, named by {meta.path.name}")
        _check_external_data(spec, listed, meta.path)
        check_graph_io(spec, f"codec {role}", *expected[role], meta.path.name)
        graphs[role] = spec
        data[name] = tuple(listed)
    return codec, state, graphs, data


# -- entry point ----------------------------------------------------------------------------
def inspect_layout(root: Path) -> MossLayout:
    """Read and check a MOSS-TTS-Nano directory (the models/ parent or the TTS directory)."""
    root = Path(root)
    manifest_path = find_manifest(root)
    if manifest_path is None:
        raise ModelError(
            f"{root} has no {MANIFEST} (tried {', '.join(MANIFEST_CANDIDATES)}); {DOWNLOAD_HINT}"
        )
    fix = f"download {MANIFEST} again ({DOWNLOAD_HINT})"
    manifest = JsonFile.read(manifest_path.resolve(), fix)
    version = manifest.get("format_version", None)
    if version != 1:
        raise ModelError(
            f"{manifest.path}: format_version {version!r} is not one this onnx-tts reads (1)"
        )
    tts_dir = manifest.path.parent
    model_files = manifest.section("model_files")
    tts_meta_path = _inside(
        _resolve_relative(manifest, "tts_meta", model_files.get("tts_meta")),
        [tts_dir],
        str(manifest.path),
        "model_files.tts_meta",
    )
    codec_meta_path = _resolve_relative(manifest, "codec_meta", model_files.get("codec_meta"))
    # The codec lives beside the TTS directory (or in it): nowhere else.
    siblings = [tts_dir]
    if codec_meta_path.parent.parent == tts_dir.parent:
        siblings.append(codec_meta_path.parent)
    _inside(codec_meta_path, siblings, str(manifest.path), "model_files.codec_meta")
    tokenizer_path = _inside(
        _resolve_relative(
            manifest, "tokenizer_model", model_files.get("tokenizer_model", "tokenizer.model")
        ),
        [tts_dir],
        str(manifest.path),
        "model_files.tokenizer_model",
    )
    if not tokenizer_path.is_file():
        raise ModelError(
            f"missing tokenizer {tokenizer_path} (SentencePiece model); {DOWNLOAD_HINT}"
        )
    tts_meta = JsonFile.read(tts_meta_path, f"download {tts_meta_path.name} again")
    codec_meta = JsonFile.read(
        codec_meta_path,
        f"the codec meta is read from {codec_meta_path.parent}: {DOWNLOAD_HINT}",
    )
    config, names, tts_graphs, tts_data, fixed = _inspect_tts(manifest, tts_meta, tts_dir)
    codec, state, codec_graphs, codec_data = _inspect_codec(
        codec_meta, codec_meta_path.parent, config
    )
    vocab = config.vocab
    templates = PromptTemplates(
        tuple(manifest.token_ids("prompt_templates.user_prompt_prefix_token_ids", vocab)),
        tuple(manifest.token_ids("prompt_templates.user_prompt_after_reference_token_ids", vocab)),
        tuple(manifest.token_ids("prompt_templates.assistant_prompt_prefix_token_ids", vocab)),
    )
    return MossLayout(
        root=root,
        tts_dir=tts_dir,
        codec_dir=codec_meta_path.parent,
        manifest_path=manifest.path,
        tts_meta_path=tts_meta_path,
        codec_meta_path=codec_meta_path,
        tokenizer_path=tokenizer_path,
        config=config,
        codec=codec,
        templates=templates,
        defaults=_defaults(manifest),
        voices=_voices(manifest, config),
        tts_graphs=tts_graphs,
        codec_graphs=codec_graphs,
        external_data={**tts_data, **codec_data},
        tts_names=names,
        fixed_frame_constants=fixed,
        state=state,
    )


__all__ = [
    "CODEC_DIR",
    "FAMILY",
    "MANIFEST",
    "SAMPLE_MODES",
    "TTS_DIR",
    "CodecConfig",
    "GenerationDefaults",
    "MossLayout",
    "PromptTemplates",
    "StateSpec",
    "TTSConfig",
    "find_manifest",
    "inspect_layout",
    "looks_like_moss",
]

"""Chatterbox ONNX layouts (Turbo, original English, multilingual).

Two parts:
* detection (no weights loaded, no session core needed): recognise a directory from its file
  names and graph I/O, pick a precision variant (fp32, fp16, q8/_quantized, q4, q4f16), check
  the .onnx_data sidecars, and read every dtype and the KV layout from the graphs;
* ``ChatterboxModel``, the Backend that onnx_tts.pipeline.Engine drives (``load_backend``):
  cached speech-encoder conditionals, the published generation loop on the session core's
  KV cache (copy / chain), stop heuristics, and the conditional decoder as vocoder.

The layouts are documented in export/synthetic_chatterbox.py. Nothing about dtypes or sizes
is assumed; all of it comes from the graphs.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper

from onnx_tts.audio import load_audio
from onnx_tts.encoder import VoiceEncoder
from onnx_tts.errors import AudioError, InputError, ModelError
from onnx_tts.frontend import normalize_text, split_sentences
from onnx_tts.generator import Sampler, SamplingOptions, lm_feeds
from onnx_tts.session import KVCache, Session, SessionOptions, describe_graphs

FAMILY_TURBO = "chatterbox-turbo"
FAMILY_ORIGINAL = "chatterbox"
FAMILY_MULTILINGUAL = "chatterbox-multilingual"
FAMILIES = (FAMILY_TURBO, FAMILY_ORIGINAL, FAMILY_MULTILINGUAL)

ROLES = ("speech_encoder", "embed_tokens", "language_model", "conditional_decoder")
PRECISION_SUFFIX = {"fp32": "", "fp16": "_fp16", "q8": "_quantized", "q4": "_q4", "q4f16": "_q4f16"}
PRECISIONS = tuple(PRECISION_SUFFIX)
# Default when --precision is not given: full precision first, then what runs fast on CPU;
# fp16 graphs are slow on CPU and come last.
DEFAULT_PRECISION_ORDER = ("fp32", "q8", "q4", "fp16", "q4f16")

START_SPEECH_TOKEN = 6561
STOP_SPEECH_TOKEN = 6562
EXAGGERATION_TOKEN = 6563
SILENCE_TOKEN = 4299
SAMPLE_RATE = 24000
SAMPLES_PER_TOKEN = 960  # 25 Hz speech tokens at 24 kHz

# Canonical speech-encoder output name -> names used by some export revisions.
SPEECH_ENCODER_OUTPUTS = {
    "audio_features": ("audio_features", "cond_emb"),
    "audio_tokens": ("audio_tokens", "prompt_token"),
    "speaker_embeddings": ("speaker_embeddings", "ref_x_vector"),
    "speaker_features": ("speaker_features", "prompt_feat"),
}
DECODER_INPUTS = ("speech_tokens", "speaker_embeddings", "speaker_features")
_PAST_RE = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
_PRESENT_RE = re.compile(r"^present\.(\d+)\.(key|value)$")
_LANGUAGE_TOKEN_RE = re.compile(r"^\[([a-z]{2})\]$")


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output as declared in the file."""

    name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...]


@dataclass(frozen=True)
class GraphSpec:
    role: str
    path: Path
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    external_data: tuple[str, ...] = ()  # sidecar file names the graph refers to

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(self.outputs)


@dataclass(frozen=True)
class LanguageModelSpec:
    """KV layout and dtypes of the language model, read from its declared I/O."""

    layers: int
    kv_heads: int
    head_dim: int
    kv_dtype: np.dtype
    embeds_dtype: np.dtype
    logits_dtype: np.dtype
    vocab_size: int | None
    hidden_size: int | None
    has_position_ids: bool
    past_names: tuple[tuple[str, str], ...]  # per layer (key, value)
    present_names: tuple[tuple[str, str], ...]

    @property
    def kv_pairs(self) -> dict[str, str]:
        """past input name -> present output name, paired by parsed layer index."""
        pairs: dict[str, str] = {}
        for past, present in zip(self.past_names, self.present_names, strict=True):
            pairs[past[0]] = present[0]
            pairs[past[1]] = present[1]
        return pairs


@dataclass(frozen=True)
class ChatterboxLayout:
    family: str
    model_dir: Path
    graph_dir: Path
    precision: str
    graphs: dict[str, GraphSpec]
    tokenizer_path: Path
    lm: LanguageModelSpec
    speech_encoder_outputs: dict[str, str]  # canonical name -> name in this graph
    embed_has_position_ids: bool
    embed_has_exaggeration: bool
    languages: tuple[str, ...] = ()
    default_voice: Path | None = None
    available_precisions: tuple[str, ...] = field(default=())

    def dtype_of(self, role: str, name: str) -> np.dtype:
        graph = self.graphs[role]
        spec = graph.inputs.get(name) or graph.outputs.get(name)
        if spec is None:
            raise ModelError(f"{graph.path.name} has no tensor named {name!r}")
        return spec.dtype


# --------------------------------------------------------------------------------------
# File discovery
# --------------------------------------------------------------------------------------
def graph_directory(model_dir: Path) -> Path:
    """Graphs live under onnx/ in the published repos; a flat directory works too."""
    model_dir = Path(model_dir)
    nested = model_dir / "onnx"
    if nested.is_dir() and any(nested.glob("language_model*.onnx")):
        return nested
    return model_dir


def looks_like_chatterbox(model_dir: Path) -> bool:
    """Cheap check used by the detector: any Chatterbox graph name present."""
    graph_dir = graph_directory(model_dir)
    return any(any(graph_dir.glob(f"{role}*.onnx")) for role in ROLES)


def _graph_file(graph_dir: Path, role: str, precision: str) -> Path:
    return graph_dir / f"{role}{PRECISION_SUFFIX[precision]}.onnx"


def available_precisions(model_dir: Path) -> list[str]:
    """Precisions whose language model file exists (other graphs may fall back to fp32),
    in the order they would be chosen by default."""
    graph_dir = graph_directory(Path(model_dir))
    return [
        p for p in DEFAULT_PRECISION_ORDER if _graph_file(graph_dir, "language_model", p).is_file()
    ]


def resolve_graph_files(model_dir: Path, precision: str) -> tuple[dict[str, Path], list[str]]:
    """Files for each role at `precision`: the variant if present, else the fp32 file (the
    community exports ship the encoder/decoder in one precision). Returns (files, problems)."""
    graph_dir = graph_directory(Path(model_dir))
    files: dict[str, Path] = {}
    problems: list[str] = []
    for role in ROLES:
        wanted = _graph_file(graph_dir, role, precision)
        fallback = _graph_file(graph_dir, role, "fp32")
        if wanted.is_file():
            files[role] = wanted
        elif role != "language_model" and fallback.is_file():
            files[role] = fallback
        else:
            names = (
                wanted.name
                if role == "language_model" or precision == "fp32"
                else (f"{wanted.name} (or {fallback.name})")
            )
            problems.append(f"missing graph {_relative(model_dir, graph_dir / names)}")
    return files, problems


def _relative(model_dir: Path, path: Path) -> str:
    try:
        return str(path.relative_to(model_dir))
    except ValueError:
        return str(path)


# --------------------------------------------------------------------------------------
# Graph I/O
# --------------------------------------------------------------------------------------
def _tensor_spec(value: onnx.ValueInfoProto) -> TensorSpec:
    tensor_type = value.type.tensor_type
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor_type.elem_type))
    shape: list[int | str | None] = []
    for dim in tensor_type.shape.dim:
        if dim.HasField("dim_value"):
            shape.append(int(dim.dim_value))
        elif dim.HasField("dim_param"):
            shape.append(dim.dim_param)
        else:
            shape.append(None)
    return TensorSpec(value.name, dtype, tuple(shape))


def read_graph_spec(role: str, path: Path) -> GraphSpec:
    """Declared inputs/outputs and sidecar names, without loading the weights."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf raises several types for a damaged file
        raise ModelError(f"{path} is not a readable ONNX graph: {exc}") from exc
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    inputs = {v.name: _tensor_spec(v) for v in graph.input if v.name not in initializers}
    outputs = {v.name: _tensor_spec(v) for v in graph.output}
    sidecars: list[str] = []
    for tensor in graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            for entry in tensor.external_data:
                if entry.key == "location" and entry.value not in sidecars:
                    sidecars.append(entry.value)
    return GraphSpec(role, Path(path), inputs, outputs, tuple(sidecars))


def _kv_names(names: tuple[str, ...], pattern: re.Pattern[str]) -> dict[int, dict[str, str]]:
    layers: dict[int, dict[str, str]] = {}
    for name in names:
        match = pattern.match(name)
        if match:
            layers.setdefault(int(match.group(1)), {})[match.group(2)] = name
    return layers


def _int_dim(spec: TensorSpec, axis: int) -> int | None:
    if len(spec.shape) <= axis:
        return None
    value = spec.shape[axis]
    return value if isinstance(value, int) else None


def _check_language_model(graph: GraphSpec, problems: list[str]) -> LanguageModelSpec | None:
    name = graph.path.name
    for required in ("inputs_embeds", "attention_mask"):
        if required not in graph.inputs:
            problems.append(f"{name}: missing input {required!r}")
    if "logits" not in graph.outputs:
        problems.append(f"{name}: missing output 'logits'")
    past = _kv_names(graph.input_names, _PAST_RE)
    present = _kv_names(graph.output_names, _PRESENT_RE)
    if not past:
        problems.append(f"{name}: no 'past_key_values.N.key|value' inputs (not an LM with past)")
        return None
    layers = max(past) + 1
    for layer in range(layers):
        for kind in ("key", "value"):
            if kind not in past.get(layer, {}):
                problems.append(f"{name}: missing input 'past_key_values.{layer}.{kind}'")
            if kind not in present.get(layer, {}):
                problems.append(f"{name}: missing output 'present.{layer}.{kind}'")
    extra = sorted(set(present) - set(range(layers)))
    if extra:
        problems.append(f"{name}: outputs present.{extra[0]}.* have no matching past input")
    if problems:
        return None
    first = graph.inputs[past[0]["key"]]
    heads, head_dim = _int_dim(first, 1), _int_dim(first, 3)
    if len(first.shape) != 4 or heads is None or head_dim is None:
        problems.append(
            f"{name}: input {first.name!r} must be [batch, heads, past, head_dim] with fixed "
            f"heads and head_dim, found {list(first.shape)}"
        )
        return None
    kv_dtype = first.dtype
    for layer in range(layers):
        for kind in ("key", "value"):
            spec = graph.inputs[past[layer][kind]]
            out = graph.outputs[present[layer][kind]]
            if spec.dtype != kv_dtype or out.dtype != kv_dtype:
                problems.append(
                    f"{name}: KV dtype differs between {spec.name!r} ({spec.dtype}) / "
                    f"{out.name!r} ({out.dtype}) and {first.name!r} ({kv_dtype})"
                )
    for integer_input in ("attention_mask", "position_ids"):
        spec = graph.inputs.get(integer_input)
        if spec is not None and spec.dtype != np.int64:
            problems.append(f"{name}: input {integer_input!r} is {spec.dtype}, expected int64")
    if problems:
        return None
    logits = graph.outputs["logits"]
    embeds = graph.inputs["inputs_embeds"]
    return LanguageModelSpec(
        layers=layers,
        kv_heads=heads,
        head_dim=head_dim,
        kv_dtype=kv_dtype,
        embeds_dtype=embeds.dtype,
        logits_dtype=logits.dtype,
        vocab_size=_int_dim(logits, 2),
        hidden_size=_int_dim(embeds, 2),
        has_position_ids="position_ids" in graph.inputs,
        past_names=tuple((past[i]["key"], past[i]["value"]) for i in range(layers)),
        present_names=tuple((present[i]["key"], present[i]["value"]) for i in range(layers)),
    )


def _check_speech_encoder(graph: GraphSpec, problems: list[str]) -> dict[str, str]:
    name = graph.path.name
    if "audio_values" not in graph.inputs:
        problems.append(f"{name}: missing input 'audio_values'")
    found: dict[str, str] = {}
    for canonical, aliases in SPEECH_ENCODER_OUTPUTS.items():
        match = next((alias for alias in aliases if alias in graph.outputs), None)
        if match is None:
            problems.append(f"{name}: missing output {canonical!r}")
        else:
            found[canonical] = match
    tokens = found.get("audio_tokens")
    if tokens and graph.outputs[tokens].dtype != np.int64:
        problems.append(f"{name}: output {tokens!r} is {graph.outputs[tokens].dtype}, not int64")
    return found


def _check_embed_tokens(graph: GraphSpec, problems: list[str]) -> None:
    name = graph.path.name
    if "input_ids" not in graph.inputs:
        problems.append(f"{name}: missing input 'input_ids'")
    if "inputs_embeds" not in graph.outputs:
        problems.append(f"{name}: missing output 'inputs_embeds'")
    has_pos, has_exag = "position_ids" in graph.inputs, "exaggeration" in graph.inputs
    if has_pos != has_exag:
        missing = "exaggeration" if has_pos else "position_ids"
        problems.append(
            f"{name}: has {'position_ids' if has_pos else 'exaggeration'} but no {missing!r} "
            "(the original/multilingual embedder takes both)"
        )


def _check_decoder(graph: GraphSpec, problems: list[str]) -> None:
    name = graph.path.name
    for required in DECODER_INPUTS:
        if required not in graph.inputs:
            problems.append(f"{name}: missing input {required!r}")
    if not graph.outputs:
        problems.append(f"{name}: declares no output")


def _tokenizer_languages(tokenizer_path: Path) -> tuple[str, ...]:
    try:
        data = json.loads(tokenizer_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"{tokenizer_path} is not a readable tokenizer.json: {exc}") from exc
    tokens = [t.get("content", "") for t in data.get("added_tokens", [])]
    vocab = (data.get("model") or {}).get("vocab") or {}
    if isinstance(vocab, dict):
        tokens.extend(vocab)
    languages = {m.group(1) for t in tokens if (m := _LANGUAGE_TOKEN_RE.match(t))}
    return tuple(sorted(languages))


# --------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------
def inspect_layout(model_dir: Path, precision: str | None = None) -> ChatterboxLayout:
    """Recognise a Chatterbox directory and validate it at `precision` (default: the first
    of fp32, q8, q4, fp16, q4f16 that exists). Raises one ModelError listing every problem."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelError(f"model directory {model_dir} does not exist or is not a directory")
    graph_dir = graph_directory(model_dir)
    choices = available_precisions(model_dir)
    if precision is None:
        if not choices:
            raise _layout_error(
                model_dir,
                [
                    "no language model graph: expected onnx/language_model.onnx (or a "
                    "_fp16, _quantized, _q4 or _q4f16 variant), under onnx/ or at the top level"
                ],
            )
        precision = choices[0]
    elif precision not in PRECISION_SUFFIX:
        raise ModelError(
            f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}"
            + (f" (this directory has {', '.join(choices)})" if choices else "")
        )
    elif precision not in choices:
        have = f"; available: {', '.join(choices)}" if choices else ""
        raise ModelError(
            f"{model_dir}: precision {precision!r} is not available "
            f"({_relative(model_dir, _graph_file(graph_dir, 'language_model', precision))} "
            f"is missing){have}"
        )

    files, problems = resolve_graph_files(model_dir, precision)
    tokenizer_path = model_dir / "tokenizer.json"
    if not tokenizer_path.is_file():
        problems.append("missing tokenizer.json")
    graphs: dict[str, GraphSpec] = {}
    for role, path in files.items():
        spec = read_graph_spec(role, path)
        for sidecar in spec.external_data:
            if not (path.parent / sidecar).is_file():
                problems.append(
                    f"missing external-data file {_relative(model_dir, path.parent / sidecar)} "
                    f"(weights of {path.name}; keep it next to the graph under this name)"
                )
        graphs[role] = spec

    encoder_outputs: dict[str, str] = {}
    lm: LanguageModelSpec | None = None
    if "speech_encoder" in graphs:
        encoder_outputs = _check_speech_encoder(graphs["speech_encoder"], problems)
    if "embed_tokens" in graphs:
        _check_embed_tokens(graphs["embed_tokens"], problems)
    if "conditional_decoder" in graphs:
        _check_decoder(graphs["conditional_decoder"], problems)
    if "language_model" in graphs:
        lm = _check_language_model(graphs["language_model"], problems)

    embed = graphs.get("embed_tokens")
    embed_has_pos = bool(embed and "position_ids" in embed.inputs)
    embed_has_exag = bool(embed and "exaggeration" in embed.inputs)
    if embed is not None and lm is not None:
        if not embed_has_pos and not lm.has_position_ids:
            problems.append(
                f"{graphs['language_model'].path.name}: Turbo layout (embed_tokens takes only "
                "input_ids) needs an LM input 'position_ids'"
            )
        embeds_out = embed.outputs.get("inputs_embeds")
        if embeds_out is not None and lm.hidden_size is not None:
            width = _int_dim(embeds_out, 2)
            if width is not None and width != lm.hidden_size:
                problems.append(
                    f"hidden sizes differ: {embed.path.name} gives {width}, "
                    f"{graphs['language_model'].path.name} takes {lm.hidden_size}"
                )

    if problems or lm is None:
        raise _layout_error(model_dir, problems or ["language model could not be read"])

    languages = _tokenizer_languages(tokenizer_path)
    if not embed_has_pos:
        family = FAMILY_TURBO
    elif languages:
        family = FAMILY_MULTILINGUAL
    else:
        family = FAMILY_ORIGINAL
    voice = model_dir / "default_voice.wav"
    return ChatterboxLayout(
        family=family,
        model_dir=model_dir,
        graph_dir=graph_dir,
        precision=precision,
        graphs=graphs,
        tokenizer_path=tokenizer_path,
        lm=lm,
        speech_encoder_outputs=encoder_outputs,
        embed_has_position_ids=embed_has_pos,
        embed_has_exaggeration=embed_has_exag,
        languages=languages,
        default_voice=voice if voice.is_file() else None,
        available_precisions=tuple(choices),
    )


def detect_family(model_dir: Path, precision: str | None = None) -> str:
    return inspect_layout(model_dir, precision).family


def _layout_error(model_dir: Path, problems: list[str]) -> ModelError:
    lines = "\n".join(f"  - {p}" for p in problems)
    return ModelError(
        f"{model_dir} is not a complete Chatterbox ONNX directory:\n{lines}\n"
        "Expected tokenizer.json and onnx/{speech_encoder,embed_tokens,language_model,"
        "conditional_decoder}[_fp16|_quantized|_q4|_q4f16].onnx with their .onnx_data files, "
        "as published in ResembleAI/chatterbox-turbo-ONNX, onnx-community/chatterbox-ONNX or "
        "onnx-community/chatterbox-multilingual-ONNX."
    )


# ======================================================================================
# Runtime adapter (Backend for onnx_tts.pipeline.Engine)
# ======================================================================================
KV_MODES_SUPPORTED = ("copy", "chain", "inplace")  # inplace needs a converted LM
DEFAULT_REPETITION_PENALTY = 1.2  # the published scripts' value
MAX_NEW_TOKENS = 1000  # 40 s of speech per chunk
MAX_CHUNK_CHARS = 300
REFERENCE_MIN_SECONDS = 1.0  # at least one 40 ms speech token... and some voice
REFERENCE_MAX_SECONDS = 20.0


@dataclass(frozen=True)
class TextChunk:
    """One sentence (or piece of one); tokenized at generation time, when the language of
    the request is known."""

    text: str


def _sampling_class() -> type:
    """SamplingOptions plus the request's language (built lazily: generator imports the
    session core, which detection must not need)."""
    global _SAMPLING_CLASS
    if _SAMPLING_CLASS is None:

        @dataclass(frozen=True)
        class ChatterboxSampling(SamplingOptions):
            language: str | None = None

        _SAMPLING_CLASS = ChatterboxSampling
    return _SAMPLING_CLASS


_SAMPLING_CLASS: type | None = None


@dataclass(frozen=True)
class StopRules:
    """Stop heuristics for runaway generation (0 disables a rule). Tokens are 40 ms each.

    - max_token_repeat: the same token this many times in a row (a stuck model);
    - max_cycle_tokens: a short cycle (period 2..max_cycle_period) repeating over this many
      tokens (a looping model);
    - max_silence_tokens: this many consecutive silence tokens (a long pause that never ends).
    Generation stops as soon as a rule fires; tokens already produced are kept (they may
    already have been streamed)."""

    max_token_repeat: int = 30
    max_cycle_tokens: int = 60
    max_cycle_period: int = 8
    max_silence_tokens: int = 50
    silence_tokens: frozenset[int] = frozenset({SILENCE_TOKEN})

    def check(self, history: list[int]) -> str | None:
        """Reason to stop after the last token of `history`, or None."""
        if not history:
            return None
        last = history[-1]
        if self.max_silence_tokens and last in self.silence_tokens:
            run = 0
            for token in reversed(history):
                if token not in self.silence_tokens:
                    break
                run += 1
            if run >= self.max_silence_tokens:
                return f"{run} silence tokens in a row"
        if self.max_token_repeat and len(history) >= self.max_token_repeat:
            tail = history[-self.max_token_repeat :]
            if all(token == last for token in tail) and last not in self.silence_tokens:
                return f"token {last} repeated {self.max_token_repeat} times"
        if self.max_cycle_tokens and len(history) >= self.max_cycle_tokens:
            tail = history[-self.max_cycle_tokens :]
            for period in range(2, self.max_cycle_period + 1):
                if len(set(tail[:period])) > 1 and all(
                    tail[i] == tail[i - period] for i in range(period, len(tail))
                ):
                    return f"a {period}-token cycle repeated over {len(tail)} tokens"
        return None


def _model_identity(paths: list[Path]) -> str:
    """Fingerprint of a graph and its sidecars for the reference-cache key: the .onnx file
    in full, each sidecar by size plus its first and last MiB (hashing a 1 GB sidecar on
    every load would cost seconds)."""
    import hashlib

    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode())
        with path.open("rb") as handle:
            if path.suffix == ".onnx":
                for block in iter(lambda handle=handle: handle.read(1 << 20), b""):
                    digest.update(block)
                continue
            size = path.stat().st_size
            digest.update(str(size).encode())
            digest.update(handle.read(1 << 20))
            if size > 2 << 20:
                handle.seek(size - (1 << 20))
                digest.update(handle.read())
    return digest.hexdigest()


def _korean_jamo(text: str) -> str:
    """Hangul syllables -> conjoining jamo, as the multilingual tokenizer expects."""
    out = []
    for char in text:
        code = ord(char) - 0xAC00
        if 0 <= code < 11172:
            out.append(chr(0x1100 + code // 588) + chr(0x1161 + (code % 588) // 28))
            if code % 28:
                out.append(chr(0x11A7 + code % 28))
        else:
            out.append(char)
    return "".join(out)


class CangjieConverter:
    """Chinese characters -> ``[cj_x]...[cj_.]`` token strings, as the multilingual model was
    trained (mapping file ``Cangjie5_TC.json`` from the repository: "glyph\tcode" entries).
    Word segmentation (pkuseg in the reference script) is not applied."""

    def __init__(self, path: Path) -> None:
        try:
            entries = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ModelError(f"cannot read the Cangjie mapping {path}: {exc}") from exc
        self.code_of: dict[str, str] = {}
        glyphs_of: dict[str, list[str]] = {}
        for entry in entries:
            glyph, code = str(entry).split("\t")[:2]
            self.code_of.setdefault(glyph, code)
            glyphs_of.setdefault(code, []).append(glyph)
        self.index_of = {
            glyph: glyphs.index(glyph) for glyphs in glyphs_of.values() for glyph in glyphs
        }

    def __call__(self, text: str) -> str:
        import unicodedata

        out = []
        for char in text:
            code = self.code_of.get(char) if unicodedata.category(char) == "Lo" else None
            if code is None:
                out.append(char)
                continue
            index = self.index_of.get(char, 0)
            letters = code + (str(index) if index > 0 else "")
            out.append("".join(f"[cj_{c}]" for c in letters) + "[cj_.]")
        return "".join(out)


class ChatterboxModel:
    """Backend for Chatterbox ONNX directories (Turbo, original English, multilingual).

    The loop follows the published scripts: the speech encoder's outputs (cached per
    reference) give the prefix and the decoder conditioning; the LM runs greedy by default
    with repetition penalty 1.2 until token 6562; each new token goes back through
    embed_tokens. Multilingual text is prefixed with ``[lang]``; ``cfg_weight > 0`` runs
    classifier-free guidance as a batch of two (second row: text embeddings zeroed)."""

    sample_rate = SAMPLE_RATE
    hop_length = SAMPLES_PER_TOKEN

    def __init__(
        self,
        root: Path,
        family: str | None = None,
        kv_mode: str | None = None,
        options: Any = None,
        *,
        precision: str | None = None,
        language: str | None = None,
        exaggeration: float | None = None,
        cfg_weight: float | None = None,
        max_new_tokens: int = MAX_NEW_TOKENS,
        stop_rules: StopRules | None = None,
    ) -> None:
        from tokenizers import Tokenizer

        self.layout = layout = inspect_layout(Path(root), precision)
        if family is not None and family != layout.family:
            raise ModelError(f"{root} holds a {layout.family} model, not {family}")
        self.family = layout.family
        lm_inputs = set(layout.graphs["language_model"].inputs)
        # A graph converted by `onnx-tts convert --inplace-kv` writes its cache in place.
        self.in_place_attention = {"seqlens_k", "total_sequence_length"} <= lm_inputs
        self.kv_mode = kv_mode or ("inplace" if self.in_place_attention else "chain")
        if self.kv_mode not in KV_MODES_SUPPORTED:
            raise InputError(f"unknown KV mode {self.kv_mode!r}; use copy, chain or inplace")
        if self.kv_mode == "inplace" and not self.in_place_attention:
            raise InputError(
                f"KV mode 'inplace' is not available for this {self.family} export: its language "
                "model grows the cache by Concat; use --kv chain, or convert it once with "
                "`onnx-tts convert --inplace-kv MODEL_DIR NEW_DIR`"
            )
        llama = layout.embed_has_position_ids
        if exaggeration is not None and not layout.embed_has_exaggeration:
            raise InputError(f"{self.family} has no exaggeration control; drop --exaggeration")
        self.exaggeration = 0.5 if exaggeration is None else float(exaggeration)
        if not 0.0 <= self.exaggeration <= 2.0:
            raise InputError(f"exaggeration must be in [0, 2], got {self.exaggeration}")
        if cfg_weight is not None and not llama:
            raise InputError(f"{self.family} does not support classifier-free guidance")
        self.cfg_weight = float(cfg_weight or 0.0)
        if not 0.0 <= self.cfg_weight <= 5.0:
            raise InputError(f"cfg_weight must be in [0, 5], got {self.cfg_weight}")
        self.language = "en"
        self.language = self._check_language(language)
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be a positive integer, got {max_new_tokens}")
        self.max_new_tokens = max_new_tokens
        self.stop_rules = stop_rules or StopRules()
        self.silence_padding = 3 if self.family == FAMILY_TURBO else 0
        self.streaming_defaults = {
            "first_chunk_frames": 10,
            "stride_frames": 25,
            "overlap_frames": 8,
            "holdback_frames": 2,
            "crossfade_samples": 480,
        }

        options = options or SessionOptions()
        self.sessions = {role: Session(spec.path, options) for role, spec in layout.graphs.items()}
        self._check_runtime_io()
        self.tokenizer = Tokenizer.from_file(str(layout.tokenizer_path))
        encoder_files = [layout.graphs["speech_encoder"].path] + [
            layout.graphs["speech_encoder"].path.parent / name
            for name in layout.graphs["speech_encoder"].external_data
        ]
        self.encoder = VoiceEncoder(
            self.sessions["speech_encoder"],
            bundle_identity=f"{self.family}/{layout.graphs['speech_encoder'].path.name}",
            sample_rate=SAMPLE_RATE,
            settings={"min_seconds": REFERENCE_MIN_SECONDS, "max_seconds": REFERENCE_MAX_SECONDS},
            graph_sha256=_model_identity(encoder_files),
            hop_length=SAMPLES_PER_TOKEN,
            frame_outputs=(layout.speech_encoder_outputs["audio_tokens"],),
            input_name="audio_values",
        )
        self._default_voice: dict[str, np.ndarray] | None = None
        self._cangjie_converter: CangjieConverter | None = None
        self._caches: dict[int, list[Any]] = {}
        import threading

        self._lock = threading.Lock()

    # -- setup ---------------------------------------------------------------------------------
    def _check_runtime_io(self) -> None:
        """The loaded sessions must agree with what the layout read from the files."""
        for role, session in self.sessions.items():
            declared = self.layout.graphs[role]
            missing = [n for n in declared.input_names if session.input(n) is None]
            if missing:
                raise ModelError(f"{declared.path.name}: runtime does not see inputs {missing}")

    def _dtype(self, role: str, name: str) -> np.dtype:
        info = self.sessions[role].input(name)
        return info.dtype if info is not None else np.dtype(np.float32)

    # -- backend interface ---------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        lm = self.layout.lm
        return {
            "name": f"{self.layout.model_dir.name} [{self.layout.precision}]",
            "family": self.family,
            "path": str(self.layout.model_dir),
            "precision": self.layout.precision,
            "precisions": list(self.layout.available_precisions),
            "sample_rate": self.sample_rate,
            "kv_mode": self.kv_mode,
            "kv": {
                "layers": lm.layers,
                "kv_heads": lm.kv_heads,
                "head_dim": lm.head_dim,
                "dtype": str(lm.kv_dtype),
                "attention": "gqa" if self.in_place_attention else "concat",
                "capacity": "per request" if self.kv_mode == "inplace" else None,
                "embeds_dtype": str(lm.embeds_dtype),
                "logits_dtype": str(lm.logits_dtype),
                "position_ids": lm.has_position_ids,
            },
            "language": self.language,
            "languages": list(self.layout.languages),
            "exaggeration": self.exaggeration if self.layout.embed_has_exaggeration else None,
            "cfg_weight": self.cfg_weight,
            "streaming": self.streaming_defaults,
            "graphs": describe_graphs(self.sessions),
        }

    def default_voice(self) -> dict[str, np.ndarray]:
        """The repository's default_voice.wav, encoded once."""

        if self.layout.default_voice is None:
            raise AudioError(
                f"{self.family} needs a reference voice (this directory has no "
                "default_voice.wav): pass --voice ref.wav with a few seconds of speech"
            )
        with self._lock:
            if self._default_voice is None:
                audio = load_audio(
                    self.layout.default_voice,
                    SAMPLE_RATE,
                    min_seconds=REFERENCE_MIN_SECONDS,
                    max_seconds=REFERENCE_MAX_SECONDS,
                )
                self._default_voice = self.encoder.encode(audio)
            return self._default_voice

    def text_chunks(self, text: str) -> list[TextChunk]:
        import unicodedata

        if self.family == FAMILY_MULTILINGUAL:
            cleaned = " ".join(unicodedata.normalize("NFKC", text).split())
        else:
            cleaned = normalize_text(text)
        chunks = []
        for sentence in split_sentences(cleaned, MAX_CHUNK_CHARS):
            sentence = _punctuate(sentence)
            if self.tokenizer.encode(sentence, add_special_tokens=False).ids:
                chunks.append(TextChunk(sentence))
        if not chunks:
            raise InputError("text has nothing speakable after normalisation")
        return chunks

    def token_ids(self, sentence: str, language: str | None = None) -> list[int]:
        """Token ids of one sentence as the published scripts build them."""
        if self.family == FAMILY_TURBO:
            return list(self.tokenizer.encode(sentence, add_special_tokens=False).ids)
        if self.family == FAMILY_MULTILINGUAL:
            language = language or self.language
            if language == "ko":
                sentence = _korean_jamo(sentence)
            elif language == "zh" and self._cangjie() is not None:
                sentence = self._cangjie()(sentence)
            sentence = f"[{language}]{sentence}"
        ids = list(self.tokenizer.encode(sentence).ids)
        if not ids or ids[-1] != START_SPEECH_TOKEN:
            # A tokenizer without the ONNX repos' template: add the wrapping ourselves.
            start = self.tokenizer.token_to_id("[START]")
            stop = self.tokenizer.token_to_id("[STOP]")
            body = list(self.tokenizer.encode(sentence, add_special_tokens=False).ids)
            ids = [EXAGGERATION_TOKEN, *([start] if start is not None else []), *body]
            ids += [stop if stop is not None else 0, START_SPEECH_TOKEN]
        return ids

    def _cangjie(self) -> CangjieConverter | None:
        path = self.layout.model_dir / "Cangjie5_TC.json"
        if self._cangjie_converter is None and path.is_file():
            self._cangjie_converter = CangjieConverter(path)
        return self._cangjie_converter

    def sampling(self, **overrides: Any) -> Any:
        """Greedy with repetition penalty 1.2 unless overridden. `language` (multilingual)
        may be given per call and travels with the options."""
        language = self._check_language(overrides.pop("language", None))
        options = _sampling_class()(
            temperature=0.0,
            top_k=0,
            top_p=1.0,
            repetition_penalty=DEFAULT_REPETITION_PENALTY,
            language=language,
        )
        return options.with_overrides(**overrides)

    def _check_language(self, language: str | None) -> str:

        if language is None:
            return self.language
        code = str(language).lower()
        if self.family != FAMILY_MULTILINGUAL:
            if code != "en":
                raise InputError(f"{self.family} speaks English only; drop --language {language}")
            return code
        if code not in self.layout.languages:
            raise InputError(
                f"language {language!r} is not in this model's tokenizer; choose one of "
                f"{', '.join(self.layout.languages)}"
            )
        return code

    def voice_arrays(self, voice: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Encoder outputs under their canonical names, without the batch axis."""

        arrays = {}
        for canonical, aliases in SPEECH_ENCODER_OUTPUTS.items():
            value = next((voice[a] for a in aliases if a in voice), None)
            if value is None:
                raise AudioError(
                    f"voice has no {canonical!r}: it was not encoded by this model's speech "
                    f"encoder (keys: {sorted(voice)})"
                )
            arrays[canonical] = np.asarray(value)
        return arrays

    def generate(
        self,
        chunk: TextChunk,
        voice: dict[str, np.ndarray],
        sampling: Any,
        should_stop: Any = None,
    ) -> Any:
        """Yields one int64 [1] frame per generated speech token (stop token excluded)."""

        arrays = self.voice_arrays(voice)
        language = getattr(sampling, "language", None) or self.language
        ids = np.asarray(self.token_ids(chunk.text, language), dtype=np.int64)[None]
        guided = self.cfg_weight > 0
        batch = 2 if guided else 1
        embeds = self._prefill_embeds(ids, arrays["audio_features"], guided)
        limit = min(self.max_new_tokens, max(64, 25 * ids.shape[1]))
        sampler = Sampler(sampling)
        seen: np.ndarray | None = None  # mask of produced tokens, sized on the first step
        generated: list[int] = []
        cache = self._acquire(batch, embeds.shape[1] + limit + 1)
        lm_session = self.sessions["language_model"]
        lm_dtype = self._dtype("language_model", "inputs_embeds")
        try:
            for step in range(limit):
                if should_stop is not None and should_stop():
                    return
                feeds = lm_feeds(lm_session, embeds.astype(lm_dtype, copy=False), cache.length)
                logits = cache.step(feeds, output_names=["logits"])["logits"][:, -1]
                scores = logits[0].astype(np.float32)
                if guided:
                    scores = scores + self.cfg_weight * (scores - logits[1].astype(np.float32))
                scores[START_SPEECH_TOKEN] = -np.inf
                scores[STOP_SPEECH_TOKEN + 1 :] = -np.inf
                if seen is None:
                    seen = np.zeros(scores.shape[0], dtype=bool)
                    seen[START_SPEECH_TOKEN] = True
                scores = sampler.penalize(scores, seen)
                token = sampler.sample(scores)
                if token == STOP_SPEECH_TOKEN:
                    return
                seen[token] = True
                generated.append(token)
                yield np.array([token], dtype=np.int64)
                if self.stop_rules.check(generated) is not None:
                    return
                embeds = self._step_embeds(token, step + 1, batch)
        finally:
            self._release(batch, cache)

    def _embed(self, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
        feeds: dict[str, np.ndarray] = {"input_ids": ids}
        if self.layout.embed_has_position_ids:
            feeds["position_ids"] = positions.astype(np.int64)
        if self.layout.embed_has_exaggeration:
            feeds["exaggeration"] = np.full(
                (ids.shape[0],), self.exaggeration, self._dtype("embed_tokens", "exaggeration")
            )
        return self.sessions["embed_tokens"].run(feeds, ["inputs_embeds"])["inputs_embeds"]

    def _prefill_embeds(self, ids: np.ndarray, features: np.ndarray, guided: bool) -> np.ndarray:
        # Text positions count from [START] = 0; marker tokens (>= 6561) take position 0.
        positions = np.where(ids >= START_SPEECH_TOKEN, 0, np.arange(ids.shape[1])[None] - 1)
        text = self._embed(ids, positions).astype(np.float32)
        prefix = np.asarray(features, dtype=np.float32)[None]
        cond = np.concatenate([prefix, text], axis=1)
        if not guided:
            return cond
        uncond_text = np.where((ids < START_SPEECH_TOKEN)[..., None], 0.0, text)
        return np.concatenate([cond, np.concatenate([prefix, uncond_text], axis=1)], axis=0)

    def _step_embeds(self, token: int, position: int, batch: int) -> np.ndarray:
        ids = np.array([[token]], dtype=np.int64)
        embeds = self._embed(ids, np.array([[position]], dtype=np.int64))
        return np.repeat(embeds, batch, axis=0) if batch > 1 else embeds

    def _acquire(self, batch: int, needed: int) -> Any:
        """A pooled KV cache for `batch` rows; in-place caches must hold `needed` tokens."""
        with self._lock:
            idle = self._caches.setdefault(batch, [])
            for index, cache in enumerate(idle):
                if cache.capacity is None or cache.capacity >= needed:
                    return idle.pop(index)
        capacity = None
        if self.kv_mode == "inplace":
            capacity = max(1024, 1 << (needed - 1).bit_length())  # few distinct sizes to pool
        return KVCache(
            self.sessions["language_model"], self.kv_mode, batch_size=batch, capacity=capacity
        )

    def _release(self, batch: int, cache: Any) -> None:
        cache.reset()
        with self._lock:
            self._caches.setdefault(batch, []).append(cache)

    def vocode(self, frames: np.ndarray, voice: dict[str, np.ndarray]) -> np.ndarray:
        """Speech tokens [F] or [F, 1] -> exactly F * 960 samples at 24 kHz.

        The decoder sees prompt tokens + frames (+ 3 silence tokens for Turbo, as published;
        their audio is cut so every frame maps to one 40 ms hop)."""
        tokens = np.asarray(frames, dtype=np.int64).reshape(-1)
        if tokens.size == 0:
            return np.zeros(0, np.float32)

        if tokens.min() < 0 or tokens.max() >= START_SPEECH_TOKEN:
            raise InputError("speech tokens for the decoder must be in [0, 6561)")
        arrays = self.voice_arrays(voice)
        prompt = arrays["audio_tokens"].reshape(-1).astype(np.int64)
        padding = np.full(self.silence_padding, SILENCE_TOKEN, np.int64)
        speech = np.concatenate([prompt, tokens, padding])[None]
        decoder = self.sessions["conditional_decoder"]
        feeds = {
            "speech_tokens": speech,
            "speaker_embeddings": arrays["speaker_embeddings"][None].astype(
                self._dtype("conditional_decoder", "speaker_embeddings")
            ),
            "speaker_features": arrays["speaker_features"][None].astype(
                self._dtype("conditional_decoder", "speaker_features")
            ),
        }
        output = decoder.run(feeds)[decoder.output_names[0]]
        samples = np.asarray(output, dtype=np.float32).reshape(-1)
        return samples[: tokens.size * SAMPLES_PER_TOKEN]


def _punctuate(sentence: str) -> str:
    """Capitalise the first letter and end with punctuation, as Chatterbox's punc_norm does."""
    sentence = sentence.strip()
    if not sentence:
        return sentence
    if sentence[0].islower():
        sentence = sentence[0].upper() + sentence[1:]
    if sentence[-1] not in ".!?,;:-\u3002\uff01\uff1f":
        sentence += "."
    return sentence


def load_backend(
    root: Path, family: str, kv: str | None, options: Any, **family_options: Any
) -> ChatterboxModel:
    """Entry point used by onnx_tts.pipeline.load for the Chatterbox families."""

    allowed = {
        "precision",
        "language",
        "exaggeration",
        "cfg_weight",
        "max_new_tokens",
        "stop_rules",
    }
    unknown = sorted(set(family_options) - allowed)
    if unknown:
        raise InputError(
            f"unknown option(s) for {family}: {', '.join(unknown)}; "
            f"available: {', '.join(sorted(allowed))}"
        )
    return ChatterboxModel(root, family, kv, options, **family_options)

"""Recognising a Chatterbox ONNX directory (Turbo, original English, multilingual) from its
file names and graph I/O, without loading weights: precision variant, external-data sidecars,
every dtype and the KV layout, read once from the graphs and kept in a `ChatterboxLayout`."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from onnx_tts.errors import ModelError
from onnx_tts.graph_io import GraphSpec, KVLayout, kv_layout, read_graph_spec
from onnx_tts.regular_files import real_path

FAMILY_TURBO = "chatterbox-turbo"
FAMILY_ORIGINAL = "chatterbox"
FAMILY_MULTILINGUAL = "chatterbox-multilingual"

ROLES = ("speech_encoder", "embed_tokens", "language_model", "conditional_decoder")
# File names of the early multilingual export carry this prefix (multi_lang_language_model...).
LEGACY_PREFIXES = ("", "multi_lang_")
PRECISION_SUFFIX = {"fp32": "", "fp16": "_fp16", "q8": "_quantized", "q4": "_q4", "q4f16": "_q4f16"}
PRECISIONS = tuple(PRECISION_SUFFIX)
# Default when --precision is not given: full precision first, then what runs fast on CPU;
# fp16 graphs are slow on CPU and come last.
DEFAULT_PRECISION_ORDER = ("fp32", "q8", "q4", "fp16", "q4f16")

# Canonical speech-encoder output name -> names used by some export revisions.
SPEECH_ENCODER_OUTPUTS = {
    "audio_features": ("audio_features", "cond_emb"),
    "audio_tokens": ("audio_tokens", "prompt_token"),
    "speaker_embeddings": ("speaker_embeddings", "ref_x_vector"),
    "speaker_features": ("speaker_features", "prompt_feat"),
}
DECODER_INPUTS = ("speech_tokens", "speaker_embeddings", "speaker_features")
_LANGUAGE_TOKEN_RE = re.compile(r"^\[([a-z]{2})\]$")


@dataclass(frozen=True)
class LanguageModelSpec:
    """The language model's KV layout and dtypes, read from its declared I/O."""

    kv: KVLayout
    embeds_dtype: np.dtype
    logits_dtype: np.dtype
    vocab_size: int | None
    hidden_size: int | None
    has_position_ids: bool


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
    available_precisions: tuple[str, ...] = ()

    def files_of(self, role: str) -> list[Path]:
        """A graph and its external-data sidecars."""
        graph = self.graphs[role]
        return [graph.path] + [graph.path.parent / name for name in graph.external_data]


# -- file discovery ---------------------------------------------------------------------------
def graph_directory(model_dir: Path) -> Path:
    """Graphs live under onnx/ in the published repos; a flat directory works too."""
    model_dir = Path(model_dir)
    nested = model_dir / "onnx"
    if nested.is_dir() and any(nested.glob("*language_model*.onnx")):
        return nested
    return model_dir


def looks_like_chatterbox(model_dir: Path) -> bool:
    """Cheap check used by detection: a Chatterbox graph name or tokenizer present (a partial
    download then gets the layout error naming what is missing)."""
    graph_dir = graph_directory(model_dir)
    return (model_dir / "tokenizer.json").is_file() or any(
        any(graph_dir.glob(f"{prefix}{role}*.onnx")) for role in ROLES for prefix in LEGACY_PREFIXES
    )


def graph_file(graph_dir: Path, role: str, precision: str) -> Path:
    """The file of `role` at `precision`: the current name, or the early multilingual one."""
    names = [f"{prefix}{role}{PRECISION_SUFFIX[precision]}.onnx" for prefix in LEGACY_PREFIXES]
    return next((graph_dir / n for n in names if (graph_dir / n).is_file()), graph_dir / names[0])


def available_precisions(model_dir: Path) -> list[str]:
    """Precisions whose language model file exists (other graphs may fall back to fp32),
    in the order they would be chosen by default."""
    graph_dir = graph_directory(Path(model_dir))
    return [
        p for p in DEFAULT_PRECISION_ORDER if graph_file(graph_dir, "language_model", p).is_file()
    ]


def resolve_graph_files(model_dir: Path, precision: str) -> tuple[dict[str, Path], list[str]]:
    """Files for each role at `precision`: the variant if present, else the fp32 file (the
    community exports ship the encoder/decoder in one precision). Returns (files, problems)."""
    graph_dir = graph_directory(Path(model_dir))
    files: dict[str, Path] = {}
    problems: list[str] = []
    for role in ROLES:
        wanted = graph_file(graph_dir, role, precision)
        fallback = graph_file(graph_dir, role, "fp32")
        if wanted.is_file():
            files[role] = wanted
        elif role != "language_model" and fallback.is_file():
            files[role] = fallback
        else:
            names = (
                wanted.name
                if role == "language_model" or precision == "fp32"
                else f"{wanted.name} (or {fallback.name})"
            )
            problems.append(f"missing graph {_relative(model_dir, graph_dir / names)}")
    return files, problems


def _relative(model_dir: Path, path: Path) -> str:
    try:
        return str(path.relative_to(model_dir))
    except ValueError:
        return str(path)


# -- graph checks -----------------------------------------------------------------------------
def _check_language_model(graph: GraphSpec, problems: list[str]) -> LanguageModelSpec | None:
    name = graph.path.name
    for required in ("inputs_embeds", "attention_mask"):
        if required not in graph.inputs:
            problems.append(f"{name}: missing input {required!r}")
    if "logits" not in graph.outputs:
        problems.append(f"{name}: missing output 'logits'")
    try:
        layout = kv_layout(graph)
    except ModelError as error:
        problems.append(f"{name}: {str(error).removeprefix(name + ': ')}")
        return None
    for integer_input in ("attention_mask", "position_ids"):
        spec = graph.inputs.get(integer_input)
        if spec is not None and spec.dtype != np.int64:
            problems.append(f"{name}: input {integer_input!r} is {spec.dtype}, expected int64")
    if problems:
        return None
    logits, embeds = graph.outputs["logits"], graph.inputs["inputs_embeds"]
    for what, spec in (("output 'logits'", logits), ("input 'inputs_embeds'", embeds)):
        if spec.dtype.kind != "f" or len(spec.shape) not in (0, 3):
            problems.append(
                f"{name}: {what} is {spec.dtype} of rank {len(spec.shape)}, expected floating "
                "point [batch, sequence, size]"
            )
    if problems:
        return None
    return LanguageModelSpec(
        kv=layout,
        embeds_dtype=embeds.dtype,
        logits_dtype=logits.dtype,
        vocab_size=logits.dim(2),
        hidden_size=embeds.dim(2),
        has_position_ids="position_ids" in graph.inputs,
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
        return
    waveform = next(iter(graph.outputs.values()))
    if waveform.dtype.kind != "f" or len(waveform.shape) > 3:
        problems.append(
            f"{name}: output {waveform.name!r} is {waveform.dtype} of rank "
            f"{len(waveform.shape)}, expected a floating point waveform"
        )


def _tokenizer_languages(tokenizer_path: Path) -> tuple[str, ...]:
    try:
        data = json.loads(tokenizer_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"{tokenizer_path} is not a readable tokenizer.json: {exc}") from None
    if not isinstance(data, dict):
        raise ModelError(f"{tokenizer_path} is not a tokenizer.json (no JSON object)")
    tokens = [t.get("content", "") for t in data.get("added_tokens", []) if isinstance(t, dict)]
    vocab = (data.get("model") or {}).get("vocab") or {}
    if isinstance(vocab, dict):
        tokens.extend(vocab)
    languages = {m.group(1) for t in tokens if (m := _LANGUAGE_TOKEN_RE.match(str(t)))}
    return tuple(sorted(languages))


# -- entry point ------------------------------------------------------------------------------
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
            raise layout_error(
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
            f"({_relative(model_dir, graph_file(graph_dir, 'language_model', precision))} "
            f"is missing){have}"
        )

    files, problems = resolve_graph_files(model_dir, precision)
    tokenizer_path = model_dir / "tokenizer.json"
    if not tokenizer_path.is_file():
        problems.append("missing tokenizer.json")
    graphs: dict[str, GraphSpec] = {}
    for role, path in files.items():
        spec = read_graph_spec(path)
        for sidecar in spec.external_data:
            sidecar_path = path.parent / sidecar
            inside_dir = real_path(sidecar_path).parent == real_path(path.parent)
            if not inside_dir:
                problems.append(
                    f"{path.name} keeps its weights in {sidecar!r}, outside its directory"
                )
            elif not sidecar_path.is_file():
                problems.append(
                    f"missing external-data file {_relative(model_dir, sidecar_path)} "
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
            width = embeds_out.dim(2)
            if width is not None and width != lm.hidden_size:
                problems.append(
                    f"hidden sizes differ: {embed.path.name} gives {width}, "
                    f"{graphs['language_model'].path.name} takes {lm.hidden_size}"
                )

    if problems or lm is None:
        raise layout_error(model_dir, problems or ["language model could not be read"])

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


def layout_error(model_dir: Path, problems: list[str]) -> ModelError:
    """One error naming every problem (on one line: the CLI prints errors as one line)."""
    return ModelError(
        f"{model_dir} is not a complete Chatterbox ONNX directory: {'; '.join(problems)}. "
        "Expected tokenizer.json and onnx/{speech_encoder,embed_tokens,language_model,"
        "conditional_decoder}[_fp16|_quantized|_q4|_q4f16].onnx with their .onnx_data files, "
        "as published in ResembleAI/chatterbox-turbo-ONNX, onnx-community/chatterbox-ONNX or "
        "onnx-community/chatterbox-multilingual-ONNX."
    )

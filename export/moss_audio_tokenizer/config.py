"""The published MOSS-Audio-Tokenizer `config.json`, read into typed, bounded specs.

Both layouts build their modules from lists of module entries (`encoder_kwargs`,
`decoder_kwargs`): a `PatchedPretransform` (a reshape by `patch_size`, no weights) or a
`Transformer` (input projection, causal RoPE transformer with a sliding window, output
projection). What differs between the two:

v1 (OpenMOSS-Team/MOSS-Audio-Tokenizer, read from its config.json and modeling code):
  mono; a projection exists only where its two widths differ; every transformer's attention
  window is `int(frame rate at its input x causal_transformer_context_duration)` steps.
v2 (OpenMOSS-Team/MOSS-Audio-Tokenizer-v2; its config is not public: the keys below are
  inferred from the modeling code vendored by vLLM-Omni and the loaders of SGLang-Omni):
  `number_channels` (or `num_channels`) and `enable_channel_interleave` (default true: the
  channels are interleaved into one stream at `channels x sampling_rate` before the encoder
  and split after the decoder); both projections always exist; a transformer entry may carry
  its own `context_duration`; windows are rounded, not truncated.

A v2 config is recognised by either channel key (or `model_type` "moss-audio-tokenizer"); any
value this exporter does not implement is refused by name, never silently ignored.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Literal

from export.checkpoint import CheckpointError

Version = Literal["v1", "v2"]

MAX_WIDTH = 1 << 16
MAX_LAYERS = 256
MAX_HEADS = 1024
MAX_PATCH = 1 << 16
MAX_CONTEXT = 1 << 22
MAX_QUANTIZERS = 256
MAX_CODEBOOK = 1 << 20
MAX_MODULES = 64
MAX_SAMPLE_RATE = 768_000

V2_MODEL_TYPE = "moss-audio-tokenizer"
# Quantizer types of the published code: the residual LFQ (L2-normalised lookup) and the plain
# residual VQ; the random-prefix / spectral variants only differ in training.
LFQ_TYPES = ("rlfq", "random_prefix_rlfq")
VQ_TYPES = ("rvq", "spec_rvq")


@dataclass(frozen=True)
class PatchSpec:
    """A PatchedPretransform: `size` steps folded into (encoder) or out of (decoder) channels."""

    size: int


@dataclass(frozen=True)
class TransformerSpec:
    """A ProjectedTransformer entry and the attention window its position in the stack gives."""

    input_dim: int
    output_dim: int
    d_model: int
    heads: int
    layers: int
    ffn: int
    context: int  # steps a query sees: itself and context - 1 before it
    max_period: float
    layer_scale: float | None  # None: no layer-scale tensors
    input_proj: bool
    output_proj: bool

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


Stage = PatchSpec | TransformerSpec


@dataclass(frozen=True)
class QuantizerSpec:
    input_dim: int
    rvq_dim: int
    output_dim: int
    quantizers: int
    codebook_size: int
    codebook_dim: int
    normalized: bool  # LFQ: L2-normalised lookup; VQ: plain nearest neighbour

    @property
    def projected(self) -> bool:
        """Each quantizer projects rvq_dim <-> codebook_dim (weight-normed 1x1 convs)."""
        return self.rvq_dim != self.codebook_dim


@dataclass(frozen=True)
class CodecSpec:
    version: Version
    sample_rate: int
    hop: int  # samples per channel per code frame
    channels: int
    interleave: bool  # channels folded into one stream of channels x sample_rate
    context_seconds: float
    encoder: tuple[Stage, ...]
    quantizer: QuantizerSpec
    decoder: tuple[Stage, ...]

    @property
    def frame_rate(self) -> float:
        return self.sample_rate / self.hop

    @property
    def stream_channels(self) -> int:
        """Channels of the signal the first encoder stage sees (1 when interleaved)."""
        return 1 if self.interleave else self.channels

    def encoder_transformers(self) -> list[tuple[int, TransformerSpec, int]]:
        """(index in the encoder list, spec, steps per code frame) of every encoder transformer."""
        found = []
        steps = math.prod(s.size for s in self.encoder if isinstance(s, PatchSpec))
        for index, stage in enumerate(self.encoder):
            if isinstance(stage, TransformerSpec):
                found.append((index, stage, steps))
            else:
                steps //= stage.size
        return found

    def decoder_transformers(self) -> list[tuple[int, TransformerSpec, int]]:
        """(index in the decoder list, spec, steps per code frame) of every decoder transformer."""
        found, steps = [], 1
        for index, stage in enumerate(self.decoder):
            if isinstance(stage, TransformerSpec):
                found.append((index, stage, steps))
            else:
                steps *= stage.size
        return found


def _number(value: Any, kind: type, low: float, high: float, where: str) -> Any:
    integral = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if kind is int and not integral:
        raise CheckpointError(f"config.json: {where} must be an integer, got {value!r:.40}")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise CheckpointError(f"config.json: {where} must be a number, got {value!r:.40}")
    number = kind(value) if math.isfinite(float(value)) else math.nan
    if not math.isfinite(number) or not low <= number <= high:
        raise CheckpointError(f"config.json: {where} must be in [{low:g}, {high:g}], got {value!r}")
    return number


def _get(entry: dict[str, Any], key: str, where: str, default: Any = ...) -> Any:
    if key in entry:
        return entry[key]
    if default is ...:
        raise CheckpointError(f"config.json: {where} has no {key!r}")
    return default


def _require(entry: dict[str, Any], key: str, allowed: tuple, where: str, default: Any) -> None:
    value = entry.get(key, default)
    if value not in allowed:
        raise CheckpointError(
            f"config.json: {where}.{key} is {value!r:.40}; this exporter implements "
            f"{' or '.join(repr(a) for a in allowed)} (the published value)"
        )


def version_of(config: dict[str, Any]) -> Version:
    v2_keys = ("number_channels", "num_channels", "enable_channel_interleave")
    if any(k in config for k in v2_keys) or config.get("model_type") == V2_MODEL_TYPE:
        return "v2"
    return "v1"


def _transformer(
    entry: dict[str, Any], where: str, version: Version, rate: float, seconds: float
) -> TransformerSpec:
    def integer(key: str, high: int) -> int:
        return _number(_get(entry, key, where), int, 1, high, f"{where}.{key}")

    input_dim, output_dim = (
        integer("input_dimension", MAX_WIDTH),
        integer("output_dimension", MAX_WIDTH),
    )
    d_model, heads = integer("d_model", MAX_WIDTH), integer("num_heads", MAX_HEADS)
    layers, ffn = integer("num_layers", MAX_LAYERS), integer("dim_feedforward", 4 * MAX_WIDTH)
    if d_model % heads or (d_model // heads) % 2:
        raise CheckpointError(
            f"config.json: {where}: d_model {d_model} must split into {heads} heads of an even "
            "width (RoPE rotates pairs)"
        )
    _require(entry, "causal", (True,), where, False)
    _require(entry, "positional_embedding", ("rope",), where, "sin")
    _require(entry, "norm", ("layer_norm",), where, "layer_norm")
    _require(entry, "gating", ("none",), where, "none")
    _require(entry, "weights_per_step", (0, None), where, 0)
    _require(entry, "positional_scale", (1.0, 1), where, 1.0)
    max_period = _number(entry.get("max_period", 10000), float, 1.0, 1e9, f"{where}.max_period")
    scale = entry.get("layer_scale")
    layer_scale = (
        None if scale is None else _number(scale, float, -1e6, 1e6, f"{where}.layer_scale")
    )
    if version == "v2":
        seconds = _number(
            entry.get("context_duration", seconds), float, 0.001, 3600, f"{where}.context_duration"
        )
        context = round(rate * seconds)
    else:
        context = int(rate * seconds)
    if not 1 <= context <= MAX_CONTEXT:
        raise CheckpointError(
            f"config.json: {where}: an attention window of {context} steps ({seconds:g} s at "
            f"{rate:g} steps/s) is out of range [1, {MAX_CONTEXT}]"
        )
    return TransformerSpec(
        input_dim=input_dim,
        output_dim=output_dim,
        d_model=d_model,
        heads=heads,
        layers=layers,
        ffn=ffn,
        context=context,
        max_period=max_period,
        layer_scale=layer_scale,
        input_proj=version == "v2" or input_dim != d_model,
        output_proj=version == "v2" or output_dim != d_model,
    )


def _stages(
    config: dict[str, Any], key: str, version: Version, rate: float, seconds: float, down: bool
) -> tuple[tuple[Stage, ...], float]:
    entries = _get(config, key, "the config")
    if not isinstance(entries, list) or not 1 <= len(entries) <= MAX_MODULES:
        raise CheckpointError(f"config.json: {key} must be a list of 1 to {MAX_MODULES} modules")
    stages: list[Stage] = []
    for index, entry in enumerate(entries):
        where = f"{key}[{index}]"
        if not isinstance(entry, dict):
            raise CheckpointError(f"config.json: {where} must be an object")
        kind = entry.get("module_type")
        if kind == "PatchedPretransform":
            size = _number(
                _get(entry, "patch_size", where), int, 1, MAX_PATCH, f"{where}.patch_size"
            )
            stages.append(PatchSpec(size))
            rate = rate / size if down else rate * size
        elif kind == "Transformer":
            stages.append(_transformer(entry, where, version, rate, seconds))
        else:
            raise CheckpointError(
                f"config.json: {where}.module_type is {kind!r:.40}; expected "
                "'PatchedPretransform' or 'Transformer'"
            )
    return tuple(stages), rate


def _check_widths(stages: tuple[Stage, ...], width: int, down: bool, what: str) -> int:
    """The channel width through the stack: each transformer must take what arrives."""
    for index, stage in enumerate(stages):
        if isinstance(stage, PatchSpec):
            if not down and width % stage.size:
                raise CheckpointError(
                    f"config.json: {what}[{index}]: {width} channels do not unfold by patch "
                    f"{stage.size}"
                )
            width = width * stage.size if down else width // stage.size
        else:
            if stage.input_dim != width:
                raise CheckpointError(
                    f"config.json: {what}[{index}].input_dimension is {stage.input_dim} but "
                    f"{width} channels arrive there"
                )
            width = stage.output_dim
    return width


def _quantizer(config: dict[str, Any]) -> QuantizerSpec:
    entry = _get(config, "quantizer_kwargs", "the config")
    if not isinstance(entry, dict):
        raise CheckpointError("config.json: quantizer_kwargs must be an object")
    kind = entry.get("quantizer_type", config.get("quantizer_type", "rvq"))
    if kind not in LFQ_TYPES + VQ_TYPES:
        raise CheckpointError(
            f"config.json: quantizer_type {kind!r:.40} is not one of {LFQ_TYPES + VQ_TYPES}"
        )

    def integer(key: str, high: int, default: Any = ...) -> int:
        value = _get(entry, key, "quantizer_kwargs", default)
        return _number(value, int, 1, high, f"quantizer_kwargs.{key}")

    input_dim = integer("input_dim", MAX_WIDTH)
    rvq_dim = integer("rvq_dim", MAX_WIDTH, None) if entry.get("rvq_dim") else input_dim
    output_dim = integer("output_dim", MAX_WIDTH, None) if entry.get("output_dim") else input_dim
    return QuantizerSpec(
        input_dim=input_dim,
        rvq_dim=rvq_dim,
        output_dim=output_dim,
        quantizers=integer("num_quantizers", MAX_QUANTIZERS, 32),
        codebook_size=integer("codebook_size", MAX_CODEBOOK, 1024),
        codebook_dim=integer("codebook_dim", MAX_WIDTH, 8),
        normalized=kind in LFQ_TYPES,
    )


def codec_spec(config: dict[str, Any]) -> CodecSpec:
    """The typed spec of a codec checkpoint's config.json (CheckpointError naming any key that
    is missing, out of range or not what the published codec uses)."""
    version = version_of(config)
    rate_key = "sampling_rate" if "sampling_rate" in config else "sample_rate"
    sample_rate = _number(
        _get(config, rate_key, "the config"), int, 1000, MAX_SAMPLE_RATE, rate_key
    )
    hop = _number(_get(config, "downsample_rate", "the config"), int, 1, 1 << 20, "downsample_rate")
    seconds = _number(
        config.get("causal_transformer_context_duration", 10.0),
        float,
        0.001,
        3600,
        "causal_transformer_context_duration",
    )
    channels, interleave = 1, False
    if version == "v2":
        key = "number_channels" if "number_channels" in config else "num_channels"
        channels = _number(config.get(key, 1), int, 1, 2, key)
        flag = config.get("enable_channel_interleave", True)
        if not isinstance(flag, bool):
            raise CheckpointError("config.json: enable_channel_interleave must be true or false")
        interleave = flag and channels > 1
    factor = channels if interleave else 1
    encoder, rate = _stages(
        config, "encoder_kwargs", version, float(sample_rate * factor), seconds, down=True
    )
    if not math.isclose(rate * hop, sample_rate, rel_tol=1e-9):
        raise CheckpointError(
            f"config.json: the encoder's patches give {rate:g} frames/s but "
            f"sampling_rate / downsample_rate is {sample_rate / hop:g}"
        )
    decoder, out_rate = _stages(config, "decoder_kwargs", version, rate, seconds, down=False)
    if round(out_rate) != sample_rate * factor:
        raise CheckpointError(
            f"config.json: the decoder's patches give {out_rate:g} samples/s, not the "
            f"{sample_rate * factor} the encoder started from"
        )
    quantizer = _quantizer(config)
    stream = 1 if interleave else channels
    latent = _check_widths(encoder, stream, True, "encoder_kwargs")
    if latent != quantizer.input_dim:
        raise CheckpointError(
            f"config.json: the encoder ends with {latent} channels but quantizer_kwargs.input_dim "
            f"is {quantizer.input_dim}"
        )
    out = _check_widths(decoder, quantizer.output_dim, False, "decoder_kwargs")
    if out != stream:
        raise CheckpointError(
            f"config.json: the decoder ends with {out} channels; {stream} expected for "
            f"{channels} channel(s)"
        )
    return CodecSpec(
        version=version,
        sample_rate=sample_rate,
        hop=hop,
        channels=channels,
        interleave=interleave,
        context_seconds=seconds,
        encoder=encoder,
        quantizer=quantizer,
        decoder=decoder,
    )


__all__ = [
    "CodecSpec",
    "PatchSpec",
    "QuantizerSpec",
    "Stage",
    "TransformerSpec",
    "Version",
    "codec_spec",
    "version_of",
]

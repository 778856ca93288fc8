"""The codec side of the export: its meta (sample rate, channels, quantizers), the streaming
decoder's state tensors (offsets and sliding attention caches, by name, dtype and shape), and
the declared I/O of its three graphs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from onnx_tts.errors import ModelError
from onnx_tts.families.moss_tts_nano.json_files import (
    JsonFile,
    checked_number,
    listed_graph,
)
from onnx_tts.families.moss_tts_nano.layout import (
    CODEC_DIR,
    CODEC_GRAPHS,
    DOWNLOAD_HINT,
    MAX_CODEBOOKS,
    MAX_CODEC_STATE_BYTES,
    MAX_CONTEXT,
    TTS_DIR,
    CodecConfig,
    StateSpec,
    TTSConfig,
)
from onnx_tts.graph_io import GraphSpec, check_graph_io


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


def inspect_codec(meta: JsonFile, codec_dir: Path, config: TTSConfig) -> tuple:
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
        name, listed, spec = listed_graph(meta, files, external, role, codec_dir, f"codec {role}")
        check_graph_io(spec, f"codec {role}", *expected[role], meta.path.name)
        graphs[role] = spec
        data[name] = listed
    return codec, state, graphs, data

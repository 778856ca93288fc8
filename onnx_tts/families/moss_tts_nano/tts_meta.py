"""The TTS side of the export: its meta (model config, tensor names, the fixed sampled
frame's constants), the manifest's generation defaults and builtin voices, and the declared
I/O of every TTS graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from onnx_tts.errors import ModelError
from onnx_tts.families.moss_tts_nano.json_files import (
    JsonFile,
    checked_number,
    listed_graph,
)
from onnx_tts.families.moss_tts_nano.layout import (
    DOWNLOAD_HINT,
    MAX_CODEBOOK_SIZE,
    MAX_CODEBOOKS,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_NEW_FRAMES,
    MAX_VOCAB,
    MAX_VOICE_FRAMES,
    MAX_VOICES,
    MAX_WIDTH,
    OPTIONAL_TTS_GRAPHS,
    REQUIRED_TTS_GRAPHS,
    SAMPLE_MODES,
    GenerationDefaults,
    TTSConfig,
)
from onnx_tts.graph_io import LENGTH_INPUTS, GraphSpec, check_graph_io


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


def generation_defaults(manifest: JsonFile) -> GenerationDefaults:
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


def builtin_voices(manifest: JsonFile, config: TTSConfig) -> dict[str, np.ndarray]:
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
        try:  # JSON integers only: a float code (3.0, 3.7) is a damaged manifest, not a code
            array = np.asarray(codes)
            if array.dtype.kind != "i":
                raise ValueError(array.dtype)
            array = array.astype(np.int64)
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
                f"of {config.n_vq} integer codes in [0, {config.codebook}); the manifest is "
                "damaged"
            )
        if name in voices:
            raise ModelError(f"{where}: a second voice named {name!r}; names must be unique")
        voices[name] = array.astype(np.int32)
    return voices


def inspect_tts(manifest: JsonFile, meta: JsonFile, tts_dir: Path) -> tuple:
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
        name, listed, spec = listed_graph(meta, files, external, role, tts_dir, role)
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
        data[name] = listed
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

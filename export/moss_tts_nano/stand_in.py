"""Write stand-in MOSS-TTS-Nano model directories in the published layout.

    python -m export.moss_tts_nano OUT_PARENT [--dims small|published] [--seed N]
        [--continue-bias X] [--without GRAPH ...] [--with-greedy-frame]

OUT_PARENT receives `MOSS-TTS-Nano-100M-ONNX/` and `MOSS-Audio-Tokenizer-Nano-ONNX/` exactly as
../shared/MOSS_TTS_NANO.md section 1 lists them: the manifest, both metas, a SentencePiece
`tokenizer.model`, five TTS graphs sharing `moss_tts_global_shared.data` /
`moss_tts_local_shared.data`, three codec graphs with `moss_audio_tokenizer_encode.data` and
`moss_audio_tokenizer_decode_shared.data`. Weights are random (torch seed); graphs are exported
with `torch.onnx.export` (TorchScript exporter, opset 17, as published), every initializer of
1 KiB or more moved to its group's shared file, identical tensors stored once.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from export.graph_files import OPSET, export_graph, remove_torch_sidecars, share_external_data

TTS_DIR = "MOSS-TTS-Nano-100M-ONNX"
CODEC_DIR = "MOSS-Audio-Tokenizer-Nano-ONNX"
MANIFEST = "browser_poc_manifest.json"
TTS_META = "tts_browser_onnx_meta.json"
CODEC_META = "codec_browser_onnx_meta.json"
TOKENIZER = "tokenizer.model"

TTS_FILES = {
    "prefill": "moss_tts_prefill.onnx",
    "decode_step": "moss_tts_decode_step.onnx",
    "local_decoder": "moss_tts_local_decoder.onnx",
    "local_cached_step": "moss_tts_local_cached_step.onnx",
    "local_fixed_sampled_frame": "moss_tts_local_fixed_sampled_frame.onnx",
}
GREEDY_FRAME_FILE = "moss_tts_local_greedy_frame.onnx"
GLOBAL_DATA = "moss_tts_global_shared.data"
LOCAL_DATA = "moss_tts_local_shared.data"
CODEC_FILES = {
    "encode": "moss_audio_tokenizer_encode.onnx",
    "decode_full": "moss_audio_tokenizer_decode_full.onnx",
    "decode_step": "moss_audio_tokenizer_decode_step.onnx",
}
ENCODE_DATA = "moss_audio_tokenizer_encode.data"
DECODE_DATA = "moss_audio_tokenizer_decode_shared.data"

# Published prompt templates (token ids of the real tokenizer; see MOSS_TTS_NANO.md 2.1).
USER_PROMPT_PREFIX = [4, 600, 289, 10356, 13, 10356, 10425, 1860, 4546, 12907, 10363, 13325, 11492]
USER_PROMPT_AFTER_REFERENCE = [
    10356, 10425, 3965, 7738, 11492, 505, 587, 10356, 10425, 352, 500, 856, 11492, 505, 587,
    10356, 10425, 2128, 1247, 594, 11492, 505, 587, 10356, 10425, 348, 909, 561, 3648, 11492,
    505, 587, 10356, 10425, 2818, 1305, 355, 348, 909, 11492, 505, 587, 10356, 10425, 484, 339,
    10367, 783, 11492, 505, 587, 10356, 10425, 2427, 980, 11492,
]  # fmt: skip
ASSISTANT_PROMPT_PREFIX = [10356, 14, 5, 4, 8165, 430]
GENERATION_DEFAULTS = {
    "max_new_frames": 375,
    "do_sample": True,
    "sample_mode": "fixed",
    "text_temperature": 1.0,
    "text_top_p": 1.0,
    "text_top_k": 50,
    "audio_temperature": 0.8,
    "audio_top_p": 0.95,
    "audio_top_k": 25,
    "audio_repetition_penalty": 1.2,
}
VOICE_NAMES = ("Junhao", "Ava", "Bella")
TEXT_SAMPLES = ("Hello, this is a short test.", "今天天气很好。")


@dataclass(frozen=True)
class StandIn:
    """What to build: sizes, seed and which optional pieces."""

    tts: Any  # tts_model.TTSDims
    codec: Any  # codec_model.CodecDims
    seed: int = 0
    # Local graphs to leave out (their `files` entry is dropped from the meta, as a dir that
    # lacks them would be), and the optional greedy frame graph.
    without: frozenset[str] = field(default_factory=frozenset)
    greedy_frame: bool = False
    voice_frames: tuple[int, ...] = (20, 12, 30)


def small() -> StandIn:
    """Test sizes: builds in seconds; published names, dtypes, ranks and code counts."""
    from export.moss_tts_nano.codec_model import CodecDims
    from export.moss_tts_nano.tts_model import TTSDims

    return StandIn(
        TTSDims(hidden=32, global_layers=2, heads=2, local_layers=1, local_heads=2),
        CodecDims(d_model=16, heads=2, layers=(1, 1, 1, 1), contexts=(6, 10, 14, 20)),
    )


def published() -> StandIn:
    """The published sizes (benchmarks): 12 x 768 global, 1 local layer, codec as published."""
    from export.moss_tts_nano.codec_model import CodecDims
    from export.moss_tts_nano.tts_model import TTSDims

    return StandIn(TTSDims(), CodecDims())


# -- export ---------------------------------------------------------------------------------
def _kv_names(kind: str, layers: int, prefix: str = "") -> list[str]:
    return [f"{prefix}{kind}_{t}_{i}" for i in range(layers) for t in ("key", "value")]


def tts_io(dims) -> dict[str, Any]:
    """The `onnx` section of the TTS meta (names as published)."""
    presents = _kv_names("present", dims.global_layers)
    return {
        "opset": OPSET,
        "prefill_output_names": ["global_hidden", *presents],
        "decode_input_names": [
            "input_ids",
            "past_valid_lengths",
            *_kv_names("past", dims.global_layers),
        ],
        "decode_output_names": ["global_hidden", *presents],
        "local_cached_input_names": [
            "global_hidden",
            "text_token_id",
            "audio_token_id",
            "channel_index",
            "step_type",
            "past_valid_lengths",
            *_kv_names("past", dims.local_layers, "local_"),
        ],
        "local_cached_output_names": [
            "text_logits",
            "audio_logits",
            *_kv_names("present", dims.local_layers, "local_"),
        ],
        "local_fixed_sampled_frame_input_names": [
            "global_hidden",
            "repetition_seen_mask",
            "assistant_random_u",
            "audio_random_u",
        ],
        "local_fixed_sampled_frame_output_names": ["should_continue", "frame_token_ids"],
        "fixed_sampled_frame_constants": {
            "text_temperature": 1.0,
            "text_top_p": 1.0,
            "text_top_k": 50,
            "audio_temperature": 0.8,
            "audio_top_p": 0.95,
            "audio_top_k": 25,
            "audio_repetition_penalty": 1.2,
        },
    }


def export_tts(model, out: Path, spec: StandIn) -> list[str]:
    """Export the TTS graphs into `out`; returns the roles exported."""
    import torch

    from export.moss_tts_nano import tts_model as tm

    dims = spec.tts
    io = tts_io(dims)
    past_len, seq_len = 3, 5
    kv_shape = (1, past_len, dims.heads, dims.head_dim)
    local_kv = (1, past_len, dims.local_heads, dims.local_head_dim)
    ids = torch.full((1, seq_len, dims.row_width), dims.audio_pad, dtype=torch.int32)
    ids[:, :, 0] = tm.PAD_TOKEN_ID
    roles = []
    with torch.no_grad():
        prefill_dyn = {"input_ids": {0: "batch", 1: "prefill_seq"}}
        prefill_dyn["attention_mask"] = {0: "batch", 1: "prefill_seq"}
        prefill_dyn["global_hidden"] = {0: "batch", 1: "prefill_seq"}
        for name in io["prefill_output_names"][1:]:
            prefill_dyn[name] = {0: "batch", 1: "prefill_seq"}
        export_graph(
            tm.Prefill(model),
            (ids, torch.ones((1, seq_len), dtype=torch.int32)),
            out / TTS_FILES["prefill"],
            ["input_ids", "attention_mask"],
            io["prefill_output_names"],
            prefill_dyn,
        )
        roles.append("prefill")

        decode_dyn = {
            "input_ids": {0: "batch", 1: "step_seq"},
            "past_valid_lengths": {0: "batch"},
            "global_hidden": {0: "batch", 1: "step_seq"},
        }
        for name in io["decode_input_names"][2:]:
            decode_dyn[name] = {0: "batch", 1: "past_seq"}
        for name in io["decode_output_names"][1:]:
            decode_dyn[name] = {0: "batch", 1: "total_seq"}
        past = tuple(torch.zeros(kv_shape) for _ in range(2 * dims.global_layers))
        export_graph(
            tm.DecodeStep(model),
            (ids[:, :1], torch.full((1,), past_len, dtype=torch.int32), *past),
            out / TTS_FILES["decode_step"],
            io["decode_input_names"],
            io["decode_output_names"],
            decode_dyn,
        )
        roles.append("decode_step")

        hidden = torch.zeros((1, dims.hidden))
        one = torch.zeros((1,), dtype=torch.int32)
        if "local_decoder" not in spec.without:
            prefix = torch.full((1, dims.n_vq - 1), dims.audio_pad, dtype=torch.int32)
            export_graph(
                tm.LocalDecoder(model),
                (hidden, one, prefix),
                out / TTS_FILES["local_decoder"],
                ["global_hidden", "text_token_id", "audio_prefix_token_ids"],
                ["text_logits", "audio_logits"],
                {},
            )
            roles.append("local_decoder")
        if "local_cached_step" not in spec.without:
            batch_only = {0: "batch"}
            cached_dyn = {name: batch_only for name in io["local_cached_input_names"][:6]}
            cached_dyn.update({name: batch_only for name in ("text_logits", "audio_logits")})
            for name in io["local_cached_input_names"][6:]:
                cached_dyn[name] = {0: "batch", 1: "local_past_seq"}
            for name in io["local_cached_output_names"][2:]:
                cached_dyn[name] = {0: "batch", 1: "local_total_seq"}
            local_past = tuple(torch.zeros(local_kv) for _ in range(2 * dims.local_layers))
            export_graph(
                tm.LocalCachedStep(model),
                (
                    hidden,
                    one,
                    one,
                    one,
                    one,
                    torch.full((1,), past_len, dtype=torch.int32),
                    *local_past,
                ),
                out / TTS_FILES["local_cached_step"],
                io["local_cached_input_names"],
                io["local_cached_output_names"],
                cached_dyn,
            )
            roles.append("local_cached_step")
        seen = torch.zeros((1, dims.n_vq, dims.codebook), dtype=torch.int32)
        if "local_fixed_sampled_frame" not in spec.without:
            names = io["local_fixed_sampled_frame_input_names"]
            outputs = io["local_fixed_sampled_frame_output_names"]
            export_graph(
                tm.LocalFixedSampledFrame(model),
                (hidden, seen, torch.full((1,), 0.5), torch.full((1, dims.n_vq), 0.5)),
                out / TTS_FILES["local_fixed_sampled_frame"],
                names,
                outputs,
                {name: {0: "batch"} for name in [*names, *outputs]},
            )
            roles.append("local_fixed_sampled_frame")
        if spec.greedy_frame:
            names = ["global_hidden", "repetition_seen_mask", "repetition_penalty"]
            outputs = ["should_continue", "frame_token_ids"]
            export_graph(
                tm.LocalGreedyFrame(model),
                (hidden, seen, torch.full((1,), 1.2)),
                out / GREEDY_FRAME_FILE,
                names,
                outputs,
                {name: {0: "batch"} for name in [*names, *outputs]},
            )
            roles.append("local_greedy_frame")
    return roles


def codec_state_names(dims) -> tuple[list[str], list[str]]:
    """decode_step state inputs and outputs, in graph order."""
    stages = len(dims.layers)
    inputs = [f"transformer_offset_{k}" for k in range(stages)]
    outputs = [f"transformer_offset_out_{k}" for k in range(stages)]
    for i in range(len(dims.cache_layout())):
        for kind in ("offset", "cached_keys", "cached_values", "cached_positions"):
            inputs.append(f"attn_{kind}_{i}")
            outputs.append(f"attn_{kind}_out_{i}")
    return inputs, outputs


def codec_meta(dims) -> dict[str, Any]:
    state_in, state_out = codec_state_names(dims)
    offsets = [
        {
            "index": k,
            "decoder_index": 1 + 2 * k,
            "input_name": f"transformer_offset_{k}",
            "output_name": f"transformer_offset_out_{k}",
            "shape": [1],
            "dtype": "int32",
        }
        for k in range(len(dims.layers))
    ]
    caches = []
    for i, (stage, layer, context) in enumerate(dims.cache_layout()):
        caches.append(
            {
                "index": i,
                "decoder_index": 1 + 2 * stage,
                "layer_index": layer,
                "context": context,
                "num_heads": dims.heads,
                "head_dim": dims.head_dim,
                "offset_input_name": f"attn_offset_{i}",
                "offset_output_name": f"attn_offset_out_{i}",
                "cached_keys_input_name": f"attn_cached_keys_{i}",
                "cached_keys_output_name": f"attn_cached_keys_out_{i}",
                "cached_values_input_name": f"attn_cached_values_{i}",
                "cached_values_output_name": f"attn_cached_values_out_{i}",
                "cached_positions_input_name": f"attn_cached_positions_{i}",
                "cached_positions_output_name": f"attn_cached_positions_out_{i}",
                "offset_shape": [1],
                "cache_shape": [1, dims.heads, context, dims.head_dim],
                "positions_shape": [1, context],
                "cache_dtype": "float32",
                "positions_dtype": "int32",
            }
        )
    return {
        "format_version": 2,
        "checkpoint_path": "MOSS-Audio-Tokenizer-Nano",
        "files": dict(CODEC_FILES),
        "external_data_files": {
            CODEC_FILES["encode"]: [ENCODE_DATA],
            CODEC_FILES["decode_full"]: [DECODE_DATA],
            CODEC_FILES["decode_step"]: [DECODE_DATA],
        },
        "codec_config": {
            "sample_rate": dims.sample_rate,
            "channels": dims.channels,
            "downsample_rate": dims.downsample,
            "num_quantizers": dims.n_q,
        },
        "onnx": {
            "opset": OPSET,
            "encode_input_names": ["waveform", "input_lengths"],
            "encode_output_names": ["audio_codes", "audio_code_lengths"],
            "decode_input_names": ["audio_codes", "audio_code_lengths"],
            "decode_output_names": ["audio", "audio_lengths"],
            "decode_step_input_names": ["audio_codes", "audio_code_lengths", *state_in],
            "decode_step_output_names": ["audio", "audio_lengths", *state_out],
        },
        "streaming_decode": {
            "batch_size": 1,
            "transformer_offsets": offsets,
            "attention_caches": caches,
        },
    }


def initial_codec_state(dims) -> list:
    """Zero offsets and caches, positions -1 (the published reset), in state-input order."""
    import torch

    state = [torch.zeros((1,), dtype=torch.int32) for _ in dims.layers]
    for _stage, _layer, context in dims.cache_layout():
        state += [
            torch.zeros((1,), dtype=torch.int32),
            torch.zeros((1, dims.heads, context, dims.head_dim)),
            torch.zeros((1, dims.heads, context, dims.head_dim)),
            torch.full((1, context), -1, dtype=torch.int32),
        ]
    return state


def export_codec(codec, out: Path) -> None:
    import torch

    from export.moss_tts_nano import codec_model as cm

    dims = codec.dims
    meta = codec_meta(dims)["onnx"]
    frames = 2
    codes = torch.zeros((1, frames, dims.n_q), dtype=torch.int32)
    lengths = torch.full((1,), frames, dtype=torch.int32)
    with torch.no_grad():
        waveform = torch.zeros((1, dims.channels, frames * dims.downsample))
        export_graph(
            cm.Encode(codec),
            (waveform, torch.full((1,), frames * dims.downsample, dtype=torch.int32)),
            out / CODEC_FILES["encode"],
            meta["encode_input_names"],
            meta["encode_output_names"],
            {
                "waveform": {0: "batch", 2: "waveform_length"},
                "input_lengths": {0: "batch"},
                "audio_codes": {0: "batch", 1: "code_length"},
                "audio_code_lengths": {0: "batch"},
            },
        )
        export_graph(
            cm.DecodeFull(codec),
            (codes, lengths),
            out / CODEC_FILES["decode_full"],
            meta["decode_input_names"],
            meta["decode_output_names"],
            {"audio_codes": {1: "code_length"}, "audio": {2: "audio_length"}},
        )
        export_graph(
            cm.DecodeStep(codec),
            (codes, lengths, *initial_codec_state(dims)),
            out / CODEC_FILES["decode_step"],
            meta["decode_step_input_names"],
            meta["decode_step_output_names"],
            {"audio_codes": {1: "code_length"}, "audio": {2: "audio_length"}},
        )


# -- metadata -------------------------------------------------------------------------------
def tts_meta(dims, roles: Sequence[str]) -> dict[str, Any]:
    files = {role: TTS_FILES[role] for role in TTS_FILES if role in roles}
    if "local_greedy_frame" in roles:
        files["local_greedy_frame"] = GREEDY_FRAME_FILE
    external = {
        name: [GLOBAL_DATA if role in ("prefill", "decode_step") else LOCAL_DATA]
        for role, name in files.items()
    }
    return {
        "format_version": 1,
        "checkpoint_path": "MOSS-TTS-Nano",
        "files": files,
        "external_data_files": external,
        "model_config": {
            "n_vq": dims.n_vq,
            "row_width": dims.row_width,
            "hidden_size": dims.hidden,
            "global_layers": dims.global_layers,
            "global_heads": dims.heads,
            "head_dim": dims.head_dim,
            "local_layers": dims.local_layers,
            "local_heads": dims.local_heads,
            "local_head_dim": dims.local_head_dim,
            "vocab_size": dims.vocab,
            "audio_codebook_sizes": [dims.codebook] * dims.n_vq,
            "audio_pad_token_id": dims.audio_pad,
            "pad_token_id": 3,
            "im_start_token_id": 4,
            "im_end_token_id": 5,
            "audio_start_token_id": 6,
            "audio_end_token_id": 7,
            "audio_user_slot_token_id": 8,
            "audio_assistant_slot_token_id": 9,
        },
        "onnx": tts_io(dims),
    }


def manifest(dims, voices: Mapping[str, np.ndarray], text_ids: Sequence[list[int]]) -> dict:
    return {
        "format_version": 1,
        "model_files": {
            "tts_meta": TTS_META,
            "codec_meta": f"../{CODEC_DIR}/{CODEC_META}",
            "tokenizer_model": TOKENIZER,
        },
        "tts_config": {
            "n_vq": dims.n_vq,
            "audio_pad_token_id": dims.audio_pad,
            "pad_token_id": 3,
            "im_start_token_id": 4,
            "im_end_token_id": 5,
            "audio_start_token_id": 6,
            "audio_end_token_id": 7,
            "audio_user_slot_token_id": 8,
            "audio_assistant_slot_token_id": 9,
            "audio_codebook_sizes": [dims.codebook] * dims.n_vq,
            "vocab_size": dims.vocab,
        },
        "prompt_templates": {
            "user_prompt_prefix_token_ids": USER_PROMPT_PREFIX,
            "user_prompt_after_reference_token_ids": USER_PROMPT_AFTER_REFERENCE,
            "assistant_prompt_prefix_token_ids": ASSISTANT_PROMPT_PREFIX,
        },
        "generation_defaults": dict(GENERATION_DEFAULTS),
        "builtin_voices": [
            {
                "voice": name,
                "display_name": name,
                "group": "stand-in",
                "audio_file": f"{name}.wav",
                "prompt_audio_codes": codes.tolist(),
            }
            for name, codes in voices.items()
        ],
        "text_samples": [
            {"id": f"sample_{i}", "text": text, "text_token_ids": ids}
            for i, (text, ids) in enumerate(zip(TEXT_SAMPLES, text_ids, strict=True))
        ],
    }


def _write_json(path: Path, payload: Mapping[str, Any], newline: bool = True) -> None:
    path.write_text(
        json.dumps(payload, indent=2, ensure_ascii=False) + ("\n" if newline else ""),
        encoding="utf-8",
    )


# -- entry point ----------------------------------------------------------------------------
def build(parent: str | os.PathLike[str], spec: StandIn | None = None) -> Path:
    """Write both model directories under `parent` (created; existing ones are replaced)
    and return `parent`."""
    import sentencepiece as spm
    import torch

    from export.moss_tts_nano.codec_model import CodecStandIn
    from export.moss_tts_nano.tokenizer import train_tokenizer
    from export.moss_tts_nano.tts_model import MossTTSStandIn

    spec = spec or small()
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".moss-stand-in-", dir=parent))
    try:
        tts_dir, codec_dir = staging / TTS_DIR, staging / CODEC_DIR
        tts_dir.mkdir()
        codec_dir.mkdir()
        torch.manual_seed(spec.seed)
        model = MossTTSStandIn(spec.tts).eval()
        codec = CodecStandIn(spec.codec).eval()
        roles = export_tts(model, tts_dir, spec)
        export_codec(codec, codec_dir)
        global_graphs = [tts_dir / TTS_FILES[r] for r in ("prefill", "decode_step")]
        local_graphs = [
            tts_dir / (GREEDY_FRAME_FILE if r == "local_greedy_frame" else TTS_FILES[r])
            for r in roles
            if r.startswith("local_")
        ]
        share_external_data(global_graphs, GLOBAL_DATA)
        if local_graphs:
            share_external_data(local_graphs, LOCAL_DATA)
        share_external_data([codec_dir / CODEC_FILES["encode"]], ENCODE_DATA)
        share_external_data(
            [codec_dir / CODEC_FILES["decode_full"], codec_dir / CODEC_FILES["decode_step"]],
            DECODE_DATA,
        )
        remove_torch_sidecars(tts_dir, (GLOBAL_DATA, LOCAL_DATA))
        remove_torch_sidecars(codec_dir, (ENCODE_DATA, DECODE_DATA))

        tokenizer = train_tokenizer()
        (tts_dir / TOKENIZER).write_bytes(tokenizer)
        sp = spm.SentencePieceProcessor(model_proto=tokenizer)
        rng = np.random.default_rng(spec.seed)
        voices = {
            name: rng.integers(0, spec.tts.codebook, (frames, spec.tts.n_vq))
            for name, frames in zip(VOICE_NAMES, spec.voice_frames, strict=False)
        }
        text_ids = [sp.encode(text, out_type=int) for text in TEXT_SAMPLES]
        _write_json(tts_dir / TTS_META, tts_meta(spec.tts, roles), newline=False)
        _write_json(tts_dir / MANIFEST, manifest(spec.tts, voices, text_ids))
        _write_json(codec_dir / CODEC_META, codec_meta(spec.codec))
        for name in (TTS_DIR, CODEC_DIR):
            target = parent / name
            if target.exists():
                shutil.rmtree(target)
            (staging / name).rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="parent directory (receives the two model directories)")
    parser.add_argument("--dims", choices=("small", "published"), default="small")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--continue-bias",
        type=float,
        help="stand-in: bias of the continue logit (large = never stops before max_new_frames)",
    )
    parser.add_argument(
        "--without",
        action="append",
        default=[],
        choices=("local_decoder", "local_cached_step", "local_fixed_sampled_frame"),
        help="leave out an optional local graph",
    )
    parser.add_argument("--with-greedy-frame", action="store_true")
    args = parser.parse_args(argv)
    spec = small() if args.dims == "small" else published()
    if args.continue_bias is not None:
        spec = replace(spec, tts=replace(spec.tts, continue_bias=args.continue_bias))
    spec = replace(
        spec, seed=args.seed, without=frozenset(args.without), greedy_frame=args.with_greedy_frame
    )
    build(args.out, spec)
    print(f"wrote {Path(args.out) / TTS_DIR} and {Path(args.out) / CODEC_DIR}", file=sys.stderr)
    return 0


__all__ = [
    "CODEC_DIR",
    "CODEC_FILES",
    "CODEC_META",
    "MANIFEST",
    "TTS_DIR",
    "TTS_FILES",
    "TTS_META",
    "StandIn",
    "build",
    "codec_meta",
    "codec_state_names",
    "initial_codec_state",
    "main",
    "published",
    "small",
]

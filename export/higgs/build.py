"""Writing a Higgs model directory from a published checkpoint (`onnx-tts export higgs`).

`export_model` reads the checkpoint (v2 or v3, `v2.read_v2` / `v3.read_v3`) and the codec,
writes the five graphs and the manifest, and checks every graph against its torch module on
the same inputs (differences recorded in bundle.json's "checks" and returned as report lines).
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from export.backbones.qwen3 import (
    Qwen3Backbone,
    check_backbone,
    checkpoint_weights,
    export_backbone,
)
from export.checkpoint import Checkpoint, CheckpointError
from export.external_weights import save_streamed
from export.higgs.codec import CodeDecoder, ReferenceEncoder, load_codec
from export.higgs.codec_modules import CodecConfig
from export.higgs.graphs import check_graph, export_graph
from export.higgs.heads import (
    build_embed_graph,
    build_head_graph,
    embed_reference,
    head_reference,
)
from export.higgs.v2 import DualFFNBackbone, V2Spec, build_dual_ffn_graph, read_v2
from export.higgs.v3 import BODY, CODEC_CONFIG, CODEC_PREFIX, ROPE, V3Spec, read_v3
from onnx_tts.bundle import FORMAT_VERSION, write_manifest

MAX_DEFAULT_POSITIONS = 32768
# Text tokens the family's prompts use, by version (looked up in tokenizer.json by name).
PROMPT_TOKENS = {
    "v2": (
        "<|begin_of_text|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
        "<|audio_out_bos|>",
        "<|audio_eos|>",
    ),
    "v3": ("<|tts|>", "<|ref_audio|>", "<|text|>", "<|audio|>"),
}
# Tokens some checkpoints have (older v3 ones lack <|ref_text|>: no transcript in the prompt).
OPTIONAL_TOKENS = {"v2": (), "v3": ("<|ref_text|>",)}
# Published generation defaults: v2 as Boson's examples/generation.py (with transformers'
# RAS window), v3 as SGLang-Omni's request defaults (temperature 1, no top-k, no top-p).
SAMPLING = {
    "v2": {"temperature": 1.0, "top_k": 50, "top_p": 0.95, "ras_window": 7, "ras_max_repeat": 2},
    "v3": {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "ras_window": 0, "ras_max_repeat": 2},
}
MAX_NEW_TOKENS = 2048
# SGLang-Omni's Higgs streaming: a first chunk at 20 frames, then 75 delayed rows (68 frames)
# per window, 8 frames of left context, 4 frames held back (decoded here as right context).
STREAMING = {
    "first_chunk_frames": 20,
    "stride_frames": 68,
    "overlap_frames": 8,
    "holdback_frames": 4,
    "crossfade_samples": 0,
}
REFERENCE_SECONDS = (1.0, 30.0)


def _codec_source(
    checkpoint: Checkpoint, version: str, codec_dir: Path | None
) -> tuple[Checkpoint, CodecConfig, str]:
    if codec_dir is not None:
        codec = Checkpoint(codec_dir, "codec checkpoint")
        return codec, CodecConfig.parse(codec.config), ""
    if version == "v3" and checkpoint.has(CODEC_CONFIG):
        return checkpoint, CodecConfig.parse(checkpoint.json(CODEC_CONFIG)), CODEC_PREFIX
    raise CheckpointError(
        "this checkpoint carries no codec: pass --codec DIR, the downloaded "
        "higgs-audio-v2-tokenizer directory (config.json + model.safetensors)"
    )


def _tokenizer_ids(path: Path, version: str) -> dict[str, int]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    ids = {name: tokenizer.token_to_id(name) for name in PROMPT_TOKENS[version]}
    missing = [name for name, value in ids.items() if value is None]
    if missing:
        raise CheckpointError(f"{path} lacks the prompt token(s) {', '.join(missing)}")
    for name in OPTIONAL_TOKENS[version]:
        if tokenizer.token_to_id(name) is not None:
            ids[name] = tokenizer.token_to_id(name)
    return {name: int(value) for name, value in ids.items()}


def _export_codec(
    codec_ck: Checkpoint, config: CodecConfig, prefix: str, out: Path, log
) -> list[Any]:
    codec = load_codec(codec_ck, config, prefix)
    encoder, decoder = ReferenceEncoder(codec).eval(), CodeDecoder(codec).eval()
    rng = np.random.default_rng(0)
    example = (rng.standard_normal((1, int(1.5 * config.sample_rate))) * 0.1).astype(np.float32)
    export_graph(
        encoder,
        (torch.from_numpy(example),),
        out / "encoder.onnx",
        ["audio"],
        ["codes"],
        {"audio": {1: "samples"}, "codes": {1: "frames"}},
    )
    checks = []
    for seconds in (1.0, 1.3, 2.02):  # both acoustic padding cases
        audio = (rng.standard_normal((1, int(seconds * config.sample_rate))) * 0.1).astype(
            np.float32
        )
        checks.append(
            check_graph("encoder", out / "encoder.onnx", encoder, {"audio": audio}, 0, ["codes"])
        )
    log("encoder.onnx: codes equal to torch")
    codes = rng.integers(0, config.codebook_size, (2, 30, config.quantizers), dtype=np.int64)
    export_graph(
        decoder,
        (torch.from_numpy(codes),),
        out / "decoder.onnx",
        ["codes"],
        ["audio"],
        {"codes": {0: "batch", 1: "frames"}, "audio": {0: "batch", 1: "samples"}},
    )
    with torch.no_grad():
        scale = float(decoder(torch.from_numpy(codes)).abs().max()) or 1.0
    checks.append(
        check_graph("decoder", out / "decoder.onnx", decoder, {"codes": codes}, 1e-4 * scale + 1e-6)
    )
    log(checks[-1].describe())
    return checks


def _export_tables(
    spec: V2Spec | V3Spec, checkpoint: Checkpoint, out: Path, routing: bool, log
) -> list[Any]:
    text, audio = spec.text_table(checkpoint), spec.audio_table(checkpoint)
    k, v = spec.codebooks, spec.codebook_size
    with open(out / "embed.onnx_data", "wb") as sink:
        graph = build_embed_graph(
            text.numpy(), audio.numpy(), k, v, routing, sink, "embed.onnx_data"
        )
    save_streamed(graph, out / "embed.onnx")
    rng = np.random.default_rng(1)
    ids = np.concatenate(
        [
            np.where(rng.random((2, 6, 1)) < 0.5, -1, rng.integers(0, text.shape[0], (2, 6, 1))),
            rng.integers(0, v, (2, 6, k)),
        ],
        axis=2,
    ).astype(np.int64)
    checks = [
        check_graph(
            "embed",
            out / "embed.onnx",
            embed_reference(text, audio, v, routing),
            {"input_ids": ids},
            1e-5,
        )
    ]
    del text
    weight = spec.head_weight(checkpoint)
    with open(out / "head.onnx_data", "wb") as sink:
        graph = build_head_graph(weight.numpy(), k, v, sink, "head.onnx_data")
    save_streamed(graph, out / "head.onnx")
    hidden = rng.standard_normal((3, weight.shape[1])).astype(np.float32)
    checks.append(
        check_graph(
            "head", out / "head.onnx", head_reference(weight, k), {"hidden_state": hidden}, 1e-3
        )
    )
    for check in checks:
        log(check.describe())
    return checks


def _export_backbone(
    spec: V2Spec | V3Spec, checkpoint: Checkpoint, out: Path, positions: int, log
) -> dict[str, float]:
    if isinstance(spec, V3Spec):
        dims = dataclasses.replace(spec.dims, max_position_embeddings=positions)
        export_backbone(dims, checkpoint_weights(checkpoint, BODY), out, name="backbone", rope=ROPE)
        module = Qwen3Backbone(dims, ROPE).eval()
        module.load(checkpoint, BODY)
        diffs = check_backbone(module, out / "backbone.onnx")
    else:
        with open(out / "backbone.onnx_data", "wb") as sink:
            graph = build_dual_ffn_graph(
                spec, spec.backbone_weights(checkpoint), sink, "backbone.onnx_data", positions
            )
        save_streamed(graph, out / "backbone.onnx")
        module = DualFFNBackbone(spec, positions).eval()
        checkpoint.load_into(module, spec.prefix)
        hidden = spec.dims.hidden_size

        def routed(generator: torch.Generator, batch: int, new: int) -> torch.Tensor:
            flags = (torch.rand(batch, new, 1, generator=generator) < 0.5).float()
            return torch.cat([torch.randn(batch, new, hidden, generator=generator), flags], -1)

        diffs = check_backbone(module, out / "backbone.onnx", embeds=routed)
    tolerance = 1e-3
    for name, diff in diffs.items():
        if not np.isfinite(diff) or diff > tolerance:
            raise CheckpointError(f"backbone.onnx: {name} differs from torch by {diff:.3g}")
    log(f"backbone: max |onnx - torch| {diffs}")
    return diffs


def export_model(
    checkpoint_dir: Path,
    out: Path,
    *,
    codec_dir: Path | None = None,
    positions: int | None = None,
    log: Callable[[str], None] = print,
) -> list[str]:
    """Write the model directory `out` (module docstring); returns the check report."""
    checkpoint = Checkpoint(checkpoint_dir, "Higgs checkpoint")
    kind = checkpoint.config.get("model_type")
    spec: V2Spec | V3Spec
    if kind == "higgs_multimodal_qwen3":
        version, spec = "v3", read_v3(checkpoint)
    elif kind in ("higgs_audio", "higgs_audio_v2"):
        version, spec = "v2", read_v2(checkpoint)
    else:
        raise CheckpointError(
            f"{checkpoint_dir}/config.json model_type {kind!r} is not a Higgs checkpoint "
            "(higgs_multimodal_qwen3, higgs_audio or higgs_audio_v2)"
        )
    codec_ck, codec_config, prefix = _codec_source(checkpoint, version, codec_dir)
    if codec_config.quantizers != spec.codebooks or codec_config.codebook_size + 2 != (
        spec.codebook_size
    ):
        raise CheckpointError(
            f"the codec has {codec_config.quantizers} x {codec_config.codebook_size} codes, the "
            f"model {spec.codebooks} x {spec.codebook_size} (with BOS/EOS): not a matching codec"
        )
    limit = min(spec.dims.max_position_embeddings, MAX_DEFAULT_POSITIONS)
    positions = limit if positions is None else positions
    if not 64 <= positions <= spec.dims.max_position_embeddings:
        raise CheckpointError(
            f"--positions must be in [64, {spec.dims.max_position_embeddings}], got {positions}"
        )
    tokenizer = checkpoint.file("tokenizer.json")
    tokens = _tokenizer_ids(tokenizer, version)
    out.mkdir(parents=True)
    shutil.copyfile(tokenizer, out / "tokenizer.json")
    log(f"Higgs {version}: {spec.dims.num_hidden_layers} layers, hidden {spec.dims.hidden_size}")
    checks = _export_codec(codec_ck, codec_config, prefix, out, log)
    checks += _export_tables(spec, checkpoint, out, version == "v2", log)
    backbone = _export_backbone(spec, checkpoint, out, positions, log)
    c = spec.dims
    manifest = {
        "format_version": FORMAT_VERSION,
        "family": "higgs",
        "name": f"higgs-{version}-{Path(checkpoint_dir).name}",
        "version": version,
        "sample_rate": codec_config.sample_rate,
        "graphs": {
            "encoder": "encoder.onnx",
            "embed": "embed.onnx",
            "lm": "backbone.onnx",
            "head": "head.onnx",
            "decoder": "decoder.onnx",
        },
        "text": {"tokenizer": "tokenizer.json", "tokens": tokens},
        "higgs": {
            "version": version,
            "codebooks": spec.codebooks,
            "codebook_size": spec.codebook_size,
            "hidden_size": c.hidden_size,
            "routing": version == "v2",
            "positions": positions,
            "max_new_tokens": MAX_NEW_TOKENS,
        },
        "kv": {
            "layers": c.num_hidden_layers,
            "kv_heads": c.num_key_value_heads,
            "head_dim": c.head_dim,
            "past_names": ["past_key_values.{i}.key", "past_key_values.{i}.value"],
            "present_names": ["present.{i}.key", "present.{i}.value"],
        },
        "codec": {
            "hop_length": codec_config.hop_length,
            "frame_rate": codec_config.frame_rate,
            "quantizers": codec_config.quantizers,
            "codebook_size": codec_config.codebook_size,
        },
        "encoder": {"min_seconds": REFERENCE_SECONDS[0], "max_seconds": REFERENCE_SECONDS[1]},
        "sampling": SAMPLING[version],
        "streaming": STREAMING,
        "checks": {
            **{
                f"{check.role}.{name}": diff
                for check in checks
                for name, diff in check.max_abs_diff.items()
            },
            **{f"backbone.{name}": diff for name, diff in backbone.items()},
        },
    }
    write_manifest(out, manifest)
    unread = [n for n in checkpoint.unread() if not n.startswith(CODEC_PREFIX)]
    report = [f"{name}: max |onnx - torch| {diff:.3g}" for name, diff in manifest["checks"].items()]
    if unread:
        report.append(f"tensors not exported: {len(unread)} (e.g. {', '.join(unread[:4])})")
    return report


__all__ = ["export_model"]

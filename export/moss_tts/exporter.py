"""`onnx-tts export moss-tts CHECKPOINT_DIR [--codec CODEC_DIR] OUT_DIR`: a published MOSS-TTS
checkpoint (Local-Transformer v1.5, Local-Transformer v1, Delay), read by tensor name into the
project's own modules and written as one model directory the engine loads (layout:
onnx_tts/families/moss_tts/layout.py), every graph checked against its torch module. The codec
(CODEC_DIR: the MOSS-Audio-Tokenizer checkpoint, or a codec `onnx-tts` already exported with
the model's n_vq quantizers) goes into OUT_DIR/codec; without it the model makes code frames
only.

Nothing from the checkpoint runs: weights are read by name (export/checkpoint.py), config.json
and tokenizer_config.json are data; the chat template of Local v1 / Delay (a Jinja template the
published processor renders) is rendered once, in Jinja's immutable sandbox, for a lone user
message with the generation prompt, and only the strings around the message are kept.

The output is staged in a directory beside OUT and renamed into place when everything passed.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from export.backbones.qwen3 import RopeTables, checkpoint_weights, export_backbone
from export.checkpoint import Checkpoint, CheckpointError
from export.moss_tts import checks, graphs
from export.moss_tts.config import MossConfig, read_config
from onnx_tts.bundle import write_manifest
from onnx_tts.errors import InputError
from onnx_tts.tools.model_dir import check_new_output, place_output

FORMAT_VERSION = 1
ROPE_CHOICES = ("auto", "float32", "bfloat16")
MAX_TEMPLATE_BYTES = 1 << 20
FRAME_RATE = 12.5
# The published generation defaults (SEED_MODELS.md sections 1-3): Local v1.5 as its README and
# model card recommend, Local v1 `_build_generation_config`, Delay `generate`.
SAMPLING = {
    "local-v1.5": dict(
        text_temperature=1.0,
        text_top_p=1.0,
        text_top_k=50,
        audio_temperature=1.7,
        audio_top_p=0.8,
        audio_top_k=25,
        audio_repetition_penalty=1.0,
        max_new_frames=4096,
    ),
    "local-v1": dict(
        text_temperature=1.5,
        text_top_p=1.0,
        text_top_k=50,
        audio_temperature=1.0,
        audio_top_p=0.95,
        audio_top_k=50,
        audio_repetition_penalty=1.1,
        max_new_frames=4096,
    ),
    "delay": dict(
        text_temperature=1.5,
        text_top_p=1.0,
        text_top_k=50,
        audio_temperature=1.7,
        audio_top_p=0.8,
        audio_top_k=25,
        audio_repetition_penalty=1.0,
        max_new_frames=1000,
    ),
}
PREFIX = checks.BACKBONE_PREFIX


def rope_tables(choice: str, config: dict[str, Any]) -> RopeTables:
    """ "auto": the checkpoint's stored dtype (`torch_dtype`): its published runtimes cast the
    rotary tables to the activation dtype, so a bf16 checkpoint runs with bf16-rounded tables."""
    if choice not in ROPE_CHOICES:
        raise InputError(f"--rope-tables must be one of {', '.join(ROPE_CHOICES)}")
    if choice == "auto":
        stored = config.get("torch_dtype") or config.get("dtype")
        choice = "bfloat16" if stored == "bfloat16" else "float32"
    return RopeTables(None if choice == "float32" else "bfloat16")


def chat_strings(checkpoint: Checkpoint) -> dict[str, str]:
    """The strings the checkpoint's chat template puts around one user message (with the
    generation prompt) and one assistant message; empty when it has no template (the
    published processor then falls back to the raw content)."""
    template = None
    if checkpoint.has("chat_template.jinja"):
        data = checkpoint.file("chat_template.jinja").read_bytes()
        if len(data) > MAX_TEMPLATE_BYTES:
            raise CheckpointError("chat_template.jinja is larger than 1 MiB")
        template = data.decode("utf-8")
    elif checkpoint.has("tokenizer_config.json"):
        found = checkpoint.json("tokenizer_config.json").get("chat_template")
        if isinstance(found, list):
            found = next(
                (
                    t.get("template")
                    for t in found
                    if isinstance(t, dict) and t.get("name") == "default"
                ),
                None,
            )
        template = found if isinstance(found, str) else None
    if template is None:
        return dict.fromkeys(
            ("user_prefix", "user_suffix", "assistant_prefix", "assistant_suffix", "user_end"), ""
        )
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def refuse(message: str) -> None:
        raise CheckpointError(f"the chat template raised: {message}")

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    environment.globals["raise_exception"] = refuse
    marker = "\u0000moss-tts-content\u0000"
    try:
        compiled = environment.from_string(template)
        user = compiled.render(
            messages=[{"role": "user", "content": marker}], add_generation_prompt=True
        )
        assistant = compiled.render(
            messages=[{"role": "assistant", "content": marker}], add_generation_prompt=False
        )
        # A user message before an assistant one (Local v1's continuation), no generation prompt.
        alone = compiled.render(
            messages=[{"role": "user", "content": marker}], add_generation_prompt=False
        )
    except CheckpointError:
        raise
    except Exception as error:  # a template that does not render is a broken checkpoint
        raise CheckpointError(f"the checkpoint's chat template does not render: {error}") from None
    if any(rendered.count(marker) != 1 for rendered in (user, assistant, alone)):
        raise CheckpointError("the chat template does not place the message content once")
    user_prefix, user_suffix = user.split(marker)
    assistant_prefix, assistant_suffix = assistant.split(marker)
    alone_prefix, user_end = alone.split(marker)
    if alone_prefix != user_prefix:
        raise CheckpointError("the chat template renders a user message's start two ways")
    return {
        "user_prefix": user_prefix,
        "user_suffix": user_suffix,
        "assistant_prefix": assistant_prefix,
        "assistant_suffix": assistant_suffix,
        "user_end": user_end,
    }


def verify_tensors(config: MossConfig, checkpoint: Checkpoint) -> None:
    """Every tensor the model reads is there with its shape (the project's modules built on
    the meta device, no memory): one CheckpointError naming every problem, before anything is
    written."""
    import torch

    from export.moss_tts.modules import build_module

    with torch.device("meta"):
        module = build_module(config)
    problems = []
    for name, tensor in module.state_dict().items():
        if name not in checkpoint.names:
            problems.append(f"missing {name} {list(tensor.shape)}")
        elif checkpoint.shape(name) != tuple(tensor.shape):
            problems.append(
                f"{name} is {list(checkpoint.shape(name))}, expected {list(tensor.shape)}"
            )
    if problems:
        shown = "; ".join(problems[:12])
        more = f"; and {len(problems) - 12} more" if len(problems) > 12 else ""
        raise CheckpointError(
            f"checkpoint {checkpoint.root} does not match the published {config.variant} "
            f"layout: {shown}{more}"
        )


def _write_graphs(
    config: MossConfig, checkpoint: Checkpoint, out: Path, rope: RopeTables
) -> dict[str, str]:
    weights = lambda name: checkpoint.tensor(name).numpy()  # noqa: E731
    export_backbone(
        config.backbone, checkpoint_weights(checkpoint, PREFIX[config.variant]), out, rope=rope
    )
    roles = {"backbone": "backbone.onnx"}
    graphs.write_embed(config, weights, out)
    roles["embed"] = "embed.onnx"
    if config.variant == "local-v1.5":
        graphs.write_local_v15(config, weights, out, rope)
        roles["local"] = "local.onnx"
    elif config.variant == "local-v1":
        graphs.write_local_v1(config, weights, out)
        roles["local"] = "local.onnx"
        for k, path in enumerate(graphs.write_heads_v1(config, weights, out)):
            roles[f"head_{k:02d}"] = path.relative_to(out).as_posix()
    else:
        graphs.write_heads_delay(config, weights, out)
        roles.update(heads_text="heads_text.onnx", heads_audio="heads_audio.onnx")
    return roles


def _check(
    config: MossConfig, checkpoint: Checkpoint, out: Path, roles: dict[str, str], rope: RopeTables
) -> dict[str, dict[str, float]]:
    found = {
        "backbone": checks.check_backbone_graph(config, checkpoint, out / roles["backbone"], rope),
        "embed": checks.check_embed(
            config, checkpoint, out / roles["embed"], graphs.table_names(config)
        ),
    }
    if config.variant == "local-v1.5":
        found["local"] = checks.check_local_v15(config, checkpoint, out / "local.onnx", rope)
    elif config.variant == "local-v1":
        heads = [out / roles[f"head_{k:02d}"] for k in range(config.channels)]
        found["local"] = checks.check_local_v1(config, checkpoint, out / "local.onnx", heads)
    else:
        found["heads"] = checks.check_heads_delay(
            config, checkpoint, out / "heads_text.onnx", out / "heads_audio.onnx"
        )
    return found


def _manifest(
    config: MossConfig,
    checkpoint: Checkpoint,
    roles: dict[str, str],
    audio: dict,
    rope: RopeTables,
    report: dict[str, Any],
) -> dict[str, Any]:
    c, b = config, config.backbone
    model: dict[str, Any] = {
        "hidden": c.hidden,
        "vocab": c.vocab,
        "n_vq": c.n_vq,
        "codebook": c.codebook,
        "audio_pad": c.audio_pad,
    }
    if c.local_v1 is not None:
        model.update(
            local_hidden=c.local_v1.hidden,
            local_layers=c.local_v1.layers,
            local_kv_heads=c.local_v1.kv_heads,
            local_head_dim=c.local_v1.head_dim,
        )
    if c.local_gpt2 is not None:
        model.update(
            local_layers=c.local_gpt2.layers,
            local_kv_heads=c.local_gpt2.heads,
            local_head_dim=c.local_gpt2.head_dim,
        )
    tokens = {k: v for k, v in c.tokens.as_dict().items() if v is not None}
    tokens = {("delay_slot" if k == "delay_slot" else k): v for k, v in tokens.items()}
    text: dict[str, Any] = {"tokenizer": "tokenizer.json"}
    if c.variant != "local-v1.5":
        text["chat"] = chat_strings(checkpoint)
    data = {role: f"{path}_data" for role, path in roles.items() if not role.startswith("codec")}
    if audio.get("codec"):  # the codec's data files, so the manifest hashes them too
        data["codec"] = sorted({f"codec/{name}" for names in audio["codec_data"] for name in names})
    return {
        "format_version": FORMAT_VERSION,
        "family": "moss-tts",
        "name": checkpoint.root.name,
        "variant": c.variant,
        "sample_rate": audio["sample_rate"],
        "audio": {"channels": audio["channels"], "hop_length": audio["hop_length"]},
        "graphs": roles,
        "data": data,
        "kv": {
            "layers": b.num_hidden_layers,
            "kv_heads": b.num_key_value_heads,
            "head_dim": b.head_dim,
            "dtype": "float32",
            "max_positions": b.max_position_embeddings,
        },
        "model": model,
        "tokens": tokens,
        "text": text,
        "sampling": SAMPLING[c.variant],
        **({"codec": {"directory": "codec"}} if audio.get("codec") else {}),
        "export": {"rope_tables": rope.describe(), "report": report},
    }


def _codec(
    config: MossConfig,
    codec_dir: Path | None,
    out: Path,
    roles: dict[str, str],
    report: dict[str, Any],
) -> dict[str, Any]:
    """The codec into out/codec (its exporter), its graphs added to `roles`; the audio format."""
    if codec_dir is None:
        channels = 2 if config.variant == "local-v1.5" else 1
        return {
            "sample_rate": config.sampling_rate,
            "channels": channels,
            "hop_length": int(config.sampling_rate / FRAME_RATE),
            "codec": False,
        }
    codec_dir = Path(codec_dir)
    if (codec_dir / "codec.json").is_file():  # a codec already exported: taken as it is
        meta = json.loads((codec_dir / "codec.json").read_text(encoding="utf-8"))
        if meta.get("quantizers") != config.n_vq:
            raise InputError(
                f"the exported codec {codec_dir} keeps {meta.get('quantizers')!r} quantizers; "
                f"this model needs {config.n_vq}: export the codec checkpoint itself"
            )
        shutil.copytree(codec_dir, out / "codec")
        report["codec"] = {"copied": str(codec_dir)}
    else:
        from export.moss_audio_tokenizer import export_codec

        report["codec"] = export_codec(codec_dir, out / "codec", quantizers=config.n_vq)
    meta = json.loads((out / "codec" / "codec.json").read_text(encoding="utf-8"))
    for role, name in meta["files"].items():
        roles[f"codec_{role}"] = f"codec/{name}"
    return {
        "sample_rate": int(meta["sample_rate"]),
        "channels": int(meta["channels"]),
        "hop_length": int(meta["hop_length"]),
        "codec": True,
        "codec_data": list(meta.get("external_data", {}).values()),
    }


def export_moss_tts(
    checkpoint_dir: Path,
    out_dir: Path,
    *,
    codec_dir: Path | None = None,
    rope: str = "auto",
    check: bool = True,
) -> dict[str, Any]:
    """Export (module docstring); returns the report (variant, graph checks, unread tensors)."""
    checkpoint_dir, out_dir = Path(checkpoint_dir), Path(out_dir)
    if not checkpoint_dir.is_dir():
        raise CheckpointError(f"checkpoint {checkpoint_dir} is not a directory")
    resolved = out_dir.resolve()
    if resolved == checkpoint_dir.resolve() or checkpoint_dir.resolve() in resolved.parents:
        raise InputError(f"{out_dir} is inside the checkpoint directory; give OUT_DIR elsewhere")
    check_new_output(out_dir, "exported model")
    with Checkpoint(checkpoint_dir) as checkpoint:
        config = read_config(checkpoint.config, checkpoint.names, f"checkpoint {checkpoint_dir}")
        tables = rope_tables(rope, checkpoint.config)
        verify_tensors(config, checkpoint)
        staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
        try:
            roles = _write_graphs(config, checkpoint, staging, tables)
            shutil.copyfile(checkpoint.file("tokenizer.json"), staging / "tokenizer.json")
            report: dict[str, Any] = {"variant": config.variant, "rope_tables": tables.describe()}
            if check:
                report["checks"] = _check(config, checkpoint, staging, roles, tables)
            audio = _codec(config, codec_dir, staging, roles, report)
            report["unread"] = checkpoint.unread()
            write_manifest(
                staging,
                _manifest(
                    config,
                    checkpoint,
                    roles,
                    audio,
                    tables,
                    {k: v for k, v in report.items() if k != "codec"},
                ),
            )
            place_output(staging, out_dir)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return report


__all__ = ["ROPE_CHOICES", "SAMPLING", "chat_strings", "export_moss_tts", "rope_tables"]

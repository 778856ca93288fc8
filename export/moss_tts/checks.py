"""Every graph an export writes, run beside the project's torch module it came from (float32, the
same weights read from the checkpoint): the max absolute differences of each output, for the
export report. Modules are built part by part, so a check never holds the whole model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from torch import nn

from export.backbones.qwen3 import Qwen3Backbone, RMSNorm, RopeTables, check_backbone
from export.checkpoint import Checkpoint
from export.moss_tts.config import MossConfig
from export.moss_tts.modules import GPT2Local, SwiGLU

BACKBONE_PREFIX = {
    "local-v1.5": "transformer.",
    "local-v1": "model.language_model.",
    "delay": "language_model.",
}


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _loaded(module: nn.Module, checkpoint: Checkpoint, prefix: str) -> nn.Module:
    checkpoint.load_into(module, prefix)
    return module.eval()


def _diff(a, b) -> float:
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


def check_backbone_graph(
    config: MossConfig, checkpoint: Checkpoint, graph: Path, rope: RopeTables
) -> dict[str, float]:
    module = Qwen3Backbone(config.backbone, rope)
    return check_backbone(_loaded(module, checkpoint, BACKBONE_PREFIX[config.variant]), graph)


def check_embed(
    config: MossConfig, checkpoint: Checkpoint, graph: Path, names: list[str]
) -> dict[str, float]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.codebook, (2, 5, config.channels), generator=generator)
    ids[..., 0] = torch.randint(0, config.vocab, (2, 5), generator=generator)
    ids[0, 1, 1:] = config.audio_pad
    tables = [checkpoint.tensor(name) for name in names]
    feeds = {"input_ids": ids.numpy()}
    if config.variant == "local-v1":
        channels = np.array([config.n_vq, max(1, config.n_vq // 3)], np.int64)
        feeds["channels"] = channels
    expected = (
        torch.zeros(2, 5, config.hidden) if config.variant == "local-v1" else tables[0][ids[..., 0]]
    )
    for k in range(1 if config.variant != "local-v1" else 0, config.channels):
        rows = tables[k][ids[..., k].clamp(max=tables[k].shape[0] - 1)]
        if config.variant == "local-v1.5" and k:
            rows = rows * ids[..., k].ne(config.audio_pad).unsqueeze(-1)
        if config.variant == "local-v1" and k:
            rows = rows * torch.as_tensor(k <= feeds["channels"]).float()[:, None, None]
        expected = expected + rows
    got = _session(graph).run(["inputs_embeds"], feeds)[0]
    return {"inputs_embeds": _diff(got, expected.numpy())}


def check_local_v15(
    config: MossConfig, checkpoint: Checkpoint, graph: Path, rope: RopeTables
) -> dict[str, float]:
    local = _loaded(GPT2Local(config.local_gpt2, rope), checkpoint, "local_transformer.")
    head = _loaded(nn.Linear(config.hidden, 2, bias=False), checkpoint, "local_text_lm_head.")
    tables = [checkpoint.tensor(f"audio_embeddings.{k}.weight") for k in range(config.n_vq)]
    session = _session(graph)
    names = [o.name for o in session.get_outputs()]
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, 1, config.hidden, generator=generator)
    past, feeds_past = (
        None,
        {
            f"past_key_values.{i}.{kind}": np.zeros(
                (2, local.local.heads, 0, local.local.head_dim), np.float32
            )
            for i in range(local.local.layers)
            for kind in ("key", "value")
        },
    )
    worst = {"text_logits": 0.0, "audio_logits": 0.0, "present": 0.0}
    with torch.no_grad():
        for position in range(config.n_vq):
            positions = torch.full((2, 1), position, dtype=torch.long)
            hidden, past = local(x, positions, past)
            text = head(hidden[:, -1])
            audio = hidden[:, -1] @ tables[position].T
            out = dict(
                zip(
                    names,
                    session.run(
                        None,
                        {
                            "inputs_embeds": x.numpy(),
                            "position_ids": positions.numpy(),
                            "channel": np.array(position, np.int64),
                            **feeds_past,
                        },
                    ),
                    strict=True,
                )
            )
            worst["text_logits"] = max(worst["text_logits"], _diff(out["text_logits"][:, 0], text))
            worst["audio_logits"] = max(
                worst["audio_logits"], _diff(out["audio_logits"][:, 0], audio)
            )
            for i, (key, value) in enumerate(past):
                for kind, tensor in (("key", key), ("value", value)):
                    got = out[f"present.{i}.{kind}"]
                    worst["present"] = max(worst["present"], _diff(got, tensor))
                    feeds_past[f"past_key_values.{i}.{kind}"] = got
            tokens = torch.randint(0, config.codebook, (2,), generator=generator)
            x = tables[position][tokens][:, None]
    return worst


def check_local_v1(
    config: MossConfig, checkpoint: Checkpoint, local_graph: Path, heads: list[Path]
) -> dict[str, float]:
    local_config = config.local_v1
    assert local_config is not None
    stack = _loaded(
        Qwen3Backbone(local_config.qwen3(), rotary=False), checkpoint, "local_transformer."
    )
    mlp_in = _loaded(
        SwiGLU(config.hidden, local_config.mlp, local_config.hidden),
        checkpoint,
        "speech_embedding_to_local_mlp.",
    )
    session = _session(local_graph)
    names = [o.name for o in session.get_outputs()]
    generator = torch.Generator().manual_seed(2)
    worst = {"local_hidden": 0.0, "present": 0.0, "logits": 0.0}
    feeds_past = {
        f"past_key_values.{i}.{kind}": np.zeros(
            (2, local_config.kv_heads, 0, local_config.head_dim), np.float32
        )
        for i in range(local_config.layers)
        for kind in ("key", "value")
    }
    past, outputs = None, []
    with torch.no_grad():
        for step in range(4):
            x = torch.randn(2, 1, config.hidden, generator=generator)
            mask = torch.ones(2, step + 1, dtype=torch.long)
            hidden, past = stack(mlp_in(x), mask, None, past)
            out = dict(
                zip(
                    names,
                    session.run(
                        None,
                        {"inputs_embeds": x.numpy(), "attention_mask": mask.numpy(), **feeds_past},
                    ),
                    strict=True,
                )
            )
            worst["local_hidden"] = max(worst["local_hidden"], _diff(out["local_hidden"], hidden))
            for i, (key, value) in enumerate(past):
                for kind, tensor in (("key", key), ("value", value)):
                    got = out[f"present.{i}.{kind}"]
                    worst["present"] = max(worst["present"], _diff(got, tensor))
                    feeds_past[f"past_key_values.{i}.{kind}"] = got
            outputs.append(hidden[:, 0])
        for k, path in enumerate(heads):
            mlp = _loaded(
                SwiGLU(local_config.hidden, local_config.mlp, config.hidden),
                checkpoint,
                f"local_to_speech_embedding_mlps.{k}.",
            )
            norm = _loaded(
                RMSNorm(config.hidden, 1e-6), checkpoint, f"layer_norm_before_lm_heads.{k}."
            )
            weight = checkpoint.tensor(f"lm_heads.{k}.weight")
            hidden = outputs[k % len(outputs)]
            expected = norm(mlp(hidden)) @ weight.T
            got = _session(path).run(["logits"], {"local_hidden": hidden.numpy()})[0]
            worst["logits"] = max(worst["logits"], _diff(got, expected))
    return worst


def check_heads_delay(
    config: MossConfig, checkpoint: Checkpoint, text: Path, audio: Path
) -> dict[str, float]:
    hidden = torch.randn(3, config.hidden, generator=torch.Generator().manual_seed(3))
    text_weight = checkpoint.tensor("lm_heads.0.weight")
    expected_text = hidden @ text_weight.T
    got_text = _session(text).run(["text_logits"], {"hidden": hidden.numpy()})[0]
    slots = [config.tokens.assistant_slot, config.tokens.delay_slot]
    got_slots, got_audio = _session(audio).run(
        ["slot_logits", "audio_logits"], {"hidden": hidden.numpy()}
    )
    expected_audio = torch.stack(
        [hidden @ checkpoint.tensor(f"lm_heads.{k + 1}.weight").T for k in range(config.n_vq)],
        dim=1,
    )
    return {
        "text_logits": _diff(got_text, expected_text),
        "slot_logits": _diff(got_slots, expected_text[:, slots]),
        "audio_logits": _diff(got_audio, expected_audio),
    }


__all__ = [
    "BACKBONE_PREFIX",
    "check_backbone_graph",
    "check_embed",
    "check_heads_delay",
    "check_local_v1",
    "check_local_v15",
]

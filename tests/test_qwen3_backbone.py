"""export/backbones/qwen3.py: the shared Qwen3 backbone (torch module by tensor name, its ONNX
LM-with-past, the check against torch, and the offline tools on the graph)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch  # the test extra installs it (export): a missing one fails, never skips

from export.backbones.qwen3 import (
    Qwen3Backbone,
    Qwen3Config,
    RopeTables,
    check_backbone,
    checkpoint_weights,
    export_backbone,
    rotary_tables,
    state_weights,
)
from export.checkpoint import Checkpoint, CheckpointError, write_checkpoint

CONFIG = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 96,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "max_position_embeddings": 256,
    "vocab_size": 97,
}


def _random(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)
    return module.eval()


def test_module_equals_transformers_qwen3():
    """An independent reference: transformers' own Qwen3Model with the same weights."""
    import transformers

    config = Qwen3Config.from_dict(CONFIG)
    mine = _random(Qwen3Backbone(config))
    theirs = transformers.Qwen3Model(transformers.Qwen3Config(**CONFIG)).eval()
    missing, unexpected = theirs.load_state_dict(mine.state_dict(), strict=False)
    assert missing == ["embed_tokens.weight"] and not unexpected
    embeds = torch.randn(2, 9, CONFIG["hidden_size"], generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, presents = mine(embeds, torch.ones(2, 9, dtype=torch.int64), torch.arange(9)[None])
        reference = theirs(inputs_embeds=embeds, use_cache=True)
    assert float((ours - reference.last_hidden_state).abs().max()) < 1e-5
    key = reference.past_key_values.layers[0].keys
    assert float((presents[0][0] - key).abs().max()) < 1e-5


def test_graph_matches_module_and_converts_in_place(tmp_path):
    config = Qwen3Config.from_dict(CONFIG)
    module = _random(Qwen3Backbone(config), seed=2)
    files = export_backbone(config, state_weights(module), tmp_path / "fp32")
    diffs = check_backbone(module, files.graph)
    assert diffs["last_hidden_state"] < 1e-5 and diffs["present"] < 1e-5
    graph = onnx.load(str(files.graph), load_external_data=False)
    assert [i.name for i in graph.graph.input][:3] == [
        "inputs_embeds",
        "attention_mask",
        "position_ids",
    ]
    assert graph.graph.output[0].name == "last_hidden_state"
    assert {o.name for o in graph.graph.output} >= {"present.1.key", "present.1.value"}
    # Weights live in the data file (offsets page-aligned for large ones), not in the graph.
    assert files.graph.stat().st_size < 40_000 < files.data.stat().st_size

    from onnx_tts.tools.convert import convert_inplace_kv

    (tmp_path / "gqa").mkdir()
    report = convert_inplace_kv(files.graph, tmp_path / "gqa" / "backbone.onnx")
    assert report.check is not None and report.check.max_abs_diff_inplace < 1e-4
    converted = onnx.load(str(tmp_path / "gqa" / "backbone.onnx"), load_external_data=False)
    assert sum(n.op_type == "GroupQueryAttention" for n in converted.graph.node) == 2


def test_loads_by_prefix_and_streams_from_the_checkpoint(tmp_path):
    config = Qwen3Config.from_dict(CONFIG)
    source = _random(Qwen3Backbone(config), seed=3)
    tensors = {f"model.language_model.{k}": v for k, v in source.state_dict().items()}
    write_checkpoint(tmp_path / "ckpt", tensors, {"language_config": CONFIG}, shards=2)
    with Checkpoint(tmp_path / "ckpt") as checkpoint:
        loaded = Qwen3Backbone(config)
        loaded.load(checkpoint, "model.language_model.")
        files = export_backbone(
            config, checkpoint_weights(checkpoint, "model.language_model."), tmp_path / "out"
        )
    assert all(
        torch.equal(a, b) for a, b in zip(source.parameters(), loaded.parameters(), strict=True)
    )
    assert check_backbone(loaded, files.graph)["last_hidden_state"] < 1e-5
    del tensors["model.language_model.layers.1.self_attn.k_norm.weight"]
    write_checkpoint(tmp_path / "broken", tensors, {})
    with Checkpoint(tmp_path / "broken") as checkpoint, pytest.raises(CheckpointError) as error:
        Qwen3Backbone(config).load(checkpoint, "model.language_model.")
    assert "missing model.language_model.layers.1.self_attn.k_norm.weight [16]" in str(error.value)


def test_rope_tables_round_as_the_published_casts(tmp_path):
    config = Qwen3Config.from_dict(CONFIG)
    cos, _ = rotary_tables(config, RopeTables())
    nearest, _ = rotary_tables(config, RopeTables("bfloat16"))
    truncated, _ = rotary_tables(config, RopeTables("bfloat16", "truncate"))
    assert torch.equal(nearest, cos.to(torch.bfloat16).float())
    bits = truncated.numpy().view(np.uint32)
    assert not (bits & 0xFFFF).any() and not torch.equal(truncated, nearest)
    assert float((truncated - cos).abs().max()) < 2**-7
    # Rounded tables change the output beyond float32 noise; the graph follows the module.
    module = _random(Qwen3Backbone(config, RopeTables("bfloat16")), seed=4)
    plain = Qwen3Backbone(config)
    plain.load_state_dict(module.state_dict())
    embeds = torch.randn(1, 5, CONFIG["hidden_size"], generator=torch.Generator().manual_seed(5))
    args = (embeds, torch.ones(1, 5, dtype=torch.int64), torch.arange(5)[None])
    with torch.no_grad():
        assert float((module(*args)[0] - plain(*args)[0]).abs().max()) > 1e-6
    files = export_backbone(config, state_weights(module), tmp_path, rope=RopeTables("bfloat16"))
    assert check_backbone(module, files.graph)["last_hidden_state"] < 1e-6


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_key_value_heads": 3}, "not a multiple"),
        ({"hidden_size": "big"}, "hidden_size must be a number"),
        ({"rope_scaling": {"rope_type": "yarn"}}, "rope scaling 'yarn'"),
        ({"head_dim": 15}, "must be even"),
    ],
)
def test_bad_configs_are_one_clear_error(change, message):
    with pytest.raises(CheckpointError, match=message):
        Qwen3Config.from_dict({**CONFIG, **change})

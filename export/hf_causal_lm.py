"""A Hugging Face causal LM exported in the layout third parties publish (optimum's
`text-generation-with-past`): one `model.onnx` taking `input_ids`, `attention_mask`,
`position_ids` and `past_key_values.{i}.key|value` [B, H, P, D] (P may be 0), giving `logits`
and `present.{i}.key|value`, the cache grown by Concat inside the model's own attention code.

The tests and benchmarks use it to have real-world LM graphs for `onnx-tts convert` without
`optimum-onnx` (which pins `transformers` < 4.58; the Higgs v2 reference needs 5.x): the model
is traced by `torch.onnx.export` through `transformers`' own forward with eager attention.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

OPSET = 17


class _WithPast(nn.Module):
    """forward(input_ids, attention_mask, position_ids, *past) -> (logits, *presents)."""

    def __init__(self, model: nn.Module, layers: int) -> None:
        super().__init__()
        self.model, self.layers = model, layers

    def forward(self, input_ids, attention_mask, position_ids, *past):
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        for i, layer in enumerate(cache.layers[: self.layers]):
            # The past as the layer's cache itself: the model's own update then grows it with
            # one Concat(past, new) (an update here would add a Concat(empty, past)).
            layer.lazy_initialization(past[2 * i], past[2 * i + 1])
            layer.keys, layer.values = past[2 * i], past[2 * i + 1]
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
        )
        presents = []
        for layer in out.past_key_values.layers:
            presents += [layer.keys, layer.values]
        return (out.logits, *presents)


def export_with_past(model: nn.Module, out_dir: Path) -> Path:
    """`model` (a transformers causal LM, eager attention) as `out_dir/model.onnx`."""
    config = model.config
    layers = config.num_hidden_layers
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    model.config._attn_implementation = "eager"
    wrapper = _WithPast(model.eval(), layers).eval()
    batch, past, new = 1, 3, 2
    past_values = [torch.randn(batch, heads, past, head_dim) for _ in range(2 * layers)]
    args = (
        torch.randint(0, config.vocab_size, (batch, new)),
        torch.ones(batch, past + new, dtype=torch.int64),
        torch.arange(past, past + new)[None],
        *past_values,
    )
    past_names = [f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    present_names = [f"present.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    dynamic = {
        "input_ids": {0: "batch_size", 1: "sequence_length"},
        "attention_mask": {0: "batch_size", 1: "total_sequence_length"},
        "position_ids": {0: "batch_size", 1: "sequence_length"},
        "logits": {0: "batch_size", 1: "sequence_length"},
        **{name: {0: "batch_size", 2: "past_sequence_length"} for name in past_names},
        **{name: {0: "batch_size", 2: "total_sequence_length"} for name in present_names},
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "model.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            wrapper,
            args,
            str(path),
            input_names=["input_ids", "attention_mask", "position_ids", *past_names],
            output_names=["logits", *present_names],
            dynamic_axes=dynamic,
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )
    return path


__all__ = ["export_with_past"]

"""Rewrite a Concat-KV decoder LM into one whose attention is com.microsoft GroupQueryAttention.

    onnx-tts convert --inplace-kv IN.onnx OUT.onnx [--no-check] [--check-steps N]
    onnx-tts convert --inplace-kv MODEL_DIR NEW_DIR     (every step LM it declares + copies)

Third-party LM exports (published TTS models, Hugging Face / optimum) grow the KV cache with
``present = Concat(past, new)`` and compute attention with explicit MatMul/Softmax nodes, so
their cache can only be chained, never written in place. This module finds, for every layer,

* the Concat nodes that produce ``present.N.key`` / ``present.N.value`` from
  ``past_key_values.N.*`` and the new key/value [B, Hkv, S, Dh] (rotary already applied),
* the score MatMul that meets the (transposed, possibly head-repeated) present key, the query
  tensor [B, H, S, Dh] on its other side and the scalar factors on both paths (the scale),
* the Softmax after it (masks added or selected on the way are dropped) and the context MatMul
  with the present value,

and replaces that subgraph with one GroupQueryAttention node (``do_rotary=0``, the source's
scale) that reads ``past_key_values.N.*`` and writes ``present.N.*``. Nodes that only fed the
old attention (causal masks, repeat-kv shapes) are removed. The converted graph keeps every
input of the source (``attention_mask`` may become unused: GroupQueryAttention is causal and
assumes no padding, which is how the published generation loops run) and adds ``seqlens_k``
(int32 [B], total length - 1) and ``total_sequence_length`` (int32 scalar), which `KVCache`
fills in.

Nothing is trusted from names alone: before rewriting, the source is run once on random inputs
with the matched tensors as extra outputs, which gives the head counts and the scale and checks
that each matched block really computes causal ``softmax(scale * Q K^T) V``. With ``check``
(the default) the converted graph is then run next to the source (prefill + decode steps, source
with numpy-fed growing cache, converted with `KVCache` in ``inplace`` and ``chain`` mode) and the
logits must agree; the output files are only moved into place after that.

Modules: `match` (find each layer's attention block), `verify` (probe run and logits check,
on the project's own session core), `rewrite` (the graph surgery), `inplace_kv` (files,
staging, model directories from their declared files: onnx_tts/tools/model_dir.py), `cli`
(`onnx-tts convert`).
"""

from onnx_tts.tools.convert.cli import add_convert_arguments, main, run_convert
from onnx_tts.tools.convert.inplace_kv import (
    ConvertReport,
    convert_bundle_inplace_kv,
    convert_inplace_kv,
)
from onnx_tts.tools.convert.match import match_attention
from onnx_tts.tools.convert.rewrite import rewrite_inplace_kv
from onnx_tts.tools.convert.verify import LayerAttention, LogitsCheck, compare_logits

__all__ = [
    "ConvertReport",
    "LayerAttention",
    "LogitsCheck",
    "add_convert_arguments",
    "compare_logits",
    "convert_bundle_inplace_kv",
    "convert_inplace_kv",
    "main",
    "match_attention",
    "rewrite_inplace_kv",
    "run_convert",
]

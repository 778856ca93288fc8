"""Quantize a model's weights: `onnx-tts quantize IN OUT [--weights int8|int4|w8a8]
[--block-size N]`.

Every MatMul with a constant weight in the graphs that run on the decode path (the step LMs,
and any other graph where it measurably pays) becomes ONNX Runtime's `MatMulNBits` (8- or 4-bit
blocks, int8 compute), or with `w8a8` an integer product whose activations are quantized per
row (about 2x the arithmetic rate for batched rows on CPUs without VNNI). The output keeps the
family's layout and loads as the same family, written from the files the family declares
(`ModelFiles`, onnx_tts/families/files.py): graphs keep their names and their shared
external-data files, a manifest gets new hashes, and a family with published variant names gets
its quantized graphs under those (`X_quantized` / `X_q4`). Each quantized graph runs beside its
float original over a prefill and >= 20 decode steps (or as many calls) and is kept only when
its outputs agree and it is not slower; `quantize_report.json` in the output says, per graph,
what was measured and decided.

Modules: `weights` (the MatMulNBits rewrite and its inverse), `w8a8` (the integer form),
`feeds` (check inputs), `agreement` (float vs quantized runs), `plan` (jobs from the declared
files, thresholds, the keep rule), `output` (the quantized model in its layout), `run`
(staging, report), `cli`.
"""

from onnx_tts.tools.quantize.cli import main, parse_args, run_quantize
from onnx_tts.tools.quantize.plan import Thresholds
from onnx_tts.tools.quantize.run import REPORT, QuantizeReport, quantize_model
from onnx_tts.tools.quantize.weights import (
    WeightsSpec,
    dequantize_matmul_nbits,
    dequantize_products,
    quantize_weights,
)

__all__ = [
    "REPORT",
    "QuantizeReport",
    "Thresholds",
    "WeightsSpec",
    "dequantize_matmul_nbits",
    "dequantize_products",
    "main",
    "parse_args",
    "quantize_model",
    "quantize_weights",
    "run_quantize",
]

"""Arguments and entry point of `onnx-tts quantize` (also `python -m onnx_tts.tools.quantize`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from onnx_tts.errors import OnnxTTSError
from onnx_tts.tools.quantize.plan import Thresholds
from onnx_tts.tools.quantize.run import MIN_STEPS, quantize_model
from onnx_tts.tools.quantize.weights import (
    BATCH_INVARIANT_BLOCK,
    BLOCK_SIZES,
    WEIGHT_KINDS,
    WeightsSpec,
)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """`onnx-tts quantize` arguments; argparse exits 2 with a usage line on bad ones."""
    defaults = Thresholds()
    parser = argparse.ArgumentParser(
        prog="onnx-tts quantize",
        description="Quantize a model's weights (int8 or int4 blocks, ONNX Runtime's "
        "MatMulNBits; or w8a8: int8 weights per column and int8 activations per row through "
        "MatMulInteger, faster for batched rows on CPUs without VNNI) into a new directory of "
        "the same family, with a report of how closely each graph's outputs follow the float "
        "graph's.",
    )
    parser.add_argument("source", type=Path, help="the model directory (any family)")
    parser.add_argument("output", type=Path, help="a new directory for the quantized model")
    parser.add_argument("--weights", choices=tuple(WEIGHT_KINDS), default="int8")
    parser.add_argument(
        "--block-size",
        type=int,
        choices=BLOCK_SIZES,
        default=BATCH_INVARIANT_BLOCK,
        help=f"input rows per weight scale (default {BATCH_INVARIANT_BLOCK}: the only size "
        "whose batched rows equal solo runs on ONNX Runtime's CPU kernels)",
    )
    parser.add_argument(
        "--graphs", help="comma-separated graphs to try (default: every graph the family offers)"
    )
    parser.add_argument(
        "--check-steps",
        type=int,
        default=MIN_STEPS,
        help=f"decode steps (or calls) the agreement is measured over (at least {MIN_STEPS})",
    )
    parser.add_argument("--min-cosine", type=float, default=defaults.min_cosine)
    parser.add_argument("--min-top1", type=float, default=defaults.min_top1)
    parser.add_argument(
        "--max-speed-ratio",
        type=float,
        default=defaults.max_speed_ratio,
        help="keep a quantized graph only if its time per call is at most this x float's",
    )
    return parser.parse_args(argv)


def run_quantize(args: argparse.Namespace) -> int:
    spec = WeightsSpec(args.weights, args.block_size)
    thresholds = Thresholds(args.min_cosine, args.min_top1, args.max_speed_ratio)
    graphs = [g.strip() for g in args.graphs.split(",") if g.strip()] if args.graphs else None
    report = quantize_model(
        args.source,
        args.output,
        spec,
        steps=args.check_steps,
        thresholds=thresholds,
        graphs=graphs,
        log=lambda line: print(line, file=sys.stderr),
    )
    print(report.summary())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`onnx-tts quantize ...` as a standalone entry point (python -m onnx_tts.tools.quantize)."""
    args = parse_args(argv)
    try:
        return run_quantize(args)
    except OnnxTTSError as error:
        print(f"onnx-tts: error: {error}", file=sys.stderr)
        return 2

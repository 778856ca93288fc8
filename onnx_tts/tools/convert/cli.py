"""Arguments and entry point of `onnx-tts convert` (also `python -m onnx_tts.tools.convert`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from onnx_tts.errors import InputError, OnnxTTSError
from onnx_tts.tools.convert.inplace_kv import convert_bundle_inplace_kv, convert_inplace_kv

MAX_CHECK_STEPS = 1000  # decode steps of the logits check (each runs both graphs)


def add_convert_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--inplace-kv",
        action="store_true",
        required=True,
        help="rewrite Concat-KV attention into GroupQueryAttention (KV cache written in place)",
    )
    parser.add_argument(
        "source",
        type=Path,
        help="LM graph with a Concat KV cache (.onnx), or a model directory onnx-tts runs "
        "(its step LMs are converted, every other file copied)",
    )
    parser.add_argument(
        "output",
        type=Path,
        help="converted .onnx file (or a directory to put it in); for a model directory, a "
        "new directory that receives the converted model",
    )
    parser.add_argument(
        "--no-check", action="store_true", help="skip the source-vs-converted logits comparison"
    )
    parser.add_argument(
        "--check-steps", type=int, default=20, help="decode steps compared after the prefill"
    )
    parser.add_argument(
        "--external-data",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="write weights to a .onnx_data sidecar (default: if the source had one)",
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """`onnx-tts convert` arguments; argparse exits 2 with a usage line on bad ones."""
    parser = argparse.ArgumentParser(
        prog="onnx-tts convert",
        description="Convert a Concat-KV LM graph so its KV cache can be written in place.",
    )
    add_convert_arguments(parser)
    return parser.parse_args(argv)


def run_convert(args: argparse.Namespace) -> int:
    if not 1 <= args.check_steps <= MAX_CHECK_STEPS:
        raise InputError(
            f"--check-steps must be from 1 to {MAX_CHECK_STEPS}, got {args.check_steps}"
        )
    if Path(args.source).is_dir():
        reports = convert_bundle_inplace_kv(
            args.source, args.output, check=not args.no_check, check_steps=args.check_steps
        )
        for report in reports:
            print(report.summary())
        print(f"wrote {args.output}: the model with its step LMs converted")
        return 0
    report = convert_inplace_kv(
        args.source,
        args.output,
        check=not args.no_check,
        check_steps=args.check_steps,
        external_data=args.external_data,
    )
    print(report.summary())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`onnx-tts convert ...` as a standalone entry point (python -m onnx_tts.tools.convert)."""
    args = parse_args(argv)
    try:
        return run_convert(args)
    except OnnxTTSError as error:
        print(f"onnx-tts: error: {error}", file=sys.stderr)
        return 2

"""`onnx-tts export moss-tts CHECKPOINT_DIR [--codec CODEC_DIR] OUT_DIR`."""

from __future__ import annotations

import argparse
import json
import sys

from onnx_tts.errors import InputError, ModelError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="onnx-tts export moss-tts",
        description="Export a published MOSS-TTS checkpoint (Local-Transformer v1.5, "
        "Local-Transformer v1, Delay) as a model directory onnx-tts loads.",
    )
    parser.add_argument("checkpoint", help="the downloaded checkpoint directory")
    parser.add_argument("out", help="the new model directory to write")
    parser.add_argument("--codec", help="the matching MOSS-Audio-Tokenizer checkpoint directory")
    parser.add_argument(
        "--rope-tables",
        default="auto",
        choices=("auto", "float32", "bfloat16"),
        help="round the rotary tables as the published runtime does (auto: the checkpoint's "
        "stored dtype)",
    )
    parser.add_argument("--no-check", action="store_true", help="skip the checks against torch")
    parser.add_argument("--report", help="also write the export report (JSON) to this file")
    args = parser.parse_args(argv)
    from export.moss_tts.exporter import export_moss_tts

    try:
        report = export_moss_tts(
            args.checkpoint,
            args.out,
            codec_dir=args.codec,
            rope=args.rope_tables,
            check=not args.no_check,
        )
    except (InputError, ModelError) as error:
        print(f"onnx-tts: error: {error}", file=sys.stderr)
        return 2
    text = json.dumps(report, indent=2, default=str)
    if args.report:
        with open(args.report, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
    print(f"wrote {args.out} ({report['variant']}); checks against torch (max |diff|):")
    for graph, diffs in report.get("checks", {}).items():
        print(f"  {graph}: " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
    if report.get("unread"):
        print(
            f"  tensors not used: {', '.join(report['unread'][:8])}"
            + (" ..." if len(report["unread"]) > 8 else "")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

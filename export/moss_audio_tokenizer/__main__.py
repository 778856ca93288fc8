"""python -m export.moss_audio_tokenizer export CODEC_DIR OUT_DIR [--quantizers N]
python -m export.moss_audio_tokenizer stand-in OUT_DIR --version v1|v2 [--dims tiny|published]"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from export.checkpoint import CheckpointError
from export.moss_audio_tokenizer import build_codec_checkpoint, export_codec
from export.moss_audio_tokenizer.stand_in import DIMS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m export.moss_audio_tokenizer")
    commands = parser.add_subparsers(dest="command", required=True)
    export = commands.add_parser("export", help="checked ONNX export of a codec checkpoint")
    export.add_argument("codec_dir", type=Path)
    export.add_argument("out_dir", type=Path)
    export.add_argument("--quantizers", type=int, help="RVQ stages to keep (default: all)")
    stand_in = commands.add_parser("stand-in", help="a random checkpoint in the published layout")
    stand_in.add_argument("out_dir", type=Path)
    stand_in.add_argument("--version", choices=("v1", "v2"), required=True)
    stand_in.add_argument("--dims", choices=DIMS, default="tiny")
    stand_in.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        if args.command == "stand-in":
            build_codec_checkpoint(args.out_dir, args.version, args.dims, args.seed)
            print(f"wrote {args.out_dir}", file=sys.stderr)
        else:
            report = export_codec(args.codec_dir, args.out_dir, quantizers=args.quantizers)
            print(json.dumps(report, indent=2))
    except CheckpointError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

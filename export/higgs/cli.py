"""`onnx-tts export higgs CHECKPOINT_DIR [--codec CODEC_DIR] OUT_DIR`.

Reads a published Higgs checkpoint as downloaded (Higgs TTS 3 / higgs-audio-v3-tts-4b with its
bundled codec; Higgs Audio v2 generation 3B in Boson's or the `transformers` layout, with the
higgs-audio-v2-tokenizer directory as `--codec`), loads every weight by name into the project's
own modules (no code from the checkpoint runs) and writes a model directory `onnx_tts.load()`
detects (family "higgs"):

    encoder.onnx   reference audio [1, N] at 24 kHz -> codes [1, F, 8]   (batch 1)
    embed.onnx     input_ids [B, S, 9] -> inputs_embeds                   (embedding sum)
    backbone.onnx  LM-with-past -> last_hidden_state (+ .onnx_data)
    head.onnx      hidden_state [B, hidden] -> logits [B, 8, 1026]
    decoder.onnx   codes [B, F, 8] -> audio [B, F * 960]
    tokenizer.json, bundle.json (the manifest, with every check's differences)

Each graph is run against its torch module on the same inputs before the directory is
written (into a temporary directory beside OUT_DIR, renamed at the end: a failed export leaves
nothing).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from onnx_tts.errors import InputError, ModelError


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="onnx-tts export higgs",
        description="Export a published Higgs Audio v2 / Higgs TTS 3 checkpoint to a model "
        "directory onnx-tts runs.",
    )
    parser.add_argument("checkpoint", help="the downloaded checkpoint directory")
    parser.add_argument("out", help="the model directory to write (must not exist)")
    parser.add_argument(
        "--codec",
        help="the higgs-audio-v2-tokenizer directory (config.json + model.safetensors); "
        "required for v2, optional for v3 (whose checkpoint carries the codec)",
    )
    parser.add_argument(
        "--positions",
        type=int,
        default=None,
        help="most positions (prompt + generated rows) one request may hold; default: the "
        "checkpoint's max_position_embeddings, at most 32768",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(list(sys.argv[1:] if argv is None else argv))
    out = Path(args.out)
    if out.exists():
        print(
            f"onnx-tts export higgs: error: {out} exists; choose a new directory", file=sys.stderr
        )
        return 2
    from export.higgs.build import export_model

    started = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with tempfile.TemporaryDirectory(prefix=f".{out.name}-", dir=out.parent) as scratch:
            report = export_model(
                Path(args.checkpoint),
                Path(scratch) / "model",
                codec_dir=Path(args.codec) if args.codec else None,
                positions=args.positions,
                log=lambda line: print(line, file=sys.stderr),
            )
            (Path(scratch) / "model").rename(out)
    except (InputError, ModelError) as error:
        print(f"onnx-tts export higgs: error: {error}", file=sys.stderr)
        shutil.rmtree(out, ignore_errors=True)
        return 2
    for line in report:
        print(line)
    print(f"wrote {out} in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

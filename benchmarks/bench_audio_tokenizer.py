"""MOSS-Audio-Tokenizer decode cost through the runtime codec (issue 41): per-frame streaming
decode (one 80 ms frame per decode_step, one stream), whole decode, several streams in one
batched decode_step, the state one stream keeps, and the process's peak memory.

``python -m benchmarks.bench_audio_tokenizer [--dims tiny|published-decoder] [--layers-div K]
[--frames N] [--json PATH]``

``tiny``: the v1 stand-in of the tests. ``published-decoder``: the published v1 decoder
(config.json of OpenMOSS-Team/MOSS-Audio-Tokenizer: 32 x 1280 then 3 x 12 x 768 layers, windows
of 10 s) with every layer count divided by ``--layers-div`` (per-frame cost is then about that
many times smaller; the report scales it back), behind a small encoder: only decoding is timed.
Random weights; exported once into a scratch directory.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _config(dims: str, div: int) -> dict[str, Any]:
    from export.moss_audio_tokenizer.stand_in import codec_config

    if dims == "tiny":
        return codec_config("v1", "tiny")
    config = codec_config("v1", "published")
    for entry in config["decoder_kwargs"]:
        if entry["module_type"] == "Transformer":
            entry["num_layers"] = max(1, entry["num_layers"] // div)
    small = codec_config("v1", "tiny")  # a small encoder that ends at the published width
    small["encoder_kwargs"][-1]["output_dimension"] = config["quantizer_kwargs"]["input_dim"]
    config["encoder_kwargs"] = small["encoder_kwargs"]
    config["reversed_decoder_kwargs"] = small["encoder_kwargs"]
    return config


def _median_ms(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def measure(codec_dir: Path, frames: int, threads: int) -> dict[str, Any]:
    import onnxruntime as ort

    from onnx_tts.families.moss_tts.codec import AudioTokenizerCodec, codec_graphs, read_codec
    from onnx_tts.session import LazySession, SessionOptions

    layout = read_codec(codec_dir)
    options = SessionOptions(intra_op_threads=threads)
    sessions = {r: LazySession(g.spec, options) for r, g in codec_graphs(layout).items()}
    codec = AudioTokenizerCodec(layout, sessions)
    rng = np.random.default_rng(0)
    codes = rng.integers(0, codec.codebook_size, (frames, codec.quantizers))
    result: dict[str, Any] = {
        "frames": frames,
        "threads": threads,
        "state_bytes_per_stream": layout.state_bytes,
        "whole_decode_frames": layout.whole_decode_frames,
    }
    with codec.open_stream() as stream:
        stream.push(codes[:2])  # warm-up (session load)
        per_frame, cpu = [], time.process_time()
        for index in range(frames):
            start = time.perf_counter()
            stream.push(codes[index : index + 1])
            per_frame.append((time.perf_counter() - start) * 1000)
        cpu = (time.process_time() - cpu) * 1000 / frames
    result["stream_ms_per_frame_median"] = statistics.median(per_frame)
    result["stream_ms_per_frame_last"] = statistics.median(per_frame[-max(3, frames // 4) :])
    result["stream_cpu_ms_per_frame"] = cpu  # all threads; what a load-free core would take
    whole = min(frames, layout.whole_decode_frames)
    codec.decode(codes[:whole])  # warm-up
    cpu = time.process_time()
    ms = _median_ms(lambda: codec.decode(codes[:whole]), 3)
    result["whole_decode_cpu_ms"] = (time.process_time() - cpu) * 1000 / 3
    result["whole_decode_frames_timed"] = whole
    result["whole_decode_ms"] = ms
    result["whole_decode_ms_per_frame"] = ms / whole
    # Several streams in one decode_step run (graph level), against one run per stream.
    session_options = ort.SessionOptions()
    session_options.intra_op_num_threads = threads
    step = ort.InferenceSession(
        str(layout.graphs["decode_step"].path), session_options, providers=["CPUExecutionProvider"]
    )
    outputs = ["audio", *(s.output for s in layout.state)]
    audio = {}
    for batch in (1, 4):
        state = {s.input: np.repeat(s.initial(), batch, axis=0) for s in layout.state}
        times, pieces = [], []
        for index in range(min(frames, 12)):
            feed = np.repeat(codes[index : index + 1].T[:, None, :], batch, axis=1)
            start = time.perf_counter()
            values = step.run(outputs, {"audio_codes": feed, **state})
            times.append((time.perf_counter() - start) * 1000)
            pieces.append(values[0])
            state = {s.input: v for s, v in zip(layout.state, values[1:], strict=True)}
        result[f"batched_step_ms_b{batch}"] = statistics.median(times[2:])
        audio[batch] = np.concatenate(pieces, axis=2)
    # Every row of the batch-4 run is the same stream: is it bit for bit the batch-1 run?
    result["batch4_rows_equal_batch1"] = all(
        np.array_equal(audio[4][row], audio[1][0]) for row in range(4)
    )
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dims", choices=("tiny", "published-decoder"), default="tiny")
    parser.add_argument("--layers-div", type=int, default=1)
    parser.add_argument("--frames", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from export.moss_audio_tokenizer import export_codec
    from export.moss_audio_tokenizer.stand_in import write_stand_in

    with tempfile.TemporaryDirectory(prefix="bench-codec-") as scratch:
        root = Path(scratch)
        started = time.perf_counter()
        write_stand_in(root / "checkpoint", _config(args.dims, args.layers_div))
        report = export_codec(root / "checkpoint", root / "onnx")
        export_seconds = time.perf_counter() - started
        export_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        result = measure(root / "onnx", args.frames, args.threads)
    result.update(
        dims=args.dims,
        layers_div=args.layers_div,
        export_seconds=round(export_seconds, 1),
        export_peak_rss_mib=export_rss,
        check=report,
        loadavg_1m=os.getloadavg()[0],
    )
    if args.layers_div > 1 and all(n % args.layers_div == 0 for n in (32, 12)):
        # Layers dominate (the rest is the lookup and the patches): about layers_div times.
        for key in ("stream_ms_per_frame_median", "stream_cpu_ms_per_frame"):
            result[f"{key}_times_layers_div"] = result[key] * args.layers_div
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

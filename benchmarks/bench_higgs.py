"""Higgs TTS 3 on this CPU (issue 42): the published PyTorch loop run its best way against the
Engine, float and int8, side by side in one run; the batched vocoder windows; streamed first
audio and RTF.

``onnx-tts bench higgs [--quick] [--layers N] [--rows N] [--rounds N] [--json PATH] [--plot PATH]``

Model: a stand-in checkpoint in the published layout (tests/higgs_reference.py `build_v3`) at
the published width (Qwen3-4B: hidden 2560, 32 x 128 query heads, 8 KV heads, FFN 9728; the
codec at its published dims: HuBERT-base, DAC 1024 channels, 8 x 1024 codes) with `--layers`
of the 36 layers (memory: a float 4B model does not fit beside the others here) and a text
table of 4096 rows (only the prompt reads it); random weights. Per-layer decode cost is what
the layers change, so frames/s at 36 layers is estimated by scaling the backbone part of the
measured step time by 36 / layers (the head, embedding and sampling stay as measured).
`--quick`: the test dims (hidden 64, 2 layers, the small codec), one round: the script runs.

Contenders at 1 and 8 requests (each request: a zero-shot prompt, `--rows` delayed rows; the
random model rarely ends early):
* ``torch``: the paraphrase of SGLang-Omni's loop (tests/higgs_reference.py `V3Reference`:
  transformers' Qwen3Model with a KV cache, the fused embedding and tied head, the sampler) at
  1 and 2 torch threads, the best one; 8 requests run one after another (it serves one);
* the Engine (`onnx_tts.load` defaults): ``float`` (Concat cache chained), ``float in place``
  (`onnx-tts convert --inplace-kv`), ``int8`` (`onnx-tts quantize` of the converted model),
  and ``int8 all cores`` (`onnx_tts.load(threads=cores)`: every session on all the cores, the
  Engine's best setting when only codes are made), and the same two for ``w8a8`` (`onnx-tts
  quantize --weights w8a8`: int8 weights per column, int8 activations per row, MatMulInteger);
  8 requests are 8 threads calling `generate` at once. Each Engine runs in a process of its
  own in each round, as a user's would.

``windows``: the codec decoder on SGLang-Omni's steady window (68 new + 8 overlap frames, 4
held back: 80 frames), 1 window alone and 8 windows of 8 streams in one call (ms per window),
with the batched windows checked equal to the solo ones; ``stream``: first audio (s) and RTF of
`Engine.stream` with the default windows, and the streamed audio's difference from one decode.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.results_io import load_average, machine_info, save_figure, write_json  # noqa: E402

PUBLISHED_WIDTH = {
    "model_type": "qwen3",
    "hidden_size": 2560,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 9728,
    "vocab_size": 4096,
    "max_position_embeddings": 4096,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
PUBLISHED_LAYERS = 36
TEXT = "Hello there, how are you today? The sun rises in the east."


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def build(root: Path, quick: bool, layers: int) -> dict[str, Any]:
    from tests import higgs_reference as ref

    config = dict(ref.V3_TEXT_CONFIG) if quick else {**PUBLISHED_WIDTH, "num_hidden_layers": layers}
    codec_dims = None if quick else ref.PUBLISHED_CODEC_DIMS
    tensors, codec, tokenizer = ref.build_v3(
        root / "checkpoint", text_config=config, codec_dims=codec_dims
    )
    onnx_tts = [sys.executable, "-m", "onnx_tts.cli"]
    steps = [
        [
            *onnx_tts,
            "export",
            "higgs",
            str(root / "checkpoint"),
            str(root / "float"),
            "--positions",
            "2048",
        ],
        [*onnx_tts, "convert", "--inplace-kv", str(root / "float"), str(root / "inplace")],
        [*onnx_tts, "quantize", str(root / "inplace"), str(root / "int8"), "--weights", "int8"],
        [*onnx_tts, "quantize", str(root / "inplace"), str(root / "w8a8"), "--weights", "w8a8"],
    ]
    for command in steps:
        _log(" ".join(command[2:5]))
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")
    reference = ref.V3Reference(tensors, codec, tokenizer, config)
    return {"config": config, "reference": reference}


def torch_request(reference, rows: int, threads: int, seed: int) -> float:
    import torch

    torch.set_num_threads(threads)
    started = time.perf_counter()
    reference.generate(TEXT, seed=seed, max_new_tokens=rows, temperature=1.0)
    return time.perf_counter() - started


def engine_requests(engine, rows: int, count: int) -> float:
    model = engine.model
    options = model.request_options({"max_new_tokens": rows})
    [chunk] = model.text.chunks(TEXT, options)
    voice = engine.voice(None)

    made: list[int] = []

    def one(seed: int) -> None:
        sampling = model.sampling_defaults().with_overrides({"seed": seed})
        made.append(len(list(engine.generate(chunk, voice, sampling, options))))

    started = time.perf_counter()
    threads = [threading.Thread(target=one, args=(seed,)) for seed in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    if made != [rows - 7] * count:  # every request made its rows (the model did not end)
        raise SystemExit(f"requests made {made} frames, expected {rows - 7} each")
    return wall


def engine_rates(model: Path, threads: int, rows: int) -> dict[int, float]:
    """Rows per second of `onnx_tts.load(model, threads=threads)` at 1 and 8 requests."""
    import onnx_tts

    with onnx_tts.load(model, threads=threads) as engine:
        for count in (8, 1):  # warm up (sessions, the rows' buffers at 8, as a server would)
            engine_requests(engine, 16, count)
        return {count: count * rows / engine_requests(engine, rows, count) for count in (1, 8)}


def engine_in_process(model: Path, threads: int, rows: int) -> dict[int, float]:
    """`engine_rates` in a process of its own."""
    command = [sys.executable, __file__, "--engine-only", str(model), "--threads", str(threads)]
    done = subprocess.run([*command, "--rows", str(rows)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return {int(k): v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def windows(engine, repeats: int) -> dict[str, Any]:
    codec = engine.model.vocoder
    rng = np.random.default_rng(0)
    batch = [rng.integers(0, 1024, (80, 8)) for _ in range(8)]
    solo = [codec.vocode(w) for w in batch]
    together = codec.vocode_windows(batch, [{}] * 8)
    exact = all(np.array_equal(a, b) for a, b in zip(solo, together, strict=True))
    timing = {}
    for count in (1, 8):
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            codec.vocode_windows(batch[:count], [{}] * count) if count > 1 else codec.vocode(
                batch[0]
            )
            best = min(best, time.perf_counter() - started)
        timing[f"ms_per_window_{count}"] = round(1000 * best / count, 1)
    return {"frames_per_window": 80, "batched_equals_solo": exact, **timing}


def stream(engine, rows: int) -> dict[str, Any]:
    options = {"seed": 3, "max_new_tokens": rows}
    whole = engine.synthesize(TEXT, **options).samples.reshape(-1)
    started = time.perf_counter()
    first, chunks = None, []
    for chunk in engine.stream(TEXT, **options):
        first = first if first is not None else time.perf_counter() - started
        chunks.append(chunk)
    wall = time.perf_counter() - started
    streamed = np.concatenate(chunks)
    seconds = len(streamed) / engine.sample_rate
    return {
        "first_audio_s": round(first or 0.0, 3),
        "rtf": round(wall / seconds, 3),
        "audio_s": round(seconds, 2),
        "max_abs_diff_vs_one_decode_rel": float(
            np.abs(streamed - whole).max() / np.abs(whole).max()
        ),
    }


def run(quick: bool, layers: int, rows: int, rounds: int) -> dict[str, Any]:
    import onnx_tts
    from onnx_tts.pipeline import available_cores

    results: dict[str, Any] = {"machine": machine_info(), "quick": quick, "rows": rows}
    with tempfile.TemporaryDirectory(prefix="higgs-bench-") as scratch:
        root = Path(scratch)
        built = build(root, quick, layers)
        results["layers"] = built["config"]["num_hidden_layers"]
        # How each quantized model's graphs agree with the float ones (quantize's own check).
        results["quantize"] = {
            kind: {
                graph["name"]: {"decision": graph["decision"], **graph.get("agreement", {})}
                for graph in json.loads((root / kind / "quantize_report.json").read_text())[
                    "graphs"
                ]
            }
            for kind in ("int8", "w8a8")
        }
        results["hidden"] = built["config"]["hidden_size"]
        samples: dict[str, list[float]] = {}
        # The bench decodes codes only (the vocoder stage idles), so the Engine's best setting
        # for it gives every session all the cores, as the torch loop's best thread count is
        # its own; `onnx_tts.load`'s default (the decode stage half of them) is measured too.
        # Each Engine runs in a process of its own, as a user's would (not beside the torch
        # model, its thread pool and three other engines).
        contenders = {
            "float": ("float", 0),
            "inplace": ("inplace", 0),
            "int8": ("int8", 0),
            "int8 all cores": ("int8", available_cores()),
            "w8a8": ("w8a8", 0),
            "w8a8 all cores": ("w8a8", available_cores()),
        }
        for round_index in range(rounds):
            for threads in (1, 2):
                wall = torch_request(built["reference"], rows, threads, round_index)
                samples.setdefault(f"torch {threads} thread(s) @1", []).append(rows / wall)
            best_torch = max(
                samples["torch 1 thread(s) @1"][-1], samples["torch 2 thread(s) @1"][-1]
            )
            samples.setdefault("torch @8", []).append(best_torch)  # one after another
            for name, (directory, threads) in contenders.items():
                for count, rate in engine_in_process(root / directory, threads, rows).items():
                    samples.setdefault(f"{name} @{count}", []).append(rate)
            _log(
                f"round {round_index + 1}: "
                + ", ".join(f"{k} {v[-1]:.1f}" for k, v in samples.items())
            )
        rows_per_s = {name: float(np.median(values)) for name, values in samples.items()}
        base = max(rows_per_s["torch 1 thread(s) @1"], rows_per_s["torch 2 thread(s) @1"])
        results["rows_per_s"] = rows_per_s
        results["speedup"] = {
            name: value / (base if name.endswith("@1") else rows_per_s["torch @8"])
            for name, value in rows_per_s.items()
            if not name.startswith("torch")
        }
        with onnx_tts.load(root / "float") as engine:
            results["windows"] = windows(engine, 3)
        with onnx_tts.load(root / "inplace") as engine:
            results["stream"] = stream(engine, rows)
    results["machine"]["loadavg_end"] = load_average()
    return results


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 3.5))
    names = list(results["rows_per_s"])
    axis.barh(names, [results["rows_per_s"][n] for n in names])
    axis.set_xlabel("delayed rows (frames) per second")
    axis.set_title(f"Higgs TTS 3, {results['layers']} layers, hidden {results['hidden']}")
    save_figure(figure, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="test dims, one round")
    parser.add_argument("--layers", type=int, default=2, help="backbone layers (of 36)")
    parser.add_argument("--rows", type=int, default=60, help="delayed rows per request")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=REPO / "benchmarks/results/higgs.json")
    parser.add_argument("--plot", type=Path, default=REPO / "benchmarks/results/higgs.png")
    parser.add_argument("--engine-only", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.engine_only:
        print(json.dumps(engine_rates(args.engine_only, args.threads, args.rows)))
        return 0
    rounds = 1 if args.quick else args.rounds
    results = run(args.quick, args.layers, args.rows, rounds)
    if not args.quick:
        layers = results["layers"]
        results["note"] = (
            f"published width with {layers} of {PUBLISHED_LAYERS} layers; multiply per-step "
            "backbone time by 36 / layers for the whole model"
        )
    write_json(args.json, results)
    plot(results, args.plot)
    print(f"wrote {args.json} and {args.plot}")
    for name, value in results["rows_per_s"].items():
        print(f"{name:28s} {value:8.1f} rows/s")
    print("speed-up:", {k: round(v, 2) for k, v in results["speedup"].items()})
    print("windows:", results["windows"], "stream:", results["stream"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

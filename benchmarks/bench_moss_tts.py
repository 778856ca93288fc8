"""MOSS-TTS at the published sizes (issue 41, item 4): the Engine against the published PyTorch
loop, side by side in one run.

``onnx-tts bench moss_tts [--quick] [--variant local-v1] [--layers N] [--frames N] [--json PATH]
[--plot PATH] [--work DIR] [--skip-torch]``

Model: a stand-in checkpoint of `--variant` at the published sizes (export/moss_tts/stand_in.py
``dims="published"``; Local v1: Qwen3-1.7B backbone, the 4-layer depth transformer, 33 heads;
random weights, bf16 as published, its stop margin so high that no run ends before `--frames`),
exported with `onnx-tts export moss-tts` (no codec: the LM side), converted for the in-place
cache (`onnx-tts convert --inplace-kv`) and quantized (`onnx-tts quantize`: int8; with
`--w8a8` also w8a8, from the same float model, or from int8 read back when the float one was
deleted). `--quick`:
the tiny stand-in, for a smoke run. `--layers N`: the published width with N backbone layers
(Local v1.5's Qwen3-4B and Delay's Qwen3-8B do not fit this machine's 23 GB as float32 torch
models; the backbone's share of a frame then shrinks, so the ratios are not the whole model's).

Measured, in this order (one big model in memory at a time):

* memory bandwidth of this CPU (a large numpy copy, best of 5: bytes read + written per s);
* the int8 backbone's decode step at batch 1 after a 64-position prompt (in place, median of
  32 steps) against its weight-read time (the bytes of its weights / the bandwidth);
* the Engine (int8; `--w8a8`: w8a8 too), each setting in a process of its own: the defaults, and
  every session on all the cores (`threads=` the cores: codes only, the vocoder idles, so this
  is the Engine's best setting for this job): frames/s at 1 and at 8 concurrent requests
  (threads calling `Engine.generate` at once; Delay: audio frames, after the delay pattern's
  ramp, as for the published loop), time to the first frame and the LM's real-time factor
  (wall seconds per second of audio at 12.5 frames/s), peak RSS;
* the published loop (tests/moss_tts_published_loop.py, the paraphrase the tests check against
  the published code; float32 torch) with 1, 2 and 4 threads, in a subprocess of its own: the
  best is the baseline; it serves one request at a time, so at 8 requests its frames/s is the
  same (requests queue) — the ratio at 8 is the Engine's batched rate over it.

First audio through the codec is not measured here (the codec is benchmarked on its own:
benchmarks/bench_audio_tokenizer.py); the first frame bounds it from below.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.results_io import load_average, machine_info, save_figure, write_json  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
TEXT = "The quick brown fox jumps over the lazy dog, and then it takes a long nap in the sun."
FRAME_RATE = 12.5
NEVER_STOP = 60.0  # the stand-in's stop margin: no request ends before max_new_frames
GOALS = {1: 3.0, 8: 10.0}  # Engine frames/s over the best published loop's (issue 41)


def _log(message: str) -> None:
    print(f"[bench-moss-tts] {message}", file=sys.stderr, flush=True)


def peak_rss_gb() -> float:
    """This process's peak resident memory. Linux keeps `ru_maxrss` across exec, so a contender
    started by a parent that once held a big model would report the parent's peak: the
    high-water mark of this process's own memory map (VmHWM) is read first."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 2**20, 2)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)


def bandwidth_gbs(megabytes: int) -> float:
    """Bytes moved per second by a large copy (read + write), best of 5."""
    source = np.ones(megabytes << 18, np.float32)
    target = np.empty_like(source)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - start)
    return round(2 * source.nbytes / best / 1e9, 2)


def models(
    work: Path, variant: str, quick: bool, layers: int = 0, w8a8: bool = False
) -> dict[str, Path]:
    """checkpoint -> float export -> in place -> int8, each made once under `work`; `layers`
    > 0: the published width with that many backbone layers."""
    import dataclasses

    import torch

    from export.moss_tts.exporter import export_moss_tts
    from export.moss_tts.stand_in import PUBLISHED, build_checkpoint
    from onnx_tts.tools.convert import convert_bundle_inplace_kv
    from onnx_tts.tools.quantize import Thresholds, WeightsSpec, quantize_model

    paths = {k: work / k for k in ("checkpoint", "float", "inplace", "int8", "w8a8")}
    if not (paths["checkpoint"] / "config.json").is_file():
        _log(f"building the {variant} stand-in into {paths['checkpoint']} ...")
        dims: Any = "tiny" if quick else "published"
        if layers and not quick:
            dims = dataclasses.replace(PUBLISHED[variant], layers=layers)
        build_checkpoint(
            paths["checkpoint"],
            variant,
            dims,
            dtype=torch.bfloat16,
            margin=NEVER_STOP,
        )
    if paths["int8"].is_dir():  # the float and in-place steps may be gone (disk)
        return _with_w8a8(paths) if w8a8 else paths
    if not paths["float"].is_dir():
        _log("exporting ...")
        export_moss_tts(paths["checkpoint"], paths["float"], check=quick)
    if not paths["inplace"].is_dir():
        _log("converting the backbone for the in-place cache ...")
        convert_bundle_inplace_kv(paths["float"], paths["inplace"], check=quick)
    if not paths["int8"].is_dir():
        _log("quantizing (int8) ...")
        # Random weights give flat distributions; the bench measures speed (the report keeps
        # the agreement numbers).
        quantize_model(
            paths["inplace"],
            paths["int8"],
            WeightsSpec("int8"),
            thresholds=Thresholds(0.0, 0.0),
            log=_log,
        )
    return _with_w8a8(paths) if w8a8 else paths


def _with_w8a8(paths: dict[str, Path]) -> dict[str, Path]:
    """The w8a8 model (`quantize --weights w8a8`) beside the int8 one: from the in-place float
    model, or, when that was deleted, from int8 read back to float (the rounding of both adds
    up; the bench measures speed)."""
    from onnx_tts.tools.quantize import Thresholds, WeightsSpec, quantize_model

    if not paths["w8a8"].is_dir():
        source = paths["inplace"] if paths["inplace"].is_dir() else paths["int8"]
        _log(f"quantizing (w8a8) from {source.name} ...")
        quantize_model(
            source, paths["w8a8"], WeightsSpec("w8a8"), thresholds=Thresholds(0.0, 0.0), log=_log
        )
    return paths


def backbone_step(model: Path, bandwidth: float) -> dict[str, Any]:
    """The int8 backbone at batch 1: ms per decode step vs its weight-read time."""
    from onnx_tts.session import KVCache, Session, SessionOptions

    session = Session(model / "backbone.onnx", SessionOptions())
    hidden = session.spec.inputs["inputs_embeds"].shape[-1]
    cache = KVCache(session, "inplace", batch_size=1, capacity=128)
    rng = np.random.default_rng(0)

    def run(positions: int) -> None:
        total = cache.length + positions
        cache.step(
            {
                "inputs_embeds": rng.standard_normal((1, positions, hidden)).astype(np.float32),
                "attention_mask": np.ones((1, total), np.int64),
                "position_ids": np.arange(cache.length, total)[None],
            },
            new_tokens=positions,
            output_names=["last_hidden_state"],
        )

    run(64)
    times = []
    for _ in range(32):
        start = time.perf_counter()
        run(1)
        times.append(time.perf_counter() - start)
    weights = (model / "backbone.onnx_data").stat().st_size
    step = float(np.median(times)) * 1e3
    read = weights / (bandwidth * 1e9 / 2) * 1e3  # bandwidth counts read + write
    return {
        "ms": round(step, 2),
        "weight_bytes": weights,
        "weight_read_ms": round(read, 2),
        "over_weight_read": round(step / read, 3),
    }


def engine_rates(model: Path, frames: int, threads: int = 0) -> dict[str, Any]:
    """The Engine in this process: `threads` 0 is `onnx_tts.load`'s default (each stage its
    share of the cores), N gives every session N intra-op threads."""
    import onnx_tts

    engine = onnx_tts.load(model, threads=threads)
    out: dict[str, Any] = {}
    try:

        def request(seed: int, first: list[float] | None = None) -> int:
            m = engine.model
            options = {"max_new_frames": frames}
            [chunk] = m.text.chunks(TEXT, m.request_options(options))
            sampling = m.sampling_defaults().with_overrides({"seed": seed})
            start, count = time.perf_counter(), 0
            for _ in engine.generate(chunk, {}, sampling, options):
                if count == 0 and first is not None:
                    first.append(time.perf_counter() - start)
                count += 1
            return count

        request(0)  # warm up
        for concurrency in (1, 8):
            firsts: list[float] = []
            counts = [0] * concurrency
            gate = threading.Barrier(concurrency + 1)

            def one(index: int, firsts: list[float] = firsts, counts=counts, gate=gate) -> None:
                gate.wait()
                counts[index] = request(index + 1, firsts)

            threads = [threading.Thread(target=one, args=(i,)) for i in range(concurrency)]
            for thread in threads:
                thread.start()
            gate.wait()
            start = time.perf_counter()
            for thread in threads:
                thread.join()
            wall = time.perf_counter() - start
            rate = sum(counts) / wall
            out[str(concurrency)] = {
                "frames_per_s": round(rate, 2),
                "first_frame_s": round(float(np.median(firsts)), 3),
                "rtf": round(FRAME_RATE * concurrency / rate, 3),
            }
    finally:
        engine.close()
    out["peak_rss_gb"] = peak_rss_gb()
    return out


def torch_rates(checkpoint: Path, frames: int, threads: int) -> dict[str, Any]:
    """The published loop (paraphrase) in this process: frames/s of one request."""
    from tests.moss_tts_published_loop import de_delay, load

    loop = load(checkpoint)
    loop.threads = threads
    variant = loop.config.variant
    start = time.perf_counter()
    if variant == "local-v1.5":
        made = len(loop.generate_v15(loop.prompt_v15(TEXT), max_new_frames=frames))
    elif variant == "local-v1":
        made = len(loop.generate_v1(loop.prompt_chat(TEXT), max_new_tokens=frames))
    else:  # rows of the delay pattern: the audio frames are what the Engine counts too
        rows = loop.generate_delay(loop.prompt_chat(TEXT), max_new_tokens=frames)
        made = len(de_delay(rows, loop.config.n_vq, loop.config.audio_pad))
    wall = time.perf_counter() - start
    return {"frames_per_s": round(made / wall, 3), "peak_rss_gb": peak_rss_gb()}


def _subprocess(which: str, model: Path, frames: int, threads: int) -> dict[str, Any]:
    """One contender in a process of its own (`which`: "torch" or "engine"), so that one big
    model is in memory at a time."""
    command = [
        sys.executable,
        __file__,
        f"--{which}-only",
        str(model),
        "--frames",
        str(frames),
        "--threads",
        str(threads),
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        why = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        return {"error": why}  # (a kill by the OOM killer leaves no stderr: -9)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace) -> dict[str, Any]:
    depth = f"-layers{args.layers}" if args.layers and not args.quick else ""
    work = Path(args.work) / f"{args.variant}{'-quick' if args.quick else ''}{depth}"
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "machine": machine_info(),
        "variant": args.variant,
        "quick": args.quick,
        "frames": args.frames,
        "layers": args.layers or None,
    }
    paths = models(work, args.variant, args.quick, args.layers, args.w8a8)
    if not args.skip_torch:  # first: the float torch model needs most of the memory (~17 GB)
        result["published"] = {
            str(t): _subprocess("torch", paths["checkpoint"], args.frames, t) for t in (1, 2, 4)
        }
        _log(f"published {result['published']}")
    result["bandwidth_gbs"] = bandwidth_gbs(64 if args.quick else 1024)
    _log(f"memory bandwidth {result['bandwidth_gbs']} GB/s")
    result["backbone_step"] = backbone_step(paths["int8"], result["bandwidth_gbs"])
    _log(f"backbone step {result['backbone_step']}")
    # The Engine as `onnx_tts.load` sets it up (the decode stage gets half the cores: the
    # vocoder stage has the rest), then with every session on all cores: this bench decodes
    # codes only, the vocoder idles, so that is the Engine's best setting for this job, as
    # the published loop's best thread count is its own.
    from onnx_tts.pipeline import available_cores

    # result key -> (weights, threads); w8a8: `quantize --weights w8a8` (MatMulInteger).
    cores = available_cores()
    settings = {
        "engine_int8": ("int8", 0),
        "engine_int8_all_cores": ("int8", cores),
    }
    if args.w8a8:
        settings |= {"engine_w8a8": ("w8a8", 0), "engine_w8a8_all_cores": ("w8a8", cores)}
    for key, (weights, threads) in settings.items():
        result[key] = _subprocess("engine", paths[weights], args.frames, threads)
        result[key]["threads"] = threads
        _log(f"{key} {result[key]}")
    if not args.skip_torch:
        rates = [v["frames_per_s"] for v in result["published"].values() if "frames_per_s" in v]
        if rates:
            best = max(rates)
            for key in settings:
                engine = result[key]
                if "error" not in engine:  # speedup, speedup_all_cores, speedup_w8a8, ...
                    name = key.replace("engine_int8", "speedup").replace("engine", "speedup")
                    result[name] = {
                        c: round(engine[c]["frames_per_s"] / best, 2) for c in ("1", "8")
                    }
            result["goals"] = {str(k): v for k, v in GOALS.items()}
        _log(", ".join(f"{k} {v}" for k, v in result.items() if k.startswith("speedup")))
    result["machine"]["loadavg_end"] = load_average()
    return result


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 3.5))
    labels, values = [], []
    for threads, value in result.get("published", {}).items():
        if "frames_per_s" in value:
            labels.append(f"torch {threads}t")
            values.append(value["frames_per_s"])
    engines = 0
    for key, name in (
        ("engine_int8", "int8"),
        ("engine_int8_all_cores", "int8 all cores"),
        ("engine_w8a8", "w8a8"),
        ("engine_w8a8_all_cores", "w8a8 all cores"),
    ):
        for concurrency in ("1", "8"):
            if concurrency in result.get(key, {}):
                labels.append(f"{name} x{concurrency}")
                values.append(result[key][concurrency]["frames_per_s"])
                engines += 1
    axis.bar(labels, values, color=["#999"] * (len(labels) - engines) + ["#1b7"] * engines)
    axis.tick_params(axis="x", labelrotation=30)
    axis.axhline(FRAME_RATE, color="#c33", linestyle="--", label="real time (12.5 frames/s)")
    axis.set_ylabel("frames / s")
    size = "tiny" if result["quick"] else "published sizes"
    if result.get("layers"):
        size = f"published width, {result['layers']} backbone layers"
    axis.set_title(f"MOSS-TTS {result['variant']} ({size})")
    axis.legend()
    save_figure(figure, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the tiny stand-in (smoke run)")
    parser.add_argument(
        "--variant", default="local-v1", choices=("local-v1", "local-v1.5", "delay")
    )
    parser.add_argument("--frames", type=int, default=40)
    parser.add_argument(
        "--layers",
        type=int,
        default=0,
        help="backbone layers of a published-width stand-in (0: all; Local v1.5 and Delay at "
        "all their layers do not fit this machine's memory as float torch models)",
    )
    parser.add_argument(
        "--work", default=str(Path.home() / ".cache" / "onnx-tts" / "bench-moss-tts")
    )
    parser.add_argument("--json", default=None)
    parser.add_argument("--plot", default=None)
    parser.add_argument("--skip-torch", action="store_true")
    parser.add_argument(
        "--w8a8",
        action="store_true",
        help="also quantize --weights w8a8 and measure it (Local v1 at the published sizes: "
        "14.4 GB peak from the float model, 3.5 min)",
    )
    parser.add_argument("--torch-only", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--engine-only", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.torch_only:
        print(json.dumps(torch_rates(Path(args.torch_only), args.frames, args.threads)))
        return 0
    if args.engine_only:
        print(json.dumps(engine_rates(Path(args.engine_only), args.frames, args.threads)))
        return 0
    result = run(args)
    depth = f"_layers{args.layers}" if args.layers and not args.quick else ""
    name = f"moss_tts_{args.variant}{'_quick' if args.quick else ''}{depth}"
    write_json(Path(args.json or RESULTS / f"{name}.json"), result)
    plot(result, Path(args.plot or RESULTS / f"{name}.png"))
    print(json.dumps({k: result[k] for k in result if k != "machine"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

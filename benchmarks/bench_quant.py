"""Quantized weights (issue 37): which int8 kernel, the Turbo-shape LM step, the default voice.

``onnx-tts bench quant [--parts kernels,lm,voice] [--rounds N] [--threads N] [--quick]``
(also ``python benchmarks/bench_quant.py``). Results: ``benchmarks/results/quant.json`` and
``quant.png``; the default voice's quality part also ``voice_quant.json``.

* ``kernels``: a stack of MatMuls with the Turbo LM's per-layer weight shapes (hidden 1024:
  1024x3072, 3072x1024, 1024x4096, 4096x1024; 4 layers, 235 MB fp32: far beyond the caches, so
  bound by reading weights like the whole LM) in fp32 and each int8 / int4 form ONNX Runtime
  offers: `quantize_dynamic` (MatMulInteger, per tensor uint8 and per channel int8) and
  MatMulNBits (8 and 4 bits, blocks of 32 / 64 / 128, int8 compute; 4 bits with float compute
  as the published q4 files run). ms per call at 1 and 8 rows, and whether each row's result
  is bit-identical alone and in the batch (what the engine needs to batch requests).
* ``lm``: the Turbo-shape LM (benchmarks/lm_graphs.py ``turbo``: GPT-2 medium, 24 layers,
  hidden 1024, vocab 6563, GroupQueryAttention, in place) float against `onnx-tts quantize`'s
  int8 and int4 weights: ms per decode step after a prefill of ``--context`` tokens, 1 and 8
  rows, variants taking turns every round (medians).
* ``voice``: the shipped default voice (its LM is 8-bit MatMulNBits since issue 17) against
  its float twin (the same weights read back as float32) and `onnx-tts quantize --weights
  int4 --graphs lm` of that twin: streaming RTF and time to first audio, sentence by sentence
  in turn (2 threads, as the voice's own evaluation), then Whisper tiny.en WER and DNSMOS of the
  streamed speech on the held-out sentences export/voice/evaluate.py uses (the first 100 prose
  sentences of the held-out split). Needs the ``voice`` extra and Debian's fortunes and
  wamerican (the sentence corpus).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make `benchmarks` and `onnx_tts` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results_io import save_figure, write_json

RESULTS = Path(__file__).resolve().parent / "results"
HIDDEN = 1024
LAYER_SHAPES = (
    (HIDDEN, 3 * HIDDEN),
    (3 * HIDDEN, HIDDEN),
    (HIDDEN, 4 * HIDDEN),
    (4 * HIDDEN, HIDDEN),
)
# name -> how the fp32 stack is quantized
KERNELS = {
    "fp32": None,
    "dynamic uint8 per tensor (MatMulInteger)": ("dynamic", "QUInt8", False),
    "dynamic int8 per channel (MatMulInteger)": ("dynamic", "QInt8", True),
    "MatMulNBits 8-bit block 32": ("nbits", 8, 32, 4),
    "MatMulNBits 8-bit block 128": ("nbits", 8, 128, 4),
    "MatMulNBits 4-bit block 32": ("nbits", 4, 32, 4),
    "MatMulNBits 4-bit block 64": ("nbits", 4, 64, 4),
    "MatMulNBits 4-bit block 128": ("nbits", 4, 128, 4),
    "MatMulNBits 4-bit block 32, float compute (published q4)": ("nbits", 4, 32, 0),
}
ROWS = (1, 8)


def _log(message: str) -> None:
    print(f"[bench-quant] {message}", file=sys.stderr, flush=True)


def _machine() -> dict[str, Any]:
    import onnxruntime

    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "onnxruntime": onnxruntime.__version__,
        "loadavg": os.getloadavg(),
    }


# -- kernels ------------------------------------------------------------------------------------
def _stack(layers: int) -> Any:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, weights, x = [], [], "x"
    for layer in range(layers):
        for index, shape in enumerate(LAYER_SHAPES):
            name, out = f"w{layer}_{index}", f"y{layer}_{index}"
            array = (0.02 * rng.standard_normal(shape)).astype(np.float32)
            weights.append(numpy_helper.from_array(array, name))
            nodes.append(helper.make_node("MatMul", [x, name], [out], name=f"mm{layer}_{index}"))
            x = out
    graph = helper.make_graph(
        nodes,
        "turbo_matmuls",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", 1, HIDDEN])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["rows", 1, HIDDEN])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def _kernel_variant(model: Any, how: tuple, directory: Path, name: str) -> Path:
    import onnx

    from onnx_tts.tools.quantize.weights import quiet_quantizer

    path = directory / f"{name}.onnx"
    if how[0] == "dynamic":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        source = directory / "fp32.onnx"
        with quiet_quantizer():
            quantize_dynamic(
                source,
                path,
                weight_type=getattr(QuantType, how[1]),
                per_channel=how[2],
                op_types_to_quantize=["MatMul"],
            )
        return path
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    _, bits, block, level = how
    settings = {"block_size": block, "is_symmetric": True, "accuracy_level": level, "bits": bits}
    copy = onnx.ModelProto.FromString(model.SerializeToString())
    quantizer = MatMulNBitsQuantizer(
        copy, **settings, algo_config=DefaultWeightOnlyQuantConfig(**settings)
    )
    with quiet_quantizer():
        quantizer.process()
    onnx.save(quantizer.model.model, str(path))
    return path


def bench_kernels(layers: int, rounds: int, threads: int, calls: int) -> dict[str, Any]:
    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="bench-quant-") as tmp:
        directory = Path(tmp)
        model = _stack(layers)
        onnx.save(model, str(directory / "fp32.onnx"))
        paths = {}
        for name, how in KERNELS.items():
            safe = f"k{len(paths)}"
            paths[name] = (
                directory / "fp32.onnx"
                if how is None
                else _kernel_variant(model, how, directory, safe)
            )
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        sessions = {
            name: ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            for name, path in paths.items()
        }
        sizes = {name: path.stat().st_size for name, path in paths.items()}
        rng = np.random.default_rng(1)
        inputs = {rows: rng.standard_normal((rows, 1, HIDDEN)).astype(np.float32) for rows in ROWS}
        invariant = {}
        for name, session in sessions.items():
            batch = session.run(None, {"x": inputs[8]})[0]
            invariant[name] = all(
                np.array_equal(batch[i : i + 1], session.run(None, {"x": inputs[8][i : i + 1]})[0])
                for i in range(8)
            )
        times: dict[tuple[str, int], list[float]] = {}
        names = list(sessions)
        for round_index in range(rounds):
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                for rows in ROWS:
                    sessions[name].run(None, {"x": inputs[rows]})  # warm
                    for _ in range(calls):
                        start = time.perf_counter()
                        sessions[name].run(None, {"x": inputs[rows]})
                        times.setdefault((name, rows), []).append(time.perf_counter() - start)
    results = []
    for name in names:
        row = {"kernel": name, "bytes": sizes[name], "batch_invariant": invariant[name]}
        for rows in ROWS:
            ms = 1000 * float(np.median(times[(name, rows)]))
            base = 1000 * float(np.median(times[("fp32", rows)]))
            row[f"ms_{rows}_rows"] = ms
            row[f"vs_fp32_{rows}_rows"] = ms / base
        results.append(row)
    return {"layers": layers, "threads": threads, "rounds": rounds, "kernels": results}


# -- the Turbo-shape LM -------------------------------------------------------------------------
def lm_variants(float_path: Path, cache: Path) -> dict[str, Path]:
    """The float LM and its int8 / int4 weights (quantize_weights, as `onnx-tts quantize`
    writes them), cached beside the float graph."""
    import onnx

    from onnx_tts.tools.external_data import save_sharing_data
    from onnx_tts.tools.quantize.weights import WeightsSpec, quantize_weights

    paths = {"float": float_path}
    for kind in ("int8", "int4"):
        path = cache / f"gqa-{kind}.onnx"
        if not path.is_file():
            _log(f"quantizing the LM to {kind} ...")
            model = onnx.load(str(float_path), load_external_data=True)
            quantized = quantize_weights(model, WeightsSpec(kind)).model
            del model
            save_sharing_data([(path, quantized)], f"gqa-{kind}.onnx.data")
        paths[kind] = path
    return paths


def bench_lm(shape_name: str, context: int, steps: int, rounds: int, threads: int) -> dict:
    from benchmarks import lm_graphs
    from onnx_tts.session import KVCache, Session, SessionOptions

    shape = lm_graphs.shape_by_name(shape_name)
    graphs = lm_graphs.ensure_graphs(shape, log=_log)
    paths = lm_variants(graphs.gqa_path, graphs.directory)
    options = SessionOptions(intra_op_threads=threads, inter_op_threads=1)
    sessions = {name: Session(path, options) for name, path in paths.items()}
    rng = np.random.default_rng(0)
    times: dict[tuple[str, int], list[float]] = {}
    agreement: dict[str, dict[str, float | None]] = {}
    for round_index in range(rounds):
        names = list(sessions)
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            for rows in ROWS:
                cache = KVCache(
                    sessions[name], "inplace", batch_size=rows, capacity=context + steps + 1
                )
                prompt = rng.integers(0, shape.vocab, (rows, context)).astype(np.int64)
                cache.step({"input_ids": prompt}, output_names=["logits"])
                for _ in range(steps):
                    token = rng.integers(0, shape.vocab, (rows, 1)).astype(np.int64)
                    start = time.perf_counter()
                    cache.step({"input_ids": token}, output_names=["logits"])
                    times.setdefault((name, rows), []).append(time.perf_counter() - start)
                del cache
    # How closely each quantized LM follows the float one (the same random tokens).
    from onnx_tts.tools.quantize.agreement import compare_with_cache
    from onnx_tts.tools.quantize.feeds import Hint

    for name in ("int8", "int4"):
        check = compare_with_cache(
            paths["float"],
            paths[name],
            prefill_tokens=8,
            steps=20,
            hints={"input_ids": Hint(high=shape.vocab)},
        )
        logits = check.outputs[0]
        agreement[name] = {"cosine_mean": logits.cosine_mean, "argmax": logits.top1}
    rows_out = []
    for name, path in paths.items():
        row: dict[str, Any] = {"weights": name, "bytes": _graph_bytes(path)}
        for rows in ROWS:
            ms = 1000 * float(np.median(times[(name, rows)]))
            row[f"ms_per_step_{rows}_rows"] = ms
            row[f"vs_float_{rows}_rows"] = ms / (1000 * float(np.median(times[("float", rows)])))
        row["agreement_with_float"] = agreement.get(name)
        rows_out.append(row)
    return {
        "shape": shape_name,
        "context": context,
        "steps_per_round": steps,
        "rounds": rounds,
        "threads": threads,
        "lm": rows_out,
    }


def _graph_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


# -- the default voice --------------------------------------------------------------------------
def held_out_sentences(count: int) -> list[str]:
    """The sentences the voice's own evaluation speaks (export/train_voice.py eval_plans)."""
    from export.train_voice import eval_plans

    plan = eval_plans(argparse.Namespace(seed=0, eval_sentences=count))[0]
    return [text for text, _ in plan.pairs]


def voice_bundles(work: Path) -> dict[str, Path]:
    """The shipped voice, its float twin and `onnx-tts quantize --weights int4` of the twin."""
    import onnx

    from onnx_tts.bundle import VOICE_MODEL_DIR, Bundle, manifest_files, write_bundle
    from onnx_tts.tools.quantize import WeightsSpec, dequantize_matmul_nbits, quantize_model

    shipped = Bundle.read(VOICE_MODEL_DIR)
    twin = work / "float"
    if not twin.is_dir():
        manifest = {k: v for k, v in shipped.manifest.items() if k != "sha256"}
        manifest["lm"] = {**manifest["lm"], "weights": "float32"}
        files: dict[str, Any] = {
            n: (VOICE_MODEL_DIR / n).read_bytes() for n in manifest_files(manifest)
        }
        lm = onnx.load(str(VOICE_MODEL_DIR / "lm.onnx"))
        dequantize_matmul_nbits(lm)
        files["lm.onnx"] = lm
        write_bundle(twin, manifest, files)
    int4 = work / "int4"
    if not int4.is_dir():
        # The LM only: the tool measured the other graphs not to pay (embed ~1.0x the float
        # time, the vocoder slower and disagreeing: mean cosine 0.95), and an embed decision
        # made on timing alone would make the candidate differ run to run.
        quantize_model(twin, int4, WeightsSpec("int4"), graphs=["lm"], log=_log)
    return {"float": twin, "int8 (shipped)": VOICE_MODEL_DIR, "int4": int4}


def bench_voice(sentences: int, threads: int, work: Path) -> dict[str, Any]:
    import onnx_tts
    from export.voice.evaluate import Transcriber, corpus_wer, dnsmos

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    bundles = voice_bundles(work)
    texts = held_out_sentences(sentences)
    engines = {
        name: onnx_tts.load(str(path), threads=threads, cache_dir=None)
        for name, path in bundles.items()
    }
    for engine in engines.values():
        list(engine.stream(texts[0]))  # warm-up
    audio: dict[str, list[np.ndarray]] = {name: [] for name in engines}
    rtf: dict[str, list[float]] = {name: [] for name in engines}
    first: dict[str, list[float]] = {name: [] for name in engines}
    names = list(engines)
    for index, text in enumerate(texts):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            pieces: list[np.ndarray] = []
            for piece in engines[name].stream(text, seed=index):
                if not pieces:
                    first[name].append(time.perf_counter() - start)
                pieces.append(piece)
            wall = time.perf_counter() - start
            clip = np.concatenate(pieces) if pieces else np.zeros(1, np.float32)
            rtf[name].append(wall / max(len(clip) / engines[name].sample_rate, 1e-3))
            audio[name].append(clip)
    _log("transcribing and scoring ...")
    transcribe = Transcriber(threads)
    results: dict[str, Any] = {}
    for name, clips in audio.items():
        hypotheses = [transcribe(c) for c in clips]
        results[name] = {
            "wer": corpus_wer(texts, hypotheses),
            "dnsmos_ovrl": float(np.mean([dnsmos(c)["ovrl_mos"] for c in clips])),
            "dnsmos_ovrl_first_30": float(np.mean([dnsmos(c)["ovrl_mos"] for c in clips[:30]])),
            "rtf_median": float(np.median(rtf[name])),
            "first_audio_ms_median": 1000 * float(np.median(first[name])),
            "bundle_bytes": sum(p.stat().st_size for p in Path(bundles[name]).iterdir()),
            "transcripts": hypotheses[:5],
        }
    base = results["float"]
    for row in results.values():
        row["wer_minus_float"] = row["wer"] - base["wer"]
        row["dnsmos_minus_float"] = row["dnsmos_ovrl"] - base["dnsmos_ovrl"]
        row["rtf_vs_float"] = row["rtf_median"] / base["rtf_median"]
        row["meets_issue_bounds"] = bool(
            row["wer_minus_float"] <= 0.005
            and row["dnsmos_minus_float"] >= -0.03
            and row["rtf_vs_float"] <= 0.7
        )
    reports = {
        name: json.loads((Path(path) / "quantize_report.json").read_text())["graphs"]
        for name, path in bundles.items()
        if (Path(path) / "quantize_report.json").is_file()
    }
    return {
        "sentences": len(texts),
        "threads": threads,
        "references": texts[:5],
        "bundles": {name: str(path) for name, path in bundles.items()},
        "results": results,
        "quantize_decisions": {
            name: {g["name"]: g["decision"] for g in graphs} for name, graphs in reports.items()
        },
    }


# -- output -------------------------------------------------------------------------------------
def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = [p for p in ("kernels", "lm", "voice") if p in results]
    figure, axes = plt.subplots(1, len(parts), figsize=(6 * len(parts), 4.5), squeeze=False)
    for axis, part in zip(axes[0], parts, strict=True):
        if part == "kernels":
            rows = results["kernels"]["kernels"]
            labels = [
                r["kernel"].replace(" (MatMulInteger)", "").replace("MatMulNBits ", "NBits ")
                for r in rows
            ]
            y = np.arange(len(rows))
            axis.barh(y - 0.2, [r["vs_fp32_1_rows"] for r in rows], 0.4, label="1 row")
            axis.barh(y + 0.2, [r["vs_fp32_8_rows"] for r in rows], 0.4, label="8 rows")
            axis.set_yticks(
                y,
                [
                    f"{lab}{' *' if r['batch_invariant'] else ''}"
                    for lab, r in zip(labels, rows, strict=True)
                ],
                fontsize=7,
            )
            axis.set_xlabel("time vs fp32 (* rows batch-invariant)")
            axis.set_title("Turbo-shape MatMul stack, 1 thread")
        elif part == "lm":
            rows = results["lm"]["lm"]
            x = np.arange(len(rows))
            axis.bar(x - 0.2, [r["ms_per_step_1_rows"] for r in rows], 0.4, label="1 row")
            axis.bar(x + 0.2, [r["ms_per_step_8_rows"] for r in rows], 0.4, label="8 rows")
            axis.set_xticks(x, [r["weights"] for r in rows])
            axis.set_ylabel("ms per decode step")
            axis.set_title(f"Turbo-shape LM, context {results['lm']['context']}")
        else:
            rows = results["voice"]["results"]
            names = list(rows)
            x = np.arange(len(names))
            axis.bar(x, [rows[n]["rtf_median"] for n in names], 0.5)
            for i, n in enumerate(names):
                axis.annotate(
                    f"WER {rows[n]['wer']:.3f}\nDNSMOS {rows[n]['dnsmos_ovrl']:.2f}",
                    (i, rows[n]["rtf_median"]),
                    ha="center",
                    va="bottom",
                    fontsize=8,
                )
            axis.set_xticks(x, names)
            axis.set_ylabel("streaming RTF (lower is better)")
            axis.set_title("default voice")
        axis.grid(alpha=0.3)
        if part != "voice":
            axis.legend()
    save_figure(figure, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="kernels,lm,voice")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (kernels, lm)")
    parser.add_argument("--context", type=int, default=256, help="LM prefill before the steps")
    parser.add_argument("--steps", type=int, default=16, help="LM decode steps per round")
    parser.add_argument("--shape", default="turbo", help="LM shape (benchmarks/lm_graphs.py)")
    parser.add_argument("--kernel-layers", type=int, default=4)
    parser.add_argument("--sentences", type=int, default=100)
    parser.add_argument("--voice-threads", type=int, default=2)
    parser.add_argument("--voice-work", type=Path, default=None, help="where voice twins go")
    parser.add_argument("--quick", action="store_true", help="small shapes, few rounds")
    parser.add_argument("--json", type=Path, default=RESULTS / "quant.json")
    parser.add_argument("--plot", type=Path, default=RESULTS / "quant.png")
    parser.add_argument("--table", action="store_true", help="print the tables of --json, exit")
    args = parser.parse_args(argv)
    if args.table:
        print(markdown_tables(json.loads(args.json.read_text())))
        return 0
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = set(parts) - {"kernels", "lm", "voice"}
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}")
    if args.quick:
        args.rounds, args.kernel_layers, args.shape = 2, 1, "turbo-small"
        args.sentences, args.steps, args.context = 4, 8, 64
    results: dict[str, Any] = {"machine_before": _machine()}
    if "kernels" in parts:
        _log("kernels ...")
        results["kernels"] = bench_kernels(args.kernel_layers, args.rounds, args.threads, 10)
    if "lm" in parts:
        _log("Turbo-shape LM ...")
        results["lm"] = bench_lm(args.shape, args.context, args.steps, args.rounds, args.threads)
    if "voice" in parts:
        _log("default voice ...")
        work = args.voice_work or Path(tempfile.mkdtemp(prefix="bench-quant-voice-"))
        results["voice"] = bench_voice(args.sentences, args.voice_threads, work)
    results["machine_after"] = _machine()
    write_json(args.json, results)
    plot(results, args.plot)
    print(markdown_tables(results))
    return 0


def markdown_tables(results: dict[str, Any]) -> str:
    """The summary tables (docs/BENCHMARKS.md) of a results file."""
    lines: list[str] = []
    if "kernels" in results:
        k = results["kernels"]
        lines += [
            f"{k['layers']}-layer stack of Turbo-shape MatMuls, {k['threads']} thread, "
            f"{k['rounds']} rounds:",
            "",
            "| weights | ms, 1 row | x fp32 | ms, 8 rows | x fp32 | rows batch-invariant |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for r in k["kernels"]:
            lines.append(
                f"| {r['kernel']} | {r['ms_1_rows']:.2f} | {r['vs_fp32_1_rows']:.2f} | "
                f"{r['ms_8_rows']:.2f} | {r['vs_fp32_8_rows']:.2f} | "
                f"{'yes' if r['batch_invariant'] else 'no'} |"
            )
        lines.append("")
    if "lm" in results:
        lm = results["lm"]
        lines += [
            f"`{lm['shape']}` LM, in place, context {lm['context']}, {lm['threads']} thread, "
            f"{lm['rounds']} rounds:",
            "",
            "| weights | ms/step, 1 row | x float | ms/step, 8 rows | x float | logits vs float "
            "(mean cosine, argmax) | size |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in lm["lm"]:
            agree = r["agreement_with_float"]
            shown = f"{agree['cosine_mean']:.4f}, {agree['argmax']:.2f}" if agree else ""
            lines.append(
                f"| {r['weights']} | {r['ms_per_step_1_rows']:.1f} | {r['vs_float_1_rows']:.2f} | "
                f"{r['ms_per_step_8_rows']:.1f} | {r['vs_float_8_rows']:.2f} | {shown} | "
                f"{r['bytes'] / 2**20:.0f} MiB |"
            )
        lines.append("")
    if "voice" in results:
        v = results["voice"]
        lines += [
            f"{v['sentences']} held-out sentences, streamed, {v['threads']} threads:",
            "",
            "| default voice | WER (- float) | DNSMOS ovrl (- float) | RTF | x float | first audio "
            "| bundle | issue bounds |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for name, r in v["results"].items():
            bounds = "met" if r["meets_issue_bounds"] else "not met"
            bounds = "(reference)" if name == "float" else bounds
            lines.append(
                f"| {name} | {r['wer']:.4f} ({r['wer_minus_float']:+.4f}) | "
                f"{r['dnsmos_ovrl']:.3f} ({r['dnsmos_minus_float']:+.3f}) | {r['rtf_median']:.4f} "
                f"| {r['rtf_vs_float']:.2f} | {r['first_audio_ms_median']:.0f} ms | "
                f"{r['bundle_bytes'] / 2**20:.1f} MiB | {bounds} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())

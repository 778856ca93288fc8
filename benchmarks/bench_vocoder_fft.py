"""Issue 28: the default voice's vocoder with Conv-form DFTs (before) against the FFT form
(after), measured side by side in one process, one thread each.

``python benchmarks/bench_vocoder_fft.py [--sentences 24] [--out FILE]`` (default: results/
vocoder_fft.json)

"Before" is the checked-in vocoder as it was (rebuilt in the Conv form from the weights of the
bundle, and checked to be that file byte for byte, sha256 below); "after" is the bundle's
vocoder.onnx. On the bundle's own speech for held-out sentences (Debian `fortunes`, the
recipe's held-out split; ``apt-get install fortunes wamerican``):

* speed: wall time per window (1 thread, windows of 22 / 60 / 150 / 300 mel frames, A/B
  taking turns), ORT's profile by operator for one 150-frame window, the ONNX DFT op and the
  overlap-add choices on their own, the per-window cost at batch 1 / 2 / 4 / 8 and whether a
  batch gives the same bits as one window at a time, and the engine's one-shot RTF;
* sameness: max |after - before| and SNR of the audio on the LM's mels, streamed against
  one-shot SNR for each, Whisper tiny.en WER of each and DNSMOS if `speechmos` is installed.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: make `export` and `onnx_tts` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results_io import write_json

RESULTS = Path(__file__).resolve().parent / "results" / "vocoder_fft.json"
# sha256 of onnx_tts/models/voice/vocoder.onnx before issue 28 (Conv / ConvTranspose DFTs).
CONV_VOCODER_SHA256 = "8c99b48174150286c154bdbcd78e569127ad68ac310eee003115c9dce02b6f30"
WINDOWS = (22, 60, 150, 300)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, default=None, help="default: the installed voice")
    parser.add_argument("--sentences", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=15, help="timed runs of each window")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from export.voice.fft_vocoder import read_bundle_vocoder, speech_mels, vocoder_session
    from onnx_tts.bundle import VOICE_MODEL_DIR

    bundle = args.bundle or VOICE_MODEL_DIR
    source = read_bundle_vocoder(bundle)
    if source.dft != "fft":
        raise SystemExit(f"{bundle}'s vocoder is not in the FFT form: convert it first")
    after_bytes = (bundle / "vocoder.onnx").read_bytes()
    before_parts = source.build("conv")
    before_bytes = before_parts.graph.SerializeToString(deterministic=True)
    sha = hashlib.sha256(before_bytes).hexdigest()
    sentences = held_out_sentences(args.sentences)
    print(f"{len(sentences)} held-out sentences; LM mels ...", flush=True)
    mels = speech_mels(bundle, sentences)
    graphs = {"before": before_bytes, "after": after_bytes}
    sessions = {name: vocoder_session(data) for name, data in graphs.items()}
    results: dict = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "load_average_start": os.getloadavg(),
        "bundle": str(bundle),
        "before": {
            "sha256": sha,
            "is_the_pre_issue_28_file": sha == CONV_VOCODER_SHA256,
            "bytes": len(before_bytes),
        },
        "after": {"sha256": hashlib.sha256(after_bytes).hexdigest(), "bytes": len(after_bytes)},
        "sentences": sentences,
        "mel_frames": [len(m) for m in mels],
    }
    print("speed per window ...", flush=True)
    results["speed"] = window_speed(sessions, mels, args.repeats)
    print("profiles ...", flush=True)
    results["profile"] = op_profiles(graphs, mels, frames=150)
    print("DFT and overlap-add ops ...", flush=True)
    results["ops"] = dft_and_overlap_add_ops(args.repeats)
    print("batches ...", flush=True)
    results["batch"] = batches(sessions, mels, args.repeats)
    print("sameness ...", flush=True)
    results["sameness"] = sameness(sessions, mels)
    print("engines: streaming, WER, RTF ...", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        from export.voice.bundle import rebundle_with_vocoder

        before_dir = Path(tmp) / "before"
        rebundle_with_vocoder(before_dir, bundle, before_parts)
        results["engine"] = engines({"before": before_dir, "after": bundle}, sentences)
    results["load_average_end"] = os.getloadavg()
    write_json(args.out, results)
    summarise(results)
    print(f"-> {args.out}")


def held_out_sentences(count: int) -> list[str]:
    """The first `count` held-out sentences of the recipe's corpus with 5-20 words."""
    from export.voice import data

    picked = [s for s in data.build_corpus()["heldout"] if 5 <= len(s.split()) <= 20]
    if len(picked) < count:
        raise SystemExit(f"only {len(picked)} held-out sentences: apt-get install fortunes")
    return picked[:count]


def _windows(mels: list[np.ndarray], frames: int, count: int) -> list[np.ndarray]:
    """`count` windows of `frames` LM frames cut from the sentences' mels end to end."""
    joined = np.concatenate(mels)
    starts = np.linspace(0, len(joined) - frames, count).astype(int)
    return [joined[s : s + frames] for s in starts]


def _timed(session, mel: np.ndarray) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    session.run(["waveform"], {"mel": mel})
    return time.perf_counter() - start


def window_speed(sessions: dict, mels: list[np.ndarray], repeats: int) -> list[dict]:
    """Wall time per window, before and after taking turns run by run."""
    rows = []
    for frames in WINDOWS:
        windows = _windows(mels, frames, repeats)
        times: dict[str, list[float]] = {name: [] for name in sessions}
        for window in windows:
            for name, session in sessions.items():
                times[name].append(_timed(session, window[None]))
        row: dict = {"frames": frames, "audio_seconds": frames * 320 / 16000}
        for name, values in times.items():
            row[name] = {
                "min_ms": 1e3 * min(values),
                "median_ms": 1e3 * statistics.median(values),
            }
        row["speedup_median"] = row["before"]["median_ms"] / row["after"]["median_ms"]
        row["speedup_min"] = row["before"]["min_ms"] / row["after"]["min_ms"]
        rows.append(row)
        print(
            f"  {frames:3d} frames: before {row['before']['median_ms']:.1f} ms, after "
            f"{row['after']['median_ms']:.1f} ms (median), x{row['speedup_median']:.2f}",
            flush=True,
        )
    return rows


def op_profiles(graphs: dict[str, bytes], mels: list[np.ndarray], frames: int, runs: int = 8):
    """ORT's profile of one window for each graph, runs taking turns: kernel time per run by
    operator (each node's median run times its count, so one descheduled run does not count)
    and the total."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        sessions = {}
        for name, graph in graphs.items():
            options = ort.SessionOptions()
            options.intra_op_num_threads = 1
            options.enable_profiling = True
            options.profile_file_prefix = str(Path(tmp) / name)
            sessions[name] = ort.InferenceSession(
                graph, options, providers=["CPUExecutionProvider"]
            )
        window = _windows(mels, frames, 1)[0][None]
        for _ in range(runs):
            for session in sessions.values():
                session.run(["waveform"], {"mel": window})
        events = {
            name: json.loads(Path(s.end_profiling()).read_text()) for name, s in sessions.items()
        }
    return {name: _by_op(found, frames) for name, found in events.items()}


def _by_op(events: list, frames: int) -> dict:
    by_node: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            by_node[(event["args"]["op_name"], event["name"])].append(event["dur"] / 1e3)
    by_op: dict[str, float] = collections.defaultdict(float)
    nodes: dict[str, int] = collections.Counter()
    for (op, _), durations in by_node.items():
        by_op[op] += statistics.median(durations)
        nodes[op] += 1
    total = sum(by_op.values())
    top = sorted(by_op.items(), key=lambda kv: -kv[1])
    return {
        "frames": frames,
        "kernel_ms_per_run": total,
        "nodes": sum(nodes.values()),
        "by_op": [{"op": op, "ms": ms, "share": ms / total, "nodes": nodes[op]} for op, ms in top],
    }


def dft_and_overlap_add_ops(repeats: int) -> dict:
    """The forward real DFT of 301 frames of 512 samples (1 thread): ONNX DFT (onesided), the
    dense product the Conv form amounts to, and the FFT form's two products; the ONNX STFT op
    and two ways to cut the frames; the overlap-add of 300 frames at hop 160: negative-pad
    shifts + Sum (used), Col2Im and ScatterElements (reduction add)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from export.voice.fft import FFTPlan

    def session(nodes: list, inits: dict, opset: int = 18):  # type: ignore[no-untyped-def]
        graph = helper.make_graph(
            nodes,
            "op",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 10
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        return ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )

    def timed(cases: dict) -> dict:
        times: dict[str, list[float]] = {name: [] for name in cases}
        outputs = {name: s.run(None, {"x": x})[0] for name, (s, x) in cases.items()}
        for _ in range(repeats):
            for name, (s, x) in cases.items():
                start = time.perf_counter()
                s.run(None, {"x": x})
                times[name].append(time.perf_counter() - start)
        return {
            name: {"median_ms": 1e3 * statistics.median(t), "min_ms": 1e3 * min(t)}
            for name, t in times.items()
        } | {"_outputs": outputs}

    rng = np.random.default_rng(0)
    n_fft, frames, hop = 512, 301, 160
    plan = FFTPlan.choose(n_fft, hop)
    x = rng.standard_normal((1, frames, n_fft)).astype(np.float32)
    angle = 2 * np.pi * np.outer(np.arange(n_fft), np.arange(plan.bins)) / n_fft
    dense = np.concatenate([np.cos(angle), -np.sin(angle)], axis=1).astype(np.float32)
    by_rows = x.transpose(0, 2, 1).reshape(1, plan.rows, -1)  # [1, a, (c, t)]
    dft = timed(
        {
            "onnx_dft_onesided": (
                session([helper.make_node("DFT", ["x"], ["y"], axis=2, onesided=1)], {}, 17),
                x[..., None],
            ),
            "dense_matmul": (
                session([helper.make_node("MatMul", ["x", "k"], ["y"])], {"k": dense}),
                x,
            ),
            "fft_two_matmuls": (
                session(
                    [
                        helper.make_node("MatMul", ["w1", "x"], ["y1"]),
                        helper.make_node("Reshape", ["y1", "s1"], ["y2"]),
                        helper.make_node("MatMul", ["w2", "y2"], ["y"]),
                    ],
                    {
                        "w1": plan.analysis_rows,
                        "w2": plan.analysis_cols,
                        "s1": np.array([0, plan.rows, 2 * plan.cols, -1], np.int64),
                    },
                ),
                np.ascontiguousarray(by_rows),
            ),
        }
    )
    reference = np.fft.rfft(x[0].astype(np.float64), axis=-1)
    onnx_dft = dft.pop("_outputs")["onnx_dft_onesided"][0]
    dft["onnx_dft_max_abs_error"] = float(
        np.abs(onnx_dft[..., 0] + 1j * onnx_dft[..., 1] - reference).max()
    )

    # The ONNX STFT op on the signal those frames come from (window and framing included),
    # against framing by Gather (a [T, n_fft] index) and the FFT form's slices of hop-major
    # audio: the STFT op runs the DFT kernel frame by frame.
    signal = rng.standard_normal((1, (frames - 1) * hop + n_fft)).astype(np.float32)
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)).astype(np.float32)
    columns = frames + plan.groups - 1
    hop_major = np.zeros((1, columns * hop), np.float32)
    hop_major[0, : signal.shape[1]] = signal[0]
    hop_major = np.ascontiguousarray(hop_major.reshape(1, columns, hop).transpose(0, 2, 1))
    ends = {
        f"e{g}": np.array([plan.group_rows(g), frames + g], np.int64)
        for g in range(plan.frame_groups)
    }
    starts = {f"b{g}": np.array([0, g], np.int64) for g in range(plan.frame_groups)}
    framing = timed(
        {
            "onnx_stft_op": (
                session(
                    [helper.make_node("STFT", ["x", "step", "window", "length"], ["y"])],
                    {
                        "step": np.array(hop, np.int64),
                        "window": window,
                        "length": np.array(n_fft, np.int64),
                    },
                    17,
                ),
                signal[..., None],
            ),
            "gather_frames": (
                session(
                    [helper.make_node("Gather", ["x", "index"], ["y"], axis=1)],
                    {"index": np.arange(frames)[:, None] * hop + np.arange(n_fft)[None, :]},
                ),
                signal,
            ),
            "hop_major_slices": (
                session(
                    [
                        helper.make_node("Slice", ["x", f"b{g}", f"e{g}", "axes"], [f"s{g}"])
                        for g in range(plan.frame_groups)
                    ]
                    + [
                        helper.make_node(
                            "Concat", [f"s{g}" for g in range(plan.frame_groups)], ["y"], axis=1
                        )
                    ],
                    ends | starts | {"axes": np.array([1, 2], np.int64)},
                ),
                hop_major,
            ),
        }
    )
    outputs = framing.pop("_outputs")
    cut = np.stack([signal[0, t * hop : t * hop + n_fft] for t in range(frames)])
    stft = np.fft.rfft(cut.astype(np.float64) * window, axis=-1)
    by_op = outputs["onnx_stft_op"][0]
    framing["onnx_stft_op_max_abs_error"] = float(
        np.abs(by_op[..., 0] + 1j * by_op[..., 1] - stft).max()
    )
    framing["gather_equals_slices"] = bool(
        np.array_equal(outputs["gather_frames"][0], outputs["hop_major_slices"][0].T)
    )

    t = 300
    groups = plan.frame_groups
    frames_in = rng.standard_normal((1, n_fft, t)).astype(np.float32)  # [B, frame sample, T]
    pads = {
        f"p{g}": np.array([0, -g * hop, g, 0, (g + 1) * hop - n_fft, plan.groups - 1 - g], np.int64)
        for g in range(groups)
    }
    out_len = (t - 1) * hop + n_fft
    index = (np.arange(t)[None, :] * hop + np.arange(n_fft)[:, None])[None]  # [1, n_fft, T]
    ola = timed(
        {
            "pad_shift_sum": (
                session(
                    [helper.make_node("Pad", ["x", f"p{g}"], [f"s{g}"]) for g in range(groups)]
                    + [helper.make_node("Sum", [f"s{g}" for g in range(groups)], ["y"])],
                    pads,
                ),
                frames_in,
            ),
            "col2im": (
                session(
                    [helper.make_node("Col2Im", ["x", "image", "block"], ["y"], strides=[1, hop])],
                    {
                        "image": np.array([1, out_len], np.int64),
                        "block": np.array([1, n_fft], np.int64),
                    },
                ),
                frames_in,
            ),
            "scatter_elements_add": (
                session(
                    [
                        helper.make_node("Reshape", ["x", "flat"], ["xf"]),
                        helper.make_node(
                            "ScatterElements",
                            ["zeros", "index", "xf"],
                            ["y"],
                            axis=1,
                            reduction="add",
                        ),
                    ],
                    {
                        "flat": np.array([1, -1], np.int64),
                        "zeros": np.zeros((1, out_len), np.float32),
                        "index": index.reshape(1, -1),
                    },
                ),
                frames_in,
            ),
        }
    )
    outputs = ola.pop("_outputs")
    hop_major = outputs["pad_shift_sum"][0].T.reshape(-1)[:out_len]
    for name in ("col2im", "scatter_elements_add"):
        other = outputs[name].reshape(-1)[:out_len]
        ola[f"{name}_max_abs_vs_pad_shift_sum"] = float(np.abs(other - hop_major).max())
    return {
        "real_dft_301x512": dft,
        "framing_301x512_hop160": framing,
        "overlap_add_300x512_hop160": ola,
    }


def batches(sessions: dict, mels: list[np.ndarray], repeats: int) -> dict:
    """B windows of 150 frames in one call: per-window cost (before / after taking turns) and
    whether each row equals that window run alone."""
    windows = np.stack(_windows(mels, 150, 8))
    out: dict = {}
    for name, session in sessions.items():
        alone = np.concatenate([session.run(["waveform"], {"mel": w[None]})[0] for w in windows])
        out[name] = {}
        for size in (2, 4, 8):
            batch = session.run(["waveform"], {"mel": windows[:size]})[0]
            out[name][f"B{size}"] = {
                "bit_identical_to_B1": bool(np.array_equal(batch, alone[:size])),
                "max_abs_diff_to_B1": float(np.abs(batch - alone[:size]).max()),
            }
    for size in (1, 2, 4, 8):
        times: dict[str, list[float]] = {name: [] for name in sessions}
        for _ in range(max(3, repeats // 2)):
            for name, session in sessions.items():
                times[name].append(_timed(session, windows[:size]) / size)
        for name in sessions:
            out[name].setdefault(f"B{size}", {})["per_window_ms_median"] = 1e3 * statistics.median(
                times[name]
            )
    return out


def sameness(sessions: dict, mels: list[np.ndarray]) -> dict:
    from export.voice.evaluate import snr_db

    clips = []
    for mel in mels:
        before, after = (s.run(["waveform"], {"mel": mel[None]})[0][0] for s in sessions.values())
        clips.append(
            {
                "frames": len(mel),
                "max_abs_diff": float(np.abs(after - before).max()),
                "peak": float(np.abs(before).max()),
                "snr_db": snr_db(before, after),
            }
        )
    snrs = [c["snr_db"] for c in clips]
    return {
        "clips": clips,
        "max_abs_diff": max(c["max_abs_diff"] for c in clips),
        "snr_db_min": min(snrs),
        "snr_db_median": statistics.median(snrs),
    }


def engines(bundles: dict[str, Path], sentences: list[str]) -> dict:
    """Per bundle: one-shot audio, streamed vs one-shot SNR, Whisper WER, DNSMOS (if
    speechmos is there) and the engine's one-shot RTF at 1 thread (bundles taking turns
    sentence by sentence)."""
    import onnx_tts
    from export.voice.evaluate import Transcriber, corpus_wer, snr_db

    loaded = {
        name: onnx_tts.load(str(path), cache_dir=None, threads=1) for name, path in bundles.items()
    }
    audio: dict[str, list[np.ndarray]] = {name: [] for name in loaded}
    seconds: dict[str, float] = {name: 0.0 for name in loaded}
    stream_snr: dict[str, list[float]] = {name: [] for name in loaded}
    for sentence in sentences:
        for name, engine in loaded.items():
            start = time.perf_counter()
            clip = engine.synthesize(sentence).samples
            seconds[name] += time.perf_counter() - start
            audio[name].append(clip)
            streamed = np.concatenate(list(engine.stream(sentence)))
            stream_snr[name].append(snr_db(clip, streamed))
    transcribe = Transcriber(threads=2)
    out: dict = {}
    for name in loaded:
        total_audio = sum(len(c) for c in audio[name]) / 16000
        hypotheses = [transcribe(c) for c in audio[name]]
        out[name] = {
            "one_shot_rtf_1_thread": seconds[name] / total_audio,
            "stream_vs_one_shot_snr_db_min": min(stream_snr[name]),
            "stream_vs_one_shot_snr_db_median": statistics.median(stream_snr[name]),
            "wer": corpus_wer(sentences, hypotheses),
            "hypotheses": hypotheses,
        }
    try:
        from export.voice.evaluate import dnsmos

        for name in loaded:
            scores = [dnsmos(c)["ovrl_mos"] for c in audio[name][:10]]
            out[name]["dnsmos_ovrl_10_sentences"] = float(np.mean(scores))
    except Exception as error:  # speechmos absent or unable to run: say so in the results
        out["dnsmos_unavailable"] = f"{type(error).__name__}: {error}"
    same = [snr_db(b, a) for b, a in zip(audio["before"], audio["after"], strict=True)]
    out["one_shot_after_vs_before_snr_db_min"] = min(same)
    return out


def summarise(results: dict) -> None:
    for row in results["speed"]:
        print(
            f"window {row['frames']} frames: x{row['speedup_median']:.2f} median "
            f"({row['before']['median_ms']:.1f} -> {row['after']['median_ms']:.1f} ms)"
        )
    for name in ("before", "after"):
        p = results["profile"][name]
        top = ", ".join(f"{r['op']} {r['ms']:.1f}" for r in p["by_op"][:4])
        print(f"profile {name}: {p['kernel_ms_per_run']:.1f} ms kernels, {p['nodes']} nodes: {top}")
    s = results["sameness"]
    print(
        f"after vs before on {len(s['clips'])} clips: max |diff| {s['max_abs_diff']:.2e}, SNR "
        f"min {s['snr_db_min']:.1f} median {s['snr_db_median']:.1f} dB"
    )
    for name in ("before", "after"):
        e = results["engine"][name]
        print(
            f"engine {name}: RTF {e['one_shot_rtf_1_thread']:.3f}, WER {e['wer']:.3f}, stream "
            f"SNR min {e['stream_vs_one_shot_snr_db_min']:.1f} dB"
        )


if __name__ == "__main__":
    main()

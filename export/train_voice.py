"""One command for the project's own voice (issue 8): data -> train -> bundle -> eval.

    python -m export.train_voice --work /work/voice-work [--stages data,train,export,eval]

Every stage is resumable: data shards and LM checkpoints live in the work directory and a
stage skips what is already there (training continues from its last checkpoint). The teacher
and the evaluators come from installed packages (see benchmarks/README_voice.md); nothing is
downloaded at run time.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path

STAGES = ("data", "train", "vocoder", "export", "eval")
CLONE_EVAL_VOICES = ("piper:joe@0.94", "piper:joe@0.92", "piper:joe@1.09")


def eval_plans(args: argparse.Namespace) -> list:
    """Held-out prose sentences spoken by the default voice, a seen warp and the held-out
    warps (references for cloning and speaker similarity)."""
    from export.voice import data

    corpus = data.build_corpus(seed=args.seed)
    prose = set(data.fortune_sentences())
    sentences = [s for s in corpus["heldout"] if s in prose][: args.eval_sentences]
    return [
        data.ShardPlan(f"eval/{voice.replace(':', '_')}", 0, [(s, voice) for s in sentences])
        for voice in (data.DEFAULT_VOICE, *CLONE_EVAL_VOICES)
    ]


def train_plans(args: argparse.Namespace) -> list:
    from export.voice import data

    corpus = data.build_corpus(seed=args.seed)
    voices = data.voice_catalog()["train"]
    return data.plan_shards(
        corpus["train"], voices, args.utterances, args.shard_size, "train", args.seed
    )


def stage_data(work: Path, args: argparse.Namespace) -> None:
    """Renders the planned shards; with --workers N, worker k renders every N-th shard."""
    from export.voice import data

    plans = eval_plans(args) + train_plans(args)
    mine = plans[args.worker :: args.workers]
    data.generate_shards(work, mine, threads=1)


def stage_train(work: Path, args: argparse.Namespace) -> None:
    from export.voice.train import TrainConfig, train

    config = TrainConfig(
        layers=args.layers,
        hidden_size=args.hidden,
        ffn_size=args.ffn,
        learning_rate=args.learning_rate,
        warmup_steps=args.warmup_steps,
        final_weight=args.final_weight,
        delta_weight=args.delta_weight,
    )
    train(work, config, args.minutes, args.seed, init_from=args.lm_init, max_steps=args.steps)


def vocoder_config(args: argparse.Namespace):
    from export.voice.vocoder import VocoderNetConfig

    return VocoderNetConfig(
        hidden=args.vocoder_hidden,
        intermediate=3 * args.vocoder_hidden,
        blocks=args.vocoder_blocks,
    )


def stage_vocoder(work: Path, args: argparse.Namespace) -> None:
    """Trains the neural vocoder on the teacher's audio (WORK/vocoder/checkpoint.pt)."""
    from export.voice.vocoder import VocoderTrainConfig, train_vocoder

    train_cfg = VocoderTrainConfig(
        gan=args.vocoder_gan, lm_share=args.vocoder_lm_share, phase_weight=args.vocoder_phase_weight
    )
    if args.vocoder_learning_rate is not None:
        train_cfg = replace(
            train_cfg,
            learning_rate=args.vocoder_learning_rate,
            final_learning_rate=args.vocoder_learning_rate / 10,
        )
    train_vocoder(
        work,
        vocoder_config(args),
        args.vocoder_minutes,
        args.seed,
        args.lm_from,
        train_cfg,
        max_steps=args.vocoder_steps,
    )


def stage_export(work: Path, args: argparse.Namespace) -> None:
    """The bundle: LM graphs from WORK/lm/checkpoint.pt (or reused from --lm-from) and the
    vocoder chosen by --vocoder, its streaming window measured here (choose_streaming)."""
    from export.voice import bundle as voice_bundle
    from export.voice.vocoder import ensure_mel_stats, load_vocoder

    out = args.bundle or work / "bundle"
    stats = ensure_mel_stats(work, args.lm_from)
    network = None if args.vocoder == "griffin-lim" else load_vocoder(work)
    if args.vocoder == "neural":
        parts = voice_bundle.neural_vocoder_parts(network, {"holdback_frames": 0})
    else:
        parts = voice_bundle.griffin_lim_parts(
            stats,
            voice_bundle.VocoderConfig(iterations=args.gl_iterations, power=args.gl_power),
            network,
        )
    if args.vocoder != "griffin-lim":
        # Griffin-Lim from a fixed phase re-estimates each window's phase and never streams
        # within 30 dB of its one-shot output; from the network's phase it does.
        parts = with_measured_streaming(parts, work, stats, args.lm_from)
    if args.lm_from:
        sizes = voice_bundle.rebundle_with_vocoder(out, args.lm_from, parts)
    else:
        from export.voice.train import blend_weights, load_trained, model_from_bundle

        model, stats = load_trained(work)
        if args.blend_base:
            base = model_from_bundle(args.blend_base, model.cfg)
            model = blend_weights(model, base, args.blend)
            print(f"export: LM = {args.blend} x trained + {1 - args.blend:.2f} x {args.blend_base}")
        sizes = voice_bundle.write_bundle(out, model, stats, parts, lm_int8=args.lm_int8)
    print(f"export: {sum(sizes.values()):,d} bytes -> {out}")


def with_measured_streaming(
    parts: object, work: Path, stats: dict, lm_bundle: Path | None, clips: int = 40
) -> object:
    """`parts` with the streaming window measured on training clips: the smallest hold-back
    that keeps streamed audio within 30 dB of one-shot (choose_streaming), worst case over
    the teacher's mels and, given the bundle whose LM will drive the vocoder, that LM's
    teacher-forced mels of the same clips (smoother frames, which need a longer look-ahead:
    on the model's own speech 12 frames measured 22 dB worst in 30 sentences, 14 frames 48)."""
    import numpy as np
    import onnxruntime as ort

    from export.voice import data
    from export.voice.codec import MEL_CONFIG
    from export.voice.evaluate import choose_streaming
    from export.voice.vocoder import lm_teacher_forced_mels, standardised_mel

    session = ort.InferenceSession(parts.graph.SerializeToString(deterministic=True))

    def decode(mel: np.ndarray) -> np.ndarray:
        return session.run(["waveform"], {"mel": mel[None].astype(np.float32)})[0][0]

    shard = sorted((work / "data" / "train").glob("shard-*.npz"))[0]
    utterances = data.load_shard(shard)[:clips]
    mels = [standardised_mel(u.audio, stats) for u in utterances]
    if lm_bundle is not None:
        mels += lm_teacher_forced_mels(lm_bundle, utterances, stats)
    streaming, sweep = choose_streaming(decode, mels, MEL_CONFIG.hop_length)
    print(f"export: streaming sweep over {len(mels)} clips {sweep} -> {streaming}")
    section = dict(parts.section, lookahead_frames=streaming["holdback_frames"])
    return replace(parts, streaming=streaming, section=section)


def stage_eval(work: Path, args: argparse.Namespace) -> None:
    from export.voice.evaluate import run_evaluation

    results = run_evaluation(
        work, args.bundle or work / "bundle", args.eval_sentences, args.threads
    )
    tmp = work / "eval.json.tmp"
    tmp.write_text(json.dumps(results, indent=1))
    os.replace(tmp, work / "eval.json")
    print(json.dumps(results["summary"], indent=1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/work/voice-work"))
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--utterances", type=int, default=6000)
    parser.add_argument("--shard-size", type=int, default=250)
    parser.add_argument("--eval-sentences", type=int, default=120)
    parser.add_argument("--workers", type=int, default=1, help="stage data: processes in all")
    parser.add_argument("--worker", type=int, default=0, help="stage data: this process's index")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gl-iterations", type=int, default=16)
    parser.add_argument(
        "--gl-power",
        type=float,
        default=1.0,
        help="Griffin-Lim: the linear magnitude is raised to this power before phase recovery",
    )
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--ffn", type=int, default=768)
    parser.add_argument("--minutes", type=float, default=60.0, help="training time this run")
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="stage train: stop once the checkpoint has taken this many steps in all",
    )
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--warmup-steps", type=int, default=300)
    parser.add_argument(
        "--final-weight",
        type=float,
        default=1.0,
        help="stage train: mel-loss weight of steps speaking a word's last phoneme",
    )
    parser.add_argument(
        "--delta-weight",
        type=float,
        default=0.0,
        help="stage train: weight of the L1 on frame-to-frame mel change (against smoothing)",
    )
    parser.add_argument(
        "--lm-init",
        type=Path,
        default=None,
        help="stage train: start from this bundle's embed/lm weights when WORK has no "
        "checkpoint (its architecture wins over --layers/--hidden/--ffn)",
    )
    parser.add_argument(
        "--blend-base",
        type=Path,
        default=None,
        help="stage export: blend the trained LM's weights with this bundle's (WiSE-FT)",
    )
    parser.add_argument(
        "--blend",
        type=float,
        default=1.0,
        help="stage export, with --blend-base: share of the trained weights (0-1)",
    )
    parser.add_argument(
        "--lm-int8",
        action="store_true",
        help="stage export: the LM's MatMul weights as int8 (a decode step reads 4x fewer bytes)",
    )
    parser.add_argument("--bundle", type=Path, default=None, help="default: WORK/bundle")
    parser.add_argument(
        "--lm-from",
        type=Path,
        default=None,
        help="a built bundle whose encoder/embed/lm graphs (and mel statistics) export reuses "
        "instead of WORK/lm/checkpoint.pt, e.g. onnx_tts/models/voice",
    )
    parser.add_argument(
        "--vocoder",
        choices=("neural", "griffin-lim", "neural-phase-griffin-lim"),
        default="neural",
        help="stage export: the neural vocoder (WORK/vocoder/checkpoint.pt), Griffin-Lim from a "
        "fixed starting phase, or Griffin-Lim starting from the neural vocoder's phase",
    )
    parser.add_argument("--vocoder-hidden", type=int, default=192)
    parser.add_argument("--vocoder-blocks", type=int, default=6)
    parser.add_argument("--vocoder-minutes", type=float, default=50.0)
    parser.add_argument(
        "--vocoder-steps",
        type=int,
        default=None,
        help="stage vocoder: stop at this step count in all, the learning rate decaying over "
        "this run's steps (reproducible on any machine; --vocoder-minutes still caps the time)",
    )
    parser.add_argument(
        "--vocoder-lm-share",
        type=float,
        default=0.0,
        help="stage vocoder: share (0-1) of the clips whose input mel is the --lm-from bundle's "
        "LM run teacher-forced, so the vocoder learns the frames the LM really emits",
    )
    parser.add_argument(
        "--vocoder-phase-weight",
        type=float,
        default=0.3,
        help="stage vocoder: weight of the direct phase losses against the magnitude losses",
    )
    parser.add_argument(
        "--vocoder-gan",
        action="store_true",
        help="stage vocoder: continue with a multi-resolution spectrogram discriminator",
    )
    parser.add_argument(
        "--vocoder-learning-rate",
        type=float,
        default=None,
        help="stage vocoder: peak learning rate (default 1e-3; it decays by cosine to a tenth); "
        "a continuation such as --vocoder-gan wants a lower one, e.g. 2e-4",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = set(stages) - set(STAGES)
    if unknown:
        parser.error(f"unknown stages {sorted(unknown)}; choose from {', '.join(STAGES)}")
    if not 0.0 <= args.blend <= 1.0:
        parser.error(f"--blend must be within 0-1 (the trained weights' share), got {args.blend}")
    if args.blend != 1.0 and args.blend_base is None:
        parser.error("--blend needs --blend-base DIR: the bundle whose weights make up the rest")
    if args.lm_int8 and args.lm_from:
        parser.error("--lm-int8 quantizes an LM built from WORK's checkpoint; --lm-from copies one")
    if not 0.0 <= args.vocoder_lm_share <= 1.0:
        parser.error(f"--vocoder-lm-share must be within 0-1, got {args.vocoder_lm_share}")
    if not 0.0 <= args.vocoder_phase_weight <= 100.0:
        parser.error(
            f"--vocoder-phase-weight must be within 0-100, got {args.vocoder_phase_weight:g}"
        )
    if args.vocoder_learning_rate is not None and not 0.0 < args.vocoder_learning_rate <= 1e-2:
        parser.error(
            f"--vocoder-learning-rate must be within (0, 0.01], got {args.vocoder_learning_rate}"
        )
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    if args.vocoder_steps is not None and args.vocoder_steps < 1:
        parser.error(f"--vocoder-steps must be at least 1, got {args.vocoder_steps}")
    args.work.mkdir(parents=True, exist_ok=True)
    if stages != ["data"]:
        import torch

        # Training shares the machine: one thread (the vocoder's measured speed is per thread).
        torch.set_num_threads(1 if "vocoder" in stages else args.threads)
    handlers = {
        "data": stage_data,
        "train": stage_train,
        "vocoder": stage_vocoder,
        "export": stage_export,
        "eval": stage_eval,
    }
    for stage in stages:
        start = time.perf_counter()
        handlers[stage](args.work, args)
        print(f"stage {stage} done in {time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()

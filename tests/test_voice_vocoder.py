"""The default voice's vocoder (issue 17): the neural vocoder's ONNX graph computes what its torch
model does, the recipe's streaming window is chosen by measurement, a bundle can be rebuilt
around a new vocoder with its LM untouched, and a neural-vocoder bundle streams within 30 dB
of its one-shot output."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import soundfile

# torch comes with the test extra ([export]): these tests always run.
import torch

import onnx_tts
from export.voice import bundle as voice_bundle
from export.voice import codec as voice_codec
from export.voice.evaluate import (
    STREAM_SNR_TARGET_DB,
    choose_streaming,
    snr_db,
    streamed_vs_one_shot_snr,
)
from export.voice.vocoder import (
    NeuralVocoder,
    VocoderNetConfig,
    bundle_mel_stats,
    standardised_mel,
    vocoder_losses,
)
from onnx_tts.bundle import VOICE_MODEL_DIR

DATA = Path(__file__).resolve().parent / "data"
TINY = VocoderNetConfig(hidden=32, intermediate=64, blocks=2, n_fft=256, hop=80, n_mels=16)


def _run(model: object, mel: np.ndarray) -> np.ndarray:
    graph = voice_bundle.build_neural_vocoder_graph(model)
    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(["waveform"], {"mel": mel.astype(np.float32)})[0]


def test_neural_vocoder_graph_matches_torch() -> None:
    torch.manual_seed(0)
    model = NeuralVocoder(TINY).eval()
    with torch.no_grad():  # make every block matter (layer scale starts small)
        for block in model.blocks:
            block.gamma.normal_()
    mel = np.random.default_rng(0).standard_normal((2, 23, TINY.n_mels)).astype(np.float32)
    waveform = _run(model, mel)
    with torch.no_grad():
        expected = model(torch.from_numpy(mel)).numpy()
    assert waveform.shape == (2, 23 * TINY.hop) == expected.shape
    assert np.abs(waveform - expected).max() <= 1e-4 * max(1.0, np.abs(expected).max())


def test_neural_vocoder_learns_a_tone_from_its_mel() -> None:
    """A few steps of the recipe's losses on one clip move the output toward it."""
    torch.manual_seed(0)
    cfg = VocoderNetConfig(hidden=32, intermediate=64, blocks=2)
    model = NeuralVocoder(cfg)
    t = np.arange(40 * cfg.hop) / 16000
    audio = (0.3 * np.sin(2 * np.pi * 220 * t) * np.hanning(len(t))).astype(np.float32)
    stats = {"mean": [0.0] * cfg.n_mels, "std": [1.0] * cfg.n_mels}
    mel = torch.from_numpy(standardised_mel(audio, stats))[None]
    target = torch.from_numpy(audio)[None]
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    first = None
    for _ in range(40):
        losses = vocoder_losses(model(mel), target)
        first = first if first is not None else losses["loss"].item()
        optimizer.zero_grad()
        losses["loss"].backward()
        optimizer.step()
    assert losses["loss"].item() < 0.7 * first


def test_vocoder_training_by_steps_repeats_exactly_and_resumes(tmp_path: Path) -> None:
    """`--vocoder-steps`: two runs to the same step count give the same weights (the schedule
    follows steps, not the clock), and a later run continues to a higher count."""
    from export.voice.vocoder import VocoderTrainConfig, train_vocoder

    cfg = VocoderNetConfig(hidden=32, intermediate=64, blocks=2)
    train_cfg = VocoderTrainConfig(batch=2, frames=16, warmup_steps=2)
    saved = {}
    for run in ("first", "again"):
        work = tmp_path / run
        _write_training_shard(work)
        (work / "mel_stats.json").write_text(json.dumps(bundle_mel_stats(VOICE_MODEL_DIR)))
        train_vocoder(work, cfg, 10.0, 0, None, train_cfg, max_steps=3)
        saved[run] = torch.load(work / "vocoder" / "checkpoint.pt", weights_only=False)
    assert saved["first"]["step"] == saved["again"]["step"] == 3
    for name, value in saved["first"]["model"].items():
        assert torch.equal(value, saved["again"]["model"][name]), name
    train_vocoder(tmp_path / "first", cfg, 10.0, 0, None, train_cfg, max_steps=5)
    resumed = torch.load(tmp_path / "first" / "vocoder" / "checkpoint.pt", weights_only=False)
    assert resumed["step"] == 5
    assert any(not torch.equal(v, resumed["model"][k]) for k, v in saved["first"]["model"].items())


def test_choose_streaming_finds_the_vocoders_reach() -> None:
    """A vocoder whose frame depends on `reach` frames either side (a moving average, zero
    padded) streams exactly once the hold-back covers the reach, not before."""
    hop, reach = 40, 5

    def decode(mel: np.ndarray) -> np.ndarray:
        padded = np.pad(mel[:, 0], reach)
        kernel = np.arange(1, 2 * reach + 2, dtype=np.float64)  # not symmetric: order matters
        smoothed = np.convolve(padded, kernel, mode="valid")
        return np.repeat(smoothed, hop).astype(np.float32)

    mels = [np.random.default_rng(k).standard_normal((90, 3)) for k in range(3)]
    options, sweep = choose_streaming(decode, mels, hop, margin_db=0.0)
    assert options["holdback_frames"] == reach
    assert all(s["min_snr_db"] < STREAM_SNR_TARGET_DB for s in sweep[:-1])
    assert snr_db(decode(mels[0]), decode(mels[0])) == float("inf")


def test_rebundle_keeps_the_lm_and_swaps_the_vocoder(tmp_path: Path) -> None:
    stats = bundle_mel_stats(VOICE_MODEL_DIR)
    parts = voice_bundle.griffin_lim_parts(stats, voice_bundle.VocoderConfig(iterations=2))
    voice_bundle.rebundle_with_vocoder(tmp_path, VOICE_MODEL_DIR, parts)
    for name in ("encoder.onnx", "embed.onnx", "lm.onnx"):
        assert (tmp_path / name).read_bytes() == (VOICE_MODEL_DIR / name).read_bytes()
    manifest = json.loads((tmp_path / "bundle.json").read_text())
    assert manifest["vocoder"]["griffin_lim_iterations"] == 2
    assert manifest["vocoder"]["kind"] == "griffin-lim"
    engine = onnx_tts.load(str(tmp_path), cache_dir=None)
    audio = engine.synthesize("A short test.").samples
    assert len(audio) > 0 and np.isfinite(audio).all()


def test_griffin_lim_from_the_neural_phase_matches_torch(tmp_path: Path) -> None:
    """The neural-phase Griffin-Lim graph computes the torch reference (mel_to_audio started
    from the phase of the network's own audio), the start changes the audio, and a bundle
    built around it speaks."""
    torch.manual_seed(0)
    model = NeuralVocoder(VocoderNetConfig(hidden=32, intermediate=64, blocks=2)).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.gamma.normal_()
    stats = bundle_mel_stats(VOICE_MODEL_DIR)
    mean, std = np.array(stats["mean"], np.float32), np.array(stats["std"], np.float32)
    mel = standardised_mel(_held_out_speech()[0][:16000], stats)
    settings = voice_bundle.VocoderConfig(iterations=3, power=0.9)
    waves = {}
    for start, phase_model in (("hash", None), ("neural", model)):
        parts = voice_bundle.griffin_lim_parts(stats, settings, phase_model)
        session = ort.InferenceSession(parts.graph.SerializeToString())
        (waves[start],) = session.run(None, {"mel": mel[None]})
    with torch.no_grad():
        expected = voice_codec.mel_to_audio(
            torch.from_numpy(mel * std + mean)[None],
            voice_bundle.MEL_CONFIG,
            iterations=3,
            power=0.9,
            starting_audio=model(torch.from_numpy(mel)[None]),
        )
    np.testing.assert_allclose(waves["neural"], expected.numpy(), atol=1e-3)
    assert np.abs(waves["neural"] - waves["hash"]).max() > 1e-2

    parts = voice_bundle.griffin_lim_parts(stats, settings, model)
    assert parts.section["starting_phase"] == "neural convnext2x32-istft1024"
    voice_bundle.rebundle_with_vocoder(tmp_path, VOICE_MODEL_DIR, parts)
    audio = onnx_tts.load(str(tmp_path), cache_dir=None).synthesize("A short test.").samples
    assert len(audio) > 0 and np.isfinite(audio).all()


def test_recipe_exports_neural_phase_griffin_lim_with_a_measured_streaming_window(
    tmp_path: Path,
) -> None:
    """`--stages export --vocoder neural-phase-griffin-lim` builds Griffin-Lim started from the
    work's vocoder checkpoint, measures its streaming window on the work's clips, and the
    bundle then streams within 30 dB of its one-shot output end to end (Griffin-Lim from the
    fixed phase does not: its windows each find another phase)."""
    from export import train_voice
    from export.voice.vocoder import save_checkpoint

    work = tmp_path / "work"
    (work / "vocoder").mkdir(parents=True)
    torch.manual_seed(2)
    model = NeuralVocoder(VocoderNetConfig(hidden=32, intermediate=64, blocks=2))
    optimizer = torch.optim.AdamW(model.parameters())
    state = {"step": 0, "seconds": 0.0, "planned_seconds": 0.0}
    save_checkpoint(work / "vocoder" / "checkpoint.pt", model, optimizer, state)
    _write_training_shard(work)
    out = tmp_path / "bundle"
    vocoder = ["--vocoder", "neural-phase-griffin-lim", "--gl-iterations", "4"]
    paths = ["--work", str(work), "--lm-from", str(VOICE_MODEL_DIR), "--bundle", str(out)]
    train_voice.main([*paths, "--stages", "export", *vocoder])
    manifest = json.loads((out / "bundle.json").read_text())
    assert manifest["vocoder"]["starting_phase"] == "neural convnext2x32-istft1024"
    holdback = manifest["streaming"]["holdback_frames"]
    assert manifest["vocoder"]["lookahead_frames"] == holdback > 2
    engine = onnx_tts.load(str(out), cache_dir=None)
    sentence = "The weather was cold, so we stayed inside and read books."
    one_shot = engine.synthesize(sentence).samples
    streamed = np.concatenate(list(engine.stream(sentence)))
    assert len(streamed) == len(one_shot)
    assert snr_db(one_shot, streamed) >= STREAM_SNR_TARGET_DB

    stats = bundle_mel_stats(out)
    fixed_start = voice_bundle.griffin_lim_parts(stats, voice_bundle.VocoderConfig(iterations=4))
    fixed_start = dataclasses.replace(fixed_start, streaming=manifest["streaming"])
    voice_bundle.rebundle_with_vocoder(out, VOICE_MODEL_DIR, fixed_start)
    engine = onnx_tts.load(str(out), cache_dir=None)
    streamed = np.concatenate(list(engine.stream(sentence)))
    assert snr_db(engine.synthesize(sentence).samples, streamed) < STREAM_SNR_TARGET_DB


@pytest.fixture(scope="module")
def neural_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checked-in voice's LM with a neural vocoder of the recipe's shape (random weights,
    every block active: its whole receptive field matters), streaming window chosen by the
    recipe's own measurement on real speech."""
    torch.manual_seed(1)
    model = NeuralVocoder(VocoderNetConfig()).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.gamma.normal_(0.0, 0.5)
    stats = bundle_mel_stats(VOICE_MODEL_DIR)
    mels = [standardised_mel(audio, stats) for audio in _held_out_speech()]
    graph = voice_bundle.build_neural_vocoder_graph(model)
    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])

    def decode(mel: np.ndarray) -> np.ndarray:
        return session.run(["waveform"], {"mel": mel[None].astype(np.float32)})[0][0]

    streaming, _ = choose_streaming(decode, mels, model.cfg.hop)
    out = tmp_path_factory.mktemp("neural-voice")
    voice_bundle.rebundle_with_vocoder(
        out, VOICE_MODEL_DIR, voice_bundle.neural_vocoder_parts(model, streaming)
    )
    return out


def _write_training_shard(work: Path) -> None:
    """WORK/data/train with one shard: the held-out speech clips as training utterances
    (their audio is all the vocoder stages read)."""
    from export.voice import data

    clips = [
        data.Utterance("x", "joe", "^a$", np.array([0, len(a), 0]), a) for a in _held_out_speech()
    ]
    (work / "data" / "train").mkdir(parents=True)
    data.save_shard(work / "data" / "train" / "shard-00000.npz", clips)


def _held_out_speech() -> list[np.ndarray]:
    clips = []
    for warp in ("0.92", "1.09"):
        audio, rate = soundfile.read(DATA / f"heldout_voice_joe_x{warp}.flac", dtype="float32")
        assert rate == 16000
        clips.append(audio)
    return clips


def test_neural_vocoder_bundle_streams_within_30_db_of_one_shot(neural_bundle: Path) -> None:
    """With the window the recipe measured, streaming through the runtime (onnx_tts.vocoder)
    equals one-shot within 30 dB: on real speech through the vocoder alone, and end to end on
    the model's own speech."""
    manifest = json.loads((neural_bundle / "bundle.json").read_text())
    assert manifest["vocoder"]["kind"] == "neural"
    assert manifest["streaming"]["holdback_frames"] <= manifest["vocoder"]["receptive_field_frames"]
    engine = onnx_tts.load(str(neural_bundle), cache_dir=None)
    stats = bundle_mel_stats(neural_bundle)
    hop = manifest["frames"]["hop_length"]
    for audio in _held_out_speech():
        snr = streamed_vs_one_shot_snr(
            lambda m: engine.model.vocoder.vocode(m, {}),
            standardised_mel(audio, stats),
            manifest["streaming"],
            hop,
        )
        assert snr >= STREAM_SNR_TARGET_DB
    sentence = "The weather was cold, so we stayed inside and read books."
    one_shot = engine.synthesize(sentence).samples
    streamed = np.concatenate(list(engine.stream(sentence)))
    assert len(streamed) == len(one_shot)
    assert snr_db(one_shot, streamed) >= STREAM_SNR_TARGET_DB
    # A window with less look-ahead than measured is audibly worse: the setting is needed.
    shorter = dict(manifest["streaming"], holdback_frames=1, overlap_frames=3)
    shorter["first_chunk_frames"] = max(shorter["first_chunk_frames"], 4)
    worse = streamed_vs_one_shot_snr(
        lambda m: engine.model.vocoder.vocode(m, {}),
        standardised_mel(_held_out_speech()[0], stats),
        shorter,
        hop,
    )
    assert worse < STREAM_SNR_TARGET_DB

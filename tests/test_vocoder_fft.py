"""Issue 28: the voice graphs' STFT and inverse STFT as FFTs (export.voice.fft) compute what
numpy's rfft / irfft do with the same window, hop, centring and normalisation; the FFT-form
vocoder gives the Conv form's audio to float rounding, one window at a time or batched (bit
for bit); and `python -m export.voice.fft_vocoder` rebuilds a bundle's vocoder in the FFT form
from the weights inside it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import soundfile
import torch

import onnx_tts
from export.voice import bundle as voice_bundle
from export.voice.evaluate import STREAM_SNR_TARGET_DB, snr_db
from export.voice.fft import FFTGraph, FFTPlan
from export.voice.fft_vocoder import convert, main, read_bundle_vocoder
from export.voice.vocoder import NeuralVocoder, VocoderNetConfig, standardised_mel
from onnx_tts.bundle import VOICE_MODEL_DIR
from onnx_tts.errors import ModelError
from onnx_tts.tools.graph_builder import FLOAT, GraphBuilder

DATA = Path(__file__).resolve().parent / "data"
# (n_fft, hop): the voice's Griffin-Lim, its neural head, its encoder, a hop that is no
# multiple of the factors, and a non-power-of-two n_fft (9 x 10).
PLANS = [(512, 160), (1024, 320), (512, 320), (64, 24), (90, 25)]


def _window(n_fft: int) -> np.ndarray:
    return 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)  # periodic Hann


def numpy_stft(audio: np.ndarray, n_fft: int, hop: int, frames: int) -> np.ndarray:
    """[B, N] -> complex [B, frames, bins]: frame t centred on sample t * hop, reflect pad."""
    padded = np.pad(audio.astype(np.float64), [(0, 0), (n_fft // 2, n_fft // 2)], mode="reflect")
    cut = np.stack([padded[:, t * hop : t * hop + n_fft] for t in range(frames)], axis=1)
    return np.fft.rfft(cut * _window(n_fft), axis=-1)


def numpy_istft(spectrum: np.ndarray, n_fft: int, hop: int) -> np.ndarray:
    """complex [B, T, bins] -> [B, T * hop]: windowed irfft, overlap-add, divided by the
    overlap-added squared window (floored at 1e-8), centring pad cut."""
    batch, frames, _ = spectrum.shape
    window = _window(n_fft)
    pieces = np.fft.irfft(spectrum, n=n_fft, axis=-1) * window
    length = max((frames - 1) * hop + n_fft, n_fft // 2 + frames * hop)
    out, envelope = np.zeros((batch, length)), np.zeros(length)
    for t in range(frames):
        out[:, t * hop : t * hop + n_fft] += pieces[:, t]
        envelope[t * hop : t * hop + n_fft] += window**2
    out /= np.maximum(envelope, 1e-8)
    return out[:, n_fft // 2 : n_fft // 2 + frames * hop]


def _from_layout(spectrum: np.ndarray, plan: FFTPlan) -> tuple[np.ndarray, np.ndarray]:
    """[B, rows, 2, half_cols, T] -> (complex [B, T, bins], the values past Nyquist)."""
    batch, frames = spectrum.shape[0], spectrum.shape[-1]
    by_bin = spectrum.transpose(0, 4, 2, 3, 1).reshape(batch, frames, 2, -1)  # k = k1 + rows*k2
    values = by_bin[..., 0, :] + 1j * by_bin[..., 1, :]
    return values[..., : plan.bins], values[..., plan.bins :]


def _fft_session(plan: FFTPlan) -> ort.InferenceSession:
    """audio [B, N] -> its STFT; spectrum [B, 2 * bins, T] -> its inverse STFT and the STFT of
    that (the Griffin-Lim loop's path: reflect the inverse's centring pad, frame again)."""
    b = GraphBuilder("fft-test")
    audio = b.add_input("audio", FLOAT, ("batch", "samples"))
    length = b.shape_dims(audio, 1, 2)
    frames = b.node("Div", [length, b.const([plan.hop])])
    forward = FFTGraph(b, plan, frames, b.node("Mul", [frames, b.const([plan.hop])]), "fwd")
    b.identity(forward.stft(forward.pad_audio(audio, length, "pad"), "stft"), "spectrum")
    spec_in = b.add_input("spec_in", FLOAT, ("batch", 2 * plan.bins, "frames"))
    frames_in = b.shape_dims(spec_in, 2, 3)
    inverse = FFTGraph(b, plan, frames_in, b.node("Mul", [frames_in, b.const([plan.hop])]), "inv")
    ola = inverse.istft(inverse.bins_to_spectrum(spec_in, 2, "layout"), "istft")
    b.identity(inverse.waveform(ola, "wave"), "waveform")
    b.identity(inverse.stft(inverse.reflect_edges(ola, "edges"), "again"), "again")
    for name in ("spectrum", "waveform", "again"):
        b.add_output(name, FLOAT, None)
    return ort.InferenceSession(b.build().SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize(("n_fft", "hop"), PLANS)
def test_fft_stft_and_inverse_match_numpy(n_fft: int, hop: int) -> None:
    plan = FFTPlan.choose(n_fft, hop)
    session = _fft_session(plan)
    rng = np.random.default_rng(n_fft + hop)
    # Odd lengths (not a multiple of the hop), batch 1 and 3, a window of a few frames.
    for batch, length in ((1, 16001), (3, 7 * hop + 3), (2, 2 * hop + 1)):
        audio = rng.standard_normal((batch, length)).astype(np.float32)
        frames = length // hop
        spec_in = rng.standard_normal((batch, 2 * plan.bins, frames)).astype(np.float32)
        spectrum, waveform, again = session.run(None, {"audio": audio, "spec_in": spec_in})

        got, past_nyquist = _from_layout(spectrum, plan)
        expected = numpy_stft(audio, n_fft, hop, frames)
        assert np.abs(got - expected).max() <= 2e-6 * np.abs(expected).max()
        assert not past_nyquist.any()

        complex_in = (spec_in[:, : plan.bins] + 1j * spec_in[:, plan.bins :]).transpose(0, 2, 1)
        expected_wave = numpy_istft(complex_in, n_fft, hop)
        assert waveform.shape == expected_wave.shape == (batch, frames * hop)
        assert np.abs(waveform - expected_wave).max() <= 2e-6 * np.abs(expected_wave).max()

        got_again, _ = _from_layout(again, plan)
        expected_again = numpy_stft(expected_wave, n_fft, hop, frames)
        assert np.abs(got_again - expected_again).max() <= 2e-6 * np.abs(expected_again).max()


def test_plan_rejects_what_it_cannot_factor() -> None:
    for n_fft, hop, cols in ((512, 0, 32), (512, 600, 32), (512, 160, 24), (511, 160, 7)):
        with pytest.raises(ValueError):
            FFTPlan(n_fft, hop, cols)
    with pytest.raises(ValueError):
        FFTPlan.choose(2, 1)
    assert FFTPlan.choose(512, 160).rows * FFTPlan.choose(512, 160).cols == 512


def _held_out_mel(stats: dict, seconds: float) -> np.ndarray:
    audio, rate = soundfile.read(DATA / "heldout_voice_joe_x1.09.flac", dtype="float32")
    assert rate == 16000
    return standardised_mel(audio[: int(seconds * rate)], stats)[None]


def test_fft_form_gives_the_conv_forms_audio() -> None:
    """Griffin-Lim from the fixed phase and from a network's phase, and the neural vocoder
    alone: the FFT form's audio is the Conv form's to float rounding (> 60 dB)."""
    torch.manual_seed(0)
    network = NeuralVocoder(VocoderNetConfig(hidden=32, intermediate=64, blocks=2)).eval()
    with torch.no_grad():
        for block in network.blocks:
            block.gamma.normal_()
    stats = {"mean": [-4.0] * 80, "std": [2.0] * 80}
    mel = _held_out_mel(stats, 1.2)
    settings = voice_bundle.VocoderConfig(iterations=4, power=0.9)
    builds = {
        "griffin-lim": lambda dft: voice_bundle.build_vocoder_graph(
            voice_bundle.MEL_CONFIG, stats, settings, None, dft
        ),
        "neural-phase": lambda dft: voice_bundle.build_vocoder_graph(
            voice_bundle.MEL_CONFIG, stats, settings, network, dft
        ),
        "neural": lambda dft: voice_bundle.build_neural_vocoder_graph(network, dft),
    }
    for name, build in builds.items():
        audio = {}
        for dft in voice_bundle.DFT_FORMS:
            session = ort.InferenceSession(build(dft).SerializeToString())
            (audio[dft],) = session.run(["waveform"], {"mel": mel})
        assert audio["fft"].shape == audio["conv"].shape == (1, mel.shape[1] * 320), name
        assert snr_db(audio["conv"], audio["fft"]) > 60, name
    with pytest.raises(ValueError, match="dft must be one of"):
        voice_bundle.build_neural_vocoder_graph(network, "dft-op")


def test_fft_encoder_gives_the_conv_encoders_embedding() -> None:
    stats = {"mean": [-4.0] * 80, "std": [2.0] * 80}
    audio, _ = soundfile.read(DATA / "heldout_voice_joe_x0.92.flac", dtype="float32")
    embeddings = {}
    for dft in voice_bundle.DFT_FORMS:
        graph = voice_bundle.build_encoder_graph(voice_bundle.MEL_CONFIG, stats, dft)
        session = ort.InferenceSession(graph.SerializeToString())
        (embeddings[dft],) = session.run(None, {"audio": np.stack([audio, audio[::-1]])})
    assert np.abs(embeddings["fft"] - embeddings["conv"]).max() < 1e-4


def test_checked_in_vocoder_is_fft_and_batches_bit_for_bit() -> None:
    """B windows of one length in one call give each window's own bits (the Conv form's
    Resize did not), and the rebuilt Conv form of its weights is the pre-issue-28 file."""
    source = read_bundle_vocoder(VOICE_MODEL_DIR)
    assert source.dft == "fft" and source.network is not None
    session = ort.InferenceSession(str(VOICE_MODEL_DIR / "vocoder.onnx"))
    mel = _held_out_mel(source.stats, 2.0)[0]
    windows = np.stack([mel[:40], mel[30:70], mel[-40:]])
    alone = [session.run(["waveform"], {"mel": w[None]})[0][0] for w in windows]
    together = session.run(["waveform"], {"mel": windows})[0]
    for row, single in zip(together, alone, strict=True):
        assert np.array_equal(row, single)


def _conv_bundle(tmp_path: Path) -> Path:
    """The checked-in voice with its vocoder in the Conv form (as before issue 28)."""
    out = tmp_path / "conv"
    parts = read_bundle_vocoder(VOICE_MODEL_DIR).build("conv")
    voice_bundle.rebundle_with_vocoder(out, VOICE_MODEL_DIR, parts)
    return out


def test_conversion_rebuilds_the_checked_in_vocoder_from_a_conv_bundle(tmp_path: Path) -> None:
    conv = _conv_bundle(tmp_path)
    assert json.loads((conv / "bundle.json").read_text())["vocoder"]["dft"] == "conv"
    assert (conv / "vocoder.onnx").stat().st_size > (
        VOICE_MODEL_DIR / "vocoder.onnx"
    ).stat().st_size
    result = convert(conv, sentences=1)
    assert result["converted"] and result["check"]["snr_db"] > 60
    # The same bytes and manifest as the checked-in (converted) bundle.
    for name in ("vocoder.onnx", "encoder.onnx", "embed.onnx", "lm.onnx", "bundle.json"):
        assert (conv / name).read_bytes() == (VOICE_MODEL_DIR / name).read_bytes(), name
    # A bundle already in the FFT form is left alone.
    assert convert(conv, sentences=0) == {
        "converted": False,
        "reason": "the vocoder is already in the FFT form",
    }


def test_converted_bundle_loads_and_streams_as_it_speaks_one_shot(tmp_path: Path) -> None:
    out = tmp_path / "fft"
    assert main([str(_conv_bundle(tmp_path)), "--out", str(out), "--check-sentences", "0"]) == 0
    engine = onnx_tts.load(str(out), cache_dir=None)
    sentence = "The weather was cold, so we stayed inside and read books."
    one_shot = engine.synthesize(sentence).samples
    streamed = np.concatenate(list(engine.stream(sentence)))
    assert len(streamed) == len(one_shot)
    assert snr_db(one_shot, streamed) >= STREAM_SNR_TARGET_DB


def test_conversion_refuses_what_it_cannot_rebuild_exactly(tmp_path: Path, capsys) -> None:
    bundle = tmp_path / "edited"
    shutil.copytree(_conv_bundle(tmp_path), bundle)
    manifest_path = bundle / "bundle.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["vocoder"]["griffin_lim_iterations"] = 15  # not what the graph was built with
    manifest_path.write_text(json.dumps(manifest))
    before = (bundle / "vocoder.onnx").read_bytes()
    with pytest.raises(ModelError, match="does not give the same graph"):
        convert(bundle, sentences=0)
    assert main([str(bundle), "--check-sentences", "0"]) == 2
    assert "does not give the same graph" in capsys.readouterr().err
    assert (bundle / "vocoder.onnx").read_bytes() == before
    assert main([str(tmp_path / "nowhere")]) == 2
    assert "has no bundle.json" in capsys.readouterr().err


def test_conversion_of_a_neural_vocoder_bundle(tmp_path: Path) -> None:
    """A bundle whose whole vocoder is the network: its weights come back from the Conv-form
    graph and the FFT form built from them is the one built from the network itself."""
    torch.manual_seed(0)
    network = NeuralVocoder(VocoderNetConfig(hidden=32, intermediate=64, blocks=2)).eval()
    streaming = json.loads((VOICE_MODEL_DIR / "bundle.json").read_text())["streaming"]
    bundle = tmp_path / "neural"
    parts = voice_bundle.neural_vocoder_parts(network, streaming, "conv")
    voice_bundle.rebundle_with_vocoder(bundle, VOICE_MODEL_DIR, parts)
    result = convert(bundle, sentences=1)
    assert result["converted"] and result["check"]["snr_db"] > 60
    expected = voice_bundle.build_neural_vocoder_graph(network, "fft")
    assert (bundle / "vocoder.onnx").read_bytes() == expected.SerializeToString(deterministic=True)
    manifest = json.loads((bundle / "bundle.json").read_text())
    assert manifest["vocoder"]["kind"] == "neural" and manifest["vocoder"]["dft"] == "fft"
    assert convert(bundle, sentences=0)["converted"] is False


@pytest.mark.parametrize("factor", [2, 3, 4])
def test_linear_upsampling_is_resize_without_its_batch_dependence(factor: int) -> None:
    """The FFT graphs' upsampling of the magnitude computes ORT's Resize (linear, half_pixel,
    edges held), for one frame and many."""
    from export.voice.bundle import _upsample_linear

    b = GraphBuilder("upsample")
    x = b.add_input("x", FLOAT, ("batch", "bins", "frames"))
    b.identity(_upsample_linear(b, x, factor, "up"), "ours")
    scales = b.const([1.0, 1.0, float(factor)], np.float32)
    b.node(
        "Resize",
        [x, "", scales],
        mode="linear",
        coordinate_transformation_mode="half_pixel",
        output_names=["resize"],
    )
    b.add_output("ours", FLOAT, None)
    b.add_output("resize", FLOAT, None)
    session = ort.InferenceSession(b.build().SerializeToString())
    rng = np.random.default_rng(factor)
    for frames in (1, 2, 9):
        values = rng.standard_normal((3, 5, frames)).astype(np.float32)
        ours, resize = session.run(None, {"x": values})
        assert ours.shape == resize.shape == (3, 5, factor * frames)
        np.testing.assert_allclose(ours, resize, rtol=1e-6, atol=1e-6)
        alone = session.run(["ours"], {"x": values[1:2]})[0]
        assert np.array_equal(alone[0], ours[1])

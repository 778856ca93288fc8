"""ONNX graphs and bundle of the trained voice (family "phoneme-mel", see
onnx_tts/families/phoneme_mel/).

* encoder.onnx: audio -> STFT -> log-mel -> standardise -> speaker embedding = per-band mean
  and std (exactly :func:`export.voice.train.speaker_stats`).
* embed.onnx: (previous frames, phoneme window, progress, speaker) -> LM input vectors.
* lm.onnx: the shared GQA decoder builder (export.onnx_graphs), trained weights; one output `logits`
  holding the step's standardised mel frames followed by the advance logits.
* vocoder.onnx: standardised log-mel -> linear magnitude -> linear interpolation to a finer hop
  -> unrolled Griffin-Lim (STFT, inverse STFT) from a fixed deterministic phase or the neural
  vocoder's, so the graph has no random op.

Every STFT and inverse STFT is an FFT built from MatMuls (export.voice.fft, `dft="fft"`, the
default since issue 28) or, as the bundles before it shipped, a strided Conv / ConvTranspose
with the windowed DFT matrix (`dft="conv"`, `dft_kernels`); both compute the same thing to
float rounding.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx

from export import onnx_graphs
from export.build_codec_lm import _bias, _linear_weight, _np, lm_weights
from export.onnx_graphs import DecoderLMSpec, build_gqa_lm
from export.voice.codec import MEL_CONFIG, MelConfig, mel_filterbank, mel_inverse
from export.voice.fft import FFTGraph, FFTPlan, spectrum_power
from onnx_tts.tools.graph_builder import (
    FLOAT,
    INT64,
    GraphBuilder,
    layer_norm,
    linear,
    reduce_op,
)

# How the graphs compute their DFTs: "fft" (export.voice.fft, the default) or "conv" (a
# Conv / ConvTranspose with the full DFT matrix, `dft_kernels`: the form the bundles before
# issue 28 shipped, kept as the reference the FFT form is measured against).
DFT_FORMS = ("fft", "conv")

GRAPH_FILES = {
    "encoder": "encoder.onnx",
    "embed": "embed.onnx",
    "lm": "lm.onnx",
    "vocoder": "vocoder.onnx",
}


@dataclass(frozen=True)
class VocoderConfig:
    upsample: int = 2
    iterations: int = 16
    momentum: float = 0.99
    # Linear magnitude raised to this power before phase reconstruction: > 1 sharpens (as
    # Tacotron did), < 1 flattens; the default voice measured best at 0.9 (README_voice).
    power: float = 1.0


def dft_kernels(n_fft: int) -> tuple[np.ndarray, np.ndarray]:
    """(analysis [2*bins, 1, n_fft], synthesis [2*bins, 1, n_fft]) with the Hann window folded
    in. Rows are real parts then imaginary parts. Synthesis is the inverse real DFT (DC and
    Nyquist counted once, the other bins twice)."""
    bins = n_fft // 2 + 1
    n = np.arange(n_fft)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * n / n_fft)  # periodic Hann, as torch's default
    angle = 2 * np.pi * np.outer(np.arange(bins), n) / n_fft
    analysis = np.concatenate([np.cos(angle), -np.sin(angle)]) * window
    weight = np.full(bins, 2.0)
    weight[0] = weight[-1] = 1.0
    synthesis = (
        np.concatenate([np.cos(angle) * weight[:, None], -np.sin(angle) * weight[:, None]])
        * window
        / n_fft
    )
    return (
        analysis[:, None, :].astype(np.float32),
        synthesis[:, None, :].astype(np.float32),
    )


def inverse_stft(
    b: GraphBuilder, synthesis: np.ndarray, hop: int, frames: str, samples: str
) -> Callable[[str, str, str], str]:
    """Adds the inverse STFT's fixed parts to `b` (synthesis kernel from `dft_kernels`, the
    overlap-added squared-window envelope for `frames` [1] frames) and returns
    istft(re, im, tag): (re, im) [B,bins,frames] -> audio [B,1,samples], frame t centred on
    sample t * hop (a ConvTranspose1d of the windowed inverse DFT, normalised, trimmed)."""
    n_fft = synthesis.shape[-1]
    half = n_fft // 2
    synthesis_k = b.initializer("istft.kernel", synthesis)
    # Row 0 of the synthesis kernel is the window * 1/n_fft (DC, cos 0): the window itself.
    window = synthesis[0, 0] * n_fft
    window_sq = (window**2).astype(np.float32)
    ones = b.node(
        "ConstantOfShape",
        [b.node("Concat", [b.const([1, 1]), frames], axis=0, name="envelope/Shape")],
        value=onnx.helper.make_tensor("one", FLOAT, [1], [1.0]),
        name="envelope/Ones",
    )
    envelope = b.node(
        "ConvTranspose",
        [ones, b.initializer("istft.window_sq", window_sq[None, None, :])],
        strides=[hop],
        name="envelope/OLA",
    )
    envelope = b.node("Max", [envelope, b.const(1e-8, np.float32)], name="envelope/Floor")
    end = b.node("Add", [samples, b.const([half])], name="istft/End")

    def istft(re: str, im: str, tag: str) -> str:
        spec = b.node("Concat", [re, im], axis=1, name=f"{tag}/Spec")
        ola = b.node("ConvTranspose", [spec, synthesis_k], strides=[hop], name=f"{tag}/OLA")
        ola = b.node("Div", [ola, envelope], name=f"{tag}/Normalise")
        return b.node("Slice", [ola, b.const([half]), end, b.const([2])], name=f"{tag}/Trim")

    return istft


def _stft(b: GraphBuilder, audio3: str, kernel: str, hop: int, n_fft: int, frames: str, name: str):
    """audio [B,1,N] -> (re, im) [B,bins,frames] of the centred (reflect-padded) STFT."""
    half = n_fft // 2
    padded = b.node(
        "Pad", [audio3, b.const([0, 0, half, 0, 0, half])], mode="reflect", name=f"{name}/Pad"
    )
    spec = b.node("Conv", [padded, kernel], strides=[hop], name=f"{name}/Conv")
    bins = n_fft // 2 + 1
    re = b.node(
        "Slice",
        [
            spec,
            b.const([0, 0]),
            b.node("Concat", [b.const([bins]), frames], axis=0),
            b.const([1, 2]),
        ],
        name=f"{name}/Re",
    )
    im_end = b.node("Concat", [b.const([2 * bins]), frames], axis=0, name=f"{name}/ImEnd")
    im = b.node("Slice", [spec, b.const([bins, 0]), im_end, b.const([1, 2])], name=f"{name}/Im")
    return re, im


def _standardised_log_mel(
    b: GraphBuilder, audio: str, cfg: MelConfig, stats: dict, dft: str = "fft"
) -> str:
    """audio [B,N] -> standardised log-mel [B, N // hop, n_mels] (as train.log_mel_frames)."""
    frames = b.node(
        "Div", [b.shape_dims(audio, 1, 2, "frames/N"), b.const([cfg.hop_length])], name="frames/F"
    )
    bank = mel_filterbank(cfg).T.copy()  # [bins, n_mels]
    if dft == "fft":
        plan = FFTPlan.choose(cfg.n_fft, cfg.hop_length)
        length = b.shape_dims(audio, 1, 2, "audio/N")
        fft = FFTGraph(b, plan, frames, length, "stft")
        spec = fft.stft(fft.pad_audio(audio, length, "audio"), "stft")
        power = spectrum_power(b, spec, "stft/Power", keepdims=False)
        magnitude = b.node("Sqrt", [power], name="stft/Magnitude")  # [B,rows,half_cols,F]
        magnitude = b.node(
            "Reshape", [magnitude, b.const([0, plan.rows * plan.half_cols, -1])], name="stft/Bins"
        )
        bank = plan.in_spectrum_order(bank, axis=0)
    else:
        audio3 = b.node("Unsqueeze", [audio, b.const([1])], name="audio/Channel")
        analysis, _ = dft_kernels(cfg.n_fft)
        re, im = _stft(
            b,
            audio3,
            b.initializer("stft.kernel", analysis),
            cfg.hop_length,
            cfg.n_fft,
            frames,
            "stft",
        )
        power = b.node("Add", [b.node("Mul", [re, re]), b.node("Mul", [im, im])], name="stft/Power")
        magnitude = b.node("Sqrt", [power], name="stft/Magnitude")  # [B,bins,F]
    mag_t = b.node("Transpose", [magnitude], perm=[0, 2, 1], name="stft/T")
    mel = b.node("MatMul", [mag_t, b.initializer("mel.bank_t", bank)])
    mel = b.node("Max", [mel, b.const(cfg.log_floor, np.float32)], name="mel/Floor")
    logmel = b.node("Log", [mel], name="mel/Log")
    return b.node(
        "Div",
        [
            b.node("Sub", [logmel, b.initializer("mel.mean", _f32(stats["mean"]))]),
            b.initializer("mel.std", _f32(stats["std"])),
        ],
        name="mel/Standardise",
    )


def _check_dft(dft: str) -> None:
    if dft not in DFT_FORMS:
        raise ValueError(f"dft must be one of {', '.join(DFT_FORMS)}, not {dft!r}")


def _f32(values: object) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


def build_encoder_graph(cfg: MelConfig, stats: dict, dft: str = "fft") -> onnx.ModelProto:
    _check_dft(dft)
    b = GraphBuilder("encoder")
    audio = b.add_input("audio", FLOAT, ("batch", "samples"))
    normed = _standardised_log_mel(b, audio, cfg, stats, dft)
    mean = reduce_op(b, "ReduceMean", normed, [1], keepdims=False, name="speaker/Mean")
    mean_sq = reduce_op(
        b, "ReduceMean", b.node("Mul", [normed, normed]), [1], keepdims=False, name="speaker/Sq"
    )
    variance = b.node(
        "Max", [b.node("Sub", [mean_sq, b.node("Mul", [mean, mean])]), b.const(0.0, np.float32)]
    )
    std = b.node("Sqrt", [variance], name="speaker/Std")
    b.node("Concat", [mean, std], axis=-1, output_names=["speaker_embedding"], name="speaker/Cat")
    b.add_output("speaker_embedding", FLOAT, ("batch", 2 * cfg.n_mels))
    stft = "FFT STFT" if dft == "fft" else "Conv STFT"
    return b.build(f"voice encoder: {stft} -> log-mel -> standardise -> per-band mean and std")


def build_embed_graph(model: object) -> onnx.ModelProto:
    """model: export.voice.train.VoiceModel."""
    emb = model.embed  # type: ignore[attr-defined]
    cfg = model.cfg  # type: ignore[attr-defined]
    b = GraphBuilder("embed")
    previous = b.add_input("previous_frames", FLOAT, ("batch", "steps", cfg.frame_width))
    window = b.add_input("phonemes", INT64, ("batch", "steps", len(cfg.context)))
    progress = b.add_input("progress", INT64, ("batch", "steps"))
    speaker = b.add_input("speaker_embedding", FLOAT, ("batch", cfg.speaker_dim))
    x = b.node(
        "Relu", [linear(b, previous, _linear_weight(emb.prenet1), _bias(emb.prenet1), "prenet1")]
    )
    x = b.node("Relu", [linear(b, x, _linear_weight(emb.prenet2), _bias(emb.prenet2), "prenet2")])
    for k in range(len(cfg.context)):
        ids = b.node("Gather", [window, b.const(k)], axis=2, name=f"phoneme.{k}/Ids")
        rows = b.node(
            "Gather", [b.initializer(f"phoneme.{k}.table", _np(emb.phonemes[k])), ids], axis=0
        )
        x = b.node("Add", [x, rows], name=f"phoneme.{k}/Add")
    clipped = b.node("Min", [progress, b.const(cfg.max_progress)], name="progress/Clip")
    x = b.node(
        "Add",
        [
            x,
            b.node("Gather", [b.initializer("progress.table", _np(emb.progress)), clipped], axis=0),
        ],
    )
    spk = linear(b, speaker, _linear_weight(emb.speaker), _bias(emb.speaker), "speaker")
    spk = b.node("Unsqueeze", [spk, b.const([1])], name="speaker/Unsqueeze")
    b.node("Add", [x, spk], output_names=["inputs_embeds"], name="embeds/Add")
    b.add_output("inputs_embeds", FLOAT, ("batch", "steps", cfg.hidden_size))
    return b.build(
        "voice embeddings: prenet(previous frames) + phoneme window + progress + speaker"
    )


def lm_spec(cfg: object) -> DecoderLMSpec:
    """The codec-lm decoder's spec with one flat head: mel frames + advance logits."""
    decoder = cfg.decoder_config()  # type: ignore[attr-defined]
    return replace(decoder.lm_spec(), vocab_size=cfg.output_width, output_heads=None)  # type: ignore[attr-defined]


def build_vocoder_graph(
    cfg: MelConfig,
    stats: dict,
    vocoder: VocoderConfig,
    phase_model: object | None = None,
    dft: str = "fft",
) -> onnx.ModelProto:
    """Griffin-Lim on the mel's pseudo-inverse magnitude. Its starting phase is a fixed hash,
    or with `phase_model` (export.voice.vocoder.NeuralVocoder) the phase of that network's
    audio for the same mel: measured on the LM's own mels, a better start than the hash (see
    benchmarks/README_voice.md). `dft`: one of DFT_FORMS."""
    _check_dft(dft)
    hop = cfg.hop_length // vocoder.upsample
    plan = FFTPlan.choose(cfg.n_fft, hop) if dft == "fft" else None
    bins = cfg.bins
    b = GraphBuilder("vocoder")
    mel = b.add_input("mel", FLOAT, ("batch", "frames", cfg.n_mels))
    logmel = b.node(
        "Add",
        [
            b.node("Mul", [mel, b.initializer("mel.std", _f32(stats["std"]))]),
            b.initializer("mel.mean", _f32(stats["mean"])),
        ],
        name="mel/Denormalise",
    )
    inverse = mel_inverse(cfg)
    if plan is not None:  # columns in the FFT spectrum's bin order: no reordering in the graph
        inverse = plan.in_spectrum_order(inverse, axis=1)
    linear = b.node("MatMul", [b.node("Exp", [logmel]), b.initializer("mel.inverse", inverse)])
    linear = b.node("Relu", [linear], name="linear/Clamp")  # [B,F,bins]
    if vocoder.power != 1.0:
        linear = b.node("Pow", [linear, b.const(vocoder.power, np.float32)], name="linear/Sharpen")
    magnitude = b.node("Transpose", [linear], perm=[0, 2, 1], name="linear/T")  # [B,bins,F]
    if vocoder.upsample > 1 and plan is not None:
        magnitude = _upsample_linear(b, magnitude, vocoder.upsample, "linear/Upsample")
    elif vocoder.upsample > 1:
        magnitude = b.node(
            "Resize",
            [magnitude, "", b.const([1.0, 1.0, float(vocoder.upsample)], np.float32)],
            mode="linear",
            coordinate_transformation_mode="half_pixel",
            name="linear/Upsample",
        )
    frames = b.node(
        "Mul", [b.shape_dims(mel, 1, 2, "F"), b.const([vocoder.upsample])], name="frames/Fine"
    )
    samples = b.node("Mul", [frames, b.const([hop])], name="frames/Samples")
    start = "a fixed phase" if phase_model is None else "the neural vocoder's phase"
    summary = (
        f"voice vocoder: log-mel -> linear magnitude -> Griffin-Lim x{vocoder.iterations} "
        f"at hop {hop}, starting from {start}"
    )
    if plan is not None:
        fft = FFTGraph(b, plan, frames, samples, "stft")
        magnitude = b.node(
            "Reshape",
            [magnitude, b.const([0, plan.rows, 1, plan.half_cols, -1])],
            name="linear/Spectrum",
        )  # [B, rows, 1, half_cols, T]
        if phase_model is None:
            cos_p, sin_p = _hash_phase(b, bins, frames)
            both = b.node("Unsqueeze", [b.node("Concat", [cos_p, sin_p], axis=0), b.const([0])])
            unit = fft.bins_to_spectrum(both, 2, "phase")
        else:
            unit = _fft_network_phase(b, phase_model, mel, fft)
        waveform = _fft_griffin_lim(b, fft, magnitude, unit, vocoder)
        b.identity(waveform, "waveform")
        b.add_output("waveform", FLOAT, ("batch", "samples"))
        return b.build(f"{summary} (FFT STFT, {plan.rows} x {plan.cols})")
    analysis, synthesis = dft_kernels(cfg.n_fft)
    analysis_k = b.initializer("stft.kernel", analysis)
    istft = inverse_stft(b, synthesis, hop, frames, samples)

    if phase_model is None:
        cos_p, sin_p = _hash_phase(b, bins, frames)
    else:
        cos_p, sin_p = _network_phase(b, phase_model, mel, analysis_k, hop, cfg.n_fft, frames)

    re = b.node("Mul", [magnitude, cos_p], name="gl0/Re")
    im = b.node("Mul", [magnitude, sin_p], name="gl0/Im")
    prev_re = prev_im = ""
    alpha = vocoder.momentum / (1 + vocoder.momentum)
    for i in range(vocoder.iterations):
        tag = f"gl{i + 1}"
        audio3 = istft(re, im, f"{tag}/istft")
        new_re, new_im = _stft(b, audio3, analysis_k, hop, cfg.n_fft, frames, f"{tag}/stft")
        acc_re, acc_im = new_re, new_im
        if prev_re:
            acc_re = b.node("Sub", [new_re, b.node("Mul", [prev_re, b.const(alpha, np.float32)])])
            acc_im = b.node("Sub", [new_im, b.node("Mul", [prev_im, b.const(alpha, np.float32)])])
        prev_re, prev_im = new_re, new_im
        norm = b.node(
            "Add",
            [
                b.node(
                    "Sqrt",
                    [
                        b.node(
                            "Add",
                            [b.node("Mul", [acc_re, acc_re]), b.node("Mul", [acc_im, acc_im])],
                        )
                    ],
                ),
                b.const(1e-8, np.float32),
            ],
            name=f"{tag}/Norm",
        )
        scale = b.node("Div", [magnitude, norm], name=f"{tag}/Scale")
        re = b.node("Mul", [acc_re, scale], name=f"{tag}/Re")
        im = b.node("Mul", [acc_im, scale], name=f"{tag}/Im")
    audio3 = istft(re, im, "out/istft")
    b.node("Squeeze", [audio3, b.const([1])], output_names=["waveform"], name="out/Squeeze")
    b.add_output("waveform", FLOAT, ("batch", "samples"))
    return b.build(summary)


def _upsample_linear(b: GraphBuilder, x: str, factor: int, name: str) -> str:
    """x [B, K, F] -> [B, K, factor * F]: what Resize(linear, half_pixel) computes, as
    element-wise ops. (ORT 1.32's Resize rounds differently with the batch size; these ops
    give every row the same bits whatever the batch.)"""
    last = b.node("Slice", [x, b.const([-1]), b.const([np.iinfo(np.int64).max]), b.const([2])])
    first = b.node("Slice", [x, b.const([0]), b.const([1]), b.const([2])])
    body = b.node("Slice", [x, b.const([0]), b.const([-1]), b.const([2])])
    tail = b.node("Slice", [x, b.const([1]), b.const([np.iinfo(np.int64).max]), b.const([2])])
    previous = b.node("Concat", [first, body], axis=2, name=f"{name}/Previous")  # edge held
    following = b.node("Concat", [tail, last], axis=2, name=f"{name}/Next")
    phases = []
    for s in range(factor):
        # Output u * j + s sits at input position j + d, d = (2 s + 1 - u) / (2 u).
        d = (2 * s + 1 - factor) / (2 * factor)
        out = x
        if d:
            near = b.node("Mul", [x, b.const(1 - abs(d), np.float32)], name=f"{name}/Near{s}")
            far = b.node(
                "Mul",
                [previous if d < 0 else following, b.const(abs(d), np.float32)],
                name=f"{name}/Far{s}",
            )
            out = b.node("Add", [near, far], name=f"{name}/Phase{s}")
        phases.append(b.node("Unsqueeze", [out, b.const([3])], name=f"{name}/Axis{s}"))
    stacked = b.node("Concat", phases, axis=3, name=f"{name}/Interleave")
    return b.node("Reshape", [stacked, b.const([0, 0, -1])], name=name)


def _fft_griffin_lim(
    b: GraphBuilder, fft: FFTGraph, magnitude: str, unit: str, vocoder: VocoderConfig
) -> str:
    """Fast Griffin-Lim (the Conv form's, in the FFT spectrum layout): magnitude [B, rows, 1,
    half_cols, T] times the starting phasor `unit` [B, rows, 2, half_cols, T] -> audio [B, S]."""
    spec = b.node("Mul", [magnitude, unit], name="gl0/Spectrum")
    alpha = b.const(vocoder.momentum / (1 + vocoder.momentum), np.float32)
    previous = ""
    for i in range(vocoder.iterations):
        tag = f"gl{i + 1}"
        audio = fft.reflect_edges(fft.istft(spec, f"{tag}/istft"), f"{tag}/pad")
        rebuilt = fft.stft(audio, f"{tag}/stft")
        accelerated = rebuilt
        if previous:
            accelerated = b.node(
                "Sub", [rebuilt, b.node("Mul", [previous, alpha])], name=f"{tag}/Momentum"
            )
        previous = rebuilt
        power = spectrum_power(b, accelerated, f"{tag}/Power")
        norm = b.node(
            "Add", [b.node("Sqrt", [power]), b.const(1e-8, np.float32)], name=f"{tag}/Norm"
        )
        scale = b.node("Div", [magnitude, norm], name=f"{tag}/Scale")
        spec = b.node("Mul", [accelerated, scale], name=f"{tag}/Spectrum")
    return fft.waveform(fft.istft(spec, "out/istft"), "out")


def _hash_phase(b: GraphBuilder, bins: int, frames: str) -> tuple[str, str]:
    """(cos, sin) [bins, frames] of a fixed starting phase: the same integer hash as
    initial_phase(), computed in the graph."""
    f_idx = b.node("Range", [b.const(0), b.const(bins), b.const(1)], name="phase/F")
    t_idx = b.node(
        "Range", [b.const(0), b.node("Squeeze", [frames, b.const([0])]), b.const(1)], name="phase/T"
    )
    f_col = b.node("Unsqueeze", [f_idx, b.const([1])], name="phase/Fcol")
    t_row = b.node("Unsqueeze", [t_idx, b.const([0])], name="phase/Trow")
    hashed = b.node(
        "Add",
        [
            b.node(
                "Add",
                [
                    b.node("Mul", [b.node("Mul", [f_col, f_col]), b.const(7)]),
                    b.node("Mul", [b.node("Mul", [f_col, t_row]), b.const(3)]),
                ],
            ),
            b.node("Mul", [t_row, b.const(13)]),
        ],
        name="phase/Hash",
    )
    phase = b.node(
        "Mul",
        [
            b.node("Cast", [b.node("Mod", [hashed, b.const(31)])], to=FLOAT),
            b.const(2 * np.pi / 31, np.float32),
        ],
        name="phase/Angle",
    )
    return b.node("Cos", [phase]), b.node("Sin", [phase])


def _network_phase(
    b: GraphBuilder, model: object, mel: str, kernel: str, hop: int, n_fft: int, frames: str
) -> tuple[str, str]:
    """(cos, sin) [B,bins,frames] of the neural vocoder's audio's STFT at Griffin-Lim's own
    frames (a silent bin starts at phase 0)."""
    audio3 = _add_neural_vocoder(b, model, mel)
    re, im = _stft(b, audio3, kernel, hop, n_fft, frames, "phase/stft")
    re = b.node("Add", [re, b.const(1e-7, np.float32)], name="phase/Bias")
    norm = b.node(
        "Sqrt",
        [b.node("Add", [b.node("Mul", [re, re]), b.node("Mul", [im, im])])],
        name="phase/Norm",
    )
    return b.node("Div", [re, norm], name="phase/Cos"), b.node("Div", [im, norm], name="phase/Sin")


def _fft_network_phase(b: GraphBuilder, model: object, mel: str, fft: FFTGraph) -> str:
    """The unit phasor [B, rows, 2, half_cols, T] of the neural vocoder's audio's STFT at
    Griffin-Lim's own frames (a silent bin starts at phase 0), as `_network_phase`."""
    audio = _fft_neural_vocoder(b, model, mel)
    spec = fft.stft(fft.pad_audio(audio, fft.samples, "phase/audio"), "phase/stft")
    bias = np.array([1e-7, 0.0], np.float32).reshape(2, 1, 1)  # on the real part only
    spec = b.node("Add", [spec, b.const(bias, np.float32)], name="phase/Bias")
    power = spectrum_power(b, spec, "phase/Power")
    return b.node("Div", [spec, b.node("Sqrt", [power], name="phase/Norm")], name="phase/Unit")


def _gelu(b: GraphBuilder, x: str, name: str) -> str:
    """Exact GELU, x * (1 + erf(x / sqrt 2)) / 2 (torch's default; ORT fuses the pattern)."""
    erf = b.node("Erf", [b.node("Mul", [x, b.const(1 / np.sqrt(2), np.float32)])], name=name)
    return b.node(
        "Mul",
        [
            b.node("Mul", [x, b.const(0.5, np.float32)]),
            b.node("Add", [erf, b.const(1.0, np.float32)]),
        ],
        name=f"{name}/Mul",
    )


def build_neural_vocoder_graph(model: object, dft: str = "fft") -> onnx.ModelProto:
    """model: export.voice.vocoder.NeuralVocoder. mel [B,F,n_mels] (standardised log-mel, as
    the LM emits) -> waveform [B, F * hop]: ConvNeXt over frames, a head predicting log-
    magnitude and phase of one STFT frame per mel frame, and the inverse STFT (the same one
    the Griffin-Lim graph ends with). `dft`: one of DFT_FORMS."""
    _check_dft(dft)
    cfg = model.cfg  # type: ignore[attr-defined]
    b = GraphBuilder("vocoder")
    mel = b.add_input("mel", FLOAT, ("batch", "frames", cfg.n_mels))
    if dft == "fft":
        b.identity(_fft_neural_vocoder(b, model, mel), "waveform")
    else:
        audio3 = _add_neural_vocoder(b, model, mel)
        b.node("Squeeze", [audio3, b.const([1])], output_names=["waveform"], name="out/Squeeze")
    b.add_output("waveform", FLOAT, ("batch", "samples"))
    return b.build(
        f"voice vocoder: log-mel -> ConvNeXt x{cfg.blocks} (hidden {cfg.hidden}) -> log-magnitude "
        f"and phase -> inverse STFT (n_fft {cfg.n_fft}, hop {cfg.hop}, {dft.upper()} form)"
    )


def _add_neural_vocoder(b: GraphBuilder, model: object, mel: str) -> str:
    """Adds the neural vocoder's nodes to `b` (Conv form): mel [B,F,n_mels] -> audio
    [B,1,F*hop]."""
    cfg = model.cfg  # type: ignore[attr-defined]
    frames = b.shape_dims(mel, 1, 2, "F")
    samples = b.node("Mul", [frames, b.const([cfg.hop])], name="frames/Samples")
    x = _convnext_trunk(b, model, mel)
    out = linear(b, x, _linear_weight(model.head), _bias(model.head), "head")  # type: ignore[attr-defined]
    out = b.node("Transpose", [out], perm=[0, 2, 1], name="head/Tback")  # [B,2*bins,F]
    bins = cfg.bins
    log_mag = b.node(
        "Slice", [out, b.const([0]), b.const([bins]), b.const([1])], name="head/LogMag"
    )
    phase = b.node(
        "Slice", [out, b.const([bins]), b.const([2 * bins]), b.const([1])], name="head/Phase"
    )
    magnitude = b.node(
        "Exp",
        [b.node("Min", [log_mag, b.const(cfg.max_log_magnitude, np.float32)])],
        name="head/Mag",
    )
    re = b.node("Mul", [magnitude, b.node("Cos", [phase])], name="head/Re")
    im = b.node("Mul", [magnitude, b.node("Sin", [phase])], name="head/Im")
    _, synthesis = dft_kernels(cfg.n_fft)
    istft = inverse_stft(b, synthesis, cfg.hop, frames, samples)
    return istft(re, im, "out/istft")


def _fft_neural_vocoder(b: GraphBuilder, model: object, mel: str) -> str:
    """Adds the neural vocoder's nodes to `b` (FFT form): mel [B,F,n_mels] -> audio
    [B,F*hop]. The head's output columns are stored in the FFT spectrum's bin order
    (`FFTPlan.in_spectrum_order`), so the head writes the spectrum layout itself."""
    cfg = model.cfg  # type: ignore[attr-defined]
    plan = FFTPlan.choose(cfg.n_fft, cfg.hop)
    frames = b.shape_dims(mel, 1, 2, "F")
    samples = b.node("Mul", [frames, b.const([cfg.hop])], name="frames/Samples")
    x = _convnext_trunk(b, model, mel)
    weight, bias = _linear_weight(model.head), _bias(model.head)  # type: ignore[attr-defined]
    halves = [slice(0, cfg.bins), slice(cfg.bins, 2 * cfg.bins)]  # log-magnitude, phase
    weight = np.concatenate([plan.in_spectrum_order(weight[:, h], axis=1) for h in halves], 1)
    bias = np.concatenate([plan.in_spectrum_order(bias[h], axis=0) for h in halves])
    out = linear(b, x, weight, bias, "head")  # [B, F, 2 * rows * half_cols]
    out = b.node("Transpose", [out], perm=[0, 2, 1], name="head/Tback")
    out = b.node(
        "Reshape", [out, b.const([0, 2, plan.rows, 1, plan.half_cols, -1])], name="head/Layout"
    )
    log_mag, phase = (
        b.node("Squeeze", [half, b.const([1])], name=f"head/{label}")
        for half, label in zip(
            b.node("Split", [out], num_outputs=2, axis=1, name="head/Split"),
            ("LogMag", "Phase"),
            strict=True,
        )
    )
    magnitude = b.node(
        "Exp",
        [b.node("Min", [log_mag, b.const(cfg.max_log_magnitude, np.float32)])],
        name="head/Mag",
    )
    re = b.node("Mul", [magnitude, b.node("Cos", [phase])], name="head/Re")
    im = b.node("Mul", [magnitude, b.node("Sin", [phase])], name="head/Im")
    spectrum = b.node("Concat", [re, im], axis=2, name="head/Spectrum")  # [B,rows,2,half,F]
    fft = FFTGraph(b, plan, frames, samples, "istft")
    return fft.waveform(fft.istft(spectrum, "out/istft"), "out")


def _convnext_trunk(b: GraphBuilder, model: object, mel: str) -> str:
    """The neural vocoder up to its head: mel [B,F,n_mels] -> normed features [B,F,hidden]."""
    cfg = model.cfg  # type: ignore[attr-defined]
    pad = cfg.kernel // 2

    def conv(x: str, layer: object, name: str, groups: int = 1) -> str:
        return b.node(
            "Conv",
            [
                x,
                b.initializer(f"{name}.weight", _np(layer.weight)),
                b.initializer(f"{name}.bias", _np(layer.bias)),
            ],  # type: ignore[attr-defined]
            pads=[pad, pad],
            group=groups,
            name=name,
        )

    def norm(x: str, layer: object, name: str) -> str:
        return layer_norm(b, x, _np(layer.weight), _np(layer.bias), layer.eps, name)  # type: ignore[attr-defined]

    x = conv(b.node("Transpose", [mel], perm=[0, 2, 1], name="mel/T"), model.embed, "embed")  # type: ignore[attr-defined]
    x = norm(b.node("Transpose", [x], perm=[0, 2, 1], name="embed/T"), model.norm, "embed/Norm")  # type: ignore[attr-defined]
    x = b.node("Transpose", [x], perm=[0, 2, 1], name="embed/Tback")  # [B,C,F]
    for i, block in enumerate(model.blocks):  # type: ignore[attr-defined]
        tag = f"block{i}"
        y = conv(x, block.dwconv, f"{tag}/dwconv", groups=cfg.hidden)
        y = norm(
            b.node("Transpose", [y], perm=[0, 2, 1], name=f"{tag}/T"), block.norm, f"{tag}/Norm"
        )
        y = linear(b, y, _linear_weight(block.pw1), _bias(block.pw1), f"{tag}/pw1")
        y = _gelu(b, y, f"{tag}/Gelu")
        y = linear(b, y, _linear_weight(block.pw2), _bias(block.pw2), f"{tag}/pw2")
        y = b.node("Mul", [y, b.initializer(f"{tag}.gamma", _np(block.gamma))], name=f"{tag}/Scale")
        y = b.node("Transpose", [y], perm=[0, 2, 1], name=f"{tag}/Tback")
        x = b.node("Add", [x, y], name=f"{tag}/Residual")
    x = b.node("Transpose", [x], perm=[0, 2, 1], name="head/T")
    return norm(x, model.final_norm, "head/Norm")  # type: ignore[attr-defined]


@dataclass(frozen=True)
class VocoderParts:
    """What a vocoder puts in a bundle: its graph, bundle.json's "vocoder" and "streaming"."""

    graph: onnx.ModelProto
    section: dict
    streaming: dict


def griffin_lim_parts(
    stats: dict, vocoder: VocoderConfig, phase_model: object | None = None, dft: str = "fft"
) -> VocoderParts:
    """Griffin-Lim, starting from the phase of `phase_model` (a NeuralVocoder) when given."""
    mel = MEL_CONFIG
    # Griffin-Lim looks both ways: half an analysis window beyond the frame, in frames.
    reach = -(-mel.n_fft // (2 * mel.hop_length)) + 1
    section = {
        "kind": "griffin-lim",
        "receptive_field_frames": reach,
        "lookahead_frames": reach,
        "griffin_lim_iterations": vocoder.iterations,
        "griffin_lim_power": vocoder.power,
        "dft": dft,
    }
    if phase_model is not None:
        cfg = phase_model.cfg  # type: ignore[attr-defined]
        section["starting_phase"] = f"neural convnext{cfg.blocks}x{cfg.hidden}-istft{cfg.n_fft}"
        section["receptive_field_frames"] = reach + cfg.receptive_field_frames
    return VocoderParts(
        build_vocoder_graph(mel, stats, vocoder, phase_model, dft),
        section,
        {
            "first_chunk_frames": 10,
            "stride_frames": 24,
            "overlap_frames": 8,
            "holdback_frames": reach,
            "crossfade_samples": 640,
        },
    )


def neural_vocoder_parts(model: object, streaming: dict, dft: str = "fft") -> VocoderParts:
    """model: export.voice.vocoder.NeuralVocoder; streaming: measured by
    export.voice.evaluate.choose_streaming."""
    cfg = model.cfg  # type: ignore[attr-defined]
    return VocoderParts(
        build_neural_vocoder_graph(model, dft),
        {
            "kind": "neural",
            "architecture": f"convnext{cfg.blocks}x{cfg.hidden}-istft{cfg.n_fft}",
            "receptive_field_frames": cfg.receptive_field_frames,
            "lookahead_frames": streaming["holdback_frames"],
            "dft": dft,
        },
        dict(streaming),
    )


def bundle_manifest(
    model: object, stats: dict, vocoder: VocoderParts, lm_int8: bool = False
) -> dict[str, object]:
    """bundle.json without the file hashes (write_bundle adds them)."""
    cfg = model.cfg  # type: ignore[attr-defined]
    mel = MEL_CONFIG
    return {
        "format_version": 1,
        "family": "phoneme-mel",
        "name": "onnx-tts-voice",
        "version": "1",
        "sample_rate": mel.sample_rate,
        "graphs": dict(GRAPH_FILES),
        "kv": onnx_graphs.kv_manifest(cfg, 4096),
        "frames": {
            "hop_length": mel.hop_length,
            "n_mels": mel.n_mels,
            "reduction": cfg.reduction,
            "frame_rate": mel.sample_rate // mel.hop_length,
        },
        "text": {
            "phonemizer": "espeak-ng",
            "language": "en-us",
            # Phoneme id = index + 1 (0 pads the window outside the sentence).
            "phonemes": list(cfg.symbols),
            "start_symbol": "^",
            "end_symbol": "$",
            "context": list(cfg.context),
            "max_progress": cfg.max_progress,
            "max_chars_per_chunk": 200,
        },
        "pointer": {"advance_classes": cfg.advance_classes, "max_steps_per_symbol": 12},
        # What the model speaks with no reference: the mean embedding of its default voice.
        "default_speaker_embedding": [round(float(v), 6) for v in stats["default_speaker"]],
        "encoder": {"min_seconds": 0.5, "max_seconds": 30.0},
        "lm": {
            "hidden_size": cfg.hidden_size,
            "max_positions": cfg.max_positions,
            "weights": "int8" if lm_int8 else "float32",
        },
        "sampling": {"temperature": 0.0},
        "streaming": dict(vocoder.streaming),
        "vocoder": dict(vocoder.section),
    }


def write_bundle(
    out_dir: Path,
    model: object,
    stats: dict,
    vocoder: VocoderConfig | VocoderParts,
    lm_int8: bool = False,
) -> dict[str, int]:
    """model: a trained `export.voice.train.VoiceModel`; stats: its mel statistics (mean, std,
    default_speaker); vocoder: Griffin-Lim settings or a built vocoder; lm_int8: the LM's
    MatMul weights as int8 (export.onnx_graphs.quantize_matmul_weights_int8). Returns file
    sizes."""
    if isinstance(vocoder, VocoderConfig):
        vocoder = griffin_lim_parts(stats, vocoder)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = model.cfg  # type: ignore[attr-defined]
    lm = build_gqa_lm(lm_spec(cfg), lm_weights(model), name="lm")  # type: ignore[arg-type]
    if lm_int8:
        lm = onnx_graphs.quantize_matmul_weights_int8(lm)
    graphs = {
        "encoder": build_encoder_graph(MEL_CONFIG, stats),
        "embed": build_embed_graph(model),
        "lm": lm,
        "vocoder": vocoder.graph,
    }
    files = {filename: graphs[key] for key, filename in GRAPH_FILES.items()}
    _, sizes = onnx_graphs.write_bundle(out, bundle_manifest(model, stats, vocoder, lm_int8), files)
    return sizes


def read_manifest(bundle_dir: Path) -> dict:
    """A built bundle's bundle.json."""
    return json.loads((Path(bundle_dir) / "bundle.json").read_text())


def bundle_initializers(bundle_dir: Path, manifest: dict, *roles: str) -> dict[str, np.ndarray]:
    """The initializers of the bundle's graphs with these roles ("encoder", "embed", ...), by
    name: the weights a bundle holds, read back without its training checkpoint (int8 weights
    come back as the float values the graph computes with)."""
    from onnx import numpy_helper

    values: dict[str, np.ndarray] = {}
    for role in roles:
        model = onnx.load(str(Path(bundle_dir) / manifest["graphs"][role]))
        values.update({t.name: numpy_helper.to_array(t) for t in model.graph.initializer})
    return onnx_graphs.dequantized_initializers(values)


def rebundle_with_vocoder(out_dir: Path, lm_from: Path, vocoder: VocoderParts) -> dict[str, int]:
    """A bundle with `lm_from`'s encoder, embed and LM graphs (byte for byte, with its text,
    kv and speaker settings) and a new vocoder: the export path when the LM's training
    checkpoint is not at hand. `out_dir` may be `lm_from` itself."""
    source = Path(lm_from)
    manifest = read_manifest(source)
    manifest.pop("sha256", None)
    graphs = manifest["graphs"]
    files: dict[str, onnx.ModelProto | bytes] = {
        graphs[role]: (source / graphs[role]).read_bytes() for role in ("encoder", "embed", "lm")
    }
    files[graphs["vocoder"]] = vocoder.graph
    manifest["streaming"] = dict(vocoder.streaming)
    manifest["vocoder"] = dict(vocoder.section)
    _, sizes = onnx_graphs.write_bundle(Path(out_dir), manifest, files)
    return sizes


__all__ = [
    "DFT_FORMS",
    "MEL_CONFIG",
    "VocoderConfig",
    "VocoderParts",
    "build_embed_graph",
    "build_encoder_graph",
    "build_neural_vocoder_graph",
    "build_vocoder_graph",
    "bundle_initializers",
    "griffin_lim_parts",
    "neural_vocoder_parts",
    "read_manifest",
    "rebundle_with_vocoder",
    "write_bundle",
]

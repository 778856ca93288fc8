"""ONNX graphs and bundle of the trained voice (family "phoneme-mel", see
onnx_tts/families/phoneme_mel.py).

* encoder.onnx: audio -> STFT (a strided Conv with windowed DFT kernels) -> log-mel ->
  standardise -> speaker embedding = per-band mean and std (exactly
  :func:`export.voice.train.speaker_stats`).
* embed.onnx: (previous frames, phoneme window, progress, speaker) -> LM input vectors.
* lm.onnx: the shared GQA decoder builder (export.onnx_graphs), trained weights; one output `logits`
  holding the step's standardised mel frames followed by the advance logits.
* vocoder.onnx: standardised log-mel -> linear magnitude -> linear interpolation to a finer hop
  -> unrolled Griffin-Lim (Conv STFT, ConvTranspose inverse STFT) from a fixed deterministic
  phase, so the graph has no random op.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx

from export import onnx_graphs
from export.build_codec_lm import _bias, _linear_weight, _np, lm_weights
from export.onnx_graphs import DecoderLMSpec, build_gqa_lm
from export.voice.codec import MEL_CONFIG, MelConfig, mel_filterbank, mel_inverse
from onnx_tts.tools.graph_builder import FLOAT, INT64, GraphBuilder, linear, reduce_op

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


def _standardised_log_mel(b: GraphBuilder, audio: str, cfg: MelConfig, stats: dict) -> str:
    """audio [B,N] -> standardised log-mel [B, N // hop, n_mels] (as train.log_mel_frames)."""
    frames = b.node(
        "Div", [b.shape_dims(audio, 1, 2, "frames/N"), b.const([cfg.hop_length])], name="frames/F"
    )
    audio3 = b.node("Unsqueeze", [audio, b.const([1])], name="audio/Channel")
    analysis, _ = dft_kernels(cfg.n_fft)
    re, im = _stft(
        b, audio3, b.initializer("stft.kernel", analysis), cfg.hop_length, cfg.n_fft, frames, "stft"
    )
    power = b.node("Add", [b.node("Mul", [re, re]), b.node("Mul", [im, im])], name="stft/Power")
    magnitude = b.node("Sqrt", [power], name="stft/Magnitude")  # [B,bins,F]
    mag_t = b.node("Transpose", [magnitude], perm=[0, 2, 1], name="stft/T")
    mel = b.node("MatMul", [mag_t, b.initializer("mel.bank_t", mel_filterbank(cfg).T.copy())])
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


def _f32(values: object) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


def build_encoder_graph(cfg: MelConfig, stats: dict) -> onnx.ModelProto:
    b = GraphBuilder("encoder")
    audio = b.add_input("audio", FLOAT, ("batch", "samples"))
    normed = _standardised_log_mel(b, audio, cfg, stats)
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
    return b.build("voice encoder: Conv STFT -> log-mel -> standardise -> per-band mean and std")


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


def build_vocoder_graph(cfg: MelConfig, stats: dict, vocoder: VocoderConfig) -> onnx.ModelProto:
    hop = cfg.hop_length // vocoder.upsample
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
    linear = b.node(
        "MatMul", [b.node("Exp", [logmel]), b.initializer("mel.inverse", mel_inverse(cfg))]
    )
    linear = b.node("Relu", [linear], name="linear/Clamp")  # [B,F,bins]
    magnitude = b.node("Transpose", [linear], perm=[0, 2, 1], name="linear/T")  # [B,bins,F]
    if vocoder.upsample > 1:
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
    analysis, synthesis = dft_kernels(cfg.n_fft)
    analysis_k = b.initializer("stft.kernel", analysis)
    synthesis_k = b.initializer("istft.kernel", synthesis)
    window_sq = (analysis[0, 0] ** 2).astype(np.float32)  # row 0 is cos(0) * window = window
    half = cfg.n_fft // 2
    # Overlap-add envelope of the squared window, for the inverse STFT's normalisation.
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

    # Starting phase: the same integer hash as initial_phase(), computed in the graph.
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
    cos_p, sin_p = b.node("Cos", [phase]), b.node("Sin", [phase])

    def istft(re: str, im: str, tag: str) -> str:
        spec = b.node("Concat", [re, im], axis=1, name=f"{tag}/Spec")
        ola = b.node("ConvTranspose", [spec, synthesis_k], strides=[hop], name=f"{tag}/OLA")
        ola = b.node("Div", [ola, envelope], name=f"{tag}/Normalise")
        return b.node("Slice", [ola, b.const([half]), end, b.const([2])], name=f"{tag}/Trim")

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
    return b.build(
        f"voice vocoder: log-mel -> linear magnitude -> Griffin-Lim x{vocoder.iterations} "
        f"at hop {hop}"
    )


def bundle_manifest(model: object, stats: dict, vocoder: VocoderConfig) -> dict[str, object]:
    """bundle.json without the file hashes (write_bundle adds them)."""
    cfg = model.cfg  # type: ignore[attr-defined]
    mel = MEL_CONFIG
    # Griffin-Lim looks both ways: half an analysis window beyond the frame, in frames.
    reach = -(-mel.n_fft // (2 * mel.hop_length)) + 1
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
        "lm": {"hidden_size": cfg.hidden_size, "max_positions": cfg.max_positions},
        "sampling": {"temperature": 0.0},
        "streaming": {
            "first_chunk_frames": 10,
            "stride_frames": 24,
            "overlap_frames": 8,
            "holdback_frames": reach,
            "crossfade_samples": 640,
        },
        "vocoder": {
            "receptive_field_frames": reach,
            "lookahead_frames": reach,
            "griffin_lim_iterations": vocoder.iterations,
        },
    }


def write_bundle(
    out_dir: Path, model: object, stats: dict, vocoder: VocoderConfig
) -> dict[str, int]:
    """model: a trained `export.voice.train.VoiceModel`; stats: its mel statistics (mean, std,
    default_speaker). Returns the file sizes."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = model.cfg  # type: ignore[attr-defined]
    graphs = {
        "encoder": build_encoder_graph(MEL_CONFIG, stats),
        "embed": build_embed_graph(model),
        "lm": build_gqa_lm(lm_spec(cfg), lm_weights(model), name="lm"),  # type: ignore[arg-type]
        "vocoder": build_vocoder_graph(MEL_CONFIG, stats, vocoder),
    }
    files = {filename: graphs[key] for key, filename in GRAPH_FILES.items()}
    _, sizes = onnx_graphs.write_bundle(out, bundle_manifest(model, stats, vocoder), files)
    return sizes


__all__ = [
    "MEL_CONFIG",
    "VocoderConfig",
    "build_embed_graph",
    "build_encoder_graph",
    "build_vocoder_graph",
    "write_bundle",
]

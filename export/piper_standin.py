"""Stand-in Piper voices: a small graph with a Piper voice's exact I/O and a real
`NAME.onnx.json` layout, for what the one real voice on the package index (joe, English, one
speaker) cannot show: other languages and multi-speaker voices.

    python -m export.piper_standin OUT_DIR NAME [--espeak-voice de] [--language de_DE]
        [--speakers a,b,c] [--sample-rate 22050] [--decoder]

The graph takes what a Piper graph takes (`input` int64 [B, T], `input_lengths` int64 [B],
`scales` float32 [3] = noise, length, noise_w; `sid` int64 [B] for several speakers) and gives
`output` float32 [B, 1, 1, samples]. Inside, like VITS: each id lasts a few frames (a table,
times the length scale, `Ceil`ed: the durations the family times words with), each frame a
256-sample tone of its id's pitch, the speaker's pitch factor, plus noise scaled by
`noise_scale` (RandomNormalLike, as Piper's graphs draw their noise). Only the interface and
the config are Piper's; the audio is a tone sequence, not speech.

With `decoder`, the frames go through a small reverse flow and HiFi-GAN-shaped decoder
instead, as in Piper's graphs: prior frames [1, 2, F] (pitch and its square, plus the noise)
and a mask of ones [1, 1, F] into one coupling layer (a channel flip, the half split,
`flow.flows.0.pre`, the speaker's embedding added (VITS's `cond`), a kernel-5 convolution,
Tanh, `post`, the other half shifted), then `dec.conv_pre` (kernel 7), the speaker's embedding
added after it (VITS's `dec.cond`), LeakyReLU, a transposed convolution upsampling by 256, a
last convolution (kernel 7) and Tanh: the graph the family cuts in three and streams in
windows.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from onnx_tts.tools.graph_builder import FLOAT, INT64, GraphBuilder

HOP = 256
# The phoneme_id_map of the published voices (joe's: its first 151 symbols; pad,
# start, end, space, punctuation, then IPA symbols), ids in order.
SYMBOLS = (
    "_^$ !'(),-.:;?abcdefhijklmnopqrstuvwxyzæçðøħŋœǀǁǂǃɐɑɒɓɔɕɖɗɘəɚɛɜɞɟɠɡɢɣɤɥɦɧɨɪɫɬɭɮɯɰɱɲɳɴɵɶɸɹɺɻɽɾ"
    'ʀʁʂʃʄʈʉʊʋʌʍʎʏʐʑʒʔʕʘʙʛʜʝʟʡʢʲˈˌːˑ˞βθχᵻⱱ0123456789\u0327\u0303\u032a\u032f\u0329ʰˤε↓#"↑'
    "\u033a\u033bgʦX\u031d\u030aɝʷ"
)


def standin_graph(
    num_symbols: int, num_speakers: int, seed: int = 0, decoder: bool = False
) -> onnx.ModelProto:
    """The stand-in graph (module docstring)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("piper_standin", opset=15)
    ids = b.add_input("input", INT64, ("batch_size", "phonemes"))
    lengths = b.add_input("input_lengths", INT64, ("batch_size",))
    scales = b.add_input("scales", FLOAT, (3,))
    if num_speakers > 1:
        sid = b.add_input("sid", INT64, ("batch_size",))
    b.add_output("output", FLOAT, ("batch_size", 1, 1, "time"))
    frames_of = b.initializer(
        "frames_per_id", rng.uniform(1.5, 5.5, num_symbols).astype(np.float32)
    )
    pitch_of = b.initializer("pitch", rng.uniform(120, 480, num_symbols).astype(np.float32))

    def scale(index: int) -> str:
        return b.node("Slice", [scales, b.const([index]), b.const([index + 1]), b.const([0])])

    # durations: table * length scale, zero past each row's length, Ceil (as VITS's w_ceil)
    positions = b.node("Range", [b.const(0), b.shape_dims(ids, 1, 2), b.const(1)])
    inside = b.node(
        "Less",
        [
            b.node("Unsqueeze", [positions, b.const([0])]),
            b.node("Unsqueeze", [lengths, b.const([1])]),
        ],
    )
    durations = b.node("Mul", [b.node("Gather", [frames_of, ids]), scale(1)])
    durations = b.node("Mul", [durations, b.node("Cast", [inside], to=FLOAT)])
    w_ceil = b.node("Ceil", [durations])
    # frames of the first row: frame f voices the id whose cumulative end is first above f
    row = b.node(
        "Squeeze",
        [b.node("Slice", [w_ceil, b.const([0]), b.const([1]), b.const([0])]), b.const([0])],
    )
    ends = b.node("CumSum", [row, b.const(0)])
    total = b.node("Cast", [b.node("ReduceSum", [row, b.const([0])], keepdims=0)], to=INT64)
    frames = b.node("Cast", [b.node("Range", [b.const(0), total, b.const(1)])], to=FLOAT)
    done = b.node(
        "Cast",
        [
            b.node(
                "LessOrEqual",
                [
                    b.node("Unsqueeze", [ends, b.const([0])]),
                    b.node("Unsqueeze", [frames, b.const([1])]),
                ],
            )
        ],
        to=INT64,
    )
    which = b.node("ReduceSum", [done, b.const([1])], keepdims=0)
    first_ids = b.node(
        "Squeeze", [b.node("Slice", [ids, b.const([0]), b.const([1]), b.const([0])]), b.const([0])]
    )
    pitch = b.node("Gather", [pitch_of, b.node("Gather", [first_ids, which])])
    if num_speakers > 1:
        factors = b.initializer(
            "speaker_pitch", (1.0 + 0.15 * np.arange(num_speakers)).astype(np.float32)
        )
        pitch = b.node(
            "Mul",
            [
                pitch,
                b.node(
                    "Gather",
                    [factors, b.node("Slice", [sid, b.const([0]), b.const([1]), b.const([0])])],
                ),
            ],
        )
    if decoder:
        _decoder(b, rng, pitch, scale(0), sid if num_speakers > 1 else None, num_speakers)
        return b.build("stand-in with a Piper voice's I/O and decoder; not speech")
    # samples: each frame HOP samples of a tone at its pitch
    per_sample = b.node(
        "Reshape",
        [
            b.node("Expand", [b.node("Unsqueeze", [pitch, b.const([1])]), b.const([1, HOP])]),
            b.const([-1]),
        ],
    )
    count = b.node("Mul", [total, b.const(HOP)])
    time = b.node(
        "Div",
        [
            b.node("Cast", [b.node("Range", [b.const(0), count, b.const(1)])], to=FLOAT),
            b.const(22050.0, np.float32),
        ],
    )
    tone = b.node(
        "Sin", [b.node("Mul", [b.node("Mul", [per_sample, time]), b.const(2 * np.pi, np.float32)])]
    )
    audio = b.node("Mul", [tone, b.const(0.3, np.float32)])
    noise = b.node(
        "Mul",
        [b.node("RandomNormalLike", [audio]), b.node("Mul", [scale(0), b.const(0.01, np.float32)])],
    )
    audio = b.node("Add", [audio, noise])
    b.node("Reshape", [audio, b.const([1, 1, 1, -1])], output_names=["output"])
    return b.build("stand-in with a Piper voice's I/O; not speech")


def _decoder(
    b: GraphBuilder, rng: np.random.Generator, pitch: str, noise: str, sid: str | None, n: int
) -> None:
    """The frames' pitch -> latent frames -> audio through a HiFi-GAN-shaped decoder
    (module docstring), into the graph's `output`."""
    width = 8
    level = b.node("Div", [pitch, b.const(500.0, np.float32)])
    level = b.node("Unsqueeze", [level, b.const([0, 1])])  # [1, 1, F]
    latent = b.node("Concat", [level, b.node("Mul", [level, level])], axis=1)
    drawn = b.node("Mul", [b.node("RandomNormalLike", [latent]), noise])
    latent = b.node("Add", [latent, b.node("Mul", [drawn, b.const(0.05, np.float32)])])

    def weight(name: str, shape: tuple[int, ...], spread: float) -> str:
        return b.initializer(name, rng.normal(0, spread, shape).astype(np.float32))

    mask = b.node(
        "Add", [b.node("Mul", [level, b.const(0.0, np.float32)]), b.const(1.0, np.float32)]
    )
    latent = _coupling(b, weight, latent, mask, sid, n)

    x = b.node(
        "Conv",
        [latent, weight("dec.conv_pre.weight", (width, 2, 7), 0.5), weight("dec.b", (width,), 0.1)],
        kernel_shape=[7],
        pads=[3, 3],
    )
    if sid is not None:
        embedding = b.node("Gather", [weight("emb_g.weight", (n, width), 0.5), sid])
        x = b.node("Add", [x, b.node("Unsqueeze", [embedding, b.const([2])])])
    x = b.node("LeakyRelu", [x], alpha=0.1)
    x = b.node(
        "ConvTranspose",
        [x, weight("dec.ups.weight", (width, 1, 2 * HOP), 0.05)],
        kernel_shape=[2 * HOP],
        strides=[HOP],
        pads=[HOP // 2, HOP // 2],
    )
    x = b.node(
        "Conv", [x, weight("dec.conv_post.weight", (1, 1, 7), 0.4)], kernel_shape=[7], pads=[3, 3]
    )
    b.node("Unsqueeze", [b.node("Tanh", [x]), b.const([1])], output_names=["output"])


def _coupling(b: GraphBuilder, weight: Any, x: str, mask: str, sid: str | None, n: int) -> str:
    """One reverse coupling layer of VITS's flow on [1, 2, F] (module docstring)."""
    flipped = b.node(
        "Slice", [x, b.const([-1]), b.const([-(2**63) + 1]), b.const([1]), b.const([-1])]
    )
    x0, x1 = b.node("Split", [flipped, b.const([1, 1])], num_outputs=2, axis=1)

    def conv(h: str, name: str, shape: tuple[int, int, int]) -> str:
        pad = shape[2] // 2
        out = b.node(
            "Conv", [h, weight(name, shape, 0.5)], kernel_shape=[shape[2]], pads=[pad, pad]
        )
        return b.node("Mul", [out, mask])

    h = conv(x0, "flow.flows.0.pre.weight", (4, 1, 1))
    if sid is not None:
        embedding = b.node("Gather", [weight("flow.flows.0.enc.cond.weight", (n, 4), 0.5), sid])
        h = b.node("Add", [h, b.node("Unsqueeze", [embedding, b.const([2])])])
    h = b.node("Tanh", [conv(h, "flow.flows.0.enc.in_layers.0.weight", (4, 4, 5))])
    shift = conv(h, "flow.flows.0.post.weight", (1, 4, 1))
    x1 = b.node("Mul", [b.node("Sub", [x1, shift]), mask])
    return b.node("Mul", [b.node("Concat", [x0, x1], axis=1), mask])


def standin_config(espeak_voice: str, language: str, speakers: list[str], sample_rate: int) -> dict:
    """A config in the published layout (the fields piper-tts and wyoming-piper read)."""
    family, _, region = language.partition("_")
    return {
        "audio": {"sample_rate": sample_rate, "quality": "medium"},
        "espeak": {"voice": espeak_voice},
        "inference": {"noise_scale": 0.667, "length_scale": 1, "noise_w": 0.8},
        "phoneme_type": "espeak",
        "phoneme_map": {},
        "phoneme_id_map": {symbol: [index] for index, symbol in enumerate(SYMBOLS[:151])},
        "num_symbols": 256,
        "num_speakers": max(1, len(speakers)),
        "speaker_id_map": {name: index for index, name in enumerate(speakers)}
        if len(speakers) > 1
        else {},
        "piper_version": "1.0.0",
        "language": {"code": language, "family": family, "region": region},
        "dataset": "standin",
    }


def write_standin(
    out: Path,
    name: str,
    espeak_voice: str = "en-us",
    language: str = "en_US",
    speakers: list[str] | None = None,
    sample_rate: int = 22050,
    decoder: bool = False,
) -> Path:
    """Write OUT/NAME.onnx and OUT/NAME.onnx.json; returns the .onnx path."""
    speakers = list(speakers or [])
    out.mkdir(parents=True, exist_ok=True)
    config = standin_config(espeak_voice, language, speakers, sample_rate)
    model = standin_graph(config["num_symbols"], config["num_speakers"], decoder=decoder)
    onnx.checker.check_model(model)
    path = out / f"{name}.onnx"
    onnx.save(model, str(path))
    path.with_name(path.name + ".json").write_text(json.dumps(config, ensure_ascii=False, indent=1))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m export.piper_standin", description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("name")
    parser.add_argument("--espeak-voice", default="en-us")
    parser.add_argument("--language", default="en_US")
    parser.add_argument("--speakers", default="", help="comma-separated speaker names")
    parser.add_argument("--sample-rate", type=int, default=22050)
    parser.add_argument("--decoder", action="store_true", help="frames through a decoder")
    args = parser.parse_args(argv)
    speakers = [s for s in args.speakers.split(",") if s]
    print(
        write_standin(
            args.out,
            args.name,
            args.espeak_voice,
            args.language,
            speakers,
            args.sample_rate,
            args.decoder,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

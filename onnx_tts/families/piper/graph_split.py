"""A Piper voice's one graph cut in two, in memory (the user's file is never touched): "frames"
(ids -> the HiFi-GAN decoder's input, one latent frame per hop of audio, and the phoneme
durations) and "decoder" (latent frames -> audio), so the decoder can run in windows while a
sentence streams.

The cut is the input of the decoder's first convolution (`dec.conv_pre`, the name every Piper
export gives its weight). The decoder is then checked to be local in time: only convolutions
of stride 1 with "same" padding, transposed convolutions that upsample exactly (kernel - pads
= stride) and element-wise operations touch the frames. Its receptive field (`reach`, in
frames on each side) is summed from those convolutions (11.2, rounded up to 12, on joe); a
window with at least that many frames of context on both sides decodes the samples of its
middle as the whole sentence does, within float rounding (9.1e-7 measured on joe, over a
5-sentence text; tests/test_piper.py holds it to 1e-5).
A graph without such a cut runs whole (`split_voice` returns None).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

DECODER_FIRST_WEIGHT = "dec.conv_pre.weight"
# Operations applied sample by sample (or a speaker's conditioning broadcast over time), and
# the output's added axes.
ELEMENTWISE = {
    "Unsqueeze",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "LeakyRelu",
    "Relu",
    "Tanh",
    "Sigmoid",
    "Identity",
    "Clip",
}


@dataclass(frozen=True)
class SplitVoice:
    """The two graphs (`onnx.ModelProto`) and what the engine needs to know of them."""

    frames: Any  # inputs: the voice's; outputs: latent, durations (when found)
    decoder: Any  # inputs: latent (+ sid for a multi-speaker voice); output: audio
    latent: str  # the cut tensor's name: [1, channels, frames]
    channels: int
    reach: int  # frames of context each side that make a window exact
    decoder_sid: bool  # the decoder takes the speaker too (its conditioning)


def split_voice(proto: Any, durations: str | None, hop_length: int) -> SplitVoice | None:
    """`proto` cut at its decoder's input (module docstring), or None when it has no such cut
    or the decoder is not local in time (then it runs whole)."""
    from onnx import helper

    graph = proto.graph
    weights = {init.name: init for init in graph.initializer}
    first = [
        node
        for node in graph.node
        if node.op_type == "Conv" and len(node.input) > 1 and node.input[1] == DECODER_FIRST_WEIGHT
    ]
    if len(first) != 1 or DECODER_FIRST_WEIGHT not in weights:
        return None
    latent = first[0].input[0]
    channels = int(weights[DECODER_FIRST_WEIGHT].dims[1])
    output = graph.output[0].name
    inputs = {value.name for value in graph.input}
    decoder_nodes = _needed(graph, [output], stop={latent})
    needs = {name for node in decoder_nodes for name in node.input if name in inputs}
    if needs - {"sid"}:
        return None  # the decoder reads more than the latent frames and the speaker
    reach, rate = _reach(decoder_nodes, latent, weights, helper)
    if reach is None or rate != hop_length:
        return None
    frame_outputs = [latent] + ([durations] if durations else [])
    frame_nodes = _needed(graph, frame_outputs, stop=set())
    frames = _subgraph(proto, frame_nodes, [value.name for value in graph.input], frame_outputs)
    decoder_inputs = [latent] + (["sid"] if "sid" in needs else [])
    decoder = _subgraph(proto, decoder_nodes, decoder_inputs, [output])
    return SplitVoice(frames, decoder, latent, channels, math.ceil(reach), "sid" in needs)


def _needed(graph: Any, outputs: list[str], stop: set[str]) -> list[Any]:
    """The nodes `outputs` depend on (not looking past the tensors in `stop`), in graph order."""
    producer = {name: node for node in graph.node for name in node.output}
    wanted, todo = set(), list(outputs)
    while todo:
        name = todo.pop()
        node = producer.get(name)
        if name in stop or node is None or id(node) in wanted:
            continue
        wanted.add(id(node))
        todo.extend(node.input)
    return [node for node in graph.node if id(node) in wanted]


def _reach(nodes: list[Any], latent: str, weights: dict, helper: Any) -> tuple[float | None, int]:
    """(frames of context each side the output depends on, samples per frame at the output),
    or (None, 0) when an operation on the frames is not local in time."""
    reach, rate = {latent: 0.0}, {latent: 1}
    last = latent
    for node in nodes:
        touched = [name for name in node.input if name in reach]
        if not touched:
            continue  # the speaker's conditioning, constants
        here = max(reach[name] for name in touched)
        step = rate[touched[0]]
        if any(rate[name] != step for name in touched):
            return None, 0
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type in ("Conv", "ConvTranspose"):
            kernel = list(attributes.get("kernel_shape", []))
            if len(kernel) != 1 or node.input[1] not in weights:
                return None, 0
            pads = list(attributes.get("pads", [0, 0]))
            (stride,) = attributes.get("strides", [1])
            (dilation,) = attributes.get("dilations", [1])
            span = (kernel[0] - 1) * dilation
            if node.op_type == "Conv":
                if stride != 1 or sum(pads) != span or pads[0] != pads[1]:
                    return None, 0
                here += span / 2 / step
            else:
                if dilation != 1 or kernel[0] - sum(pads) != stride or pads[0] != pads[1]:
                    return None, 0
                # an output sample sees ceil(kernel / stride) inputs around its position
                here += (span / 2 + stride / 2) / (step * stride)
                step *= stride
        elif node.op_type not in ELEMENTWISE:
            return None, 0
        for name in node.output:
            reach[name], rate[name] = here, step
            last = name
    return reach[last], rate[last]


def _subgraph(proto: Any, nodes: list[Any], inputs: list[str], outputs: list[str]) -> Any:
    """A model of `nodes` with `inputs` and `outputs` (the latent and the durations, both
    float [B, C, T], declared so where the voice does not declare them), the initializers
    they use and `proto`'s opsets."""
    from onnx import TensorProto, helper

    graph = proto.graph
    used = {name for node in nodes for name in node.input}
    declared = {value.name: value for value in graph.input}
    new_inputs = [
        declared[name]
        if name in declared
        else helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, None, None])
        for name in inputs
    ]
    new_outputs = [
        next((v for v in graph.output if v.name == name), None)
        or helper.make_tensor_value_info(name, TensorProto.FLOAT, [None, None, None])
        for name in outputs
    ]
    sub = helper.make_graph(
        nodes,
        graph.name,
        new_inputs,
        new_outputs,
        [init for init in graph.initializer if init.name in used],
    )
    model = helper.make_model(sub, opset_imports=list(proto.opset_import))
    model.ir_version = proto.ir_version
    return model


__all__ = ["SplitVoice", "split_voice"]

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

A second cut, at the flow's input, lets the flow run in windows too: the expanded prior
sample z_p and the frames' mask, where the reverse flow's first coupling (`flow.flows.K.pre`,
the names Piper exports keep) reads them, behind the flips and the half split that only reorder
channels. The flow is WaveNet coupling layers, local in time like the decoder: only "same"
convolutions of stride 1, element-wise operations, Split/Concat/Slice on the channel axis (the
flips) and zeros the shape of a frame tensor (`Shape` -> `ConstantOfShape`) touch the frames;
its reach is summed the same way (32 frames on joe: 4 couplings of 4 layers of kernel 5). The
program's graph then stops at z_p (`prior`); `flow` maps z_p and the mask to the decoder's
input. A flow with anything else on the frames (or no such cut) stays in the program's graph:
the two-way cut above (`SplitVoice.flow` is None).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

DECODER_FIRST_WEIGHT = "dec.conv_pre.weight"
FLOW_WEIGHTS = "flow.flows."  # prefix of the flow's weights; its couplings' first: ".pre.weight"
COUPLING_FIRST = ".pre.weight"
CHANNEL_AXIS = 1  # frame tensors are [1, channels, frames]
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
    "Neg",
    "Exp",
}
# Operations that select or join channels: local in time when their axis is the channels'.
CHANNEL_OPS = {"Split", "Concat", "Slice"}


@dataclass(frozen=True)
class SplitVoice:
    """The graphs (`onnx.ModelProto`) and what the engine needs to know of them."""

    # inputs: the voice's; outputs: latent (or, with `flow`, its sample and mask), durations
    # (when found)
    frames: Any
    decoder: Any  # inputs: latent (+ sid for a multi-speaker voice); output: audio
    latent: str  # the decoder's input: [1, channels, frames]
    channels: int
    reach: int  # the decoder's frames of context each side that make a window exact
    decoder_sid: bool  # the decoder takes the speaker too (its conditioning)
    flow: FlowCut | None = None  # the flow cut off the frames graph


@dataclass(frozen=True)
class FlowCut:
    """The flow as a graph of its own: inputs the prior sample and the mask (+ sid), output the
    decoder's input; `frames` then outputs sample, mask (and the durations)."""

    graph: Any
    sample: str  # z_p: [1, channels, frames]
    mask: str  # [1, 1, frames]
    reach: int  # the flow's frames of context each side
    sid: bool  # the flow takes the speaker too


def split_voice(proto: Any, durations: str | None, hop_length: int) -> SplitVoice | None:
    """`proto` cut at its decoder's input (module docstring), or None when it has no such cut
    or the decoder is not local in time (then it runs whole)."""
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
    constants = _constants(graph)
    reach, rate = _reach(decoder_nodes, [latent], weights, constants)
    if reach is None or rate != hop_length:
        return None
    flow = _cut_flow(proto, latent, weights, constants)
    ends = [flow.sample, flow.mask] if flow is not None else [latent]
    frame_outputs = ends + ([durations] if durations else [])
    frame_nodes = _needed(graph, frame_outputs, stop=set())
    frames = _subgraph(proto, frame_nodes, [value.name for value in graph.input], frame_outputs)
    decoder_inputs = [latent] + (["sid"] if "sid" in needs else [])
    decoder = _subgraph(proto, decoder_nodes, decoder_inputs, [output])
    return SplitVoice(frames, decoder, latent, channels, math.ceil(reach), "sid" in needs, flow)


def _cut_flow(proto: Any, latent: str, weights: dict, constants: dict) -> FlowCut | None:
    """The flow between the prior sample and `latent` as a graph of its own (module
    docstring), or None when it cannot be found or is not local in time."""
    graph = proto.graph
    producer = {name: node for node in graph.node for name in node.output}
    couplings = [
        node
        for node in _needed(graph, [latent], stop=set())
        if node.op_type == "Conv"
        and len(node.input) > 1
        and node.input[1].startswith(FLOW_WEIGHTS)
        and node.input[1].endswith(COUPLING_FIRST)
    ]
    if not couplings:
        return None
    first = couplings[0]  # graph order: the coupling the reverse flow runs first
    sample = first.input[0]
    # Back past the flips and the half split (only channels: `_reach` checks them below).
    while sample in producer and producer[sample].op_type in ("Split", "Slice"):
        sample = producer[sample].input[0]
    masks = [
        name
        for node in graph.node
        if node.op_type == "Mul" and first.output[0] in node.input
        for name in node.input
        if name != first.output[0]
    ]
    inputs = {value.name for value in graph.input}
    if len(masks) != 1 or {sample, masks[0]} & (inputs | set(constants) | set(weights)):
        return None
    mask = masks[0]
    nodes = _needed(graph, [latent], stop={sample, mask})
    needs = {name for node in nodes for name in node.input if name in inputs}
    if needs - {"sid"}:
        return None  # the flow reads more of the voice's inputs than the speaker
    reach, rate = _reach(nodes, [sample, mask], weights, constants)
    if reach is None or rate != 1:
        return None
    flow_inputs = [sample, mask] + (["sid"] if "sid" in needs else [])
    flow = _subgraph(proto, nodes, flow_inputs, [latent])
    return FlowCut(flow, sample, mask, math.ceil(reach), "sid" in needs)


def _constants(graph: Any) -> dict[str, Any]:
    """The graph's constant tensors (initializers and `Constant` nodes) as arrays."""
    from onnx import AttributeProto, numpy_helper

    found = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    for node in graph.node:
        tensors = [a.t for a in node.attribute if a.type == AttributeProto.TENSOR]
        if node.op_type == "Constant" and tensors:
            found[node.output[0]] = numpy_helper.to_array(tensors[0])
    return found


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


def _reach(
    nodes: list[Any], sources: list[str], weights: dict, constants: dict
) -> tuple[float | None, int]:
    """(frames of context each side the last output depends on, samples per frame there), or
    (None, 0) when an operation on the frames of `sources` is not local in time."""
    from onnx import helper

    reach = dict.fromkeys(sources, 0.0)
    rate = dict.fromkeys(sources, 1)
    shapes: dict[str, tuple[float, int]] = {}  # a frame tensor's shape: only for zeros of it
    reshaped: set[str] = set()  # axes moved (Unsqueeze): no channel operation on these
    last = sources[0]
    for node in nodes:
        touched = [name for name in node.input if name in reach]
        if any(name in shapes for name in node.input):
            if node.op_type != "ConstantOfShape":
                return None, 0
            reach[node.output[0]], rate[node.output[0]] = 0.0, shapes[node.input[0]][1]
            continue
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
        elif node.op_type == "Shape":
            shapes[node.output[0]] = (here, step)
            continue
        elif node.op_type in CHANNEL_OPS:
            if touched != [node.input[0]] and node.op_type != "Concat":
                return None, 0  # a Slice's or Split's bounds read from the frames
            if any(name in reshaped for name in touched) or _axis(node, attributes, constants) != [
                CHANNEL_AXIS
            ]:
                return None, 0
        elif node.op_type not in ELEMENTWISE:
            return None, 0
        for name in node.output:
            reach[name], rate[name] = here, step
            if node.op_type == "Unsqueeze" or any(n in reshaped for n in touched):
                reshaped.add(name)
            last = name
    return reach[last], rate[last]


def _axis(node: Any, attributes: dict, constants: dict) -> list[int] | None:
    """The axes a Split, Concat or Slice works on (None when not known from the graph)."""
    if node.op_type != "Slice":
        return [int(attributes.get("axis", 0))]
    if len(node.input) < 4 or node.input[3] not in constants:
        return None  # no axes: every axis
    return [int(axis) for axis in constants[node.input[3]].reshape(-1)]


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


__all__ = ["FlowCut", "SplitVoice", "split_voice"]

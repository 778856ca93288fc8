"""The Piper flow cut (`graph_split`): the reverse flow cut off the frames graph runs in
windows beside the decoder only when every operation on its frames is local in time; anything
else keeps it in the frames graph (the decoder-only cut), and the audio is the same."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnx_tts
from export.piper_standin import write_standin
from onnx_tts.families.piper.graph_split import _constants, _reach, split_voice

QUIET = {"noise_scale": 0.0, "noise_w": 0.0}
TEXT = "Guten Tag. Wie geht es dir heute? Das Wetter ist schön und der Zug kommt pünktlich."


def _frames_graph(second: onnx.NodeProto, extra: list[onnx.TensorProto]) -> onnx.GraphProto:
    """x [1, 4, T] -> a kernel-5 convolution -> `second` (reading "c", writing "y")."""
    weight = helper.make_tensor(
        "w", TensorProto.FLOAT, [4, 4, 5], np.zeros(80, np.float32).tolist()
    )
    conv = helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[5], pads=[2, 2])
    return helper.make_graph(
        [conv, second],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [weight, *extra],
    )


def _reach_of(graph: onnx.GraphProto) -> tuple[float | None, int]:
    weights = {init.name: init for init in graph.initializer}
    return _reach(list(graph.node), ["x"], weights, _constants(graph))


def _ints(name: str, values: list[int]) -> onnx.TensorProto:
    return helper.make_tensor(name, TensorProto.INT64, [len(values)], values)


@pytest.mark.parametrize(
    ("second", "extra"),
    [
        # a slice of the frames (time) axis: not local
        (
            helper.make_node("Slice", ["c", "s", "e", "a"], ["y"]),
            [_ints("s", [1]), _ints("e", [-1]), _ints("a", [2])],
        ),
        # a mean over time
        (helper.make_node("ReduceMean", ["c"], ["y"], axes=[2]), []),
        # a split of the frames
        (helper.make_node("Split", ["c", "n"], ["y", "z"], axis=2), [_ints("n", [2, 2])]),
        # a causal convolution (padding on one side only)
        (helper.make_node("Conv", ["c", "w"], ["y"], kernel_shape=[5], pads=[4, 0]), []),
    ],
)
def test_reach_refuses_an_operation_that_is_not_local_in_time(second, extra):
    assert _reach_of(_frames_graph(second, extra)) == (None, 0)


def test_reach_sums_convolutions_through_channel_flips_and_zeros_of_a_shape():
    """The flow's own operations: a flip of the channels (Slice, step -1, axis 1), the half
    split, zeros the shape of a frame tensor; two kernel-5 convolutions: 2 + 2 frames."""
    flip = helper.make_node("Slice", ["c", "s", "e", "a", "st"], ["f"])
    halves = helper.make_node("Split", ["f", "n"], ["h0", "h1"], axis=1)
    shape = helper.make_node("Shape", ["h0"], ["sh"])
    zeros = helper.make_node("ConstantOfShape", ["sh"], ["zz"])
    joined = helper.make_node("Concat", ["zz", "h1", "h0", "h1"], ["j"], axis=1)
    conv = helper.make_node("Conv", ["j", "w"], ["y"], kernel_shape=[5], pads=[2, 2])
    graph = _frames_graph(flip, [_ints("s", [-1]), _ints("e", [-(2**63) + 1])])
    graph.initializer.extend([_ints("a", [1]), _ints("st", [-1]), _ints("n", [2, 2])])
    graph.node.extend([halves, shape, zeros, joined, conv])
    assert _reach_of(graph) == (4.0, 1)
    # The same with a Shape read by anything but ConstantOfShape (a length of the frames).
    graph.node[3].op_type = "Expand"
    assert _reach_of(graph) == (None, 0)


def test_a_flow_that_is_not_local_stays_in_the_frames_graph_and_the_audio_is_the_same(tmp_path):
    """A stand-in voice whose flow reads the mean over time of its frames: the decoder-only
    cut (the flow runs whole in the frames graph), its windowed stream equal to its one-shot
    audio within float rounding; the unchanged voice gets the flow cut, its random draws
    left in the frames graph (windows see the one draw of their sentence)."""
    local = write_standin(tmp_path / "local", "de_DE-local-medium", "de", "de_DE", [], 22050, True)
    proto = onnx.load(str(local))
    split = split_voice(proto, None, 256)
    assert split is not None and split.flow is not None and split.flow.reach == 2
    drawn = {"RandomNormalLike", "RandomNormal", "RandomUniformLike", "RandomUniform"}
    assert not any(n.op_type in drawn for n in split.flow.graph.graph.node)
    assert not any(n.op_type in drawn for n in split.decoder.graph.node)
    assert any(n.op_type in drawn for n in split.frames.graph.node)

    # Add the mean over time of the flow's first (masked) convolution to it.
    pre = next(n for n in proto.graph.node if "flow.flows.0.pre.weight" in n.input)
    masked = next(n for n in proto.graph.node if pre.output[0] in n.input)
    hidden = masked.output[0]
    mean = helper.make_node("ReduceMean", [hidden], ["onnx_tts_mean"], axes=[2])
    add = helper.make_node("Add", [hidden, "onnx_tts_mean"], ["onnx_tts_global"])
    for node in proto.graph.node:
        node.input[:] = ["onnx_tts_global" if i == hidden else i for i in node.input]
    index = list(proto.graph.node).index(masked) + 1
    proto.graph.node.insert(index, add)
    proto.graph.node.insert(index, mean)
    split = split_voice(proto, None, 256)
    assert split is not None and split.flow is None and split.reach == 5
    path = tmp_path / "global" / "de_DE-global-medium.onnx"
    path.parent.mkdir()
    onnx.save(proto, str(path))
    path.with_name(path.name + ".json").write_text(
        local.with_name(local.name + ".json").read_text()
    )
    with onnx_tts.load(str(path), cache_dir=None) as voice:
        info = voice.info()["streaming"]
        assert "windows of the decoder" in info and "flow" not in info
        whole = voice.synthesize(TEXT, normalize_audio=False, cache=False, **QUIET).samples
        pieces = list(voice.stream(TEXT, normalize_audio=False, cache=False, **QUIET))
        assert len(pieces) > 3
        assert np.abs(np.concatenate(pieces) - whole).max() <= 1e-5

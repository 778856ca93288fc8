"""`onnx-tts quantize --weights w8a8`: int8 weights per column and int8 activations per row
through MatMulInteger. A row computes the same bits alone or in a batch (the integer product is
exact), the result follows the float product within the quantization's error, the weights read
back are the ones the graph computes with, and through the public path a w8a8 model loads,
batches requests as rows of one step (each request's audio equal to its solo run), says what it
is, and is not quantized twice."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_tts
from onnx_tts.bundle import Bundle
from onnx_tts.errors import InputError
from onnx_tts.tools.quantize import (
    Thresholds,
    WeightsSpec,
    dequantize_products,
    quantize_model,
    quantize_weights,
)
from onnx_tts.tools.quantize.w8a8 import ZERO_POINT
from tests.conftest import at_once, codec_lm_dir

ANY_SPEED = Thresholds(max_speed_ratio=1e9)  # decisions by agreement alone (timing is noisy)
TEXTS = ["Hello there.", "How are you today?", "Fine, thanks."]
WIDTH, HIDDEN = 64, 96


def _two_layers(seed: int = 0) -> onnx.ModelProto:
    """x [batch, tokens, 64] -> MatMul (64x96), Relu; the same x -> MatMul (64x96) (two products
    sharing one activation); their sum -> MatMul (96x64)."""
    rng = np.random.default_rng(seed)
    weights = {
        "w_a": rng.standard_normal((WIDTH, HIDDEN)).astype(np.float32) * 0.2,
        "w_b": rng.standard_normal((WIDTH, HIDDEN)).astype(np.float32) * 0.2,
        "w_out": rng.standard_normal((HIDDEN, WIDTH)).astype(np.float32) * 0.2,
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w_a"], ["a"], name="a"),
        helper.make_node("Relu", ["a"], ["a_relu"], name="relu"),
        helper.make_node("MatMul", ["x", "w_b"], ["b"], name="b"),
        helper.make_node("Add", ["a_relu", "b"], ["h"], name="sum"),
        helper.make_node("MatMul", ["h", "w_out"], ["y"], name="out"),
    ]
    shape = ["batch", "tokens", WIDTH]
    graph = helper.make_graph(
        nodes,
        "two_layers",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_rows_are_exact_alone_and_batched_and_follow_the_float_product():
    model = _two_layers()
    quantized = quantize_weights(model, WeightsSpec("w8a8"))
    assert quantized.quantized == 3 and quantized.float_matmuls == 0
    ops = [n.op_type for n in quantized.model.graph.node]
    assert ops.count("MatMulInteger") == 3 and "MatMul" not in ops
    # One per-row quantization of x serves both products that read it.
    assert ops.count("ReduceMax") == 2
    x = np.random.default_rng(1).standard_normal((5, 3, WIDTH)).astype(np.float32)
    x[2, 1] *= 40.0  # one loud row: per-tensor scales would coarsen every other row
    x[3, 0] = 0.0  # a silent row has no scale
    batched = _run(quantized.model, x)
    for row in range(5):
        for token in range(3):
            alone = _run(quantized.model, x[row : row + 1, token : token + 1])
            np.testing.assert_array_equal(alone[0, 0], batched[row, token])
    reference = _run(model, x)
    assert np.all(np.isfinite(batched)) and not np.any(batched[3, 0])
    error = np.abs(batched - reference).max(axis=-1) / np.abs(reference).max(axis=-1).clip(1e-6)
    assert error[np.abs(reference).max(axis=-1) > 0].max() < 0.05, error.max()
    # The loud row did not change its neighbours: each row's error is its own.
    quiet = np.delete(error.reshape(-1), [2 * 3 + 1, 3 * 3])
    assert quiet.max() < 0.05


def test_weights_read_back_are_the_ones_computed_with_and_requantize():
    model = _two_layers()
    quantized = quantize_weights(model, WeightsSpec("w8a8")).model
    back = onnx.ModelProto()
    back.CopyFrom(quantized)
    assert dequantize_products(back) == 3
    assert [n.op_type for n in back.graph.node] == ["MatMul", "Relu", "MatMul", "Add", "MatMul"]
    values = {t.name: numpy_helper.to_array(t) for t in quantized.graph.initializer}
    read = {t.name: numpy_helper.to_array(t) for t in back.graph.initializer}
    for node in quantized.graph.node:
        if node.op_type != "MatMulInteger":
            continue
        marks = json.loads(node.doc_string)
        levels = values[marks["weight"]].astype(np.float32) - ZERO_POINT
        expected = levels * values[marks["scale"]]
        np.testing.assert_array_equal(read[f"{marks['weight']}/dequantized"], expected)
        # within half a level of the float weight it came from
        source = {"a": "w_a", "b": "w_b", "y": "w_out"}[marks["output"]]
        original = numpy_helper.to_array(
            next(t for t in model.graph.initializer if t.name == source)
        )
        assert np.all(np.abs(expected - original) <= 0.5 * values[marks["scale"]] + 1e-7)
    # A w8a8 graph quantizes again another way (read back to float first).
    again = quantize_weights(quantized, WeightsSpec("int8")).model
    assert sum(n.op_type == "MatMulNBits" for n in again.graph.node) == 3
    assert not any(n.op_type == "MatMulInteger" for n in again.graph.node)


def test_block_size_is_refused_for_w8a8():
    with pytest.raises(InputError, match="drop --block-size"):
        WeightsSpec("w8a8", 64)


@pytest.fixture(scope="module")
def codec_lm_w8a8(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("w8a8") / "codec-lm-w8a8"
    quantize_model(codec_lm_dir(), out, WeightsSpec("w8a8"), thresholds=ANY_SPEED)
    return out


def test_a_w8a8_model_loads_batches_and_each_request_equals_its_solo_run(codec_lm_w8a8):
    bundle = Bundle.read(codec_lm_w8a8).validate(("graphs",))
    assert bundle.manifest["quantized"]["kind"] == "w8a8"
    report = json.loads((codec_lm_w8a8 / "quantize_report.json").read_text())
    lm = next(g for g in report["graphs"] if g["name"] == "lm")
    assert lm["decision"].startswith("quantized"), lm["decision"]
    solo = onnx_tts.load(codec_lm_w8a8, cache_dir=None, max_batch=1)
    expected = [solo.synthesize(t, seed=5).samples for t in TEXTS]
    engine = onnx_tts.load(codec_lm_w8a8, cache_dir=None, max_batch=4)
    assert engine.info()["batching"]["batched"]  # the load-time probe finds rows independent
    results = at_once([lambda t=t: engine.synthesize(t, seed=5).samples for t in TEXTS])
    for got, want in zip(results, expected, strict=True):
        assert got.size and np.all(np.isfinite(got))
        np.testing.assert_array_equal(got, want)
    assert engine.stats()["mean_batch"] > 1.0


def test_info_names_it_and_quantize_does_not_do_it_twice(codec_lm_w8a8, tmp_path):
    command = [sys.executable, "-m", "onnx_tts.cli"]
    info = subprocess.run(
        [*command, "info", "--model", str(codec_lm_w8a8), "--cache-dir", "none", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    kinds = {r: g["weights"] for r, g in json.loads(info.stdout)["graphs"].items()}
    assert kinds["lm"].startswith("w8a8 (MatMulInteger") and kinds["encoder"] == "float32"
    again = subprocess.run(
        [*command, "quantize", str(codec_lm_w8a8), str(tmp_path / "again"), "--weights", "w8a8"],
        capture_output=True,
        text=True,
    )
    assert again.returncode == 2 and "already quantized (w8a8" in again.stderr, again.stderr
    assert "Traceback" not in again.stderr and not (tmp_path / "again").exists()
    refused = subprocess.run(
        [*command, "quantize", str(codec_lm_dir()), str(tmp_path / "b"), "--weights", "w8a8",
         "--block-size", "64"],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert refused.returncode == 2 and "drop --block-size" in refused.stderr
    assert not (tmp_path / "b").exists()

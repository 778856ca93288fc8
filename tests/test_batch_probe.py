"""An LM whose kernels compute a lone row by another path than a row among others (ONNX
Runtime's MatMulNBits on CPUs without VNNI: a vector times the weights for one row, a matrix
product, whose rows agree bit for bit for any count from two up, otherwise) still batches:
the load-time probe finds that steps at least two rows wide are invariant, and a lone request
then steps beside a spare row, so its audio is the same alone and among others."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

import onnx_tts

LONE_ROW_SCALE = 5.0


def _lone_row_path(converted: Path) -> None:
    """Give the LM a path of its own for a step of one row: its logits move (by
    LONE_ROW_SCALE x sin(1000 x logit), which reorders them) when the batch is one row wide:
    what a kernel with a separate one-row code path does, in a size that changes tokens."""
    path = converted / "onnx" / "language_model.onnx"
    model = onnx.load(str(path))
    graph = model.graph
    logits = next(o for o in graph.output if o.name == "logits")
    producer = next(n for n in graph.node if "logits" in n.output)
    producer.output[list(producer.output).index("logits")] = "logits_shared_path"
    source = graph.input[0].name
    graph.initializer.extend(
        [
            helper.make_tensor("lone_index", TensorProto.INT64, [], [0]),
            helper.make_tensor("lone_one", TensorProto.INT64, [], [1]),
            helper.make_tensor("lone_scale", TensorProto.FLOAT, [], [LONE_ROW_SCALE]),
            helper.make_tensor("lone_freq", TensorProto.FLOAT, [], [1000.0]),
        ]
    )
    graph.node.extend(
        [
            helper.make_node("Shape", [source], ["lone_shape"]),
            helper.make_node("Gather", ["lone_shape", "lone_index"], ["lone_rows"]),
            helper.make_node("Equal", ["lone_rows", "lone_one"], ["lone_is_one"]),
            helper.make_node("Cast", ["lone_is_one"], ["lone_flag"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["logits_shared_path", "lone_freq"], ["lone_fast"]),
            helper.make_node("Sin", ["lone_fast"], ["lone_wave"]),
            helper.make_node("Mul", ["lone_wave", "lone_scale"], ["lone_wiggle"]),
            helper.make_node("Mul", ["lone_flag", "lone_wiggle"], ["lone_add"]),
            helper.make_node("Add", ["logits_shared_path", "lone_add"], [logits.name]),
        ]
    )
    for sidecar in path.parent.glob("language_model.onnx_data"):
        sidecar.unlink()
    onnx.save_model(
        model, str(path), save_as_external_data=True, location="language_model.onnx_data"
    )


def _load(model: Path, max_batch: int) -> onnx_tts.Engine:
    return onnx_tts.load(model, cache_dir=None, threads=1, max_batch=max_batch, kv="inplace")


def test_a_lone_row_steps_beside_a_spare_one_and_batches_exactly(tmp_path, voice_wav):
    from export import synthetic_chatterbox as synth
    from onnx_tts.tools.convert import convert_bundle_inplace_kv

    source, converted = tmp_path / "source", tmp_path / "converted"
    synth.export(synth.SyntheticConfig(variant="turbo", precisions=("fp32",)), source)
    convert_bundle_inplace_kv(source, converted, check=False)
    _lone_row_path(converted)
    texts = ["Hi.", "A longer sentence, so that the rows differ in length.", "One two.", "Bye."]
    with _load(converted, max_batch=1) as one_row:  # every step one row wide
        narrow = [
            one_row.synthesize(t, voice=voice_wav, seed=i).samples for i, t in enumerate(texts)
        ]
    with _load(converted, max_batch=4) as batched:
        assert batched.info()["batching"]["batched"]
        assert batched.scheduler.slots is not None and batched.scheduler.slots.min_span == 2
        alone = [
            batched.synthesize(t, voice=voice_wav, seed=i).samples for i, t in enumerate(texts)
        ]
        with ThreadPoolExecutor(4) as pool:
            together = list(
                pool.map(
                    lambda i: batched.synthesize(texts[i], voice=voice_wav, seed=i).samples,
                    range(4),
                )
            )
        assert batched.stats()["mean_batch"] > 1.0
    assert all(np.array_equal(a, b) for a, b in zip(alone, together, strict=True))
    # (the lone-row path is real: a request stepped one row wide comes out otherwise)
    assert any(not np.array_equal(a, n) for a, n in zip(alone, narrow, strict=True))


def test_a_model_whose_rows_agree_alone_keeps_single_row_steps():
    from tests.conftest import codec_lm_dir

    with _load(codec_lm_dir(), max_batch=4) as engine:
        assert engine.info()["batching"]["batched"]
        assert engine.scheduler.slots is not None and engine.scheduler.slots.min_span == 1

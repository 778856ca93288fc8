"""onnx_tts.tools.convert: Concat-KV LMs rewritten to GroupQueryAttention (in-place KV cache)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from export import synthetic_chatterbox as synth
from onnx_tts.errors import InputError, ModelError
from onnx_tts.families.chatterbox import FAMILY_TURBO
from onnx_tts.session import KVCache, Session, SessionOptions
from onnx_tts.tools.convert import (
    compare_logits,
    convert_bundle_inplace_kv,
    convert_inplace_kv,
    main,
)
from tests import graphs

LM = "language_model"


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Synthetic Chatterbox bundles: GPT-2 style Turbo, Llama style original with and without
    LM position_ids, and a Turbo with inline weights."""
    root = tmp_path_factory.mktemp("convert-bundles")
    configs = {
        "turbo": synth.SyntheticConfig(variant="turbo", precisions=("fp32", "fp16", "q4")),
        "original": synth.SyntheticConfig(variant="original", precisions=("fp32", "fp16")),
        "original-nopos": synth.SyntheticConfig(
            variant="original", lm_position_ids=False, precisions=("fp32",)
        ),
        "turbo-inline": synth.SyntheticConfig(
            variant="turbo", precisions=("fp32",), external_data=False
        ),
    }
    out = {}
    for name, config in configs.items():
        out[name] = root / name
        synth.export(config, out[name])
    return out


def _lm(bundle: Path, precision: str = "fp32") -> Path:
    return bundle / "onnx" / f"{LM}{synth.PRECISION_SUFFIX[precision]}.onnx"


def _io(path: Path) -> tuple[dict[str, int], dict[str, int]]:
    model = onnx.load(str(path), load_external_data=False)
    inputs = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    outputs = {o.name: o.type.tensor_type.elem_type for o in model.graph.output}
    return inputs, outputs


def _assert_drop_in(source: Path, converted: Path, layers: int) -> None:
    """Same inputs and outputs (names and dtypes) plus the two int32 length inputs; every
    present output now comes from GroupQueryAttention, none from Concat."""
    source_in, source_out = _io(source)
    conv_in, conv_out = _io(converted)
    assert {k: v for k, v in conv_in.items() if k in source_in} == source_in
    assert set(conv_in) - set(source_in) == {"seqlens_k", "total_sequence_length"}
    assert conv_in["seqlens_k"] == conv_in["total_sequence_length"] == TensorProto.INT32
    assert conv_out == source_out
    model = onnx.load(str(converted), load_external_data=False)
    producers = {o: n for n in model.graph.node for o in n.output}
    gqa = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == layers
    assert all(n.domain == "com.microsoft" for n in gqa)
    for name in conv_out:
        if name.startswith("present."):
            assert producers[name].op_type == "GroupQueryAttention"
    assert not any(n.op_type == "Softmax" for n in model.graph.node)
    assert model.ir_version == 10
    assert any(o.domain == "com.microsoft" for o in model.opset_import)


CASES = [
    ("turbo", "fp32"),
    ("turbo", "fp16"),
    ("turbo", "q4"),
    ("original", "fp32"),
    ("original", "fp16"),
    ("original-nopos", "fp32"),
]


@pytest.mark.parametrize(("name", "precision"), CASES)
def test_converted_synthetic_lm_matches_source(bundles, tmp_path, name, precision):
    source = _lm(bundles[name], precision)
    report = convert_inplace_kv(source, tmp_path / "lm.onnx")
    assert report.destination == tmp_path / "lm.onnx"
    _assert_drop_in(source, report.destination, layers=2)
    assert [layer.num_heads for layer in report.layers] == [4, 4]
    assert all(layer.scale == pytest.approx(0.25) for layer in report.layers)  # 1/sqrt(16)
    check = report.check
    assert check is not None and check.decode_steps == 20
    # fp32 graphs agree to float rounding; fp16 ones within half-precision noise.
    limit = 1e-4 if precision in ("fp32", "q4") else 2e-2
    assert check.max_abs_diff_unmasked <= limit * max(1.0, check.typical_abs_logit)
    # The source's KV dtype is kept: the original fp16 export runs the fp16 kernel.
    expected_kv = "float16" if (name, precision) == ("original", "fp16") else "float32"
    assert report.kv_dtype == expected_kv
    # Positions come from attention_mask when the LM has no position_ids: still read.
    assert ("attention_mask" in report.unused_inputs) == (name != "original-nopos")


def _source_logits(source: Path, steps: list[dict], batch: int) -> list[np.ndarray]:
    """Plain onnxruntime, numpy past tensors fed back (the published scripts' loop)."""
    session = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    inputs = {i.name: i for i in session.get_inputs()}
    past = {
        n: np.zeros((batch, i.shape[1], 0, i.shape[3]), np.float32)
        for n, i in inputs.items()
        if n.startswith("past_key_values.")
    }
    results, length = [], 0
    for feeds in steps:
        new = feeds["inputs_embeds"].shape[1]
        full = dict(feeds, **past, attention_mask=np.ones((batch, length + new), np.int64))
        if "position_ids" in inputs:
            full["position_ids"] = np.tile(np.arange(length, length + new), (batch, 1))
        out = dict(zip(names, session.run(None, full), strict=True))
        results.append(out["logits"])
        past = {n: out[n.replace("past_key_values.", "present.")] for n in past}
        length += new
    return results


@pytest.mark.parametrize("name", ["turbo", "original", "original-nopos"])
def test_inplace_cache_is_one_buffer_and_batch_of_two_matches(bundles, tmp_path, name):
    """Independent of the converter's own check: batch 2 (classifier-free guidance runs so),
    source on onnxruntime with numpy KV vs converted on KVCache('inplace')."""
    source = _lm(bundles[name])
    converted = convert_inplace_kv(source, tmp_path / "lm.onnx", check=False).destination
    rng = np.random.default_rng(5)
    steps = [{"inputs_embeds": rng.standard_normal((2, 11, 64)).astype(np.float32)}]
    steps += [
        {"inputs_embeds": rng.standard_normal((2, 1, 64)).astype(np.float32)} for _ in range(15)
    ]
    expected = _source_logits(source, steps, batch=2)

    session = Session(converted, SessionOptions(intra_op_threads=1))
    cache = KVCache(session, "inplace", batch_size=2, capacity=64)
    buffers = cache.past_data_ptrs()
    for feeds, want in zip(steps, expected, strict=True):
        new = feeds["inputs_embeds"].shape[1]
        full = dict(feeds, attention_mask=np.ones((2, cache.length + new), np.int64))
        if session.input("position_ids") is not None:
            full["position_ids"] = np.tile(np.arange(cache.length, cache.length + new), (2, 1))
        logits = cache.step(full, output_names=["logits"])["logits"]
        np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-4)
        assert cache.present_data_ptrs() == buffers  # written into the bound buffers
    assert cache.length == 26 and cache.past_data_ptrs() == buffers


def test_converted_bundle_is_a_drop_in_for_the_chatterbox_adapter(bundles, tmp_path):
    """Converting a model directory converts every language_model*.onnx, links the rest, and
    the result loads as the same family and speaks the same audio (greedy decoding) in chain
    and in in-place mode, one-shot and streamed."""
    import soundfile

    import onnx_tts
    from tests.conftest import speechlike

    voice = tmp_path / "voice.wav"
    soundfile.write(voice, speechlike(3.0), 24000)
    converted = tmp_path / "turbo-gqa"
    reports = convert_bundle_inplace_kv(bundles["turbo"], converted, check_steps=3)
    assert sorted(r.destination.name for r in reports) == [
        f"{LM}.onnx",
        f"{LM}_fp16.onnx",
        f"{LM}_q4.onnx",
    ]
    assert all(r.destination.parent == converted / "onnx" for r in reports)
    source_files = sorted(p.relative_to(bundles["turbo"]) for p in bundles["turbo"].rglob("*"))
    assert sorted(p.relative_to(converted) for p in converted.rglob("*")) == source_files
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left
    tokenizer = converted / "tokenizer.json"
    assert tokenizer.read_bytes() == (bundles["turbo"] / "tokenizer.json").read_bytes()

    text = "Hello there. This is the second sentence!"
    audio = {}
    runs = (
        ("source", bundles["turbo"], "chain"),
        ("chain", converted, "chain"),
        ("inplace", converted, "inplace"),
        ("default", converted, None),
    )
    for key, bundle, kv in runs:
        engine = onnx_tts.load(model=bundle, kv=kv, cache_dir=None, threads=1)
        assert engine.info()["family"] == FAMILY_TURBO
        audio[key] = engine.synthesize(text, voice=voice).samples
        if key == "default":  # a converted LM runs in place unless told otherwise
            assert engine.info()["kv_mode"] == "inplace"
            streamed = np.concatenate(list(engine.stream(text, voice=voice)))
            assert streamed.shape == audio["source"].shape
    assert audio["source"].size > 24000
    for key in ("chain", "inplace", "default"):
        np.testing.assert_array_equal(audio[key], audio["source"])
    with pytest.raises(onnx_tts.InputError, match="convert it once"):
        onnx_tts.load(model=bundles["turbo"], kv="inplace", cache_dir=None)


def test_bundle_conversion_is_all_or_nothing(bundles, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(bundles["turbo-inline"], broken)
    _edit_lm(bundles["turbo-inline"], broken / "onnx" / f"{LM}.onnx", _softcap)
    with pytest.raises(ModelError, match="Tanh"):
        convert_bundle_inplace_kv(broken, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken"]
    with pytest.raises(InputError, match="already exists"):
        convert_bundle_inplace_kv(bundles["turbo"], broken)


def test_external_data_follows_the_source(bundles, tmp_path):
    sidecar_report = convert_inplace_kv(_lm(bundles["turbo"]), tmp_path, check=False)
    assert sidecar_report.destination == tmp_path / f"{LM}.onnx"  # a directory target
    assert sidecar_report.external_data
    assert (tmp_path / f"{LM}.onnx_data").stat().st_size > 100_000
    assert (tmp_path / f"{LM}.onnx").stat().st_size < 100_000

    inline = tmp_path / "inline"
    inline.mkdir()
    report = convert_inplace_kv(_lm(bundles["turbo-inline"]), inline / "lm.onnx", check=False)
    assert not report.external_data
    assert sorted(p.name for p in inline.iterdir()) == ["lm.onnx"]
    # Both files run: the converted graphs are complete on their own.
    for path in (sidecar_report.destination, report.destination):
        assert "GroupQueryAttention" in {n.op_type for n in onnx.load(str(path)).graph.node}


# --------------------------------------------------------------------------------------
# Hugging Face exports (the optimum layout, export/hf_causal_lm.py): input_ids, SDPA-style
# scaling, repeat_kv for GQA
# --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def optimum_exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    from export.hf_causal_lm import export_with_past

    root = tmp_path_factory.mktemp("optimum")
    torch.manual_seed(0)
    models = {
        "gpt2": GPT2LMHeadModel(
            GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=300, n_positions=256)
        ),
        "llama-gqa": LlamaForCausalLM(
            LlamaConfig(
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                hidden_size=64,
                intermediate_size=128,
                vocab_size=300,
                max_position_embeddings=256,
            )
        ),
    }
    out = {}
    for name, model in models.items():
        out[name] = export_with_past(model.eval(), root / name)
    return out


@pytest.mark.parametrize(("name", "kv_heads"), [("gpt2", 4), ("llama-gqa", 2)])
def test_optimum_exports_convert(optimum_exports, tmp_path, name, kv_heads):
    source = optimum_exports[name]
    report = convert_inplace_kv(source, tmp_path / "model.onnx")
    _assert_drop_in(source, report.destination, layers=2)
    assert {(layer.num_heads, layer.kv_num_heads) for layer in report.layers} == {(4, kv_heads)}
    assert all(layer.scale == pytest.approx(0.25) for layer in report.layers)
    assert report.check is not None and report.check.max_abs_diff <= 1e-4
    # A second, independent comparison with a batch of two and another token sequence.
    again = compare_logits(source, report.destination, batch_size=2, seed=9, decode_steps=5)
    assert again.max_abs_diff <= 1e-4


# --------------------------------------------------------------------------------------
# Graphs that must be refused, with nothing written
# --------------------------------------------------------------------------------------
def _edit_lm(bundle: Path, target: Path, edit) -> Path:
    model = onnx.load(str(_lm(bundle)))
    edit(model.graph)
    model.ir_version = 10
    onnx.save(model, str(target))
    return target


def _insert_before_softmax(graph: onnx.GraphProto, op_type: str) -> None:
    softmax = next(n for n in graph.node if n.op_type == "Softmax")
    position = list(graph.node).index(softmax)
    graph.node.insert(position, helper.make_node(op_type, [softmax.input[0]], ["capped"]))
    softmax.input[0] = "capped"


def _softcap(graph: onnx.GraphProto) -> None:
    _insert_before_softmax(graph, "Tanh")


def _use_past_length(graph: onnx.GraphProto) -> None:
    """logits += 0 * len(past): a live read of the past's shape outside attention."""
    graph.initializer.append(numpy_helper.from_array(np.array([2], np.int64), "axis2"))
    graph.initializer.append(numpy_helper.from_array(np.array([3], np.int64), "axis3"))
    graph.initializer.append(numpy_helper.from_array(np.float32(0.0), "zero"))
    logits = next(n for n in graph.node if "logits" in n.output)
    logits.output[0] = "logits_before"
    graph.node.extend(
        [
            helper.make_node("Shape", ["past_key_values.0.key"], ["past_shape"]),
            helper.make_node("Slice", ["past_shape", "axis2", "axis3"], ["past_len"]),
            helper.make_node("Cast", ["past_len"], ["past_len_f"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["past_len_f", "zero"], ["nothing"]),
            helper.make_node("Add", ["logits_before", "nothing"], ["logits"]),
        ]
    )


def _assert_refused(source: Path, target: Path, *patterns: str) -> None:
    before = sorted(p.name for p in target.parent.iterdir())
    with pytest.raises(ModelError) as caught:
        convert_inplace_kv(source, target)
    for pattern in patterns:
        assert pattern in str(caught.value)
    assert sorted(p.name for p in target.parent.iterdir()) == before  # no output, no temp dir


def test_softcapped_scores_are_refused(bundles, tmp_path):
    source = _edit_lm(bundles["turbo-inline"], tmp_path / "src.onnx", _softcap)
    out = tmp_path / "out"
    out.mkdir()
    _assert_refused(source, out / "lm.onnx", "layer 0", "Tanh")


def test_attention_without_causal_mask_is_refused(tmp_path):
    """tests/graphs.concat_lm attends to every token of the prefill: the probe run sees that
    the block is not causal attention, so a GroupQueryAttention would change its output."""
    source = graphs.concat_lm(tmp_path / "src.onnx")
    out = tmp_path / "out"
    out.mkdir()
    _assert_refused(source, out / "lm.onnx", "layer 0", "not causal")


def test_reading_the_past_length_outside_attention_is_refused(bundles, tmp_path):
    source = _edit_lm(bundles["turbo-inline"], tmp_path / "src.onnx", _use_past_length)
    out = tmp_path / "out"
    out.mkdir()
    _assert_refused(source, out / "lm.onnx", "past_key_values.0.key", "outside attention")


def test_other_graphs_are_refused(bundles, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    already = graphs.gqa_lm(tmp_path / "gqa.onnx")
    _assert_refused(already, out / "a.onnx", "already comes from GroupQueryAttention")
    embed = bundles["turbo"] / "onnx" / "embed_tokens.onnx"
    _assert_refused(embed, out / "b.onnx", "past_key_values")


def test_bad_paths_are_input_errors(bundles, tmp_path):
    source = _lm(bundles["turbo"])
    with pytest.raises(InputError, match="not found"):
        convert_inplace_kv(tmp_path / "missing.onnx", tmp_path / "out.onnx")
    with pytest.raises(InputError, match="overwrite the source"):
        convert_inplace_kv(source, source.parent)
    with pytest.raises(InputError, match=r"\.onnx"):
        convert_inplace_kv(source, tmp_path / "out.bin")


def test_command_line(bundles, tmp_path, capsys):
    target = tmp_path / "lm.onnx"
    assert (
        main(["--inplace-kv", str(_lm(bundles["original"])), str(target), "--check-steps", "3"])
        == 0
    )
    printed = capsys.readouterr().out
    assert "2 attention blocks -> GroupQueryAttention" in printed
    assert "3 steps" in printed and target.is_file()

    bad = graphs.concat_lm(tmp_path / "noncausal.onnx")
    assert main(["--inplace-kv", str(bad), str(tmp_path / "bad.onnx")]) == 2
    assert "not causal" in capsys.readouterr().err
    assert not (tmp_path / "bad.onnx").exists()
    with pytest.raises(SystemExit):  # the flag names the conversion; it is required
        main([str(_lm(bundles["original"])), str(tmp_path / "x.onnx")])


def test_runtime_never_imports_the_tools_or_the_onnxruntime_module():
    """A synth loads neither onnx_tts.tools (the converter is offline tooling) nor the Python
    onnxruntime module (one ORT per process: the core loads the wheel's library itself).
    Checked in a fresh interpreter, since this test process imports both."""
    import subprocess
    import sys

    script = (
        "import sys, onnx_tts\n"
        "engine = onnx_tts.load(cache_dir=None, threads=1)\n"
        "assert engine.synthesize('Hi there.').samples.size > 0\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'onnxruntime'"
        " or m.startswith('onnx_tts.tools')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300
    )
    assert done.stdout.strip() == "[]"


def test_converter_probe_runs_on_the_session_core_not_the_onnxruntime_module(tmp_path):
    """The probe and the logits check go through onnx_tts.session: converting in a fresh
    interpreter leaves the Python onnxruntime module unimported."""
    import subprocess
    import sys

    source = graphs.concat_lm(tmp_path / "src.onnx")
    script = (
        "import sys\n"
        "from onnx_tts.tools.convert import main\n"
        f"code = main(['--inplace-kv', {str(source)!r}, {str(tmp_path / 'out.onnx')!r}])\n"
        "print(code, 'onnxruntime' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300
    )
    # concat_lm is not causal: the probe runs it and refuses it, exit 2, one line
    assert done.stdout.split() == ["2", "False"]
    assert "not causal" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_onnx_tts_convert_command_passes_its_arguments_through(bundles, tmp_path, capsys):
    from onnx_tts.cli import main as cli_main

    target = tmp_path / "lm.onnx"
    source = str(_lm(bundles["original"]))
    assert cli_main(["convert", "--inplace-kv", source, str(target), "--check-steps", "2"]) == 0
    assert "2 attention blocks -> GroupQueryAttention" in capsys.readouterr().out
    bad = graphs.concat_lm(tmp_path / "noncausal.onnx")
    assert cli_main(["convert", "--inplace-kv", str(bad), str(tmp_path / "bad.onnx")]) == 2
    assert capsys.readouterr().err.startswith("onnx-tts: error: layer 0")
    with pytest.raises(SystemExit) as usage:
        cli_main(["convert", "--help"])
    assert usage.value.code == 0 and "--inplace-kv" in capsys.readouterr().out

"""`onnx-tts quantize`: the output of every family loads as the same family through
`onnx_tts.load`, its report's agreement numbers are measured (and respond to what was done),
it composes with `convert --inplace-kv` in both orders, the published q8 / q4 Chatterbox
variants run in place and batched, and bad inputs are one clear error with nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import onnx_tts
from export import synthetic_chatterbox as synth
from onnx_tts.bundle import Bundle, write_bundle
from onnx_tts.errors import InputError, ModelError
from onnx_tts.tools.convert import convert_bundle_inplace_kv
from onnx_tts.tools.quantize import (
    REPORT,
    Thresholds,
    WeightsSpec,
    dequantize_matmul_nbits,
    quantize_model,
    quantize_weights,
)
from onnx_tts.tools.quantize.agreement import compare_with_cache
from tests import graphs
from tests.conftest import at_once, codec_lm_dir

ANY_SPEED = Thresholds(max_speed_ratio=1e9)  # decisions by agreement alone (timing is noisy)
TEXT = "Hello there, how are you?"


def _report(out: Path) -> dict:
    return json.loads((out / REPORT).read_text())


def _graph(report: dict, name: str) -> dict:
    return next(g for g in report["graphs"] if g["name"] == name)


def _nbits(path: Path) -> list[onnx.NodeProto]:
    model = onnx.load(str(path), load_external_data=False)
    return [n for n in model.graph.node if n.op_type == "MatMulNBits"]


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


# -- the measuring itself -----------------------------------------------------------------------
def _with_logits(source: Path, target: Path, op: str, constant: float | None = None) -> Path:
    """`source` with its logits passed through `op` (Add of a constant, Neg, Identity)."""
    model = onnx.load(str(source))
    for node in model.graph.node:
        node.output[:] = ["raw_logits" if o == "logits" else o for o in node.output]
    inputs = ["raw_logits"]
    if constant is not None:
        model.graph.initializer.append(
            numpy_helper.from_array(np.array(constant, np.float32), "shift")
        )
        inputs.append("shift")
    model.graph.node.append(helper.make_node(op, inputs, ["logits"]))
    onnx.save(model, str(target))
    return target


def test_agreement_numbers_are_measured(tmp_path):
    """Known differences come out as such: identical graphs agree exactly, a constant shift
    of every logit is that max |diff| with the argmax unchanged, negated logits have cosine
    -1 and (almost) no argmax in common."""
    source = graphs.gqa_lm(tmp_path / "lm.onnx")
    same = compare_with_cache(source, source, prefill_tokens=8, steps=20)
    logits = same.outputs[0]
    assert (logits.max_abs_diff, logits.top1) == (0.0, 1.0)
    assert logits.cosine_min == pytest.approx(1.0, abs=1e-12)
    assert same.prefill_tokens == 8 and same.decode_steps == 20
    shifted = compare_with_cache(
        source,
        _with_logits(source, tmp_path / "shift.onnx", "Add", 0.5),
        prefill_tokens=8,
        steps=20,
    ).outputs[0]
    assert shifted.max_abs_diff == pytest.approx(0.5, abs=1e-5) and shifted.top1 == 1.0
    assert shifted.cosine_min < 1.0
    negated = compare_with_cache(
        source, _with_logits(source, tmp_path / "neg.onnx", "Neg"), prefill_tokens=8, steps=20
    ).outputs[0]
    assert negated.cosine_mean == pytest.approx(-1.0, abs=1e-6)
    assert negated.top1 < 0.2


def test_dequantized_weights_are_the_ones_the_graph_computes_with():
    """MatMulNBits read back as float gives the weights the export recipe reads back (the
    shipped voice's 8-bit LM), and re-quantizing them to 8 bits gives the same codes."""
    from export.onnx_graphs import dequantized_initializers

    lm = Path(onnx_tts.__file__).parent / "models" / "voice" / "lm.onnx"
    model = onnx.load(str(lm))
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    expected = dequantized_initializers(values)
    float_model = onnx.ModelProto()
    float_model.CopyFrom(model)
    assert dequantize_matmul_nbits(float_model) == len(_nbits_in(model))
    weights = {t.name: numpy_helper.to_array(t) for t in float_model.graph.initializer}
    for name, array in weights.items():
        if name.endswith("/dequantized"):
            base = name.removesuffix("_Q8/dequantized")
            np.testing.assert_array_equal(array, expected[base])
    again = quantize_weights(model, WeightsSpec("int8")).model
    before = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    after = {t.name: numpy_helper.to_array(t) for t in again.graph.initializer}
    codes = [n for n in before if n.endswith("_Q8")]
    assert codes
    for name in codes:
        twin = f"{name.removesuffix('_Q8')}_Q8/dequantized_Q8"
        np.testing.assert_array_equal(after[twin], before[name])


def _nbits_in(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == "MatMulNBits"]


# -- bundles ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def codec_lm_int8(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("quantized") / "codec-lm-int8"
    quantize_model(codec_lm_dir(), out, WeightsSpec("int8"), thresholds=ANY_SPEED)
    return out


def test_quantized_bundle_loads_as_the_same_family(codec_lm_int8):
    source = Bundle.read(codec_lm_dir())
    bundle = Bundle.read(codec_lm_int8).validate(("graphs",))  # every sha256 matches
    assert bundle.family == "codec-lm"
    assert bundle.section("graphs") == source.section("graphs")
    assert bundle.manifest["quantized"]["kind"] == "int8"
    for role in ("lm", "lm_concat"):
        nodes = _nbits(bundle.graph_path(role))
        assert nodes and all(_attrs(n)["bits"] == 8 for n in nodes)
        assert all(
            _attrs(n)["block_size"] == 32 and _attrs(n)["accuracy_level"] == 4 for n in nodes
        )
    assert not _nbits(bundle.graph_path("encoder"))  # runs once per voice: left float
    engine = onnx_tts.load(codec_lm_int8, cache_dir=None, threads=1, max_batch=4)
    assert engine.info()["family"] == "codec-lm"
    assert engine.info()["batching"]["batched"]  # MatMulNBits rows do not depend on each other
    audio = engine.synthesize(TEXT, seed=1).samples
    assert audio.size and np.all(np.isfinite(audio))
    size = sum(p.stat().st_size for p in codec_lm_int8.iterdir())
    assert size < 0.5 * sum(p.stat().st_size for p in codec_lm_dir().iterdir())


def test_report_measures_each_graph_and_int4_agrees_less_than_int8(codec_lm_int8, tmp_path):
    """The report's numbers come from running the graphs: an independent onnxruntime run of
    the float and quantized lm_concat agrees with them, and int4 agrees less than int8."""
    report = _report(codec_lm_int8)
    assert report["family"] == "codec-lm" and report["weights"]["bits"] == 8
    lm = _graph(report, "lm_concat")
    assert lm["quantized"] and lm["matmuls"]["quantized"] > 0
    logits = lm["agreement"]["lm_concat"]["outputs"][0]
    assert lm["agreement"]["lm_concat"]["decode_steps"] >= 20
    assert 0 < logits["max_abs_diff"] < logits["typical_abs"]
    assert lm["bytes"]["quantized"] < lm["bytes"]["float"]
    assert _graph(report, "encoder")["quantized"] is False

    def logits_of(path: Path, steps: list[np.ndarray]) -> np.ndarray:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        past = {
            i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
            for i in session.get_inputs()
            if i.name.startswith("past_key_values.")
        }
        names = [o.name for o in session.get_outputs()]
        out, length = [], 0
        for embeds in steps:
            new = embeds.shape[1]
            feeds = {"inputs_embeds": embeds, **past}
            feeds["attention_mask"] = np.ones((1, length + new), np.int64)
            feeds["position_ids"] = np.arange(length, length + new, dtype=np.int64)[None]
            values = dict(zip(names, session.run(None, feeds), strict=True))
            out.append(values["logits"].ravel())
            past = {n: values[n.replace("past_key_values.", "present.")] for n in past}
            length += new
        return np.concatenate(out)

    rng = np.random.default_rng(7)
    steps = [rng.standard_normal((1, 8, 256)).astype(np.float32)]
    steps += [rng.standard_normal((1, 1, 256)).astype(np.float32) for _ in range(20)]
    a = logits_of(codec_lm_dir() / "lm_concat.onnx", steps)
    b = logits_of(codec_lm_int8 / "lm_concat.onnx", steps)
    independent = float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))
    assert independent == pytest.approx(logits["cosine_mean"], abs=2e-4)

    int4 = tmp_path / "int4"
    quantize_model(codec_lm_dir(), int4, WeightsSpec("int4"), thresholds=Thresholds(0.0, 0.0, 1e9))
    lm4 = _graph(_report(int4), "lm_concat")["agreement"]["lm_concat"]["outputs"][0]
    assert lm4["cosine_mean"] < logits["cosine_mean"]
    assert lm4["max_abs_diff"] > logits["max_abs_diff"]
    assert _nbits(int4 / "lm_concat.onnx")[0].attribute  # 4-bit nodes
    assert {_attrs(n)["bits"] for n in _nbits(int4 / "lm_concat.onnx")} == {4}


def test_a_graph_that_disagrees_stays_float(tmp_path):
    """With a bar no quantized graph can pass, every graph is written float and says why."""
    out = tmp_path / "strict"
    report = quantize_model(
        codec_lm_dir(), out, WeightsSpec("int4"), thresholds=Thresholds(1.0, 1.0, 1e9)
    )
    assert not any(r.kept for r in report.results)
    for name in ("lm", "lm_concat", "vocoder"):
        assert (out / f"{name}.onnx").read_bytes() == (codec_lm_dir() / f"{name}.onnx").read_bytes()
    assert "outputs disagree" in _graph(_report(out), "lm")["decision"]
    assert onnx_tts.load(out, cache_dir=None, threads=1).info()["family"] == "codec-lm"


def test_codec_lm_composes_with_convert_in_either_order(tmp_path):
    """quantize -> convert and convert -> quantize give the same in-place, batched model."""
    converted = tmp_path / "converted"
    convert_bundle_inplace_kv(codec_lm_dir(), converted, check_steps=20)
    first = tmp_path / "convert-then-quantize"
    quantize_model(converted, first, WeightsSpec("int8"), thresholds=ANY_SPEED)
    quantized = tmp_path / "quantized"
    quantize_model(codec_lm_dir(), quantized, WeightsSpec("int8"), thresholds=ANY_SPEED)
    second = tmp_path / "quantize-then-convert"
    convert_bundle_inplace_kv(quantized, second, check_steps=20)
    audio = []
    for directory in (first, second):
        Bundle.read(directory).validate(("graphs",))
        assert _nbits(directory / "lm_concat.onnx")
        engine = onnx_tts.load(
            directory, lm_graph="lm_concat", cache_dir=None, threads=1, max_batch=4
        )
        assert engine.info()["kv_mode"] == "inplace" and engine.info()["batching"]["batched"]
        audio.append(engine.synthesize(TEXT, seed=3).samples)
    np.testing.assert_array_equal(audio[0], audio[1])


# -- MOSS-TTS-Nano ------------------------------------------------------------------------------
def _external_refs(path: Path) -> list[tuple[str, int, int]]:
    model = onnx.load(str(path), load_external_data=False)
    refs = []
    for tensor in model.graph.initializer:
        entry = {e.key: e.value for e in tensor.external_data}
        if entry:
            refs.append((entry["location"], int(entry["offset"]), int(entry["length"])))
    return refs


def test_moss_keeps_its_layout_and_shared_weights(moss_models, tmp_path):
    out = tmp_path / "moss-int8"
    report = quantize_model(moss_models, out, WeightsSpec("int8"), thresholds=ANY_SPEED)
    kept = {r.job.name for r in report.results if r.kept}
    assert {"moss_tts_global_shared", "moss_tts_local_shared"} <= kept
    tts = out / "MOSS-TTS-Nano-100M-ONNX"
    names = sorted(p.name for p in (moss_models / "MOSS-TTS-Nano-100M-ONNX").iterdir())
    assert sorted(p.name for p in tts.iterdir()) == names  # same files, same names
    prefill = _external_refs(tts / "moss_tts_prefill.onnx")
    step = _external_refs(tts / "moss_tts_decode_step.onnx")
    assert {loc for loc, *_ in prefill + step} == {"moss_tts_global_shared.data"}
    assert set(prefill) & set(step)  # the same bytes serve both graphs
    stored = {(offset, length) for _, offset, length in prefill + step}
    data = tts / "moss_tts_global_shared.data"
    assert data.stat().st_size == sum(length for _, length in stored)  # each tensor once
    assert _nbits(tts / "moss_tts_decode_step.onnx") and _nbits(
        tts / "moss_tts_local_fixed_sampled_frame.onnx"
    )
    engine = onnx_tts.load(out, cache_dir=None, threads=1)
    assert engine.info()["family"] == "moss-tts-nano"
    assert engine.synthesize("Hello there.", seed=1, max_new_frames=12).samples.shape[1] == 2


def test_moss_composes_with_convert_in_either_order(moss_models, tmp_path):
    converted = tmp_path / "converted"
    convert_bundle_inplace_kv(moss_models, converted)
    first = tmp_path / "convert-then-quantize"
    quantize_model(converted, first, WeightsSpec("int8"), thresholds=ANY_SPEED)
    quantized = tmp_path / "quantized"
    quantize_model(moss_models, quantized, WeightsSpec("int8"), thresholds=ANY_SPEED)
    second = tmp_path / "quantize-then-convert"
    convert_bundle_inplace_kv(quantized, second)
    audio = []
    for directory in (first, second):
        engine = onnx_tts.load(directory, cache_dir=None, threads=1, max_batch=4)
        assert engine.info()["kv_mode"] == "inplace" and engine.info()["batching"]["batched"]
        audio.append(engine.synthesize("Hello there.", seed=2, max_new_frames=12).samples)
    np.testing.assert_array_equal(audio[0], audio[1])


# -- Chatterbox ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def turbo(tmp_path_factory) -> Path:
    """A Turbo stand-in with the float graphs and the published q8 (dynamic int8) and q4
    (MatMulNBits) variants, quantized the way the published files are."""
    root = tmp_path_factory.mktemp("turbo")
    synth.export(synth.SyntheticConfig(variant="turbo", precisions=("fp32", "q8", "q4")), root)
    return root


def test_chatterbox_output_takes_the_published_variant_names(turbo, tmp_path, voice_wav):
    out = tmp_path / "turbo-int4"
    quantize_model(turbo, out, WeightsSpec("int4"), thresholds=Thresholds(0.0, 0.0, 1e9))
    files = sorted(p.name for p in (out / "onnx").iterdir())
    assert "language_model_q4.onnx" in files and "language_model_q4.onnx_data" in files
    assert "language_model.onnx" not in files  # no fp32 LM: the default precision is q4
    assert "speech_encoder.onnx" in files  # left float; every precision falls back to it
    assert not any(name.endswith(("_fp16.onnx", "_quantized.onnx")) for name in files)
    engine = onnx_tts.load(out, cache_dir=None, threads=1)
    assert engine.info()["family"] == "chatterbox-turbo"
    assert engine.info()["precision"] == "q4" and engine.info()["precisions"] == ["q4"]
    assert engine.synthesize("Hello there.", voice=str(voice_wav), seed=0).samples.size


@pytest.mark.parametrize("precision", ["q8", "q4"])
def test_published_quantized_variants_run_in_place_and_batched(
    turbo, tmp_path, voice_wav, precision
):
    """After `convert --inplace-kv`, the published q8 / q4 LMs decode in place with requests
    as rows of one batched step, and every request's audio equals its solo run."""
    converted = tmp_path / "inplace"
    reports = convert_bundle_inplace_kv(turbo, converted, check_steps=20)
    name = f"language_model{synth.PRECISION_SUFFIX[precision]}.onnx"
    report = next(r for r in reports if r.destination.name == name)
    assert any("rows made independent" in note for note in report.notes)
    texts = ["Hello there.", "How are you today?", "Fine, thanks."]
    solo = onnx_tts.load(converted, precision=precision, kv="inplace", max_batch=1, cache_dir=None)
    expected = [solo.synthesize(t, voice=str(voice_wav), seed=5).samples for t in texts]
    engine = onnx_tts.load(
        converted, precision=precision, kv="inplace", max_batch=4, cache_dir=None
    )
    assert engine.info()["kv_mode"] == "inplace" and engine.info()["batching"]["batched"]
    results = at_once(
        [lambda t=t: engine.synthesize(t, voice=str(voice_wav), seed=5).samples for t in texts]
    )
    for got, want in zip(results, expected, strict=True):
        np.testing.assert_array_equal(got, want)
    assert engine.stats()["mean_batch"] > 1.0


# -- refusals -----------------------------------------------------------------------------------
def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_bad_inputs_are_clear_errors_and_write_nothing(tmp_path):
    source = tmp_path / "model"
    shutil.copytree(codec_lm_dir(), source)
    with pytest.raises(InputError, match="inside the model"):
        quantize_model(source, source / "out", WeightsSpec("int8"))
    with pytest.raises(InputError, match="inside the model"):
        quantize_model(source, source, WeightsSpec("int8"))
    (tmp_path / "taken").mkdir()
    with pytest.raises(InputError, match="already exists"):
        quantize_model(source, tmp_path / "taken", WeightsSpec("int8"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelError, match="not a model onnx-tts can quantize"):
        quantize_model(empty, tmp_path / "out", WeightsSpec("int8"))
    with pytest.raises(InputError, match="not a model directory"):
        quantize_model(source / "lm.onnx", tmp_path / "out", WeightsSpec("int8"))
    with pytest.raises(InputError, match="unknown weights kind 'int3'"):
        WeightsSpec("int3")
    with pytest.raises(InputError, match="--block-size"):
        WeightsSpec("int4", 48)
    with pytest.raises(InputError, match="at least 20"):
        quantize_model(source, tmp_path / "out", WeightsSpec("int8"), steps=5)
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []


def _with_erf_in_double(bundle: Path, out: Path) -> Path:
    """The codec-lm bundle whose vocoder computes a Erf in float64 (no CPU kernel)."""
    manifest = {k: v for k, v in Bundle.read(bundle).manifest.items() if k != "sha256"}
    vocoder = onnx.load(str(bundle / "vocoder.onnx"))
    for node in vocoder.graph.node:
        node.output[:] = ["raw_waveform" if o == "waveform" else o for o in node.output]
    vocoder.graph.node.extend(
        [
            helper.make_node("Cast", ["raw_waveform"], ["wide"], to=onnx.TensorProto.DOUBLE),
            helper.make_node("Erf", ["wide"], ["erf"]),
            helper.make_node("Cast", ["erf"], ["waveform"], to=onnx.TensorProto.FLOAT),
        ]
    )
    files = {name: (bundle / name).read_bytes() for name in ("tokenizer.json",)}
    for name in manifest["graphs"].values():
        files[name] = vocoder if name == "vocoder.onnx" else (bundle / name).read_bytes()
    write_bundle(out, manifest, files)
    return out


def test_a_graph_onnx_runtime_cannot_run_on_the_cpu_is_refused(tmp_path):
    source = _with_erf_in_double(codec_lm_dir(), tmp_path / "model")
    with pytest.raises(ModelError, match=r"no CPU kernel for Erf") as error:
        quantize_model(source, tmp_path / "out", WeightsSpec("int8"))
    assert "vocoder" in str(error.value) and "Traceback" not in str(error.value)
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []


def test_command_line(tmp_path, capsys):
    from onnx_tts.cli import main

    out = tmp_path / "out"
    assert (
        main(["quantize", str(codec_lm_dir()), str(out), "--weights", "int8", "--graphs", "lm"])
        == 0
    )
    printed = capsys.readouterr().out
    assert "lm: quantized" in printed and "lm_concat: kept float: not selected" in printed
    assert onnx_tts.load(out, cache_dir=None, threads=1).info()["family"] == "codec-lm"
    assert main(["quantize", str(codec_lm_dir()), str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["quantize", str(codec_lm_dir()), str(tmp_path / "x"), "--graphs", "nope"]) == 2
    assert "--graphs nope" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        main(["quantize", str(codec_lm_dir()), str(tmp_path / "y"), "--weights", "int3"])
    assert usage.value.code == 2
    assert "invalid choice: 'int3'" in capsys.readouterr().err


# -- issue 43: a model that is quantized already; the weights kind in `info` ---------------------
def test_a_model_quantized_already_is_said_so_and_never_claims_a_speed_up(
    codec_lm_int8, tmp_path, capsys
):
    """Quantizing an int8 model again reported "0.55x the float time" and wrote a bit-identical
    copy. A model whose graphs are all quantized as asked is refused with one line saying so;
    in a model quantized in part, those graphs are left as they are and only the others are
    quantized and measured."""
    from onnx_tts.cli import main

    assert main(["quantize", str(codec_lm_int8), str(tmp_path / "again")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is already quantized (int8 (MatMulNBits, blocks of 32" in err[0]
    assert "lm, lm_concat" in err[0] and not (tmp_path / "again").exists()

    part = tmp_path / "lm-only"
    quantize_model(codec_lm_dir(), part, WeightsSpec("int8"), graphs=["lm"], thresholds=ANY_SPEED)
    both = tmp_path / "both"
    report = quantize_model(
        part, both, WeightsSpec("int8"), graphs=["lm", "lm_concat"], thresholds=ANY_SPEED
    )
    lm, concat = _graph(_report(both), "lm"), _graph(_report(both), "lm_concat")
    assert lm["decision"].startswith("left as it is: already int8 (MatMulNBits, blocks of 32")
    assert "float time" not in lm["decision"] and "agreement" not in lm
    assert concat["decision"].startswith("quantized")
    assert (both / "lm.onnx").read_bytes() == (part / "lm.onnx").read_bytes()
    manifest = Bundle.read(both).validate(("graphs",)).manifest
    assert manifest["quantized"]["graphs"] == ["lm", "lm_concat"]
    assert "lm: left as it is" in report.summary()
    # int4 of an int8 graph is a new quantization: read back to float, measured against it
    assert main(["quantize", str(codec_lm_int8), str(tmp_path / "int4"), "--weights", "int4",
                 "--graphs", "lm", "--max-speed-ratio", "1e9"]) == 0  # fmt: skip
    decision = _graph(_report(tmp_path / "int4"), "lm")["decision"]
    assert "float time" in decision and not decision.startswith("left as it is"), decision


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--max-speed-ratio", "nan"),
        ("--max-speed-ratio", "inf"),
        ("--max-speed-ratio", "0"),
        ("--min-cosine", "nan"),
        ("--min-top1", "-0.5"),
        ("--check-steps", "1000000000"),
    ],
)
def test_thresholds_must_be_finite_and_in_range(tmp_path, capsys, flag, value):
    from onnx_tts.cli import main

    assert main(["quantize", str(codec_lm_dir()), str(tmp_path / "out"), flag, value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0] and value.split("0000")[0] in err[0], err
    assert not (tmp_path / "out").exists()


def test_info_shows_the_weights_kind_of_each_graph(codec_lm_int8):
    import subprocess
    import sys

    def info(model: Path) -> tuple[dict, str]:
        command = [sys.executable, "-m", "onnx_tts.cli", "info", "--model", str(model),
                   "--cache-dir", "none"]  # fmt: skip
        as_json = subprocess.run([*command, "--json"], capture_output=True, text=True, check=True)
        text = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        return {r: g["weights"] for r, g in json.loads(as_json.stdout)["graphs"].items()}, text

    int8 = "int8 (MatMulNBits, blocks of 32, int8 compute)"
    quantized, text = info(codec_lm_int8)
    assert quantized["lm"] == int8 and quantized["encoder"] == "float32"
    assert f"[lm] lm.onnx  weights {int8}" in text
    source, _ = info(codec_lm_dir())
    assert set(source.values()) == {"float32"}

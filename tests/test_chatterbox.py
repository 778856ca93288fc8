"""Synthetic Chatterbox bundles (export/synthetic_chatterbox.py) and the layout detector
(onnx_tts/families)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer

from export import synthetic_chatterbox as synth
from onnx_tts.errors import ModelError
from onnx_tts.families import detect
from onnx_tts.families.chatterbox import (
    FAMILY_MULTILINGUAL,
    FAMILY_ORIGINAL,
    FAMILY_TURBO,
    available_precisions,
    inspect_layout,
)
from onnx_tts.graph_io import read_graph_spec
from tests.waiting import wait_until

ALL = ("fp32", "fp16", "q8", "q4", "q4f16")
FAMILY_OF = {
    "turbo": FAMILY_TURBO,
    "original": FAMILY_ORIGINAL,
    "multilingual": FAMILY_MULTILINGUAL,
}


@pytest.fixture(scope="session")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every variant in every precision, plus the original revision without LM position_ids
    and a multilingual one with them."""
    root = tmp_path_factory.mktemp("chatterbox")
    out: dict[str, Path] = {}
    for variant in synth.VARIANTS:
        out[variant] = root / variant
        synth.export(synth.SyntheticConfig(variant=variant), out[variant])
    out["original-nopos"] = root / "original-nopos"
    synth.export(
        synth.SyntheticConfig(variant="original", lm_position_ids=False, precisions=("fp32",)),
        out["original-nopos"],
    )
    out["multilingual-pos"] = root / "multilingual-pos"
    synth.export(
        synth.SyntheticConfig(variant="multilingual", lm_position_ids=True, precisions=("fp32",)),
        out["multilingual-pos"],
    )
    return out


@pytest.fixture()
def small_turbo(tmp_path: Path) -> Path:
    """A fresh fp32-only Turbo bundle that a test may damage."""
    target = tmp_path / "turbo"
    synth.export(synth.SyntheticConfig(variant="turbo", precisions=("fp32",)), target)
    return target


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _np_type(type_string: str) -> type:
    return np.float16 if type_string == "tensor(float16)" else np.float32


# --------------------------------------------------------------------------------------
# Exporter: files, names, dtypes
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", synth.VARIANTS)
def test_file_names_and_sidecars_match_published_layout(bundles, variant):
    onnx_dir = bundles[variant] / "onnx"
    varied = synth.ROLES if variant == "turbo" else ("embed_tokens", "language_model")
    expected = set()
    for role in synth.ROLES:
        for precision in ALL if role in varied else ("fp32",):
            name = f"{role}{synth.PRECISION_SUFFIX[precision]}.onnx"
            expected |= {name, name + "_data"}
    assert {p.name for p in onnx_dir.iterdir()} == expected
    assert (bundles[variant] / "tokenizer.json").is_file()
    assert (bundles[variant] / "default_voice.wav").is_file() == (variant != "turbo")
    # No staging directory is left behind by the atomic write.
    assert not [p for p in bundles[variant].iterdir() if p.name.startswith(".synthetic-")]
    for graph in onnx_dir.glob("*.onnx"):
        model = onnx.load(str(graph), load_external_data=False)
        assert model.ir_version == 10
        assert read_graph_spec(graph).external_data == (graph.name + "_data",)


@pytest.mark.parametrize("variant", synth.VARIANTS)
def test_graph_io_names(bundles, variant):
    onnx_dir = bundles[variant] / "onnx"
    encoder = read_graph_spec(onnx_dir / "speech_encoder.onnx")
    assert encoder.input_names == ("audio_values",)
    assert encoder.output_names == (
        "audio_features",
        "audio_tokens",
        "speaker_embeddings",
        "speaker_features",
    )
    assert encoder.outputs["audio_tokens"].dtype == np.int64
    embed = read_graph_spec(onnx_dir / "embed_tokens.onnx")
    if variant == "turbo":
        assert embed.input_names == ("input_ids",)
    else:
        assert embed.input_names == ("input_ids", "position_ids", "exaggeration")
    assert embed.output_names == ("inputs_embeds",)
    lm = read_graph_spec(onnx_dir / "language_model.onnx")
    head = ("inputs_embeds", "attention_mask")
    head += ("position_ids",) if variant != "multilingual" else ()
    kv = tuple(f"past_key_values.{i}.{k}" for i in range(2) for k in ("key", "value"))
    assert lm.input_names == head + kv
    presents = tuple(f"present.{i}.{k}" for i in range(2) for k in ("key", "value"))
    assert lm.output_names == ("logits", *presents)
    assert lm.outputs["logits"].shape[-1] == (6563 if variant == "turbo" else 8194)
    decoder = read_graph_spec(onnx_dir / "conditional_decoder.onnx")
    assert decoder.input_names == ("speech_tokens", "speaker_embeddings", "speaker_features")
    assert decoder.output_names == ("waveform",)


@pytest.mark.parametrize(
    ("variant", "embeds", "kv", "logits"),
    [
        ("turbo", np.float32, np.float32, np.float32),  # fp16 weights, fp32 I/O
        ("original", np.float16, np.float16, np.float16),  # fp16 end to end
        ("multilingual", np.float32, np.float16, np.float32),  # fp32 embeddings, fp16 KV
    ],
)
@pytest.mark.parametrize("precision", ["fp16", "q4f16"])
def test_fp16_variants_declare_the_mixed_dtypes(bundles, variant, embeds, kv, logits, precision):
    layout = inspect_layout(bundles[variant], precision)
    assert layout.lm.embeds_dtype == embeds
    assert layout.lm.kv.dtype == kv
    assert layout.lm.logits_dtype == logits
    assert layout.graphs["embed_tokens"].outputs["inputs_embeds"].dtype == embeds
    if variant != "turbo":
        assert layout.graphs["embed_tokens"].inputs["exaggeration"].dtype == np.float32


def test_quantized_variants_use_quantized_kernels(bundles):
    def op_types(name: str) -> set[str]:
        model = onnx.load(str(bundles["turbo"] / "onnx" / name), load_external_data=False)
        return {node.op_type for node in model.graph.node}

    assert "MatMulNBits" in op_types("language_model_q4.onnx")
    assert "MatMulNBits" in op_types("language_model_q4f16.onnx")
    assert "MatMulInteger" in op_types("language_model_quantized.onnx")
    assert "MatMulNBits" not in op_types("language_model.onnx")


def test_tokenizers_follow_each_layout(bundles):
    original = Tokenizer.from_file(str(bundles["original"] / "tokenizer.json"))
    ids = original.encode("Hello there, friend.").ids
    assert ids[0] == synth.EXAGGERATION_TOKEN
    assert ids[1] == original.token_to_id("[START]")
    assert ids[-2:] == [0, synth.START_SPEECH_TOKEN]  # [STOP]=0 then start of speech
    assert original.token_to_id("[SPACE]") == 2 and 2 in ids
    assert original.token_to_id("[en]") is None

    multilingual = Tokenizer.from_file(str(bundles["multilingual"] / "tokenizer.json"))
    french = multilingual.encode("[fr]Bonjour").ids
    assert french[2] == multilingual.token_to_id("[fr]")

    turbo = Tokenizer.from_file(str(bundles["turbo"] / "tokenizer.json"))
    encoded = turbo.encode("Well [laugh] fine.")
    assert turbo.token_to_id("[laugh]") in encoded.ids
    assert turbo.decode(encoded.ids) == "Well [laugh] fine."


def test_export_is_deterministic(tmp_path):
    cfg = synth.SyntheticConfig(variant="original", precisions=("fp32",))
    synth.export(cfg, tmp_path / "a")
    synth.export(cfg, tmp_path / "b")
    for name in ("tokenizer.json", "onnx/language_model.onnx_data", "onnx/embed_tokens.onnx"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_inline_weights_option(tmp_path):
    synth.export(
        synth.SyntheticConfig(variant="turbo", precisions=("fp32",), external_data=False), tmp_path
    )
    assert not list((tmp_path / "onnx").glob("*.onnx_data"))
    assert detect(tmp_path).family == FAMILY_TURBO


def test_cli_rejects_bad_arguments(tmp_path):
    with pytest.raises(SystemExit):
        synth.parse_args(["turbo", str(tmp_path), "--precisions", "fp8"])
    with pytest.raises(SystemExit):
        synth.parse_args(["turbo", str(tmp_path), "--no-lm-position-ids"])
    with pytest.raises(SystemExit):
        synth.parse_args(["original", str(tmp_path), "--hidden", "60", "--heads", "8"])
    cfg, out = synth.parse_args(["multilingual", str(tmp_path), "--layers", "3"])
    assert cfg.layers == 3 and out == tmp_path and not cfg.has_lm_position_ids


# --------------------------------------------------------------------------------------
# The graphs run like the real ones
# --------------------------------------------------------------------------------------
def _prefix_and_ids(bundle: Path, variant: str, precision: str):
    layout = inspect_layout(bundle, precision)
    encoder = _session(layout.graphs["speech_encoder"].path)
    embed = _session(layout.graphs["embed_tokens"].path)
    audio = (0.2 * np.sin(np.arange(2 * 24000) / 9.0)).astype(np.float32)[None]
    features, tokens, speaker, mel = encoder.run(None, {"audio_values": audio})
    tokenizer = Tokenizer.from_file(str(layout.tokenizer_path))
    text = "[de]Guten Tag." if variant.startswith("multilingual") else "Good day to you."
    ids = np.array([tokenizer.encode(text).ids], np.int64)
    return layout, encoder, embed, (features, tokens, speaker, mel), ids


def _embed(embed: ort.InferenceSession, layout, ids: np.ndarray, positions: np.ndarray):
    feeds = {"input_ids": ids}
    if layout.embed_has_position_ids:
        feeds["position_ids"] = positions
        feeds["exaggeration"] = np.full((ids.shape[0],), 0.5, np.float32)
    return embed.run(None, feeds)[0]


def _lm_feeds(layout, embeds, total: int, past: dict):
    feeds = {"inputs_embeds": embeds, "attention_mask": np.ones((1, total), np.int64), **past}
    if layout.lm.has_position_ids:
        start = total - embeds.shape[1]
        feeds["position_ids"] = np.arange(start, total, dtype=np.int64)[None]
    return feeds


LOOP_CASES = [
    (name, precision)
    for name in ("turbo", "original", "multilingual")
    for precision in ("fp32", "q4", "fp16")
] + [("original-nopos", "fp32"), ("multilingual-pos", "fp32")]


@pytest.mark.parametrize(("name", "precision"), LOOP_CASES)
def test_chained_kv_greedy_loop_matches_full_recompute(bundles, name, precision):
    """Three greedy steps feeding each step's present.* OrtValues back as past_key_values.*
    give the same logits as one uncached run over the whole sequence (so Concat growth,
    the causal mask and the positions are right)."""
    layout, _, embed, (features, *_), ids = _prefix_and_ids(bundles[name], name, precision)
    assert layout.family == FAMILY_OF[name.split("-")[0]]
    lm = _session(layout.graphs["language_model"].path)
    embeds_type = _np_type(lm.get_inputs()[0].type)
    kv_type = layout.lm.kv.dtype.type
    positions = np.where(ids >= 6561, 0, np.arange(ids.shape[1])[None] - 1).astype(np.int64)
    text_embeds = _embed(embed, layout, ids, positions)
    sequence = [np.concatenate([features, text_embeds.astype(np.float32)], axis=1)]

    empty = np.zeros((1, layout.lm.kv.kv_heads, 0, layout.lm.kv.head_dim), kv_type)
    past = {past: ort.OrtValue.ortvalue_from_numpy(empty) for past, _ in layout.lm.kv.pairs}
    pairs = dict(layout.lm.kv.pairs)
    output_names = [o.name for o in lm.get_outputs()]
    step_logits, generated = [], []
    embeds = sequence[0]
    total = embeds.shape[1]
    for step in range(3):
        feeds = _lm_feeds(layout, embeds.astype(embeds_type), total, {})
        values = {k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in feeds.items()}
        values.update(past)
        outputs = dict(zip(output_names, lm.run_with_ort_values(output_names, values), strict=True))
        logits = outputs["logits"].numpy()[0, -1].astype(np.float32)
        step_logits.append(logits)
        token = int(np.argmax(logits))
        assert token < synth.START_SPEECH_TOKEN or token == synth.STOP_SPEECH_TOKEN
        generated.append(token)
        past = {past_name: outputs[present] for past_name, present in pairs.items()}
        assert past["past_key_values.0.key"].shape()[2] == total
        embeds = _embed(embed, layout, np.array([[token]], np.int64), np.array([[step + 1]]))
        sequence.append(embeds.astype(np.float32))
        total += 1

    # One uncached run over prefix + the first two generated tokens.
    full = np.concatenate(sequence[:3], axis=1)
    no_past = {past: empty for past, _ in layout.lm.kv.pairs}
    logits = lm.run(["logits"], _lm_feeds(layout, full.astype(embeds_type), full.shape[1], no_past))
    full_logits = logits[0][0].astype(np.float32)
    tolerance = 2e-2 if embeds_type is np.float16 or kv_type is np.float16 else 1e-4
    for offset, cached in enumerate(step_logits):
        row = full_logits[sequence[0].shape[1] - 1 + offset]
        np.testing.assert_allclose(cached, row, atol=tolerance * max(1.0, np.abs(row).max()))
        assert int(np.argmax(row)) == generated[offset]


@pytest.mark.parametrize("variant", synth.VARIANTS)
def test_speech_encoder_and_decoder_shapes(bundles, variant):
    layout, _, _, (features, tokens, speaker, mel), _ = _prefix_and_ids(
        bundles[variant], variant, "fp32"
    )
    assert tokens.shape == (1, 2 * 24000 // 960) and tokens.dtype == np.int64
    assert tokens.min() >= 0 and tokens.max() < synth.SPEECH_CODEBOOK
    assert mel.shape == (1, 2 * tokens.shape[1], 80)
    assert speaker.shape == (1, 192)
    expected_len = tokens.shape[1] if variant == "turbo" else 34
    assert features.shape == (1, expected_len, 64)

    decoder = _session(layout.graphs["conditional_decoder"].path)
    generated = np.array([[5, 17, 300, 4299, 4299, 4299]], np.int64)
    feeds = {"speaker_embeddings": speaker, "speaker_features": mel}
    wave = decoder.run(None, {"speech_tokens": np.concatenate([tokens, generated], 1), **feeds})[0]
    # The prompt is trimmed: 960 samples per generated token.
    assert wave.shape == (1, generated.shape[1] * synth.SAMPLES_PER_TOKEN)
    assert np.isfinite(wave).all() and np.abs(wave).max() > 0.01
    # Causal: changing the last token leaves every earlier token's samples unchanged.
    changed = generated.copy()
    changed[0, -1] = 123
    other = decoder.run(None, {"speech_tokens": np.concatenate([tokens, changed], 1), **feeds})[0]
    cut = (generated.shape[1] - 1) * synth.SAMPLES_PER_TOKEN
    np.testing.assert_array_equal(wave[:, :cut], other[:, :cut])
    assert not np.array_equal(wave[:, cut:], other[:, cut:])


def test_stop_schedule_makes_greedy_decoding_end(tmp_path):
    synth.export(
        synth.SyntheticConfig(variant="turbo", precisions=("fp32",), stop_after=40), tmp_path
    )
    layout = inspect_layout(tmp_path)
    lm = _session(layout.graphs["language_model"].path)
    empty = np.zeros((1, layout.lm.kv.kv_heads, 0, layout.lm.kv.head_dim), np.float32)
    past = {past: empty for past, _ in layout.lm.kv.pairs}
    embeds = np.random.default_rng(0).standard_normal((1, 45, 64)).astype(np.float32)
    logits = lm.run(["logits"], _lm_feeds(layout, embeds, 45, past))[0][0]
    winners = logits.argmax(axis=-1)
    assert (winners[:39] != synth.STOP_SPEECH_TOKEN).all()
    assert (winners[42:] == synth.STOP_SPEECH_TOKEN).all()


# --------------------------------------------------------------------------------------
# Detector
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", synth.VARIANTS)
def test_detect_recognises_each_family(bundles, variant):
    assert detect(bundles[variant]).family == FAMILY_OF[variant]
    assert available_precisions(bundles[variant]) == ["fp32", "q8", "q4", "fp16", "q4f16"]
    layout = inspect_layout(bundles[variant])
    assert layout.precision == "fp32"  # the default
    assert layout.lm.kv.layers == 2 and layout.lm.kv.kv_heads == 4 and layout.lm.kv.head_dim == 16
    assert layout.lm.has_position_ids == (variant != "multilingual")
    assert (len(layout.languages) == 23) == (variant == "multilingual")


def test_community_exports_fall_back_to_fp32_encoder_and_decoder(bundles):
    layout = inspect_layout(bundles["original"], "q4")
    assert layout.graphs["language_model"].path.name == "language_model_q4.onnx"
    assert layout.graphs["embed_tokens"].path.name == "embed_tokens_q4.onnx"
    assert layout.graphs["speech_encoder"].path.name == "speech_encoder.onnx"
    assert layout.graphs["conditional_decoder"].path.name == "conditional_decoder.onnx"


def test_detect_flat_directory_and_reference_bundle(small_turbo, tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    for item in (small_turbo / "onnx").iterdir():
        shutil.copy(item, flat / item.name)
    shutil.copy(small_turbo / "tokenizer.json", flat / "tokenizer.json")
    assert detect(flat).family == FAMILY_TURBO

    from tests.conftest import codec_lm_dir

    assert detect(codec_lm_dir()).family == "codec-lm"


def test_default_precision_when_only_quantized_files_exist(tmp_path):
    synth.export(synth.SyntheticConfig(variant="turbo", precisions=("q4", "fp16")), tmp_path)
    assert available_precisions(tmp_path) == ["q4", "fp16"]
    assert inspect_layout(tmp_path).precision == "q4"
    with pytest.raises(ModelError, match=r"'q8' is not available.*available: q4, fp16"):
        inspect_layout(tmp_path, "q8")
    with pytest.raises(ModelError, match="unknown precision 'int8'"):
        inspect_layout(tmp_path, "int8")


def test_missing_graph_is_named(small_turbo):
    (small_turbo / "onnx" / "conditional_decoder.onnx").unlink()
    with pytest.raises(ModelError, match=r"missing graph onnx/conditional_decoder\.onnx"):
        detect(small_turbo)


def test_missing_sidecar_is_named(small_turbo):
    (small_turbo / "onnx" / "language_model.onnx_data").unlink()
    with pytest.raises(ModelError) as caught:
        detect(small_turbo)
    assert "missing external-data file onnx/language_model.onnx_data" in str(caught.value)


def test_missing_tokenizer_is_named(small_turbo):
    (small_turbo / "tokenizer.json").unlink()
    with pytest.raises(ModelError, match=r"missing tokenizer\.json"):
        detect(small_turbo)


def test_every_problem_is_reported_in_one_error(small_turbo):
    onnx_dir = small_turbo / "onnx"
    (onnx_dir / "speech_encoder.onnx").unlink()
    # A language model whose last present output is gone.
    lm = onnx.load(str(onnx_dir / "language_model.onnx"), load_external_data=False)
    keep = [o for o in lm.graph.output if o.name != "present.1.value"]
    del lm.graph.output[:]
    lm.graph.output.extend(keep)
    onnx.save_model(lm, str(onnx_dir / "language_model.onnx"))
    with pytest.raises(ModelError) as caught:
        detect(small_turbo)
    message = str(caught.value)
    assert "missing graph onnx/speech_encoder.onnx" in message
    assert "'past_key_values.1.value' has no present output" in message
    assert "\n" not in message  # one line: the CLI prints errors as one line


def test_mismatched_graph_io_is_named(small_turbo):
    onnx_dir = small_turbo / "onnx"
    # The decoder graph in place of the embedder: right file name, wrong signature.
    shutil.copy(onnx_dir / "conditional_decoder.onnx", onnx_dir / "embed_tokens.onnx")
    with pytest.raises(ModelError) as caught:
        detect(small_turbo)
    message = str(caught.value)
    assert "embed_tokens.onnx: missing input 'input_ids'" in message
    assert "embed_tokens.onnx: missing output 'inputs_embeds'" in message


def test_kv_dtype_mismatch_is_named(small_turbo):
    path = small_turbo / "onnx" / "language_model.onnx"
    lm = onnx.load(str(path), load_external_data=False)
    for value in lm.graph.input:
        if value.name == "past_key_values.1.value":
            value.type.tensor_type.elem_type = onnx.TensorProto.FLOAT16
    onnx.save_model(lm, str(path))
    with pytest.raises(ModelError, match=r"KV tensors disagree.*past_key_values\.1\.value"):
        detect(small_turbo)


@pytest.mark.parametrize(
    ("graph", "tensor", "dtype", "message"),
    [
        ("language_model", "logits", onnx.TensorProto.INT64, r"output 'logits' is int64"),
        ("conditional_decoder", None, onnx.TensorProto.INT16, r"output '\w+' is int16"),
    ],
)
def test_outputs_of_the_wrong_dtype_are_refused(small_turbo, graph, tensor, dtype, message):
    """A graph whose declared output is not what the loop reads (integer logits, a 16-bit
    waveform) is refused at load, never run into silence or other audio."""
    path = small_turbo / "onnx" / f"{graph}.onnx"
    model = onnx.load(str(path), load_external_data=False)
    output = next(o for o in model.graph.output if tensor is None or o.name == tensor)
    cast = f"{output.name}_as_wrong_type"
    for node in model.graph.node:
        node.output[:] = [cast if name == output.name else name for name in node.output]
    model.graph.node.append(onnx.helper.make_node("Cast", [cast], [output.name], to=dtype))
    output.type.tensor_type.elem_type = dtype
    onnx.save_model(model, str(path))
    with pytest.raises(ModelError, match=message):
        detect(small_turbo)


def test_not_a_model_directory(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        detect(tmp_path / "nowhere")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelError, match=r"no bundle\.json and no Chatterbox graphs"):
        detect(tmp_path)


# --------------------------------------------------------------------------------------
# Runtime adapter: end-to-end synthesis through onnx_tts.load
# --------------------------------------------------------------------------------------
TEXT = "Hello there. This is the second sentence!"


@pytest.fixture(scope="session")
def reference_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import soundfile

    path = tmp_path_factory.mktemp("voice") / "ref.wav"
    t = np.arange(3 * 24000) / 24000
    wave = 0.3 * np.sin(2 * np.pi * 180 * t) * (0.7 + 0.3 * np.sin(2 * np.pi * 2 * t))
    soundfile.write(path, wave.astype(np.float32), 24000)
    return path


def _load(bundle: Path, kv: str, **options):
    import onnx_tts

    return onnx_tts.load(model=bundle, kv=kv, cache_dir=None, threads=1, **options)


E2E_CASES = [
    ("turbo", "fp32"),
    ("turbo", "q4"),
    ("original", "fp32"),
    ("original", "fp16"),
    ("multilingual", "fp32"),
    ("multilingual", "q8"),
    ("original-nopos", "fp32"),
    ("multilingual-pos", "fp32"),
]


@pytest.mark.parametrize(("name", "precision"), E2E_CASES)
def test_end_to_end_identical_in_every_kv_mode(bundles, reference_wav, name, precision):
    results = {}
    for kv in ("copy", "chain"):
        engine = _load(bundles[name], kv, precision=precision)
        assert engine.info()["kv_mode"] == kv
        assert engine.info()["precision"] == precision
        audio = engine.synthesize(TEXT, voice=reference_wav)
        results[kv] = audio.samples
    assert np.array_equal(results["copy"], results["chain"])
    samples = results["chain"]
    assert audio.sample_rate == 24000
    assert samples.dtype == np.float32 and np.isfinite(samples).all()
    assert audio.duration > 1.0 and np.abs(samples).max() > 0.05


@pytest.mark.parametrize(
    "name", ["turbo", "original", "multilingual", "original-nopos", "multilingual-pos"]
)
@pytest.mark.parametrize("kv", ["copy", "chain"])
def test_streaming_equals_one_shot(bundles, reference_wav, name, kv):
    """Streamed chunks concatenate to the one-shot samples: the synthetic decoder is causal
    with two tokens of left context, within the default 8-frame overlap."""
    engine = _load(bundles[name], kv)
    whole = engine.synthesize(TEXT, voice=reference_wav).samples
    chunks = list(engine.stream(TEXT, voice=reference_wav))
    assert len(chunks) > 3 and all(len(c) for c in chunks)
    streamed = np.concatenate(chunks)
    assert streamed.shape == whole.shape
    np.testing.assert_allclose(streamed, whole, atol=1e-6)
    # A small first chunk: the first window is 10 tokens, 2 held back -> 8 x 40 ms.
    assert len(chunks[0]) <= 10 * 960


def test_abandoned_stream_returns_its_kv_cache(bundles, reference_wav):
    engine = _load(bundles["original"], "chain")
    stream = engine.stream(TEXT, voice=reference_wav, first_chunk_frames=4)
    next(stream)
    stream.close()
    # The cache goes back to the pool (reset) at the scheduler's next step.
    pool = engine.model.pool
    wait_until(lambda: pool.idle_count() == 1, "the abandoned stream's cache is idle")
    assert engine.stats()["active_rows"] == 0


@pytest.mark.parametrize(
    "name", ["turbo", "original", "multilingual", "original-nopos", "multilingual-pos"]
)
def test_generation_matches_the_published_loop(bundles, reference_wav, name):
    """The engine's tokens equal those of a plain onnxruntime re-implementation of the
    model cards' loop (greedy, penalty 1.2 over every token so far, stop at 6562, numpy KV)."""
    engine = _load(bundles[name], "chain")
    backend = engine.model
    voice = backend.voice_arrays(engine.voice(reference_wav))
    (chunk,) = backend.text.chunks("Good morning to all of you.", {})
    ours = [int(f[0]) for f in engine.generate(chunk, engine.voice(reference_wav))]

    layout = backend.layout
    embed = _session(layout.graphs["embed_tokens"].path)
    lm = _session(layout.graphs["language_model"].path)
    ids = np.array([backend.text.token_ids(chunk)], np.int64)
    positions = np.where(ids >= 6561, 0, np.arange(ids.shape[1])[None] - 1)
    embeds = np.concatenate(
        [voice["audio_features"][None], _embed(embed, layout, ids, positions)], axis=1
    )
    empty = np.zeros((1, layout.lm.kv.kv_heads, 0, layout.lm.kv.head_dim), np.float32)
    past = {past: empty for past, _ in layout.lm.kv.pairs}
    history = [synth.START_SPEECH_TOKEN]
    output_names = [o.name for o in lm.get_outputs()]
    total = embeds.shape[1]
    for step in range(len(ours) + 1):
        outputs = dict(
            zip(output_names, lm.run(None, _lm_feeds(layout, embeds, total, past)), strict=True)
        )
        logits = outputs["logits"][0, -1].copy()
        logits[synth.START_SPEECH_TOKEN] = -np.inf
        logits[synth.STOP_SPEECH_TOKEN + 1 :] = -np.inf
        seen = np.unique(history)
        logits[seen] = np.where(logits[seen] > 0, logits[seen] / 1.2, logits[seen] * 1.2)
        token = int(np.argmax(logits))
        history.append(token)
        if token == synth.STOP_SPEECH_TOKEN:
            break
        past = {p: outputs[q] for p, q in dict(layout.lm.kv.pairs).items()}
        embeds = _embed(embed, layout, np.array([[token]]), np.array([[step + 1]]))
        total += 1
    assert history[-1] == synth.STOP_SPEECH_TOKEN  # the synthetic stop schedule ended it
    assert ours == history[1:-1]


def test_multilingual_language_and_guidance(bundles, reference_wav):
    bundle = bundles["multilingual"]
    english = _load(bundle, "chain").synthesize("Bonjour tout le monde.", voice=reference_wav)
    french = _load(bundle, "chain", language="fr")
    said = french.synthesize("Bonjour tout le monde.", voice=reference_wav)
    assert not np.array_equal(english.samples, said.samples)
    # Per-request language (the CLI passes it with the sampling options).
    per_call = _load(bundle, "chain").synthesize(
        "Bonjour tout le monde.", voice=reference_wav, language="fr"
    )
    assert np.array_equal(per_call.samples, said.samples)
    text = french.model.text
    assert text.token_ids("Salut.")[2] == text.tokenizer.token_to_id("[fr]")

    guided = {
        kv: _load(bundle, kv, cfg_weight=0.5).synthesize("Guten Tag.", voice=reference_wav)
        for kv in ("copy", "chain")
    }
    plain = _load(bundle, "chain").synthesize("Guten Tag.", voice=reference_wav)
    assert np.array_equal(guided["copy"].samples, guided["chain"].samples)
    assert not np.array_equal(guided["chain"].samples, plain.samples)


def test_reference_cache_serves_the_second_request(bundles, reference_wav, tmp_path):
    import onnx_tts

    engine = onnx_tts.load(model=bundles["turbo"], cache_dir=tmp_path / "cache", threads=1)
    first = engine.synthesize("One more time.", voice=reference_wav)
    second = engine.synthesize("One more time.", voice=reference_wav)
    stats = engine.cache_stats()["reference"]
    assert stats["misses"] == 1 and stats["hits"] == 1
    assert np.array_equal(first.samples, second.samples)
    # A fresh engine on the same disk cache does not run the speech encoder again.
    again = onnx_tts.load(model=bundles["turbo"], cache_dir=tmp_path / "cache", threads=1)
    again.synthesize("One more time.", voice=reference_wav)
    reference = again.cache_stats()["reference"]
    assert reference["hits"] == 1 and reference["misses"] == 0


def test_default_voice_and_turbo_without_voice(bundles):
    from onnx_tts.errors import AudioError

    audio = _load(bundles["original"], "chain").synthesize("No voice given.")
    assert audio.duration > 0.5
    with pytest.raises(AudioError, match="needs a reference voice"):
        _load(bundles["turbo"], "chain").synthesize("No voice given.")


def test_sampling_options_are_applied(bundles, reference_wav):
    engine = _load(bundles["turbo"], "chain")
    greedy = engine.synthesize("Some words here.", voice=reference_wav)
    sampled = [
        engine.synthesize("Some words here.", voice=reference_wav, temperature=0.9, seed=5)
        for _ in range(2)
    ]
    assert np.array_equal(sampled[0].samples, sampled[1].samples)
    assert not np.array_equal(sampled[0].samples, greedy.samples)


def test_bad_options_are_rejected(bundles):
    from onnx_tts.errors import InputError

    with pytest.raises(InputError, match="grows its cache by Concat"):
        _load(bundles["turbo"], "inplace")
    with pytest.raises(InputError, match="English only"):
        _load(bundles["turbo"], "chain", language="de")
    with pytest.raises(InputError, match="choose one of ar, da, de"):
        _load(bundles["multilingual"], "chain", language="xx")
    # Options outside the family's schema are refused naming the ones it takes.
    with pytest.raises(InputError, match="takes no option exaggeration; options it takes"):
        _load(bundles["turbo"], "chain", exaggeration=0.7)
    with pytest.raises(InputError, match="takes no option speed"):
        _load(bundles["turbo"], "chain", speed=2.0)
    with pytest.raises(ModelError, match="'q8' is not available"):
        _load(bundles["original-nopos"], "chain", precision="q8")


def test_exaggeration_changes_the_original_model_output(bundles, reference_wav):
    calm = _load(bundles["original"], "chain", exaggeration=0.2)
    lively = _load(bundles["original"], "chain", exaggeration=1.2)
    a = calm.synthesize("How are you today?", voice=reference_wav)
    b = lively.synthesize("How are you today?", voice=reference_wav)
    assert not np.array_equal(a.samples, b.samples)


def test_vocode_maps_each_token_to_one_hop(bundles, reference_wav):
    engine = _load(bundles["turbo"], "chain")
    voice = engine.voice(reference_wav)
    frames = np.array([[10], [20], [4299], [30]], np.int64)
    samples = engine.model.vocoder.vocode(frames, voice)
    assert samples.shape == (4 * 960,)
    from onnx_tts.errors import InputError

    with pytest.raises(InputError, match=r"\[0, 6561\)"):
        engine.model.vocoder.vocode(np.array([[6562]]), voice)


# --------------------------------------------------------------------------------------
# Stop heuristics
# --------------------------------------------------------------------------------------
def _fires(rules, tokens: list[int]) -> int | None:
    """Index of the token at which a one-row StopTracker says stop (None: never)."""
    from onnx_tts.decoding import StopTracker

    tracker = StopTracker(rules, rows=1)
    for index, token in enumerate(tokens):
        if tracker.push(np.zeros(1, np.int64), np.array([token]))[0]:
            return index
    return None


def test_stop_rules():
    from onnx_tts.decoding import StopRules

    rules = StopRules(
        max_token_repeat=5,
        max_cycle_tokens=9,
        max_cycle_period=3,
        max_silence_tokens=4,
        silence_tokens=frozenset({4299}),
    )
    assert _fires(rules, list(range(1, 13))) is None
    assert _fires(rules, [1, 2, 7, 7, 7, 7]) is None
    assert _fires(rules, [1, 2, 7, 7, 7, 7, 7]) == 6  # the 5th 7 in a row
    assert _fires(rules, [5, 1, 2, 3, 1, 2, 3, 1, 2]) is None  # 8 tokens of cycle: not yet
    assert _fires(rules, [5, 1, 2, 3, 1, 2, 3, 1, 2, 3]) == 9  # a 3-token cycle over 9
    assert _fires(rules, [1, 4299, 4299, 4299]) is None
    assert _fires(rules, [1, 4299, 4299, 4299, 4299]) == 4  # 4 silence tokens
    off = StopRules(max_token_repeat=0, max_cycle_tokens=0, max_silence_tokens=0)
    assert _fires(off, [7] * 100) is None and _fires(off, [4299] * 100) is None


def test_stop_rules_track_rows_independently():
    """Rows of one tracker (batched decoding) never see each other's tokens."""
    from onnx_tts.decoding import StopRules, StopTracker

    rules = StopRules(max_token_repeat=3, max_cycle_tokens=0, max_silence_tokens=0)
    tracker = StopTracker(rules, rows=3)
    rows = np.array([0, 2])
    assert not tracker.push(rows, np.array([7, 7])).any()
    assert not tracker.push(rows, np.array([7, 8])).any()
    assert tracker.push(rows, np.array([7, 8])).tolist() == [True, False]
    tracker.reset(0)  # a new request in row 0 starts with a clean history
    assert not tracker.push(np.array([0]), np.array([7])).any()


def test_stop_rules_refuse_bad_values():
    from onnx_tts.decoding import StopRules
    from onnx_tts.errors import InputError

    with pytest.raises(InputError, match="max_token_repeat"):
        StopRules(max_token_repeat=-1).checked()
    with pytest.raises(InputError, match="integer"):
        StopRules(max_cycle_tokens=2.5).checked()


def test_stop_rules_end_a_runaway_generation(bundles, reference_wav):
    """With the stop schedule far away, a strict rule ends generation early."""
    engine = _load(bundles["turbo"], "chain", max_new_tokens=400)
    (chunk,) = engine.model.text.chunks("Wait for it.", {})
    voice = engine.voice(reference_wav)
    greedy = engine.model.sampling_defaults().with_overrides({"repetition_penalty": 1.0})
    tokens = [int(f[0]) for f in engine.generate(chunk, voice, greedy)]
    # Find where the unpenalised greedy run first repeats a token, if it does at all.
    repeats = [i for i in range(1, len(tokens)) if tokens[i] == tokens[i - 1]]
    strict = _load(
        bundles["turbo"],
        "chain",
        max_new_tokens=400,
        max_token_repeat=2,
        max_cycle_tokens=0,
        max_silence_tokens=0,
    )
    cut = [int(f[0]) for f in strict.generate(chunk, voice, greedy)]
    expected = repeats[0] + 1 if repeats else len(tokens)
    assert cut == tokens[:expected]


def test_tokenizer_without_the_onnx_template_is_wrapped(bundles, tmp_path):
    """A tokenizer.json without the post-processor still yields [6563][START]..[STOP][6561]."""
    copy = tmp_path / "original"
    shutil.copytree(bundles["original-nopos"], copy)
    data = json.loads((copy / "tokenizer.json").read_text())
    data["post_processor"] = None
    (copy / "tokenizer.json").write_text(json.dumps(data))
    wrapped = _load(copy, "chain").model.text.token_ids("Hello there.")
    reference = _load(bundles["original-nopos"], "chain").model.text.token_ids("Hello there.")
    assert wrapped == reference


def test_chinese_text_goes_through_the_cangjie_mapping(bundles, tmp_path):
    from onnx_tts.families.chatterbox import CangjieConverter

    mapping = tmp_path / "Cangjie5_TC.json"
    mapping.write_text(json.dumps(["你\tonf", "好\tvnd", "妳\tvnf", "尔\tonf"]))
    convert = CangjieConverter(mapping)
    assert convert("你好!") == ("[cj_o][cj_n][cj_f][cj_.][cj_v][cj_n][cj_d][cj_.]!")
    assert convert("尔") == "[cj_o][cj_n][cj_f][cj_1][cj_.]"  # second glyph of code onf
    copy = tmp_path / "multilingual"
    shutil.copytree(bundles["multilingual-pos"], copy)
    shutil.copy(mapping, copy / "Cangjie5_TC.json")
    backend = _load(copy, "chain", language="zh").model
    plain = _load(bundles["multilingual-pos"], "chain", language="zh").model
    assert backend.text.token_ids("你好") != plain.text.token_ids("你好")


def test_older_speech_encoder_output_names_are_accepted(bundles, reference_wav, tmp_path):
    """Older original-model exports name the encoder outputs cond_emb / prompt_token /
    ref_x_vector / prompt_feat; the result must not change."""
    copy = tmp_path / "original"
    shutil.copytree(bundles["original-nopos"], copy)
    path = copy / "onnx" / "speech_encoder.onnx"
    model = onnx.load(str(path), load_external_data=False)
    renames = {
        "audio_features": "cond_emb",
        "audio_tokens": "prompt_token",
        "speaker_embeddings": "ref_x_vector",
        "speaker_features": "prompt_feat",
    }
    for node in model.graph.node:
        node.output[:] = [renames.get(name, name) for name in node.output]
    for output in model.graph.output:
        output.name = renames[output.name]
    onnx.save_model(model, str(path))  # weights stay in the untouched sidecar
    layout = inspect_layout(copy)
    assert layout.speech_encoder_outputs["audio_tokens"] == "prompt_token"
    renamed = _load(copy, "chain").synthesize("Names changed.", voice=reference_wav)
    original = _load(bundles["original-nopos"], "chain").synthesize(
        "Names changed.", voice=reference_wav
    )
    assert np.array_equal(renamed.samples, original.samples)


def test_tokenizer_only_directory_names_the_missing_language_model(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ModelError, match=r"no language model graph: expected onnx/language_model"):
        detect(tmp_path)


def test_concurrent_requests_match_sequential_ones(bundles, reference_wav):
    from concurrent.futures import ThreadPoolExecutor

    engine = _load(bundles["multilingual"], "chain", cfg_weight=0.3)
    texts = ["First request here.", "A different second one!", "And a third."]
    sequential = [engine.synthesize(t, voice=reference_wav).samples for t in texts]
    with ThreadPoolExecutor(max_workers=3) as pool:
        parallel = list(pool.map(lambda t: engine.synthesize(t, voice=reference_wav), texts))
    for alone, together in zip(sequential, parallel, strict=True):
        assert np.array_equal(alone, together.samples)


def test_a_first_token_that_is_stop_is_an_error_not_an_empty_file(tmp_path, reference_wav, capsys):
    """The synthetic stop schedule from position 1 makes STOP the first sampled token: this
    wrote an empty WAV with exit 0 (and printed RTF 5.6e9)."""
    from onnx_tts.cli import main
    from onnx_tts.errors import EmptyAudioError

    bundle = tmp_path / "mute"
    synth.export(synth.SyntheticConfig(variant="turbo", precisions=("fp32",), stop_after=1), bundle)
    engine = _load(bundle, "chain")
    (chunk,) = engine.model.text.chunks("Hello there.", {})
    assert list(engine.generate(chunk, engine.voice(reference_wav))) == []  # STOP came first
    with pytest.raises(EmptyAudioError, match=r"no audio for the text \('Hello there\.'\)"):
        engine.synthesize("Hello there.", voice=reference_wav)
    out = tmp_path / "out.wav"
    args = ["synth", "Hello there.", "-o", str(out), "--model", str(bundle)]
    args += ["--voice", str(reference_wav), "--cache-dir", "none", "-v"]
    for extra in ([], ["--stream"]):
        code = main([*args, *extra])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and "no audio" in err[0], err
        assert not out.exists()


def test_a_reference_over_20_seconds_is_cut_with_a_warning(small_turbo, tmp_path, capsys):
    """Chatterbox encodes at most 20 s of a reference: a longer one was cut silently."""
    import soundfile

    from onnx_tts.cli import main
    from onnx_tts.errors import ReferenceTrimmedWarning
    from tests.conftest import speechlike

    long_wav = tmp_path / "long.wav"
    soundfile.write(long_wav, speechlike(25.0), 24000)
    engine = _load(small_turbo, "chain")
    with pytest.warns(ReferenceTrimmedWarning, match=r"is 25\.0 s long; only its first 20 s"):
        voice = engine.voice(long_wav)
    first_20 = tmp_path / "first20.wav"
    soundfile.write(first_20, speechlike(25.0)[: 20 * 24000], 24000)
    assert all(np.array_equal(voice[k], engine.voice(first_20)[k]) for k in voice)
    out = tmp_path / "out.wav"
    args = ["synth", "Hello.", "-o", str(out), "--model", str(small_turbo), "-q"]
    code = main([*args, "--voice", str(long_wav), "--cache-dir", "none"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 0 and out.exists()
    assert err == [
        f"onnx-tts: warning: reference audio {long_wav} is 25.0 s long; only its first 20 s are "
        "used: trim it to the part you want"
    ]


@pytest.fixture(scope="module")
def fp32_bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One fp32-only bundle per variant (cheaper than `bundles`)."""
    root = tmp_path_factory.mktemp("chatterbox-fp32")
    out = {}
    for variant in synth.VARIANTS:
        out[variant] = root / variant
        synth.export(synth.SyntheticConfig(variant=variant, precisions=("fp32",)), out[variant])
    return out


PUNCTUATION_TEXT = (
    "wait\u2026 what: \u201cyes\u201d \u2014 \u2018no\u2019; ok - fine... at 3:30. next one"
)


@pytest.mark.parametrize(
    ("variant", "expected"),
    [
        # Turbo's list: ellipsis character, colon, dashes, curly quotes; ";" and "..." stay.
        ("turbo", ["Wait, what, \"yes\" - 'no';", "Ok - fine...", "At three thirty.", "Next one."]),
        # Original: also "...", ";" and " - " become commas; the English frontend reads 3:30.
        ("original", ["Wait, what, \"yes\" - 'no', ok, fine, at three thirty.", "Next one."]),
        # Multilingual: the same list, every colon (no English number reading).
        ("multilingual", ["Wait, what, \"yes\" - 'no', ok, fine, at 3,30.", "Next one."]),
    ],
)
def test_published_punctuation_replacements(fp32_bundles, variant, expected):
    """The published punc_norm replacements (ellipsis, colon, semicolon, dashes, curly
    quotes) were missing: the text only got a capital and a period."""
    engine = _load(fp32_bundles[variant], "chain")
    assert engine.model.text.chunks(PUNCTUATION_TEXT, {}) == expected


def test_japanese_kanji_are_read_as_hiragana(fp32_bundles):
    """The published multilingual pipeline turns kanji into their hiragana reading
    (pykakasi) before tokenizing; kanji went to the tokenizer as they were."""
    import unicodedata

    from onnx_tts.families.chatterbox.text import hiragana

    def nfkd(text: str) -> str:
        return unicodedata.normalize("NFKD", text)

    # Dictionary readings of whole phrases (学ぶ is まなぶ, not がく + ぶ), kana unchanged.
    assert hiragana("日本語を学ぶのは楽しいです。") == nfkd("にほんごをまなぶのはたのしいです。")
    assert hiragana("カタカナとひらがな") == nfkd("カタカナとひらがな")
    # A kanji reading that starts with は or へ gets a space before it, as published.
    assert hiragana("私は花が好きです。") == nfkd("わたしは はながすきです。")
    backend = _load(fp32_bundles["multilingual"], "chain", language="ja").model
    tokenizer = backend.text.tokenizer
    ids = backend.text.token_ids("日本語を学ぶ")
    assert ids == tokenizer.encode("[ja]" + nfkd("にほんごをまなぶ")).ids
    assert ids != tokenizer.encode("[ja]" + nfkd("日本語を学ぶ")).ids
    # Other languages keep their kanji-free path (Chinese goes through Cangjie instead).
    assert backend.text.token_ids("日本", "ko") == tokenizer.encode("[ko]" + nfkd("日本")).ids


@pytest.mark.parametrize(("variant", "cap"), [("turbo", 1024), ("original", 256)])
def test_published_loop_text_and_token_cap(tmp_path, reference_wav, variant, cap):
    """--published-loop capitalised and added "." where the model cards' scripts do not,
    and capped every text at 1000 tokens where they use 1024 (Turbo) and 256 (original,
    multilingual)."""
    bundle = tmp_path / variant
    synth.export(
        synth.SyntheticConfig(variant=variant, precisions=("fp32",), stop_after=0), bundle
    )  # no stop schedule: only the cap ends generation
    published = _load(bundle, "chain", published_loop=True)
    backend = published.model
    assert backend.text.chunks("  hello there: one; two - three\n", {}) == [
        "hello there: one; two - three"
    ]
    assert backend.max_new_tokens == cap
    (chunk,) = backend.text.chunks("hello there", {})
    frames = list(published.generate(chunk, published.voice(reference_wav)))
    assert len(frames) == cap
    assert _load(bundle, "chain", published_loop=True, max_new_tokens=7).model.max_new_tokens == 7
    assert _load(bundle, "chain").model.max_new_tokens == 1000  # our loop's default cap


@pytest.mark.parametrize("attention", ["concat", "gqa", "gqa-mask"])
def test_guidance_with_the_prefix_cache_in_every_kv_mode(tmp_path, reference_wav, attention):
    """Classifier-free guidance (two LM rows) with the voice-prefix cache on crashed with
    --kv chain|copy: GroupQueryAttention refuses several new tokens after a past at batch 2,
    so the one-run prefill must follow the graph's attention, not the KV mode. Every layout
    (Concat, converted GQA, the published GQA-internal one) in every mode it runs must decode
    guided requests, a prefix-cache hit equal to a miss and to no prefix cache at all."""
    from onnx_tts.tools.convert import convert_bundle_inplace_kv
    from tests.test_scheduler import _gqa_internal

    source = tmp_path / "source"
    config = synth.SyntheticConfig(variant="original", lm_position_ids=False, precisions=("fp32",))
    synth.export(config, source)
    bundle = source
    if attention != "concat":
        bundle = tmp_path / "converted"
        convert_bundle_inplace_kv(source, bundle, check=False)
        if attention == "gqa-mask":
            _gqa_internal(bundle)
    assert detect(bundle).inspected.lm.kv.attention == attention
    modes = ("copy", "chain") if attention == "concat" else ("copy", "chain", "inplace")
    text = "Guided speech. A second sentence."
    results = {}
    for kv in modes:
        plain = _load(bundle, kv, cfg_weight=0.5, prefix_cache_bytes=0)
        cached = _load(bundle, kv, cfg_weight=0.5, max_batch=2)
        want = plain.synthesize(text, voice=reference_wav).samples
        for _ in range(2):  # a miss, then a hit (where this mode uses the prefix cache)
            assert np.array_equal(cached.synthesize(text, voice=reference_wav).samples, want)
        results[kv] = want
        assert want.size and np.isfinite(want).all()
    assert np.array_equal(results["copy"], results["chain"])
    if "inplace" in results:  # the in-place rows prefill each guided row on its own
        np.testing.assert_allclose(results["inplace"], results["chain"], atol=1e-4)
    unguided = _load(bundle, "chain").synthesize(text, voice=reference_wav).samples
    assert not np.array_equal(unguided, results["chain"])

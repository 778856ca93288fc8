"""The codec-lm bundle: torch vs ONNX Runtime parity, KV modes, causality, determinism."""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

# torch comes with the test extra ([export]): these tests always run.
import torch

import export.build_codec_lm as build_codec_lm_module
from export.build_codec_lm import (
    GRAPH_FILES,
    TOKENIZER_FILE,
    BuildResult,
    build_codec_lm,
    codec_lm_bundle,
    recipe_key,
)
from export.codec_lm_model import synthetic_audio
from export.onnx_graphs import (
    DecoderLMSpec,
    build_concat_lm,
    build_gqa_lm,
    random_lm_weights,
)

MAX_BUNDLE_BYTES = 25_000_000


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    return build_codec_lm(tmp_path_factory.mktemp("codec_lm_a"), seed=0)


@pytest.fixture(scope="module")
def sessions(built: BuildResult) -> dict[str, ort.InferenceSession]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return {
        key: ort.InferenceSession(
            str(built.out_dir / filename), options, providers=["CPUExecutionProvider"]
        )
        for key, filename in GRAPH_FILES.items()
    }


def _audio(count: int, seconds: float, seed: int) -> torch.Tensor:
    return synthetic_audio(count, seconds, 24000, torch.Generator().manual_seed(seed))


def _run(session: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def _empty_past(layers: int, batch: int) -> dict[str, np.ndarray]:
    return {
        f"past_key_values.{i}.{kind}": np.zeros((batch, 2, 0, 64), np.float32)
        for i in range(layers)
        for kind in ("key", "value")
    }


def _presents_as_past(outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {
        name.replace("present.", "past_key_values."): value
        for name, value in outputs.items()
        if name.startswith("present.")
    }


# (batch, tokens per step): prefill then decode steps. ORT's GroupQueryAttention accepts a
# multi-token step after the prefill only for batch 1, so only that scenario has one.
LM_SCENARIOS = {"batch1": (1, (9, 1, 1, 3, 1, 1)), "batch2": (2, (9, 1, 1, 1))}


@pytest.fixture(scope="module", params=list(LM_SCENARIOS))
def lm_scenario(request: pytest.FixtureRequest) -> tuple[torch.Tensor, tuple[int, ...]]:
    batch, steps = LM_SCENARIOS[request.param]
    generator = torch.Generator().manual_seed(7)
    return torch.randn(batch, sum(steps), 256, generator=generator), steps


@pytest.fixture(scope="module")
def lm_inputs(lm_scenario: tuple[torch.Tensor, tuple[int, ...]]) -> torch.Tensor:
    return lm_scenario[0]


@pytest.fixture(scope="module")
def lm_steps(lm_scenario: tuple[torch.Tensor, tuple[int, ...]]) -> tuple[int, ...]:
    return lm_scenario[1]


@pytest.fixture(scope="module")
def torch_logits(built: BuildResult, lm_inputs: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return built.model.lm(lm_inputs)[0].numpy()


@pytest.fixture(scope="module")
def gqa_growing_logits(
    built: BuildResult,
    sessions: dict[str, ort.InferenceSession],
    lm_inputs: torch.Tensor,
    lm_steps: tuple[int, ...],
) -> np.ndarray:
    batch, layers = lm_inputs.shape[0], built.model.cfg.layers
    past, position, chunks = _empty_past(layers, batch), 0, []
    for step in lm_steps:
        total = position + step
        outputs = _run(
            sessions["lm"],
            {
                "inputs_embeds": lm_inputs[:, position:total].numpy(),
                "seqlens_k": np.full((batch,), total - 1, np.int32),
                "total_sequence_length": np.array(total, np.int32),
                **past,
            },
        )
        assert outputs["present.0.key"].shape == (batch, 2, total, 64)
        past, position = _presents_as_past(outputs), total
        chunks.append(outputs["logits"])
    return np.concatenate(chunks, axis=1)


def test_encoder_matches_torch(built: BuildResult, sessions: dict[str, ort.InferenceSession]):
    audio = _audio(2, 1.3, seed=11)  # 31200 samples: not a multiple of the hop
    audio = audio[:, :31170]
    expected_codes, expected_speaker = built.model.encoder(audio)
    outputs = _run(sessions["encoder"], {"audio": audio.numpy()})
    assert outputs["codes"].shape == (2, 31170 // 480, 4)
    assert outputs["codes"].dtype == np.int64
    np.testing.assert_array_equal(outputs["codes"], expected_codes.numpy())
    np.testing.assert_allclose(
        outputs["speaker_embedding"], expected_speaker.detach().numpy(), atol=1e-5
    )
    np.testing.assert_allclose(np.linalg.norm(outputs["speaker_embedding"], axis=-1), 1.0, 1e-5)
    # Different inputs give different codes (the encoder is not a constant).
    assert (outputs["codes"][0] != outputs["codes"][1]).any()


def test_rvq_is_residual_on_encoder_latents(
    built: BuildResult, sessions: dict[str, ort.InferenceSession]
):
    audio = _audio(3, 2.0, seed=21)
    rvq = built.model.encoder.rvq
    with torch.no_grad():
        latent = built.model.encoder.latent(audio)
        codes = torch.from_numpy(_run(sessions["encoder"], {"audio": audio.numpy()})["codes"])
        errors = [float((latent * latent).mean())]
        for stages in range(1, 5):
            reconstruction = rvq.dequantize(codes[..., :stages])
            errors.append(float(((latent - reconstruction) ** 2).mean()))
        # Stage k quantises what stages < k left over: the ORT codes prefix = torch's k-stage RVQ.
        np.testing.assert_array_equal(codes[..., :2].numpy(), rvq.quantize(latent, 2).numpy())
    assert all(later < earlier for earlier, later in itertools.pairwise(errors)), errors


def test_embed_matches_torch_and_accepts_empty(
    built: BuildResult, sessions: dict[str, ort.InferenceSession]
):
    generator = torch.Generator().manual_seed(3)
    text_ids = torch.randint(0, built.model.cfg.text_vocab_size, (2, 7), generator=generator)
    audio_codes = torch.randint(0, 259, (2, 5, 4), generator=generator)
    speaker = torch.nn.functional.normalize(torch.randn(2, 128, generator=generator), dim=-1)
    with torch.no_grad():
        expected = built.model.embed(text_ids, audio_codes, speaker)
    outputs = _run(
        sessions["embed"],
        {
            "text_ids": text_ids.numpy(),
            "audio_codes": audio_codes.numpy(),
            "speaker_embedding": speaker.numpy(),
        },
    )
    for name, value in zip(
        ("text_embeds", "audio_embeds", "speaker_embeds"), expected, strict=True
    ):
        np.testing.assert_allclose(outputs[name], value.numpy(), atol=1e-5, err_msg=name)
    assert outputs["speaker_embeds"].shape == (2, 1, 256)

    empty = _run(
        sessions["embed"],
        {
            "text_ids": np.zeros((2, 0), np.int64),
            "audio_codes": np.zeros((2, 0, 4), np.int64),
            "speaker_embedding": speaker.numpy(),
        },
    )
    assert empty["text_embeds"].shape == (2, 0, 256)
    assert empty["audio_embeds"].shape == (2, 0, 256)


def test_lm_growing_cache_matches_torch(
    gqa_growing_logits: np.ndarray, torch_logits: np.ndarray, lm_inputs: torch.Tensor
):
    assert gqa_growing_logits.shape == (*lm_inputs.shape[:2], 4, 259)
    np.testing.assert_allclose(gqa_growing_logits, torch_logits, atol=1e-4)


def test_lm_shared_buffer_equals_growing_cache(
    built: BuildResult,
    sessions: dict[str, ort.InferenceSession],
    lm_inputs: torch.Tensor,
    lm_steps: tuple[int, ...],
    gqa_growing_logits: np.ndarray,
):
    batch, layers, capacity = lm_inputs.shape[0], built.model.cfg.layers, 32
    session = sessions["lm"]
    buffers = {
        (i, kind): ort.OrtValue.ortvalue_from_numpy(np.zeros((batch, 2, capacity, 64), np.float32))
        for i in range(layers)
        for kind in ("key", "value")
    }
    pointers = {key: value.data_ptr() for key, value in buffers.items()}
    position, chunks = 0, []
    for step in lm_steps:
        total = position + step
        binding = session.io_binding()
        binding.bind_cpu_input(
            "inputs_embeds", np.ascontiguousarray(lm_inputs[:, position:total].numpy())
        )
        binding.bind_cpu_input("seqlens_k", np.full((batch,), total - 1, np.int32))
        binding.bind_cpu_input("total_sequence_length", np.array(total, np.int32))
        binding.bind_output("logits")
        for (i, kind), buffer in buffers.items():
            binding.bind_ortvalue_input(f"past_key_values.{i}.{kind}", buffer)
            binding.bind_ortvalue_output(f"present.{i}.{kind}", buffer)
        session.run_with_iobinding(binding)
        outputs = binding.get_outputs()
        assert outputs[1].data_ptr() == pointers[(0, "key")]  # written in place, not copied
        chunks.append(outputs[0].numpy())
        position = total
    shared = np.concatenate(chunks, axis=1)
    np.testing.assert_array_equal(shared, gqa_growing_logits)
    key_cache = buffers[(0, "key")].numpy()
    assert np.abs(key_cache[:, :, :position]).min(axis=-1).max() > 0  # filled
    assert not key_cache[:, :, position:].any()  # untouched beyond the sequence


def test_lm_concat_matches_gqa_and_torch(
    built: BuildResult,
    sessions: dict[str, ort.InferenceSession],
    lm_inputs: torch.Tensor,
    lm_steps: tuple[int, ...],
    gqa_growing_logits: np.ndarray,
    torch_logits: np.ndarray,
):
    batch, layers = lm_inputs.shape[0], built.model.cfg.layers
    past, position, chunks = _empty_past(layers, batch), 0, []
    for step in lm_steps:
        total = position + step
        outputs = _run(
            sessions["lm_concat"],
            {
                "inputs_embeds": lm_inputs[:, position:total].numpy(),
                "attention_mask": np.ones((batch, total), np.int64),
                "position_ids": np.tile(np.arange(position, total), (batch, 1)),
                **past,
            },
        )
        assert outputs["present.3.value"].shape == (batch, 2, total, 64)
        past, position = _presents_as_past(outputs), total
        chunks.append(outputs["logits"])
    concat = np.concatenate(chunks, axis=1)
    np.testing.assert_allclose(concat, gqa_growing_logits, atol=1e-4)
    np.testing.assert_allclose(concat, torch_logits, atol=1e-4)


def test_lm_concat_attention_mask_hides_left_padding(sessions: dict[str, ort.InferenceSession]):
    session, pad = sessions["lm_concat"], 3
    single = torch.randn(1, 6, 256, generator=torch.Generator().manual_seed(9)).numpy()
    alone = _run(
        session,
        {
            "inputs_embeds": single,
            "attention_mask": np.ones((1, 6), np.int64),
            "position_ids": np.arange(6)[None],
            **_empty_past(4, 1),
        },
    )["logits"]
    noise = np.random.default_rng(0).standard_normal((1, pad, 256)).astype(np.float32)
    padded = _run(
        session,
        {
            "inputs_embeds": np.concatenate([noise, single], axis=1),
            "attention_mask": np.array([[0] * pad + [1] * 6], np.int64),
            "position_ids": np.array([[0] * pad + list(range(6))], np.int64),
            **_empty_past(4, 1),
        },
    )["logits"]
    np.testing.assert_allclose(padded[:, pad:], alone, atol=1e-4)


def test_vocoder_matches_torch_and_is_bounded(
    built: BuildResult, sessions: dict[str, ort.InferenceSession]
):
    codes = torch.randint(0, 256, (2, 30, 4), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = built.model.vocoder(codes).numpy()
    waveform = _run(sessions["vocoder"], {"codes": codes.numpy()})["waveform"]
    assert waveform.shape == (2, 30 * 480)
    np.testing.assert_allclose(waveform, expected, atol=1e-5)
    assert np.abs(waveform).max() <= 0.5
    assert waveform.std() > 1e-3  # not silence


def test_vocoder_windowed_decode_equals_full_decode(
    built: BuildResult, sessions: dict[str, ort.InferenceSession]
):
    manifest = json.loads((built.out_dir / "bundle.json").read_text())
    context = manifest["vocoder"]["receptive_field_frames"]
    assert context == built.model.cfg.vocoder_receptive_field_frames
    hop = manifest["codec"]["hop_length"]
    codes = np.random.default_rng(1).integers(0, 256, (1, 45, 4), dtype=np.int64)
    full = _run(sessions["vocoder"], {"codes": codes})["waveform"]
    for start, stop in [(0, 8), (8, 20), (20, 21), (21, 45)]:
        first = max(0, start - context)
        window = _run(sessions["vocoder"], {"codes": codes[:, first:stop]})["waveform"]
        np.testing.assert_array_equal(
            window[:, (start - first) * hop :], full[:, start * hop : stop * hop]
        )
    # One frame less of context changes the output: the stated receptive field is not too big.
    start = 20
    short = _run(sessions["vocoder"], {"codes": codes[:, start - context + 1 : start + 1]})[
        "waveform"
    ]
    assert not np.array_equal(short[:, -hop:], full[:, start * hop : (start + 1) * hop])


def _file_hashes(directory: Path) -> dict[str, str]:
    names = [*GRAPH_FILES.values(), TOKENIZER_FILE, "bundle.json"]
    return {name: hashlib.sha256((directory / name).read_bytes()).hexdigest() for name in names}


def test_build_is_deterministic(built: BuildResult, tmp_path: Path):
    second = build_codec_lm(tmp_path / "codec_lm_b", seed=0)
    assert _file_hashes(second.out_dir) == _file_hashes(built.out_dir)


def test_cached_bundle_is_built_once_and_keyed_by_the_recipe(
    built: BuildResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    first = codec_lm_bundle(cache_root=tmp_path)
    assert first.parent == tmp_path / "codec-lm" and first.name == recipe_key(0)
    assert _file_hashes(first) == _file_hashes(built.out_dir)
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no staging left over
    calls = []
    monkeypatch.setattr(build_codec_lm_module, "build_codec_lm", lambda *a: calls.append(a))
    assert codec_lm_bundle(cache_root=tmp_path) == first and calls == []  # a hit: no build
    assert recipe_key(1) != recipe_key(0)
    # Another recipe (here: another library version) is another directory.
    real_version = build_codec_lm_module.importlib.metadata.version
    monkeypatch.setattr(
        build_codec_lm_module.importlib.metadata,
        "version",
        lambda name: "0.0-other" if name == "onnx" else real_version(name),
    )
    assert recipe_key(0) != first.name


def test_manifest_describes_the_files(built: BuildResult):
    manifest = json.loads((built.out_dir / "bundle.json").read_text())
    assert manifest["graphs"] == GRAPH_FILES
    for name, digest in manifest["sha256"].items():
        assert hashlib.sha256((built.out_dir / name).read_bytes()).hexdigest() == digest
    assert set(manifest["sha256"]) == {*GRAPH_FILES.values(), TOKENIZER_FILE}
    total = sum(path.stat().st_size for path in built.out_dir.iterdir())
    assert total < MAX_BUNDLE_BYTES
    for filename in GRAPH_FILES.values():
        model = onnx.load(str(built.out_dir / filename), load_external_data=False)
        assert model.ir_version == 10
        assert {o.domain: o.version for o in model.opset_import}.get("", 0) >= 17
    lm = onnx.load(str(built.out_dir / "lm.onnx"))
    gqa = [n for n in lm.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == manifest["kv"]["layers"]
    cos = next(t for t in lm.graph.initializer if t.name == "cos_cache")
    assert list(cos.dims) == [manifest["lm"]["max_positions"], 32]


def test_tokenizer_is_character_level_with_specials(built: BuildResult):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(built.out_dir / TOKENIZER_FILE))
    for token, index in {"<pad>": 0, "<unk>": 1, "<bos>": 2, "<eos>": 3}.items():
        assert tokenizer.token_to_id(token) == index
    encoding = tokenizer.encode("Hi, Ａ1!")  # full-width A: NFKC folds it to "a"
    assert encoding.tokens == ["h", "i", ",", " ", "a", "1", "!"]
    assert tokenizer.encode("a~b").tokens == ["a", "<unk>", "b"]
    assert tokenizer.decode(tokenizer.encode('it\'s (ok): yes; no - "q"?').ids) == (
        'it\'s (ok): yes; no - "q"?'
    )
    assert max(tokenizer.get_vocab().values()) + 1 == built.model.cfg.text_vocab_size


@pytest.mark.parametrize(
    "spec",
    [
        DecoderLMSpec(2, 64, 4, 1, 16, 96, 50, output_heads=None, norm="layer", rotary=False),
        DecoderLMSpec(3, 96, 2, 2, 48, 128, 33, output_heads=2, norm="rms", rotary=True),
    ],
    ids=["layernorm-norotary-mqa", "rmsnorm-rotary-mha"],
)
def test_lm_builders_agree_for_other_shapes(spec: DecoderLMSpec, tmp_path: Path):
    weights = random_lm_weights(spec, seed=1)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    graphs = {}
    for name, model in (
        ("gqa", build_gqa_lm(spec, weights)),
        ("concat", build_concat_lm(spec, weights)),
    ):
        graphs[name] = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
    inputs = np.random.default_rng(2).standard_normal((1, 7, spec.hidden_size), np.float32)
    past = {
        f"past_key_values.{i}.{kind}": np.zeros((1, spec.kv_heads, 0, spec.head_dim), np.float32)
        for i in range(spec.layers)
        for kind in ("key", "value")
    }
    gqa_past, concat_past, position = dict(past), dict(past), 0
    for step in (4, 1, 2):
        total = position + step
        gqa = _run(
            graphs["gqa"],
            {
                "inputs_embeds": inputs[:, position:total],
                "seqlens_k": np.array([total - 1], np.int32),
                "total_sequence_length": np.array(total, np.int32),
                **gqa_past,
            },
        )
        feeds = {
            "inputs_embeds": inputs[:, position:total],
            "attention_mask": np.ones((1, total), np.int64),
            **concat_past,
        }
        if spec.rotary:
            feeds["position_ids"] = np.arange(position, total)[None]
        concat = _run(graphs["concat"], feeds)
        expected_shape = (1, step, spec.output_heads, spec.vocab_size)
        if spec.output_heads is None:
            expected_shape = (1, step, spec.vocab_size)
        assert gqa["logits"].shape == expected_shape
        np.testing.assert_allclose(gqa["logits"], concat["logits"], atol=1e-4)
        np.testing.assert_allclose(gqa["present.1.key"], concat["present.1.key"], atol=1e-5)
        gqa_past, concat_past, position = _presents_as_past(gqa), _presents_as_past(concat), total


def test_lm_builder_rejects_weights_that_do_not_fit_the_spec():
    from onnx_tts.errors import ModelError

    spec = DecoderLMSpec(1, 64, 4, 2, 16, 96, 50)
    weights = random_lm_weights(spec, seed=0)
    weights.layers[0].k = weights.layers[0].k.T.copy()  # torch layout [out, in]
    with pytest.raises(ModelError, match=r"layers\.0\.k .*expected float32\(64, 32\)"):
        build_gqa_lm(spec, weights)
    with pytest.raises(ModelError, match="multiple of kv_heads"):
        DecoderLMSpec(1, 64, 4, 3, 16, 96, 50)


def test_bundle_writer_hashes_every_file_and_refuses_unlisted_ones(tmp_path: Path):
    import json

    from export.onnx_graphs import write_bundle
    from onnx_tts.errors import ModelError

    manifest = {"graphs": {"lm": "lm.onnx"}, "text": {"tokenizer": "tokenizer.json"}}
    files = {"lm.onnx": b"graph bytes", "tokenizer.json": b"{}"}
    sha256, sizes = write_bundle(tmp_path, manifest, files)
    written = json.loads((tmp_path / "bundle.json").read_text())
    assert set(written["sha256"]) == {"lm.onnx", "tokenizer.json"} == set(sha256)
    for name, digest in written["sha256"].items():
        assert hashlib.sha256((tmp_path / name).read_bytes()).hexdigest() == digest
    assert sizes["bundle.json"] == (tmp_path / "bundle.json").stat().st_size

    other = tmp_path / "other"
    with pytest.raises(ModelError, match=r"vocoder\.onnx"):
        write_bundle(other, {**manifest, "vocoder": "vocoder.onnx"}, files)
    assert not other.exists()  # refused before anything was written

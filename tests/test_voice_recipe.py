"""The trained-voice recipe's pieces on tiny data (no teacher or judges needed), and the
"phoneme-mel" runtime family it exports to."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

import onnx_tts
from export.voice import bundle as voice_bundle
from export.voice import codec as voice_codec
from export.voice import data, evaluate, train
from onnx_tts.errors import InputError, ModelError
from onnx_tts.frontend import PhonemeTable, Phonemizer

MEL = voice_bundle.MEL_CONFIG
SYMBOLS = tuple(sorted(set("^$ ,.həloʊwɜːdˈ")))


def chirp(seconds: float = 1.0, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(16000 * seconds)) / 16000
    tone = 0.3 * np.sin(2 * np.pi * (120 + 80 * t) * t * (1 + seed * 0.1))
    return (tone + 0.03 * rng.standard_normal(t.shape)).astype(np.float32)


# -- text -----------------------------------------------------------------------------------------
def test_clean_sentence_keeps_prose_and_drops_the_rest() -> None:
    assert data.clean_sentence("It was 3 dark and stormy nights.") == (
        "It was three dark and stormy nights."
    )
    assert data.clean_sentence("Too short.") is None
    assert data.clean_sentence("SHOUTING ALL THE WAY DOWN THE HALL") is None
    assert data.clean_sentence("Tabs\tand curly {braces} are not speakable here.") is None


def test_fortunes_are_split_deduplicated_and_attributions_dropped(tmp_path: Path) -> None:
    text = (
        "The cat sat on the mat today. The dog did not like that at all.\n"
        "\t\t-- Somebody Famous\n%\nThe cat sat on the mat today.\n%\n"
    )
    (tmp_path / "cookie").write_text(text)
    sentences = data.fortune_sentences(tmp_path)
    assert sentences == ["The cat sat on the mat today.", "The dog did not like that at all."]


def test_heldout_split_is_a_stable_function_of_the_sentence() -> None:
    sentences = [f"Sentence number {i} is here for the split." for i in range(2000)]
    held = [s for s in sentences if data.is_heldout(s)]
    assert 10 < len(held) < 90  # about 2 percent
    assert all(data.is_heldout(s.upper()) for s in held)  # case does not move a sentence


def test_voice_catalog_keeps_heldout_voices_out_of_training() -> None:
    catalog = data.voice_catalog()
    train_names = {v.name for v in catalog["train"]}
    assert not train_names & {v.name for v in catalog["heldout"]}
    assert data.DEFAULT_VOICE in train_names
    plans = data.plan_shards(["a b c d."] * 10, catalog["train"], 50, 20, "train", seed=1)
    assert [len(p.pairs) for p in plans] == [20, 20, 10]
    assert {voice for p in plans for _, voice in p.pairs} <= train_names


def test_phonemizer_keeps_clause_punctuation_and_is_deterministic() -> None:
    phonemizer = Phonemizer("en-us")
    out = phonemizer.phonemize("Hello, world. Is it?")
    assert out == phonemizer.phonemize("Hello, world. Is it?")
    assert out.startswith("həlˈoʊ, ")  # stress mark and punctuation are symbols too
    assert out.count(",") == 1 and out.count(".") == 1 and out.endswith("?")
    assert "wˈɜːld" in out
    table = PhonemeTable(list(SYMBOLS))
    ids = table.encode("həlˈoʊ#")  # unknown symbols are dropped, not guessed
    # The same ids as training uses: symbol i -> i + 1, 0 is the window's padding.
    assert ids == [SYMBOLS.index(ch) + 1 for ch in "həlˈoʊ"]


def test_phoneme_table_rejects_duplicates() -> None:
    with pytest.raises(ModelError, match="duplicate"):
        PhonemeTable(["a", "b", "a"])


# -- alignment ------------------------------------------------------------------------------------
def test_step_pointer_and_inputs_follow_the_durations() -> None:
    cfg = train.TrainConfig(symbols=SYMBOLS)
    # Symbols of 700, 100 (shorter than a step), 1500 and 1300 samples; steps of 640.
    durations = np.array([700, 100, 1500, 1300])
    pointer = train.step_pointer(durations, steps=6, samples_per_step=640)
    assert pointer.tolist() == [0, 2, 2, 2, 3, 3]  # symbol 1 is skipped: too short for a step
    symbols = np.array([1, 2, 3, 4])
    window, progress, advance = train.step_inputs(symbols, pointer, cfg)
    assert progress.tolist() == [0, 0, 1, 2, 0, 1]
    assert advance.tolist() == [2, 0, 0, 1, 0, 1]  # the last step moves past the end
    assert int(advance.sum()) == len(symbols)
    assert window[0].tolist() == [0, 0, 1, 2, 3]  # padding before the first symbol
    assert window[-1].tolist() == [2, 3, 4, 0, 0]


# -- metrics --------------------------------------------------------------------------------------
def test_wer_counts_word_edits_over_reference_words() -> None:
    assert evaluate.corpus_wer(["The cat sat."], ["the cat sat"]) == 0.0
    assert evaluate.corpus_wer(["one two three four"], ["one 2 three"]) == pytest.approx(0.25)
    assert evaluate.corpus_wer(["a b", "c d"], ["a x", "c d e"]) == pytest.approx(0.5)
    with pytest.raises(InputError):
        evaluate.corpus_wer(["a"], [])


# -- model, graphs, training ----------------------------------------------------------------------
TINY = train.TrainConfig(
    layers=1,
    hidden_size=64,
    heads=2,
    kv_heads=1,
    head_dim=32,
    ffn_size=128,
    prenet_size=64,
    batch_steps=400,
    symbols=SYMBOLS,
)


def tiny_stats() -> dict:
    mel = np.concatenate([train.log_mel_frames(chirp(seed=s)) for s in range(3)])
    return {
        "mean": mel.mean(0).tolist(),
        "std": (mel.std(0) + 1e-3).tolist(),
        "symbols": list(SYMBOLS),
        "default_speaker": [0.0] * TINY.speaker_dim,
    }


def tiny_utterances() -> list[data.Utterance]:
    utterances = []
    for seed, phonemes in enumerate(["^həlˈoʊ.$", "^wˈɜːld,$", "^hˈoʊld.$"]):
        audio = chirp(0.6, seed)
        durations = np.full(len(phonemes), len(audio) // len(phonemes))
        durations[-1] += len(audio) - durations.sum()
        utterances.append(data.Utterance("x", f"v{seed % 2}", phonemes, durations, audio))
    return utterances


def tiny_examples(stats: dict) -> list[train.Example]:
    ids = {ch: i + 1 for i, ch in enumerate(SYMBOLS)}
    mean, std = np.array(stats["mean"], np.float32), np.array(stats["std"], np.float32)
    return [train.make_example(u, ids, mean, std, TINY.reduction) for u in tiny_utterances()]


def test_training_lowers_both_losses() -> None:
    torch.manual_seed(0)
    stats = tiny_stats()
    model = train.VoiceModel(TINY)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    batches = train.Batches(tiny_examples(stats), TINY, seed=0)
    batch = batches.tensors(list(range(3)))
    first = None
    for _ in range(60):
        losses = train.batch_losses(model, batch)
        first = first or {k: v.item() for k, v in losses.items()}
        optimizer.zero_grad()
        losses["loss"].backward()
        optimizer.step()
    assert losses["mel_l1"].item() < 0.7 * first["mel_l1"]
    assert losses["advance_ce"].item() < 0.7 * first["advance_ce"]


def test_exported_graphs_match_torch(tmp_path: Path) -> None:
    torch.manual_seed(0)
    stats = tiny_stats()
    model = train.VoiceModel(TINY).eval()
    voice_bundle.write_bundle(tmp_path, model, stats, voice_bundle.VocoderConfig(iterations=3))
    audio = chirp(seed=5)
    mean, std = np.array(stats["mean"], np.float32), np.array(stats["std"], np.float32)
    normed = (train.log_mel_frames(audio) - mean) / std

    encoder = ort.InferenceSession(str(tmp_path / "encoder.onnx"))
    (speaker,) = encoder.run(None, {"audio": audio[None]})
    np.testing.assert_allclose(speaker[0], train.speaker_stats(normed), atol=1e-4)

    example = tiny_examples(stats)[0]
    window, progress, _ = train.step_inputs(example.symbols, example.pointer, TINY)
    steps = 4
    previous = np.zeros((1, steps, TINY.frame_width), np.float32)
    previous[0, 1:] = example.mel[: 2 * (steps - 1)].astype(np.float32).reshape(steps - 1, -1)
    feeds = {
        "previous_frames": previous,
        "phonemes": window[None, :steps],
        "progress": progress[None, :steps],
        "speaker_embedding": speaker,
    }
    (embeds,) = ort.InferenceSession(str(tmp_path / "embed.onnx")).run(None, feeds)
    with torch.no_grad():
        expected = model.embed(*(torch.from_numpy(v) for v in feeds.values()))
        expected_out, _ = model.lm(expected)
    np.testing.assert_allclose(embeds, expected.numpy(), atol=1e-5)

    lm = ort.InferenceSession(str(tmp_path / "lm.onnx"))
    lm_feeds = {
        "inputs_embeds": embeds,
        "seqlens_k": np.array([steps - 1], np.int32),
        "total_sequence_length": np.array(steps, np.int32),
    }
    for tensor in lm.get_inputs():
        if tensor.name.startswith("past_key_values"):
            lm_feeds[tensor.name] = np.zeros((1, TINY.kv_heads, 0, TINY.head_dim), np.float32)
    (out,) = lm.run(["logits"], lm_feeds)
    np.testing.assert_allclose(out, expected_out.numpy(), atol=1e-4)

    vocoder = ort.InferenceSession(str(tmp_path / "vocoder.onnx"))
    (waveform,) = vocoder.run(None, {"mel": normed[None].astype(np.float32)})
    expected = voice_codec.mel_to_audio(
        torch.from_numpy(normed * std + mean)[None], MEL, upsample=2, iterations=3
    )
    assert waveform.shape == (1, len(normed) * MEL.hop_length)
    np.testing.assert_allclose(waveform, expected.numpy(), atol=1e-3)


def test_griffin_lim_power_matches_torch_and_changes_the_audio() -> None:
    stats = tiny_stats()
    mean, std = np.array(stats["mean"], np.float32), np.array(stats["std"], np.float32)
    normed = ((train.log_mel_frames(chirp(seed=6)) - mean) / std).astype(np.float32)
    waves = {}
    for power in (1.0, 0.9):
        parts = voice_bundle.griffin_lim_parts(
            stats, voice_bundle.VocoderConfig(iterations=3, power=power)
        )
        assert parts.section["griffin_lim_power"] == power
        session = ort.InferenceSession(parts.graph.SerializeToString())
        (waves[power],) = session.run(None, {"mel": normed[None]})
        expected = voice_codec.mel_to_audio(
            torch.from_numpy(normed * std + mean)[None], MEL, iterations=3, power=power
        )
        np.testing.assert_allclose(waves[power], expected.numpy(), atol=1e-3)
    assert np.abs(waves[1.0] - waves[0.9]).max() > 1e-2


@pytest.fixture(scope="module")
def tiny_trained() -> tuple[train.VoiceModel, dict]:
    """A tiny model trained a little on one utterance, so the pointer actually moves."""
    torch.manual_seed(0)
    stats = tiny_stats()
    model = train.VoiceModel(TINY)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    batches = train.Batches(tiny_examples(stats), TINY, seed=0)
    for _ in range(150):
        losses = train.batch_losses(model, batches.tensors([0, 1, 2]))
        optimizer.zero_grad()
        losses["loss"].backward()
        optimizer.step()
    return model.eval(), stats


@pytest.fixture(scope="module")
def tiny_bundle(
    tiny_trained: tuple[train.VoiceModel, dict], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    model, stats = tiny_trained
    out = tmp_path_factory.mktemp("voice-bundle")
    voice_bundle.write_bundle(out, model, stats, voice_bundle.VocoderConfig(iterations=2))
    return out


def test_int8_lm_bundle_computes_with_int8_weights_and_reads_back(
    tiny_trained: tuple[train.VoiceModel, dict], tiny_bundle: Path, tmp_path: Path
) -> None:
    import onnx

    model, stats = tiny_trained
    voice_bundle.write_bundle(
        tmp_path, model, stats, voice_bundle.VocoderConfig(iterations=2), lm_int8=True
    )
    manifest = voice_bundle.read_manifest(tmp_path)
    assert manifest["lm"]["weights"] == "int8"
    assert voice_bundle.read_manifest(tiny_bundle)["lm"]["weights"] == "float32"
    graph = onnx.load(str(tmp_path / "lm.onnx")).graph
    ops = [node.op_type for node in graph.node]
    assert "MatMul" not in ops and ops.count("MatMulNBits") == 7 * TINY.layers + 1
    quantized = [t for t in graph.initializer if t.name.endswith("_Q8")]
    assert len(quantized) == 7 * TINY.layers + 1
    assert all(t.data_type == onnx.TensorProto.UINT8 for t in quantized)
    # Read back, each weight is within one quantization step (at most its output channel's
    # largest magnitude / 127) of the trained one; a misread layout would be far off.
    restored = train.model_from_bundle(tmp_path, train.TrainConfig()).state_dict()
    for name, weight in model.state_dict().items():
        step = weight.abs().amax(dim=-1, keepdim=True) / 127 if weight.ndim == 2 else 0
        assert torch.all((restored[name] - weight).abs() <= step + 1e-6), name
    # The engine speaks with it in every KV mode, identically, and close to the float LM.
    outputs = {
        mode: onnx_tts.load(tmp_path, kv=mode, cache_dir=None).synthesize("Hello world.").samples
        for mode in ("copy", "chain", "inplace")
    }
    for mode, samples in outputs.items():
        np.testing.assert_array_equal(samples, outputs["inplace"], err_msg=mode)
    full = onnx_tts.load(tiny_bundle, cache_dir=None).synthesize("Hello world.").samples
    assert outputs["inplace"].shape == full.shape
    a, b = train.log_mel_frames(full), train.log_mel_frames(outputs["inplace"])
    assert np.abs(a - b).mean() < 0.1 * np.abs(a - a.mean(0)).mean()


def test_phoneme_mel_bundle_speaks_identically_in_every_kv_mode(tiny_bundle: Path) -> None:
    engines = {
        mode: onnx_tts.load(tiny_bundle, kv=mode, cache_dir=None)
        for mode in ("copy", "chain", "inplace")
    }
    assert engines["inplace"].info()["family"] == "phoneme-mel"
    outputs = {mode: e.synthesize("Hello world.").samples for mode, e in engines.items()}
    first = outputs["inplace"]
    assert first.dtype == np.float32 and first.size > 0 and np.isfinite(first).all()
    assert first.size % MEL.hop_length == 0
    for mode, samples in outputs.items():
        np.testing.assert_array_equal(samples, first, err_msg=mode)


def test_phoneme_mel_stream_matches_one_shot(tiny_bundle: Path) -> None:
    engine = onnx_tts.load(tiny_bundle, cache_dir=None)
    whole = engine.synthesize("Hello world. Hold.").samples
    streamed = np.concatenate(list(engine.stream("Hello world. Hold.")))
    assert streamed.shape == whole.shape
    # Griffin-Lim finds a phase per window, so samples differ; the spectrum must not: the mean
    # log-mel difference stays far below the signal's own frame-to-frame variation.
    a, b = train.log_mel_frames(whole), train.log_mel_frames(streamed)
    assert np.abs(a - b).mean() < 0.1 * np.abs(a - a.mean(0)).mean()


def test_phoneme_mel_clones_from_a_reference_and_caches_it(
    tiny_bundle: Path, tmp_path: Path
) -> None:
    engine = onnx_tts.load(tiny_bundle, cache_dir=tmp_path / "cache")
    reference = chirp(2.0, seed=7)
    first = engine.synthesize("Hello.", voice=reference).samples
    again = engine.synthesize("Hello.", voice=reference).samples
    np.testing.assert_array_equal(first, again)
    assert engine.cache_stats()["reference"]["memory"]["hits"] >= 1
    default = engine.synthesize("Hello.").samples
    assert not np.array_equal(first[: len(default)], default[: len(first)])


def test_phoneme_mel_bundle_validation_names_the_problem(tiny_bundle: Path, tmp_path: Path) -> None:
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_bundle, broken)
    manifest = json.loads((broken / "bundle.json").read_text())
    del manifest["pointer"]
    (broken / "bundle.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelError, match="pointer"):
        onnx_tts.load(broken, cache_dir=None)
    manifest["pointer"] = {"advance_classes": 5}
    (broken / "bundle.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelError, match="logits"):
        onnx_tts.load(broken, cache_dir=None)


def test_recipe_batches_group_lengths_and_condition_on_another_utterance() -> None:
    stats = tiny_stats()
    examples = tiny_examples(stats) * 4
    batches = train.Batches(examples, TINY, seed=random.Random(1).randrange(100))
    epoch = batches.epoch()
    assert sorted(i for b in epoch for i in b) == list(range(len(examples)))
    tensors = batches.tensors(epoch[0])
    assert tensors["mask"].sum() == sum(len(examples[i].pointer) for i in epoch[0])
    # The previous-frames input is the target shifted by one step (zeros first).
    assert torch.equal(tensors["previous"][:, 1:], tensors["frames"][:, :-1])
    assert float(tensors["previous"][:, 0].abs().sum()) == 0.0


def test_word_final_steps_mark_the_last_phoneme_its_neighbour_and_release() -> None:
    ids = {ch: i + 1 for i, ch in enumerate(SYMBOLS)}
    symbols = np.array([ids[ch] for ch in "^hoʊ wɜːld.$"])
    boundaries = train.Batches([], train.TrainConfig(symbols=SYMBOLS), seed=0).boundaries
    # One step per symbol: the pointer visits every index once.
    marks = train.word_final_steps(symbols, np.arange(len(symbols)), boundaries)
    #                ^  h  o  ʊ  ' ' w  ɜ  ː  l  d  .  $
    expected = [0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0]
    assert marks.tolist() == expected
    # A pointer that skips the short final "d" still marks the step before it.
    skipping = np.array([0, 5, 6, 8, 10, 11])
    assert train.word_final_steps(symbols, skipping, boundaries).tolist() == [0, 0, 0, 1, 1, 0]


def test_final_weight_emphasises_word_final_steps_in_the_mel_loss() -> None:
    stats = tiny_stats()
    examples = tiny_examples(stats)
    plain = train.Batches(examples, TINY, seed=0).tensors([0])
    weighted = train.Batches(
        examples, train.TrainConfig(**{**TINY.__dict__, "final_weight": 4.0}), seed=0
    ).tensors([0])
    final = weighted["weight"][0] > 1.0
    assert bool(final.any()) and bool((~final).any())
    assert torch.equal(plain["weight"], plain["mask"])
    # An error only on word-final steps costs more under the weighting, the same elsewhere.
    model = train.VoiceModel(TINY).eval()
    with torch.no_grad():
        x = model.embed(plain["previous"], plain["window"], plain["progress"], plain["speaker"])
        out, _ = model.lm(x)
    for batch in (plain, weighted):
        batch["frames"] = out[..., : TINY.frame_width].detach().clone()
        batch["frames"][0, final] += 1.0
    with torch.no_grad():
        loss_plain = train.batch_losses(model, plain)
        loss_weighted = train.batch_losses(model, weighted)
    share = float(final.float().mean())
    assert loss_plain["mel_l1"].item() == pytest.approx(share, rel=1e-4)
    assert loss_weighted["mel_l1"].item() == pytest.approx(share, rel=1e-4)
    assert loss_weighted["loss"].item() > loss_plain["loss"].item() + 0.1


def test_model_from_bundle_gives_back_the_exported_weights(tmp_path: Path) -> None:
    torch.manual_seed(3)
    model = train.VoiceModel(TINY).eval()
    voice_bundle.write_bundle(
        tmp_path, model, tiny_stats(), voice_bundle.VocoderConfig(iterations=2)
    )
    restored = train.model_from_bundle(tmp_path, train.TrainConfig(final_weight=2.0))
    assert restored.cfg.final_weight == 2.0  # training settings come from the caller
    assert (restored.cfg.layers, restored.cfg.hidden_size, restored.cfg.ffn_size) == (1, 64, 128)
    original, loaded = model.state_dict(), restored.state_dict()
    assert original.keys() == loaded.keys()
    for name, tensor in original.items():
        assert torch.equal(tensor, loaded[name]), name


def test_blend_weights_interpolates_between_two_models_of_one_architecture() -> None:
    torch.manual_seed(4)
    tuned, base = train.VoiceModel(TINY), train.VoiceModel(TINY)
    ends = {share: train.blend_weights(tuned, base, share).state_dict() for share in (0, 0.7, 1)}
    for name, weight in tuned.state_dict().items():
        other = base.state_dict()[name]
        assert torch.equal(ends[1][name], weight) and torch.equal(ends[0][name], other), name
        assert torch.allclose(ends[0.7][name], 0.7 * weight + 0.3 * other, atol=1e-6), name
    assert not torch.equal(ends[0.7]["lm.head.weight"], ends[1]["lm.head.weight"])
    wider = train.VoiceModel(dataclasses.replace(TINY, ffn_size=256))
    with pytest.raises(ValueError, match="same architecture"):
        train.blend_weights(tuned, wider, 0.5)
    with pytest.raises(ValueError, match="within"):
        train.blend_weights(tuned, base, 1.5)


def test_training_stops_at_a_step_count_in_all_and_resumes_to_the_next(tmp_path: Path) -> None:
    stats = tiny_stats()
    (tmp_path / "mel_stats.json").write_text(json.dumps(stats))
    shard = tmp_path / "data" / "train" / "shard-00000.npz"
    shard.parent.mkdir(parents=True)
    data.save_shard(shard, tiny_utterances())
    checkpoint = tmp_path / "lm" / "checkpoint.pt"
    train.train(tmp_path, TINY, minutes=10, seed=0, max_steps=3)
    first = torch.load(checkpoint, weights_only=False)
    assert first["step"] == 3
    train.train(tmp_path, TINY, minutes=10, seed=0, max_steps=5)
    second = torch.load(checkpoint, weights_only=False)
    assert second["step"] == 5
    assert any(not torch.equal(first["model"][k], second["model"][k]) for k in first["model"])


@pytest.mark.parametrize(
    ("flags", "complaint"),
    [
        (["--blend", "0.5"], "--blend needs --blend-base"),
        (["--blend", "1.5", "--blend-base", "x"], "--blend must be within 0-1"),
        (["--vocoder-lm-share", "2"], "--vocoder-lm-share must be within 0-1"),
        (["--vocoder-phase-weight", "-1"], "--vocoder-phase-weight must be within 0-100"),
        (["--vocoder-learning-rate", "0"], "--vocoder-learning-rate must be within (0, 0.01]"),
        (["--steps", "0"], "--steps must be at least 1"),
        (["--vocoder-steps", "0"], "--vocoder-steps must be at least 1"),
    ],
)
def test_recipe_refuses_out_of_range_settings_before_any_work(
    flags: list[str], complaint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from export import train_voice

    with pytest.raises(SystemExit) as stopped:
        train_voice.main(["--work", str(tmp_path / "w"), "--stages", "export", *flags])
    assert stopped.value.code == 2
    assert complaint in capsys.readouterr().err
    assert not (tmp_path / "w").exists()

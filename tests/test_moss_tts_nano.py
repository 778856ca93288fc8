"""Family moss-tts-nano on small stand-in graphs, checked against a paraphrase of the published
onnxruntime loop (tests/moss_published_loop.py): the same frames and audio for the same seed
in every sample mode, local path and KV mode, for builtin and cloned voices and long chunked
text; streamed audio equals one-shot audio; broken directories, references and texts get one
clear error."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile

from onnx_tts.cache.reference import ReferenceCache
from onnx_tts.errors import AudioError, InputError, ModelError
from onnx_tts.families import FAMILIES, detect
from onnx_tts.families.moss_tts_nano import open_model
from onnx_tts.families.moss_tts_nano.sampling import sample_rows
from tests.moss_published_loop import PublishedLoop, host_sample
from tests.waiting import wait_until

TTS = "MOSS-TTS-Nano-100M-ONNX"
CODEC = "MOSS-Audio-Tokenizer-Nano-ONNX"
TEXT = "Hello there, this is a small test of the stand in."
LONG_TEXT = (
    "The first sentence of a longer text talks about the weather, which is mild today. "
    "A second one follows, with a clause, another clause, and a third clause to be sure. "
    "Then comes a very long sentence that keeps going without much punctuation at all so that "
    "the chunker has to cut it somewhere near the end of its token budget and carry on with "
    "the rest of the words in the next piece of text. Short one. The end."
)
FRAMES = 24  # max_new_frames in most tests: enough for stops and codec windows, quick


@pytest.fixture(scope="module")
def models(moss_models):
    """One loaded stand-in per KV mode (module scope: loading takes a few seconds)."""
    made = {kv: open_model(moss_models, kv=kv, threads=1) for kv in ("copy", "chain")}
    yield made
    for model in made.values():
        model.close()


@pytest.fixture(scope="module")
def official(moss_official):
    with contextlib.closing(open_model(moss_official, threads=1)) as model:
        yield model


@pytest.fixture(scope="module")
def published(moss_models):
    return PublishedLoop(moss_models)


def _frames(model, text, *, seed, voice=None, **options):
    """Every chunk's frames [F, 16] as the family makes them (one generator for the text)."""
    checked = model.request_options({"max_new_frames": FRAMES, **options})
    prompt = model.voice(voice)
    generator = np.random.default_rng(seed) if checked["sampling"].do_sample else None
    chunks = model.text_chunks(text, checked)
    return [
        [list(map(int, f)) for f in model.frames(chunk, prompt, checked, generator)]
        for chunk in chunks
    ]


# -- identical to the published loop ----------------------------------------------------------
PATH_CASES = [
    # (sample_mode, local path forced, local graphs the published loop sees)
    ("fixed", "fixed_frame", {"local_fixed_sampled_frame", "local_cached_step"}),
    ("fixed", "cached_step", {"local_cached_step"}),  # no fixed graph: host sampling
    ("full", "cached_step", {"local_cached_step", "local_fixed_sampled_frame"}),
    ("full", "decoder", set()),
    ("greedy", "cached_step", {"local_cached_step"}),
    ("greedy", "decoder", set()),
    ("greedy", "greedy_frame", {"local_greedy_frame"}),
]


@pytest.mark.parametrize(("mode", "path", "available"), PATH_CASES)
def test_same_frames_as_the_published_loop(models, moss_models, mode, path, available):
    loop = PublishedLoop(moss_models, available=available)
    for seed in (0, 1) if mode != "greedy" else (0,):
        theirs = loop.synthesize(TEXT, seed=seed, sample_mode=mode, max_new_frames=FRAMES)
        for kv, model in models.items():
            ours = _frames(model, TEXT, seed=seed, sample_mode=mode, local_path=path)
            assert ours == theirs["frames"], f"seed {seed}, kv {kv}"


def test_runs_end_by_should_continue_and_by_max_new_frames(models, published):
    lengths = set()
    for seed in range(6):
        frames = _frames(models["chain"], TEXT, seed=seed)[0]
        lengths.add(len(frames))
        theirs = published.synthesize(TEXT, seed=seed, max_new_frames=FRAMES)["frames"][0]
        assert frames == theirs
    assert FRAMES in lengths and min(lengths) < FRAMES  # both stop rules were exercised


@pytest.mark.parametrize("mode", ["fixed", "full", "greedy"])
def test_same_audio_as_the_published_loop(models, published, mode):
    ours = models["chain"].synthesize(TEXT, seed=7, sample_mode=mode, max_new_frames=FRAMES)
    theirs = published.synthesize(TEXT, seed=7, sample_mode=mode, max_new_frames=FRAMES)
    assert ours.dtype == np.float32 and ours.ndim == 2 and ours.shape[1] == 2
    np.testing.assert_array_equal(ours, theirs["waveform"])


def test_default_dispatch_is_the_published_one(official, moss_official):
    info = official.info()
    assert info["local_path_by_mode"] == {
        "greedy": "cached_step",
        "fixed": "fixed_frame",
        "full": "cached_step",
    }
    loop = PublishedLoop(moss_official)
    for mode in ("fixed", "full", "greedy"):
        ours = _frames(official, TEXT, seed=3, sample_mode=mode)
        assert (
            ours == loop.synthesize(TEXT, seed=3, sample_mode=mode, max_new_frames=FRAMES)["frames"]
        )


def test_graphs_a_request_never_needs_are_never_loaded(moss_official, closing):
    model = closing(open_model(moss_official, threads=1))
    model.synthesize(TEXT, seed=0, max_new_frames=4)  # fixed: the frame graph, codec decode
    loaded = {role for role, s in model.sessions.items() if s.loaded}
    assert loaded == {"prefill", "decode_step", "local_fixed_sampled_frame"}
    assert {role for role, s in model.codec_sessions.items() if s.loaded} == {"decode_full"}
    assert len(model.info()["graphs"]) == 8  # info describes them all from the files


def test_long_text_is_chunked_and_spoken_as_published(models, published):
    model = models["chain"]
    checked = model.request_options({"voice_clone_max_text_tokens": 30})
    chunks = model.text_chunks(LONG_TEXT, checked)
    assert chunks == published.split_text(LONG_TEXT, 30)
    assert len(chunks) >= 4
    ours = model.synthesize(
        LONG_TEXT, seed=11, voice="Ava", max_new_frames=FRAMES, voice_clone_max_text_tokens=30
    )
    theirs = published.synthesize(
        LONG_TEXT, seed=11, voice="Ava", max_new_frames=FRAMES, chunk_tokens=30
    )
    # One generator runs through the chunks in order; pauses of 0.24 / 0.40 s between them.
    np.testing.assert_array_equal(ours, theirs["waveform"])


@pytest.mark.parametrize(
    "text",
    [
        "短句。这是一个比较长的中文句子，用来测试中文的切分规则，看看是否和发布的代码一样！还有第三句。",
        "no final punctuation here and lower case start",
        'She said "stop!" and left; then (quietly) she came back. Again.',
        "word " * 120,
    ],
)
def test_chunking_matches_the_published_rules(models, published, text):
    model = models["chain"]
    for budget in (8, 20, 75):
        ours = model.text_chunks(text, {"voice_clone_max_text_tokens": budget})
        assert ours == published.split_text(text, budget), budget


# -- voices -----------------------------------------------------------------------------------
def _reference(path: Path, channels: int, rate: int = 48000, seconds: float = 1.2) -> Path:
    t = np.arange(int(rate * seconds)) / rate
    left = 0.3 * np.sin(2 * np.pi * 220 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
    data = left if channels == 1 else np.stack([left, 0.5 * np.roll(left, 37)], axis=1)
    soundfile.write(path, data.astype(np.float32), rate, subtype="FLOAT")
    return path


@pytest.mark.parametrize("channels", [1, 2])
def test_cloned_voice_matches_the_published_loop(models, published, tmp_path, channels):
    reference = _reference(tmp_path / f"ref{channels}.wav", channels)
    model = models["copy"]
    codes = model.voice(str(reference))["prompt_audio_codes"]
    assert codes.tolist() == published.encode_reference(reference)
    ours = model.synthesize(TEXT, voice=str(reference), seed=5, max_new_frames=FRAMES)
    theirs = published.synthesize(TEXT, reference=reference, seed=5, max_new_frames=FRAMES)
    np.testing.assert_array_equal(ours, theirs["waveform"])


def test_reference_is_encoded_once_through_the_cache(models, tmp_path):
    model = models["chain"]
    reference = _reference(tmp_path / "ref.wav", 1)
    cache = ReferenceCache(memory_bytes=1 << 24, disk_dir=None)
    first = model.voice(str(reference), cache)
    second = model.voice(str(reference), cache)
    stats = cache.stats()
    assert stats["misses"] == 1 and stats["hits"] == 1
    np.testing.assert_array_equal(first["prompt_audio_codes"], second["prompt_audio_codes"])
    # The mono file and a stereo file with two equal channels are one canonical reference.
    mono, rate = soundfile.read(reference, dtype="float32")
    soundfile.write(tmp_path / "dual.wav", np.stack([mono, mono], axis=1), rate, subtype="FLOAT")
    model.voice(str(tmp_path / "dual.wav"), cache)
    assert cache.stats()["hits"] == 2
    identity = json.loads(model.encoder.identity)
    assert identity["encoder_sha256"] and identity["sample_rate"] == 48000


def test_builtin_voices_by_name(models):
    model = models["chain"]
    assert model.voice_names == ["Junhao", "Ava", "Bella"]
    default = model.voice()["prompt_audio_codes"]
    np.testing.assert_array_equal(default, model.voice("Junhao")["prompt_audio_codes"])
    assert not np.array_equal(default[:5], model.voice("Ava")["prompt_audio_codes"][:5])


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "missing.wav", "neither a builtin voice"),
        (lambda d: _write(d / "silent.wav", np.zeros(48000)), "silent"),
        (lambda d: _write(d / "short.wav", 0.3 * np.ones(2000)), "long"),
        (lambda d: _write(d / "six.wav", 0.3 * np.ones((48000, 6))), "6 channels"),
        (lambda d: _garbage(d / "noise.wav"), "cannot decode"),
        (lambda d: _write(d / "loud.wav", np.full(48000, 40.0)), "peaks"),
    ],
)
def test_bad_references_are_refused(models, tmp_path, make, message):
    with pytest.raises(AudioError, match=message):
        models["chain"].synthesize(TEXT, voice=str(make(tmp_path)), seed=0)


def _write(path: Path, data: np.ndarray) -> Path:
    soundfile.write(path, np.asarray(data, np.float32), 48000, subtype="FLOAT")
    return path


def _garbage(path: Path) -> Path:
    path.write_bytes(b"RIFF0000WAVEjunkjunkjunk" * 10)
    return path


def test_non_finite_reference_samples_are_refused(models):
    samples = np.full((2, 48000), np.nan, np.float32)
    with pytest.raises(AudioError, match="NaN"):
        models["chain"].voice(samples)


# -- streaming ------------------------------------------------------------------------------
@pytest.mark.parametrize(("decode_frames", "codec_thread"), [(1, False), (3, True), (None, False)])
def test_stream_equals_one_shot(models, decode_frames, codec_thread):
    model = models["chain"]
    options = {"max_new_frames": FRAMES, "voice_clone_max_text_tokens": 12}
    text = "A first short sentence here. And a second sentence follows it."
    one_shot = model.synthesize(text, seed=2, **options)
    stream = model.stream(
        text, seed=2, decode_frames=decode_frames, codec_thread=codec_thread, **options
    )
    pieces = list(stream)
    streamed = np.concatenate(pieces)
    assert len(pieces) > 3 and streamed.shape == one_shot.shape
    np.testing.assert_allclose(streamed, one_shot, atol=2e-5, rtol=0)


def test_codec_state_copy_and_chain_give_the_same_audio(models):
    codes = np.random.default_rng(0).integers(0, 1024, (13, 16))
    outs = []
    for kv in ("copy", "chain"):
        with models[kv].codec.stream() as stream:
            outs.append(np.concatenate([stream.push(codes[i : i + 4]) for i in range(0, 13, 4)]))
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[1], models["chain"].vocode(codes), atol=2e-5, rtol=0)


def test_codec_state_is_chained_without_a_copy(models):
    with models["chain"].codec.stream() as stream:
        codes = np.zeros((2, 16), np.int64)
        stream.push(codes)
        written = stream.chain.output_data_ptrs()
        assert stream.chain.state_data_ptrs() == written  # outputs became inputs in place
        stream.push(codes)
        assert stream.chain.steps == 2
    with models["copy"].codec.stream() as stream:
        stream.push(codes)
        assert set(stream.chain.state_data_ptrs()).isdisjoint(stream.chain.output_data_ptrs())


def _own_cache_run(model, feeds_frames=3):
    """Admit one request into an OwnCaches home of the model's pool, prefill, one step."""
    from onnx_tts.decoding.kv_rows import OwnCaches
    from onnx_tts.request import Request

    request = model.request(
        TEXT,
        model.voice(),
        model.request_options({"max_new_frames": feeds_frames}),
        np.random.default_rng(0),
    )
    state = model.program.new_state(1)
    admission = model.program.admit(state, 0, Request(request, {}, model.sampling_defaults()))
    home = OwnCaches(model.program, model.pool, model.kv)
    return home, state, admission


def test_global_kv_is_chained_from_the_prefill_graph(models):
    model = models["chain"]
    home, state, admission = _own_cache_run(model)
    rows = np.zeros(1, np.int64)
    try:
        home.prefill(0, admission, None)
        cache = home.caches[0]
        length = admission.inputs.shape[1]
        assert cache.length == length
        assert cache.past_data_ptrs() == cache.present_data_ptrs()  # prefill presents adopted
        model.program.consume(state, rows, np.zeros((1, 32), np.float32))
        home.step(rows, model.program.step_inputs(state, rows))
        assert cache.past_data_ptrs() == cache.present_data_ptrs()
        assert cache.read(0).shape == (1, length + 1, 2, 16)
    finally:
        home.release(0)


def test_closing_generation_returns_the_kv_cache(models):
    model = models["chain"]
    idle = model.pool.idle_count()
    checked = model.request_options({"max_new_frames": FRAMES})
    frames = model.frames(TEXT, model.voice(), checked, np.random.default_rng(0))
    next(frames)
    frames.close()
    _eventually(lambda: model.pool.idle_count() == max(idle, 1))  # freed at the next step


def _eventually(condition):
    """Wait for a worker thread to make `condition` true."""
    wait_until(condition, "the worker freed the row", poll_seconds=0.005)


# -- host sampling is the published one ---------------------------------------------------------
def test_vectorised_host_sampling_draws_the_published_tokens():
    rng = np.random.default_rng(9)
    for trial in range(200):
        vocab = int(rng.integers(2, 300))
        logits = (rng.standard_normal((3, vocab)) * rng.uniform(0.1, 6)).astype(np.float32)
        logits[:, : vocab // 4] = np.round(logits[:, : vocab // 4])  # ties
        temperature = rng.uniform(0.3, 1.5, 3)
        top_k = rng.integers(0, vocab + 2, 3)
        top_p = rng.choice([1.0, 0.95, 0.5, 0.01], 3)
        seeds = rng.integers(0, 1000, 3)
        draws = np.array([np.random.default_rng(s).random() for s in seeds])
        ours = sample_rows(logits, temperature, top_k, top_p, draws)
        for row in range(3):
            expected = host_sample(
                logits[row],
                do_sample=True,
                temperature=float(temperature[row]),
                top_k=int(top_k[row]),
                top_p=float(top_p[row]),
                rng=np.random.default_rng(seeds[row]),
            )
            assert ours[row] == expected, trial


# -- options and text ------------------------------------------------------------------------
def test_options_are_checked(models, official):
    model = models["chain"]
    with pytest.raises(InputError, match="takes no option temperature"):
        model.synthesize(TEXT, temperature=0.5)
    with pytest.raises(InputError, match="sample_mode"):
        model.synthesize(TEXT, sample_mode="beam")
    with pytest.raises(InputError, match="max_new_frames"):
        model.synthesize(TEXT, max_new_frames=0)
    with pytest.raises(InputError, match="bakes audio_temperature"):
        model.synthesize(TEXT, sample_mode="fixed", audio_temperature=1.1)
    with pytest.raises(InputError, match="lacks"):
        official.synthesize(TEXT, sample_mode="greedy", local_path="greedy_frame")
    with pytest.raises(InputError, match="fixed_frame"):
        model.synthesize(TEXT, sample_mode="full", local_path="fixed_frame")
    with pytest.raises(InputError, match="seed"):
        model.synthesize(TEXT, seed=-1)
    with pytest.raises(InputError, match="decode_frames"):
        model.stream(TEXT, decode_frames=0)
    # full mode takes the host sampling options
    audio = model.synthesize(
        TEXT, seed=1, sample_mode="full", audio_temperature=1.1, max_new_frames=4
    )
    assert audio.shape[1] == 2


@pytest.mark.parametrize("text", ["!!! ... ???", "🙂🙂", "   ", ""])
def test_text_with_nothing_to_speak_is_refused(models, text):
    with pytest.raises(InputError, match=r"nothing speakable|empty"):
        models["chain"].synthesize(text)
    with pytest.raises(InputError, match=r"nothing speakable|empty"):
        models["chain"].stream(text)


# -- detection and broken directories ---------------------------------------------------------
def test_detected_from_the_parent_and_from_the_tts_directory(moss_official):
    assert detect(moss_official).family == "moss-tts-nano"
    detection = detect(moss_official / TTS)
    assert detection.family == "moss-tts-nano"
    assert detection.inspected.codec_dir == (moss_official / CODEC).resolve()
    assert "moss-tts-nano" in FAMILIES


def test_onnx_tts_info_shows_the_family(moss_official):
    result = subprocess.run(
        [sys.executable, "-m", "onnx_tts.cli", "info", "--model", str(moss_official), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["family"] == "moss-tts-nano" and info["sample_rate"] == 48000
    assert info["channels"] == 2 and info["kv"]["layout"].startswith("[batch, sequence")
    assert set(info["graphs"]) >= {"prefill", "decode_step", "codec_decode_step"}


def _synth(model_dir, tmp_path, name, *extra):
    out = tmp_path / name
    command = [sys.executable, "-m", "onnx_tts.cli", "synth", TEXT, "--model", str(model_dir)]
    command += ["-o", str(out), "--threads", "1", "--cache-dir", str(tmp_path / "cache")]
    command += ["--seed", "0", "--max-new-frames", "10", "--voice", "Ava", *extra]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return soundfile.read(out, dtype="float32")


def test_cli_synth_writes_48k_stereo_wav_streamed_or_not(moss_official, tmp_path):
    whole, rate = _synth(moss_official, tmp_path, "whole.wav")
    streamed, streamed_rate = _synth(moss_official, tmp_path, "streamed.wav", "--stream")
    assert rate == streamed_rate == 48000
    assert whole.ndim == 2 and whole.shape[1] == 2 and len(whole) == 10 * 3840
    assert streamed.shape == whole.shape
    # decode_step (streamed) and decode_full (one shot) agree up to float rounding: 1 LSB.
    np.testing.assert_allclose(streamed, whole, atol=1.5 / 32767, rtol=0)


def test_cli_broken_request_is_one_line_and_writes_nothing(moss_official, tmp_path):
    out = tmp_path / "out.wav"
    command = [sys.executable, "-m", "onnx_tts.cli", "synth", TEXT, "--model", str(moss_official)]
    command += ["-o", str(out), "--threads", "1", "--voice", "Nobody", "--cache-dir", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "Nobody" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not out.exists()


@pytest.fixture
def broken(moss_official, tmp_path):
    """A fresh copy of the official stand-in to damage."""
    for name in (TTS, CODEC):
        shutil.copytree(moss_official / name, tmp_path / name)
    return tmp_path


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _unlink(directory: str, name: str):
    return lambda d: (d / directory / name).unlink()


def _cut(directory: str, name: str, keep: float = 0.5):
    return lambda d: _truncate(d / directory / name, keep)


def _set(directory: str, name: str, *keys: str | int, value):
    """Set one value inside a JSON file (keys lead to it)."""

    def edit(data) -> None:
        for key in keys[:-1]:
            data = data[key]
        data[keys[-1]] = value

    return lambda d: _edit_json(d / directory / name, edit)


TTS_META, CODEC_META, MANIFEST = (
    "tts_browser_onnx_meta.json",
    "codec_browser_onnx_meta.json",
    "browser_poc_manifest.json",
)
BROKEN_CASES = [
    (
        _unlink(TTS, "moss_tts_global_shared.data"),
        r"missing external-data file .*moss_tts_global_shared\.data",
    ),
    (_cut(TTS, "moss_tts_local_shared.data"), r"local_shared\.data is \d+ bytes .* truncated"),
    (
        _cut(TTS, "moss_tts_decode_step.onnx", 0.3),
        r"moss_tts_decode_step\.onnx cannot be read as an ONNX graph",
    ),
    (
        _unlink(CODEC, "moss_audio_tokenizer_decode_step.onnx"),
        r"missing graph .*moss_audio_tokenizer_decode_step\.onnx",
    ),
    (_unlink(TTS, "tokenizer.model"), r"missing tokenizer"),
    (_set(TTS, TTS_META, "model_config", "n_vq", value=8), r"codebook_sizes must list 8"),
    (
        _set(TTS, TTS_META, "model_config", "hidden_size", value=64),
        r"global_hidden' dimension 2 is 32, expected 64",
    ),
    (_set(TTS, TTS_META, "format_version", value=3), r"format_version 3"),
    (
        _set(CODEC, CODEC_META, "codec_config", "num_quantizers", value=8),
        r"8 quantizers .* pair MOSS-TTS-Nano-100M-ONNX with its own",
    ),
    (
        _set(
            CODEC,
            CODEC_META,
            "streaming_decode",
            "attention_caches",
            0,
            "cache_shape",
            value=[1, 2, 7, 8],
        ),
        r"attn_cached_keys_0' dimension 2 is 6, expected 7",
    ),
    (
        _set(TTS, MANIFEST, "model_files", "codec_meta", value="../../../etc/codec_meta.json"),
        r"outside the model directories",
    ),
    (
        _set(TTS, MANIFEST, "model_files", "tokenizer_model", value=f"../{CODEC}/x.model"),
        r"outside the model directories",
    ),
    (_set(TTS, TTS_META, "files", "prefill", value="../prefill.onnx"), r"plain file name"),
    (_set(TTS, MANIFEST, "tts_config", "audio_end_token_id", value=5), r"different exports"),
    (
        _set(TTS, MANIFEST, "builtin_voices", 0, "prompt_audio_codes", value=[[5000] * 16]),
        r"prompt_audio_codes must be",
    ),
    (lambda d: (d / TTS / MANIFEST).write_text("{not json"), r"not valid JSON"),
]


@pytest.mark.parametrize(("damage", "message"), BROKEN_CASES)
def test_broken_directories_get_one_clear_error(broken, damage, message):
    damage(broken)
    with pytest.raises(ModelError, match=message) as caught:
        detect(broken)
    assert "\n" not in str(caught.value)


def test_cli_names_the_broken_file_and_exits_2(broken):
    (broken / TTS / "moss_tts_global_shared.data").unlink()
    result = subprocess.run(
        [sys.executable, "-m", "onnx_tts.cli", "info", "--model", str(broken)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2
    assert "moss_tts_global_shared.data" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_legacy_directory_names_resolve(broken):
    (broken / CODEC).rename(broken / (CODEC + "-CPU"))
    _edit_json(
        broken / TTS / "browser_poc_manifest.json",
        lambda m: m["model_files"].update(
            codec_meta=f"../{CODEC}-CPU/codec_browser_onnx_meta.json"
        ),
    )
    assert detect(broken).inspected.codec_dir.name == CODEC + "-CPU"
    (broken / (CODEC + "-CPU")).rename(broken / CODEC)
    assert detect(broken).inspected.codec_dir.name == CODEC  # the legacy path falls back


# -- the in-place KV cache (onnx-tts convert --inplace-kv) -------------------------------------
@pytest.fixture(scope="module")
def moss_inplace(moss_official, tmp_path_factory):
    target = tmp_path_factory.mktemp("moss-inplace") / "models"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "onnx_tts.cli",
            "convert",
            "--inplace-kv",
            str(moss_official),
            str(target),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "2 attention blocks -> GroupQueryAttention" in result.stdout
    return target


def test_converted_decode_step_keeps_the_published_files(moss_official, moss_inplace):
    import onnx

    decode = moss_inplace / TTS / "moss_tts_decode_step.onnx"
    model = onnx.load(str(decode), load_external_data=False)
    assert sum(n.op_type == "GroupQueryAttention" for n in model.graph.node) == 2
    assert not any(
        n.op_type == "Concat" and "present" in "".join(n.output) for n in model.graph.node
    )
    inputs = {i.name: i for i in model.graph.input}
    dims = [d.dim_value or d.dim_param for d in inputs["past_key_0"].type.tensor_type.shape.dim]
    assert dims[1:] == [2, "past_sequence_length", 16]  # [batch, heads, capacity, head_dim]
    assert {"seqlens_k", "total_sequence_length", "past_valid_lengths"} <= set(inputs)
    # Weights stay in the shared file (stored once); every other file is the published one.
    locations = {
        e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"
    }
    assert locations == {"moss_tts_global_shared.data"}
    for directory in (TTS, CODEC):
        for path in (moss_official / directory).iterdir():
            if path.name != "moss_tts_decode_step.onnx":
                assert path.read_bytes() == (moss_inplace / directory / path.name).read_bytes()


@pytest.mark.parametrize("kv", ["inplace", "chain", "copy"])
def test_in_place_kv_gives_the_published_frames(moss_inplace, moss_official, kv, closing):
    model = closing(open_model(moss_inplace, kv=kv, threads=1))
    assert model.kv_mode == kv and model.kv.attention == "gqa"
    loop = PublishedLoop(moss_official)
    for mode in ("fixed", "full", "greedy"):
        ours = _frames(model, TEXT, seed=4, sample_mode=mode)
        theirs = loop.synthesize(TEXT, seed=4, sample_mode=mode, max_new_frames=FRAMES)
        assert ours == theirs["frames"], mode


def test_in_place_slot_row_takes_the_prefill_and_never_moves(moss_inplace, closing):
    from onnx_tts.decoding.kv_rows import SlotRows
    from onnx_tts.request import Request

    model = closing(open_model(moss_inplace, threads=1))
    request = model.request(
        TEXT, model.voice(), model.request_options({"max_new_frames": 3}), np.random.default_rng(0)
    )
    state = model.program.new_state(1)
    admission = model.program.admit(state, 0, Request(request, {}, model.sampling_defaults()))
    slots = SlotRows(model.program, model.kv, model.pool.capacity, max_rows=2)
    assert slots.reserve(0, admission.max_tokens)
    rows = np.zeros(1, np.int64)
    slots.prefill(0, admission, None)  # [B, S, H, D] presents copied into [B, H, cap, D]
    length = admission.inputs.shape[1]
    prefill = model.program.prefill_lm.run(
        {"input_ids": admission.inputs, "attention_mask": np.ones((1, length), np.int32)}
    )
    first = slots.slots.read(0, 0, length)
    np.testing.assert_array_equal(first, prefill["present_key_0"].transpose(0, 2, 1, 3))
    buffers = slots.row_ptrs(0)
    model.program.consume(state, rows, np.zeros((1, 32), np.float32))
    slots.step(rows, model.program.step_inputs(state, rows))
    assert slots.row_ptrs(0) == buffers and slots.lengths[0] == length + 1
    np.testing.assert_array_equal(slots.slots.read(0, 0, length), first)


def test_converting_twice_is_refused(moss_inplace, tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "onnx_tts.cli",
            "convert",
            "--inplace-kv",
            str(moss_inplace),
            str(tmp_path / "again"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 2 and "GroupQueryAttention" in result.stderr
    assert not (tmp_path / "again").exists()


def test_closing_a_stream_midway_frees_its_caches(models):
    model = models["chain"]
    idle = model.pool.idle_count()
    stream = model.stream(TEXT, seed=1, decode_frames=1, codec_thread=True, max_new_frames=FRAMES)
    next(stream)
    stream.close()  # a codec decode may be in flight on the worker: waited for, then released
    _eventually(lambda: model.pool.idle_count() >= max(idle, 1))  # freed at the next step
    assert len(model.codec._idle) >= 1
    again = model.synthesize(TEXT, seed=1, max_new_frames=FRAMES)
    np.testing.assert_allclose(
        np.concatenate(list(model.stream(TEXT, seed=1, max_new_frames=FRAMES))), again, atol=2e-5
    )


# -- through the Engine (onnx_tts.load): the scheduler, the vocoder stage, the server --------
TEXTS = [
    "Hello there.",
    TEXT,
    "A somewhat longer sentence, to give this row a longer prompt than the others have.",
    "Short.",
]


@pytest.fixture(scope="module")
def engines(moss_official, moss_inplace):
    """Engines in every KV mode: in place with batched slot rows, chain and copy on caches of
    their own."""
    import onnx_tts

    made = {
        "inplace": onnx_tts.load(moss_inplace, threads=1, cache_dir=None, max_batch=8),
        "chain": onnx_tts.load(moss_official, kv="chain", threads=1, cache_dir=None, max_batch=8),
        "copy": onnx_tts.load(moss_official, kv="copy", threads=1, cache_dir=None, max_batch=8),
    }
    yield made
    for engine in made.values():
        engine.close()


def _engine_frames(engine, text, seed, voice="Ava", **options):
    """The frames of a one-chunk text through the engine's scheduler."""
    options = {"max_new_frames": FRAMES, **options}
    prompt = engine.voice(voice)
    sampling = engine.backend.sampling_defaults().with_overrides({"seed": seed})
    [chunk] = engine.backend.text_chunks(text, engine.backend.request_options(options))
    return [list(map(int, f)) for f in engine.generate(chunk, prompt, sampling, options)]


def test_engine_kv_modes_give_the_published_frames(engines, moss_official):
    assert engines["inplace"].info()["batching"]["batched"] is True
    assert engines["inplace"].info()["kv_mode"] == "inplace"
    loop = PublishedLoop(moss_official)
    for mode in ("fixed", "full", "greedy"):
        theirs = loop.synthesize(TEXT, seed=5, voice="Ava", sample_mode=mode, max_new_frames=FRAMES)
        for kv, engine in engines.items():
            ours = _engine_frames(engine, TEXT, seed=5, sample_mode=mode)
            assert [ours] == theirs["frames"], (mode, kv)


def test_engine_batch_is_invariant(engines):
    """12 requests of different lengths at once (rows of shared steps, 8 at a time) make the
    frames each makes alone."""
    import threading

    engine = engines["inplace"]
    jobs = [(TEXTS[i % len(TEXTS)], i, "full" if i % 3 == 0 else "fixed") for i in range(12)]
    alone = [_engine_frames(engine, text, seed, sample_mode=mode) for text, seed, mode in jobs]
    steps = engine.stats()["steps"]
    row_steps = engine.stats()["row_steps"]
    together: list = [None] * len(jobs)
    start = threading.Barrier(len(jobs))

    def run(index: int) -> None:
        text, seed, mode = jobs[index]
        start.wait()
        together[index] = _engine_frames(engine, text, seed, sample_mode=mode)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert together == alone
    stats = engine.stats()
    assert (stats["row_steps"] - row_steps) / (stats["steps"] - steps) > 2  # really batched


def test_prompts_admitted_together_prefill_side_by_side(engines):
    """Requests admitted in one round run their prompts through the prefill graph on the
    prefill workers at once, each into its own slot row, and make the frames each makes
    alone."""
    from onnx_tts.decoding.scheduler import DecodeScheduler
    from onnx_tts.request import Request

    engine = engines["inplace"]
    backend = engine.backend
    jobs = [(TEXTS[i % len(TEXTS)], i, "full" if i % 2 else "fixed") for i in range(5)]
    alone = [_engine_frames(engine, text, seed, sample_mode=mode) for text, seed, mode in jobs]
    scheduler = DecodeScheduler(backend.program, backend.pool, max_batch=8, prefill_workers=3)
    try:
        requests = []
        for text, seed, mode in jobs:
            options = backend.request_options({"max_new_frames": FRAMES, "sample_mode": mode})
            [chunk] = backend.text_chunks(text, options)
            sampling = backend.sampling_defaults().with_overrides({"seed": seed})
            requests.append(Request(chunk, engine.voice("Ava"), sampling, options))
        with scheduler._cv:  # the worker waits for the lock: all five are admitted at once
            streams = [scheduler.submit(request) for request in requests]
        together = [[list(map(int, frame)) for frame in stream] for stream in streams]
        stats = scheduler.stats()
    finally:
        scheduler.close()
    assert together == alone
    assert stats["prefills"] == stats["parallel_prefills"] == len(jobs)


@pytest.mark.parametrize("kv", ["inplace", "chain"])
def test_engine_stream_equals_one_shot(engines, kv):
    engine = engines[kv]
    text = "A first short sentence here. And a second sentence follows it."
    options = {"max_new_frames": FRAMES, "voice_clone_max_text_tokens": 12, "sample_mode": "greedy"}
    one_shot = engine.synthesize(text, voice="Ava", seed=2, **options)
    assert one_shot.sample_rate == 48000 and one_shot.samples.shape[1] == 2
    pieces = list(engine.stream(text, voice="Ava", seed=2, stride_frames=3, **options))
    streamed = np.concatenate(pieces)
    assert len(pieces) > 3 and streamed.shape == one_shot.samples.shape
    np.testing.assert_allclose(streamed, one_shot.samples, atol=2e-5, rtol=0)
    # The chunks are separated by the published pauses.
    chunks = engine.backend.text_chunks(text, engine.backend.request_options(options))
    pause = round(48000 * engine.backend.pause_seconds(chunks[0]))
    assert len(chunks) == 2 and np.count_nonzero(np.abs(one_shot.samples).max(axis=1) == 0) >= pause


def test_engine_clones_a_voice_through_the_reference_cache(moss_official, tmp_path):
    import onnx_tts

    engine = onnx_tts.load(moss_official, threads=1, cache_dir=tmp_path / "cache")
    try:
        rng = np.random.default_rng(0)
        path = tmp_path / "ref.wav"
        soundfile.write(path, (0.3 * rng.standard_normal(24000)).astype(np.float32), 24000)
        voice = engine.voice(str(path))
        assert voice["prompt_audio_codes"].shape[1] == 16
        again = engine.voice(str(path))
        np.testing.assert_array_equal(voice["prompt_audio_codes"], again["prompt_audio_codes"])
        assert engine.cache_stats()["reference"]["hits"] >= 1
        options = {"max_new_frames": 6, "sample_mode": "greedy"}
        audio = engine.synthesize(TEXT, voice=str(path), seed=1, **options)
        assert audio.samples.shape[1] == 2
    finally:
        engine.close()


def test_server_lists_builtin_voices_and_sends_24k_mono_pcm(moss_inplace, tmp_path):
    import httpx

    from benchmarks.live_server import LiveServer

    live = LiveServer(tmp_path, "--model", str(moss_inplace), "--threads", "1")
    try:
        voices = {v["id"] for v in httpx.get(live.url + "/v1/audio/voices").json()["voices"]}
        assert {"default", "Ava"} <= voices
        body = {"input": TEXT, "voice": "Ava", "seed": 0, "max_new_frames": 10}
        pcm = httpx.post(
            live.url + "/v1/audio/speech", json={**body, "response_format": "pcm"}, timeout=120
        )
        wav = httpx.post(
            live.url + "/v1/audio/speech", json={**body, "response_format": "wav"}, timeout=120
        )
        unknown = httpx.post(
            live.url + "/v1/audio/speech", json={**body, "voice": "Nobody"}, timeout=120
        )
    finally:
        live.stop()
    assert pcm.status_code == 200 and len(pcm.content) == 10 * 0.08 * 24000 * 2  # s16le mono
    samples, rate = soundfile.read(io.BytesIO(wav.content), dtype="float32")
    assert rate == 48000 and samples.ndim == 1 and len(samples) == 10 * 3840  # downmixed
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "voice_not_found"

"""Family moss-tts-nano on small stand-in graphs, checked through the public API (the Engine of
`onnx_tts.load`, the CLI and the server, caches on) against a paraphrase of the published
onnxruntime loop (tests/moss_published_loop.py): the same frames and audio for the same text,
voice and seed in every sample mode, local path and KV mode, for builtin voices and voices
cloned from mono or stereo files, one chunk or several (one generator through the chunks in
order, as published; `parallel_chunks` documented as seed + i per chunk); streamed audio
equals one-shot audio; broken directories, references and texts get one clear error."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import soundfile

import onnx_tts
from onnx_tts.audio import pcm16
from onnx_tts.decoding.request import Request
from onnx_tts.errors import AudioError, EmptyAudioError, InputError, ModelError
from onnx_tts.families import FAMILIES, detect
from onnx_tts.families.moss_tts_nano.sampling import sample_rows
from tests.moss_published_loop import PAUSE_LONG, PAUSE_SHORT, PublishedLoop, host_sample
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
SSML_LEAD = '<speak><break time="500ms"/>'
FRAMES = 24  # max_new_frames in most tests: enough for stops and codec windows, quick
MODES = ("fixed", "full", "greedy")


@pytest.fixture(scope="module")
def engines(moss_models, tmp_path_factory):
    """The stand-in as users load it (`onnx_tts.load` defaults: reference cache on, batched
    scheduler), in the two KV modes of a Concat graph, plus the faithful path max_batch=1 and
    an engine with the result cache on."""
    cache = tmp_path_factory.mktemp("moss-cache")
    made = {
        "chain": onnx_tts.load(moss_models, cache_dir=cache / "chain"),
        "copy": onnx_tts.load(moss_models, kv="copy", cache_dir=cache / "copy"),
        "solo": onnx_tts.load(moss_models, max_batch=1, threads=1, cache_dir=cache / "solo"),
        "results": onnx_tts.load(
            moss_models, cache_dir=cache / "results", result_cache_bytes=64 << 20
        ),
    }
    yield made
    for engine in made.values():
        engine.close()


@pytest.fixture(scope="module")
def official(moss_official, tmp_path_factory):
    engine = onnx_tts.load(moss_official, cache_dir=tmp_path_factory.mktemp("moss-official"))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def published(moss_models):
    return PublishedLoop(moss_models)


def _frames(engine, text, *, seed, voice=None, **options):
    """The frames [F, 16] of a one-chunk text through the engine's scheduler (the LM stage of
    the public Engine: `voice()`, `generate()`)."""
    options = {"max_new_frames": FRAMES, **options}
    model = engine.model
    checked = model.request_options(options)
    [chunk] = model.text.chunks(text, checked)
    sampling = model.sampling_defaults().with_overrides({"seed": seed})
    frames = engine.generate(chunk, engine.voice(voice), sampling, options)
    return [list(map(int, frame)) for frame in frames]


def _speaking(loop, text, start=0, **options):
    """(seed, published run) of the first seed from `start` whose published run speaks every
    chunk: the random stand-in may stop a chunk at its first step, which the engine refuses
    as no audio (tested apart), so such seeds would compare nothing."""
    for seed in range(start, start + 100):
        theirs = loop.synthesize(text, seed=seed, **options)
        if all(theirs["frames"]):
            return seed, theirs
    raise AssertionError(f"no seed in [{start}, {start + 100}) speaks every chunk of {text!r}")


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
def test_same_frames_as_the_published_loop(engines, moss_models, mode, path, available):
    loop = PublishedLoop(moss_models, available=available)
    for seed in (0, 1) if mode != "greedy" else (0,):
        theirs = loop.synthesize(TEXT, seed=seed, sample_mode=mode, max_new_frames=FRAMES)
        for kv in ("chain", "copy", "solo"):
            ours = _frames(engines[kv], TEXT, seed=seed, sample_mode=mode, local_path=path)
            assert [ours] == theirs["frames"], f"seed {seed}, {kv}"


def test_runs_end_by_should_continue_and_by_max_new_frames(engines, published):
    lengths = set()
    for seed in range(6):
        frames = _frames(engines["chain"], TEXT, seed=seed)
        lengths.add(len(frames))
        theirs = published.synthesize(TEXT, seed=seed, max_new_frames=FRAMES)["frames"]
        assert [frames] == theirs
    assert FRAMES in lengths and min(lengths) < FRAMES  # both stop rules were exercised


@pytest.mark.parametrize("mode", MODES)
def test_same_audio_as_the_published_loop(engines, published, mode):
    theirs = published.synthesize(TEXT, seed=7, sample_mode=mode, max_new_frames=FRAMES)
    for kv in ("chain", "copy", "solo", "results"):
        for _ in range(2 if kv == "results" else 1):  # made, then replayed from the cache
            ours = engines[kv].synthesize(TEXT, seed=7, sample_mode=mode, max_new_frames=FRAMES)
            assert ours.sample_rate == 48000 and ours.samples.shape[1] == 2
            np.testing.assert_array_equal(ours.samples, theirs["waveform"], err_msg=kv)
    assert engines["results"].cache_stats()["result"]["hits"] >= 1


@pytest.mark.parametrize("mode", MODES)
def test_several_chunks_draw_from_one_generator_in_order_as_published(engines, published, mode):
    options = {"max_new_frames": FRAMES, "voice_clone_max_text_tokens": 30}
    seed, theirs = _speaking(
        published,
        LONG_TEXT,
        11,
        voice="Ava",
        sample_mode=mode,
        max_new_frames=FRAMES,
        chunk_tokens=30,
    )
    assert len(theirs["chunks"]) >= 4
    for kv in ("chain", "solo", "results"):
        ours = engines[kv].synthesize(
            LONG_TEXT, seed=seed, voice="Ava", sample_mode=mode, **options
        )
        # One generator runs through the chunks in order; pauses of 0.24 / 0.40 s between them.
        np.testing.assert_array_equal(ours.samples, theirs["waveform"], err_msg=kv)
    streamed = np.concatenate(
        list(
            engines["chain"].stream(LONG_TEXT, seed=seed, voice="Ava", sample_mode=mode, **options)
        )
    )
    assert streamed.shape == theirs["waveform"].shape
    # decode_step windows vs decode_full: the same audio up to float rounding.
    np.testing.assert_allclose(streamed, theirs["waveform"], atol=2e-5, rtol=0)


def test_parallel_chunks_seed_chunk_i_with_seed_plus_i(engines, published):
    """`parallel_chunks`: the chunks decode at once as rows, chunk i drawing from a generator
    of its own seeded seed + i: each chunk is the published loop's run of that chunk alone
    with that seed, joined by the published pauses."""
    engine = engines["chain"]
    options = {"max_new_frames": FRAMES, "voice_clone_max_text_tokens": 30}
    chunks = engine.model.text.chunks(LONG_TEXT, engine.model.request_options(options))
    seed = next(  # a seed for which each chunk alone, seeded seed + i, speaks
        s
        for s in range(21, 121)
        if all(
            published.synthesize(c, seed=s + i, voice="Ava", max_new_frames=FRAMES)["frames"][0]
            for i, c in enumerate(chunks)
        )
    )
    pieces, frames = [], []
    for index, chunk in enumerate(chunks):
        alone = published.synthesize(
            chunk, seed=seed + index, voice="Ava", max_new_frames=FRAMES, chunk_tokens=10_000
        )
        pieces.append(alone["waveform"])
        frames += alone["frames"]
        if index < len(chunks) - 1:
            pause = PAUSE_SHORT if len(chunk.split()) <= 4 else PAUSE_LONG
            pieces.append(np.zeros((round(48000 * pause), 2), np.float32))
    ours = engine.synthesize(LONG_TEXT, seed=seed, voice="Ava", parallel_chunks=True, **options)
    np.testing.assert_array_equal(ours.samples, np.concatenate(pieces))
    # The published order draws chunk 0 alike and the later chunks from where it left off.
    sequential = published.synthesize(
        LONG_TEXT, seed=seed, voice="Ava", max_new_frames=FRAMES, chunk_tokens=30
    )["frames"]
    assert sequential[0] == frames[0] and sequential[1:] != frames[1:]


def test_default_dispatch_is_the_published_one(official, moss_official):
    info = official.info()
    assert info["local_path_by_mode"] == {
        "greedy": "cached_step",
        "fixed": "fixed_frame",
        "full": "cached_step",
    }
    loop = PublishedLoop(moss_official)
    for mode in MODES:
        ours = _frames(official, TEXT, seed=3, sample_mode=mode)
        theirs = loop.synthesize(TEXT, seed=3, sample_mode=mode, max_new_frames=FRAMES)
        assert [ours] == theirs["frames"]


def test_the_default_path_loads_with_the_model_and_the_rest_never(moss_official, tmp_path):
    """The graphs a request with the load options needs load with the model (the first
    request then runs as fast as the next); other local paths and the encoder never load
    unless a request needs them."""
    default = {"prefill", "decode_step", "codec_decode_full", "codec_decode_step"}
    for options, local in (
        ({}, "local_fixed_sampled_frame"),  # fixed: the published dispatch's frame graph
        ({"sample_mode": "full"}, "local_cached_step"),
        ({"local_path": "decoder"}, "local_decoder"),
    ):
        engine = onnx_tts.load(moss_official, cache_dir=tmp_path, **options)
        try:
            graphs = engine.model.graphs
            at_load = {role for role in graphs.sessions if graphs.loaded(role)}
            engine.synthesize(TEXT, seed=0, max_new_frames=4)
            list(engine.stream(TEXT, seed=0, max_new_frames=4))
            after = {role for role in graphs.sessions if graphs.loaded(role)}
            assert at_load == after == {*default, local}, options
            assert len(engine.info()["graphs"]) == 8  # info describes them all from the files
        finally:
            engine.close()


def test_quantize_judges_the_frame_graphs_choices_one_by_one(moss_models, tmp_path):
    """`onnx-tts quantize` with its agreement bars keeps the local depth transformer int8 on
    the stand-in: its choices are judged one by one through the graphs that take each
    channel's input as given (local_decoder, local_cached_step logits), the frame graphs by
    their continue decision (their 16 chained codes diverge after one flip on flat random
    logits; that kept the published-shape stand-in's local transformer float)."""
    from onnx_tts.tools.quantize import Thresholds, WeightsSpec, quantize_model

    out = tmp_path / "int8"
    report = quantize_model(
        moss_models, out, WeightsSpec("int8"), thresholds=Thresholds(max_speed_ratio=1e9)
    )
    local = next(r for r in report.results if r.job.name == "moss_tts_local_shared")
    assert local.kept, local.reason
    compared = {
        name: {o.name for o in agreement.outputs} for name, agreement in local.agreements.items()
    }
    assert compared["local_fixed_sampled_frame"] == {"should_continue"}
    assert compared["local_greedy_frame"] == {"should_continue"}
    assert {"text_logits", "audio_logits"} <= compared["local_decoder"]
    assert {"text_logits", "audio_logits"} <= compared["local_cached_step"]


@pytest.mark.parametrize(
    "text",
    [
        "短句。这是一个比较长的中文句子，用来测试中文的切分规则，看看是否和发布的代码一样！还有第三句。",
        "no final punctuation here and lower case start",
        'She said "stop!" and left; then (quietly) she came back. Again.',
        "word " * 120,
        LONG_TEXT,
    ],
)
def test_chunking_matches_the_published_rules(engines, published, text):
    model = engines["chain"].model
    for budget in (8, 20, 75):
        options = model.request_options({"voice_clone_max_text_tokens": budget})
        assert model.text.chunks(text, options) == published.split_text(text, budget), budget


# -- voices -----------------------------------------------------------------------------------
def _reference(path: Path, channels: int, rate: int = 48000, seconds: float = 1.2) -> Path:
    t = np.arange(int(rate * seconds)) / rate
    left = 0.3 * np.sin(2 * np.pi * 220 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
    data = left if channels == 1 else np.stack([left, 0.5 * np.roll(left, 37)], axis=1)
    soundfile.write(path, data.astype(np.float32), rate, subtype="FLOAT")
    return path


@pytest.mark.parametrize(("channels", "rate"), [(1, 48000), (2, 48000), (2, 44100)])
def test_cloned_voice_matches_the_published_loop(engines, published, tmp_path, channels, rate):
    """A reference at the codec's 48 kHz, mono or stereo, gives the published prompt codes and
    audio; one at another rate is resampled first (soxr here and in the test's paraphrase: the
    published torchaudio resampler may round differently)."""
    reference = _reference(tmp_path / f"ref{channels}.wav", channels, rate)
    expected = published.encode_reference(reference)
    assert 0 < len(expected) < 20
    for kv in ("chain", "copy", "solo"):
        engine = engines[kv]
        for _ in range(2):  # encoded, then from the reference cache
            assert engine.voice(str(reference))["prompt_audio_codes"].tolist() == expected
    theirs = published.synthesize(TEXT, reference=reference, seed=5, max_new_frames=FRAMES)
    for kv in ("chain", "solo"):
        ours = engines[kv].synthesize(TEXT, voice=str(reference), seed=5, max_new_frames=FRAMES)
        np.testing.assert_array_equal(ours.samples, theirs["waveform"], err_msg=kv)


def test_cloned_voice_over_several_chunks(engines, published, tmp_path):
    reference = _reference(tmp_path / "stereo.wav", 2)
    options = {"max_new_frames": FRAMES, "voice_clone_max_text_tokens": 30}
    seed, theirs = _speaking(
        published, LONG_TEXT, 3, reference=reference, max_new_frames=FRAMES, chunk_tokens=30
    )
    ours = engines["chain"].synthesize(LONG_TEXT, voice=str(reference), seed=seed, **options)
    np.testing.assert_array_equal(ours.samples, theirs["waveform"])


def test_reference_is_encoded_once_through_the_cache(engines, tmp_path):
    engine = engines["chain"]
    reference = _reference(tmp_path / "ref.wav", 1, seconds=1.37)  # a clip no other test uses
    before = engine.cache_stats()["reference"]
    first = engine.voice(str(reference))
    second = engine.voice(str(reference))
    stats = engine.cache_stats()["reference"]
    assert stats["misses"] - before["misses"] == 1 and stats["hits"] - before["hits"] == 1
    np.testing.assert_array_equal(first["prompt_audio_codes"], second["prompt_audio_codes"])
    # The mono file and a stereo file with two equal channels are one canonical reference.
    mono, rate = soundfile.read(reference, dtype="float32")
    soundfile.write(tmp_path / "dual.wav", np.stack([mono, mono], axis=1), rate, subtype="FLOAT")
    engine.voice(str(tmp_path / "dual.wav"))
    assert engine.cache_stats()["reference"]["hits"] - before["hits"] == 2
    identity = json.loads(engine.model.encoder.identity)
    assert identity["encoder_sha256"] and identity["sample_rate"] == 48000


def test_builtin_voices_by_name(engines):
    engine = engines["chain"]
    assert engine.voice_names == ("Junhao", "Ava", "Bella")
    default = engine.voice()["prompt_audio_codes"]
    np.testing.assert_array_equal(default, engine.voice("Junhao")["prompt_audio_codes"])
    assert not np.array_equal(default[:5], engine.voice("Ava")["prompt_audio_codes"][:5])


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
def test_bad_references_are_refused(engines, tmp_path, make, message):
    with pytest.raises(AudioError, match=message):
        engines["chain"].synthesize(TEXT, voice=str(make(tmp_path)), seed=0)


def _write(path: Path, data: np.ndarray) -> Path:
    soundfile.write(path, np.asarray(data, np.float32), 48000, subtype="FLOAT")
    return path


def _garbage(path: Path) -> Path:
    path.write_bytes(b"RIFF0000WAVEjunkjunkjunk" * 10)
    return path


def test_non_finite_reference_samples_are_refused(engines):
    samples = np.full((2, 48000), np.nan, np.float32)
    with pytest.raises(AudioError, match="NaN"):
        engines["chain"].voice(samples)


@pytest.mark.parametrize(
    "codes",
    [
        np.full((4, 16), 3.0),  # floats: not codes
        np.full((4, 16), 5000),  # past the codebook
        np.full((4, 8), 3),  # the wrong number of codebooks
    ],
)
def test_bad_encoded_voices_are_refused(engines, codes):
    with pytest.raises(AudioError, match="prompt_audio_codes must be integer codes"):
        engines["chain"].synthesize(TEXT, voice={"prompt_audio_codes": codes}, seed=0)


# -- streaming ------------------------------------------------------------------------------
@pytest.mark.parametrize("stride", [1, 3, 8])
def test_stream_equals_one_shot(engines, stride):
    engine = engines["chain"]
    options = {"max_new_frames": FRAMES, "voice_clone_max_text_tokens": 12}
    text = "A first short sentence here. And a second sentence follows it."
    one_shot = engine.synthesize(text, seed=2, **options).samples
    pieces = list(engine.stream(text, seed=2, stride_frames=stride, **options))
    streamed = np.concatenate(pieces)
    assert len(pieces) > 3 and streamed.shape == one_shot.shape
    np.testing.assert_allclose(streamed, one_shot, atol=2e-5, rtol=0)


def test_codec_state_copy_and_chain_give_the_same_audio(engines):
    codes = np.random.default_rng(0).integers(0, 1024, (13, 16))
    outs = []
    for kv in ("copy", "chain"):
        with engines[kv].model.codec.stream() as stream:
            outs.append(np.concatenate([stream.push(codes[i : i + 4]) for i in range(0, 13, 4)]))
    np.testing.assert_array_equal(outs[0], outs[1])
    one_shot = engines["chain"].model.vocoder.vocode(codes, {})
    np.testing.assert_allclose(outs[1], one_shot, atol=2e-5, rtol=0)


def test_codec_state_is_chained_without_a_copy(engines):
    with engines["chain"].model.codec.stream() as stream:
        codes = np.zeros((2, 16), np.int64)
        stream.push(codes)
        written = stream.chain.output_data_ptrs()
        assert stream.chain.state_data_ptrs() == written  # outputs became inputs in place
        stream.push(codes)
        assert stream.chain.steps == 2
    with engines["copy"].model.codec.stream() as stream:
        stream.push(codes)
        assert set(stream.chain.state_data_ptrs()).isdisjoint(stream.chain.output_data_ptrs())


def _admitted(engine, max_new_frames=3):
    """A MOSS request admitted into row 0 of a fresh program state."""
    model = engine.model
    options = model.request_options({"max_new_frames": max_new_frames})
    sampling = model.sampling_defaults().with_overrides({"seed": 0})
    request = Request(TEXT, engine.voice(), sampling, options)
    state = model.program.new_state(1)
    return state, model.program.admit(state, 0, request)


def test_global_kv_is_chained_from_the_prefill_graph(engines):
    from onnx_tts.decoding.kv_rows import OwnCaches

    model = engines["chain"].model
    state, admission = _admitted(engines["chain"])
    home = OwnCaches(model.program, model.pool, model.kv)
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


def test_closing_generation_returns_the_kv_cache(engines):
    engine = engines["solo"]
    model = engine.model
    idle = model.pool.idle_count()
    options = {"max_new_frames": FRAMES}
    sampling = model.sampling_defaults().with_overrides({"seed": 0})
    [chunk] = model.text.chunks(TEXT, model.request_options(options))
    frames = engine.generate(chunk, engine.voice(), sampling, options)
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
def test_options_are_checked(engines, official):
    engine = engines["chain"]
    with pytest.raises(InputError, match=r"unknown option\(s\) temperature .* own: "):
        engine.synthesize(TEXT, temperature=0.5)
    with pytest.raises(InputError, match="sample_mode"):
        engine.synthesize(TEXT, sample_mode="beam")
    with pytest.raises(InputError, match="max_new_frames"):
        engine.synthesize(TEXT, max_new_frames=0)
    with pytest.raises(InputError, match="bakes audio_temperature"):
        engine.synthesize(TEXT, sample_mode="fixed", audio_temperature=1.1)
    with pytest.raises(InputError, match="lacks"):
        official.synthesize(TEXT, sample_mode="greedy", local_path="greedy_frame")
    with pytest.raises(InputError, match="fixed_frame"):
        engine.synthesize(TEXT, sample_mode="full", local_path="fixed_frame")
    with pytest.raises(InputError, match="seed"):
        engine.synthesize(TEXT, seed=-1)
    with pytest.raises(InputError, match="parallel_chunks"):
        engine.synthesize(TEXT, parallel_chunks="yes")
    # full mode takes the host sampling options
    audio = engine.synthesize(
        TEXT, seed=1, sample_mode="full", audio_temperature=1.1, max_new_frames=4
    )
    assert audio.samples.shape[1] == 2


@pytest.mark.parametrize("text", ["!!! ... ???", "🙂🙂", "   ", ""])
def test_text_with_nothing_to_speak_is_refused(engines, text):
    with pytest.raises(InputError, match=r"nothing speakable|empty"):
        engines["chain"].synthesize(text)
    with pytest.raises(InputError, match=r"nothing speakable|empty"):
        engines["chain"].stream(text)


def _seed_with_silent_chunks(published, text, chunk_tokens, start=0):
    """(seed, published run) of the first seed whose published run of `text` ends some chunk
    at its first step (no frame) while another chunk speaks."""
    for seed in range(start, start + 100):
        theirs = published.synthesize(
            text, seed=seed, max_new_frames=FRAMES, chunk_tokens=chunk_tokens
        )
        spoken = [bool(frames) for frames in theirs["frames"]]
        if any(spoken) and not all(spoken):
            return seed, theirs
    raise AssertionError(f"no seed in [{start}, {start + 100}) silences a chunk of {text!r}")


def test_a_chunk_that_stops_at_once_adds_only_its_pause_as_published(engines, published):
    """The published runtime continues past a chunk that ends before any frame: the chunk
    adds no samples, the pause after it stays. The engine gives exactly that, one-shot,
    streamed, with the result cache (stored, then replayed) and with parallel chunks."""
    seed, theirs = _seed_with_silent_chunks(published, LONG_TEXT, 30)
    options = {"max_new_frames": FRAMES, "voice_clone_max_text_tokens": 30}
    for kv in ("chain", "solo", "results"):
        for _ in range(2 if kv == "results" else 1):
            ours = engines[kv].synthesize(LONG_TEXT, seed=seed, **options)
            np.testing.assert_array_equal(ours.samples, theirs["waveform"], err_msg=kv)
    assert engines["results"].cache_stats()["result"]["hits"] >= 1
    streamed = np.concatenate(list(engines["chain"].stream(LONG_TEXT, seed=seed, **options)))
    assert streamed.shape == theirs["waveform"].shape
    np.testing.assert_allclose(streamed, theirs["waveform"], atol=2e-5, rtol=0)
    # Parallel chunks: chunk i alone with seed + i; a silent one gives its pause only.
    engine = engines["results"]
    chunks = engine.model.text.chunks(LONG_TEXT, engine.model.request_options(options))
    alone = [
        published.synthesize(c, seed=seed + i, max_new_frames=FRAMES, chunk_tokens=10_000)
        for i, c in enumerate(chunks)
    ]
    if any(run["frames"][0] for run in alone) and not all(run["frames"][0] for run in alone):
        pieces = []
        for index, (chunk, run) in enumerate(zip(chunks, alone, strict=True)):
            pieces.append(run["waveform"])
            if index < len(chunks) - 1:
                pause = PAUSE_SHORT if len(chunk.split()) <= 4 else PAUSE_LONG
                pieces.append(np.zeros((round(48000 * pause), 2), np.float32))
        before = engine.cache_stats()["result"]["entries"]
        ours = engine.synthesize(LONG_TEXT, seed=seed, parallel_chunks=True, **options)
        np.testing.assert_array_equal(ours.samples, np.concatenate(pieces))
        # The text and each sentence that spoke are stored; a silent sentence never is.
        spoke = sum(bool(run["frames"][0]) for run in alone)
        assert engine.cache_stats()["result"]["entries"] == before + 1 + spoke


def test_a_text_without_any_audio_is_an_error_and_never_cached(engines, published):
    """Only a whole text whose every chunk ended at its first step is an error: one line
    naming it, one-shot and streamed (before any sample went out), nothing cached."""
    seed = next(
        s
        for s in range(100)
        if not published.synthesize(TEXT, seed=s, max_new_frames=FRAMES)["frames"][0]
    )
    engine = engines["results"]
    before = engine.cache_stats()["result"]["entries"]
    with pytest.raises(EmptyAudioError, match=r"no audio for the text .*first step"):
        engine.synthesize(TEXT, seed=seed, max_new_frames=FRAMES)
    stream = engine.stream(TEXT, seed=seed, max_new_frames=FRAMES, cache=True)
    with pytest.raises(EmptyAudioError, match="no audio for the text"):
        next(iter(stream))
    assert engine.cache_stats()["result"]["entries"] == before
    # A text that starts with a break and has no audio: its silence never goes out either.
    options = {"max_new_frames": FRAMES}
    with pytest.raises(EmptyAudioError, match="no audio"):
        next(iter(engines["chain"].stream(SSML_LEAD + TEXT + "</speak>", seed=seed, **options)))


def _silent_runs(samples: np.ndarray) -> list[int]:
    """Lengths of the runs of exactly silent frames of [N, channels] samples."""
    runs, length = [], 0
    for quiet in (np.abs(samples).max(axis=1) == 0).tolist():
        if quiet:
            length += 1
        elif length:
            runs, length = [*runs, length], 0
    return [*runs, length] if length else runs


def test_sentence_silence_falls_between_sentences_at_any_speed(engines, published):
    """MOSS-TTS-Nano joins sentences into chunks of up to 75 tokens; with `sentence_silence`
    each sentence is a chunk of its own (drawn in order from the text's one generator, as
    published) and exactly that silence lies between them, at any speed."""
    text = "A first short sentence here. And a second sentence follows it. Then a third one."
    engine = engines["chain"]
    model = engine.model
    assert len(model.text.chunks(text, model.request_options({}))) == 1
    sentences = model.text.sentence_chunks(text, model.request_options({}))
    assert len(sentences) == 3
    seed = next(  # a seed whose published runs speak every sentence, in order
        s
        for s in range(100)
        if all(
            run["frames"][0]
            for run in [published.synthesize(sentences[0], seed=s, max_new_frames=FRAMES)]
            + [published.synthesize(x, max_new_frames=FRAMES) for x in sentences[1:]]
        )
    )
    runs = [published.synthesize(sentences[0], seed=seed, max_new_frames=FRAMES)]
    runs += [published.synthesize(x, max_new_frames=FRAMES) for x in sentences[1:]]
    gap = np.zeros((round(48000 * 0.7), 2), np.float32)
    expected = np.concatenate(
        [runs[0]["waveform"], gap, runs[1]["waveform"], gap, runs[2]["waveform"]]
    )
    ours = engine.synthesize(text, seed=seed, max_new_frames=FRAMES, sentence_silence=0.7)
    np.testing.assert_array_equal(ours.samples, expected)
    for speed in (0.8, 1.5):
        fast = engine.synthesize(
            text, seed=seed, max_new_frames=FRAMES, sentence_silence=0.7, speed=speed
        ).samples
        streamed = np.concatenate(
            list(
                engine.stream(
                    text, seed=seed, max_new_frames=FRAMES, sentence_silence=0.7, speed=speed
                )
            )
        )
        assert streamed.shape == fast.shape
        for samples in (fast, streamed):
            runs_of_zeros = _silent_runs(samples)
            assert sum(run >= len(gap) for run in runs_of_zeros) == 2, speed


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


def _synth(model_dir, out: Path, text, *extra):
    command = [sys.executable, "-m", "onnx_tts.cli", "synth", text, "--model", str(model_dir)]
    command += ["-o", str(out), "--threads", "1", "--cache-dir", str(out.parent / "cache")]
    command += [*extra]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return soundfile.read(out, dtype="int16")


def _published_wav(waveform: np.ndarray) -> np.ndarray:
    """A waveform as the published runtime writes WAV: clip to [-1, 1], x 32767, rounded."""
    return pcm16(waveform)


def test_cli_synth_gives_the_published_wav(moss_official, tmp_path):
    loop = PublishedLoop(moss_official)
    theirs = loop.synthesize(TEXT, seed=0, voice="Ava", max_new_frames=10)
    whole, rate = _synth(
        moss_official,
        tmp_path / "whole.wav",
        TEXT,
        "--seed",
        "0",
        "--max-new-frames",
        "10",
        "--voice",
        "Ava",
    )
    streamed, streamed_rate = _synth(
        moss_official,
        tmp_path / "streamed.wav",
        TEXT,
        "--seed",
        "0",
        "--max-new-frames",
        "10",
        "--voice",
        "Ava",
        "--stream",
    )
    assert rate == streamed_rate == 48000
    assert whole.ndim == 2 and whole.shape[1] == 2
    np.testing.assert_array_equal(whole, _published_wav(theirs["waveform"]))
    assert streamed.shape == whole.shape
    # decode_step (streamed) and decode_full (one shot) agree up to float rounding: 1 LSB.
    assert np.abs(streamed.astype(int) - whole.astype(int)).max() <= 1


def test_cli_synth_clones_over_several_chunks_as_published(moss_official, tmp_path):
    loop = PublishedLoop(moss_official)
    reference = _reference(tmp_path / "stereo.wav", 2)
    seed, theirs = _speaking(
        loop, LONG_TEXT, 3, reference=reference, max_new_frames=FRAMES, chunk_tokens=30
    )
    ours, rate = _synth(
        moss_official,
        tmp_path / "long.wav",
        LONG_TEXT,
        "--seed",
        str(seed),
        "--max-new-frames",
        str(FRAMES),
        "--voice",
        str(reference),
        "--voice-clone-max-text-tokens",
        "30",
    )
    assert rate == 48000
    np.testing.assert_array_equal(ours, _published_wav(theirs["waveform"]))


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
    # Codes stored as floats would be truncated into other codes: refused, never spoken.
    (
        _set(TTS, MANIFEST, "builtin_voices", 0, "prompt_audio_codes", value=[[3.5] * 16] * 4),
        r"integer codes",
    ),
    (
        _set(TTS, MANIFEST, "builtin_voices", 0, "prompt_audio_codes", value=[[3.0] * 16] * 4),
        r"integer codes",
    ),
    (_set(TTS, MANIFEST, "builtin_voices", 1, "voice", value="Junhao"), r"second voice named"),
]


@pytest.mark.parametrize(("damage", "message"), BROKEN_CASES)
def test_broken_directories_get_one_clear_error(broken, damage, message):
    damage(broken)
    with pytest.raises(ModelError, match=message) as caught:
        detect(broken)
    assert "\n" not in str(caught.value)


def test_a_tokenizer_larger_than_the_model_vocabulary_is_refused(broken):
    """A tokenizer.model with pieces past the model's vocab_size would feed the embedding ids
    it has no row for (ONNX Runtime's Gather error mid-request): refused at load."""
    from sentencepiece import sentencepiece_model_pb2

    path = broken / TTS / "tokenizer.model"
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(path.read_bytes())
    vocab = json.loads((broken / TTS / TTS_META).read_text())["model_config"]["vocab_size"]
    while len(proto.pieces) <= vocab:
        piece = proto.pieces.add()
        piece.piece, piece.type = f"extra{len(proto.pieces)}", piece.USER_DEFINED
    path.write_bytes(proto.SerializeToString())
    with pytest.raises(ModelError, match=r"tokenizer\.model has \d+ pieces but .* has 16384"):
        onnx_tts.load(broken, cache_dir=None)


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


@pytest.fixture(scope="module")
def inplace_engines(moss_official, moss_inplace, tmp_path_factory):
    """Engines in every KV mode of the converted stand-in: in place with batched slot rows
    (the default), chain and copy on caches of their own."""
    cache = tmp_path_factory.mktemp("moss-inplace-cache")
    made = {
        "inplace": onnx_tts.load(moss_inplace, threads=1, cache_dir=cache / "a"),
        "chain": onnx_tts.load(moss_inplace, kv="chain", threads=1, cache_dir=cache / "b"),
        "copy": onnx_tts.load(moss_inplace, kv="copy", threads=1, cache_dir=cache / "c"),
    }
    yield made
    for engine in made.values():
        engine.close()


def test_in_place_kv_gives_the_published_frames_and_audio(inplace_engines, moss_official):
    assert inplace_engines["inplace"].info()["batching"]["batched"] is True
    loop = PublishedLoop(moss_official)
    for mode in MODES:
        theirs = loop.synthesize(TEXT, seed=5, voice="Ava", sample_mode=mode, max_new_frames=FRAMES)
        for kv, engine in inplace_engines.items():
            assert engine.info()["kv_mode"] == kv and engine.model.kv.attention == "gqa"
            ours = _frames(engine, TEXT, seed=5, voice="Ava", sample_mode=mode)
            assert [ours] == theirs["frames"], (mode, kv)
    seed, theirs = _speaking(
        loop, LONG_TEXT, 11, voice="Ava", max_new_frames=FRAMES, chunk_tokens=30
    )
    ours = inplace_engines["inplace"].synthesize(
        LONG_TEXT, seed=seed, voice="Ava", max_new_frames=FRAMES, voice_clone_max_text_tokens=30
    )
    np.testing.assert_array_equal(ours.samples, theirs["waveform"])


def test_in_place_slot_row_takes_the_prefill_and_never_moves(inplace_engines):
    from onnx_tts.decoding.kv_rows import SlotRows

    engine = inplace_engines["inplace"]
    model = engine.model
    state, admission = _admitted(engine)
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


# -- many requests at once: the scheduler, the vocoder stage, the server --------------------
TEXTS = [
    "Hello there.",
    TEXT,
    "A somewhat longer sentence, to give this row a longer prompt than the others have.",
    "Short.",
]


def test_engine_batch_is_invariant(inplace_engines):
    """12 requests of different lengths at once (rows of shared steps, 8 at a time) make the
    frames each makes alone."""
    engine = inplace_engines["inplace"]
    jobs = [(TEXTS[i % len(TEXTS)], i, "full" if i % 3 == 0 else "fixed") for i in range(12)]
    alone = [_frames(engine, text, seed=seed, sample_mode=mode) for text, seed, mode in jobs]
    steps = engine.stats()["steps"]
    row_steps = engine.stats()["row_steps"]
    together: list = [None] * len(jobs)
    start = threading.Barrier(len(jobs))

    def run(index: int) -> None:
        text, seed, mode = jobs[index]
        start.wait()
        together[index] = _frames(engine, text, seed=seed, sample_mode=mode)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert together == alone
    stats = engine.stats()
    assert (stats["row_steps"] - row_steps) / (stats["steps"] - steps) > 2  # really batched


def test_prompts_admitted_together_prefill_side_by_side(inplace_engines):
    """Requests admitted in one round run their prompts through the prefill graph on the
    prefill workers at once, each into its own slot row, and make the frames each makes
    alone."""
    from onnx_tts.decoding.scheduler import DecodeScheduler

    engine = inplace_engines["inplace"]
    model = engine.model
    jobs = [(TEXTS[i % len(TEXTS)], i, "full" if i % 2 else "fixed") for i in range(5)]
    alone = [_frames(engine, text, seed=seed, sample_mode=mode) for text, seed, mode in jobs]
    scheduler = DecodeScheduler(model.program, model.pool, max_batch=8, prefill_workers=3)
    try:
        requests = []
        for text, seed, mode in jobs:
            options = model.request_options({"max_new_frames": FRAMES, "sample_mode": mode})
            [chunk] = model.text.chunks(text, options)
            sampling = model.sampling_defaults().with_overrides({"seed": seed})
            requests.append(Request(chunk, engine.voice(), sampling, options))
        with scheduler._cv:  # the worker waits for the lock: all five are admitted at once
            streams = [scheduler.submit(request) for request in requests]
        together = [[list(map(int, frame)) for frame in stream] for stream in streams]
        stats = scheduler.stats()
    finally:
        scheduler.close()
    assert together == alone
    assert stats["prefills"] == stats["parallel_prefills"] == len(jobs)


@pytest.mark.parametrize("kv", ["inplace", "chain"])
def test_engine_stream_equals_one_shot_with_the_published_pauses(inplace_engines, kv):
    engine = inplace_engines[kv]
    text = "A first short sentence here. And a second sentence follows it."
    options = {"max_new_frames": FRAMES, "voice_clone_max_text_tokens": 12, "sample_mode": "greedy"}
    one_shot = engine.synthesize(text, voice="Ava", seed=2, **options)
    assert one_shot.sample_rate == 48000 and one_shot.samples.shape[1] == 2
    pieces = list(engine.stream(text, voice="Ava", seed=2, stride_frames=3, **options))
    streamed = np.concatenate(pieces)
    assert len(pieces) > 3 and streamed.shape == one_shot.samples.shape
    np.testing.assert_allclose(streamed, one_shot.samples, atol=2e-5, rtol=0)
    model = engine.model
    chunks = model.text.chunks(text, model.request_options(options))
    pause = round(48000 * model.vocoder.pause_seconds(chunks[0]))
    assert len(chunks) == 2 and np.count_nonzero(np.abs(one_shot.samples).max(axis=1) == 0) >= pause


def test_server_speaks_the_published_audio(moss_official, tmp_path):
    """The server as users run it: builtin voices listed; WAV in the model's 48 kHz stereo is
    the published audio (streamed: up to float rounding); OpenAI's pcm is 24 kHz mono; an
    unknown voice is a 404."""
    import httpx

    from benchmarks.live_server import LiveServer

    loop = PublishedLoop(moss_official)
    theirs = loop.synthesize(TEXT, voice="Ava", seed=0, max_new_frames=10)
    live = LiveServer(tmp_path, "--model", str(moss_official), "--threads", "1")
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
    samples, rate = soundfile.read(io.BytesIO(wav.content), dtype="int16")
    assert rate == 48000 and samples.shape == (10 * 3840, 2)
    # Streamed through the codec's decode_step: the published decode_full audio up to float
    # rounding (1 LSB of 16 bits), stereo as published.
    expected = _published_wav(theirs["waveform"]).astype(int)
    assert np.abs(samples.astype(int) - expected).max() <= 1
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "voice_not_found"

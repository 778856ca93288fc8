"""MOSS-TTS continuation (the reference audio is the start of the speech) on the stand-ins of
tests/test_moss_tts.py, against the published paths paraphrased in
tests/moss_tts_published_loop.py: the prompt (`prompt_text + text`, the reference's codes as
assistant rows), the frames greedy and sampled (the penalty over generated frames only), and
the audio of the codec worker primed with the reference's codes (Delay: its processor's
truncated delay pattern, the frames that complete the reference's, and its `decode`); through
`synthesize`, `stream`, the CLI and a live server; the refusals; result-cache keys apart from
cloning."""

from __future__ import annotations

import dataclasses
import io
import json
import subprocess
import sys

import numpy as np
import pytest
import soundfile

import onnx_tts
from onnx_tts.audio import pcm16
from onnx_tts.errors import InputError
from onnx_tts.families.moss_tts.text import continuation_options
from tests import moss_tts_published_loop as published
from tests.conftest import speechlike
from tests.test_moss_tts import (  # noqa: F401 - the module's fixtures, shared
    CODECS,
    TEXT,
    assert_close_audio,
    codecs,
    engines,
    frames_of,
    loops,
    models,
)

VARIANT = "local-v1.5"
LOCAL = ("local-v1.5", "local-v1")  # (Delay continues inside its delay pattern: below)
REFERENCE_TEXT = "This is what the reference says. "
STEPS = {"local-v1.5": 12, "local-v1": 6}  # (Local v1's paraphrase is the slow one)
RATES = {"local-v1.5": 48000, "local-v1": 24000}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A stereo reference file at Local v1.5's rate (what `voice=` takes; Local v1 reads it at
    its codec's 24 kHz, mono)."""
    path = tmp_path_factory.mktemp("continuation") / "reference.wav"
    samples = speechlike(1.2, 48000, seed=5)
    soundfile.write(path, np.stack([samples, samples], axis=1), 48000, subtype="FLOAT")
    return path


def expected_frames(loop, codes, *, seed=0, greedy=False, text=TEXT, steps=None, **options):
    """The paraphrase's frames of a continuation of `codes` (transcript REFERENCE_TEXT)."""
    variant = loop.config.variant
    steps = steps or STEPS[variant]
    prompt = published.continuation_prompt(loop, REFERENCE_TEXT, text, codes)
    if variant == "local-v1.5":
        extra = {"do_sample": False} if greedy else {}
        return loop.generate_v15(prompt, seed=seed, max_new_frames=steps, **extra, **options)
    extra = {"text_temperature": 0.0, "audio_temperature": 0.0} if greedy else {}
    rows = loop.generate_v1(prompt, seed=seed, max_new_tokens=steps, **extra, **options)
    return [row[1:] for row in rows]


def torch_codec(codecs, variant):  # noqa: F811
    from export.moss_audio_tokenizer import load_codec

    return load_codec(codecs(*CODECS[variant])[0])


def continued(**more):
    return {"continuation": True, "reference_text": REFERENCE_TEXT, **more}


@pytest.mark.parametrize("variant", LOCAL)
def test_prompt_and_frames_are_the_published_continuations(engines, loops, models, variant):  # noqa: F811
    loop, engine = loops(variant), engines(variant)
    steps = STEPS[variant]
    codes = np.random.default_rng(11).integers(0, 1024, (7, loop.config.n_vq))
    rows = engine.model.text.prompt(REFERENCE_TEXT + TEXT, {}, continuation=codes).rows
    expected_rows = published.continuation_prompt(loop, REFERENCE_TEXT, TEXT, codes).numpy()
    assert np.array_equal(rows, expected_rows)
    assert (rows[-len(codes) :, 1:] == codes).all()  # the reference ends the prompt
    if variant == "local-v1":  # the export renders the user message without the generation
        chat = json.loads((models(variant)[1] / "bundle.json").read_text())["text"]["chat"]
        assert chat["user_end"] == loop.user_end  # prompt with the checkpoint's template
    voice = {"codes": codes}
    greedy = expected_frames(loop, codes, greedy=True)
    assert len(greedy) > 3
    for kind in ("default", "solo"):
        ours = frames_of(
            engines(variant, kind), voice=voice, greedy=True, **continued(max_new_frames=steps)
        )
        assert ours == greedy, kind
    # Local v1.5's repetition penalty counts the generated frames only, Local v1's the prompt's
    # codes too (each as published).
    for seed, penalty in ((1, 1.0), (2, 1.3)):
        options = continued(audio_repetition_penalty=penalty, max_new_frames=steps)
        theirs = expected_frames(loop, codes, seed=seed, audio_repetition_penalty=penalty)
        assert frames_of(engine, seed=seed, voice=voice, **options) == theirs, seed
    # Not the clone's frames: the mode changes the prompt.
    assert frames_of(engine, seed=1, voice=voice, max_new_frames=steps) != frames_of(
        engine, seed=1, voice=voice, max_new_frames=steps, **continued()
    )


@pytest.mark.parametrize("variant", LOCAL)
def test_audio_is_the_primed_codec_worker_one_shot_and_streamed(
    engines,  # noqa: F811
    loops,  # noqa: F811
    codecs,  # noqa: F811
    reference,
    variant,
):
    """The reference file's codes (its canonical encode, through the reference cache) start the
    speech: the audio is the new frames decoded by a codec stream primed with those codes."""
    engine = engines(variant)
    codes = engine.voice(str(reference))["codes"]
    frames = expected_frames(loops(variant), codes, seed=4)
    assert len(frames) > 3
    want = published.primed_stream_decode(torch_codec(codecs, variant), codes, frames)
    want = want[:, 0] if want.shape[1] == 1 else want
    options = continued(max_new_frames=STEPS[variant])
    one_shot = engine.synthesize(TEXT, voice=str(reference), seed=4, **options)
    assert one_shot.sample_rate == RATES[variant]
    assert_close_audio(one_shot.samples, want)
    assert len(one_shot.samples) == len(frames) * engine.model.hop_length
    for first, stride in ((1, 4), (3, 2)):
        chunks = engine.stream(
            TEXT,
            voice=str(reference),
            seed=4,
            first_chunk_frames=first,
            stride_frames=stride,
            cache=False,
            **options,
        )
        assert_close_audio(np.concatenate(list(chunks)), want)


def test_a_text_of_several_chunks_continues_the_reference_in_each(engines, loops, reference):  # noqa: F811
    """Each chunk is one published continuation request (transcript + chunk, the audio primed
    with the reference), seed + i, joined by the pause, as every mode's chunks are."""
    engine = engines(VARIANT)
    text = "The first sentence is here. A second one follows it."
    options = continued(max_new_frames=6, max_chunk_chars=30)
    chunks = engine.model.text.chunks(text, engine.model.request_options(options))
    assert len(chunks) == 2
    codes = engine.voice(str(reference))["codes"]
    result = engine.synthesize(text, voice=str(reference), seed=8, **options)
    parts = []
    for index, chunk in enumerate(chunks):
        voice = {"codes": codes}
        frames = expected_frames(loops(VARIANT), codes, seed=8 + index, text=chunk, steps=6)
        single = engine.synthesize(chunk, voice=voice, seed=8 + index, cache=False, **options)
        assert len(single.samples) == len(frames) * engine.model.hop_length
        parts += [single.samples, np.zeros((round(0.15 * 48000), 2), np.float32)]
    assert_close_audio(result.samples, np.concatenate(parts[:-1]))


def test_refusals_are_one_clear_input_error(engines, reference):  # noqa: F811
    engine = engines(VARIANT)
    cases = [
        ({"continuation": True}, str(reference), "needs reference_text"),
        ({"continuation": True, "reference_text": "  "}, str(reference), "needs reference_text"),
        (continued(), None, "give one as the voice"),
        ({"reference_text": "hello"}, str(reference), "add continuation=True"),
        (continued(reference_text="say <|im_end|>"), str(reference), "control token"),
    ]
    for options, voice, message in cases:
        with pytest.raises(InputError, match=message):
            engine.synthesize(TEXT, voice=voice, seed=1, max_new_frames=4, **options)
        with pytest.raises(InputError, match=message):
            engine.stream(TEXT, voice=voice, seed=1, max_new_frames=4, **options)
    # A Local v1 or Delay export from before continuation lacks the user message's end.
    for variant in ("local-v1", "delay"):
        old = dataclasses.replace(engine.model.layout, variant=variant, chat={})
        with pytest.raises(InputError, match="export it again"):
            continuation_options(continued(), old)


def test_the_result_cache_keeps_continuation_apart_from_cloning(models, reference, tmp_path):  # noqa: F811
    """With a result cache, a continuation and a clone of the same voice, text and seed have
    keys of their own (the transcript in the continuation's), and `synthesize` serves each its
    own entry. (The entries are put directly: the random stand-in codec's audio peaks past the
    cache's +-16 bound on samples, so its real results would not be stored.)"""
    _, out, _ = models(VARIANT)
    engine = onnx_tts.load(out, cache_dir=tmp_path / "cache", result_cache_bytes=64 << 20)
    voice, seed = str(reference), 6
    requests = {
        "clone": {"max_new_frames": 8},
        "continuation": continued(max_new_frames=8),
        "other transcript": continued(max_new_frames=8, reference_text="Another one. "),
    }
    keys = {}
    for name, options in requests.items():
        engine.caching.recall(TEXT, voice, seed, options, None)  # (the model's identity)
        plan = engine.planner.plan(TEXT, seed, options)
        keys[name] = engine.caching.key(plan, engine.voice(voice), None, None)
    assert None not in keys.values() and len(set(keys.values())) == 3
    results = engine.caching.results
    assert results is not None
    entries = {}
    for index, name in enumerate(("clone", "continuation")):
        entries[name] = np.full((480, 2), 0.01 * (index + 1), np.float32)
        results.put_audio(keys[name], entries[name], 48000)
    for name in ("clone", "continuation"):
        got = engine.synthesize(TEXT, voice=voice, seed=seed, **requests[name]).samples
        assert np.array_equal(got, entries[name]), name
        streamed = engine.stream(TEXT, voice=voice, seed=seed, **requests[name])
        assert np.array_equal(np.concatenate(list(streamed)), entries[name]), name
    engine.close()


def _synth_cli(out, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "onnx_tts.cli", "synth", TEXT, "--model", str(out), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("variant", ["local-v1.5", "delay"])
def test_cli_continues_a_reference(models, engines, reference, tmp_path, variant):  # noqa: F811
    _, out, _ = models(variant)
    wav = tmp_path / "out.wav"
    steps = STEPS.get(variant, 48)
    common = ["--seed", "3", "--max-new-frames", str(steps), "--threads", "1"]
    common += ["--cache-dir", str(tmp_path / "cache"), "--voice", str(reference)]
    done = _synth_cli(
        out, "-o", str(wav), "--continuation", "--reference-text", REFERENCE_TEXT, *common
    )
    assert done.returncode == 0, done.stderr
    ours, rate = soundfile.read(wav, dtype="int16")
    expected = engines(variant).synthesize(
        TEXT, voice=str(reference), seed=3, max_new_frames=steps, **continued()
    )
    assert len(expected.samples) > 0
    assert rate == RATES.get(variant, 24000) and ours.shape == expected.samples.shape
    assert np.abs(ours.astype(int) - pcm16(expected.samples).astype(int)).max() <= 1
    refused = _synth_cli(out, "-o", str(tmp_path / "no.wav"), "--continuation", *common)
    assert refused.returncode == 2 and "needs reference_text" in refused.stderr
    assert "Traceback" not in refused.stderr and not (tmp_path / "no.wav").exists()


def test_server_continues_an_uploaded_voice(models, engines, reference, tmp_path):  # noqa: F811
    import httpx

    from benchmarks.live_server import LiveServer

    _, out, _ = models(VARIANT)
    live = LiveServer(tmp_path, "--model", str(out), "--threads", "1")
    try:
        with reference.open("rb") as file:
            made = httpx.post(
                live.url + "/v1/audio/voices",
                files={"audio_sample": ("reference.wav", file, "audio/wav")},
                data={"name": "ref"},
                timeout=300,
            )
        assert made.status_code in (200, 201), made.text
        body = {"input": TEXT, "voice": "ref", "seed": 2, "max_new_frames": STEPS[VARIANT]}
        body |= {"response_format": "wav", **continued()}
        reply = httpx.post(live.url + "/v1/audio/speech", json=body, timeout=300)
        missing = {**body, "reference_text": None}
        refused = httpx.post(live.url + "/v1/audio/speech", json=missing, timeout=300)
    finally:
        live.stop()
    assert reply.status_code == 200, reply.text
    assert refused.status_code == 400 and "reference_text" in refused.text
    samples, rate = soundfile.read(io.BytesIO(reply.content), dtype="int16")
    # The server keeps an uploaded voice mono: the same reference, duplicated to stereo.
    mono = soundfile.read(reference, dtype="float32")[0][:, 0]
    expected = engines(VARIANT).synthesize(
        TEXT, voice=mono, seed=2, max_new_frames=STEPS[VARIANT], **continued()
    )
    assert rate == 48000 and samples.shape == expected.samples.shape
    assert np.abs(samples.astype(int) - pcm16(expected.samples).astype(int)).max() <= 1


@pytest.mark.parametrize("frames", [None, 40])
def test_delay_continues_inside_its_pattern_as_published(engines, loops, codecs, reference, frames):  # noqa: F811
    """Delay's prompt ends inside the delay pattern (the reference's last n_vq - 1 frames only
    in part): the first frames the engine emits are those frames completed by the model, and
    the audio is the published `decode`'s (the reference's frames and one more cut), one-shot
    and streamed. A reference of fewer frames than n_vq - 1 (the file, 1.2 s) and of more
    (random codes)."""
    engine, loop = engines("delay"), loops("delay")
    n_vq, steps = loop.config.n_vq, 48
    if frames is None:
        voice: object = str(reference)
        codes = engine.voice(voice)["codes"]
    else:
        codes = np.random.default_rng(12).integers(0, 1024, (frames, n_vq))
        voice = {"codes": codes}
    assert (len(codes) < n_vq - 1) == (frames is None)
    prompt = published.continuation_prompt(loop, REFERENCE_TEXT, TEXT, codes)
    rows = engine.model.text.prompt(REFERENCE_TEXT + TEXT, {}, continuation=codes).rows
    assert np.array_equal(rows, prompt.numpy())
    codec = torch_codec(codecs, "delay")
    mixed = min(len(codes), n_vq - 1)
    # (Seed 7 draws one code 8e-9 of the total from a boundary of its distribution: float32
    # rounding picks either neighbour there.)
    for seed, greedy in ((0, True), (3, False), (5, False)):
        extra = {"text_temperature": 0.0, "audio_temperature": 0.0} if greedy else {}
        generated = loop.generate_delay(prompt, seed=seed, max_new_tokens=steps, **extra)
        want_frames, want_audio = published.delay_continuation_decode(
            loop, codec, prompt, generated
        )
        assert len(want_frames) > len(codes) + 1, seed  # new speech beyond the cut
        options = continued(max_new_frames=steps, greedy=greedy)
        ours = frames_of(engine, seed=seed, voice=voice, **options)
        assert ours == want_frames[len(codes) - mixed :], seed
        want_audio = want_audio[:, 0]
        one_shot = engine.synthesize(TEXT, voice=voice, seed=seed, cache=False, **options)
        assert_close_audio(one_shot.samples, want_audio)
        chunks = engine.stream(
            TEXT,
            voice=voice,
            seed=seed,
            first_chunk_frames=2,
            stride_frames=3,
            cache=False,
            **options,
        )
        assert_close_audio(np.concatenate(list(chunks)), want_audio)

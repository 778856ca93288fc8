"""Family moss-tts (Local v1.5, Local v1, Delay) on stand-in checkpoints in the published layout
(export/moss_tts/stand_in.py: config keys, tensor names, special ids, sharded safetensors, the
real Qwen3 tokenizer; tiny sizes, random weights), exported with `onnx-tts export moss-tts` and
run through the public API, checked against a paraphrase of the published torch loops
(tests/moss_tts_published_loop.py): the same code frames greedy, and sampled from the same
uniform draws (one per sampled token from `np.random.default_rng(seed)`, in the published
order), for text alone, a reference voice's codes, Local v1's n_vq_for_inference; batched rows
equal solo runs; broken checkpoints and bad requests get one clear error."""

from __future__ import annotations

import io
import itertools
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch  # the test extra installs it (export): a missing one fails, never skips

import onnx_tts
from export.moss_tts.stand_in import cached_checkpoint
from onnx_tts.audio import pcm16
from onnx_tts.errors import InputError
from onnx_tts.families import detect
from tests import moss_tts_published_loop as published

VARIANTS = ("local-v1.5", "local-v1", "delay")
TEXT = "Hello there, this is a small test of the stand in."
# max_new_frames of most runs: Delay's first frame needs n_vq + 1 steps after its audio_start;
# Local v1's paraphrase (33 channels, a 150k-token text channel) is the slowest to run.
STEPS = {"local-v1.5": 24, "local-v1": 10, "delay": 80}
# Local v1.5's stand-in is stored in bfloat16 (as published): its rotary tables are rounded
# through bf16 (`--rope-tables auto`); the others in float32.
DTYPES = {"local-v1.5": torch.bfloat16, "local-v1": torch.float32, "delay": torch.float32}


CODECS = {"local-v1.5": ("v2", 12), "local-v1": ("v1", 32), "delay": ("v1", 32)}


@pytest.fixture(scope="module")
def codecs(tmp_path_factory):
    """version -> (stand-in codec checkpoint, the same exported with the LM's quantizers):
    v2 (48 kHz stereo) for Local v1.5, v1 (24 kHz mono) for Local v1 and Delay, exported once
    and handed to each model's export."""
    from export.moss_audio_tokenizer import build_codec_checkpoint, export_codec

    made: dict[str, tuple[Path, Path]] = {}
    root = tmp_path_factory.mktemp("moss-codecs")

    def get(version: str, quantizers: int) -> tuple[Path, Path]:
        if version not in made:
            checkpoint = build_codec_checkpoint(root / f"{version}-checkpoint", version)
            export_codec(checkpoint, root / f"{version}-onnx", quantizers=quantizers)
            made[version] = (checkpoint, root / f"{version}-onnx")
        return made[version]

    return get


@pytest.fixture(scope="module")
def models(tmp_path_factory, codecs):
    """variant -> (checkpoint, exported model directory, export report), exported on first use
    (with its codec)."""
    made: dict[str, tuple[Path, Path, dict]] = {}
    root = tmp_path_factory.mktemp("moss-tts")

    def get(variant: str) -> tuple[Path, Path, dict]:
        if variant not in made:
            from export.moss_tts.exporter import export_moss_tts

            checkpoint = cached_checkpoint(variant, dtype=DTYPES[variant])
            out = root / variant
            codec = codecs(*CODECS[variant])[1]
            made[variant] = (checkpoint, out, export_moss_tts(checkpoint, out, codec_dir=codec))
        return made[variant]

    return get


@pytest.fixture(scope="module")
def engines(models, tmp_path_factory):
    """(variant, kind) -> engine: "default" as `onnx_tts.load` makes it, "solo" max_batch 1."""
    made: dict[tuple[str, str], onnx_tts.Engine] = {}
    cache = tmp_path_factory.mktemp("moss-tts-cache")

    def get(variant: str, kind: str = "default"):
        if (variant, kind) not in made:
            _, out, _ = models(variant)
            options = {"max_batch": 1, "threads": 1} if kind == "solo" else {}
            made[variant, kind] = onnx_tts.load(out, cache_dir=cache / variant / kind, **options)
        return made[variant, kind]

    yield get
    for engine in made.values():
        engine.close()


@pytest.fixture(scope="module")
def loops(models):
    made: dict[str, published.Published] = {}

    def get(variant: str) -> published.Published:
        if variant not in made:
            made[variant] = published.load(models(variant)[0])
        return made[variant]

    return get


def frames_of(engine, text=TEXT, *, seed=0, voice=None, **options):
    """The frames of a one-chunk text through the engine's LM stage (`Engine.generate`)."""
    model = engine.model
    options = {"max_new_frames": STEPS[model.layout.variant], **options}
    [chunk] = model.text.chunks(text, model.request_options(options))
    sampling = model.sampling_defaults().with_overrides({"seed": seed})
    stream = engine.generate(chunk, engine.voice(voice), sampling, options)
    return [list(map(int, frame)) for frame in stream]


def reference_frames(
    loop, text=TEXT, *, seed=0, greedy=False, reference=None, steps=None, **options
):
    """The paraphrase's frames of the same request."""
    variant = loop.config.variant
    steps = steps or STEPS[variant]
    if variant == "local-v1.5":
        prompt = loop.prompt_v15(text, reference=reference)
        extra = {"do_sample": False} if greedy else {}
        return loop.generate_v15(prompt, seed=seed, max_new_frames=steps, **extra, **options)
    prompt = loop.prompt_chat(text, reference=reference)
    extra = {"text_temperature": 0.0, "audio_temperature": 0.0} if greedy else {}
    if variant == "local-v1":
        rows = loop.generate_v1(prompt, seed=seed, max_new_tokens=steps, **extra, **options)
        return [row[1:] for row in rows]
    rows = loop.generate_delay(prompt, seed=seed, max_new_tokens=steps, **extra, **options)
    return published.de_delay(rows, loop.config.n_vq, loop.config.audio_pad)


# -- export ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
def test_export_checks_every_graph_against_torch(models, variant):
    _, out, report = models(variant)
    assert report["variant"] == variant
    diffs = [d for graph in report["checks"].values() for d in graph.values()]
    assert len(diffs) >= 5 and max(diffs) < 2e-5
    assert report["rope_tables"] == ("bfloat16 (nearest)" if variant == "local-v1.5" else "float32")
    detection = detect(out)
    assert detection.family == "moss-tts"
    manifest = json.loads((out / "bundle.json").read_text())
    assert manifest["variant"] == variant and manifest["sha256"]["backbone.onnx_data"]
    if variant == "local-v1":  # the backbone's own embed_tokens is frozen and unused
        assert report["unread"] == ["model.language_model.embed_tokens.weight"]
        assert len([r for r in manifest["graphs"] if r.startswith("head_")]) == 33
    else:
        assert report["unread"] == []


def test_chat_template_is_the_checkpoints_rendered_in_a_sandbox(models, loops):
    """Local v1 and Delay render the checkpoint's own chat template (the real Qwen3 one here)
    once at export: the strings around a lone user message are the paraphrase's."""
    _, out, _ = models("delay")
    chat = json.loads((out / "bundle.json").read_text())["text"]["chat"]
    loop = loops("delay")
    assert (chat["user_prefix"], chat["user_suffix"]) == loop.chat[:2]
    assert (chat["assistant_prefix"], chat["assistant_suffix"]) == loop.chat[2:]


# -- the published loops ---------------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
def test_same_frames_as_the_published_loop(engines, loops, variant):
    loop = loops(variant)
    model = engines(variant).model
    assert np.array_equal(
        model.text.prompt(TEXT, {}).rows,
        (loop.prompt_v15(TEXT) if variant == "local-v1.5" else loop.prompt_chat(TEXT)).numpy(),
    )
    expected_greedy = reference_frames(loop, greedy=True)
    assert len(expected_greedy) > 3
    for kind in ("default", "solo"):
        assert frames_of(engines(variant, kind), greedy=True) == expected_greedy, kind
    for seed in (1, 2):
        expected = reference_frames(loop, seed=seed)
        assert frames_of(engines(variant), seed=seed) == expected, f"seed {seed}"


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_reference_voice_gives_the_published_frames(engines, loops, variant):
    """A voice given as its codes (what `Engine.voice` returns for a reference file) goes into
    the prompt's reference rows as published; its block is the prefix the prefix cache keeps."""
    loop = loops(variant)
    codes = np.random.default_rng(7).integers(0, 1024, (9, loop.config.n_vq))
    engine = engines(variant)
    voice = {"codes": codes}
    prompt = engine.model.text.prompt(TEXT, {}, codes)
    expected_rows = (
        loop.prompt_v15(TEXT, reference=codes)
        if variant == "local-v1.5"
        else loop.prompt_chat(TEXT, reference=codes)
    )
    assert np.array_equal(prompt.rows, expected_rows.numpy())
    assert prompt.prefix > len(codes)
    assert frames_of(engine, seed=3, voice=voice) == reference_frames(loop, seed=3, reference=codes)


def test_local_v1_generates_fewer_codebooks_on_request(engines, loops):
    loop = loops("local-v1")
    ours = frames_of(engines("local-v1"), seed=4, n_vq_for_inference=5)
    assert ours == reference_frames(loop, seed=4, n_vq_for_inference=5)
    assert all(frame[5:] == [0] * 27 for frame in ours)  # as published: 0, not the pad


def test_delay_can_stop_with_its_audio(engines):
    engine = engines("delay")
    whole = frames_of(engine, seed=5, max_new_frames=120)
    early = frames_of(engine, seed=5, max_new_frames=120, stop_at="audio_end")
    # The first audio segment, whole; the published loop runs on to im_end (here the random
    # stand-in starts a second segment before it).
    assert 0 < len(early) <= len(whole) and whole[: len(early)] == early


@pytest.mark.parametrize(
    ("variant", "options", "message"),
    [
        ("local-v1.5", {"n_vq_for_inference": 4}, "n_vq_for_inference is Local v1's"),
        ("local-v1", {"n_vq_for_inference": 40}, r"n_vq_for_inference must be in \[1, 32\]"),
        ("local-v1", {"stop_at": "audio_end"}, "stop_at is Delay's"),
        ("delay", {"audio_top_p": 2.0}, "audio_top_p"),
        ("delay", {"temperature": 0.5}, "takes no option temperature"),
    ],
)
def test_bad_options_are_one_clear_error(engines, variant, options, message):
    with pytest.raises(InputError, match=message):
        engines(variant).model.request_options(options)


def test_prompt_fields_fill_the_template_as_published(engines, loops):
    fields = {"language": "en", "instruction": "calm", "tokens": 30}
    for variant in ("local-v1.5", "delay"):
        loop = loops(variant)
        expected = (
            loop.prompt_v15(TEXT, fields=fields)
            if variant == "local-v1.5"
            else loop.prompt_chat(TEXT, fields=fields)
        )
        model = engines(variant).model
        options = model.request_options(fields)
        assert np.array_equal(model.text.prompt(TEXT, options["fields"]).rows, expected.numpy())


@pytest.mark.parametrize(
    ("text", "cleaned"),
    [
        ("This   is   a   test.", "This is a test."),
        ("## A heading\n- first item\n- second item", "A heading。first item。second item"),
        ("Wait... what?!?!", "Wait。what？！"),
        ("see app.js.map -> v2.3.1 now", "see app.js.map，v2.3.1 now"),
        ("mail ops+tts@example.ai \u200bplease", "mail ops+tts@example.ai please"),
        ("【Notice】Servers down —— back soon", "Notice。Servers down。back soon"),
    ],
)
def test_delay_text_is_cleaned_up_as_its_processor_does(text, cleaned):
    from onnx_tts.families.moss_tts.normalize import normalize_text

    assert normalize_text(text) == cleaned


def test_text_spelling_a_control_token_is_refused(engines):
    with pytest.raises(InputError, match="control token"):
        engines("local-v1.5").model.text.chunks("say <|im_end|> now", {})


# -- the offline tools and batching ----------------------------------------------------------------
@pytest.fixture(scope="module")
def inplace(models, tmp_path_factory):
    """Local v1.5 with its backbone converted to GroupQueryAttention (`onnx-tts convert
    --inplace-kv`): requests share backbone steps as rows of one in-place KV buffer."""
    from onnx_tts.tools.convert import convert_bundle_inplace_kv

    _, out, _ = models("local-v1.5")
    converted = tmp_path_factory.mktemp("moss-tts-inplace") / "model"
    convert_bundle_inplace_kv(out, converted)
    engine = onnx_tts.load(converted, cache_dir=tmp_path_factory.mktemp("inplace-cache"))
    yield converted, engine
    engine.close()


def test_converted_backbone_keeps_its_sidecar_and_gives_the_published_frames(inplace, loops):
    converted, engine = inplace
    manifest = json.loads((converted / "bundle.json").read_text())
    assert (converted / "backbone.onnx_data").is_file() and manifest["sha256"]["backbone.onnx"]
    assert engine.model.kv_mode == "inplace"
    assert frames_of(engine, seed=1) == reference_frames(loops("local-v1.5"), seed=1)


def test_batched_rows_equal_solo_runs(inplace):
    _, engine = inplace
    texts = ["Hello there.", TEXT, "A somewhat longer sentence, to give this row a longer prompt."]
    jobs = [(texts[i % 3], i) for i in range(6)]
    alone = [frames_of(engine, text, seed=seed) for text, seed in jobs]
    before = engine.stats()
    together: list = [None] * len(jobs)
    start = threading.Barrier(len(jobs))

    def run(index: int) -> None:
        text, seed = jobs[index]
        start.wait()
        together[index] = frames_of(engine, text, seed=seed)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert together == alone
    after = engine.stats()
    assert (after["row_steps"] - before["row_steps"]) / (after["steps"] - before["steps"]) > 1.5


def test_quantized_model_loads_and_speaks(models, tmp_path):
    _, out, _ = models("local-v1.5")
    quantized = tmp_path / "int8"
    done = _cli("quantize", str(out), str(quantized))
    assert done.returncode == 0, done.stderr
    manifest = json.loads((quantized / "bundle.json").read_text())
    assert "backbone" in manifest["quantized"]["graphs"]
    engine = onnx_tts.load(quantized, cache_dir=tmp_path / "cache")
    try:
        assert len(frames_of(engine, seed=1, greedy=True)) == STEPS["local-v1.5"]  # never stops
    finally:
        engine.close()


def test_sessions_on_several_threads_give_the_published_frames_without_spinning(
    models, loops, tmp_path, monkeypatch
):
    """`load(threads=2)`: Local v1 runs 35 sessions one after another per frame; a spinning
    pool of each would poll through the next one's run (measured 36x slower on 2 cores), so
    no session spins, and the frames are still the published loop's."""
    from onnx_tts import session as session_module

    made: list = []
    core_session = session_module._core.Session

    def recording(path: str, config):
        made.append((path, config.intra_op_threads, config.allow_spinning))
        return core_session(path, config)

    monkeypatch.setattr(session_module._core, "Session", recording)
    _, out, _ = models("local-v1")
    engine = onnx_tts.load(out, threads=2, cache_dir=tmp_path / "cache")
    try:
        assert frames_of(engine, greedy=True) == reference_frames(loops("local-v1"), greedy=True)
    finally:
        engine.close()
    assert len(made) > 33 and {threads for _, threads, _ in made} == {2}
    assert [path for path, _, spinning in made if spinning] == []


# -- the exporter's CLI ----------------------------------------------------------------------------
def _cli(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ONNX_TTS_REPO"}
    return subprocess.run(
        [sys.executable, "-m", "onnx_tts", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=900,
    )


def test_broken_checkpoints_are_one_line_and_exit_2(models, tmp_path):
    checkpoint, _, _ = models("local-v1.5")
    broken = tmp_path / "broken"
    shutil.copytree(checkpoint, broken)
    index = json.loads((broken / "model.safetensors.index.json").read_text())
    del index["weight_map"]["local_text_lm_head.weight"]
    (broken / "model.safetensors.index.json").write_text(json.dumps(index))
    for args, message in [
        ((str(broken), str(tmp_path / "out")), "missing local_text_lm_head.weight"),
        ((str(checkpoint), str(checkpoint / "out")), "inside the checkpoint directory"),
        ((str(tmp_path / "nowhere"), str(tmp_path / "out2")), "is not a directory"),
    ]:
        done = _cli("export", "moss-tts", *args)
        assert done.returncode == 2, done.stderr
        assert message in done.stderr and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))


# -- audio: the codec, references, chunks, streaming, CLI and server ------------------------------
def torch_decode(codecs, variant: str, frames) -> np.ndarray:
    """The torch codec's decode of `frames` [F, n_vq] as [samples, channels] (the reference)."""
    from export.moss_audio_tokenizer import load_codec

    codec = load_codec(codecs(*CODECS[variant])[0])
    with torch.no_grad():
        audio = codec.decode(torch.tensor(frames).T[:, None, :]).numpy()[0].T
    return audio[:, 0] if audio.shape[1] == 1 else audio


def assert_close_audio(ours: np.ndarray, theirs: np.ndarray) -> None:
    """Equal up to float rounding of the codec graphs: 1e-5 of the audio's peak."""
    assert ours.shape == theirs.shape
    peak = max(1.0, float(np.abs(theirs).max()))
    assert float(np.abs(ours - theirs).max()) <= 1e-5 * peak


@pytest.mark.parametrize("variant", VARIANTS)
def test_audio_is_the_torch_codecs_decode_one_shot_and_streamed(engines, loops, codecs, variant):
    engine = engines(variant)
    frames = reference_frames(loops(variant), seed=2)
    one_shot = engine.synthesize(TEXT, seed=2, max_new_frames=STEPS[variant])
    assert one_shot.sample_rate == (48000 if variant == "local-v1.5" else 24000)
    assert_close_audio(one_shot.samples, torch_decode(codecs, variant, frames))
    streamed = np.concatenate(list(engine.stream(TEXT, seed=2, max_new_frames=STEPS[variant])))
    assert_close_audio(streamed, one_shot.samples)


@pytest.mark.parametrize("variant", ["local-v1.5", "delay"])
def test_cloned_voice_from_a_file_through_the_reference_cache(
    engines, loops, codecs, variant, tmp_path
):
    """A reference file's codes are its canonical batch-1 encode (the torch codec's codes of
    the prepared samples), cached; speech with that voice is the published loop's with those
    codes in the reference rows."""
    from export.moss_audio_tokenizer import load_codec
    from tests.conftest import speechlike

    engine = engines(variant)
    rate, channels = engine.model.sample_rate, engine.model.channels
    samples = speechlike(1.6, rate, seed=3)
    path = tmp_path / "reference.wav"
    soundfile.write(path, np.stack([samples] * channels, axis=1), rate, subtype="FLOAT")
    before = engine.cache_stats()["reference"]
    voice = engine.voice(str(path))
    again = engine.voice(str(path))
    after = engine.cache_stats()["reference"]
    assert np.array_equal(voice["codes"], again["codes"])
    assert after["hits"] > before.get("hits", 0)
    codec = load_codec(codecs(*CODECS[variant])[0])
    prepared = engine.model.voices.encoder.validate(engine.model.voices.read(path))
    with torch.no_grad():
        expected = (
            codec.encode(
                torch.tensor(prepared).reshape(1, channels, -1), loops(variant).config.n_vq
            )
            .numpy()[:, 0]
            .T
        )
    assert np.array_equal(voice["codes"], expected)
    ours = frames_of(engine, seed=6, voice=str(path))
    assert ours == reference_frames(loops(variant), seed=6, reference=voice["codes"])


def test_a_text_of_several_chunks_is_each_chunk_published_with_seed_plus_i(engines, loops, codecs):
    engine = engines("local-v1.5")
    text = "The first sentence is here. A second one follows it. And then a third."
    options = {"max_new_frames": 8, "max_chunk_chars": 30}
    chunks = engine.model.text.chunks(text, engine.model.request_options(options))
    assert len(chunks) == 3
    result = engine.synthesize(text, seed=10, **options)
    pause = np.zeros((round(0.15 * 48000), 2), np.float32)
    pieces = []
    for index, chunk in enumerate(chunks):
        frames = reference_frames(loops("local-v1.5"), chunk, seed=10 + index, steps=8)
        pieces += [torch_decode(codecs, "local-v1.5", frames), pause]
    assert_close_audio(result.samples, np.concatenate(pieces[:-1]))


def test_ssml_breaks_and_word_timings_work_unchanged(engines):
    """The engine's markup and captions need nothing of the family: an SSML break is silence
    between two chunks, each chunk spoken as published; words get (estimated) times."""
    engine = engines("local-v1.5")
    ssml = '<speak>Hello there.<break time="300ms"/>See you soon.</speak>'
    audio = engine.synthesize(ssml, seed=3, max_new_frames=6, timestamps=True)
    assert [w.word for w in audio.words] == ["Hello", "there", "See", "you", "soon"]
    assert all(a.end <= b.start + 1e-6 for a, b in itertools.pairwise(audio.words))
    silent = np.flatnonzero(np.abs(audio.samples).max(axis=1) == 0)
    assert len(silent) >= round(0.3 * 48000)


def test_cli_synth_and_info(models, engines, tmp_path):
    _, out, _ = models("delay")
    wav = tmp_path / "out.wav"
    command = [
        sys.executable,
        "-m",
        "onnx_tts.cli",
        "synth",
        TEXT,
        "--model",
        str(out),
        "-o",
        str(wav),
        "--seed",
        "2",
        "--max-new-frames",
        str(STEPS["delay"]),
        "--threads",
        "1",
        "--cache-dir",
        str(tmp_path / "cache"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    ours, rate = soundfile.read(wav, dtype="int16")
    expected = engines("delay").synthesize(TEXT, seed=2, max_new_frames=STEPS["delay"]).samples
    assert rate == 24000 and ours.shape == expected.shape
    assert np.abs(ours.astype(int) - pcm16(expected).astype(int)).max() <= 1  # float rounding
    info = subprocess.run(
        [sys.executable, "-m", "onnx_tts.cli", "info", "--model", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert info.returncode == 0, info.stderr
    described = json.loads(info.stdout)
    assert described["family"] == "moss-tts" and described["variant"] == "delay"


def test_server_speaks_the_engines_audio(models, engines, tmp_path):
    import httpx

    from benchmarks.live_server import LiveServer

    _, out, _ = models("local-v1.5")
    expected = engines("local-v1.5").synthesize(TEXT, seed=4, max_new_frames=10).samples
    live = LiveServer(tmp_path, "--model", str(out), "--threads", "1")
    try:
        body = {
            "input": TEXT,
            "voice": "default",
            "seed": 4,
            "max_new_frames": 10,
            "response_format": "wav",
        }
        reply = httpx.post(live.url + "/v1/audio/speech", json=body, timeout=300)
    finally:
        live.stop()
    assert reply.status_code == 200, reply.text
    samples, rate = soundfile.read(io.BytesIO(reply.content), dtype="int16")
    assert rate == 48000 and samples.shape == expected.shape
    assert np.abs(samples.astype(int) - pcm16(expected).astype(int)).max() <= 1

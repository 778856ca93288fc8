"""End to end: text (+ voice) -> waveform on the reference bundle, the CLI, and bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile

import onnx_tts
from onnx_tts.audio import check_output_path
from onnx_tts.cli import main
from onnx_tts.decoding import RowSampler, SamplingOptions
from onnx_tts.errors import InputError, ModelError, OutputError
from onnx_tts.families.codec_lm import DelayPattern
from onnx_tts.frontend import normalize_text, split_sentences
from tests.conftest import codec_lm_dir, speechlike

TEXT = "Hello there. The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, onnx_tts.Engine]]:
    made = {
        mode: onnx_tts.load(codec_lm_dir(), kv=mode, cache_dir=None)
        for mode in ("copy", "chain", "inplace")
    }
    yield made
    for engine in made.values():
        engine.close()


def test_every_kv_mode_gives_identical_samples(engines: dict[str, onnx_tts.Engine]) -> None:
    audio = {mode: engine.synthesize(TEXT, seed=7) for mode, engine in engines.items()}
    reference = audio["copy"]
    assert reference.sample_rate == 24000
    assert reference.samples.dtype == np.float32
    assert np.isfinite(reference.samples).all()
    assert np.abs(reference.samples).max() <= 1.0
    for mode in ("chain", "inplace"):
        np.testing.assert_array_equal(audio[mode].samples, reference.samples)


def test_same_seed_same_audio_other_seed_other_audio(codec_lm_engine: onnx_tts.Engine) -> None:
    first = codec_lm_engine.synthesize("A short sentence.", seed=3)
    again = codec_lm_engine.synthesize("A short sentence.", seed=3)
    other = codec_lm_engine.synthesize("A short sentence.", seed=4)
    np.testing.assert_array_equal(first.samples, again.samples)
    assert not np.array_equal(first.samples, other.samples)


def test_duration_is_plausible_for_the_text(codec_lm_engine: onnx_tts.Engine) -> None:
    model = codec_lm_engine.model
    for text in ("Hi.", TEXT):
        chunks = model.text.chunks(text, {})
        audio = codec_lm_engine.synthesize(text, seed=1)
        frames = audio.samples.shape[0] // model.hop_length
        pause_frames = (len(chunks) - 1) * 0.15 * 50
        low = sum(model.frame_limits(len(c.ids))[0] for c in chunks)
        high = sum(model.frame_limits(len(c.ids))[1] for c in chunks) + pause_frames + 1
        assert low <= frames <= high, (text, frames, low, high)
    short = codec_lm_engine.synthesize("Hi.", seed=1).duration
    long = codec_lm_engine.synthesize(TEXT * 2, seed=1).duration
    assert long > 3 * short


def test_long_text_is_split_into_sentences(codec_lm_engine: onnx_tts.Engine) -> None:
    seen: list[tuple[int, int]] = []
    codec_lm_engine.synthesize(
        "One. Two. Three.", seed=1, progress=lambda done, total: seen.append((done, total))
    )
    assert seen == [(1, 3), (2, 3), (3, 3)]


def test_voice_changes_the_output_and_wav_flac_agree(
    codec_lm_engine: onnx_tts.Engine, tmp_path: Path
) -> None:
    samples = speechlike(2.5, seed=2)
    wav, flac = tmp_path / "v.wav", tmp_path / "v.flac"
    soundfile.write(str(wav), samples, 24000, subtype="PCM_24")
    soundfile.write(str(flac), samples, 24000, subtype="PCM_24")
    plain = codec_lm_engine.synthesize("Clone me.", seed=5)
    from_wav = codec_lm_engine.synthesize("Clone me.", voice=wav, seed=5)
    from_flac = codec_lm_engine.synthesize("Clone me.", voice=flac, seed=5)
    assert not np.array_equal(plain.samples, from_wav.samples)
    np.testing.assert_array_equal(from_wav.samples, from_flac.samples)


def test_voice_at_another_rate_is_resampled(codec_lm_engine: onnx_tts.Engine, tmp_path: Path):
    path = tmp_path / "v16k.wav"
    soundfile.write(str(path), speechlike(2.0, sample_rate=16000), 16000)
    prompt = codec_lm_engine.voice(path)
    assert prompt["codes"].shape == (int(2.0 * 24000) // 480, 4)


def test_concat_lm_runs_in_copy_and_chain_and_refuses_inplace() -> None:
    copy = onnx_tts.load(codec_lm_dir(), kv="copy", lm_graph="lm_concat", cache_dir=None)
    chain = onnx_tts.load(codec_lm_dir(), kv="chain", lm_graph="lm_concat", cache_dir=None)
    a = copy.synthesize("Concat graphs too.", seed=2)
    b = chain.synthesize("Concat graphs too.", seed=2)
    np.testing.assert_array_equal(a.samples, b.samples)
    with pytest.raises(InputError, match="GroupQueryAttention"):
        onnx_tts.load(codec_lm_dir(), kv="inplace", lm_graph="lm_concat", cache_dir=None)


def test_audio_save_is_atomic(
    codec_lm_engine: onnx_tts.Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    audio = codec_lm_engine.synthesize("Save me.", seed=1)
    target = tmp_path / "out.wav"
    audio.save(target)
    before = target.read_bytes()
    data, rate = soundfile.read(str(target), dtype="float32")
    assert rate == 24000 and len(data) == len(audio.samples)

    def broken_write(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(soundfile, "write", broken_write)
    with pytest.raises(OutputError, match="No space left"):
        audio.save(target)
    assert target.read_bytes() == before  # the old file survives a failed write
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.wav"]


# -- frontend, sampler, delay pattern ------------------------------------------------------------


def test_normalize_text() -> None:
    assert normalize_text("Dr. Smith paid $1,250 & left.") == (
        "doctor Smith paid one thousand two hundred fifty dollars and left."
    )
    assert normalize_text("It’s  3.5\tpercent…") == "It's three point five percent..."
    assert normalize_text("Room 42") == "Room forty two"


def test_split_sentences_bounds_chunk_length() -> None:
    text = "First one. Second one! " + ", ".join(["a long clause of words"] * 20) + "."
    chunks = split_sentences(text, max_chars=80)
    assert chunks[:2] == ["First one.", "Second one!"]
    assert all(len(c) <= 80 for c in chunks)
    assert " ".join(chunks).replace(" ", "") == text.replace(" ", "")


def sample_one(options: SamplingOptions, logits: np.ndarray) -> int:
    sampler = RowSampler(1)
    sampler.assign(0, options.checked())
    return int(sampler.sample(np.zeros(1, np.int64), logits[None])[0])


def test_sampler_greedy_topk_and_seed() -> None:
    logits = np.array([0.1, 2.0, 1.9, -1.0], np.float32)
    assert sample_one(SamplingOptions(temperature=0), logits) == 1
    assert {sample_one(SamplingOptions(top_k=1, seed=s), logits) for s in range(20)} == {1}
    draws = [sample_one(SamplingOptions(seed=11, top_k=0, top_p=1.0), logits) for _ in range(3)]
    assert len(set(draws)) == 1
    spread = {
        sample_one(SamplingOptions(seed=s, temperature=2.0, top_k=0, top_p=1.0), logits)
        for s in range(50)
    }
    assert len(spread) > 2


def test_rows_with_different_options_sample_as_if_alone() -> None:
    """One vectorised call over rows with different temperature/top-k/top-p/seed gives each row
    exactly what it gets alone: a row's draw never depends on its batch neighbours."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((4, 3, 50)).astype(np.float32)
    options = [
        SamplingOptions(temperature=0.0, seed=1),
        SamplingOptions(temperature=0.7, top_k=5, top_p=1.0, seed=2),
        SamplingOptions(temperature=1.3, top_k=0, top_p=0.8, seed=3),
        SamplingOptions(temperature=1.0, top_k=10, top_p=0.9, seed=4),
    ]
    together = RowSampler(4)
    for row, option in enumerate(options):
        together.assign(row, option)
    rows = np.array([2, 0, 3, 1])
    batched = together.sample(rows, logits[rows])
    for position, row in enumerate(rows):
        alone = RowSampler(1)
        alone.assign(0, options[row])
        expected = alone.sample(np.zeros(1, np.int64), logits[row][None])[0]
        np.testing.assert_array_equal(batched[position], expected)


def test_repetition_penalty_lowers_seen_tokens() -> None:
    sampler = RowSampler(1)
    sampler.assign(0, SamplingOptions(repetition_penalty=2.0))
    out = sampler.penalize(
        np.zeros(1, np.int64),
        np.array([[4.0, -1.0, 3.0]], np.float32),
        np.array([[True, True, False]]),
    )
    np.testing.assert_allclose(out, [[2.0, -2.0, 3.0]])


@pytest.mark.parametrize(
    "bad",
    [
        {"temperature": -1},
        {"top_p": 0},
        {"top_k": -2},
        {"seed": -5},
        {"seed": 1.5},
        {"seed": "7"},
        {"temperature": "hot"},
        {"top_k": 1.5},
        {"temperature": float("nan")},
        {"seed": True},
    ],
)
def test_bad_sampling_options(bad: dict) -> None:
    with pytest.raises(InputError):
        SamplingOptions(**bad).checked()


def test_largest_seed_works_for_every_sentence(codec_lm_engine: onnx_tts.Engine) -> None:
    """Sentence i uses seed + i: the largest valid seed must not fail on sentence 2."""
    audio = codec_lm_engine.synthesize("One. Two. Three.", seed=2**63 - 1)
    assert audio.duration > 0.3
    with pytest.raises(InputError, match="seed"):
        codec_lm_engine.synthesize("One.", seed=2**63)


def test_delay_pattern_assembles_whole_frames_only() -> None:
    k, pad, eos = 3, 90, 92
    pattern = DelayPattern(2, k, pad, eos)
    rows = np.array([1])
    frames_out: list[np.ndarray] = []
    forced_rows = []
    # Frames f carry value 10*f + codebook; EOS after 4 frames.
    step = 0
    while not pattern.finished(rows)[0]:
        forced = pattern.forced(rows)[0]
        forced_rows.append(forced)
        values = [
            int(forced[c])
            if forced[c] >= 0
            else (eos if c == 0 and step == 4 else 10 * (step - c) + c)
            for c in range(k)
        ]
        frames, completed = pattern.push(rows, np.array([values]))
        if completed[0]:
            frames_out.append(frames[0])
        step += 1
    assert step == 4 + k - 1
    # The first rows pad the lagging codebooks; the last ones pad codebook 0 after its EOS.
    assert list(forced_rows[0]) == [-1, pad, pad] and list(forced_rows[1]) == [-1, -1, pad]
    assert list(forced_rows[-1]) == [pad, pad, -1]
    np.testing.assert_array_equal(
        np.stack(frames_out), [[10 * f + c for c in range(k)] for f in range(4)]
    )
    assert pattern.step[0] == 0  # the other row was never touched


# -- bundle validation ---------------------------------------------------------------------------


@pytest.fixture
def bundle_copy(tmp_path: Path) -> Path:
    target = tmp_path / "bundle"
    shutil.copytree(codec_lm_dir(), target)
    return target


def _edit_manifest(root: Path, edit) -> None:
    manifest = json.loads((root / "bundle.json").read_text())
    edit(manifest)
    (root / "bundle.json").write_text(json.dumps(manifest))


def test_manifest_mismatch_names_the_tensor(bundle_copy: Path) -> None:
    _edit_manifest(bundle_copy, lambda m: m["codec"].update(codebooks=5))
    with pytest.raises(ModelError, match=r"codes.*dimension 2 is 4, expected 5"):
        onnx_tts.load(bundle_copy, cache_dir=None)


def test_missing_graph_is_named(bundle_copy: Path) -> None:
    (bundle_copy / "vocoder.onnx").unlink()
    with pytest.raises(ModelError, match=r"missing file.*vocoder\.onnx"):
        onnx_tts.load(bundle_copy, cache_dir=None)


def test_corrupt_graph_fails_its_checksum(bundle_copy: Path) -> None:
    data = bytearray((bundle_copy / "embed.onnx").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (bundle_copy / "embed.onnx").write_bytes(bytes(data))
    with pytest.raises(ModelError, match=r"embed.onnx does not match the sha256"):
        onnx_tts.load(bundle_copy, cache_dir=None)


def test_unsupported_format_version(bundle_copy: Path) -> None:
    _edit_manifest(bundle_copy, lambda m: m.update(format_version=99))
    with pytest.raises(ModelError, match="format_version 99"):
        onnx_tts.load(bundle_copy, cache_dir=None)


# -- CLI -----------------------------------------------------------------------------------------


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main([*args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_synth_writes_a_wav(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "hello.wav"
    code, _, err = run_cli(
        [
            "synth",
            "Hello.",
            "-o",
            str(out),
            "--seed",
            "1",
            "--cache-dir",
            "none",
            "--kv",
            "chain",
            "-v",
            "--model",
            str(codec_lm_dir()),
        ],
        capsys,
    )
    assert code == 0, err
    data, rate = soundfile.read(str(out))
    assert rate == 24000 and len(data) > 0
    assert "RTF" in err and "[" not in err  # timings shown, no progress bar off a terminal
    again = tmp_path / "again.wav"
    run_cli(
        [
            "synth",
            "Hello.",
            "-o",
            str(again),
            "--seed",
            "1",
            "--cache-dir",
            "none",
            "--model",
            str(codec_lm_dir()),
        ],
        capsys,
    )
    assert again.read_bytes() == out.read_bytes()


def test_cli_reads_text_from_stdin(tmp_path: Path) -> None:
    out = tmp_path / "stdin.wav"
    result = subprocess.run(
        [sys.executable, "-m", "onnx_tts.cli", "synth", "-", "-o", str(out), "--cache-dir", "none"],
        input=b"Read from standard input.",
        capture_output=True,
    )
    assert result.returncode == 0, result.stderr
    assert soundfile.info(str(out)).duration > 0.1


def test_cli_info_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        ["info", "--json", "--cache-dir", "none", "--model", str(codec_lm_dir())], capsys
    )
    info = json.loads(out)
    assert code == 0
    assert info["sample_rate"] == 24000 and info["kv"]["layers"] == 4
    lm_inputs = info["graphs"]["lm"]["inputs"]
    assert any(line.startswith("past_key_values.3.value: float32") for line in lm_inputs)


def _bad_reference_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    corrupt = tmp_path / "corrupt.wav"
    corrupt.write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunkjunkjunk")
    unsupported = tmp_path / "voice.txt"
    unsupported.write_text("not audio at all")
    silent = tmp_path / "silent.wav"
    soundfile.write(str(silent), np.zeros(48000, np.float32), 24000)
    short = tmp_path / "short.wav"
    soundfile.write(str(short), speechlike(0.1), 24000)
    return {
        "missing": (tmp_path / "nope.wav", "not found"),
        "corrupt": (corrupt, "cannot decode"),
        "unsupported": (unsupported, "cannot decode"),
        "silent": (silent, "silent"),
        "too short": (short, "at least"),
    }


def test_cli_bad_inputs_fail_cleanly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.wav"
    cases: list[tuple[list[str], str]] = [
        (["synth", "", "-o", str(out)], "text is empty"),
        (["synth", "   \n\t", "-o", str(out)], "text is empty"),
        (
            ["synth", "Hi.", "-o", str(out), "--model", str(tmp_path / "no-model")],
            "model directory not found",
        ),
        (["synth", "Hi.", "-o", str(tmp_path / "missing-dir" / "x.wav")], "does not exist"),
        (["synth", "Hi.", "-o", str(tmp_path / "x.xyz")], "unknown extension"),
        (["synth", "Hi.", "-o", str(out), "--temperature", "-2"], "temperature"),
    ]
    for _name, (path, message) in _bad_reference_files(tmp_path).items():
        cases.append((["synth", "Hi.", "-o", str(out), "--voice", str(path)], message))
    for args, message in cases:
        code, _stdout, err = run_cli([*args, "--cache-dir", "none"], capsys)
        assert code == 2, (args, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, err)
        assert "Traceback" not in err
        assert not out.exists()
    leftovers = [
        p.name for p in tmp_path.iterdir() if p.name.startswith(".") or p.suffix == ".part"
    ]
    assert leftovers == []


def test_cli_undecodable_stdin_and_unwritable_dir(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "onnx_tts.cli", "synth", "-", "-o", str(tmp_path / "x.wav")],
        input=b"\xff\xfe\xfa not utf-8",
        capture_output=True,
    )
    assert result.returncode == 2
    assert b"not valid UTF-8" in result.stderr and b"Traceback" not in result.stderr
    directory = tmp_path / "dir.wav"
    directory.mkdir()
    with pytest.raises(OutputError, match="is a directory"):
        check_output_path(directory)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if not os.access(locked, os.W_OK):  # root may write anyway; then there is no error
            with pytest.raises(OutputError, match="not writable"):
                check_output_path(locked / "x.wav")
    finally:
        locked.chmod(0o700)


def test_cli_stream_outputs_match_one_shot(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "onnx_tts.cli", "synth", "Stream it. Twice.", "--seed", "4"]
    base += ["--cache-dir", "none", "--model", str(codec_lm_dir())]
    one_shot = tmp_path / "one.wav"
    streamed = tmp_path / "streamed.wav"
    subprocess.run([*base, "-o", str(one_shot)], check=True, capture_output=True)
    result = subprocess.run([*base, "--stream", "-o", str(streamed), "-v"], capture_output=True)
    assert result.returncode == 0, result.stderr
    assert b"time to first audio" in result.stderr
    raw = subprocess.run([*base, "--stream", "-o", "-"], check=True, capture_output=True).stdout
    reference, rate = soundfile.read(str(one_shot), dtype="int16")
    progressive, rate2 = soundfile.read(str(streamed), dtype="int16")
    assert rate == rate2 == 24000
    assert len(raw) == 2 * len(reference) == 2 * len(progressive)
    pcm = np.frombuffer(raw, dtype="<i2")
    # Default windows decode exactly (overlap covers the causal vocoder's receptive field);
    # 16-bit rounding of float sums may differ by one step.
    assert np.abs(pcm.astype(np.int32) - reference).max() <= 1
    np.testing.assert_array_equal(pcm, progressive)
    assert not list(tmp_path.glob(".*.part"))


def test_cli_raw_stdout_needs_stream(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["synth", "Hi.", "-o", "-", "--cache-dir", "none"], capsys)
    assert code == 2 and "add --stream" in err


def test_top_p_keeps_the_smallest_prefix_reaching_p() -> None:
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]] * 400))
    sampler = RowSampler(1)
    sampler.assign(0, SamplingOptions(temperature=1.0, top_k=0, top_p=0.6, seed=0))
    tokens = sampler.sample(np.zeros(len(logits), np.int64), logits)
    assert set(tokens.tolist()) == {0, 1}  # 0.5 < 0.6, so token 1 (crossing) is kept, 2-3 not
    share = (tokens == 0).mean()
    assert 0.55 < share < 0.70  # renormalised: 0.5 / 0.8 = 0.625


# -- text chunks fit the KV capacity ---------------------------------------------------------------


def test_one_long_word_is_split_to_fit_the_kv_capacity(codec_lm_engine: onnx_tts.Engine) -> None:
    """A 2,000-letter word was refused ("needs N KV positions"): every chunk must fit."""
    backend = codec_lm_engine.model
    chunks = backend.text.chunks("a" * 2000, {})
    assert sum(len(chunk.ids) for chunk in chunks) == len(backend.text.tokenizer.encode("a" * 2000))
    capacity = backend.pool.capacity.fixed
    assert all(backend._positions_needed(len(chunk.ids)) <= capacity for chunk in chunks)
    assert max(len(chunk.ids) for chunk in chunks) == backend.max_chunk_tokens
    audio = codec_lm_engine.synthesize("a" * 300, seed=3)
    assert audio.duration > 0 and np.isfinite(audio.samples).all()


def test_long_sentence_is_split_at_spaces_not_inside_words(
    codec_lm_engine: onnx_tts.Engine,
) -> None:
    backend = codec_lm_engine.model
    words = ["word"] * 60
    chunks = backend.text.chunks(" ".join(words), {})
    assert len(chunks) > 1
    assert all(len(chunk.ids) <= backend.max_chunk_tokens for chunk in chunks)
    word = backend.text.tokenizer.encode("word")
    # Each chunk holds whole words: its tokens start with those of "word".
    assert all(list(chunk.ids[: len(word)]) == word for chunk in chunks)


def test_kv_capacity_too_small_for_one_token_is_refused_at_load(bundle_copy: Path) -> None:
    """kv.capacity 16 used to cut every sentence short without a word; now load says why."""
    _edit_manifest(bundle_copy, lambda m: m["kv"].update(capacity=16))
    with pytest.raises(ModelError, match=r"kv.capacity.*16.*needs at least"):
        onnx_tts.load(bundle_copy, cache_dir=None)


@pytest.mark.parametrize(
    "kwargs, name",
    [({"model": 123}, "model"), ({"cache_dir": 123}, "cache_dir"), ({"redis_url": 5}, "redis_url")],
)
def test_load_refuses_arguments_of_the_wrong_type(kwargs: dict, name: str) -> None:
    """load(model=123) and load(cache_dir=123) were TypeError tracebacks from pathlib."""
    with pytest.raises(InputError, match=f"^{name} must be"):
        onnx_tts.load(**kwargs)


@pytest.mark.parametrize(
    "raw, kept",
    [
        (
            "cannot load ONNX graph /m/lm.onnx: Load model from /m/lm.onnx failed:std::bad_alloc",
            "cannot load ONNX graph /m/lm.onnx: out of memory",
        ),
        (
            "ONNX Runtime: /onnxruntime_src/core/framework/bfc_arena.cc:360 void* onnxruntime::"
            "BFCArena::AllocateRawInternal(size_t, bool) Failed to allocate memory for requested "
            "buffer of size 8388608",
            "ONNX Runtime: out of memory",
        ),
    ],
)
def test_allocation_failures_are_one_plain_line(raw: str, kept: str) -> None:
    from onnx_tts.cli import plain_error
    from onnx_tts.errors import SessionError

    line = plain_error(SessionError(raw))
    assert line.startswith(kept)
    assert "bad_alloc" not in line and "bfc_arena" not in line and "size_t" not in line
    assert plain_error(SessionError("graph x: input 'a' has shape [2]")) == (
        "graph x: input 'a' has shape [2]"
    )


def test_cli_memory_error_is_exit_2_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    def no_memory(*_: object, **__: object) -> None:
        raise MemoryError

    import onnx_tts.pipeline

    monkeypatch.setattr(onnx_tts.pipeline, "build_engine", no_memory)
    assert main(["synth", "Hi.", "-o", str(tmp_path / "x.wav")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("onnx-tts: error: out of memory")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("model", ["voice", "codec-lm"])
def test_an_utterance_with_no_audio_is_an_error(
    model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A model that ends a sentence at its first step (e.g. it samples the stop token first)
    made an empty WAV with exit 0; every family now raises EmptyAudioError (CLI: exit 2, one
    line, no file) and nothing is cached."""
    from onnx_tts.decoding import StepOutput
    from onnx_tts.errors import EmptyAudioError

    model_dir = codec_lm_dir() if model == "codec-lm" else None
    engine = onnx_tts.load(
        model_dir, cache_dir=None, result_cache_bytes=1 << 20, result_cache_dir=None
    )
    kind = type(engine.model.program)
    normal = kind.consume

    def stops_at_once(self, state, rows, outputs):  # the program's step, then "done, no frame"
        normal(self, state, rows, outputs)
        return StepOutput([np.zeros((0, 1), np.int64) for _ in rows], np.ones(len(rows), bool))

    monkeypatch.setattr(kind, "consume", stops_at_once)
    with pytest.raises(EmptyAudioError, match="no audio for any of the 2 sentences"):
        engine.synthesize("Hello there. Second sentence.", seed=1)
    with pytest.raises(EmptyAudioError, match="no audio for the text"):
        list(engine.stream("Hello there.", seed=1))
    assert engine.cache_stats()["result"]["entries"] == 0
    out = tmp_path / "out.wav"
    args = ["synth", "Hello there.", "-o", str(out), "--cache-dir", "none", "-q", "-v"]
    args += ["--model", str(model_dir)] if model_dir else []
    for extra in ([], ["--stream"]):
        code, _, err = run_cli([*args, *extra], capsys)
        assert code == 2 and err.strip().count("\n") == 0 and "no audio" in err, err
        assert "RTF" not in err and not out.exists()
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(kind, "consume", normal)
    assert engine.synthesize("Hello there.", seed=1).duration > 0.1  # the same engine recovers

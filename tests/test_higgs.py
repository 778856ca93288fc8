"""Higgs Audio v2 and Higgs TTS 3: `onnx-tts export higgs` from checkpoints in the published
layouts, then the exported directory through `onnx_tts.load`, the CLI and a live server
(caches on), against the references of tests/higgs_reference.py:

* v2: `transformers` 5.23's HiggsAudioV2ForConditionalGeneration.generate and its processor
  (prompt, reference encode, delay pattern, decode) on a small random-weight model, greedy and
  sampled (same draws), repetition-aware resampling on as published;
* v3: a paraphrase of SGLang-Omni's higgs_tts loop on a stand-in checkpoint with the published
  tensor names (the codec inside it), greedy and sampled.
"""

from __future__ import annotations

import io
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
import transformers  # noqa: F401

import onnx_tts
from onnx_tts.decoding.delay import undelay
from onnx_tts.errors import InputError
from tests import higgs_reference as ref

TEXT = "Hello there, how are you today?"
TWO_SENTENCES = "Hello there, how are you today? The sun rises in the east and sets in the west."
REFERENCE_TEXT = "It was the night before my birthday."
ROWS = 80  # max_new_tokens: the runs end by the end rule or here


def _export(checkpoint: Path, out: Path, *extra: str) -> None:
    command = [sys.executable, "-m", "onnx_tts.cli", "export", "higgs", str(checkpoint), str(out)]
    result = subprocess.run(
        [*command, "--positions", "1024", *extra], capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stderr
    assert "backbone.last_hidden_state" in result.stdout  # the checks are reported


@pytest.fixture(scope="module")
def v2(tmp_path_factory):
    root = tmp_path_factory.mktemp("higgs-v2")
    model, codec, _ = ref.build_v2(root / "checkpoint", root / "codec", eos_scale=1.4)
    _export(root / "checkpoint", root / "model", "--codec", str(root / "codec"))
    engine = onnx_tts.load(root / "model", cache_dir=root / "cache")
    processor = ref.v2_processor(root / "checkpoint", codec)
    yield {"root": root, "model": model, "codec": codec, "processor": processor, "engine": engine}
    engine.close()


@pytest.fixture(scope="module")
def v3(tmp_path_factory):
    root = tmp_path_factory.mktemp("higgs-v3")
    tensors, codec, tokenizer = ref.build_v3(root / "checkpoint")
    _export(root / "checkpoint", root / "model")
    engine = onnx_tts.load(root / "model", cache_dir=root / "cache")
    yield {
        "root": root,
        "reference": ref.V3Reference(tensors, codec, tokenizer),
        "engine": engine,
    }
    engine.close()


def _frames(engine, text, *, seed=None, voice=None, **options) -> np.ndarray:
    """The frames [F, 8] of a one-chunk text through the engine's scheduler."""
    model = engine.model
    sampling_keys = ("temperature", "top_k", "top_p")
    family = {k: v for k, v in options.items() if k not in sampling_keys}
    checked = model.request_options({"max_new_tokens": ROWS, **family})
    [chunk] = model.text.chunks(text, checked)
    overrides = {k: v for k, v in options.items() if k in sampling_keys}
    sampling = model.sampling_defaults().with_overrides({"seed": seed, **overrides})
    frames = engine.generate(chunk, engine.voice(voice), sampling, checked)
    return np.array([list(map(int, frame)) for frame in frames]).reshape(-1, 8)


def _v2_reference(v2, text, **kwargs):
    rows, audio = ref.v2_generate(v2["model"], v2["processor"], text, max_new_tokens=ROWS, **kwargs)
    ended = bool((rows[-1] == 1025).all())
    body = rows[1:-1] if ended else rows[1:]
    return np.clip(undelay(body), 0, 1023), audio


# -- codec --------------------------------------------------------------------------------------
@pytest.mark.parametrize("seconds", [1.0, 1.5, 2.02])  # both acoustic padding cases
def test_reference_codes_equal_transformers_codec(v2, seconds):

    audio = ref.reference_audio(seconds, seed=int(seconds * 10))
    with torch.no_grad():
        theirs = v2["codec"].encode(torch.from_numpy(audio)[None, None]).audio_codes[0].T
    mine = v2["engine"].voice(audio)["codes"]
    assert mine.shape == tuple(theirs.shape) and (mine == theirs.numpy()).all()


def test_codec_windows_batch_exactly_and_decode_as_transformers(v2):

    codec = v2["engine"].model.vocoder
    rng = np.random.default_rng(0)
    windows = [rng.integers(0, 1024, (n, 8)) for n in (24, 24, 24, 10)]
    batched = codec.vocode_windows(windows, [{}] * 4)
    alone = [codec.vocode(w) for w in windows]
    assert all(np.array_equal(a, b) for a, b in zip(batched, alone, strict=True))
    with torch.no_grad():
        theirs = v2["codec"].decode(torch.from_numpy(windows[0]).T[None]).audio_values[0, 0]
    assert np.abs(alone[0] - theirs.numpy()).max() <= 1e-5 * np.abs(alone[0]).max()


# -- v2 -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("clone", [False, True], ids=["default", "clone"])
def test_v2_rows_and_audio_equal_transformers(v2, sampled, clone):
    voice = ref.reference_audio(1.3, seed=3) if clone else None
    kwargs = {"do_sample": sampled, "seed": 11}
    if clone:
        kwargs.update(reference=voice, reference_text=REFERENCE_TEXT)
    theirs, audio = _v2_reference(v2, TEXT, **kwargs)
    options = {"reference_text": REFERENCE_TEXT} if clone else {}
    engine = v2["engine"]
    mine = _frames(
        engine, TEXT, seed=11, voice=voice, temperature=1.0 if sampled else 0.0, **options
    )
    assert len(theirs) > 0 and np.array_equal(mine, theirs)
    spoken = engine.synthesize(
        TEXT,
        voice=voice,
        seed=11,
        temperature=1.0 if sampled else 0.0,
        max_new_tokens=ROWS,
        **options,
    ).samples.reshape(-1)
    assert spoken.shape == audio.shape
    assert np.abs(spoken - audio).max() <= 1e-5 * np.abs(audio).max()


def test_v2_runs_end_by_the_end_rule_and_by_the_row_limit(v2):
    theirs, _ = _v2_reference(v2, TEXT, do_sample=True, seed=2)
    mine = _frames(v2["engine"], TEXT, seed=2, temperature=1.0)
    assert np.array_equal(mine, theirs) and len(mine) < ROWS - 9  # ended before the limit
    short = _frames(v2["engine"], TEXT, seed=2, temperature=1.0, max_new_tokens=12)
    assert np.array_equal(short, theirs[: 12 - 8])  # 12 rows: the begin row + 11 = 4 frames


def test_v2_resampling_can_be_turned_off(v2):
    theirs, _ = _v2_reference(v2, TEXT, ras=False)
    mine = _frames(v2["engine"], TEXT, temperature=0.0, ras_window=0)
    assert np.array_equal(mine, theirs)


def test_v2_several_chunks_seed_plus_index(v2):
    engine = v2["engine"]
    chunks = engine.model.text.chunks(TWO_SENTENCES, {"max_chunk_tokens": 12})
    assert len(chunks) == 2
    result = engine.synthesize(
        TWO_SENTENCES, seed=5, temperature=1.0, max_new_tokens=ROWS, max_chunk_tokens=12
    ).samples.reshape(-1)
    pieces = [
        _v2_reference(v2, chunk, do_sample=True, seed=5 + i)[1] for i, chunk in enumerate(chunks)
    ]
    pause = len(result) - sum(len(p) for p in pieces)
    assert 0 < pause <= 24000  # the pause between the chunks
    head = result[: len(pieces[0])]
    assert np.abs(head - pieces[0]).max() <= 1e-5 * np.abs(pieces[0]).max()
    tail = result[-len(pieces[1]) :]
    assert np.abs(tail - pieces[1]).max() <= 1e-5 * np.abs(pieces[1]).max()


def test_v2_batched_rows_equal_solo_runs(v2):
    engine = v2["engine"]
    seeds = [21, 22, 23, 24]
    solo = {seed: _frames(engine, TEXT, seed=seed, temperature=1.0) for seed in seeds}
    together: dict[int, np.ndarray] = {}

    def run(seed):
        together[seed] = _frames(engine, TEXT, seed=seed, temperature=1.0)

    threads = [threading.Thread(target=run, args=(seed,)) for seed in seeds]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert set(together) == set(seeds)
    assert all(np.array_equal(together[s], solo[s]) for s in seeds)


def test_streamed_audio_against_one_decode(v2):
    """Windows (SGLang-Omni's defaults) against one decode of all frames: exact length, and
    the seams' difference bounded (the codec is non-causal: 8 frames of left context and 4
    held back are not the whole context; measured and documented in docs/MODELS.md)."""
    engine = v2["engine"]
    options = {"seed": 4, "temperature": 1.0, "max_new_tokens": 200, "ras_window": 0}
    whole = engine.synthesize(TEXT, **options).samples.reshape(-1)
    # SGLang-Omni's overlap and hold-back; a shorter stride than its 68 frames, so a short
    # run has several seams.
    windows = {"first_chunk_frames": 8, "stride_frames": 8}
    streamed = np.concatenate(list(engine.stream(TEXT, **windows, **options)))
    assert streamed.shape == whole.shape and len(whole) > 20 * 960
    error = np.abs(streamed - whole).max() / np.abs(whole).max()
    print(f"streamed vs one decode: max |diff| / peak {error:.3g}")
    assert error < 0.2
    wide = np.concatenate(
        list(
            engine.stream(
                TEXT,
                first_chunk_frames=14,
                stride_frames=16,
                overlap_frames=16,
                holdback_frames=12,
                **options,
            )
        )
    )
    assert np.abs(wide - whole).max() / np.abs(whole).max() < 1e-4  # enough context: equal


def test_bad_input_is_one_clear_error(v2):
    engine = v2["engine"]
    with pytest.raises(InputError, match="control token"):
        engine.synthesize("say <|eot_id|> now")
    with pytest.raises(InputError, match="ras_window"):
        engine.synthesize(TEXT, ras_window=-1)
    with pytest.raises(Exception, match="at least"):
        engine.voice(ref.reference_audio(0.5))


# -- v3 -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "sampling",
    [{"temperature": 0.0}, {"temperature": 1.0}, {"temperature": 0.8, "top_k": 30, "top_p": 0.8}],
    ids=["greedy", "sampled", "top-k-p"],
)
@pytest.mark.parametrize("clone", [False, True], ids=["default", "clone"])
def test_v3_rows_and_audio_equal_sglang_loop(v3, sampling, clone):
    voice = ref.reference_audio(1.6, seed=7) if clone else None
    extra = {"reference": voice, "reference_text": REFERENCE_TEXT} if clone else {}
    _, theirs, audio = v3["reference"].generate(
        TEXT, seed=9, max_new_tokens=ROWS, **sampling, **extra
    )
    options = {"reference_text": REFERENCE_TEXT} if clone else {}
    engine = v3["engine"]
    assert np.array_equal(_frames(engine, TEXT, seed=9, voice=voice, **sampling, **options), theirs)
    spoken = engine.synthesize(
        TEXT, voice=voice, seed=9, max_new_tokens=ROWS, **sampling, **options
    ).samples.reshape(-1)
    assert spoken.shape == audio.shape
    assert np.abs(spoken - audio).max() <= 1e-5 * np.abs(audio).max()


def test_v3_bf16_rotary_tables_matter(v3):
    """The export rounds the rotary tables through bf16 as the published runtime does: the
    float32 tables would give other hidden states (and the paraphrase would not agree)."""
    import numpy as onp

    from export.backbones.qwen3 import Qwen3Config, RopeTables, rotary_tables

    config = Qwen3Config.from_dict(ref.V3_TEXT_CONFIG)
    rounded, _ = rotary_tables(config, RopeTables("bfloat16", "nearest"), 64)
    plain, _ = rotary_tables(config, RopeTables(), 64)
    assert onp.abs(rounded.numpy() - plain.numpy()).max() > 1e-4


# -- the CLI and the server ---------------------------------------------------------------------
def test_cli_synth_writes_the_api_audio(v2, tmp_path):
    model = v2["root"] / "model"
    out = tmp_path / "out.wav"
    command = [sys.executable, "-m", "onnx_tts.cli", "synth", TEXT, "--model", str(model)]
    command += ["-o", str(out), "--seed", "3", "--temperature", "1.0", "--max-new-tokens", "40"]
    command += ["--cache-dir", str(tmp_path / "cache"), "--threads", "1"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    written, rate = soundfile.read(out, dtype="float32")
    expected = v2["engine"].synthesize(TEXT, seed=3, temperature=1.0, max_new_tokens=40).samples
    assert rate == 24000 and written.shape == expected.reshape(-1).shape
    assert np.abs(written - expected.reshape(-1)).max() <= 2 / 32768  # 16-bit WAV


def test_cli_export_refuses_a_directory_that_is_not_higgs(tmp_path):
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "config.json").write_text('{"model_type": "llama"}')
    command = [sys.executable, "-m", "onnx_tts.cli", "export", "higgs"]
    result = subprocess.run(
        [*command, str(tmp_path / "checkpoint"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2 and "error" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()


def test_server_speaks_the_api_audio(v3, tmp_path):
    import httpx
    import openai

    from benchmarks.live_server import LiveServer

    model = v3["root"] / "model"
    expected = v3["engine"].synthesize(TEXT, seed=1, max_new_tokens=40).samples.reshape(-1)
    live = LiveServer(tmp_path, "--model", str(model), "--threads", "1")
    try:
        client = openai.OpenAI(base_url=live.url + "/v1", api_key="none")
        wav = client.audio.speech.create(
            model="onnx-tts",
            voice="default",
            input=TEXT,
            response_format="wav",
            extra_body={"seed": 1, "max_new_tokens": 40},
        )
        bad = httpx.post(
            live.url + "/v1/audio/speech",
            json={"input": TEXT, "voice": "default", "ras_window": -3},
            timeout=120,
        )
    finally:
        live.stop()
    samples, rate = soundfile.read(io.BytesIO(wav.content), dtype="float32")
    # Streamed in windows (a listener's growing windows): the one-shot audio up to the seams.
    assert rate == 24000 and samples.shape == expected.shape
    assert np.abs(samples - expected).max() <= 0.2 * np.abs(expected).max() + 2 / 32768
    assert np.corrcoef(samples, expected)[0, 1] > 0.99
    assert 400 <= bad.status_code < 500 and "ras_window" in bad.text


def test_convert_inplace_and_quantize_the_exported_model(v3, tmp_path):
    """The offline tools on an exported directory: in-place KV gives the float rows; int8
    weights (the backbone's and head's weights in data files of their own) load and speak."""
    source = v3["root"] / "model"
    tools = [sys.executable, "-m", "onnx_tts.cli"]
    for command in (
        [*tools, "convert", "--inplace-kv", str(source), str(tmp_path / "inplace")],
        [*tools, "quantize", str(tmp_path / "inplace"), str(tmp_path / "int8")],
    ):
        result = subprocess.run(command, capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, result.stderr
    float_frames = _frames(v3["engine"], TEXT, temperature=0.0)
    with onnx_tts.load(tmp_path / "inplace", cache_dir=tmp_path / "cache") as inplace:
        assert inplace.model.kv_mode == "inplace"
        assert np.array_equal(_frames(inplace, TEXT, temperature=0.0), float_frames)
    with onnx_tts.load(tmp_path / "int8", cache_dir=tmp_path / "cache") as int8:
        frames = _frames(int8, TEXT, temperature=0.0)
        assert len(frames) > 0 and frames.max() < 1024

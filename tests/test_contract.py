"""The user-facing contract, as properties over arguments (hypothesis).

CLI: `python -m onnx_tts.cli synth ...` either exits 0 having written a finite file in
[-1, 1], or exits 2 with ONE line on stderr and no output file. Never a traceback, never a
partial file. API: `Engine.synthesize(...)` returns finite samples in [-1, 1] or raises an
OnnxTTSError; nothing else escapes.

Few examples (each CLI example is a subprocess that loads a model) and no shrinking phase,
so a failure costs one run; the failing argv is in the assertion message.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

import onnx_tts
from onnx_tts.bundle import VOICE_MODEL_DIR
from onnx_tts.errors import OnnxTTSError, OnnxTTSWarning
from tests.conftest import codec_lm_dir

REPO = Path(__file__).resolve().parents[1]
CLI_SETTINGS = settings(
    max_examples=25,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
API_SETTINGS = settings(
    max_examples=60,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow],
)

TEXTS = st.one_of(
    st.sampled_from(
        [
            "Hello there.",
            "1st 2nd 3rd, items 2,3 at 10:30 for $5.99.",
            "3.14e10 and 1.2.3.4.",
            "你好 world",
            "你好",
            "",
            "   ",
            "!!!",
            "a" * 300,
            "Ünïcödé café – “quotes”…",
            "\udcff invalid",
        ]
    ),
    # NUL cannot be passed in argv at all (the OS refuses it before onnx-tts runs).
    st.text(
        alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=30
    ),
)
ODD_NUMBERS = st.sampled_from(
    ["0", "-1", "1.5", "nan", "inf", "-inf", "1e309", "abc", "", "9223372036854775807", "2"]
)
INTS = st.one_of(st.integers(-5, 2**63 + 5).map(str), ODD_NUMBERS)
FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32).map(repr), ODD_NUMBERS)
OPTIONS = {
    "--seed": INTS,
    "--temperature": FLOATS,
    "--top-k": INTS,
    "--top-p": FLOATS,
    "--repetition-penalty": FLOATS,
    "--first-chunk-frames": INTS,
    "--stride-frames": INTS,
    "--overlap-frames": INTS,
    "--holdback-frames": INTS,
    "--crossfade-samples": INTS,
    "--threads": st.sampled_from(["0", "1", "2", "-1", "x"]),  # no runaway sizes here
    "--kv": st.sampled_from(["copy", "chain", "inplace", "bogus"]),
    "--language": st.sampled_from(["en", "fr", "xx"]),
    "--max-new-tokens": INTS,
    "--precision": st.sampled_from(["fp32", "fp16", "q99"]),
    "--exaggeration": FLOATS,
}


@st.composite
def cli_arguments(draw: st.DrawFn) -> list[str]:
    argv = ["synth", draw(TEXTS)]
    model = draw(st.sampled_from([None, codec_lm_dir()]))
    if model is not None:
        argv += ["--model", str(model)]
    for name in draw(st.lists(st.sampled_from(sorted(OPTIONS)), max_size=4, unique=True)):
        argv += [name, draw(OPTIONS[name])]
    if draw(st.booleans()):
        argv.append("--stream")
    return argv


def run_cli(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "onnx_tts.cli", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        timeout=300,
    )


def assert_finite_audio_file(path: Path, context: str) -> None:
    assert path.is_file(), f"exit 0 but no file: {context}"
    data, _ = soundfile.read(str(path), dtype="float32")
    assert data.size > 0, f"empty audio: {context}"
    assert np.isfinite(data).all() and np.abs(data).max() <= 1.0, context


def test_cli_exits_0_with_finite_audio_or_2_with_one_line(tmp_path_factory) -> None:
    @CLI_SETTINGS
    @example(argv=["synth", "你好", "--stream"])  # once gave a warning line before the error
    @given(argv=cli_arguments())
    def check(argv: list[str]) -> None:
        work = tmp_path_factory.mktemp("contract")
        out = work / "out.wav"
        full = [*argv, "-o", str(out), "--cache-dir", str(work / "cache")]
        proc = run_cli(full, work)
        stderr = proc.stderr.decode("utf-8", "replace")
        context = f"argv={full!r} exit={proc.returncode} stderr={stderr[-2000:]!r}"
        if proc.returncode == 0:
            assert_finite_audio_file(out, context)
        else:
            assert proc.returncode == 2, context
            assert len(stderr.strip().splitlines()) == 1, context
            assert "Traceback" not in stderr, context
            assert not out.exists(), context
        leftovers = [p.name for p in work.iterdir() if p.name.endswith(".part")]
        assert leftovers == [], context

    check()


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, onnx_tts.Engine]]:
    made = {
        "voice": onnx_tts.load(VOICE_MODEL_DIR, cache_dir=None),
        "codec-lm": onnx_tts.load(codec_lm_dir(), kv="inplace", cache_dir=None),
    }
    yield made
    for engine in made.values():
        engine.close()


ANY_VALUE = st.one_of(
    st.none(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["7", "hot", "", [1, 2], {}, b"x", True]),
)
API_KEYWORDS = ("seed", "temperature", "top_k", "top_p", "repetition_penalty", "speed")


@st.composite
def api_calls(draw: st.DrawFn) -> tuple[str, object, dict[str, object]]:
    model = draw(st.sampled_from(["voice", "codec-lm"]))
    text = draw(st.one_of(TEXTS, st.sampled_from([None, 123, b"bytes ok", b"\xff\xfe"])))
    names = draw(st.lists(st.sampled_from(API_KEYWORDS), max_size=3, unique=True))
    keywords = {name: draw(ANY_VALUE) for name in names}
    if draw(st.booleans()):
        keywords["voice"] = draw(
            st.sampled_from(
                [
                    123,
                    [0.1, 0.2],
                    {},
                    "/nonexistent/voice.wav",
                    np.zeros(10, np.float32),
                    np.full(16000, np.nan, np.float32),
                    {"speaker_embedding": np.full(8, np.nan, np.float32)},
                ]
            )
        )
    return model, text, keywords


@API_SETTINGS
@given(call=api_calls())
def test_api_returns_finite_audio_or_raises_onnx_tts_error(engines, call) -> None:
    model, text, keywords = call
    context = f"model={model} text={text!r} keywords={keywords!r}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OnnxTTSWarning)
        try:
            audio = engines[model].synthesize(text, **keywords)
        except OnnxTTSError:
            return
        except Exception as error:  # the contract: nothing else escapes
            pytest.fail(f"{type(error).__name__}: {error} ({context})")
    samples = audio.samples
    assert samples.size and np.isfinite(samples).all(), context
    assert float(np.abs(samples).max()) <= 1.0 + 1e-6, context
    assert math.isclose(audio.duration, samples.size / audio.sample_rate)

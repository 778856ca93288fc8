"""Issue 43, paths a run starts from: a model file that is a link to itself (MOSS-TTS-Nano's
`tokenizer.model`, a bundle's graph) ended `synth` in `RuntimeError: Symlink loop`; a run
started in a working directory that was deleted crashed resolving a relative path; and
`load(cache_dir="none")` made a directory named `none`. Each is now one line and exit 2, or
does what the flags do."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import onnx_tts
from onnx_tts.bundle import DEFAULT_MODEL_DIR
from tests.conftest import codec_lm_dir
from tests.waiting import WAIT_BOUND_SECONDS


def cli(*args: str, cwd: Path | None = None) -> tuple[int, list[str]]:
    done = subprocess.run(
        [sys.executable, "-m", "onnx_tts.cli", *args],
        capture_output=True,
        text=True,
        timeout=WAIT_BOUND_SECONDS,
        cwd=cwd,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, [line for line in done.stderr.splitlines() if line.strip()]


def test_a_tokenizer_that_is_a_link_to_itself_is_one_line(moss_official, tmp_path) -> None:
    model = tmp_path / "moss"
    shutil.copytree(moss_official, model)
    tokenizer = model / "MOSS-TTS-Nano-100M-ONNX" / "tokenizer.model"
    tokenizer.unlink()
    tokenizer.symlink_to(tokenizer.name)
    code, lines = cli("synth", "Hello.", "-o", str(tmp_path / "out.wav"), "--model", str(model))
    assert code == 2 and len(lines) == 1 and "tokenizer.model" in lines[0], lines
    assert not (tmp_path / "out.wav").exists()


def test_a_bundle_graph_that_is_a_link_to_itself_is_one_line(tmp_path) -> None:
    model = tmp_path / "voice"
    shutil.copytree(DEFAULT_MODEL_DIR, model)
    (model / "vocoder.onnx").unlink()
    (model / "vocoder.onnx").symlink_to("vocoder.onnx")
    code, lines = cli("synth", "Hello.", "-o", str(tmp_path / "out.wav"), "--model", str(model))
    assert code == 2 and len(lines) == 1 and "vocoder.onnx" in lines[0], lines


@pytest.fixture
def deleted_directory(tmp_path: Path) -> Path:
    gone = tmp_path / "gone"
    gone.mkdir()
    return gone


def _in_deleted(directory: Path, *args: str) -> tuple[int, list[str]]:
    """`onnx-tts ARGS` started in `directory`, which is removed before it runs."""
    script = (
        f"import os, sys; os.chdir({str(directory)!r}); os.rmdir({str(directory)!r}); "
        "sys.argv = ['onnx-tts', *sys.argv[1:]]; from onnx_tts.cli import main; "
        "sys.exit(main())"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=WAIT_BOUND_SECONDS,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, [line for line in done.stderr.splitlines() if line.strip()]


def test_a_run_started_in_a_deleted_directory(deleted_directory, tmp_path) -> None:
    out = tmp_path / "hello.wav"
    code, lines = _in_deleted(deleted_directory, "synth", "Hello.", "-o", str(out), "-q")
    assert code == 0 and out.stat().st_size > 1000, lines
    deleted_directory.mkdir()
    code, lines = _in_deleted(deleted_directory, "synth", "Hello.", "-o", "relative.wav")
    assert code == 2 and len(lines) == 1 and "relative.wav" in lines[0], lines
    for tool in (["quantize", str(codec_lm_dir()), "relative-out"],
                 ["convert", "--inplace-kv", str(codec_lm_dir()), "relative-out"]):  # fmt: skip
        deleted_directory.mkdir()
        code, lines = _in_deleted(deleted_directory, *tool)
        assert code == 2 and len(lines) == 1 and "relative-out" in lines[0], lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hello.wav"]


def test_load_cache_dir_none_is_no_directory(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with onnx_tts.load(cache_dir="none", result_cache_dir="None") as engine:
        assert engine.synthesize("Hello.", seed=1).samples.size > 1000
    assert list(tmp_path.iterdir()) == []

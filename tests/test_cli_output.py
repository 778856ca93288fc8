"""The CLI's output side: every file format by extension or --format, atomic writes, stdout,
the progress bar, --version, `python -m onnx_tts`, and the generated shell completion."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile

import onnx_tts
from onnx_tts import audio as audio_io
from onnx_tts.audio import (
    FORMAT_EXTENSIONS,
    OUTPUT_FORMATS,
    encode_audio,
    encoded_rate,
    output_format,
    save_audio,
)
from onnx_tts.cli import build_parser, main
from onnx_tts.completion import bash_script
from onnx_tts.errors import NonFiniteAudioError, OutputError
from onnx_tts.synth_cli import _Progress

RATE = 16000  # the default voice's rate: mp3, opus and aac take it as is
TONE_HZ = 440.0


def _tone(seconds: float = 1.0, rate: int = RATE) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.4 * np.sin(2 * np.pi * TONE_HZ * t)).astype(np.float32)


def _decode(path: Path) -> tuple[np.ndarray, int, str]:
    """(samples, rate, codec) read back by libsndfile, or by ffmpeg (PyAV) for AAC."""
    try:
        info = soundfile.info(str(path))
        samples, rate = soundfile.read(str(path), dtype="float32")
        return samples, rate, info.subtype
    except soundfile.LibsndfileError:
        with av.open(str(path)) as container:
            stream = container.streams.audio[0]
            frames = [f.to_ndarray().reshape(-1) for f in container.decode(stream)]
            return np.concatenate(frames), stream.rate, stream.codec_context.name


def _peak_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.argmax(spectrum) * rate / len(samples))


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize(
    ("extension", "codec", "rate"),
    [
        (".wav", "PCM_16", RATE),
        (".flac", "PCM_16", RATE),
        (".mp3", "MPEG_LAYER_III", RATE),
        (".ogg", "VORBIS", RATE),
        (".opus", "OPUS", RATE),
        (".aac", "aac", RATE),
    ],
)
def test_each_extension_writes_its_format(
    tmp_path: Path, extension: str, codec: str, rate: int
) -> None:
    tone = _tone()
    path = save_audio(tmp_path / f"tone{extension}", tone, RATE)
    samples, got_rate, got_codec = _decode(path)
    assert (got_codec, got_rate) == (codec, rate)
    # Lossy codecs pad (encoder delay, last frame) but keep the length within 0.1 s.
    assert abs(len(samples) / got_rate - 1.0) < 0.1
    assert abs(_peak_hz(samples, got_rate) - TONE_HZ) < 5
    if codec == "PCM_16":
        np.testing.assert_allclose(samples, tone, atol=1 / 32767)
    assert _leftovers(tmp_path) == []


def test_every_output_format_has_an_extension_and_a_rate() -> None:
    assert set(FORMAT_EXTENSIONS.values()) == set(OUTPUT_FORMATS)
    assert encoded_rate("opus", 16000) == 16000  # a rate Opus takes as it is
    assert encoded_rate("opus", 22050) == 24000
    assert encoded_rate("mp3", 16000) == 16000
    assert encoded_rate("mp3", 17000) == 22050  # the nearest rate above
    assert encoded_rate("wav", 17000) == 17000
    assert output_format("x.MP3") == "mp3"
    assert output_format("x.wav", "opus") == "opus"
    with pytest.raises(OutputError, match=r"unknown extension \.xyz"):
        output_format("x.xyz")
    with pytest.raises(OutputError, match="unknown audio format 'au'"):
        output_format("x.wav", "au")


def test_forced_format_wins_over_the_extension(tmp_path: Path) -> None:
    path = save_audio(tmp_path / "speech.bin", _tone(), RATE, "opus")
    info = soundfile.info(str(path))
    assert (info.format, info.subtype, info.samplerate) == ("OGG", "OPUS", RATE)


def test_failures_leave_no_file_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = _tone()
    bad[100] = np.nan
    for extension in (".mp3", ".opus", ".aac", ".flac"):
        with pytest.raises(NonFiniteAudioError):
            save_audio(tmp_path / f"nan{extension}", bad, RATE)
    existing = save_audio(tmp_path / "kept.ogg", _tone(0.5), RATE)
    before = existing.read_bytes()

    def broken_write(*_args: object, **_kwargs: object) -> None:
        raise soundfile.LibsndfileError(1, "encoder exploded")

    monkeypatch.setattr(audio_io.soundfile, "write", broken_write)
    with pytest.raises(OutputError, match=r"cannot encode .*kept\.ogg as ogg"):
        save_audio(existing, _tone(), RATE)
    assert existing.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.ogg"]


def test_aac_without_pyav_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "av", None)  # `import av` raises ImportError
    with pytest.raises(OutputError, match=r"onnx-tts\[aac\]"):
        encode_audio(_tone(), RATE, "aac")
    out = tmp_path / "x.aac"
    code = main(["synth", "Hi.", "-o", str(out), "--cache-dir", "none"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "pip install 'onnx-tts[aac]'" in err[0]
    assert not out.exists()


def _synth(tmp_path: Path, *args: str, text: str = "Hello there.") -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "onnx_tts", "synth", text, "--seed", "1"]
    return subprocess.run(
        [*command, "--cache-dir", "none", *args], capture_output=True, cwd=tmp_path
    )


def test_cli_writes_mp3_and_opus_files_and_says_what_it_wrote(tmp_path: Path) -> None:
    reference = _synth(tmp_path, "-o", "ref.wav")
    assert reference.returncode == 0, reference.stderr
    wav, rate = soundfile.read(str(tmp_path / "ref.wav"), dtype="float32")
    for name, codec, expected_rate in (
        ("a.mp3", "MPEG_LAYER_III", rate),
        ("b.opus", "OPUS", rate),
    ):
        result = _synth(tmp_path, "-o", name)
        assert result.returncode == 0, result.stderr
        assert f"at {expected_rate} Hz" in result.stderr.decode()
        info = soundfile.info(str(tmp_path / name))
        assert (info.subtype, info.samplerate) == (codec, expected_rate)
        assert abs(info.duration - len(wav) / rate) < 0.1
    forced = _synth(tmp_path, "-o", "speech.audio", "--format", "flac", "-q")
    assert forced.returncode == 0 and forced.stderr == b""  # --quiet: no summary line
    flac, _ = soundfile.read(str(tmp_path / "speech.audio"), dtype="float32")
    np.testing.assert_array_equal(flac, wav)  # same seed, lossless: the same samples


def test_cli_stdout_formats(tmp_path: Path) -> None:
    whole = _synth(tmp_path, "-o", "-", "--format", "mp3")
    assert whole.returncode == 0, whole.stderr
    assert soundfile.info(io.BytesIO(whole.stdout)).subtype == "MPEG_LAYER_III"
    streamed = _synth(tmp_path, "-o", "-", "--format", "wav", "--stream")
    assert streamed.returncode == 0, streamed.stderr
    samples, _ = soundfile.read(io.BytesIO(streamed.stdout), dtype="int16")
    raw = _synth(tmp_path, "-o", "-", "--stream")
    np.testing.assert_array_equal(np.frombuffer(raw.stdout, "<i2"), samples)
    refused = _synth(tmp_path, "-o", "-", "--format", "mp3", "--stream")
    assert refused.returncode == 2 and refused.stdout == b""
    assert b"drop --stream" in refused.stderr and b"Traceback" not in refused.stderr
    pcm_to_file = _synth(tmp_path, "-o", "x.wav", "--format", "pcm")
    assert pcm_to_file.returncode == 2 and b"stdout only" in pcm_to_file.stderr
    assert not (tmp_path / "x.wav").exists()


class _Terminal(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize(
    ("tty", "enabled", "total", "shown"),
    [
        (True, True, 5, True),
        (False, True, 5, False),
        (True, False, 5, False),
        (True, True, 1, False),
    ],
)
def test_progress_bar_only_on_a_terminal_and_not_quiet(
    monkeypatch: pytest.MonkeyPatch, tty: bool, enabled: bool, total: int, shown: bool
) -> None:
    terminal = _Terminal(tty)
    monkeypatch.setattr(sys, "stderr", terminal)
    progress = _Progress(enabled=enabled)
    for done in range(1, total + 1):
        progress(done, total)
    assert ("sentence" in terminal.getvalue()) == shown


def test_version_and_python_dash_m(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"onnx-tts {onnx_tts.__version__} (onnxruntime ")
    result = subprocess.run(
        [sys.executable, "-m", "onnx_tts", "--version"], capture_output=True, text=True
    )
    assert result.returncode == 0 and result.stdout.strip() == line
    bad = subprocess.run([sys.executable, "-m", "onnx_tts", "nonsense"], capture_output=True)
    assert bad.returncode == 2 and b"invalid choice" in bad.stderr


def _complete(script: str, *words: str) -> list[str]:
    """Run the completion function in a real bash as it runs on TAB: COMP_WORDS = `words`,
    the cursor on the last one."""
    quoted = " ".join(f"'{word}'" for word in words)
    program = (
        f"{script}\nCOMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}\n"
        '_onnx_tts; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    result = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True)
    return result.stdout.split()


def test_bash_completion_offers_commands_flags_and_choices(tmp_path: Path) -> None:
    script = bash_script(build_parser())
    assert _complete(script, "onnx-tts", "sy") == ["synth"]
    assert "completion" in _complete(script, "onnx-tts", "")
    assert _complete(script, "onnx-tts", "--ver") == ["--version"]
    assert _complete(script, "onnx-tts", "synth", "--for") == ["--format"]
    assert _complete(script, "onnx-tts", "synth", "--format", "o") == ["ogg", "opus"]
    assert _complete(script, "onnx-tts", "synth", "--seed", "") == []  # a number: no files
    assert _complete(script, "onnx-tts", "bench", "k") == ["kv"]
    assert _complete(script, "onnx-tts", "serve", "--log-level", "w") == ["warning"]
    # Family flags come from the registry: a flag added there is completed too.
    assert "--exaggeration" in _complete(script, "onnx-tts", "synth", "--")
    # After the positional choice (and a flag's value), words complete as file names.
    (tmp_path / "voice.wav").touch()
    assert _complete(script, "onnx-tts", "synth", "--voice", f"{tmp_path}/vo") == [
        f"{tmp_path}/voice.wav"
    ]
    assert _complete(script, "onnx-tts", "cache", "--tier", "result", "st") == ["stats"]


def test_completion_command_prints_both_scripts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "bash"]) == 0
    bash = capsys.readouterr().out
    assert bash.rstrip().endswith("complete -o filenames -F _onnx_tts onnx-tts")
    subprocess.run(["bash", "-n"], input=bash, text=True, check=True)  # parses
    assert main(["completion", "zsh"]) == 0
    zsh = capsys.readouterr().out
    assert "bashcompinit" in zsh and bash in zsh


def test_cli_output_onto_a_link_and_onto_a_read_only_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "real.wav"
    target.write_bytes(b"old")
    link = tmp_path / "link.wav"
    link.symlink_to(target)
    assert main(["synth", "Hi.", "-o", str(link), "--cache-dir", "none", "-q"]) == 0
    assert link.is_symlink() and soundfile.info(str(target)).duration > 0.2
    locked = tmp_path / "locked.wav"
    locked.write_bytes(b"keep me")
    locked.chmod(0o444)
    capsys.readouterr()
    for extra in ([], ["--stream"]):
        code = main(["synth", "Hi.", "-o", str(locked), "--cache-dir", "none", *extra])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and "read-only" in err[0], err
    assert locked.read_bytes() == b"keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.wav", "locked.wav", "real.wav"]


def _closed(*fds: int):
    def close() -> None:
        for fd in fds:
            os.close(fd)

    return close


@pytest.mark.parametrize(
    ("argv", "closed", "message"),
    [
        (["Hello.", "-o", "-", "--stream"], 1, "stdout is closed"),
        (["Hello.", "-o", "-", "--format", "wav"], 1, "stdout is closed"),
        (["Hello.", "-o", "-", "--stream", "--format", "wav"], 1, "stdout is closed"),
        (["-", "-o", "{out}"], 0, "stdin is closed"),
        (["-", "-o", "-", "--stream"], 0, "stdin is closed"),
    ],
    ids=["stream-pcm", "whole-wav", "stream-wav", "stdin-to-file", "stdin-to-stdout"],
)
def test_closed_standard_streams_are_one_line_and_exit_2(
    tmp_path: Path, argv: list[str], closed: int, message: str
) -> None:
    """`>&-` and `<&-`: the first write to stdout (or read of stdin) was a traceback; the
    descriptor of a closed stdout could also be reused by the next file opened."""
    argv = [arg.replace("{out}", str(tmp_path / "out.wav")) for arg in argv]
    done = subprocess.run(
        [sys.executable, "-m", "onnx_tts.cli", "synth", *argv],
        stdin=subprocess.DEVNULL if closed != 0 else None,
        stdout=subprocess.DEVNULL if closed != 1 else None,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        timeout=300,
        preexec_fn=_closed(closed),
    )
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith("onnx-tts: error: ") and message in line
    assert list(tmp_path.iterdir()) == []  # nothing written anywhere

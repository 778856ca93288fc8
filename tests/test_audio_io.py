"""Audio I/O: one 16-bit conversion for every writer, atomic writes with sane permissions,
streamed WAVs that never leave partial files, and reference decoding that refuses bad files."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import numpy as np
import pytest
import soundfile

from onnx_tts import audio as audio_io
from onnx_tts.audio import (
    ProgressiveWavWriter,
    RawPcmWriter,
    load_audio,
    pcm16,
    save_audio,
    to_pcm16,
)
from onnx_tts.errors import (
    AudioError,
    InputError,
    NonFiniteAudioError,
    OutputClosedError,
    OutputError,
    ReferenceTrimmedWarning,
)
from tests.conftest import speechlike

RATE = 24000


def _samples(n: int = 24000, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = rng.uniform(-1.2, 1.2, n).astype(np.float32)
    # Values exactly half an LSB apart, where two roundings disagree.
    values[:8] = np.array([0.5, -0.5, 1.5, 2.5, -1.5, 3.5, 0.49, 0.51], np.float32) / 32767
    return values


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".part"))


def test_pcm16_clips_scales_and_rounds_half_to_even() -> None:
    # 0.5 * 32767 = 16383.5 exactly: half to even gives 16384 (away from zero would too, but
    # 0.25 * 32767 = 8191.75 and 2**-16 * 32767 = 0.49998... pin the rest of the rule).
    values = np.array([0.0, 1.0, -1.0, 2.0, -3.0, 0.5, -0.5, 0.25, 2.0**-16], np.float32)
    out = pcm16(values)
    assert out.dtype == np.dtype("<i2")
    assert out.tolist() == [0, 32767, -32767, 32767, -32767, 16384, -16384, 8192, 0]


def test_every_writer_gives_the_same_samples(tmp_path: Path) -> None:
    samples = _samples()
    expected = pcm16(samples)
    whole = save_audio(tmp_path / "whole.wav", samples, RATE)
    with ProgressiveWavWriter(tmp_path / "streamed.wav", RATE) as writer:
        for start in range(0, len(samples), 1000):
            writer.write(samples[start : start + 1000])
    raw_path = tmp_path / "raw.pcm"
    with raw_path.open("wb") as handle:
        RawPcmWriter(handle).write(samples)
    for path in (whole, tmp_path / "streamed.wav"):
        data, rate = soundfile.read(str(path), dtype="int16")
        assert rate == RATE
        np.testing.assert_array_equal(data, expected)
    np.testing.assert_array_equal(np.frombuffer(raw_path.read_bytes(), "<i2"), expected)
    flac = save_audio(tmp_path / "whole.flac", samples, RATE)
    np.testing.assert_array_equal(soundfile.read(str(flac), dtype="int16")[0], expected)
    assert to_pcm16(samples) == expected.tobytes()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_audio_is_never_written(tmp_path: Path, bad: float) -> None:
    samples = _samples(1000)
    samples[500] = bad
    target = tmp_path / "x.wav"
    with pytest.raises(NonFiniteAudioError, match="NaN or infinite"):
        save_audio(target, samples, RATE)
    assert not target.exists() and _leftovers(tmp_path) == []
    with pytest.raises(NonFiniteAudioError), ProgressiveWavWriter(target, RATE) as writer:
        writer.write(samples[:400])
        writer.write(samples)
    assert not target.exists() and _leftovers(tmp_path) == []
    with pytest.raises(NonFiniteAudioError):
        to_pcm16(samples)
    assert issubclass(NonFiniteAudioError, InputError) and issubclass(
        NonFiniteAudioError, AudioError
    )


def test_new_files_follow_the_umask_and_existing_files_keep_their_mode(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        fresh = save_audio(tmp_path / "fresh.wav", _samples(100), RATE)
        assert stat.S_IMODE(fresh.stat().st_mode) == 0o644
        with ProgressiveWavWriter(tmp_path / "streamed.wav", RATE) as writer:
            writer.write(_samples(100))
        assert stat.S_IMODE((tmp_path / "streamed.wav").stat().st_mode) == 0o644
        os.umask(0o077)
        assert stat.S_IMODE(save_audio(tmp_path / "p.wav", _samples(10), RATE).stat().st_mode) == (
            0o600
        )
        existing = tmp_path / "existing.wav"
        existing.write_bytes(b"old")
        existing.chmod(0o664)
        save_audio(existing, _samples(100), RATE)
        assert stat.S_IMODE(existing.stat().st_mode) == 0o664
        with ProgressiveWavWriter(existing, RATE) as writer:
            writer.write(_samples(100))
        assert stat.S_IMODE(existing.stat().st_mode) == 0o664
    finally:
        os.umask(old)


def test_concurrent_streams_to_one_path_use_unique_temp_files(tmp_path: Path) -> None:
    target = tmp_path / "same.wav"
    first = ProgressiveWavWriter(target, RATE)
    second = ProgressiveWavWriter(target, RATE)
    assert first.tmp != second.tmp
    first.write(_samples(1000, seed=1))
    second.write(_samples(3000, seed=2))
    first.finish()
    second.finish()
    data, _ = soundfile.read(str(target), dtype="int16")
    np.testing.assert_array_equal(data, pcm16(_samples(3000, seed=2)))
    assert _leftovers(tmp_path) == []


def test_aborted_stream_leaves_nothing_and_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "keep.wav"
    target.write_bytes(b"previous")
    writer = ProgressiveWavWriter(target, RATE)
    writer.write(_samples(100))
    assert writer.tmp.exists()
    writer.abort()
    assert target.read_bytes() == b"previous" and _leftovers(tmp_path) == []
    with pytest.raises(OutputError, match="WAV or raw PCM"):
        ProgressiveWavWriter(tmp_path / "x.flac", RATE)


def test_full_disk_is_a_clear_error_and_leaves_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_space(fd: int, data: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    target = tmp_path / "out.wav"
    target.write_bytes(b"previous")
    monkeypatch.setattr(audio_io.os, "write", no_space)
    with pytest.raises(OutputError, match="No space left"):
        save_audio(target, _samples(100), RATE)
    assert target.read_bytes() == b"previous" and _leftovers(tmp_path) == []


def test_raw_writer_to_dev_full_is_a_clear_error() -> None:
    with open("/dev/full", "wb") as handle, pytest.raises(OutputError, match="No space left"):
        RawPcmWriter(handle).write(_samples(10))


def test_raw_writer_to_a_closed_pipe_raises_output_closed() -> None:
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    with (
        os.fdopen(write_fd, "wb") as handle,
        pytest.raises(OutputClosedError, match="closed"),
    ):
        RawPcmWriter(handle).write(_samples(10))


# -- decoding references ------------------------------------------------------------------------
def _wav(path: Path, samples: np.ndarray, rate: int = RATE, subtype: str = "PCM_16") -> Path:
    soundfile.write(str(path), samples, rate, subtype=subtype)
    return path


def test_truncated_wav_is_refused(tmp_path: Path) -> None:
    path = _wav(tmp_path / "cut.wav", speechlike(2.0))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(AudioError, match="truncated"):
        load_audio(path, RATE)
    whole = _wav(tmp_path / "whole.wav", speechlike(2.0))
    assert len(load_audio(whole, RATE)) == 2 * RATE


def test_absurd_sample_rates_are_refused(tmp_path: Path) -> None:
    path = _wav(tmp_path / "slow.wav", np.array([0.5, -0.5, 0.25], np.float32), rate=1)
    with pytest.raises(AudioError, match="sample rate of 1 Hz"):
        load_audio(path, RATE)


def test_too_short_clips_are_refused(tmp_path: Path) -> None:
    path = _wav(tmp_path / "blip.wav", speechlike(0.05))
    with pytest.raises(AudioError, match=r"at least 0\.1 s"):
        load_audio(path, RATE)


def test_absurd_and_non_finite_peaks_are_refused(tmp_path: Path) -> None:
    loud = speechlike(1.0)
    loud[100] = 1e30
    with pytest.raises(AudioError, match="peaks at 1e\\+30"):
        load_audio(_wav(tmp_path / "loud.wav", loud, subtype="FLOAT"), RATE)
    broken = speechlike(1.0)
    broken[100] = np.nan
    with pytest.raises(NonFiniteAudioError):
        load_audio(_wav(tmp_path / "nan.wav", broken, subtype="FLOAT"), RATE)


def test_decode_size_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _wav(tmp_path / "long.wav", speechlike(3.0))
    with pytest.warns(ReferenceTrimmedWarning):
        assert len(load_audio(path, RATE, max_seconds=1.0)) == RATE
    monkeypatch.setattr(audio_io, "MAX_DECODE_SECONDS", 0.5)
    with pytest.warns(ReferenceTrimmedWarning, match=r"3\.0 s long; only its first 0\.5 s"):
        assert len(load_audio(path, RATE)) == RATE // 2


def test_a_trimmed_reference_is_never_silent(tmp_path: Path) -> None:
    """A reference longer than the model takes was cut without a word; now the cut is a
    ReferenceTrimmedWarning (file or samples), or goes to `on_trim` (the server's header)."""
    import warnings

    from onnx_tts.encoder import validate_reference_audio

    path = _wav(tmp_path / "long.wav", speechlike(25.0, 16000), rate=16000)
    with pytest.warns(ReferenceTrimmedWarning) as caught:
        samples = load_audio(path, RATE, max_seconds=20.0)
    (warning,) = [w.message for w in caught]
    assert len(samples) == 20 * RATE
    assert (warning.seconds, warning.kept) == (25.0, 20.0)
    assert str(warning) == (
        f"reference audio {path} is 25.0 s long; only its first 20 s are used: trim it to the "
        "part you want"
    )
    told: list = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is warned when a callback takes the news
        assert len(load_audio(path, RATE, max_seconds=20.0, on_trim=told.append)) == 20 * RATE
        assert len(load_audio(path, RATE, max_seconds=30.0, on_trim=told.append)) == 25 * RATE
        # What load_audio already cut (and resampled) passes the encoder's check silently.
        odd = _wav(tmp_path / "odd.wav", speechlike(25.0, 11025), rate=11025)
        cut = load_audio(odd, RATE, max_seconds=20.0, on_trim=told.append)
        validate_reference_audio(cut, RATE, max_seconds=20.0)
    assert [(t.seconds, t.kept) for t in told] == [(25.0, 20.0), (25.0, 20.0)]
    with pytest.warns(ReferenceTrimmedWarning, match=r"is 25\.0 s long; only its first 20 s"):
        kept = validate_reference_audio(speechlike(25.0), RATE, max_seconds=20.0)
    assert len(kept) == 20 * RATE


def test_a_directory_that_refuses_new_files_is_a_clear_error_before_any_work() -> None:
    """/proc passes the permission check (as root) but refuses new files: this was a
    FileNotFoundError traceback from tempfile after the whole synthesis."""
    target = Path("/proc/x.wav")
    with pytest.raises(OutputError, match=r"cannot write /proc/x.wav: .*nothing was written"):
        audio_io.check_output_path(target)
    with pytest.raises(OutputError, match=r"cannot write /proc/x.wav"):
        audio_io.save_audio(target, np.zeros(100, np.float32), 24000)
    with pytest.raises(OutputError, match=r"cannot write /proc/x.wav"):
        audio_io.ProgressiveWavWriter(target, 24000)


def test_too_long_and_longest_valid_names(tmp_path: Path) -> None:
    """A 300-character name was an OSError traceback; a valid 250-character name must work
    (its temp file name is shortened)."""
    with pytest.raises(OutputError, match=r"cannot write .*File name too long"):
        audio_io.check_output_path(tmp_path / ("a" * 300 + ".wav"))
    longest = tmp_path / ("b" * 250 + ".wav")
    save_audio(longest, np.zeros(100, np.float32), 24000)
    with ProgressiveWavWriter(longest, 24000) as sink:
        sink.write(np.zeros(100, np.float32))
    assert [p.name for p in tmp_path.iterdir()] == [longest.name]


def _write_each_way(path: Path, samples: np.ndarray) -> None:
    """The three ways audio reaches a file: whole, streamed, raw bytes."""
    save_audio(path, samples, RATE)
    with ProgressiveWavWriter(path, RATE) as writer:
        writer.write(samples)
    audio_io.write_atomically(path, audio_io.encode_audio(samples, RATE, "wav"))


def test_writing_through_a_symbolic_link_replaces_its_target_and_keeps_the_link(
    tmp_path: Path,
) -> None:
    """`-o link.wav` replaced the link with a regular file; now the target is rewritten (temp
    file beside the target, renamed onto it) and the link still points at it."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = elsewhere / "real.wav"
    target.write_bytes(b"old")
    target.chmod(0o640)
    chain = tmp_path / "first.wav"
    (tmp_path / "second.wav").symlink_to(target)
    chain.symlink_to(tmp_path / "second.wav")  # a link to a link
    samples = _samples(2400)
    _write_each_way(chain, samples)
    assert chain.is_symlink() and (tmp_path / "second.wav").is_symlink()
    assert os.readlink(chain) == str(tmp_path / "second.wav")
    data, _ = soundfile.read(str(target), dtype="int16")
    np.testing.assert_array_equal(data, pcm16(samples))
    assert stat.S_IMODE(target.stat().st_mode) == 0o640  # the target keeps its mode
    assert _leftovers(tmp_path) == [] and _leftovers(elsewhere) == []
    assert audio_io.check_output_path(chain) == target
    # A dangling link: its target is created, the link kept.
    dangling = tmp_path / "dangling.wav"
    dangling.symlink_to(elsewhere / "new.wav")
    save_audio(dangling, samples, RATE)
    assert dangling.is_symlink() and (elsewhere / "new.wav").is_file()


def test_a_link_loop_and_a_read_only_file_are_refused_before_any_work(tmp_path: Path) -> None:
    """A read-only file was silently replaced by the atomic rename; now every writer refuses
    it with one line, before writing anything, and leaves it as it was."""
    loop = tmp_path / "loop.wav"
    loop.symlink_to(tmp_path / "other.wav")
    (tmp_path / "other.wav").symlink_to(loop)
    with pytest.raises(OutputError, match="symbolic links form a loop"):
        audio_io.check_output_path(loop)
    locked = tmp_path / "locked.wav"
    locked.write_bytes(b"keep me")
    locked.chmod(0o444)
    link = tmp_path / "to-locked.wav"
    link.symlink_to(locked)
    for path in (locked, link):
        with pytest.raises(OutputError, match=r"locked\.wav: the file is read-only"):
            audio_io.check_output_path(path)
        with pytest.raises(OutputError, match="read-only"):
            save_audio(path, _samples(100), RATE)
        with pytest.raises(OutputError, match="read-only"):
            ProgressiveWavWriter(path, RATE)
        with pytest.raises(OutputError, match="read-only"):
            audio_io.write_atomically(path, b"data")
    assert locked.read_bytes() == b"keep me" and stat.S_IMODE(locked.stat().st_mode) == 0o444
    assert _leftovers(tmp_path) == []


def test_load_audio_in_stereo(tmp_path):
    """channels=2 keeps a stereo file, duplicates a mono one, refuses more channels."""
    from onnx_tts.audio import load_audio
    from onnx_tts.errors import AudioError

    t = np.arange(24000) / 24000
    left, right = 0.3 * np.sin(2 * np.pi * 200 * t), 0.2 * np.sin(2 * np.pi * 300 * t)
    soundfile.write(tmp_path / "st.wav", np.stack([left, right], 1), 24000, subtype="FLOAT")
    soundfile.write(tmp_path / "mono.wav", left, 24000, subtype="FLOAT")
    soundfile.write(tmp_path / "three.wav", np.stack([left] * 3, 1), 24000, subtype="FLOAT")
    stereo = load_audio(tmp_path / "st.wav", 24000, channels=2)
    assert stereo.shape == (24000, 2)
    np.testing.assert_allclose(stereo[:, 1], right, atol=1e-6)
    duplicated = load_audio(tmp_path / "mono.wav", 48000, channels=2)
    assert duplicated.shape == (48000, 2)
    np.testing.assert_array_equal(duplicated[:, 0], duplicated[:, 1])
    np.testing.assert_allclose(duplicated[:, 0], load_audio(tmp_path / "mono.wav", 48000))
    assert load_audio(tmp_path / "st.wav", 24000).ndim == 1  # mono by default
    with pytest.raises(AudioError, match="3 channels"):
        load_audio(tmp_path / "three.wav", 24000, channels=2)

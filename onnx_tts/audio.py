"""Audio I/O: decode with soundfile, resample with soxr, write files atomically.

Every writer (a whole file, a WAV streamed as it is generated, raw PCM to a pipe) turns float
samples into 16-bit integers with the one function :func:`pcm16`, so `-o x.wav` and `--stream`
give the same samples. Non-finite samples are refused before anything is written.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
import struct
import sys
import tempfile
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

import numpy as np
import soundfile
import soxr

from onnx_tts.errors import AudioError, NonFiniteAudioError, OutputClosedError, OutputError

# Below this peak a reference clip carries no voice to clone.
SILENCE_PEAK = 1e-4
# Float files can hold any value; a peak this far above full scale is a broken file, not speech.
MAX_REFERENCE_PEAK = 16.0
MIN_SAMPLE_RATE = 8_000
MAX_SAMPLE_RATE = 384_000
# Shorter than this there is no voice in a clip, whatever the model asks for.
MIN_CLIP_SECONDS = 0.1
# Decoding reads at most this much of a reference (before trimming to the model's max_seconds).
MAX_DECODE_SECONDS = 600.0
MAX_DECODE_CHANNELS = 64
# A RIFF/WAV file counts its bytes in 32 bits.
MAX_WAV_DATA_BYTES = 0xFFFFFFFF - 36

OUTPUT_FORMATS = {".wav": "WAV", ".flac": "FLAC", ".ogg": "OGG"}
PCM16_SCALE = 32767.0


def check_finite(samples: np.ndarray, what: str = "audio") -> None:
    """NonFiniteAudioError when `samples` hold NaN or infinity (never sent to a speaker)."""
    array = np.asarray(samples)
    if array.size and not np.isfinite(array).all():
        bad = int(np.count_nonzero(~np.isfinite(array)))
        raise NonFiniteAudioError(
            f"{what} holds {bad} NaN or infinite sample{'s' * (bad != 1)}; nothing was written. "
            "This is a model or input fault: check the voice and the model files"
        )


def pcm16(samples: np.ndarray) -> np.ndarray:
    """Float samples in [-1, 1] -> int16 (clipped, x 32767, rounded half to even).

    The single 16-bit conversion of every writer. Raises NonFiniteAudioError for NaN/inf.
    """
    array = np.asarray(samples, dtype=np.float32)
    check_finite(array)
    scaled = np.clip(array, -1.0, 1.0).astype(np.float64) * PCM16_SCALE
    return np.rint(scaled).astype("<i2")


def to_pcm16(samples: np.ndarray) -> bytes:
    """Little-endian signed 16-bit PCM bytes (see :func:`pcm16`), for raw streaming."""
    return pcm16(samples).tobytes()


def as_mono_float32(audio: np.ndarray, dtype: str = "float32") -> np.ndarray:
    """Decoded reference samples as contiguous 1-D float32, or AudioError saying how to fix it."""
    samples = np.asarray(audio)
    if samples.ndim != 1:
        raise AudioError(
            f"reference audio must be mono 1-D samples, got shape {samples.shape}; "
            "decode it with onnx_tts.audio.load_audio, which downmixes to mono"
        )
    if samples.dtype.kind != "f":
        raise AudioError(
            f"reference audio must be floating point in [-1, 1], got dtype {samples.dtype}; "
            "decode it with onnx_tts.audio.load_audio"
        )
    return np.ascontiguousarray(samples, dtype=dtype)


def resample(samples: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    """Resample float32 audio, [N] or [N, channels], with soxr (high quality)."""
    samples = np.asarray(samples, dtype=np.float32)
    if from_rate == to_rate:
        return samples
    return soxr.resample(samples, from_rate, to_rate, quality="HQ").astype(np.float32, copy=False)


# -- decoding -----------------------------------------------------------------------------------
def wav_truncation(path: Path) -> str | None:
    """Why a RIFF/WAVE file is cut short (its data chunk claims more bytes than follow), or
    None. libsndfile reads such a file silently up to where it ends."""
    try:
        with path.open("rb") as handle:
            head = handle.read(12)
            if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
                return None
            size = path.stat().st_size
            position = 12
            for _ in range(64):  # a WAV has a handful of chunks; never walk an endless list
                header = handle.read(8)
                if len(header) < 8:
                    return "it ends before its data chunk"
                chunk_id, chunk_size = header[:4], struct.unpack("<I", header[4:])[0]
                position += 8
                if chunk_id == b"data":
                    if chunk_size in (0, 0xFFFFFFFF):  # written by a streamer, size unknown
                        return None
                    missing = position + chunk_size - size
                    if missing > 0:
                        return f"its data chunk is missing {missing} of {chunk_size} bytes"
                    return None
                position += chunk_size + (chunk_size & 1)
                handle.seek(position)
    except OSError:
        return None  # soundfile reports unreadable files itself
    return None


def load_audio(
    path: str | os.PathLike[str],
    sample_rate: int,
    *,
    min_seconds: float | None = None,
    max_seconds: float | None = None,
    channels: int = 1,
) -> np.ndarray:
    """Decode an audio file to float32 at `sample_rate`: mono [N] (channels averaged), or with
    `channels=2` stereo [N, 2] for stereo models (a mono file duplicated, a stereo one kept, more
    channels refused).

    Raises AudioError for a missing, unreadable, unsupported, truncated, empty, silent or too
    short file, a sample rate outside 8-384 kHz, and non-finite or absurd (> 16) peaks. Audio
    longer than `max_seconds` is trimmed to it (a reference voice needs a few seconds), and at
    most MAX_DECODE_SECONDS are ever decoded.
    """
    path = Path(path)
    if not path.exists():
        raise AudioError(f"reference audio not found: {path}")
    if not path.is_file():
        raise AudioError(f"reference audio is not a file: {path}")
    try:
        info = soundfile.info(str(path))
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as error:
        raise AudioError(
            f"cannot decode reference audio {path}: {str(error).rstrip('.')}; "
            "use a WAV, FLAC or OGG file"
        ) from None
    rate = int(info.samplerate)
    if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        raise AudioError(
            f"reference audio {path} has a sample rate of {rate} Hz; use {MIN_SAMPLE_RATE} to "
            f"{MAX_SAMPLE_RATE} Hz (resample it, e.g. to 24000 Hz)"
        )
    if not 1 <= info.channels <= MAX_DECODE_CHANNELS:
        raise AudioError(
            f"reference audio {path} has {info.channels} channels; at most "
            f"{MAX_DECODE_CHANNELS} (a voice is mono or stereo)"
        )
    truncated = wav_truncation(path)
    if truncated:
        raise AudioError(f"reference audio {path} is truncated: {truncated}; re-export the file")
    limit = MAX_DECODE_SECONDS if max_seconds is None else min(max_seconds, MAX_DECODE_SECONDS)
    max_frames = max(1, int(limit * rate))
    try:
        data, _ = soundfile.read(str(path), frames=max_frames, dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as error:
        raise AudioError(
            f"cannot decode reference audio {path}: {str(error).rstrip('.')}; "
            "use a WAV, FLAC or OGG file"
        ) from None
    except MemoryError:
        raise AudioError(f"reference audio {path} is too large to decode") from None
    if data.size == 0:
        raise AudioError(f"reference audio {path} is empty")
    if not np.isfinite(data).all():
        raise NonFiniteAudioError(
            f"reference audio {path} contains NaN or infinite samples; re-export the file"
        )
    if channels not in (1, 2):
        raise AudioError(f"cannot decode to {channels} channels: 1 (mono) or 2 (stereo)")
    if channels == 1:
        samples = data.mean(axis=1) if data.shape[1] > 1 else data[:, 0]
    elif data.shape[1] <= 2:
        samples = np.repeat(data, 2 // data.shape[1], axis=1)
    else:
        raise AudioError(
            f"reference audio {path} has {data.shape[1]} channels; give a mono or stereo file"
        )
    seconds = len(samples) / rate
    needed = max(MIN_CLIP_SECONDS, min_seconds or 0.0)
    if seconds < needed:
        raise AudioError(
            f"reference audio {path} is {seconds:.2f} s long; at least {needed:g} s of speech "
            "is needed"
        )
    peak = float(np.max(np.abs(samples)))
    if peak > MAX_REFERENCE_PEAK:
        raise AudioError(
            f"reference audio {path} peaks at {peak:.3g} (full scale is 1.0); the file is "
            "broken or mis-scaled: re-export it as 16-bit PCM or float in [-1, 1]"
        )
    if peak < SILENCE_PEAK:
        raise AudioError(f"reference audio {path} is silent; record a few seconds of speech")
    return resample(np.ascontiguousarray(samples), rate, sample_rate)


# -- writing ------------------------------------------------------------------------------------
def check_output_path(path: str | os.PathLike[str]) -> Path:
    """Fail early, before any synthesis work, when `path` cannot be written."""
    path = Path(path)
    if path.suffix.lower() not in OUTPUT_FORMATS:
        raise OutputError(
            f"cannot write {path}: unknown extension {path.suffix or '(none)'}; "
            f"use one of {', '.join(OUTPUT_FORMATS)}"
        )
    parent = path.parent if str(path.parent) else Path(".")
    try:
        if not parent.is_dir():
            raise OutputError(f"cannot write {path}: directory {parent} does not exist")
        if path.is_dir():
            raise OutputError(f"cannot write {path}: it is a directory")
    except OSError as error:  # e.g. a name longer than the file system allows
        raise _write_error(path, error) from None
    if not os.access(parent, os.W_OK):
        raise OutputError(f"cannot write {path}: directory {parent} is not writable")
    # Permission bits do not say everything (root, /proc, read-only mounts): try it.
    fd, probe = _temp_beside(path)
    os.close(fd)
    os.unlink(probe)
    return path


def _temp_beside(path: Path) -> tuple[int, str]:
    """A new uniquely named temp file next to `path` (same file system, for the rename)."""
    parent = path.parent if str(path.parent) else Path(".")
    try:
        # The name is shortened so that a valid long target name gives a valid temp name.
        return tempfile.mkstemp(prefix=f".{path.name[:128]}.", suffix=".part", dir=parent)
    except OSError as error:
        raise _write_error(path, error) from None


def _current_umask() -> int:
    # /proc avoids os.umask's set-and-restore, which races with other threads creating files.
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def output_mode(path: Path) -> int:
    """Permission bits for a file about to replace `path`: those of the existing file, else
    what open() would give a new file (0666 minus the umask). mkstemp alone gives 0600."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return 0o666 & ~_current_umask()


def _fsync_directory(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_error(path: Path, error: OSError) -> OutputError:
    reason = error.strerror or str(error)
    return OutputError(f"cannot write {path}: {reason}; nothing was written")


def encode_audio(samples: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """The bytes of a WAV/FLAC (16-bit, via :func:`pcm16`) or OGG Vorbis file."""
    buffer = io.BytesIO()
    if fmt in ("WAV", "FLAC"):
        soundfile.write(buffer, pcm16(samples), sample_rate, format=fmt, subtype="PCM_16")
    else:
        array = np.asarray(samples, dtype=np.float32)
        check_finite(array)
        soundfile.write(buffer, np.clip(array, -1.0, 1.0), sample_rate, format=fmt)
    return buffer.getvalue()


def save_audio(path: str | os.PathLike[str], samples: np.ndarray, sample_rate: int) -> Path:
    """Write audio atomically: encoded in memory, written to a unique temporary file in the
    target directory, fsynced, given the permissions of the file it replaces (or the umask's),
    then renamed over `path`. On any failure `path` is untouched and no temp file remains."""
    path = check_output_path(path)
    if not isinstance(sample_rate, int) or not MIN_SAMPLE_RATE // 8 <= sample_rate <= 10**6:
        raise OutputError(f"cannot write {path}: bad sample rate {sample_rate!r}")
    try:
        data = encode_audio(samples, sample_rate, OUTPUT_FORMATS[path.suffix.lower()])
    except OSError as error:
        raise _write_error(path, error) from None
    except (soundfile.LibsndfileError, RuntimeError) as error:
        raise OutputError(f"cannot encode {path}: {error}") from None
    fd, tmp = _temp_beside(path)
    try:
        try:
            os.fchmod(fd, output_mode(path))
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as error:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise _write_error(path, error) from None
        raise
    _fsync_directory(path.parent if str(path.parent) else Path("."))
    return path


class ProgressiveWavWriter:
    """A 16-bit mono WAV written as chunks arrive: to a unique temporary file in the target
    directory; the header is fixed at :meth:`finish`, which renames it over `path`.
    :meth:`abort` (or leaving a ``with`` block by an exception) removes the temp file, so
    `path` only ever holds a complete file."""

    def __init__(self, path: str | os.PathLike[str], sample_rate: int) -> None:
        self.path = check_output_path(path)
        if self.path.suffix.lower() != ".wav":
            raise OutputError(
                f"cannot stream to {self.path}: streaming writes WAV or raw PCM (-o -), not "
                f"{self.path.suffix}"
            )
        self.sample_rate = int(sample_rate)
        self.data_bytes = 0
        fd, name = _temp_beside(self.path)
        self.tmp = Path(name)
        self._file: BinaryIO | None = os.fdopen(fd, "wb")
        try:
            self._file.write(self._header(0))
        except OSError as error:
            self.abort()
            raise _write_error(self.path, error) from None

    def _header(self, data_bytes: int) -> bytes:
        rate = self.sample_rate
        return (
            b"RIFF"
            + struct.pack("<I", 36 + data_bytes)
            + b"WAVEfmt "
            + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
            + b"data"
            + struct.pack("<I", data_bytes)
        )

    @property
    def samples_written(self) -> int:
        return self.data_bytes // 2

    def write(self, samples: np.ndarray) -> None:
        """Append float samples (checked finite, converted with :func:`pcm16`)."""
        if self._file is None:
            raise OutputError(f"cannot write {self.path}: the writer is closed")
        data = pcm16(samples).tobytes()
        if self.data_bytes + len(data) > MAX_WAV_DATA_BYTES:
            raise OutputError(
                f"cannot write {self.path}: a WAV file holds at most 4 GiB of audio; use "
                "shorter text or raw PCM (-o -)"
            )
        try:
            self._file.write(data)
        except OSError as error:
            raise _write_error(self.path, error) from None
        self.data_bytes += len(data)

    def finish(self) -> Path:
        """Fix the header, fsync, set the permissions and rename over `path`."""
        if self._file is None:
            raise OutputError(f"cannot write {self.path}: the writer is closed")
        handle = self._file
        try:
            handle.seek(0)
            handle.write(self._header(self.data_bytes))
            handle.flush()
            os.fchmod(handle.fileno(), output_mode(self.path))
            os.fsync(handle.fileno())
            handle.close()
            self._file = None
            os.replace(self.tmp, self.path)
        except OSError as error:
            self.abort()
            raise _write_error(self.path, error) from None
        _fsync_directory(self.path.parent if str(self.path.parent) else Path("."))
        return self.path

    def abort(self) -> None:
        """Drop the partial file; `path` is left as it was."""
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
        self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> ProgressiveWavWriter:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if kind is None:
            self.finish()
        else:
            self.abort()


class RawPcmWriter:
    """Raw s16le PCM to a byte stream (stdout for ``-o -``), flushed per chunk.

    A reader that went away (EPIPE) raises OutputClosedError, a full or failing device
    (ENOSPC, EIO, ``> /dev/full``) OutputError: one clear line instead of a traceback. When the
    stream is stdout, its descriptor is pointed at /dev/null after a failure, so Python's final
    flush at exit does not fail a second time."""

    def __init__(self, stream: BinaryIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stdout.buffer
        self.samples_written = 0

    def write(self, samples: np.ndarray) -> None:
        data = to_pcm16(samples)
        try:
            self.stream.write(data)
            self.stream.flush()
        except BrokenPipeError:
            self._silence()
            raise OutputClosedError(
                "the reader of the audio stream closed it (broken pipe)"
            ) from None
        except OSError as error:
            self._silence()
            reason = error.strerror or errno.errorcode.get(error.errno or 0, str(error))
            raise OutputError(f"cannot write the audio stream: {reason}") from None
        self.samples_written += len(data) // 2

    def _silence(self) -> None:
        with contextlib.suppress(AttributeError, OSError, ValueError):
            fileno = self.stream.fileno()
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fileno)
            os.close(devnull)

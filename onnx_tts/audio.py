"""Audio I/O: decode with soundfile, resample with soxr, write files atomically.

Every writer (a whole file, a WAV streamed as it is generated, raw PCM to a pipe) turns float
samples into 16-bit integers with the one function :func:`pcm16`, so `-o x.wav` and `--stream`
give the same samples. Non-finite samples are refused before anything is written.

Output formats (:data:`OUTPUT_FORMATS`, from the one table in `formats.py`): libsndfile inside
the soundfile wheel writes WAV, FLAC, Ogg Vorbis and Ogg Opus, LAME (`lameenc`) constant-bitrate
MP3, PyAV (the optional `aac` extra) AAC in ADTS. Codecs with a fixed set of sample rates get
the audio resampled with soxr. Audio is mono [N] or [N, channels].
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import struct
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

import numpy as np
import soundfile
import soxr

from onnx_tts.atomic_files import (
    StagedFile,
    output_mode,
    output_target,
    release_temp,
    temp_beside,
    write_atomically,
    write_error,
)
from onnx_tts.errors import (
    AudioError,
    NonFiniteAudioError,
    OnnxTTSError,
    OutputClosedError,
    OutputError,
    ReferenceTrimmedWarning,
)
from onnx_tts.formats import FORMAT_EXTENSIONS, FORMATS, OUTPUT_FORMATS, encoded_rate

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

# The formats `save_audio` writes come from the one format table (`formats.py`).
AAC_EXTRA_HINT = "AAC output needs PyAV: pip install 'onnx-tts[aac]' (or use mp3/opus)"
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


def downmix(samples: np.ndarray) -> np.ndarray:
    """[N] mono float32 of [N] or [N, channels] samples (the channels' mean)."""
    array = np.asarray(samples, dtype=np.float32)
    if array.ndim == 2:
        return array.mean(axis=1, dtype=np.float32) if array.shape[1] > 1 else array[:, 0]
    return array


def resample(samples: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    """Resample float32 audio, [N] or [N, channels], with soxr (high quality)."""
    samples = np.asarray(samples, dtype=np.float32)
    if from_rate == to_rate:
        return samples
    return soxr.resample(samples, from_rate, to_rate, quality="HQ").astype(np.float32, copy=False)


# -- decoding -----------------------------------------------------------------------------------
def wav_truncation(source: Path | bytes) -> str | None:
    """Why a RIFF/WAVE file (a path, or its bytes) is cut short (its data chunk claims more
    bytes than follow), or None. libsndfile reads such a file silently up to where it ends."""
    try:
        if isinstance(source, bytes):
            handle: BinaryIO = io.BytesIO(source)
            size = len(source)
        else:
            handle = source.open("rb")
            size = source.stat().st_size
        with handle:
            head = handle.read(12)
            if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
                return None
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


def _undecodable(error: Exception, name: object) -> AudioError:
    """libsndfile's refusal of reference audio `name`, naming the file as the caller does (not
    an in-memory object)."""
    reason = re.sub(r"<_io\.BytesIO object at 0x[0-9a-f]+>", str(name), str(error)).rstrip(".")
    return AudioError(
        f"cannot decode reference audio {name}: {reason}; use a WAV, FLAC or OGG file"
    )


Trimmed = Callable[[ReferenceTrimmedWarning], None]


def reference_trimmed(
    seconds: float, kept: float, what: str = "reference audio", on_trim: Trimmed | None = None
) -> None:
    """Say that a reference of `seconds` was cut to its first `kept` seconds: to `on_trim`
    when given (the server puts it in a header), else as a ReferenceTrimmedWarning (the CLI
    prints it as one warning line)."""
    warning = ReferenceTrimmedWarning(
        f"{what} is {seconds:.1f} s long; only its first {kept:g} s are used: trim it to the "
        "part you want",
        seconds,
        kept,
    )
    if on_trim is not None:
        on_trim(warning)
    else:
        warnings.warn(warning, stacklevel=3)


def load_audio(
    path: str | os.PathLike[str] | bytes,
    sample_rate: int,
    *,
    min_seconds: float | None = None,
    max_seconds: float | None = None,
    on_trim: Trimmed | None = None,
    channels: int = 1,
    name: str | None = None,
) -> np.ndarray:
    """Decode an audio file (a path, or its bytes, named `name` in messages) to float32 at
    `sample_rate`: mono [N] (channels averaged), or with `channels=2` stereo [N, 2] for stereo
    models (a mono file duplicated, a stereo one kept, more channels refused).

    Raises AudioError for a missing, unreadable, unsupported, truncated, empty, silent or too
    short file, a sample rate outside 8-384 kHz, and non-finite or absurd (> 16) peaks. Audio
    longer than `max_seconds` is trimmed to it (a reference voice needs a few seconds), and at
    most MAX_DECODE_SECONDS are ever decoded; a trim is never silent (see
    :func:`reference_trimmed`: a warning, or `on_trim`).
    """
    data_bytes = path if isinstance(path, bytes) else None
    if data_bytes is None:
        file_path = Path(path)  # type: ignore[arg-type]
        if not file_path.exists():
            raise AudioError(f"reference audio not found: {file_path}")
        if not file_path.is_file():
            raise AudioError(f"reference audio is not a file: {file_path}")
    truncated = wav_truncation(file_path if data_bytes is None else data_bytes)
    path = name or (file_path if data_bytes is None else "audio")  # type: ignore[assignment]

    def source() -> Any:  # what libsndfile opens: the file, or the bytes in memory
        return str(file_path) if data_bytes is None else io.BytesIO(data_bytes)

    try:
        info = soundfile.info(source())
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as error:
        raise _undecodable(error, path) from None
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
    if truncated:
        raise AudioError(f"reference audio {path} is truncated: {truncated}; re-export the file")
    limit = MAX_DECODE_SECONDS if max_seconds is None else min(max_seconds, MAX_DECODE_SECONDS)
    max_frames = max(1, int(limit * rate))
    try:
        data, _ = soundfile.read(source(), frames=max_frames, dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as error:
        raise _undecodable(error, path) from None
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
        samples = downmix(data)
    elif data.shape[1] <= 2:
        samples = np.repeat(data, 2 // data.shape[1], axis=1)
    else:
        raise AudioError(
            f"reference audio {path} has {data.shape[1]} channels; give a mono or stereo file"
        )
    if info.frames > max_frames:
        reference_trimmed(info.frames / rate, limit, f"reference audio {path}", on_trim)
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
def output_format(path: str | os.PathLike[str] | None, forced: str | None = None) -> str:
    """The format to write: `forced` (e.g. from ``--format``) when given, else the one
    `path`'s extension names; OutputError listing the choices for anything else."""
    if forced is not None:
        name = forced.lower().lstrip(".")
        if name not in OUTPUT_FORMATS:
            raise OutputError(
                f"unknown audio format {forced!r}; use one of {', '.join(OUTPUT_FORMATS)}"
            )
        return name
    suffix = Path(path).suffix.lower() if path is not None else ""
    if suffix not in FORMAT_EXTENSIONS:
        raise OutputError(
            f"cannot write {path}: unknown extension {suffix or '(none)'}; use one of "
            f"{', '.join(FORMAT_EXTENSIONS)} (or name the format with --format)"
        )
    return FORMAT_EXTENSIONS[suffix]


def check_encoder(fmt: str) -> None:
    """OutputError naming the extra to install when the encoder of `fmt` is missing."""
    if fmt == "aac":
        try:
            import av  # noqa: F401
        except ImportError:
            raise OutputError(AAC_EXTRA_HINT) from None


def check_output_path(path: str | os.PathLike[str], fmt: str | None = None) -> Path:
    """Fail early, before any synthesis work, when `path` cannot be written (an unknown
    extension when no format is forced, a missing encoder, a directory that is not there or
    not writable, a read-only file); returns the file the write replaces (see
    :func:`output_target`: a symbolic link's target)."""
    check_encoder(output_format(path, fmt))
    path = output_target(path)
    parent = path.parent if str(path.parent) else Path(".")
    try:
        if not parent.is_dir():
            raise OutputError(f"cannot write {path}: directory {parent} does not exist")
        if path.is_dir():
            raise OutputError(f"cannot write {path}: it is a directory")
    except OSError as error:  # e.g. a name longer than the file system allows
        raise write_error(path, error) from None
    if not os.access(parent, os.W_OK):
        raise OutputError(f"cannot write {path}: directory {parent} is not writable")
    # Permission bits do not say everything (root, /proc, read-only mounts): try it.
    fd, probe = temp_beside(path)
    os.close(fd)
    release_temp(probe, remove=True)
    return path


def _encode_aac(samples: np.ndarray, sample_rate: int) -> bytes:
    """AAC-LC in an ADTS stream (what a `.aac` file is) with PyAV's bundled ffmpeg; samples
    [N] or [N, channels] (packed)."""
    try:
        import av
    except ImportError:
        raise OutputError(AAC_EXTRA_HINT) from None
    layout = "mono" if samples.ndim == 1 else "stereo"
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="adts") as container:
        stream = container.add_stream("aac", rate=sample_rate)
        stream.layout = layout
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="flt", layout=layout)
        frame.sample_rate = sample_rate
        for packet in (*stream.encode(frame), *stream.encode(None)):
            container.mux(packet)
    return buffer.getvalue()


def _encode_mp3(samples: np.ndarray, sample_rate: int) -> bytes:
    """Constant-bitrate MP3 from LAME (the server's streamed MP3 too): every frame the same
    size, so decoders that never learn the length read it whole."""
    import lameenc

    channels = 1 if samples.ndim == 1 else samples.shape[1]
    encoder = lameenc.Encoder()
    encoder.set_in_sample_rate(sample_rate)
    encoder.set_channels(channels)
    encoder.set_bit_rate(64 * channels if sample_rate <= 24000 else 96 * channels)
    encoder.set_quality(2)
    data = bytes(encoder.encode(to_pcm16(samples))) if len(samples) else b""
    return data + bytes(encoder.flush())


def encode_audio(samples: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """The bytes of a complete file of format `fmt` (one of OUTPUT_FORMATS): samples [N] or
    [N, channels]. WAV and FLAC are 16-bit (:func:`pcm16`); the lossy codecs take float samples
    clipped to [-1, 1], resampled first when the codec needs another rate (`encoded_rate`).
    NonFiniteAudioError for NaN/inf samples."""
    fmt = fmt.lower()
    if fmt not in OUTPUT_FORMATS:
        raise OutputError(f"unknown audio format {fmt!r}; use one of {', '.join(OUTPUT_FORMATS)}")
    rate = encoded_rate(fmt, sample_rate)
    if fmt in ("wav", "flac"):
        data: np.ndarray = pcm16(samples)
    else:
        array = np.asarray(samples, dtype=np.float32)
        check_finite(array)
        data = np.clip(resample(array, sample_rate, rate), -1.0, 1.0)
    if fmt == "aac":
        return _encode_aac(np.ascontiguousarray(data, dtype=np.float32), rate)
    if fmt == "mp3":
        return _encode_mp3(data, rate)
    buffer = io.BytesIO()
    container, subtype = FORMATS[fmt].sndfile  # type: ignore[misc]
    soundfile.write(buffer, data, rate, format=container, subtype=subtype)
    return buffer.getvalue()


def save_audio(
    path: str | os.PathLike[str], samples: np.ndarray, sample_rate: int, fmt: str | None = None
) -> Path:
    """Write audio atomically (see :func:`write_atomically`) in format `fmt`, by default the
    one the extension names: encoded in memory first, so an encoder error leaves `path` as
    it was."""
    return write_atomically(*encoded_output(path, samples, sample_rate, fmt))


def encoded_output(
    path: str | os.PathLike[str], samples: np.ndarray, sample_rate: int, fmt: str | None = None
) -> tuple[Path, bytes]:
    """The file `path` names (a link's target) and the audio encoded for it, in format `fmt`
    or the one the extension names: what :func:`save_audio` writes."""
    fmt = output_format(path, fmt)  # from the name given, even when it is a link
    target = check_output_path(path, fmt)
    if not isinstance(sample_rate, int) or not MIN_SAMPLE_RATE // 8 <= sample_rate <= 10**6:
        raise OutputError(f"cannot write {target}: bad sample rate {sample_rate!r}")
    return target, encode_for(target, samples, sample_rate, fmt)


def encode_for(target: object, samples: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """:func:`encode_audio`, with encoder failures as OutputError naming `target`."""
    try:
        return encode_audio(samples, sample_rate, fmt)
    except OnnxTTSError:
        raise  # already says what is wrong (NaN samples, a missing encoder)
    except OSError as error:
        raise OutputError(f"cannot encode {target}: {error.strerror or error}") from None
    except (soundfile.LibsndfileError, RuntimeError, ValueError) as error:
        raise OutputError(f"cannot encode {target} as {fmt}: {error}") from None


def wav_header(sample_rate: int, data_bytes: int | None, channels: int = 1) -> bytes:
    """The 44-byte header of a 16-bit PCM WAV (mono, or `channels` interleaved) holding
    `data_bytes` of samples; None = a stream of unknown length (both sizes 0xFFFFFFFF, which
    ffmpeg, sox and browsers read to the end)."""
    riff, data = (0xFFFFFFFF, 0xFFFFFFFF) if data_bytes is None else (36 + data_bytes, data_bytes)
    block = 2 * channels
    return (
        b"RIFF"
        + struct.pack("<I", riff)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block, block, 16)
        + b"data"
        + struct.pack("<I", data)
    )


class ProgressiveWavWriter:
    """A 16-bit WAV (mono, or `channels` interleaved: chunks [N, channels]) written as chunks
    arrive: to a unique temporary file in the target directory; the header is fixed at
    :meth:`finish`, which renames it over `path`.
    :meth:`abort` (or leaving a ``with`` block by an exception) removes the temp file, so
    `path` only ever holds a complete file."""

    def __init__(self, path: str | os.PathLike[str], sample_rate: int, channels: int = 1) -> None:
        if Path(path).suffix.lower() != ".wav":
            raise OutputError(
                f"cannot stream to {path}: streaming writes WAV or raw PCM (-o -), not "
                f"{Path(path).suffix}"
            )
        self.path = check_output_path(path)  # a symbolic link's target
        self.sample_rate = int(sample_rate)
        self.channels = int(channels)
        self.data_bytes = 0
        fd, name = temp_beside(self.path)
        self.tmp = Path(name)
        self._file: BinaryIO | None = os.fdopen(fd, "wb")
        try:
            self._file.write(self._header(0))
        except OSError as error:
            self.abort()
            raise write_error(self.path, error) from None

    def _header(self, data_bytes: int) -> bytes:
        return wav_header(self.sample_rate, data_bytes, self.channels)

    @property
    def samples_written(self) -> int:
        return self.data_bytes // (2 * self.channels)

    def write(self, samples: np.ndarray) -> None:
        """Append float samples (checked finite, converted with :func:`pcm16`)."""
        if self._file is None:
            raise OutputError(f"cannot write {self.path}: the writer is closed")
        samples = np.asarray(samples)
        if (samples.shape[1] if samples.ndim == 2 else 1) != self.channels:
            raise OutputError(
                f"cannot write {self.path}: chunks must have {self.channels} channel(s)"
            )
        data = pcm16(samples).tobytes()
        if self.data_bytes + len(data) > MAX_WAV_DATA_BYTES:
            raise OutputError(
                f"cannot write {self.path}: a WAV file holds at most 4 GiB of audio; use "
                "shorter text or raw PCM (-o -)"
            )
        try:
            self._file.write(data)
        except OSError as error:
            raise write_error(self.path, error) from None
        self.data_bytes += len(data)

    def finish(self) -> Path:
        """Fix the header, fsync, set the permissions and rename over `path`."""
        return self.complete().commit()

    def complete(self) -> StagedFile:
        """Fix the header, fsync and set the permissions: the file, complete, waits beside
        `path` for its :meth:`StagedFile.commit` (with other outputs: `commit_together`)."""
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
        except OSError as error:
            self.abort()
            raise write_error(self.path, error) from None
        return StagedFile(self.path, str(self.tmp))

    def abort(self) -> None:
        """Drop the partial file; `path` is left as it was."""
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
        release_temp(str(self.tmp), remove=True)

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
    """Raw s16le PCM (or any bytes, :meth:`write_bytes`) to a byte stream (stdout for
    ``-o -``), flushed per chunk.

    A reader that went away (EPIPE) raises OutputClosedError, a full or failing device
    (ENOSPC, EIO, ``> /dev/full``) OutputError: one clear line instead of a traceback. When the
    stream is stdout, its descriptor is pointed at /dev/null after a failure, so Python's final
    flush at exit does not fail a second time."""

    def __init__(self, stream: BinaryIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stdout.buffer
        self.samples_written = 0

    def write(self, samples: np.ndarray) -> None:
        data = to_pcm16(samples)
        self.write_bytes(data)
        self.samples_written += len(data) // 2

    def write_bytes(self, data: bytes) -> None:
        """Write and flush bytes as they are (a header, a whole encoded file)."""
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

    def _silence(self) -> None:
        with contextlib.suppress(AttributeError, OSError, ValueError):
            fileno = self.stream.fileno()
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fileno)
            os.close(devnull)

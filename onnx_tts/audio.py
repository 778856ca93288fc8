"""Audio I/O: decode with soundfile, resample with soxr, write files atomically."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import soundfile
import soxr

from onnx_tts.errors import AudioError, OutputError

# Below this peak a reference clip carries no voice to clone.
SILENCE_PEAK = 1e-4

OUTPUT_FORMATS = {".wav": "WAV", ".flac": "FLAC", ".ogg": "OGG"}


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
    """Resample mono float32 audio with soxr (high quality)."""
    samples = np.asarray(samples, dtype=np.float32)
    if from_rate == to_rate:
        return samples
    return soxr.resample(samples, from_rate, to_rate, quality="HQ").astype(np.float32, copy=False)


def load_audio(
    path: str | os.PathLike[str],
    sample_rate: int,
    *,
    min_seconds: float | None = None,
    max_seconds: float | None = None,
) -> np.ndarray:
    """Decode an audio file to mono float32 at `sample_rate`.

    Raises AudioError for a missing, unreadable, unsupported, empty, silent or too short file.
    Audio longer than `max_seconds` is trimmed to it (a reference voice needs a few seconds).
    """
    path = Path(path)
    if not path.exists():
        raise AudioError(f"reference audio not found: {path}")
    if not path.is_file():
        raise AudioError(f"reference audio is not a file: {path}")
    try:
        data, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as error:
        raise AudioError(
            f"cannot decode reference audio {path}: {str(error).rstrip('.')}; "
            "use a WAV, FLAC or OGG file"
        ) from None
    if data.size == 0:
        raise AudioError(f"reference audio {path} is empty")
    mono = data.mean(axis=1) if data.shape[1] > 1 else data[:, 0]
    if not np.all(np.isfinite(mono)):
        raise AudioError(f"reference audio {path} contains NaN or infinite samples")
    if min_seconds is not None and len(mono) / rate < min_seconds:
        raise AudioError(
            f"reference audio {path} is {len(mono) / rate:.2f} s long; at least {min_seconds:g} s"
            " of speech is needed"
        )
    if float(np.max(np.abs(mono))) < SILENCE_PEAK:
        raise AudioError(f"reference audio {path} is silent; record a few seconds of speech")
    if max_seconds is not None and len(mono) > int(max_seconds * rate):
        mono = mono[: int(max_seconds * rate)]
    return resample(np.ascontiguousarray(mono), rate, sample_rate)


def check_output_path(path: str | os.PathLike[str]) -> Path:
    """Fail early, before any synthesis work, when `path` cannot be written."""
    path = Path(path)
    if path.suffix.lower() not in OUTPUT_FORMATS:
        raise OutputError(
            f"cannot write {path}: unknown extension {path.suffix or '(none)'}; "
            f"use one of {', '.join(OUTPUT_FORMATS)}"
        )
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise OutputError(f"cannot write {path}: directory {parent} does not exist")
    if path.is_dir():
        raise OutputError(f"cannot write {path}: it is a directory")
    if not os.access(parent, os.W_OK):
        raise OutputError(f"cannot write {path}: directory {parent} is not writable")
    return path


def save_audio(path: str | os.PathLike[str], samples: np.ndarray, sample_rate: int) -> Path:
    """Write audio atomically: a temporary file in the same directory, then a rename."""
    path = check_output_path(path)
    fmt = OUTPUT_FORMATS[path.suffix.lower()]
    samples = np.asarray(samples, dtype=np.float32)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            subtype = "PCM_16" if fmt in ("WAV", "FLAC") else None
            soundfile.write(handle, samples, sample_rate, format=fmt, subtype=subtype)
        os.replace(tmp, path)
    except BaseException as error:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise OutputError(f"cannot write {path}: {error.strerror or error}") from None
        raise
    return path


def to_pcm16(samples: np.ndarray) -> bytes:
    """Little-endian signed 16-bit PCM, for raw streaming to stdout."""
    clipped = np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0)
    return (clipped * 32767.0).round().astype("<i2").tobytes()

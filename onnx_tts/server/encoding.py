"""Audio response formats: whole files and incremental (streamed) bytes.

libsndfile (inside the soundfile wheel) writes WAV, FLAC, MP3 and Ogg Opus with no ffmpeg.
Streaming: `pcm` is raw s16le, `wav` gets a header whose sizes say "unknown length" (what
ffmpeg and browsers accept for live WAV), and flac/mp3/opus go through libsndfile writing to a
sink that forwards every byte as soon as it is written. The few bytes those encoders rewrite
at close (FLAC's total-length field, MP3 tags) are left as written: a streamed file of unknown
length, which decoders read to the end.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass

import numpy as np
import soundfile

from onnx_tts.audio import to_pcm16

# OpenAI's formats that libsndfile can write; `aac` cannot be.
CONTENT_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
FORMATS = tuple(CONTENT_TYPES)
_SNDFILE = {
    "wav": ("WAV", "PCM_16"),
    "flac": ("FLAC", "PCM_16"),
    "mp3": ("MP3", "MPEG_LAYER_III"),
    "opus": ("OGG", "OPUS"),
}
# Rates each codec accepts; other model rates are resampled to the nearest one above.
_CODEC_RATES = {
    "mp3": (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000),
    "opus": (8000, 12000, 16000, 24000, 48000),
}


def encoded_rate(response_format: str, sample_rate: int) -> int:
    """The sample rate the output file will have (codecs with fixed rate sets)."""
    rates = _CODEC_RATES.get(response_format)
    if rates is None or sample_rate in rates:
        return sample_rate
    return next((r for r in rates if r >= sample_rate), rates[-1])


def wav_stream_header(sample_rate: int, channels: int = 1, bits: int = 16) -> bytes:
    """A RIFF/WAVE header for a PCM stream of unknown length (sizes 0xFFFFFFFF)."""
    block = channels * bits // 8
    return (
        b"RIFF"
        + struct.pack("<I", 0xFFFFFFFF)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block, block, bits)
        + b"data"
        + struct.pack("<I", 0xFFFFFFFF)
    )


class _ForwardSink(io.RawIOBase):
    """A seekable file for libsndfile that hands out each newly written byte once."""

    def __init__(self) -> None:
        self._position = 0
        self._end = 0  # bytes handed out so far
        self._pending = bytearray()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        return b""  # the encoders only probe; nothing is read back

    def write(self, data) -> int:  # type: ignore[override]
        data = bytes(data)
        if self._position >= self._end:
            self._pending += data
            self._end += len(data)
        self._position += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._position, 2: self._end}[whence]
        self._position = base + offset
        return self._position

    def tell(self) -> int:
        return self._position

    def take(self) -> bytes:
        out = bytes(self._pending)
        self._pending.clear()
        return out


@dataclass
class StreamEncoder:
    """Float32 chunks in, response bytes out, in order: feed(), then close()."""

    response_format: str
    sample_rate: int

    def __post_init__(self) -> None:
        self._started = False
        self._sink: _ForwardSink | None = None
        self._file: soundfile.SoundFile | None = None
        if self.response_format in ("flac", "mp3", "opus"):
            fmt, subtype = _SNDFILE[self.response_format]
            self._sink = _ForwardSink()
            self._file = soundfile.SoundFile(
                self._sink, "w", self.sample_rate, 1, format=fmt, subtype=subtype
            )

    def feed(self, samples: np.ndarray) -> bytes:
        head = b""
        if not self._started:
            self._started = True
            if self.response_format == "wav":
                head = wav_stream_header(self.sample_rate)
        if self._file is not None:
            if len(samples):
                self._file.write(np.clip(samples, -1.0, 1.0))
            return head + self._sink.take()  # type: ignore[union-attr]
        return head + to_pcm16(samples)

    def close(self) -> bytes:
        out = self.feed(np.zeros(0, np.float32)) if not self._started else b""
        if self._file is not None:
            self._file.close()
            self._file = None
            out += self._sink.take()  # type: ignore[union-attr]
        return out


def encode_file(samples: np.ndarray, sample_rate: int, response_format: str) -> bytes:
    """A complete file (or raw s16le for `pcm`)."""
    samples = np.clip(np.asarray(samples, np.float32), -1.0, 1.0)
    if response_format == "pcm":
        return to_pcm16(samples)
    fmt, subtype = _SNDFILE[response_format]
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, sample_rate, format=fmt, subtype=subtype)
    return buffer.getvalue()

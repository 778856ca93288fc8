"""Audio response formats, encoded incrementally: float32 chunks in, response bytes out.

Every format is a stream that a player can start on before the end is known:
- `pcm`: raw s16le mono; `wav`: a RIFF header whose size fields say "unknown length"
  (0xFFFFFFFF, what ffmpeg, libsndfile and browsers accept for live WAV), then s16le;
- `mp3`: constant-bitrate MPEG layer III from LAME (`lameenc`, 0.4 MB): every frame has the
  same size, so a decoder that never sees a length (libsndfile's mpg123, browsers) still
  reads the whole stream and its duration; libsndfile's own MP3 writer is VBR without a Xing
  header, which libsndfile itself then misreads (a fraction of the audio);
- `opus`: Ogg Opus from libsndfile (pages go out as they fill; Ogg needs no total length);
- `flac`: native FLAC from libsndfile; STREAMINFO's total-samples field stays 0 ("unknown",
  allowed by the format): ffmpeg and libsndfile's read loop decode it to the end;
- `aac`: AAC-LC in ADTS frames from ffmpeg's encoder through PyAV. PyAV is 107 MB installed,
  so it is the optional extra `onnx-tts[aac]`; without it `aac` is a clear 400.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import soundfile

from onnx_tts.audio import to_pcm16

CONTENT_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
FORMATS = tuple(CONTENT_TYPES)
# OpenAI's pcm is 24 kHz s16le mono and clients assume it; other formats say their rate.
PCM_DEFAULT_RATE = 24000
# Rates a request may ask for with the `sample_rate` extension field.
REQUESTABLE_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
# Rates each codec takes; a model rate outside the set is resampled to the nearest above.
_CODEC_RATES = {
    "mp3": (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000),
    "opus": (8000, 12000, 16000, 24000, 48000),
    "aac": (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000),
}
_SNDFILE = {"flac": ("FLAC", "PCM_16"), "opus": ("OGG", "OPUS")}
# libsndfile holds Ogg pages until they fill (seconds of Opus); ask for a page per 100 ms so
# the stream moves as the audio is made. SFC_SET_OGG_PAGE_LATENCY_MS, from sndfile.h.
_SFC_SET_OGG_PAGE_LATENCY_MS = 0x1302
_OGG_PAGE_MS = 100.0


class FormatUnavailable(Exception):
    """The format needs an optional package that is not installed (message says which)."""


def codec_rates(response_format: str) -> tuple[int, ...] | None:
    """The sample rates `response_format` can carry (None: any)."""
    return _CODEC_RATES.get(response_format)


def encoded_rate(response_format: str, sample_rate: int, requested: int | None = None) -> int:
    """The sample rate of the response: `requested` when given (the caller checked it against
    codec_rates), 24 kHz for pcm, else the model's rate or the nearest one the codec takes."""
    if requested is not None:
        return requested
    if response_format == "pcm":
        return PCM_DEFAULT_RATE
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


class _Codec(Protocol):
    def feed(self, samples: np.ndarray) -> bytes: ...
    def close(self) -> bytes: ...


class _Pcm:
    def __init__(self, sample_rate: int, header: bytes = b"") -> None:
        self._head = header

    def feed(self, samples: np.ndarray) -> bytes:
        head, self._head = self._head, b""
        return head + to_pcm16(samples)

    def close(self) -> bytes:
        return self.feed(np.zeros(0, np.float32))


class _Mp3:
    def __init__(self, sample_rate: int) -> None:
        import lameenc

        self._encoder = lameenc.Encoder()
        self._encoder.set_in_sample_rate(sample_rate)
        self._encoder.set_channels(1)
        # Constant bitrate: speech at <= 24 kHz (MPEG-2) needs less than music at 32-48 kHz.
        self._encoder.set_bit_rate(64 if sample_rate <= 24000 else 96)
        self._encoder.set_quality(2)

    def feed(self, samples: np.ndarray) -> bytes:
        return bytes(self._encoder.encode(to_pcm16(samples))) if len(samples) else b""

    def close(self) -> bytes:
        return bytes(self._encoder.flush())


class _ForwardSink(io.RawIOBase):
    """A seekable file for an encoder that hands out each newly written byte once; bytes it
    rewrites later (totals, tags) are dropped: they describe a stream already sent."""

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

    def write(self, data: Any) -> int:  # type: ignore[override]
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


class _Sndfile:
    """FLAC and Ogg Opus through libsndfile (inside the soundfile wheel)."""

    def __init__(self, sample_rate: int, fmt: str, subtype: str) -> None:
        self._sink = _ForwardSink()
        self._file = soundfile.SoundFile(
            self._sink, "w", sample_rate, 1, format=fmt, subtype=subtype
        )
        if fmt == "OGG":
            from soundfile import _ffi, _snd

            latency = _ffi.new("double*", _OGG_PAGE_MS)
            _snd.sf_command(
                self._file._file, _SFC_SET_OGG_PAGE_LATENCY_MS, latency, _ffi.sizeof("double")
            )

    def feed(self, samples: np.ndarray) -> bytes:
        if len(samples):
            self._file.write(np.clip(samples, -1.0, 1.0))
        return self._sink.take()

    def close(self) -> bytes:
        self._file.close()
        return self._sink.take()


class _Aac:
    """AAC-LC in ADTS through PyAV (ffmpeg's native encoder), frames out as they are made."""

    def __init__(self, sample_rate: int) -> None:
        try:
            import av
        except ImportError:
            raise FormatUnavailable(
                "response_format 'aac' needs PyAV on the server: pip install 'onnx-tts[aac]'"
            ) from None
        self._sink = _ForwardSink()
        self._container = av.open(self._sink, "w", format="adts")
        self._stream = self._container.add_stream("aac", rate=sample_rate, layout="mono")
        self._stream.bit_rate = 64000
        self._rate = sample_rate
        self._pts = 0
        self._av = av

    def _frame(self, samples: np.ndarray) -> Any:
        frame = self._av.AudioFrame.from_ndarray(
            np.clip(samples, -1.0, 1.0).astype(np.float32).reshape(1, -1),
            format="flt",
            layout="mono",
        )
        frame.sample_rate = self._rate
        frame.pts = self._pts
        self._pts += len(samples)
        return frame

    def feed(self, samples: np.ndarray) -> bytes:
        if len(samples):
            for packet in self._stream.encode(self._frame(samples)):
                self._container.mux(packet)
        return self._sink.take()

    def close(self) -> bytes:
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()
        return self._sink.take()


_CODECS: dict[str, Callable[[int], _Codec]] = {
    "pcm": _Pcm,
    "wav": lambda rate: _Pcm(rate, wav_stream_header(rate)),
    "mp3": _Mp3,
    "flac": lambda rate: _Sndfile(rate, *_SNDFILE["flac"]),
    "opus": lambda rate: _Sndfile(rate, *_SNDFILE["opus"]),
    "aac": _Aac,
}


class StreamEncoder:
    """Float32 chunks in, response bytes out, in order: feed() as audio comes, then close().
    Opening it checks the format can be made here (FormatUnavailable otherwise)."""

    def __init__(self, response_format: str, sample_rate: int) -> None:
        self.response_format = response_format
        self.sample_rate = sample_rate
        self._codec = _CODECS[response_format](sample_rate)
        self._closed = False

    def feed(self, samples: np.ndarray) -> bytes:
        return self._codec.feed(np.asarray(samples, np.float32))

    def close(self) -> bytes:
        if self._closed:
            return b""
        self._closed = True
        return self._codec.close()


def encode_file(samples: np.ndarray, sample_rate: int, response_format: str) -> bytes:
    """The whole response at once: the same bytes a stream of one chunk gives."""
    encoder = StreamEncoder(response_format, sample_rate)
    return encoder.feed(samples) + encoder.close()

"""Audio response formats, encoded incrementally: float32 chunks in, response bytes out.

Every format is a stream that a player can start on before the end is known:
- `pcm`: raw s16le mono; `wav`: a RIFF header whose size fields say "unknown length"
  (0xFFFFFFFF, what ffmpeg, libsndfile and browsers accept for live WAV), then s16le;
- `mp3`: constant-bitrate MPEG layer III from LAME (`lameenc`, 0.4 MB): every frame has the
  same size, so a decoder that never sees a length (libsndfile's mpg123, browsers) still
  reads the whole stream and its duration; libsndfile's own MP3 writer is VBR without a Xing
  header, which libsndfile itself then misreads (a fraction of the audio);
- `opus`: Ogg Opus from libsndfile (pages go out as they fill; Ogg needs no total length);
- `flac`: native FLAC from libsndfile, sent whole once the audio is complete: a FLAC streamed
  before its length is known says "length unknown" in STREAMINFO, which `soundfile.read()` (and
  other seeking readers) cannot read to the end;
- `aac`: AAC-LC in ADTS frames from ffmpeg's encoder through PyAV. PyAV is 107 MB installed,
  so it is the optional extra `onnx-tts[aac]`; without it `aac` is a clear 400.

Names, content types and the rates each codec takes come from the one format table
(`onnx_tts.formats`). Audio is mono or interleaved channels ([N, channels]): OpenAI's `pcm` is
always mono (the job downmixes it), the other formats carry the model's channels.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import soundfile

from onnx_tts.audio import to_pcm16, wav_header
from onnx_tts.formats import CONTENT_TYPES, RESPONSE_FORMATS, encoded_rate
from onnx_tts.formats import FORMATS as FORMAT_TABLE

FORMATS = RESPONSE_FORMATS
# Rates a request may ask for with the `sample_rate` extension field (a codec with rates of its
# own takes only those).
REQUESTABLE_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
# libsndfile holds Ogg pages until they fill (seconds of Opus); ask for a page per 100 ms so
# the stream moves as the audio is made. SFC_SET_OGG_PAGE_LATENCY_MS, from sndfile.h.
_SFC_SET_OGG_PAGE_LATENCY_MS = 0x1302
_OGG_PAGE_MS = 100.0


class FormatUnavailable(Exception):
    """The format needs an optional package that is not installed (message says which)."""


def codec_rates(response_format: str) -> tuple[int, ...] | None:
    """The sample rates `response_format` can carry when its codec restricts them (None: any
    of REQUESTABLE_RATES; `pcm` is 24 kHz unless asked otherwise)."""
    if response_format == "pcm":
        return None
    return FORMAT_TABLE[response_format].rates


def wav_stream_header(sample_rate: int, channels: int = 1) -> bytes:
    """A 16-bit PCM WAV header for a stream of unknown length (sizes 0xFFFFFFFF)."""
    return wav_header(sample_rate, None, channels)


class _Codec(Protocol):
    def feed(self, samples: np.ndarray) -> bytes: ...
    def close(self) -> bytes: ...


class _Pcm:
    def __init__(self, sample_rate: int, channels: int = 1, header: bytes = b"") -> None:
        self._head = header

    def feed(self, samples: np.ndarray) -> bytes:
        head, self._head = self._head, b""
        return head + to_pcm16(samples)

    def close(self) -> bytes:
        return self.feed(np.zeros(0, np.float32))


class _Mp3:
    def __init__(self, sample_rate: int, channels: int = 1) -> None:
        import lameenc

        self._encoder = lameenc.Encoder()
        self._encoder.set_in_sample_rate(sample_rate)
        self._encoder.set_channels(channels)
        # Constant bitrate: speech at <= 24 kHz (MPEG-2) needs less than music at 32-48 kHz.
        self._encoder.set_bit_rate((64 if sample_rate <= 24000 else 96) * channels)
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


class _OggOpus:
    """Ogg Opus through libsndfile (inside the soundfile wheel), pages as they fill."""

    def __init__(self, sample_rate: int, channels: int) -> None:
        from soundfile import _ffi, _snd

        self._sink = _ForwardSink()
        fmt, subtype = FORMAT_TABLE["opus"].sndfile  # type: ignore[misc]
        self._file = soundfile.SoundFile(
            self._sink, "w", sample_rate, channels, format=fmt, subtype=subtype
        )
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


class _Whole:
    """A format sent whole once the audio is complete (FLAC: a file written before its
    length is known cannot be read to the end by seeking readers such as soundfile.read)."""

    def __init__(self, sample_rate: int, channels: int, fmt: str) -> None:
        self._rate, self._fmt = sample_rate, fmt
        self._pieces: list[np.ndarray] = []

    def feed(self, samples: np.ndarray) -> bytes:
        if len(samples):
            self._pieces.append(np.asarray(samples, np.float32))
        return b""

    def close(self) -> bytes:
        from onnx_tts.audio import encode_audio

        samples = np.concatenate(self._pieces) if self._pieces else np.zeros(0, np.float32)
        return encode_audio(samples, self._rate, self._fmt)


class _Aac:
    """AAC-LC in ADTS through PyAV (ffmpeg's native encoder), frames out as they are made."""

    def __init__(self, sample_rate: int, channels: int = 1) -> None:
        try:
            import av
        except ImportError:
            raise FormatUnavailable(
                "response_format 'aac' needs PyAV on the server: pip install 'onnx-tts[aac]'"
            ) from None
        self._sink = _ForwardSink()
        self._container = av.open(self._sink, "w", format="adts")
        self._layout = "mono" if channels == 1 else "stereo"
        self._stream = self._container.add_stream("aac", rate=sample_rate, layout=self._layout)
        self._stream.bit_rate = 64000 * channels
        self._rate = sample_rate
        self._pts = 0
        self._av = av

    def _frame(self, samples: np.ndarray) -> Any:
        frame = self._av.AudioFrame.from_ndarray(
            np.clip(samples, -1.0, 1.0).astype(np.float32).reshape(1, -1),
            format="flt",
            layout=self._layout,
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


_CODECS: dict[str, Callable[[int, int], _Codec]] = {
    "pcm": _Pcm,
    "wav": lambda rate, channels: _Pcm(rate, channels, wav_stream_header(rate, channels)),
    "mp3": _Mp3,
    "flac": lambda rate, channels: _Whole(rate, channels, "flac"),
    "opus": _OggOpus,
    "aac": _Aac,
}


class StreamEncoder:
    """Float32 chunks ([n] or [n, channels]) in, response bytes out, in order: feed() as audio
    comes, then close(). Opening it checks the format can be made here (FormatUnavailable
    otherwise)."""

    def __init__(self, response_format: str, sample_rate: int, channels: int = 1) -> None:
        self.response_format = response_format
        self.sample_rate = sample_rate
        self.channels = channels
        self._codec = _CODECS[response_format](sample_rate, channels)
        self._closed = False

    @property
    def cheap_feed(self) -> bool:
        """Whether feed() costs no real CPU (a copy to PCM, or kept for close()), so it may
        run on the event loop; a codec's feed does not."""
        return isinstance(self._codec, (_Pcm, _Whole))

    def feed(self, samples: np.ndarray) -> bytes:
        return self._codec.feed(np.asarray(samples, np.float32))

    def close(self) -> bytes:
        if self._closed:
            return b""
        self._closed = True
        return self._codec.close()


def encode_file(samples: np.ndarray, sample_rate: int, response_format: str) -> bytes:
    """The whole response at once: the same bytes a stream of one chunk gives."""
    samples = np.asarray(samples, np.float32)
    channels = samples.shape[1] if samples.ndim == 2 else 1
    encoder = StreamEncoder(response_format, sample_rate, channels)
    return encoder.feed(samples) + encoder.close()


__all__ = [
    "CONTENT_TYPES",
    "FORMATS",
    "REQUESTABLE_RATES",
    "FormatUnavailable",
    "StreamEncoder",
    "codec_rates",
    "encode_file",
    "encoded_rate",
    "wav_stream_header",
]

"""The one table of audio output formats, for files (the CLI, `Audio.save`) and responses (the
server): names, extensions, content types, the sample rates each codec takes, how libsndfile
writes it, and what it needs installed. Pure data: `audio.py` writes files from it and
`server/encoding.py` streams responses from it, so the two cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass

# Sample rates of MPEG audio (MP3 and AAC share the list up to 48 kHz).
_MPEG_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)


@dataclass(frozen=True)
class AudioFormat:
    """One output format. `rates`: the sample rates its codec takes (None: any; audio at
    another rate is resampled to the nearest one above); `sndfile`: libsndfile's (format,
    subtype) when libsndfile writes it; `response`: one of OpenAI's `response_format`s;
    `file`: written as a file; `needs`: the optional extra its encoder comes from."""

    name: str
    extensions: tuple[str, ...]
    content_type: str
    rates: tuple[int, ...] | None = None
    sndfile: tuple[str, str] | None = None
    response: bool = True
    file: bool = True
    needs: str | None = None


FORMATS: dict[str, AudioFormat] = {
    f.name: f
    for f in (
        AudioFormat("wav", (".wav",), "audio/wav", sndfile=("WAV", "PCM_16")),
        AudioFormat("flac", (".flac",), "audio/flac", sndfile=("FLAC", "PCM_16")),
        # Constant-bitrate LAME: readable to the end by decoders that never learn the length
        # (libsndfile's own MP3 writer is VBR without a Xing header, which it then misreads).
        AudioFormat("mp3", (".mp3",), "audio/mpeg", _MPEG_RATES),
        AudioFormat(
            "ogg", (".ogg", ".oga"), "audio/ogg", sndfile=("OGG", "VORBIS"), response=False
        ),
        # Opus runs at 48 kHz inside; it takes these input rates as they are.
        AudioFormat(
            "opus", (".opus",), "audio/ogg", (8000, 12000, 16000, 24000, 48000), ("OGG", "OPUS")
        ),
        AudioFormat(
            "aac", (".aac",), "audio/aac", (*_MPEG_RATES, 64000, 88200, 96000), needs="aac"
        ),
        # OpenAI's pcm: raw s16le mono at 24 kHz (clients assume it), responses and stdout.
        AudioFormat("pcm", (), "audio/pcm", (24000,), file=False),
    )
}
OUTPUT_FORMATS = tuple(name for name, f in FORMATS.items() if f.file)
# In OpenAI's order of its response_format values.
RESPONSE_FORMATS = tuple(
    name for name in ("mp3", "opus", "aac", "flac", "wav", "pcm") if FORMATS[name].response
)
FORMAT_EXTENSIONS = {ext: f.name for f in FORMATS.values() for ext in f.extensions}
CONTENT_TYPES = {name: f.content_type for name, f in FORMATS.items()}


def encoded_rate(fmt: str, sample_rate: int, requested: int | None = None) -> int:
    """The sample rate `fmt` carries audio made at `sample_rate`: `requested` when given (the
    caller checked it against the format's rates), else the model's rate when the codec takes
    it, else the nearest rate above it the codec takes (the highest at most)."""
    if requested is not None:
        return requested
    rates = FORMATS[fmt].rates
    if rates is None or sample_rate in rates:
        return sample_rate
    if len(rates) == 1:
        return rates[0]
    return next((rate for rate in rates if rate >= sample_rate), rates[-1])


__all__ = [
    "CONTENT_TYPES",
    "FORMATS",
    "FORMAT_EXTENSIONS",
    "OUTPUT_FORMATS",
    "RESPONSE_FORMATS",
    "AudioFormat",
    "encoded_rate",
]

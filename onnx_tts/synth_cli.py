"""`onnx-tts synth`: text in, a file or a stream out (formats, streaming, speech shaping,
captions); its flags and the command."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from onnx_tts.audio import OUTPUT_FORMATS, ProgressiveWavWriter, RawPcmWriter
from onnx_tts.errors import InputError
from onnx_tts.flags import add_engine_flags, load_engine
from onnx_tts.signals import committing
from onnx_tts.vocoder import STREAMING_KEYS

if TYPE_CHECKING:
    from onnx_tts.atomic_files import StagedFile

SAMPLING_HELP = {
    "temperature": "randomness of each token: 0 = greedy (always the likeliest), higher = more "
    "varied (default: the model's)",
    "top_k": "draw only from the k likeliest tokens (0 = no limit)",
    "top_p": "draw only from the likeliest tokens whose probabilities sum to p (nucleus, 0-1]",
    "repetition_penalty": "divide the scores of tokens already produced (1 = off, >1 repeats less)",
}


def add_synth_parser(commands: Any) -> argparse.ArgumentParser:
    """Register `synth` on the main CLI's subparsers."""
    synth = commands.add_parser("synth", help="synthesize speech from text")
    synth.add_argument("text", help="text to speak, or - to read it from stdin")
    synth.add_argument(
        "-o",
        "--output",
        default="out.wav",
        help="output file, its extension picks the format (.wav .flac .mp3 .ogg .opus .aac; "
        "AAC needs the 'aac' extra), or - for stdout (raw s16le PCM with --stream)",
    )
    synth.add_argument(
        "--format",
        choices=(*OUTPUT_FORMATS, "pcm"),
        help="write this format whatever the extension (pcm = raw s16le, stdout only)",
    )
    synth.add_argument(
        "-q", "--quiet", action="store_true", help="no progress bar and no summary line"
    )
    synth.add_argument("--voice", help="reference audio to clone (WAV, FLAC, OGG)")
    synth.add_argument("--seed", type=int, help="random seed (same seed -> same audio)")
    shaping = synth.add_argument_group("speech (pace, pauses, markup, captions)")
    shaping.add_argument(
        "--speed", type=float, default=1.0, help="pace, 0.25-4 (time-stretched, pitch kept)"
    )
    shaping.add_argument(
        "--sentence-silence", type=float, help="seconds of silence between sentences"
    )
    shaping.add_argument(
        "--ssml", action="store_true", help="read the text as SSML (a text starting <speak> is)"
    )
    shaping.add_argument(
        "--captions",
        metavar="FILE",
        help="also write the words' timings as subtitles (.srt or .vtt)",
    )
    sampling = synth.add_argument_group("sampling (how each token is drawn)")
    sampling.add_argument("--temperature", type=float, help=SAMPLING_HELP["temperature"])
    sampling.add_argument("--top-k", type=int, help=SAMPLING_HELP["top_k"])
    sampling.add_argument("--top-p", type=float, help=SAMPLING_HELP["top_p"])
    sampling.add_argument(
        "--repetition-penalty", type=float, help=SAMPLING_HELP["repetition_penalty"]
    )
    streaming = synth.add_argument_group("streaming (only with --stream)")
    streaming.add_argument("--stream", action="store_true", help="stream audio as it is made")
    streaming.add_argument("--first-chunk-frames", type=int, help="frames in the first window")
    streaming.add_argument("--stride-frames", type=int, help="new frames per later window")
    streaming.add_argument("--overlap-frames", type=int, help="left context per window")
    streaming.add_argument("--holdback-frames", type=int, help="frames held for right context")
    streaming.add_argument("--crossfade-samples", type=int, help="crossfade between windows")
    synth.add_argument("-v", "--verbose", action="store_true", help="timings on stderr")
    add_engine_flags(synth)
    return synth


def _read_text(arg: str) -> str:
    from onnx_tts.frontend import check_text

    if arg == "-":
        if sys.stdin is None:  # started with stdin closed (<&-)
            raise InputError(
                "the text is - (read stdin), but stdin is closed; pipe the text in, or give "
                "it as an argument"
            )
        return check_text(sys.stdin.buffer.read())
    return check_text(arg)


class _Progress:
    """A tqdm bar of sentences on stderr, shown only when stderr is a terminal, the text has
    more than one sentence and --quiet was not given."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.bar: Any = None

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or total < 2 or not sys.stderr.isatty():
            return
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="sentence", file=sys.stderr, leave=False)
        self.bar.update(done - self.bar.n)
        if done == total:
            self.bar.close()


def _stream_options(args: argparse.Namespace) -> dict[str, Any]:
    given = {
        name: getattr(args, name) for name in STREAMING_KEYS if getattr(args, name) is not None
    }
    if given and not args.stream:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise InputError(f"{flags} only apply to streaming; add --stream or drop them")
    return given


def _sampling_options(args: argparse.Namespace) -> dict[str, Any]:
    return {name: getattr(args, name) for name in SAMPLING_HELP if getattr(args, name) is not None}


def _write_stream(chunks: Iterable[np.ndarray], sink: Any) -> tuple[int, float | None]:
    """Write chunks as they come (each writer converts with audio.pcm16 and checks they are
    finite); returns the samples written and the time to the first audio."""
    start = time.perf_counter()
    first: float | None = None
    samples = 0
    for chunk in chunks:
        if first is None and len(chunk):
            first = time.perf_counter() - start
        sink.write(chunk)
        samples += len(chunk)
    return samples, first


def _output_format(args: argparse.Namespace) -> str:
    """The format synth writes, checked before any work: from --format or the extension;
    "pcm" (raw s16le) only to stdout."""
    from onnx_tts.audio import check_encoder, check_output_path, output_format

    if args.output == "-" and sys.stdout is None:  # started with stdout closed (>&-)
        raise InputError(
            "-o - writes the audio to stdout, but stdout is closed; redirect it (> out.wav) "
            "or give -o FILE"
        )
    if args.output != "-":
        if args.format == "pcm":
            raise InputError("--format pcm writes raw samples to stdout only: add -o -")
        check_output_path(args.output, args.format)  # fail before any work
        return output_format(args.output, args.format)
    if args.format is None and not args.stream:
        raise InputError(
            "-o - writes raw PCM as it streams; add --stream (or --format wav|mp3|... for a "
            "whole file on stdout)"
        )
    fmt = args.format or "pcm"
    if args.stream and fmt not in ("pcm", "wav"):
        raise InputError(
            f"--stream to stdout writes pcm or wav; drop --stream to get the whole {fmt} file "
            "on stdout"
        )
    check_encoder(fmt)
    return fmt


# Writes one finished output completely beside its place; every output is staged before any
# is put in place (`_put_in_place`), so that a failure leaves every file as it was.
Output = Callable[[], "StagedFile"]


def _synth_stream(
    args: argparse.Namespace, engine: Any, fmt: str, chunks: Any
) -> tuple[int, float | None, list[Output]]:
    """Write the chunks of engine.stream as they come; (samples, time to first audio, what
    completes the file)."""
    from onnx_tts.audio import encoded_output, wav_header

    channels = engine.channels  # stereo models write stereo
    if args.output == "-":
        sink = RawPcmWriter()
        if fmt == "wav":
            sink.write_bytes(wav_header(engine.sample_rate, None, channels))
        return (*_write_stream(chunks, sink), [])
    if fmt == "wav":
        writer = ProgressiveWavWriter(args.output, engine.sample_rate, channels)
        try:
            return (*_write_stream(chunks, writer), [writer.complete])
        except BaseException:
            writer.abort()
            raise
    # Compressed formats are encoded whole at the end (the file appears only complete).
    kept: list[np.ndarray] = []
    samples, first = _write_stream(chunks, _Collector(kept))
    audio = np.concatenate(kept) if kept else np.zeros(0, np.float32)
    encoded = encoded_output(args.output, audio, engine.sample_rate, fmt)
    return samples, first, [_file_output(*encoded)]


def _file_output(path: Path, data: bytes) -> Output:
    from onnx_tts.atomic_files import stage_file

    return lambda: stage_file(path, data)


def _put_in_place(outputs: list[Output]) -> None:
    """Stage every output (each complete beside its place), then rename them all into place
    with termination signals held: a full disk or a failed encode leaves every file as it
    was, the captions included."""
    from onnx_tts.atomic_files import commit_together

    staged: list[StagedFile] = []
    try:
        for output in outputs:
            staged.append(output())
    except BaseException:
        for file in staged:
            file.discard()
        raise
    with committing():  # the outputs go in place together; the run is then done
        commit_together(staged)


class _Collector:
    """A stream sink that keeps the chunks (checked finite) for one encode at the end."""

    def __init__(self, chunks: list[np.ndarray]) -> None:
        self.chunks = chunks

    def write(self, samples: np.ndarray) -> None:
        from onnx_tts.audio import check_finite

        check_finite(samples)
        self.chunks.append(np.asarray(samples, np.float32))


def _captions_kind(args: argparse.Namespace) -> str | None:
    """srt or vtt from --captions' extension (checked before any work)."""
    if args.captions is None:
        return None
    from onnx_tts.audio import check_output_path

    kind = Path(args.captions).suffix.lower().lstrip(".")
    if kind not in ("srt", "vtt"):
        raise InputError(f"--captions writes .srt or .vtt subtitles, not {args.captions!r}")
    check_output_path(args.captions, "wav")  # writable, before any work
    from onnx_tts.atomic_files import same_file

    if args.output != "-" and same_file(args.output, args.captions):
        raise InputError(
            f"-o {args.output} and --captions {args.captions} are the same file; give the "
            "captions a file of their own"
        )
    return kind


def _captions(args: argparse.Namespace, kind: str | None, words: Any) -> list[Output]:
    if kind is None:
        return []
    from onnx_tts.pipeline.timings import subtitles

    return [_file_output(Path(args.captions), subtitles(words or [], kind).encode())]


def cmd_synth(args: argparse.Namespace) -> int:
    from onnx_tts.audio import encode_for, encoded_output, encoded_rate

    text = _read_text(args.text)
    fmt = _output_format(args)
    captions = _captions_kind(args)
    to_stdout = args.output == "-"
    window = _stream_options(args)
    started = time.perf_counter()
    engine = load_engine(args)
    loaded = time.perf_counter()
    options = {
        **_sampling_options(args),
        "ssml": True if args.ssml else None,
        "speed": args.speed,
        "sentence_silence": args.sentence_silence,
        "timestamps": captions is not None,
    }
    if args.stream:
        chunks = engine.stream(text, voice=args.voice, seed=args.seed, **window, **options)
        samples, first, outputs = _synth_stream(args, engine, fmt, chunks)
        duration = samples / engine.sample_rate
        outputs = _captions(args, captions, chunks.words) + outputs
    else:
        audio = engine.synthesize(
            text,
            voice=args.voice,
            seed=args.seed,
            progress=_Progress(enabled=not args.quiet),
            **options,
        )
        outputs = _captions(args, captions, audio.words)
        if not to_stdout:
            encoded = encoded_output(args.output, audio.samples, audio.sample_rate, fmt)
            outputs.append(_file_output(*encoded))
        elif fmt == "pcm":
            RawPcmWriter().write(audio.samples)
        else:
            data = encode_for("stdout", audio.samples, audio.sample_rate, fmt)
            RawPcmWriter().write_bytes(data)
        duration, first = audio.duration, None
    _put_in_place(outputs)
    elapsed = time.perf_counter() - loaded
    if args.verbose:
        parts = [
            f"load {loaded - started:.2f} s",
            f"synth {elapsed:.2f} s",
            f"audio {duration:.2f} s",
            f"RTF {elapsed / max(duration, 1e-9):.3f}",
        ]
        if first is not None:
            parts.insert(2, f"time to first audio {first * 1000:.0f} ms")
        print("onnx-tts: " + ", ".join(parts), file=sys.stderr)
    if not to_stdout and not args.quiet:
        rate = encoded_rate(fmt, engine.sample_rate)
        print(f"wrote {args.output} ({fmt}, {duration:.2f} s at {rate} Hz)", file=sys.stderr)
    return 0

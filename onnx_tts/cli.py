"""`onnx-tts` command line: synth, info, bench, cache."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from onnx_tts.atomic_files import remove_temp_files
from onnx_tts.audio import OUTPUT_FORMATS, ProgressiveWavWriter, RawPcmWriter
from onnx_tts.completion import SHELLS
from onnx_tts.config import CacheConfig, add_flags, from_flags
from onnx_tts.errors import InputError, OnnxTTSError, OutputClosedError
from onnx_tts.flags import add_engine_flags, engine_configs, family_options
from onnx_tts.signals import TerminatedBySignal, termination_as_exception

# `onnx-tts cache` takes where the caches are, not how big they may grow.
CACHE_SIZE_FIELDS = (
    "cache_memory_bytes",
    "cache_disk_bytes",
    "redis_ttl_seconds",
    "result_cache_bytes",
    "result_cache_disk_bytes",
    "prefix_cache_bytes",
)


class _Parser(argparse.ArgumentParser):
    """argparse with the project's error contract: one line on stderr, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


SAMPLING_HELP = {
    "temperature": "randomness of each token: 0 = greedy (always the likeliest), higher = more "
    "varied (default: the model's)",
    "top_k": "draw only from the k likeliest tokens (0 = no limit)",
    "top_p": "draw only from the likeliest tokens whose probabilities sum to p (nucleus, 0-1]",
    "repetition_penalty": "divide the scores of tokens already produced (1 = off, >1 repeats less)",
}
STREAM_FLAGS = (
    "first_chunk_frames",
    "stride_frames",
    "overlap_frames",
    "holdback_frames",
    "crossfade_samples",
)


def version_line() -> str:
    """`onnx-tts --version`: ours, and the ONNX Runtime and Python it runs on."""
    from importlib.metadata import PackageNotFoundError, version

    import onnx_tts

    try:
        runtime = f"onnxruntime {version('onnxruntime')}"
    except PackageNotFoundError:
        runtime = "onnxruntime not installed"
    python = ".".join(map(str, sys.version_info[:3]))
    return f"onnx-tts {onnx_tts.__version__} ({runtime}, Python {python})"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="onnx-tts", description="Text-to-speech on ONNX Runtime with a zero-copy KV core."
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parser.add_argument("--version", action="version", version=version_line())
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

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

    info = commands.add_parser("info", help="describe a model: graphs, I/O, KV layout")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    add_engine_flags(info)

    bench = commands.add_parser("bench", help="benchmarks (run from a source checkout)")
    bench.add_argument(
        "suite", choices=_bench_suites() or None, help="a benchmarks/bench_*.py of the checkout"
    )
    bench.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the benchmark")

    # The converter is an offline tool (onnx_tts.tools): its own parser reads the raw
    # arguments, so neither it nor its imports load unless `convert` runs.
    convert = commands.add_parser(
        "convert",
        help="rewrite a model's Concat-KV LM for the in-place KV cache",
        add_help=False,
        prefix_chars="\0",  # pass every argument, --help and flags included, through as is
    )
    convert.add_argument("args", nargs=argparse.REMAINDER)

    from onnx_tts.server.cli import add_parser as add_serve_parser
    from onnx_tts.server.cli import add_wyoming_parser

    add_serve_parser(commands)  # light: the server's heavy imports happen when it runs
    add_wyoming_parser(commands)

    config = commands.add_parser(
        "config", help="every setting: flag, ONNX_TTS_* environment variable, default"
    )
    config.add_argument("--markdown", action="store_true", help="as a Markdown table")

    completion = commands.add_parser(
        "completion",
        help="print a shell completion script",
        description='Print a completion script: eval "$(onnx-tts completion bash)" in '
        "~/.bashrc (or save it as ~/.local/share/bash-completion/completions/onnx-tts); for "
        'zsh, eval "$(onnx-tts completion zsh)" in ~/.zshrc.',
    )
    completion.add_argument("shell", choices=SHELLS)

    cache = commands.add_parser("cache", help="cache statistics and maintenance")
    cache.add_argument("action", choices=("stats", "clear"))
    cache.add_argument("--json", action="store_true")
    cache.add_argument(
        "--tier",
        choices=("reference", "result", "prefix"),
        help="clear only this cache (prefix: memory of each serving process, nothing on disk)",
    )
    add_flags(cache, CacheConfig, exclude=CACHE_SIZE_FIELDS)
    return parser


def _load_engine(args: argparse.Namespace) -> Any:
    from onnx_tts.pipeline import build_engine

    config, caches = engine_configs(args)
    return build_engine(config, caches, family_options=family_options(args))


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
    given = {name: getattr(args, name) for name in STREAM_FLAGS if getattr(args, name) is not None}
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


def _synth_stream(
    args: argparse.Namespace, engine: Any, fmt: str, chunks: Any
) -> tuple[int, float | None]:
    """Write the chunks of engine.stream as they come; (samples, time to first audio)."""
    from onnx_tts.audio import save_audio, wav_header

    channels = engine.channels  # stereo models write stereo
    if args.output == "-":
        sink = RawPcmWriter()
        if fmt == "wav":
            sink.write_bytes(wav_header(engine.sample_rate, None, channels))
        return _write_stream(chunks, sink)
    if fmt == "wav":
        with ProgressiveWavWriter(args.output, engine.sample_rate, channels) as writer:
            return _write_stream(chunks, writer)
    # Compressed formats are encoded whole at the end (the file appears only complete).
    kept: list[np.ndarray] = []
    samples, first = _write_stream(chunks, _Collector(kept))
    audio = np.concatenate(kept) if kept else np.zeros(0, np.float32)
    save_audio(args.output, audio, engine.sample_rate, fmt)
    return samples, first


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
    return kind


def _write_captions(args: argparse.Namespace, kind: str | None, words: Any) -> None:
    if kind is not None:
        from onnx_tts.atomic_files import write_atomically
        from onnx_tts.pipeline.timings import subtitles

        write_atomically(Path(args.captions), subtitles(words or [], kind).encode())


def cmd_synth(args: argparse.Namespace) -> int:
    from onnx_tts.audio import encode_for, encoded_rate

    text = _read_text(args.text)
    fmt = _output_format(args)
    captions = _captions_kind(args)
    to_stdout = args.output == "-"
    window = _stream_options(args)
    started = time.perf_counter()
    engine = _load_engine(args)
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
        samples, first = _synth_stream(args, engine, fmt, chunks)
        duration = samples / engine.sample_rate
        _write_captions(args, captions, chunks.words)
    else:
        audio = engine.synthesize(
            text,
            voice=args.voice,
            seed=args.seed,
            progress=_Progress(enabled=not args.quiet),
            **options,
        )
        if not to_stdout:
            audio.save(args.output, fmt)
        elif fmt == "pcm":
            RawPcmWriter().write(audio.samples)
        else:
            data = encode_for("stdout", audio.samples, audio.sample_rate, fmt)
            RawPcmWriter().write_bytes(data)
        _write_captions(args, captions, audio.words)
        duration, first = audio.duration, None
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


def cmd_info(args: argparse.Namespace) -> int:
    import onnx_tts
    from onnx_tts.session import ort_library_path, ort_version

    engine = _load_engine(args)
    info = engine.info()
    info["onnxruntime"] = {"version": ort_version(), "library": ort_library_path()}
    info["onnx_tts"] = onnx_tts.__version__
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    print(f"model      {info.get('name')} ({info.get('family')})  {info.get('path')}")
    print(f"sample rate {info.get('sample_rate')} Hz   KV mode {info.get('kv_mode')}")
    kv = info.get("kv", {})
    if kv:
        print(
            f"KV layout  {kv.get('layers')} layers x {kv.get('kv_heads')} KV heads x "
            f"{kv.get('head_dim')} dims, {kv.get('dtype')}, attention {kv.get('attention')}, "
            f"capacity {kv.get('capacity')}"
        )
    runtime = info["onnxruntime"]
    print(f"runtime    onnxruntime {runtime['version']} ({runtime['library']})")
    for role, graph in info.get("graphs", {}).items():
        print(f"\n[{role}] {graph['file']}")
        for line in graph["inputs"]:
            print(f"  in   {line}")
        for line in graph["outputs"]:
            print(f"  out  {line}")
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    from onnx_tts.cache.manage import all_cache_stats, clear_caches, format_stats

    caches = from_flags(CacheConfig, args)
    dirs = (caches.cache_dir, caches.result_cache_dir, caches.redis_url)
    # Hit/miss counters live per process; a CLI process only sees the shared tiers' contents.
    if args.action == "clear":
        removed = clear_caches(args.tier, *dirs)
        print(json.dumps(removed) if args.json else f"cleared: {removed}")
        return 0
    stats = all_cache_stats(*dirs)
    if args.json:
        print(json.dumps(stats, indent=2, default=str))
    else:
        scope = {"process": " (held in each serving process's memory: see its /metrics)"}
        print(
            "\n\n".join(
                f"[{name}]{scope.get(s.get('scope'), '')}\n{format_stats(s)}"
                for name, s in stats.items()
            )
        )
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from onnx_tts.config import (
        CacheConfig,
        EngineConfig,
        RayConfig,
        ServerConfig,
        WyomingConfig,
        env_table,
    )

    # A variable both servers read (ONNX_TTS_HEADER_TIMEOUT, ...) is listed once.
    rows = env_table(ServerConfig, EngineConfig, CacheConfig, RayConfig, WyomingConfig)
    if args.markdown:
        print("| variable | flag | default | meaning |\n|---|---|---|---|")
        for variable, flag, default, meaning in rows:
            print(f"| `{variable}` | `{flag}` | {default} | {meaning} |")
        return 0
    for variable, flag, default, meaning in rows:
        print(f"{variable:34} {flag:26} {default:12} {meaning}")
    return 0


def _find_benchmarks() -> Path:
    """benchmarks/ of a source checkout: $ONNX_TTS_REPO, the current directory or its parents."""
    starts = [Path(os.environ["ONNX_TTS_REPO"])] if os.environ.get("ONNX_TTS_REPO") else []
    starts += [Path.cwd(), *Path.cwd().parents, Path(__file__).resolve().parents[1]]
    for start in starts:
        if (start / "benchmarks" / "bench_kv.py").is_file():
            return start
    raise InputError(
        "benchmarks live in the source checkout: run `onnx-tts bench` from the onnx-tts "
        "repository (or set ONNX_TTS_REPO to it)"
    )


def _bench_suites() -> tuple[str, ...]:
    """The benchmarks of the source checkout (none outside one)."""
    try:
        repo = _find_benchmarks()
    except InputError:
        return ()
    return tuple(sorted(path.stem[6:] for path in (repo / "benchmarks").glob("bench_*.py")))


def cmd_bench(args: argparse.Namespace) -> int:
    import importlib

    repo = _find_benchmarks()
    suites = _bench_suites()
    if args.suite not in suites:
        raise InputError(f"unknown benchmark {args.suite!r}; choose one of {', '.join(suites)}")
    sys.path.insert(0, str(repo))
    module = importlib.import_module(f"benchmarks.bench_{args.suite}")
    forwarded = [a for a in args.args if a != "--"]
    return int(module.main(forwarded) or 0)


def cmd_convert(args: argparse.Namespace) -> int:
    from onnx_tts.tools.convert.cli import parse_args, run_convert

    return int(run_convert(parse_args(args.args)) or 0)


def cmd_completion(args: argparse.Namespace) -> int:
    from onnx_tts.completion import script

    sys.stdout.write(script(args.shell, build_parser()))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from onnx_tts.deploy import serve_on_ray
    from onnx_tts.server.cli import run

    return run(args, on_ray=serve_on_ray)


def cmd_wyoming(args: argparse.Namespace) -> int:
    from onnx_tts.server.wyoming import run

    return run(args)


COMMANDS = {
    "synth": cmd_synth,
    "info": cmd_info,
    "cache": cmd_cache,
    "config": cmd_config,
    "bench": cmd_bench,
    "convert": cmd_convert,
    "serve": cmd_serve,
    "completion": cmd_completion,
    "wyoming": cmd_wyoming,
}


# How ONNX Runtime and the C++ library say an allocation failed; never shown raw to a user.
ALLOCATION_FAILURES = ("bad_alloc", "Failed to allocate", "out of memory", "length_error")
OUT_OF_MEMORY_HINT = (
    "out of memory (an allocation failed); close other programs, use fewer --threads or a "
    "shorter text, or raise the process memory limit"
)


def plain_error(error: BaseException) -> str:
    """The one line shown for `error`: allocation failures deep in the runtime become a plain
    out-of-memory message that keeps only our own context (e.g. which graph was loading)."""
    message = " ".join(str(error).split())
    if not isinstance(error, MemoryError) and not any(m in message for m in ALLOCATION_FAILURES):
        return message
    kept = []
    for part in message.split(": "):
        internal = any(m in part for m in ALLOCATION_FAILURES) or "ONNXRuntimeError" in part
        if internal or part.startswith(("Load model from", "Non-zero status code")):
            break
        if part:
            kept.append(part)
    return ": ".join([*kept, OUT_OF_MEMORY_HINT])


def _one_line_warning(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> None:
    print(f"onnx-tts: warning: {message}", file=sys.stderr)


class _WarningLine(logging.Handler):
    """The library logs recoverable trouble (a corrupt cache entry, Redis down); the CLI shows
    each record as one `onnx-tts: warning:` line, like its other warnings."""

    def emit(self, record: logging.LogRecord) -> None:
        message = " ".join(record.getMessage().split())
        print(f"onnx-tts: warning: {message}", file=sys.stderr)  # sys.stderr of the moment


def _log_warnings_as_one_line() -> None:
    logger = logging.getLogger("onnx_tts")
    if not any(isinstance(handler, _WarningLine) for handler in logger.handlers):
        logger.addHandler(_WarningLine(logging.WARNING))
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.WARNING)


def _hold_standard_descriptors() -> None:
    """A process started with stdin, stdout or stderr closed (`>&-`) has a free descriptor 0-2
    that the next file opened would take: audio meant for stdout would land in it. Each one
    is held by /dev/null; Python already set sys.stdin/stdout to None for them, which the
    commands check (one clear line), and errors go to /dev/null rather than to stdout."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            held = os.open(os.devnull, os.O_RDWR)
            if held != fd:
                os.dup2(held, fd)
                os.close(held)
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - for the life of the process


def main(argv: list[str] | None = None) -> int:
    _hold_standard_descriptors()
    parser = build_parser()
    args = parser.parse_args(argv)
    warnings.showwarning = _one_line_warning
    _log_warnings_as_one_line()
    try:
        with termination_as_exception():
            try:
                return COMMANDS[args.command](args)
            except BaseException:
                # A signal (or any failure) may have come while a temp file existed: remove
                # them while further signals are still held off by the handler.
                remove_temp_files()
                raise
    except TerminatedBySignal as stop:
        print(f"onnx-tts: {stop}", file=sys.stderr)
        return stop.exit_code
    except OutputClosedError:
        # The reader of a --stream pipe went away (e.g. `| head`): not an error of ours.
        return 0
    except (OnnxTTSError, MemoryError) as error:
        if args.debug:
            raise
        print(f"onnx-tts: error: {plain_error(error)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("onnx-tts: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())

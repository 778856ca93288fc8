"""`onnx-tts` command line: synth, info, bench, cache."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import wave
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from onnx_tts.errors import InputError, OnnxTTSError, OutputError


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="model directory (default: the bundled reference voice)")
    parser.add_argument("--kv", choices=("copy", "chain", "inplace"), help="KV cache handling")
    parser.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads (0 = all)")
    parser.add_argument("--precision", help="third-party exports: fp32, fp16, q8, q4, q4f16")
    parser.add_argument("--exaggeration", type=float, help="Chatterbox: emotion exaggeration")
    parser.add_argument("--cfg-weight", type=float, help="Chatterbox multilingual: CFG weight")
    parser.add_argument("--max-new-tokens", type=int, help="Chatterbox: speech token limit")
    parser.add_argument("--cache-dir", help="reference cache directory ('none' disables)")
    parser.add_argument("--redis", help="redis://host:port/db for a shared reference cache")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="onnx-tts", description="Text-to-speech on ONNX Runtime with a zero-copy KV core."
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    commands = parser.add_subparsers(dest="command", required=True)

    synth = commands.add_parser("synth", help="synthesize speech from text")
    synth.add_argument("text", help="text to speak, or - to read it from stdin")
    synth.add_argument(
        "-o", "--output", default="out.wav", help="WAV/FLAC/OGG file, or - (raw s16le)"
    )
    synth.add_argument("--voice", help="reference audio to clone (WAV, FLAC, OGG)")
    synth.add_argument("--seed", type=int, help="random seed (same seed -> same audio)")
    synth.add_argument("--temperature", type=float)
    synth.add_argument("--top-k", type=int)
    synth.add_argument("--top-p", type=float)
    synth.add_argument("--repetition-penalty", type=float)
    synth.add_argument("--language", help="language code for multilingual models")
    synth.add_argument("--stream", action="store_true", help="stream audio as it is generated")
    synth.add_argument("--first-chunk-frames", type=int)
    synth.add_argument("--stride-frames", type=int)
    synth.add_argument("--overlap-frames", type=int)
    synth.add_argument("--holdback-frames", type=int)
    synth.add_argument("--crossfade-samples", type=int)
    synth.add_argument("-v", "--verbose", action="store_true", help="timings on stderr")
    _add_model_arguments(synth)

    info = commands.add_parser("info", help="describe a model: graphs, I/O, KV layout")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    _add_model_arguments(info)

    bench = commands.add_parser("bench", help="benchmarks (run from a source checkout)")
    bench.add_argument("suite", choices=("kv", "refcache", "streaming"))
    bench.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the benchmark")

    # The converter is an offline tool (onnx_tts.tools): its own parser reads the raw
    # arguments, so neither it nor its imports load unless `convert` runs.
    convert = commands.add_parser(
        "convert",
        help="rewrite a Concat-KV LM (e.g. Chatterbox) for the in-place KV cache",
        add_help=False,
        prefix_chars="\0",  # pass every argument, --help and flags included, through as is
    )
    convert.add_argument("args", nargs=argparse.REMAINDER)

    cache = commands.add_parser("cache", help="reference cache statistics and maintenance")
    cache.add_argument("action", choices=("stats", "clear"))
    cache.add_argument("--json", action="store_true")
    cache.add_argument("--cache-dir", help="reference cache directory")
    cache.add_argument("--redis", help="redis://host:port/db")
    return parser


def _cache_dir(value: str | None) -> str | None:
    if value is None:
        return "default"
    return None if value.lower() == "none" else value


def _load_engine(args: argparse.Namespace) -> Any:
    import onnx_tts

    names = ("precision", "exaggeration", "cfg_weight", "max_new_tokens")
    family_options = {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
    return onnx_tts.load(
        model=args.model,
        kv=args.kv,
        threads=args.threads,
        cache_dir=_cache_dir(args.cache_dir),
        redis_url=args.redis,
        **family_options,
    )


def _read_text(arg: str) -> str:
    from onnx_tts.frontend import check_text

    if arg == "-":
        return check_text(sys.stdin.buffer.read())
    return check_text(arg)


class _Progress:
    """A one-line progress bar on stderr, only when stderr is a terminal."""

    def __init__(self) -> None:
        self.enabled = sys.stderr.isatty()

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or total < 2:
            return
        width = 30
        filled = int(width * done / total)
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} sentences")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()


class _ProgressiveWav:
    """A WAV file written as chunks arrive, under a temporary name until complete."""

    def __init__(self, path: Path, sample_rate: int) -> None:
        from onnx_tts.audio import check_output_path

        self.path = check_output_path(path)
        if self.path.suffix.lower() != ".wav":
            raise OutputError(f"--stream writes WAV or raw PCM (-o -), not {self.path.suffix}")
        self.tmp = self.path.with_name(f".{self.path.name}.part")
        self.writer = wave.open(str(self.tmp), "wb")  # noqa: SIM115 - closed in finish/abort
        self.writer.setnchannels(1)
        self.writer.setsampwidth(2)
        self.writer.setframerate(sample_rate)

    def write(self, pcm: bytes) -> None:
        self.writer.writeframes(pcm)

    def finish(self) -> None:
        self.writer.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self.writer.close()
        self.tmp.unlink(missing_ok=True)


def _stream_options(args: argparse.Namespace) -> dict[str, Any]:
    names = (
        "first_chunk_frames",
        "stride_frames",
        "overlap_frames",
        "holdback_frames",
        "crossfade_samples",
    )
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def _sampling_options(args: argparse.Namespace) -> dict[str, Any]:
    names = ("temperature", "top_k", "top_p", "repetition_penalty", "language")
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def _write_stream(
    chunks: Iterable[np.ndarray], sink: BinaryIO | _ProgressiveWav
) -> tuple[int, float | None]:
    from onnx_tts.audio import to_pcm16

    start = time.perf_counter()
    first: float | None = None
    samples = 0
    for chunk in chunks:
        if first is None and len(chunk):
            first = time.perf_counter() - start
        sink.write(to_pcm16(chunk))
        if not isinstance(sink, _ProgressiveWav):
            sink.flush()
        samples += len(chunk)
    return samples, first


def cmd_synth(args: argparse.Namespace) -> int:
    from onnx_tts.audio import check_output_path

    text = _read_text(args.text)
    to_stdout = args.output == "-"
    if to_stdout and not args.stream:
        raise InputError("-o - writes raw PCM as it streams; add --stream")
    if not to_stdout:
        check_output_path(args.output)  # fail before any work
    started = time.perf_counter()
    engine = _load_engine(args)
    loaded = time.perf_counter()
    sampling = _sampling_options(args)
    if args.stream:
        chunks = engine.stream(
            text, voice=args.voice, seed=args.seed, **_stream_options(args), **sampling
        )
        if to_stdout:
            samples, first = _write_stream(chunks, sys.stdout.buffer)
        else:
            sink = _ProgressiveWav(Path(args.output), engine.sample_rate)
            try:
                samples, first = _write_stream(chunks, sink)
            except BaseException:
                sink.abort()
                raise
            sink.finish()
        duration = samples / engine.sample_rate
    else:
        audio = engine.synthesize(
            text, voice=args.voice, seed=args.seed, progress=_Progress(), **sampling
        )
        audio.save(args.output)
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
    if not to_stdout:
        print(f"wrote {args.output} ({duration:.2f} s at {engine.sample_rate} Hz)", file=sys.stderr)
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
    from onnx_tts.refcache import ReferenceCache, format_stats

    # Hit/miss counters live per process; a CLI process only sees the shared tiers' contents.
    cache = ReferenceCache(
        memory_bytes=0, disk_dir=_cache_dir(args.cache_dir), redis_url=args.redis
    )
    if args.action == "clear":
        removed = cache.clear()
        print(json.dumps(removed) if args.json else f"cleared: {removed}")
        return 0
    stats = cache.stats()
    print(json.dumps(stats, indent=2, default=str) if args.json else format_stats(stats))
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


def cmd_bench(args: argparse.Namespace) -> int:
    import importlib

    repo = _find_benchmarks()
    sys.path.insert(0, str(repo))
    module = importlib.import_module(f"benchmarks.bench_{args.suite}")
    forwarded = [a for a in args.args if a != "--"]
    return int(module.main(forwarded) or 0)


def cmd_convert(args: argparse.Namespace) -> int:
    from onnx_tts.tools.convert.cli import parse_args, run_convert

    return int(run_convert(parse_args(args.args)) or 0)


COMMANDS = {
    "synth": cmd_synth,
    "info": cmd_info,
    "cache": cmd_cache,
    "bench": cmd_bench,
    "convert": cmd_convert,
}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except OnnxTTSError as error:
        if args.debug:
            raise
        print(f"onnx-tts: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("onnx-tts: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of a --stream pipe went away (e.g. `| head`): not an error of ours.
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    raise SystemExit(main())

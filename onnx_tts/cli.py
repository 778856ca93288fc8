"""`onnx-tts` command line: synth, info, bench, cache, and the offline convert / quantize."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Any, NoReturn

from onnx_tts.atomic_files import remove_temp_files
from onnx_tts.completion import SHELLS
from onnx_tts.config import CacheConfig, add_flags, from_flags
from onnx_tts.errors import InputError, OnnxTTSError, OutputClosedError
from onnx_tts.flags import add_engine_flags, load_engine
from onnx_tts.signals import (
    TerminatedBySignal,
    keep_status_on_late_signals,
    termination_as_exception,
)
from onnx_tts.synth_cli import add_synth_parser, cmd_synth

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

    add_synth_parser(commands)

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
    quantize = commands.add_parser(
        "quantize",
        help="quantize a model's weights (int8 or int4) into a new directory of the same family",
        add_help=False,
        prefix_chars="\0",
    )
    quantize.add_argument("args", nargs=argparse.REMAINDER)
    # Exporters of published PyTorch checkpoints live beside the benchmarks in the source
    # checkout (`export/`, with the `export` extra: torch); their own parser reads the rest.
    export = commands.add_parser(
        "export",
        help="export a published checkpoint into a model directory (source checkout, "
        "`export` extra)",
        add_help=False,
        prefix_chars="\0",
    )
    export.add_argument("args", nargs=argparse.REMAINDER)

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


def cmd_info(args: argparse.Namespace) -> int:
    import onnx_tts
    from onnx_tts.graph_io import read_graph_proto, weights_kind
    from onnx_tts.session import ort_library_path, ort_version

    engine = load_engine(args)
    info = engine.info()
    for role, session in engine.model.graphs.sessions.items():  # each graph's weights kind
        if role in info.get("graphs", {}):
            info["graphs"][role]["weights"] = weights_kind(read_graph_proto(session.path))
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
        print(f"\n[{role}] {graph['file']}  weights {graph.get('weights', '?')}")
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


def _find_checkout(marker: str = "benchmarks/bench_kv.py", command: str = "bench") -> Path:
    """The source checkout holding `marker`: $ONNX_TTS_REPO, the current directory or its
    parents, or the one this package was installed from (editable)."""
    starts = [Path(os.environ["ONNX_TTS_REPO"])] if os.environ.get("ONNX_TTS_REPO") else []
    try:
        here = Path.cwd()
        starts += [here, *here.parents]
    except OSError:  # started in a deleted directory: the other places still count
        pass
    starts.append(Path(__file__).resolve().parents[1])
    for start in starts:
        if (start / marker).is_file():
            return start
    raise InputError(
        f"`onnx-tts {command}` runs from the onnx-tts source checkout: run it there (or set "
        "ONNX_TTS_REPO to it)"
    )


def _bench_suites() -> tuple[str, ...]:
    """The benchmarks of the source checkout (none outside one)."""
    try:
        repo = _find_checkout()
    except InputError:
        return ()
    return tuple(sorted(path.stem[6:] for path in (repo / "benchmarks").glob("bench_*.py")))


def cmd_bench(args: argparse.Namespace) -> int:
    import importlib

    repo = _find_checkout()
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


def cmd_quantize(args: argparse.Namespace) -> int:
    from onnx_tts.tools.quantize.cli import parse_args, run_quantize

    return int(run_quantize(parse_args(args.args)) or 0)


def cmd_export(args: argparse.Namespace) -> int:
    repo = _find_checkout("export/cli.py", "export")
    sys.path.insert(0, str(repo))
    from export.cli import main as export_main  # the checkout's exporters (needs torch)

    return int(export_main(args.args) or 0)


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
    "quantize": cmd_quantize,
    "export": cmd_export,
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
    status = _run(args)
    if argv is None:  # the process's entry point: a signal while it ends keeps the status
        keep_status_on_late_signals(status)
    return status


def _run(args: argparse.Namespace) -> int:
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
        if stop.completed:  # the outputs were already in place: the work is done
            print(f"onnx-tts: {stop} after the output was written", file=sys.stderr)
            return 0
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

"""`onnx-tts serve`: arguments and the uvicorn process (graceful drain on SIGTERM)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from typing import Any

from onnx_tts.cli import add_cache_arguments, cache_load_options
from onnx_tts.pipeline import DEFAULT_MAX_BATCH
from onnx_tts.server.timeouts import Timeouts

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8880


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"bind address ({DEFAULT_HOST})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port ({DEFAULT_PORT})")
    parser.add_argument(
        "--model",
        action="append",
        dest="models",
        metavar="DIR",
        help="model directory; repeat to serve several (the first is the default; "
        "default: the bundled voice)",
    )
    parser.add_argument("--workers", type=int, default=16, help="requests generating at once (16)")
    parser.add_argument(
        "--compute-slots",
        type=int,
        default=os.cpu_count() or 1,
        help="engine calls at once, earliest playback deadline first (default: CPU count)",
    )
    parser.add_argument(
        "--max-queue", type=int, default=64, help="requests waiting for a worker before 429 (64)"
    )
    parser.add_argument(
        "--max-batch",
        type=int,
        default=DEFAULT_MAX_BATCH,
        help=f"requests decoded as rows of one LM step ({DEFAULT_MAX_BATCH}; 1 = each alone)",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("ONNX_TTS_API_KEY"),
        help="require 'Authorization: Bearer KEY' on /v1 and /metrics (or $ONNX_TTS_API_KEY)",
    )
    add_cache_arguments(parser)
    parser.add_argument("--voices-dir", help="where uploaded voices are kept")
    parser.add_argument(
        "--max-upload-bytes", type=int, default=10 << 20, help="voice upload limit (10 MiB)"
    )
    parser.add_argument("--kv", choices=("copy", "chain", "inplace"), help="KV cache handling")
    parser.add_argument(
        "--threads", type=int, default=1, help="ONNX Runtime threads per session (1; 0 = all)"
    )
    parser.add_argument(
        "--drain-seconds",
        type=float,
        default=30.0,
        help="on SIGTERM, wait this long for in-flight requests (30)",
    )
    parser.add_argument(
        "--header-timeout",
        type=float,
        default=Timeouts.header,
        help=f"seconds a client has to send a request's headers ({Timeouts.header:g})",
    )
    parser.add_argument(
        "--body-timeout",
        type=float,
        default=Timeouts.body,
        help=f"seconds for a whole request body ({Timeouts.body:g}; "
        f"{Timeouts.body_idle:g} at most between its chunks)",
    )
    parser.add_argument(
        "--keep-alive",
        type=float,
        default=Timeouts.keep_alive,
        help=f"seconds an idle connection stays open between requests ({Timeouts.keep_alive:g})",
    )
    add_logging_arguments(parser)
    return parser


def add_logging_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-level", default="info", choices=("debug", "info", "warning", "error")
    )
    parser.add_argument(
        "--log-json", action="store_true", help="log one JSON object per line (for collectors)"
    )


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `serve` on the main CLI's subparsers."""
    parser = subparsers.add_parser("serve", help="OpenAI-compatible speech server (HTTP)")
    return add_arguments(parser)


WYOMING_URI = "tcp://127.0.0.1:10200"


def add_wyoming_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """`onnx-tts wyoming` (onnx_tts.server.wyoming): Home Assistant's protocol."""
    parser.add_argument(
        "--uri", default=WYOMING_URI, help=f"where to listen: tcp://HOST:PORT ({WYOMING_URI})"
    )
    parser.add_argument("--model", metavar="DIR", help="model directory (default: bundled voice)")
    parser.add_argument("--voices-dir", help="uploaded voices (the HTTP server's, by default)")
    parser.add_argument("--workers", type=int, default=4, help="texts generating at once (4)")
    parser.add_argument("--kv", choices=("copy", "chain", "inplace"), help="KV cache handling")
    parser.add_argument(
        "--threads", type=int, default=1, help="ONNX Runtime threads per session (1; 0 = all)"
    )
    add_cache_arguments(parser)
    add_logging_arguments(parser)
    return parser


def add_wyoming_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `wyoming` on the main CLI's subparsers."""
    parser = subparsers.add_parser(
        "wyoming", help="Wyoming protocol server (Home Assistant voice services)"
    )
    return add_wyoming_arguments(parser)


def _check(args: argparse.Namespace) -> str | None:
    checks = [
        (1 <= args.port <= 65535, "--port must be 1-65535"),
        (1 <= args.workers <= 256, "--workers must be 1-256"),
        (1 <= args.compute_slots <= 256, "--compute-slots must be 1-256"),
        (0 <= args.max_queue <= 100_000, "--max-queue must be 0-100000"),
        (1 <= args.max_batch <= 256, "--max-batch must be 1-256"),
        (args.max_upload_bytes >= 1024, "--max-upload-bytes must be at least 1024"),
        (args.threads >= 0, "--threads must be >= 0"),
        (args.drain_seconds >= 0, "--drain-seconds must be >= 0"),
        (0 < args.header_timeout <= 3600, "--header-timeout must be in (0, 3600]"),
        (0 < args.body_timeout <= 3600, "--body-timeout must be in (0, 3600]"),
        (0 < args.keep_alive <= 3600, "--keep-alive must be in (0, 3600]"),
        (args.api_key is None or args.api_key.strip() != "", "--api-key must not be empty"),
    ]
    return next((message for ok, message in checks if not ok), None)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; returns the exit status (2 for bad arguments or models)."""
    problem = _check(args)
    if problem:
        print(f"onnx-tts serve: {problem}", file=sys.stderr)
        return 2
    import uvicorn

    from onnx_tts.server.app import ServerConfig, create_app
    from onnx_tts.server.engines import ModelRegistry
    from onnx_tts.server.protocol import protocol_with

    configure_logging(args.log_level, args.log_json)
    try:
        sock = listen(args.host, args.port)
    except OSError as error:
        print(f"onnx-tts serve: cannot listen on {args.host}:{args.port}: {error}", file=sys.stderr)
        return 2
    timeouts = Timeouts(
        header=args.header_timeout,
        body_idle=min(Timeouts.body_idle, args.body_timeout),
        body=args.body_timeout,
        keep_alive=args.keep_alive,
    )
    config = ServerConfig(
        models=list(args.models or [None]),
        workers=args.workers,
        compute_slots=args.compute_slots,
        max_queue=args.max_queue,
        max_batch=args.max_batch,
        api_key=args.api_key,
        voices_dir=args.voices_dir,
        max_upload_bytes=args.max_upload_bytes,
        load_options={
            "kv": args.kv,
            "threads": args.threads,
            "max_batch": args.max_batch,
            **cache_load_options(args),
        },
        timeouts=timeouts,
    )
    registry = ModelRegistry(config.models, config.load_options)
    app = create_app(config, registry)
    state = app.state.server

    class DrainingServer(uvicorn.Server):
        """First SIGTERM/SIGINT: stop accepting, finish in-flight requests (/health says
        draining), exit 0. A second one during the drain: stop every generation and exit."""

        forced = False

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.should_exit:
                # Not uvicorn's force_exit, which abandons tasks mid-flight (tracebacks at
                # exit): the generations stop and their responses end, so the drain that is
                # under way finishes at once and the shutdown stays clean.
                self.forced = True
                stopped = state.cancel_all()
                logging.getLogger("onnx_tts.server").info(
                    "second signal: stopping %d generation(s) now", stopped
                )
                return
            state.draining = True
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # uvicorn re-raises the signal after a drain (exit 143); a clean drain is exit 0.
            previous = {s: signal.signal(s, self.handle_exit) for s in _STOP_SIGNALS}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    server = DrainingServer(
        uvicorn.Config(
            app,
            http=protocol_with(timeouts.header),
            log_config=None,  # our handlers (configure_logging) format uvicorn's records too
            log_level=args.log_level,
            access_log=False,  # the app logs one line per request itself
            timeout_keep_alive=max(1, round(timeouts.keep_alive)),
            timeout_graceful_shutdown=args.drain_seconds or None,
        )
    )

    def stop_if_load_fails() -> None:
        registry.ready.wait()
        if registry.error is not None:
            server.should_exit = True

    threading.Thread(target=stop_if_load_fails, daemon=True).start()
    logging.getLogger("onnx_tts.server").info("listening on http://%s:%d", *sock.getsockname()[:2])
    server.run(sockets=[sock])
    if registry.error is not None:
        print(f"onnx-tts serve: cannot load the model: {registry.error}", file=sys.stderr)
        return 2
    if server.forced:
        print("onnx-tts serve: stopped by a second signal before the drain ended", file=sys.stderr)
        return 1
    return 0


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (OSError with the system's reason if it cannot be)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
        sock.set_inheritable(True)
    except OSError:
        sock.close()
        raise
    return sock


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, and the record's own fields
    (a synthesis line carries model, voice, characters, audio seconds, ...)."""

    _STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in self._STANDARD and not key.startswith("_") and key != "color_message":
                entry[key] = value
        if record.exc_info and record.exc_info[0] is not None:
            entry["error"] = one_line_error(record.exc_info[1])
        return json.dumps(entry, default=str)


def one_line_error(error: BaseException | None) -> str:
    return f"{type(error).__name__}: {' '.join(str(error).split())}"


class _ExpectedFailures(logging.Filter):
    """A stream aborted after its first byte was already logged in one line by the app;
    uvicorn's 'Exception in ASGI application' for it would add a traceback. Keep one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        from onnx_tts.server.app import StreamAborted

        return not (record.exc_info and isinstance(record.exc_info[1], StreamAborted))


def configure_logging(level: str, as_json: bool) -> None:
    """Root handler for the server's and uvicorn's loggers: text lines or JSON lines."""
    handler = logging.StreamHandler()
    if as_json:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(_ExpectedFailures())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    # The CLI's one-line warning handler would print every server warning twice.
    logging.getLogger("onnx_tts").handlers.clear()
    logging.getLogger("onnx_tts").setLevel(logging.NOTSET)


def main(argv: list[str] | None = None) -> int:
    parser = add_arguments(
        argparse.ArgumentParser(
            prog="onnx-tts serve", description="OpenAI-compatible speech server on onnx-tts"
        )
    )
    return run(parser.parse_args(argv))

"""`onnx-tts serve` and `onnx-tts wyoming`: their settings (from the typed configuration),
the uvicorn process (graceful drain on SIGTERM, exit 0) and logging (text or JSON lines)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from onnx_tts.config import (
    WyomingConfig,
    add_flags,
)
from onnx_tts.errors import InputError, OnnxTTSError
from onnx_tts.flags import add_engine_flags, add_folder_flags
from onnx_tts.server.settings import ServeSettings, add_arguments, serve_settings
from onnx_tts.signals import handled_signals


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `serve` on the main CLI's subparsers."""
    parser = subparsers.add_parser("serve", help="OpenAI-compatible speech server (HTTP)")
    return add_arguments(parser)


def add_wyoming_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """`onnx-tts wyoming` (onnx_tts.server.wyoming): Home Assistant's protocol."""
    add_flags(parser.add_argument_group("wyoming"), WyomingConfig)
    add_engine_flags(parser)
    add_folder_flags(parser)
    return parser


def add_wyoming_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `wyoming` on the main CLI's subparsers."""
    parser = subparsers.add_parser(
        "wyoming", help="Wyoming protocol server (Home Assistant voice services)"
    )
    return add_wyoming_arguments(parser)


def run(args: argparse.Namespace, on_ray: Callable[[ServeSettings], int] | None = None) -> int:
    """Serve until SIGINT/SIGTERM; returns the exit status (2 for bad arguments or models).
    With --ray the settings go to `on_ray` (the CLI passes the Ray Serve runner: the server
    knows nothing of where it is deployed)."""
    try:
        settings = serve_settings(args)
    except InputError as error:
        print(f"onnx-tts serve: {error}", file=sys.stderr)
        return 2
    config = settings.server
    configure_logging(config.log_level, config.log_json)
    if settings.ray.ray:
        if on_ray is None:
            print("onnx-tts serve: --ray runs through `onnx-tts serve --ray`", file=sys.stderr)
            return 2
        return on_ray(settings)
    import uvicorn

    from onnx_tts.server.app import create_app
    from onnx_tts.server.engines import ModelRegistry
    from onnx_tts.server.protocol import protocol_with

    try:
        sock = listen(config.host, config.port)
    except OSError as error:
        print(
            f"onnx-tts serve: cannot listen on {config.host}:{config.port}: {error}",
            file=sys.stderr,
        )
        return 2
    registry = ModelRegistry(
        config.models or [None],
        settings.engine,
        settings.caches,
        settings.family,
        max_streams=config.max_streams,
        max_waiting=config.max_queue,
        folders=settings.folders,
    )
    try:
        app = create_app(config, registry)  # opens the voice store: a bad --voices-dir is here
    except OnnxTTSError as error:
        sock.close()
        print(f"onnx-tts serve: {error}", file=sys.stderr)
        return 2
    state = app.state.server

    class DrainingServer(uvicorn.Server):
        """First SIGTERM/SIGINT: stop accepting, finish in-flight requests (/health says
        draining), exit 0. A second one during the drain: stop every generation and exit."""

        forced = False

        def handle_exit(self, sig: int, frame: Any) -> None:
            if not self.should_exit:
                logging.getLogger("onnx_tts.server").info(
                    "%s: finishing the requests in flight, then stopping", _signal_name(sig)
                )
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
            # Every terminating signal drains as SIGTERM does (SIGHUP of a closed terminal,
            # SIGQUIT, ...), but one the server was started with ignored (nohup).
            previous = {s: signal.signal(s, self.handle_exit) for s in handled_signals()}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    server = DrainingServer(
        uvicorn.Config(
            app,
            http=protocol_with(config.header_timeout),
            log_config=None,  # our handlers (configure_logging) format uvicorn's records too
            log_level=config.log_level,
            access_log=False,  # the app logs one line per request itself
            timeout_keep_alive=max(1, round(config.keep_alive)),
            timeout_graceful_shutdown=config.drain_seconds or None,
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


def _signal_name(signum: int) -> str:
    from onnx_tts.signals import TerminatedBySignal

    return TerminatedBySignal(signum).name


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
        from onnx_tts.server.speech import StreamAborted

        return not (record.exc_info and isinstance(record.exc_info[1], StreamAborted))


def configure_logging(level: str, as_json: bool) -> None:
    """Root handler for the server's and uvicorn's loggers: text lines or JSON lines."""
    from onnx_tts.server.protocol import QuietInvalidRequests

    handler = logging.StreamHandler()
    if as_json:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(_ExpectedFailures())
    handler.addFilter(QuietInvalidRequests())
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

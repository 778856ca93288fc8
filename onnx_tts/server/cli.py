"""`onnx-tts serve`: arguments and the uvicorn process (graceful drain on SIGTERM)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from onnx_tts.cli import add_cache_arguments, cache_load_options
from onnx_tts.deploy.options import add_ray_arguments
from onnx_tts.pipeline import DEFAULT_MAX_BATCH

if TYPE_CHECKING:
    from onnx_tts.server.app import ServerConfig

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
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning"))
    add_ray_arguments(parser)
    return parser


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `serve` on the main CLI's subparsers."""
    parser = subparsers.add_parser("serve", help="OpenAI-compatible speech server (HTTP)")
    return add_arguments(parser)


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
        (args.api_key is None or args.api_key.strip() != "", "--api-key must not be empty"),
    ]
    return next((message for ok, message in checks if not ok), None)


def server_config(args: argparse.Namespace) -> ServerConfig:
    """The app's configuration from `serve`'s parsed flags (also the Ray replicas')."""
    from onnx_tts.server.app import ServerConfig

    return ServerConfig(
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
    )


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; returns the exit status (2 for bad arguments or models)."""
    problem = _check(args)
    if problem:
        print(f"onnx-tts serve: {problem}", file=sys.stderr)
        return 2
    import uvicorn

    from onnx_tts.server.app import create_app
    from onnx_tts.server.engines import ModelRegistry

    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    config = server_config(args)
    if args.ray:
        from onnx_tts.deploy import serve_on_ray

        return serve_on_ray(args, config)
    registry = ModelRegistry(config.models, config.load_options)
    app = create_app(config, registry)
    state = app.state.server

    class DrainingServer(uvicorn.Server):
        # uvicorn stops accepting and waits for in-flight requests; /health says so meanwhile.
        def handle_exit(self, sig: int, frame: Any) -> None:
            state.draining = True
            super().handle_exit(sig, frame)

    server = DrainingServer(
        uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            access_log=False,  # the app logs one line per request itself
            timeout_graceful_shutdown=args.drain_seconds or None,
        )
    )

    def stop_if_load_fails() -> None:
        registry.ready.wait()
        if registry.error is not None:
            server.should_exit = True

    threading.Thread(target=stop_if_load_fails, daemon=True).start()
    server.run()
    if registry.error is not None:
        print(f"onnx-tts serve: cannot load the model: {registry.error}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = add_arguments(
        argparse.ArgumentParser(
            prog="onnx-tts serve", description="OpenAI-compatible speech server on onnx-tts"
        )
    )
    return run(parser.parse_args(argv))

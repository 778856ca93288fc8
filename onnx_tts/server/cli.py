"""`onnx-tts serve`: arguments and the uvicorn process (graceful drain on SIGTERM)."""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from onnx_tts.config import (
    CacheConfig,
    EngineConfig,
    RayConfig,
    ServerConfig,
    add_flags,
    from_flags,
)
from onnx_tts.errors import InputError
from onnx_tts.flags import add_engine_flags, engine_configs, family_options


@dataclass(frozen=True)
class ServeSettings:
    """Everything `serve` was told: the server's, the engine's, the caches' and Ray's
    settings (each checked against its config class) and the family options."""

    server: ServerConfig
    engine: EngineConfig
    caches: CacheConfig
    ray: RayConfig
    family: dict[str, Any] = field(default_factory=dict)


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """serve's flags: the server's, the engine's (but --model, which serve repeats), the
    caches' and Ray's, all from the typed configuration (`onnx_tts.config`)."""
    add_flags(parser.add_argument_group("server"), ServerConfig)
    add_engine_flags(parser, exclude=("model",))
    add_flags(
        parser.add_argument_group(
            "Ray Serve (--ray)",
            "replicas of the same server on a Ray cluster, behind Serve's proxy",
        ),
        RayConfig,
    )
    return parser


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `serve` on the main CLI's subparsers."""
    parser = subparsers.add_parser("serve", help="OpenAI-compatible speech server (HTTP)")
    return add_arguments(parser)


def serve_settings(args: argparse.Namespace) -> ServeSettings:
    """The checked settings of `serve`'s parsed flags (then ONNX_TTS_*, then defaults); also
    what every Ray replica is built from. InputError names the first bad flag."""
    from onnx_tts.deploy.options import check_ray

    engine, caches = engine_configs(args)
    ray = check_ray(from_flags(RayConfig, args))
    return ServeSettings(from_flags(ServerConfig, args), engine, caches, ray, family_options(args))


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; returns the exit status (2 for bad arguments or models)."""
    try:
        settings = serve_settings(args)
    except InputError as error:
        print(f"onnx-tts serve: {error}", file=sys.stderr)
        return 2
    server_config = settings.server
    logging.basicConfig(
        level=getattr(logging, server_config.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if settings.ray.ray:
        from onnx_tts.deploy import serve_on_ray

        return serve_on_ray(settings)
    import uvicorn

    from onnx_tts.server.app import create_app
    from onnx_tts.server.engines import ModelRegistry

    registry = ModelRegistry(
        server_config.models or [None], settings.engine, settings.caches, settings.family
    )
    app = create_app(server_config, registry)
    state = app.state.server

    class DrainingServer(uvicorn.Server):
        # uvicorn stops accepting and waits for in-flight requests; /health says so meanwhile.
        def handle_exit(self, sig: int, frame: Any) -> None:
            state.draining = True
            super().handle_exit(sig, frame)

    server = DrainingServer(
        uvicorn.Config(
            app,
            host=server_config.host,
            port=server_config.port,
            log_level=server_config.log_level,
            access_log=False,  # the app logs one line per request itself
            timeout_graceful_shutdown=server_config.drain_seconds or None,
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

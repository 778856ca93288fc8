"""What `onnx-tts serve` is told: its flags (from the typed configuration) and the checked
settings they give, for the single process and for every Ray replica alike."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from onnx_tts.config import (
    CacheConfig,
    EngineConfig,
    RayConfig,
    ServerConfig,
    add_flags,
    check_ray,
    from_flags,
)
from onnx_tts.flags import (
    add_engine_flags,
    add_folder_flags,
    engine_configs,
    family_options,
    folder_options,
)


@dataclass(frozen=True)
class ServeSettings:
    """Everything `serve` was told: the server's, the engine's, the caches' and Ray's
    settings (each checked against its config class) and the family options."""

    server: ServerConfig
    engine: EngineConfig
    caches: CacheConfig
    ray: RayConfig
    family: dict[str, Any] = field(default_factory=dict)
    folders: dict[str, str] = field(default_factory=dict)  # folder flag -> its directory


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """serve's flags: the server's, the engine's (but --model, which serve repeats), the
    caches' and Ray's, all from the typed configuration (`onnx_tts.config`)."""
    add_flags(parser.add_argument_group("server"), ServerConfig)
    add_engine_flags(parser, exclude=("model",))
    add_folder_flags(parser)
    add_flags(
        parser.add_argument_group(
            "Ray Serve (--ray)",
            "replicas of the same server on a Ray cluster, behind Serve's proxy",
        ),
        RayConfig,
    )
    return parser


def serve_settings(args: argparse.Namespace) -> ServeSettings:
    """The checked settings of `serve`'s parsed flags (then ONNX_TTS_*, then defaults); also
    what every Ray replica is built from. InputError names the first bad flag."""
    engine, caches = engine_configs(args)
    ray = check_ray(from_flags(RayConfig, args))
    return ServeSettings(
        from_flags(ServerConfig, args),
        engine,
        caches,
        ray,
        family_options(args),
        folder_options(args),
    )

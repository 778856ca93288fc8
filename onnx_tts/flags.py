"""Command-line flags of the commands that load models, made from the typed configuration
(`onnx_tts.config`) and the family registry, shared by `onnx-tts synth|info` and `serve`."""

from __future__ import annotations

import argparse
from typing import Any

from onnx_tts.config import CacheConfig, EngineConfig, add_flags, from_flags


def add_engine_flags(parser: argparse.ArgumentParser, exclude: tuple[str, ...] = ()) -> None:
    """The engine's and the caches' flags, then one flag per family option."""
    from onnx_tts.families import FAMILIES, all_options

    add_flags(parser.add_argument_group("engine"), EngineConfig, exclude)
    add_flags(parser.add_argument_group("caches"), CacheConfig)
    family_flags = parser.add_argument_group(
        "model family options", "refused (exit 2) by a model whose family does not take them"
    )
    for option in all_options().values():
        takers = ", ".join(name for name, f in FAMILIES.items() if f.option(option.name))
        extra = f" [{takers}]"
        if option.kind is bool:  # --x sets it, --no-x clears it (a default of true too)
            family_flags.add_argument(
                option.flag,
                dest=option.name,
                action=argparse.BooleanOptionalAction,
                help=option.help + extra,
            )
        else:
            family_flags.add_argument(
                option.flag,
                dest=option.name,
                type=option.kind,
                choices=option.choices or None,
                help=option.help + extra,
            )


def add_folder_flags(parser: argparse.ArgumentParser) -> None:
    """The servers' flags for the folders of models families declare (`Family.folder`):
    `--NAME DIR`, each voice of the folder a model of its own, loaded when first asked for."""
    from onnx_tts.families import FAMILIES

    group = parser.add_argument_group("model folders")
    for family in FAMILIES.values():
        if family.folder is not None:
            env = "ONNX_TTS_" + family.folder.option.upper()
            group.add_argument(
                family.folder.flag,
                dest=family.folder.option,
                metavar="DIR",
                help=f"{family.folder.help} (env {env})",
            )


def folder_options(args: argparse.Namespace) -> dict[str, str]:
    """Folder flag -> directory, from the command line, then `ONNX_TTS_<FLAG>`."""
    import os

    from onnx_tts.families import FAMILIES

    folders = {}
    for family in FAMILIES.values():
        if family.folder is not None:
            option = family.folder.option
            value = getattr(args, option, None) or os.environ.get("ONNX_TTS_" + option.upper())
            if value:
                folders[option] = value
    return folders


def engine_configs(args: argparse.Namespace, **overrides: Any) -> tuple[EngineConfig, CacheConfig]:
    """The checked configs the flags (then `ONNX_TTS_*`, then defaults) give."""
    return from_flags(EngineConfig, args, **overrides), from_flags(CacheConfig, args)


def family_options(args: argparse.Namespace) -> dict[str, Any]:
    """The family flags given on the command line (the model's family checks them)."""
    from onnx_tts.families import all_options

    return {
        name: getattr(args, name) for name in all_options() if getattr(args, name, None) is not None
    }


def load_engine(args: argparse.Namespace) -> Any:
    """The engine the parsed engine flags describe (`synth`, `info`)."""
    from onnx_tts.pipeline import build_engine

    config, caches = engine_configs(args)
    return build_engine(config, caches, family_options=family_options(args))


__all__ = [
    "add_engine_flags",
    "add_folder_flags",
    "engine_configs",
    "family_options",
    "folder_options",
    "load_engine",
]

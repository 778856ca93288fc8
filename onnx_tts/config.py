"""Typed configuration: one dataclass per component, each field with its default and bounds once.

`onnx_tts.load()` keywords, the CLI and server flags and the `ONNX_TTS_*` environment variables
all come from (or are checked against) these classes, so a default or a bound is written in
one place and means the same everywhere:

    flag value  >  ONNX_TTS_<FIELD> environment variable  >  the field's default

A field's `Setting` says how it is shown: its help, bounds or choices, the unit of its flag
(`--result-cache-mb` is MiB, the field bytes), its flag name if not `--field-name`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from onnx_tts.errors import InputError

ENV_PREFIX = "ONNX_TTS_"
MIB = 1 << 20
# Bound on ONNX Runtime threads: far above what helps on any machine, far below what exhausts
# memory (each thread has its own stack and scratch buffers).
MAX_THREADS = max(64, 4 * (os.cpu_count() or 1))
MAX_CACHE_MEMORY_BYTES = 1 << 40
MAX_CACHE_DISK_BYTES = 1 << 44
MAX_REDIS_TTL_SECONDS = 10 * 365 * 24 * 3600
MAX_BATCH_LIMIT = 256


@dataclass(frozen=True)
class Setting:
    """How a config field is checked and shown as a flag and an environment variable."""

    help: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    unit: int = 1  # flag/env value x unit = field value (e.g. MiB flags of byte fields)
    flag: str | None = None  # default: --name-with-dashes (without a unit suffix)
    env: bool = True
    metavar: str | None = None
    repeat: bool = False  # a list field given by repeating its flag
    units: str = ""  # shown after bounds in messages ("seconds"); MiB fields say "MiB"

    @property
    def unit_name(self) -> str:
        return self.units or ("MiB" if self.unit == MIB else "")


def setting(default: Any, help: str, **options: Any) -> Any:
    """A dataclass field with its Setting (and a default factory for lists)."""
    meta = {"setting": Setting(help, **options)}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


# -- the components ------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineConfig:
    """What `onnx_tts.load()` loads and how it runs."""

    model: str | None = setting(None, "model directory (default: the bundled trained voice)")
    kv: str | None = setting(
        None, "KV cache handling (default: the model's own)", choices=("copy", "chain", "inplace")
    )
    threads: int = setting(
        0,
        "ONNX Runtime intra-op threads per session (0 = chosen for the cores: the decode and "
        "vocoder stages together do not oversubscribe them)",
        low=0,
        high=MAX_THREADS,
    )
    # 16: a row that waits (its listener has audio ahead) holds only its KV; at 8, 16 server
    # clients waited for rows (`bench serve`: time to first audio p95 0.2-0.6 s against 0.1 s).
    max_batch: int = setting(
        16,
        "requests decoded as rows of one LM step (1 = each request alone)",
        low=1,
        high=MAX_BATCH_LIMIT,
    )
    slot_bytes: int = setting(
        2 << 30,
        "memory budget of the batched KV slot buffers, MiB (they grow on demand up to it)",
        low=MIB,
        high=MAX_CACHE_MEMORY_BYTES,
        unit=MIB,
        flag="--slot-mb",
    )
    max_waiting: int = setting(
        1024,
        "requests waiting for a decode row before new ones are refused",
        low=0,
        high=1 << 20,
    )
    lookahead: bool = setting(
        False,
        "decode lookahead: hand a step's frames to the vocoder while the next step's LM run "
        "goes on in a helper thread",
    )
    policy: str = setting(
        "deadline",
        "scheduling policy: deadline (most urgent first, listeners about to run dry before "
        "those with audio buffered) or fifo (first come first served)",
        choices=("deadline", "fifo"),
    )
    prefill: str = setting(
        "apart",
        "how a new request's prompt runs: apart (on a prefill worker, beside the decode step: "
        "rows already streaming keep their cadence), chunked (a chunk per round, between "
        "steps) or inline (the whole prompt in the round, before the step)",
        choices=("apart", "chunked", "inline"),
    )


@dataclass(frozen=True)
class CacheConfig:
    """The reference (voice), result and voice-prefix caches and their tiers."""

    cache_dir: str | None = setting(
        "default", "reference cache directory ('none' disables the disk tier)", metavar="DIR"
    )
    cache_memory_bytes: int = setting(
        256 * MIB,
        "memory tier of the reference cache, MiB",
        low=0,
        high=MAX_CACHE_MEMORY_BYTES,
        unit=MIB,
        flag="--cache-memory-mb",
    )
    cache_disk_bytes: int = setting(
        1 << 30,
        "bound of the reference cache's disk tier, MiB",
        low=1,
        high=MAX_CACHE_DISK_BYTES,
        unit=MIB,
        flag="--cache-disk-mb",
    )
    redis_url: str | None = setting(
        None,
        "redis://host:port/db shared by the reference and result caches (replicas)",
        flag="--redis",
        metavar="URL",
    )
    redis_ttl_seconds: int | None = setting(
        None,
        "seconds before Redis entries expire (default: kept until Redis evicts them)",
        low=1,
        high=MAX_REDIS_TTL_SECONDS,
        flag="--redis-ttl",
        units="seconds",
    )
    result_cache_bytes: int | None = setting(
        None,
        "result cache (finished audio of greedy/seeded requests) in memory, MiB (0 = disk/Redis "
        "tiers only; default: off, or 64 when --result-cache-dir is given)",
        low=0,
        high=MAX_CACHE_MEMORY_BYTES,
        unit=MIB,
        flag="--result-cache-mb",
    )
    result_cache_dir: str | None = setting(
        "default",
        "result cache directory ('none' disables; giving one turns the result cache on)",
        metavar="DIR",
    )
    result_cache_disk_bytes: int = setting(
        4 << 30,
        "bound of the result cache's disk tier, MiB",
        low=1,
        high=MAX_CACHE_DISK_BYTES,
        unit=MIB,
        flag="--result-cache-disk-mb",
    )
    cache_secret: str | None = setting(
        None,
        "sign disk and Redis cache entries with this secret (HMAC-SHA256 over key and value, "
        "16-4096 bytes) and refuse unsigned or mis-signed ones (shared tiers others can write)",
        metavar="SECRET",
    )
    prefix_cache_bytes: int = setting(
        256 * MIB,
        "voice-prefix KV cache per model, MiB in memory (0 = off)",
        low=0,
        high=MAX_CACHE_MEMORY_BYTES,
        unit=MIB,
        flag="--prefix-cache-mb",
    )


# The result cache's memory budget when only its directory is given.
DEFAULT_RESULT_MEMORY_BYTES = 64 * MIB


LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class ServerConfig:
    """`onnx-tts serve`: the HTTP server around one or more engines."""

    host: str = setting("127.0.0.1", "bind address")
    port: int = setting(8880, "port", low=1, high=65535)
    models: list[str] = setting(
        [],
        "model directory; repeat to serve several (the first is the default, also reachable "
        "as tts-1; default: the bundled voice)",
        flag="--model",
        metavar="DIR",
        repeat=True,
    )
    max_streams: int = setting(
        64,
        "requests generating at once at most (fewer when the cores cannot keep that many "
        "listeners playing in real time: admission measures it)",
        low=1,
        high=4096,
    )
    max_queue: int = setting(
        64, "requests waiting to start before new ones get 429", low=0, high=100_000
    )
    queue_timeout: float = setting(
        5.0,
        "seconds a request may wait to start before it gets 429 with Retry-After",
        low=0,
        high=600,
        units="seconds",
    )
    api_key: str | None = setting(
        None, "require 'Authorization: Bearer KEY' on /v1 and /metrics", metavar="KEY"
    )
    voices_dir: str | None = setting(None, "where uploaded voices are kept", metavar="DIR")
    max_upload_bytes: int = setting(10 * MIB, "voice upload limit, bytes", low=1024, high=1 << 30)
    drain_seconds: float = setting(
        30.0, "on SIGTERM, wait this long for in-flight requests", low=0, high=3600, units="seconds"
    )
    # Connection limits, so no client holds a connection by sending slowly: a real client sends
    # its headers in one packet (10 s leaves room for a slow mobile link and bounds slowloris);
    # a 10 MiB voice upload at 1 Mbit/s takes 84 s; 5 s idle keep-alive is uvicorn's default.
    header_timeout: float = setting(
        10.0, "seconds a client has to send a request's headers", low=0.1, high=3600
    )
    body_timeout: float = setting(
        120.0, "seconds for a whole request body", low=0.1, high=3600, units="seconds"
    )
    body_idle_timeout: float = setting(
        10.0, "seconds at most between two chunks of a request body", low=0.1, high=3600
    )
    keep_alive: float = setting(
        5.0, "seconds an idle connection stays open between requests", low=0.1, high=3600
    )
    log_level: str = setting("info", "log level", choices=LOG_LEVELS)
    log_json: bool = setting(False, "log one JSON object per line (for collectors)")


@dataclass(frozen=True)
class WyomingConfig:
    """`onnx-tts wyoming`: Home Assistant's Wyoming protocol around one engine."""

    uri: str = setting("tcp://127.0.0.1:10200", "where to listen: tcp://HOST:PORT", metavar="URI")
    voices_dir: str | None = setting(
        None, "uploaded voices (the HTTP server's, by default)", metavar="DIR"
    )
    max_streams: int = setting(
        16,
        "texts generating at once at most (fewer when admission measures less room)",
        low=1,
        high=4096,
    )
    # Home Assistant opens a connection per request; a streamed text's chunks come as its
    # language model writes them (seconds apart). The HTTP server's header bound applies to
    # the rest of an event once its first byte has come.
    header_timeout: float = setting(
        10.0,
        "seconds a client has to send the rest of an event once its first byte arrived",
        low=0.1,
        high=3600,
        units="seconds",
    )
    idle_timeout: float = setting(
        60.0,
        "seconds a connection may stay silent, while nothing is being spoken to it, before "
        "it is closed",
        low=0.1,
        high=3600,
        units="seconds",
    )
    log_level: str = setting("info", "log level", choices=LOG_LEVELS)
    log_json: bool = setting(False, "log one JSON object per line (for collectors)")


PROXY_LOCATIONS = ("HeadOnly", "EveryNode")
MAX_REPLICAS = 1024


@dataclass(frozen=True)
class RayConfig:
    """`onnx-tts serve --ray`: the same server as replicas on Ray Serve (onnx_tts.deploy)."""

    ray: bool = setting(
        False,
        "serve on Ray Serve: each replica a batched engine, the same routes (pip install "
        "'onnx-tts[ray]')",
    )
    ray_address: str | None = setting(
        None,
        "the Ray cluster to deploy to (e.g. 'auto' or 127.0.0.1:6379; default: start a local "
        "one that stops with this command)",
        metavar="ADDRESS",
    )
    replicas: int = setting(1, "replicas when not autoscaling", low=1, high=MAX_REPLICAS)
    min_replicas: int | None = setting(
        None, "autoscale from this many replicas (with --max-replicas)", low=0, high=MAX_REPLICAS
    )
    max_replicas: int | None = setting(
        None, "autoscale up to this many replicas", low=1, high=MAX_REPLICAS
    )
    target_ongoing_requests: float = setting(
        4.0, "autoscaling target: requests in flight per replica", low=0.001, high=10_000
    )
    replica_cpus: float = setting(
        1.0,
        "CPUs Ray reserves for each replica",
        low=0.001,
        high=1024,
    )
    proxy_location: str = setting(
        "HeadOnly",
        "where Serve runs HTTP proxies: the head node, or every node with a replica (nodes "
        "that share an IP, as on one machine, need HeadOnly)",
        choices=PROXY_LOCATIONS,
    )


# -- checking ----------------------------------------------------------------------------------


def check_ray(config: RayConfig) -> RayConfig:
    """`config` (its fields already bounded) with the rules between fields checked."""
    low, high = config.min_replicas, config.max_replicas
    if (low is None) != (high is None):
        raise InputError("--min-replicas and --max-replicas go together (autoscaling bounds)")
    if low is not None and high is not None and low > high:
        raise InputError(f"--min-replicas ({low}) must not exceed --max-replicas ({high})")
    return config


def _settings(cls: type) -> list[tuple[dataclasses.Field, Setting, Any]]:
    hints = typing.get_type_hints(cls)
    return [(f, f.metadata["setting"], hints[f.name]) for f in dataclasses.fields(cls)]


def _base_type(annotation: Any) -> tuple[type, bool]:
    """(the scalar type, whether None is allowed) of a field annotation."""
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _base_type(inner[0])[0], True
    if origin is list:
        return list, False
    return annotation, False


def flag_of(item: dataclasses.Field, spec: Setting) -> str:
    return spec.flag or "--" + item.name.replace("_", "-")


def env_of(item: dataclasses.Field, spec: Setting) -> str:
    """The field's environment variable, named after its flag (values in the flag's unit)."""
    return ENV_PREFIX + flag_of(item, spec).lstrip("-").replace("-", "_").upper()


def check_value(
    name: str, value: Any, annotation: Any, spec: Setting, label: str, in_unit: bool = False
) -> Any:
    """`value` checked against the field's type, choices and bounds; InputError naming `label`
    (bounds and value shown in the flag's unit when `in_unit`, else as given)."""
    kind, nullable = _base_type(annotation)
    if value is None:
        if nullable:
            return None
        raise InputError(f"{label} is required")
    if kind is list:
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise InputError(f"{label} must be a list of strings, got {value!r}")
        return list(value)
    if kind is str:
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str):
            raise InputError(f"{label} must be a string, got {value!r}")
        if spec.choices and value not in spec.choices:
            raise InputError(f"{label} must be one of {', '.join(spec.choices)}, got {value!r}")
        return value
    if kind is bool:
        if not isinstance(value, bool):
            raise InputError(f"{label} must be true or false, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        what = "an integer" if kind is int else "a number"
        raise InputError(f"{label} must be {what}, got {value!r}")
    if kind is int and not isinstance(value, int):
        raise InputError(f"{label} must be an integer, got {value!r}")
    if not math.isfinite(value) or (
        (spec.low is not None and value < spec.low) or (spec.high is not None and value > spec.high)
    ):
        unit = spec.unit if in_unit else 1
        # A MiB flag's low bound is shown rounded up to a whole MiB; other bounds as they are.
        shown_low = spec.low if unit == 1 or spec.low is None else math.ceil(spec.low / unit) * unit
        low = "-inf" if shown_low is None else _in_unit(shown_low, unit)
        high = "inf" if spec.high is None else _in_unit(spec.high, unit)
        units = spec.unit_name if in_unit or spec.unit == 1 else ""
        raise InputError(
            f"{label} must be in [{low}, {high}]{' ' + units if units else ''}, got "
            f"{_in_unit(value, unit)}"
        )
    return kind(value)


def _in_unit(value: float, unit: int) -> str:
    value = value / unit
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def checked(config: Any, labels: Mapping[str, str] | None = None) -> Any:
    """`config` with every field checked (InputError naming the keyword, or its label in
    `labels`, e.g. the flag); returns it."""
    for item, spec, annotation in _settings(type(config)):
        label = (labels or {}).get(item.name, item.name)
        check_value(item.name, getattr(config, item.name), annotation, spec, label, bool(labels))
    return config


# -- flags and environment -----------------------------------------------------------------------


def _parse_text(text: str, annotation: Any, spec: Setting, label: str) -> Any:
    """A flag or environment string -> the field's value (flags of unit fields are in their
    unit: `--result-cache-mb 64` is 64 MiB). 'none' clears an optional field."""
    kind, nullable = _base_type(annotation)
    if nullable and text.strip().lower() == "none":
        return None
    if kind is str:
        return text
    if kind is bool:
        lowered = text.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise InputError(f"{label} must be true or false, got {text!r}")
    try:
        number = int(text) if kind is int else float(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise InputError(f"{label} must be {what}, got {text!r}") from None
    return number * spec.unit


def add_flags(
    parser: argparse.ArgumentParser | Any,
    cls: type,
    exclude: tuple[str, ...] = (),
    environ: Mapping[str, str] | None = None,
) -> None:
    """One flag per field of `cls` (those not excluded). Defaults come from the environment
    (ONNX_TTS_<FIELD>) when set, else the field; values are converted and checked later by
    `from_flags`, so a bad value is one line naming the flag."""
    environ = os.environ if environ is None else environ
    defaults = cls()
    hints = typing.get_type_hints(cls)
    for item, spec, _ in _settings(cls):
        if item.name in exclude:
            continue
        flag = flag_of(item, spec)
        env = env_of(item, spec)
        default = getattr(defaults, item.name)
        shown = _in_unit(default, spec.unit) if isinstance(default, int) and default else default
        help_text = f"{spec.help} (default: {shown if shown not in (None, []) else 'none'}; ${env})"
        kwargs: dict[str, Any] = {"dest": item.name, "help": help_text, "default": None}
        if spec.metavar or spec.unit == MIB:
            kwargs["metavar"] = spec.metavar or "MIB"
        if spec.choices:
            kwargs["choices"] = spec.choices
        if spec.repeat:
            kwargs["action"] = "append"
        if _base_type(hints[item.name])[0] is bool:  # a switch: present = true
            kwargs.update(action="store_const", const="true")
            kwargs.pop("metavar", None)
        parser.add_argument(flag, **kwargs)


def from_flags(
    cls: type,
    namespace: argparse.Namespace,
    environ: Mapping[str, str] | None = None,
    **overrides: Any,
) -> Any:
    """Build `cls` from parsed flags (strings), then the environment, then defaults; every
    value checked, a bad one an InputError naming its flag or variable."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    labels = {}
    for item, spec, annotation in _settings(cls):
        flag = flag_of(item, spec)
        labels[item.name] = flag
        given = getattr(namespace, item.name, None)
        if given is not None:
            if spec.repeat:
                values[item.name] = list(given)
            else:
                values[item.name] = _parse_text(str(given), annotation, spec, flag)
            continue
        env = env_of(item, spec)
        if spec.env and environ.get(env):
            text = environ[env]
            labels[item.name] = f"${env}"  # a bad value names where it came from
            if spec.repeat:
                values[item.name] = [p for p in text.split(os.pathsep) if p]
            else:
                values[item.name] = _parse_text(text, annotation, spec, f"${env}")
    values.update(overrides)
    return checked(cls(**values), labels)


def env_table(*classes: type) -> list[tuple[str, str, str, str]]:
    """(variable, flag, default, help) of every field, for the README's table."""
    rows: list[tuple[str, str, str, str]] = []
    for cls in classes:
        defaults = cls()
        for item, spec, _ in _settings(cls):
            if not spec.env:
                continue
            default = getattr(defaults, item.name)
            shown = (
                _in_unit(default, spec.unit) if isinstance(default, int) and default else default
            )
            shown = "none" if shown in (None, []) else shown
            variable = env_of(item, spec)
            if all(row[0] != variable for row in rows):  # serve's --model is the engine's
                rows.append((variable, flag_of(item, spec), str(shown), spec.help))
    return rows


def load_keywords(engine: EngineConfig, caches: CacheConfig) -> dict[str, Any]:
    """`onnx_tts.load()` keywords of two configs."""
    return {**dataclasses.asdict(engine), **dataclasses.asdict(caches)}


__all__ = [
    "DEFAULT_RESULT_MEMORY_BYTES",
    "ENV_PREFIX",
    "MAX_BATCH_LIMIT",
    "MAX_CACHE_DISK_BYTES",
    "MAX_CACHE_MEMORY_BYTES",
    "MAX_REDIS_TTL_SECONDS",
    "MAX_THREADS",
    "MIB",
    "PROXY_LOCATIONS",
    "CacheConfig",
    "EngineConfig",
    "RayConfig",
    "ServerConfig",
    "Setting",
    "WyomingConfig",
    "add_flags",
    "check_value",
    "checked",
    "env_table",
    "from_flags",
    "load_keywords",
]

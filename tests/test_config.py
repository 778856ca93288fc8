"""Typed configuration: one place for every default and bound, and everything generated from it
(load() keywords, CLI and serve flags, ONNX_TTS_* environment variables) agreeing with it."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import onnx_tts
from onnx_tts.config import (
    CacheConfig,
    EngineConfig,
    RayConfig,
    ServerConfig,
    add_flags,
    env_of,
    env_table,
    flag_of,
    from_flags,
)
from onnx_tts.errors import InputError
from tests.waiting import WAIT_BOUND_SECONDS


def _parse(cls: type, argv: list[str], environ: dict[str, str] | None = None):
    parser = argparse.ArgumentParser()
    add_flags(parser, cls, environ=environ or {})
    return from_flags(cls, parser.parse_args(argv), environ=environ or {})


@pytest.mark.parametrize("cls", [EngineConfig, CacheConfig, ServerConfig, RayConfig])
def test_defaults_pass_their_own_bounds_and_flags_default_to_them(cls):
    assert _parse(cls, []) == cls()


def test_every_engine_and_cache_field_is_a_load_keyword_and_nothing_else_is():
    """load() takes the config fields through **settings; its own parameters are only the
    model path and providers, so no default is written twice."""
    parameters = inspect.signature(onnx_tts.load).parameters
    assert set(parameters) == {"model", "providers", "settings"}
    from onnx_tts.pipeline import CACHE_FIELDS, ENGINE_FIELDS

    assert set(ENGINE_FIELDS) == {f.name for f in dataclasses.fields(EngineConfig)}
    assert set(CACHE_FIELDS) == {f.name for f in dataclasses.fields(CacheConfig)}


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"max_batch": 0}, "max_batch must be in [1, 256], got 0"),
        ({"threads": "4"}, "threads must be an integer"),
        ({"kv": "fast"}, "kv must be one of copy, chain, inplace"),
        ({"prefix_cache_bytes": -1}, "prefix_cache_bytes must be in [0,"),
        ({"redis_ttl_seconds": 0}, "redis_ttl_seconds must be in [1,"),
        ({"slot_bytes": 1.5}, "slot_bytes must be an integer"),
        ({"max_waiting": True}, "max_waiting must be an integer"),
    ],
)
def test_load_refuses_bad_settings_with_the_config_bound(keywords, message):
    with pytest.raises(InputError, match=message.replace("[", r"\[")):
        onnx_tts.load(cache_dir=None, **keywords)


def test_flags_use_their_units_and_environment_fills_the_rest():
    environ = {"ONNX_TTS_RESULT_CACHE_MB": "3", "ONNX_TTS_THREADS": "2", "ONNX_TTS_KV": "chain"}
    caches = _parse(CacheConfig, ["--prefix-cache-mb", "5"], environ)
    assert caches.prefix_cache_bytes == 5 << 20
    assert caches.result_cache_bytes == 3 << 20  # the variable is in the flag's unit
    engine = _parse(EngineConfig, ["--threads", "1"], environ)
    assert engine.threads == 1  # a flag beats the environment
    assert engine.kv == "chain"


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"ONNX_TTS_MAX_BATCH": "many"}, "$ONNX_TTS_MAX_BATCH must be an integer, got 'many'"),
        ({"ONNX_TTS_PORT": "70000"}, "$ONNX_TTS_PORT must be in [1, 65535], got 70000"),
    ],
)
def test_bad_environment_values_name_the_variable_or_flag(environ, message):
    cls = ServerConfig if "PORT" in next(iter(environ)) else EngineConfig
    with pytest.raises(InputError) as error:
        _parse(cls, [], environ)
    assert str(error.value) == message


def test_none_clears_an_optional_setting():
    assert _parse(CacheConfig, ["--cache-dir", "none"]).cache_dir is None
    assert _parse(CacheConfig, ["--redis", "none"]).redis_url is None


def test_every_serve_option_has_a_documented_environment_variable():
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    rows = env_table(ServerConfig, EngineConfig, CacheConfig, RayConfig)
    assert len(rows) >= 30
    missing = [variable for variable, *_ in rows if variable not in text]
    assert missing == []


def test_serve_and_synth_share_one_default_per_setting():
    """The flags of both commands come from the same dataclasses: their defaults cannot
    disagree (the server used to default to 1 thread and max_batch 1, the CLI to 0 and 8)."""
    from onnx_tts.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    synth, serve = commands.choices["synth"], commands.choices["serve"]
    for item in dataclasses.fields(EngineConfig):
        if item.name == "model":
            continue
        flag = flag_of(item, item.metadata["setting"])
        helps = [
            next(a.help for a in p._actions if flag in a.option_strings) for p in (synth, serve)
        ]
        assert helps[0] == helps[1], flag
        assert env_of(item, item.metadata["setting"]) in helps[0]


def test_a_result_cache_directory_alone_turns_the_result_cache_on(tmp_path):
    engine = onnx_tts.load(cache_dir=None, result_cache_dir=tmp_path / "results")
    assert engine.results is not None
    engine.synthesize("Cached by directory.", seed=1)
    assert any((tmp_path / "results").rglob("*")), "the disk tier stored nothing"
    assert onnx_tts.load(cache_dir=None).results is None  # the default stays off


def test_server_environment_variables_reach_a_real_serve_process(tmp_path):
    """`onnx-tts serve` reads ONNX_TTS_* (here a bad value, so it exits at once)."""
    done = subprocess.run(
        [sys.executable, "-m", "onnx_tts.server"],
        capture_output=True,
        text=True,
        timeout=WAIT_BOUND_SECONDS,
        env={"PATH": "/usr/bin:/bin", "ONNX_TTS_MAX_QUEUE": "-3", "HOME": str(tmp_path)},
    )
    assert done.returncode == 2
    expected = "onnx-tts serve: $ONNX_TTS_MAX_QUEUE must be in [0, 100000], got -3"
    assert done.stderr.strip() == expected

"""Shared fixtures. Every test run gets its own cache directory, never the user's; bundles
built for tests (codec-lm) are kept in the content-addressed build cache across runs.

Memory (docs/TESTING.md, "Test suite resources"): fixtures close the engines they make; an
engine a test drops is closed by its finalizer, and what it held is given back to the system
once the process has grown by RELEASE_AFTER_BYTES since the last time (`_release_memory`)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import soundfile

from export.build_cache import build_cache_root

# Pinned before the XDG cache is redirected per session (below), so built bundles outlive it;
# subprocesses (CLI, servers, benchmarks) inherit it.
os.environ["ONNX_TTS_BUILD_CACHE"] = str(build_cache_root())


# A dropped engine's model (ONNX Runtime sessions, KV slot buffers) sits in reference cycles
# until the cyclic collector runs, which in a process of this size is rare; freed heap pages
# stay with the process until malloc_trim. Growth beyond this since the last release triggers
# one (a full collection costs ~0.2 s, so not after every test).
RELEASE_AFTER_BYTES = 256 << 20
_PROCESS = psutil.Process()
_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
_released_at = [_PROCESS.memory_info().rss]


def at_once(calls: list[Callable[[], Any]]) -> list[Any]:
    """Each call on a thread of its own, all started together (a barrier); their results in
    order (the first error raised)."""
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []
    start = threading.Barrier(len(calls))

    def one(index: int) -> None:
        start.wait()
        try:
            results[index] = calls[index]()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def release_memory() -> None:
    """Collect garbage (dropped engines stop their workers from a thread named
    "onnx-tts-close": waited for, then what they held is collected too) and give freed heap
    pages back to the system."""
    gc.collect()
    for thread in threading.enumerate():
        if thread.name == "onnx-tts-close":
            thread.join()
    gc.collect()
    if hasattr(_LIBC, "malloc_trim"):  # glibc
        _LIBC.malloc_trim(0)
    _released_at[0] = _PROCESS.memory_info().rss


@pytest.fixture(autouse=True)
def _release_memory():
    yield
    if _PROCESS.memory_info().rss - _released_at[0] > RELEASE_AFTER_BYTES:
        release_memory()


@pytest.fixture
def closing() -> Iterator[Callable[[Any], Any]]:
    """`closing(thing)` returns `thing` and closes it after the test (an engine, a scheduler,
    a backend with a scheduler of its own): the test need not clean up on failure."""
    with contextlib.ExitStack() as stack:
        yield lambda thing: stack.enter_context(contextlib.closing(thing))


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))


def speechlike(seconds: float, sample_rate: int = 24000, seed: int = 0) -> np.ndarray:
    """A voiced, amplitude-modulated signal: enough structure for an encoder to chew on."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sample_rate)) / sample_rate
    f0 = 110 + 40 * seed + 15 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / sample_rate
    voiced = sum(np.sin(k * phase) / k for k in range(1, 8))
    envelope = 0.5 * (1 + np.sin(2 * np.pi * 3.0 * t + seed))
    noise = 0.02 * rng.standard_normal(len(t))
    return (0.3 * voiced * envelope / 2.5 + noise).astype(np.float32)


@pytest.fixture(scope="session")
def voice_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("voices") / "voice.wav"
    soundfile.write(str(path), speechlike(3.0), 24000, subtype="FLOAT")
    return path


@functools.cache
def codec_lm_dir() -> Path:
    """The random-weight codec-lm bundle: built on first use (~5 s), then read from the build
    cache (see export/build_codec_lm.py). Not shipped in the wheel."""
    from export.build_codec_lm import codec_lm_bundle

    return codec_lm_bundle()


@pytest.fixture(scope="session")
def codec_lm_engine():
    import onnx_tts

    with onnx_tts.load(codec_lm_dir(), kv="inplace", cache_dir=None) as engine:
        yield engine


@pytest.fixture(scope="session")
def moss_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Small stand-in MOSS-TTS-Nano directories (published layout, random weights), built
    once per session, with the optional greedy frame graph as well as the official five."""
    from dataclasses import replace

    from export.moss_tts_nano import build, small

    return build(tmp_path_factory.mktemp("moss"), replace(small(), greedy_frame=True))


@pytest.fixture(scope="session")
def moss_official(moss_models: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in with exactly the official graph set (no greedy frame graph in the meta)."""
    import json
    import shutil

    target = tmp_path_factory.mktemp("moss-official")
    for name in ("MOSS-TTS-Nano-100M-ONNX", "MOSS-Audio-Tokenizer-Nano-ONNX"):
        shutil.copytree(moss_models / name, target / name)
    meta_path = target / "MOSS-TTS-Nano-100M-ONNX" / "tts_browser_onnx_meta.json"
    meta = json.loads(meta_path.read_text())
    removed = meta["files"].pop("local_greedy_frame")
    meta["external_data_files"].pop(removed)
    meta_path.write_text(json.dumps(meta, indent=2))
    (meta_path.parent / removed).unlink()
    return target

"""An engine's model (sessions, KV slot buffers, workers) goes when the engine goes: at
close(), at the end of a `with` block, or once its user drops it without closing it, as a
long-running process that loads engines over time needs."""

from __future__ import annotations

import gc
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import onnx_tts
from onnx_tts.decoding import scheduler
from onnx_tts.errors import OnnxTTSError
from tests.conftest import codec_lm_dir, release_memory
from tests.waiting import wait_until

TEXT = "Two sentences here. The second one is a little longer."


def _used_engine() -> tuple[list[weakref.ref], np.ndarray]:
    """Weak references to a used engine's parts (its workers' threads hold them while they
    run), and what it said."""
    engine = onnx_tts.load(codec_lm_dir(), cache_dir=None, max_batch=4)
    audio = engine.synthesize(TEXT, seed=1).samples
    streamed = np.concatenate(list(engine.stream(TEXT, seed=1)))
    assert len(streamed) == len(audio)
    assert engine.stats()["slot_bytes"] > 0  # the slot buffers exist, and must go too
    parts = [engine, engine.model, engine.scheduler, engine.executor.vocoder]
    return [weakref.ref(part) for part in parts], audio


def test_a_dropped_engine_stops_its_workers_and_frees_its_model(monkeypatch) -> None:
    monkeypatch.setattr(scheduler, "IDLE_RELEASE_SECONDS", None)  # the slots stay till the end
    parts, _ = _used_engine()  # dropped on return, never closed
    release_memory()  # the collector finalizes it; its workers stop, then its parts go
    assert [part() for part in parts] == [None] * len(parts)


def test_a_closed_engine_refuses_work_and_frees_its_model() -> None:
    with onnx_tts.load(codec_lm_dir(), cache_dir=None) as engine:
        engine.synthesize(TEXT, seed=2)
        parts = [weakref.ref(p) for p in (engine.model, engine.scheduler)]
    with pytest.raises(OnnxTTSError, match="closed"):
        engine.synthesize(TEXT, seed=2)
    del engine
    release_memory()
    assert [part() for part in parts] == [None, None]


def test_a_stream_keeps_the_engine_nobody_else_holds(codec_lm_engine) -> None:
    """`onnx_tts.load(...).stream(text)` reads to its end: the stream holds its engine."""
    stream = onnx_tts.load(codec_lm_dir(), kv="inplace", cache_dir=None).stream(TEXT, seed=3)
    gc.collect()  # an engine only the stream refers to must not be finalized here
    samples = np.concatenate(list(stream))
    expected = np.concatenate(list(codec_lm_engine.stream(TEXT, seed=3)))
    np.testing.assert_array_equal(samples, expected)


def test_an_idle_engine_lets_go_of_the_slot_rows_a_burst_grew(monkeypatch) -> None:
    """A burst grows the slot buffers to its rows, and a server kept them until it exited;
    once no work comes for IDLE_RELEASE_SECONDS they go, and the next requests allocate what
    they need and say the same."""
    monkeypatch.setattr(scheduler, "IDLE_RELEASE_SECONDS", None)
    with onnx_tts.load(codec_lm_dir(), cache_dir=None, max_batch=4) as engine:

        def burst() -> list[np.ndarray]:
            with ThreadPoolExecutor(4) as pool:
                return list(pool.map(lambda i: engine.synthesize(TEXT, seed=i).samples, range(4)))

        before = burst()
        grown = engine.stats()
        assert grown["slot_rows"] == 4 and grown["slot_bytes"] > 0
        monkeypatch.setattr(scheduler, "IDLE_RELEASE_SECONDS", 0.0)
        engine.synthesize(TEXT, seed=9)  # the worker's next wait for work is bounded
        wait_until(lambda: engine.stats()["slot_bytes"] == 0, "the idle slot buffers went")
        assert engine.stats()["slot_releases"] >= 1 and engine.stats()["slot_rows"] == 0
        after = burst()
    assert all(map(np.array_equal, after, before))

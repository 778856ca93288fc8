"""Prefill beside the decode step (decoding/prefill.py): a new request's prompt never holds up
the rows already decoding, and never changes a request's frames.

The model is the random-weight codec-lm with a reference voice: its prompts are ~200 positions
(a voice prefix of 151), many step-times of work. A stand-in prefill that blocks on an event
shows what the decode worker does meanwhile; nothing here waits on the clock."""

from __future__ import annotations

import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import onnx_tts
from onnx_tts.decoding.kv_rows import chunk_bounds
from onnx_tts.decoding.prefill import PrefillJob, TurnGate
from onnx_tts.decoding.request import Request
from onnx_tts.errors import InputError
from tests.conftest import codec_lm_dir

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hi.",
    "A somewhat longer sentence, so that rows end at different steps.",
    "One two three.",
]
MODES = ("apart", "chunked", "inline")


def _load(max_batch: int = 4, **settings):
    return onnx_tts.load(codec_lm_dir(), cache_dir=None, threads=1, max_batch=max_batch, **settings)


@pytest.fixture(scope="module")
def solo():
    engine = _load(max_batch=1, prefill="inline", prefix_cache_bytes=0)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def expected(solo, voice_wav):
    """Each job's samples from a solo engine, its prompt in one run, no prefix cache."""
    return {
        (text, seed): solo.synthesize(text, voice=voice_wav, seed=seed).samples
        for seed, text in enumerate(TEXTS)
    }


def _request(engine, text: str, voice, seed: int) -> Request:
    model = engine.model
    [chunk] = model.text.chunks(text, {})
    sampling = model.sampling_defaults().with_overrides({"seed": seed})
    return Request(chunk, voice, sampling, {})


class BlockedPrefill:
    """Stand-in: the prefill of `target` waits for `release` before it runs (as a long prompt
    would take its time); `started` is set once it is waiting."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail: bool = False) -> None:
        self.target: Request | None = None
        self.started, self.release = threading.Event(), threading.Event()
        self.fail = fail
        real = PrefillJob.run

        def run(job: PrefillJob, prefix_cache):
            if job.request is self.target:
                self.started.set()
                assert self.release.wait(120), "the test never released the prefill"
                if self.fail:
                    raise RuntimeError("stand-in prefill failure")
            return real(job, prefix_cache)

        monkeypatch.setattr(PrefillJob, "run", run)


def _wait_until(condition, seconds: float = 60.0) -> bool:
    """Poll `condition` (the worker acts between rounds); not a timing assertion."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def _samples(engine, request: Request) -> np.ndarray:
    """Frames of `request` through the scheduler, vocoded as `synthesize` does."""
    frames = list(engine.scheduler.submit(request))
    return engine.model.vocoder.vocode(np.stack(frames), request.voice)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("prefix_cache", [True, False])
def test_requests_admitted_while_others_decode_get_their_solo_frames(
    mode, prefix_cache, expected, voice_wav
):
    """Eight requests arrive while others decode, in every prefill mode, with and without the
    voice-prefix cache (two-run prefill, hits and misses): every one equals a solo engine
    that prefilled its prompt in one run."""
    engine = _load(prefill=mode, **({} if prefix_cache else {"prefix_cache_bytes": 0}))
    try:
        jobs = [(TEXTS[i % len(TEXTS)], i % len(TEXTS)) for i in range(8)]
        with ThreadPoolExecutor(4) as pool:  # 4 rows: later requests join a running batch
            got = list(
                pool.map(lambda j: engine.synthesize(j[0], voice=voice_wav, seed=j[1]), jobs)
            )
        same = [np.array_equal(g.samples, expected[j]) for g, j in zip(got, jobs, strict=True)]
        assert same == [True] * len(jobs)
        stats = engine.stats()
        assert stats["prefills"] == 8 and stats["mean_batch"] > 1.2
        assert stats["parallel_prefills"] == (0 if mode == "inline" else 8)
        if mode == "chunked":  # ~200-position prompts in 16-position chunks
            assert stats["prefill_turns"] >= 8 * 3
    finally:
        engine.close()


@pytest.mark.parametrize("mode", ["apart", "chunked"])
def test_rows_keep_stepping_while_a_long_prefill_runs(mode, monkeypatch, expected, voice_wav):
    """While one request's prefill is held up, a request admitted after it decodes to its end;
    then the held one joins and makes its solo frames."""
    blocked = BlockedPrefill(monkeypatch)
    engine = _load(prefill=mode)
    try:
        voice = engine.voice(voice_wav)
        held = blocked.target = _request(engine, TEXTS[0], voice, 0)
        with ThreadPoolExecutor(1) as pool:
            held_samples = pool.submit(_samples, engine, held)
            assert blocked.started.wait(60)
            steps = engine.stats()["steps"]
            other = _samples(engine, _request(engine, TEXTS[2], voice, 2))
            stats = engine.stats()
            assert not blocked.release.is_set() and stats["prefilling"] == 1
            assert stats["steps"] - steps >= len(other) // engine.model.hop_length
            np.testing.assert_array_equal(other, expected[(TEXTS[2], 2)])
            blocked.release.set()
            np.testing.assert_array_equal(held_samples.result(), expected[(TEXTS[0], 0)])
    finally:
        blocked.release.set()
        engine.close()


@pytest.mark.parametrize("mode", ["apart", "chunked"])
def test_cancelling_during_prefill_frees_the_row(mode, monkeypatch, expected, voice_wav):
    """A request cancelled while its prompt runs leaves its row at once (the prompt's run
    cannot be interrupted: it is dropped when it ends), and the row serves the next request
    unchanged."""
    blocked = BlockedPrefill(monkeypatch)
    engine = _load(max_batch=1, prefill=mode)
    try:
        voice = engine.voice(voice_wav)
        held = blocked.target = _request(engine, TEXTS[0], voice, 0)
        stream = engine.scheduler.submit(held)
        assert blocked.started.wait(60)
        assert engine.stats()["active_rows"] == 1
        stream.close()  # cancels: the only row must be freed
        assert _wait_until(lambda: engine.stats()["active_rows"] == 0)
        assert engine.stats()["prefilling"] == 0 and not blocked.release.is_set()
        follower = _request(engine, TEXTS[1], voice, 1)
        with ThreadPoolExecutor(1) as pool:
            follower_samples = pool.submit(_samples, engine, follower)
            # (the one prefill worker of a one-row engine is still busy with the dropped prompt)
            blocked.release.set()
            np.testing.assert_array_equal(follower_samples.result(), expected[(TEXTS[1], 1)])
        assert engine.stats()["prefills"] == 1  # the follower's: the dropped one never joined
        assert list(stream) == []
    finally:
        blocked.release.set()
        engine.close()


def test_a_failing_prefill_fails_only_its_request(monkeypatch, expected, voice_wav):
    blocked = BlockedPrefill(monkeypatch, fail=True)
    engine = _load()
    try:
        voice = engine.voice(voice_wav)
        failing = blocked.target = _request(engine, TEXTS[0], voice, 0)
        with ThreadPoolExecutor(1) as pool:
            outcome = pool.submit(_samples, engine, failing)
            assert blocked.started.wait(60)
            blocked.release.set()
            with pytest.raises(RuntimeError, match="stand-in prefill failure"):
                outcome.result()
        with ThreadPoolExecutor(3) as pool:
            others = list(
                pool.map(
                    lambda seed: _samples(engine, _request(engine, TEXTS[seed], voice, seed)),
                    (1, 2, 3),
                )
            )
        for seed, samples in zip((1, 2, 3), others, strict=True):
            np.testing.assert_array_equal(samples, expected[(TEXTS[seed], seed)])
        assert engine.stats()["active_rows"] == 0
    finally:
        blocked.release.set()
        engine.close()


def test_the_slot_buffer_is_written_only_by_the_decode_worker(monkeypatch, expected, voice_wav):
    """The slot buffer grows while a prompt is being prefilled (a second request needs a
    second row), yet every write into the buffer in use (joining rows, moving live rows into a
    grown buffer, steps) comes from the decode worker: a prefill never writes into it, so it
    never grows or moves under one, and the prefilled request still makes its solo frames."""
    blocked = BlockedPrefill(monkeypatch)
    engine = _load()
    slots = engine.scheduler.slots
    writers: list[tuple[str, str]] = []
    for method in ("join", "_move_into", "run"):
        real = getattr(slots, method)

        def record(*args, _real=real, _name=method):
            writers.append((_name, threading.current_thread().name))
            return _real(*args)

        monkeypatch.setattr(slots, method, record)
    try:
        voice = engine.voice(voice_wav)
        held = blocked.target = _request(engine, TEXTS[0], voice, 0)
        with ThreadPoolExecutor(1) as pool:
            held_samples = pool.submit(_samples, engine, held)
            assert blocked.started.wait(60)
            rows = engine.stats()["slot_rows"]
            other = _samples(engine, _request(engine, TEXTS[2], voice, 2))
            assert engine.stats()["slot_rows"] > rows  # grown while the prompt was held
            blocked.release.set()
            np.testing.assert_array_equal(held_samples.result(), expected[(TEXTS[0], 0)])
        np.testing.assert_array_equal(other, expected[(TEXTS[2], 2)])
        assert {name for name, _ in writers} == {"join", "_move_into", "run"}
        assert {thread for _, thread in writers} == {"onnx-tts-decode"}
    finally:
        blocked.release.set()
        engine.close()


def test_rows_keep_stepping_while_the_slot_buffer_grows(monkeypatch, expected, voice_wav):
    """A request that needs a bigger slot buffer waits for it (allocated beside the steps:
    here held up) while the rows already decoding go on to their end; then it joins the grown
    buffer and makes its solo frames."""
    from onnx_tts.decoding.kv_rows import SlotRows

    started, release = threading.Event(), threading.Event()
    real = SlotRows._allocate

    def allocate(self, rows, capacity):
        if threading.current_thread().name.startswith("onnx-tts-grow"):
            started.set()
            assert release.wait(120), "the test never released the allocation"
        return real(self, rows, capacity)

    monkeypatch.setattr(SlotRows, "_allocate", allocate)
    engine = _load()
    try:
        voice = engine.voice(voice_wav)
        first = engine.scheduler.submit(_request(engine, TEXTS[2], voice, 2))
        frames = [next(first)]  # decoding in the buffer's one row
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(_samples, engine, _request(engine, TEXTS[0], voice, 0))
            assert started.wait(60)
            frames += list(first)  # to its end, while the grown buffer is held up
            assert engine.stats()["slot_rows"] == 1 and not release.is_set()
            release.set()
            np.testing.assert_array_equal(waiting.result(), expected[(TEXTS[0], 0)])
        samples = engine.model.vocoder.vocode(np.stack(frames), voice)
        np.testing.assert_array_equal(samples, expected[(TEXTS[2], 2)])
        assert engine.stats()["slot_rows"] == 2 and engine.stats()["slot_grows"] == 1
    finally:
        release.set()
        engine.close()


def test_chunks_never_hold_a_single_position():
    for tokens in range(1, 80):
        for size in (None, 2, 3, 16, 32):
            bounds = list(chunk_bounds(tokens, size))
            assert bounds[0][0] == 0 and bounds[-1][1] == tokens
            assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
            assert all(end - start >= 2 for start, end in bounds) or bounds == [(0, tokens)]
            if size is not None:
                assert all(end - start < size + 2 for start, end in bounds)


def test_a_turn_runs_only_when_granted_and_the_worker_waits_for_it():
    woken = threading.Event()
    gate = TurnGate(woken.set)
    assert not gate.grant()  # nobody waits: nothing to wait for
    ran, inside = threading.Event(), threading.Event()

    def prefill() -> None:
        with gate.turn():
            inside.set()
            ran.wait(60)

    thread = threading.Thread(target=prefill)
    thread.start()
    assert woken.wait(60) and not inside.is_set()
    releaser = threading.Timer(0, ran.set)  # the turn ends only after grant() was called
    granted = []
    runner = threading.Thread(target=lambda: granted.append(gate.grant()))
    runner.start()
    assert inside.wait(60)
    assert runner.is_alive() or ran.is_set()  # grant() waits for the turn to end
    releaser.start()
    runner.join(60)
    thread.join(60)
    assert granted == [True]


def test_an_abandoned_turn_never_runs():
    gate = TurnGate(lambda: None)
    failures: list[BaseException] = []

    def prefill() -> None:
        try:
            with gate.turn():
                failures.append(AssertionError("ran after abandon"))
        except BaseException as error:
            failures.append(error)

    thread = threading.Thread(target=prefill)
    thread.start()
    while not gate.waiting:
        thread.join(0.01)
    gate.abandon()
    thread.join(60)
    assert len(failures) == 1 and "went away" in str(failures[0])
    assert not gate.grant()


@pytest.mark.parametrize("bad", ["later", "", None])
def test_an_unknown_prefill_mode_is_refused(bad):
    with pytest.raises(InputError, match="prefill"):
        _load(prefill=bad)


def test_a_prompt_of_a_few_positions_runs_in_the_round():
    """The default voice's prompt is one position (about a step's work): it runs in the
    decode worker's round, not on a prefill worker, and its audio is the same either way."""
    apart = onnx_tts.load(None, cache_dir=None, threads=1)
    inline = onnx_tts.load(None, cache_dir=None, threads=1, prefill="inline")
    try:
        text = "A prompt of one position."
        np.testing.assert_array_equal(
            apart.synthesize(text, seed=1).samples, inline.synthesize(text, seed=1).samples
        )
        stats = apart.stats()
        assert stats["prefills"] == 1 and stats["parallel_prefills"] == 0
    finally:
        apart.close()
        inline.close()

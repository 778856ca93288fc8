"""The staged pipeline: the vocoder stage (batched windows equal per-stream ones, most urgent
first, a failing stream fails alone), admission control, and nothing left behind by many
clients that come and go."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

import onnx_tts
from onnx_tts.decoding.request import CancelToken, PlaybackClock, Request
from onnx_tts.errors import CancelledError, InputError, OnnxTTSError
from onnx_tts.families.base import Vocoder, VocoderCapabilities
from onnx_tts.pipeline import stages
from onnx_tts.pipeline.admission import Admission, retry_after_seconds
from onnx_tts.pipeline.stages import VocoderStage
from onnx_tts.session import available_cores
from onnx_tts.vocoder import StreamingOptions
from tests.conftest import codec_lm_dir
from tests.waiting import WAIT_BOUND_SECONDS, wait_until

TEXTS = [
    "The sun rose slowly over the quiet hills.",
    "She packed her bag and left before dawn.",
    "A small dog barked at the passing train.",
    "Rain is expected later this afternoon.",
]


@pytest.fixture(scope="module")
def codec_engine():
    engine = onnx_tts.load(codec_lm_dir(), cache_dir=None, max_batch=8)
    yield engine
    engine.close()


@pytest.mark.parametrize("model", ["codec-lm", "default voice"])
def test_batched_vocoder_windows_equal_each_stream_alone(model, codec_engine):
    """Eight concurrent streams: their windows went through shared vocoder calls (mean batch
    above 1) and every stream's audio equals the same stream decoded alone (the codec-lm
    vocoder pads shorter windows, the default voice's batches windows of one length)."""
    path = codec_lm_dir() if model == "codec-lm" else None
    alone = onnx_tts.load(path, cache_dir=None, max_batch=1)
    engine = codec_engine if model == "codec-lm" else onnx_tts.load(cache_dir=None, max_batch=8)
    jobs = [(TEXTS[i % 4], i) for i in range(8)]
    expected = [np.concatenate(list(alone.stream(t, seed=s))) for t, s in jobs]
    alone.close()
    before = engine.stats()["vocoder"]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda j: np.concatenate(list(engine.stream(j[0], seed=j[1]))), jobs))
    for want, have in zip(expected, got, strict=True):
        np.testing.assert_array_equal(have, want)
    after = engine.stats()["vocoder"]
    if engine is not codec_engine:
        engine.close()
    calls = after["calls"] - before["calls"]
    windows = after["windows"] - before["windows"]
    assert windows > calls, "no vocoder call decoded more than one stream's window"


class _RecordingVocoder(Vocoder):
    """A stand-in vocoder: records the order it decodes streams in, fails for one voice."""

    def __init__(self, hop: int) -> None:
        self.hop, self.order = hop, []
        self.capabilities = VocoderCapabilities(16000, hop)

    def vocode(self, frames: np.ndarray, voice: Any) -> np.ndarray:
        if voice.get("fail"):
            raise InputError("this voice breaks the vocoder")
        self.order.append(voice["name"])
        return np.zeros(len(frames) * self.hop, np.float32)


def _one_shot_request(name: str, **timing: Any) -> Request:
    return Request(name, {"name": name, **timing.pop("voice", {})}, None, {}, **timing)  # type: ignore[arg-type]


def test_stage_decodes_the_most_urgent_stream_first_and_a_failure_stays_alone():
    vocoder = _RecordingVocoder(hop=4)
    stage = VocoderStage(vocoder)
    now = time.monotonic()
    dry = PlaybackClock()
    dry.chunk(now - 2.0, 0.5)  # this listener ran dry 1.5 s ago
    specs = [
        ("batch", {}),  # no deadline: arrival + slack
        ("later", {"deadline": now + 5}),
        ("broken", {"deadline": now + 4, "voice": {"fail": True}}),
        ("soon", {"deadline": now + 1}),
        ("starving", {"deadline": now + 9, "clock": dry}),
    ]
    streams = {}
    with stage.lock:  # the worker takes its first round once every stream is due
        for name, timing in specs:
            request = _one_shot_request(name, **timing)
            streams[name] = stage.open(request, None, hop_length=4)
        for stream in streams.values():  # one-shot streams: every frame, then the end
            stream.put(np.zeros((1, 2)))
            stream.end()
    results = {}
    for name, stream in streams.items():
        try:
            results[name] = [len(chunk) for chunk in stream]
        except InputError as error:
            results[name] = str(error)
    assert results["broken"] == "this voice breaks the vocoder"
    assert all(results[name] == [4] for name in ("batch", "later", "soon", "starving"))
    # The first round took them in urgency order (the lock held the worker until all were due).
    assert vocoder.order == ["starving", "soon", "later", "batch"]
    stage.close()


class _Decoders(Vocoder):
    """A vocoder with stateful stand-in decoders (one per stream, as `open_stream` makes
    them) that count how many pushes run at once; with `meet`, every push waits (bounded) for
    another push to run at the same time and fails if none does."""

    def __init__(self, meet: bool) -> None:
        self.meeting = threading.Barrier(2, timeout=WAIT_BOUND_SECONDS) if meet else None
        self.lock = threading.Lock()
        self.running = self.most = self.pushes = 0
        self.capabilities = VocoderCapabilities(16000, 4, channels=2, stateful_streams=True)

    def vocode(self, frames: np.ndarray, voice: Any) -> np.ndarray:
        return np.zeros((0, 2), np.float32)

    def open_stream(self) -> Any:
        return self

    def push(self, codes: np.ndarray) -> np.ndarray:
        with self.lock:
            self.running += 1
            self.pushes += 1
            self.most = max(self.most, self.running)
        try:
            if self.meeting is not None:
                self.meeting.wait()
        finally:
            with self.lock:
                self.running -= 1
        return np.zeros((len(codes) * 4, 2), np.float32)

    def close(self) -> None:
        pass


@pytest.mark.parametrize("lm_idle", [True, False])
def test_streams_with_decoders_of_their_own_decode_two_at_once_while_the_lm_idles(lm_idle):
    decoders = _Decoders(meet=lm_idle)
    stage = VocoderStage(
        decoders,
        lm_idle=lambda: lm_idle,
    )
    window = StreamingOptions(2, 2, 0, 0, 0)
    with stage.lock:  # the four windows below are all due in the first round
        streams = [stage.open(_one_shot_request(f"s{i}"), window, hop_length=4) for i in range(4)]
        for stream in streams:
            stream.put(np.zeros((2, 3), np.int64))
            stream.end()
    assert [sum(len(chunk) for chunk in stream) for stream in streams] == [8] * 4
    assert decoders.pushes == 4 and decoders.most == (2 if lm_idle else 1)
    stage.close()


class _Windows(Vocoder):
    """A batching stand-in vocoder: records each call's window count and how many calls run
    at once; a call of first windows waits (bounded) for another call to run beside it."""

    def __init__(self) -> None:
        self.meeting = threading.Barrier(2, timeout=WAIT_BOUND_SECONDS)
        self.lock = threading.Lock()
        self.running = self.most = 0
        self.calls: list[int] = []
        self.capabilities = VocoderCapabilities(16000, 4, batches_exactly=True)

    def vocode(self, frames: np.ndarray, voice: Any) -> np.ndarray:
        return self.vocode_windows([frames], [voice])[0]

    def vocode_windows(self, windows: Any, voices: Any) -> list[np.ndarray]:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.calls.append(len(windows))
            first_round = len(self.calls) <= 2
        try:
            if first_round:
                self.meeting.wait()
        finally:
            with self.lock:
                self.running -= 1
        return [np.full(len(w) * 4, float(w[0, 0]), np.float32) for w in windows]


def test_a_burst_s_first_windows_decode_in_two_halves_at_once():
    """Four streams whose first windows are due together (a burst that started at once): the
    stage decodes them as two calls of two that run at the same time, and each stream still
    gets its own samples; later windows of the same streams go back to one shared call."""
    vocoder = _Windows()
    stage = VocoderStage(vocoder, lm_idle=lambda: False)
    window = StreamingOptions(2, 2, 0, 0, 0)
    with stage.lock:  # the four first windows are due in the stage's first round
        streams = [stage.open(_one_shot_request(f"s{i}"), window, hop_length=4) for i in range(4)]
        for index, stream in enumerate(streams):
            stream.put(np.full(3, index, np.float32))
            stream.put(np.full(3, index, np.float32))
    wait_until(lambda: len(vocoder.calls) >= 2, "the first windows were decoded")
    with stage.lock:  # the second windows: due together again, but none is a first
        for index, stream in enumerate(streams):
            stream.put(np.full(3, index, np.float32))
            stream.put(np.full(3, index, np.float32))
            stream.end()
    audio = [np.concatenate(list(stream)) for stream in streams]
    assert vocoder.calls[:2] == [2, 2] and vocoder.most == 2
    assert vocoder.calls[2:] == [4]
    for index, samples in enumerate(audio):
        np.testing.assert_array_equal(samples, np.full(16, index, np.float32))
    stage.close()


def _first_windows_of(stage: VocoderStage, count: int) -> list[Any]:
    """`count` streams whose first windows are all due in the stage's first round."""
    window = StreamingOptions(2, 2, 0, 0, 0)
    with stage.lock:
        streams = [
            stage.open(_one_shot_request(f"s{i}"), window, hop_length=4) for i in range(count)
        ]
        for index, stream in enumerate(streams):
            stream.put(np.full(3, index, np.float32))
            stream.put(np.full(3, index, np.float32))
            stream.end()
    return streams


def test_a_burst_bigger_than_one_vocoder_batch_decodes_every_first_window_at_once():
    """More first windows than one call takes (`max_batch`): all of them are in the two halves
    of the first round. (Eight first windows of the default voice are more frames than one
    call takes: the one left over waited for a round of its own, after both halves.)"""
    vocoder = _Windows()
    stage = VocoderStage(vocoder, lm_idle=lambda: False, max_batch=2)
    streams = _first_windows_of(stage, 4)
    audio = [np.concatenate(list(stream)) for stream in streams]
    assert vocoder.calls[:2] == [2, 2] and vocoder.most == 2
    for index, samples in enumerate(audio):
        np.testing.assert_array_equal(samples, np.full(8, index, np.float32))
    stage.close()


class _HeldWindows(_Windows):
    """First windows wait until the test releases them."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def vocode_windows(self, windows: Any, voices: Any) -> list[np.ndarray]:
        with self.lock:
            self.running += 1
            self.calls.append(len(windows))
        try:
            self.release.wait(WAIT_BOUND_SECONDS)
        finally:
            with self.lock:
                self.running -= 1
        return [np.full(len(w) * 4, float(w[0, 0]), np.float32) for w in windows]


def test_the_decode_step_waits_while_a_burst_s_first_windows_take_both_cores(monkeypatch):
    """While the two halves of a burst's first windows decode, the decode scheduler's next
    step waits (`hold_lm`, which the engine gives its scheduler): on two cores a step would
    take one from listeners still waiting for their first audio. It goes on once they are
    decoded, and a step never waits while no first windows decode."""
    monkeypatch.setattr(stages, "FIRST_WINDOWS_HOLD_SECONDS", WAIT_BOUND_SECONDS)
    vocoder = _HeldWindows()
    stage = VocoderStage(vocoder, lm_idle=lambda: False)
    stage.hold_lm()  # nothing decodes: returns at once
    streams = _first_windows_of(stage, 4)
    wait_until(lambda: vocoder.running == 2, "both halves are decoding")
    step = threading.Thread(target=stage.hold_lm)
    step.start()
    step.join(0.2)
    assert step.is_alive(), "the step went on while the first windows decoded"
    vocoder.release.set()
    step.join(WAIT_BOUND_SECONDS)
    assert not step.is_alive()
    assert [len(np.concatenate(list(stream))) for stream in streams] == [8] * 4
    stage.close()


def test_the_engine_s_decode_steps_wait_for_its_vocoder_stage():
    engine = onnx_tts.load(cache_dir=None)
    try:
        assert engine.scheduler.hold_steps == engine.executor.vocoder.hold_lm
        # Its one-thread LM takes the vocoder's core for half of a step while that idles.
        if available_cores() >= 2:
            assert engine.scheduler.second_core_free == engine.executor.vocoder.idle
    finally:
        engine.close()


def test_steps_split_in_halves_on_two_cores_make_the_same_audio():
    """Six sentences decode as six rows of one step; run as two halves of three rows at once
    (the vocoder idle) they give the audio of one run of six, sample for sample."""
    text = " ".join(
        [
            "The first row speaks.",
            "A second one follows.",
            "Then comes the third.",
            "Here is the fourth.",
            "The fifth is short.",
            "And the sixth ends it.",
        ]
    )
    audio = {}
    for split in (False, True):
        engine = onnx_tts.load(cache_dir=None)
        try:
            engine.scheduler.second_core_free = lambda split=split: split
            audio[split] = engine.synthesize(text, seed=3, cache=False).samples
            slots = engine.scheduler.slots
            assert (slots.split_runs > 0) == split
        finally:
            engine.close()
    np.testing.assert_array_equal(audio[True], audio[False])


def test_many_clients_coming_and_going_leave_nothing_behind(codec_engine):
    """64 concurrent streams, a third of them abandoned at a random point: afterwards no row,
    no stream of the vocoder stage and no extra thread remains."""
    threads_before = threading.active_count()
    rng = random.Random(7)
    plans = [(TEXTS[i % 4], i, rng.random() < 0.35, rng.randint(0, 3)) for i in range(64)]
    errors: list[BaseException] = []

    def client(plan: tuple[str, int, bool, int]) -> None:
        text, seed, leave, after = plan
        try:
            stream = codec_engine.stream(text, seed=seed)
            for index, _ in enumerate(stream):
                if leave and index >= after:
                    break
            stream.close()
        except BaseException as error:  # collected, asserted below
            errors.append(error)

    with ThreadPoolExecutor(64) as pool:
        list(pool.map(client, plans))
    assert errors == []
    wait_until(lambda: codec_engine.stats()["active_rows"] == 0, "no row is active")
    wait_until(lambda: codec_engine.stats()["vocoder"]["open_streams"] == 0, "no stream is open")
    assert codec_engine.stats()["queued"] == 0
    wait_until(lambda: threading.active_count() <= threads_before, "no thread is left")


def test_a_cancelled_stream_stops_in_both_stages(codec_engine):
    cancel = CancelToken()
    stream = codec_engine.stream(" ".join(TEXTS * 3), seed=1, cancel=cancel)
    next(stream)
    cancel.cancel()  # e.g. a server whose client went away
    wait_until(lambda: codec_engine.stats()["active_rows"] == 0, "the cancelled row is free")
    with pytest.raises(CancelledError):  # never a stream that ends as if it were whole
        while True:
            next(stream)
    stream.close()
    wait_until(lambda: codec_engine.stats()["vocoder"]["open_streams"] == 0, "no stream is open")


# -- admission ---------------------------------------------------------------------------------


class _Load:
    """Busy seconds of two stages and the audio seconds they made, advanced by hand."""

    def __init__(self) -> None:
        self.busy = [0.0, 0.0]
        self.audio = 0.0

    def __call__(self) -> tuple[float, ...]:
        return tuple(self.busy)

    def made(self) -> float:
        return self.audio


def _admission(load: _Load, **settings) -> Admission:
    settings = {"max_streams": 64, "max_waiting": 8, **settings}
    return Admission(load, load.made, **settings)


def test_admission_learns_capacity_from_the_cost_of_a_second_of_audio(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr("onnx_tts.pipeline.admission.time.monotonic", lambda: clock[0])
    load = _Load()
    admission = _admission(load, target_utilisation=0.8, cores=2)
    for _ in range(4):  # unmeasured: admitted up to max_streams
        assert admission.try_admit(admission.enqueue())
    admission.capacity()  # first sample
    clock[0] += 1.0
    load.busy = [0.2, 0.8]  # 4 s of audio kept the vocoder 80% busy: 0.2 s per audio second
    load.audio = 4.0
    assert admission.capacity() == 4  # 0.8 / 0.2 real-time streams (cores: 2 * 0.8 / 0.25)
    waiting = admission.enqueue()
    assert not admission.try_admit(waiting)  # full: it waits
    admission.release()
    assert admission.try_admit(waiting)


def test_one_fast_stream_is_not_taken_for_a_full_machine(monkeypatch):
    """A stream is generated faster than it plays: one stream that keeps a stage 80% busy
    while making 10 s of audio a second costs 0.08 of that stage per real-time listener, so
    about 10 such listeners fit, not 1 (the estimate per active stream said 1)."""
    clock = [1000.0]
    monkeypatch.setattr("onnx_tts.pipeline.admission.time.monotonic", lambda: clock[0])
    load = _Load()
    admission = _admission(load, target_utilisation=0.8, cores=2)
    assert admission.try_admit(admission.enqueue())
    admission.capacity()
    clock[0] += 1.0
    load.busy, load.audio = [0.6, 0.8], 10.0  # 0.06 and 0.08 s per second of audio
    assert admission.capacity() == 10  # 0.8 / 0.08 (all cores: 2 * 0.8 / 0.14 = 11.4)
    assert admission.stats()["utilisation"] == 0.8


def test_the_cores_bound_capacity_when_both_stages_are_costly(monkeypatch):
    """Two stages on one core cannot both run: their costs add up."""
    clock = [1000.0]
    monkeypatch.setattr("onnx_tts.pipeline.admission.time.monotonic", lambda: clock[0])
    load = _Load()
    admission = _admission(load, target_utilisation=0.8, cores=1)
    assert admission.try_admit(admission.enqueue())
    admission.capacity()
    clock[0] += 1.0
    load.busy, load.audio = [0.5, 0.5], 5.0  # 0.1 s each per second of audio
    assert admission.capacity() == 4  # 1 * 0.8 / 0.2 (each stage alone: 0.8 / 0.1 = 8)


def test_admission_holds_new_streams_while_a_listener_runs_dry():
    lead = [5.0]
    admission = _admission(_Load(), max_streams=8, max_waiting=4, lead=lambda arrived: lead[0])
    assert admission.try_admit(admission.enqueue())
    lead[0] = 0.02  # the playing listener is about to stall
    ticket = admission.enqueue()
    assert not admission.try_admit(ticket)
    lead[0] = 2.0
    assert admission.try_admit(ticket)


def test_requests_that_arrive_together_start_together():
    """A new stream waits while a listener that was playing when its request arrived is about
    to run dry; a listener that started after it arrived never holds it back (8 clients that
    started at once were admitted one by one, each waiting for the stream admitted before it
    to get ahead of its player)."""
    from types import SimpleNamespace

    from onnx_tts.server.engines import SpeechModel

    model = SpeechModel("m", engine=None)  # type: ignore[arg-type]
    admission = _admission(_Load(), max_streams=8, max_waiting=4, lead=model.lead)
    assert admission.try_admit(admission.enqueue(None))  # nothing plays yet
    now = time.perf_counter()
    before, after = PlaybackClock(), PlaybackClock()
    before.chunk(now - 1.0, 1.05)  # playing since 1 s ago, dry in 0.05 s
    after.chunk(now - 0.2, 0.25)  # started 0.2 s ago, dry in 0.05 s
    arrived = now - 0.5  # between the two starts
    model.jobs = {1: SimpleNamespace(clock=after)}
    together = admission.enqueue(arrived)
    assert admission.try_admit(together)  # `after` started after it arrived
    later = admission.enqueue(now)
    assert not admission.try_admit(later)  # it arrived while `after` played: it waits
    admission.abandon(later)
    model.jobs = {1: SimpleNamespace(clock=after), 2: SimpleNamespace(clock=before)}
    ticket = admission.enqueue(arrived)
    assert not admission.try_admit(ticket)  # `before` played when it arrived, and runs dry
    before.chunk(time.perf_counter(), 100.0)  # now far ahead of its player
    assert admission.try_admit(ticket)


def test_a_stalled_listener_lowers_the_limit_and_each_calm_sample_raises_it(monkeypatch):
    """What the costs miss, the listeners show: a sample in which one of 6 active listeners
    stalled caps admission at 5 (a short lead alone does not: a new stream always has one);
    each sample without a stall allows one more, whatever the leads (short streams arriving
    all the time always include one that just started)."""
    clock = [1000.0]
    monkeypatch.setattr("onnx_tts.pipeline.admission.time.monotonic", lambda: clock[0])
    lead, stalls = [5.0], [0]
    admission = _admission(
        _Load(), max_streams=64, lead=lambda arrived: lead[0], stalls=lambda: stalls[0]
    )
    for _ in range(6):
        assert admission.try_admit(admission.enqueue())
    admission.capacity()  # first sample
    lead[0] = 0.1
    clock[0] += 1.0
    assert admission.capacity() == 64  # about to run dry, not stalled
    stalls[0] = 2
    clock[0] += 1.0
    assert admission.capacity() == 5
    assert admission.stats()["limit_lowered"] == 1
    admission.release()
    admission.release()  # 4 active, the limit is 5
    lead[0] = 0.4  # a stream just started: little audio ahead, no stall
    clock[0] += 1.0
    assert admission.capacity() == 6
    waiting = [admission.enqueue() for _ in range(3)]
    assert [admission.try_admit(t) for t in waiting] == [True, True, False]
    stalls[0] = 3  # another stall with 6 active: back to 5
    clock[0] += 1.0
    assert admission.capacity() == 5 and admission.stats()["limit_lowered"] == 2


def test_a_model_slower_than_real_time_is_not_held_to_one_stream(monkeypatch):
    """A stage busy 1.5 s per second of audio cannot keep even one listener fed: holding the
    rest back would only serialise them, so every stream is admitted (to be batched) and the
    stats say the model is not real-time here."""
    clock = [1000.0]
    monkeypatch.setattr("onnx_tts.pipeline.admission.time.monotonic", lambda: clock[0])
    load = _Load()
    admission = _admission(load, max_streams=8, lead=lambda arrived: 0.0, cores=2)
    assert admission.try_admit(admission.enqueue())
    admission.capacity()
    clock[0] += 1.0
    load.busy, load.audio = [0.9, 0.0], 0.6  # 1.5 s of decode per second of audio
    assert admission.capacity() == 8
    assert [admission.try_admit(admission.enqueue()) for _ in range(8)] == [True] * 7 + [False]
    assert admission.stats()["real_time"] is False


def test_a_model_whose_one_stream_is_slower_than_real_time_admits_all(monkeypatch):
    """A big LM that batches well (its cost per audio second at 8 rows says 2 streams fit)
    but whose every stream, even alone, gets only 0.5 s of audio per second: no listener can
    be kept fed, so admission stops holding streams back (and the stats say why)."""
    clock = [1000.0]
    monkeypatch.setattr("onnx_tts.pipeline.admission.time.monotonic", lambda: clock[0])
    load = _Load()
    admission = _admission(load, max_streams=8, cores=2)
    assert admission.try_admit(admission.enqueue())
    admission.capacity()
    for _ in range(8):  # one stream alone: 0.4 s busy, 0.25 s of audio per 0.5 s sample
        clock[0] += 0.5
        load.busy = [load.busy[0] + 0.4, load.busy[1]]
        load.audio += 0.25
        admission.capacity()
    stats = admission.stats()
    assert stats["real_time"] is False and stats["stream_rate"] == 0.5
    assert stats["capacity"] == 8


def test_admission_queue_is_bounded_and_first_come_first_served():
    admission = _admission(_Load(), max_streams=1, max_waiting=2)
    assert admission.try_admit(admission.enqueue())
    first, second = admission.enqueue(), admission.enqueue()
    assert admission.enqueue() is None  # the queue holds two
    admission.release()
    assert not admission.try_admit(second)  # not its turn
    assert admission.try_admit(first)
    admission.abandon(second, timed_out=True)
    stats = admission.stats()
    assert stats["refused_queue_full"] == 1 and stats["refused_timeout"] == 1
    assert stats["waiting"] == 0 and stats["active"] == 1


@pytest.mark.parametrize(
    ("seconds", "active", "expected"), [(8.0, 4, 2), (8.0, 0, 1), (300.0, 1, 30), (0.5, 9, 1)]
)
def test_retry_after_is_about_when_a_stream_ends(seconds, active, expected):
    assert retry_after_seconds(seconds, active) == expected


def test_threads_zero_gives_each_stage_its_share_of_the_cores():
    """--threads 0 (the default): the decode and vocoder stages run at once, so their
    sessions split the cores instead of each taking all of them; explicit threads are kept."""
    from onnx_tts.pipeline import available_cores
    from onnx_tts.pipeline.stages import threads_per_stage

    shares = threads_per_stage(available_cores())
    assert shares["decode"] + shares["vocoder"] == max(2, available_cores())
    engine = onnx_tts.load(codec_lm_dir(), cache_dir=None, threads=0)
    threads = {role: s.options.intra_op_threads for role, s in engine.model.graphs.sessions.items()}
    assert threads["vocoder"] == shares["vocoder"] and threads["lm"] == shares["decode"]
    assert threads["encoder"] == shares["encoder"]
    engine.close()
    explicit = onnx_tts.load(codec_lm_dir(), cache_dir=None, threads=3)
    assert {s.options.intra_op_threads for s in explicit.model.graphs.sessions.values()} == {3}
    explicit.close()
    assert threads_per_stage(8) == {"decode": 4, "vocoder": 4, "encoder": 4}
    assert threads_per_stage(1) == {"decode": 1, "vocoder": 1, "encoder": 1}


def test_a_listener_with_a_clock_gets_growing_windows_a_reader_the_fixed_stride():
    """Server streams carry their listener's clock: after the short first chunk their windows
    grow to the stride (the listener holds what the next window needs); a stream read as fast
    as it is made keeps the fixed stride (fewer windows to decode)."""
    from onnx_tts.decoding.request import PlaybackClock

    engine = onnx_tts.load(cache_dir=None, max_batch=1)
    text = " ".join(TEXTS)
    played = [len(c) for c in engine.stream(text, seed=3, clock=PlaybackClock(0.1))]
    read = [len(c) for c in engine.stream(text, seed=3)]
    engine.close()
    assert sum(played) == sum(read)
    assert played[0] == read[0]  # the same first chunk
    assert len(played) > len(read) and played[1] < read[1]


def test_a_fault_in_the_decode_step_fails_its_requests_and_the_worker_lives_on(monkeypatch):
    """A fault outside any row's own work (here: the step itself raises) killed the worker
    thread, and every stream then waited forever (attack round three). Now the requests of
    that step get the error and the next request decodes."""
    from onnx_tts.decoding.scheduler import DecodeScheduler
    from onnx_tts.errors import SessionError

    engine = onnx_tts.load(codec_lm_dir(), cache_dir=None, max_batch=8)
    original, calls = DecodeScheduler._step, {"n": 0}

    def flaky(self, rows):
        calls["n"] += 1
        if calls["n"] == 6:
            raise SessionError("injected LM fault")
        return original(self, rows)

    monkeypatch.setattr(DecodeScheduler, "_step", flaky)

    def listen(seed: int) -> object:
        try:
            return np.concatenate(list(engine.stream(TEXTS[seed % 4], seed=seed)))
        except SessionError as error:
            return error

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(listen, range(8)))
    assert any(isinstance(o, SessionError) for o in outcomes)
    assert len(engine.synthesize("After the fault.", seed=1).samples) > 0
    wait_until(lambda: engine.stats()["active_rows"] == 0, "no row is active")
    engine.close()


@pytest.mark.parametrize("fault", ["raises", "nan"])
def test_one_bad_window_in_a_batched_call_fails_its_stream_alone(fault):
    """Eight streams share batched vocoder calls; the vocoder breaks (or returns NaN) for one
    of them: that stream fails, the seven others get exactly their own audio (the batched call
    failed as a whole before, taking its other streams with it)."""
    from onnx_tts.errors import OnnxTTSError

    engine = onnx_tts.load(codec_lm_dir(), cache_dir=None, max_batch=8)
    alone = [np.concatenate(list(engine.stream(TEXTS[i % 4], seed=i))) for i in range(8)]
    backend = engine.model
    original_windows, original_one = backend.vocoder.vocode_windows, backend.vocoder.vocode

    def is_bad(voice) -> bool:
        return np.array_equal(np.asarray(voice["speaker_embedding"]), marked)

    def broken(waveform_or_codes, voice):
        if is_bad(voice):
            if fault == "raises":
                raise RuntimeError("injected vocoder fault")
            return np.full(len(waveform_or_codes) * backend.hop_length, np.nan, np.float32)
        return original_one(waveform_or_codes, voice)

    def broken_windows(windows, voices):
        if any(is_bad(v) for v in voices):
            if fault == "raises":
                raise RuntimeError("injected vocoder fault")
            out = original_windows(windows, voices)
            pairs = zip(out, voices, strict=True)
            return [np.full_like(w, np.nan) if is_bad(v) else w for w, v in pairs]
        return original_windows(windows, voices)

    backend.vocoder.vocode, backend.vocoder.vocode_windows = broken, broken_windows
    voice = engine.voice(None)
    marked = np.asarray(voice["speaker_embedding"], np.float32) + np.float32(0.25)
    bad_voice = {**voice, "speaker_embedding": marked}

    def listen(i: int) -> object:
        try:
            v = bad_voice if i == 3 else voice
            return np.concatenate(list(engine.stream(TEXTS[i % 4], seed=i, voice=v)))
        except (OnnxTTSError, RuntimeError) as error:
            return error

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(listen, range(8)))
    engine.close()
    assert isinstance(outcomes[3], Exception)
    for i, outcome in enumerate(outcomes):
        if i != 3:
            np.testing.assert_array_equal(outcome, alone[i])


def test_short_texts_are_planned_one_at_a_time_and_a_long_one_beside_them(monkeypatch):
    """A burst's texts plan one after another (each ready as soon as it can be, not all as
    late as the last); a text over SERIAL_PLAN_CHARS plans beside them."""
    from onnx_tts.pipeline.planner import SERIAL_PLAN_CHARS

    engine = onnx_tts.load(cache_dir=None)
    text_of = engine.model.text
    chunks = text_of.chunks
    order: list[str] = []
    first_inside, release, long_inside = threading.Event(), threading.Event(), threading.Event()
    names = {"First one.": "a", "Second one.": "b"}

    def recorded(text: str, options: Any) -> Any:
        name = names.get(text, "long")
        order.append(f"{name} in")
        if name == "a":
            first_inside.set()
            assert release.wait(WAIT_BOUND_SECONDS)
        if name == "long":
            long_inside.set()
        made = chunks(text, options)
        order.append(f"{name} out")
        return made

    monkeypatch.setattr(text_of, "chunks", recorded)
    long_text = "A long text. " * (SERIAL_PLAN_CHARS // 12 + 1)
    plans = [lambda t=t: engine.planner.plan(t, None, {}) for t in ("Second one.", long_text)]
    try:
        with ThreadPoolExecutor(3) as pool:
            first = pool.submit(engine.planner.plan, "First one.", None, {})
            assert first_inside.wait(WAIT_BOUND_SECONDS)
            others = [pool.submit(plan) for plan in plans]
            assert long_inside.wait(WAIT_BOUND_SECONDS)  # beside the short one in progress
            time.sleep(0.05)  # room for the second short text to start, were it not held
            release.set()
            for future in (first, *others):
                assert future.result(WAIT_BOUND_SECONDS).chunks
        assert order.index("b in") > order.index("a out")
        assert order.index("long in") < order.index("a out")
    finally:
        engine.close()


def test_a_stream_whose_construction_fails_is_collected_quietly(monkeypatch):
    """A stream that never finished being made (refused options here; a signal's exception
    raised inside it under the CLI) leaves nothing to close: collecting it reports nothing
    (it used to print 'Exception ignored in VocoderStream.__del__' after the CLI's last line)."""
    import gc

    unraisable: list[Any] = []
    monkeypatch.setattr("sys.unraisablehook", unraisable.append)
    stage = VocoderStage(_RecordingVocoder(hop=4))
    request = _one_shot_request("primed")
    request.prime = np.zeros((2, 1), np.int64)  # a primed stream needs a stateful decoder
    try:
        with pytest.raises(OnnxTTSError, match="decoder with a state"):
            stage.open(request, StreamingOptions(first_chunk_frames=4, stride_frames=4), 4)
        gc.collect()
        assert unraisable == []
    finally:
        stage.close()

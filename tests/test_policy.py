"""The scheduling policy as one replaceable part: its decisions are plain data, checked here
without a model (deadline and FIFO side by side), then through an engine as users load it
(`onnx_tts.load(policy=...)`): which request a busy scheduler admits next."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import onnx_tts
from onnx_tts.decoding.policy import (
    DeadlinePolicy,
    DecodePlan,
    DecodeView,
    FifoPolicy,
    StreamLoad,
    Urgency,
    make_policy,
)
from onnx_tts.errors import InputError
from tests.conftest import codec_lm_dir

NOW = 1000.0


def _u(priority: int = 0, due: float = NOW + 10, order: int = 0) -> Urgency:
    return Urgency(priority, due, order)


WAITING = (
    _u(due=NOW + 60, order=0),  # arrived first, due late
    _u(due=NOW + 1, order=1),  # due soon
    _u(priority=-1, due=NOW + 90, order=2),  # a higher priority
    _u(due=NOW + 5, order=3),
)


def test_deadline_admits_by_priority_then_due_time_into_the_lowest_free_rows():
    plan = DeadlinePolicy().schedule(DecodeView(WAITING, (1, 3), (), NOW))
    assert plan.admit == ((2, 1), (1, 3))  # priority -1 first, then the one due soonest
    # Their prefills start (in admission order); a row being prefilled never steps.
    assert plan.prefill == (1, 3) and plan.step == () and plan.sit_out == ()


def test_fifo_admits_in_arrival_order():
    plan = FifoPolicy().schedule(DecodeView(WAITING, (0, 2, 5), (), NOW))
    assert plan.admit == ((0, 0), (1, 2), (2, 5))


def test_no_free_row_admits_nothing_and_every_quiet_row_steps():
    active = ((0, _u(due=NOW + 5)), (1, _u(due=NOW + 8)))
    for policy in (DeadlinePolicy(), FifoPolicy()):
        plan = policy.schedule(DecodeView(WAITING, (), active, NOW))
        assert plan == DecodePlan((), (0, 1), (), ())


def test_deadline_paces_rows_with_audio_ahead_while_one_is_urgent():
    active = (
        (0, _u(due=NOW + 0.2)),  # about to run dry: urgent
        (1, _u(due=NOW + 0.9)),  # within the ahead window: steps too
        (2, _u(due=NOW + 3.0)),  # 3 s of audio buffered: sits out
    )
    plan = DeadlinePolicy().schedule(DecodeView((), (), active, NOW))
    assert plan.step == (0, 1) and plan.sit_out == (2,)
    # FIFO lets every row step whatever its listener holds.
    assert FifoPolicy().schedule(DecodeView((), (), active, NOW)).step == (0, 1, 2)
    # Nothing urgent: nobody waits.
    calm = tuple((row, _u(due=NOW + 2 + row)) for row in range(3))
    assert DeadlinePolicy().schedule(DecodeView((), (), calm, NOW)).sit_out == ()


def test_a_prompt_being_prefilled_never_makes_decoding_rows_sit_out():
    """A new stream's prompt runs apart from the step (or a chunk per round): rows with plenty
    of audio buffered go on stepping meanwhile (sitting out would idle the decode worker, or
    make a chunked prefill run whole); once it decodes, it paces them like any row."""
    active = ((0, _u(due=NOW + 4.0)),)  # a listener with 4 s buffered
    waiting = (_u(due=NOW + 0.1, order=7),)  # a new stream whose first audio is due now
    plan = DeadlinePolicy().schedule(DecodeView(waiting, (1,), active, NOW))
    assert plan.admit == ((0, 1),) and plan.prefill == (1,)
    assert plan.step == (0,) and plan.sit_out == ()
    later = DeadlinePolicy().schedule(DecodeView((), (), active, NOW, ((1, waiting[0], True),)))
    assert later.prefill == (1,) and later.step == (0,) and later.sit_out == ()
    joined = DeadlinePolicy().schedule(DecodeView((), (), (*active, (1, waiting[0])), NOW))
    assert joined.step == (1,) and joined.sit_out == (0,)


def test_chunked_prefills_get_turns_most_urgent_first():
    """Prefills waiting for a chunk turn: `prefill_turns` of them per round, by urgency (FIFO:
    by arrival), after the prefills that start this round; one that does not wait gets none."""
    prefilling = (
        (4, _u(due=NOW + 3, order=0), True),
        (5, _u(due=NOW + 1, order=1), True),
        (6, _u(due=NOW + 0.5, order=2), False),  # its prompt runs something else now
    )
    view = DecodeView((_u(due=NOW + 2, order=3),), (7,), (), NOW, prefilling)
    assert DeadlinePolicy().schedule(view).prefill == (7, 5)
    assert FifoPolicy().schedule(view).prefill == (7, 4)
    both = DeadlinePolicy()
    both.prefill_turns = 2
    assert both.schedule(view).prefill == (7, 5, 4)


def test_rows_never_sit_out_while_requests_wait_for_a_row():
    """Pacing holds back rows with audio ahead only while that frees the cores for someone;
    with requests waiting for a row it would only keep the rows busy longer."""
    active = ((0, _u(due=NOW + 0.2)), (1, _u(due=NOW + 3.0)))
    paced = DeadlinePolicy().schedule(DecodeView((), (), active, NOW))
    assert paced.step == (0,) and paced.sit_out == (1,)
    waiting = (_u(due=NOW + 0.1, order=9),)
    full = DeadlinePolicy().schedule(DecodeView(waiting, (), active, NOW))
    assert full.admit == () and full.step == (0, 1) and full.sit_out == ()
    # A free row for the waiting request: pacing as usual.
    room = DeadlinePolicy().schedule(DecodeView(waiting, (2,), active, NOW))
    assert room.admit == ((0, 2),) and room.sit_out == (1,)


def test_window_order():
    windows = [_u(due=NOW + 3, order=0), _u(due=NOW - 1, order=1), _u(priority=1, order=2)]
    assert DeadlinePolicy().order(windows) == [1, 0, 2]
    assert FifoPolicy().order(windows) == [0, 1, 2]


@pytest.mark.parametrize(
    ("load", "deadline", "fifo"),
    [
        (StreamLoad(active=2, capacity=4, lead=2.0, real_time=True), True, True),
        (StreamLoad(active=4, capacity=4, lead=2.0, real_time=True), False, False),
        # A playing listener about to run dry: the deadline policy serves it first.
        (StreamLoad(active=2, capacity=4, lead=0.1, real_time=True), False, True),
        # No stream gets real time here: holding new ones back helps nobody.
        (StreamLoad(active=2, capacity=4, lead=0.1, real_time=False), True, True),
        (StreamLoad(active=0, capacity=1, lead=None, real_time=True), True, True),
    ],
)
def test_stream_admission(load, deadline, fifo):
    assert DeadlinePolicy().stream_may_start(load) is deadline
    assert FifoPolicy().stream_may_start(load) is fifo


def test_policies_by_name():
    assert make_policy(None).name == "deadline"
    assert make_policy("fifo").name == "fifo"
    custom = FifoPolicy()
    assert make_policy(custom) is custom
    with pytest.raises(InputError, match="unknown scheduling policy 'lifo'"):
        make_policy("lifo")
    with pytest.raises(InputError, match="policy must be one of deadline, fifo"):
        onnx_tts.load(codec_lm_dir(), policy="lifo", cache_dir=None)


@pytest.mark.parametrize(("policy", "expected"), [("deadline", "BCA"), ("fifo", "ABC")])
def test_a_busy_engine_admits_what_its_policy_says(policy, expected):
    """One row, busy with a first request; three more wait (A, then B with a higher priority,
    then C due before A): the deadline policy admits B, C, A; FIFO admits A, B, C."""
    engine = onnx_tts.load(codec_lm_dir(), max_batch=1, cache_dir=None, policy=policy)
    try:
        assert engine.scheduler.policy.name == policy
        model = engine.model
        voice, sampling = engine.voice(), model.sampling_defaults()
        [chunk] = model.text.chunks("A short sentence to keep the row busy.", {})
        started: list[str] = []
        lock = threading.Lock()
        streams = []
        with engine.scheduler._cv:  # held: the worker sees all four at its next round
            streams.append(engine.generate(chunk, voice, sampling))
        first = next(streams[0])  # the first request holds the only row now
        assert np.size(first)
        program_admit = model.program.admit
        try:

            def admit(state, row, request):
                with lock:
                    started.append(request.options.get("name"))
                return program_admit(state, row, request)

            model.program.admit = admit
            with engine.scheduler._cv:
                for name, timing in (("A", {}), ("B", {"priority": -1}), ("C", {"deadline": 0})):
                    streams.append(
                        engine.executor.frames(
                            _request(engine, chunk, voice, sampling, name, **timing)
                        )
                    )
            for stream in streams:
                list(stream)
        finally:
            model.program.admit = program_admit
        assert "".join(name for name in started if name in "ABC") == expected
    finally:
        engine.close()


def _request(engine, chunk, voice, sampling, name, **timing):
    from onnx_tts.decoding.request import Request

    return Request(chunk, voice, sampling, {"name": name}, **timing)

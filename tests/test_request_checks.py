"""Round five: no argument stops the engine. Every request option is checked at the call; a
failure inside the worker fails that request alone; a cancelled request ends as cancelled and
nothing cut short reaches a cache; the silence a text may ask for has one bound; a server's
threads return to their resting count after a burst of clients that leave."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

import onnx_tts
from benchmarks.live_server import LiveServer
from onnx_tts.decoding.request import Request
from onnx_tts.frontend.ssml import MAX_TOTAL_BREAK_SECONDS
from tests.waiting import wait_until

LONG_TEXT = "This sentence is long enough to keep the decoder busy for a little while. " * 4
BAD_CALLS = [
    ({"priority": "high"}, "priority"),
    ({"priority": 10**30}, "priority"),
    ({"priority": 1.5}, "priority"),
    ({"deadline": "soon"}, "deadline"),
    ({"deadline": [1]}, "deadline"),
    ({"deadline": 10**400}, "deadline"),
    ({"deadline": float("nan")}, "deadline"),
    ({"cancel": "x"}, "cancel"),
    ({"speed": 10**400}, "speed"),
    ({"speed": float("inf")}, "speed"),
    ({"sentence_silence": 10**400}, "sentence_silence"),
    ({"sentence_silence": None, "seed": 10**5000}, "seed"),
    ({"temperature": 10**400}, "temperature"),
    ({"top_k": 10**400}, "top_k"),
]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory):
    cache = tmp_path_factory.mktemp("request-checks-cache")
    results = cache / "results"  # the result cache on, in memory and on disk
    with onnx_tts.load(cache_dir=str(cache), result_cache_dir=str(results), max_batch=8) as engine:
        yield engine


@pytest.mark.parametrize(("options", "name"), BAD_CALLS)
@pytest.mark.parametrize("call", ["synthesize", "stream"])
def test_a_bad_option_is_refused_at_the_call_naming_it(engine, call, options, name):
    with pytest.raises(onnx_tts.InputError) as caught:
        result = getattr(engine, call)("Hello there.", **options)
        list(result)  # (a stream is checked before its first chunk: never reached)
    message = str(caught.value)
    assert message.startswith(name), message
    assert len(message) < 300  # an integer of 5,000 digits is not quoted


def test_bad_calls_beside_a_long_request_leave_it_and_the_engine_whole(engine):
    solo = engine.synthesize(LONG_TEXT, seed=3, cache=False)
    outcome: dict[str, object] = {}

    def long_request() -> None:
        try:
            outcome["audio"] = engine.synthesize(LONG_TEXT, seed=3, cache=False)
        except Exception as error:  # reported below
            outcome["error"] = error

    worker = threading.Thread(target=long_request)
    worker.start()
    refused = 0
    for options, _ in BAD_CALLS * 2:
        with pytest.raises(onnx_tts.InputError):
            engine.synthesize("Bad.", cache=False, **options)
        refused += 1
    worker.join(600)
    assert "error" not in outcome, outcome.get("error")
    assert np.array_equal(outcome["audio"].samples, solo.samples)  # type: ignore[union-attr]
    assert refused == 2 * len(BAD_CALLS)
    after = engine.synthesize("Still speaking.", seed=1, cache=False)
    assert after.duration > 0.3


def test_a_request_made_by_hand_is_checked_before_it_reaches_the_worker(engine):
    voice = engine.voice()
    sampling = engine.model.sampling_defaults()
    chunk = engine.model.text.chunks("Hello.", {})[0]
    for bad in ({"deadline": "soon"}, {"priority": None}, {"cancel": 3}, {"clock": "x"}):
        with pytest.raises(onnx_tts.InputError):
            Request(chunk, voice, sampling, **bad)


class FailingClock(onnx_tts.PlaybackClock):
    """A player whose clock is broken (a caller's own subclass)."""

    def runs_dry_at(self) -> float | None:
        raise RuntimeError("this player's clock broke")


def test_a_request_whose_timing_breaks_fails_alone(engine):
    solo = engine.synthesize(LONG_TEXT, seed=4, cache=False)
    outcome: dict[str, object] = {}

    def healthy() -> None:
        outcome["audio"] = engine.synthesize(LONG_TEXT, seed=4, cache=False)

    worker = threading.Thread(target=healthy)
    worker.start()
    with pytest.raises(RuntimeError, match="clock broke"):
        for _ in engine.stream(LONG_TEXT, seed=5, cache=False, clock=FailingClock()):
            pass
    worker.join(600)
    assert np.array_equal(outcome["audio"].samples, solo.samples)  # type: ignore[union-attr]


def test_a_watch_that_raises_cancels_only_its_own_request(engine):
    def broken() -> bool:
        raise ValueError("no")

    frames = engine.generate(
        engine.model.text.chunks("Hello there.", {})[0], engine.voice(), should_stop=broken
    )
    assert list(frames) == []  # cancelled at the first look, nothing generated
    assert engine.synthesize("Fine.", seed=1, cache=False).duration > 0.2
    with pytest.raises(onnx_tts.InputError, match="should_stop must be callable"):
        engine.generate("x", engine.voice(), should_stop=5)  # type: ignore[arg-type]


def _cancel_after_first_sentence(engine, call: str, seed: int) -> None:
    """The request's own holder cancels it once its first sentence is out."""
    token = onnx_tts.CancelToken()
    if call == "synthesize":
        engine.synthesize(LONG_TEXT, seed=seed, cancel=token, progress=lambda *_: token.cancel())
    else:
        for _ in engine.stream(LONG_TEXT, seed=seed, cancel=token):
            token.cancel()


@pytest.mark.parametrize("call", ["synthesize", "stream"])
def test_a_cancelled_request_is_an_error_and_never_cached(engine, call):
    engine.clear_cache()
    whole = engine.synthesize(LONG_TEXT, seed=7, cache=False)
    with pytest.raises(onnx_tts.CancelledError, match="cancelled"):
        _cancel_after_first_sentence(engine, call, seed=7)
    # (a sentence finished before the cancel may be stored: it is whole.) The next identical
    # requests, uncancelled: whole, through both calls and both tiers.
    assert np.array_equal(engine.synthesize(LONG_TEXT, seed=7).samples, whole.samples)
    streamed = np.concatenate(list(engine.stream(LONG_TEXT, seed=7)))
    assert len(streamed) == len(whole.samples)
    engine.results.clear(["memory"])
    assert np.array_equal(engine.synthesize(LONG_TEXT, seed=7).samples, whole.samples)
    assert engine.results.stats()["disk"]["hits"] >= 1


@pytest.mark.parametrize("call", ["synthesize", "stream"])
def test_a_request_already_cancelled_says_so_even_when_cached(engine, call):
    engine.synthesize("Cached already.", seed=2)  # stored
    token = onnx_tts.CancelToken()
    token.cancel()
    with pytest.raises(onnx_tts.CancelledError):
        list(getattr(engine, call)("Cached already.", seed=2, cancel=token))
    with pytest.raises(onnx_tts.CancelledError):
        list(getattr(engine, call)("Never made before.", seed=2, cancel=token))


def test_the_silence_a_text_asks_for_has_one_bound(engine):
    bound = int(MAX_TOTAL_BREAK_SECONDS)
    sentences = " ".join(["Yes."] * 62)
    with pytest.raises(onnx_tts.InputError, match="sentence_silence"):
        engine.synthesize(sentences, sentence_silence=10.0)  # 61 gaps of 10 s: 610 s
    breaks = '<break time="10s"/>' * (bound // 10 - 1)
    with pytest.raises(onnx_tts.InputError, match="silence"):
        engine.synthesize(f"<speak>{breaks}Yes. Yes. No.</speak>", sentence_silence=10.0)
    exactly = engine.synthesize(f"<speak>Yes.{breaks}<break time='10s'/>No.</speak>")
    assert exactly.duration >= bound
    tenths = '<break time="100ms"/>' * 100  # ten seconds in tenths: no float drift
    assert engine.synthesize(f"<speak>{tenths}Yes.</speak>").duration >= 10.0


def _server_threads(server: LiveServer) -> int:
    status = Path(f"/proc/{server.process.pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("Threads:")).split()[1])


def _leave_early(url: str, index: int) -> None:
    body = {
        "model": "tts-1",
        "input": f"Client {index} asks for a sentence or two. Then it goes away.",
        "voice": "alloy",
        "response_format": "wav",
    }
    try:
        with (
            httpx.Client(timeout=120) as client,
            client.stream("POST", url + "/v1/audio/speech", json=body),
        ):
            time.sleep(0.02 + 0.006 * (index % 30))  # gone 20-200 ms after sending
    except httpx.HTTPError:
        pass


@pytest.mark.parametrize("prefill", ["apart", "chunked"])
def test_server_threads_return_to_their_count_after_clients_leave(moss_official, tmp_path, prefill):
    server = LiveServer(tmp_path, "--model", str(moss_official), "--prefill", prefill)
    try:
        warm = httpx.post(
            server.url + "/v1/audio/speech",
            json={
                "model": "tts-1",
                "input": "Warm up the server now.",
                "voice": "alloy",
                "seed": 1,
            },
            timeout=600,
        )
        assert warm.status_code == 200
        resting = wait_until(
            lambda: (
                (n := _server_threads(server), time.sleep(0.5), n == _server_threads(server))
                and _server_threads(server)
            ),
            "the server's thread count to settle",
        )
        clients = [threading.Thread(target=_leave_early, args=(server.url, i)) for i in range(30)]
        for client in clients:
            client.start()
        for client in clients:
            client.join(600)
        wait_until(
            lambda: _server_threads(server) <= resting,
            f"the server's threads back to {resting} after the clients left",
            bound=180,
            poll_seconds=0.5,
        )
        assert httpx.get(server.url + "/health", timeout=30).status_code == 200
    finally:
        server.stop()
    assert "Traceback" not in server.log()

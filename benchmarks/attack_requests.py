"""Round five (issue 43), category "requests": no argument stops the engine.

Each case runs in its own subprocess against the staged pipeline (attack_live's
`pipeline_case_main`), beside a long request that must come out exactly as it does alone:

- a bad `priority`, `deadline`, `cancel`, `clock`, `progress`, `should_stop`, `seed`, `speed`,
  `sentence_silence` or sampling value (strings, lists, NaN, integers of any size) is refused
  at the call, naming the option;
- a player's clock that breaks fails its own request, not the one beside it;
- a request cancelled mid-sentence (synthesize and stream) is a CancelledError, never audio
  that looks whole, and nothing cut short reaches the memory or disk tier of the result cache;
  a request whose token is already cancelled says so (cached or not);
- the silence a text asks for (breaks and sentence_silence together) has one bound, and
  exactly that bound is accepted;
- 30 streams dropped 20-200 ms after they started leave no thread behind.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.attack_live import PIPELINE, _left_behind, add

CATEGORY = "requests"
LONG = "This sentence keeps the decoder busy for a while, word after word after word. " * 4
BAD_OPTIONS: list[tuple[str, dict[str, Any]]] = [
    ("priority 'high'", {"priority": "high"}),
    ("priority 10**30", {"priority": 10**30}),
    ("priority None", {"priority": None}),
    ("deadline 'soon'", {"deadline": "soon"}),
    ("deadline [1]", {"deadline": [1]}),
    ("deadline 10**400", {"deadline": 10**400}),
    ("deadline nan", {"deadline": float("nan")}),
    ("deadline -inf", {"deadline": float("-inf")}),
    ("cancel 'x'", {"cancel": "x"}),
    ("cancel True", {"cancel": True}),
    ("progress 3", {"progress": 3}),
    ("seed 10**5000", {"seed": 10**5000}),
    ("seed -1", {"seed": -1}),
    ("speed 10**400", {"speed": 10**400}),
    ("speed nan", {"speed": float("nan")}),
    ("sentence_silence 10**400", {"sentence_silence": 10**400}),
    ("sentence_silence 'long'", {"sentence_silence": "long"}),
    ("temperature 10**400", {"temperature": 10**400}),
    ("top_k 10**400", {"top_k": 10**400}),
    ("top_p nan", {"top_p": float("nan")}),
    ("timestamps 'yes'", {"timestamps": "yes"}),
    ("cache 'yes'", {"cache": "yes"}),
]
STREAM_ONLY: list[tuple[str, dict[str, Any]]] = [
    ("clock 'x'", {"clock": "x"}),
    ("stride_frames 10**400", {"stride_frames": 10**400}),
]


def _beside_a_long_request(engine: Any, bad_call: Callable[[], Any], threads_before: int) -> str:
    """`bad_call` must be an InputError while a long request decodes; that request must come
    out as it does alone, and the engine must take the next request."""
    import onnx_tts

    solo = engine.synthesize(LONG, seed=11)
    outcome: dict[str, Any] = {}

    def long_request() -> None:
        try:
            outcome["samples"] = engine.synthesize(LONG, seed=11).samples
        except Exception as error:
            outcome["error"] = error

    worker = threading.Thread(target=long_request)
    worker.start()
    problem = ""
    for _ in range(3):  # several bad calls while it runs
        try:
            bad_call()
            problem = "the bad call was not refused"
        except onnx_tts.InputError as error:
            if len(str(error)) > 400 or "\n" in str(error):
                problem = f"the refusal is not one short line: {str(error)[:80]!r}..."
        except Exception as error:
            problem = f"the bad call failed with {type(error).__name__}: {error}"
    worker.join(300)
    if worker.is_alive():
        return "the long request never finished"
    if "error" in outcome:
        return f"the long request beside it failed: {outcome['error']!r}"
    if not np.array_equal(outcome["samples"], solo.samples):
        return "the long request beside it changed"
    if problem:
        return problem
    if engine.synthesize("After that.", seed=1).duration < 0.2:
        return "the engine no longer speaks"
    return _left_behind(engine, threads_before)


def _bad_option(call: str, options: dict[str, Any]) -> Callable[[Any, int], str]:
    def probe(engine: Any, threads_before: int) -> str:
        def bad_call() -> None:
            result = getattr(engine, call)("A bad call.", **options)
            if call == "stream":
                list(result)

        return _beside_a_long_request(engine, bad_call, threads_before)

    return probe


def _broken_clock(engine: Any, threads_before: int) -> str:
    import onnx_tts

    class Broken(onnx_tts.PlaybackClock):
        def runs_dry_at(self) -> float | None:
            raise RuntimeError("this player's clock broke")

    def call() -> None:
        try:
            list(engine.stream("A broken player.", seed=2, clock=Broken()))
        except RuntimeError as error:  # its own request fails with its own error
            raise onnx_tts.InputError(str(error)) from None

    return _beside_a_long_request(engine, call, threads_before)


def _broken_watch(engine: Any, threads_before: int) -> str:
    def broken() -> bool:
        raise ValueError("this watch broke")

    chunk = engine.model.text.chunks("A watched request.", {})[0]
    frames = list(engine.generate(chunk, engine.voice(), should_stop=broken))
    if frames:
        return "a request whose watch raises was not stopped"
    return _left_behind(engine, threads_before)


def _cached_engine(directory: str) -> Any:
    import onnx_tts
    from tests.conftest import codec_lm_dir

    return onnx_tts.load(codec_lm_dir(), cache_dir=None, result_cache_dir=directory, max_batch=8)


def _cancel_mid(call: str) -> Callable[[Any, int], str]:
    def probe(engine: Any, threads_before: int) -> str:
        import onnx_tts

        with tempfile.TemporaryDirectory() as directory, _cached_engine(directory) as cached:
            whole = cached.synthesize(LONG, seed=5, cache=False).samples
            token = onnx_tts.CancelToken()
            try:
                if call == "synthesize":
                    threading.Timer(0.05, token.cancel).start()
                    cut = cached.synthesize(LONG, seed=5, cancel=token).samples
                    if not np.array_equal(cut, whole):
                        return f"cancelled synthesize returned {len(cut)} of {len(whole)} samples"
                else:
                    for _ in cached.stream(LONG, seed=5, cancel=token):
                        token.cancel()
                    return "a cancelled stream ended as if it were whole"
            except onnx_tts.CancelledError:
                pass
            for disk_alone in (False, True):  # the memory tier, then the disk tier alone
                if disk_alone:
                    cached.results.clear(["memory"])
                again = cached.synthesize(LONG, seed=5).samples
                if not np.array_equal(again, whole):
                    return f"the cache gave {len(again)} of {len(whole)} samples after a cancel"
                streamed = np.concatenate(list(cached.stream(LONG, seed=5)))
                if len(streamed) != len(whole):
                    return f"a stream gave {len(streamed)} of {len(whole)} samples after a cancel"
        return _left_behind(engine, threads_before)

    return probe


def _already_cancelled(engine: Any, threads_before: int) -> str:
    import onnx_tts

    token = onnx_tts.CancelToken()
    token.cancel()
    for call in ("synthesize", "stream"):
        try:
            list(getattr(engine, call)("Warm up.", seed=0, cancel=token))
            return f"{call} with a cancelled token gave audio"
        except onnx_tts.CancelledError:
            pass
    return _left_behind(engine, threads_before)


def _silence_bound(engine: Any, threads_before: int) -> str:
    import onnx_tts

    try:
        engine.synthesize(" ".join(["Yes."] * 62), sentence_silence=10.0)
        return "61 gaps of 10 s of sentence_silence were accepted"
    except onnx_tts.InputError:
        pass
    breaks = '<break time="10s"/>' * 60
    exactly = engine.synthesize(f"<speak>Yes.{breaks}No.</speak>")
    if exactly.duration < 600:
        return f"exactly 600 s of breaks gave {exactly.duration:.1f} s"
    return _left_behind(engine, threads_before)


def _drop_thirty(engine: Any, threads_before: int) -> str:
    streams = [engine.stream(LONG, seed=i) for i in range(30)]
    for index, stream in enumerate(streams):
        time.sleep(0.02 + 0.006 * index)
        stream.close()
    return _left_behind(engine, threads_before)


def register_cases() -> None:
    for index, (what, options) in enumerate(BAD_OPTIONS):
        for call in ("synthesize", "stream"):
            name = f"requests_bad_{call}_{index}"
            PIPELINE[name] = _bad_option(call, options)
            add(CATEGORY, "subprocess", name, "ok", note=f"{call}({what}) beside a long request")
    for index, (what, options) in enumerate(STREAM_ONLY):
        name = f"requests_bad_stream_only_{index}"
        PIPELINE[name] = _bad_option("stream", options)
        add(CATEGORY, "subprocess", name, "ok", note=f"stream({what}) beside a long request")
    for name, probe, why in [
        ("requests_broken_clock", _broken_clock, "a player's clock that raises"),
        ("requests_broken_watch", _broken_watch, "a should_stop that raises"),
        ("requests_cancel_synthesize", _cancel_mid("synthesize"), "synthesize cancelled mid-way"),
        ("requests_cancel_stream", _cancel_mid("stream"), "a stream cancelled mid-sentence"),
        ("requests_already_cancelled", _already_cancelled, "a token cancelled before the call"),
        ("requests_silence_bound", _silence_bound, "silence past the bound, and exactly it"),
        ("requests_drop_thirty", _drop_thirty, "30 streams dropped 20-200 ms in"),
    ]:
        PIPELINE[name] = probe
        add(CATEGORY, "subprocess", name, "ok", note=why)

"""The decode scheduler: concurrent requests as rows of one LM batch (continuous batching)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import psutil
import pytest

import onnx_tts
from onnx_tts.decoding import scheduler as scheduler_module
from onnx_tts.decoding.kv_rows import MIN_SLOT_CAPACITY
from onnx_tts.decoding.request import CancelToken, PlaybackClock, Request
from onnx_tts.decoding.scheduler import DecodeScheduler, QueueFull
from onnx_tts.errors import InputError
from tests.conftest import codec_lm_dir
from tests.waiting import wait_until

TEXTS = [
    "Hi.",
    "The quick brown fox jumps over the lazy dog.",
    "One two three.",
    "A somewhat longer sentence, so that rows end at different steps.",
    "Short one.",
    "Numbers like 42 and 7 are read out loud.",
    "Batching must not change a single sample.",
    "Goodbye for now.",
]


def _load(model=None, max_batch: int = 8, **kwargs):
    return onnx_tts.load(model, cache_dir=None, threads=1, max_batch=max_batch, **kwargs)


@pytest.fixture(scope="module")
def solo_voice():
    with _load(max_batch=1) as engine:
        yield engine


@pytest.fixture(scope="module")
def batched_voice():
    with _load(max_batch=8) as engine:
        yield engine


@pytest.mark.parametrize("model", ["voice", "codec-lm"])
def test_concurrent_requests_equal_the_solo_path(model):
    """Batch invariance: 16 requests, solo and then 8 at a time as rows of one batch."""
    model = codec_lm_dir() if model == "codec-lm" else None
    solo, batched = _load(model, max_batch=1), _load(model, max_batch=8)
    assert solo.scheduler.max_batch == 1 and batched.scheduler.max_batch == 8
    jobs = [(TEXTS[i % len(TEXTS)], i) for i in range(16)]
    expected = [solo.synthesize(text, seed=seed).samples for text, seed in jobs]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda job: batched.synthesize(job[0], seed=job[1]).samples, jobs))
    differing = [i for i in range(len(jobs)) if not np.array_equal(expected[i], got[i])]
    assert differing == []
    stats = batched.stats()
    assert stats["mean_batch"] > 1.5  # rows really shared steps
    assert stats["active_rows"] == 0 and stats["queued"] == 0


def test_streams_equal_the_solo_path(solo_voice, batched_voice):
    text = "Streaming through the scheduler. It keeps every window the same."
    expected = np.concatenate(list(solo_voice.stream(text, seed=4)))

    def run(_: int) -> np.ndarray:
        return np.concatenate(list(batched_voice.stream(text, seed=4)))

    with ThreadPoolExecutor(4) as pool:
        for got in pool.map(run, range(4)):
            np.testing.assert_array_equal(got, expected)


def test_sixteen_threads_hammering_one_engine(solo_voice, batched_voice):
    jobs = [(TEXTS[i % len(TEXTS)], 100 + i) for i in range(32)]
    expected = {seed: solo_voice.synthesize(text, seed=seed).samples for text, seed in jobs}
    errors: list[BaseException] = []
    results: dict[int, np.ndarray] = {}

    def worker(part: list[tuple[str, int]]) -> None:
        try:
            for text, seed in part:
                results[seed] = batched_voice.synthesize(text, seed=seed).samples
        except BaseException as error:  # collected, asserted below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(jobs[i::16],)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert all(np.array_equal(results[seed], expected[seed]) for _, seed in jobs)


def test_cancelled_stream_frees_its_row(batched_voice):
    scheduler = batched_voice.scheduler
    long_text = " ".join(TEXTS[1:4])
    stream = batched_voice.stream(long_text, seed=1)
    next(stream)
    assert scheduler.stats()["active_rows"] >= 1
    stream.close()
    wait_until(lambda: scheduler.stats()["active_rows"] == 0, "the cancelled row is free")
    # The freed row serves the next request, unchanged.
    again = batched_voice.synthesize("Short one.", seed=2).samples
    assert np.array_equal(again, _load(max_batch=1).synthesize("Short one.", seed=2).samples)


def test_rows_join_and_leave_without_moving_the_kv(batched_voice, monkeypatch):
    """Once the slot buffers have grown to the load, requests come and go without any row
    moving or the buffers growing again (while work keeps coming: see IDLE_RELEASE_SECONDS)."""
    monkeypatch.setattr(scheduler_module, "IDLE_RELEASE_SECONDS", None)

    def burst() -> None:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: batched_voice.synthesize(TEXTS[i], seed=i), range(8)))

    burst()  # sizes the buffers for 8 concurrent rows of these texts
    scheduler = batched_voice.scheduler
    slots = scheduler.slots.slots
    before = (slots.past_data_ptrs(0, slots.rows), scheduler.stats()["slot_grows"])
    burst()
    assert (slots.past_data_ptrs(0, slots.rows), scheduler.stats()["slot_grows"]) == before
    assert scheduler.slots.slots is slots


def test_a_row_keeps_its_address_while_it_decodes(batched_voice):
    backend = batched_voice.model
    chunk = backend.text.chunks(TEXTS[3], {})[0]
    request = Request(chunk, batched_voice.voice(), backend.sampling_defaults(), {})
    stream = batched_voice.scheduler.submit(request)
    next(stream)
    first = batched_voice.scheduler.row_ptrs(request)
    addresses = {tuple(batched_voice.scheduler.row_ptrs(request)) for _ in stream}
    assert first and addresses <= {tuple(first), ()}  # () once the row has been freed


def test_one_sentence_allocates_only_what_it_needs(monkeypatch):
    """Slot buffers grow on demand: one short request on a max_batch=8 engine holds one
    row of the smallest capacity, not 8 rows of the model's limit."""
    monkeypatch.setattr(scheduler_module, "IDLE_RELEASE_SECONDS", None)  # read after the work
    engine = _load(codec_lm_dir(), max_batch=8)
    engine.synthesize("Hi.", seed=1)
    stats = engine.stats()
    layout = engine.model.pool.layout
    policy = engine.model.pool.capacity  # this bundle fixes its capacity in bundle.json
    assert stats["slot_rows"] == 1
    assert stats["slot_capacity"] == (policy.fixed or MIN_SLOT_CAPACITY)
    assert stats["slot_bytes"] == stats["slot_capacity"] * layout.bytes_per_token
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: engine.synthesize(TEXTS[i], seed=i), range(8)))
    assert engine.stats()["slot_rows"] == 8  # grown for eight at once


def test_bad_request_fails_alone(solo_voice, batched_voice):
    """A request the program refuses inside the worker fails; the others finish unchanged."""
    backend = batched_voice.model
    good_voice = batched_voice.voice()
    bad_voice = {"speaker_embedding": np.zeros(3, np.float32)}  # wrong width
    chunk = backend.text.chunks("Fine words here.", {})[0]
    sampling = backend.sampling_defaults().with_overrides({"seed": 5})
    expected = list(solo_voice.generate(chunk, good_voice, sampling))
    streams = [
        batched_voice.generate(chunk, good_voice, sampling),
        batched_voice.generate(chunk, bad_voice, sampling),
        batched_voice.generate(chunk, good_voice, sampling),
    ]
    good_a = list(streams[0])
    with pytest.raises(Exception) as failure:
        list(streams[1])
    assert "speaker" in str(failure.value) or "shape" in str(failure.value).lower()
    good_b = list(streams[2])
    for frames in (good_a, good_b):
        assert len(frames) == len(expected)
        assert all(np.array_equal(a, b) for a, b in zip(frames, expected, strict=True))


def test_request_longer_than_the_slot_budget_gets_a_cache_of_its_own(solo_voice):
    """A request needing more KV than the slot budget allows decodes in the same loop on an
    in-place cache sized to it (counted), with the same frames as in a slot row."""
    backend = solo_voice.model
    layout = backend.pool.layout
    tight = DecodeScheduler(
        backend.program,
        backend.pool,
        max_batch=2,
        slot_bytes=(MIN_SLOT_CAPACITY - 1) * layout.bytes_per_token,
    )
    roomy = DecodeScheduler(backend.program, backend.pool, max_batch=2)
    chunk = backend.text.chunks("This sentence needs its own capacity.", {})[0]
    sampling = backend.sampling_defaults().with_overrides({"seed": 3})
    voice = solo_voice.voice()
    own = list(tight.submit(Request(chunk, voice, sampling, {})))
    slotted = list(roomy.submit(Request(chunk, voice, sampling, {})))
    assert tight.stats()["own_kv"] == 1 and roomy.stats()["own_kv"] == 0
    assert len(own) == len(slotted) and all(map(np.array_equal, own, slotted))
    tight.close()
    roomy.close()


def test_admission_goes_by_priority_then_deadline_then_arrival(solo_voice):
    """With every row busy, the waiting request due first is admitted first: a stream whose
    player runs dry soonest, then the earliest first-audio deadline, then arrival."""
    backend = solo_voice.model
    scheduler = DecodeScheduler(backend.program, backend.pool, max_batch=1)
    voice, sampling = solo_voice.voice(), backend.sampling_defaults()
    now = time.monotonic()

    def request(name: str, **timing) -> Request:
        return Request(name, voice, sampling, {}, **timing)

    playing = PlaybackClock()
    playing.chunk(now - 5.0, 1.0)  # its player ran dry 4 s ago
    queued = [
        request("batch"),  # no deadline: arrival + slack
        request("late", deadline=now + 60),
        request("soon", deadline=now + 1),
        request("dry", deadline=now + 30, clock=playing),
        request("first", deadline=now + 90, priority=-1),
    ]
    order = []
    for _ in queued:
        scheduler.waiting = [r for r in queued if r.chunk not in order]
        scheduler.requests = [None]
        (row,) = scheduler._take(scheduler._plan())
        order.append(scheduler.requests[row].chunk)
    assert order == ["first", "dry", "soon", "batch", "late"]


def test_cancelled_waiting_request_never_starts(solo_voice):
    backend = solo_voice.model
    scheduler = DecodeScheduler(backend.program, backend.pool, max_batch=1)
    cancel = CancelToken()
    chunk = backend.text.chunks("Never spoken.", {})[0]
    stream = scheduler.submit(
        Request(chunk, solo_voice.voice(), backend.sampling_defaults(), {}, cancel=cancel)
    )
    cancel.cancel()
    assert list(stream) == []
    assert scheduler.stats()["prefills"] == 0
    scheduler.close()


def test_a_full_queue_is_refused_not_grown(solo_voice):
    backend = solo_voice.model
    scheduler = DecodeScheduler(backend.program, backend.pool, max_batch=1, max_waiting=0)
    chunk = backend.text.chunks("Too many.", {})[0]
    with pytest.raises(QueueFull, match="waiting"):
        scheduler.submit(Request(chunk, solo_voice.voice(), backend.sampling_defaults(), {}))
    scheduler.close()


def test_churn_of_ten_thousand_steps_does_not_grow_memory(batched_voice):
    scheduler = batched_voice.scheduler
    process = psutil.Process()

    def burst() -> None:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: batched_voice.synthesize(TEXTS[i % 8], seed=i), range(24)))

    burst()  # warm-up: buffers, arenas, thread pools
    rss_before = process.memory_info().rss
    start = scheduler.stats()["row_steps"]
    while scheduler.stats()["row_steps"] - start < 10_000:
        burst()
    growth = process.memory_info().rss - rss_before
    assert growth < 64 << 20, f"RSS grew by {growth >> 20} MB over 10,000 row steps"


def test_info_says_whether_a_model_batches():
    concat = _load(codec_lm_dir(), lm_graph="lm_concat", kv="chain")
    assert concat.info()["batching"]["batched"] is False
    assert "chain" in concat.info()["batching"]["why"]
    batched = _load(codec_lm_dir())
    assert batched.info()["batching"] == {
        "batched": True,
        "max_batch": 8,
        "slot_capacity": "grows on demand",
    }
    assert _load(max_batch=1).info()["batching"]["batched"] is False


@pytest.mark.parametrize("bad", [0, -1, 257, 2.5, "8", True])
def test_max_batch_is_bounded(bad):
    with pytest.raises(InputError, match="max_batch"):
        _load(max_batch=bad)


@pytest.mark.parametrize("bad", [0, -1, 65, True, 1.5, "2"])
def test_prefill_workers_are_bounded(batched_voice, bad):
    backend = batched_voice.model
    with pytest.raises(InputError, match="prefill_workers"):
        DecodeScheduler(backend.program, backend.pool, max_batch=2, prefill_workers=bad)


def _speaker(engine, texts: list[str], voice):
    return lambda i: engine.synthesize(texts[i], voice=voice, seed=i)


@pytest.mark.parametrize("variant", ["turbo", "original"])
def test_converted_chatterbox_batches_and_equals_solo(tmp_path, voice_wav, variant):
    """Chatterbox LMs made in place by `convert --inplace-kv` decode as rows of one batch, with
    the same tokens as alone."""
    from export import synthetic_chatterbox as synth
    from onnx_tts.tools.convert import convert_bundle_inplace_kv

    source, converted = tmp_path / "source", tmp_path / "converted"
    synth.export(synth.SyntheticConfig(variant=variant, precisions=("fp32",)), source)
    convert_bundle_inplace_kv(source, converted, check=False)
    solo = _load(converted, max_batch=1, kv="inplace")
    batched = _load(converted, max_batch=4, kv="inplace")
    assert batched.info()["batching"]["batched"] is True
    texts = ["Hello there.", "How are you today?", "Fine, thanks.", "See you soon."]
    expected = [solo.synthesize(t, voice=voice_wav, seed=i).samples for i, t in enumerate(texts)]
    with ThreadPoolExecutor(4) as pool:
        got = list(
            pool.map(
                lambda i: batched.synthesize(texts[i], voice=voice_wav, seed=i).samples, range(4)
            )
        )
    assert all(np.array_equal(a, b) for a, b in zip(expected, got, strict=True))
    assert batched.stats()["mean_batch"] > 1.0


def _gqa_internal(converted: Path) -> None:
    """Rewrite a converted Chatterbox LM the way onnxruntime-genai builds the published
    original/multilingual LMs: GroupQueryAttention inside, its lengths derived from
    `attention_mask` (no seqlens_k / total_sequence_length inputs)."""
    import onnx
    from onnx import TensorProto, helper

    path = converted / "onnx" / "language_model.onnx"
    model = onnx.load(str(path))
    graph = model.graph
    kept = [i for i in graph.input if i.name not in ("seqlens_k", "total_sequence_length")]
    del graph.input[:]
    graph.input.extend(kept)
    axis = helper.make_tensor("gqa_internal_axis", TensorProto.INT64, [1], [1])
    one = helper.make_tensor("gqa_internal_one", TensorProto.INT64, [], [1])
    graph.initializer.extend([axis, one])
    derived = [
        helper.make_node(
            "ReduceSum", ["attention_mask", "gqa_internal_axis"], ["gi_sum"], keepdims=0
        ),
        helper.make_node("Sub", ["gi_sum", "gqa_internal_one"], ["gi_seqlens"]),
        helper.make_node("Cast", ["gi_seqlens"], ["seqlens_k"], to=TensorProto.INT32),
        helper.make_node("Shape", ["attention_mask"], ["gi_shape"]),
        helper.make_node("Gather", ["gi_shape", "gqa_internal_one"], ["gi_total"]),
        helper.make_node("Cast", ["gi_total"], ["total_sequence_length"], to=TensorProto.INT32),
    ]
    nodes = derived + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    for sidecar in path.parent.glob("language_model.onnx_data"):
        sidecar.unlink()
    onnx.save_model(
        model, str(path), save_as_external_data=True, location="language_model.onnx_data"
    )


def test_gqa_internal_chatterbox_runs_in_place_and_batches(tmp_path, voice_wav):
    """The published original/multilingual LM layout (GQA inside, lengths from the mask):
    in place solo equals chain, and batched rows equal solo."""
    from export import synthetic_chatterbox as synth
    from onnx_tts.families import detect
    from onnx_tts.tools.convert import convert_bundle_inplace_kv

    source, converted = tmp_path / "source", tmp_path / "converted"
    config = synth.SyntheticConfig(variant="original", lm_position_ids=False, precisions=("fp32",))
    synth.export(config, source)
    convert_bundle_inplace_kv(source, converted, check=False)
    _gqa_internal(converted)
    assert detect(converted).inspected.lm.kv.attention == "gqa-mask"
    chain = _load(source, max_batch=1, kv="chain")
    solo = _load(converted, max_batch=1, kv="inplace")
    batched = _load(converted, max_batch=4, kv="inplace")
    assert batched.info()["batching"]["batched"]  # its rows pass the batch-invariance probe
    texts = ["Hello there.", "How are you today?", "Fine, thanks.", "See you soon."]
    expected = [chain.synthesize(t, voice=voice_wav, seed=i).samples for i, t in enumerate(texts)]
    alone = [solo.synthesize(t, voice=voice_wav, seed=i).samples for i, t in enumerate(texts)]
    with ThreadPoolExecutor(4) as pool:
        rows = list(
            pool.map(
                lambda i: batched.synthesize(texts[i], voice=voice_wav, seed=i).samples, range(4)
            )
        )
    for want, one, row in zip(expected, alone, rows, strict=True):
        assert want.shape == one.shape == row.shape
        np.testing.assert_allclose(one, want, atol=1e-4)  # GQA kernel vs Concat attention
        assert np.array_equal(row, one)  # batching changes nothing


def _positions_from_mask_width(converted: Path) -> None:
    """Make a GQA-internal LM derive its positions from the attention mask's width
    (Range(Shape(attention_mask)[1])) instead of its cumulative sum: the same numbers for one
    sequence, wrong ones for a row padded beside a longer row."""
    import onnx
    from onnx import TensorProto, helper

    path = converted / "onnx" / "language_model.onnx"
    model = onnx.load(str(path))
    graph = model.graph
    (cumsum,) = [n for n in graph.node if n.op_type == "CumSum" and n.input[0] == "attention_mask"]
    graph.initializer.extend(
        [
            helper.make_tensor("width_one", TensorProto.INT64, [], [1]),
            helper.make_tensor("width_axis", TensorProto.INT64, [1], [0]),
        ]
    )
    width = [
        helper.make_node("Shape", ["attention_mask"], ["width_shape"], start=1, end=2),
        helper.make_node("Squeeze", ["width_shape", "width_axis"], ["width"]),
        helper.make_node("Add", ["width", "width_one"], ["width_end"]),
        helper.make_node("Range", ["width_one", "width_end", "width_one"], ["width_range"]),
        helper.make_node("Unsqueeze", ["width_range", "width_axis"], [cumsum.output[0]]),
    ]
    nodes = width + [n for n in graph.node if n is not cumsum]
    del graph.node[:]
    graph.node.extend(nodes)
    for sidecar in path.parent.glob("language_model.onnx_data"):
        sidecar.unlink()
    onnx.save_model(
        model, str(path), save_as_external_data=True, location="language_model.onnx_data"
    )


def test_an_lm_that_reads_the_mask_width_decodes_alone(tmp_path, voice_wav):
    """Batched rows get an attention_mask as wide as the longest row. An LM that reads the
    mask's width decoded a request differently batched than solo; the load-time probe now
    finds it and runs each request on a KV cache of its own in the same scheduler."""
    from export import synthetic_chatterbox as synth
    from onnx_tts.decoding.batch_probe import NOT_INVARIANT
    from onnx_tts.tools.convert import convert_bundle_inplace_kv

    source, converted = tmp_path / "source", tmp_path / "converted"
    config = synth.SyntheticConfig(variant="original", lm_position_ids=False, precisions=("fp32",))
    synth.export(config, source)
    convert_bundle_inplace_kv(source, converted, check=False)
    _gqa_internal(converted)
    mask_sum = _load(converted, max_batch=1, kv="inplace")
    _positions_from_mask_width(converted)
    solo = _load(converted, max_batch=1, kv="inplace")
    batched = _load(converted, max_batch=4, kv="inplace")
    assert batched.info()["batching"] == {"batched": False, "max_batch": 4, "why": NOT_INVARIANT}
    assert batched.scheduler.slots is None
    texts = ["Hi.", "A longer sentence, so that the rows differ in length.", "One two.", "Bye."]
    alone = [solo.synthesize(t, voice=voice_wav, seed=i).samples for i, t in enumerate(texts)]
    for i, text in enumerate(texts):  # the stand-in reads as the original does, alone
        assert np.array_equal(alone[i], mask_sum.synthesize(text, voice=voice_wav, seed=i).samples)
    with ThreadPoolExecutor(4) as pool:
        rows = list(
            pool.map(
                lambda i: batched.synthesize(texts[i], voice=voice_wav, seed=i).samples, range(4)
            )
        )
    assert all(np.array_equal(row, one) for row, one in zip(rows, alone, strict=True))
    # Models whose rows compute alone keep batching.
    for model in (None, codec_lm_dir()):
        assert _load(model, max_batch=4).info()["batching"]["batched"]

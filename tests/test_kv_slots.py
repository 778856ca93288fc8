"""KVSlots: in-place KV slot buffers for batched decoding (issue 14).

Rows of one [rows, Hkv, capacity, D] buffer per KV tensor are bound as contiguous sub-buffers;
sequences join (prefill at batch 1 into their row), decode together with ragged lengths, and
leave. Every row's logits must equal the same sequence run alone on KVCache('inplace').
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_tts
from onnx_tts.errors import SessionError
from onnx_tts.session import KVCache, KVSlots, Session
from tests import graphs
from tests.conftest import codec_lm_dir

MODELS = Path(onnx_tts.__file__).parent / "models"


def gqa_mask_lm(path: Path, layers: int = 2) -> Path:
    """gqa_lm with its length inputs derived from `attention_mask` inside the graph, as
    onnxruntime-genai builds them (seqlens_k = ReduceSum(mask) - 1, total = Shape(mask)[1])."""
    graphs.gqa_lm(path, layers=layers)
    model = onnx.load(str(path))
    graph = model.graph
    kept = [i for i in graph.input if i.name not in ("seqlens_k", "total_sequence_length")]
    del graph.input[:]
    graph.input.extend(kept)
    graph.input.insert(
        1, helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["b", "t"])
    )
    graph.initializer.extend(
        [
            numpy_helper.from_array(np.array([1], np.int64), "mask_axis"),
            numpy_helper.from_array(np.array(1, np.int64), "one"),
        ]
    )
    lengths = [
        helper.make_node("ReduceSum", ["attention_mask", "mask_axis"], ["mask_sum"], keepdims=0),
        helper.make_node("Sub", ["mask_sum", "one"], ["seqlens64"]),
        helper.make_node("Cast", ["seqlens64"], ["seqlens_k"], to=TensorProto.INT32),
        helper.make_node("Shape", ["attention_mask"], ["mask_shape"]),
        helper.make_node("Gather", ["mask_shape", "one"], ["total64"], axis=0),
        helper.make_node("Cast", ["total64"], ["total_sequence_length"], to=TensorProto.INT32),
    ]
    nodes = lengths + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    model.ir_version = 10
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def gqa_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return graphs.gqa_lm(tmp_path_factory.mktemp("g") / "gqa.onnx", layers=3)


@pytest.fixture(scope="module")
def mask_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gqa_mask_lm(tmp_path_factory.mktemp("g") / "gqa_mask.onnx", layers=3)


@pytest.fixture(scope="module")
def converted_paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Synthetic Chatterbox LMs (Turbo with position_ids, original without) after
    `onnx-tts convert --inplace-kv`: seqlens inputs, attention_mask and GQA."""
    from export import synthetic_chatterbox as synth
    from onnx_tts.tools.convert import convert_inplace_kv

    root = tmp_path_factory.mktemp("converted")
    configs = {
        "turbo": synth.SyntheticConfig(variant="turbo", precisions=("fp32",)),
        "original": synth.SyntheticConfig(
            variant="original", lm_position_ids=False, precisions=("fp32",)
        ),
    }
    out = {}
    for name, config in configs.items():
        synth.export(config, root / name)
        source = root / name / "onnx" / "language_model.onnx"
        out[name] = convert_inplace_kv(source, root / f"{name}.onnx", check=False).destination
    return out


def lm_paths() -> dict[str, Path | str]:
    return {
        "gqa": "gqa_path",
        "gqa-mask": "mask_path",
        "voice": MODELS / "voice" / "lm.onnx",
        "codec-lm": "codec-lm",  # built on first use: see tests.conftest.codec_lm_dir
        "chatterbox-turbo-converted": "turbo",
        "chatterbox-original-converted": "original",
    }


@pytest.fixture(params=list(lm_paths()))
def lm(request: pytest.FixtureRequest) -> Session:
    where = lm_paths()[request.param]
    if isinstance(where, Path):
        return Session(where)
    if where == "codec-lm":
        return Session(codec_lm_dir() / "lm.onnx")
    if where in ("turbo", "original"):
        return Session(request.getfixturevalue("converted_paths")[where])
    return Session(request.getfixturevalue(where))


def hidden_of(session: Session) -> int:
    return int(session.input("inputs_embeds").shape[-1])


def side_feeds(session: Session, lengths: list[int], new: int) -> dict[str, np.ndarray]:
    """attention_mask (each row's tokens marked, padding on the right) and position_ids for
    the graphs that take them, for rows holding `lengths` tokens and adding `new`."""
    feeds = {}
    if session.input("attention_mask") is not None:
        mask = np.zeros((len(lengths), max(lengths) + new), np.int64)
        for row, length in enumerate(lengths):
            mask[row, : length + new] = 1
        feeds["attention_mask"] = mask
    if session.input("position_ids") is not None:
        feeds["position_ids"] = np.array(lengths, np.int64)[:, None] + np.arange(new)
    return feeds


def solo_logits(session: Session, seq: list[np.ndarray], capacity: int) -> list[np.ndarray]:
    """The reference: one sequence alone on KVCache('inplace')."""
    kv = KVCache(session, "inplace", capacity=capacity)
    out = []
    for embeds in seq:
        feeds = {"inputs_embeds": embeds, **side_feeds(session, [kv.length], embeds.shape[1])}
        out.append(kv.step(feeds)["logits"])
    return out


@dataclass
class Request:
    prefill: int
    decode: int
    join: int  # scheduler step at which it may join
    seq: list[np.ndarray] = field(default_factory=list)
    got: list[np.ndarray] = field(default_factory=list)
    row: int = -1
    length: int = 0


def run_scheduler(
    session: Session, slots: KVSlots, requests: list[Request]
) -> dict[int, tuple[int, list[int]]]:
    """A tiny decode scheduler: requests join at a step boundary (prefill at batch 1 into a free
    row), every active row decodes one token per step over one contiguous row range (idle rows
    inside the range get a dummy token at length 0), finished requests free their row.
    Returns, per step, the bound range's first row and the per-row pointers seen."""
    hidden = hidden_of(session)
    free = list(range(slots.rows))
    active: list[Request] = []
    waiting = list(requests)
    pointers: dict[int, tuple[int, list[int]]] = {}
    step = 0
    while waiting or active:
        for request in [r for r in waiting if r.join <= step]:
            if not free:
                break  # FIFO: the rest wait for a row
            waiting.remove(request)
            request.row = free.pop(0)
            first = request.seq[0]
            feeds = {"inputs_embeds": first, **side_feeds(session, [0], first.shape[1])}
            lengths = np.array([0], np.int64)
            request.got.append(slots.step(feeds, request.row, lengths)["logits"])
            request.length = first.shape[1]
            active.append(request)
        if active:
            lo = min(r.row for r in active)
            hi = max(r.row for r in active) + 1
            by_row = {r.row: r for r in active}
            embeds = np.zeros((hi - lo, 1, hidden), np.float32)
            lengths = np.zeros(hi - lo, np.int64)
            for row, request in by_row.items():
                embeds[row - lo] = request.seq[len(request.got)][0]
                lengths[row - lo] = request.length
            feeds = {"inputs_embeds": embeds, **side_feeds(session, lengths.tolist(), 1)}
            before = slots.past_data_ptrs(lo, hi - lo)
            logits = slots.step(feeds, lo, lengths)["logits"]
            assert slots.present_data_ptrs(lo, hi - lo) == before  # written in place
            pointers[step] = (lo, before)
            for row, request in by_row.items():
                request.got.append(logits[row - lo : row - lo + 1])
                request.length += 1
                if len(request.got) == request.decode + 1:
                    active.remove(request)
                    free.append(request.row)
        step += 1
    return pointers


def make_requests(hidden: int, seed: int = 0) -> list[Request]:
    rng = np.random.default_rng(seed)
    plan = [(5, 9, 0), (2, 4, 0), (9, 6, 1), (3, 8, 3), (7, 3, 4), (1, 5, 6)]
    requests = []
    for prefill, decode, join in plan:
        request = Request(prefill, decode, join)
        request.seq = [rng.standard_normal((1, prefill, hidden)).astype(np.float32)]
        request.seq += [
            rng.standard_normal((1, 1, hidden)).astype(np.float32) for _ in range(decode)
        ]
        requests.append(request)
    return requests


def test_ragged_rows_joining_and_leaving_match_solo_runs(lm: Session) -> None:
    """Per-row logits of the batched, churning run equal the solo KVCache('inplace') run
    bit for bit (max abs difference measured: 0.0 on all six graphs)."""
    capacity = 32
    slots = KVSlots(lm, rows=3, capacity=capacity)
    requests = make_requests(hidden_of(lm))
    run_scheduler(lm, slots, requests)
    worst = 0.0
    for request in requests:
        expected = solo_logits(lm, request.seq, capacity)
        assert len(request.got) == len(expected)
        for have, want in zip(request.got, expected, strict=True):
            worst = max(worst, float(np.abs(have - want).max()))
    assert worst == 0.0, f"max abs difference {worst}"


def test_row_kv_equals_solo_cache_after_churn(gqa_path: Path) -> None:
    session = Session(gqa_path)
    slots = KVSlots(session, rows=3, capacity=32)
    requests = make_requests(hidden_of(session), seed=1)
    last = requests[-1]
    last.decode = 20  # still active when the others have left
    last.seq += [np.full((1, 1, hidden_of(session)), 0.1 * i, np.float32) for i in range(20 - 5)]
    run_scheduler(session, slots, requests)
    kv = KVCache(session, "inplace", capacity=32)
    for embeds in last.seq:
        kv.step({"inputs_embeds": embeds})
    assert kv.length == last.length
    for index in range(len(slots.pairs)):
        np.testing.assert_array_equal(slots.read(index, last.row, last.length), kv.read(index))


def test_row_addresses_are_fixed_and_strided(gqa_path: Path) -> None:
    """Each row's sub-buffer is base + row * row_stride, the same at every step whatever range
    is bound: rows joining or leaving move no data."""
    session = Session(gqa_path)
    slots = KVSlots(session, rows=4, capacity=16)
    base = slots.past_data_ptrs(0, 1)
    strides = [slots.row_stride(i) for i in range(len(slots.pairs))]
    heads, head_dim = 2, 8  # gqa_lm's kv_heads x head_dim, float32
    assert strides == [heads * 16 * head_dim * 4] * len(slots.pairs)
    expected = {row: [b + row * s for b, s in zip(base, strides, strict=True)] for row in range(4)}
    requests = make_requests(hidden_of(session), seed=2)
    pointers = run_scheduler(session, slots, requests)
    assert len(pointers) > 5
    for lo, seen in pointers.values():
        assert seen == expected[lo]
    assert len({lo for lo, _ in pointers.values()}) >= 2  # different row ranges were bound
    for row in range(4):
        assert slots.past_data_ptrs(row, 1) == expected[row]
    assert slots.past_data_ptrs(0, 1) == base


def test_batched_first_prefill_matches_solo(gqa_path: Path) -> None:
    session = Session(gqa_path)
    rng = np.random.default_rng(3)
    prompts = rng.standard_normal((3, 4, hidden_of(session))).astype(np.float32)
    slots = KVSlots(session, rows=3, capacity=16)
    batched = slots.step({"inputs_embeds": prompts}, 0, np.zeros(3, np.int64))["logits"]
    for row in range(3):
        (solo,) = solo_logits(session, [prompts[row : row + 1]], 16)
        np.testing.assert_array_equal(batched[row : row + 1], solo)


def test_twin_steps_other_rows_at_the_same_time(gqa_path: Path) -> None:
    """A twin binds the same buffers: it steps rows 2-3 on another thread while the original
    steps rows 0-1, and every row's logits and cached KV equal its solo run bit for bit."""
    import threading

    session = Session(gqa_path)
    hidden = hidden_of(session)
    rng = np.random.default_rng(5)
    seqs = [
        [rng.standard_normal((1, 3, hidden)).astype(np.float32)]
        + [rng.standard_normal((1, 1, hidden)).astype(np.float32) for _ in range(6)]
        for _ in range(4)
    ]
    slots = KVSlots(session, rows=4, capacity=16)
    twin = slots.twin()
    assert twin is slots.twin()  # made once, kept with the buffers
    assert twin.past_data_ptrs(0, 4) == slots.past_data_ptrs(0, 4)
    got: list[list[np.ndarray]] = [[] for _ in seqs]
    for row, seq in enumerate(seqs):
        got[row].append(slots.step({"inputs_embeds": seq[0]}, row, np.zeros(1, np.int64))["logits"])

    def step(on: KVSlots, first: int, index: int) -> None:
        embeds = np.concatenate([seqs[first][index], seqs[first + 1][index]])
        lengths = np.full(2, 3 + index - 1, np.int64)
        logits = on.step({"inputs_embeds": embeds}, first, lengths)["logits"]
        got[first].append(logits[:1])
        got[first + 1].append(logits[1:])

    for index in range(1, 7):
        upper = threading.Thread(target=step, args=(twin, 2, index))
        upper.start()
        step(slots, 0, index)
        upper.join()
    for row, seq in enumerate(seqs):
        for have, want in zip(got[row], solo_logits(session, seq, 16), strict=True):
            np.testing.assert_array_equal(have, want)
    del slots  # the twin keeps the buffers alive
    assert twin.step({"inputs_embeds": seqs[0][1]}, 0, np.array([3]))["logits"].shape[0] == 1


def test_output_names_and_stats(gqa_path: Path) -> None:
    session = Session(gqa_path)
    slots = KVSlots(session, rows=2, capacity=8)
    feeds = {"inputs_embeds": np.ones((2, 1, hidden_of(session)), np.float32)}
    assert slots.step(feeds, 0, np.zeros(2, np.int64), output_names=[]) == {}
    out = slots.step(feeds, 0, np.ones(2, np.int64), output_names=["logits"])
    assert list(out) == ["logits"] and out["logits"].shape == (2, 1, hidden_of(session))
    assert slots.stats()["steps"] == 2
    assert (slots.rows, slots.capacity) == (2, 8)


def bad(match: str):
    return pytest.raises(SessionError, match=match)


def test_construction_errors(gqa_path: Path, tmp_path: Path) -> None:
    session = Session(gqa_path)
    with bad(r"rows must be in \[1, 1024\], got 0"):
        KVSlots(session, rows=0, capacity=8)
    with bad(r"rows must be in \[1, 1024\], got 1025"):
        KVSlots(session, rows=1025, capacity=8)
    with bad("capacity must be >= 1"):
        KVSlots(session, rows=1, capacity=0)
    with bad(r"would take .* GiB; the limit is 16 GiB"):
        KVSlots(session, rows=1024, capacity=10_000_000)
    with bad("does not have"):
        KVSlots(session, rows=1, capacity=8, pairs={"nope": "present.0.key"})
    concat = Session(graphs.concat_lm(tmp_path / "concat.onnx"))
    with bad("grows its KV cache by Concat"):
        KVSlots(concat, rows=2, capacity=8)


def test_step_errors(gqa_path: Path, mask_path: Path) -> None:
    session = Session(gqa_path)
    hidden = hidden_of(session)
    slots = KVSlots(session, rows=4, capacity=8)
    one = {"inputs_embeds": np.ones((1, 1, hidden), np.float32)}
    two = {"inputs_embeds": np.ones((2, 1, hidden), np.float32)}
    with bad("1-D int64"):
        slots.step(one, 0, np.zeros(1, np.float32))
    with bad("1-D int64"):
        slots.step(one, 0, np.zeros((1, 1), np.int64))
    with bad("lengths is empty"):
        slots.step(one, 0, np.zeros(0, np.int64))
    with bad(r"lengths\[0\] is -1"):
        slots.step(one, 0, np.array([-1], np.int64))
    with bad(r"lengths\[1\] is 8 but a step adding 1 token\(s\) needs a length in \[0, 7\]"):
        slots.step(two, 0, np.array([0, 8], np.int64))
    with bad(r"rows \[3, 5\) are outside"):
        slots.step(two, 3, np.zeros(2, np.int64))
    with bad(r"rows \[-1, 0\) are outside"):
        slots.step(one, -1, np.zeros(1, np.int64))
    with bad("has batch 2 but lengths has 1 row"):
        slots.step(two, 0, np.zeros(1, np.int64))
    with bad("derived from lengths"):
        slots.step({**one, "seqlens_k": np.zeros(1, np.int32)}, 0, np.zeros(1, np.int64))
    with bad("KV input held by the slots"):
        slots.step({**one, "past_key_values.0.key": np.zeros((1, 2, 8, 8), np.float32)}, 0, [0])
    with bad("KV output held by the slots"):
        slots.step(one, 0, np.zeros(1, np.int64), output_names=["present.0.key"])
    with bad("unknown output 'nope'"):
        slots.step(one, 0, np.zeros(1, np.int64), output_names=["nope"])
    with bad("needs every row empty"):
        slots.step(
            {"inputs_embeds": np.ones((2, 2, hidden), np.float32)}, 0, np.array([0, 3], np.int64)
        )
    with bad("dtype float64"):
        slots.step({"inputs_embeds": np.ones((1, 1, hidden))}, 0, np.zeros(1, np.int64))
    slots.step(two, 1, np.zeros(2, np.int64))
    with bad(r"were not in the last step \(rows \[1, 3\)\)"):
        slots.present_data_ptrs(0, 1)
    with bad(r"rows \[4, 5\) are outside"):
        slots.past_data_ptrs(4, 1)
    with bad("index 6 out of range"):
        slots.read(6, 0, 1)
    with bad("index -1 out of range"):
        slots.read(-1, 0, 1)
    with bad(r"length 9 is outside \[0, 8\]"):
        slots.read(0, 0, 9)

    masked = KVSlots(Session(mask_path), rows=2, capacity=8)
    with bad("missing input"):
        masked.step(two, 0, np.zeros(2, np.int64))
    with bad(r"attention_mask' has shape \[2, 3\], expected \[2, 2\]"):
        masked.step({**two, "attention_mask": np.ones((2, 3), np.int64)}, 0, np.array([1, 0]))
    with bad(r"attention_mask row 1 marks 2 tokens but lengths\[1\] \+ new tokens is 1"):
        masked.step({**two, "attention_mask": np.ones((2, 2), np.int64)}, 0, np.array([1, 0]))


def test_churn_of_10k_steps_does_not_grow_memory(tmp_path: Path) -> None:
    from tools.leak_check import rss_mb

    session = Session(graphs.gqa_lm(tmp_path / "small.onnx", layers=2))
    hidden = hidden_of(session)
    rows, capacity = 4, 48
    slots = KVSlots(session, rows=rows, capacity=capacity)
    lengths = np.zeros(rows, np.int64)
    token = np.ones((rows, 1, hidden), np.float32)
    prompt = np.ones((1, 3, hidden), np.float32)
    start = None
    for step in range(10_000):
        # Rows leave when full and rejoin with a 3-token prefill; the bound range changes too.
        for row in np.flatnonzero(lengths >= capacity - 1):
            slots.step({"inputs_embeds": prompt}, int(row), np.zeros(1, np.int64))
            lengths[row] = 3
        lo = step % 2
        slots.step({"inputs_embeds": token[lo:]}, lo, lengths[lo:])
        lengths[lo:] += 1
        if step == 500:
            start = rss_mb()
    assert start is not None
    growth = rss_mb() - start
    assert growth < 4.0, f"resident memory grew by {growth:.1f} MB over 9,500 steps"

"""The C++ session core: zero-copy KV handling, parity across modes, and clear errors."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from onnx_tts.errors import ModelError, SessionError
from onnx_tts.session import KVCache, Session, SessionOptions, ort_library_path
from tests import graphs

HIDDEN_CONCAT = 16  # concat_lm: 2 heads x 8
HIDDEN_GQA = 32  # gqa_lm: 4 heads x 8


@pytest.fixture(scope="module")
def concat_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 12 layers so that layer 10 exists: "10" sorts before "2" as a string.
    return graphs.concat_lm(tmp_path_factory.mktemp("g") / "concat.onnx", layers=12)


@pytest.fixture(scope="module")
def gqa_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return graphs.gqa_lm(tmp_path_factory.mktemp("g") / "gqa.onnx", layers=3)


def embeds(hidden: int, steps: int = 12, prefill: int = 6, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    first = rng.standard_normal((1, prefill, hidden)).astype(np.float32)
    rest = [rng.standard_normal((1, 1, hidden)).astype(np.float32) for _ in range(steps)]
    return [first, *rest]


def run_cache(session: Session, mode: str, seq: list[np.ndarray], capacity: int | None = None):
    kv = KVCache(session, mode, capacity=capacity)
    return kv, [kv.step({"inputs_embeds": e})["logits"] for e in seq]


def reference_loop(path: Path, seq: list[np.ndarray], layers: int, heads: int, head_dim: int):
    """The published-script way, on onnxruntime's own Python API: numpy feeds, present -> past."""
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    past = {
        f"past_key_values.{i}.{k}": np.zeros((1, heads, 0, head_dim), np.float32)
        for i in range(layers)
        for k in ("key", "value")
    }
    names = [o.name for o in sess.get_outputs()]
    logits = []
    for e in seq:
        outs = dict(zip(names, sess.run(None, {"inputs_embeds": e, **past}), strict=True))
        logits.append(outs["logits"])
        past = {
            n.replace("present", "past_key_values"): v for n, v in outs.items() if n != "logits"
        }
    return logits


def test_session_introspection(concat_path: Path) -> None:
    session = Session(concat_path)
    first = session.inputs[0]
    assert first.name == "inputs_embeds"
    assert first.dtype == np.float32
    assert first.shape == ("b", "s", HIDDEN_CONCAT)
    assert session.output("present.11.value").shape == ("b", 2, "t", 8)
    out = session.run(
        {
            "inputs_embeds": np.ones((1, 2, HIDDEN_CONCAT), np.float32),
            **{n: np.zeros((1, 2, 0, 8), np.float32) for n in session.input_names[1:]},
        },
        output_names=["present.3.key"],
    )
    assert list(out) == ["present.3.key"]
    assert out["present.3.key"].shape == (1, 2, 2, 8)


def test_pairs_follow_parsed_layer_index(concat_path: Path) -> None:
    kv = KVCache(Session(concat_path), "chain")
    pasts = [p for p, _ in kv.pairs]
    assert pasts[4] == "past_key_values.2.key"  # not .10, which sorts before .2 as text
    assert pasts[-1] == "past_key_values.11.value"
    for past, present in kv.pairs:
        assert past.split(".")[1:] == present.split(".")[1:]


def test_chain_and_copy_match_onnxruntime_reference(concat_path: Path) -> None:
    session = Session(concat_path)
    seq = embeds(HIDDEN_CONCAT)
    expected = reference_loop(concat_path, seq, layers=12, heads=2, head_dim=8)
    for mode in ("copy", "chain"):
        _, got = run_cache(session, mode, seq)
        for want, have in zip(expected, got, strict=True):
            np.testing.assert_array_equal(have, want)


def test_chain_moves_present_into_past_without_copy(concat_path: Path) -> None:
    kv = KVCache(Session(concat_path), "chain")
    previous_present = None
    for e in embeds(HIDDEN_CONCAT, steps=8):
        if previous_present is not None:
            assert kv.past_data_ptrs() == previous_present
        kv.step({"inputs_embeds": e})
        previous_present = kv.present_data_ptrs()
        assert all(previous_present)


def test_copy_mode_really_copies(concat_path: Path) -> None:
    kv = KVCache(Session(concat_path), "copy")
    seq = embeds(HIDDEN_CONCAT, steps=3)
    kv.step({"inputs_embeds": seq[0]})
    present = kv.present_data_ptrs()
    assert not set(present) & set(kv.past_data_ptrs())


def test_inplace_buffers_never_move(gqa_path: Path) -> None:
    kv = KVCache(Session(gqa_path), "inplace", capacity=64)
    before = kv.past_data_ptrs()
    for e in embeds(HIDDEN_GQA, steps=40):
        kv.step({"inputs_embeds": e})
        assert kv.present_data_ptrs() == before
    assert kv.past_data_ptrs() == before
    kv.reset()
    assert kv.length == 0
    assert kv.past_data_ptrs() == before  # reset does not reallocate


def test_all_modes_bit_identical_on_gqa(gqa_path: Path) -> None:
    session = Session(gqa_path)
    seq = embeds(HIDDEN_GQA, steps=20)
    results = {
        mode: run_cache(session, mode, seq, capacity=64 if mode == "inplace" else None)
        for mode in ("copy", "chain", "inplace")
    }
    for mode in ("chain", "inplace"):
        for a, b in zip(results["copy"][1], results[mode][1], strict=True):
            np.testing.assert_array_equal(a, b)
    # Cached keys agree too (the inplace buffer is read up to the cached length only).
    for index in range(len(results["copy"][0].pairs)):
        np.testing.assert_array_equal(
            results["copy"][0].read(index), results["inplace"][0].read(index)
        )


def test_reset_starts_a_new_sequence(gqa_path: Path) -> None:
    session = Session(gqa_path)
    seq = embeds(HIDDEN_GQA, steps=5)
    for mode, capacity in (("chain", None), ("inplace", 32), ("copy", None)):
        kv, first = run_cache(session, mode, seq, capacity)
        kv.reset()
        second = [kv.step({"inputs_embeds": e})["logits"] for e in seq]
        for a, b in zip(first, second, strict=True):
            np.testing.assert_array_equal(a, b)


def test_capacity_overflow_is_a_clear_error(gqa_path: Path) -> None:
    kv = KVCache(Session(gqa_path), "inplace", capacity=8)
    kv.step({"inputs_embeds": np.zeros((1, 6, HIDDEN_GQA), np.float32)})
    with pytest.raises(SessionError, match="capacity"):
        kv.step({"inputs_embeds": np.zeros((1, 3, HIDDEN_GQA), np.float32)})
    assert kv.length == 6  # the failed step changed nothing
    with pytest.raises(SessionError, match="needs a capacity"):
        KVCache(Session(gqa_path), "inplace")


def test_length_inputs_are_checked(gqa_path: Path) -> None:
    kv = KVCache(Session(gqa_path), "inplace", capacity=16)
    with pytest.raises(SessionError, match="seqlens_k"):
        kv.step(
            {
                "inputs_embeds": np.zeros((1, 1, HIDDEN_GQA), np.float32),
                "seqlens_k": np.array([500], np.int32),
            }
        )


@pytest.mark.parametrize(
    ("feeds", "message"),
    [
        ({"inputs_embeds": np.zeros((1, 1, HIDDEN_CONCAT), np.float64)}, "dtype float64"),
        ({"inputs_embeds": np.zeros((1, HIDDEN_CONCAT), np.float32)}, "rank 2"),
        ({"inputs_embeds": np.zeros((1, 1, 15), np.float32)}, "dimension 2 must be 16"),
        ({"inputs_embeds": [1.0, 2.0]}, "must be a numpy array"),
        ({"bogus": np.zeros(1, np.float32)}, "unknown input 'bogus'"),
        ({}, "missing input"),
    ],
)
def test_bad_feeds_name_the_tensor(concat_path: Path, feeds: dict, message: str) -> None:
    with pytest.raises(SessionError, match=message):
        Session(concat_path).run(feeds)


def test_kv_inputs_are_not_fed_by_the_caller(concat_path: Path) -> None:
    kv = KVCache(Session(concat_path), "chain")
    with pytest.raises(SessionError, match="managed by the cache"):
        kv.step(
            {
                "inputs_embeds": np.zeros((1, 1, HIDDEN_CONCAT), np.float32),
                "past_key_values.0.key": np.zeros((1, 2, 0, 8), np.float32),
            }
        )


def test_bad_model_files(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="not found"):
        Session(tmp_path / "missing.onnx")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is not a protobuf")
    with pytest.raises(ModelError, match="cannot load ONNX graph"):
        Session(junk)
    with pytest.raises(ModelError, match="CUDAExecutionProvider is not available"):
        Session(junk, SessionOptions(providers=("CUDAExecutionProvider",)))


def test_graph_without_kv_is_rejected_by_kvcache(tmp_path: Path, concat_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "plain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(tmp_path / "plain.onnx"))
    with pytest.raises(SessionError, match="no KV inputs"):
        KVCache(Session(tmp_path / "plain.onnx"), "chain")
    with pytest.raises(SessionError, match="unknown KV mode"):
        KVCache(Session(concat_path), "zerocopy")  # type: ignore[arg-type]


def test_fuzzed_feeds_never_crash(concat_path: Path, gqa_path: Path) -> None:
    """Hundreds of random bad feeds: each is an exception, the process survives."""
    rng = np.random.default_rng(1234)
    sessions = [Session(concat_path), Session(gqa_path)]
    dtypes = [np.float32, np.float64, np.int64, np.int32, np.float16, np.bool_, np.uint8]
    errors = 0
    for trial in range(300):
        session = sessions[trial % 2]
        feeds = {}
        for info in session.inputs:
            if rng.random() < 0.1:
                continue  # missing feed
            rank = len(info.shape) if rng.random() < 0.7 else int(rng.integers(0, 5))
            shape = tuple(int(rng.integers(0, 4)) for _ in range(rank))
            dtype = info.dtype if rng.random() < 0.7 else dtypes[int(rng.integers(len(dtypes)))]
            feeds[info.name] = (rng.standard_normal(shape) * 1000).astype(dtype)
        if rng.random() < 0.1:
            feeds["not_an_input"] = np.zeros(2, np.float32)
        try:
            session.run(feeds)
        except SessionError:
            errors += 1
    assert errors > 250  # nearly all are wrong on purpose; the process is still alive


def test_steps_release_the_gil(gqa_path: Path) -> None:
    """Concurrent generations in threads produce the same results as sequential ones."""
    session = Session(gqa_path)
    seqs = [embeds(HIDDEN_GQA, steps=30, seed=s) for s in range(4)]
    sequential = [run_cache(session, "inplace", seq, 64)[1] for seq in seqs]
    parallel: list = [None] * 4

    def work(i: int) -> None:
        parallel[i] = run_cache(session, "inplace", seqs[i], 64)[1]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a, b in zip(sequential, parallel, strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)


def test_core_imports_without_onnxruntime_module() -> None:
    code = (
        "import sys; from onnx_tts.session import Session, ort_version; ort_version(); "
        "assert 'onnxruntime' not in sys.modules, 'onnxruntime python module was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert "libonnxruntime.so" in ort_library_path()


def test_core_imports_after_onnxruntime_module(concat_path: Path) -> None:
    code = (
        "import onnxruntime, numpy as np; from onnx_tts.session import Session; "
        f"s = Session({str(concat_path)!r}); print(len(s.inputs))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "25"


def test_no_memory_growth_over_10k_steps_per_mode() -> None:
    from tools.leak_check import check

    results = check(steps=10_000, max_growth_mb=4.0)
    assert results["ok"], results
    assert len([k for k in results if "/" in k]) == 5


def test_values_stay_in_ort_memory_between_runs(concat_path: Path) -> None:
    """run_values() keeps outputs as ORT values that feed the next run without a copy."""
    session = Session(concat_path)
    seq = embeds(HIDDEN_CONCAT, steps=3)
    past: dict = {n: np.zeros((1, 2, 0, 8), np.float32) for n in session.input_names[1:]}
    expected = reference_loop(concat_path, seq, layers=12, heads=2, head_dim=8)
    for step, e in enumerate(seq):
        out = session.run_values({"inputs_embeds": e, **past})
        np.testing.assert_array_equal(out["logits"].numpy(), expected[step])
        past = {n.replace("present", "past_key_values"): v for n, v in out.items() if n != "logits"}
        value = past["past_key_values.0.key"]
        assert value.on_cpu and value.dtype == "float32" and value.data_ptr != 0
        assert tuple(value.shape) == (1, 2, 6 + step, 8)


def test_requested_outputs_may_change_between_steps(gqa_path: Path, concat_path: Path) -> None:
    for path, hidden, mode in (
        (gqa_path, HIDDEN_GQA, "inplace"),
        (concat_path, HIDDEN_CONCAT, "chain"),
    ):
        seq = embeds(hidden, steps=4)
        session = Session(path)
        _, expected = run_cache(session, mode, seq, capacity=32 if mode == "inplace" else None)
        kv = KVCache(session, mode, capacity=32 if mode == "inplace" else None)
        assert kv.step({"inputs_embeds": seq[0]}, output_names=[]) == {}
        got = [kv.step({"inputs_embeds": e}, output_names=["logits"])["logits"] for e in seq[1:3]]
        got.append(kv.step({"inputs_embeds": seq[3]})["logits"])
        for a, b in zip(expected[1:4], got, strict=True):
            np.testing.assert_array_equal(a, b)
        with pytest.raises(SessionError, match="managed by the cache"):
            kv.step({"inputs_embeds": seq[4]}, output_names=["present.0.key"])
        assert kv.length == sum(e.shape[1] for e in seq[:4])  # the refused step added none

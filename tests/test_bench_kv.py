"""KV benchmark (issue 6): graph equivalence on small configs, runner agreement, report format."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import bench_kv, lm_graphs
from onnx_tts.errors import InputError, ModelError

TINY = ("gpt2-tiny", "llama-tiny")


@pytest.fixture(scope="module")
def graph_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bench-graphs")


@pytest.fixture(scope="module")
def tiny_graphs(graph_cache: Path) -> dict[str, lm_graphs.ShapeGraphs]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ONNX_TTS_BENCH_CACHE", str(graph_cache))
        return {name: lm_graphs.ensure_graphs(lm_graphs.SHAPES[name]) for name in TINY}


def _empty_past(shape: lm_graphs.LMShape) -> dict[str, np.ndarray]:
    empty = np.zeros((1, shape.kv_heads, 0, shape.head_dim), dtype=np.float32)
    return {
        f"past_key_values.{i}.{kind}": empty
        for i in range(shape.layers)
        for kind in ("key", "value")
    }


@pytest.mark.parametrize("name", TINY)
def test_gqa_graph_matches_optimum_export_and_torch(
    name: str, tiny_graphs: dict[str, lm_graphs.ShapeGraphs]
) -> None:
    import torch

    graphs = tiny_graphs[name]
    shape = graphs.shape
    concat = ort.InferenceSession(str(graphs.concat_path), providers=["CPUExecutionProvider"])
    gqa = ort.InferenceSession(str(graphs.gqa_path), providers=["CPUExecutionProvider"])
    concat_names = [o.name for o in concat.get_outputs()]
    gqa_names = [o.name for o in gqa.get_outputs()]
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, shape.vocab, size=(1, 12), dtype=np.int64)

    # prefill 8 tokens, then 4 single-token steps, each graph with its own growing cache
    concat_past, gqa_past = _empty_past(shape), _empty_past(shape)
    length, diffs, all_logits = 0, [], []
    for chunk in (tokens[:, :8], *(tokens[:, i : i + 1] for i in range(8, 12))):
        c_out = dict(
            zip(
                concat_names,
                concat.run(
                    None, {**bench_kv.concat_feeds(chunk, length, "input_ids"), **concat_past}
                ),
                strict=True,
            )
        )
        g_out = dict(
            zip(
                gqa_names,
                gqa.run(None, {**bench_kv.gqa_feeds(chunk, length, "input_ids"), **gqa_past}),
                strict=True,
            )
        )
        assert g_out["logits"].shape == c_out["logits"].shape == (1, chunk.shape[1], shape.vocab)
        diffs.append(float(np.max(np.abs(g_out["logits"] - c_out["logits"]))))
        np.testing.assert_allclose(g_out["present.1.value"], c_out["present.1.value"], atol=1e-5)
        all_logits.append(g_out["logits"])
        concat_past = {k: c_out[k.replace("past_key_values", "present")] for k in concat_past}
        gqa_past = {k: g_out[k.replace("past_key_values", "present")] for k in gqa_past}
        length += chunk.shape[1]
    print(f"{name}: GQA vs optimum export, max abs logits diff per step: {diffs}")
    assert max(diffs) < 1e-4
    # the logits are not degenerate: tokens are told apart
    assert np.std(np.concatenate(all_logits, axis=1)) > 1e-2

    model = lm_graphs.build_torch_model(shape)  # same seed -> same weights
    with torch.no_grad():
        expected = model(torch.from_numpy(tokens)).logits.numpy()
    np.testing.assert_allclose(np.concatenate(all_logits, axis=1), expected, atol=1e-4)


def _lm(graphs: lm_graphs.ShapeGraphs) -> bench_kv.LMUnderTest:
    lm = bench_kv.describe_graphs(
        graphs.shape.name, graphs.concat_path, graphs.gqa_path, "generation"
    )
    lm.token_size = graphs.shape.vocab
    return lm


@pytest.mark.parametrize("name", TINY)
def test_every_mode_produces_the_baseline_logits(
    name: str, tiny_graphs: dict[str, lm_graphs.ShapeGraphs]
) -> None:
    lm = _lm(tiny_graphs[name])
    tokens = bench_kv.TokenSource(lm, 40)
    capacity = 32
    logits: dict[str, list[np.ndarray]] = {}
    for graph in ("concat", "gqa"):
        modes = [m for m in bench_kv.ALL_MODES if bench_kv.MODE_GRAPH[m] == graph]
        with bench_kv.open_runners(lm, [graph], modes, capacity) as runners:
            assert [r.mode for r in runners] == modes
            for runner in runners:
                for _ in range(2):  # a reset must give a clean second sequence
                    runner.reset()
                    steps = [np.array(runner.advance(tokens.take(0, 6)), copy=True)]
                    for i in range(6, 14):
                        steps.append(np.array(runner.advance(tokens.take(i, 1)), copy=True))
                    assert runner.past_length == 14
                logits[runner.mode] = steps
    baseline = logits[bench_kv.BASELINE_MODE]
    for mode, steps in logits.items():
        for got, want in zip(steps, baseline, strict=True):
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, atol=1e-4, err_msg=mode)


def test_inplace_runner_writes_into_its_fixed_buffers(
    tiny_graphs: dict[str, lm_graphs.ShapeGraphs],
) -> None:
    lm = _lm(tiny_graphs["llama-tiny"])
    tokens = bench_kv.TokenSource(lm, 20)
    with bench_kv.open_runners(lm, ["gqa"], ["ort-iobinding-inplace"], 16) as (inplace,):
        with bench_kv.open_runners(lm, ["concat"], ["ort-run"], 16) as (baseline,):
            pointers = [v.data_ptr() for v in inplace.buffers.values()]
            for runner in (inplace, baseline):
                runner.advance(tokens.take(0, 5))
                for i in range(5, 9):
                    runner.advance(tokens.take(i, 1))
            assert [v.data_ptr() for v in inplace.buffers.values()] == pointers
            for past_name, value in inplace.buffers.items():
                cached = value.numpy()
                assert cached.shape == (1, lm.kv_heads, 16, lm.head_dim)
                np.testing.assert_allclose(cached[:, :, :9], baseline.past[past_name], atol=1e-5)
        with pytest.raises(InputError, match="capacity"):
            inplace.advance(tokens.take(0, 8))


def test_main_writes_records_targets_and_plot(
    tmp_path: Path, graph_cache: Path, tiny_graphs: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ONNX_TTS_BENCH_CACHE", str(graph_cache))
    out_json, out_png, out_md = tmp_path / "kv.json", tmp_path / "kv.png", tmp_path / "kv.md"
    code = bench_kv.main(
        [
            "--shapes",
            "gpt2-tiny",
            "--contexts",
            "64",
            "96",
            "--window",
            "3",
            "--warmup",
            "1",
            "--json",
            str(out_json),
            "--plot",
            str(out_png),
            "--markdown",
            str(out_md),
        ]
    )
    assert code == 0
    report = json.loads(out_json.read_text())
    records = report["records"]
    modes = {r["mode"] for r in records}
    assert modes == set(bench_kv.ALL_MODES)
    assert len(records) == len(bench_kv.ALL_MODES) * 2
    assert {(r["shape"], r["context"]) for r in records} == {("gpt2-tiny", 64), ("gpt2-tiny", 96)}
    for r in records:
        assert r["ms_per_step"] > 0 and r["total_lm_ms"] > r["prefill_ms"] > 0
        assert r["steps_timed"] == 3
        assert r["logits_max_abs_diff_vs_baseline"] < 1e-4
        assert r["peak_rss_mb"] >= r["rss_before_mb"] > 0
        if r["mode"] == bench_kv.BASELINE_MODE:
            assert r["speedup_step_vs_baseline"] == 1.0
        if r["mode"].startswith("core-"):
            assert r["core_overhead_us"] >= 0 and r["steps"] >= 3 * 2 * 2
            assert r["ort_run_ms"] < r["ms_per_step"] * 3
    # a 96-step generation takes longer than a 64-step one, in every mode
    for mode in modes:
        by_ctx = {r["context"]: r["total_lm_ms"] for r in records if r["mode"] == mode}
        assert by_ctx[96] > by_ctx[64]
    assert report["machine"]["logical_cpus"] >= 1
    assert any("never slower" in t["target"] for t in report["targets"])
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    tables = out_md.read_text()
    assert all(f"| `{mode}` |" in tables for mode in bench_kv.ALL_MODES)


def test_integrated_total_is_prefill_plus_the_area_under_ms_per_step() -> None:
    flat = bench_kv.integrate_totals({64: 2.0, 1024: 2.0}, [64, 100], prefill_ms=10.0)
    assert flat == {64: pytest.approx(10.0 + 64 * 2.0), 100: pytest.approx(10.0 + 100 * 2.0)}
    # linear ms(p) = p / 64 between the two contexts: sum over p = 64..127 of p / 64
    linear = bench_kv.integrate_totals({64: 1.0, 128: 2.0}, [64], prefill_ms=0.0)
    assert linear[64] == pytest.approx(sum(p / 64 for p in range(64, 128)))


def test_targets_report_reached_and_missed_numbers() -> None:
    def rec(mode: str, ctx: int, ms: float, speedup: float, total: float) -> dict:
        return {
            "shape": "s",
            "mode": mode,
            "context": ctx,
            "ms_per_step": ms,
            "speedup_step_vs_baseline": speedup,
            "speedup_total_vs_baseline": total,
        }

    records = [
        rec("core-inplace", 64, 1.0, 3.5, 2.0),
        rec("core-inplace", 512, 1.1, 3.5, 2.0),
        rec("core-inplace", 1024, 1.5, 4.0, 2.5),
        rec("core-chain", 64, 2.0, 1.2, 1.2),
        rec("core-chain", 512, 2.0, 0.9, 1.05),
        rec("core-chain", 1024, 2.0, 1.3, 1.10),
    ]
    targets = {t["target"]: t for t in bench_kv.check_targets(records)}
    assert targets["core-inplace >= 3x baseline per step @512"]["reached"] is True
    flat = targets["core-inplace ms/step @1024 <= 1.3x @64"]
    assert flat["reached"] is False and flat["measured"] == pytest.approx(1.5)
    never = targets["core-chain never slower than baseline"]
    assert never["reached"] is False and never["measured"] == pytest.approx(0.9)
    gain = next(t for name, t in targets.items() if name.startswith("core-chain total"))
    assert gain["reached"] is False and gain["measured"] == pytest.approx(1.10)


def test_bad_arguments_raise_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="unknown LM shape 'gpt5'"):
        bench_kv.main(["--shapes", "gpt5"])
    with pytest.raises(InputError, match="prefill"):
        bench_kv.main(["--shapes", "gpt2-tiny", "--contexts", "16"])
    with pytest.raises(ModelError, match="missing"):
        bench_kv.describe_graphs("x", tmp_path / "a.onnx", tmp_path / "b.onnx", "window")


def test_rolling_median_drops_an_isolated_stall_but_keeps_a_trend() -> None:
    smoothed = bench_kv.rolling_median([1, 1, 100, 1, 1, 2, 2, 2], half_width=1)
    assert smoothed.tolist() == [1, 1, 1, 1, 1, 2, 2, 2]

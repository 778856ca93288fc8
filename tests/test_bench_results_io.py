"""benchmarks/results_io.py: how every benchmark writes its JSON and its plot."""

from __future__ import annotations

import json

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from benchmarks import results_io
from onnx_tts.errors import OutputError


def test_write_json_creates_the_directory_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "new" / "result.json"
    results_io.write_json(path, {"b": [1, 2]}, indent=1)
    assert path.read_text() == '{\n "b": [\n  1,\n  2\n ]\n}\n'
    assert [p.name for p in path.parent.iterdir()] == ["result.json"]


def test_a_failed_write_keeps_the_earlier_result(tmp_path):
    path = tmp_path / "result.json"
    path.write_text("earlier\n")
    path.chmod(0o444)  # read-only on purpose: the write must refuse, not replace it
    with pytest.raises(OutputError, match="read-only"):
        results_io.write_json(path, {"new": True})
    assert path.read_text() == "earlier\n"
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_save_figure_writes_a_png_and_closes_the_figure(tmp_path):
    figure, axis = plt.subplots(figsize=(2, 2))
    axis.plot([0, 1], [1, 0])
    path = tmp_path / "plots" / "result.png"
    results_io.save_figure(figure, path, dpi=50)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert figure.number not in plt.get_fignums()
    assert [p.name for p in path.parent.iterdir()] == ["result.png"]


def test_machine_info_has_the_keys_results_are_read_with():
    info = results_io.machine_info()
    # serve_report.py reads cpu_count and loadavg_start; test_bench_kv reads logical_cpus.
    assert info["cpu_count"] == info["logical_cpus"] >= 1
    assert len(info["loadavg_start"]) == 3
    assert info["onnxruntime"] and info["platform"] and info["python"]
    json.dumps(info)  # it goes into the results as it is


def _old_tree(root):
    (root / "onnx_tts").mkdir(parents=True)
    (root / "onnx_tts" / "__init__.py").write_text("")
    return root


def test_require_tree_refuses_an_interpreter_that_imports_another_tree(tmp_path):
    """This suite's interpreter has this checkout installed: PYTHONPATH does not move it to
    an old tree, so a 'before' arm run with it would measure this tree."""
    import sys

    old = _old_tree(tmp_path / "old")
    with pytest.raises(SystemExit, match="not from --before-repo"):
        results_io.require_tree(sys.executable, old)


def test_require_tree_accepts_an_interpreter_that_imports_the_old_tree(tmp_path):
    import sys

    old = _old_tree(tmp_path / "old")
    launcher = tmp_path / "python-without-site"  # no site-packages: PYTHONPATH decides
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    launcher.chmod(0o755)
    assert results_io.require_tree(str(launcher), old) == str(old / "onnx_tts" / "__init__.py")

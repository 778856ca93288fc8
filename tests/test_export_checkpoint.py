"""The exporters' checkpoint reader (export/checkpoint.py) and `onnx-tts export`'s dispatch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch  # the test extra installs it (export): a missing one fails, never skips

from export.checkpoint import Checkpoint, CheckpointError, write_checkpoint


class Pair(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(3, 2, bias=False)
        self.b = torch.nn.Embedding(4, 3)


def _tensors() -> dict[str, torch.Tensor]:
    return {"m.a.weight": torch.randn(2, 3), "m.b.weight": torch.randn(4, 3), "m.x": torch.ones(1)}


@pytest.mark.parametrize("shards", [1, 2])
def test_loads_by_name_across_shards_and_reports_unread(tmp_path, shards):
    tensors = _tensors()
    write_checkpoint(tmp_path, tensors, {"hidden": 3}, shards=shards, dtype=torch.bfloat16)
    with Checkpoint(tmp_path) as checkpoint:
        assert checkpoint.config == {"hidden": 3}
        module = Pair()
        checkpoint.load_into(module, "m.")
        expected = tensors["m.a.weight"].to(torch.bfloat16).float()
        assert torch.equal(module.a.weight, expected)
        assert checkpoint.unread() == ["m.x"]


def test_every_missing_or_misshaped_tensor_is_named_at_once(tmp_path):
    tensors = _tensors()
    tensors["m.a.weight"] = torch.zeros(3, 3)
    del tensors["m.b.weight"]
    write_checkpoint(tmp_path, tensors, {})
    with Checkpoint(tmp_path) as checkpoint, pytest.raises(CheckpointError) as caught:
        checkpoint.load_into(Pair(), "m.")
    message = str(caught.value)
    assert "m.a.weight is [3, 3], expected [2, 3]" in message
    assert "missing m.b.weight [4, 3]" in message


def test_non_finite_weights_are_refused(tmp_path):
    tensors = _tensors()
    tensors["m.a.weight"][0, 0] = float("nan")
    write_checkpoint(tmp_path, tensors, {})
    with Checkpoint(tmp_path) as checkpoint, pytest.raises(CheckpointError, match="NaN"):
        checkpoint.load_into(Pair(), "m.")


def test_links_and_missing_files_are_refused(tmp_path):
    outside = tmp_path / "outside"
    write_checkpoint(outside, _tensors(), {})
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "config.json").symlink_to(outside / "config.json")
    with pytest.raises(CheckpointError, match="symbolic link"):
        Checkpoint(linked)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="neither"):
        Checkpoint(empty)
    (empty / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        Checkpoint(empty)
    with pytest.raises(CheckpointError, match="not a directory"):
        Checkpoint(tmp_path / "nowhere")


def _cli(*args: str, cwd: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ONNX_TTS_REPO"}
    command = [sys.executable, "-m", "onnx_tts", "export", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def test_export_names_its_exporters_and_refuses_an_unknown_one(tmp_path):
    done = _cli("no-such-model", "in", "out", cwd=str(tmp_path))
    assert done.returncode == 2
    assert "no exporter 'no-such-model'" in done.stderr
    assert "Traceback" not in done.stderr
    listed = _cli("--help", cwd=str(tmp_path))
    assert listed.returncode == 0 and "exporters:" in listed.stdout

"""Writing exported graphs: the torch exporter as the recipes call it (TorchScript exporter,
opset 17), and graphs that keep their weights in one shared external-data file."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

OPSET = 17
EXTERNAL_THRESHOLD = 1024  # bytes; smaller tensors stay inside the graph (as published)


def export_graph(
    module: Any,
    args: tuple,
    path: Path,
    inputs: Sequence[str],
    outputs: Sequence[str],
    dynamic: Mapping[str, Mapping[int, str]],
) -> None:
    """`module` traced at `args` into `path` (constant folding on, warnings of the tracer off:
    every graph a recipe writes is checked against its torch module afterwards)."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            args,
            str(path),
            input_names=list(inputs),
            output_names=list(outputs),
            dynamic_axes={k: dict(v) for k, v in dynamic.items()},
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )


def share_external_data(graphs: Sequence[Path], data_name: str) -> None:
    """Move every initializer of >= 1 KiB of `graphs` into one `data_name` file beside them,
    each distinct tensor (by sha256 of its bytes) stored once."""
    import onnx

    from onnx_tts.tools.external_data import save_sharing_data

    models = [(path, onnx.load(str(path), load_external_data=True)) for path in graphs]
    directory = graphs[0].parent
    for path in graphs:
        for stale in directory.glob(f"{path.name}*.data"):
            stale.unlink()
    save_sharing_data(models, data_name, EXTERNAL_THRESHOLD)


def remove_torch_sidecars(directory: Path, keep: Iterable[str]) -> None:
    """torch writes large graphs with per-tensor sidecars; keep only the shared files."""
    keep = set(keep)
    for item in directory.iterdir():
        ours = item.suffix in (".onnx", ".json", ".model") or item.name in keep
        if item.is_file() and not ours:
            item.unlink()


__all__ = [
    "EXTERNAL_THRESHOLD",
    "OPSET",
    "export_graph",
    "remove_torch_sidecars",
    "share_external_data",
]

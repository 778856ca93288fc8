"""Writing the Higgs graphs and checking each against its torch module.

`export_graph` traces a module with `torch.onnx.export` (the TorchScript exporter: dynamic axes
by name, Concat-grown KV caches that `onnx-tts convert --inplace-kv` rewrites), stores weights
of large graphs in one `<graph>.onnx_data` file beside it, and `check_graph` runs the written
file on onnxruntime against the module on the same inputs: the difference is reported, and
beyond its tolerance the export fails.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch

from onnx_tts.errors import ModelError

OPSET = 17
# Graphs above this many bytes of weights keep them in a `.onnx_data` file beside the graph.
EXTERNAL_BYTES = 64 << 20
EXTERNAL_THRESHOLD = 1024  # tensors of at least this many bytes go to the data file


@dataclass(frozen=True)
class GraphCheck:
    """One graph compared with its torch module: the largest absolute difference of each
    output, and whether integer outputs (codes) are equal."""

    role: str
    max_abs_diff: dict[str, float]
    tolerance: float

    def describe(self) -> str:
        parts = ", ".join(f"{name} {diff:.2e}" for name, diff in self.max_abs_diff.items())
        return f"{self.role}: max |onnx - torch| {parts} (tolerance {self.tolerance:g})"


def export_graph(
    module: torch.nn.Module,
    args: tuple,
    path: Path,
    inputs: Sequence[str],
    outputs: Sequence[str],
    dynamic: Mapping[str, Mapping[int, str]],
) -> Path:
    """`module(*args)` traced to `path`; weights in `path.name + '_data'` when large."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in (path, path.with_name(path.name + "_data")):
        stale.unlink(missing_ok=True)
    # torch writes a large graph's weights tensor by tensor beside it: trace into a scratch
    # directory, then save the graph with its weights in one file.
    with tempfile.TemporaryDirectory(dir=path.parent) as scratch:
        traced = Path(scratch) / path.name
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # tracer notes about shapes read as Python numbers
            torch.onnx.export(
                module,
                args,
                str(traced),
                input_names=list(inputs),
                output_names=list(outputs),
                dynamic_axes={name: dict(axes) for name, axes in dynamic.items()},
                opset_version=OPSET,
                do_constant_folding=True,
                dynamo=False,
            )
        model = onnx.load(str(traced), load_external_data=True)
    model.ir_version = min(model.ir_version, 10)  # onnxruntime reads up to 10 here
    weights = sum(t.ByteSize() for t in model.graph.initializer)
    if weights > EXTERNAL_BYTES:
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=path.name + "_data",
            size_threshold=EXTERNAL_THRESHOLD,
        )
    else:
        onnx.save_model(model, str(path))
    return path


def run_onnx(
    path: Path, feeds: Mapping[str, np.ndarray], threads: int = 1
) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, dict(feeds)), strict=True))


def check_graph(
    role: str,
    path: Path,
    module: Callable[..., object],
    feeds: Mapping[str, np.ndarray],
    tolerance: float,
    exact: Sequence[str] = (),
) -> GraphCheck:
    """Run `path` and `module(*feeds.values())` on the same inputs; ModelError beyond
    `tolerance` (or any difference in the `exact` outputs)."""
    produced = run_onnx(path, feeds)
    with torch.no_grad():
        expected = module(*(torch.from_numpy(np.asarray(v)) for v in feeds.values()))
    if isinstance(expected, torch.Tensor):
        expected = (expected,)
    flat: list[torch.Tensor] = []
    for item in expected:  # type: ignore[union-attr]
        flat.extend(item if isinstance(item, (list, tuple)) else [item])
    diffs: dict[str, float] = {}
    for (name, value), reference in zip(produced.items(), flat, strict=True):
        want = reference.numpy()
        if value.shape != want.shape:
            raise ModelError(f"{role}: output {name} is {value.shape}, torch gives {want.shape}")
        diff = float(np.max(np.abs(value.astype(np.float64) - want))) if value.size else 0.0
        diffs[name] = diff
        if name in exact and diff != 0.0:
            raise ModelError(f"{role}: output {name} differs from torch (must be equal)")
        if not np.isfinite(diff) or diff > tolerance:
            raise ModelError(
                f"{role}: output {name} differs from torch by {diff:.3g} (tolerance {tolerance:g})"
            )
    return GraphCheck(role, diffs, tolerance)


__all__ = ["OPSET", "GraphCheck", "check_graph", "export_graph", "run_onnx"]

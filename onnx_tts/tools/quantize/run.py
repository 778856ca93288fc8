"""`quantize_model(IN, OUT, spec)`: every graph of a model that pays to quantize, checked
against its float original and written in the family's own layout (from the files the family
declares: onnx_tts/families/files.py), with a report.

The output directory is built in a private staging directory beside OUT and appears with one
rename after it loads as the same family, so a failure leaves nothing behind.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from onnx_tts.bundle import write_file
from onnx_tts.errors import InputError, ModelError, SessionError
from onnx_tts.families.files import ModelFiles
from onnx_tts.graph_io import model_bytes
from onnx_tts.tools.external_data import save_sharing_data
from onnx_tts.tools.model_dir import model_files, new_output, place_output
from onnx_tts.tools.quantize.agreement import Agreement, compare_stateless, compare_with_cache
from onnx_tts.tools.quantize.output import write_output
from onnx_tts.tools.quantize.plan import (
    Check,
    GraphJob,
    GraphResult,
    Thresholds,
    decide,
    nothing_to_quantize,
    plan_jobs,
    settle,
)
from onnx_tts.tools.quantize.weights import (
    W8A8,
    WeightsSpec,
    dequantize_products,
    has_quantized_products,
    quantize_weights,
)

REPORT = "quantize_report.json"
MIN_STEPS = 20  # decode steps (or calls) the agreement is measured over, at least
MAX_STEPS = 1000  # and at most (each one runs both graphs)
PREFILL_TOKENS = 8


@dataclass(frozen=True)
class QuantizeReport:
    source: Path
    destination: Path
    family: str
    spec: WeightsSpec
    thresholds: Thresholds
    results: tuple[GraphResult, ...]
    source_bytes: int
    output_bytes: int

    def as_dict(self) -> dict[str, Any]:
        import onnxruntime

        return {
            "tool": "onnx-tts quantize",
            "onnxruntime": onnxruntime.__version__,
            "source": str(self.source),
            "family": self.family,
            "weights": self.spec.describe(),
            "thresholds": self.thresholds.as_dict(),
            "graphs": [r.as_dict(self.source) for r in self.results],
            "bytes": {"source": self.source_bytes, "output": self.output_bytes},
        }

    def summary(self) -> str:
        how = (
            "per column, activations per row"
            if self.spec.kind == W8A8
            else f"blocks of {self.spec.block_size}"
        )
        lines = [
            f"quantized {self.source} -> {self.destination} ({self.family}, {self.spec.kind} "
            f"weights, {how})"
        ]
        for result in self.results:
            lines.append(f"  {result.job.name}: {result.reason}")
            for name, agreement in result.agreements.items():
                for output in agreement.outputs:
                    if output.equal is not None:
                        shown = f"{output.equal:.3f} equal"
                    else:
                        shown = f"cosine {output.cosine_mean:.5f} (min {output.cosine_min:.5f})"
                        if output.top1 is not None:
                            shown += f", argmax {output.top1:.3f}"
                    lines.append(f"    {name} {output.name}: {shown}")
        lines.append(
            f"  size {self.source_bytes / 2**20:.1f} MiB -> {self.output_bytes / 2**20:.1f} MiB; "
            f"report: {self.destination / REPORT}"
        )
        return "\n".join(lines)


def _model(source: Path) -> tuple[str, ModelFiles]:
    """The family of `source` and its files; a ModelError when it is no model onnx-tts runs."""
    try:
        detection, files = model_files(source)
    except ModelError as error:
        raise ModelError(f"{source} is not a model onnx-tts can quantize: {error}") from None
    return detection.family, files


def _directory_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _run_check(
    check: Check, references: dict[str, Path], candidates: dict[str, Path], steps: int, what: str
) -> Agreement:
    what = f"{what} ({check.name})"
    if check.kind == "calls":
        role = check.roles[0]
        return compare_stateless(
            references[role],
            candidates[role],
            calls=steps + 1,
            hints=check.hints,
            dims=check.dims,
            outputs=check.outputs,
            what=what,
        )
    step_role = check.roles[-1]
    prefill = None
    if len(check.roles) == 2:
        first = check.roles[0]
        prefill = (references[first], candidates[first])
    return compare_with_cache(
        references[step_role],
        candidates[step_role],
        prefill_tokens=PREFILL_TOKENS,
        steps=steps,
        hints=check.hints,
        dims=check.dims,
        prefill=prefill,
        what=what,
    )


def _quantize_job(
    job: GraphJob, spec: WeightsSpec, work: Path, steps: int, thresholds: Thresholds
) -> GraphResult:
    """Quantize the job's graphs, check them against the float graphs and decide. A source
    that is already quantized (MatMulNBits, w8a8) is compared through its weights read back
    as float: the report always measures against float."""
    if job.already:  # quantizing it again would write the same graph
        return GraphResult(job, False, f"left as it is: {job.note}")
    if not job.checks:
        return GraphResult(job, False, f"kept float: {job.note}")
    directory = work / job.name
    (directory / "float").mkdir(parents=True)
    result = GraphResult(job, False, "")
    graphs, floats = [], []
    references = dict(zip(job.roles, job.sources, strict=True))
    for role, source in zip(job.roles, job.sources, strict=True):
        model = onnx.load(str(source), load_external_data=True)
        if has_quantized_products(model):  # the check's reference is its float read-back
            quantized = quantize_weights(model, spec)
            dequantize_products(model)
            references[role] = directory / "float" / f"{role}.onnx"
            floats.append((references[role], model))
            result.float_bytes += model_bytes(model)
        else:  # the float source on disk is the reference: its weights in memory can go
            result.float_bytes += model_bytes(model)
            quantized = quantize_weights(model, spec, consume=True)
        model = None
        result.quantized_matmuls += quantized.quantized
        result.float_matmuls += quantized.float_matmuls
        result.quantized_bytes += model_bytes(quantized.model)
        result.candidates[role] = directory / f"{role}.onnx"
        graphs.append((result.candidates[role], quantized.model))
    if result.quantized_matmuls == 0:
        result.reason = "kept float: no MatMul with a constant weight large enough to quantize"
        return result
    save_sharing_data(graphs, "weights.data")
    save_sharing_data(floats, "weights.data")
    # Nothing of the graphs stays in memory while the check runs them from disk (the loop's
    # last `model` and `quantized` too: a 1.7B backbone's float and quantized weights were
    # 9 GB held beside the sessions).
    del graphs, floats, model, quantized
    for check in job.checks:
        try:
            result.agreements[check.name] = _run_check(
                check, references, result.candidates, steps, job.name
            )
        except SessionError as error:  # e.g. a check input the graph does not accept
            raise ModelError(
                f"{job.name} ({check.name}): the agreement check could not run the graphs: "
                f"{error}; leave this graph out (--graphs)"
            ) from None
    result.kept, result.reason = decide(result.agreements, thresholds, job.per_step)
    return result


def quantize_model(
    source: Path,
    destination: Path,
    spec: WeightsSpec,
    *,
    steps: int = MIN_STEPS,
    thresholds: Thresholds | None = None,
    graphs: Sequence[str] | None = None,
    log: Callable[[str], None] | None = None,
) -> QuantizeReport:
    """Quantize the model directory `source` into the new directory `destination` (same
    family, same layout). `graphs`: the job names to try (default: all the family offers);
    `steps`: decode steps (or calls) of the agreement check, at least 20."""
    if not MIN_STEPS <= steps <= MAX_STEPS:
        raise InputError(
            f"--check-steps must be at least {MIN_STEPS} and at most {MAX_STEPS}, got {steps}"
        )
    thresholds = thresholds or Thresholds()
    source, destination = Path(source), Path(destination)
    if not source.is_dir():
        raise InputError(
            f"{source} is not a model directory: pass a model directory that onnx_tts.load "
            "takes (a bundle.json bundle or a published layout onnx-tts recognises)"
        )
    with new_output(destination, "quantized model", source=source) as staging:
        family, files = _model(source)
        jobs = plan_jobs(files, spec, graphs)
        if not any(job.checks for job in jobs):
            raise InputError(nothing_to_quantize(source, jobs))
        work, out = staging / "work", staging / "out"
        work.mkdir()
        results = []
        for job in jobs:
            if log and job.checks:
                log(f"{job.name}: quantizing and checking ...")
            results.append(_quantize_job(job, spec, work, steps, thresholds))
        settle(files, results)
        out.mkdir()
        write_output(files, out, results, spec)
        report = QuantizeReport(
            source,
            destination,
            family,
            spec,
            thresholds,
            tuple(results),
            _directory_bytes(source),
            _directory_bytes(out),
        )
        text = json.dumps(report.as_dict(), indent=2) + "\n"
        write_file(out / REPORT, text.encode("utf-8"))
        _check_loads_as(out, family)
        place_output(out, destination, "quantized model")
    return report


def _check_loads_as(out: Path, family: str) -> None:
    """The written directory is recognised as the same family (layout and files checked)."""
    from onnx_tts.families import detect

    found = detect(out).family
    if found != family:
        raise ModelError(f"the quantized model loads as {found}, not {family}: nothing was written")


__all__ = ["REPORT", "QuantizeReport", "quantize_model"]

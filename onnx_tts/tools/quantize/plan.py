"""What the quantizer does to one model: the graphs it tries (`GraphJob`, from the files the
family declares: `plan_jobs`), how each is checked, and the rule that keeps a quantized graph
(`Thresholds`, `decide`, `settle`): its outputs must agree with the float graph's and it must
not be slower.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onnx_tts.errors import InputError, ModelError, checked_number
from onnx_tts.families.files import CHECK_KINDS, Check, GraphFile, ModelFiles
from onnx_tts.graph_io import matmul_nbits_settings, read_graph_proto, weights_kind
from onnx_tts.tools.quantize.agreement import Agreement
from onnx_tts.tools.quantize.weights import INT8_COMPUTE, W8A8, WeightsSpec

VOICE_NOTE = "runs once per reference voice (its result is cached), not on the decode path"
MAX_SPEED_RATIO = 1e9  # --max-speed-ratio: anything this large keeps a graph however slow


@dataclass(frozen=True)
class GraphJob:
    """One decision of the quantizer: the graphs `roles` (files `sources`) are quantized
    together and kept or left float together (graphs that share their weights in one file stay
    sharing them), after every one of `checks`. No checks: left float, `note` says why.
    `per_step`: some graph runs for every row at every decode step (`GraphFile.runs`), where
    reading the weights is the cost: they are kept whenever they agree; any other graph must
    also measure not slower."""

    name: str
    roles: tuple[str, ...]
    sources: tuple[Path, ...]
    checks: tuple[Check, ...] = ()
    note: str = ""
    per_step: bool = False
    already: str = ""  # the weights kind it already has (left as it is), or ""

    def __post_init__(self) -> None:
        if len(self.roles) != len(self.sources):
            raise ValueError(f"bad job {self}")

    def source(self, role: str) -> Path:
        return self.sources[self.roles.index(role)]


@dataclass(frozen=True)
class Thresholds:
    """When a quantized graph agrees with its float graph: every float output's mean cosine
    >= `min_cosine`, every logits output's argmax agreement and every integer output's
    (sampled codes) equality >= `min_top1`; and it is kept only when its measured time per
    call is at most `max_speed_ratio` x the float graph's."""

    min_cosine: float = 0.99
    min_top1: float = 0.9
    max_speed_ratio: float = 1.05

    def __post_init__(self) -> None:
        checked_number("--min-cosine", self.min_cosine, 0.0, 1.0)
        checked_number("--min-top1", self.min_top1, 0.0, 1.0)
        checked_number(
            "--max-speed-ratio", self.max_speed_ratio, 0.0, MAX_SPEED_RATIO, open_low=True
        )

    def problems(self, agreement: Agreement) -> list[str]:
        found = []
        for output in agreement.outputs:
            if output.equal is not None and output.equal < self.min_top1:
                found.append(f"{output.name}: {output.equal:.3f} of values equal")
                continue
            if output.cosine_mean < self.min_cosine:
                found.append(f"{output.name}: mean cosine {output.cosine_mean:.4f}")
            if output.top1 is not None and output.top1 < self.min_top1:
                found.append(f"{output.name}: argmax agrees at {output.top1:.3f} of positions")
        return found

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


@dataclass
class GraphResult:
    """What happened to one job."""

    job: GraphJob
    kept: bool
    reason: str
    quantized_matmuls: int = 0
    float_matmuls: int = 0
    float_bytes: int = 0
    quantized_bytes: int = 0
    agreements: dict[str, Agreement] = field(default_factory=dict)  # by check name
    candidates: dict[str, Path] = field(default_factory=dict)  # role -> quantized file

    def as_dict(self, root: Path) -> dict[str, Any]:
        def shown(path: Path) -> str:
            try:
                return str(path.relative_to(root))
            except ValueError:
                return str(path)

        out: dict[str, Any] = {
            "name": self.job.name,
            "graphs": {
                role: shown(p) for role, p in zip(self.job.roles, self.job.sources, strict=True)
            },
            "quantized": self.kept,
            "decision": self.reason,
        }
        if self.job.checks:
            out["matmuls"] = {"quantized": self.quantized_matmuls, "float": self.float_matmuls}
            out["bytes"] = {"float": self.float_bytes, "quantized": self.quantized_bytes}
            out["agreement"] = {name: a.as_dict() for name, a in self.agreements.items()}
        return out


def decide(
    agreements: Mapping[str, Agreement], thresholds: Thresholds, per_step: bool
) -> tuple[bool, str]:
    """Keep the quantized graphs? And why, in one line with the numbers: every check must
    agree, and (unless the graphs run every decode step) the checked calls together must not
    be slower."""
    problems = [
        f"{name}: {problem}"
        for name, agreement in agreements.items()
        for problem in thresholds.problems(agreement)
    ]
    float_ms = sum(a.float_ms for a in agreements.values())
    quantized_ms = sum(a.quantized_ms for a in agreements.values())
    ratio = quantized_ms / max(float_ms, 1e-9)
    timing = f"{quantized_ms:.3g} ms vs {float_ms:.3g} ms per call ({ratio:.2f}x the float time)"
    if problems:
        return False, f"kept float: outputs disagree ({'; '.join(problems)}); {timing}"
    if ratio > thresholds.max_speed_ratio and not per_step:
        return False, f"kept float: not faster ({timing}), outputs agree"
    if ratio > thresholds.max_speed_ratio:
        timing += " here; kept: a decode-step graph reads 2-4x fewer weight bytes"
    return True, f"quantized: outputs agree, {timing}"


def _already(graphs: Sequence[GraphFile], files: ModelFiles, spec: WeightsSpec | None) -> str:
    """The weights kind of graphs that are all quantized as `spec` asks already (every
    MatMulNBits node of each at its bits, block size and int8 compute; w8a8: its products
    alone), else ""."""
    if spec is None:
        return ""
    models = [read_graph_proto(files.source(g.path)) for g in graphs]
    if spec.kind == W8A8:
        done = all(weights_kind(model).startswith(W8A8) for model in models)
        return weights_kind(models[0]) if done else ""
    wanted = {(spec.bits, spec.block_size, INT8_COMPUTE)}
    if all(matmul_nbits_settings(model) == wanted for model in models):
        return weights_kind(models[0])
    return ""


def _job(files: ModelFiles, graphs: Sequence[GraphFile], spec: WeightsSpec | None) -> GraphJob:
    first = graphs[0]
    # Graphs sharing an external-data file are one job, named after the file.
    name = posixpath.splitext(posixpath.basename(first.data[0]))[0] if first.data else first.role
    roles = tuple(g.role for g in graphs)
    sources = tuple(files.source(g.path) for g in graphs)
    if any(g.runs == "voice" for g in graphs):
        return GraphJob(name, roles, sources, note=VOICE_NOTE)
    already = _already(graphs, files, spec)
    if already:
        return GraphJob(name, roles, sources, note=f"already {already}", already=already)
    checks = tuple(g.check for g in graphs if g.check is not None)
    per_step = any(g.runs == "step" for g in graphs)
    return GraphJob(name, roles, sources, checks, per_step=per_step)


def plan_jobs(
    files: ModelFiles, spec: WeightsSpec | None = None, selected: Sequence[str] | None = None
) -> list[GraphJob]:
    """The jobs of a model: its float graphs (variants are not sources), those that share an
    external-data file together, in the order the family lists them. Graphs quantized as
    `spec` already are left as they are; with `selected` (job names; InputError for one the
    model does not have) the others are left out."""
    graphs = [g for g in files.graphs if not g.variant]
    missing = sorted({g.role for g in files.graphs} - {g.role for g in graphs})
    if missing:
        raise ModelError(
            f"{files.root} has no float {', '.join(missing)} graph to quantize (only variants "
            "of it); quantize the float model"
        )
    groups: dict[str, list[GraphFile]] = {}
    for graph in graphs:
        name = posixpath.basename(graph.path)
        if files.manifest and graph.data:
            raise ModelError(
                f"{name} shares an external-data file with other graphs; bundles with shared "
                "data cannot be quantized (re-export it with a data file per graph)"
            )
        if len(graph.data) > 1:
            raise ModelError(f"{name} ({graph.role}) keeps its weights in several data files")
        key = graph.data_files()[0] if graph.data else graph.path
        groups.setdefault(key, []).append(graph)
    jobs = [_job(files, group, spec) for group in groups.values()]
    if not selected:
        return jobs
    names = {job.name for job in jobs}
    unknown = sorted(set(selected) - names)
    if unknown:
        raise InputError(
            f"--graphs {', '.join(unknown)}: this model has {', '.join(sorted(names))}"
        )
    return [
        job
        if job.name in selected
        else GraphJob(job.name, job.roles, job.sources, note="not selected (--graphs)")
        for job in jobs
    ]


def nothing_to_quantize(source: Path, jobs: Sequence[GraphJob]) -> str:
    """Why a model whose jobs try nothing is refused (one line): what it already is."""
    already = [job for job in jobs if job.already]
    if already:
        kinds = sorted({job.already for job in already})
        return (
            f"{source} is already quantized ({'; '.join(kinds)}: "
            f"{', '.join(job.name for job in already)}) and nothing else of it can be: "
            "quantize its float model, or ask for other --weights or --block-size"
        )
    return f"nothing of {source} can be quantized: " + "; ".join(
        f"{job.name} {job.note}" for job in jobs
    )


def settle(files: ModelFiles, results: Sequence[GraphResult]) -> None:
    """The model's last say on which results are kept: when its variant is chosen by one
    graph's file and that graph stays float, a quantized variant of another graph would never
    be chosen, so it stays float too."""
    role = files.variant_chosen_by
    if role is None:
        return
    chooser = next((r for r in results if role in r.job.roles), None)
    if chooser is None or chooser.kept:
        return
    for result in results:
        if result.kept:
            result.kept = False
            result.reason = (
                f"kept float: the {role.replace('_', ' ')} stays float, and the layout picks a "
                f"precision by it (alone: {result.reason})"
            )


__all__ = [
    "CHECK_KINDS",
    "VOICE_NOTE",
    "Check",
    "GraphJob",
    "GraphResult",
    "Thresholds",
    "decide",
    "nothing_to_quantize",
    "plan_jobs",
    "settle",
]

"""Writing a quantized model in its family's own layout, from the files the family declares
(`ModelFiles`): quantized graphs that share an external-data file are written sharing it again
(each distinct tensor once); a graph of a model whose manifest lists its files stays one file
(or keeps its own sidecar, under the same name) and the manifest is written again (new sha256
of every file, a "quantized" section); otherwise a quantized graph takes the published variant
name of its weights kind (`X<suffix>.onnx`, or its own name when the family has no variant
names) with its weights in `<name>_data`. Variants of the source are not copied (the quantized
model's default variant is then the quantized one), graphs left float keep their files, and
every other file is copied as it is."""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx

from onnx_tts.bundle import save_model
from onnx_tts.errors import InputError
from onnx_tts.families.files import GraphFile, ModelFiles
from onnx_tts.tools.external_data import save_sharing_data
from onnx_tts.tools.model_dir import copy_model, files_of, rewrite_manifest
from onnx_tts.tools.quantize.plan import GraphResult
from onnx_tts.tools.quantize.weights import WeightsSpec


def variant_path(path: str, suffix: str) -> str:
    """`onnx/X.onnx` -> `onnx/X<suffix>.onnx`."""
    stem, extension = posixpath.splitext(path)
    return f"{stem}{suffix}{extension}"


def _suffix(files: ModelFiles, spec: WeightsSpec) -> str:
    if not files.variant_suffixes:
        return ""
    if spec.kind not in files.variant_suffixes:
        raise InputError(
            f"this model has no variant name for {spec.kind} weights (it has "
            f"{', '.join(sorted(files.variant_suffixes))})"
        )
    return files.variant_suffixes[spec.kind]


def _write_graphs(
    files: ModelFiles, out: Path, graphs: Sequence[GraphFile], result: GraphResult, suffix: str
) -> None:
    models = [
        onnx.load(str(result.candidates[graph.role]), load_external_data=True) for graph in graphs
    ]
    if graphs[0].data:  # one shared file, as in the source
        save_sharing_data(
            [(out / g.path, m) for g, m in zip(graphs, models, strict=True)], graphs[0].data[0]
        )
        return
    for graph, model in zip(graphs, models, strict=True):
        if files.manifest:  # the manifest lists each graph: one file, or with its sidecar
            if graph.sidecars:
                save_sharing_data([(out / graph.path, model)], graph.sidecars[0])
            else:
                save_model(model, out / graph.path)
            continue
        name = variant_path(graph.path, suffix)
        save_sharing_data([(out / name, model)], posixpath.basename(name) + "_data")


def write_output(
    files: ModelFiles, out: Path, results: Sequence[GraphResult], spec: WeightsSpec
) -> None:
    """The quantized model into the (existing, empty) directory `out`."""
    suffix = _suffix(files, spec)
    kept = [r for r in results if r.kept]
    kept_roles = {role for r in kept for role in r.job.roles}
    float_graphs = {g.role: g for g in files.graphs if not g.variant}
    as_they_are = [g for g in float_graphs.values() if g.role not in kept_roles]
    leaving = files_of(g for g in files.graphs if g.variant or g.role in kept_roles)
    copy_model(files, out, leaving - files_of(as_they_are))
    for result in kept:
        graphs = [float_graphs[role] for role in result.job.roles]
        _write_graphs(files, out, graphs, result, suffix)

    already = {role for r in results if r.job.already for role in r.job.roles}

    def record(manifest: dict[str, Any]) -> None:
        manifest["quantized"] = {**spec.describe(), "graphs": sorted(kept_roles | already)}
        lm = manifest.get("lm")
        if isinstance(lm, dict) and "weights" in lm and "lm" in kept_roles:
            manifest["lm"] = {**lm, "weights": spec.kind}

    rewrite_manifest(files, out, record)


__all__ = ["variant_path", "write_output"]

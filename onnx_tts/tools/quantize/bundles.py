"""Quantizing an onnx-tts bundle (a directory with bundle.json: the default voice
"phoneme-mel", "codec-lm"): the graphs the manifest lists, written back under the same names
with bundle.json rewritten by the one bundle writer (new sha256 of every file, a "quantized"
section saying what was done)."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import onnx

from onnx_tts.bundle import MANIFEST, Bundle
from onnx_tts.errors import ModelError
from onnx_tts.graph_io import kv_pairs, read_graph_spec
from onnx_tts.tools.bundle_files import manifest_files, write_bundle
from onnx_tts.tools.quantize.feeds import Hint
from onnx_tts.tools.quantize.plan import Check, GraphJob, GraphResult
from onnx_tts.tools.quantize.weights import WeightsSpec

ENCODER_NOTE = "runs once per reference voice (its result is cached), not on the decode path"
ENCODER_ROLES = ("encoder",)
# Sizes for symbolic dimensions of the stateless graphs' check inputs.
CHECK_DIMS = {"frames": 120, "steps": 8, "sequence": 8}


def _has_cache(path: Path) -> bool:
    spec = read_graph_spec(path)
    try:
        kv_pairs(spec.input_names, spec.output_names)
    except ModelError:
        return False
    return True


class BundleTarget:
    """A bundle.json directory."""

    def __init__(self, bundle: Bundle) -> None:
        self.bundle = bundle
        self.root = bundle.root
        self.family = bundle.family
        self.graphs: dict[str, str] = dict(bundle.section("graphs"))
        for role in self.graphs:
            path = bundle.graph_path(role)
            if read_graph_spec(path).external_data:
                raise ModelError(
                    f"{path.name} keeps its weights in an external-data file; bundles with "
                    "external data cannot be quantized (re-export it with inline weights)"
                )

    def jobs(self) -> list[GraphJob]:
        hints = {}
        codec = self.bundle.manifest.get("codec")
        if isinstance(codec, dict) and isinstance(codec.get("codebook_size"), int):
            hints["codes"] = Hint(high=codec["codebook_size"])  # what the vocoder may receive
        jobs = []
        for role in self.graphs:
            path = self.bundle.graph_path(role)
            if role in ENCODER_ROLES:
                jobs.append(GraphJob(role, (role,), (path,), note=ENCODER_NOTE))
                continue
            kind = "cache" if _has_cache(path) else "calls"
            jobs.append(
                GraphJob(role, (role,), (path,), (Check(kind, (role,), hints, CHECK_DIMS),))
            )
        return jobs

    def settle(self, results: Sequence[GraphResult]) -> None:
        """Every result stands as decided."""

    def write(self, out: Path, results: Sequence[GraphResult], spec: WeightsSpec) -> None:
        kept = {r.job.roles[0]: r.candidates[r.job.roles[0]] for r in results if r.kept}
        manifest = {k: v for k, v in self.bundle.manifest.items() if k != "sha256"}
        files: dict[str, onnx.ModelProto | bytes] = {}
        for name in sorted(manifest_files(manifest)):
            files[name] = (self.root / name).read_bytes()
        for role, name in self.graphs.items():
            if role in kept:
                files[name] = onnx.load(str(kept[role]), load_external_data=True)
        manifest["quantized"] = {**spec.describe(), "graphs": sorted(kept)}
        lm = manifest.get("lm")
        if isinstance(lm, dict) and "weights" in lm and "lm" in kept:
            manifest["lm"] = {**lm, "weights": spec.kind}
        write_bundle(out, manifest, files)
        for path in sorted(self.root.iterdir()):  # files the manifest does not name
            if path.name == MANIFEST or path.name in files or not path.is_file():
                continue
            shutil.copy2(path, out / path.name)


__all__ = ["BundleTarget"]

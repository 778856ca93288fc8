"""The files of a moss-tts model directory, for the offline tools: the model's own graphs that
bundle.json lists, each with its own external-data sidecar (`<graph>.onnx_data`), and
bundle.json as the manifest. The backbone is the step LM `convert --inplace-kv` rewrites; the
backbone, the depth transformer and the heads run at every decode step (quantized whenever they
agree); the input tables (`embed`) are read by the host and stay as they are. The codec in
`codec/` is its own model (its graphs share data files): the tools copy it as it is."""

from __future__ import annotations

import posixpath

from onnx_tts.bundle import MANIFEST, Bundle
from onnx_tts.families.base import Detection
from onnx_tts.families.files import Check, GraphFile, Hint, ModelFiles, Runs

CHECK_DIMS = {"sequence": 4, "frames": 8}


def _runs(role: str) -> Runs:
    return "voice" if role == "embed" else "step"  # host tables: never rewritten


def _check(bundle: Bundle, role: str) -> Check | None:
    model = bundle.manifest.get("model", {})
    n_vq = int(model.get("n_vq", 1)) if isinstance(model, dict) else 1
    if role == "backbone":
        return Check("cache", (role,), {}, CHECK_DIMS)
    if role == "local":
        return Check("cache", (role,), {"channel": Hint(high=n_vq, shape=())}, CHECK_DIMS)
    if role.startswith("head"):
        return Check("calls", (role,), {}, CHECK_DIMS)
    return None


def model_files(detection: Detection) -> ModelFiles:
    bundle: Bundle = detection.inspected
    graphs = []
    for role, path in bundle.section("graphs").items():
        if role.startswith("codec_"):
            continue
        sidecar = posixpath.basename(path) + "_data"
        has_sidecar = (bundle.root / posixpath.dirname(path) / sidecar).is_file()
        runs = _runs(role)
        graphs.append(
            GraphFile(
                role,
                path,
                runs=runs,
                step_lm=role == "backbone",
                sidecars=(sidecar,) if has_sidecar else (),
                check=None if runs == "voice" else _check(bundle, role),
            )
        )
    return ModelFiles(detection.root, {"": bundle.root}, tuple(graphs), manifest=MANIFEST)


__all__ = ["model_files"]

"""The files of a model in a `bundle.json` directory, for the offline tools: every graph the
manifest lists, by its role, and bundle.json as the manifest that lists every file's sha256.
Families whose models are bundles declare their files with `bundle_files`."""

from __future__ import annotations

from onnx_tts.bundle import MANIFEST, Bundle
from onnx_tts.errors import ModelError
from onnx_tts.families.base import Detection
from onnx_tts.families.files import Check, GraphFile, Hint, ModelFiles
from onnx_tts.graph_io import kv_pairs, read_graph_spec

# Graph roles that run once per reference voice (their result is cached).
VOICE_ROLES = ("encoder",)
# Sizes for symbolic dimensions of the stateless graphs' check inputs.
CHECK_DIMS = {"frames": 120, "steps": 8, "sequence": 8}


def bundle_files(detection: Detection) -> ModelFiles:
    """The files of the bundle `detection` read. Every graph but the encoder is a "call"
    graph: a bundle's graphs are small, so a quantized one must also measure not slower. A
    graph with a KV cache is a step LM and is checked over a prefill and decode steps."""
    bundle: Bundle = detection.inspected
    hints = {}
    codec = bundle.manifest.get("codec")
    if isinstance(codec, dict) and isinstance(codec.get("codebook_size"), int):
        hints["codes"] = Hint(high=codec["codebook_size"])  # what the vocoder may receive
    graphs = []
    for role, name in bundle.section("graphs").items():
        spec = read_graph_spec(bundle.graph_path(role))
        try:
            kv_pairs(spec.input_names, spec.output_names)
            cached = True
        except ModelError:
            cached = False
        voice = role in VOICE_ROLES
        graphs.append(
            GraphFile(
                role,
                name,
                runs="voice" if voice else "call",
                step_lm=cached,
                sidecars=spec.external_data,
                check=None
                if voice
                else Check("cache" if cached else "calls", (role,), hints, CHECK_DIMS),
            )
        )
    return ModelFiles(detection.root, {"": bundle.root}, tuple(graphs), manifest=MANIFEST)


__all__ = ["CHECK_DIMS", "VOICE_ROLES", "bundle_files"]

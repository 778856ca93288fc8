"""What the families whose models are `bundle.json` directories share: their files for the
offline tools (`bundle_files`: every graph the manifest lists, by its role, and bundle.json as
the manifest that lists every file's sha256), their reference encoder identified by the
manifest (`bundle_encoder`), and a `BundledModel` whose file hashes are the manifest's (checked
at load, so never read again)."""

from __future__ import annotations

from collections.abc import Sequence

from onnx_tts.bundle import MANIFEST, Bundle
from onnx_tts.encoder import VoiceEncoder
from onnx_tts.errors import ModelError
from onnx_tts.families.base import Detection, Model
from onnx_tts.families.files import Check, GraphFile, Hint, ModelFiles
from onnx_tts.graph_io import kv_pairs, read_graph_spec
from onnx_tts.session import Session

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


class BundledModel(Model):
    """A model loaded from a bundle (`self.bundle`, set by the subclass before `__init__`)."""

    bundle: Bundle

    def file_hashes(self) -> dict[str, str]:
        """The manifest's sha256 of every file: `Bundle.validate` checked them at load."""
        return dict(self.bundle.manifest.get("sha256", {}) or {})


def bundle_encoder(
    bundle: Bundle, session: Session, hop_length: int, frame_outputs: Sequence[str] = ("codes",)
) -> VoiceEncoder:
    """The reference encoder of a bundle's "encoder" graph, identified by the bundle and the
    graph's sha256 from the manifest (checked at load, so the graph is not hashed again)."""
    return VoiceEncoder(
        session,
        bundle_identity=f"{bundle.name}@{bundle.identity}",
        sample_rate=bundle.sample_rate,
        settings=dict(bundle.manifest.get("encoder", {})),
        graph_sha256=bundle.file_sha256(bundle.section("graphs")["encoder"]),
        graph_path=bundle.graph_path("encoder"),
        hop_length=hop_length,
        frame_outputs=frame_outputs,
    )


__all__ = ["CHECK_DIMS", "VOICE_ROLES", "BundledModel", "bundle_encoder", "bundle_files"]

"""A Higgs model directory's files for the offline tools (`convert`, `quantize`): the backbone
is the step LM (Concat-grown cache -> GroupQueryAttention), it and the audio head run at every
decode step, the embedding sum is a table lookup, the reference encoder runs once per voice."""

from __future__ import annotations

from onnx_tts.bundle import MANIFEST, Bundle
from onnx_tts.families.base import Detection
from onnx_tts.families.files import Check, GraphFile, Hint, ModelFiles, Runs
from onnx_tts.graph_io import read_graph_spec

RUNS: dict[str, Runs] = {
    "encoder": "voice",
    "embed": "call",
    "lm": "step",
    "head": "step",
    "decoder": "call",
}
CHECK_FRAMES = 24


def model_files(detection: Detection) -> ModelFiles:
    bundle: Bundle = detection.inspected
    higgs = bundle.section("higgs")
    books, size = int(higgs["codebooks"]), int(higgs["codebook_size"])
    checks = {
        "lm": Check("cache", ("lm",), {}, {"sequence": 8}),
        "head": Check("calls", ("head",), {}, {"batch": 2}),
        "embed": Check(
            "calls",
            ("embed",),
            {"input_ids": Hint(high=size - 2, shape=(1, 8, 1 + books))},
        ),
        "decoder": Check(
            "calls", ("decoder",), {"codes": Hint(high=size - 2, shape=(1, CHECK_FRAMES, books))}
        ),
    }
    graphs = []
    for role, name in bundle.section("graphs").items():
        spec = read_graph_spec(bundle.graph_path(role))
        graphs.append(
            GraphFile(
                role,
                name,
                runs=RUNS.get(role, "call"),
                step_lm=role == "lm",
                sidecars=spec.external_data,
                check=checks.get(role),
            )
        )
    return ModelFiles(detection.root, {"": bundle.root}, tuple(graphs), manifest=MANIFEST)


__all__ = ["model_files"]

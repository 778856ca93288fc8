"""A Chatterbox directory's files, for the offline tools: every graph of every published
precision present (fp32 is the float graph, the others its variants), each with its own
`.onnx_data` sidecar. Quantized graphs take the published variant names (`X_quantized.onnx`
for int8, the "q8" variant; `X_q4.onnx` for int4), so `--precision` finds them; the language
model's file decides which precision loads."""

from __future__ import annotations

from onnx_tts.families.base import Detection
from onnx_tts.families.chatterbox.layout import (
    PRECISION_SUFFIX,
    PRECISIONS,
    ROLES,
    ChatterboxLayout,
    graph_file,
)
from onnx_tts.families.files import Check, GraphFile, Hint, ModelFiles, Runs
from onnx_tts.graph_io import read_graph_spec

FLOAT_PRECISION = "fp32"
LANGUAGE_MODEL = "language_model"
# The published precision of each quantized weights kind.
PRECISION_OF = {"int8": "q8", "int4": "q4"}
RUNS: dict[str, Runs] = {
    "speech_encoder": "voice",
    "embed_tokens": "call",
    LANGUAGE_MODEL: "step",
    "conditional_decoder": "call",
}
# Check inputs of the conditional decoder: 40 speech tokens after a 10-token prompt (the
# decoder trims T / 2 prompt tokens given T speaker feature frames).
DECODER_HINTS = {
    "speech_tokens": Hint(shape=(1, 50), high=6561),
    "speaker_features": Hint(shape=(1, 20, 80)),
    "exaggeration": Hint(value=0.5),
}


def model_files(detection: Detection) -> ModelFiles:
    """Every graph file of the directory `detection` read, float graphs first."""
    layout: ChatterboxLayout = detection.inspected
    root = layout.model_dir
    known = {spec.path: spec for spec in layout.graphs.values()}
    graphs = []
    for precision in PRECISIONS:
        for role in ROLES:
            path = graph_file(layout.graph_dir, role, precision)
            if not path.is_file():
                continue
            spec = known.get(path) or read_graph_spec(path)
            runs = RUNS[role]
            lm = role == LANGUAGE_MODEL
            graphs.append(
                GraphFile(
                    role,
                    path.relative_to(root).as_posix(),
                    runs=runs,
                    step_lm=lm,
                    sidecars=spec.external_data,
                    variant="" if precision == FLOAT_PRECISION else precision,
                    check=None
                    if runs == "voice"
                    else Check("cache" if lm else "calls", (role,), DECODER_HINTS),
                )
            )
    return ModelFiles(
        root,
        {"": root},
        tuple(graphs),
        variant_suffixes={kind: PRECISION_SUFFIX[p] for kind, p in PRECISION_OF.items()},
        variant_chosen_by=LANGUAGE_MODEL,
    )


__all__ = ["PRECISION_OF", "model_files"]

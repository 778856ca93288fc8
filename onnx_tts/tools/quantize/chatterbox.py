"""Quantizing a Chatterbox ONNX directory: the fp32 graphs are the source; a quantized graph is
written under the published name of its precision (`X_quantized.onnx` for int8, the "q8"
variant; `X_q4.onnx` for int4) with its weights in `X_<suffix>.onnx_data`, so the Chatterbox
layout picks it by `--precision` (and by default, since the output holds no fp32 LM). A graph
left float keeps its fp32 name, which every precision falls back to. Other precision variants
of the source are not copied."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import onnx

from onnx_tts.errors import ModelError
from onnx_tts.families.chatterbox.layout import (
    PRECISION_SUFFIX,
    ChatterboxLayout,
    graph_directory,
    inspect_layout,
)
from onnx_tts.tools.bundle_files import save_sharing_data
from onnx_tts.tools.quantize.feeds import Hint
from onnx_tts.tools.quantize.plan import Check, GraphJob, GraphResult
from onnx_tts.tools.quantize.weights import WeightsSpec

PRECISION_OF = {"int8": "q8", "int4": "q4"}
ENCODER_NOTE = "runs once per reference voice (its result is cached), not on the decode path"
# Check inputs of the conditional decoder: 40 speech tokens after a 10-token prompt (the
# decoder trims T / 2 prompt tokens given T speaker feature frames).
DECODER_HINTS = {
    "speech_tokens": Hint(shape=(1, 50), high=6561),
    "speaker_features": Hint(shape=(1, 20, 80)),
    "exaggeration": Hint(value=0.5),
}


def output_name(source: Path, kind: str) -> str:
    """`language_model.onnx` -> `language_model_q4.onnx` (the published variant name)."""
    return source.name[: -len(".onnx")] + PRECISION_SUFFIX[PRECISION_OF[kind]] + ".onnx"


class ChatterboxTarget:
    """A Chatterbox directory; its fp32 graphs are what gets quantized."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        try:
            self.layout: ChatterboxLayout = inspect_layout(self.root, "fp32")
        except ModelError as error:
            raise ModelError(
                f"{self.root} has no complete float (fp32) Chatterbox model to quantize: {error}"
            ) from None
        self.family = self.layout.family
        self.graph_dir = graph_directory(self.root)

    def jobs(self) -> list[GraphJob]:
        jobs = []
        for role, spec in self.layout.graphs.items():
            path = spec.path
            if role == "speech_encoder":
                jobs.append(GraphJob(role, (role,), (path,), note=ENCODER_NOTE))
                continue
            lm = role == "language_model"
            check = Check("cache" if lm else "calls", (role,), DECODER_HINTS)
            jobs.append(GraphJob(role, (role,), (path,), (check,), per_step=lm))
        return jobs

    def settle(self, results: Sequence[GraphResult]) -> None:
        """The layout picks a precision by the language model's file: with the LM left
        float, a quantized variant of another graph would never be chosen, so it stays float
        too."""
        lm = next((r for r in results if r.job.name == "language_model"), None)
        if lm is not None and not lm.kept:
            for result in results:
                if result.kept:
                    result.kept = False
                    result.reason = (
                        f"kept float: the language model stays float, and the layout picks "
                        f"a precision by it (alone: {result.reason})"
                    )

    def write(self, out: Path, results: Sequence[GraphResult], spec: WeightsSpec) -> None:
        kept = {r.job.roles[0]: r.candidates[r.job.roles[0]] for r in results if r.kept}
        graph_out = out / self.graph_dir.relative_to(self.root)
        graph_out.mkdir(parents=True, exist_ok=True)
        for role, graph in self.layout.graphs.items():
            if role in kept:
                name = output_name(graph.path, spec.kind)
                model = onnx.load(str(kept[role]), load_external_data=True)
                save_sharing_data([(graph_out / name, model)], name + "_data")
                continue
            for path in self.layout.files_of(role):
                shutil.copy2(path, graph_out / path.name)
        for path in sorted(self.root.iterdir()):  # tokenizer, default voice, notes
            if path.is_file() and path.suffix not in (".onnx", ".onnx_data"):
                shutil.copy2(path, out / path.name)


__all__ = ["PRECISION_OF", "ChatterboxTarget", "output_name"]

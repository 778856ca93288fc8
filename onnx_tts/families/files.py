"""What a model's files are, as its family declares them for the offline tools (`onnx-tts
convert`, `onnx-tts quantize`): the directories that make up the model, every graph by role with
what a tool must know to rewrite it, how a rewritten variant is named, and whether a manifest
lists the files' hashes. Data only: a family builds a `ModelFiles` from what detection read
(`Family.files`), and the tools work from it alone, so they name no family.

    ModelFiles
      root          the directory the model was detected in
      directories   where each of the model's directories goes in an output ("" = the output)
      graphs        GraphFile: role, path, when it runs (step / call / voice), step LM,
                    external data it shares with other graphs or owns (sidecars), variant,
                    how quantize checks it
      manifest      a file listing every file's sha256, rewritten after files change
      variant_suffixes, variant_chosen_by   published names of quantized variants
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

# When a graph runs, which decides what quantizing it is worth:
#   "step"  a large graph run for every row at every decode step: reading its weights is the
#           cost, so fewer weight bytes pay (kept quantized whenever its outputs agree);
#   "call"  any other graph run while speaking (a prefill, vocoder windows, a codec, a small
#           graph): kept quantized only when it agrees and measures not slower;
#   "voice" runs once per reference voice and its result is cached: left as it is.
Runs = Literal["step", "call", "voice"]
CHECK_KINDS = ("cache", "calls")


@dataclass(frozen=True)
class Hint:
    """How to draw one input of a check run. `high`: integers in [low, high); `scale`: float
    normal times it; `uniform`: floats in [0, 1); `value`: every element this number; `shape`:
    fixed shape (overrides the declared dims); `length_of`: (input, axis) whose size this
    input holds."""

    high: int | None = None
    low: int = 0
    scale: float = 1.0
    uniform: bool = False
    value: float | None = None
    shape: tuple[int, ...] | None = None
    length_of: tuple[str, int] | None = None


@dataclass(frozen=True)
class Check:
    """How a graph is compared with a rewritten twin: "cache" (a prefill + decode steps with a
    KV cache; with two `roles`, the first graph prefills the second's cache) or "calls"
    (independent runs). `hints` say how to draw inputs the graph's I/O does not bound, `dims`
    size its symbolic dimensions, `outputs` are the ones compared (default: all; a state is
    not a result)."""

    kind: str
    roles: tuple[str, ...]
    hints: Mapping[str, Hint] = field(default_factory=dict)
    dims: Mapping[str, int] = field(default_factory=dict)
    outputs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in CHECK_KINDS or not 1 <= len(self.roles) <= 2:
            raise ValueError(f"bad check {self}")

    @property
    def name(self) -> str:
        return "+".join(self.roles)


@dataclass(frozen=True)
class GraphFile:
    """One graph file of a model.

    `path`: where it lies in the model, relative and with "/" (the same place in an output).
    `step_lm`: the autoregressive LM whose KV cache the engine keeps across decode steps
    (`convert --inplace-kv` rewrites it when that cache grows by Concat).
    `data`: external-data files its weights must stay in (the family's own files name them;
    graphs naming the same file share it, and a rewrite keeps them shared).
    `sidecars`: external-data files of its own, named after it (a rewrite writes new ones).
    `variant`: "" for the float graph, else the published variant it is (e.g. a precision).
    `check`: how quantize compares it with its quantized twin (None: it is not checked
    alone). Paths in `data` and `sidecars` are relative to the graph's directory."""

    role: str
    path: str
    runs: Runs = "call"
    step_lm: bool = False
    data: tuple[str, ...] = ()
    sidecars: tuple[str, ...] = ()
    variant: str = ""
    check: Check | None = None

    @property
    def directory(self) -> str:
        return posixpath.dirname(self.path)

    def data_files(self) -> list[str]:
        """Its shared external-data files, relative to the model."""
        return [posixpath.normpath(posixpath.join(self.directory, n)) for n in self.data]

    def sidecar_files(self) -> list[str]:
        """Its own external-data files, relative to the model."""
        return [posixpath.normpath(posixpath.join(self.directory, n)) for n in self.sidecars]

    def files(self) -> list[str]:
        """The graph and every external-data file it reads, relative to the model."""
        return [self.path, *self.data_files(), *self.sidecar_files()]


@dataclass(frozen=True)
class ModelFiles:
    """A detected model's files (see the module docstring).

    `directories`: the model's directories by their place in an output ("" when the model is
    one directory, which the output replaces; else a name, the output holding them side by
    side). `manifest`: a file (relative) that lists every file with its sha256 and is written
    again by `onnx_tts.bundle.write_manifest` after files change. `variant_suffixes`: weights
    kind ("int8", "int4") -> suffix of the published variant name (`X<suffix>.onnx`, weights in
    `X<suffix>.onnx_data`), so the family's variant choice finds a quantized graph; empty:
    quantized graphs keep their names. `variant_chosen_by`: the role whose file decides which
    variant loads (while it stays float, no other graph may take a variant name)."""

    root: Path
    directories: Mapping[str, Path]
    graphs: tuple[GraphFile, ...]
    manifest: str | None = None
    variant_suffixes: Mapping[str, str] = field(default_factory=dict)
    variant_chosen_by: str | None = None

    def source(self, path: str) -> Path:
        """The file `path` (relative to the model) as it lies in the source directories."""
        if "" in self.directories:
            return self.directories[""] / path
        head, _, rest = path.partition("/")
        return self.directories[head] / rest


__all__ = ["CHECK_KINDS", "Check", "GraphFile", "Hint", "ModelFiles", "Runs"]

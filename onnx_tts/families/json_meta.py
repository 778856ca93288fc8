"""Typed access to a model directory's JSON files and checks of the files they name: every
value bounded, every path inside its directory, every graph readable with its external data
whole. A missing or inconsistent piece is one ModelError line naming the file and the fix.
Families whose models describe themselves in JSON files (rather than a bundle.json) read them
through this module."""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onnx_tts.errors import ModelError
from onnx_tts.graph_io import GraphSpec, graph_spec_of, read_graph_proto
from onnx_tts.regular_files import real_path

if TYPE_CHECKING:
    import onnx

MAX_JSON_BYTES = 64 << 20


@dataclass(frozen=True)
class JsonFile:
    """A parsed JSON object and the file it came from (for messages)."""

    path: Path
    data: dict[str, Any]

    @classmethod
    def read(cls, path: Path, fix: str, max_bytes: int = MAX_JSON_BYTES) -> JsonFile:
        if not path.is_file():
            raise ModelError(f"missing {path}; {fix}")
        try:
            size = path.stat().st_size
            if size > max_bytes:
                raise ModelError(f"{path} is {size} bytes; at most {max_bytes} are read")
            data = json.loads(path.read_bytes().decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
            raise ModelError(f"{path} is not valid JSON ({error}); {fix}") from None
        except OSError as error:
            raise ModelError(f"cannot read {path}: {error.strerror or error}") from None
        if not isinstance(data, dict):
            raise ModelError(f"{path} must hold a JSON object; {fix}")
        return cls(path, data)

    def get(self, dotted: str, default: Any = ...) -> Any:
        value: Any = self.data
        for part in dotted.split("."):
            if not isinstance(value, dict) or part not in value:
                if default is ...:
                    raise ModelError(f"{self.path}: {dotted} is missing")
                return default
            value = value[part]
        return value

    def section(self, dotted: str) -> dict[str, Any]:
        value = self.get(dotted)
        if not isinstance(value, dict):
            raise ModelError(f"{self.path}: {dotted} must be a JSON object")
        return value

    def number(self, dotted: str, kind: type, low: float, high: float, default: Any = ...) -> Any:
        value = self.get(dotted, default)
        return checked_number(value, kind, low, high, f"{self.path}: {dotted}")

    def flag(self, dotted: str, default: Any = ...) -> bool:
        value = self.get(dotted, default)
        if not isinstance(value, bool):
            raise ModelError(f"{self.path}: {dotted} must be true or false, got {value!r}")
        return value

    def text(self, dotted: str, default: Any = ...) -> str:
        value = self.get(dotted, default)
        if not isinstance(value, str) or not value:
            raise ModelError(f"{self.path}: {dotted} must be a non-empty string, got {value!r}")
        return value

    def names(self, dotted: str, limit: int = 4096) -> list[str]:
        value = self.get(dotted)
        if (
            not isinstance(value, list)
            or len(value) > limit
            or not all(isinstance(v, str) and v for v in value)
        ):
            raise ModelError(f"{self.path}: {dotted} must be a list of tensor names")
        return list(value)


def checked_number(value: Any, kind: type, low: float, high: float, where: str) -> Any:
    integral = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if kind is int and not integral:
        raise ModelError(f"{where} must be an integer in [{low:g}, {high:g}], got {value!r}")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ModelError(f"{where} must be a number in [{low:g}, {high:g}], got {value!r}")
    number = kind(value)
    if not math.isfinite(number) or number < low or number > high:
        raise ModelError(f"{where} must be in [{low:g}, {high:g}], got {value!r}")
    return number


def plain_name(value: Any, where: str) -> str:
    """A file name without directories (metas name files beside themselves)."""
    if (
        not isinstance(value, str)
        or not value
        or "/" in value
        or "\\" in value
        or "\0" in value
        or value in (".", "..")
    ):
        raise ModelError(f"{where} must be a plain file name in its directory, got {value!r}")
    return value


def inside(path: Path, directories: Sequence[Path], where: str, what: str) -> Path:
    """`path` refused unless it lies directly in one of `directories` (after symlinks)."""
    if path.parent not in [real_path(d) for d in directories]:
        allowed = " or ".join(str(d) for d in directories)
        raise ModelError(
            f"{where}: {what} {path} lies outside the model directories ({allowed}); a model "
            "directory must not make onnx-tts open other files: fix the path"
        )
    return path


def read_graph(path: Path, what: str, fix: str) -> tuple[onnx.ModelProto, GraphSpec]:
    """The graph file parsed once (without its external data) and its declared I/O; `fix`
    says what to do when it is missing."""
    if not path.is_file():
        raise ModelError(f"missing graph {path} ({what}); {fix}")
    try:
        model = read_graph_proto(path)
        return model, graph_spec_of(model, path)
    except ModelError as error:
        raise ModelError(
            f"{path} cannot be read as an ONNX graph (a truncated or damaged download?): "
            f"{str(error).split(': ', 1)[-1]}; download the file again"
        ) from None


def external_extents(model: onnx.ModelProto, path: Path) -> dict[str, int]:
    """For each external-data file of the graph `model` (read from `path`): the end of the
    furthest byte its tensors read."""
    import onnx

    ends: dict[str, int] = {}
    for tensor in model.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        entry = {e.key: e.value for e in tensor.external_data}
        location = entry.get("location", "")
        try:
            offset, length = int(entry.get("offset", 0)), int(entry.get("length", -1))
        except ValueError:
            raise ModelError(
                f"{path}: tensor {tensor.name!r} has a malformed external-data entry"
            ) from None
        if length < 0:  # no length: the rest of the file, checked by ORT itself
            length = 0
        ends[location] = max(ends.get(location, 0), offset + length)
    return ends


def check_external_data(
    graph: GraphSpec, model: onnx.ModelProto, listed: Sequence[str], meta: Path
) -> None:
    """The graph's weights (`model`: its parsed file) are in files beside it, listed by the
    meta, long enough."""
    path = graph.path
    for name in graph.external_data:
        plain_name(name, f"{path}: external-data location")
        if name not in listed:
            raise ModelError(
                f"{path.name} keeps its weights in {name!r} but {meta.name} lists "
                f"{list(listed)} for it: the meta and the graph are from different exports; "
                "download both again"
            )
    for name in listed:
        data = path.parent / name
        if not data.is_file():
            raise ModelError(
                f"missing external-data file {data} (weights of {path.name}); download it and "
                "keep it beside the graph under this name"
            )
    for name, end in external_extents(model, path).items():
        size = (path.parent / name).stat().st_size
        if end > size:
            raise ModelError(
                f"{path.parent / name} is {size} bytes but {path.name} reads up to byte {end}: "
                "the file is truncated; download it again"
            )


def listed_graph(
    meta: JsonFile,
    files: dict[str, Any],
    external: dict[str, Any],
    role: str,
    directory: Path,
    what: str,
    fix: str,
) -> tuple[str, tuple[str, ...], GraphSpec]:
    """The graph the meta names for `role` (`files`: its files section; `external`: its
    external_data_files), read from `directory` with the external-data files the meta lists
    for it checked: (file name, listed external-data files, declared I/O); `fix` says what
    to do about a missing graph."""
    name = plain_name(files[role], f"{meta.path}: files.{role}")
    listed = external.get(name, [])
    if not isinstance(listed, list):
        raise ModelError(f"{meta.path}: external_data_files[{name!r}] must be a list")
    listed = [plain_name(n, f"{meta.path}: external_data_files[{name!r}]") for n in listed]
    model, spec = read_graph(directory / name, f"{what}, named by {meta.path.name}", fix)
    check_external_data(spec, model, listed, meta.path)
    return name, tuple(listed), spec


__all__ = [
    "MAX_JSON_BYTES",
    "JsonFile",
    "check_external_data",
    "checked_number",
    "external_extents",
    "inside",
    "listed_graph",
    "plain_name",
    "read_graph",
]

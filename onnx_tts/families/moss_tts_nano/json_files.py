"""The export's JSON files as the family reads them: the family-neutral reader
(`onnx_tts.families.json_meta`) with the published prompt-template ids and the fallback from
the legacy directory names."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from onnx_tts.errors import ModelError
from onnx_tts.families import json_meta
from onnx_tts.families.json_meta import checked_number, inside
from onnx_tts.families.moss_tts_nano.layout import (
    DOWNLOAD_HINT,
    LEGACY_DIRS,
    MAX_JSON_BYTES,
    MAX_TEMPLATE_TOKENS,
)
from onnx_tts.graph_io import GraphSpec
from onnx_tts.regular_files import real_path


class JsonFile(json_meta.JsonFile):
    @classmethod
    def read(cls, path: Path, fix: str, max_bytes: int = MAX_JSON_BYTES) -> JsonFile:
        return super().read(path, fix, max_bytes)

    def token_ids(self, dotted: str, vocab: int) -> list[int]:
        value = self.get(dotted)
        if not isinstance(value, list) or len(value) > MAX_TEMPLATE_TOKENS:
            raise ModelError(f"{self.path}: {dotted} must be a list of token ids")
        return [checked_number(v, int, 0, vocab - 1, f"{self.path}: {dotted}[]") for v in value]


def resolve_relative(manifest: JsonFile, key: str, value: Any) -> Path:
    """A manifest-relative path: a relative path, with the published fallback from the
    legacy directory names to the current ones."""
    where = f"{manifest.path}: model_files.{key}"
    if not isinstance(value, str) or not value or "\0" in value or "\\" in value:
        raise ModelError(f"{where} must be a relative path, got {value!r}")
    if os.path.isabs(value):
        raise ModelError(f"{where} {value!r} must be relative to the manifest's directory")
    base = manifest.path.parent
    path = real_path(base / value)  # a link loop stays a path that fails to open
    if path.exists():
        return path
    for legacy, current in LEGACY_DIRS.items():
        parts = value.split("/")
        if legacy in parts:
            renamed = real_path(base / "/".join(current if p == legacy else p for p in parts))
            if renamed.exists():
                return renamed
    return path


def listed_graph(
    meta: json_meta.JsonFile,
    files: dict[str, Any],
    external: dict[str, Any],
    role: str,
    directory: Path,
    what: str,
) -> tuple[str, tuple[str, ...], GraphSpec]:
    """`json_meta.listed_graph` with the published download as the fix."""
    return json_meta.listed_graph(meta, files, external, role, directory, what, DOWNLOAD_HINT)


__all__ = ["JsonFile", "checked_number", "inside", "listed_graph", "resolve_relative"]

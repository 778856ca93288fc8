"""Bundle manifests (`bundle.json`): loading, and validation against the graphs they name."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onnx_tts.errors import ModelError

FORMAT_VERSION = 1
MANIFEST = "bundle.json"
MODELS_DIR = Path(__file__).resolve().parent / "models"
VOICE_MODEL_DIR = MODELS_DIR / "voice"  # the trained voice (export/train_voice.py)
CODEC_LM_MODEL_DIR = MODELS_DIR / "codec-lm"  # random weights, for tests and benchmarks
DEFAULT_MODEL_DIR = VOICE_MODEL_DIR

# Sections each family's manifest must have (the "family" key; "codec-lm" when absent).
_REQUIRED_SECTIONS = {
    "codec-lm": ("graphs", "kv", "codec", "text", "sampling", "streaming", "vocoder"),
    "phoneme-mel": ("graphs", "kv", "frames", "text", "pointer", "lm", "streaming", "vocoder"),
}


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, read in blocks."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError as error:
        raise ModelError(f"cannot read {path}: {error.strerror or error}") from None
    return digest.hexdigest()


def resolve_model_dir(model: str | Path | None) -> Path:
    """The model directory to load: the argument, or the bundled default voice."""
    if model is None:
        return DEFAULT_MODEL_DIR
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelError(f"model directory not found: {path}")
    if not path.is_dir():
        raise ModelError(f"--model must be a directory holding a model, got the file {path}")
    return path


@dataclass
class Bundle:
    """A parsed and checked `bundle.json`."""

    root: Path
    manifest: dict[str, Any]

    @classmethod
    def load(cls, root: Path, verify_checksums: bool = True) -> Bundle:
        path = root / MANIFEST
        if not path.is_file():
            raise ModelError(f"{root} has no {MANIFEST}; it is not an onnx-tts bundle")
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ModelError(f"{path} is not valid JSON: {error}") from None
        if not isinstance(manifest, dict):
            raise ModelError(f"{path} must hold a JSON object")
        version = manifest.get("format_version")
        if version != FORMAT_VERSION:
            raise ModelError(
                f"{path}: format_version {version!r} is not supported (this onnx-tts reads "
                f"{FORMAT_VERSION}); upgrade onnx-tts or re-export the bundle"
            )
        family = manifest.get("family", "codec-lm")
        if family not in _REQUIRED_SECTIONS:
            raise ModelError(
                f"{path}: family {family!r} is not one this onnx-tts runs "
                f"({', '.join(_REQUIRED_SECTIONS)}); upgrade onnx-tts or re-export the bundle"
            )
        missing = [
            key for key in _REQUIRED_SECTIONS[family] if not isinstance(manifest.get(key), dict)
        ]
        if missing:
            raise ModelError(f"{path} lacks section(s): {', '.join(missing)}")
        bundle = cls(root, manifest)
        bundle._check_files(verify_checksums)
        return bundle

    def _check_files(self, verify_checksums: bool) -> None:
        expected = self.manifest.get("sha256", {})
        files = list(self.manifest["graphs"].values())
        if "tokenizer" in self.manifest["text"]:
            files.append(self.manifest["text"]["tokenizer"])
        absent = [name for name in files if not (self.root / name).is_file()]
        if absent:
            raise ModelError(f"bundle {self.root} is missing file(s): {', '.join(absent)}")
        if not verify_checksums:
            return
        for name in files:
            want = expected.get(name)
            if want and file_sha256(self.root / name) != want:
                raise ModelError(
                    f"bundle {self.root}: {name} does not match the sha256 in {MANIFEST} "
                    "(the file is corrupt or was changed after export)"
                )

    # -- convenient views ---------------------------------------------------------------------
    @property
    def name(self) -> str:
        return str(self.manifest.get("name", self.root.name))

    @property
    def identity(self) -> str:
        """Stable id of this bundle's contents: name, version and graph hashes."""
        hashes = self.manifest.get("sha256", {})
        payload = json.dumps(
            [self.name, self.manifest.get("version"), sorted(hashes.items())], sort_keys=True
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    @property
    def sample_rate(self) -> int:
        return int(self.manifest["sample_rate"])

    def graph_path(self, role: str) -> Path:
        graphs = self.manifest["graphs"]
        if role not in graphs:
            raise ModelError(f"bundle {self.root} defines no '{role}' graph")
        return self.root / graphs[role]

    def section(self, name: str) -> dict[str, Any]:
        return dict(self.manifest.get(name, {}))

    def kv_specs(self) -> tuple[dict[str, tuple[str, Any]], dict[str, tuple[str, Any]]]:
        """({past name: (dtype, dims)}, {present name: (dtype, dims)}) for check_graph_io."""
        kv = self.manifest["kv"]
        spec = (kv.get("dtype", "float32"), (None, int(kv["kv_heads"]), None, int(kv["head_dim"])))
        names = self.kv_names()
        return {past: spec for past, _ in names}, {present: spec for _, present in names}

    def kv_names(self) -> list[tuple[str, str]]:
        kv = self.manifest["kv"]
        return [
            (past.format(i=i), present.format(i=i))
            for i in range(int(kv["layers"]))
            for past, present in zip(kv["past_names"], kv["present_names"], strict=True)
        ]

"""Bundle manifests (`bundle.json`): parsing, and the checks every bundle passes before any of
its files is opened: known format, the family's sections, typed and bounded values, and
files that lie inside the bundle directory and match their listed sha256; and the one bundle
writer (`write_bundle`, `write_manifest`), through which export recipes and the offline tools
write every bundle.json, so its hashes always come from the bytes on disk."""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onnx_tts.atomic_files import write_atomically
from onnx_tts.errors import ModelError
from onnx_tts.regular_files import real_path

if TYPE_CHECKING:
    import onnx

FORMAT_VERSION = 1
MANIFEST = "bundle.json"
MAX_MANIFEST_BYTES = 16 << 20
MODELS_DIR = Path(__file__).resolve().parent / "models"
VOICE_MODEL_DIR = MODELS_DIR / "voice"  # the trained voice (export/train_voice.py)
DEFAULT_MODEL_DIR = VOICE_MODEL_DIR

# Bounds on the KV layout a manifest may declare, and on the memory one sequence's in-place
# KV buffers may take: a manifest must not be able to make the engine allocate without limit.
MAX_LAYERS = 256
MAX_HEADS = 256
MAX_HEAD_DIM = 1024
MAX_CAPACITY = 1 << 20
MAX_KV_BYTES_PER_SEQUENCE = 8 << 30

_REQUIRED = object()


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


def files_identity(paths: Iterable[Path]) -> str:
    """Fingerprint of a graph and its sidecars (for cache keys): the .onnx file in full, each
    sidecar by name, size and its first and last MiB (hashing a 1 GB sidecar on every load
    would cost seconds)."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode())
        try:
            with path.open("rb") as handle:
                if path.suffix == ".onnx":
                    for block in iter(lambda handle=handle: handle.read(1 << 20), b""):
                        digest.update(block)
                    continue
                size = path.stat().st_size
                digest.update(str(size).encode())
                digest.update(handle.read(1 << 20))
                if size > 2 << 20:
                    handle.seek(size - (1 << 20))
                    digest.update(handle.read())
        except OSError as error:
            raise ModelError(f"cannot read {path}: {error.strerror or error}") from None
    return digest.hexdigest()


def resolve_model_dir(model: str | os.PathLike[str] | None) -> Path:
    """The model to load: the argument (a directory, or a model file some family reads
    alone), or the bundled default voice."""
    if model is None:
        return DEFAULT_MODEL_DIR
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelError(f"model directory not found: {path}")
    return path  # a directory, or a file a layout detector may take (families.detect)


def inside(root: Path, relative: Any, what: str) -> Path:
    """`root / relative`, refused unless it is a relative path that stays inside `root`
    (after symlinks): a model directory must not make the engine open other files."""
    if not isinstance(relative, str) or not relative:
        raise ModelError(f"{root / MANIFEST}: {what} must be a file name, got {relative!r}")
    if os.path.isabs(relative) or "\\" in relative or "\0" in relative:
        raise ModelError(
            f"{root / MANIFEST}: {what} {relative!r} must be a path relative to the bundle"
        )
    base = real_path(root)
    path = real_path(base / relative)  # a link loop stays a path that fails to open
    if path != base and base not in path.parents:
        raise ModelError(
            f"{root / MANIFEST}: {what} {relative!r} points outside the bundle directory"
        )
    return path


@dataclass
class Bundle:
    """A parsed `bundle.json`. `read` parses; `validate` checks sections and files."""

    root: Path
    manifest: dict[str, Any]

    @classmethod
    def read(cls, root: Path) -> Bundle:
        path = root / MANIFEST
        if not path.is_file():
            raise ModelError(f"{root} has no {MANIFEST}; it is not an onnx-tts bundle")
        try:
            size = path.stat().st_size
            if size > MAX_MANIFEST_BYTES:
                raise ModelError(
                    f"{path} is {size} bytes; a manifest holds at most {MAX_MANIFEST_BYTES}"
                )
            manifest = json.loads(path.read_bytes().decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
            raise ModelError(f"{path} is not valid JSON: {error}") from None
        except OSError as error:
            raise ModelError(f"cannot read {path}: {error.strerror or error}") from None
        if not isinstance(manifest, dict):
            raise ModelError(f"{path} must hold a JSON object")
        version = manifest.get("format_version")
        if version != FORMAT_VERSION:
            raise ModelError(
                f"{path}: format_version {version!r} is not supported (this onnx-tts reads "
                f"{FORMAT_VERSION}); upgrade onnx-tts or re-export the bundle"
            )
        return cls(root, manifest)

    @property
    def family(self) -> str | None:
        """The family the manifest names (None: a manifest written before "family" existed;
        the registry knows which family those are)."""
        family = self.manifest.get("family")
        if family is not None and not isinstance(family, str):
            raise ModelError(f"{self.root / MANIFEST}: family must be a string, got {family!r}")
        return family

    def validate(self, sections: Iterable[str], verify_checksums: bool = True) -> Bundle:
        """Check the family's required sections, then every listed file: inside the bundle,
        present, with a sha256 entry that matches. Returns self."""
        missing = [key for key in sections if not isinstance(self.manifest.get(key), dict)]
        if missing:
            raise ModelError(f"{self.root / MANIFEST} lacks section(s): {', '.join(missing)}")
        hashes = self.manifest.get("sha256", {})
        if not isinstance(hashes, dict):
            raise ModelError(f"{self.root / MANIFEST}: sha256 must map file names to hashes")
        files = self.listed_files()
        absent = [name for name, path in files.items() if not path.is_file()]
        if absent:
            raise ModelError(f"bundle {self.root} is missing file(s): {', '.join(absent)}")
        unhashed = [name for name in files if not isinstance(hashes.get(name), str)]
        if unhashed:
            raise ModelError(
                f"{self.root / MANIFEST}: no sha256 for {', '.join(unhashed)}; every file a "
                "bundle lists must carry its hash (re-export the bundle)"
            )
        if verify_checksums:
            for name, path in files.items():
                if file_sha256(path) != hashes[name]:
                    raise ModelError(
                        f"bundle {self.root}: {name} does not match the sha256 in {MANIFEST} "
                        "(the file is corrupt or was changed after export)"
                    )
        return self

    def listed_files(self) -> dict[str, Path]:
        """Every file the manifest names (graphs, tokenizer), resolved inside the bundle."""
        graphs = self.section("graphs")
        names = [(f"graphs.{role}", name) for role, name in graphs.items()]
        text = self.manifest.get("text")
        if isinstance(text, dict) and "tokenizer" in text:
            names.append(("text.tokenizer", text["tokenizer"]))
        return {str(name): inside(self.root, name, what) for what, name in names}

    # -- typed access ---------------------------------------------------------------------------
    def section(self, name: str) -> dict[str, Any]:
        value = self.manifest.get(name)
        if not isinstance(value, dict):
            raise ModelError(f"{self.root / MANIFEST}: section {name!r} must be a JSON object")
        return value

    def value(
        self,
        section: str | None,
        key: str,
        kind: type = int,
        low: float | None = None,
        high: float | None = None,
        default: Any = _REQUIRED,
    ) -> Any:
        """A manifest value checked for type and range (a ModelError naming the key if not);
        `section` None reads a top-level key."""
        table = self.manifest if section is None else self.section(section)
        where = key if section is None else f"{section}.{key}"
        if key not in table:
            if default is _REQUIRED:
                raise ModelError(f"{self.root / MANIFEST}: {where} is missing")
            return default
        value = table[key]
        if kind is str:
            if not isinstance(value, str):
                raise ModelError(f"{self.root / MANIFEST}: {where} must be a string, got {value!r}")
            return value
        integral = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        if kind is int and not integral:
            raise ModelError(f"{self.root / MANIFEST}: {where} must be an integer, got {value!r}")
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ModelError(f"{self.root / MANIFEST}: {where} must be a number, got {value!r}")
        number = kind(value)
        if (
            not math.isfinite(number)
            or (low is not None and number < low)
            or (high is not None and number > high)
        ):
            raise ModelError(
                f"{self.root / MANIFEST}: {where} must be in [{low:g}, {high:g}], got {value!r}"
            )
        return number

    # -- views ------------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return str(self.manifest.get("name", self.root.name))

    @property
    def identity(self) -> str:
        """Stable id of this bundle's contents: name, version and file hashes."""
        hashes = self.manifest.get("sha256", {})
        payload = json.dumps(
            [self.name, self.manifest.get("version"), sorted(hashes.items())], sort_keys=True
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    @property
    def sample_rate(self) -> int:
        return self.value(None, "sample_rate", int, 8000, 384000)

    def path(self, section: str, key: str) -> Path:
        """The file a manifest entry names, checked to lie inside the bundle."""
        table = self.section(section)
        if key not in table:
            raise ModelError(f"bundle {self.root} defines no {section}.{key}")
        return inside(self.root, table[key], f"{section}.{key}")

    def graph_path(self, role: str) -> Path:
        return self.path("graphs", role)

    def file_sha256(self, relative: str) -> str | None:
        return self.manifest.get("sha256", {}).get(relative)

    def kv_capacity(self, default: int) -> int:
        """kv.capacity, bounded so one sequence's in-place KV fits MAX_KV_BYTES_PER_SEQUENCE."""
        layers = self.value("kv", "layers", int, 1, MAX_LAYERS)
        heads = self.value("kv", "kv_heads", int, 1, MAX_HEADS)
        head_dim = self.value("kv", "head_dim", int, 1, MAX_HEAD_DIM)
        capacity = self.value("kv", "capacity", int, 1, MAX_CAPACITY, default)
        kv_bytes = 2 * layers * heads * head_dim * 4 * capacity
        if kv_bytes > MAX_KV_BYTES_PER_SEQUENCE:
            raise ModelError(
                f"{self.root / MANIFEST}: kv.capacity {capacity} would take {kv_bytes >> 20} MiB "
                f"of KV per sequence (limit {MAX_KV_BYTES_PER_SEQUENCE >> 20} MiB)"
            )
        return capacity

    def kv_specs(self) -> tuple[dict[str, tuple[str, Any]], dict[str, tuple[str, Any]]]:
        """({past name: (dtype, dims)}, {present name: (dtype, dims)}) for check_graph_io."""
        layers = self.value("kv", "layers", int, 1, MAX_LAYERS)
        heads = self.value("kv", "kv_heads", int, 1, MAX_HEADS)
        head_dim = self.value("kv", "head_dim", int, 1, MAX_HEAD_DIM)
        dtype = self.value("kv", "dtype", str, default="float32")
        kv = self.section("kv")
        past_names, present_names = kv.get("past_names"), kv.get("present_names")
        if not (
            isinstance(past_names, list)
            and isinstance(present_names, list)
            and len(past_names) == len(present_names)
            and all(isinstance(n, str) and "{i}" in n for n in past_names + present_names)
        ):
            raise ModelError(
                f"{self.root / MANIFEST}: kv.past_names and kv.present_names must be equally "
                "long lists of names with an {i} layer placeholder"
            )
        spec = (dtype, (None, heads, None, head_dim))
        names = [
            (past.replace("{i}", str(i)), present.replace("{i}", str(i)))
            for i in range(layers)
            for past, present in zip(past_names, present_names, strict=True)
        ]
        return {past: spec for past, _ in names}, {present: spec for _, present in names}


# -- writing ------------------------------------------------------------------------------------
# Files a manifest can name; each one is hashed into its "sha256" section.
_BUNDLE_FILE_SUFFIXES = (".onnx", ".onnx_data", ".json", ".txt", ".wav")


def manifest_files(value: object) -> set[str]:
    """Every string in a manifest that names a bundle file."""
    if isinstance(value, str):
        return {value} if value.endswith(_BUNDLE_FILE_SUFFIXES) else set()
    if isinstance(value, Mapping):
        return set().union(*(manifest_files(v) for v in value.values()))
    if isinstance(value, list | tuple):
        return set().union(*(manifest_files(v) for v in value))
    return set()


def write_file(path: str | os.PathLike[str], data: bytes) -> None:
    """`data` written atomically to `path`, its directories made first."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(target, data)


def save_model(model: onnx.ModelProto, path: str | os.PathLike[str]) -> bytes:
    """Serialises a graph deterministically, writes it atomically, returns the bytes written."""
    data = model.SerializeToString(deterministic=True)
    write_file(path, data)
    return data


def _checked_manifest(manifest: Mapping[str, object], present: Iterable[str]) -> None:
    unlisted = sorted(manifest_files(manifest) - set(present))
    if unlisted:
        raise ModelError(
            f"the manifest names {', '.join(unlisted)} but no such file is written: pass it in "
            "`files` so it is hashed"
        )
    if "sha256" in manifest:
        raise ModelError("the manifest must not carry 'sha256': the bundle writer computes it")


def _write_manifest_text(out: Path, manifest: Mapping[str, object], sha256: dict[str, str]) -> int:
    text = (json.dumps({**manifest, "sha256": sha256}, indent=2) + "\n").encode("utf-8")
    write_atomically(out / MANIFEST, text)
    return len(text)


def write_bundle(
    out_dir: str | os.PathLike[str],
    manifest: Mapping[str, object],
    files: Mapping[str, onnx.ModelProto | bytes],
) -> tuple[dict[str, str], dict[str, int]]:
    """The one bundle writer: every file (graphs serialised deterministically), then
    bundle.json = `manifest` + "sha256" of every file, each written atomically (bundle.json
    last, so a reader never sees a manifest whose files are not there yet).

    Raises ModelError when the manifest names a file that is not in `files` (it would carry no
    hash). Returns ({file: sha256 hex}, {file: size} including bundle.json)."""
    _checked_manifest(manifest, files)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sha256: dict[str, str] = {}
    sizes: dict[str, int] = {}
    for filename, content in files.items():
        if isinstance(content, bytes):
            write_file(out / filename, content)
            data = content
        else:
            data = save_model(content, out / filename)
        sha256[filename] = hashlib.sha256(data).hexdigest()
        sizes[filename] = len(data)
    sizes[MANIFEST] = _write_manifest_text(out, manifest, sha256)
    return sha256, sizes


def write_manifest(
    out_dir: str | os.PathLike[str], manifest: Mapping[str, object]
) -> dict[str, str]:
    """bundle.json for files already in `out_dir` (a bundle whose files a tool rewrote): the
    `manifest` + the sha256 of every file it names, read from disk, in name order. Raises
    ModelError when a named file is not there. Returns {file: sha256 hex}."""
    out = Path(out_dir)
    names = sorted(manifest_files(manifest))
    _checked_manifest(manifest, [name for name in names if (out / name).is_file()])
    sha256 = {name: file_sha256(inside(out, name, "a listed file")) for name in names}
    _write_manifest_text(out, manifest, sha256)
    return sha256

"""A published Hugging Face checkpoint directory, read by tensor name and never run.

Exporters load weights by name into the project's own torch modules: no `trust_remote_code`,
no pickle, no code from the checkpoint. What is read is untrusted: only regular files directly
inside the directory (no link, device, FIFO or file outside it), JSON files bounded in size,
safetensors opened memory-mapped. A missing or mis-shaped tensor is a `CheckpointError` that
names every problem at once, so one run tells a user all that is wrong with a download.

`write_checkpoint` writes the same layout (sharded safetensors + index, config.json): the test
helpers build stand-in checkpoints with it.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from onnx_tts.errors import InputError
from onnx_tts.regular_files import RefusedFile, read_regular_file

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
MAX_JSON_BYTES = 64 << 20  # tokenizer.json of a large vocabulary is ~11 MB
MAX_PROBLEMS_SHOWN = 12
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class CheckpointError(InputError):
    """A checkpoint directory that is not the published layout the exporter reads."""


class Checkpoint:
    """The tensors (by name, across shards) and JSON files of one checkpoint directory."""

    def __init__(self, root: str | os.PathLike[str], what: str = "checkpoint") -> None:
        self.root = Path(root)
        self.what = what
        if not self.root.is_dir():
            raise CheckpointError(f"{what} {self.root} is not a directory")
        self.config: dict[str, Any] = self.json("config.json")
        self._file_of = self._weight_map()
        self._handles: dict[str, Any] = {}
        self.read: set[str] = set()

    # -- files ---------------------------------------------------------------------------------
    def file(self, name: str) -> Path:
        """`name`, a regular file directly inside the directory (CheckpointError otherwise)."""
        if Path(name).name != name or name in ("", ".", ".."):
            raise CheckpointError(f"{self.what} {self.root}: {name!r} is not a file name")
        path = self.root / name
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            raise CheckpointError(f"{self.what} {self.root} has no {name}") from None
        except OSError as error:
            raise CheckpointError(f"{self.what} {path}: {error.strerror}") from None
        if not stat.S_ISREG(info.st_mode):
            kind = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a regular file"
            raise CheckpointError(
                f"{self.what} {path} is {kind}; copy the real file into the directory"
            )
        return path

    def has(self, name: str) -> bool:
        return os.path.lexists(self.root / name)

    def json(self, name: str, max_bytes: int = MAX_JSON_BYTES) -> dict[str, Any]:
        """A JSON object file of the directory, bounded in size."""
        path = self.file(name)
        try:
            data = read_regular_file(path, max_bytes, root=self.root)
            value = json.loads(data.decode("utf-8"))
        except RefusedFile as refused:
            raise CheckpointError(f"{self.what} {path}: {refused.what}") from None
        except (UnicodeDecodeError, ValueError) as error:
            raise CheckpointError(f"{self.what} {path} is not valid JSON: {error}") from None
        except OSError as error:
            raise CheckpointError(f"{self.what} {path}: {error.strerror}") from None
        if not isinstance(value, dict):
            raise CheckpointError(f"{self.what} {path} is not a JSON object")
        return value

    def _weight_map(self) -> dict[str, str]:
        if self.has(INDEX):
            index = self.json(INDEX)
            weight_map = index.get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise CheckpointError(f"{self.what} {self.root / INDEX} has no weight_map")
            bad = [f for f in set(weight_map.values()) if not isinstance(f, str)]
            if bad:
                raise CheckpointError(f"{self.what} {self.root / INDEX}: bad file names {bad}")
            for shard in sorted(set(weight_map.values())):
                self.file(shard)
            return {str(k): v for k, v in weight_map.items()}
        if not self.has(SINGLE):
            raise CheckpointError(
                f"{self.what} {self.root} has neither {INDEX} nor {SINGLE}: point at the "
                "downloaded checkpoint directory (safetensors weights)"
            )
        self.file(SINGLE)
        with self._open(SINGLE) as handle:
            return dict.fromkeys(handle.keys(), SINGLE)

    def _open(self, shard: str) -> Any:
        try:
            return safe_open(str(self.file(shard)), framework="pt")
        except CheckpointError:
            raise
        except Exception as error:  # safetensors raises its own error types
            raise CheckpointError(
                f"{self.what} {self.root / shard} is not a readable safetensors file: {error}"
            ) from None

    def _handle(self, name: str) -> Any:
        shard = self._file_of[name]
        if shard not in self._handles:
            self._handles[shard] = self._open(shard).__enter__()
        return self._handles[shard]

    # -- tensors -------------------------------------------------------------------------------
    @property
    def names(self) -> frozenset[str]:
        return frozenset(self._file_of)

    def shape(self, name: str) -> tuple[int, ...]:
        self._require(name)
        return tuple(self._handle(name).get_slice(name).get_shape())

    def tensor(self, name: str, shape: Sequence[int] | None = None) -> torch.Tensor:
        """The tensor `name` (float types as float32), checked against `shape` when given."""
        self._require(name)
        if shape is not None and self.shape(name) != tuple(shape):
            raise CheckpointError(
                f"{self.what} {self.root}: tensor {name} has shape {list(self.shape(name))}, "
                f"expected {list(shape)}"
            )
        try:
            value = self._handle(name).get_tensor(name)
        except Exception as error:
            raise CheckpointError(f"{self.what} {self.root}: tensor {name}: {error}") from None
        self.read.add(name)
        if value.dtype in FLOAT_DTYPES:
            value = value.to(torch.float32)
            if not torch.isfinite(value).all():
                raise CheckpointError(
                    f"{self.what} {self.root}: tensor {name} holds NaN or infinite values"
                )
        return value

    def _require(self, name: str) -> None:
        if name not in self._file_of:
            raise CheckpointError(f"{self.what} {self.root} has no tensor {name}")

    def load_into(
        self, module: torch.nn.Module, name_of: Callable[[str], str | None] | str = ""
    ) -> None:
        """Every parameter and buffer of `module` from the tensor `name_of(key)` (a string is
        a prefix), checked by shape; all problems in one CheckpointError. A key mapped to None
        is left as the module made it (e.g. a table computed, not stored)."""
        rename = (lambda key: name_of + key) if isinstance(name_of, str) else name_of
        state = module.state_dict()
        problems: list[str] = []
        loaded: dict[str, torch.Tensor] = {}
        for key, current in state.items():
            name = rename(key)
            if name is None:
                continue
            if name not in self._file_of:
                problems.append(f"missing {name} {list(current.shape)}")
                continue
            shape = self.shape(name)
            if shape != tuple(current.shape):
                problems.append(f"{name} is {list(shape)}, expected {list(current.shape)}")
                continue
            loaded[key] = self.tensor(name).to(current.dtype)
        if problems:
            shown = "; ".join(problems[:MAX_PROBLEMS_SHOWN])
            more = len(problems) - MAX_PROBLEMS_SHOWN
            raise CheckpointError(
                f"{self.what} {self.root} does not match the published layout: {shown}"
                + (f"; and {more} more" if more > 0 else "")
            )
        module.load_state_dict(loaded, strict=False)

    def unread(self) -> list[str]:
        """Tensors of the checkpoint no module took (an exporter reports them)."""
        return sorted(set(self._file_of) - self.read)

    def close(self) -> None:
        for handle in self._handles.values():
            handle.__exit__(None, None, None)
        self._handles.clear()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def write_checkpoint(
    root: str | os.PathLike[str],
    tensors: Mapping[str, torch.Tensor],
    config: Mapping[str, Any],
    *,
    shards: int = 1,
    dtype: torch.dtype | None = None,
    extra_files: Mapping[str, bytes] | None = None,
) -> Path:
    """Write `tensors` as a Hugging Face checkpoint: `model.safetensors`, or `shards` files
    `model-0000i-of-0000n.safetensors` plus `model.safetensors.index.json`; `config.json`;
    `extra_files` (tokenizer files, ...) by name. `dtype` converts float tensors (e.g. bf16 as
    published)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)
    prepared = {
        name: (
            tensors[name].to(dtype)
            if dtype is not None and tensors[name].is_floating_point()
            else tensors[name]
        ).contiguous()
        for name in names
    }
    if shards <= 1:
        save_file(prepared, str(root / SINGLE), metadata={"format": "pt"})
    else:
        per_shard = math.ceil(len(names) / shards)
        weight_map: dict[str, str] = {}
        total = 0
        for index in range(shards):
            part = names[index * per_shard : (index + 1) * per_shard]
            file = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
            save_file({n: prepared[n] for n in part}, str(root / file), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(part, file))
            total += sum(prepared[n].numel() * prepared[n].element_size() for n in part)
        index_json = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (root / INDEX).write_text(json.dumps(index_json, indent=2), encoding="utf-8")
    (root / "config.json").write_text(json.dumps(dict(config), indent=2), encoding="utf-8")
    for name, data in (extra_files or {}).items():
        (root / name).write_bytes(data)
    return root


__all__ = ["Checkpoint", "CheckpointError", "write_checkpoint"]

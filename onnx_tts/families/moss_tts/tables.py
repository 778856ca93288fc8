"""The backbone's input tables, read by the host straight from `embed.onnx`'s external data.

The embedding of a row [text, code_1..code_n] is a sum of one row per table; summing them on
the host (numpy, float32, in the published order) costs microseconds and no graph run, and the
tables are memory-mapped from `embed.onnx_data` (the same bytes the `embed.onnx` graph reads),
so a 150k-token text table costs no memory until rows are read. Each table is checked before it
is mapped: a float32 [rows, hidden] initializer whose data lies inside the model directory and
inside its data file.

Per release (the published `_build_inputs_embeds` / `_prepare_multi_modal_inputs`):
  local-v1.5  text row + each code's row, a pad code (1024) adding nothing;
  local-v1    zeros + rows of channels 0..n (n = n_vq_for_inference, the rest left out);
  delay       text row + each code's row, the pad code's own row included.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from onnx_tts.bundle import inside
from onnx_tts.errors import ModelError

TABLE = "channel.{k}"


def _external(tensor: onnx.TensorProto) -> dict[str, str]:
    return {entry.key: entry.value for entry in tensor.external_data}


class InputTables:
    """Memory-mapped tables of one model; `embed(ids)` sums rows as the release does."""

    def __init__(self, graph: Path, root: Path, variant: str, hidden: int, pad: int) -> None:
        self.variant, self.hidden, self.pad = variant, hidden, pad
        model = onnx.load(str(graph), load_external_data=False)
        found = {t.name: t for t in model.graph.initializer if t.name.startswith("channel.")}
        self.tables: list[np.ndarray] = []
        for k in range(len(found)):
            tensor = found.get(TABLE.format(k=k))
            if tensor is None:
                raise ModelError(f"{graph}: no table {TABLE.format(k=k)}")
            self.tables.append(self._map(graph, root, tensor))
        if not self.tables:
            raise ModelError(f"{graph} holds no input tables (channel.K initializers)")

    def _map(self, graph: Path, root: Path, tensor: onnx.TensorProto) -> np.ndarray:
        shape = tuple(tensor.dims)
        where = f"{graph}: table {tensor.name}"
        if (
            tensor.data_type != TensorProto.FLOAT
            or len(shape) != 2
            or shape[1] != self.hidden
            or tensor.data_location != TensorProto.EXTERNAL
        ):
            raise ModelError(f"{where} must be float32 [rows, {self.hidden}] in external data")
        info = _external(tensor)
        path = inside(
            root,
            str(Path(graph.parent.relative_to(root), info.get("location", ""))),
            "an embed table's data file",
        )
        try:
            offset, length = int(info.get("offset", 0)), int(info["length"])
            size = path.stat().st_size
        except (KeyError, ValueError, OSError) as error:
            raise ModelError(f"{where}: unreadable external data ({error})") from None
        if length != shape[0] * shape[1] * 4 or offset < 0 or offset + length > size:
            raise ModelError(f"{where}: its data does not fit {path.name} ({size} bytes)")
        return np.memmap(path, dtype=np.float32, mode="r", offset=offset, shape=shape)

    @property
    def channels(self) -> int:
        return len(self.tables)

    def check_ids(self, ids: np.ndarray) -> None:
        """Refuse ids outside a table (the model's own rows only ever hold valid ones)."""
        for k, table in enumerate(self.tables):
            column = ids[..., k]
            limit = table.shape[0] + (1 if k and self.variant == "local-v1.5" else 0)
            if column.size and (column.min() < 0 or column.max() >= limit):
                raise ModelError(f"row ids of channel {k} out of range [0, {limit})")

    def embed(self, ids: np.ndarray, channels: np.ndarray | None = None) -> np.ndarray:
        """ids [B, T, C] int -> [B, T, hidden] float32. `channels` [B] (Local v1): the codebooks
        each row sums (its n_vq_for_inference)."""
        ids = np.asarray(ids, np.int64)
        self.check_ids(ids)
        if self.variant == "local-v1":
            out = np.zeros((*ids.shape[:-1], self.hidden), np.float32)
            used = np.full(ids.shape[0], self.channels - 1) if channels is None else channels
            for k, table in enumerate(self.tables):
                rows = table[ids[..., k]]
                if k:
                    rows = rows * (k <= used)[:, None, None].astype(np.float32)
                out += rows
            return out
        out = np.array(self.tables[0][ids[..., 0]], np.float32)
        for k in range(1, self.channels):
            codes = ids[..., k]
            if self.variant == "local-v1.5":
                valid = codes != self.pad
                rows = self.tables[k][np.where(valid, codes, 0)] * valid[..., None]
            else:
                rows = self.tables[k][codes]
            out = out + rows
        return out

    def row(self, channel: int, tokens: np.ndarray) -> np.ndarray:
        """Rows of one table [n, hidden] (a depth transformer's next input)."""
        return np.array(self.tables[channel][np.asarray(tokens, np.int64)], np.float32)


__all__ = ["InputTables"]

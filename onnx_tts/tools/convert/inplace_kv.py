"""`onnx-tts convert --inplace-kv`: one LM graph file, or every step LM of a model directory
(any family: the files its family declares), rewritten so its KV cache can be written in place.

Files are staged beside the target and moved into place only after the rewrite is valid ONNX
and (with ``check``) its logits match the source's, so a failure leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from onnx import TensorProto, external_data_helper

from onnx_tts.errors import InputError, ModelError
from onnx_tts.graph_io import GQA_OP, PAST_VALID_LENGTHS, graph_spec_of, read_graph_spec
from onnx_tts.regular_files import file_kind
from onnx_tts.signals import committing, deferred
from onnx_tts.tools.convert.rewrite import rewrite_inplace_kv
from onnx_tts.tools.convert.verify import LayerAttention, LogitsCheck, compare_logits
from onnx_tts.tools.model_dir import (
    check_graph_file,
    copy_model,
    files_of,
    model_files,
    new_output,
    place_output,
    real_path,
    rewrite_manifest,
    staging_beside,
    write_failure,
)
from onnx_tts.tools.quantize.rows import RowChanges, independent_rows

_EXTERNAL_DATA_THRESHOLD = 1 << 30  # inline graphs above 1 GiB are written with a sidecar


@dataclass(frozen=True)
class ConvertReport:
    source: Path
    destination: Path
    layers: tuple[LayerAttention, ...]
    kv_dtype: str  # dtype of the KV I/O; GroupQueryAttention runs in it
    nodes_before: int
    nodes_after: int
    unused_inputs: tuple[str, ...]
    external_data: bool
    check: LogitsCheck | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def summary(self) -> str:
        first = self.layers[0]
        scales = sorted({round(layer.scale, 6) for layer in self.layers})
        lines = [
            f"converted {self.source} -> {self.destination}",
            f"  {len(self.layers)} attention blocks -> GroupQueryAttention "
            f"(heads {first.num_heads}, kv heads {first.kv_num_heads}, head dim "
            f"{first.head_dim}, scale {', '.join(f'{s:g}' for s in scales)}, "
            f"{self.kv_dtype})",
            f"  nodes {self.nodes_before} -> {self.nodes_after}; external data: "
            f"{'yes' if self.external_data else 'no'}",
        ]
        if self.unused_inputs:
            lines.append(f"  inputs kept but no longer read: {', '.join(self.unused_inputs)}")
        if self.check is not None:
            c = self.check
            lines.append(
                f"  logits check ({c.prefill_tokens}-token prefill + {c.decode_steps} steps): "
                f"max |diff| inplace {c.max_abs_diff_inplace:.3g}, chain "
                f"{c.max_abs_diff_chain:.3g}, without masking biases {c.max_abs_diff_unmasked:.3g} "
                f"(median |logit| {c.typical_abs_logit:.3g}, tolerance {c.tolerance:.3g})"
            )
        else:
            lines.append("  logits check: skipped")
        lines.extend(f"  note: {note}" for note in self.notes)
        return "\n".join(lines)


# A row rewrite changes only how activations are quantized: its logits stay this close to the
# source's (mean cosine over a prefill and the decode steps), or something went wrong.
ROWS_MIN_COSINE = 0.99


def _rows_note(source: Path, reference: Path, rows: RowChanges, steps: int) -> str:
    """Measure the row rewrite against the source; a ModelError when it drifted."""
    from onnx_tts.tools.quantize.agreement import compare_with_cache

    agreement = compare_with_cache(source, reference, prefill_tokens=8, steps=steps)
    logits = next(o for o in agreement.outputs if o.name == "logits")
    measured = (
        f"logits vs the source over an 8-token prefill + {steps} steps: mean cosine "
        f"{logits.cosine_mean:.5f}, argmax {logits.top1:.3f}, max |diff| {logits.max_abs_diff:.3g}"
    )
    if logits.cosine_mean < ROWS_MIN_COSINE:
        raise ModelError(
            f"making the rows of {source.name} independent changed its logits too much "
            f"({measured}); nothing was written"
        )
    return f"rows made independent for batching ({rows.describe()}); {measured}"


def _save(model: onnx.ModelProto, path: Path, external: bool) -> list[Path]:
    """Save `model` as `path` (+ `path.name`_data sidecar when `external`). Returns files."""
    if external:
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=path.name + "_data",
            size_threshold=1024,
        )
        return [path.with_name(path.name + "_data"), path]
    onnx.save_model(model, str(path))
    return [path]


def _resolve_paths(src: Path, dst: Path) -> tuple[Path, Path, onnx.ModelProto]:
    """The source graph (a regular file, or a link to one), the file to write and the source
    parsed without its weights (checked by `check_graph_file`): InputError when the output
    would replace the source or a file the source reads, or cannot be written there."""
    src, dst = Path(src), Path(dst)
    real = real_path(src)
    try:
        mode = os.lstat(real).st_mode
    except OSError:
        raise InputError(f"source graph not found: {src}") from None
    if not stat.S_ISREG(mode):
        raise InputError(f"the source graph {src} is {file_kind(mode)}, not an ONNX file")
    model = check_graph_file(src, real_path(src.parent))
    reads = {real} | {
        real_path(src.parent / name) for name in graph_spec_of(model, src).external_data
    }
    if dst.is_dir():
        dst = dst / src.name
    if dst.suffix != ".onnx":
        raise InputError(f"the output must be an .onnx file, got {dst}")
    if not dst.parent.is_dir():
        raise InputError(f"output directory does not exist: {dst.parent}")
    target = real_path(dst.parent, dst) / dst.name
    if {target, target.with_name(target.name + "_data")} & reads:
        raise InputError(
            f"refusing to overwrite the source {src} or its weights: write the converted graph "
            "to another path"
        )
    return src, dst, model


def _external_entries(model: onnx.ModelProto) -> dict[str, dict[str, str]]:
    """Initializer name -> its external-data entry (location, offset, length)."""
    return {
        t.name: {e.key: e.value for e in t.external_data}
        for t in model.graph.initializer
        if t.data_location == TensorProto.EXTERNAL
    }


def _point_at(model: onnx.ModelProto, entries: dict[str, dict[str, str]]) -> None:
    """Initializers the source kept outside the graph point at the same bytes again (the
    rewrite keeps their names); constants the rewrite added stay in the graph."""
    for tensor in model.graph.initializer:
        entry = entries.get(tensor.name)
        if entry is None:
            continue
        external_data_helper.set_external_data(
            tensor, entry["location"], int(entry.get("offset", 0)), int(entry["length"])
        )
        tensor.data_location = TensorProto.EXTERNAL
        tensor.ClearField("raw_data")


def _notes(inputs: set[str], unused: tuple[str, ...]) -> list[str]:
    notes = []
    if "attention_mask" in unused:
        notes.append(
            "attention_mask is no longer read: GroupQueryAttention attends causally to all "
            "cached tokens (no padding), as the published generation loops run"
        )
    if PAST_VALID_LENGTHS in inputs and PAST_VALID_LENGTHS not in unused:
        notes.append(
            f"{PAST_VALID_LENGTHS} still places each token (RoPE); GroupQueryAttention attends "
            "to every cached position up to it, as the source's mask does"
        )
    return notes


def convert_inplace_kv(
    src: Path,
    dst: Path,
    *,
    check: bool = True,
    check_steps: int = 20,
    external_data: bool | None = None,
    keep_external: bool = False,
    commit: bool = True,
) -> ConvertReport:
    """Convert the Concat-KV LM `src` into a GroupQueryAttention LM at `dst` (a file, or a
    directory to write `src`'s file name into). Files are written atomically; with `check`
    they are only moved into place once the converted logits match the source's.

    `external_data`: None writes a `.onnx_data` sidecar when the source had one or the graph
    is over 1 GiB. `keep_external`: the weights stay in the external-data files the source
    reads (shared with other graphs, which keep reading them), which must already lie beside
    `dst`; only the graph file is written. `commit`: putting the files in place is the
    command's last step (termination signals held for it: `onnx_tts.signals.committing`);
    False when `dst` lies in a staging directory of a larger output."""
    src, dst, model = _resolve_paths(src, dst)
    try:
        return _convert(src, dst, model, check, check_steps, external_data, keep_external, commit)
    except OSError as error:  # a full or read-only directory, a name too long: one line
        raise write_failure(dst, "converted graph", error) from None


def _convert(
    src: Path,
    dst: Path,
    model: onnx.ModelProto,
    check: bool,
    check_steps: int,
    external_data: bool | None,
    keep_external: bool,
    commit: bool,
) -> ConvertReport:
    stored = _external_entries(model)  # where its weights are stored, before they are loaded
    try:
        external_data_helper.load_external_data_for_model(model, os.path.dirname(str(src)))
    except Exception as error:  # onnx raises DecodeError, OSError, ValueError, ...
        raise ModelError(f"cannot read {src} as an ONNX graph: {error}") from None
    nodes_before = len(model.graph.node)
    inputs = {i.name for i in model.graph.input}
    had_external = bool(stored)
    if keep_external:
        locations = {entry["location"] for entry in stored.values()}
        absent = sorted(name for name in locations if not (dst.parent / name).is_file())
        if absent:
            raise InputError(
                f"{src.name} keeps its weights in {', '.join(absent)}, which must lie beside "
                f"{dst} when they are kept"
            )
    notes: list[str] = []

    staging = staging_beside(dst, "converted graph")
    # Kept external data is found beside the graph: that graph is staged in its directory.
    staged_graph = dst.parent / f"{staging.name}.onnx" if keep_external else staging / dst.name
    try:
        # Quantized variants (q8 / q4) first get rows that do not depend on each other, so
        # the converted LM can batch; the attention rewrite is then checked against that.
        reference = src
        rows = independent_rows(model)
        if rows.changed:
            reference = staging / "rows" / src.name
            reference.parent.mkdir()
            copy = onnx.ModelProto()
            copy.CopyFrom(model)
            _save(copy, reference, True)
            del copy
            if check:
                notes.append(_rows_note(src, reference, rows, check_steps))
            else:
                notes.append(f"rows made independent for batching: {rows.describe()}")
        layers, unused, kv_dtype = rewrite_inplace_kv(model, staging)
        if keep_external:
            external_data = True
            _point_at(model, stored)
            staged_graph.write_bytes(model.SerializeToString())
            staged = [staged_graph]
        else:
            if external_data is None:
                external_data = had_external or model.ByteSize() > _EXTERNAL_DATA_THRESHOLD
            staged = _save(model, staged_graph, external_data)
        nodes_after = len(model.graph.node)
        del model
        try:
            onnx.checker.check_model(str(staged_graph))
        except onnx.checker.ValidationError as error:
            raise ModelError(f"the converted graph is not valid ONNX: {error}") from None
        result = None
        if check:
            result = compare_logits(reference, staged_graph, decode_steps=check_steps)
        notes.extend(_notes(inputs, unused))
        with committing() if commit else contextlib.nullcontext():
            for path in staged:  # sidecar first, so the graph never points at a missing file
                path.chmod(0o644)
                os.replace(path, dst.parent / (dst.name if path == staged_graph else path.name))
            stale = dst.with_name(dst.name + "_data")
            if not external_data and stale.exists():
                stale.unlink()
    finally:
        with deferred():  # a signal now (the output may be in place) lets the cleanup end
            shutil.rmtree(staging, ignore_errors=True)
            staged_graph.unlink(missing_ok=True)
    return ConvertReport(
        source=src,
        destination=dst,
        layers=tuple(layers),
        kv_dtype=kv_dtype,
        nodes_before=nodes_before,
        nodes_after=nodes_after,
        unused_inputs=unused,
        external_data=bool(external_data),
        check=result,
        notes=tuple(notes),
    )


def convert_bundle_inplace_kv(
    src: Path, dst: Path, *, check: bool = True, check_steps: int = 20
) -> list[ConvertReport]:
    """Convert a model directory of any family: every step LM its family declares whose KV
    cache grows by Concat is rewritten under its own name (every variant of it); weights that
    the LM shares with other graphs stay in their shared file; every other file is copied as
    it is, and a manifest is written again with the new hashes.

    `dst`, a new directory that receives the model (a model of several directories gets them
    side by side), appears in one rename once every graph has converted (and passed the
    logits check), so a failure leaves nothing behind."""
    src, dst = Path(src), Path(dst)
    if not src.is_dir():
        raise InputError(f"model directory not found: {src}")
    what = "converted model"
    with new_output(dst, what, source=src) as staging:
        _, files = model_files(src)
        lms = [
            graph
            for graph in files.graphs
            if graph.step_lm and not read_graph_spec(files.source(graph.path)).uses(GQA_OP)
        ]
        if not lms:
            raise ModelError(
                f"{src}: no step LM of this model grows its KV cache by Concat (its LMs "
                "already use GroupQueryAttention, which writes the cache in place); nothing to "
                "convert"
            )
        converted = {graph.path for graph in lms}
        needed = files_of(g for g in files.graphs if g.path not in converted)
        # The converted graphs are written anew with sidecars of their own; shared data stays.
        rewritten = {path for g in lms for path in (g.path, *g.sidecar_files())} - needed
        out = staging / "out"
        copy_model(files, out, rewritten)
        reports = [
            convert_inplace_kv(
                files.source(graph.path),
                out / graph.path,
                check=check,
                check_steps=check_steps,
                # A manifest lists every file: a graph it lists stays as it was (one file,
                # or with its own sidecar).
                external_data=False if files.manifest and not graph.sidecars else None,
                keep_external=bool(graph.data),
                commit=False,
            )
            for graph in lms
        ]
        rewrite_manifest(files, out)
        place_output(out, dst, what)
    return [
        dataclasses.replace(r, destination=dst / r.destination.relative_to(out)) for r in reports
    ]

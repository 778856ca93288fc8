"""`onnx-tts convert --inplace-kv`: one LM graph file, every ``language_model*.onnx`` of a
Chatterbox-style model directory, or the decode_step graph of a MOSS-TTS-Nano layout, rewritten
so its KV cache can be written in place.

Files are staged in a temporary directory beside the target and moved into place only after
the rewrite is valid ONNX and (with ``check``) its logits match the source's, so a failure
leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from onnx import TensorProto

from onnx_tts.errors import InputError, ModelError
from onnx_tts.tools.convert.rewrite import rewrite_inplace_kv
from onnx_tts.tools.convert.verify import LayerAttention, LogitsCheck, compare_logits
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


def _has_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer)


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


def _resolve_paths(src: Path, dst: Path) -> tuple[Path, Path]:
    src, dst = Path(src), Path(dst)
    if not src.is_file():
        raise InputError(f"source graph not found: {src}")
    if dst.is_dir():
        dst = dst / src.name
    if dst.resolve() == src.resolve():
        raise InputError(
            f"refusing to overwrite the source {src}: write the converted graph to another path"
        )
    if dst.suffix != ".onnx":
        raise InputError(f"the output must be an .onnx file, got {dst}")
    if not dst.parent.is_dir():
        raise InputError(f"output directory does not exist: {dst.parent}")
    return src, dst


def convert_inplace_kv(
    src: Path,
    dst: Path,
    *,
    check: bool = True,
    check_steps: int = 20,
    external_data: bool | None = None,
) -> ConvertReport:
    """Convert the Concat-KV LM `src` into a GroupQueryAttention LM at `dst` (a file, or a
    directory to write `src`'s file name into). Files are written atomically; with `check`
    they are only moved into place once the converted logits match the source's.

    `external_data`: None writes a `.onnx_data` sidecar when the source had one or the graph
    is over 1 GiB."""
    src, dst = _resolve_paths(src, dst)
    try:
        model = onnx.load(str(src), load_external_data=True)
    except Exception as error:  # onnx raises DecodeError, OSError, ...
        raise ModelError(f"cannot read {src} as an ONNX graph: {error}") from None
    nodes_before = len(model.graph.node)
    had_external = _has_external_data(onnx.load(str(src), load_external_data=False))
    notes: list[str] = []

    staging = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
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
        if external_data is None:
            external_data = had_external or model.ByteSize() > _EXTERNAL_DATA_THRESHOLD
        staged = _save(model, staging / dst.name, external_data)
        del model
        try:
            onnx.checker.check_model(str(staging / dst.name))
        except onnx.checker.ValidationError as error:
            raise ModelError(f"the converted graph is not valid ONNX: {error}") from None
        result = None
        if check:
            result = compare_logits(reference, staging / dst.name, decode_steps=check_steps)
        if "attention_mask" in unused:
            notes.append(
                "attention_mask is no longer read: GroupQueryAttention attends causally to all "
                "cached tokens (no padding), as the Chatterbox loop runs"
            )
        for path in staged:  # sidecar first, so the graph never points at a missing file
            path.chmod(0o644)
            os.replace(path, dst.parent / path.name)
        stale = dst.with_name(dst.name + "_data")
        if not external_data and stale.exists():
            stale.unlink()
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    converted = onnx.load(str(dst), load_external_data=False)
    return ConvertReport(
        source=src,
        destination=dst,
        layers=tuple(layers),
        kv_dtype=kv_dtype,
        nodes_before=nodes_before,
        nodes_after=len(converted.graph.node),
        unused_inputs=unused,
        external_data=bool(external_data),
        check=result,
        notes=tuple(notes),
    )


_LM_FILE_RE = re.compile(r"^language_model(_[a-z0-9]+)?\.onnx$")


def _external_locations(path: Path) -> set[str]:
    model = onnx.load(str(path), load_external_data=False)
    locations = set()
    for tensor in model.graph.initializer:
        if tensor.data_location == TensorProto.EXTERNAL:
            locations.update(e.value for e in tensor.external_data if e.key == "location")
    return locations


def convert_bundle_inplace_kv(
    src: Path, dst: Path, *, check: bool = True, check_steps: int = 20
) -> list[ConvertReport]:
    """Convert every ``language_model*.onnx`` of a Chatterbox-style model directory and write
    a complete copy of the directory to `dst` (the other files copied as they are).

    `dst` must not exist yet; it appears in one rename once every graph has converted (and
    passed the logits check), so a failure leaves nothing behind."""
    src, dst = Path(src), Path(dst)
    if not src.is_dir():
        raise InputError(f"model directory not found: {src}")
    if dst.exists():
        raise InputError(f"{dst} already exists: give a new directory for the converted model")
    if not dst.parent.is_dir():
        raise InputError(f"output directory does not exist: {dst.parent}")
    graphs = sorted(p for p in src.rglob("*.onnx") if _LM_FILE_RE.match(p.name))
    if not graphs:
        raise ModelError(
            f"{src} has no language_model*.onnx graph; pass the LM graph file itself to convert "
            "another layout"
        )
    lm_sidecars = {g.parent / loc for g in graphs for loc in _external_locations(g)}
    shared = {
        p.parent / loc
        for p in src.rglob("*.onnx")
        if p not in graphs
        for loc in _external_locations(p)
    }
    staging = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    reports: list[ConvertReport] = []
    try:
        for graph in graphs:
            target = staging / graph.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            report = convert_inplace_kv(graph, target, check=check, check_steps=check_steps)
            reports.append(report)
        for path in sorted(src.rglob("*")):
            if path.is_dir() or path in graphs or (path in lm_sidecars and path not in shared):
                continue
            # A plain copy: onnx refuses external data files with several hard links.
            target = staging / path.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        staging.chmod(0o755)
        os.replace(staging, dst)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [
        dataclasses.replace(r, destination=dst / r.destination.relative_to(staging))
        for r in reports
    ]


def convert_manifest_bundle_inplace_kv(
    src: Path, dst: Path, *, check: bool = True, check_steps: int = 20
) -> list[ConvertReport]:
    """Convert an onnx-tts bundle (bundle.json: codec-lm, phoneme-mel): every graph it lists
    whose KV cache grows by Concat (codec-lm's `lm_concat`) is rewritten under its own name,
    and bundle.json is written again by the one bundle writer with the new hashes. `dst`, a new
    directory, appears in one rename once every graph passed its check."""
    from onnx_tts.families import detect
    from onnx_tts.graph_io import GQA_OP, kv_pairs, read_graph_spec
    from onnx_tts.tools.bundle_files import manifest_files, write_bundle

    src, dst = Path(src), Path(dst)
    if dst.exists():
        raise InputError(f"{dst} already exists: give a new directory for the converted model")
    if not dst.parent.is_dir():
        raise InputError(f"output directory does not exist: {dst.parent}")
    bundle = detect(src).inspected
    candidates = []
    for role, name in bundle.section("graphs").items():
        spec = read_graph_spec(bundle.graph_path(role))
        try:
            kv_pairs(spec.input_names, spec.output_names)
        except ModelError:
            continue  # not an LM
        if not spec.uses(GQA_OP):
            candidates.append(name)
    if not candidates:
        raise ModelError(
            f"{src}: no graph of this bundle grows its KV cache by Concat (its LMs already keep "
            "the cache in place); nothing to convert"
        )
    staging = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    reports: list[ConvertReport] = []
    try:
        converted, out = staging / "converted", staging / "out"
        converted.mkdir()
        for name in candidates:
            reports.append(
                convert_inplace_kv(
                    src / name,
                    converted / name,
                    check=check,
                    check_steps=check_steps,
                    external_data=False,
                )
            )
        manifest = {k: v for k, v in bundle.manifest.items() if k != "sha256"}
        files = {name: (src / name).read_bytes() for name in sorted(manifest_files(manifest))}
        files.update({name: (converted / name).read_bytes() for name in candidates})
        write_bundle(out, manifest, files)
        for path in sorted(src.iterdir()):  # files the manifest does not name
            if path.is_file() and path.name != "bundle.json" and path.name not in files:
                shutil.copy2(path, out / path.name)
        out.chmod(0o755)
        os.replace(out, dst)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [dataclasses.replace(r, destination=dst / r.destination.name) for r in reports]


def convert_moss_inplace_kv(
    src: Path, dst: Path, *, check: bool = True, check_steps: int = 20
) -> ConvertReport:
    """Convert a MOSS-TTS-Nano layout (the parent of its two directories, or the TTS directory
    with its codec beside it): its ``decode_step`` graph becomes GroupQueryAttention over
    [batch, heads, capacity, head_dim] buffers; everything else is copied unchanged into `dst`,
    a new directory that receives both model directories.

    The converted graph keeps its weights where the source keeps them, in the shared
    ``moss_tts_global_shared.data`` beside the prefill graph, so the metas stay valid and the
    weights are stored once. `dst` appears in one rename after the check passed."""
    from onnx import external_data_helper

    from onnx_tts.families.moss_tts_nano.reader import inspect_layout

    src, dst = Path(src), Path(dst)
    if dst.exists():
        raise InputError(f"{dst} already exists: give a new directory for the converted model")
    if not dst.parent.is_dir():
        raise InputError(f"output directory does not exist: {dst.parent}")
    layout = inspect_layout(src)
    source = layout.tts_graphs["decode_step"].path
    model = onnx.load(str(source), load_external_data=True)
    nodes_before = len(model.graph.node)
    stored = {
        t.name: {e.key: e.value for e in t.external_data}
        for t in onnx.load(str(source), load_external_data=False).graph.initializer
        if t.data_location == TensorProto.EXTERNAL
    }
    staging = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    try:
        for directory in dict.fromkeys((layout.tts_dir, layout.codec_dir)):
            shutil.copytree(directory, staging / directory.name)
        target = staging / layout.tts_dir.name / source.name
        with tempfile.TemporaryDirectory(prefix="onnx-tts-probe-") as scratch:
            layers, unused, kv_dtype = rewrite_inplace_kv(model, Path(scratch))
        for tensor in model.graph.initializer:
            entry = stored.get(tensor.name)
            if entry is None:
                continue  # a constant the rewrite added: small, kept in the graph
            external_data_helper.set_external_data(
                tensor, entry["location"], int(entry.get("offset", 0)), int(entry["length"])
            )
            tensor.data_location = TensorProto.EXTERNAL
            tensor.ClearField("raw_data")
        target.write_bytes(model.SerializeToString())
        del model
        try:
            onnx.checker.check_model(str(target))
        except onnx.checker.ValidationError as error:
            raise ModelError(f"the converted graph is not valid ONNX: {error}") from None
        result = compare_logits(source, target, decode_steps=check_steps) if check else None
        staging.chmod(0o755)
        os.replace(staging, dst)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    converted = onnx.load(str(dst / layout.tts_dir.name / source.name), load_external_data=False)
    return ConvertReport(
        source=source,
        destination=dst / layout.tts_dir.name / source.name,
        layers=tuple(layers),
        kv_dtype=kv_dtype,
        nodes_before=nodes_before,
        nodes_after=len(converted.graph.node),
        unused_inputs=unused,
        external_data=True,
        check=result,
        notes=(
            "past_valid_lengths still places each token (RoPE); GroupQueryAttention attends to "
            "every cached position up to it, as the source's mask does",
        ),
    )

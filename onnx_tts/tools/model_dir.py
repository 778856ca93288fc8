"""A model directory as the offline tools see it: the files its family declares (`ModelFiles`,
onnx_tts/families/files.py), a new output directory built beside its final place, the files a
tool leaves as they are copied into it, and the manifest written again after files changed.
`convert`, `quantize` and the exporters write every family's models through here, so none
names one.

Both ends are untrusted. The input (IN) is looked at before any file of it is opened
(`check_model_tree`): only directories and regular files, and links to regular files inside
IN; a FIFO (whose read never ends), a socket, a device, a link out of IN (`/etc/hostname`,
`/dev/zero`), to nothing or to itself is refused by name. Each graph's external data must lie
in IN as a regular file, at offsets and lengths that fit it and its tensor (`check_graph_file`),
and no dimension is negative. Files are copied through `onnx_tts.regular_files` (no link
followed, at most the size the file had when it was opened).

The output (OUT) must be new (not even a dangling link), its name must fit the file system, and
it may not lie inside IN (after `..` and links: `check_new_output`). `new_output` claims it at
once (an empty directory made exclusively, so a second run into the same OUT is refused with
one line), builds the output in a uniquely named staging directory beside it, and removes both
on any failure (one line naming the cause: full, read-only, a name too long, ...);
`place_output` puts the finished output in place with one rename while termination signals are
held (`onnx_tts.signals.committing`: a signal after it ends the run as done, exit 0)."""

from __future__ import annotations

import contextlib
import errno
import math
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onnx_tts.atomic_files import fsync_directory, temp_prefix
from onnx_tts.bundle import Bundle, write_manifest
from onnx_tts.errors import InputError, ModelError, OutputError
from onnx_tts.families import Detection, detect, family_of
from onnx_tts.families.files import GraphFile, ModelFiles
from onnx_tts.graph_io import read_graph_proto
from onnx_tts.regular_files import RefusedFile, file_kind, open_regular_file
from onnx_tts.regular_files import real_path as resolved
from onnx_tts.signals import committing, deferred

if TYPE_CHECKING:
    import onnx

# Bounds on what an input directory may make a tool walk and copy.
MAX_MODEL_ENTRIES = 100_000
MAX_MODEL_DEPTH = 32
MAX_MODEL_FILE_BYTES = 1 << 40
_COPY_BLOCK = 1 << 20


# -- reading IN ---------------------------------------------------------------------------------
def real_path(path: str | os.PathLike[str], named: object = None) -> Path:
    """`path` with every link and `..` resolved; InputError naming `named` (default `path`)
    when that cannot be known (a relative path in a working directory that was deleted)."""
    try:
        return resolved(path)
    except OSError as error:  # os.getcwd() of a removed directory
        raise InputError(
            f"cannot resolve {named or path}: {error.strerror or error} (was the current "
            "directory removed?); give an absolute path"
        ) from None


def _refuse(path: Path, what: str, fix: str) -> ModelError:
    return ModelError(
        f"{path} is {what}: a model directory may hold only regular files and directories "
        f"(and links to files inside it); {fix}"
    )


def _check_link(path: Path, root: Path) -> None:
    """A symbolic link inside the model: refused unless it leads to a regular file inside it."""
    try:
        target = Path(os.path.realpath(path, strict=True))
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise _refuse(path, "a symbolic link loop", "remove the link") from None
        raise _refuse(
            path, f"a symbolic link to nothing ({os.readlink(path)})", "remove or fix it"
        ) from None
    if target != root and root not in target.parents:
        raise _refuse(
            path,
            f"a symbolic link to {target}, outside the model",
            "copy that file into the model instead of linking to it",
        )
    mode = os.lstat(target).st_mode
    if not stat.S_ISREG(mode):
        raise _refuse(path, f"a symbolic link to {file_kind(mode)} ({target})", "remove it")


def check_model_tree(source: str | os.PathLike[str]) -> Path:
    """Every entry below the model directory `source`, looked at without following links or
    opening anything: ModelError naming the first that is not a directory, a regular file or a
    link to a regular file inside the model (and when there are more than MAX_MODEL_ENTRIES or
    they nest deeper than MAX_MODEL_DEPTH). Returns the directory's real path."""
    root = real_path(source)
    pending = [(root, 0)]
    seen = 0
    while pending:
        directory, depth = pending.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError as error:
            raise ModelError(f"cannot read {directory}: {error.strerror or error}") from None
        seen += len(entries)
        if seen > MAX_MODEL_ENTRIES:
            raise ModelError(f"{source} holds more than {MAX_MODEL_ENTRIES} files: not a model")
        for entry in entries:
            path = Path(entry.path)
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode):
                if depth >= MAX_MODEL_DEPTH:
                    raise ModelError(f"{path} nests deeper than {MAX_MODEL_DEPTH} directories")
                pending.append((path, depth + 1))
            elif stat.S_ISLNK(mode):
                _check_link(path, root)
            elif not stat.S_ISREG(mode):
                raise _refuse(path, file_kind(mode), "remove it")
    return root


def _tensor_bytes(tensor: onnx.TensorProto) -> int | None:
    """The bytes a tensor's values take (None for strings and unknown types)."""
    from onnx import TensorProto, helper

    count = math.prod(tensor.dims)
    if tensor.data_type == TensorProto.STRING:
        return None
    if tensor.data_type in (TensorProto.INT4, TensorProto.UINT4, TensorProto.FLOAT4E2M1):
        return (count + 1) // 2
    try:
        return count * helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        return None


def _external_entry(tensor: onnx.TensorProto, path: Path, root: Path) -> None:
    """One tensor's external data: a regular file inside `root`, its range inside the file and
    as long as the tensor."""
    entries = {entry.key: entry.value for entry in tensor.external_data}
    where = f"{path.name}: tensor {tensor.name[:80]!r} keeps its data"
    location = entries.get("location", "")
    if not location or os.path.isabs(location) or "\0" in location or "\\" in location:
        raise ModelError(f"{where} at {location[:80]!r}, which is no path relative to the graph")
    data = path.parent / location
    try:
        real = Path(os.path.realpath(data, strict=True))
    except OSError as error:
        raise ModelError(f"{where} in {location[:80]!r}: {error.strerror or error}") from None
    if root not in real.parents:
        raise ModelError(f"{where} in {real}, outside the model; copy it into the model")
    info = os.lstat(real)
    if not stat.S_ISREG(info.st_mode):
        raise ModelError(f"{where} in {location[:80]!r}, which is {file_kind(info.st_mode)}")
    try:
        offset = int(entries.get("offset", "0"))
        length = int(entries["length"]) if "length" in entries else info.st_size - offset
    except ValueError:
        raise ModelError(f"{where} at an offset or length that is no integer") from None
    if offset < 0 or length < 0 or offset + length > info.st_size:
        raise ModelError(
            f"{where} at offset {offset}, length {length}, outside the {info.st_size} bytes of "
            f"{location[:80]!r}"
        )
    expected = _tensor_bytes(tensor)
    if expected is not None and length != expected:
        raise ModelError(f"{where} in {length} bytes, but its shape needs {expected}")


def check_graph_file(path: Path, root: Path) -> onnx.ModelProto:
    """The graph `path` parsed (without its external data) and checked before its weights are
    read: no negative dimension (initializers, inputs, outputs), inline values as long as their
    shape, external data inside `root` (real path) as `_external_entry` says. Returns it."""
    from onnx import TensorProto

    model = read_graph_proto(path)
    graph = model.graph
    for value in (*graph.input, *graph.output):
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_value") and dim.dim_value < 0:
                raise ModelError(
                    f"{path.name}: {value.name[:80]!r} has the negative dimension {dim.dim_value}"
                )
    for tensor in graph.initializer:
        if any(d < 0 for d in tensor.dims):
            raise ModelError(
                f"{path.name}: initializer {tensor.name[:80]!r} has a negative dimension "
                f"{list(tensor.dims)[:8]}"
            )
        if tensor.data_location == TensorProto.EXTERNAL:
            _external_entry(tensor, path, root)
        elif tensor.raw_data:
            expected = _tensor_bytes(tensor)
            if expected is not None and len(tensor.raw_data) != expected:
                raise ModelError(
                    f"{path.name}: initializer {tensor.name[:80]!r} holds "
                    f"{len(tensor.raw_data)} bytes, but its shape needs {expected}"
                )
    return model


def model_files(source: Path) -> tuple[Detection, ModelFiles]:
    """What `source` holds and its files as its family declares them, after its directory tree
    (`check_model_tree`) and every graph (`check_graph_file`) passed; a ModelError saying what
    is wrong when it is no model onnx-tts runs, or its family declares no files."""
    root = check_model_tree(source)
    detection = detect(source)
    family = family_of(detection)
    if family.files is None:
        raise ModelError(
            f"{source}: the {family.name} family does not declare its files, so the offline "
            "tools cannot rewrite it"
        )
    files = family.files(detection)
    for graph in files.graphs:
        check_graph_file(files.source(graph.path), root)
    return detection, files


def files_of(graphs: Iterable[GraphFile]) -> set[str]:
    """Every file the graphs read (graph files and external data), relative to the model."""
    return {path for graph in graphs for path in graph.files()}


def _copy_file(source: Path, root: Path, target: Path) -> None:
    """The regular file `source` (a real path below `root`) copied to the new file `target`,
    at most the bytes it had when opened. ModelError when it cannot be read; an OSError of the
    writing as it comes."""
    with contextlib.ExitStack() as stack:
        try:
            fd, info = stack.enter_context(
                open_regular_file(source, MAX_MODEL_FILE_BYTES, root=root)
            )
        except (OSError, RefusedFile) as error:
            raise ModelError(f"cannot read {source}: {error}") from None
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        out = os.open(target, flags, 0o644)
        stack.callback(os.close, out)
        left = info.st_size
        while left > 0:
            try:
                block = os.read(fd, min(left, _COPY_BLOCK))
            except OSError as error:
                raise ModelError(f"cannot read {source}: {error.strerror}") from None
            if not block:
                break
            view = memoryview(block)
            while view:
                view = view[os.write(out, view) :]
            left -= len(block)


def copy_model(files: ModelFiles, out: Path, leave_out: Iterable[str] = ()) -> None:
    """Copy every file of the model's directories into `out` (each directory at its place),
    but the files `leave_out` names (relative to the model: what a tool writes anew or drops).
    Plain copies of regular files (onnx refuses external-data files with several hard links);
    a link inside the model is copied as the file it leads to (`check_model_tree` allowed)."""
    skipped = set(leave_out)
    root = real_path(files.root)
    for place, directory in files.directories.items():
        pending = [(real_path(directory), out / place if place else out, place)]
        while pending:
            source, target, prefix = pending.pop()
            target.mkdir(parents=True, exist_ok=True)
            for entry in sorted(os.scandir(source), key=lambda e: e.name):
                relative = f"{prefix}/{entry.name}" if prefix else entry.name
                if relative in skipped:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    pending.append((Path(entry.path), target / entry.name, relative))
                    continue
                real = real_path(entry.path)
                if real != root and root not in real.parents:
                    raise _refuse(Path(entry.path), f"a link to {real}", "copy the file in")
                _copy_file(real, root, target / entry.name)


def rewrite_manifest(
    files: ModelFiles, out: Path, update: Callable[[dict[str, Any]], None] | None = None
) -> None:
    """When the model has a manifest: the source's, changed by `update`, written into `out`
    with the sha256 of `out`'s files (`onnx_tts.bundle.write_manifest`)."""
    if files.manifest is None:
        return
    place = Path(files.manifest).parent
    source = Bundle.read(files.source(files.manifest).parent)
    manifest = {k: v for k, v in source.manifest.items() if k != "sha256"}
    if update is not None:
        update(manifest)
    write_manifest(out / place, manifest)


# -- writing OUT --------------------------------------------------------------------------------
def _name_max(directory: Path) -> int:
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def check_new_output(
    destination: Path, what: str = "output", *, source: str | os.PathLike[str] | None = None
) -> Path:
    """`destination` as a new directory to create (for the `what`): InputError when anything is
    there already (a dangling link too), its parent is no directory, its name is too long for
    the file system, or (given the model `source` it is made from) it lies inside `source` or
    is it, after `..` and links. Creates nothing (`new_output` claims it)."""
    destination = Path(destination)
    if source is not None:
        inside = real_path(source)
        real = real_path(destination.parent, destination) / destination.name
        if real == inside or inside in real.parents:
            raise InputError(
                f"the output {destination} is inside the model {source}: write the {what} to a "
                "new directory outside it"
            )
    if os.path.lexists(destination):
        if destination.is_symlink():
            raise InputError(
                f"{destination} is a symbolic link (to {os.readlink(destination)}): give a new "
                f"directory for the {what}"
            )
        raise InputError(f"{destination} already exists: give a new directory for the {what}")
    parent = destination.parent
    if not parent.is_dir():
        raise InputError(f"output directory does not exist: {parent}")
    limit = _name_max(parent)
    if len(os.fsencode(destination.name)) > limit:
        raise InputError(
            f"the name of the {what} is {len(os.fsencode(destination.name))} bytes long; names "
            f"in {parent} hold at most {limit}: give a shorter name"
        )
    return destination


def write_failure(destination: Path, what: str, error: OSError) -> OutputError:
    """A file-system failure while the output was built, as one line (nothing was written)."""
    reason = error.strerror or str(error)
    where = f" ({error.filename})" if error.filename else ""
    hint = ""
    if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        hint = "; free some space or write it elsewhere"
    elif error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        hint = "; write it to a directory you can write"
    elif error.errno == errno.ENAMETOOLONG:
        hint = "; give a shorter name"
    return OutputError(
        f"cannot write the {what} {destination}: {reason}{where}{hint}; nothing was written"
    )


def staging_beside(destination: Path, what: str = "output") -> Path:
    """A new, uniquely named directory beside `destination` (same file system: one rename puts
    it in place) named after it, its host and its process (`atomic_files.temp_prefix`)."""
    destination = Path(destination)
    try:
        return Path(
            tempfile.mkdtemp(
                prefix=temp_prefix(destination.name), suffix=".part", dir=destination.parent
            )
        )
    except OSError as error:
        raise write_failure(destination, what, error) from None


def place_output(staging: Path, destination: Path, what: str = "output") -> None:
    """The finished output (built in `staging`) moved to `destination` in one rename, with
    termination signals held (`committing`). The rename replaces nothing but an empty
    directory (the claim of `new_output`): OutputError, nothing moved, when another run put
    something there meanwhile."""
    with committing():
        try:
            staging.chmod(0o755)
            os.rename(staging, destination)
        except OSError as error:
            if error.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise OutputError(
                    f"{destination} was written by another run meanwhile: this run's {what} "
                    "was not put in place"
                ) from None
            raise write_failure(destination, what, error) from None
    fsync_directory(destination.parent)


@contextlib.contextmanager
def new_output(
    destination: Path, what: str = "output", *, source: str | os.PathLike[str] | None = None
) -> Iterator[Path]:
    """A staging directory for the new output `destination` (checked by `check_new_output`),
    which is claimed at once: made as an empty directory, exclusively, so that a second run
    into it is refused with one line. The caller builds the output in the staging directory and
    calls `place_output(staging or a directory in it, destination)` last. On any failure the
    staging directory and the claim are removed, and an OSError becomes one OutputError line."""
    destination = check_new_output(destination, what, source=source)
    try:
        os.mkdir(destination, 0o700)
    except FileExistsError:
        raise InputError(
            f"{destination} already exists (another run is writing it?): give a new directory "
            f"for the {what}"
        ) from None
    except OSError as error:
        raise write_failure(destination, what, error) from None
    claim = os.lstat(destination).st_ino
    staging: Path | None = None
    try:
        staging = staging_beside(destination, what)
        try:
            yield staging
        except OSError as error:
            raise write_failure(destination, what, error) from None
    except BaseException:
        with contextlib.suppress(OSError):
            if os.lstat(destination).st_ino == claim:  # still our empty claim, not the output
                os.rmdir(destination)
        raise
    finally:
        if staging is not None:
            with deferred():  # a signal now (the output may be in place) lets it go first
                shutil.rmtree(staging, ignore_errors=True)


__all__ = [
    "MAX_MODEL_ENTRIES",
    "check_graph_file",
    "check_model_tree",
    "check_new_output",
    "copy_model",
    "files_of",
    "model_files",
    "new_output",
    "place_output",
    "real_path",
    "rewrite_manifest",
    "staging_beside",
    "write_failure",
]

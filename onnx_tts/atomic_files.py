"""Files written atomically: a unique temporary file beside the one replaced, fsynced, given
that file's permissions (or the umask's), then renamed over it; a symbolic link's target is
the file replaced, and a read-only file is refused. On any failure nothing is left behind."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from onnx_tts.errors import OutputError


def output_target(path: str | os.PathLike[str]) -> Path:
    """The file a write to `path` replaces: `path` itself, or the final target of a symbolic
    link (the link stays a link, as with a shell redirection; a dangling link's target is
    created). OutputError for a link loop and for an existing file the user may not write
    (no write permission, or no write bit at all: marked read-only on purpose, which even
    root's atomic replace must respect)."""
    path = Path(path)
    try:
        if path.is_symlink():
            target = Path(os.path.realpath(path))
            if target.is_symlink():  # realpath stops at a loop
                raise OutputError(f"cannot write {path}: its symbolic links form a loop")
            path = target
    except OSError as error:  # e.g. a name longer than the file system allows
        raise write_error(path, error) from None
    try:
        mode = path.stat().st_mode
    except OSError:
        return path  # not there yet (or unreachable: the directory checks say why)
    if stat.S_ISREG(mode) and (not os.access(path, os.W_OK) or not mode & 0o222):
        raise OutputError(
            f"cannot write {path}: the file is read-only; choose another output path or make "
            f"it writable (chmod u+w {path})"
        )
    return path


def temp_beside(path: Path) -> tuple[int, str]:
    """A new uniquely named temp file next to `path` (same file system, for the rename)."""
    parent = path.parent if str(path.parent) else Path(".")
    try:
        # The name is shortened so that a valid long target name gives a valid temp name.
        return tempfile.mkstemp(prefix=f".{path.name[:128]}.", suffix=".part", dir=parent)
    except OSError as error:
        raise write_error(path, error) from None


def _current_umask() -> int:
    # /proc avoids os.umask's set-and-restore, which races with other threads creating files.
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def output_mode(path: Path) -> int:
    """Permission bits for a file about to replace `path`: those of the existing file, else
    what open() would give a new file (0666 minus the umask). mkstemp alone gives 0600."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return 0o666 & ~_current_umask()


def fsync_directory(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_error(path: Path, error: OSError) -> OutputError:
    reason = error.strerror or str(error)
    return OutputError(f"cannot write {path}: {reason}; nothing was written")


def write_atomically(path: Path, data: bytes) -> Path:
    """Write `data` to a unique temporary file beside `path` (beside a symbolic link's target,
    which is the file replaced: see :func:`output_target`), fsync it, give it the permissions
    of the file it replaces (or the umask's), then rename it over that file. On any failure
    `path` is untouched and no temp file remains."""
    path = output_target(path)
    fd, tmp = temp_beside(path)
    try:
        try:
            os.fchmod(fd, output_mode(path))
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as error:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise write_error(path, error) from None
        raise
    fsync_directory(path.parent if str(path.parent) else Path("."))
    return path


__all__ = [
    "fsync_directory",
    "output_mode",
    "output_target",
    "temp_beside",
    "write_atomically",
    "write_error",
]

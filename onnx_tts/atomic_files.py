"""Files written atomically: a unique temporary file beside the one replaced, fsynced, given
that file's permissions (or the umask's), then renamed over it; a symbolic link's target is
the file replaced, and a read-only file is refused. On any failure nothing is left behind.

Every temporary file is registered from the moment it exists (its creation and registration
are one step, no terminating signal between them: `onnx_tts.signals.deferred`) until it is
renamed or removed, so that a process ended by a signal removes what it left with
:func:`remove_temp_files`."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import stat
import tempfile
import threading
from pathlib import Path

from onnx_tts.errors import OutputError
from onnx_tts.signals import deferred

_live_temps: set[str] = set()
_temps_lock = threading.Lock()


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


def _host_tag() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:64]


def _writer_tag() -> str:
    return f"{_host_tag()}-{os.getpid()}"


def temp_prefix(name: str) -> str:
    """The start of a temp file's name for a file `name`: hidden, and naming the host and
    process writing it, so that a temp file whose writer was killed (SIGKILL, which no
    handler sees) is recognised and removed by :func:`remove_orphaned_temps`. The name is
    shortened so that a valid long target name gives a valid temp name."""
    return f".{name[:128]}.{_writer_tag()}."


_TEMP_NAME = re.compile(r"^\..+\.(?P<host>[A-Za-z0-9-]*)-(?P<pid>\d+)\.[A-Za-z0-9_]+\.part$")


def remove_orphaned_temps(directory: Path) -> int:
    """Remove the temp files in `directory` left by a process of this host that no longer
    runs (those of other hosts sharing the directory are left alone); how many."""
    host = _host_tag()
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    removed = 0
    for entry in entries:
        found = _TEMP_NAME.match(entry.name)
        if found is None or found["host"] != host or _running(int(found["pid"])):
            continue
        with contextlib.suppress(OSError):
            if entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
                removed += 1
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # gone, or never a process id
        return False
    except PermissionError:  # another user's process: it runs
        pass
    return True


def temp_beside(path: Path) -> tuple[int, str]:
    """A new uniquely named temp file next to `path` (same file system, for the rename),
    registered until :func:`release_temp` (see the module docstring)."""
    parent = path.parent if str(path.parent) else Path(".")
    try:
        with deferred():
            fd, name = tempfile.mkstemp(prefix=temp_prefix(path.name), suffix=".part", dir=parent)
            with _temps_lock:
                _live_temps.add(name)
    except OSError as error:
        raise write_error(path, error) from None
    return fd, name


def release_temp(name: str, *, remove: bool = False) -> None:
    """`name` is no temp file of ours any more (renamed into place, or removed here when
    `remove`)."""
    if remove:
        with contextlib.suppress(OSError):
            os.unlink(name)
    with _temps_lock:
        _live_temps.discard(name)


def remove_temp_files() -> int:
    """Remove every registered temp file (a process ended by a signal); how many there were."""
    with _temps_lock:
        names = list(_live_temps)
        _live_temps.clear()
    for name in names:
        with contextlib.suppress(OSError):
            os.unlink(name)
    return len(names)


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


class StagedFile:
    """A file written completely to a temp file beside the one it replaces, not yet in place:
    :meth:`commit` renames it over that file, :meth:`discard` removes it. Several outputs
    staged first and committed together are replaced only once every one was complete."""

    def __init__(self, path: Path, temp: str) -> None:
        self.path, self.temp = path, temp
        self._done = False

    def commit(self) -> Path:
        if self._done:
            raise OutputError(f"cannot write {self.path}: it was already committed or discarded")
        self._done = True
        try:
            os.replace(self.temp, self.path)
            release_temp(self.temp)
        except BaseException as error:
            release_temp(self.temp, remove=True)
            if isinstance(error, OSError):
                raise write_error(self.path, error) from None
            raise
        fsync_directory(self.path.parent if str(self.path.parent) else Path("."))
        return self.path

    def discard(self) -> None:
        if not self._done:
            self._done = True
            release_temp(self.temp, remove=True)


def stage_file(path: Path, data: bytes) -> StagedFile:
    """Write `data` to a unique temporary file beside `path` (beside a symbolic link's target,
    which is the file replaced: see :func:`output_target`), fsynced and given the permissions
    of the file it replaces (or the umask's); `path` is untouched until the result's
    :meth:`StagedFile.commit`. On a failure no temp file remains."""
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
    except BaseException as error:
        release_temp(tmp, remove=True)
        if isinstance(error, OSError):
            raise write_error(path, error) from None
        raise
    return StagedFile(path, tmp)


def write_atomically(path: Path, data: bytes) -> Path:
    """Write `data` over `path` at once (:func:`stage_file`, then the rename): on any failure
    `path` is untouched and no temp file remains."""
    return stage_file(path, data).commit()


def commit_together(staged: list[StagedFile]) -> None:
    """Put staged files in place, in order; if one cannot be, those after it are discarded."""
    for index, file in enumerate(staged):
        try:
            file.commit()
        except BaseException:
            for rest in staged[index + 1 :]:
                rest.discard()
            raise


def same_file(first: str | os.PathLike[str], second: str | os.PathLike[str]) -> bool:
    """Whether writing `first` and `second` would write one file: the same path however
    spelled ("./x", "x", "d/../x"), a symbolic link to the other, a hard link (same device
    and inode), or, where the file system ignores case, names that differ only in case."""
    a, b = Path(os.path.realpath(first)), Path(os.path.realpath(second))
    if a == b:
        return True
    try:
        one, other = a.stat(), b.stat()
    except OSError:  # one of them is not there yet
        pass
    else:
        return (one.st_dev, one.st_ino) == (other.st_dev, other.st_ino)
    if a.name.casefold() != b.name.casefold() or not _same_directory(a.parent, b.parent):
        return False
    # (had either existed, the other name would have reached it there too)
    return not a.exists() and not b.exists() and _ignores_case(a.parent)


def _same_directory(a: Path, b: Path) -> bool:
    try:
        one, other = a.stat(), b.stat()
    except OSError:
        return a == b
    return (one.st_dev, one.st_ino) == (other.st_dev, other.st_ino)


def _ignores_case(directory: Path) -> bool:
    """Whether names in `directory` are compared without case: a probe file is looked up by
    its name in the other case."""
    try:
        fd, name = temp_beside(directory / "case-probe")
    except OutputError:
        return False
    os.close(fd)
    try:
        probe = Path(name)
        return probe.with_name(probe.name.swapcase()).exists()
    finally:
        release_temp(name, remove=True)


__all__ = [
    "StagedFile",
    "commit_together",
    "fsync_directory",
    "output_mode",
    "output_target",
    "release_temp",
    "remove_orphaned_temps",
    "remove_temp_files",
    "same_file",
    "stage_file",
    "temp_beside",
    "temp_prefix",
    "write_atomically",
    "write_error",
]

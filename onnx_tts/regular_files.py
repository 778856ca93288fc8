"""Reading files that someone else may have put in a directory of ours (cache entries, stored
voices) without trusting what they are.

A cache or voices directory can hold anything its writers left: a FIFO (whose `open` blocks
until a writer comes, and whose read never ends), a link to `/dev/zero` or to a file outside
the directory, a sparse file of many GiB. :func:`read_regular_file` opens only a regular file,
reached from the directory without following any symbolic link, and refuses one larger than
the caller's bound by its `stat` size, before reading a byte. It never blocks: the open is
non-blocking and nothing but a regular file is read.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "RefusedFile",
    "directory_fd",
    "file_kind",
    "open_regular_file",
    "read_regular_file",
    "real_path",
    "unlink_below",
]

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class RefusedFile(Exception):
    """A path that is not a regular file of an acceptable size; `what` says what it is."""

    def __init__(self, path: object, what: str) -> None:
        super().__init__(f"{path} is {what}")
        self.path = path
        self.what = what


def file_kind(mode: int) -> str:
    """What a file of `st_mode` `mode` is, in words ("a FIFO", "a symbolic link", ...)."""
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


@contextlib.contextmanager
def directory_fd(root: str | os.PathLike[str], parts: tuple[str, ...] = ()) -> Iterator[int]:
    """A descriptor of `root`/`parts...`, each part a real directory (never a symbolic link):
    RefusedFile when one is not, FileNotFoundError when one is missing."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            try:
                inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as error:
                if error.errno in (errno.ELOOP, errno.ENOTDIR):
                    info = os.stat(part, dir_fd=fd, follow_symlinks=False)
                    raise RefusedFile(part, f"{file_kind(info.st_mode)}, not a directory") from None
                raise
            os.close(fd)
            fd = inner
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def open_regular_file(
    path: str | os.PathLike[str], max_bytes: int, *, root: str | os.PathLike[str] | None = None
) -> Iterator[tuple[int, os.stat_result]]:
    """A read-only descriptor of `path` and its `fstat`, when it is a regular file of at most
    `max_bytes`, reached from `root` (default: its own directory) through real directories
    only; closed when the block ends. For a file too large to read at once (a model's weights,
    copied in blocks); the refusals are :func:`read_regular_file`'s."""
    path = Path(path)
    base = path.parent if root is None else Path(root)
    parts = path.relative_to(base).parts
    if not parts:
        raise RefusedFile(path, "a directory")
    with directory_fd(base, parts[:-1]) as parent:
        name = parts[-1]
        # lstat first: a device or FIFO is never even opened (opening some devices acts).
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if not stat.S_ISREG(info.st_mode):
            raise RefusedFile(path, file_kind(info.st_mode))
        try:
            fd = os.open(name, _OPEN_FLAGS, dir_fd=parent)
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise RefusedFile(path, "a symbolic link") from None
            raise
    try:
        info = os.fstat(fd)  # what was opened (it may have been swapped since the lstat)
        if not stat.S_ISREG(info.st_mode):
            raise RefusedFile(path, file_kind(info.st_mode))
        if info.st_size > max_bytes:
            raise RefusedFile(path, f"{info.st_size} bytes long, more than the {max_bytes} allowed")
        yield fd, info
    finally:
        os.close(fd)


def read_regular_file(
    path: str | os.PathLike[str], max_bytes: int, *, root: str | os.PathLike[str] | None = None
) -> bytes:
    """The bytes of `path` when it is a regular file of at most `max_bytes`, reached from `root`
    (default: its own directory) through real directories only.

    RefusedFile for a symbolic link (anywhere below `root`), a FIFO, device, socket or
    directory, or a file larger than `max_bytes` (by its size, never read); FileNotFoundError
    when it is not there; other OSErrors as the system reports them."""
    with open_regular_file(path, max_bytes, root=root) as (fd, info):
        chunks = []
        left = info.st_size + 1  # one byte more: a file that grows meanwhile is refused
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    data = b"".join(chunks)
    if len(data) > max_bytes or len(data) > info.st_size:
        raise RefusedFile(path, "growing while it is read")
    return data


def real_path(path: str | os.PathLike[str]) -> Path:
    """`path` with every symbolic link and `..` resolved, as os.path.realpath does: a link
    loop stays in it (opening it then fails with ELOOP, a clear OSError), where Path.resolve
    raises RuntimeError on Python 3.11. OSError when a relative path's working directory was
    removed."""
    return Path(os.path.realpath(path))


def unlink_below(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> bool:
    """Remove `path` (a file, FIFO or link, never a directory, never a link's target) when it
    is reached from `root` through real directories only; whether it was removed."""
    parts = Path(path).relative_to(Path(root)).parts
    if not parts:
        return False
    try:
        with directory_fd(root, parts[:-1]) as parent:
            os.unlink(parts[-1], dir_fd=parent)
            return True
    except (OSError, RefusedFile):
        return False

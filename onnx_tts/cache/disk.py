"""Disk tier: one content-addressed file per key, shared by every process using the directory.

Files are ``<dir>/<key[:2]>/<key>.otc`` holding the checksummed blob of
:mod:`onnx_tts.cache.codec`, written atomically (a uniquely named temporary file, then a
rename), so a reader sees a whole entry or none. Optionally bounded in bytes: when a write
takes the directory over, the least recently used files (by mtime, refreshed on every hit) are
removed down to 90 % of the bound. ``clear`` only empties a directory that carries the cache's
marker file, so a mistyped path never loses someone's files.

Whatever else lands in the directory is never trusted: an entry is read only when it is a
regular file reached through real subdirectories (no symbolic link is followed below the
cache directory) and no larger than any entry can be, judged by its size before a byte is
read (:func:`onnx_tts.regular_files.read_regular_file`). A FIFO, a device, a link to
``/dev/zero`` or a many-GiB sparse file is refused unread (never blocking) and dropped as a bad
entry; nothing is written, pruned or removed through a link either.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
from pathlib import Path
from typing import Any

from onnx_tts.cache.tier import Entry, Unreadable
from onnx_tts.errors import CacheError, InputError
from onnx_tts.regular_files import RefusedFile, directory_fd, read_regular_file, unlink_below

__all__ = ["DiskTier", "cache_root"]

log = logging.getLogger(__name__)

SUFFIX = ".otc"
_TMP_PREFIX = ".tmp-"
# No entry is larger than this (nor than the tier's own bound): a file that is, is refused
# unread. A result entry of an hour of audio at 48 kHz is ~0.7 GiB.
MAX_ENTRY_BYTES = 2 << 30


def _new_temp_file(parent: int) -> tuple[int, str]:
    """(descriptor, name) of a new, uniquely named temp file in directory `parent` (fd)."""
    name = f"{_TMP_PREFIX}{secrets.token_hex(8)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(name, flags, 0o644, dir_fd=parent), name


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/onnx-tts``, or ``~/.cache/onnx-tts``: home of every disk cache."""
    base = os.environ.get("XDG_CACHE_HOME") or ""
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".cache"
    return root / "onnx-tts"


class DiskTier:
    """Files under ``directory``.

    Args:
        directory: where the entries live.
        label: the cache's name in log lines and errors ("reference cache").
        marker_name: file that marks the directory as this cache's own.
        max_bytes: bound of the directory (None: unbounded).
        create: create the directory (and its marker) if missing; False for read-only uses
            such as ``cache stats``, which must not create directories.
    """

    name = "disk"
    shared = True

    def __init__(
        self,
        directory: Path,
        label: str,
        marker_name: str,
        max_bytes: int | None = None,
        *,
        create: bool = True,
    ) -> None:
        if max_bytes is not None and (
            not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes <= 0
        ):
            raise InputError(f"disk_max_bytes must be a positive int or None, got {max_bytes!r}")
        self.directory = directory
        self.label = label
        self.marker_name = marker_name
        self.max_bytes = max_bytes
        self._errors = 0
        self._evictions = 0
        self._lock = threading.Lock()  # counters and the size estimate
        self._used: int | None = None  # estimate, (re)measured when pruning
        if create:
            self._adopt()

    @classmethod
    def open(
        cls,
        directory: Path,
        label: str,
        marker_name: str,
        max_bytes: int | None = None,
        *,
        create: bool = True,
        optional: bool = False,
    ) -> DiskTier | None:
        """A tier on ``directory``; with ``optional`` (the default location), None instead of
        an error when it cannot be created, so a read-only home never stops synthesis."""
        try:
            return cls(directory, label, marker_name, max_bytes, create=create)
        except OSError as exc:
            if optional:
                log.warning("%s: disk tier disabled, cannot create %s: %s", label, directory, exc)
                return None
            raise CacheError(
                f"cannot create the {label} directory {directory}: {exc}; pass a writable "
                "disk_dir, or disk_dir=None to disable the disk tier"
            ) from exc

    def _adopt(self) -> None:
        path = self.directory
        if path.is_dir():
            # An empty directory holds nothing to lose: the cache may adopt it.
            if not any(path.iterdir()):
                self._write_marker()
        else:
            path.mkdir(parents=True, exist_ok=True)
            self._write_marker()

    def _write_marker(self) -> None:
        marker = self.directory / self.marker_name
        if not marker.exists():
            marker.write_text(
                f"This directory is an onnx-tts {self.label}; `onnx-tts cache clear` empties it.\n"
            )

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}{SUFFIX}"

    def describe(self, key: str) -> str:
        return str(self._path(key))

    def _failed(self, message: str, *args: object) -> None:
        log.warning("%s: " + message, self.label, *args)
        with self._lock:
            self._errors += 1

    @property
    def max_entry_bytes(self) -> int:
        """The largest entry this tier reads (and stores)."""
        return min(self.max_bytes or MAX_ENTRY_BYTES, MAX_ENTRY_BYTES)

    def get(self, key: str) -> bytes | Unreadable | None:
        path = self._path(key)
        try:
            blob = read_regular_file(path, self.max_entry_bytes, root=self.directory)
        except FileNotFoundError:
            return None
        except RefusedFile as refused:
            return Unreadable(f"refused unread: {refused.what}")
        except OSError as exc:
            self._failed("cannot read %s: %s; recomputing", path, exc)
            return None
        with contextlib.suppress(OSError):
            os.utime(path, follow_symlinks=False)  # recency for the size bound's LRU
        return blob

    def put(self, key: str, entry: Entry) -> None:
        blob = entry.blob
        if len(blob) > self.max_entry_bytes:
            return  # larger than the whole tier
        path = self._path(key)
        sub = path.parent.name
        tmp_name = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Written and renamed inside the subdirectory's own descriptor: a subdirectory
            # that is a symbolic link (to somewhere outside the cache) is refused, never used.
            with directory_fd(self.directory, (sub,)) as parent:
                fd, tmp_name = _new_temp_file(parent)
                # No fsync: after a crash a torn file fails its checksum and is recomputed, so
                # durability is not worth a disk flush per new entry.
                with os.fdopen(fd, "wb") as handle:
                    handle.write(blob)
                os.replace(tmp_name, path.name, src_dir_fd=parent, dst_dir_fd=parent)
                tmp_name = None
            self._account(len(blob))
        except RefusedFile as refused:
            self._failed("cannot write %s: %s; entry not stored on disk", path, refused)
        except OSError as exc:
            self._failed("cannot write %s: %s; entry not stored on disk", path, exc)
        finally:
            if tmp_name is not None:
                unlink_below(self.directory, path.parent / tmp_name)

    def delete(self, key: str) -> None:
        # A file, FIFO or link itself (never a link's target, never a directory), and only
        # in a real subdirectory of the cache.
        unlink_below(self.directory, self._path(key))

    def stats(self) -> dict[str, Any]:
        with self._lock:
            errors, evictions = self._errors, self._evictions
        return {
            "enabled": True,
            "dir": str(self.directory),
            "errors": errors,
            "max_bytes": self.max_bytes,
            "evictions": evictions,
            **self._usage(),
        }

    def clear(self) -> int | None:
        if not self.directory.exists():
            return None
        if not (self.directory / self.marker_name).is_file():
            raise CacheError(
                f"refusing to clear {self.directory}: it has no {self.marker_name} file, so "
                "onnx-tts did not create it as a cache; check the path (or delete the "
                "files yourself)"
            )
        removed = 0
        with self._lock:
            for path in self._files():
                try:
                    path.unlink()
                    removed += path.name.endswith(SUFFIX)
                except OSError:
                    pass
            self._used = None
        return removed

    def close(self) -> None:
        pass  # no handle is kept open between calls

    # -- size bound ----------------------------------------------------------------------------

    def _account(self, added: int) -> None:
        if self.max_bytes is None:
            return
        with self._lock:
            if self._used is None:
                self._used = self._usage()["bytes"]
            else:
                self._used += added
            if self._used > self.max_bytes:
                self._prune()

    def _prune(self) -> None:
        """Remove least recently used files down to 90 % of the bound (caller holds lock)."""
        assert self.max_bytes is not None
        entries = []
        for path in self._files():
            if path.name.endswith(SUFFIX):
                try:
                    info = path.lstat()
                except OSError:
                    continue  # removed concurrently
                entries.append((info.st_mtime_ns, path.name, info.st_size, path))
        entries.sort()
        used = sum(entry[2] for entry in entries)
        target = self.max_bytes * 9 // 10
        for _, _, size, path in entries:
            if used <= target:
                break
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                self._evictions += 1
            used -= size
        self._used = used

    def _files(self) -> list[Path]:
        """Entries and temp files in the real two-letter subdirectories (a subdirectory that is
        a link to elsewhere is not ours: nothing there is counted, pruned or cleared)."""
        files = []
        try:
            subs = [e for e in os.scandir(self.directory) if e.is_dir(follow_symlinks=False)]
        except OSError:
            return files
        for sub in subs:
            if len(sub.name) != 2:
                continue
            with contextlib.suppress(OSError), os.scandir(sub.path) as entries:
                files.extend(
                    Path(e.path)
                    for e in entries
                    if e.name.endswith(SUFFIX) or e.name.startswith(_TMP_PREFIX)
                )
        return files

    def _usage(self) -> dict[str, int]:
        entries = 0
        used = 0
        for path in self._files():
            if path.name.endswith(SUFFIX):
                try:
                    used += path.lstat().st_size
                    entries += 1
                except OSError:
                    pass  # removed concurrently
        return {"entries": entries, "bytes": used}

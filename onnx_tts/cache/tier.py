"""The storage tier protocol: what :class:`onnx_tts.cache.tiered.TieredCache` needs from a tier.

A tier is one place entries live: process memory, a directory, a Redis server. Adding a kind
of storage is one module with one class that has these members; the composition does the
rest (lookup order, promotion, single flight, checking values, counting hits, misses and
rejected entries).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["Entry", "Tier", "Unreadable", "Value"]

Value = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class Entry:
    """What a tier is given to store: the value (read-only arrays viewing ``blob``) and its
    serialised form (:func:`onnx_tts.cache.codec.encode_value`, signed when the cache has a
    secret). A shared tier stores the blob, an in-process one the value."""

    value: Value
    blob: bytes


@dataclass(frozen=True)
class Unreadable:
    """What a shared tier's ``get`` returns for an entry it refuses to read (not a regular
    file, larger than any entry): the composition drops it and counts it like a corrupt one."""

    reason: str


@runtime_checkable
class Tier(Protocol):
    """One storage tier. Methods never raise for trouble in the storage itself (a full disk, a
    dead server): they log it, count it in ``stats()["errors"]`` and act as a miss."""

    #: Its name in stats, logs and ``clear(tiers=...)``: "memory", "disk", "redis", ...
    name: str
    #: True: holds blobs that other processes may have written (get returns bytes, which the
    #: composition verifies and decodes). False: holds this process's values (get returns them).
    shared: bool

    def get(self, key: str) -> bytes | Value | Unreadable | None:
        """The stored blob (shared) or value (not shared) of ``key``, None when there is none,
        or Unreadable when what is stored there is refused unread."""
        ...

    def put(self, key: str, entry: Entry) -> None:
        """Store ``entry`` under ``key`` (or not: a tier may decline, e.g. an entry too big)."""
        ...

    def delete(self, key: str) -> None:
        """Remove ``key`` if present (a bad entry found by the composition)."""
        ...

    def describe(self, key: str) -> str:
        """Where ``key``'s entry lives, for log lines (a path, a Redis key)."""
        ...

    def stats(self) -> dict[str, Any]:
        """At least ``enabled``, ``entries``, ``bytes``, ``evictions`` and ``errors`` (None
        when unknown, e.g. a Redis that cannot be reached)."""
        ...

    def clear(self) -> int | None:
        """Remove every entry; the number removed, or None when there was no store to clear
        (e.g. a directory that does not exist)."""
        ...

    def close(self) -> None:
        """Release connections or handles; the tier is not used afterwards."""
        ...

"""In-process tier: values kept as read-only arrays, bounded in (serialised) bytes.

Two eviction policies: ``"lru"`` (least recently used) and ``"lfu"`` (least frequently used,
frequencies halved every 1,000 lookups so that yesterday's popular entries cannot squat forever;
ties go to the least recently used). On the Zipf(1.1) workload of benchmarks/bench_cache.py LFU
keeps more hits than LRU when the budget is tight.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from onnx_tts.cache.tier import Entry, Value
from onnx_tts.errors import InputError

__all__ = ["MEMORY_POLICIES", "MemoryTier"]

MEMORY_POLICIES = ("lru", "lfu")
# Every this many lookups all frequencies are halved; frequencies of keys not in memory are
# kept for at most this many keys (a bound on the bookkeeping, whatever the traffic).
_LFU_AGING_PERIOD = 1000
_LFU_MAX_TRACKED = 1 << 16


class MemoryTier:
    """Entries of this process, at most ``max_bytes`` of them (counted as their blob sizes)."""

    name = "memory"
    shared = False

    def __init__(self, max_bytes: int, policy: str = "lru") -> None:
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 0:
            raise InputError(f"memory_bytes must be an int >= 0 (0 disables), got {max_bytes!r}")
        if policy not in MEMORY_POLICIES:
            raise InputError(f"memory policy must be one of {MEMORY_POLICIES}, got {policy!r}")
        self.max_bytes = max_bytes
        self.policy = policy
        # Least recently used first; value and its size.
        self._entries: OrderedDict[str, tuple[Value, int]] = OrderedDict()
        self._used = 0
        self._evictions = 0
        self._frequency: dict[str, int] = {}  # lfu only
        self._lookups = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> Value | None:
        with self._lock:
            if self.policy == "lfu":
                self._count_lookup(key)
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def keys(self) -> list[str]:
        """The keys held, least recently used first."""
        with self._lock:
            return list(self._entries)

    def put(self, key: str, entry: Entry) -> None:
        size = len(entry.blob)
        if size > self.max_bytes:
            return  # larger than the whole tier (or the tier is disabled)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._used -= old[1]
            self._entries[key] = (entry.value, size)
            self._used += size
            while self._used > self.max_bytes:
                _, evicted = self._entries.pop(self._victim(key))
                self._used -= evicted
                self._evictions += 1

    def delete(self, key: str) -> None:
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._used -= old[1]

    def describe(self, key: str) -> str:
        return key

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "enabled": self.max_bytes > 0,
                "entries": len(self._entries),
                "bytes": self._used,
                "max_bytes": self.max_bytes,
                "evictions": self._evictions,
                "errors": 0,
            }

    def clear(self) -> int:
        with self._lock:
            removed = len(self._entries)
            self._entries.clear()
            self._used = 0
            self._frequency.clear()
            return removed

    def close(self) -> None:
        self.clear()

    # -- eviction (callers hold the lock) ------------------------------------------------------

    def _victim(self, newcomer: str) -> str:
        """The entry to evict: the least recently used one, or under "lfu" the least
        frequently used (the least recently used among equals); never the newcomer."""
        if self.policy == "lru":
            return next(iter(self._entries))
        frequency = self._frequency
        # The OrderedDict runs from least to most recently used, and min() keeps the first of
        # equals. O(entries) per eviction: entries are whole utterances, so a few thousand.
        return min((k for k in self._entries if k != newcomer), key=lambda k: frequency.get(k, 0))

    def _count_lookup(self, key: str) -> None:
        self._frequency[key] = self._frequency.get(key, 0) + 1
        self._lookups += 1
        if self._lookups % _LFU_AGING_PERIOD == 0 or len(self._frequency) > _LFU_MAX_TRACKED:
            self._frequency = {k: f // 2 for k, f in self._frequency.items() if f > 1}

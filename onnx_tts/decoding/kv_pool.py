"""KV caches for decode loops: the mode decision (made once per model, from its graph I/O) and a
pool that reuses caches across requests with a bounded capacity and a bounded idle set."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from onnx_tts.errors import InputError
from onnx_tts.graph_io import KVLayout
from onnx_tts.session import KV_MODES, KVCache, Session

# In-place buffers of a model without a fixed capacity are sized in powers of two from this,
# so a pool holds few distinct sizes.
MIN_GROWN_CAPACITY = 1024
# Idle caches kept per (batch, capacity) after their request ended; more are freed at once.
DEFAULT_MAX_IDLE = 4


def resolve_kv_mode(requested: str | None, layout: KVLayout, default: str | None = None) -> str:
    """The KV mode to run `layout` with: the request, else the model's default, else in place
    when the graph allows it and chain otherwise. Raises InputError for an unknown mode or
    for in place on a graph whose attention grows its cache by Concat."""
    mode = requested or default or ("inplace" if layout.in_place else "chain")
    if mode not in KV_MODES:
        raise InputError(f"unknown KV mode {mode!r}; choose one of {', '.join(KV_MODES)}")
    if mode == "inplace" and not layout.in_place:
        raise InputError(
            "KV mode 'inplace' needs an LM whose attention writes the cache in place "
            "(GroupQueryAttention); this one grows its cache by Concat: use --kv chain, or "
            "convert it once with `onnx-tts convert --inplace-kv MODEL_DIR NEW_DIR`"
        )
    return mode


@dataclass(frozen=True)
class CapacityPolicy:
    """How many tokens an in-place cache holds: `fixed` (the bundle's kv.capacity), or grown
    to fit each request up to `limit` (the model's position limit)."""

    fixed: int | None
    limit: int

    def capacity_for(self, needed: int) -> int:
        if needed > self.limit or (self.fixed is not None and needed > self.fixed):
            raise InputError(
                f"this text chunk needs {needed} KV positions but the model holds at most "
                f"{self.fixed or self.limit}; split the text into shorter sentences (or use a "
                "shorter reference clip)"
            )
        if self.fixed is not None:
            return self.fixed
        return min(self.limit, max(MIN_GROWN_CAPACITY, 1 << (max(needed, 1) - 1).bit_length()))


class KVPool:
    """Reuses the KV caches of one LM session: in-place buffers are allocated once and handed
    from request to request; at most `max_idle` idle caches of each shape are kept."""

    def __init__(
        self,
        session: Session,
        layout: KVLayout,
        mode: str,
        capacity: CapacityPolicy,
        max_idle: int = DEFAULT_MAX_IDLE,
    ) -> None:
        self.session, self.layout, self.mode = session, layout, mode
        self.capacity = capacity
        self.max_idle = max_idle
        self._idle: dict[tuple[int, int | None], list[KVCache]] = {}
        self._lock = threading.Lock()

    def acquire(self, needed: int, batch: int = 1) -> KVCache:
        """A reset cache for `batch` rows that can take `needed` more tokens."""
        size = self.capacity.capacity_for(needed) if self.mode == "inplace" else None
        with self._lock:
            idle = self._idle.get((batch, size))
            if idle:
                return idle.pop()
        return KVCache(self.session, self.mode, batch_size=batch, capacity=size)

    def release(self, cache: KVCache) -> None:
        cache.reset()
        key = (cache.batch_size, cache.capacity)
        with self._lock:
            idle = self._idle.setdefault(key, [])
            if len(idle) < self.max_idle:
                idle.append(cache)

    def idle_count(self) -> int:
        with self._lock:
            return sum(len(caches) for caches in self._idle.values())


__all__ = ["CapacityPolicy", "KVPool", "resolve_kv_mode"]

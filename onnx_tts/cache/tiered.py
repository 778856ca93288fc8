"""The tiered composition: lookup through tiers, promotion, single flight, checks, counters.

Tiers (:class:`onnx_tts.cache.tier.Tier`) are looked up in order, fastest first; a hit in a
lower tier is copied into the tiers above it. Concurrent requests for one key that misses every
tier run ``compute`` once per process; the others wait for it ("merged" in the stats).

Every value read from a tier is checked before it is served: a blob from a shared tier (disk,
Redis) is verified (checksum, key, signature with a secret) and decoded by
:mod:`onnx_tts.cache.codec`, and every value, from any tier, must fit the cache's
:class:`onnx_tts.cache.schema.Schema`. A bad entry is dropped from that tier, counted
(``rejected``, and ``corrupt`` when its bytes are not a valid entry), logged once as a warning,
and the lookup goes on as a miss: it is recomputed, never served, never an error.
Values offered to the cache (computed or ``put``) are checked the same way and refused with an
error. Values are dicts of read-only numpy arrays; copy them before writing.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from onnx_tts.cache.codec import CorruptEntry, decode_entry, encode_value
from onnx_tts.cache.schema import Schema
from onnx_tts.cache.tier import Entry, Tier, Unreadable, Value
from onnx_tts.errors import CacheError, InputError

__all__ = ["TieredCache", "check_key"]

log = logging.getLogger(__name__)

_KEY_PATTERN = re.compile(r"^[0-9a-f]{64}$")
# Bad entries already reported (tier, key, reason): a bad entry that cannot be removed (a
# read-only directory) is reported once, not on every request.
_MAX_WARNED = 4096


def check_key(key: str) -> None:
    """InputError unless ``key`` is 64 lowercase hex characters (a sha256)."""
    if not isinstance(key, str) or not _KEY_PATTERN.match(key):
        raise InputError(
            f"cache key must be 64 lowercase hex characters (use make_key), got {key!r}"
        )


@dataclass
class _Flight:
    """One in-progress lookup/compute that concurrent requests for the same key join."""

    done: threading.Event = field(default_factory=threading.Event)
    value: Value | None = None
    error: BaseException | None = None


@dataclass
class _Counters:
    requests: int = 0
    misses: int = 0
    merged: int = 0
    compute_errors: int = 0
    compute_seconds: float = 0.0


@dataclass
class _TierCounters:
    hits: int = 0
    misses: int = 0
    rejected: int = 0  # entries dropped on read, for any reason
    corrupt: int = 0  # of those, entries whose bytes were not a valid entry for their key


class TieredCache:
    """A cache of dicts of numeric arrays over ``tiers`` (fastest first).

    Args:
        tiers: the storage tiers; names must be unique.
        label: the cache's name in log lines and errors.
        schema: what a value may hold (default: any numeric arrays, finite, bounded).
        secret: HMAC key for entries of shared tiers (see :mod:`onnx_tts.cache.codec`); with
            it, unsigned or mis-signed entries are rejected.
    """

    def __init__(
        self,
        tiers: Sequence[Tier],
        *,
        label: str = "cache",
        schema: Schema | None = None,
        secret: bytes | None = None,
    ) -> None:
        names = [tier.name for tier in tiers]
        if len(set(names)) != len(names):
            raise InputError(f"tier names must be unique, got {names}")
        self._tiers = tuple(tiers)
        # An in-process first tier is read under the lock, so that a miss there and a flight
        # that just finished cannot both compute.
        self._first = self._tiers[0] if self._tiers and not self._tiers[0].shared else None
        self._lower = range(1 if self._first is not None else 0, len(self._tiers))
        self.label = label
        self.schema = schema if schema is not None else Schema()
        self._secret = secret
        self._lock = threading.Lock()
        self._flights: dict[str, _Flight] = {}
        self._counters = _Counters()
        self._tier_counters = {name: _TierCounters() for name in names}
        self._warned: OrderedDict[tuple[str, str, str], None] = OrderedDict()

    @property
    def tiers(self) -> tuple[Tier, ...]:
        return self._tiers

    def tier(self, name: str) -> Tier | None:
        """The tier called ``name``, or None when this cache has none (e.g. disabled)."""
        return next((tier for tier in self._tiers if tier.name == name), None)

    # -- reading -------------------------------------------------------------------------------

    def get(self, key: str, schema: Schema | None = None) -> dict[str, np.ndarray] | None:
        """Look ``key`` up in every tier without computing, counting or promoting."""
        check_key(key)
        schema = schema or self.schema
        for index in range(len(self._tiers)):
            found = self._read(index, key, schema, counted=False)
            if found is not None:
                return dict(found[0])
        return None

    def lookup(self, key: str, schema: Schema | None = None) -> dict[str, np.ndarray] | None:
        """Like :meth:`get`, but counted in the stats as a request (hit or miss), and a hit in
        a lower tier is copied into the tiers above it. A miss computes nothing; store the
        value with :meth:`put`."""
        check_key(key)
        schema = schema or self.schema
        with self._lock:
            self._counters.requests += 1
        for index in range(len(self._tiers)):
            found = self._read(index, key, schema, counted=True)
            if found is not None:
                self._promote(key, *found, index)
                return dict(found[0])
        with self._lock:
            self._counters.misses += 1
        return None

    def memory_lookup(self, key: str, schema: Schema | None = None) -> dict[str, np.ndarray] | None:
        """The in-process first tier's value of ``key`` (counted as a request and a hit), or
        None without counting."""
        if self._first is None:
            return None
        item = self._first.get(key)
        if item is None:
            return None
        value = self._accept(0, key, item, schema or self.schema)
        if value is None:
            return None
        with self._lock:
            self._counters.requests += 1
            self._tier_counters[self._first.name].hits += 1
        return dict(value)

    def get_or_compute(
        self,
        key: str,
        compute: Callable[[], Mapping[str, np.ndarray]],
        schema: Schema | None = None,
    ) -> dict[str, np.ndarray]:
        """Return the cached value of ``key``, running ``compute()`` once if no tier has it.

        Concurrent callers with the same key share one lookup and one compute; if it raises,
        they all get the exception and nothing is stored. ``schema`` overrides the cache's
        (e.g. the outputs of the encoder that made the key).
        """
        check_key(key)
        schema = schema or self.schema
        first = self._first
        with self._lock:
            self._counters.requests += 1
            item = first.get(key) if first is not None else None
            if item is None:
                if first is not None:
                    self._tier_counters[first.name].misses += 1
                flight, leader = self._join(key)
        if item is not None:
            # Checked outside the lock: it reads every value of the arrays.
            value = self._accept(0, key, item, schema)
            if value is not None:
                with self._lock:
                    self._tier_counters[first.name].hits += 1
                return dict(value)
            with self._lock:  # a bad entry was dropped: on as a miss
                self._tier_counters[first.name].misses += 1
                flight, leader = self._join(key)

        if not leader:
            flight.done.wait()
            if flight.error is not None:
                raise flight.error
            assert flight.value is not None
            return dict(flight.value)
        try:
            flight.value = self._lead(key, compute, schema)
            return dict(flight.value)
        except BaseException as exc:
            flight.error = exc
            with self._lock:
                self._counters.compute_errors += 1
            raise
        finally:
            with self._lock:
                del self._flights[key]
            flight.done.set()

    # -- writing -------------------------------------------------------------------------------

    def put(self, key: str, arrays: Mapping[str, np.ndarray], schema: Schema | None = None) -> None:
        """Store a value computed outside :meth:`get_or_compute` in every tier; a value that
        does not fit the schema is refused (see :meth:`_unstorable`) and nothing is stored."""
        check_key(key)
        entry = self._entry(key, arrays, schema or self.schema)
        for tier in self._tiers:
            tier.put(key, entry)

    def _unstorable(self, problem: str) -> Exception:
        """The error for a value offered to the cache that does not fit its schema."""
        return CacheError(f"{self.label}: refusing to store this value: {problem}")

    # -- stats and maintenance -----------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters (per process) and tier contents.

        ``requests = hits + misses + merged + compute_errors`` (``merged``: requests that
        joined another's in-flight lookup; ``compute_errors``: failed lookups/computes, whose
        joiners get the same exception); ``hits`` is the sum over tiers. Per tier: ``hits``,
        ``misses`` (looked there, not found), ``rejected`` (bad entries dropped on read),
        ``corrupt`` (those whose bytes were not a valid entry), ``errors`` (storage failures),
        ``entries``/``bytes`` (disk and Redis measured on the spot, so they include other
        processes' entries), ``evictions``. Top-level ``entries``/``bytes`` are those of the
        largest tier; ``tiers`` lists the enabled ones.
        """
        with self._lock:
            counters = _Counters(**vars(self._counters))
            per_tier = {name: _TierCounters(**vars(c)) for name, c in self._tier_counters.items()}
        hits = sum(c.hits for c in per_tier.values())
        result: dict[str, Any] = {
            "requests": counters.requests,
            "hits": hits,
            "misses": counters.misses,
            "merged": counters.merged,
            "hit_rate": (hits + counters.merged) / counters.requests if counters.requests else 0.0,
            "compute_errors": counters.compute_errors,
            "compute_seconds": round(counters.compute_seconds, 6),
        }
        tiers = self._tier_stats(per_tier)
        result.update(tiers)
        enabled = [name for name, info in tiers.items() if info["enabled"]]
        result["tiers"] = enabled
        # Whole-cache size: the largest tier (each lower tier holds what the upper ones hold,
        # give or take evictions), so an operator reads one number per cache.
        sizes = [result[t] for t in enabled if result[t]["entries"] is not None]
        result["entries"] = max((t["entries"] for t in sizes), default=0)
        result["bytes"] = max((t["bytes"] for t in sizes), default=0)
        return result

    def _tier_stats(self, counters: Mapping[str, _TierCounters]) -> dict[str, dict[str, Any]]:
        """Each tier's stats and counters, by name in lookup order."""
        return {tier.name: {**tier.stats(), **vars(counters[tier.name])} for tier in self._tiers}

    def clear(self, tiers: Iterable[str] | None = None) -> dict[str, int]:
        """Remove every entry from the named tiers (default: all); the number removed per tier.
        Counters are kept; in-flight computes are not interrupted."""
        known = self._tier_names()
        chosen = known if tiers is None else tuple(tiers)
        unknown = [name for name in chosen if name not in known]
        if unknown:
            raise InputError(f"unknown cache tier(s) {unknown}; choose from {list(known)}")
        removed: dict[str, int] = {}
        for tier in self._tiers:
            if tier.name in chosen:
                count = tier.clear()
                if count is not None:
                    removed[tier.name] = count
        return removed

    def _tier_names(self) -> tuple[str, ...]:
        """Names ``clear`` accepts (a typed cache adds its disabled standard tiers)."""
        return tuple(tier.name for tier in self._tiers)

    def close(self) -> None:
        for tier in self._tiers:
            tier.close()

    # -- internals -----------------------------------------------------------------------------

    def _join(self, key: str) -> tuple[_Flight, bool]:
        """(flight, leader): join the flight of ``key`` or start it (caller holds the lock)."""
        flight = self._flights.get(key)
        if flight is None:
            flight = self._flights[key] = _Flight()
            return flight, True
        self._counters.merged += 1
        return flight, False

    def _lead(
        self, key: str, compute: Callable[[], Mapping[str, np.ndarray]], schema: Schema
    ) -> Value:
        for index in self._lower:
            found = self._read(index, key, schema, counted=True)
            if found is not None:
                self._promote(key, *found, index)
                return found[0]
        started = time.perf_counter()
        arrays = compute()
        elapsed = time.perf_counter() - started
        # Hand out exactly what a later hit would return: read-only views of the blob.
        entry = self._entry(key, arrays, schema)
        with self._lock:
            self._counters.misses += 1
            self._counters.compute_seconds += elapsed
        for tier in self._tiers:
            tier.put(key, entry)
        return entry.value

    def _entry(self, key: str, arrays: Mapping[str, np.ndarray], schema: Schema) -> Entry:
        blob = encode_value(key, arrays, self._secret)
        value = decode_entry(blob, key, self._secret)
        problem = schema.problem(value)
        if problem is not None:
            raise self._unstorable(problem)
        return Entry(value, blob)

    def _read(
        self, index: int, key: str, schema: Schema, *, counted: bool
    ) -> tuple[Value, bytes | None] | None:
        """(value, blob) of ``key`` in tier ``index`` if present and valid, else None."""
        tier = self._tiers[index]
        item = tier.get(key)
        value = None if item is None else self._accept(index, key, item, schema)
        if counted:
            with self._lock:
                counters = self._tier_counters[tier.name]
                if value is None:
                    counters.misses += 1
                else:
                    counters.hits += 1
        if value is None:
            return None
        return value, item if tier.shared else None

    def _accept(
        self, index: int, key: str, item: bytes | Value | Unreadable, schema: Schema
    ) -> Value | None:
        """The value of a tier's ``item`` if it is valid, else None (the entry is dropped)."""
        tier = self._tiers[index]
        if isinstance(item, Unreadable):
            self._drop(tier, key, item.reason, corrupt=True)
            return None
        try:
            value = decode_entry(item, key, self._secret) if tier.shared else item
        except CorruptEntry as exc:
            self._drop(tier, key, str(exc), corrupt=True)
            return None
        problem = schema.problem(value)
        if problem is not None:
            self._drop(tier, key, problem, corrupt=False)
            return None
        return value

    def _drop(self, tier: Tier, key: str, why: str, *, corrupt: bool) -> None:
        tier.delete(key)
        with self._lock:
            counters = self._tier_counters[tier.name]
            counters.rejected += 1
            counters.corrupt += corrupt
            seen = (tier.name, key, why)
            first_time = seen not in self._warned
            self._warned[seen] = None
            if len(self._warned) > _MAX_WARNED:
                self._warned.popitem(last=False)
        (log.warning if first_time else log.debug)(
            "%s: %s %s entry %s (%s); removed, recomputing",
            self.label,
            "corrupt" if corrupt else "rejected",
            tier.name,
            tier.describe(key),
            why,
        )

    def _promote(self, key: str, value: Value, blob: bytes | None, index: int) -> None:
        """Copy a hit in tier ``index`` into the tiers above it."""
        if index == 0:
            return
        if blob is None:  # found in an in-process tier below a shared one
            blob = encode_value(key, value, self._secret)
        entry = Entry(value, blob)
        for tier in self._tiers[:index]:
            tier.put(key, entry)

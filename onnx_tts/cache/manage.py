"""Maintenance of the caches' shared tiers: ``onnx-tts cache stats [--json]`` and
``onnx-tts cache clear [--tier reference|result|prefix]``.

A maintenance process opens each cache read-only (no memory tier, no directory created); hit
counters live in each serving process (its ``Engine.cache_stats()`` and ``/metrics``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from onnx_tts.cache.prefix import PrefixCache
from onnx_tts.cache.reference import ReferenceCache
from onnx_tts.cache.result import ResultCache
from onnx_tts.cache.typed import TIERS, TypedCache
from onnx_tts.errors import InputError

__all__ = ["CACHES", "all_cache_stats", "clear_caches", "format_stats"]

CACHES = ("reference", "result", "prefix")

PathLike = str | os.PathLike[str] | None


def _maintenance_caches(
    reference_dir: PathLike, result_dir: PathLike, redis_url: str | None
) -> dict[str, TypedCache]:
    def shared_tiers(kind: type[TypedCache], directory: PathLike) -> TypedCache:
        return kind(memory_bytes=0, disk_dir=directory, redis_url=redis_url, create_disk_dir=False)

    return {
        "reference": shared_tiers(ReferenceCache, reference_dir),
        "result": shared_tiers(ResultCache, result_dir),
        # Memory only: its entries live (and are counted) in each serving process.
        "prefix": PrefixCache(memory_bytes=0),
    }


def all_cache_stats(
    reference_dir: PathLike = "default",
    result_dir: PathLike = "default",
    redis_url: str | None = None,
) -> dict[str, dict]:
    """``{"reference": ..., "result": ..., "prefix": ...}``: the shared tiers of every cache,
    for ``onnx-tts cache stats``; creates nothing on disk. (Hit counters, and the prefix
    cache's entries, live in each serving process: see its /metrics.)"""
    caches = _maintenance_caches(reference_dir, result_dir, redis_url)
    return {name: cache.stats() for name, cache in caches.items()}


def clear_caches(
    which: str | None = None,
    reference_dir: PathLike = "default",
    result_dir: PathLike = "default",
    redis_url: str | None = None,
) -> dict[str, dict[str, int]]:
    """Empty the disk and Redis tiers of one cache (``which``: "reference", "result" or
    "prefix", which has none: it empties with its process) or of all of them, for ``onnx-tts
    cache clear [--tier ...]``; entries removed per cache and tier. A disk directory without
    the cache's marker file is refused (CacheError)."""
    if which is not None and which not in CACHES:
        raise InputError(f"unknown cache {which!r}; choose from {', '.join(CACHES)}")
    caches = _maintenance_caches(reference_dir, result_dir, redis_url)
    chosen = CACHES if which is None else (which,)
    return {name: caches[name].clear(tiers=("disk", "redis")) for name in chosen}


def _human_bytes(value: int | None) -> str:
    if value is None:
        return "?"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


def format_stats(stats: Mapping) -> str:
    """A short human-readable table of one cache's ``stats()`` (for ``cache stats``)."""
    lines = [
        f"requests {stats['requests']}  hits {stats['hits']}  misses {stats['misses']}  "
        f"merged {stats['merged']}  hit rate {100 * stats['hit_rate']:.1f}%",
        f"{'tier':<8}{'enabled':>9}{'hits':>8}{'entries':>9}{'bytes':>12}{'evictions':>11}"
        f"{'corrupt':>9}{'rejected':>10}{'errors':>8}  location",
    ]
    extra = [name for name in stats.get("tiers", ()) if name not in TIERS]
    for tier in (*(name for name in TIERS if name in stats), *extra):
        info = stats[tier]
        location = info.get("dir") or info.get("url") or ""
        if info.get("max_bytes") is not None:
            location = f"{location} (max {_human_bytes(info['max_bytes'])})".strip()
        lines.append(
            f"{tier:<8}{'yes' if info['enabled'] else 'no':>9}{info['hits']:>8}"
            f"{'?' if info['entries'] is None else info['entries']:>9}"
            f"{_human_bytes(info['bytes']):>12}{_or_dash(info['evictions']):>11}"
            f"{info.get('corrupt', 0):>9}{info.get('rejected', 0):>10}"
            f"{_or_dash(info.get('errors', 0)):>8}  {location or '-'}"
        )
    return "\n".join(lines)

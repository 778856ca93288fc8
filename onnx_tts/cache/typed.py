"""The standard memory / disk / Redis stack that the typed caches (reference, result, prefix)
build from their constructor arguments, and the stats every one of them reports.

A typed cache is a subclass that says what it stores through class attributes (log label,
Redis key segment, marker file, directory name, memory policy) and passes its schema.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from onnx_tts.cache.disk import DiskTier, cache_root
from onnx_tts.cache.memory import MemoryTier
from onnx_tts.cache.redis import RedisTier
from onnx_tts.cache.schema import Schema
from onnx_tts.cache.tier import Tier
from onnx_tts.cache.tiered import TieredCache
from onnx_tts.errors import InputError

__all__ = ["DEFAULT_MEMORY_BYTES", "TIERS", "TypedCache"]

DEFAULT_MEMORY_BYTES = 256 * 1024 * 1024
TIERS = ("memory", "disk", "redis")

# What stats() says of a standard tier this cache does not use.
_DISABLED: dict[str, dict[str, Any]] = {
    "memory": {"max_bytes": 0, "evictions": 0},
    "disk": {"dir": None, "max_bytes": None, "evictions": 0},
    "redis": {"url": None, "evictions": None},
}


class TypedCache(TieredCache):
    """Memory / disk / Redis cache of one kind of value.

    Args:
        memory_bytes: bound of the in-process tier, counted in serialised bytes; 0 disables it.
            Evicts by the class's ``memory_policy`` (see :mod:`onnx_tts.cache.memory`).
        disk_dir: directory of the disk tier. ``"default"`` is ``~/.cache/onnx-tts/<dir_name>``
            (or under ``$XDG_CACHE_HOME``; a default that cannot be created only disables the
            tier); ``None`` disables the tier.
        redis_url: ``redis://host:port/db`` (or ``unix://``) of a shared Redis; ``None``
            disables the tier.
        namespace: prefix of the Redis keys, so that several deployments can share a server.
        redis_ttl_seconds: expiry of Redis entries; ``None`` keeps them until evicted.
        disk_max_bytes: bound of the disk tier (least recently used files removed past it);
            ``None``: unbounded.
        create_disk_dir: create the directory (and its marker) if missing; False for
            read-only uses such as ``cache stats``, which must not create directories.
        secret: HMAC key of the disk and Redis entries (``cache_secret``); None: unsigned.
        schema: what a value may hold; default: the class's.
    """

    label = "cache"  # in log lines and errors
    redis_segment = "cache"  # Redis keys are <namespace>:<segment>:<key>
    marker_name = ".onnx-tts-cache"
    dir_name = "cache"
    memory_policy = "lru"
    value_schema = Schema()

    def __init__(
        self,
        memory_bytes: int = DEFAULT_MEMORY_BYTES,
        disk_dir: str | os.PathLike[str] | None = "default",
        redis_url: str | None = None,
        namespace: str = "onnx-tts",
        redis_ttl_seconds: int | None = None,
        disk_max_bytes: int | None = None,
        *,
        create_disk_dir: bool = True,
        secret: bytes | None = None,
        schema: Schema | None = None,
    ) -> None:
        if secret is not None and not isinstance(secret, bytes):
            raise InputError("secret must be bytes (see onnx_tts.cache.codec.resolve_cache_secret)")
        tiers: list[Tier] = []
        memory = MemoryTier(memory_bytes, self.memory_policy)
        if memory_bytes:
            tiers.append(memory)
        if disk_dir is not None:
            use_default = isinstance(disk_dir, str) and disk_dir == "default"
            path = self.default_dir() if use_default else Path(disk_dir).expanduser()
            disk = DiskTier.open(
                path,
                self.label,
                self.marker_name,
                disk_max_bytes,
                create=create_disk_dir,
                optional=use_default,
            )
            if disk is not None:
                tiers.append(disk)
        if redis_url is not None:
            tiers.append(
                RedisTier(redis_url, self.label, self.redis_segment, namespace, redis_ttl_seconds)
            )
        super().__init__(tiers, label=self.label, schema=schema or self.value_schema, secret=secret)

    @classmethod
    def default_dir(cls) -> Path:
        """``$XDG_CACHE_HOME/onnx-tts/<dir_name>``, or ``~/.cache/onnx-tts/<dir_name>``."""
        return cache_root() / cls.dir_name

    @property
    def disk_dir(self) -> Path | None:
        """Directory of the disk tier, or ``None`` when it is disabled."""
        disk = self.tier("disk")
        return disk.directory if isinstance(disk, DiskTier) else None

    @property
    def memory_bytes(self) -> int:
        """Bound of the memory tier (0: disabled)."""
        memory = self.tier("memory")
        return memory.max_bytes if isinstance(memory, MemoryTier) else 0

    def _tier_stats(self, counters: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """Every standard tier, in lookup order (``enabled`` False for the ones this cache does
        not use), then any other."""
        used = super()._tier_stats(counters)
        disabled = {"enabled": False, "hits": 0, "misses": 0, "rejected": 0, "corrupt": 0}
        disabled.update(errors=0, entries=0, bytes=0)
        standard = {
            name: used.get(name, {**disabled, **extra}) for name, extra in _DISABLED.items()
        }
        return {**standard, **used}

    def _tier_names(self) -> tuple[str, ...]:
        return (*TIERS, *(name for name in super()._tier_names() if name not in TIERS))

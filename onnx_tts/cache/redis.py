"""Redis tier (optional): the same blobs as the disk tier, shared by several servers.

Keys are ``<namespace>:<segment>:<key>`` so that several caches and deployments can share one
server; entries may expire after a TTL. A Redis that fails (down, slow, wrong type under a
key) is logged and counted, and the tier is skipped for 30 s: it costs one timeout per
interval, never a failed request.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.parse
from typing import Any

from onnx_tts.cache.tier import Entry
from onnx_tts.errors import CacheError, InputError

__all__ = ["RedisTier", "redact_url"]

log = logging.getLogger(__name__)

# After a failure the tier is skipped for this long, so that a dead server costs one connect
# timeout per interval instead of one per request.
RETRY_SECONDS = 30.0
_SCAN_BATCH = 500


def redact_url(url: str | None) -> str | None:
    """The URL without its password, for logs and stats."""
    if url is None:
        return None
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urllib.parse.urlunsplit(parts._replace(netloc=user + netloc))


class RedisTier:
    """Entries in a Redis server.

    Args:
        url: ``redis://host:port/db`` (or ``unix://``).
        label: the cache's name in log lines.
        segment: the cache's part of the keys ("refcache", "resultcache").
        namespace: prefix of the keys, so that several deployments can share a server.
        ttl_seconds: expiry of the entries; None keeps them until Redis evicts them.
    """

    name = "redis"
    shared = True

    def __init__(
        self,
        url: str,
        label: str,
        segment: str,
        namespace: str = "onnx-tts",
        ttl_seconds: int | None = None,
    ) -> None:
        if ttl_seconds is not None and (
            not isinstance(ttl_seconds, int) or isinstance(ttl_seconds, bool) or ttl_seconds <= 0
        ):
            raise InputError(
                f"redis_ttl_seconds must be a positive int or None, got {ttl_seconds!r}"
            )
        if not namespace or not isinstance(namespace, str):
            raise InputError("namespace must be a non-empty string")
        try:
            import redis
        except ImportError as exc:
            raise CacheError(
                "redis_url was given but the 'redis' package is not installed; "
                "pip install redis, or leave redis_url unset"
            ) from exc
        try:
            # Short timeouts: a slow or dead Redis must cost little and is then skipped.
            self._client = redis.Redis.from_url(url, socket_connect_timeout=1.0, socket_timeout=2.0)
        except ValueError as exc:
            raise CacheError(
                f"invalid redis_url {redact_url(url)!r}: {exc}; expected e.g. "
                "redis://127.0.0.1:6379/0 or unix:///path/to/redis.sock"
            ) from exc
        self._errors_type = redis.RedisError
        self.url = url
        self.label = label
        self._prefix = f"{namespace}:{segment}:"
        self.ttl_seconds = ttl_seconds
        self._down_until = 0.0
        self._errors = 0
        self._lock = threading.Lock()

    def _key(self, key: str) -> str:
        return self._prefix + key

    def describe(self, key: str) -> str:
        return self._key(key)

    def _available(self) -> bool:
        return time.monotonic() >= self._down_until

    def _failed(self, action: str, exc: Exception) -> None:
        log.warning(
            "%s: redis %s failed (%s: %s); skipping the redis tier for %.0f s",
            self.label,
            action,
            type(exc).__name__,
            exc,
            RETRY_SECONDS,
        )
        with self._lock:
            self._errors += 1
        self._down_until = time.monotonic() + RETRY_SECONDS

    def get(self, key: str) -> bytes | None:
        if not self._available():
            return None
        try:
            blob = self._client.get(self._key(key))
        except self._errors_type as exc:
            self._failed("get", exc)
            return None
        return None if blob is None else bytes(blob)

    def put(self, key: str, entry: Entry) -> None:
        if not self._available():
            return
        try:
            self._client.set(self._key(key), entry.blob, ex=self.ttl_seconds)
        except self._errors_type as exc:
            self._failed("set", exc)

    def delete(self, key: str) -> None:
        try:
            self._client.delete(self._key(key))
        except self._errors_type as exc:
            self._failed("delete", exc)

    def _scan(self) -> list[bytes]:
        return list(self._client.scan_iter(match=self._prefix + "*", count=_SCAN_BATCH))

    def stats(self) -> dict[str, Any]:
        with self._lock:
            errors = self._errors
        usage: dict[str, int | None]
        try:
            keys = self._scan()
            pipe = self._client.pipeline(transaction=False)
            for rkey in keys:
                pipe.strlen(rkey)
            sizes = pipe.execute() if keys else []
            usage = {"entries": len(keys), "bytes": int(sum(sizes))}
        except self._errors_type as exc:
            log.warning("%s: redis stats failed: %s", self.label, exc)
            usage = {"entries": None, "bytes": None}
        return {
            "enabled": True,
            "url": redact_url(self.url),
            "errors": errors,
            "evictions": None,  # Redis evicts by its own maxmemory policy; not visible here
            **usage,
        }

    def clear(self) -> int:
        try:
            keys = self._scan()
            for start in range(0, len(keys), _SCAN_BATCH):
                self._client.delete(*keys[start : start + _SCAN_BATCH])
        except self._errors_type as exc:
            raise CacheError(
                f"cannot clear the redis tier at {redact_url(self.url)}: {exc}"
            ) from exc
        return len(keys)

    def close(self) -> None:
        self._client.close()

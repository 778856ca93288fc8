"""Voice-prefix KV cache: prefill a voice's conditioning prefix once, start every request from it.

Families whose LM input starts with positions that depend only on the voice (the reference's
audio features, a speaker embedding and reference codes before the text) say how
many in `Admission.prefix`. With a prefix cache, every such request prefills in two runs: the
prefix (or, on a hit, its KV values copied into the request's cache or row instead), then the
rest continuing after it. Both paths compute the rest from the same prefix values, so a hit's
logits are bit-identical to a miss's; on GroupQueryAttention LMs the two-run prefill is also
bit-identical to a one-run prefill (tests/test_prefix_cache.py).

Entries are keyed by the LM and the prefix embeddings themselves (a digest of their bytes):
equal embeddings give equal KV, so the key is exact whatever the voice came from. Memory only
(KV values are large and cheap to recompute next to a whole request), LFU with aging under a
byte budget, single flight for concurrent misses. A value is one float KV array per layer pair,
"kv.0" .. "kv.<n-1>", each of rank 4 ([lm_rows, heads, prefix, head_dim]), finite and within
+-MAX_ACTIVATION (:data:`PREFIX_SCHEMA`); a prefill whose KV is not is used for its request and
never stored.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import numpy as np

from onnx_tts.cache.schema import ArraySpec, Schema
from onnx_tts.cache.typed import TypedCache

DEFAULT_PREFIX_CACHE_BYTES = 256 << 20
MIN_REST = 2

RunPart = Callable[[np.ndarray, int], np.ndarray]
PREFIX_SCHEMA = Schema(numbered=("kv.", ArraySpec(("float32", "float16"), (None,) * 4)))


class _NotCacheable(Exception):
    """The prefix ran but its KV values are not a valid entry (NaN/inf, say): use them for this
    request, store nothing."""


class PrefixCache(TypedCache):
    """In-memory cache of voice-prefix KV values: {"kv.<i>": [lm_rows, H, P, D]} per entry."""

    label = "prefix cache"
    memory_policy = "lfu"
    value_schema = PREFIX_SCHEMA

    def __init__(self, memory_bytes: int = DEFAULT_PREFIX_CACHE_BYTES, identity: str = "") -> None:
        super().__init__(memory_bytes, disk_dir=None, redis_url=None)
        self.identity = identity

    def stats(self) -> dict:
        # Entries live in this process only: `onnx-tts cache stats` sees none of a server's.
        return {**super().stats(), "scope": "process"}

    def key(self, prefix_embeds: np.ndarray) -> str:
        digest = hashlib.blake2b(digest_size=32)
        digest.update(self.identity.encode())
        digest.update(f"{prefix_embeds.dtype.str}{prefix_embeds.shape}".encode())
        digest.update(np.ascontiguousarray(prefix_embeds).data)
        return digest.hexdigest()

    def prefill(
        self,
        embeds: np.ndarray,
        prefix: int,
        run: RunPart,
        read: Callable[[int], Sequence[np.ndarray]],
        load: Callable[[Sequence[np.ndarray]], None],
    ) -> np.ndarray:
        """Prefill `embeds` [lm_rows, T, D] whose first `prefix` positions are the voice prefix;
        returns the last position's logits.

        run(embeds_part, cached_tokens) runs the LM over a part after `cached_tokens` cached
        positions and returns its last logits; read(length) returns the cache's KV values of
        the first `length` positions (one array per KV pair); load(values) makes the cache
        hold exactly those values."""
        # The rest keeps two tokens or more: GroupQueryAttention runs a one-token step with its
        # decode kernel, which rounds differently from a prompt run (the split would then not
        # equal a one-run prefill bit for bit).
        prefix = min(int(prefix), embeds.shape[1] - MIN_REST)
        if prefix < 1 or self.memory_bytes == 0:
            return run(embeds, 0)
        ran = False

        def compute() -> dict[str, np.ndarray]:
            nonlocal ran
            run(embeds[:, :prefix], 0)
            ran = True
            values = {f"kv.{i}": v for i, v in enumerate(read(prefix))}
            if PREFIX_SCHEMA.problem(values) is not None:
                raise _NotCacheable
            return values

        try:
            value = self.get_or_compute(self.key(embeds[:, :prefix]), compute)
        except _NotCacheable:
            value = None
        if not ran:
            if value is None:  # joined a leader whose values were not cacheable
                run(embeds[:, :prefix], 0)
            else:
                load([value[f"kv.{i}"] for i in range(len(value))])
        return run(embeds[:, prefix:], prefix)


__all__ = ["DEFAULT_PREFIX_CACHE_BYTES", "PREFIX_SCHEMA", "PrefixCache"]

"""Uploaded voices in Redis, so that every replica behind a load balancer sees every upload.

The same contract as `onnx_tts.server.voices.VoiceStore` (ids, names, limits, `Voice`, the
checks on read), stored where all replicas reach it: one hash `<namespace>:voices:meta`
(id -> JSON metadata with the audio's sha256, signed with a secret) and one string
`<namespace>:voices:audio:<id>` per voice (mono float32 little-endian samples at the stored
rate). An upload writes both in one MULTI/EXEC, so another replica sees a whole voice or none.
Whoever else can write to the Redis is not trusted: a reader checks the metadata (and its
signature with `--cache-secret`: a voice written straight into Redis without the secret is
neither listed nor used), then the samples' length, finiteness, sha256 and content address
(the id), so audio replaced in Redis, even with its metadata updated to match, never speaks
under the old id. Redis errors become one 503 line for the client (the request can be
retried); the client retries a dropped connection once, which covers a Redis restart between
two requests.

A Redis without persistence loses the voices when it restarts: run it with AOF or RDB
snapshots (see docs/DEPLOYMENT.md) when uploads must outlive it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from onnx_tts.server.voice_names import ID_PATTERN, check_new_name, reserved_names
from onnx_tts.server.voices import (
    MAX_STORED_SAMPLES,
    CheckedAudio,
    Rejections,
    Voice,
    VoiceStoreError,
    checked_samples,
    damaged,
    parse_meta,
    stored_as,
    voice_id,
    voice_meta,
)


def _unavailable(error: Exception) -> VoiceStoreError:
    return VoiceStoreError(
        503,
        f"the shared voice store (Redis) is unavailable ({type(error).__name__}); retry shortly",
        "voice_store_unavailable",
        headers={"Retry-After": "1"},
    )


class RedisVoiceStore:
    """`VoiceStore`'s methods (add, get, list, audio, delete) over a shared Redis."""

    def __init__(
        self, redis_url: str, namespace: str = "onnx-tts", secret: bytes | None = None
    ) -> None:
        import redis
        from redis.backoff import ExponentialBackoff
        from redis.retry import Retry

        self._redis_errors: tuple[type[Exception], ...] = (redis.RedisError, OSError)
        self._client = redis.Redis.from_url(
            redis_url,
            socket_connect_timeout=1.0,
            socket_timeout=5.0,
            retry=Retry(ExponentialBackoff(cap=1.0, base=0.1), retries=3),
            retry_on_error=[redis.ConnectionError, redis.TimeoutError],
        )
        self._meta_key = f"{namespace}:voices:meta"
        self._audio_prefix = f"{namespace}:voices:audio:"
        self.secret = secret
        self.rejections = Rejections(f"Redis {self._meta_key}")
        self._audio = CheckedAudio()

    @property
    def rejected(self) -> int:
        return self.rejections.count

    def _call(self, operation: Any, *args: Any) -> Any:
        try:
            return operation(*args)
        except self._redis_errors as error:
            raise _unavailable(error) from None

    def _parse(self, ident: str, raw: bytes | None) -> tuple[Voice, str] | None:
        """(voice, audio sha256) of a stored record, or None (refused ones reported once)."""
        if raw is None or not ID_PATTERN.match(ident):
            return None
        state = hashlib.sha256(raw).hexdigest()
        if self.rejections.refused(ident, state):
            return None
        voice, why, extra = parse_meta(ident, raw, self.secret)
        digest = extra.get("sha256")
        if voice is not None and not (isinstance(digest, str) and len(digest) == 64):
            voice, why = None, "its metadata has no audio sha256"
        if voice is None:
            self.rejections.refuse(ident, state, why)
            return None
        return voice, digest

    # -- reads -----------------------------------------------------------------------------

    def get(self, ident: str) -> Voice | None:
        if not ID_PATTERN.match(ident):
            return None
        entry = self._parse(ident, self._call(self._client.hget, self._meta_key, ident))
        return None if entry is None else entry[0]

    def list(self) -> list[Voice]:
        entries = self._call(self._client.hgetall, self._meta_key)
        return sorted(self._voices(entries), key=lambda v: (v.created_at, v.id))

    def audio(self, voice: Voice, sample_rate: int) -> np.ndarray:
        """The voice's samples at `sample_rate`, checked against its record and its id when
        first read (then kept in memory); VoiceStoreError (404, voice_damaged) when they
        fail."""
        cached = self._audio.get(voice.id, sample_rate)
        if cached is not None:
            return cached
        raw_meta, data = self._call(self._read_pair, voice.id)
        entry = self._parse(voice.id, raw_meta)
        if entry is None:
            raise damaged(voice, "its record is missing or refused")
        samples, why = _samples(entry[0], data, entry[1])
        if samples is None:
            self.rejections.refuse(voice.id, hashlib.sha256(raw_meta).hexdigest(), why)
            raise damaged(voice, why)
        return self._audio.keep(voice, samples, sample_rate)

    def _read_pair(self, ident: str) -> tuple[bytes | None, bytes | None]:
        pipe = self._client.pipeline(transaction=True)
        pipe.hget(self._meta_key, ident)
        pipe.get(self._audio_prefix + ident)
        # A key of the wrong type (someone else's write) is a damaged voice, not a Redis
        # that is down: its error comes back in place of the value.
        raw_meta, data = pipe.execute(raise_on_error=False)
        if isinstance(raw_meta, Exception):
            raise raw_meta
        return raw_meta, None if isinstance(data, Exception) else data

    # -- writes ----------------------------------------------------------------------------

    def add(
        self,
        name: str,
        audio: np.ndarray,
        sample_rate: int,
        reserved: Mapping[str, str] | None = None,
    ) -> tuple[Voice, bool]:
        """Store `audio` (already decoded and checked) under its content id; returns the voice
        and whether it is new, with `VoiceStore.add`'s rules: the name normalised once and not
        reserved, the same clip under another name VoiceExists, another clip under a name
        already taken VoiceNameTaken."""
        samples = np.ascontiguousarray(audio, "<f4")
        if samples.ndim != 1 or not 0 < len(samples) <= MAX_STORED_SAMPLES:
            raise ValueError(f"a voice is 1 to {MAX_STORED_SAMPLES} mono samples")
        if not np.isfinite(samples).all():
            raise ValueError("a voice's samples must be finite")
        shown, key = check_new_name(name, reserved_names({}) if reserved is None else reserved)
        ident = voice_id(samples, sample_rate)
        data = samples.tobytes()
        import redis

        for _attempt in range(16):
            try:
                with self._client.pipeline(transaction=True) as pipe:
                    # WATCH makes the count check and the write one step: a concurrent upload
                    # on another replica restarts this one instead of passing the limit.
                    pipe.watch(self._meta_key)
                    stored = self._voices(pipe.hgetall(self._meta_key))
                    # The count of every record, refused ones too: the hash is bounded.
                    existing = stored_as(stored, ident, key, pipe.hlen(self._meta_key))
                    if existing is not None:
                        return existing, False
                    voice = Voice(ident, shown, int(time.time()), sample_rate)
                    sha = hashlib.sha256(data).hexdigest()
                    pipe.multi()
                    pipe.set(self._audio_prefix + ident, data)
                    pipe.hset(
                        self._meta_key,
                        ident,
                        json.dumps(voice_meta(voice, self.secret, sha256=sha)),
                    )
                    pipe.execute()
                    self.rejections.forget(ident)
                    return voice, True
            except redis.WatchError:
                continue
            except self._redis_errors as error:
                raise _unavailable(error) from None
        raise _unavailable(RuntimeError("too many concurrent voice uploads"))

    def _voices(self, entries: dict[bytes, bytes]) -> list[Voice]:
        found = (self._parse(k.decode("ascii", "replace"), raw) for k, raw in entries.items())
        return [entry[0] for entry in found if entry is not None]

    def delete(self, ident: str) -> bool:
        if not ID_PATTERN.match(ident):
            return False
        pipe = self._client.pipeline(transaction=True)
        pipe.hdel(self._meta_key, ident)
        pipe.delete(self._audio_prefix + ident)
        removed, _ = self._call(pipe.execute)
        self._audio.forget(ident)
        self.rejections.forget(ident)
        return bool(removed)


def _samples(voice: Voice, data: bytes | None, digest: str) -> tuple[np.ndarray | None, str]:
    if data is None:
        return None, "its audio is missing"
    if len(data) % 4 or not 0 < len(data) // 4 <= MAX_STORED_SAMPLES:
        return None, "its audio is not a whole number of float32 samples within bounds"
    if hashlib.sha256(data).hexdigest() != digest:
        return None, "its audio does not match its record's sha256"
    samples = np.frombuffer(data, "<f4").astype(np.float32)
    why = checked_samples(voice, samples, voice.sample_rate)
    return (None, why) if why else (samples, "")


def open_voice_store(
    voices_dir: str | os.PathLike[str], redis_url: str | None, secret: bytes | None = None
) -> Any:
    """The store uploads go to: Redis when the server shares one (every replica sees every
    voice), else the directory; `secret` (the cache secret) signs and checks every voice."""
    if redis_url:
        return RedisVoiceStore(redis_url, secret=secret)
    from onnx_tts.server.voices import VoiceStore

    return VoiceStore(voices_dir, secret)

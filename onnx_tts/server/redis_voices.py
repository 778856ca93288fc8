"""Uploaded voices in Redis, so that every replica behind a load balancer sees every upload.

The same contract as `onnx_tts.server.voices.VoiceStore` (ids, names, limits, `Voice`), stored
where all replicas reach it: one hash `<namespace>:voices:meta` (id -> JSON metadata with the
audio's sha256) and one string `<namespace>:voices:audio:<id>` per voice (mono float32
little-endian samples at the stored rate). An upload writes both in one MULTI/EXEC, so another
replica sees a whole voice or none; a reader checks the sha256, length and finiteness before
using the samples, and an entry that fails is treated as absent. Redis errors become one 503
line for the client (the request can be retried); the client retries a dropped connection
once, which covers a Redis restart between two requests.

A Redis without persistence loses the voices when it restarts: run it with AOF or RDB
snapshots (see the README's deployment section) when uploads must outlive it.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from dataclasses import asdict
from typing import Any

import numpy as np

from onnx_tts.audio import resample
from onnx_tts.server.errors import APIError
from onnx_tts.server.voices import (
    _ID_PATTERN,
    MAX_NAME_CHARS,
    MAX_VOICES,
    Voice,
    VoiceExists,
    VoiceNameTaken,
    voice_id,
)

# A stored clip is a reference voice (seconds), never more than this many samples.
MAX_STORED_SAMPLES = 10 * 60 * 48_000
_MAX_META_BYTES = 4096


def _unavailable(error: Exception) -> APIError:
    return APIError(
        503,
        f"the shared voice store (Redis) is unavailable ({type(error).__name__}); retry shortly",
        code="voice_store_unavailable",
        headers={"Retry-After": "1"},
    )


class RedisVoiceStore:
    """`VoiceStore`'s methods (add, get, find, list, audio, delete) over a shared Redis."""

    def __init__(self, redis_url: str, namespace: str = "onnx-tts") -> None:
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
        self._lock = threading.Lock()
        self._audio: dict[tuple[str, int], np.ndarray] = {}

    def _call(self, operation: Any, *args: Any) -> Any:
        try:
            return operation(*args)
        except self._redis_errors as error:
            raise _unavailable(error) from None

    # -- reads -----------------------------------------------------------------------------

    def get(self, ident: str) -> Voice | None:
        if not _ID_PATTERN.match(ident):
            return None
        raw = self._call(self._client.hget, self._meta_key, ident)
        entry = _parse_meta(ident, raw)
        return None if entry is None else entry[0]

    def find(self, id_or_name: str) -> Voice | None:
        """By id, or by name when exactly one voice has it."""
        voice = self.get(id_or_name)
        if voice is not None:
            return voice
        named = [v for v in self.list() if v.name == id_or_name]
        return named[0] if len(named) == 1 else None

    def list(self) -> list[Voice]:
        entries = self._call(self._client.hgetall, self._meta_key)
        voices = []
        for key, raw in entries.items():
            ident = key.decode("ascii", "replace")
            entry = _parse_meta(ident, raw) if _ID_PATTERN.match(ident) else None
            if entry is not None:
                voices.append(entry[0])
        return sorted(voices, key=lambda v: (v.created_at, v.id))

    def audio(self, voice: Voice, sample_rate: int) -> np.ndarray:
        """The voice's samples at `sample_rate` (kept in memory after the first read)."""
        key = (voice.id, sample_rate)
        cached = self._audio.get(key)
        if cached is not None:
            return cached
        raw_meta, data = self._call(self._read_pair, voice.id)
        entry = _parse_meta(voice.id, raw_meta)
        samples = None if entry is None or data is None else _check_samples(data, entry[1])
        if samples is None:
            raise APIError(
                400,
                f"voice {voice.id!r} is missing or damaged in the shared store; upload it again",
                param="voice",
                code="voice_not_found",
            )
        if voice.sample_rate != sample_rate:
            samples = resample(samples, voice.sample_rate, sample_rate)
        samples.setflags(write=False)
        with self._lock:
            self._audio[key] = samples
        return samples

    def _read_pair(self, ident: str) -> tuple[bytes | None, bytes | None]:
        pipe = self._client.pipeline(transaction=True)
        pipe.hget(self._meta_key, ident)
        pipe.get(self._audio_prefix + ident)
        raw_meta, data = pipe.execute()
        return raw_meta, data

    # -- writes ----------------------------------------------------------------------------

    def add(self, name: str, audio: np.ndarray, sample_rate: int) -> tuple[Voice, bool]:
        """Store `audio` (already decoded and checked) under its content id; returns the voice
        and whether it is new, with `VoiceStore.add`'s rule: the same clip under another name
        is VoiceExists, another clip under a name already taken VoiceNameTaken."""
        samples = np.ascontiguousarray(audio, "<f4")
        if samples.ndim != 1 or not 0 < len(samples) <= MAX_STORED_SAMPLES:
            raise ValueError(f"a voice is 1 to {MAX_STORED_SAMPLES} mono samples")
        if not np.isfinite(samples).all():
            raise ValueError("a voice's samples must be finite")
        if not 0 < len(name) <= MAX_NAME_CHARS:
            raise ValueError(f"a voice name is 1 to {MAX_NAME_CHARS} characters")
        ident = voice_id(samples, sample_rate)
        data = samples.tobytes()
        import redis

        for _attempt in range(16):
            try:
                with self._client.pipeline(transaction=True) as pipe:
                    # WATCH makes the count check and the write one step: a concurrent upload
                    # on another replica restarts this one instead of passing the limit.
                    pipe.watch(self._meta_key)
                    existing = _parse_meta(ident, pipe.hget(self._meta_key, ident))
                    if existing is not None:
                        if existing[0].name != name:
                            raise VoiceExists(existing[0])
                        return existing[0], False
                    taken = _named(pipe.hgetall(self._meta_key), name)
                    if taken is not None:
                        raise VoiceNameTaken(taken)
                    if pipe.hlen(self._meta_key) >= MAX_VOICES:
                        raise OverflowError(
                            f"the server stores at most {MAX_VOICES} voices; delete some first"
                        )
                    voice = Voice(ident, name, int(time.time()), sample_rate)
                    meta = {**asdict(voice), "sha256": hashlib.sha256(data).hexdigest()}
                    pipe.multi()
                    pipe.set(self._audio_prefix + ident, data)
                    pipe.hset(self._meta_key, ident, json.dumps(meta))
                    pipe.execute()
                    return voice, True
            except redis.WatchError:
                continue
            except self._redis_errors as error:
                raise _unavailable(error) from None
        raise _unavailable(RuntimeError("too many concurrent voice uploads"))

    def delete(self, ident: str) -> bool:
        if not _ID_PATTERN.match(ident):
            return False
        pipe = self._client.pipeline(transaction=True)
        pipe.hdel(self._meta_key, ident)
        pipe.delete(self._audio_prefix + ident)
        removed, _ = self._call(pipe.execute)
        with self._lock:
            for key in [k for k in self._audio if k[0] == ident]:
                del self._audio[key]
        return bool(removed)


def _named(entries: dict[bytes, bytes], name: str) -> Voice | None:
    """The stored voice called `name` among raw metadata entries, if any."""
    for key, raw in entries.items():
        ident = key.decode("ascii", "replace")
        entry = _parse_meta(ident, raw) if _ID_PATTERN.match(ident) else None
        if entry is not None and entry[0].name == name:
            return entry[0]
    return None


def _parse_meta(ident: str, raw: bytes | None) -> tuple[Voice, str] | None:
    """(voice, audio sha256) from a stored metadata entry, or None when absent or malformed."""
    if raw is None or len(raw) > _MAX_META_BYTES:
        return None
    try:
        data = json.loads(raw)
        digest = data.pop("sha256")
        voice = Voice(**data)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    checks = (
        voice.id == ident,
        isinstance(voice.name, str) and 0 < len(voice.name) <= MAX_NAME_CHARS,
        isinstance(voice.created_at, int),
        isinstance(voice.sample_rate, int) and 8000 <= voice.sample_rate <= 384_000,
        isinstance(digest, str) and len(digest) == 64,
    )
    return (voice, digest) if all(checks) else None


def _check_samples(data: bytes, digest: str) -> np.ndarray | None:
    if len(data) % 4 or not 0 < len(data) // 4 <= MAX_STORED_SAMPLES:
        return None
    if hashlib.sha256(data).hexdigest() != digest:
        return None
    samples = np.frombuffer(data, "<f4").astype(np.float32)
    return samples if np.isfinite(samples).all() else None


def open_voice_store(voices_dir: str | os.PathLike[str], redis_url: str | None) -> Any:
    """The store uploads go to: Redis when the server shares one (every replica sees every
    voice), else the directory."""
    if redis_url:
        return RedisVoiceStore(redis_url)
    from onnx_tts.server.voices import VoiceStore

    return VoiceStore(voices_dir)

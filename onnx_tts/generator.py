"""LM stage: prefill + decode loop on the C++ core, sampling, and the delay-pattern machine."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

import numpy as np

from onnx_tts.errors import InputError
from onnx_tts.session import KV_MODES, KVCache, Session


@dataclass(frozen=True)
class SamplingOptions:
    """Token sampling. temperature 0 means greedy; seed makes generation reproducible."""

    temperature: float = 0.8
    top_k: int = 50
    top_p: float = 0.95
    repetition_penalty: float = 1.1
    seed: int | None = None

    def checked(self) -> SamplingOptions:
        if not np.isfinite(self.temperature) or self.temperature < 0:
            raise InputError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise InputError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise InputError(f"top_p must be in (0, 1], got {self.top_p}")
        if not np.isfinite(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise InputError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise InputError(f"seed must be a non-negative integer, got {self.seed}")
        return self

    def with_overrides(self, **overrides: Any) -> SamplingOptions:
        return replace(self, **{k: v for k, v in overrides.items() if v is not None}).checked()


class Sampler:
    """Samples one token from a logit vector, with a private seeded generator."""

    def __init__(self, options: SamplingOptions) -> None:
        self.options = options.checked()
        self.rng = np.random.default_rng(options.seed)

    def penalize(self, logits: np.ndarray, seen: np.ndarray) -> np.ndarray:
        """Repetition penalty on the tokens marked in the boolean mask `seen`: positive logits
        are divided by the penalty, negative ones multiplied (the usual CTRL-style rule)."""
        penalty = self.options.repetition_penalty
        if penalty == 1.0:
            return logits
        return np.where(seen, np.where(logits > 0, logits / penalty, logits * penalty), logits)

    def sample(self, logits: np.ndarray) -> int:
        return int(self.sample_rows(logits[None])[0])

    def sample_rows(self, logits: np.ndarray) -> np.ndarray:
        """One token per row of `logits` [R, V], vectorised (one RNG draw per row)."""
        logits = np.asarray(logits, dtype=np.float64)
        if self.options.temperature == 0:
            return logits.argmax(axis=-1)
        logits = logits / self.options.temperature
        vocab = logits.shape[-1]
        top_k = self.options.top_k
        if top_k and top_k < vocab:
            kth = np.partition(logits, vocab - top_k, axis=-1)[:, vocab - top_k][:, None]
            logits = np.where(logits >= kth, logits, -np.inf)
        probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        if self.options.top_p < 1.0:
            order = np.argsort(-probs, axis=-1, kind="stable")
            ranked = np.take_along_axis(probs, order, axis=-1)
            # Keep the smallest prefix whose mass reaches top_p (the crossing token included).
            keep_ranked = (np.cumsum(ranked, axis=-1) - ranked) < self.options.top_p
            keep = np.zeros_like(keep_ranked)
            np.put_along_axis(keep, order, keep_ranked, axis=-1)
            probs = np.where(keep, probs, 0.0)
            probs /= probs.sum(axis=-1, keepdims=True)
        cdf = np.cumsum(probs, axis=-1)
        draws = self.rng.random(len(probs))[:, None] * cdf[:, -1:]
        return np.minimum((cdf < draws).sum(axis=-1), vocab - 1)


class DelayState(Enum):
    DELAY = "delay"  # higher codebooks still waiting for their first frame
    ACTIVE = "active"
    WIND_DOWN = "wind-down"  # codebook 0 has ended; higher codebooks finish their lag
    FINISHED = "finished"


class DelayPattern:
    """Codebook k lags k frames. Row t holds frame t-k for codebook k (pad outside the range).

    Feed one sampled row per step; complete frames come out in order, never a partial one.
    """

    def __init__(self, codebooks: int, pad_id: int, eos_id: int) -> None:
        self.codebooks = codebooks
        self.pad_id = pad_id
        self.eos_id = eos_id
        self.row = 0  # index of the next row to sample
        self.end_frame: int | None = None  # number of frames, known once codebook 0 emits EOS
        self.frames: list[np.ndarray] = []  # frames being assembled
        self.emitted = 0

    @property
    def state(self) -> DelayState:
        if self.end_frame is None:
            return DelayState.DELAY if self.row < self.codebooks else DelayState.ACTIVE
        # The last real frame (end_frame - 1) reaches codebook K-1 at row end_frame + K - 2.
        if self.row >= self.end_frame + self.codebooks - 1:
            return DelayState.FINISHED
        return DelayState.WIND_DOWN

    def forced(self, codebook: int) -> int | None:
        """The token this row must hold for `codebook`, or None when it is sampled."""
        frame = self.row - codebook
        if frame < 0:
            return self.pad_id
        if self.end_frame is not None and frame >= self.end_frame:
            return self.eos_id if (codebook == 0 and frame == self.end_frame) else self.pad_id
        return None

    def push(self, row: np.ndarray) -> list[np.ndarray]:
        """Record one sampled row; return the frames it completed."""
        if row[0] == self.eos_id and self.end_frame is None:
            self.end_frame = self.row
        for k in range(self.codebooks):
            frame = self.row - k
            if frame < 0 or (self.end_frame is not None and frame >= self.end_frame):
                continue
            while len(self.frames) <= frame:
                self.frames.append(np.full(self.codebooks, -1, dtype=np.int64))
            self.frames[frame][k] = row[k]
        self.row += 1
        done = []
        while self.emitted < len(self.frames) and (self.frames[self.emitted] >= 0).all():
            done.append(self.frames[self.emitted])
            self.emitted += 1
        return done


def lm_feeds(session: Session, embeds: np.ndarray, past_length: int) -> dict[str, np.ndarray]:
    """Inputs beside the KV cache that LM graphs commonly take, derived from the cache length."""
    batch, new = embeds.shape[0], embeds.shape[1]
    feeds: dict[str, np.ndarray] = {"inputs_embeds": embeds}
    names = set(session.input_names)
    if "attention_mask" in names:
        feeds["attention_mask"] = np.ones((batch, past_length + new), dtype=np.int64)
    if "position_ids" in names:
        positions = np.arange(past_length, past_length + new, dtype=np.int64)
        feeds["position_ids"] = np.broadcast_to(positions, (batch, new)).copy()
    return feeds


class KVPool:
    """Reuses KV caches across requests: in-place buffers are allocated once per worker."""

    def __init__(self, session: Session, mode: str, capacity: int) -> None:
        if mode not in KV_MODES:
            raise InputError(f"unknown KV mode {mode!r}; choose one of {', '.join(KV_MODES)}")
        self.session, self.mode, self.capacity = session, mode, capacity
        self._idle: list[KVCache] = []
        self._lock = threading.Lock()

    def acquire(self) -> KVCache:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        capacity = self.capacity if self.mode == "inplace" else None
        return KVCache(self.session, self.mode, capacity=capacity)

    def release(self, cache: KVCache) -> None:
        cache.reset()
        with self._lock:
            self._idle.append(cache)


@dataclass(frozen=True)
class LengthLimits:
    min_frames: int
    max_frames: int


class CodecLMGenerator:
    """Generates codec frames for one text chunk with the reference LM (delay pattern)."""

    def __init__(
        self,
        embed: Session,
        lm: Session,
        kv_pool: KVPool,
        codebooks: int,
        codebook_size: int,
        pad_id: int,
        bos_id: int,
        eos_id: int,
    ) -> None:
        self.embed, self.lm, self.pool = embed, lm, kv_pool
        self.codebooks, self.codebook_size = codebooks, codebook_size
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id

    def _embed(
        self, text_ids: np.ndarray, audio_codes: np.ndarray, speaker: np.ndarray
    ) -> dict[str, np.ndarray]:
        return self.embed.run(
            {
                "text_ids": text_ids.reshape(1, -1).astype(np.int64),
                "audio_codes": audio_codes.reshape(1, -1, self.codebooks).astype(np.int64),
                "speaker_embedding": speaker.reshape(1, -1).astype(np.float32),
            }
        )

    def prompt_embeds(self, text_ids: list[int], voice: dict[str, np.ndarray]) -> np.ndarray:
        """[speaker][prompt frames][text][BOS frame] as one [1, P, D] prefill."""
        codes = voice["codes"].reshape(-1, self.codebooks)
        bos = np.full((1, self.codebooks), self.bos_id, dtype=np.int64)
        parts = self._embed(
            np.asarray(text_ids, dtype=np.int64),
            np.concatenate([codes, bos]),
            voice["speaker_embedding"],
        )
        audio = parts["audio_embeds"]
        return np.concatenate(
            [parts["speaker_embeds"], audio[:, :-1], parts["text_embeds"], audio[:, -1:]], axis=1
        )

    def generate(
        self,
        text_ids: list[int],
        voice: dict[str, np.ndarray],
        sampling: SamplingOptions,
        limits: LengthLimits,
        should_stop: Callable[[], bool] | None = None,
    ) -> Iterator[np.ndarray]:
        """Yields complete frames (int64 [K]) as the delay pattern completes them."""
        sampler = Sampler(sampling)
        pattern = DelayPattern(self.codebooks, self.pad_id, self.eos_id)
        # Tokens each codebook has produced, as a mask: O(1) per step for the penalty.
        seen = np.zeros((self.codebooks, self.codebook_size + 3), dtype=bool)
        cache = self.pool.acquire()
        try:
            embeds = self.prompt_embeds(text_ids, voice)
            needed = embeds.shape[1] + limits.max_frames + self.codebooks + 1
            if cache.capacity is not None and needed > cache.capacity:
                raise InputError(
                    f"this chunk needs {needed} KV positions but the model's capacity is "
                    f"{cache.capacity}; use a shorter reference clip or shorter sentences"
                )
            while pattern.state is not DelayState.FINISHED:
                if should_stop is not None and should_stop():
                    return
                logits = cache.step(lm_feeds(self.lm, embeds, cache.length))["logits"]
                row = self._sample_row(logits[0, -1], pattern, sampler, seen, limits)
                yield from pattern.push(row)
                codes = row.reshape(1, 1, self.codebooks)
                embeds = self._embed(np.zeros(0, np.int64), codes, voice["speaker_embedding"])[
                    "audio_embeds"
                ]
        finally:
            self.pool.release(cache)

    def _sample_row(
        self,
        logits: np.ndarray,
        pattern: DelayPattern,
        sampler: Sampler,
        seen: np.ndarray,
        limits: LengthLimits,
    ) -> np.ndarray:
        """Sample all K codebooks of one row at once, then apply the delay pattern's forcing."""
        scores = logits.astype(np.float32, copy=True)
        scores[:, self.codebook_size :] = -np.inf  # specials are structural, never sampled
        frame0 = pattern.row  # the frame codebook 0 would produce in this row
        if frame0 >= limits.min_frames:
            scores[0, self.eos_id] = logits[0, self.eos_id]
        scores = sampler.penalize(scores, seen[:, : scores.shape[1]])
        row = sampler.sample_rows(scores).astype(np.int64)
        if pattern.forced(0) is None and frame0 >= limits.max_frames:
            row[0] = self.eos_id
        for k in range(self.codebooks):
            forced = pattern.forced(k)
            if forced is not None:
                row[k] = forced
            else:
                seen[k, row[k]] = True
        return row

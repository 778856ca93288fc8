"""Result caching around execution: a deterministic request (greedy or seeded, or any request
with cache=True) is looked up before planning and stored after; a text of several sentences
also stores and reuses each sentence; a completed stream stores its audio under a key that
includes its windows."""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from onnx_tts.cache.result import ResultCache, model_identity, request_digest, result_key
from onnx_tts.errors import InputError, OnnxTTSError, OnnxTTSWarning
from onnx_tts.families.base import Model
from onnx_tts.pipeline.planner import Plan
from onnx_tts.vocoder import StreamingOptions


class ResultCaching:
    """One model's use of the result cache (None: every call is a miss that stores nothing)."""

    def __init__(self, model: Model, results: ResultCache | None) -> None:
        self.model, self.results = model, results
        # Texts of several sentences also store and reuse each sentence.
        self.sentence_entries = True
        self._identity: str | None = None

    def recall(
        self, text: Any, voice: Any, seed: Any, options: Mapping[str, Any], cache: bool | None
    ) -> tuple[str | None, dict[str, np.ndarray] | None]:
        """(digest, cached value) of a request as given, from the result cache's memory before
        any text processing; (None, None) without a cache or with cache=False."""
        if cache not in (None, True, False):
            raise InputError(
                f"cache must be None (deterministic requests only), True or False, got {cache!r}"
            )
        if self.results is None or cache is False:
            return None, None
        if self._identity is None:
            self._identity = model_identity(self.model)
        # A request that asked for caching has its own alias: auto requests never replay it.
        given = {**options, "\x00cache": True} if cache else options
        digest = request_digest(self._identity, text, voice, seed, given)
        return digest, self.results.recall(digest)

    def key(
        self, plan: Plan, prompt: Mapping[str, np.ndarray], digest: str | None, cache: bool | None
    ) -> str | None:
        """Result-cache key of a deterministic (greedy or seeded) request, or of any request
        with cache=True (a sampled one is then made once and replayed), else None."""
        sampling = plan.sampling
        sampled = sampling.temperature > 0 and sampling.seed is None
        if self.results is None or cache is False or (sampled and not cache):
            return None
        options = {**plan.options, **plan.key()}  # speed and pauses change the audio too
        key = result_key(self._identity or "", plan.chunks, prompt, sampling, options)
        if key is not None:
            self.results.remember(digest, key)
        return key

    def sentence_keys(self, plan: Plan, prompt: Mapping[str, np.ndarray]) -> list[str | None]:
        """Result-cache keys of each sentence of a deterministic text of several sentences, so
        a new text reuses the sentences it shares with earlier ones. A sentence's audio is
        generated and vocoded on its own (with its own seed), so its entry is exact. A text
        of one sentence needs none: its whole-text key is that sentence's key; nor does a
        text whose chunks draw from one generator in order (a sentence's audio then depends
        on the sentences before it)."""
        if (
            not self.sentence_entries
            or self.results is None
            or len(plan.chunks) < 2
            or plan.sequential
        ):
            return [None] * len(plan.chunks)
        identity = self._identity or ""
        return [
            result_key(identity, [chunk], prompt, plan.sampling.for_chunk(index), plan.options)
            for index, chunk in enumerate(plan.chunks)
        ]

    def known_sentences(self, keys: list[str | None]) -> dict[int, np.ndarray]:
        results = self.results
        known = {}
        for index, key in enumerate(keys):
            if key is not None and results is not None:
                samples = results.get_sentence(key)
                if samples is not None:
                    known[index] = samples
        return known

    def store_sentence(self, key: str | None, samples: np.ndarray) -> None:
        if key is not None and self.results is not None:
            self.results.put_sentence(key, samples, self.model.sample_rate)

    @staticmethod
    def stream_key(key: str, window: StreamingOptions) -> str:
        """Streamed audio depends on the windows: it is stored under a key of its own."""
        return hashlib.sha256(f"{key}/stream/{window!r}".encode()).hexdigest()

    def stream_hit(self, key: str, window: StreamingOptions) -> dict[str, np.ndarray] | None:
        """A stored stream with these windows (the counted lookup), else synthesize()'s
        one-shot entry (uncounted), else None."""
        assert self.results is not None
        return self.results.lookup(self.stream_key(key, window)) or self.results.get(key)

    def store_stream(self, key: str, samples: np.ndarray) -> None:
        """Store a completed stream's audio (not a cancelled one's). A failing cache never
        fails the stream."""
        if self.results is not None:
            try:
                self.results.put_audio(key, samples, self.model.sample_rate)
            except OnnxTTSError as error:
                warnings.warn(f"result not cached: {error}", OnnxTTSWarning, stacklevel=2)


__all__ = ["ResultCaching"]

"""The engine: one loaded model behind a small facade (synthesize, stream, voice, stats).

The work is done by named parts: `Planner` (text and options checked, split into chunks),
`Voices` (references encoded once through the reference cache), `ResultCaching` (finished audio
of deterministic requests), `Executor` (chunks as requests of the model's one `DecodeScheduler`,
vocoded one-shot or window by window).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from onnx_tts.audio import save_audio
from onnx_tts.cache.prefix import PrefixCache
from onnx_tts.cache.reference import ReferenceCache
from onnx_tts.cache.result import ResultCache, replay_chunks
from onnx_tts.cache.tiered import TieredCache
from onnx_tts.decoding import SamplingOptions
from onnx_tts.decoding.direct import DirectProgram, DirectScheduler
from onnx_tts.decoding.kv_rows import DEFAULT_SLOT_BYTES
from onnx_tts.decoding.policy import SchedulingPolicy
from onnx_tts.decoding.prefill import DEFAULT_PREFILL_MODE
from onnx_tts.decoding.request import CancelToken, PlaybackClock, Request
from onnx_tts.decoding.scheduler import DEFAULT_MAX_WAITING, DecodeScheduler, FrameStream
from onnx_tts.errors import InputError, shown
from onnx_tts.families import FAMILIES
from onnx_tts.families.base import Family, Model
from onnx_tts.pipeline.caching import ResultCaching
from onnx_tts.pipeline.execution import AudioStream, Executor, Progress, ReadyChunks, cancelled
from onnx_tts.pipeline.planner import Planner, Timing
from onnx_tts.pipeline.timings import WordTiming
from onnx_tts.pipeline.voices import VoiceLike, VoiceResolver
from onnx_tts.vocoder import StreamingOptions


@dataclass
class Audio:
    """Synthesised speech: float32 samples at `sample_rate`, [N] (mono) or [N, channels], and
    when asked for (`timestamps=True`), when each word sounds (`words`)."""

    samples: np.ndarray
    sample_rate: int
    words: list[WordTiming] | None = None

    @property
    def duration(self) -> float:
        return len(self.samples) / self.sample_rate

    def save(self, path: str | os.PathLike[str], format: str | None = None) -> Path:
        """Write the file atomically (no partial file on failure), in `format` (one of
        onnx_tts.audio.OUTPUT_FORMATS: wav flac mp3 ogg opus aac) or else the one the
        extension names."""
        return save_audio(path, self.samples, self.sample_rate, format)

    def as_value(self) -> dict[str, np.ndarray]:
        """The result-cache value of this audio (samples and rate)."""
        return {"samples": self.samples, "sample_rate": np.asarray(self.sample_rate, np.int64)}


class Engine:
    """A loaded model plus its caches. Thread-safe: concurrent synthesize()/stream() calls
    (and the sentences of one text) decode as rows of the model's one scheduler."""

    def __init__(
        self,
        model: Model,
        cache: ReferenceCache | None,
        family: Family | None = None,
        max_batch: int = 1,
        results: ResultCache | None = None,
        prefixes: PrefixCache | None = None,
        slot_bytes: int = DEFAULT_SLOT_BYTES,
        max_waiting: int = DEFAULT_MAX_WAITING,
        lookahead: bool = False,
        prefill_workers: int = 1,
        policy: str | SchedulingPolicy | None = None,
        prefill: str = DEFAULT_PREFILL_MODE,
    ) -> None:
        self.model = model
        self.cache = cache
        self.results = results  # finished audio of deterministic requests (cache/result.py)
        self.prefixes = prefixes  # KV of voice prefixes (cache/prefix.py)
        self.family = family or FAMILIES[model.family]
        # A bundle whose streaming defaults are invalid fails at load (ModelError), not at the
        # first stream after it passed every non-streaming test.
        self.streaming_options()
        self.scheduler: DecodeScheduler | DirectScheduler
        if isinstance(model.program, DirectProgram):  # one call per chunk, no decode loop
            self.scheduler = DirectScheduler(model.program, max_waiting, policy)
        else:
            assert model.pool is not None, "a model with a step LM has a KV pool"
            self.scheduler = DecodeScheduler(
                model.program,
                model.pool,
                max_batch,
                prefixes,
                slot_bytes,
                max_waiting,
                lookahead,
                prefill_workers,
                policy,
                prefill,
            )
        self.planner = Planner(model, self.family)
        self.voices = VoiceResolver(model.voices, cache)
        self.caching = ResultCaching(model, results)
        self.executor = Executor(model, self.scheduler)
        # The workers' threads hold the model (sessions, slot buffers) until they stop: an
        # engine dropped without close() stops them once it is gone, or a process that loads
        # engines over time keeps every one of them. (At exit the scheduler's hook does it.)
        self._finalizer = weakref.finalize(
            self, _stop_workers, self.scheduler, self.executor, model
        )
        self._finalizer.atexit = False

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def sample_rate(self) -> int:
        return self.model.sample_rate

    @property
    def channels(self) -> int:
        """Channels of the model's audio (samples are [N, channels] when more than 1)."""
        return self.model.channels

    @property
    def sentence_entries(self) -> bool:
        """Whether texts of several sentences also store and reuse each sentence."""
        return self.caching.sentence_entries

    @sentence_entries.setter
    def sentence_entries(self, value: bool) -> None:
        self.caching.sentence_entries = bool(value)

    def info(self) -> dict[str, Any]:
        info = self.model.info()
        scheduler = self.scheduler
        batched = scheduler.slots is not None and scheduler.max_batch > 1
        info["batching"] = {"batched": batched, "max_batch": scheduler.max_batch}
        if batched:
            info["batching"]["slot_capacity"] = "grows on demand"
        else:
            info["batching"]["why"] = scheduler.batching_unavailable or "max_batch is 1"
        return info

    def stats(self) -> dict[str, Any]:
        """Decode scheduler counters (queue length, active rows, steps, mean batch size, slot
        buffer size) and the vocoder stage's (under "vocoder")."""
        return {**self.scheduler.stats(), "vocoder": self.executor.vocoder.stats()}

    def close(self) -> None:
        """Stop the decode scheduler's and the vocoder stage's workers (requests still queued
        fail) and let the model's memory go. `with onnx_tts.load(...) as engine:` closes it."""
        self._finalizer.detach()
        _close_parts(self.scheduler, self.executor, self.model)

    # -- voices and caches ---------------------------------------------------------------------
    def voice(self, voice: VoiceLike = None) -> dict[str, np.ndarray]:
        """The conditioning of a voice: None (the model's default), a builtin voice's name, a
        reference file, samples at the encoder's rate, or an already-encoded dict. References
        go through the reference cache."""
        return self.voices.resolve(voice)

    @property
    def voice_names(self) -> tuple[str, ...]:
        """Voices the model itself ships, by name (e.g. a manifest's builtin voices)."""
        return self.model.voices.names

    def _caches(self) -> dict[str, TieredCache | None]:
        return {"reference": self.cache, "result": self.results, "prefix": self.prefixes}

    def cache_stats(self) -> dict[str, Any]:
        """{"reference": ..., "result": ..., "prefix": ...}: each cache's stats ({} when off)."""
        return {name: c.stats() if c is not None else {} for name, c in self._caches().items()}

    def clear_cache(self) -> dict[str, dict[str, int]]:
        return {name: c.clear() if c is not None else {} for name, c in self._caches().items()}

    # -- synthesis -----------------------------------------------------------------------------
    def generate(
        self,
        chunk: Any,
        voice: Mapping[str, np.ndarray],
        sampling: SamplingOptions | None = None,
        options: Mapping[str, Any] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> FrameStream:
        """The LM stage alone: complete frames of one text chunk (an item of the model's
        `model.text.chunks()`), for an encoded voice (`voice()`), as they are generated.
        Closing the iterator stops generation and frees its row."""
        cancel = CancelToken()
        if should_stop is not None:
            if not callable(should_stop):
                raise InputError(f"should_stop must be callable, got {shown(should_stop)}")
            cancel.watch(should_stop)
        request = Request(
            chunk,
            voice,
            sampling or self.model.sampling_defaults(),
            self.model.request_options(options or {}),
            cancel=cancel,
        )
        return _owned(self.executor.frames(request), self)

    def synthesize(
        self,
        text: str | bytes,
        voice: VoiceLike = None,
        seed: int | None = None,
        progress: Progress | None = None,
        cache: bool | None = None,
        *,
        ssml: bool | None = None,
        speed: float = 1.0,
        sentence_silence: float | None = None,
        timestamps: bool = False,
        deadline: float | None = None,
        priority: int = 0,
        cancel: CancelToken | None = None,
        **options: Any,
    ) -> Audio:
        """Speak `text` (in the voice of `voice` when given). Same seed -> same samples.

        `text` may carry markup: SSML when it starts with <speak> (or `ssml=True`; False reads
        it as plain text), inline ``[[ phonemes ]]`` otherwise. `speed` (0.25-4, pitch kept)
        scales every sentence's pace; `sentence_silence` (seconds) replaces the pause between
        sentences; `timestamps` gives `Audio.words` (each word's start and end). `options`:
        sampling (temperature, top_k, top_p, repetition_penalty, where the family takes them)
        and the model family's request options (e.g. language). `cache` (with a result cache):
        None stores and reuses deterministic requests only, True also a sampled one (made once,
        then replayed), False neither looks up nor stores (a request with timestamps is never
        cached). `deadline` (time.monotonic() seconds), `priority` (lower first) and `cancel`
        (a CancelToken the caller may fire) order and stop the work in the scheduler."""
        timing = Timing(deadline=deadline, priority=priority, cancel=cancel)
        if progress is not None and not callable(progress):
            raise InputError(f"progress must be callable (done, total), got {shown(progress)}")
        _refuse_cancelled(timing)
        shaping = {"ssml": ssml, "speed": speed, "sentence_silence": sentence_silence}
        if timestamps is True:
            cache = False  # cached audio carries no word timings
        digest, value = self.caching.recall(text, voice, seed, {**options, **shaping}, cache)
        if value is None:
            plan = self.planner.plan(text, seed, options, timestamps=timestamps, **shaping)
            prompt = self.voice(voice)
            key = self.caching.key(plan, prompt, digest, cache)
            if key is None:
                samples, words = self.executor.synthesize(plan, prompt, timing, progress)
                return Audio(samples, self.sample_rate, words if timestamps else None)
            sentences = self.caching.sentence_keys(plan, prompt)

            def compute() -> dict[str, np.ndarray]:
                samples, _ = self.executor.synthesize(
                    plan,
                    prompt,
                    timing,
                    progress,
                    known=self.caching.known_sentences(sentences),
                    made=lambda index, made: self.caching.store_sentence(sentences[index], made),
                )
                return Audio(samples, self.sample_rate).as_value()

            # Single flight: concurrent identical requests synthesise once.
            value = self.caching.results.get_or_compute(key, compute)  # type: ignore[union-attr]
        elif progress is not None:
            progress(1, 1)
        return Audio(np.array(value["samples"]), int(value["sample_rate"]))

    # -- streaming -----------------------------------------------------------------------------
    def streaming_options(self, **overrides: int | None) -> StreamingOptions:
        """The model's streaming window defaults (bundle.json "streaming") with overrides
        (None = default), checked: e.g. a stride smaller than the overlap is an InputError."""
        return StreamingOptions.resolve(
            self.model.streaming_defaults, int(self.model.hop_length), **overrides
        )

    def stream(
        self,
        text: str | bytes,
        voice: VoiceLike = None,
        seed: int | None = None,
        *,
        first_chunk_frames: int | None = None,
        stride_frames: int | None = None,
        overlap_frames: int | None = None,
        holdback_frames: int | None = None,
        crossfade_samples: int | None = None,
        cache: bool | None = None,
        ssml: bool | None = None,
        speed: float = 1.0,
        sentence_silence: float | None = None,
        timestamps: bool = False,
        deadline: float | None = None,
        clock: PlaybackClock | None = None,
        priority: int = 0,
        cancel: CancelToken | None = None,
        **options: Any,
    ) -> AudioStream | ReadyChunks:
        """Speak `text` as float32 chunks at `sample_rate`, yielded as frames are generated.

        The chunks concatenate to the length of synthesize()'s output for the same text, voice
        and seed (and to the same samples when the windows are wide enough for the vocoder;
        see onnx_tts.vocoder). Options and text are checked here, before the first chunk
        (markup, speed, sentence_silence and timestamps as in synthesize(); with timestamps the
        stream's `words` grows by each sentence's words once it was handed out). Closing the
        iterator early (or breaking out of the loop) stops generation and frees its rows. The
        stream can also be polled (`poll()`, `listen(callback)`: an event loop serving many
        streams). `cache`: as in synthesize(). `deadline` (first audio, time.monotonic()
        seconds; default now), `clock` (the listener's player: once audio flows, the stream is
        due when it would run dry), `priority` and `cancel` order and stop the work.
        """
        window = self.streaming_options(
            first_chunk_frames=first_chunk_frames,
            stride_frames=stride_frames,
            overlap_frames=overlap_frames,
            holdback_frames=holdback_frames,
            crossfade_samples=crossfade_samples,
        )
        timing = Timing(
            deadline=Timing.now() if deadline is None else deadline,
            clock=clock,
            priority=priority,
            cancel=cancel,
        )
        _refuse_cancelled(timing)
        shaping = {"ssml": ssml, "speed": speed, "sentence_silence": sentence_silence}
        if timestamps is True:
            cache = False  # cached audio carries no word timings
        digest, hit = self.caching.recall(text, voice, seed, {**options, **shaping}, cache)
        stream_key = None
        if hit is None:
            plan = self.planner.plan(text, seed, options, timestamps=timestamps, **shaping)
            prompt = self.voice(voice)
            key = self.caching.key(plan, prompt, digest, cache)
            if key is not None:
                stream_key = self.caching.stream_key(key, window)
                hit = self.caching.stream_hit(key, window)
        if hit is not None:  # the cached audio at once, in the stream's chunk sizes
            hop = int(self.model.hop_length)
            sizes = window.first_chunk_frames * hop, window.stride_frames * hop
            return ReadyChunks(replay_chunks(hit["samples"], *sizes))
        stream = self.executor.stream(plan, prompt, window, timing)
        if stream_key is not None:
            stream.on_complete = lambda samples: self.caching.store_stream(stream_key, samples)
        return _owned(stream, self)


def _refuse_cancelled(timing: Timing) -> None:
    """A request whose token already fired is cancelled, not run (nor replayed)."""
    if timing.cancel is not None and timing.cancel.cancelled:
        raise cancelled()


def _stop_workers(
    scheduler: DecodeScheduler | DirectScheduler, executor: Executor, model: Model
) -> None:
    """Close a dropped engine's workers. From a thread of its own: the garbage collector may
    run this on one of those workers, maybe holding a stage lock the closing waits for."""
    parts = (scheduler, executor, model)
    threading.Thread(target=_close_parts, args=parts, name="onnx-tts-close", daemon=True).start()


def _close_parts(
    scheduler: DecodeScheduler | DirectScheduler, executor: Executor, model: Model
) -> None:
    scheduler.close()
    executor.close()
    model.close()


_Stream = TypeVar("_Stream")


def _owned(stream: _Stream, engine: Engine) -> _Stream:
    """`stream`, holding its engine: `onnx_tts.load().stream(text)` is read to its end even
    though nothing else keeps that engine."""
    stream._engine = engine  # type: ignore[attr-defined]
    return stream


__all__ = ["Audio", "Engine"]

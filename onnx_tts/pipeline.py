"""The pipeline: text + optional reference voice -> waveform, through encoder, LM and vocoder."""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from onnx_tts.audio import check_finite, load_audio, save_audio
from onnx_tts.bundle import resolve_model_dir
from onnx_tts.cache.codec import resolve_cache_secret
from onnx_tts.cache.prefix import DEFAULT_PREFIX_CACHE_BYTES, PrefixCache
from onnx_tts.cache.reference import ReferenceCache
from onnx_tts.cache.result import (
    ResultCache,
    model_identity,
    replay_chunks,
    request_digest,
    result_key,
)
from onnx_tts.cache.tiered import TieredCache
from onnx_tts.decoding import SAMPLING_KEYS, Request, SamplingOptions, check_seed, decode_solo
from onnx_tts.decoding.scheduler import (
    MAX_BATCH_LIMIT,
    DecodeScheduler,
    FrameStream,
    RunSolo,
    batching_support,
)
from onnx_tts.errors import AudioError, InputError, OnnxTTSError, OnnxTTSWarning
from onnx_tts.families import FAMILIES, detect, family_of, load_backend
from onnx_tts.families.base import Backend, Family, LoadSettings
from onnx_tts.frontend import check_text
from onnx_tts.session import KV_MODES, SessionOptions
from onnx_tts.vocoder import StreamingOptions, stream_decode

# Pause inserted between sentences that were generated separately.
SENTENCE_PAUSE_SECONDS = 0.15

VoiceLike = str | os.PathLike[str] | np.ndarray | Mapping[str, np.ndarray] | None
# Bound on ONNX Runtime threads: far above what helps on any machine, far below what exhausts
# memory (each thread has its own stack and scratch buffers).
MAX_THREADS = max(64, 4 * (os.cpu_count() or 1))
MAX_CACHE_MEMORY_BYTES = 1 << 40
MAX_CACHE_DISK_BYTES = 1 << 44
MAX_REDIS_TTL_SECONDS = 10 * 365 * 24 * 3600
DEFAULT_REFERENCE_DISK_BYTES = 1 << 30
DEFAULT_RESULT_DISK_BYTES = 4 << 30
# An encoded voice given as a dict: at most this many values per array.
MAX_VOICE_VALUES = 1 << 24
# Concurrent requests decode as rows of one batch up to this many (benchmarks/bench_batch.py).
DEFAULT_MAX_BATCH = 8


@dataclass
class Audio:
    """Synthesised speech: float32 mono samples at `sample_rate`."""

    samples: np.ndarray
    sample_rate: int

    @property
    def duration(self) -> float:
        return len(self.samples) / self.sample_rate

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write WAV/FLAC/OGG by extension, atomically (no partial file on failure)."""
        return save_audio(path, self.samples, self.sample_rate)

    def as_value(self) -> dict[str, np.ndarray]:
        """The result-cache value of this audio (samples and rate)."""
        return {"samples": self.samples, "sample_rate": np.asarray(self.sample_rate, np.int64)}


class Engine:
    """A loaded model plus its reference cache. Thread-safe for concurrent synthesize() calls."""

    def __init__(
        self,
        backend: Backend,
        cache: ReferenceCache | None,
        family: Family | None = None,
        max_batch: int = 1,
        results: ResultCache | None = None,
        prefixes: PrefixCache | None = None,
    ) -> None:
        self.backend = backend
        self.cache = cache
        self.results = results  # finished audio of deterministic requests (cache/result.py)
        self.prefixes = prefixes  # KV of voice prefixes (cache/prefix.py)
        # Texts of several sentences also store and reuse each sentence (result cache only).
        self.sentence_entries = True
        self._identity: str | None = None
        self.family = family or FAMILIES[backend.family]
        pool = backend.pool
        self.batching_unavailable = batching_support(backend.program, pool.layout, pool.mode)
        # A bundle whose streaming defaults are invalid fails at load (ModelError), not at the
        # first stream after it passed every non-streaming test.
        self.streaming_options()
        self.scheduler: DecodeScheduler | None = None
        if max_batch > 1 and self.batching_unavailable is None:
            self.scheduler = DecodeScheduler(
                backend.program, pool.layout, pool.capacity, max_batch, prefix_cache=prefixes
            )

    @property
    def sample_rate(self) -> int:
        return self.backend.sample_rate

    def info(self) -> dict[str, Any]:
        info = self.backend.info()
        if self.scheduler is not None:
            info["batching"] = {
                "batched": True,
                "max_batch": self.scheduler.max_batch,
                "slot_capacity": self.scheduler.capacity,
            }
        else:
            info["batching"] = {
                "batched": False,
                "why": self.batching_unavailable or "max_batch is 1",
            }
        return info

    def stats(self) -> dict[str, Any]:
        """Decode scheduler counters: queue length, active rows, steps, mean batch size."""
        return self.scheduler.stats() if self.scheduler is not None else {"max_batch": 1}

    def close(self) -> None:
        """Stop the decode scheduler's worker (requests still queued fail)."""
        if self.scheduler is not None:
            self.scheduler.close()

    # -- voices --------------------------------------------------------------------------------
    def voice(self, voice: VoiceLike = None) -> dict[str, np.ndarray]:
        """Encoder outputs for a reference: a file path, mono samples at the encoder's rate, or
        an already-encoded dict. Goes through the reference cache."""
        if voice is None:
            return self.backend.default_voice()
        if isinstance(voice, Mapping):
            return self._encoded_voice(voice)
        encoder = self.backend.encoder
        if isinstance(voice, np.ndarray):
            audio = voice
        elif isinstance(voice, (str, os.PathLike)):
            audio = load_audio(
                voice,
                encoder.sample_rate,
                min_seconds=encoder.min_seconds,
                max_seconds=encoder.max_seconds,
            )
        else:
            raise InputError(
                f"voice must be a file path, mono float samples or a dict from Engine.voice(), "
                f"got {type(voice).__name__}"
            )
        if self.cache is None:
            return encoder.encode(audio)
        return encoder.encode_cached(audio, self.cache)

    def _encoded_voice(self, voice: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """An already-encoded voice, checked: the encoder's outputs, numeric, finite."""
        expected = set(self.backend.encoder.output_names)
        missing = sorted(expected - set(voice))
        if missing:
            raise AudioError(
                f"encoded voice lacks {', '.join(missing)} (this model's encoder gives "
                f"{', '.join(sorted(expected))}); pass a file or samples, or a dict that "
                "Engine.voice() returned for this model"
            )
        arrays: dict[str, np.ndarray] = {}
        for name in sorted(expected):
            try:
                array = np.asarray(voice[name])
            except (TypeError, ValueError):
                array = np.asarray(None)
            if array.dtype.kind not in "iuf" or array.size > MAX_VOICE_VALUES:
                raise AudioError(f"encoded voice value {name!r} is not a numeric array")
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                raise AudioError(f"encoded voice value {name!r} holds NaN or infinite numbers")
            arrays[name] = array
        return arrays

    def _caches(self) -> dict[str, TieredCache | None]:
        return {"reference": self.cache, "result": self.results, "prefix": self.prefixes}

    def cache_stats(self) -> dict[str, Any]:
        """{"reference": ..., "result": ..., "prefix": ...}: each cache's stats ({} when off)."""
        return {name: c.stats() if c is not None else {} for name, c in self._caches().items()}

    def clear_cache(self) -> dict[str, dict[str, int]]:
        return {name: c.clear() if c is not None else {} for name, c in self._caches().items()}

    def _recall(
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
            self._identity = model_identity(self.backend)
        # A request that asked for caching has its own alias: auto requests never replay it.
        given = {**options, "\x00cache": True} if cache else options
        digest = request_digest(self._identity, text, voice, seed, given)
        return digest, self.results.recall(digest)

    def _result_key(
        self, chunks, sampling: SamplingOptions, options, prompt, digest, cache: bool | None
    ) -> str | None:
        """Result-cache key of a deterministic (greedy or seeded) request, or of any request
        with cache=True (a sampled one is then made once and replayed), else None."""
        sampled = sampling.temperature > 0 and sampling.seed is None
        if self.results is None or cache is False or (sampled and not cache):
            return None
        key = result_key(self._identity or "", chunks, prompt, sampling, options)
        if key is not None:
            self.results.remember(digest, key)
        return key

    # -- synthesis -----------------------------------------------------------------------------
    def _plan(
        self, text: str | bytes, seed: int | None, options: Mapping[str, Any]
    ) -> tuple[list[Any], SamplingOptions, dict[str, Any]]:
        """Check everything a request gives before any work: text, seed, sampling options and
        the family's request options (an unknown keyword is an InputError naming the valid
        ones)."""
        text = check_text(text)
        sampling = {k: v for k, v in options.items() if k in SAMPLING_KEYS}
        family_options = {k: v for k, v in options.items() if k not in SAMPLING_KEYS}
        request_names = {o.name for o in self.family.options_in("request")}
        unknown = sorted(set(family_options) - request_names)
        if unknown:
            valid = sorted({*SAMPLING_KEYS, "seed", *request_names})
            raise InputError(
                f"unknown option(s) {', '.join(unknown)} for the {self.family.name} model; "
                f"valid: {', '.join(valid)}"
            )
        checked = self.backend.request_options(self.family.check_options(family_options, "request"))
        defaults = self.backend.sampling_defaults()
        plan = defaults.with_overrides({**sampling, "seed": check_seed(seed)})
        return self.backend.text_chunks(text, checked), plan, checked

    def generate(
        self,
        chunk: Any,
        voice: Mapping[str, np.ndarray],
        sampling: SamplingOptions | None = None,
        options: Mapping[str, Any] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> Iterator[np.ndarray]:
        """The LM stage alone: complete frames of one text chunk (an item of the model's
        `backend.text_chunks()`), for an encoded voice (`voice()`), as they are generated.
        Closing the iterator stops generation and frees its KV cache."""
        request = Request(
            chunk,
            voice,
            sampling or self.backend.sampling_defaults(),
            self.backend.request_options(options or {}),
        )
        program = self.backend.program
        if self.scheduler is None or not program.batchable(request):
            return decode_solo(program, self.backend.pool, request, should_stop, self.prefixes)
        # Submitted now (not at first iteration), so a text's sentences decode side by side.
        return self._scheduled(self.scheduler.submit(request, should_stop), request, should_stop)

    def _scheduled(
        self,
        stream: FrameStream,
        request: Request,
        should_stop: Callable[[], bool] | None,
    ) -> Iterator[np.ndarray]:
        try:
            try:
                first = next(stream)
            except RunSolo:  # needs more KV than a batch row holds
                yield from decode_solo(
                    self.backend.program, self.backend.pool, request, should_stop, self.prefixes
                )
                return
            except StopIteration:
                return
            yield first
            yield from stream
        finally:
            stream.close()

    def _frames(
        self,
        chunk: Any,
        voice: Mapping[str, np.ndarray],
        sampling: SamplingOptions,
        options: Mapping[str, Any],
        index: int,
    ) -> Iterator[np.ndarray]:
        return self.generate(chunk, voice, sampling.for_chunk(index), options)

    def synthesize(
        self,
        text: str | bytes,
        voice: VoiceLike = None,
        seed: int | None = None,
        progress: Callable[[int, int], None] | None = None,
        cache: bool | None = None,
        **options: Any,
    ) -> Audio:
        """Speak `text` (in the voice of `voice` when given). Same seed -> same samples.

        `options`: sampling (temperature, top_k, top_p, repetition_penalty) and the model
        family's request options (e.g. language). `cache` (with a result cache): None stores
        and reuses deterministic requests only, True also a sampled one (made once, then
        replayed), False neither looks up nor stores."""
        digest, value = self._recall(text, voice, seed, options, cache)
        if value is None:
            chunks, sampling, checked = self._plan(text, seed, options)
            prompt = self.voice(voice)
            key = self._result_key(chunks, sampling, checked, prompt, digest, cache)
            if key is None:
                return self._synthesize(chunks, sampling, checked, prompt, progress)
            sentences = self._sentence_keys(chunks, sampling, checked, prompt)
            # Single flight: concurrent identical requests synthesise once.
            value = self.results.get_or_compute(
                key,
                lambda: self._synthesize(
                    chunks, sampling, checked, prompt, progress, sentences
                ).as_value(),
            )
        elif progress is not None:
            progress(1, 1)
        return Audio(np.array(value["samples"]), int(value["sample_rate"]))

    def _sentence_keys(self, chunks, sampling, checked, prompt) -> list[str | None]:
        """Result-cache keys of each sentence of a deterministic text of several sentences, so
        a new text reuses the sentences it shares with earlier ones. A sentence's audio is
        generated and vocoded on its own (with its own seed), so its entry is exact. A text
        of one sentence needs none: its whole-text key is that sentence's key."""
        if not self.sentence_entries or self.results is None or len(chunks) < 2:
            return [None] * len(chunks)
        identity = self._identity or ""
        return [
            result_key(identity, [chunk], prompt, sampling.for_chunk(index), checked)
            for index, chunk in enumerate(chunks)
        ]

    def _synthesize(self, chunks, sampling, checked, prompt, progress, sentence_keys=None) -> Audio:
        keys = sentence_keys or [None] * len(chunks)
        results = self.results  # not None whenever a sentence key is
        known = {}
        for index, key in enumerate(keys):
            if key is not None and (samples := results.get_sentence(key)) is not None:
                known[index] = samples
        pause = self._sentence_pause()
        pieces: list[np.ndarray] = []
        # With the batch scheduler every sentence is queued at once and decodes as its own row.
        generators = {
            index: self._frames(chunk, prompt, sampling, checked, index)
            for index, chunk in enumerate(chunks)
            if index not in known
        }
        try:
            for index in range(len(chunks)):
                if index in known:
                    samples = known[index]
                else:
                    frames = list(generators[index])
                    samples = (
                        self._vocode(np.stack(frames), prompt)
                        if frames
                        else np.zeros(0, np.float32)
                    )
                    if keys[index] is not None:
                        results.put_sentence(keys[index], samples, self.sample_rate)
                if index:
                    pieces.append(pause)
                if samples.size:
                    pieces.append(samples)
                if progress is not None:
                    progress(index + 1, len(chunks))
        finally:
            for generator in generators.values():  # on an error, the others stop at once
                generator.close()
        samples = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
        return Audio(samples.astype(np.float32, copy=False), self.sample_rate)

    def _vocode(self, frames: np.ndarray, prompt: Mapping[str, np.ndarray]) -> np.ndarray:
        # A model that yields NaN/inf must never reach a speaker, a file or a cache.
        samples = self.backend.vocode(frames, prompt)
        check_finite(samples, "the model's audio")
        return samples

    # -- streaming -----------------------------------------------------------------------------
    def _sentence_pause(self) -> np.ndarray:
        """The silence between separately generated sentences (same in synthesize and stream)."""
        return np.zeros(int(SENTENCE_PAUSE_SECONDS * self.sample_rate), np.float32)

    def streaming_options(self, **overrides: int | None) -> StreamingOptions:
        """The model's streaming window defaults (bundle.json "streaming") with overrides
        (None = default), checked: e.g. a stride smaller than the overlap is an InputError."""
        return StreamingOptions.resolve(
            self.backend.streaming_defaults, int(self.backend.hop_length), **overrides
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
        **options: Any,
    ) -> Iterator[np.ndarray]:
        """Speak `text` as float32 chunks at `sample_rate`, yielded as frames are generated.

        The chunks concatenate to the length of synthesize()'s output for the same text, voice
        and seed (and to the same samples when the windows are wide enough for the vocoder;
        see onnx_tts.vocoder). Options and text are checked here, before the first chunk.
        Closing the iterator early (or breaking out of the loop) stops generation and
        returns the KV cache to its pool. `cache`: as in synthesize().
        """
        window = self.streaming_options(
            first_chunk_frames=first_chunk_frames,
            stride_frames=stride_frames,
            overlap_frames=overlap_frames,
            holdback_frames=holdback_frames,
            crossfade_samples=crossfade_samples,
        )
        digest, hit = self._recall(text, voice, seed, options, cache)
        stream_key = None
        if hit is None:
            chunks, sampling, checked = self._plan(text, seed, options)
            prompt = self.voice(voice)
            key = self._result_key(chunks, sampling, checked, prompt, digest, cache)
            if key is not None:
                # Streamed audio depends on the windows: it is stored under its own key (the
                # counted lookup); synthesize()'s one-shot entry serves a stream too (uncounted).
                stream_key = hashlib.sha256(f"{key}/stream/{window!r}".encode()).hexdigest()
                hit = self.results.lookup(stream_key) or self.results.get(key)
        if hit is not None:  # the cached audio at once, in the stream's chunk sizes
            hop = int(self.backend.hop_length)
            sizes = window.first_chunk_frames * hop, window.stride_frames * hop
            return replay_chunks(hit["samples"], *sizes)
        chunks_out = self._stream_chunks(chunks, sampling, checked, prompt, window)
        return chunks_out if stream_key is None else self._storing(chunks_out, stream_key)

    def _storing(self, chunks: Iterator[np.ndarray], key: str) -> Iterator[np.ndarray]:
        """Yield `chunks`; once all of them were yielded (not on a cancelled stream), store
        their audio in the result cache. A failing cache never fails the stream."""
        pieces = []
        for chunk in chunks:
            pieces.append(chunk)
            yield chunk
        if self.results is not None:
            samples = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
            try:
                self.results.put_audio(key, samples, self.sample_rate)
            except OnnxTTSError as error:
                warnings.warn(f"result not cached: {error}", OnnxTTSWarning, stacklevel=2)

    def _stream_chunks(
        self,
        chunks: list[Any],
        sampling: SamplingOptions,
        options: Mapping[str, Any],
        prompt: Mapping[str, np.ndarray],
        window: StreamingOptions,
    ) -> Iterator[np.ndarray]:
        hop_length = int(self.backend.hop_length)

        def vocode(codes: np.ndarray) -> np.ndarray:
            return self._vocode(codes, prompt)

        for index, chunk in enumerate(chunks):
            if index:
                yield self._sentence_pause()
            frames = self._frames(chunk, prompt, sampling, options, index)
            # stream_decode closes `frames` when it is closed: an abandoned stream stops the
            # LM loop and releases its KV cache at once, not at garbage collection.
            pieces = stream_decode(frames, vocode, window, hop_length)
            try:
                yield from pieces
            finally:
                pieces.close()


def load(
    model: str | os.PathLike[str] | None = None,
    kv: str | None = None,
    threads: int = 0,
    providers: tuple[str, ...] = ("CPUExecutionProvider",),
    cache_dir: str | os.PathLike[str] | None = "default",
    cache_memory_bytes: int = 256 << 20,
    redis_url: str | None = None,
    max_batch: int = DEFAULT_MAX_BATCH,
    result_cache_bytes: int | None = None,
    result_cache_dir: str | os.PathLike[str] | None = "default",
    prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES,
    cache_disk_bytes: int = DEFAULT_REFERENCE_DISK_BYTES,
    result_cache_disk_bytes: int = DEFAULT_RESULT_DISK_BYTES,
    redis_ttl_seconds: int | None = None,
    cache_secret: str | bytes | None = None,
    **family_options: Any,
) -> Engine:
    """Load a model directory (default: the bundled trained voice) into an Engine.

    kv: "copy", "chain" or "inplace" (default: the model's own default).
    threads: ONNX Runtime intra-op threads (0 = one per core).
    cache_dir: disk tier of the reference cache ("default" = user cache dir, None = off).
    max_batch: most requests decoded as rows of one LM batch (1 = each request alone on its
    own cache; models whose LM cannot batch always run alone, `info()["batching"]` says why).
    result_cache_bytes: memory budget of the result cache (finished audio of greedy or seeded
    requests; None = no result cache, 0 = only its disk/Redis tiers); result_cache_dir: its
    disk tier ("default" = user cache dir, None = off); it shares redis_url.
    prefix_cache_bytes: memory budget of the voice-prefix KV cache (families whose LM input
    starts with voice conditioning prefill it once per voice; 0 = off).
    cache_disk_bytes, result_cache_disk_bytes: bounds of the two disk tiers (least recently
    used files are removed past them); redis_ttl_seconds: expiry of both caches' Redis entries
    (None: kept until Redis evicts them by its maxmemory policy).
    cache_secret: sign the disk and Redis entries of both caches (HMAC-SHA256 over key and
    value) and refuse unsigned or mis-signed ones, for tiers others can write to (default:
    $ONNX_TTS_CACHE_SECRET, else unsigned).
    family_options: the family's load options (`onnx-tts info` lists them), e.g. precision
    or exaggeration for Chatterbox exports.
    """
    for name, value in (("model", model), ("cache_dir", cache_dir)):
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise InputError(f"{name} must be a directory path or None, got {value!r}")
    if redis_url is not None and not isinstance(redis_url, str):
        raise InputError(f"redis_url must be a redis:// URL string or None, got {redis_url!r}")
    if kv is not None and not isinstance(kv, str):
        raise InputError(f"kv must be one of {', '.join(KV_MODES)}, got {kv!r}")
    if not _int_in(threads, 0, MAX_THREADS):
        raise InputError(
            f"threads must be an integer in [0, {MAX_THREADS}] (0 = one per core), got {threads!r}"
        )
    if isinstance(providers, str) or not all(isinstance(p, str) for p in providers):
        raise InputError(f"providers must be a sequence of provider names, got {providers!r}")
    if not _int_in(cache_memory_bytes, 0, MAX_CACHE_MEMORY_BYTES):
        raise InputError(
            f"cache_memory_bytes must be an integer in [0, {MAX_CACHE_MEMORY_BYTES}], got "
            f"{cache_memory_bytes!r}"
        )
    if not _int_in(max_batch, 1, MAX_BATCH_LIMIT):
        raise InputError(
            f"max_batch must be an integer in [1, {MAX_BATCH_LIMIT}], got {max_batch!r}"
        )
    if result_cache_bytes is not None and not _int_in(
        result_cache_bytes, 0, MAX_CACHE_MEMORY_BYTES
    ):
        raise InputError(
            f"result_cache_bytes must be None (off) or an integer in [0, "
            f"{MAX_CACHE_MEMORY_BYTES}], got {result_cache_bytes!r}"
        )
    if not _int_in(prefix_cache_bytes, 0, MAX_CACHE_MEMORY_BYTES):
        raise InputError(
            f"prefix_cache_bytes must be an integer in [0, {MAX_CACHE_MEMORY_BYTES}] (0 = off), "
            f"got {prefix_cache_bytes!r}"
        )
    for name, value in (
        ("cache_disk_bytes", cache_disk_bytes),
        ("result_cache_disk_bytes", result_cache_disk_bytes),
    ):
        if not _int_in(value, 1, MAX_CACHE_DISK_BYTES):
            raise InputError(
                f"{name} must be an integer in [1, {MAX_CACHE_DISK_BYTES}], got {value!r}"
            )
    if redis_ttl_seconds is not None and not _int_in(redis_ttl_seconds, 1, MAX_REDIS_TTL_SECONDS):
        raise InputError(
            f"redis_ttl_seconds must be None or an integer in [1, {MAX_REDIS_TTL_SECONDS}], got "
            f"{redis_ttl_seconds!r}"
        )
    secret = resolve_cache_secret(cache_secret)
    root = resolve_model_dir(model)
    detection = detect(root, family_options)
    session_options = SessionOptions(providers=tuple(providers), intra_op_threads=threads)
    backend = load_backend(detection, LoadSettings(kv, session_options), family_options)
    cache = ReferenceCache(
        memory_bytes=cache_memory_bytes,
        disk_dir=cache_dir,
        redis_url=redis_url,
        redis_ttl_seconds=redis_ttl_seconds,
        disk_max_bytes=cache_disk_bytes,
        secret=secret,
    )
    results = None
    if result_cache_bytes is not None:
        results = ResultCache(
            result_cache_bytes,
            disk_dir=result_cache_dir,
            redis_url=redis_url,
            redis_ttl_seconds=redis_ttl_seconds,
            disk_max_bytes=result_cache_disk_bytes,
            secret=secret,
            sample_rate=backend.sample_rate,
        )
    prefixes = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes else None
    return Engine(backend, cache, family_of(detection), max_batch, results, prefixes)


def _int_in(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high

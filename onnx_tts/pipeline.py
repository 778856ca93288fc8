"""The pipeline: text + optional reference voice -> waveform, through encoder, LM and vocoder."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from onnx_tts.audio import load_audio, save_audio
from onnx_tts.bundle import resolve_model_dir
from onnx_tts.errors import InputError, ModelError
from onnx_tts.frontend import check_text
from onnx_tts.generator import SamplingOptions
from onnx_tts.refcache import ReferenceCache
from onnx_tts.session import KV_MODES, SessionOptions
from onnx_tts.vocoder import StreamingOptions, stream_decode

# Pause inserted between sentences that were generated separately.
SENTENCE_PAUSE_SECONDS = 0.15

VoiceLike = str | os.PathLike[str] | np.ndarray | dict[str, np.ndarray] | None


class Backend(Protocol):
    """What a model family provides to the engine (see families/)."""

    family: str
    sample_rate: int
    hop_length: int  # samples per codec frame (streaming windows are counted in frames)
    kv_mode: str
    streaming_defaults: dict[str, Any]

    @property
    def encoder(self) -> Any: ...  # onnx_tts.encoder.VoiceEncoder
    def info(self) -> dict[str, Any]: ...
    def default_voice(self) -> dict[str, np.ndarray]: ...
    def text_chunks(self, text: str) -> list[Any]: ...
    def sampling(self, **overrides: Any) -> SamplingOptions: ...
    def generate(
        self,
        chunk: Any,
        voice: dict[str, np.ndarray],
        sampling: SamplingOptions,
        should_stop: Callable[[], bool] | None = None,
    ) -> Iterator[np.ndarray]: ...
    def vocode(self, frames: np.ndarray, voice: dict[str, np.ndarray]) -> np.ndarray: ...


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


class Engine:
    """A loaded model plus its reference cache. Thread-safe for concurrent synthesize() calls."""

    def __init__(self, backend: Backend, cache: ReferenceCache | None) -> None:
        self.backend = backend
        self.cache = cache

    @property
    def sample_rate(self) -> int:
        return self.backend.sample_rate

    def info(self) -> dict[str, Any]:
        return self.backend.info()

    # -- voices --------------------------------------------------------------------------------
    def voice(self, voice: VoiceLike = None) -> dict[str, np.ndarray]:
        """Encoder outputs for a reference: a file path, mono samples at the encoder's rate, or
        an already-encoded dict. Goes through the reference cache."""
        if voice is None:
            return self.backend.default_voice()
        if isinstance(voice, dict):
            return voice
        encoder = self.backend.encoder
        if isinstance(voice, np.ndarray):
            audio = voice
        else:
            audio = load_audio(
                voice,
                encoder.sample_rate,
                min_seconds=encoder.min_seconds,
                max_seconds=encoder.max_seconds,
            )
        if self.cache is None:
            return encoder.encode(audio)
        return encoder.encode_cached(audio, self.cache)

    def cache_stats(self) -> dict[str, Any]:
        return self.cache.stats() if self.cache is not None else {}

    def clear_cache(self) -> dict[str, int]:
        return self.cache.clear() if self.cache is not None else {}

    # -- synthesis -----------------------------------------------------------------------------
    def _plan(
        self, text: str | bytes, seed: int | None, sampling: dict[str, Any]
    ) -> tuple[list[Any], SamplingOptions]:
        text = check_text(text)
        options = self.backend.sampling(seed=seed, **sampling)
        return self.backend.text_chunks(text), options

    @staticmethod
    def _chunk_sampling(options: SamplingOptions, index: int) -> SamplingOptions:
        # Each sentence gets its own derived seed so results do not depend on chunking order.
        return (
            options if options.seed is None else options.with_overrides(seed=options.seed + index)
        )

    def synthesize(
        self,
        text: str | bytes,
        voice: VoiceLike = None,
        seed: int | None = None,
        progress: Callable[[int, int], None] | None = None,
        **sampling: Any,
    ) -> Audio:
        """Speak `text` (in the voice of `voice` when given). Same seed -> same samples."""
        chunks, options = self._plan(text, seed, sampling)
        prompt = self.voice(voice)
        pause = self._sentence_pause()
        pieces: list[np.ndarray] = []
        for index, chunk in enumerate(chunks):
            frames = list(
                self.backend.generate(chunk, prompt, self._chunk_sampling(options, index))
            )
            codes = np.stack(frames) if frames else np.zeros((0, 1), np.float32)
            if index:
                pieces.append(pause)
            if frames:
                pieces.append(self.backend.vocode(codes, prompt))
            if progress is not None:
                progress(index + 1, len(chunks))
        samples = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
        return Audio(samples.astype(np.float32, copy=False), self.sample_rate)

    # -- streaming -----------------------------------------------------------------------------
    def _sentence_pause(self) -> np.ndarray:
        """The silence between separately generated sentences (same in synthesize and stream)."""
        return np.zeros(int(SENTENCE_PAUSE_SECONDS * self.sample_rate), np.float32)

    def streaming_options(self, **overrides: int | None) -> StreamingOptions:
        """The model's streaming window defaults (bundle.json "streaming") with overrides
        (None = default), checked: e.g. a stride smaller than the overlap is an InputError."""
        hop_length = getattr(self.backend, "hop_length", None)  # optional for a family
        if not hop_length:
            raise ModelError(
                f"the {self.backend.family!r} model family does not expose its vocoder hop "
                "length, so it cannot stream yet; use synthesize() instead"
            )
        return StreamingOptions.resolve(
            self.backend.streaming_defaults, int(hop_length), **overrides
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
        **sampling: Any,
    ) -> Iterator[np.ndarray]:
        """Speak `text` as float32 chunks at `sample_rate`, yielded as frames are generated.

        The chunks concatenate to the length of synthesize()'s output for the same text, voice
        and seed (and to the same samples when the windows are wide enough for the vocoder;
        see onnx_tts.vocoder). Options and text are checked here, before the first chunk.
        Closing the iterator early (or breaking out of the loop) stops generation and
        returns the KV cache to its pool.
        """
        window = self.streaming_options(
            first_chunk_frames=first_chunk_frames,
            stride_frames=stride_frames,
            overlap_frames=overlap_frames,
            holdback_frames=holdback_frames,
            crossfade_samples=crossfade_samples,
        )
        chunks, options = self._plan(text, seed, sampling)
        prompt = self.voice(voice)
        return self._stream_chunks(chunks, options, prompt, window)

    def _stream_chunks(
        self,
        chunks: list[Any],
        options: SamplingOptions,
        prompt: dict[str, np.ndarray],
        window: StreamingOptions,
    ) -> Iterator[np.ndarray]:
        hop_length = int(self.backend.hop_length)  # type: ignore[attr-defined]

        def vocode(codes: np.ndarray) -> np.ndarray:
            return self.backend.vocode(codes, prompt)

        for index, chunk in enumerate(chunks):
            if index:
                yield self._sentence_pause()
            frames = self.backend.generate(chunk, prompt, self._chunk_sampling(options, index))
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
    **family_options: Any,
) -> Engine:
    """Load a model directory (default: the bundled reference voice) into an Engine.

    kv: "copy", "chain" or "inplace" (default: the model's own default).
    cache_dir: disk tier of the reference cache ("default" = user cache dir, None = off).
    """
    from onnx_tts.families import CODEC_LM, PHONEME_MEL, detect

    if kv is not None and kv not in KV_MODES:
        raise InputError(f"unknown KV mode {kv!r}; choose one of {', '.join(KV_MODES)}")
    if not isinstance(threads, int) or threads < 0:
        raise InputError(f"threads must be an integer >= 0 (0 = all cores), got {threads!r}")
    root = resolve_model_dir(model)
    options = SessionOptions(providers=tuple(providers), intra_op_threads=threads)
    family = detect(root)
    backend: Backend
    if family == CODEC_LM:
        from onnx_tts.families.codec_lm import CodecLMModel

        backend = CodecLMModel(root, kv, options, **family_options)
    elif family == PHONEME_MEL:
        from onnx_tts.families.phoneme_mel import PhonemeMelModel

        unknown = sorted(k for k, v in family_options.items() if v is not None)
        if unknown:
            raise InputError(f"options {unknown} do not apply to the {family!r} model family")
        backend = PhonemeMelModel(root, kv, options)
    else:
        from onnx_tts.families.chatterbox import load_backend

        backend = load_backend(root, family, kv, options, **family_options)
    cache = ReferenceCache(memory_bytes=cache_memory_bytes, disk_dir=cache_dir, redis_url=redis_url)
    return Engine(backend, cache)

"""Request execution: a planned text's chunks go to the model's scheduler as requests (for
`synthesize` all at once, so the sentences of one text decode as parallel rows); their frames go
to the vocoder stage, which decodes them one-shot per sentence (`synthesize`) or window by
window (`stream`); the sentences are joined by a short pause."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import numpy as np

from onnx_tts.audio import check_finite
from onnx_tts.decoding.scheduler import DecodeScheduler, FrameStream
from onnx_tts.errors import EmptyAudioError
from onnx_tts.families.base import Backend
from onnx_tts.pipeline.planner import Plan, Timing
from onnx_tts.pipeline.stages import VocoderStage, VocoderStream
from onnx_tts.request import Request
from onnx_tts.vocoder import StreamingOptions

# Pause inserted between sentences that were generated separately.
SENTENCE_PAUSE_SECONDS = 0.15

Progress = Callable[[int, int], None]


class Executor:
    """Runs the plans of one model through its scheduler and its vocoder stage."""

    def __init__(self, backend: Backend, scheduler: DecodeScheduler) -> None:
        self.backend, self.scheduler = backend, scheduler
        batched = getattr(backend, "vocode_windows", None) is not None
        self.vocoder = VocoderStage(
            lambda frames, voice: backend.vocode(frames, voice),
            (lambda frames, voices: backend.vocode_windows(frames, voices)) if batched else None,
            scheduler_wake=scheduler.wake,
        )

    @property
    def sample_rate(self) -> int:
        return self.backend.sample_rate

    def pause(self) -> np.ndarray:
        """The silence between separately generated sentences (same in synthesize and stream)."""
        return np.zeros(int(SENTENCE_PAUSE_SECONDS * self.sample_rate), np.float32)

    def frames(self, request: Request) -> FrameStream:
        """Complete frames of one request as they are generated (closing stops it): the LM
        stage alone."""
        return self.scheduler.submit(request)

    def audio(self, request: Request, window: StreamingOptions | None) -> VocoderStream:
        """The samples of one request through both stages: windowed, or one-shot (`window`
        None: one chunk, every frame vocoded at once). Closing stops it."""
        stream = self.vocoder.open(request, window, int(self.backend.hop_length))
        self.scheduler.submit(request)
        return stream

    def close(self) -> None:
        self.vocoder.close()

    def vocode(self, frames: np.ndarray, voice: Mapping[str, np.ndarray]) -> np.ndarray:
        # A model that yields NaN/inf must never reach a speaker, a file or a cache.
        samples = self.backend.vocode(frames, voice)
        check_finite(samples, "the model's audio")
        return samples

    def synthesize(
        self,
        plan: Plan,
        voice: Mapping[str, np.ndarray],
        timing: Timing | None = None,
        progress: Progress | None = None,
        known: Mapping[int, np.ndarray] | None = None,
        made: Callable[[int, np.ndarray], None] | None = None,
    ) -> np.ndarray:
        """The whole text's samples. `known` sentences (from the result cache) are not
        generated; `made(index, samples)` is told each sentence that was."""
        known = known or {}
        requests = plan.requests(voice, timing)
        # Every sentence is submitted at once and decodes as its own row.
        streams = {
            index: self.audio(request, None)
            for index, request in enumerate(requests)
            if index not in known
        }
        pieces: list[np.ndarray] = []
        try:
            for index in range(len(requests)):
                if index in known:
                    samples = known[index]
                else:
                    samples = np.concatenate([np.zeros(0, np.float32), *streams[index]])
                    if not samples.size:
                        raise no_audio(requests[index].chunk, index, len(requests))
                    if made is not None:
                        made(index, samples)
                if index:
                    pieces.append(self.pause())
                if samples.size:
                    pieces.append(samples)
                if progress is not None:
                    progress(index + 1, len(requests))
        finally:
            for stream in streams.values():  # on an error, the others stop at once
                stream.close()
        samples = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
        return samples.astype(np.float32, copy=False)

    def stream(
        self,
        plan: Plan,
        voice: Mapping[str, np.ndarray],
        window: StreamingOptions,
        timing: Timing | None = None,
    ) -> Iterator[np.ndarray]:
        """Chunks of the text's audio as windows of frames are vocoded; closing the iterator
        cancels every sentence still to come."""
        requests = plan.requests(voice, timing)
        try:
            for index, request in enumerate(requests):
                if index:
                    yield self.pause()
                # Closing the audio stream cancels its request: the LM frees its row at once.
                pieces = self.audio(request, window)
                try:
                    produced = 0
                    for piece in pieces:
                        produced += len(piece)
                        yield piece
                finally:
                    pieces.close()
                if not produced:
                    raise no_audio(request.chunk, index, len(requests))
        finally:
            if requests:
                requests[0].cancel.cancel()  # shared by all: the rest never start


def no_audio(chunk: object, index: int, count: int) -> EmptyAudioError:
    """The error for a sentence the model ended without any audio: an utterance with no sound
    is never returned, written or cached as if it were speech."""
    which = f"sentence {index + 1} of {count}"
    if isinstance(chunk, str):
        which += f" ({chunk[:40]!r}{'...' if len(chunk) > 40 else ''})"
    return EmptyAudioError(
        f"the model produced no audio for {which}: it stopped at its first step; rephrase "
        "the text, or when sampling try another seed"
    )


__all__ = ["SENTENCE_PAUSE_SECONDS", "Executor", "Progress", "no_audio"]

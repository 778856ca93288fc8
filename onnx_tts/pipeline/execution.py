"""Request execution: a planned text's chunks go to the model's scheduler as requests (for
`synthesize` all at once, so the sentences of one text decode as parallel rows); their frames go
to the vocoder stage, which decodes them one-shot per sentence (`synthesize`) or window by
window (`stream`); the sentences are joined by the vocoder's pause. A plan in sequential order
(one generator for the whole text) submits each chunk once the LM finished the one before."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping

import numpy as np

from onnx_tts.audio import check_finite
from onnx_tts.decoding.direct import DirectScheduler
from onnx_tts.decoding.request import Request
from onnx_tts.decoding.scheduler import DecodeScheduler, FrameStream
from onnx_tts.errors import CancelledError, EmptyAudioError, OnnxTTSError
from onnx_tts.families.base import Model
from onnx_tts.pipeline.planner import Plan, Timing
from onnx_tts.pipeline.stages import VocoderStage, VocoderStream
from onnx_tts.pipeline.timestretch import TimeStretcher, stretch
from onnx_tts.pipeline.timings import WordTiming, time_words
from onnx_tts.session import available_cores
from onnx_tts.vocoder import StreamingOptions

Progress = Callable[[int, int], None]


class Executor:
    """Runs the plans of one model through its scheduler and its vocoder stage."""

    def __init__(self, model: Model, scheduler: DecodeScheduler | DirectScheduler) -> None:
        self.model, self.scheduler = model, scheduler
        self.vocoder = VocoderStage(
            model.vocoder,
            scheduler_wake=scheduler.wake,
            lm_idle=scheduler.idle,
            policy=scheduler.policy,
        )
        if isinstance(scheduler, DecodeScheduler):  # (a direct scheduler runs one row)
            scheduler.hold_steps = self.vocoder.hold_lm
            # While the vocoder idles, its core takes half of each step's rows (when the LM's
            # threads fit twice in the cores: --threads 0 gives it half of them).
            threads = scheduler.program.lm.options.intra_op_threads
            if 0 < 2 * threads <= available_cores():
                scheduler.second_core_free = self.vocoder.idle
        self.hop_length = int(model.hop_length)

    @property
    def sample_rate(self) -> int:
        return self.model.sample_rate

    @property
    def channels(self) -> int:
        """Channels of the model's audio: samples are [N] (mono) or [N, channels]."""
        return self.model.channels

    def silence(self, samples: int = 0) -> np.ndarray:
        """`samples` zeros shaped like the model's audio."""
        shape = (samples,) if self.channels == 1 else (samples, self.channels)
        return np.zeros(shape, np.float32)

    def pause(self, plan: Plan, requests: list[Request], index: int) -> np.ndarray:
        """The silence after chunk `index` (same in synthesize and stream): the plan's (a
        break, `sentence_silence`), else between two chunks the vocoder's pause rule."""
        seconds = plan.pause_after(index)
        if seconds is None:
            last = index == len(requests) - 1
            seconds = 0.0 if last else self.model.vocoder.pause_seconds(requests[index].chunk)
        return self.silence(int(seconds * self.sample_rate))

    def no_audio(self, requests: list[Request]) -> EmptyAudioError:
        """The error for a text none of whose chunks made any audio."""
        return no_audio([self.model.text.describe(request.chunk) for request in requests])

    def timings(self, request: Request, samples: int, rate: float, offset: int) -> list[WordTiming]:
        """The word timings of one chunk of `samples` (as made), played at `rate` from output
        sample `offset` on."""
        words = self.model.text.words(request.chunk)
        sample_rate = self.sample_rate
        return time_words(words, request.marks, samples, sample_rate, rate, offset / sample_rate)

    def frames(self, request: Request) -> FrameStream:
        """Complete frames of one request as they are generated (closing stops it): the LM
        stage alone."""
        return self.scheduler.submit(request)

    def audio(self, request: Request, window: StreamingOptions | None) -> VocoderStream:
        """The samples of one request through both stages: windowed, or one-shot (`window`
        None: one chunk, every frame vocoded at once). Closing stops it."""
        stream = self.vocoder.open(request, window, self.hop_length)
        self.scheduler.submit(request)
        return stream

    def close(self) -> None:
        self.vocoder.close()

    def vocode(self, frames: np.ndarray, voice: Mapping[str, np.ndarray]) -> np.ndarray:
        # A model that yields NaN/inf must never reach a speaker, a file or a cache.
        samples = self.model.vocoder.vocode(frames, voice)
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
    ) -> tuple[np.ndarray, list[WordTiming]]:
        """The whole text's samples, and its word timings when the plan asks for them. `known`
        sentences (from the result cache, as made, before any speed) are not generated;
        `made(index, samples)` is told each sentence that was."""
        known = known or {}
        requests = self.requests(plan, voice, timing)
        cancel = requests[0].cancel  # shared by every chunk of the text
        if cancel.cancelled:
            raise cancelled()
        streams = _OneShotStreams(self, requests, sequential=plan.sequential)
        if not plan.sequential:  # every sentence at once, each decoding as its own row
            for index in range(len(requests)):
                if index not in known:
                    streams.start(index)
        pieces: list[np.ndarray] = [self.silence(round(plan.lead * self.sample_rate))]
        words: list[WordTiming] = []
        spoken = False
        try:
            for index, request in enumerate(requests):
                if index in known:
                    samples = known[index]
                else:
                    parts = [piece for piece in streams.get(index) if len(piece)]
                    samples = np.concatenate([self.silence(), *parts])
                    if cancel.cancelled:  # its frames may have been cut short
                        raise streams.failure() or cancelled()
                    # A sentence the model ended at once adds nothing (its pause stays, as the
                    # published runtimes do) and is never stored as a sentence of its own.
                    if made is not None and samples.size:
                        made(index, samples)
                spoken = spoken or bool(samples.size)
                rate = plan.rate(index)
                played = stretch(samples, rate, self.sample_rate) if rate != 1.0 else samples
                if plan.timestamps:
                    offset = sum(len(piece) for piece in pieces)
                    words += self.timings(request, len(samples), rate, offset)
                pieces += [played, self.pause(plan, requests, index)]
                if progress is not None:
                    progress(index + 1, len(requests))
        finally:
            streams.close()  # on an error, the others stop at once
        if not spoken:
            raise self.no_audio(requests)
        samples = np.concatenate(pieces) if pieces else self.silence()
        return samples.astype(np.float32, copy=False), words

    def stream(
        self,
        plan: Plan,
        voice: Mapping[str, np.ndarray],
        window: StreamingOptions,
        timing: Timing | None = None,
    ) -> AudioStream:
        """The text's audio as windows of frames are vocoded (see AudioStream)."""
        return AudioStream(self, plan, self.requests(plan, voice, timing), window)

    def requests(
        self, plan: Plan, voice: Mapping[str, np.ndarray], timing: Timing | None
    ) -> list[Request]:
        """The plan's requests, each primed as the vocoder says for this voice and these
        options (checked now: a request that cannot be primed fails before any work)."""
        return plan.requests(voice, timing, self.model.vocoder.prime_frames(voice, plan.options))


class _OneShotStreams:
    """The one-shot streams of a text's chunks for `Executor.synthesize`. In sequential order
    chunk i + 1 is submitted when the LM finished chunk i (or when the consumer reaches it,
    whichever comes first: only after chunk i ended either way)."""

    def __init__(self, executor: Executor, requests: list[Request], sequential: bool) -> None:
        self.executor, self.requests, self.sequential = executor, requests, sequential
        self.streams: dict[int, VocoderStream] = {}
        self._lock = threading.Lock()
        self._closed = False

    def start(self, index: int) -> None:
        with self._lock:
            if self._closed or index >= len(self.requests) or index in self.streams:
                return
            request = self.requests[index]
            stream = self.executor.vocoder.open(request, None, self.executor.hop_length)
            if self.sequential:
                stream.on_lm_done = lambda: self.start(index + 1)
            self.streams[index] = stream
        self.executor.scheduler.submit(request)

    def get(self, index: int) -> VocoderStream:
        self.start(index)  # (already started unless the consumer is ahead of the LM)
        return self.streams[index]

    def failure(self) -> BaseException | None:
        """The first error a chunk failed with (it cancelled its siblings: that error, not
        the cancellation, is what the caller is told)."""
        with self._lock:
            streams = list(self.streams.values())
        return first_failure(streams)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            streams = list(self.streams.values())
        for stream in streams:
            stream.close()


class AudioStream:
    """The audio of one text as it is made: each sentence's windows in order, a pause between.

    Sentence 0 is submitted at once; sentence i+1 as soon as the LM has finished sentence i,
    so its decoding overlaps the vocoding of the one before. Iterate it (blocking), or poll it
    (`poll()`, with `listen(callback)` to be told from another thread when something is ready:
    an event loop serves many streams without a thread each). Closing it cancels every
    sentence still to come and frees their rows. `on_complete(samples)`, when set, receives
    the whole audio once every chunk was handed out (not for a closed stream). A chunk with a
    speed of its own is time-stretched as it streams; with word timings asked for, `words`
    grows by each chunk's words once the chunk's last samples were handed out."""

    def __init__(
        self,
        executor: Executor,
        plan: Plan,
        requests: list[Request],
        window: StreamingOptions,
    ) -> None:
        self.executor, self.plan, self.requests, self.window = executor, plan, requests, window
        self.words: list[WordTiming] = []
        self.on_complete: Callable[[np.ndarray], None] | None = None
        self._listener: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self._streams: list[VocoderStream | None] = [None] * len(requests)
        self._index = 0
        self._pause_due = False
        self._pieces: list[np.ndarray] = []
        self._closed = False
        self._failure: BaseException | None = None
        self._produced = 0  # samples of the current sentence as made (before its speed)
        self._emitted = 0  # samples handed out so far
        # Silence (a lead, pauses) is held back until the first sound: a text with no audio
        # at all is an error before anything went out, never silence and then an error.
        self._spoken = False
        self._held = 0
        self._stretcher: TimeStretcher | None = None
        self._lead = round(plan.lead * executor.sample_rate)
        if requests:
            self._open(0)

    def _open(self, index: int) -> None:
        """Start sentence `index` (from the consumer, or from the scheduler's thread when the
        sentence before it finished). A failure to start is the consumer's error."""
        with self._lock:
            if self._closed or index >= len(self.requests) or self._streams[index] is not None:
                return
            request = self.requests[index]
            # A chunk whose samples depend on all of it (the family says) is vocoded whole.
            whole = self.executor.model.vocoder.whole_chunks(request.options)
            try:
                stream = self.executor.vocoder.open(
                    request, None if whole else self.window, self.executor.hop_length
                )
            except OnnxTTSError as error:  # the engine is closing
                self._failure = error
                return
            stream.on_ready = self._ready
            stream.on_lm_done = lambda: self._open(index + 1)
            self._streams[index] = stream
        try:
            self.executor.scheduler.submit(self.requests[index])
        except OnnxTTSError as error:
            stream.fail(error)

    def _ready(self) -> None:
        listener = self._listener
        if listener is not None:
            listener()

    def listen(self, callback: Callable[[], None]) -> None:
        """Call `callback` (from a worker thread) whenever samples, the end or an error may
        be ready; it is called once now."""
        self._listener = callback
        callback()

    def __iter__(self) -> Iterator[np.ndarray]:
        return self

    def __next__(self) -> np.ndarray:
        chunk = self._next(block=True)
        assert chunk is not None
        return chunk

    def poll(self) -> np.ndarray | None:
        """The next chunk if one is ready, else None; StopIteration at the end."""
        return self._next(block=False)

    def _next(self, block: bool) -> np.ndarray | None:
        while True:
            if self._closed:
                raise StopIteration
            if self.requests and self.requests[0].cancel.cancelled:
                # Cancelled by its token's holder (or a failed sentence cancelled the rest):
                # an error, never a stream that ends early as if it were whole.
                failure = first_failure(self._streams)
                self.close()
                raise failure or cancelled()
            if self._lead:
                lead, self._lead = self._lead, 0
                self._held += lead
                continue
            if self._pause_due:
                self._pause_due = False
                pause = self.executor.pause(self.plan, self.requests, self._index - 1)
                if len(pause) and self._spoken and not self._held:
                    return self._keep(pause)
                self._held += len(pause)
                continue
            if self._index >= len(self.requests):
                if not self._spoken:  # no sentence made a sound
                    self.close()
                    raise self.executor.no_audio(self.requests)
                if self._held:
                    return self._keep(self._after_held(self.executor.silence()))
                self._finish()
                raise StopIteration
            stream = self._streams[self._index]
            if stream is None:  # not started yet (the consumer is ahead of the LM)
                self._open(self._index)
                stream = self._streams[self._index]
                if stream is None:
                    self.close()
                    raise self._failure or OnnxTTSError("the engine is closed")
            try:
                chunk = stream.next_chunk(block)
            except StopIteration:
                if self.requests[self._index].cancel.cancelled:
                    continue  # (said at the top of the loop)
                # (a sentence without sound adds nothing but its pause, as published)
                tail = self._end_chunk()
                if len(tail):
                    return self._keep(self._after_held(tail))
                continue
            except BaseException:
                self.close()
                raise
            if chunk is None:
                return None
            self._produced += len(chunk)
            self._spoken = self._spoken or bool(len(chunk))
            played = self._played(chunk)
            if not len(played):
                continue
            return self._keep(self._after_held(played))

    def _after_held(self, samples: np.ndarray) -> np.ndarray:
        """`samples`, after the silence held back until now (see `_held`)."""
        if not self._held:
            return samples
        held, self._held = self.executor.silence(self._held), 0
        return np.concatenate([held, samples])

    def _played(self, chunk: np.ndarray) -> np.ndarray:
        """`chunk` at its sentence's speed (time-stretched when the plan asks for one)."""
        rate = self.plan.rate(self._index)
        if rate == 1.0:
            return chunk
        if self._stretcher is None:
            channels = chunk.shape[1] if chunk.ndim == 2 else 1
            self._stretcher = TimeStretcher(rate, self.executor.sample_rate, channels)
        return self._stretcher.push(chunk)

    def _end_chunk(self) -> np.ndarray:
        """The sentence's last samples (a time-stretcher's tail), its words, and the step to
        the next sentence (after its pause)."""
        tail = self.executor.silence()
        if self._stretcher is not None:
            tail, self._stretcher = self._stretcher.finish(), None
        if self.plan.timestamps:
            rate = self.plan.rate(self._index)
            start = self._emitted + self._held + len(tail) - round(self._produced / rate)
            request = self.requests[self._index]
            self.words += self.executor.timings(request, self._produced, rate, start)
        self._index += 1
        self._produced = 0
        self._pause_due = True
        return tail

    def _keep(self, chunk: np.ndarray) -> np.ndarray:
        self._emitted += len(chunk)
        if self.on_complete is not None:
            self._pieces.append(chunk)
        return chunk

    def _finish(self) -> None:
        self._closed = True
        if self.on_complete is not None:
            samples = np.concatenate(self._pieces) if self._pieces else self.executor.silence()
            self._pieces = []
            self.on_complete(samples)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self.requests:
            self.requests[0].cancel.cancel()  # shared by all: the rest never start
        for stream in self._streams:
            if stream is not None:
                stream.close()

    def __del__(self) -> None:
        if "_closed" in vars(self):  # (a stream whose __init__ failed has nothing to close)
            self.close()


class ReadyChunks:
    """Audio that is all there already (a result-cache hit) with AudioStream's interface."""

    def __init__(self, chunks: Iterator[np.ndarray]) -> None:
        self._chunks = chunks
        self.words: list[WordTiming] = []  # a replayed result carries no word timings

    def __iter__(self) -> Iterator[np.ndarray]:
        return self

    def __next__(self) -> np.ndarray:
        return next(self._chunks)

    def poll(self) -> np.ndarray | None:
        return next(self._chunks)

    def listen(self, callback: Callable[[], None]) -> None:
        callback()

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()


def cancelled() -> CancelledError:
    return CancelledError(
        "the request was cancelled (its CancelToken fired) before its audio was complete; "
        "nothing was returned or cached"
    )


def first_failure(streams: Iterable[VocoderStream | None]) -> BaseException | None:
    """The first error one of a text's sentence streams failed with, other than a
    cancellation."""
    for stream in streams:
        failed = None if stream is None else stream.failed
        if failed is not None and not isinstance(failed, CancelledError):
            return failed
    return None


def no_audio(chunks: list[str]) -> EmptyAudioError:
    """The error for a text the model ended without any audio in any of its sentences
    (`chunks`: each as the family describes it, or ""): an utterance with no sound is never
    returned, written or cached as if it were speech. A sentence without audio among others
    that have some is no error: it adds nothing but its pause, as the published runtimes
    give it."""
    if len(chunks) == 1:
        which = "the text"
        if chunks[0]:
            which += f" ({chunks[0][:40]!r}{'...' if len(chunks[0]) > 40 else ''})"
        how = "it stopped at its first step"
    else:
        which = f"any of the {len(chunks)} sentences of the text"
        how = "each stopped at its first step"
    return EmptyAudioError(
        f"the model produced no audio for {which}: {how}; rephrase the text, or when "
        "sampling try another seed"
    )


__all__ = [
    "AudioStream",
    "Executor",
    "Progress",
    "ReadyChunks",
    "cancelled",
    "no_audio",
]

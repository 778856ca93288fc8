"""One speech request of the servers (HTTP and Wyoming): admitted by the model's capacity-aware
`Admission`, then run as an asyncio task that submits the text to the engine (the decode
scheduler and the vocoder stage do the work, most urgent stream first) and turns its audio into
events for the response: START, AUDIO (float32 at the output rate and channels; the engine
applies the speed), WORDS (with word timings asked for: the words of each sentence once its
last samples went out as AUDIO, as WordTimings in the output's seconds), END or ERROR. No
thread waits per request: the engine's stream tells the event loop when audio is ready. The
request's playback clock goes with it, so the engine knows when its listener would run dry;
its cancel token stops the work at the next step when the client goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import soxr

from onnx_tts.audio import downmix
from onnx_tts.decoding.request import CancelToken, PlaybackClock
from onnx_tts.errors import SessionError
from onnx_tts.server.engines import SpeechModel
from onnx_tts.server.threads import blocking

# Events a Generation posts to its queue.
START, AUDIO, WORDS, END, ERROR = "start", "audio", "words", "end", "error"
# A request should hear its first audio within this long of arriving (its deadline).
FIRST_AUDIO_BUDGET_SECONDS = 0.2


class ServerStopping(Exception):
    """A generation stopped because the server was told to stop at once."""


class Busy(Exception):
    """No room for the request now: `retry_after` seconds is a fair wait before retrying."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass
class Generation:
    """One request's synthesis; its events go to `events` as the audio is made."""

    model: SpeechModel
    text: str
    voice_audio: np.ndarray | str | None  # samples, a builtin voice's name, or the default
    seed: int | None
    options: dict[str, Any]
    speed: float
    output_rate: int
    output_channels: int = 1  # OpenAI's pcm: mono; the other formats: the model's channels
    ssml: bool | None = None  # None: SSML when the text starts with <speak>
    sentence_silence: float | None = None  # seconds between sentences (None: the model's)
    timestamps: bool = False  # post WORDS events
    received_at: float = field(default_factory=time.perf_counter)
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel_token: CancelToken = field(default_factory=CancelToken)
    clock: PlaybackClock = field(default_factory=PlaybackClock)
    generated_samples: int = 0  # at the model's rate, after speed (for usage tokens)
    started_at: float = 0.0
    cache_hit: bool | None = None  # the result cache replayed this audio (None: not started)
    task: asyncio.Task | None = None
    _admitted: bool = False
    _ticket: int | None = None  # its place in the admission's line, while it waits
    _stream: Any = None  # opened by `open_stream`, before `start`

    def cancel(self) -> None:
        self.cancel_token.cancel()

    @property
    def cancelled(self) -> bool:
        return self.cancel_token.cancelled

    def admit_at_once(self) -> bool:
        """(any thread) Take the model's admission now when it has room and nobody waits;
        otherwise the request takes its place in line for `admit`. Busy when the line is
        full."""
        admission = self.model.admission
        ticket = admission.enqueue(self.received_at)
        if ticket is None:
            raise Busy(
                f"the server is busy ({admission.max_waiting} requests waiting); retry shortly",
                self.model.retry_after(),
            )
        if admission.try_admit(ticket):
            self._admitted = True
            return True
        self._ticket = ticket
        return False

    async def admit(self, timeout: float) -> None:
        """Wait (first come, first served) until the model's admission lets this stream
        start; Busy when the queue is full or the wait exceeds `timeout`."""
        if self._admitted:
            return
        admission = self.model.admission
        if self._ticket is None and self.admit_at_once():
            return
        ticket = self._ticket
        deadline = time.monotonic() + timeout
        try:
            while not admission.try_admit(ticket):
                if self.cancelled:
                    raise asyncio.CancelledError
                if time.monotonic() >= deadline:
                    admission.abandon(ticket, timed_out=True)
                    raise Busy(
                        f"the server is at capacity ({admission.active} streams playing in real "
                        "time); retry shortly",
                        self.model.retry_after(),
                    )
                await asyncio.sleep(0.01)
            self._admitted = True
        except BaseException:
            admission.abandon(ticket)
            raise
        finally:
            self._ticket = None

    def open_stream(self) -> None:
        """(on a worker thread, once admitted) Open the engine's stream now, in the trip that
        planned the request: `start` then runs it without another trip to the worker pool.
        A failure gives the admission back and is raised."""
        try:
            self._stream = self._open_stream()
        except BaseException:
            self.abandon()
            raise

    def abandon(self) -> None:
        """The request ends before `start` (its client left, planning failed): an open stream
        is closed and the admission given back."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        if self._ticket is not None:
            self.model.admission.abandon(self._ticket)
            self._ticket = None
        if self._admitted and self.task is None:
            self._admitted = False
            self.model.admission.release()

    def start(self) -> None:
        """Run the synthesis as a task of the running loop (after `admit`)."""
        self.model.track(self)
        self._loop = asyncio.get_running_loop()
        self.task = self._loop.create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        stream = None
        self.started_at = time.perf_counter()
        try:
            # Opened in the planning trip (`open_stream`), else one trip to the worker pool:
            # the voice (cached encode) and the stream's start.
            stream, self._stream = self._stream, None
            if stream is None:
                stream = await blocking(self._open_stream)
            self.cache_hit = self.model.replayed(stream)
            self.events.put_nowait((START, None))

            def wake() -> None:
                loop.call_soon_threadsafe(ready.set)

            stream.listen(wake)
            await self._pump(stream, ready)
        except Exception as error:
            self.events.put_nowait((ERROR, error))
        finally:
            if stream is not None:
                stream.close()  # stops the LM and frees its rows at once
            self.model.untrack(self)

    def _open_stream(self) -> Any:
        """(on a worker thread) the voice's encoder outputs, then the engine's stream."""
        voice = self.model.encode_voice(self.voice_audio)
        return self.model.stream(
            self.text,
            voice,
            self.seed,
            {
                **self.options,
                "speed": self.speed,
                "ssml": self.ssml,
                "sentence_silence": self.sentence_silence,
                "timestamps": self.timestamps,
            },
            deadline=time.monotonic() + FIRST_AUDIO_BUDGET_SECONDS,
            clock=self.clock,
            cancel=self.cancel_token,
        )

    async def _pump(self, stream: Any, ready: asyncio.Event) -> None:
        model = self.model
        channels = self.output_channels
        resampler = (
            soxr.ResampleStream(model.sample_rate, self.output_rate, channels, dtype="float32")
            if self.output_rate != model.sample_rate
            else None
        )

        def emit(samples: np.ndarray, last: bool = False) -> None:
            if resampler is not None:
                samples = resampler.resample_chunk(samples, last=last)
            if len(samples):
                self.events.put_nowait((AUDIO, np.asarray(samples, np.float32)))

        told = 0  # words posted so far

        def tell_words() -> None:
            nonlocal told
            words = stream.words
            if self.timestamps and len(words) > told:
                self.events.put_nowait((WORDS, list(words[told:])))
                told = len(words)

        while True:
            if self.cancelled:
                return
            try:
                chunk = stream.poll()
            except StopIteration:
                break
            if chunk is None:
                tell_words()
                await ready.wait()
                ready.clear()
                continue
            # OpenAI's pcm is 24 kHz s16le mono: a stereo model's audio is downmixed for it;
            # the other formats keep the model's channels. Then the response's rate.
            if channels == 1:
                chunk = downmix(chunk)
            if not np.all(np.isfinite(chunk)):
                raise SessionError("the model produced non-finite samples; output stopped")
            self.generated_samples += len(chunk)
            emit(chunk)
            # A sentence's words are complete once its last samples were handed out: the
            # poll that returned `chunk` (a time-stretcher's tail) or the one before it.
            tell_words()
        emit(np.zeros((0, channels) if channels > 1 else 0, np.float32), last=True)
        tell_words()
        self.events.put_nowait((END, None))

    def stop(self, error: BaseException) -> None:
        """End the request now with `error` (a server told to stop at once; callable from a
        signal handler)."""
        self.cancel()
        loop = getattr(self, "_loop", None)
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                loop.call_soon_threadsafe(self.events.put_nowait, (ERROR, error))


__all__ = [
    "AUDIO",
    "END",
    "ERROR",
    "FIRST_AUDIO_BUDGET_SECONDS",
    "START",
    "WORDS",
    "Busy",
    "Generation",
    "ServerStopping",
]

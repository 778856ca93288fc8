"""The vocoder stage: every stream's windows of one model, on one worker thread.

The decode scheduler hands each request's frames to its `VocoderStream` (the request's sink);
the stage's worker decodes whatever windows are due in the order the scheduling policy gives
(by default most urgent stream first: a stream whose player is about to run dry before one
that has audio buffered; a one-shot request with no deadline last), and hands the samples to
the stream's consumer. Windows that become due
within `gather_seconds` of each other are decoded together: one vocoder call for a batch when
the family's vocoder declares that it batches exactly (`VocoderCapabilities.batches_exactly`:
`Vocoder.vocode_windows`), otherwise one call each in deadline order. So the vocoder runs
beside the LM (its own thread, its own cores) instead of inside every caller's thread, and a
slow consumer never holds either stage up: its samples wait in its own queue.

A one-shot request (`synthesize`) is a stream with a single window: all its frames, decoded
when its LM is done.

A vocoder that streams with a state of its own (a codec with causal caches:
`VocoderCapabilities.stateful_streams`) gives each streamed request one decoder
(`Vocoder.open_stream()`: `push(frames) -> samples`, `close()`), fed each window's new frames
in order (no overlap, no crossfade: the state carries the context), on the stage's thread.

A request with frames to start from (`Request.prime`: speech that continues a reference) is
decoded after them, their audio dropped: its stream's decoder is opened primed
(`Vocoder.open_primed_stream`), its one-shot window decoded by `Vocoder.vocode_after`, never
batched with other streams' windows; the audio of its first `Vocoder.unheard_frames` frames is
dropped too.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from onnx_tts.audio import check_finite
from onnx_tts.decoding.policy import SchedulingPolicy, make_policy
from onnx_tts.decoding.request import Handoff, Request
from onnx_tts.errors import OnnxTTSError
from onnx_tts.families.base import Vocoder
from onnx_tts.session import close_at_exit
from onnx_tts.vocoder import StreamingDecoder, StreamingOptions, Window

# Windows due within this long of the first one are decoded in the same round.
DEFAULT_GATHER_SECONDS = 0.002
# Most windows of one vocoder call.
MAX_VOCODER_BATCH = 16
# Most frames of one batched call: a call cannot be interrupted, so a long one holds up a
# window that becomes urgent meanwhile (a new stream's first); batching saves 10-15% per frame
# on short windows of the default voice and nothing on long ones (measured).
MAX_VOCODER_BATCH_FRAMES = 160
# Longest a decode step waits for a burst's first windows (`VocoderStage.hold_lm`): about
# three times what 8 first windows of the default voice take on two cores.
FIRST_WINDOWS_HOLD_SECONDS = 0.1
_END = object()


def threads_per_stage(cores: int) -> dict[str, int]:
    """Intra-op threads of each stage's sessions for `--threads 0`: the decode scheduler's
    worker and the vocoder stage's run at the same time, so each gets half the cores (on 2
    cores: 1 each; ORT's default of all cores per session made them fight: 2.5-3x slower under
    load). Reference encodes run beside both, rarely (cached): half the cores too."""
    half = max(1, cores // 2)
    return {"decode": half, "vocoder": max(1, cores - half), "encoder": half}


class VocoderStream:
    """One request's frames in, its samples out. The scheduler calls `put`/`end` (it is the
    request's sink); the consumer iterates the samples; closing cancels the request."""

    def __init__(
        self,
        stage: VocoderStage,
        request: Request,
        window: StreamingOptions | None,
        hop_length: int,
    ) -> None:
        self.stage, self.request = stage, request
        self.prime = request.prime
        # Samples decoded but never heard (`Vocoder.unheard_frames` of a primed request).
        self.unheard = 0
        if self.prime is not None:
            self.unheard = stage.vocoder.unheard_frames(self.prime) * hop_length
        if self.prime is not None and window is not None and not stage.stateful:
            raise OnnxTTSError("a primed request streams through a decoder with a state only")
        # A windowed stream of a model with a stateful decoder feeds it only new frames.
        self.stateful = window is not None and stage.stateful
        if self.stateful:
            assert window is not None
            window = dataclasses.replace(
                window, overlap_frames=0, holdback_frames=0, crossfade_samples=0
            )
        self._state: Any = None  # the stateful decoder, opened at the first window
        # None: one-shot, a single window of every frame once the LM is done.
        # A listener playing in real time (a clock) gets windows that grow to the stride.
        self.decoder = (
            StreamingDecoder(window, hop_length, grow=request.clock is not None)
            if window is not None
            else None
        )
        self.frames: list[np.ndarray] = []  # one-shot frames
        self.finished = False  # the LM is done (no more frames)
        self.failed: BaseException | None = None
        self.done = False  # every sample was handed out
        self.samples = Handoff()
        self._closed = False
        # Called (from the stage's or the scheduler's thread) when samples, the end or an
        # error were queued, and when the LM finished this request: an async consumer wakes.
        self.on_ready: Callable[[], None] | None = None
        self.on_lm_done: Callable[[], None] | None = None

    def _queue(self, item: Any) -> None:
        if item is _END:
            self.samples.end()
        elif isinstance(item, BaseException):
            self.samples.end(item)
        else:
            self.samples.put(item)
        if self.on_ready is not None:
            try:
                self.on_ready()
            except Exception:  # a consumer that cannot be woken (its loop closed) is gone
                self.request.cancel.cancel()

    # -- producer side (the decode scheduler) -------------------------------------------------
    def put(self, frame: np.ndarray) -> None:
        with self.stage.lock:
            if self.decoder is not None:
                self.decoder.push(frame)
            else:
                self.frames.append(np.asarray(frame))
        self.stage.notify_if_due(self)

    def end(self, error: BaseException | None = None) -> None:
        with self.stage.lock:
            self.finished = True
            if error is not None:
                self.failed = error
            elif self.decoder is not None:
                self.decoder.finish()
        self.stage.notify_if_due(self, force=True)
        if error is None and self.on_lm_done is not None:
            self.on_lm_done()

    # -- the stage ---------------------------------------------------------------------------
    def is_due(self) -> bool:
        """(under the stage lock) whether a window (or a failure) is ready, without building
        the window."""
        if self.done:
            return False
        if self.failed is not None:
            return True
        return self.decoder.window_due() if self.decoder is not None else self.finished

    def due_window(self) -> Window | np.ndarray | None:
        """(under the stage lock) the window to decode now, if any."""
        if self.done or self.failed is not None:
            return None
        if self.decoder is not None:
            return self.decoder.next_window()
        if self.finished:
            return np.stack(self.frames) if self.frames else np.zeros((0, 1), np.float32)
        return None

    def accept(self, window: Window | np.ndarray, waveform: np.ndarray) -> int:
        """(under the stage lock) the decoded waveform of `window`; returns the samples it
        handed to the consumer."""
        if self.decoder is not None:
            assert isinstance(window, Window)
            chunk = self._heard(self.decoder.accept(window, waveform))
            if len(chunk):
                self._queue(chunk)
            if self.decoder.done:
                self.done = True
                self._queue(_END)
            return len(chunk)
        samples = self._heard(np.asarray(waveform, np.float32))
        self._queue(samples)
        self.done = True
        self._queue(_END)
        return len(samples)

    def _heard(self, samples: np.ndarray) -> np.ndarray:
        if self.unheard:
            cut = min(self.unheard, len(samples))
            samples, self.unheard = samples[cut:], self.unheard - cut
        return samples

    @property
    def decodes_alone(self) -> bool:
        """Never batched with other streams' windows: it has a decoder state of its own, or
        frames of its own to start from."""
        return self.stateful or self.prime is not None

    def decode_stateful(self, codes: np.ndarray) -> np.ndarray:
        """(on the stage's thread) the next frames through this stream's own decoder."""
        if self._state is None:
            vocoder, prime = self.stage.vocoder, self.prime
            self._state = (
                vocoder.open_stream() if prime is None else vocoder.open_primed_stream(prime)
            )
        return self._state.push(codes)

    def release_state(self) -> None:
        """(on the stage's thread) hand the stateful decoder back once the stream ended."""
        if self._state is not None:
            state, self._state = self._state, None
            state.close()

    def fail(self, error: BaseException) -> None:
        self.failed = error
        self.done = True
        self._queue(error)

    # -- consumer side -----------------------------------------------------------------------
    def __iter__(self) -> Iterator[np.ndarray]:
        return self

    def __next__(self) -> np.ndarray:
        chunk = self.next_chunk(block=True)
        assert chunk is not None
        return chunk

    def next_chunk(self, block: bool) -> np.ndarray | None:
        """The next samples (None when `block` is false and none are ready yet); raises
        StopIteration at the end and the request's error if it failed."""
        if self._closed:
            raise StopIteration
        try:
            return self.samples.take(block)
        except BaseException:  # the end (StopIteration) or the request's error
            self._closed = True
            raise

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.request.cancel.cancel()
            self.stage.forget(self)
            self.stage.scheduler_wake()

    def __del__(self) -> None:
        if "_closed" in vars(self):  # (a stream whose __init__ failed has nothing to close)
            self.close()


class VocoderStage:
    """Decodes the due windows of every open stream of one model (module docstring)."""

    def __init__(
        self,
        vocoder: Vocoder,
        scheduler_wake: Callable[[], None] = lambda: None,
        gather_seconds: float = DEFAULT_GATHER_SECONDS,
        max_batch: int = MAX_VOCODER_BATCH,
        lm_idle: Callable[[], bool] | None = None,
        policy: SchedulingPolicy | None = None,
    ) -> None:
        self.vocoder = vocoder
        self.policy = make_policy(policy)  # which due windows go first
        capabilities = vocoder.capabilities
        self.batches = capabilities.batches_exactly
        self.stateful = capabilities.stateful_streams
        # While the decode scheduler has nothing to run (`lm_idle`), its core is free: two
        # streams with decoders of their own then decode at once (the windows left when a
        # burst of streams ends together otherwise wait for one another on one core).
        self.lm_idle = lm_idle
        self._beside: ThreadPoolExecutor | None = None
        self.scheduler_wake = scheduler_wake
        self.gather_seconds, self.max_batch = gather_seconds, max_batch
        # Re-entrant: an AudioStream dropped without closing is closed by the garbage
        # collector, which may run on this stage's thread while it holds the lock (its
        # close -> forget takes the lock again: with a plain Lock the stage deadlocked).
        self.lock = threading.RLock()
        self._cv = threading.Condition(self.lock)
        self.streams: set[VocoderStream] = set()
        self._due: set[VocoderStream] = set()
        self._decoding: set[VocoderStream] = set()  # taken by the worker's current round
        # Cleared while a burst's first windows decode on both cores (`hold_lm`).
        self._first_windows_done = threading.Event()
        self._first_windows_done.set()
        self._closed = False
        self._thread: threading.Thread | None = None
        # samples: audio handed to consumers (admission's cost per second of audio).
        self._stats = {"rounds": 0, "calls": 0, "windows": 0, "samples": 0, "busy_seconds": 0.0}

    def open(
        self, request: Request, window: StreamingOptions | None, hop_length: int
    ) -> VocoderStream:
        """A stream for `request` (windowed, or one-shot when `window` is None); set it as the
        request's sink before submitting the request to the scheduler."""
        stream = VocoderStream(self, request, window, hop_length)
        request.sink = stream
        with self._cv:
            if self._closed:
                raise OnnxTTSError("the engine's vocoder stage is closed")
            self.streams.add(stream)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="onnx-tts-vocoder", daemon=True
                )
                self._thread.start()
                if self.batches or (self.stateful and self.lm_idle is not None):
                    # Its thread starts now, with the stage's: a burst starts no thread.
                    self._beside = ThreadPoolExecutor(1, thread_name_prefix="onnx-tts-vocoder")
                    self._beside.submit(_nothing)
                close_at_exit(self)
        return stream

    def hold_lm(self) -> None:
        """(the decode scheduler, before a step) Wait while a burst's first windows decode as
        two halves on two cores: the step would take one of them from listeners waiting for
        their first audio, while the rows it would advance have their first window already
        (bounded: a step waits at most FIRST_WINDOWS_HOLD_SECONDS)."""
        if not self._first_windows_done.is_set():  # (every step asks: no lock when unheld)
            self._first_windows_done.wait(FIRST_WINDOWS_HOLD_SECONDS)

    def idle(self) -> bool:
        """Nothing to decode now (read without the lock: a window that becomes due meanwhile
        only waits for the step under way)."""
        return not self._due and not self._decoding

    def forget(self, stream: VocoderStream) -> None:
        """A stream closed by its consumer: its windows are dropped and its stateful decoder
        goes back to the vocoder's pool (by the worker, if it is decoding for it now)."""
        with self._cv:
            self.streams.discard(stream)
            self._due.discard(stream)
            if stream not in self._decoding:
                stream.release_state()

    def notify_if_due(self, stream: VocoderStream, force: bool = False) -> None:
        with self._cv:
            if stream in self.streams and (force or stream.is_due()):
                self._due.add(stream)
                self._cv.notify()

    def stats(self) -> dict[str, Any]:
        with self._cv:
            calls = self._stats["calls"]
            return {
                "open_streams": len(self.streams),
                "mean_vocoder_batch": self._stats["windows"] / calls if calls else 0.0,
                **self._stats,
            }

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        if self._beside is not None:
            self._beside.shutdown(wait=True)

    # -- worker ------------------------------------------------------------------------------
    def _run(self) -> None:
        leftover = False  # windows of the last round still wait: no need to gather more
        while True:
            with self._cv:
                while not self._closed and not self._due:
                    self._cv.wait()
                if self._closed:
                    closed = OnnxTTSError("the engine was closed")
                    for stream in self.streams:
                        stream.fail(closed)
                    return
            if self.gather_seconds > 0 and not leftover:
                time.sleep(self.gather_seconds)  # let windows due at about the same time join
            with self._cv:
                work = self._take_due()
                self._decoding = {stream for stream, _ in work}
            started = time.perf_counter()
            # Only the most urgent batch per round: a window that became due meanwhile (a new
            # stream's first, a listener about to run dry) goes before the rest of this round.
            batches = self._split_first_windows(self._batches(work))
            taken = 2 if self._second_decoder_free(batches) else 1
            if taken == 2:
                assert self._beside is not None  # (made with the stage's thread)
                if _first_windows(batches[0]):
                    self._first_windows_done.clear()
                try:
                    beside = self._beside.submit(self._decode, batches[1])
                    self._decode(batches[0])
                    beside.result()
                finally:
                    self._first_windows_done.set()
            elif batches:
                self._decode(batches[0])
            with self._cv:
                # (their windows are taken again next round: a window depends only on the
                # frames, so it is the same one)
                waiting = [stream for batch in batches[taken:] for stream, _ in batch]
                self._release_finished()
                self._due.update(stream for stream in waiting if stream in self.streams)
                leftover = bool(waiting)
                self._stats["rounds"] += 1
                self._stats["busy_seconds"] += time.perf_counter() - started
            # Nothing of a finished round stays reachable while the worker waits for the next:
            # its streams hold their voices, frames and engine.
            del work, batches, waiting

    def _release_finished(self) -> None:
        """(under the lock) free the decoder state of the streams that closed or ended while
        their windows were being decoded."""
        for stream in self._decoding - self.streams:
            stream.release_state()
        self._decoding = set()

    def _second_decoder_free(self, batches: list[list[tuple]]) -> bool:
        """Whether the two most urgent batches may decode at once: windows of two streams with
        decoders of their own while the decode scheduler idles (see `lm_idle`), or the two
        halves of a burst's first windows (`_split_first_windows`)."""
        if len(batches) < 2 or self._beside is None:
            return False
        if _first_windows(batches[0]) and _first_windows(batches[1]):
            return True
        return (
            batches[0][0][0].stateful
            and batches[1][0][0].stateful
            and self.lm_idle is not None
            and self.lm_idle()
        )

    def _split_first_windows(self, batches: list[list[tuple]]) -> list[list[tuple]]:
        """The first windows of several streams (a burst that started together) as two
        halves that decode at once, on two cores, while listeners wait for their first audio
        (measured with `bench serve --burst 8` on the default voice: one batch of 8 first
        windows took 50 ms of one core while the other core stepped the LM). The halves take
        the leading batches of first windows of one length together: 8 first windows of 22
        frames fill more than one batch (MAX_VOCODER_BATCH_FRAMES), and the window left over
        used to wait for the next round, alone, after both halves."""
        if not batches or not self.batches or not _first_windows(batches[0]):
            return batches
        length = len(_codes(batches[0][0][1]))
        merged: list[tuple] = []
        taken = 0
        for batch in batches:
            count = len(merged) + len(batch)
            fits = count <= 2 * self.max_batch and count * length <= 2 * MAX_VOCODER_BATCH_FRAMES
            if (
                not _first_windows(batch)
                or batch[0][0].decodes_alone
                or len(_codes(batch[0][1])) != length
                or not fits
            ):
                break
            merged += batch
            taken += 1
        if len(merged) < 2:
            return batches
        half = (len(merged) + 1) // 2
        return [merged[:half], merged[half:], *batches[taken:]]

    def _take_due(self) -> list[tuple[VocoderStream, Any]]:
        """(under the lock) every due (stream, window), most urgent first; failed streams
        get their error now."""
        work = []
        due = list(self._due)
        for stream in [due[i] for i in self.policy.order([s.request.urgency() for s in due])]:
            if stream.failed is not None and not stream.done:
                stream.release_state()
                stream.fail(stream.failed)
                self.streams.discard(stream)
                continue
            window = stream.due_window()
            if window is not None:
                work.append((stream, window))
        self._due.clear()
        return work

    def _batches(self, work: list[tuple[VocoderStream, Any]]) -> list[list[tuple]]:
        """Windows decoded in one call: equal lengths when the vocoder batches, else one each;
        in the order of each batch's most urgent window."""
        if not self.batches:
            return [[item] for item in work]
        rank = {id(item): index for index, item in enumerate(work)}
        alone = [[item] for item in work if item[0].decodes_alone]
        work = [item for item in work if not item[0].decodes_alone]
        groups: dict[int, list[tuple]] = {}
        order: list[list[tuple]] = []
        for item in work:
            codes = _codes(item[1])
            group = groups.get(len(codes))
            if (
                group is None
                or len(group) >= self.max_batch
                or (len(group) + 1) * len(codes) > MAX_VOCODER_BATCH_FRAMES
            ):
                group = groups[len(codes)] = []
                order.append(group)
            group.append(item)
        return sorted(order + alone, key=lambda batch: rank[id(batch[0])])

    def _decode(self, batch: list[tuple[VocoderStream, Any]]) -> None:
        codes = [_codes(w) for _, w in batch]
        voices = [stream.request.voice for stream, _ in batch]
        empty = np.zeros(0, np.float32)
        filled = [i for i, c in enumerate(codes) if len(c)]  # a flush may hold no new frames
        # Per window: its waveform, or the error that fails its stream (and only its stream).
        results: list[np.ndarray | Exception] = [empty] * len(batch)

        def alone(index: int) -> np.ndarray | Exception:
            try:
                stream = batch[index][0]
                if stream.stateful:  # a stream with its own decoder
                    return stream.decode_stateful(codes[index])
                if stream.prime is not None:
                    return self.vocoder.vocode_after(stream.prime, codes[index], voices[index])
                return self.vocoder.vocode(codes[index], voices[index])
            except Exception as error:
                return error

        if len(filled) > 1 and self.batches and not batch[0][0].stateful:
            try:
                decoded = self.vocoder.vocode_windows(
                    [codes[i] for i in filled], [voices[i] for i in filled]
                )
                for index, waveform in zip(filled, decoded, strict=True):
                    results[index] = waveform
            except Exception:  # one window may break the batch: each alone finds which
                for index in filled:
                    results[index] = alone(index)
        else:
            for index in filled:
                results[index] = alone(index)
        for index, result in enumerate(results):
            if not isinstance(result, Exception):
                try:  # NaN/inf must never reach a speaker, a file or a cache
                    check_finite(np.asarray(result), "the model's audio")
                except Exception as error:
                    results[index] = error
        failed = False
        with self._cv:
            self._stats["calls"] += 1 if filled else 0
            self._stats["windows"] += len(filled)
            for (stream, window), result in zip(batch, results, strict=True):
                if isinstance(result, Exception):  # this stream fails, the others go on
                    failed = True
                    stream.release_state()
                    stream.fail(result)
                    stream.request.cancel.cancel()
                    self.streams.discard(stream)
                    continue
                if stream not in self.streams:
                    continue  # closed meanwhile (its decoder goes back in _release_finished)
                try:
                    self._stats["samples"] += stream.accept(window, result)
                except Exception as error:
                    stream.fail(error)
                if stream.done:
                    stream.release_state()
                    self.streams.discard(stream)
                elif stream.is_due():
                    self._due.add(stream)  # more was due than one window
        if failed:
            self.scheduler_wake()


def _nothing() -> None:
    return None


def _codes(window: Window | np.ndarray) -> np.ndarray:
    """The frames a due item decodes: a window's, or a one-shot stream's whole."""
    return window.codes if isinstance(window, Window) else window


def _first_windows(batch: list[tuple]) -> bool:
    """Whether `batch` is windows (not one-shot frames, not stateful) of which one is its
    stream's first."""
    return not batch[0][0].stateful and any(
        isinstance(window, Window) and window.emit_start == 0 for _, window in batch
    )


__all__ = [
    "DEFAULT_GATHER_SECONDS",
    "MAX_VOCODER_BATCH",
    "VocoderStage",
    "VocoderStream",
]

"""Vocoder stage, generic part: windowed streaming of any frames -> waveform vocoder.

Streaming decodes overlapping windows of complete frames as they arrive:

    decoded:  [ overlap | new frames ........ | hold-back ]
    emitted:            [ crossfade | ... ]   (up to the hold-back, less the next crossfade)

* overlap: frames before the new ones, re-decoded as left context and dropped;
* hold-back: the newest frames, decoded as right context (look-ahead) but not emitted until
  the next window, which has more right context for them;
* crossfade: the last `crossfade_samples` a window would emit are kept back and faded (linear)
  into the next window's re-decoding of the same samples, which lies inside its overlap.

Windows are placed at fixed frame counts, so the output depends only on the frames, the
options and whether the stream grows, never on timing: the first at `first_chunk_frames`, then
every `stride_frames`. A growing stream (a listener playing in real time: a request with a
playback clock, as every server stream has) instead adds as many new frames per window as have
been emitted so far (at least `overlap_frames`, at most `stride_frames`): its windows grow
geometrically to the stride, so the listener always holds about as much audio as the next
window has to generate (under load, a fixed long stride right after a short first chunk made
every listener run dry). A stream read as fast as it is made keeps the fixed stride: fewer
windows, less overlap decoded twice (growing costs the default voice's vocoder ~1.6x the work
on a short sentence).
With a causal vocoder whose left context is R frames, `overlap_frames * hop >=
R * hop + crossfade_samples` gives exactly the one-shot waveform; a vocoder with look-ahead L
also needs `holdback_frames >= L`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Protocol

import numpy as np

from onnx_tts.errors import InputError, ModelError, shown

# -- streaming -------------------------------------------------------------------------------

STREAMING_KEYS = (
    "first_chunk_frames",
    "stride_frames",
    "overlap_frames",
    "holdback_frames",
    "crossfade_samples",
)


# Bound on every window size in frames: far above any useful window (~20 minutes of audio at
# 50 frames/s), far below what would hold a whole long text in one vocoder run.
MAX_WINDOW_FRAMES = 1 << 16


@dataclass(frozen=True)
class StreamingOptions:
    """Window protocol of the streaming vocoder (see the module docstring)."""

    first_chunk_frames: int = 8
    stride_frames: int = 24
    overlap_frames: int = 8
    holdback_frames: int = 2
    crossfade_samples: int = 480

    @classmethod
    def resolve(
        cls, defaults: Mapping[str, Any], hop_length: int, **overrides: int | None
    ) -> StreamingOptions:
        """Bundle defaults (its "streaming" section) with per-request overrides (None = keep),
        checked against the vocoder's hop length."""
        unknown = sorted(set(overrides) - set(STREAMING_KEYS))
        if unknown:
            raise InputError(
                f"unknown streaming option(s) {', '.join(unknown)}; "
                f"valid ones are {', '.join(STREAMING_KEYS)}"
            )
        values: dict[str, Any] = {
            field.name: defaults.get(field.name, field.default) for field in fields(cls)
        }
        try:
            cls(**values).checked(hop_length)
        except InputError as error:
            raise ModelError(
                f'the model\'s streaming defaults (bundle.json "streaming") are invalid: {error}'
            ) from None
        values.update({key: value for key, value in overrides.items() if value is not None})
        return cls(**values).checked(hop_length)

    def checked(self, hop_length: int) -> StreamingOptions:
        for key in STREAMING_KEYS:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise InputError(f"{key} must be an integer, got {shown(value)}")
            # (the crossfade is bounded by the overlap below; any integer is checked here)
            high = MAX_WINDOW_FRAMES * (hop_length if key == "crossfade_samples" else 1)
            if value > high:
                raise InputError(f"{key} must be at most {high}, got {shown(value)}")
            if value < -high:
                raise InputError(f"{key} must be at least 0, got {shown(value)}")
        if self.first_chunk_frames < 1 or self.stride_frames < 1:
            raise InputError(
                f"first_chunk_frames and stride_frames must be >= 1, got "
                f"{self.first_chunk_frames} and {self.stride_frames}"
            )
        if self.overlap_frames < 0 or self.holdback_frames < 0 or self.crossfade_samples < 0:
            raise InputError(
                "overlap_frames, holdback_frames and crossfade_samples must be >= 0, got "
                f"{self.overlap_frames}, {self.holdback_frames} and {self.crossfade_samples}"
            )
        if self.stride_frames < self.overlap_frames:
            raise InputError(
                f"stride_frames ({self.stride_frames}) must be >= overlap_frames "
                f"({self.overlap_frames}): each window would re-decode more frames than it "
                "adds; raise the stride or lower the overlap"
            )
        if self.crossfade_samples > self.overlap_frames * hop_length:
            raise InputError(
                f"crossfade_samples ({self.crossfade_samples}) must fit in the overlap "
                f"({self.overlap_frames} frames x {hop_length} samples = "
                f"{self.overlap_frames * hop_length}); lower crossfade_samples or raise "
                "overlap_frames"
            )
        first_emitted = (self.first_chunk_frames - self.holdback_frames) * hop_length
        if first_emitted <= self.crossfade_samples:
            raise InputError(
                f"the first chunk would be empty: first_chunk_frames ({self.first_chunk_frames}) "
                f"minus holdback_frames ({self.holdback_frames}) leaves {first_emitted} samples, "
                f"not more than crossfade_samples ({self.crossfade_samples}); raise "
                "first_chunk_frames or lower holdback_frames/crossfade_samples"
            )
        return self


@dataclass(frozen=True)
class Window:
    """Frames [start, end) to decode; the audio of frames [emit_start, emit_end) is due."""

    start: int
    end: int
    emit_start: int
    emit_end: int
    final: bool
    codes: np.ndarray  # [end - start, K]


class StreamingDecoder:
    """The window state of one stream: push complete frames, decode each due window, hand the
    waveform back to `accept`, which returns the samples ready to play.

    Decoding is left to the caller so that windows of several streams can share one vocoder
    call (`decode_streams`). Emitted chunks concatenate to exactly `frames * hop` samples.
    """

    def __init__(self, options: StreamingOptions, hop_length: int, grow: bool = False) -> None:
        self.options = options.checked(hop_length)
        self.hop_length = hop_length
        self._frames: list[np.ndarray] = []
        self._base = 0  # absolute index of self._frames[0]; older frames are dropped
        self._windows = 0  # windows accepted so far
        self._boundary = self.options.first_chunk_frames  # frame count of the next window
        self.grow = grow
        self._emitted_frames = 0  # audio up to this frame is sent or held as the tail
        self._tail = np.zeros(0, np.float32)  # last samples before _emitted_frames, unsent
        self._finished = False
        self._done = False

    @property
    def frames_received(self) -> int:
        return self._base + len(self._frames)

    @property
    def done(self) -> bool:
        return self._done

    def push(self, frames: np.ndarray | Iterable[np.ndarray]) -> None:
        """Add complete frames: one [K] frame or [N, K]. Incomplete delay-pattern rows must
        never get here (the generator yields complete frames only)."""
        if self._finished:
            raise InputError("cannot push frames after finish()")
        array = np.asarray(frames if isinstance(frames, np.ndarray) else list(frames))
        if array.ndim == 1:
            array = array[None]
        if array.ndim != 2:
            raise InputError(f"frames must be [K] or [N, K], got shape {array.shape}")
        # Codec codes (int64) or continuous frames (float32, e.g. mel): kept as they come.
        self._frames.extend(np.asarray(row) for row in array)

    def finish(self) -> None:
        """No more frames: the next window is the last and flushes everything."""
        self._finished = True

    def _next_boundary(self) -> int:
        return self._boundary

    def window_due(self) -> bool:
        """Whether next_window() has a window now (cheap: no frames are copied)."""
        if self._done:
            return False
        return self._finished or self.frames_received >= self._next_boundary()

    def next_window(self) -> Window | None:
        """The window due now, or None until more frames arrive (or finish() is called)."""
        if self._done:
            return None
        received = self.frames_received
        end = self._next_boundary()
        # Windows sit at fixed frame counts whenever the frames arrive: a boundary already
        # reached is decoded before the final window, even after finish().
        if received >= end:
            emit_end, final = end - self.options.holdback_frames, False
        elif self._finished:
            end, emit_end, final = received, received, True
        else:
            return None
        emit_start = self._emitted_frames
        start = max(0, emit_start - self.options.overlap_frames)
        if end == emit_start:  # final window with no new frames: only the tail to flush
            start = end
        rows = self._frames[start - self._base : end - self._base]
        codes = np.stack(rows) if rows else np.zeros((0, self._width()), np.int64)
        return Window(start, end, emit_start, emit_end, final, codes)

    def _width(self) -> int:
        return len(self._frames[0]) if self._frames else 0

    def accept(self, window: Window, waveform: np.ndarray) -> np.ndarray:
        """Take the decoded waveform of `window` (from next_window) and return the samples
        that are final now (float32, possibly empty)."""
        hop = self.hop_length
        waveform = np.asarray(waveform, dtype=np.float32)
        if waveform.ndim != 2:  # mono [N]; multichannel [N, channels] is kept as it is
            waveform = waveform.reshape(-1)
        if len(waveform) != (window.end - window.start) * hop:
            raise InputError(
                f"window of {window.end - window.start} frames must decode to "
                f"{(window.end - window.start) * hop} samples, got {len(waveform)}"
            )
        if window.emit_start != self._emitted_frames:
            raise InputError("windows must be accepted in the order next_window() gives them")
        offset = window.start * hop  # absolute sample index of waveform[0]
        seam = window.emit_start * hop  # where the previously emitted audio ends (with tail)
        pieces: list[np.ndarray] = []
        tail = self._tail
        if len(tail) and window.end > window.emit_start:
            # The tail and this window's re-decoded head cover the same samples: fade across.
            head = waveform[seam - len(tail) - offset : seam - offset]
            fade_in = (np.arange(len(tail), dtype=np.float32) + 0.5) / len(tail)
            fade_in = fade_in.reshape((-1,) + (1,) * (tail.ndim - 1))
            pieces.append(tail * (1.0 - fade_in) + head * fade_in)
        elif len(tail):
            pieces.append(tail)  # no new frames: the tail was already right
        keep = 0 if window.final else self.options.crossfade_samples
        stop = window.emit_end * hop - keep
        pieces.append(waveform[seam - offset : stop - offset])
        self._tail = waveform[stop - offset : window.emit_end * hop - offset].copy()
        self._emitted_frames = window.emit_end
        self._windows += 1
        if not window.final:
            stride = self.options.stride_frames
            if self.grow:
                stride = min(stride, max(self.options.overlap_frames, 1, self._emitted_frames))
            self._boundary += stride
        self._done = window.final
        # Frames before the next window's overlap are never decoded again.
        drop = max(0, window.emit_end - self.options.overlap_frames) - self._base
        if drop > 0:
            del self._frames[:drop]
            self._base += drop
        return np.concatenate(pieces).astype(np.float32, copy=False)


def decode_in_batches(
    windows: Sequence[np.ndarray],
    decode_batch: Callable[[np.ndarray], np.ndarray],
    samples_per_frame: int,
    pad_shorter: bool = False,
) -> list[np.ndarray]:
    """Decode several [F_i, ...] frame windows with as few `decode_batch` runs ([B, F, ...] ->
    [B, F * samples_per_frame]) as exactness allows: windows of one length share a run; with
    `pad_shorter` (a causal vocoder, whose samples never depend on later frames) shorter
    windows are right-padded into the longest one's run. Returns one waveform per window, in
    order (empty windows give empty waveforms)."""
    results: list[np.ndarray] = [np.zeros(0, np.float32) for _ in windows]
    pending = [index for index, window in enumerate(windows) if len(window)]
    groups: dict[int, list[int]] = {}
    if pad_shorter and pending:
        groups[max(len(windows[index]) for index in pending)] = pending
    else:
        for index in pending:
            groups.setdefault(len(windows[index]), []).append(index)
    for length, members in groups.items():
        first = np.asarray(windows[members[0]])
        batch = np.zeros((len(members), length, *first.shape[1:]), first.dtype)
        for row, index in enumerate(members):
            batch[row, : len(windows[index])] = windows[index]
        waveforms = decode_batch(batch)
        for row, index in enumerate(members):
            results[index] = waveforms[row, : len(windows[index]) * samples_per_frame].copy()
    return results


class WindowVocoder(Protocol):
    """A vocoder that decodes several windows of frames in as few runs as it can."""

    def decode_windows(self, windows: Sequence[np.ndarray]) -> list[np.ndarray]: ...


def decode_streams(
    vocoder: WindowVocoder, decoders: Sequence[StreamingDecoder]
) -> list[np.ndarray | None]:
    """Decode the due window of every stream in one `decode_windows` call.

    Returns, per decoder, the samples it released (None when it had no window due)."""
    due = [(decoder, decoder.next_window()) for decoder in decoders]
    todo = [window for _, window in due if window is not None and len(window.codes)]
    waveforms = iter(vocoder.decode_windows([window.codes for window in todo]))
    empty = np.zeros(0, np.float32)
    return [
        None
        if window is None
        else decoder.accept(window, next(waveforms) if len(window.codes) else empty)
        for decoder, window in due
    ]


def stream_decode(
    frames: Iterable[np.ndarray],
    decode: Callable[[np.ndarray], np.ndarray],
    options: StreamingOptions,
    hop_length: int,
) -> Iterator[np.ndarray]:
    """Single-stream driver: yields non-empty float32 chunks as `frames` (complete [K] frames)
    arrive, decoding each window with `decode` ([F, K] -> [F * hop]). Closing this generator
    closes `frames` too, so an LM generator behind it stops and frees its state."""
    decoder = StreamingDecoder(options, hop_length)

    def drain() -> Iterator[np.ndarray]:
        while (window := decoder.next_window()) is not None:
            waveform = decode(window.codes) if len(window.codes) else np.zeros(0, np.float32)
            chunk = decoder.accept(window, waveform)
            if len(chunk):
                yield chunk

    source = iter(frames)
    try:
        for frame in source:
            decoder.push(frame)
            yield from drain()
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()
    decoder.finish()
    yield from drain()

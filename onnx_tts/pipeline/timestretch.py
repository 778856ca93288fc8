"""Speed control by WSOLA (waveform-similarity overlap-add), streaming.

Resampling would change the pitch along with the tempo; WSOLA keeps the pitch: it cuts the
input into Hann-windowed frames taken every `speed * hop` input samples and overlap-adds them
every `hop` output samples, moving each frame by up to `tolerance` samples so that it lines up
with the natural continuation of the frame before (maximum cross-correlation). The streaming
class gives the same samples whatever the chunking of its input. Audio of several channels
([N, channels]) is aligned on the channels' mean and every channel moved alike, so the
channels stay together.
"""

from __future__ import annotations

import numpy as np

from onnx_tts.errors import checked_number

MIN_SPEED = 0.25
MAX_SPEED = 4.0
FRAME_SECONDS = 0.040  # long enough to hold two pitch periods of a low voice
TOLERANCE_SECONDS = 0.010  # up to one period of a 100 Hz voice either way


class TimeStretcher:
    """Streaming WSOLA: push() float32 chunks ([n] or [n, channels]), then finish(); output is
    round(len(input) / speed) samples at the same rate and pitch."""

    def __init__(self, speed: float, sample_rate: int, channels: int = 1) -> None:
        self.speed = checked_number("speed", speed, MIN_SPEED, MAX_SPEED)
        self.hop = max(8, round(FRAME_SECONDS * sample_rate / 2))
        self.frame = 2 * self.hop
        self.tolerance = max(1, round(TOLERANCE_SECONDS * sample_rate))
        # Periodic Hann: overlapping copies at hop = frame / 2 sum to exactly 1.
        window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(self.frame) / self.frame)
        self.channels = channels
        self.window = window.astype(np.float32)[:, None]  # [frame, 1]: every channel alike
        self._input = np.zeros((0, channels), np.float32)
        self._input_start = 0  # absolute index of self._input[0]
        self._received = 0
        self._frames_done = 0  # frames overlap-added so far
        self._previous = 0  # absolute input position of the last frame taken
        self._tail = np.zeros((self.frame, channels), np.float32)  # overlap-add; first hop final
        self._emitted = 0
        self._finished = False

    @property
    def passthrough(self) -> bool:
        return self.speed == 1.0

    def push(self, samples: np.ndarray) -> np.ndarray:
        samples = np.asarray(samples, np.float32)
        if self.passthrough:
            self._emitted += len(samples)
            return samples
        self._input = np.concatenate([self._input, samples.reshape(len(samples), self.channels)])
        self._received += len(samples)
        return self._shaped(self._run(final=False))

    def _shaped(self, out: np.ndarray) -> np.ndarray:
        """[n] for mono, [n, channels] otherwise (as the samples came in)."""
        return out[:, 0] if self.channels == 1 else out

    def finish(self) -> np.ndarray:
        """The rest of the output; total length round(len(input) / speed)."""
        if self._finished or self.passthrough:
            self._finished = True
            return self._shaped(np.zeros((0, self.channels), np.float32))
        self._finished = True
        out = self._run(final=True)
        # The last frame overshoots the target by less than one hop: cut it there.
        out = out[: max(0, round(self._received / self.speed) - self._emitted)]
        self._emitted += len(out)
        return self._shaped(out)

    # ------------------------------------------------------------------------------------------
    def _segment(self, start: int, length: int) -> np.ndarray:
        """Input samples [start, start + length), zeros past the end / before the start."""
        lo = start - self._input_start
        piece = self._input[max(lo, 0) : max(lo + length, 0)]
        if lo < 0:
            zeros = np.zeros((min(-lo, length), self.channels), np.float32)
            piece = np.concatenate([zeros, piece])
        if len(piece) < length:
            piece = np.pad(piece, ((0, length - len(piece)), (0, 0)))
        return piece

    def _run(self, final: bool) -> np.ndarray:
        pieces = []
        target = round(self._received / self.speed) if final else None
        while True:
            k = self._frames_done
            nominal = round(k * self.hop * self.speed)
            if final:
                if k * self.hop >= target:  # type: ignore[operator]
                    break
            elif nominal + self.tolerance + self.frame > self._received or (
                self._previous + self.hop + self.frame > self._received
            ):
                break
            if k == 0:
                position = 0
            else:
                natural = self._segment(self._previous + self.hop, self.frame).mean(axis=1)
                lo = max(0, nominal - self.tolerance)
                region = self._segment(lo, nominal + self.tolerance - lo + self.frame)
                scores = np.correlate(region.mean(axis=1), natural, mode="valid")
                position = lo + int(np.argmax(scores))
            self._tail += self.window * self._segment(position, self.frame)
            pieces.append(self._tail[: self.hop].copy())
            self._tail = np.concatenate(
                [self._tail[self.hop :], np.zeros((self.hop, self.channels), np.float32)]
            )
            self._previous = position
            self._frames_done += 1
            # Drop input no later frame can reach (the next search starts near the nominal).
            keep_from = min(self._previous, nominal) - self.tolerance
            drop = keep_from - self._input_start
            if drop > 0:
                self._input = self._input[drop:]
                self._input_start += drop
        out = np.concatenate(pieces) if pieces else np.zeros((0, self.channels), np.float32)
        if not final:
            self._emitted += len(out)
        return out


def stretch(samples: np.ndarray, speed: float, sample_rate: int) -> np.ndarray:
    """Whole-signal WSOLA (the streaming class in one call), [n] or [n, channels]."""
    samples = np.asarray(samples, np.float32)
    channels = samples.shape[1] if samples.ndim == 2 else 1
    stretcher = TimeStretcher(speed, sample_rate, channels)
    return np.concatenate([stretcher.push(samples), stretcher.finish()])

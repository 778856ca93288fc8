"""The MOSS audio tokenizer: reference encoding (through the canonical batch-of-1 reference
cache), one-shot decoding, and streaming decoding with the codec's recurrent state chained by
the core.

Audio is stereo at 48 kHz: the encoder takes [1, 2, N]; the decoders return [1, 2, N] (as
published) and this module hands out [N, 2] float32, the layout audio files use.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from onnx_tts.audio import (
    MAX_REFERENCE_PEAK,
    MIN_CLIP_SECONDS,
    SILENCE_PEAK,
    check_finite,
    load_audio,
)
from onnx_tts.encoder import VoiceEncoder
from onnx_tts.errors import AudioError, InputError, ModelError, NonFiniteAudioError
from onnx_tts.families.moss_tts_nano.layout import MossLayout
from onnx_tts.session import LazySession, StateChain
from onnx_tts.state_streams import ChainedStream, StatePool

PROMPT_CODES = "prompt_audio_codes"
REFERENCE_MIN_SECONDS = 0.5
REFERENCE_MAX_SECONDS = 30.0
# A one-shot decode_full holds the whole clip; longer clips decode through decode_step in
# pieces (same audio, bounded memory), as the published runtime falls back to.
MAX_FULL_DECODE_FRAMES = 1500
STEP_DECODE_FRAMES = 8


def load_reference(path: str | os.PathLike[str], sample_rate: int, channels: int) -> np.ndarray:
    """A reference file as [channels, N] float32 at `sample_rate`: resampled with soxr, mono
    duplicated to stereo (as published), at most REFERENCE_MAX_SECONDS decoded. AudioError for
    a missing, unreadable, truncated, empty, silent, too short or non-finite file."""
    samples = load_audio(
        path,
        sample_rate,
        min_seconds=REFERENCE_MIN_SECONDS,
        max_seconds=REFERENCE_MAX_SECONDS,
        channels=channels,
    )
    waveform = samples[None] if samples.ndim == 1 else samples.T
    return check_reference(waveform, sample_rate, what=f"reference audio {path}")


def check_reference(waveform: Any, sample_rate: int, what: str = "reference audio") -> np.ndarray:
    """[channels, N] float samples checked: finite, audible, not absurdly loud, long enough;
    cut to REFERENCE_MAX_SECONDS. Returns contiguous float32."""
    array = np.asarray(waveform)
    if array.ndim != 2 or array.shape[0] not in (1, 2) or array.dtype.kind != "f":
        raise AudioError(
            f"{what} must be float samples [channels, N] with 1 or 2 channels, got "
            f"{array.dtype} {array.shape}"
        )
    array = np.ascontiguousarray(array[:, : int(REFERENCE_MAX_SECONDS * sample_rate)], np.float32)
    seconds = array.shape[1] / sample_rate
    if seconds < max(MIN_CLIP_SECONDS, REFERENCE_MIN_SECONDS):
        raise AudioError(
            f"{what} is {seconds:.2f} s long; at least {REFERENCE_MIN_SECONDS:g} s of speech "
            "is needed"
        )
    if not np.isfinite(array).all():
        raise NonFiniteAudioError(f"{what} contains NaN or infinite samples")
    peak = float(np.abs(array).max())
    if peak > MAX_REFERENCE_PEAK:
        raise AudioError(f"{what} peaks at {peak:.3g} (full scale is 1.0); rescale it to [-1, 1]")
    if peak < SILENCE_PEAK:
        raise AudioError(f"{what} is silent; give a clip with audible speech")
    return array


class _EncodeAdapter:
    """The codec's encode graph as the VoiceEncoder sees a graph: `audio` [1, C * N]
    (channel-major, the canonical flat reference) -> `prompt_audio_codes` [1, F, n_q] int32."""

    def __init__(self, session: LazySession, channels: int) -> None:
        self.session = session
        self.channels = channels
        self.options = session.options
        self.path = session.path
        self.output_names = (PROMPT_CODES,)

    def run(self, feeds: Mapping[str, np.ndarray], output_names=None) -> dict[str, np.ndarray]:
        flat = np.asarray(feeds["audio"], np.float32)
        if flat.ndim != 2 or flat.shape[0] != 1 or flat.shape[1] % self.channels:
            raise InputError(f"the reference must be one flat [1, {self.channels} x N] array")
        waveform = flat.reshape(1, self.channels, -1)
        out = self.session.run(
            {
                "waveform": waveform,
                "input_lengths": np.array([waveform.shape[2]], np.int32),
            }
        )
        codes = np.asarray(out["audio_codes"])
        length = int(np.asarray(out["audio_code_lengths"]).reshape(-1)[0])
        if codes.ndim != 3 or not 0 < length <= codes.shape[1]:
            raise ModelError(
                f"{self.session.path.name} returned {codes.shape[1] if codes.ndim == 3 else '?'} "
                f"frames with audio_code_lengths {length}: the encode graph is broken"
            )
        return {PROMPT_CODES: codes[:, :length].astype(np.int32)}


class ReferenceEncoder(VoiceEncoder):
    """The canonical batch-of-1 encode of a stereo reference. A reference is [channels, N]
    float32 at the codec rate; its canonical form (what the cache key covers and the graph
    sees) is the channel-major samples after mono -> stereo duplication, so a mono file and
    the stereo file with two equal channels are one entry."""

    def __init__(self, session: LazySession, layout: MossLayout, graph_sha256: str) -> None:
        self.channels = layout.codec.channels
        super().__init__(
            _EncodeAdapter(session, self.channels),
            bundle_identity=f"moss-tts-nano/{layout.codec_meta_path.parent.name}",
            sample_rate=layout.codec.sample_rate,
            settings={
                "channels": self.channels,
                "min_seconds": REFERENCE_MIN_SECONDS,
                "max_seconds": REFERENCE_MAX_SECONDS,
            },
            graph_sha256=graph_sha256,
            hop_length=layout.codec.downsample,
            frame_outputs=(PROMPT_CODES,),
        )

    def validate(self, audio: np.ndarray) -> np.ndarray:
        waveform = np.asarray(audio)
        if waveform.ndim == 1:  # mono samples
            waveform = waveform[None]
        waveform = check_reference(waveform, self.sample_rate)
        if waveform.shape[0] == 1 and self.channels == 2:
            waveform = np.repeat(waveform, 2, axis=0)
        elif waveform.shape[0] == 2 and self.channels == 1:
            waveform = waveform.mean(axis=0, keepdims=True)
        return np.ascontiguousarray(waveform.reshape(-1), np.float32)


def _audio_rows(audio: np.ndarray, lengths: np.ndarray, channels: int, where: str) -> np.ndarray:
    """The decoders' [1, C, N] output and length as [length, C] float32."""
    array = np.asarray(audio)
    length = int(np.asarray(lengths).reshape(-1)[0])
    if array.ndim != 3 or array.shape[1] != channels or not 0 <= length <= array.shape[2]:
        raise ModelError(
            f"{where} returned audio {array.shape} with length {length}; expected "
            f"[1, {channels}, >= length]: the codec graph is broken"
        )
    samples = np.ascontiguousarray(array[0, :, :length].T, np.float32)
    check_finite(samples, "the codec's audio")
    return samples


class CodecDecoder:
    """One-shot and streaming decoding of [F, n_q] codes to [F x downsample, channels]."""

    def __init__(
        self, layout: MossLayout, full: LazySession, step: LazySession, state_mode: str
    ) -> None:
        self.layout = layout
        self.full = full
        self.step = step
        self.channels = layout.codec.channels
        self.n_q = layout.codec.quantizers
        self.codebook = layout.config.codebook
        self.state_mode = state_mode
        state = layout.state
        self.states = StatePool(
            step, [(s.input, s.output) for s in state], [s.initial() for s in state], state_mode
        )

    def _codes(self, frames: np.ndarray) -> np.ndarray:
        codes = np.asarray(frames)
        if codes.ndim != 2 or codes.shape[1] != self.n_q:
            raise InputError(f"codes must be [frames, {self.n_q}], got {codes.shape}")
        if codes.size and (codes.min() < 0 or codes.max() >= self.codebook):
            raise InputError(f"codes must lie in [0, {self.codebook})")
        return np.ascontiguousarray(codes[None], np.int32)

    def decode(self, frames: np.ndarray) -> np.ndarray:
        """All frames at once: decode_full (up to MAX_FULL_DECODE_FRAMES), else decode_step
        over pieces with its state, which gives the same audio."""
        codes = self._codes(frames)
        if codes.shape[1] == 0:
            return np.zeros((0, self.channels), np.float32)
        if codes.shape[1] > MAX_FULL_DECODE_FRAMES:
            with self.stream() as stream:
                pieces = [
                    stream.push(codes[0, i : i + STEP_DECODE_FRAMES])
                    for i in range(0, codes.shape[1], STEP_DECODE_FRAMES)
                ]
                return np.concatenate(pieces)
        out = self.full.run(
            {"audio_codes": codes, "audio_code_lengths": np.array([codes.shape[1]], np.int32)}
        )
        return _audio_rows(out["audio"], out["audio_lengths"], self.channels, self.full.path.name)

    def stream(self) -> ChainedStream:
        """A fresh streaming decoder (state zeroed, positions -1); use it as a context
        manager (or close it) so its state is reused by the next stream."""
        return ChainedStream(self.states, self._push)

    def _push(self, chain: StateChain, frames: np.ndarray) -> np.ndarray:
        """Audio [len(frames) x downsample, channels] of the next frames."""
        codes = self._codes(frames)
        if codes.shape[1] == 0:
            return np.zeros((0, self.channels), np.float32)
        out = chain.step(
            {"audio_codes": codes, "audio_code_lengths": np.array([codes.shape[1]], np.int32)},
            ["audio", "audio_lengths"],
        )
        return _audio_rows(out["audio"], out["audio_lengths"], self.channels, self.step.path.name)


def stream_budget(first_audio: float | None, emitted_seconds: float, now: float) -> int:
    """Frames to decode at once while streaming (the published rule): 1 until the first audio
    or while less than 0.2 s ahead of real time, then 2 (< 0.55 s), 4 (< 1.1 s), else 8."""
    if first_audio is None:
        return 1
    lead = emitted_seconds - (now - first_audio)
    if lead < 0.20:
        return 1
    if lead < 0.55:
        return 2
    if lead < 1.10:
        return 4
    return 8


def concat_audio(pieces: Sequence[np.ndarray], channels: int) -> np.ndarray:
    kept = [p for p in pieces if len(p)]
    return np.concatenate(kept) if kept else np.zeros((0, channels), np.float32)


__all__ = [
    "PROMPT_CODES",
    "CodecDecoder",
    "ReferenceEncoder",
    "check_reference",
    "concat_audio",
    "load_reference",
    "stream_budget",
]

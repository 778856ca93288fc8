"""The trained voice's acoustic frames and DSP vocoder: log-mel and Griffin-Lim, in torch.

Frames are 50 per second (hop 320 at 16 kHz): mel frame t summarises the window centred on
sample t * hop + hop / 2. The vocoder maps mel energies back to linear magnitudes
(filter-weighted) and finds a phase by Griffin-Lim, optionally on frames interpolated to a
finer hop (more overlap gives Griffin-Lim a much better phase).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class MelConfig:
    sample_rate: int = 16000
    hop_length: int = 320
    n_fft: int = 1024
    n_mels: int = 80
    fmin: float = 0.0
    fmax: float = 8000.0
    log_floor: float = 1e-5

    @property
    def bins(self) -> int:
        return self.n_fft // 2 + 1


# The trained voice's frames (train.py, bundle.py): 80 bands, n_fft 512, 50 per second.
MEL_CONFIG = MelConfig(n_fft=512)


def hz_to_mel(hz: np.ndarray | float) -> np.ndarray:
    return 2595.0 * np.log10(1.0 + np.asarray(hz, np.float64) / 700.0)


def mel_to_hz(mel: np.ndarray | float) -> np.ndarray:
    return 700.0 * (10.0 ** (np.asarray(mel, np.float64) / 2595.0) - 1.0)


def mel_filterbank(cfg: MelConfig) -> np.ndarray:
    """Triangular filters, area-normalised, float32 [n_mels, bins]."""
    edges = mel_to_hz(np.linspace(hz_to_mel(cfg.fmin), hz_to_mel(cfg.fmax), cfg.n_mels + 2))
    freqs = np.linspace(0.0, cfg.sample_rate / 2, cfg.bins)
    bank = np.zeros((cfg.n_mels, cfg.bins))
    for m in range(cfg.n_mels):
        lower, center, upper = edges[m : m + 3]
        rising = (freqs - lower) / (center - lower)
        falling = (upper - freqs) / (upper - center)
        bank[m] = np.maximum(0.0, np.minimum(rising, falling)) * 2.0 / (upper - lower)
    return bank.astype(np.float32)


def _window(cfg: MelConfig) -> torch.Tensor:
    return torch.hann_window(cfg.n_fft, periodic=True, dtype=torch.float32)


def stft(audio: torch.Tensor, cfg: MelConfig, hop: int) -> torch.Tensor:
    """audio [B,N] -> complex STFT [B,bins,N // hop + 1]: Hann window, frame t centred on
    sample t * hop (reflect padding), as the ONNX graphs' `_stft`."""
    return torch.stft(
        audio,
        cfg.n_fft,
        hop_length=hop,
        window=_window(cfg),
        center=True,
        pad_mode="reflect",
        return_complex=True,
    )


def magnitudes(audio: torch.Tensor, cfg: MelConfig, hop: int | None = None) -> torch.Tensor:
    """audio [B,N] -> |STFT| [B,F,bins] with F = N // hop (centred frames, reflect padding)."""
    hop = hop or cfg.hop_length
    frames = audio.shape[-1] // hop
    spec = stft(audio, cfg, hop)
    # Frame t of torch's centred STFT is centred on sample t * hop; shift by half a hop by
    # averaging neighbours would blur, so keep torch's frames and drop the last extra one.
    return spec.abs()[..., :frames].transpose(-1, -2)


def log_mel(audio: torch.Tensor, cfg: MelConfig) -> torch.Tensor:
    """audio [B,N] -> natural-log mel energies [B, N // hop, n_mels]."""
    bank = torch.from_numpy(mel_filterbank(cfg))
    return torch.log(torch.clamp(magnitudes(audio, cfg) @ bank.T, min=cfg.log_floor))


def mel_inverse(cfg: MelConfig) -> np.ndarray:
    """Mel energies -> linear magnitudes [n_mels, bins], non-negative and well conditioned.

    Each filter's energy over its weight sum estimates the magnitude near its centre; a
    linear bin is the filter-weighted mean of those estimates. (The least-squares pseudo-
    inverse reproduces exact mel frames but blows quantised ones up by 10^3 and more: the
    narrow low filters make the filterbank nearly singular.)
    """
    bank = mel_filterbank(cfg).astype(np.float64)
    filter_sums = bank.sum(axis=1, keepdims=True)  # mel_m / s_m estimates the magnitude
    coverage = bank.sum(axis=0)
    # Bins no filter covers (only at the very edges) borrow their nearest covered bin.
    covered = np.flatnonzero(coverage > 0)
    nearest = covered[np.abs(np.arange(cfg.bins)[:, None] - covered[None, :]).argmin(1)]
    return (bank[:, nearest] / coverage[nearest] / filter_sums).astype(np.float32)


def griffin_lim(
    magnitude: torch.Tensor,
    cfg: MelConfig,
    hop: int,
    iterations: int,
    momentum: float = 0.99,
    starting_phase: torch.Tensor | None = None,
) -> torch.Tensor:
    """Fast Griffin-Lim (with momentum) for |STFT| [B,F,bins] at `hop` -> audio [B, F*hop],
    from `starting_phase` [B,bins,F] (default: the fixed `initial_phase`)."""
    spec_mag = magnitude.transpose(-1, -2)  # [B,bins,F]
    length = magnitude.shape[-2] * hop
    window = _window(cfg)
    phase = starting_phase
    if phase is None:
        phase = torch.from_numpy(initial_phase(spec_mag.shape[-2], spec_mag.shape[-1]))
    angles = torch.polar(torch.ones_like(phase), phase).expand(spec_mag.shape)
    previous = torch.zeros_like(angles)
    audio = torch.zeros(magnitude.shape[0], length)
    for _ in range(iterations):
        audio = torch.istft(
            spec_mag * angles, cfg.n_fft, hop_length=hop, window=window, center=True, length=length
        )
        rebuilt = stft(audio, cfg, hop)[..., : spec_mag.shape[-1]]
        accelerated = rebuilt - (momentum / (1 + momentum)) * previous
        previous = rebuilt
        angles = accelerated / (accelerated.abs() + 1e-8)
    return torch.istft(
        spec_mag * angles, cfg.n_fft, hop_length=hop, window=window, center=True, length=length
    )


def initial_phase(bins: int, frames: int) -> np.ndarray:
    """Deterministic, spread-out starting phase [bins, frames] (integer hash, exact in ONNX)."""
    f = np.arange(bins, dtype=np.int64)[:, None]
    t = np.arange(frames, dtype=np.int64)[None, :]
    return (2 * np.pi * ((f * f * 7 + f * t * 3 + t * 13) % 31) / 31).astype(np.float32)


def mel_to_audio(
    logmel: torch.Tensor,
    cfg: MelConfig,
    upsample: int = 2,
    iterations: int = 32,
    power: float = 1.0,
    starting_audio: torch.Tensor | None = None,
) -> torch.Tensor:
    """log-mel [B,F,n_mels] -> audio [B, F*hop]: inverse filterbank (magnitude ** power), then
    Griffin-Lim on frames linearly interpolated to hop / upsample, starting from the phase of
    `starting_audio` [B, F*hop] when given."""
    inverse = torch.from_numpy(mel_inverse(cfg))
    linear = torch.clamp(torch.exp(logmel) @ inverse, min=0.0) ** power  # [B,F,bins]
    if upsample > 1:
        linear = torch.nn.functional.interpolate(
            linear.transpose(1, 2), scale_factor=upsample, mode="linear", align_corners=False
        ).transpose(1, 2)
    hop = cfg.hop_length // upsample
    phase = None
    if starting_audio is not None:
        phase = torch.angle(stft(starting_audio, cfg, hop)[..., : linear.shape[1]])
    return griffin_lim(linear, cfg, hop, iterations, starting_phase=phase)

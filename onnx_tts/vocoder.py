"""Vocoder stage: codec frames -> waveform, one-shot."""

from __future__ import annotations

import numpy as np

from onnx_tts.errors import InputError
from onnx_tts.session import Session


class Vocoder:
    """Runs a `codes` [B, F, K] -> `waveform` [B, F * hop] graph."""

    def __init__(self, session: Session, hop_length: int, codebooks: int, codebook_size: int):
        self.session = session
        self.hop_length = hop_length
        self.codebooks = codebooks
        self.codebook_size = codebook_size

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """[F, K] -> [F * hop] or [B, F, K] -> [B, F * hop] float32 samples."""
        codes = np.asarray(codes, dtype=np.int64)
        single = codes.ndim == 2
        batch = codes[None] if single else codes
        if batch.ndim != 3 or batch.shape[2] != self.codebooks:
            raise InputError(
                f"vocoder codes must be [frames, {self.codebooks}] or [batch, frames, "
                f"{self.codebooks}], got shape {codes.shape}"
            )
        if batch.shape[1] == 0:
            empty = np.zeros((batch.shape[0], 0), np.float32)
            return empty[0] if single else empty
        if batch.min() < 0 or batch.max() >= self.codebook_size:
            raise InputError(
                f"vocoder codes must be in [0, {self.codebook_size}); special tokens "
                "(pad/bos/eos) must not reach the vocoder"
            )
        waveform = self.session.run({"codes": batch}, ["waveform"])["waveform"]
        return waveform[0] if single else waveform

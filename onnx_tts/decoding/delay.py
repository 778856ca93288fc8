"""The codebook delay pattern, family-neutral: codebook k of frame t sits in row t + k.

A delayed sequence of T frames over K codebooks has T + K - 1 rows; before its data a codebook
holds a begin value, after it an end value. Frames come back from rows with `undelay`; while
rows arrive one by one, frame t is complete once row t + K - 1 exists (`complete_frame`).
"""

from __future__ import annotations

import numpy as np


def delay(codes: np.ndarray, begin: int, end: int) -> np.ndarray:
    """[T, K] frames -> [T + K - 1, K] delayed rows, `begin` before and `end` after each
    codebook's data."""
    codes = np.asarray(codes)
    frames, books = codes.shape
    rows = np.full((frames + books - 1, books), end, codes.dtype)
    for k in range(books):
        rows[:k, k] = begin
        rows[k : k + frames, k] = codes[:, k]
    return rows


def undelay(rows: np.ndarray) -> np.ndarray:
    """[L, K] delayed rows (L >= K - 1) -> [L - K + 1, K] frames."""
    rows = np.asarray(rows)
    length, books = rows.shape
    frames = max(0, length - books + 1)
    out = np.empty((frames, books), rows.dtype)
    for k in range(books):
        out[:, k] = rows[k : k + frames, k]
    return out


def complete_frame(rows: np.ndarray, last_row: int) -> np.ndarray | None:
    """The frame that row `last_row` completes (rows[last_row - K + 1 + k, k] for each k), or
    None while fewer than K rows exist. `rows` must hold rows up to `last_row`."""
    books = rows.shape[1]
    first = last_row - books + 1
    if first < 0:
        return None
    return rows[first + np.arange(books), np.arange(books)].copy()


__all__ = ["complete_frame", "delay", "undelay"]

"""The STFT and inverse STFT of the voice graphs as FFTs built from small matrix products.

The convolution form (``bundle.dft_kernels``) multiplies every frame by the full n_fft x n_fft
DFT matrix. Here the DFT is factored Cooley-Tukey style, n_fft = rows x cols, frame sample
n = a * cols + c and bin k = k1 + rows * k2:

    X[k1 + rows*k2] = sum_c e^(-2 pi i c k / n_fft) * sum_a x[a*cols + c] e^(-2 pi i a k1 / rows)

One MatMul over `a` (shared by every column c and frame), then one batched MatMul over `c`
per k1 with the twiddle factor folded into its matrix: n_fft * 2 * (rows + cols + 2)
multiply-adds per frame instead of n_fft * (n_fft + 2). The inverse runs the same two stages
backwards. ONNX's own ``DFT`` op is slower than the dense product on ORT 1.32's CPU kernel
(a scalar radix-2 loop over std::complex; measured in benchmarks/bench_vocoder_fft.py).

Layouts, chosen so that the stages need no transpose (both products contract the axis
before the last, frames ride along as the last axis):

* spectrum: [B, rows, 2, half_cols, T]: bin k = k1 + rows * k2 at (k1, :, k2), axis 2 =
  (real, imaginary); bins past n_fft / 2 are exactly zero.
* hop-major audio: [B, hop, J]: element (q, j) is sample j * hop + q - n_fft / 2 (the
  centring pad is part of the layout). Frame t's samples a * cols + c are then the rows
  (g, q) = divmod(a * cols + c, hop) of column t + g: framing is a few slices, and the overlap-
  add of the inverse is a few shifted sums, all over whole rows.

Frame t is centred on sample t * hop with reflect padding, the window is the periodic Hann,
and the inverse normalises by the overlap-added squared window: the convolution form exactly
(to float rounding).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeVar

import numpy as np

from onnx_tts.tools.graph_builder import GraphBuilder, reduce_op

_T = TypeVar("_T")


@dataclass(frozen=True)
class FFTPlan:
    """How one (n_fft, hop) STFT is factored: n_fft = rows * cols."""

    n_fft: int
    hop: int
    cols: int

    def __post_init__(self) -> None:
        if not 0 < self.hop <= self.n_fft:
            raise ValueError(f"hop {self.hop} must be in 1..n_fft ({self.n_fft})")
        if self.n_fft % 2 or self.cols < 2 or self.n_fft % self.cols or self.cols == self.n_fft:
            raise ValueError(
                f"cols {self.cols} must divide the even n_fft {self.n_fft} and leave rows >= 2"
            )

    @classmethod
    def choose(cls, n_fft: int, hop: int) -> FFTPlan:
        """The factorisation with the fewest multiply-adds (rows + cols smallest; a tie goes to
        the larger cols: 16 x 32 for 512, which measured as fast as 32 x 16)."""
        options = [c for c in range(2, n_fft) if n_fft % c == 0]
        if n_fft % 2 or not options:
            raise ValueError(f"no FFT plan for n_fft {n_fft}: it must be even and at least 4")
        return cls(n_fft, hop, min(options, key=lambda c: (n_fft // c + c, -c)))

    @property
    def rows(self) -> int:
        return self.n_fft // self.cols

    @property
    def half_cols(self) -> int:
        """k2 runs over 0..cols/2: every bin up to n_fft / 2 (and a few past it, kept zero)."""
        return self.cols // 2 + 1

    @property
    def bins(self) -> int:
        return self.n_fft // 2 + 1

    @property
    def frame_groups(self) -> int:
        """Hop columns a frame's samples fall in (n_fft / hop rounded up)."""
        return -(-self.n_fft // self.hop)

    def group_rows(self, g: int) -> int:
        """Frame samples in hop column g of the frame (hop, less in the last)."""
        return min(self.hop, self.n_fft - g * self.hop)

    @property
    def groups(self) -> int:
        """Hop columns past a frame's first that the overlap-add keeps, plus one: at least the
        frame's, and enough to reach n_fft / 2 past the last frame's centre (the centring
        pad). An inverse STFT of T frames has T + groups - 1 columns."""
        return max(self.frame_groups, 1 + -(-self.n_fft // (2 * self.hop)))

    def window(self) -> np.ndarray:
        """Periodic Hann (torch's default; bundle.dft_kernels), float64."""
        return 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(self.n_fft) / self.n_fft)

    def frame_window(self) -> np.ndarray:
        """[n_fft, 1]: the window at frame sample a * cols + c."""
        return self.window()[:, None].astype(np.float32)

    def bin_index(self) -> np.ndarray:
        """k at [k1, k2]: [rows, half_cols]."""
        return np.arange(self.rows)[:, None] + self.rows * np.arange(self.half_cols)[None, :]

    def in_spectrum_order(self, values: np.ndarray, axis: int) -> np.ndarray:
        """A per-bin array (`bins` long along `axis`) reordered to the spectrum layout's (k1, k2)
        order, rows * half_cols long, zero past n_fft / 2: a weight matrix whose rows or columns
        are bins then produces or consumes the layout directly."""
        k = self.bin_index().reshape(-1)
        valid = k <= self.n_fft // 2
        out = np.take(values, np.where(valid, k, 0), axis=axis)
        shape = [1] * out.ndim
        shape[axis] = -1
        return (out * valid.reshape(shape)).astype(values.dtype)

    def from_spectrum_order(self, values: np.ndarray, axis: int) -> np.ndarray:
        """The inverse of `in_spectrum_order`: back to `bins` in bin order."""
        order = np.argsort(self.bin_index().reshape(-1), kind="stable")[: self.bins]
        return np.take(values, order, axis=axis)

    @staticmethod
    def _angles(a: np.ndarray, b: np.ndarray, period: int) -> np.ndarray:
        """2 pi (a * b mod period) / period in float64 (the integer product reduced exactly)."""
        return 2 * np.pi * (np.multiply.outer(a, b) % period) / period

    @cached_property
    def analysis_rows(self) -> np.ndarray:
        """Forward stage 1, [(k1, re|im), rows (a)]: the length-`rows` DFT."""
        a = np.arange(self.rows)
        angle = self._angles(a, a, self.rows)  # [k1, a]
        out = np.stack([np.cos(angle), -np.sin(angle)], axis=1)
        return out.reshape(2 * self.rows, self.rows).astype(np.float32)

    @cached_property
    def analysis_cols(self) -> np.ndarray:
        """Forward stage 2, [rows (k1), (re|im, k2), (re|im, c)]: twiddle and the length-`cols`
        DFT for each k1; zero rows for bins past n_fft / 2."""
        k = self.bin_index()
        theta = self._angles(k, np.arange(self.cols), self.n_fft)  # [k1, k2, c]
        valid = (k <= self.n_fft // 2)[..., None]
        cos, sin = np.cos(theta) * valid, np.sin(theta) * valid
        # (Yr + i Yi) e^(-i theta): real = Yr cos + Yi sin, imaginary = Yi cos - Yr sin.
        real = np.concatenate([cos, sin], axis=2)
        imag = np.concatenate([-sin, cos], axis=2)
        return np.concatenate([real, imag], axis=1).astype(np.float32)

    @cached_property
    def synthesis_cols(self) -> np.ndarray:
        """Inverse stage 1, [rows (k1), (re|im, c), (re|im, k2)]: the inverse real DFT's bin
        weights (DC and Nyquist once, the others twice, past Nyquist zero), the length-`cols`
        inverse DFT and the twiddle for each k1."""
        k = self.bin_index()
        weight = np.where((k == 0) | (k == self.n_fft // 2), 1.0, 2.0) * (k <= self.n_fft // 2)
        psi = self._angles(k, np.arange(self.cols), self.n_fft).transpose(0, 2, 1)  # [k1,c,k2]
        cos, sin = weight[:, None, :] * np.cos(psi), weight[:, None, :] * np.sin(psi)
        # (Xr + i Xi) e^(i psi): real = Xr cos - Xi sin, imaginary = Xr sin + Xi cos.
        real = np.concatenate([cos, -sin], axis=2)
        imag = np.concatenate([sin, cos], axis=2)
        return np.concatenate([real, imag], axis=1).astype(np.float32)

    @cached_property
    def synthesis_rows(self) -> np.ndarray:
        """Inverse stage 2, [rows (a), (k1, re|im)]: the real part of the length-`rows` inverse
        DFT, divided by n_fft."""
        a = np.arange(self.rows)
        angle = self._angles(a, a, self.rows)  # [a, k1]
        out = np.stack([np.cos(angle), -np.sin(angle)], axis=2) / self.n_fft
        return out.reshape(self.rows, 2 * self.rows).astype(np.float32)


class FFTGraph:
    """FFT STFT / inverse STFT nodes of one plan in a GraphBuilder, for signals of `frames`
    frames and `samples` = frames * hop samples (1-D int64 [1] tensors of the graph)."""

    def __init__(self, b: GraphBuilder, plan: FFTPlan, frames: str, samples: str, tag: str):
        self.b, self.plan, self.frames, self.samples, self.tag = b, plan, frames, samples, tag
        self._cache: dict[str, Any] = {}  # weights and per-graph index tensors, built once

    def _weight(self, kind: str) -> str:
        """The plan's matrix `kind` (or the window) as an initializer, added once."""

        def make() -> str:
            values = self.plan.frame_window() if kind == "window" else getattr(self.plan, kind)
            return self.b.initializer(f"{self.tag}.{kind}", values)

        return self._once(kind, make)

    def _once(self, key: str, make: Callable[[], _T]) -> _T:
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    # forward ---------------------------------------------------------------------------
    def stft(self, padded: str, name: str) -> str:
        """Padded hop-major audio [B, hop, >= T + groups - 1] -> spectrum [B, rows, 2,
        half_cols, T] of its first T frames."""
        b, p = self.b, self.plan
        ends = self._once("frame_ends", self._frame_ends)
        # Frame sample g * hop + q is row q of column t + g: one slice of T columns per g.
        parts = [
            b.node(
                "Slice",
                [padded, b.const([0, g]), ends[g], b.const([1, 2])],
                name=f"{name}/Cols{g}",
            )
            for g in range(p.frame_groups)
        ]
        frames = (
            parts[0] if len(parts) == 1 else b.node("Concat", parts, axis=1, name=f"{name}/Frames")
        )
        frames = b.node("Mul", [frames, self._weight("window")], name=f"{name}/Window")
        frames = b.node(
            "Reshape", [frames, b.const([0, p.rows, -1])], name=f"{name}/Rows"
        )  # [B, a, (c, t)]
        y = b.node("MatMul", [self._weight("analysis_rows"), frames], name=f"{name}/DFTrows")
        y = b.node(
            "Reshape", [y, b.const([0, p.rows, 2 * p.cols, -1])], name=f"{name}/ByK1"
        )  # [B, k1, (re|im, c), t]
        y = b.node("MatMul", [self._weight("analysis_cols"), y], name=f"{name}/DFTcols")
        return b.node(
            "Reshape", [y, b.const([0, p.rows, 2, p.half_cols, -1])], name=f"{name}/Spectrum"
        )

    def _frame_ends(self) -> list[str]:
        """Slice ends (rows, columns) of each hop column of the frames."""
        b, p = self.b, self.plan
        return [
            b.node(
                "Concat",
                [b.const([p.group_rows(g)]), b.node("Add", [self.frames, b.const([g])])],
                axis=0,
                name=f"{self.tag}/End{g}",
            )
            for g in range(p.frame_groups)
        ]

    def pad_audio(self, audio: str, length: str, name: str) -> str:
        """Plain audio [B, N] (`length` = [N]) -> padded hop-major audio for this plan's frames
        (reflect padding by n_fft / 2 at both ends, as the convolution form's Pad)."""
        b, p = self.b, self.plan
        half = p.n_fft // 2
        padded = b.node(
            "Pad", [audio, b.const([0, half, 0, half])], mode="reflect", name=f"{name}/Reflect"
        )
        # Zeros to whole hops (never read by a frame), then cut to T + groups - 1 hops.
        padded = b.node("Pad", [padded, b.const([0, 0, 0, p.groups * p.hop])], name=f"{name}/Tail")
        end = b.node(
            "Mul",
            [b.node("Add", [self.frames, b.const([p.groups - 1])]), b.const([p.hop])],
            name=f"{name}/End",
        )
        padded = b.node("Slice", [padded, b.const([0]), end, b.const([1])], name=f"{name}/Cut")
        padded = b.node("Reshape", [padded, b.const([0, -1, p.hop])], name=f"{name}/Hops")
        return b.node("Transpose", [padded], perm=[0, 2, 1], name=f"{name}/HopMajor")

    def reflect_edges(self, audio: str, name: str) -> str:
        """An inverse STFT's output (hop-major, T * hop true samples) with its centring pad
        replaced by the reflection of the signal: what the convolution form's Pad(reflect)
        of the trimmed audio gives, without the trim."""
        b = self.b
        left, right = self._once("edge_index", self._edge_index)
        flat = b.node("Reshape", [audio, b.const([0, -1])], name=f"{name}/Flat")
        start = b.node(
            "Gather", [flat, left], axis=1, name=f"{name}/Left"
        )  # [B, hop, left columns]
        end = b.node("Gather", [flat, right], axis=1, name=f"{name}/Right")
        middle = b.node(
            "Slice",
            [
                audio,
                b.const([self._edge_columns()[0]]),
                self._once("right_start", self._right_start),
                b.const([2]),
            ],
            name=f"{name}/Middle",
        )
        return b.node("Concat", [start, middle, end], axis=2, name=f"{name}/Padded")

    def _edge_columns(self) -> tuple[int, int]:
        """(columns at the start, columns at the end) that hold centring pad."""
        p = self.plan
        half = p.n_fft // 2
        return -(-half // p.hop), p.groups - 1 - half // p.hop

    def _right_start(self) -> str:
        return self.b.node(
            "Add",
            [self.frames, self.b.const([self.plan.n_fft // 2 // self.plan.hop])],
            name=f"{self.tag}/RightStart",
        )

    def _edge_index(self) -> tuple[str, str]:
        """Flat indices [hop, columns] into an inverse STFT's [hop, T + groups - 1] output of
        the reflected samples (or the sample itself where it is inside the signal)."""
        b, p, tag = self.b, self.plan, f"{self.tag}/edges"
        half = p.n_fft // 2
        left_cols, right_cols = self._edge_columns()
        width = b.node("Add", [self.frames, b.const([p.groups - 1])], name=f"{tag}/Width")
        last = b.node("Sub", [self.samples, b.const([1])], name=f"{tag}/Last")
        q = np.arange(p.hop)[:, None]

        def index(first_col: str | np.ndarray, cols: int, label: str) -> str:
            pos = b.node(
                "Add",
                [
                    b.node("Mul", [first_col, b.const([p.hop])]),
                    b.const(q + p.hop * np.arange(cols)),
                ],
                name=f"{tag}/{label}Pos",
            )  # [hop, cols] padded positions
            s = b.node("Sub", [pos, b.const(half)], name=f"{tag}/{label}Sample")
            # Reflect about 0 and S - 1 (one bounce: the pad is shorter than the signal).
            s = b.node(
                "Sub",
                [last, b.node("Abs", [b.node("Sub", [last, b.node("Abs", [s])])])],
                name=f"{tag}/{label}Reflect",
            )
            p_src = b.node("Add", [s, b.const(half)], name=f"{tag}/{label}Src")
            col = b.node("Div", [p_src, b.const(p.hop)], name=f"{tag}/{label}Col")
            row = b.node("Mod", [p_src, b.const(p.hop)], name=f"{tag}/{label}Row")
            return b.node("Add", [b.node("Mul", [row, width]), col], name=f"{tag}/{label}Flat")

        left = index(b.const([0]), left_cols, "Left")
        right = index(self._once("right_start", self._right_start), right_cols, "Right")
        return left, right

    # inverse ---------------------------------------------------------------------------
    def istft(self, spectrum: str, name: str) -> str:
        """Spectrum [B, rows, 2, half_cols, T] -> the overlap-added inverse STFT, normalised by
        the squared-window envelope, hop-major [B, hop, T + groups - 1] (centring pad kept)."""
        b, p = self.b, self.plan
        z = b.node(
            "Reshape", [spectrum, b.const([0, p.rows, 2 * p.half_cols, -1])], name=f"{name}/In"
        )
        z = b.node("MatMul", [self._weight("synthesis_cols"), z], name=f"{name}/DFTcols")
        z = b.node("Reshape", [z, b.const([0, 2 * p.rows, -1])], name=f"{name}/ByC")
        x = b.node("MatMul", [self._weight("synthesis_rows"), z], name=f"{name}/DFTrows")
        x = b.node(
            "Reshape", [x, b.const([0, p.n_fft, -1])], name=f"{name}/Frames"
        )  # [B, frame sample (a, c), T]
        x = b.node("Mul", [x, self._weight("window")], name=f"{name}/Window")
        ola = self._overlap_add(x, name)
        return b.node("Div", [ola, self.envelope()], name=f"{name}/Normalise")

    def _overlap_add(self, frames: str, name: str) -> str:
        """[B, n_fft, T] -> [B, hop, T + groups - 1]: frame t's samples g * hop + q land in
        row q of column t + g (a Pad with negative pads cuts each hop out and shifts it)."""
        b, p = self.b, self.plan
        shifted = []
        for g in range(p.frame_groups):
            # Rows g*hop .. g*hop + hop - 1 (zeros past n_fft), columns shifted right by g.
            pads = [0, -g * p.hop, g, 0, (g + 1) * p.hop - p.n_fft, p.groups - 1 - g]
            shifted.append(b.node("Pad", [frames, b.const(pads)], name=f"{name}/Shift{g}"))
        return b.node("Sum", shifted, name=f"{name}/OLA") if len(shifted) > 1 else shifted[0]

    def envelope(self) -> str:
        """The overlap-added squared window [hop, T + groups - 1], floored at 1e-8."""

        def make() -> str:
            b, p, tag = self.b, self.plan, f"{self.tag}/envelope"
            window_sq = self.plan.frame_window() ** 2  # [n_fft, 1]
            shape = b.node(
                "Concat", [b.const([1, p.n_fft]), self.frames], axis=0, name=f"{tag}/Shape"
            )
            frames = b.node(
                "Expand", [b.initializer(f"{self.tag}.window_sq", window_sq), shape], name=tag
            )
            ola = self._overlap_add(frames, tag)
            ola = b.node("Squeeze", [ola, b.const([0])], name=f"{tag}/Squeeze")
            return b.node("Max", [ola, b.const(1e-8, np.float32)], name=f"{tag}/Floor")

        return self._once("envelope", make)

    def waveform(self, audio: str, name: str) -> str:
        """Hop-major inverse STFT output -> [B, T * hop] samples (the centring pad cut)."""
        b, half = self.b, self.plan.n_fft // 2
        x = b.node("Transpose", [audio], perm=[0, 2, 1], name=f"{name}/T")
        x = b.node("Reshape", [x, b.const([0, -1])], name=f"{name}/Flat")
        end = b.node("Add", [self.samples, b.const([half])], name=f"{name}/End")
        return b.node("Slice", [x, b.const([half]), end, b.const([1])], name=f"{name}/Trim")

    # layouts ---------------------------------------------------------------------------
    def bins_to_spectrum(self, values: str, parts: int, name: str) -> str:
        """[B, parts * bins, T] (parts: 2 for real then imaginary, 1 for a magnitude) ->
        [B, rows, parts, half_cols, T], bins past n_fft / 2 zero."""
        b, p = self.b, self.plan
        x = b.node("Reshape", [values, b.const([0, parts, p.bins, -1])], name=f"{name}/Parts")
        extra = p.rows * p.half_cols - p.bins
        x = b.node("Pad", [x, b.const([0, 0, 0, 0, 0, 0, extra, 0])], name=f"{name}/Pad")
        x = b.node("Reshape", [x, b.const([0, parts, p.half_cols, p.rows, -1])], name=f"{name}/K")
        return b.node("Transpose", [x], perm=[0, 3, 1, 2, 4], name=f"{name}/Layout")


def spectrum_power(b: GraphBuilder, spectrum: str, name: str, keepdims: bool = True) -> str:
    """|X|^2 of a spectrum [B, rows, 2, half_cols, T] -> [B, rows, (1,) half_cols, T].
    (Mul + ReduceSum: ORT 1.32's ReduceSumSquare over a middle axis is 5x slower.)"""
    squares = b.node("Mul", [spectrum, spectrum], name=f"{name}/Squares")
    return reduce_op(b, "ReduceSum", squares, [2], keepdims=keepdims, name=name)


__all__ = ["FFTGraph", "FFTPlan", "spectrum_power"]

"""What a cache value may hold: each typed cache declares a :class:`Schema`, and every value
read from any tier, or offered to one, is checked here (the one place).

A checksum proves only that an entry was written whole; a hostile or buggy writer can still
store audio scaled x1000, another sample rate, big-endian or complex numbers, 1e30 embeddings or
arrays of the wrong shape. Such a value must never be served: the tiered cache drops it and
recomputes (see :mod:`onnx_tts.cache.tiered`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from onnx_tts.cache.codec import ALLOWED_DTYPE_KINDS

__all__ = ["MAX_ACTIVATION", "MAX_INDEX", "ArraySpec", "Schema"]

# Bound on float values that are not audio (embeddings, encoder features, KV values): the
# largest float16. No model produces more in either precision (an fp16 graph would overflow to
# inf), and it is still 26 orders of magnitude below the 1e30 an attacker stored.
MAX_ACTIVATION = 65504.0
# Bound on integer values (codes, token ids): what an int32 index can address.
MAX_INDEX = 2**31 - 1
Dim = int | None


@dataclass(frozen=True)
class ArraySpec:
    """One array of a value.

    dtypes: allowed dtype names (e.g. ``("float32",)``); empty = any bool/int/float dtype.
    shape: the expected shape, None for a dimension of any size; None = any rank.
    low, high: bounds on every value (inclusive; floats must also be finite). Default: float
        values within +-MAX_ACTIVATION, integers within +-MAX_INDEX.
    max_size: most elements.
    """

    dtypes: tuple[str, ...] = ()
    shape: tuple[Dim, ...] | None = None
    low: float | None = None
    high: float | None = None
    max_size: int | None = None
    # Resolved once: this check runs on every cache hit, so it avoids numpy's slow paths
    # (dtype.name, numpy scalars) and costs a few microseconds plus two reductions.
    _allowed: tuple[np.dtype, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_allowed", tuple(np.dtype(d) for d in self.dtypes))

    def problem(self, name: str, array: object) -> str | None:
        """Why ``array`` cannot be this array, or None."""
        if not isinstance(array, np.ndarray):
            return f"{name!r} is a {type(array).__name__}, not a numpy array"
        dtype = array.dtype
        if dtype.kind not in ALLOWED_DTYPE_KINDS:
            return f"{name!r} has dtype {dtype}; only bool, integer and real float values"
        if not dtype.isnative:
            return f"{name!r} has non-native byte order ({dtype.str})"
        if self._allowed and dtype not in self._allowed:
            return f"{name!r} has dtype {dtype}, expected {' or '.join(self.dtypes)}"
        if self.shape is not None:
            if array.ndim != len(self.shape):
                return (
                    f"{name!r} has shape {array.shape}, expected {len(self.shape)}-D "
                    f"{_describe(self.shape)}"
                )
            pairs = zip(array.shape, self.shape, strict=True)
            if any(want is not None and got != want for got, want in pairs):
                return f"{name!r} has shape {array.shape}, expected {_describe(self.shape)}"
        if self.max_size is not None and array.size > self.max_size:
            return f"{name!r} holds {array.size} values, more than {self.max_size}"
        return self._range_problem(name, array)

    def _range_problem(self, name: str, array: np.ndarray) -> str | None:
        kind = array.dtype.kind
        if array.size == 0 or kind == "b":
            return None
        floating = kind == "f"
        low = self.low if self.low is not None else -MAX_ACTIVATION if floating else -MAX_INDEX
        high = self.high if self.high is not None else MAX_ACTIVATION if floating else MAX_INDEX
        if array.size == 1:
            smallest = largest = array.item()
        else:  # two reductions, no temporary; NaN propagates through min/max
            smallest, largest = array.min().item(), array.max().item()
        if floating and not (math.isfinite(smallest) and math.isfinite(largest)):
            return f"{name!r} holds NaN or infinite values"
        if not low <= smallest <= largest <= high:
            bound = f"{_number(low)}" if low == high else f"[{_number(low)}, {_number(high)}]"
            actual = (
                f"{_number(smallest)}"
                if smallest == largest
                else f"[{_number(smallest)}, {_number(largest)}]"
            )
            return f"{name!r} holds {actual}, expected {bound}"
        return None


@dataclass(frozen=True)
class Schema:
    """The arrays of a value.

    arrays: exactly these names, each with its spec. numbered: ``(prefix, spec)`` for values of
    ``prefix0 .. prefix{n-1}`` (n >= 1, e.g. one KV array per layer). With neither, any names
    are allowed, each checked against ``any_array``.
    """

    arrays: Mapping[str, ArraySpec] = field(default_factory=dict)
    numbered: tuple[str, ArraySpec] | None = None
    any_array: ArraySpec = ArraySpec()

    def problem(self, value: object) -> str | None:
        """Why ``value`` cannot be a value of this schema, or None."""
        if not isinstance(value, Mapping) or not value:
            return f"a value is a non-empty dict of arrays, got {type(value).__name__}"
        for name, spec in self._specs(value).items():
            if spec is None:
                return self._names_problem(value)
            problem = spec.problem(name, value[name])
            if problem is not None:
                return problem
        return None

    def _specs(self, value: Mapping) -> dict[str, ArraySpec | None]:
        if self.numbered is not None:
            prefix, spec = self.numbered
            expected = {f"{prefix}{i}" for i in range(len(value))}
            return {name: spec if name in expected else None for name in value}
        if self.arrays:
            if set(value) != set(self.arrays):
                return {"": None}
            return dict(self.arrays)
        return {name: self.any_array for name in value}

    def _names_problem(self, value: Mapping) -> str:
        if self.numbered is not None:
            prefix = self.numbered[0]
            return f"holds arrays {sorted(value)}, expected {prefix}0 .. {prefix}{len(value) - 1}"
        return f"holds arrays {sorted(value)}, expected {sorted(self.arrays)}"


def _describe(shape: tuple[Dim, ...]) -> str:
    return "[" + ", ".join("*" if d is None else str(d) for d in shape) + "]"


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)

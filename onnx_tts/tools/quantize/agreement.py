"""How closely a quantized graph follows its float original: both run side by side on the
same inputs (a prefill, then single-token decode steps for graphs with a KV cache; for other
graphs as many calls), on the project's own session core, and every output is compared step
by step: max |diff|, cosine, argmax agreement of logits and equality of integer outputs
(sampled codes). Each call is timed too (float and quantized alternate, so both see the same
machine load), which tells whether the quantized graph is faster.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from onnx_tts.decoding.program import length_feeds
from onnx_tts.errors import ModelError, SessionError
from onnx_tts.graph_io import graph_spec_of, kv_layout, read_graph_proto
from onnx_tts.session import KVCache, Session, SessionOptions
from onnx_tts.tools.quantize.feeds import Hint, RandomFeeds, gather_sizes

# An entry more than this many times the median |value| is a masking bias, not a logit.
MASK_FACTOR = 100.0
_MISSING_KERNEL = re.compile(r"implementation for (\w+)\((\d+)\) node with name '([^']*)'")


@dataclass(frozen=True)
class OutputAgreement:
    """One output of the graph, over every compared call."""

    name: str
    max_abs_diff: float
    typical_abs: float  # median |value| of the float output
    cosine_min: float
    cosine_mean: float
    top1: float | None = None  # logits: share of positions whose argmax agrees
    equal: float | None = None  # integer outputs (codes, flags): share of equal elements

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class Agreement:
    prefill_tokens: int
    decode_steps: int
    outputs: tuple[OutputAgreement, ...]
    float_ms: float  # median per decode call (or per call, without a cache)
    quantized_ms: float

    @property
    def speed_ratio(self) -> float:
        """Quantized time over float time (below 1: faster)."""
        return self.quantized_ms / max(self.float_ms, 1e-9)

    def as_dict(self) -> dict[str, Any]:
        return {
            "prefill_tokens": self.prefill_tokens,
            "decode_steps": self.decode_steps,
            "outputs": [o.as_dict() for o in self.outputs],
            "float_ms_per_call": round(self.float_ms, 4),
            "quantized_ms_per_call": round(self.quantized_ms, 4),
            "speed_ratio": round(self.speed_ratio, 4),
        }


@dataclass
class _Tally:
    max_abs: float = 0.0
    cosines: list[float] = field(default_factory=list)
    typical: list[float] = field(default_factory=list)
    top1: list[float] = field(default_factory=list)
    equal: list[float] = field(default_factory=list)

    def add(self, name: str, reference: np.ndarray, value: np.ndarray) -> None:
        if reference.shape != value.shape:
            raise ModelError(
                f"output {name!r}: the quantized graph gives shape {value.shape}, the float "
                f"graph {reference.shape}"
            )
        if reference.dtype.kind in "iub":
            self.equal.append(float(np.mean(reference == value)) if reference.size else 1.0)
            return
        a, b = reference.astype(np.float64), value.astype(np.float64)
        if not np.all(np.isfinite(b)):
            self.max_abs = float("inf")
            self.cosines.append(float("-inf"))
            return
        self.max_abs = max(self.max_abs, float(np.max(np.abs(a - b))) if a.size else 0.0)
        typical = float(np.median(np.abs(a))) if a.size else 0.0
        self.typical.append(typical)
        # Masking biases (-1e4 on tokens a model never emits) would make every cosine ~1:
        # the cosine is taken over the ordinary entries, as the converter's check does.
        ordinary = np.abs(a) <= MASK_FACTOR * max(typical, 1e-6)
        a, b = a[ordinary], b[ordinary]
        norm = float(np.linalg.norm(a) * np.linalg.norm(b))
        self.cosines.append(float(np.dot(a, b) / norm) if norm > 0 else 1.0)
        if "logits" in name and reference.ndim >= 1 and reference.shape[-1] > 1:
            agree = np.argmax(reference, -1) == np.argmax(value, -1)
            self.top1.append(float(np.mean(agree)))

    def result(self, name: str) -> OutputAgreement:
        if self.equal and not self.cosines:
            equal = float(np.mean(self.equal))
            return OutputAgreement(name, 0.0, 0.0, 1.0, 1.0, equal=equal)
        return OutputAgreement(
            name,
            self.max_abs,
            float(np.median(self.typical)) if self.typical else 0.0,
            float(min(self.cosines)) if self.cosines else 1.0,
            float(np.mean(self.cosines)) if self.cosines else 1.0,
            top1=float(np.mean(self.top1)) if self.top1 else None,
        )


def open_session(path: Path, what: str) -> Session:
    """A session on the core (one thread: steadier timings); a graph ONNX Runtime cannot run
    on the CPU is a ModelError naming the operator."""
    try:
        return Session(path, SessionOptions(intra_op_threads=1, inter_op_threads=1))
    except (ModelError, SessionError) as error:
        text = str(error)
        missing = _MISSING_KERNEL.search(text)
        if missing:
            op, version, node = missing.groups()
            raise ModelError(
                f"{what}: ONNX Runtime has no CPU kernel for {op} (opset {version}, node "
                f"{node!r}) with these input types, so the graph cannot run here; leave this "
                "graph out (--graphs) or export it with operators the CPU provider implements"
            ) from None
        raise ModelError(f"{what}: ONNX Runtime cannot load the graph: {text}") from None


class _Pair:
    """The float and the quantized session of one graph, run on the same feeds."""

    def __init__(self, float_path: Path, quantized_path: Path, what: str) -> None:
        self.reference = open_session(float_path, f"{what} (float)")
        self.quantized = open_session(quantized_path, f"{what} (quantized)")
        self.tallies: dict[str, _Tally] = {}
        self.outputs: tuple[str, ...] = ()  # compared outputs (all when empty)
        self.times: tuple[list[float], list[float]] = ([], [])

    def compare(self, reference: Mapping[str, np.ndarray], value: Mapping[str, np.ndarray]):
        for name, array in reference.items():
            if self.outputs and name not in self.outputs:
                continue
            self.tallies.setdefault(name, _Tally()).add(name, array, value[name])

    def timed(self, run_reference, run_quantized, keep: bool) -> tuple[dict, dict]:
        start = time.perf_counter()
        reference = run_reference()
        middle = time.perf_counter()
        value = run_quantized()
        end = time.perf_counter()
        if keep:
            self.times[0].append(middle - start)
            self.times[1].append(end - middle)
        self.compare(reference, value)
        return reference, value

    def result(self, prefill: int, steps: int) -> Agreement:
        float_times, quantized_times = self.times
        return Agreement(
            prefill,
            steps,
            tuple(tally.result(name) for name, tally in self.tallies.items()),
            1000 * float(np.median(float_times)) if float_times else 0.0,
            1000 * float(np.median(quantized_times)) if quantized_times else 0.0,
        )


def _feeds_for(
    path: Path, hints: Mapping[str, Hint], dims: Mapping[str, int], seed: int
) -> RandomFeeds:
    model = read_graph_proto(path)  # parsed once, for its inputs and its embedding tables
    return RandomFeeds(graph_spec_of(model, path).inputs, gather_sizes(model), hints, dims, seed)


def compare_stateless(
    float_path: Path,
    quantized_path: Path,
    *,
    calls: int,
    hints: Mapping[str, Hint] | None = None,
    dims: Mapping[str, int] | None = None,
    outputs: Sequence[str] = (),
    what: str = "graph",
    seed: int = 0,
) -> Agreement:
    """`calls` runs of both graphs on fresh random inputs (no state between calls); `outputs`
    are compared (default: all)."""
    feeds = _feeds_for(float_path, hints or {}, dims or {}, seed)
    pair = _Pair(float_path, quantized_path, what)
    pair.outputs = tuple(outputs)
    for index in range(calls):
        step = feeds.make()
        pair.timed(
            lambda step=step: pair.reference.run(step),
            lambda step=step: pair.quantized.run(step),
            keep=index > 0,
        )
    return pair.result(0, calls)


def compare_with_cache(
    float_path: Path,
    quantized_path: Path,
    *,
    prefill_tokens: int,
    steps: int,
    hints: Mapping[str, Hint] | None = None,
    dims: Mapping[str, int] | None = None,
    prefill: tuple[Path, Path] | None = None,
    what: str = "graph",
    seed: int = 0,
) -> Agreement:
    """A graph with a KV cache: a prefill of `prefill_tokens` (one run of the graph itself, a
    run of single-token steps for graphs without a sequence input, or a run of the separate
    `prefill` graphs (float, quantized) whose presents become the cache), then `steps`
    single-token decode steps, each cache kept by `KVCache` (in place when the graph writes it
    in place, else chained) and teacher-forced with the same random inputs."""
    feeds = _feeds_for(float_path, hints or {}, dims or {}, seed)
    pair = _Pair(float_path, quantized_path, what)
    in_place = kv_layout(pair.reference.spec).in_place
    capacity = prefill_tokens + steps + 1
    caches = [
        KVCache(
            session, "inplace" if in_place else "chain", capacity=capacity if in_place else None
        )
        for session in (pair.reference, pair.quantized)
    ]
    sequence = bool(feeds.sequence_inputs())

    def step(tokens: int, keep: bool) -> None:
        inputs = feeds.make(tokens if sequence else None)
        inputs.update(length_feeds(pair.reference, np.array([caches[0].length]), tokens))
        pair.timed(
            lambda: caches[0].step(inputs, new_tokens=tokens),
            lambda: caches[1].step(inputs, new_tokens=tokens),
            keep=keep,
        )

    if prefill is not None:
        prefill_feeds = _feeds_for(prefill[0], hints or {}, dims or {}, seed + 1)
        prefill_pair = _Pair(prefill[0], prefill[1], f"{what} prefill")
        inputs = prefill_feeds.make(prefill_tokens)
        inputs.update(length_feeds(prefill_pair.reference, np.array([0]), prefill_tokens))
        reference = caches[0].prefill(prefill_pair.reference, inputs)
        value = caches[1].prefill(prefill_pair.quantized, inputs)
        pair.compare(reference, value)
    elif sequence:
        step(prefill_tokens, keep=False)
    else:
        for _ in range(prefill_tokens):
            step(1, keep=False)
    for index in range(steps):
        step(1, keep=index > 0)
    return pair.result(prefill_tokens, steps)


def worst(outputs: Sequence[OutputAgreement]) -> OutputAgreement:
    """The output that agrees least (lowest cosine, then lowest equality)."""
    return min(outputs, key=lambda o: (o.cosine_min, o.equal if o.equal is not None else 1.0))


__all__ = [
    "Agreement",
    "OutputAgreement",
    "compare_stateless",
    "compare_with_cache",
    "open_session",
    "worst",
]

"""Python face of the C++ session core (`onnx_tts._core`).

The core loads the ONNX Runtime shared library that ships inside the installed `onnxruntime`
(or `onnxruntime-gpu`) wheel, found without importing the wheel's Python module, so there is
one ORT per process and GPU builds work unchanged.
"""

from __future__ import annotations

import atexit
import concurrent.futures.thread  # noqa: F401 - registers its exit hook first (below)
import glob
import importlib.util
import logging
import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

try:
    from onnx_tts import _core
except ImportError as _missing_core:
    # Typical cause: `python` started in the repository root after a non-editable
    # `pip install .`, so this source tree (without the compiled core) shadows the install.
    raise ImportError(
        f"onnx_tts's compiled core (_core) is missing from {Path(__file__).parent}: this looks "
        "like the source tree without a build. Run from another directory, or install it "
        "editable (pip install -e .)"
    ) from _missing_core
from onnx_tts.errors import ModelError, SessionError
from onnx_tts.graph_io import (
    GQA_OP,
    GraphSpec,
    TensorSpec,
    graph_spec,
    kv_layout,
    kv_pairs,
    read_graph_spec,
)

KVMode = Literal["copy", "chain", "inplace"]
KV_MODES: tuple[str, ...] = ("copy", "chain", "inplace")

_init_lock = threading.Lock()


def ort_library_path() -> str:
    """Path of libonnxruntime inside the installed onnxruntime wheel (or $ONNX_TTS_ORT_LIBRARY)."""
    override = os.environ.get("ONNX_TTS_ORT_LIBRARY")
    if override:
        return override
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise SessionError(
            "onnxruntime is not installed: pip install onnxruntime (or onnxruntime-gpu)"
        )
    for location in spec.submodule_search_locations:
        candidates = sorted(glob.glob(os.path.join(location, "capi", "libonnxruntime.so*")))
        if candidates:
            return candidates[-1]
    raise SessionError(
        "the installed onnxruntime wheel has no capi/libonnxruntime.so*; reinstall onnxruntime "
        "or set ONNX_TTS_ORT_LIBRARY to the library's path"
    )


def ensure_runtime() -> None:
    """Load ONNX Runtime into the core once per process."""
    if _core.is_initialized():
        return
    with _init_lock:
        if not _core.is_initialized():
            try:
                _core.init(ort_library_path())
            except _core.RunError as error:
                raise SessionError(str(error)) from None


def ort_version() -> str:
    ensure_runtime()
    return _core.ort_version()


def available_cores() -> int:
    """CPUs this process may run on (its affinity, e.g. a container's share)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# Workers (anything with close()) whose daemon threads may be inside an ONNX Runtime run or
# hand work to a thread pool: closed as soon as the main thread ends (`close_at_exit`).
_CLOSE_AT_EXIT: weakref.WeakSet[Any] = weakref.WeakSet()


def close_at_exit(worker: Any) -> None:
    """Have `worker.close()` run when the main thread ends, before anything of the interpreter
    goes: before concurrent.futures stops taking work (a daemon thread handing a pool work then
    dies with "Exception in thread ..." on stderr; CI saw it after a signal) and before ONNX
    Runtime's statics are destroyed under a run (the process aborts, exit 134)."""
    _CLOSE_AT_EXIT.add(worker)


def _close_workers() -> None:
    for worker in list(_CLOSE_AT_EXIT):
        try:
            worker.close()
        except Exception as error:  # (one worker's failure must not keep the rest running)
            logging.getLogger("onnx_tts").debug("closing %r at exit failed: %r", worker, error)


# threading's exit hooks run when the main thread ends, before atexit's, latest registered
# first: concurrent.futures registered its own on import (above), so ours runs before it.
getattr(threading, "_register_atexit", atexit.register)(_close_workers)


@dataclass(frozen=True)
class SessionOptions:
    """How a graph is run. `shared_thread_pool` makes sessions share ORT's global pool.

    `allow_spinning` is off: a family's stage may run many sessions one after another (35 per
    frame for one family: a backbone, a depth step and 33 heads), and with spinning each
    finished session's workers keep polling while the next one runs. Measured with 2 intra-op
    threads on 2 cores: 1.2 frames/s with spinning against 23 without (a tiny model), and at a
    1.7B model's size 0.87 frames/s without it against 0.62 at one thread
    (docs/BENCHMARKS.md)."""

    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    intra_op_threads: int = 0
    inter_op_threads: int = 0
    graph_optimization_level: str = "all"
    shared_thread_pool: bool = False
    allow_spinning: bool = False
    device_id: int = 0

    def to_core(self) -> Any:
        config = _core.SessionConfig()
        config.providers = list(self.providers)
        config.intra_op_threads = int(self.intra_op_threads)
        config.inter_op_threads = int(self.inter_op_threads)
        config.graph_optimization_level = self.graph_optimization_level
        config.shared_thread_pool = bool(self.shared_thread_pool)
        config.allow_spinning = bool(self.allow_spinning)
        config.device_id = int(self.device_id)
        return config


def _tensor_specs(raw: list[dict[str, Any]]) -> list[TensorSpec]:
    return [TensorSpec(i["name"], np.dtype(i["dtype"]), tuple(i["shape"])) for i in raw]


@dataclass
class Session:
    """One ONNX graph on the C++ core."""

    path: Path
    options: SessionOptions = field(default_factory=SessionOptions)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        if not self.path.is_file():
            raise ModelError(f"ONNX graph not found: {self.path}")
        ensure_runtime()
        try:
            self._core = _core.Session(str(self.path), self.options.to_core())
        except _core.ModelLoadError as error:
            raise ModelError(str(error)) from None
        except _core.RunError as error:
            raise SessionError(str(error)) from None
        self.inputs: list[TensorSpec] = _tensor_specs(self._core.inputs)
        self.outputs: list[TensorSpec] = _tensor_specs(self._core.outputs)
        self.spec = graph_spec(self.path, self.inputs, self.outputs)

    @property
    def input_names(self) -> list[str]:
        return [info.name for info in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [info.name for info in self.outputs]

    def input(self, name: str) -> TensorSpec | None:
        return next((info for info in self.inputs if info.name == name), None)

    def output(self, name: str) -> TensorSpec | None:
        return next((info for info in self.outputs if info.name == name), None)

    def run(
        self, feeds: Mapping[str, Any], output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Run with numpy feeds; returns numpy outputs (all of them unless named)."""
        try:
            return self._core.run(dict(feeds), None if output_names is None else list(output_names))
        except _core.RunError as error:
            raise SessionError(str(error)) from None

    def run_values(
        self, feeds: Mapping[str, Any], output_names: Sequence[str] | None = None
    ) -> dict[str, Any]:
        """Run and keep the outputs in ORT memory (`_core.Value`); they can be fed back as-is."""
        try:
            return self._core.run(
                dict(feeds), None if output_names is None else list(output_names), True
            )
        except _core.RunError as error:
            raise SessionError(str(error)) from None

    @property
    def core(self) -> Any:
        return self._core


class LazySession:
    """A graph whose session is created the first time it runs (a family may ship graphs
    that most requests never need: their memory and load time are then never spent). Its
    declared I/O (`spec`) was read without a session."""

    def __init__(self, spec: GraphSpec, options: SessionOptions) -> None:
        self.spec = spec
        self.path = spec.path
        self.options = options
        self.output_names = list(spec.outputs)
        self._session: Session | None = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._session is not None

    def get(self) -> Session:
        if self._session is None:
            with self._lock:
                if self._session is None:
                    self._session = Session(self.path, self.options)
        return self._session

    def run(
        self, feeds: Mapping[str, Any], output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        return self.get().run(feeds, output_names)


def describe_graphs(sessions: Mapping[str, Session | LazySession]) -> dict[str, dict[str, Any]]:
    """File and declared I/O of each graph by role, for `onnx-tts info`."""
    return {
        role: {
            "file": session.path.name,
            "inputs": [t.describe() for t in session.spec.inputs.values()],
            "outputs": [t.describe() for t in session.spec.outputs.values()],
        }
        for role, session in sessions.items()
    }


def _pair_names(session: Session, pairs: Mapping[str, str] | None) -> list[tuple[str, str]]:
    """The caller's (past, present) pairs in their order, or the graph's paired by layer."""
    if pairs is not None:
        return [(str(past), str(present)) for past, present in pairs.items()]
    try:
        return kv_pairs(session.spec.input_names, session.spec.output_names)
    except ModelError as error:
        raise SessionError(f"{session.path.name}: {error} (pass pairs= to name them)") from None


class KVCache:
    """The KV cache of one LM session, in `copy`, `chain` or `inplace` mode.

    `step(feeds)` takes every non-KV input (for GroupQueryAttention graphs `seqlens_k` and
    `total_sequence_length` are filled in by the cache) and returns the non-KV outputs.
    """

    def __init__(
        self,
        session: Session,
        mode: KVMode = "chain",
        batch_size: int = 1,
        capacity: int | None = None,
        pairs: Mapping[str, str] | None = None,
    ) -> None:
        if mode not in KV_MODES:
            raise SessionError(f"unknown KV mode {mode!r}; choose one of {', '.join(KV_MODES)}")
        self.session = session
        try:
            self._core = _core.KVCache(
                session.core, mode, batch_size, capacity, _pair_names(session, pairs)
            )
        except _core.RunError as error:
            raise SessionError(str(error)) from None

    @property
    def mode(self) -> str:
        return self._core.mode

    @property
    def length(self) -> int:
        return self._core.length

    @property
    def capacity(self) -> int | None:
        return self._core.capacity

    @property
    def batch_size(self) -> int:
        return self._core.batch_size

    @property
    def pairs(self) -> list[tuple[str, str]]:
        return list(self._core.pairs)

    def step(
        self,
        feeds: Mapping[str, Any],
        new_tokens: int | None = None,
        output_names: Sequence[str] | None = None,
    ) -> dict[str, np.ndarray]:
        try:
            return self._core.step(
                dict(feeds), new_tokens, None if output_names is None else list(output_names)
            )
        except _core.RunError as error:
            raise SessionError(str(error)) from None

    def reset(self) -> None:
        self._core.reset()

    def prefill(
        self,
        session: Session,
        feeds: Mapping[str, Any],
        output_names: Sequence[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """Empty the cache, run `session` (a prefill graph with this cache's present outputs
        and no past inputs, e.g. a prefill graph beside a step graph) over `feeds`,
        and keep its presents as the cache's first tokens: in chain mode the values themselves
        become the step graph's pasts, no host copy. Returns the other outputs (all unless
        named)."""
        try:
            return self._core.prefill(
                session.core, dict(feeds), None if output_names is None else list(output_names)
            )
        except _core.RunError as error:
            raise SessionError(str(error)) from None

    def load_prefix(self, values: Sequence[np.ndarray]) -> None:
        """Empty the cache, then hold `values` (one array per pair in `pairs` order, shaped
        like the pair's past input for L tokens, as `read` returns them): the next step
        continues after those L tokens exactly as if they had been run (a cached voice
        prefix)."""
        try:
            self._core.load_prefix(list(values))
        except _core.RunError as error:
            raise SessionError(str(error)) from None

    def read(self, index: int) -> np.ndarray:
        """Copy of KV tensor `index` (in `pairs` order): [batch, heads, length, head_dim], or
        [batch, length, heads, head_dim] for graphs laid out that way."""
        return self._core.read(index)

    def past_data_ptrs(self) -> list[int]:
        return list(self._core.past_data_ptrs())

    def present_data_ptrs(self) -> list[int]:
        return list(self._core.present_data_ptrs())

    def stats(self) -> dict[str, int]:
        return dict(self._core.stats())

    def reset_stats(self) -> None:
        self._core.reset_stats()


class KVSlots:
    """In-place KV slot buffers [rows, Hkv, capacity, D] per past/present pair, allocated once,
    bound as contiguous sub-buffers of a row range (nothing is copied when rows join/leave).

    For a decode scheduler: each active request owns a row; a step runs the LM over a range of
    rows at once. GroupQueryAttention graphs get `seqlens_k` / `total_sequence_length` from
    `lengths`; an `attention_mask` (right-padded: row i marks lengths[i] + new tokens) and
    `position_ids` are the caller's, the mask checked against `lengths`. A step adding several
    tokens over several rows needs every row empty (a batched first prefill). One instance is
    not for concurrent steps from several threads."""

    def __init__(
        self,
        session: Session,
        rows: int,
        capacity: int,
        pairs: Mapping[str, str] | None = None,
    ) -> None:
        self.session = session
        names = _pair_names(session, pairs)
        _require_in_place(session, names)
        try:
            self._core = _core.KVSlots(session.core, int(rows), int(capacity), names)
        except _core.RunError as error:
            raise SessionError(str(error)) from None

    @property
    def rows(self) -> int:
        return self._core.rows

    @property
    def capacity(self) -> int:
        return self._core.capacity

    @property
    def pairs(self) -> list[tuple[str, str]]:
        return list(self._core.pairs)

    def row_stride(self, index: int) -> int:
        """Bytes from one row to the next in KV tensor `index`'s buffer."""
        return self._core.row_stride(index)

    def twin(self) -> KVSlots:
        """A second binding over these buffers (made once, kept with them): it steps one row
        range while this one steps another, disjoint range on another thread."""
        twin = self.__dict__.get("_twin")
        if twin is None:
            twin = object.__new__(KVSlots)
            twin.session, twin._core = self.session, self._core.twin()
            self._twin = twin
        return twin

    def step(
        self,
        feeds: Mapping[str, np.ndarray],
        first_row: int,
        lengths: np.ndarray,
        output_names: Sequence[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """Run the LM over rows [first_row, first_row + len(lengths)); row i holds lengths[i]
        cached tokens; the feeds' batch dim is len(lengths) and their seq dim the new tokens.
        For GroupQueryAttention graphs with seqlens_k/total_sequence_length inputs the core
        fills seqlens_k[i] = lengths[i] + new - 1 and total_sequence_length = max(lengths) +
        new; graphs that take an attention_mask instead get the caller's mask."""
        lengths = np.asarray(lengths)
        if lengths.dtype != np.int64 or lengths.ndim != 1:
            raise SessionError(
                f"lengths must be a 1-D int64 array (one cached length per row), got "
                f"{lengths.dtype} with shape {lengths.shape}"
            )
        try:
            return self._core.step(
                dict(feeds),
                int(first_row),
                lengths,
                None if output_names is None else list(output_names),
            )
        except _core.RunError as error:
            raise SessionError(str(error)) from None

    def past_data_ptrs(self, first_row: int, count: int) -> list[int]:
        return list(self._call(self._core.past_data_ptrs, first_row, count))

    def present_data_ptrs(self, first_row: int, count: int) -> list[int]:
        """Where ONNX Runtime wrote the presents of these rows in the last step."""
        return list(self._call(self._core.present_data_ptrs, first_row, count))

    def read(self, index: int, row: int, length: int) -> np.ndarray:
        """Copy of row `row`'s first `length` tokens of KV tensor `index`, [1, H, length, D]."""
        return self._call(self._core.read, index, row, length)

    def load_prefix(self, row: int, values: Sequence[np.ndarray]) -> None:
        """Write `values` (one array per pair, [1, H, L, D], as `read` returns them) as row
        `row`'s first L tokens; a step with that row's length L continues after them."""
        try:
            self._core.load_prefix(int(row), list(values))
        except _core.RunError as error:
            raise SessionError(str(error)) from None

    def stats(self) -> dict[str, int]:
        return dict(self._core.stats())

    @staticmethod
    def _call(method: Any, *args: int) -> Any:
        try:
            return method(*(int(a) for a in args))
        except _core.RunError as error:
            raise SessionError(str(error)) from None


class StateChain:
    """A graph's fixed-size recurrent state, fed back from run to run by the core: each state
    output becomes the next step's state input ("chain": the value itself, no copy; "copy":
    fetched to host memory and fed back, the published scripts' way). `pairs` are (state
    input, state output) names, `initial` one array per pair (what `reset()` returns to).

    For streaming decoders whose state is named by a metadata file rather than by a naming
    pattern, e.g. a streaming codec's step graph (offsets, sliding attention caches)."""

    def __init__(
        self,
        session: Session,
        pairs: Sequence[tuple[str, str]],
        initial: Sequence[np.ndarray],
        mode: str = "chain",
    ) -> None:
        self.session = session
        try:
            self._core = _core.StateChain(
                session.core,
                mode,
                [(str(i), str(o)) for i, o in pairs],
                [np.ascontiguousarray(a) for a in initial],
            )
        except _core.RunError as error:
            raise SessionError(str(error)) from None

    @property
    def mode(self) -> str:
        return self._core.mode

    @property
    def steps(self) -> int:
        """Steps run since construction or the last reset()."""
        return self._core.steps

    @property
    def pairs(self) -> list[tuple[str, str]]:
        return list(self._core.pairs)

    def reset(self) -> None:
        self._core.reset()

    def step(
        self, feeds: Mapping[str, Any], output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Run over the non-state `feeds` and the current state; returns the non-state outputs
        (all unless named)."""
        try:
            names = None if output_names is None else list(output_names)
            return self._core.step(dict(feeds), names)
        except _core.RunError as error:
            raise SessionError(str(error)) from None

    def state_data_ptrs(self) -> list[int]:
        return list(self._core.state_data_ptrs())

    def output_data_ptrs(self) -> list[int]:
        """Where the last step wrote each state output."""
        return list(self._core.output_data_ptrs())


def _require_in_place(session: Session, pairs: Sequence[tuple[str, str]]) -> None:
    """Refuse graphs that grow their cache by Concat: their present is longer than their past,
    so one buffer cannot be both. Decided from the graph's I/O, and from its operators when the
    I/O alone cannot tell (an attention_mask LM may or may not use GroupQueryAttention)."""
    try:
        layout = kv_layout(session.spec)
    except ModelError:
        return  # custom pair names: the core checks the pairs themselves
    if layout.attention == "gqa":
        return
    if "attention_mask" in session.spec.inputs and read_graph_spec(session.path).uses(GQA_OP):
        return
    raise SessionError(
        f"{session.path.name} grows its KV cache by Concat (no GroupQueryAttention), so it cannot "
        "keep KV in place; decode it with KVCache(mode='chain') or convert it with "
        "`onnx-tts convert --inplace-kv`"
    )

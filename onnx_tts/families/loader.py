"""The one loader every family's graphs go through: sessions with each stage's options, the KV
mode decided once from the LM's graph I/O, and the KV pool.

A family declares its graphs (`GraphSet`: files by role, the stage each runs in, which load on
first use, which is the step LM and how many positions a request may cache); `load_graphs`
builds the rest the same way for every family, float or quantized graphs alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from onnx_tts.decoding import CapacityPolicy, KVPool, resolve_kv_mode
from onnx_tts.graph_io import GraphSpec, KVLayout, kv_layout
from onnx_tts.session import LazySession, Session, SessionOptions, describe_graphs

Stage = Literal["decode", "vocoder", "encoder"]


@dataclass(frozen=True)
class LoadSettings:
    """Settings every family takes from `onnx_tts.load()`. `stage_threads` (when set) gives
    each stage's sessions their intra-op threads, so the stages that run at once do not
    oversubscribe the cores: `options_for(stage)`."""

    kv: str | None = None
    session_options: SessionOptions = field(default_factory=SessionOptions)
    stage_threads: Mapping[str, int] | None = None

    def options_for(self, stage: Stage) -> SessionOptions:
        """The session options of a graph of `stage` (decode: the LM and what each step
        runs; vocoder; encoder: reference voices)."""
        if self.stage_threads is None or stage not in self.stage_threads:
            return self.session_options
        return replace(self.session_options, intra_op_threads=self.stage_threads[stage])


@dataclass(frozen=True)
class Graph:
    """One graph of a family: its file, the stage it runs in, whether it loads on first use
    (then its declared I/O `spec`, read by detection, is needed) and, when the family knows
    better than the stage's share of the cores, options of its own."""

    path: Path
    stage: Stage = "decode"
    lazy: bool = False
    spec: GraphSpec | None = None
    options: SessionOptions | None = None


@dataclass(frozen=True)
class GraphSet:
    """What a family declares about its graphs: by role, the step LM's role (its KV layout
    decides the KV mode), how many positions one request's cache may hold, the model's
    preferred KV mode (used when the LM can run it), and the LM's KV layout when the family
    inspected more than its declared I/O shows (e.g. attention inside the graph). A model with
    no step LM (`lm` None: one graph call per chunk) has no KV layout, mode or pool."""

    graphs: Mapping[str, Graph]
    lm: str | None
    capacity: CapacityPolicy | None = None
    default_kv: str | None = None
    kv: KVLayout | None = None


@dataclass
class LoadedGraphs:
    """A family's sessions by role, its LM's KV layout, the KV mode and the KV pool (none of
    the four for a model without a step LM; its KV mode is then "none")."""

    sessions: dict[str, Session | LazySession]
    lm: Session | None
    kv: KVLayout | None
    kv_mode: str
    pool: KVPool | None
    specs: dict[str, GraphSpec] = field(default_factory=dict)

    def __getitem__(self, role: str) -> Session:
        """The session of `role` (created now if it loads on first use)."""
        session = self.sessions[role]
        return session.get() if isinstance(session, LazySession) else session

    def __contains__(self, role: object) -> bool:
        return role in self.sessions

    def session(self, role: str) -> Session | LazySession:
        """The session of `role` as it is (a LazySession is not loaded by asking)."""
        return self.sessions[role]

    def loaded(self, role: str) -> bool:
        session = self.sessions[role]
        return not isinstance(session, LazySession) or session.loaded

    def describe(self) -> dict[str, dict[str, Any]]:
        return describe_graphs(self.sessions)


def load_graphs(declared: GraphSet, settings: LoadSettings) -> LoadedGraphs:
    """Sessions for `declared` (lazy ones made on first use), the KV mode (the request, else
    the model's default when its LM can run it, else in place when the LM writes its cache in
    place and chain otherwise: `resolve_kv_mode`), and the LM's KV pool."""
    sessions: dict[str, Session | LazySession] = {}
    for role, graph in declared.graphs.items():
        options = graph.options or settings.options_for(graph.stage)
        if graph.lazy and graph.spec is not None and role != declared.lm:
            sessions[role] = LazySession(graph.spec, options)
        else:
            sessions[role] = Session(graph.path, options)
    specs = {role: session.spec for role, session in sessions.items()}
    if declared.lm is None:
        return LoadedGraphs(sessions, None, None, "none", None, specs)
    lm = sessions[declared.lm]
    assert isinstance(lm, Session)
    layout = declared.kv or kv_layout(lm.spec)
    default = declared.default_kv
    if default == "inplace" and not layout.in_place:
        default = None  # a default for the model's other LM graph (e.g. a GQA twin)
    mode = resolve_kv_mode(settings.kv, layout, default)
    assert declared.capacity is not None, "a step LM needs a capacity policy"
    pool = KVPool(lm, layout, mode, declared.capacity)
    return LoadedGraphs(sessions, lm, layout, mode, pool, specs)


__all__ = ["Graph", "GraphSet", "LoadSettings", "LoadedGraphs", "Stage", "load_graphs"]

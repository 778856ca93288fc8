"""Streams of a streaming decoder whose recurrent state the core chains from step to step
(`StateChain`): a pool of such states for one step graph, and the stream object a caller
pushes frames into. Each stream has a state of its own; a closed stream's state is reset and
kept for the next one (at most a few), so opening a stream allocates nothing in steady use."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np

from onnx_tts.errors import InputError
from onnx_tts.session import LazySession, Session, StateChain

KEPT_IDLE = 4


class StatePool:
    """The states of `step`'s streams: `pairs` (state input, state output) names, `initial`
    one array per pair (a fresh stream's value), `mode` "chain" (outputs fed back in place)
    or "copy"."""

    def __init__(
        self,
        step: Session | LazySession,
        pairs: Sequence[tuple[str, str]],
        initial: Sequence[np.ndarray],
        mode: str,
    ) -> None:
        self.step, self.pairs, self.initial, self.mode = step, list(pairs), list(initial), mode
        self._idle: list[StateChain] = []
        self._lock = threading.Lock()  # streams open and close on several threads

    def take(self) -> StateChain:
        with self._lock:
            chain = self._idle.pop() if self._idle else None
        if chain is None:
            session = self.step.get() if isinstance(self.step, LazySession) else self.step
            chain = StateChain(session, self.pairs, self.initial, self.mode)
        chain.reset()
        return chain

    def give_back(self, chain: StateChain) -> None:
        chain.reset()
        with self._lock:
            if len(self._idle) < KEPT_IDLE:
                self._idle.append(chain)


class ChainedStream:
    """One stream: `push(frames)` runs `step(chain, frames)` on this stream's state and returns
    its audio; `close()` (or leaving the `with` block) gives the state back to the pool."""

    def __init__(
        self, pool: StatePool, step: Callable[[StateChain, np.ndarray], np.ndarray]
    ) -> None:
        self.pool, self._step = pool, step
        self.chain: StateChain | None = pool.take()

    def push(self, frames: np.ndarray) -> np.ndarray:
        if self.chain is None:
            raise InputError("this stream is closed; open a new one")
        return self._step(self.chain, frames)

    def close(self) -> None:
        if self.chain is not None:
            self.pool.give_back(self.chain)
            self.chain = None

    def __enter__(self) -> ChainedStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["ChainedStream", "StatePool"]

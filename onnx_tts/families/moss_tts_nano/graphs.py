"""Sessions of the MOSS-TTS-Nano graphs: the global transformer's two graphs load with the
model; the local paths and the codec's graphs load on first use, since most requests need one
local path of three and cloning is the only user of the encoder (memory and load time of the
others are then never spent). Every file was checked by the layout before, so what is left to
fail at first use is ONNX Runtime itself, which names the graph."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from onnx_tts.graph_io import GraphSpec
from onnx_tts.session import Session, SessionOptions


class LazySession:
    """A graph whose session is created the first time it runs."""

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


def describe_specs(specs: Mapping[str, GraphSpec]) -> dict[str, dict[str, Any]]:
    """File and declared I/O of each graph by role (as `onnx-tts info` lists them)."""
    return {
        role: {
            "file": spec.path.name,
            "inputs": [t.describe() for t in spec.inputs.values()],
            "outputs": [t.describe() for t in spec.outputs.values()],
        }
        for role, spec in specs.items()
    }


__all__ = ["LazySession", "describe_specs"]

"""`onnx-tts serve`: an OpenAI-compatible speech server (POST /v1/audio/speech and friends),
and `onnx-tts wyoming` (Home Assistant's Wyoming protocol)."""

from __future__ import annotations

from typing import Any

from onnx_tts.config import ServerConfig

__all__ = ["ServerConfig", "create_app"]


def __getattr__(name: str) -> Any:
    # Lazy: the CLI imports onnx_tts.server.cli to build its parser; FastAPI and the engine
    # load only when a server runs.
    if name == "create_app":
        from onnx_tts.server.app import create_app

        return create_app
    raise AttributeError(name)

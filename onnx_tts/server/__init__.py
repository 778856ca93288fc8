"""`onnx-tts serve`: an OpenAI-compatible speech server (POST /v1/audio/speech and friends)."""

from onnx_tts.config import ServerConfig
from onnx_tts.server.app import create_app

__all__ = ["ServerConfig", "create_app"]

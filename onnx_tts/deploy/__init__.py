"""Running onnx-tts past one process: Ray Serve replicas (onnx_tts.deploy.ray)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from onnx_tts.server.settings import ServeSettings


def serve_on_ray(settings: ServeSettings) -> int:
    """`onnx-tts serve --ray`: exit 2 with one line when Ray Serve is not installed."""
    if settings.ray.ray_address is None:
        use_loopback_only()
    try:
        from onnx_tts.deploy.ray import serve_on_ray as run
    except ImportError as error:
        print(
            f"onnx-tts serve: --ray needs Ray Serve ({error.name or error} is missing): "
            "pip install 'onnx-tts[ray]'",
            file=sys.stderr,
        )
        return 2
    return run(settings)


def use_loopback_only() -> None:
    """Make the Ray started by this process a one-machine cluster on 127.0.0.1.

    Ray turns 127.0.0.1 into the machine's outward address unless clusters are off (its
    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER switch, read when ray is first imported); a cluster that
    lives and dies with this command has no other nodes, so nothing leaves loopback.
    """
    if "ray" not in sys.modules:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

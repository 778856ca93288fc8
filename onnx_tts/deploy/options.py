"""How the Ray Serve settings (`onnx_tts.config.RayConfig`) become a Serve deployment: the
checks that span several settings, a replica's compute slots, Serve's deployment options.

Light on purpose: the CLI imports this to check `serve`'s flags, and Ray is imported only when
the server starts (onnx_tts.deploy.ray).
"""

from __future__ import annotations

from typing import Any

from onnx_tts.config import RayConfig


def autoscaling(config: RayConfig) -> bool:
    return config.min_replicas is not None or config.max_replicas is not None


def deployment_options(
    config: RayConfig, max_streams: int, max_queue: int, drain_seconds: float
) -> dict[str, Any]:
    """Keywords of `Deployment.options` (Serve's names and units)."""
    options: dict[str, Any] = {
        "ray_actor_options": {"num_cpus": config.replica_cpus},
        # A replica takes what its own admission can hold; past that it answers 429 itself.
        "max_ongoing_requests": max_streams + max_queue,
        "health_check_period_s": 5.0,
        "health_check_timeout_s": 30.0,
        "graceful_shutdown_timeout_s": max(1.0, drain_seconds),
    }
    if autoscaling(config):
        options["autoscaling_config"] = {
            "min_replicas": config.min_replicas,
            "max_replicas": config.max_replicas,
            "target_ongoing_requests": config.target_ongoing_requests,
        }
    else:
        options["num_replicas"] = config.replicas
    return options


__all__ = ["autoscaling", "deployment_options"]

"""The Ray Serve options of `onnx-tts serve --ray` (flags, checks, Serve deployment options).

Light on purpose: the CLI imports this to build its parser, and Ray is imported only when the
server starts (onnx_tts.deploy.ray).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any

PROXY_LOCATIONS = ("HeadOnly", "EveryNode")
MAX_REPLICAS = 1024


def add_ray_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "Ray Serve (--ray)", "replicas of the same server on a Ray cluster, behind Serve's proxy"
    )
    group.add_argument(
        "--ray",
        action="store_true",
        help="serve on Ray Serve: each replica a batched engine, the same routes (pip install "
        "'onnx-tts[ray]')",
    )
    group.add_argument(
        "--ray-address",
        help="the Ray cluster to deploy to (e.g. 'auto' or 127.0.0.1:6379; default: start "
        "a local one that stops with this command)",
    )
    group.add_argument(
        "--replicas", type=int, default=1, help="replicas when not autoscaling (default: 1)"
    )
    group.add_argument(
        "--min-replicas", type=int, help="autoscale from this many replicas (with --max-replicas)"
    )
    group.add_argument("--max-replicas", type=int, help="autoscale up to this many replicas")
    group.add_argument(
        "--target-ongoing-requests",
        type=float,
        default=4.0,
        help="autoscaling target: requests in flight per replica (default: 4)",
    )
    group.add_argument(
        "--replica-cpus",
        type=float,
        default=1.0,
        help="CPUs Ray reserves for each replica; also caps its --compute-slots (default: 1)",
    )
    group.add_argument(
        "--proxy-location",
        choices=PROXY_LOCATIONS,
        default="HeadOnly",
        help="where Serve runs HTTP proxies: the head node, or every node with a replica "
        "(nodes that share an IP, as on one machine, need HeadOnly; default: HeadOnly)",
    )


@dataclass(frozen=True)
class ReplicaOptions:
    """How many replicas, how they scale, what each reserves."""

    replicas: int = 1
    min_replicas: int | None = None
    max_replicas: int | None = None
    target_ongoing_requests: float = 4.0
    replica_cpus: float = 1.0
    proxy_location: str = "HeadOnly"

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ReplicaOptions:
        return cls(
            replicas=args.replicas,
            min_replicas=args.min_replicas,
            max_replicas=args.max_replicas,
            target_ongoing_requests=args.target_ongoing_requests,
            replica_cpus=args.replica_cpus,
            proxy_location=args.proxy_location,
        )

    @property
    def autoscaling(self) -> bool:
        return self.min_replicas is not None or self.max_replicas is not None

    def problem(self) -> str | None:
        """One line naming the first bad option, or None."""
        low, high = self.min_replicas, self.max_replicas
        checks = [
            (1 <= self.replicas <= MAX_REPLICAS, f"--replicas must be 1-{MAX_REPLICAS}"),
            (
                (low is None) == (high is None),
                "--min-replicas and --max-replicas go together (autoscaling bounds)",
            ),
            (
                low is None or high is None or 0 <= low <= high <= MAX_REPLICAS,
                f"autoscaling needs 0 <= --min-replicas <= --max-replicas <= {MAX_REPLICAS}",
            ),
            (high is None or high >= 1, "--max-replicas must be at least 1"),
            (
                0 < self.target_ongoing_requests <= 10_000,
                "--target-ongoing-requests must be > 0 and <= 10000",
            ),
            (0 < self.replica_cpus <= 1024, "--replica-cpus must be > 0 and <= 1024"),
            (self.proxy_location in PROXY_LOCATIONS, "--proxy-location: HeadOnly or EveryNode"),
        ]
        return next((message for ok, message in checks if not ok), None)

    def compute_slots(self, requested: int) -> int:
        """A replica's engine calls at once: the server's setting, at most its CPUs."""
        return max(1, min(requested, math.ceil(self.replica_cpus)))

    def deployment_options(
        self, workers: int, max_queue: int, drain_seconds: float
    ) -> dict[str, Any]:
        """Keywords of `Deployment.options` (Serve's names and units)."""
        options: dict[str, Any] = {
            "ray_actor_options": {"num_cpus": self.replica_cpus},
            # A replica takes what its own dispatcher admits; past that it answers 429 itself.
            "max_ongoing_requests": workers + max_queue,
            "health_check_period_s": 5.0,
            "health_check_timeout_s": 30.0,
            "graceful_shutdown_timeout_s": max(1.0, drain_seconds),
        }
        if self.autoscaling:
            options["autoscaling_config"] = {
                "min_replicas": self.min_replicas,
                "max_replicas": self.max_replicas,
                "target_ongoing_requests": self.target_ongoing_requests,
            }
        else:
            options["num_replicas"] = self.replicas
        return options

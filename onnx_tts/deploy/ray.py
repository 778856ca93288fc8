"""onnx-tts on Ray Serve: the same server, as replicas Serve places, scales and restarts.

Each replica is one `onnx_tts.server.app.create_app` (the same routes, voices API, web page and
metrics as `onnx-tts serve`) over its own batched engine, behind Serve's HTTP proxy; with a
Redis URL the replicas share the reference and result caches and the uploaded voices.

Three ways in, one configuration (the `onnx-tts serve` flags):

* ``onnx-tts serve --ray [--replicas N | --min-replicas A --max-replicas B] [--redis URL]``
* ``serve run onnx_tts.deploy.ray:app`` (defaults) or
  ``serve run onnx_tts.deploy.ray:build_app replicas=2 redis=redis://...``
* a Serve config file (deploy/serve_config.yaml, or KubeRay's RayService) naming
  ``import_path: onnx_tts.deploy.ray:build_app`` with ``args`` keyed by the flag names.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping
from typing import Any, NoReturn

from ray import serve
from ray.serve import Application
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from onnx_tts.deploy.options import autoscaling, deployment_options
from onnx_tts.errors import InputError
from onnx_tts.server.app import create_app
from onnx_tts.server.engines import ModelRegistry
from onnx_tts.server.errors import one_line
from onnx_tts.server.settings import ServeSettings, add_arguments, serve_settings

log = logging.getLogger("onnx_tts.deploy")

APP_NAME = "onnx-tts"
DEPLOYMENT_NAME = "OnnxTTS"
REPLICA_HEADER = "x-onnx-tts-replica"
PROXY_CALLBACK_VARIABLE = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
PROXY_CALLBACK = "onnx_tts.deploy.proxy:middlewares"
LOCAL_OBJECT_STORE_BYTES = 128 << 20  # replicas pass only requests and audio chunks
# Serve kills an HTTP proxy that is not ready within 5 s (or misses health checks of 10 s),
# and `serve.start` then fails: on cores that other work keeps busy that happened at start.
# Generous bounds for a cluster started here (a hung proxy is still found, later).
PROXY_CHECK_SECONDS = {
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "120",
    "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "120",
}


class ReplicaHeader:
    """Names the replica on every response, so a client or a test can tell replicas apart."""

    def __init__(self, app: ASGIApp, replica: str) -> None:
        self.app = app
        self.header = (REPLICA_HEADER.encode(), replica.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def named(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, named)


@serve.deployment(name=DEPLOYMENT_NAME)
@serve.ingress()
class OnnxTTSReplica:
    """One replica: the models loaded before Serve sends it a request, then the app."""

    def __init__(self, settings: ServeSettings) -> None:
        logging.getLogger("onnx_tts").setLevel(logging.INFO)
        self._config = settings.server
        server = settings.server
        self._registry = ModelRegistry(
            server.models or [None],
            settings.engine,
            settings.caches,
            settings.family,
            max_streams=server.max_streams,
            max_waiting=server.max_queue,
        )
        # Loading here (not in the app's background) keeps the replica out of the routing
        # table until it can answer; a model that cannot load fails the deployment.
        self._registry.load_all()
        self._name = serve.get_replica_context().replica_tag

    def __serve_build_asgi_app__(self) -> ASGIApp:
        return ReplicaHeader(create_app(self._config, self._registry), self._name)

    def check_health(self) -> None:
        """Serve's periodic probe: a replica whose models failed is replaced."""
        if self._registry.error is not None:
            raise RuntimeError(f"model failed: {one_line(self._registry.error)}")


def build(settings: ServeSettings) -> Application:
    """The Serve application: `settings` on every replica, placed and scaled by its Ray part."""
    server, ray = settings.server, settings.ray
    deployment = OnnxTTSReplica.options(
        **deployment_options(ray, server.max_streams, server.max_queue, server.drain_seconds)
    )
    return deployment.bind(settings)


class _ArgsError(ValueError):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _ArgsError(message)


def parse_app_args(args: Mapping[str, Any]) -> ServeSettings:
    """`serve` settings from a Serve config's ``args`` (``{"replicas": 2, "model": [DIR]}``);
    keys are the flag names with '-' or '_', a list repeats a flag, true sets a switch."""
    argv: list[str] = []
    for key, value in args.items():
        flag = "--" + str(key).replace("_", "-")
        values = value if isinstance(value, (list, tuple)) else [value]
        for item in values:
            if item is True:
                argv.append(flag)
            elif item is not None and item is not False:
                argv += [flag, str(item)]
    parsed = add_arguments(_Parser(prog="onnx_tts.deploy.ray", add_help=False)).parse_args(argv)
    try:
        return serve_settings(parsed)
    except InputError as error:
        raise _ArgsError(str(error)) from None


def build_app(args: Mapping[str, Any] | None = None) -> Application:
    """Serve's application builder (``import_path: onnx_tts.deploy.ray:build_app``)."""
    try:
        settings = parse_app_args(dict(args or {}))
    except _ArgsError as error:
        raise ValueError(f"onnx-tts Serve args: {error}") from None
    return build(settings)


def __getattr__(name: str) -> Any:
    # `serve run onnx_tts.deploy.ray:app`: the defaults, built only when asked for.
    if name == "app":
        return build_app()
    raise AttributeError(name)


# -- `onnx-tts serve --ray` ---------------------------------------------------------------------


def serve_on_ray(settings: ServeSettings) -> int:
    """Deploy on Ray Serve and stay up until SIGINT/SIGTERM (exit 2 for bad options/models)."""
    import ray

    options, server = settings.ray, settings.server
    if not settings.caches.redis_url and (autoscaling(options) or options.replicas > 1):
        log.warning(
            "several replicas without --redis: each keeps its own caches, and uploaded voices "
            "are shared only by replicas on one machine (same --voices-dir)"
        )
    local = options.ray_address is None
    # Every proxy of a cluster started here wraps requests in the failover middleware; a
    # cluster started elsewhere sets the variable on its own nodes (docs/DEPLOYMENT.md).
    os.environ.setdefault(PROXY_CALLBACK_VARIABLE, PROXY_CALLBACK)
    # One proxy spreads requests over all replicas instead of filling its own node's first.
    os.environ.setdefault("RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING", "0")
    for name, value in PROXY_CHECK_SECONDS.items():
        os.environ.setdefault(name, value)
    ray.init(
        address=options.ray_address,
        _node_ip_address=_loopback_node(options.ray_address),
        include_dashboard=False if local else None,
        object_store_memory=LOCAL_OBJECT_STORE_BYTES if local else None,
        logging_level=logging.WARNING,
        log_to_driver=server.log_level == "debug",
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        start = {
            "http_options": {"host": server.host, "port": server.port},
            "proxy_location": options.proxy_location,
        }
        try:
            serve.start(**start)
        except TimeoutError:
            # Ray waits a fixed 60 s for its HTTP proxies; on busy cores they take longer,
            # and go on starting: connect to the controller that was started, and go on.
            log.warning("Ray Serve's HTTP proxy is still starting (a busy machine)")
            serve.start(**start)
        try:
            serve.run(build(settings), name=APP_NAME, route_prefix="/")
        except RuntimeError as error:
            print(f"onnx-tts serve: the deployment failed: {_cause(error)}", file=sys.stderr)
            return 2
        scale = (
            f"{options.min_replicas}-{options.max_replicas} replicas (autoscaling)"
            if autoscaling(options)
            else f"{options.replicas} replica(s)"
        )
        print(f"onnx-tts on Ray Serve: http://{server.host}:{server.port} ({scale})", flush=True)
        stop.wait()
        return 0
    finally:
        # A cluster we started goes with us; on a shared one, only our application does.
        try:
            if local:
                serve.shutdown()
            else:
                serve.delete(APP_NAME)
        finally:
            ray.shutdown()


def _cause(error: BaseException) -> str:
    """The line of a deployment failure that names the cause, not Ray's traceback."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line and not line.startswith("File "):
            return line
    return lines[-1] if lines else type(error).__name__


def _loopback_node(address: str | None) -> str | None:
    """The node this driver joins when the cluster's address is on loopback (127.x.y.z, one
    machine): that node itself, since Ray would otherwise look for one at 127.0.0.1."""
    host = (address or "").rpartition(":")[0] or (address or "")
    try:
        return host if ipaddress.ip_address(host).is_loopback and host != "127.0.0.1" else None
    except ValueError:
        return None

"""onnx_tts.deploy without a cluster: Serve config and CLI options, the proxy's replica
failover, and uploaded voices in a real Redis (tests/test_ray_serve.py runs the live thing)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from onnx_tts.deploy.proxy import ATTEMPTS, ReplicaFailover
from onnx_tts.server.voice_names import resolve_voice
from onnx_tts.server.voices import VoiceExists, VoiceStoreError
from tests.redis_server import redis_server

REPO = Path(__file__).resolve().parents[1]


# -- configuration ------------------------------------------------------------------------------


def test_serve_args_are_the_serve_flags() -> None:
    from onnx_tts.deploy.ray import build_app, parse_app_args

    parsed = parse_app_args(
        {"replicas": 3, "model": ["a", "b"], "max_batch": 4, "redis": "redis://h:1/0"}
    )
    assert (parsed.ray.replicas, parsed.server.models, parsed.engine.max_batch) == (
        3,
        ["a", "b"],
        4,
    )
    assert parsed.caches.redis_url == "redis://h:1/0"
    deployment = build_app({"replicas": 3, "replica-cpus": 2, "max-streams": 8, "max-queue": 4})
    bound = deployment._bound_deployment
    assert bound.num_replicas == 3
    assert bound.ray_actor_options["num_cpus"] == 2
    assert bound.max_ongoing_requests == 12  # what the replica's own admission holds
    settings = bound.init_args[0]
    assert settings.server.max_streams == 8
    scaled = build_app({"min-replicas": 1, "max-replicas": 5, "target-ongoing-requests": 2})
    autoscaling = scaled._bound_deployment._deployment_config.autoscaling_config
    assert (autoscaling.min_replicas, autoscaling.max_replicas) == (1, 5)
    assert autoscaling.target_ongoing_requests == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"replicas": 0}, "--replicas must be"),
        ({"min-replicas": 1}, "go together"),
        ({"min-replicas": 3, "max-replicas": 2}, "must not exceed --max-replicas"),
        ({"replica-cpus": 0}, "--replica-cpus"),
        ({"max-streams": 0}, "--max-streams must be"),
        ({"no-such-flag": 1}, "unrecognized arguments: --no-such-flag"),
    ],
)
def test_bad_serve_args_are_one_line(args: dict[str, Any], message: str) -> None:
    from onnx_tts.deploy.ray import build_app

    with pytest.raises(ValueError, match=message) as caught:
        build_app(args)
    assert "\n" not in str(caught.value)


def test_cli_refuses_bad_replica_options_with_exit_2() -> None:
    command = [sys.executable, "-m", "onnx_tts.server", "--ray", "--min-replicas", "2"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "onnx-tts serve: --min-replicas and --max-replicas go together (autoscaling bounds)"
    ]


def _serve_configs() -> Iterator[tuple[str, dict[str, Any]]]:
    yield "serve_config.yaml", yaml.safe_load((REPO / "deploy" / "serve_config.yaml").read_text())
    service = yaml.safe_load((REPO / "deploy" / "rayservice.yaml").read_text())
    yield "rayservice.yaml", yaml.safe_load(service["spec"]["serveConfigV2"])


@pytest.mark.parametrize("name", ["serve_config.yaml", "rayservice.yaml"])
def test_example_serve_configs_are_valid(name: str) -> None:
    """Each example validates against Ray's own schema, and its app builds from its args."""
    from ray.serve.schema import ServeDeploySchema

    from onnx_tts.deploy.ray import DEPLOYMENT_NAME, build_app

    config = dict(_serve_configs())[name]
    schema = ServeDeploySchema.model_validate(config)
    (app,) = schema.applications
    assert app.import_path == "onnx_tts.deploy.ray:build_app"
    assert [d.name for d in app.deployments] == [DEPLOYMENT_NAME]
    built = build_app(app.args)
    assert built._bound_deployment.name == DEPLOYMENT_NAME


def test_rayservice_manifest_structure() -> None:
    service = yaml.safe_load((REPO / "deploy" / "rayservice.yaml").read_text())
    assert (service["apiVersion"], service["kind"]) == ("ray.io/v1", "RayService")
    cluster = service["spec"]["rayClusterConfig"]
    import ray

    assert cluster["rayVersion"] == ray.__version__
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for group in groups:
        (container,) = group["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"] == (
            "onnx_tts.deploy.proxy:middlewares"
        )
    for worker in cluster["workerGroupSpecs"]:
        assert worker["minReplicas"] <= worker["replicas"] <= worker["maxReplicas"]


# -- failover at the proxy -----------------------------------------------------------------------


class _FakeProxy:
    """Serve's proxy as the middleware sees it: each attempt plays one scripted outcome."""

    def __init__(self, *outcomes: str) -> None:
        self.outcomes = list(outcomes)
        self.bodies: list[bytes] = []

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.bodies.append(body)
        outcome = self.outcomes.pop(0)
        if outcome == "dies":  # the replica died before answering: the proxy sends nothing
            return
        if outcome == "proxy-503":
            headers = [(b"content-type", b"text/plain; charset=utf-8")]
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": b"Deployment unavailable."})
            return
        kind = b"text/event-stream" if outcome.startswith("sse") else b"audio/pcm"
        headers = [(b"content-type", kind), (b"x-request-id", b"app"), (b"x-request-id", b"ray")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        if outcome.endswith("ok"):
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        # "...-cut": the replica died mid-stream


def _run(app: Any, method: str = "POST", path: str = "/v1/audio/speech") -> list[dict]:
    sent: list[dict] = []
    parts = [
        {"type": "http.request", "body": b'{"input":', "more_body": True},
        {"type": "http.request", "body": b'"hi"}', "more_body": False},
    ]

    async def receive() -> dict:
        if parts:
            return parts.pop(0)
        await asyncio.sleep(3600)  # the client stays connected
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "headers": []}
    middleware = ReplicaFailover(app)
    import onnx_tts.deploy.proxy as proxy

    saved, proxy.BACKOFF_SECONDS = proxy.BACKOFF_SECONDS, (0.0,)
    try:
        asyncio.run(middleware(scope, receive, send))
    finally:
        proxy.BACKOFF_SECONDS = saved
    return sent


def test_a_request_whose_replica_died_before_answering_is_retried_with_its_body() -> None:
    proxy = _FakeProxy("dies", "audio-ok")
    sent = _run(proxy)
    assert proxy.bodies == [b'{"input":"hi"}'] * 2
    assert sent[0]["status"] == 200
    assert [v for k, v in sent[0]["headers"] if k == b"x-request-id"] == [b"app"]
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}


def test_when_every_attempt_fails_the_client_gets_503_in_openai_envelope() -> None:
    proxy = _FakeProxy(*["dies"] * ATTEMPTS)
    sent = _run(proxy)
    assert len(proxy.bodies) == ATTEMPTS
    assert sent[0]["status"] == 503
    assert (b"retry-after", b"1") in sent[0]["headers"]
    error = json.loads(sent[1]["body"])["error"]
    assert (error["type"], error["code"]) == ("server_error", "replica_unavailable")


def test_a_proxy_made_error_becomes_the_envelope() -> None:
    sent = _run(_FakeProxy(*["proxy-503"] * ATTEMPTS))
    assert sent[0]["status"] == 503
    assert json.loads(sent[1]["body"])["error"]["code"] == "replica_unavailable"


def test_a_delete_is_not_sent_twice() -> None:
    proxy = _FakeProxy("dies", "audio-ok")
    sent = _run(proxy, method="DELETE", path="/v1/audio/voices/voice_x")
    assert len(proxy.bodies) == 1 and sent[0]["status"] == 503


def test_a_cut_event_stream_ends_with_an_error_event() -> None:
    sent = _run(_FakeProxy("sse-cut"))
    assert sent[0]["status"] == 200
    last = sent[-1]
    assert last["more_body"] is False
    event = json.loads(last["body"].decode().removeprefix("data: "))
    assert event["type"] == "error" and event["error"]["code"] == "replica_failed"


def test_a_cut_audio_stream_is_left_unterminated() -> None:
    sent = _run(_FakeProxy("audio-cut"))
    assert sent[0]["status"] == 200
    assert all(m.get("more_body") for m in sent[1:])  # the client sees a broken transfer


# -- uploaded voices in Redis -------------------------------------------------------------------


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with redis_server(tmp_path_factory.mktemp("redis")) as url:
        yield url


def _clip(seed: int) -> np.ndarray:
    from tests.conftest import speechlike

    return speechlike(1.0, 16000, seed=seed)


def test_redis_voices_are_shared_between_stores(redis_url: str) -> None:
    from onnx_tts.server.redis_voices import RedisVoiceStore

    first = RedisVoiceStore(redis_url, namespace="t1")
    second = RedisVoiceStore(redis_url, namespace="t1")
    voice, created = first.add("alice", _clip(1), 16000)
    assert created
    assert second.get(voice.id) == voice
    assert resolve_voice("alice", [], second.list()).stored == voice
    assert [v.id for v in second.list()] == [voice.id]
    np.testing.assert_array_equal(second.audio(voice, 16000), _clip(1))
    assert len(second.audio(voice, 24000)) == 24000  # resampled on request
    assert first.add("alice", _clip(1), 16000) == (voice, False)  # same clip and name
    with pytest.raises(VoiceExists, match="alice"):  # the same clip under another name
        second.add("bob", _clip(1), 16000)
    assert second.delete(voice.id) and not first.delete(voice.id)
    assert first.get(voice.id) is None and first.list() == []


@pytest.mark.parametrize("store_kind", ["disk", "redis"])
def test_another_clip_under_a_taken_name_is_refused(
    store_kind: str, redis_url: str, tmp_path: Path
) -> None:
    """A second voice of the same name made the name resolve to nothing (find() needs one
    match): the upload is refused, and the name keeps addressing the first voice."""
    from onnx_tts.server.redis_voices import RedisVoiceStore
    from onnx_tts.server.voices import VoiceNameTaken, VoiceStore

    store = (
        VoiceStore(tmp_path / "voices")
        if store_kind == "disk"
        else RedisVoiceStore(redis_url, namespace="t-name")
    )
    first, _ = store.add("carol", _clip(6), 16000)
    with pytest.raises(VoiceNameTaken, match=f"'carol' is already the voice {first.id}"):
        store.add("carol", _clip(7), 16000)
    assert [v.id for v in store.list()] == [first.id]
    assert resolve_voice("carol", [], store.list()).stored == first


def test_damaged_redis_voices_are_never_used(redis_url: str) -> None:
    import redis

    from onnx_tts.server.redis_voices import RedisVoiceStore

    store = RedisVoiceStore(redis_url, namespace="t2")
    voice, _ = store.add("bob", _clip(2), 16000)
    client = redis.Redis.from_url(redis_url)
    client.setrange(f"t2:voices:audio:{voice.id}", 8, b"\x00\x00\xc0\x7f")  # a NaN inside
    with pytest.raises(VoiceStoreError) as caught:
        RedisVoiceStore(redis_url, namespace="t2").audio(voice, 16000)
    assert caught.value.status == 404 and caught.value.code == "voice_damaged"
    client.hset("t2:voices:meta", voice.id, b"{not json")
    assert store.get(voice.id) is None and store.list() == []


def test_redis_voice_limit_holds(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import onnx_tts.server.redis_voices as module
    import onnx_tts.server.voices as records

    monkeypatch.setattr(records, "MAX_VOICES", 2)  # the rule both stores apply
    store = module.RedisVoiceStore(redis_url, namespace="t3")
    store.add("a", _clip(3), 16000)
    store.add("b", _clip(4), 16000)
    with pytest.raises(OverflowError, match="at most 2 voices"):
        store.add("c", _clip(5), 16000)
    assert len(store.list()) == 2


def test_unreachable_redis_is_a_503_line() -> None:
    from benchmarks.live_server import free_port
    from onnx_tts.server.redis_voices import RedisVoiceStore

    store = RedisVoiceStore(f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(VoiceStoreError) as caught:
        store.list()
    assert caught.value.status == 503 and caught.value.code == "voice_store_unavailable"


def test_unreachable_redis_fails_only_requests_for_stored_voices() -> None:
    from types import SimpleNamespace

    from benchmarks.live_server import free_port
    from onnx_tts.server.redis_voices import RedisVoiceStore
    from onnx_tts.server.voices import voice_to_speak

    store = RedisVoiceStore(f"redis://127.0.0.1:{free_port()}/0")
    model = SimpleNamespace(name="m", builtin_voices=("Narrator",), voice_rate=16000)
    registry = SimpleNamespace(models={"m": model})
    assert voice_to_speak(store, registry, model, "default") is None
    assert voice_to_speak(store, registry, model, "Alloy") is None  # OpenAI's name
    assert voice_to_speak(store, registry, model, "narrator") == "Narrator"
    with pytest.raises(VoiceStoreError) as caught:
        voice_to_speak(store, registry, model, "my uploaded voice")
    assert caught.value.status == 503


def test_a_voice_store_removes_uploads_cut_short_by_a_killed_server(tmp_path: Path) -> None:
    """SIGKILL leaves an upload's temp file (no handler runs); the store, opened again,
    removes those of dead processes of this host, and keeps a running writer's and another
    host's (a shared directory)."""
    from onnx_tts.atomic_files import temp_prefix
    from onnx_tts.server.voices import VoiceStore

    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    killed.kill()
    killed.wait()
    mine = temp_prefix("voice_0.json")
    orphan = mine.replace(f"-{os.getpid()}.", f"-{killed.pid}.") + "k3x9q2ab.part"
    running = mine + "r8t2m1zz.part"
    elsewhere = ".voice_0.json.another-host-12.abc12345.part"
    for name in (orphan, running, elsewhere):
        (tmp_path / name).write_bytes(b"half an upload")
    VoiceStore(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([running, elsewhere])

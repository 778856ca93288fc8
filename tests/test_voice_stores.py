"""Issue 36: voice stores trust nothing they read back. A stored voice's audio replaced on disk
or in Redis (with or without its metadata updated to match) spoke under the old
content-addressed id, and a voice written straight into Redis without the cache secret was
listed and used. Now audio is checked against its id when loaded (refused, reported once,
counted, left out of the list), files are read only when they are regular files, and with
--cache-secret every voice is signed; live servers, httpx, a real redis-server."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis
import soundfile

from benchmarks.live_server import LiveServer
from onnx_tts.server.voices import Voice, voice_id, voice_meta
from tests.conftest import speechlike
from tests.redis_server import redis_server

RATE = 16000
SECRET = "a-voice-secret-of-32-characters!"
OTHER_SECRET = "someone-else-secret-32-chars-ok!"


def wav(samples: np.ndarray, rate: int = RATE) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format="WAV", subtype="FLOAT")
    return buffer.getvalue()


def upload(server: LiveServer, name: str, seed: int) -> dict:
    response = httpx.post(
        server.url + "/v1/audio/voices",
        files={"audio_sample": ("v.wav", wav(speechlike(2.0, RATE, seed=seed)), "audio/wav")},
        data={"name": name},
        timeout=60,
    )
    assert response.status_code == 201, response.text
    return response.json()


def speak(server: LiveServer, voice: str) -> httpx.Response:
    body = {"input": "Hello there.", "voice": voice, "response_format": "pcm", "seed": 1}
    return httpx.post(server.url + "/v1/audio/speech", json=body, timeout=120)


def listed_ids(server: LiveServer) -> set[str]:
    return {
        v["id"] for v in httpx.get(server.url + "/v1/audio/voices", timeout=30).json()["voices"]
    }


def rejected_total(server: LiveServer) -> float:
    for line in httpx.get(server.url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("onnx_tts_voices_rejected_total "):
            return float(line.split()[1])
    raise AssertionError("no onnx_tts_voices_rejected_total in /metrics")


def refused_lines(server: LiveServer, ident: str) -> list[str]:
    return [line for line in server.log().splitlines() if f"voice {ident} in " in line]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    live = LiveServer(tmp_path)
    yield live
    live.stop()
    assert "Traceback" not in live.log()


def voices_dir(server: LiveServer) -> Path:
    return server.log_path.parent / "voices"


@pytest.mark.parametrize("meta", ["kept", "updated"])
def test_audio_replaced_on_disk_never_speaks_under_the_old_id(
    server: LiveServer, meta: str
) -> None:
    voice = upload(server, "porch", seed=50)
    ident = voice["id"]
    rate = RATE if meta == "kept" else 24000
    (voices_dir(server) / f"{ident}.wav").write_bytes(wav(speechlike(2.0, rate, seed=51), rate))
    if meta == "updated":  # the record rewritten to describe the new audio
        record = json.loads((voices_dir(server) / f"{ident}.json").read_text())
        record["sample_rate"] = 24000
        (voices_dir(server) / f"{ident}.json").write_text(json.dumps(record))
    refused = speak(server, ident)
    assert refused.status_code == 404, refused.text
    error = refused.json()["error"]
    assert error["code"] == "voice_damaged" and error["param"] == "voice"
    assert "does not match its id" in error["message"]
    assert ident not in listed_ids(server)
    assert speak(server, "porch").json()["error"]["code"] == "voice_not_found"
    assert len(refused_lines(server, ident)) == 1  # reported once, then left out
    assert rejected_total(server) == 1
    # Uploading the clip again restores the voice under its id.
    assert upload(server, "porch", seed=50)["id"] == ident
    assert speak(server, ident).status_code == 200


@pytest.mark.parametrize("kind", ["fifo", "link_to_dev_zero", "sparse_6_gib", "missing"])
def test_a_voice_file_that_is_not_a_regular_file_is_refused_at_once(
    server: LiveServer, kind: str
) -> None:
    ident = upload(server, "shed", seed=52)["id"]
    audio = voices_dir(server) / f"{ident}.wav"
    audio.unlink()
    if kind == "fifo":
        os.mkfifo(audio)  # nothing ever writes: an open that waits would hang forever
    elif kind == "link_to_dev_zero":
        audio.symlink_to("/dev/zero")
    elif kind == "sparse_6_gib":
        with open(audio, "wb") as handle:
            handle.truncate(6 << 30)
    refused = speak(server, ident)
    assert refused.status_code == 404, refused.text
    error = refused.json()["error"]
    assert error["code"] == "voice_damaged" and error["param"] == "voice"
    assert {
        "fifo": "a FIFO",
        "link_to_dev_zero": "a symbolic link",
        "sparse_6_gib": "bytes long",
        "missing": "missing",
    }[kind] in error["message"]
    # The server still stops cleanly on SIGTERM (a FIFO read would have blocked it).
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(120) == 0


def test_with_a_cache_secret_unsigned_and_forged_voices_are_neither_listed_nor_used(
    tmp_path: Path,
) -> None:
    live = LiveServer(tmp_path, "--cache-secret", SECRET)
    try:
        signed = upload(live, "signed one", seed=53)
        record = json.loads((voices_dir(live) / f"{signed['id']}.json").read_text())
        assert len(bytes.fromhex(record["mac"])) == 32
        forged = []
        for seed, how in ((54, "unsigned"), (55, "other secret"), (56, "renamed")):
            samples = speechlike(2.0, RATE, seed=seed)
            voice = Voice(voice_id(samples, RATE), f"forged {seed}", 1, RATE)
            meta = voice_meta(voice, {"unsigned": None, "other secret": OTHER_SECRET.encode(),
                                      "renamed": SECRET.encode()}[how])  # fmt: skip
            if how == "renamed":  # a signed record whose name was edited afterwards
                meta["name"] = "edited"
            soundfile.write(str(voices_dir(live) / f"{voice.id}.wav"), samples, RATE,
                            subtype="FLOAT")  # fmt: skip
            (voices_dir(live) / f"{voice.id}.json").write_text(json.dumps(meta))
            forged.append(voice.id)
        ids = listed_ids(live)
        assert signed["id"] in ids and not ids & set(forged)
        for ident in forged:
            refused = speak(live, ident)
            assert refused.status_code == 404, refused.text
            assert refused.json()["error"]["code"] == "voice_not_found"
        assert speak(live, signed["id"]).status_code == 200
        assert rejected_total(live) == 3
    finally:
        live.stop()
    assert "Traceback" not in live.log()


def _redis_voice(client: redis.Redis, samples: np.ndarray, name: str, secret: bytes | None) -> str:
    """A voice written straight into Redis, as someone with access to it could."""
    data = np.ascontiguousarray(samples, "<f4").tobytes()
    voice = Voice(voice_id(samples, RATE), name, 1, RATE)
    meta = voice_meta(voice, secret, sha256=hashlib.sha256(data).hexdigest())
    client.hset("onnx-tts:voices:meta", voice.id, json.dumps(meta))
    client.set(f"onnx-tts:voices:audio:{voice.id}", data)
    return voice.id


def test_audio_replaced_in_redis_with_its_record_updated_never_speaks_under_the_old_id(
    tmp_path: Path,
) -> None:
    with redis_server(tmp_path / "redis") as url:
        client = redis.Redis.from_url(url)
        live = LiveServer(tmp_path / "a", "--redis", url, "--cache-dir", "none")
        try:
            ident = upload(live, "attic", seed=57)["id"]
            other = np.ascontiguousarray(speechlike(2.0, RATE, seed=58), "<f4").tobytes()
            client.set(f"onnx-tts:voices:audio:{ident}", other)
            record = json.loads(client.hget("onnx-tts:voices:meta", ident))
            record["sha256"] = hashlib.sha256(other).hexdigest()
            client.hset("onnx-tts:voices:meta", ident, json.dumps(record))
            refused = speak(live, ident)
            assert refused.status_code == 404, refused.text
            assert refused.json()["error"]["code"] == "voice_damaged"
            assert "does not match its id" in refused.json()["error"]["message"]
            assert ident not in listed_ids(live)
            assert rejected_total(live) == 1
        finally:
            live.stop()
            client.close()
    assert "Traceback" not in live.log()


def test_a_voice_written_into_redis_without_the_secret_is_neither_listed_nor_used(
    tmp_path: Path,
) -> None:
    with redis_server(tmp_path / "redis") as url:
        client = redis.Redis.from_url(url)
        shared = ("--redis", url, "--cache-dir", "none", "--cache-secret", SECRET)
        first = LiveServer(tmp_path / "a", *shared)
        second = None
        try:
            forged = _redis_voice(client, speechlike(2.0, RATE, seed=59), "sneaky", None)
            mis_signed = _redis_voice(
                client, speechlike(2.0, RATE, seed=60), "sneakier", OTHER_SECRET.encode()
            )
            genuine = upload(first, "genuine", seed=61)["id"]
            second = LiveServer(tmp_path / "b", *shared)
            for replica in (first, second):
                ids = listed_ids(replica)
                assert genuine in ids and forged not in ids and mis_signed not in ids
                for ident in (forged, mis_signed):
                    assert speak(replica, ident).json()["error"]["code"] == "voice_not_found"
                assert speak(replica, genuine).status_code == 200
            assert speak(first, "sneaky").status_code == 404
        finally:
            first.stop()
            if second is not None:
                second.stop()
            client.close()
    assert "Traceback" not in first.log()

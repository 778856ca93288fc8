"""`onnx-tts serve` against live server processes, with the official openai client and httpx."""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import av
import httpx
import numpy as np
import openai
import pytest
import soundfile

from benchmarks.live_server import LiveServer, free_port
from onnx_tts.decoding.request import PlaybackClock
from onnx_tts.pipeline.timestretch import TimeStretcher, stretch
from onnx_tts.server.encoding import StreamEncoder, wav_stream_header
from tests.conftest import speechlike
from tests.waiting import WAIT_BOUND_SECONDS, wait_until

RATE = 16000  # the bundled default voice
PCM_RATE = 24000  # OpenAI's pcm: what clients assume
TEXT = "The quick brown fox jumps over the lazy dog. Then it naps in the sun."
LONG_TEXT = " ".join(["This sentence keeps the worker busy for a while."] * 80)


# -- live servers -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = LiveServer(
        tmp_path_factory.mktemp("serve"),
        *("--max-upload-bytes", "400000"),
        # Sixteen clients at once wait for a stream slot however busy the machine is: a 429
        # after the default 5 s would make the tests depend on the machine's speed.
        *("--queue-timeout", "600"),
    )
    yield live
    live.stop()
    assert "Traceback" not in live.log()


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def decode(data: bytes) -> tuple[np.ndarray, int]:
    """Any response format -> float samples (ffmpeg via PyAV reads streams of unknown length)."""
    with av.open(io.BytesIO(data)) as container:
        frames = [f.to_ndarray().reshape(-1) for f in container.decode(audio=0)]
        rate = container.streams.audio[0].rate
    samples = np.concatenate(frames)
    if samples.dtype.kind == "i":
        samples = samples / 32768.0
    return samples.astype(np.float32), rate


def pcm(data: bytes) -> np.ndarray:
    return np.frombuffer(data, "<i2").astype(np.float32) / 32768.0


def speech(server: LiveServer, **body: object) -> httpx.Response:
    return httpx.post(server.url + "/v1/audio/speech", json=body, timeout=120)


def metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            head = line.split(" ")[0]
            if head == name or head.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.fixture(scope="module")
def reference_pcm(server: LiveServer) -> np.ndarray:
    """The default voice's samples at its own rate (pcm with sample_rate = the model's)."""
    response = speech(server, input=TEXT, response_format="pcm", sample_rate=RATE)
    assert response.status_code == 200
    assert response.headers["x-sample-rate"] == str(RATE)
    return pcm(response.content)


# -- OpenAI client --------------------------------------------------------------------------------


def test_models_and_health(server: LiveServer, client: openai.OpenAI) -> None:
    models = client.models.list()
    ids = [m.id for m in models.data]
    assert ids[0] == "onnx-tts-voice"
    # OpenAI's model names are listed as aliases of the default model (pipecat's default is
    # gpt-4o-mini-tts).
    assert {"tts-1", "tts-1-hd", "gpt-4o-mini-tts"} <= set(ids[1:])
    assert all(m.model_extra["alias_of"] == "onnx-tts-voice" for m in models.data[1:])
    health = httpx.get(server.url + "/health").json()
    assert health == {"status": "ok", "models": ["onnx-tts-voice"]}
    assert client.models.retrieve("tts-1").id == "onnx-tts-voice"
    assert client.models.retrieve("gpt-4o-mini-tts").id == "onnx-tts-voice"


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus", "aac"])
def test_speech_create_whole_file(
    client: openai.OpenAI, reference_pcm: np.ndarray, fmt: str
) -> None:
    response = client.audio.speech.create(
        model="gpt-4o-mini-tts", voice="alloy", input=TEXT, response_format=fmt
    )
    samples, rate = decode(response.content)
    expected_rate = 48000 if fmt == "opus" else RATE
    assert rate == expected_rate
    seconds = len(reference_pcm) / RATE
    # mp3 and aac add an encoder delay and padding (one or two frames) that a file of unknown
    # length cannot declare.
    slack = 0.2 if fmt in ("mp3", "aac") else 0.1
    assert abs(len(samples) / rate - seconds) < slack, (len(samples) / rate, seconds)
    assert np.all(np.isfinite(samples)) and np.abs(samples).max() > 0.01


def test_streaming_pcm_with_openai_client(
    server: LiveServer, client: openai.OpenAI, reference_pcm: np.ndarray
) -> None:
    with client.audio.speech.with_streaming_response.create(
        model="tts-1",
        voice="default",
        input=TEXT,
        response_format="pcm",
        extra_body={"stream_format": "audio", "sample_rate": RATE},
    ) as response:
        headers = response.headers
        chunks = list(response.iter_bytes())
    assert headers["x-sample-rate"] == str(RATE)
    assert (headers["x-channels"], headers["x-bit-depth"]) == ("1", "16")
    assert headers["content-type"] == "audio/pcm"
    data = b"".join(chunks)
    assert len(data) == 2 * len(reference_pcm)  # streamed and whole: same length


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus", "aac"])
def test_streaming_formats_decode(client: openai.OpenAI, reference_pcm: np.ndarray, fmt: str):
    with client.audio.speech.with_streaming_response.create(
        model="tts-1",
        voice="default",
        input=TEXT,
        response_format=fmt,
        extra_body={"stream_format": "audio"},
    ) as response:
        data = b"".join(response.iter_bytes())
    samples, rate = decode(data)
    # mp3 and aac add encoder delay and padding that a stream cannot declare.
    slack = 0.2 if fmt in ("mp3", "aac") else 0.06
    assert abs(len(samples) / rate - len(reference_pcm) / RATE) < slack
    if fmt == "wav":
        assert data.startswith(wav_stream_header(RATE))


def test_sse_with_httpx(server: LiveServer, reference_pcm: np.ndarray) -> None:
    body = {"input": TEXT, "stream_format": "sse", "response_format": "pcm", "sample_rate": RATE}
    with httpx.stream("POST", server.url + "/v1/audio/speech", json=body, timeout=60) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: ")]
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) >= 2  # streamed, not one blob
    assert events[-1]["type"] == "speech.audio.done"
    usage = events[-1]["usage"]
    assert usage["input_tokens"] == len(TEXT)
    assert usage["output_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    audio = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    np.testing.assert_array_equal(pcm(audio), reference_pcm)


def test_speed_is_applied(server: LiveServer, reference_pcm: np.ndarray) -> None:
    """The engine applies the speed: each sentence time-stretched (pitch kept), the pause
    between them as it is; the server sends exactly what the Python API makes."""
    import onnx_tts
    from onnx_tts.audio import pcm16

    engine = onnx_tts.load(cache_dir=None)
    try:
        for speed in (0.5, 2.0):
            response = speech(
                server, input=TEXT, response_format="pcm", speed=speed, sample_rate=RATE
            )
            assert response.status_code == 200
            # The same frames, stretched alike (streamed windows round apart from one-shot).
            expected = pcm16(engine.synthesize(TEXT, speed=speed).samples)
            assert len(pcm(response.content)) == len(expected)
            pause = int(0.15 * RATE)
            assert abs(len(expected) - pause - (len(reference_pcm) - pause) / speed) <= 2
    finally:
        engine.close()


def test_seed_and_model_options_pass_through(server: LiveServer) -> None:
    one = speech(server, input="Sampled speech.", response_format="pcm", temperature=0.7, seed=3)
    two = speech(server, input="Sampled speech.", response_format="pcm", temperature=0.7, seed=3)
    assert one.status_code == two.status_code == 200
    assert one.content == two.content


# -- voices ---------------------------------------------------------------------------------------


def _wav_bytes(samples: np.ndarray, rate: int, fmt: str = "WAV") -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format=fmt)
    return buffer.getvalue()


def upload(server: LiveServer, data: bytes, name: str = "mine") -> httpx.Response:
    return httpx.post(
        server.url + "/v1/audio/voices",
        files={"audio_sample": ("voice.wav", data, "audio/wav")},
        data={"name": name, "consent": "yes"},
        timeout=60,
    )


def test_voice_upload_use_delete(server: LiveServer, reference_pcm: np.ndarray) -> None:
    # Integer samples: WAV and FLAC then hold exactly the same content.
    clip = (speechlike(2.0, RATE, seed=2) * 32767).astype(np.int16)
    created = upload(server, _wav_bytes(clip, RATE))
    assert created.status_code == 201, created.text
    voice = created.json()
    assert voice["object"] == "audio.voice" and voice["name"] == "mine"
    assert voice["id"].startswith("voice_") and isinstance(voice["created_at"], int)
    # Content-addressed: the same samples as FLAC are the same voice (200: nothing new).
    again = upload(server, _wav_bytes(clip, RATE, "FLAC"))
    assert again.status_code == 200 and again.json()["id"] == voice["id"]
    # The same clip under another name is refused, naming the voice it already is; the
    # stored voice keeps its name.
    renamed = upload(server, _wav_bytes(clip, RATE), name="someone else")
    assert renamed.status_code == 409, renamed.text
    error = renamed.json()["error"]
    assert error["code"] == "voice_exists" and voice["id"] in error["message"]
    assert "'mine'" in error["message"]

    listed = httpx.get(server.url + "/v1/audio/voices").json()["voices"]
    assert {"id": voice["id"], "name": "mine"} in listed
    assert listed[0] == {"id": "default", "name": "default"}

    for ref in (voice["id"], {"id": voice["id"]}):
        used = speech(server, input=TEXT, voice=ref, response_format="pcm", sample_rate=RATE)
        assert used.status_code == 200, used.text
        assert pcm(used.content).shape != reference_pcm.shape or not np.array_equal(
            pcm(used.content), reference_pcm
        )

    assert httpx.delete(f"{server.url}/v1/audio/voices/{voice['id']}").status_code == 200
    gone = speech(server, input=TEXT, voice=voice["id"])
    assert gone.status_code == 404 and gone.json()["error"]["param"] == "voice"
    assert httpx.delete(f"{server.url}/v1/audio/voices/{voice['id']}").status_code == 404


def test_voice_upload_errors(server: LiveServer) -> None:
    too_big = upload(server, _wav_bytes(speechlike(20.0, RATE), RATE))  # 640 kB > 400 kB
    assert too_big.status_code == 413
    assert too_big.json()["error"]["code"] == "too_large"
    not_audio = upload(server, b"this is not audio at all" * 10)
    assert not_audio.status_code == 400
    error = not_audio.json()["error"]
    assert error["param"] == "audio_sample" and "\n" not in error["message"]
    silent = upload(server, _wav_bytes(np.zeros(RATE * 2, np.float32), RATE))
    assert silent.status_code == 400 and "silent" in silent.json()["error"]["message"]
    no_name = httpx.post(
        server.url + "/v1/audio/voices",
        files={"audio_sample": ("v.wav", _wav_bytes(speechlike(2.0, RATE), RATE))},
    )
    assert no_name.status_code == 400 and no_name.json()["error"]["param"] == "name"


def test_a_long_upload_is_trimmed_and_says_so(server: LiveServer) -> None:
    """A clip beyond the encoder's 30 s was cut silently; the response now says so in a
    header and the server logs it."""
    clip = io.BytesIO()  # 8-bit at 8 kHz: under the fixture's 400 kB upload limit
    soundfile.write(clip, speechlike(31.0, 8000, seed=4), 8000, format="WAV", subtype="PCM_U8")
    created = upload(server, clip.getvalue(), name="long one")
    assert created.status_code == 201, created.text
    assert created.headers["X-Reference-Trimmed"] == "31.0 s; kept the first 30 s"
    assert "voice 'long one': audio_sample is 31.0 s long; only its first 30 s" in server.log()
    short = upload(server, _wav_bytes(speechlike(2.0, RATE, seed=5), RATE), name="short one")
    assert short.status_code == 201 and "X-Reference-Trimmed" not in short.headers
    for made in (created, short):
        httpx.delete(f"{server.url}/v1/audio/voices/{made.json()['id']}")


# -- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"input": ""}, 400, "input"),
        ({"input": "x" * 4097}, 400, "input"),
        ({"model": "tts-1"}, 400, "input"),
        ({"input": "hi", "response_format": "aiff"}, 400, "response_format"),
        ({"input": "hi", "response_format": "pcm", "sample_rate": 44000}, 400, "sample_rate"),
        ({"input": "hi", "response_format": "opus", "sample_rate": 44100}, 400, "sample_rate"),
        ({"input": "hi", "sample_rate": "24000"}, 400, "sample_rate"),
        ({"input": "hi", "speed": 4.5}, 400, "speed"),
        ({"input": "hi", "speed": 0.1}, 400, "speed"),
        ({"input": "hi", "stream_format": "chunks"}, 400, "stream_format"),
        ({"input": "hi", "model": "gpt-4o-mini-tts-2099"}, 404, "model"),
        ({"input": "hi", "voice": "nobody"}, 404, "voice"),
        ({"input": "hi", "voice": {"id": "voice_000000000000000000000000"}}, 404, "voice"),
        ({"input": "hi", "top_q": 0.5}, 400, "top_q"),
        ({"input": "hi", "seed": -1}, 400, "seed"),
        ({"input": "hi", "temperature": "hot"}, 400, "temperature"),
        ({"input": "hi", "repetition_penalty": [1]}, 400, "repetition_penalty"),
        ({"input": "hi", "top_k": 1.5}, 400, "top_k"),
        ({"input": "hi", "stride_frames": True}, 400, "stride_frames"),
        ({"input": "hi", "temperature": -1.0}, 400, None),
        ({"input": "...."}, 400, None),
    ],
)
def test_errors_use_openai_envelope(
    server: LiveServer, body: dict, status: int, param: str | None
) -> None:
    response = speech(server, **body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    assert error["message"] and "\n" not in error["message"] and "Traceback" not in error["message"]


def test_unknown_format_error_names_supported_formats(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.audio.speech.create(
            model="tts-1",
            voice="alloy",
            input="hi",
            response_format="aiff",  # type: ignore[arg-type]
        )
    assert "mp3, opus, aac, flac, wav, pcm" in str(caught.value)


def test_malformed_requests(server: LiveServer) -> None:
    bad_json = httpx.post(server.url + "/v1/audio/speech", content=b"{nope")
    assert bad_json.status_code == 400 and bad_json.json()["error"]["code"] == "invalid_json"
    array = httpx.post(server.url + "/v1/audio/speech", json=[1, 2])
    assert array.status_code == 400
    huge = httpx.post(server.url + "/v1/audio/speech", content=b"x" * (2 << 20))
    assert huge.status_code == 413
    missing = httpx.get(server.url + "/v1/nothing-here")
    assert missing.status_code == 404 and "error" in missing.json()


# -- metrics --------------------------------------------------------------------------------------


def test_metrics(server: LiveServer) -> None:
    assert speech(server, input="Metrics please.", response_format="wav").status_code == 200
    assert speech(server, input="").status_code == 400
    text = httpx.get(server.url + "/metrics").text
    assert metric(text, "onnx_tts_requests_total", path="/v1/audio/speech", status="200") >= 1
    assert metric(text, "onnx_tts_requests_total", path="/v1/audio/speech", status="400") >= 1
    assert metric(text, "onnx_tts_time_to_first_audio_seconds_count") >= 1
    assert metric(text, "onnx_tts_real_time_factor_count") >= 1
    assert metric(text, "onnx_tts_request_duration_seconds_count") >= 1
    assert metric(text, "onnx_tts_audio_seconds_total") > 0.5
    assert metric(text, "onnx_tts_batch_size_count") >= 1
    assert "onnx_tts_queue_depth" in text and "onnx_tts_stream_underruns_total" in text
    assert 'onnx_tts_reference_cache_lookups_total{model="onnx-tts-voice",tier="memory"}' in text
    # Each stage's work (its busy time, items and runs: items / runs is its mean batch).
    for stage in ("decode", "vocoder"):
        assert (
            metric(text, "onnx_tts_stage_busy_seconds_total", model="onnx-tts-voice", stage=stage)
            > 0
        )
        assert metric(text, "onnx_tts_stage_runs_total", model="onnx-tts-voice", stage=stage) >= 1
        assert metric(
            text, "onnx_tts_stage_items_total", model="onnx-tts-voice", stage=stage
        ) >= metric(text, "onnx_tts_stage_runs_total", stage=stage)
    assert metric(text, "onnx_tts_admission_capacity", model="onnx-tts-voice") >= 1


def test_result_cache_hits_are_served_and_counted(tmp_path: Path) -> None:
    """A seeded request repeated on a server with a result cache is a memory hit, with the
    same bytes, and /metrics counts it."""
    live = LiveServer(tmp_path, "--result-cache-mb", "8", "--result-cache-dir", "none")
    try:
        body = {"input": "Please hold.", "response_format": "pcm", "seed": 3}
        first = speech(live, **body)
        second = speech(live, **body)
        assert first.status_code == second.status_code == 200
        assert first.content == second.content and len(first.content) > 1000
        text = httpx.get(live.url + "/metrics").text
        labels = {"model": "onnx-tts-voice"}
        assert metric(text, "onnx_tts_result_cache_lookups_total", tier="memory", **labels) >= 1
        assert metric(text, "onnx_tts_result_cache_lookups_total", tier="miss", **labels) >= 1
        # A sampled request is cached only when it asks ("cache": true), then replayed.
        sampled = {"input": "Sampled.", "response_format": "pcm", "temperature": 0.8}
        one, two = (speech(live, **sampled, cache=True) for _ in range(2))
        assert one.status_code == two.status_code == 200 and one.content == two.content
        assert speech(live, **sampled, cache="maybe").status_code == 400
    finally:
        live.stop()


def test_prefix_cache_is_counted_in_metrics(tmp_path: Path) -> None:
    """codec-lm's voice prefix is prefilled once: the second request with the voice is a
    prefix hit, and /metrics shows lookups, entries and bytes per cache."""
    from tests.conftest import codec_lm_dir

    live = LiveServer(tmp_path, "--model", str(codec_lm_dir()), "--max-batch", "1")
    try:
        for text in ("First line.", "Second line."):
            assert speech(live, input=text, response_format="pcm", seed=1).status_code == 200
        text = httpx.get(live.url + "/metrics").text
        name = httpx.get(live.url + "/v1/models").json()["data"][0]["id"]
        lookups = "onnx_tts_prefix_cache_lookups_total"
        assert metric(text, lookups, model=name, tier="miss") == 1, text
        assert metric(text, lookups, model=name, tier="memory") == 1
        assert metric(text, "onnx_tts_cache_entries", cache="prefix", model=name) == 1
        assert metric(text, "onnx_tts_cache_bytes", cache="prefix", model=name) > 0
        assert f'onnx_tts_cache_entries{{cache="reference",model="{name}"}}' in text
    finally:
        live.stop()


# -- concurrency ----------------------------------------------------------------------------------


def test_sixteen_concurrent_streaming_clients(
    server: LiveServer, client: openai.OpenAI, reference_pcm: np.ndarray
) -> None:
    results: dict[int, bytes] = {}
    errors: list[BaseException] = []

    def one(index: int) -> None:
        try:
            with client.audio.speech.with_streaming_response.create(
                model="tts-1",
                voice="default",
                input=TEXT,
                response_format="pcm",
                extra_body={"stream_format": "audio", "sample_rate": RATE},
            ) as response:
                results[index] = b"".join(response.iter_bytes())
        except BaseException as error:  # collected and re-raised below
            errors.append(error)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_BOUND_SECONDS)
    assert not errors, errors
    assert len(results) == 16
    for data in results.values():  # greedy decoding: every stream is the same, complete audio
        np.testing.assert_array_equal(pcm(data), reference_pcm)


# -- API key, queue limit, disconnect, SIGTERM -----------------------------------------------------


@pytest.fixture(scope="module")
def strict_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = LiveServer(
        tmp_path_factory.mktemp("strict"),
        "--api-key",
        "sekrit",
        "--max-streams",
        "1",
        "--max-queue",
        "0",
    )
    yield live
    live.stop()


def test_api_key(strict_server: LiveServer) -> None:
    url = strict_server.url + "/v1/audio/speech"
    body = {"input": "Hello.", "response_format": "wav"}
    assert httpx.post(url, json=body).status_code == 401
    wrong = httpx.post(url, json=body, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(strict_server.url + "/metrics").status_code == 401
    assert httpx.get(strict_server.url + "/health").status_code == 200
    good = openai.OpenAI(base_url=strict_server.url + "/v1", api_key="sekrit", max_retries=0)
    audio = good.audio.speech.create(model="tts-1", voice="alloy", input="Hello.")
    assert len(audio.content) > 100
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=strict_server.url + "/v1", api_key="bad", max_retries=0
        ).models.list()


def test_queue_full_then_disconnect_cancels(strict_server: LiveServer) -> None:
    headers = {"Authorization": "Bearer sekrit"}
    url = strict_server.url + "/v1/audio/speech"
    long_body = {"input": LONG_TEXT, "response_format": "pcm", "stream_format": "audio"}
    with httpx.stream("POST", url, json=long_body, headers=headers, timeout=60) as busy:
        assert busy.status_code == 200
        stream = busy.iter_bytes()  # keep it: a dropped iterator closes the connection
        assert next(stream)
        refused = httpx.post(url, json={"input": "Me too."}, headers=headers)
        assert refused.status_code == 429
        assert refused.json()["error"]["type"] == "rate_limit_error"

    # The client went away mid-stream: its generation stops and frees the only worker.
    def idle_metrics() -> str:
        text = httpx.get(strict_server.url + "/metrics", headers=headers).text
        return text if metric(text, "onnx_tts_active_generations") == 0 else ""

    text = wait_until(idle_metrics, "the abandoned generation stopped", poll_seconds=0.1)
    assert metric(text, "onnx_tts_cancelled_generations_total") >= 1
    after = httpx.post(url, json={"input": "Now it is free."}, headers=headers)
    assert after.status_code == 200


def test_a_request_refused_as_its_stream_opens_gives_its_place_back(
    strict_server: LiveServer,
) -> None:
    """Text the engine refuses (checked as its stream opens, in the trip that planned and
    admitted it) is a 400, and the server's one stream is free again at once."""
    headers = {"Authorization": "Bearer sekrit"}
    url = strict_server.url + "/v1/audio/speech"
    for text in ("Say [[ 1 2 3 ]].", "<speak><break time='-1s'/>Hi.</speak>"):
        refused = httpx.post(url, json={"input": text}, headers=headers)
        assert refused.status_code == 400, refused.text
    text = httpx.get(strict_server.url + "/metrics", headers=headers).text
    assert metric(text, "onnx_tts_active_generations") == 0
    after = httpx.post(url, json={"input": "Still free."}, headers=headers)
    assert after.status_code == 200


def test_sigterm_drains_in_flight_streams(tmp_path: Path) -> None:
    live = LiveServer(tmp_path)
    try:
        text = " ".join(["A sentence to finish after the signal."] * 12)
        expected = pcm(speech(live, input=text, response_format="pcm").content)
        body = {"input": text, "response_format": "pcm"}  # streamed without asking
        with httpx.stream("POST", live.url + "/v1/audio/speech", json=body, timeout=60) as r:
            stream = r.iter_bytes()
            chunks = [next(stream)]
            live.process.send_signal(signal.SIGTERM)
            chunks.extend(stream)
        np.testing.assert_array_equal(pcm(b"".join(chunks)), expected)
        # A clean drain is a clean exit.
        assert live.process.wait(WAIT_BOUND_SECONDS) == 0
        with pytest.raises(httpx.TransportError):
            httpx.get(live.url + "/health", timeout=2)
    finally:
        live.stop()
    assert "status=200" in live.log()


def test_bad_arguments_exit_2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "onnx_tts.server", "--max-streams", "0"],
        capture_output=True,
        text=True,
        timeout=WAIT_BOUND_SECONDS,
        env={**os.environ},
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "onnx-tts serve: --max-streams must be in [1, 4096], got 0"
    ]


def test_unloadable_model_exits_2(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "onnx_tts.server", "--port", str(free_port())]
    done = subprocess.run(
        [*command, "--model", str(tmp_path / "missing"), "--voices-dir", str(tmp_path / "v")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "cannot load the model" in done.stderr


# -- units: time stretch, encoders, playback clock -------------------------------------------------


def _dominant_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.argmax(spectrum) * rate / len(samples))


@pytest.mark.parametrize("speed", [0.25, 0.5, 1.5, 2.0, 4.0])
def test_time_stretch_keeps_pitch_and_scales_length(speed: float) -> None:
    t = np.arange(2 * RATE) / RATE
    tone = (0.5 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    out = stretch(tone, speed, RATE)
    assert len(out) == round(len(tone) / speed)
    middle = out[len(out) // 8 : -len(out) // 8]
    assert abs(_dominant_hz(middle, RATE) - 220) < 3  # resampling would give 220 * speed
    assert 0.45 < np.abs(middle).max() < 0.55  # no gaps or doubling at the seams


def test_time_stretch_streaming_equals_whole() -> None:
    signal_ = speechlike(1.5, RATE, seed=1)
    whole = stretch(signal_, 1.3, RATE)
    stretcher = TimeStretcher(1.3, RATE)
    rng = np.random.default_rng(0)
    parts, start = [], 0
    while start < len(signal_):
        size = int(rng.integers(1, 2000))
        parts.append(stretcher.push(signal_[start : start + size]))
        start += size
    parts.append(stretcher.finish())
    np.testing.assert_array_equal(np.concatenate(parts), whole)


def test_stream_encoder_wav_and_pcm() -> None:
    tone = (0.25 * np.sin(np.arange(RATE) / 5)).astype(np.float32)
    for fmt in ("wav", "pcm"):
        encoder = StreamEncoder(fmt, RATE)
        data = b"".join(encoder.feed(tone[i : i + 999]) for i in range(0, RATE, 999))
        data += encoder.close()
        body = data[44:] if fmt == "wav" else data
        np.testing.assert_allclose(pcm(body), tone, atol=1 / 32000)


def test_playback_clock_counts_underruns() -> None:
    clock = PlaybackClock()
    assert clock.chunk(0.0, 1.0) == 0.0  # starts playing
    assert clock.chunk(0.5, 1.0) == 0.0  # arrived while 0.5 s was still buffered
    assert clock.chunk(2.5, 1.0) == pytest.approx(0.5)  # the player ran dry at 2.0
    assert clock.underruns == 1 and clock.stalled == pytest.approx(0.5)


def test_replicas_share_voice_encodes_through_redis(tmp_path: Path) -> None:
    from tests.redis_server import redis_server

    with redis_server(tmp_path / "redis") as url:
        shared = ["--redis", url, "--voices-dir", str(tmp_path / "shared-voices")]
        first = LiveServer(tmp_path / "a", *shared, "--cache-dir", "none")
        second = LiveServer(tmp_path / "b", *shared, "--cache-dir", "none")
        try:
            clip = (speechlike(2.0, RATE, seed=4) * 32767).astype(np.int16)
            created = upload(first, _wav_bytes(clip, RATE))
            assert created.status_code == 201, created.text
            used = speech(second, input="Shared voice.", voice=created.json()["id"])
            assert used.status_code == 200, used.text
            text = httpx.get(second.url + "/metrics").text
            labels = {"model": "onnx-tts-voice"}
            assert metric(text, "onnx_tts_reference_cache_lookups_total", tier="redis", **labels)
            assert not metric(text, "onnx_tts_reference_cache_lookups_total", tier="miss", **labels)
        finally:
            first.stop()
            second.stop()


def test_a_bad_shared_voice_entry_is_recomputed_on_a_replica_and_counted(tmp_path: Path) -> None:
    """A checksum-valid but mis-shaped reference entry in the shared Redis was a 500 on the
    replica that read it (and a corrupt one a 400 blaming the client): now the replica encodes
    the voice again, answers 200 with the same audio, and /metrics counts the rejected entry."""
    import redis

    from onnx_tts.cache.codec import decode_value
    from tests.cache_entries import REFERENCE_ATTACKS, forge_blob
    from tests.redis_server import redis_server

    with redis_server(tmp_path / "redis") as url:
        shared = ["--redis", url, "--voices-dir", str(tmp_path / "shared-voices")]
        first = LiveServer(tmp_path / "a", *shared, "--cache-dir", "none")
        second = None
        try:
            clip = (speechlike(2.0, RATE, seed=5) * 32767).astype(np.int16)
            voice = upload(first, _wav_bytes(clip, RATE)).json()["id"]
            made = speech(first, input="Shared voice.", voice=voice, response_format="pcm")
            assert made.status_code == 200, made.text
            client = redis.Redis.from_url(url)
            (rkey,) = client.keys("onnx-tts:refcache:*")
            key = rkey.decode().rsplit(":", 1)[1]
            good = decode_value(client.get(rkey), key)
            client.set(rkey, forge_blob(key, REFERENCE_ATTACKS["mis_shaped"](good)))

            second = LiveServer(tmp_path / "b", *shared, "--cache-dir", "none")
            served = speech(second, input="Shared voice.", voice=voice, response_format="pcm")
            assert served.status_code == 200, served.text
            assert served.content == made.content
            text = httpx.get(second.url + "/metrics").text
            labels = {"cache": "reference", "model": "onnx-tts-voice", "tier": "redis"}
            assert metric(text, "onnx_tts_cache_rejected_total", **labels) == 1, text
            assert "rejected redis entry" in second.log()
            assert decode_value(client.get(rkey), key)["speaker_embedding"].shape == (160,)
        finally:
            first.stop()
            if second is not None:
                second.stop()


def test_health_is_503_until_the_model_is_loaded(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from onnx_tts.config import CacheConfig
    from onnx_tts.server import ServerConfig, create_app
    from onnx_tts.server.engines import ModelRegistry

    registry = ModelRegistry([None], caches=CacheConfig(cache_dir=None))
    app = create_app(ServerConfig(voices_dir=str(tmp_path / "voices")), registry)
    client = TestClient(app)  # no lifespan: nothing loads until we say so
    assert client.get("/health").status_code == 503
    assert client.get("/health").json() == {"status": "loading"}
    waiting = client.post("/v1/audio/speech", json={"input": "Too early."})
    assert waiting.status_code == 503 and waiting.json()["error"]["code"] == "loading"
    registry.load_all()
    assert client.get("/health").json() == {"status": "ok", "models": ["onnx-tts-voice"]}
    assert client.post("/v1/audio/speech", json={"input": "Now."}).status_code == 200


# -- issue 43: SIGHUP, SIGQUIT and the other terminating signals ---------------------------------
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1])
def test_every_terminating_signal_drains_as_sigterm_does(tmp_path: Path, sig: int) -> None:
    """SIGHUP or SIGQUIT to `onnx-tts serve` was logged as a traceback and the server kept
    running. Each now drains the streams in flight and ends the server with exit 0, one log
    line naming it."""
    live = LiveServer(tmp_path)
    try:
        text = " ".join(["A sentence to finish after the signal."] * 6)
        expected = pcm(speech(live, input=text, response_format="pcm").content)
        body = {"input": text, "response_format": "pcm"}
        with httpx.stream("POST", live.url + "/v1/audio/speech", json=body, timeout=60) as r:
            stream = r.iter_bytes()
            chunks = [next(stream)]
            live.process.send_signal(sig)
            chunks.extend(stream)
        np.testing.assert_array_equal(pcm(b"".join(chunks)), expected)
        assert live.process.wait(WAIT_BOUND_SECONDS) == 0
    finally:
        live.stop()
    log = live.log()
    assert "Traceback" not in log
    assert f"{signal.Signals(sig).name}: finishing the requests in flight" in log


class _StartedUnderNohup(LiveServer):
    """`onnx-tts serve` started with SIGHUP ignored, as `nohup` starts it."""

    def _command(self) -> tuple[list[str], dict[str, str] | None, Path | None]:
        start = ("import runpy, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_IGN); "
                 "sys.argv[0] = 'onnx_tts.server'; "
                 "runpy.run_module('onnx_tts.server', run_name='__main__')")  # fmt: skip
        return [sys.executable, "-c", start], None, None


def test_a_sighup_the_server_was_started_with_ignored_stays_ignored(tmp_path: Path) -> None:
    live = _StartedUnderNohup(tmp_path)
    try:
        live.process.send_signal(signal.SIGHUP)
        answered = speech(live, input="Still serving.", response_format="pcm")
        assert answered.status_code == 200 and len(answered.content) > 1000
        assert live.process.poll() is None
        live.process.send_signal(signal.SIGTERM)
        assert live.process.wait(WAIT_BOUND_SECONDS) == 0
    finally:
        live.stop()
    assert "Traceback" not in live.log() and "SIGHUP" not in live.log()

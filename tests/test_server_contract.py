"""The HTTP server's conventions and fault contract, against live processes: every response
streams, readable by ffmpeg and libsndfile; pcm at 24 kHz; instructions; bad bodies and
headers; client disconnects; connection timeouts (raw sockets); signals; the port in use;
the per-synthesis log."""

from __future__ import annotations

import io
import itertools
import json
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import av
import httpx
import numpy as np
import pytest
import soundfile
from soundfile import _ffi, _snd

from benchmarks.live_server import LiveServer, free_port
from tests.conftest import speechlike
from tests.waiting import WAIT_BOUND_SECONDS, wait_until

RATE = 16000  # the default voice's own rate
TEXT = "The quick brown fox jumps over the lazy dog. Then it naps in the sun."
LONG_TEXT = " ".join(["This sentence keeps the worker busy for a while."] * 80)


def long_text(tag: str) -> str:
    """A text of distinct sentences (no cache can answer any of it), about a minute of speech."""
    return " ".join(f"Sentence {i} of the {tag} test keeps the worker busy." for i in range(60))


FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = LiveServer(
        tmp_path_factory.mktemp("contract"),
        "--log-json",
        "--header-timeout",
        "1",
        "--body-timeout",
        "2",
        "--keep-alive",
        "1",
        "--result-cache-mb",
        "8",
        "--result-cache-dir",
        "none",
    )
    yield live
    live.stop()
    assert "Traceback" not in live.log()


def speech(server: LiveServer, **body: object) -> httpx.Response:
    return httpx.post(server.url + "/v1/audio/speech", json=body, timeout=120)


def metric(server: LiveServer, name: str) -> float:
    response = httpx.get(server.url + "/metrics")
    assert response.status_code == 200, response.text
    for line in response.text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_until_idle(server: LiveServer) -> None:
    wait_until(
        lambda: metric(server, "onnx_tts_active_generations") == 0,
        "no generation is active",
        poll_seconds=0.1,
    )


def log_records(server: LiveServer) -> list[dict]:
    return [json.loads(line) for line in server.log().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def native(server: LiveServer) -> np.ndarray:
    """TEXT in the default voice at the model's own rate."""
    response = speech(server, input=TEXT, response_format="pcm", sample_rate=RATE)
    assert response.status_code == 200
    return np.frombuffer(response.content, "<i2").astype(np.float32) / 32768


# -- every response streams -----------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_streams_without_asking(server: LiveServer, fmt: str) -> None:
    """No stream_format: the body still comes chunked while the audio is being made; FLAC
    alone is sent whole once the audio is complete (so seeking readers, soundfile.read among
    them, read it to the end)."""
    body = {"input": long_text(f"streaming {fmt}"), "response_format": fmt}
    with httpx.stream("POST", server.url + "/v1/audio/speech", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["transfer-encoding"] == "chunked"
        assert "content-length" not in r.headers
        stream = r.iter_raw()  # kept: a dropped iterator closes the connection
        assert next(stream)
        active = metric(server, "onnx_tts_active_generations")
        # The first bytes are here while the generation is still running (FLAC: after it).
        assert active >= 1 if fmt != "flac" else active == 0
    wait_until_idle(server)


def _libsndfile_read(data: bytes) -> tuple[np.ndarray, int]:
    """libsndfile's own read loop (sf_readf_float until it returns 0). soundfile.read() is not
    used for FLAC: a stream's STREAMINFO says 'length unknown', and soundfile's wrapper then
    seeks after each read, which libFLAC cannot do without the length."""
    with soundfile.SoundFile(io.BytesIO(data)) as sound:
        block = np.empty(4096, np.float32)
        pieces = []
        while True:
            got = _snd.sf_readf_float(sound._file, _ffi.cast("float *", block.ctypes.data), 4096)
            if got <= 0:
                break
            pieces.append(block[:got].copy())
        return np.concatenate(pieces), sound.samplerate


def _ffmpeg_read(data: bytes) -> tuple[np.ndarray, int]:
    with av.open(io.BytesIO(data)) as container:
        frames = [f.to_ndarray().reshape(-1) for f in container.decode(audio=0)]
        rate = container.streams.audio[0].rate
    samples = np.concatenate(frames)
    if samples.dtype.kind == "i":
        samples = samples / 32768.0
    return samples.astype(np.float32), rate


@pytest.mark.parametrize("fmt", ["wav", "mp3", "opus", "flac", "aac"])
def test_streamed_formats_read_by_ffmpeg_and_libsndfile(
    server: LiveServer, native: np.ndarray, fmt: str
) -> None:
    response = speech(server, input=TEXT, response_format=fmt)
    assert response.status_code == 200
    seconds = len(native) / RATE
    # mp3 and aac carry an encoder delay and padding that a stream cannot declare.
    slack = 0.2 if fmt in ("mp3", "aac") else 0.06
    readers = [_ffmpeg_read]
    if fmt == "flac":
        readers.append(_libsndfile_read)
    elif fmt != "aac":  # libsndfile has no AAC decoder at all
        readers.append(lambda data: soundfile.read(io.BytesIO(data), dtype="float32"))
    for read in readers:
        samples, rate = read(response.content)
        assert abs(len(samples) / rate - seconds) < slack, (read, len(samples) / rate, seconds)
        assert np.all(np.isfinite(samples)) and np.abs(samples).max() > 0.01


def test_streamed_mp3_is_constant_bitrate(server: LiveServer) -> None:
    """Every MPEG frame has the same bitrate, so players that never learn the length (no
    Xing/Info header can be written up front) still read the whole stream and its duration."""
    data = speech(server, input=TEXT, response_format="mp3").content
    bitrate_indexes = set()
    position = 0
    while position + 4 <= len(data):
        header = int.from_bytes(data[position : position + 4], "big")
        if header >> 21 != 0x7FF:  # not a frame sync: an ID3 tag or padding
            position += 1
            continue
        version = (header >> 19) & 3  # 3 = MPEG-1, 2 = MPEG-2
        index = (header >> 12) & 15
        rate_index = (header >> 10) & 3
        padding = (header >> 9) & 1
        kbps = {3: [0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320]}.get(
            version, [0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160]
        )[index]
        rate = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000)}[version][rate_index]
        size = (144 if version == 3 else 72) * kbps * 1000 // rate + padding
        bitrate_indexes.add(index)
        position += size
    assert len(bitrate_indexes) == 1, bitrate_indexes


def test_pcm_is_24khz_unless_asked(server: LiveServer, native: np.ndarray) -> None:
    default = speech(server, input=TEXT, response_format="pcm")
    assert default.status_code == 200
    assert default.headers["x-sample-rate"] == "24000"
    assert (default.headers["x-channels"], default.headers["x-bit-depth"]) == ("1", "16")
    samples = len(default.content) // 2
    assert abs(samples - len(native) * 1.5) <= 2  # the same speech, resampled
    asked = speech(server, input=TEXT, response_format="pcm", sample_rate=48000)
    assert asked.headers["x-sample-rate"] == "48000"
    assert abs(len(asked.content) // 2 - len(native) * 3) <= 3


# -- OpenAI's instructions ------------------------------------------------------------------


def test_instructions_applied_or_reported(server: LiveServer, native: np.ndarray) -> None:
    slow = speech(
        server, input=TEXT, response_format="pcm", sample_rate=RATE, instructions="Speak slowly."
    )
    assert slow.status_code == 200
    assert "speed" in slow.headers["x-instructions-applied"]
    assert "x-instructions-ignored" not in slow.headers
    assert len(slow.content) // 2 > 1.1 * len(native)  # slower speech is longer
    odd = speech(
        server, input=TEXT, response_format="pcm", instructions="Sound like a pirate; be calm."
    )
    assert odd.status_code == 200
    assert "pirate" in odd.headers["x-instructions-ignored"]
    # The default voice has no expressiveness control: "calm" is reported, not dropped.
    assert "calm" in odd.headers["x-instructions-ignored"]
    warnings = [r for r in log_records(server) if "instructions ignored" in r["message"]]
    assert any("pirate" in r["message"] for r in warnings)


# -- bad bodies and headers -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 200_000 + b"]" * 200_000,  # deeper than the JSON parser's recursion limit
        b'{"input": "hi", "x": ' + b"[" * 40 + b"]" * 40 + b"}",  # parses, too deep to accept
        b'{"input": "hi", "voice": ' + b'{"id": ' * 30 + b'"v"' + b"}" * 30 + b"}",
    ],
)
def test_deeply_nested_json_is_400(server: LiveServer, body: bytes) -> None:
    response = httpx.post(server.url + "/v1/audio/speech", content=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_json" and "nests deeper" in error["message"]


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = LiveServer(tmp_path_factory.mktemp("keyed"), "--api-key", "sekrit")
    yield live
    live.stop()
    assert "Traceback" not in live.log()


@pytest.mark.parametrize(
    "value",
    [
        "Bearer café".encode("latin-1"),
        "Bearer ключ".encode(),
        b"Bearer \xff\xfe",
        "Bärer sekrit".encode(),
    ],
)
def test_non_ascii_authorization_is_401(keyed: LiveServer, value: bytes) -> None:
    response = httpx.post(
        keyed.url + "/v1/audio/speech",
        json={"input": "Hello."},
        headers={"Authorization": value},
    )
    assert response.status_code == 401, response.text
    assert response.json()["error"]["code"] == "invalid_api_key"
    good = httpx.post(
        keyed.url + "/v1/audio/speech",
        json={"input": "Hello.", "response_format": "wav"},
        headers={"Authorization": "Bearer sekrit"},
    )
    assert good.status_code == 200


# -- clients that leave, and slow clients ------------------------------------------------------


def _raw_request(port: int, body: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_BOUND_SECONDS)
    sock.sendall(
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return sock


@pytest.mark.parametrize(
    "values",
    [("Bearer wrong", "Bearer sekrit"), ("Bearer sekrit", "Bearer wrong"), ("Bearer sekrit", "")],
    ids=["wrong-then-right", "right-then-wrong", "right-then-empty"],
)
def test_several_authorization_headers_are_401(keyed: LiveServer, values: tuple) -> None:
    """Only the last of several Authorization headers was read: a wrong key followed by the
    right one got in. Which one counts differs between proxies and servers, so several are
    refused whatever they hold."""
    body = json.dumps({"input": "Hello.", "response_format": "pcm"}).encode()
    head = b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += b"".join(b"Authorization: " + v.encode() + b"\r\n" for v in values)
    head += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", keyed.port), timeout=60) as sock:
        sock.sendall(head + body)
        answer = _read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 401 "), answer[:200]
    assert b'"invalid_api_key"' in answer


@pytest.mark.parametrize(
    ("field", "value"),
    [("voice", "v" * 100_000), ("voice", ""), ("seed", "7"), ("speed", "1.5")],
    ids=["voice-100k", "voice-empty", "seed-string", "speed-string"],
)
def test_unbounded_or_coerced_fields_are_400(server: LiveServer, field: str, value: str) -> None:
    """A 100,000-character voice name was looked up and echoed in a 404; numbers sent as
    strings were coerced and served. Both are the client's mistake, said in one line."""
    response = speech(server, input="Hello.", response_format="pcm", **{field: value})
    assert response.status_code == 400, response.text[:200]
    error = response.json()["error"]
    assert error["param"] == field and len(error["message"]) < 200


@pytest.mark.parametrize("name", ["a\x00b", "two\nlines", "bell\x07", "esc\x1b[31m"])
def test_voice_names_with_control_characters_are_400(server: LiveServer, name: str) -> None:
    """A name with NUL or a newline was stored and listed (and a newline can forge log lines
    or break the web page's list)."""
    wav = io.BytesIO()
    soundfile.write(wav, speechlike(2.0, RATE, seed=31), RATE, format="WAV")
    response = httpx.post(
        server.url + "/v1/audio/voices",
        files={"audio_sample": ("voice.wav", wav.getvalue(), "audio/wav")},
        data={"name": name},
        timeout=60,
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "name"
    listed = httpx.get(server.url + "/v1/audio/voices", timeout=30).json()["voices"]
    assert name not in [v["name"] for v in listed]


def test_a_name_taken_by_another_clip_is_409_and_keeps_its_voice(server: LiveServer) -> None:
    def upload(seed: int) -> httpx.Response:
        wav = io.BytesIO()
        soundfile.write(wav, speechlike(2.0, RATE, seed=seed), RATE, format="WAV")
        return httpx.post(
            server.url + "/v1/audio/voices",
            files={"audio_sample": ("voice.wav", wav.getvalue(), "audio/wav")},
            data={"name": "taken-name"},
            timeout=60,
        )

    first = upload(21)
    assert first.status_code == 201, first.text
    second = upload(22)
    assert second.status_code == 409, second.text
    assert first.json()["id"] in second.json()["error"]["message"]
    by_name = speech(server, input="Hello.", voice="taken-name", response_format="pcm")
    assert by_name.status_code == 200, by_name.text


@pytest.mark.parametrize("read_status", [False, True])
def test_plain_request_stops_generating_when_its_client_leaves(
    server: LiveServer, read_status: bool
) -> None:
    """A request without stream_format (what client.audio.speech.create sends) whose client
    goes away, before or after the first bytes, stops its generation."""
    wait_until_idle(server)
    cancelled = metric(server, "onnx_tts_cancelled_generations_total")
    text = long_text(f"leaving {read_status}")
    sock = _raw_request(server.port, json.dumps({"input": text}).encode())
    if read_status:
        assert sock.recv(64).startswith(b"HTTP/1.1 200")
    sock.close()
    wait_until_idle(server)
    assert metric(server, "onnx_tts_cancelled_generations_total") == cancelled + 1
    stopped = [r for r in log_records(server) if r.get("outcome") == "cancelled"]
    assert stopped and stopped[-1]["characters"] == len(text)
    assert any("client went away" in r["message"] for r in log_records(server))


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (the socket's timeout
    bounds the wait, far above the limits under test: 1-2 s)."""
    received = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return received
        received += chunk


def test_half_a_request_line_is_timed_out(server: LiveServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_BOUND_SECONDS) as sock:
        sock.sendall(b"GET /heal")
        answer = _read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"


def test_headers_dripped_byte_by_byte_are_timed_out(server: LiveServer) -> None:
    """The header clock runs from the first byte: a client that keeps sending one byte at a
    time (20 a second) does not reset it. The client drips until the server answers or
    closes, so the answer comes while the headers are still arriving."""
    request = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: "
    deadline = time.monotonic() + WAIT_BOUND_SECONDS  # a bound on the wait, nothing more
    with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_BOUND_SECONDS) as sock:
        closed, answer = False, b""
        for byte in itertools.chain(request, itertools.repeat(ord("a"))):
            if select.select([sock], [], [], 0.05)[0]:  # the server spoke (or closed)
                try:
                    answer = _read_until_closed(sock)
                except ConnectionResetError:  # it closed with a dripped byte unread: TCP
                    closed = True  # resets the connection, which may drop the 408 before us
                break
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            assert time.monotonic() < deadline, "the server let the headers drip on"
    assert closed or answer.startswith(b"HTTP/1.1 408 ")


def test_a_silent_connection_is_closed(server: LiveServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_BOUND_SECONDS) as sock:
        assert _read_until_closed(sock) == b""


def test_a_stalled_body_is_timed_out(server: LiveServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_BOUND_SECONDS) as sock:
        sock.sendall(
            b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"input": '
        )
        answer = _read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b'"request_timeout"' in answer


def test_an_idle_keep_alive_connection_is_closed(server: LiveServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_BOUND_SECONDS) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = _read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert answer.endswith(b'"models":["onnx-tts-voice"]}')


# -- the log --------------------------------------------------------------------------------------


def test_one_json_line_per_synthesis_with_cache_hits(server: LiveServer) -> None:
    body = {"input": "Logged once.", "response_format": "wav", "seed": 5}
    assert speech(server, **body).status_code == 200
    assert speech(server, **body).status_code == 200
    records = log_records(server)  # every line is one JSON object
    synthesis = [r for r in records if r.get("event") == "synthesis" and r["characters"] == 12]
    assert len(synthesis) == 2
    first, second = synthesis
    assert (first["model"], first["voice"], first["format"]) == ("onnx-tts-voice", "default", "wav")
    assert first["audio_seconds"] > 0.3 and first["time_to_first_audio"] > 0
    assert (first["cache_hit"], second["cache_hit"]) == (False, True)
    assert first["outcome"] == second["outcome"] == "done"
    access = [r for r in records if r["message"].startswith("request id=")]
    assert any("status=200" in r["message"] for r in access)


# -- process: signals and the port ---------------------------------------------------------------


def test_second_signal_during_the_drain_stops_at_once(tmp_path: Path) -> None:
    live = LiveServer(tmp_path, "--drain-seconds", "600")
    try:
        body = {"input": LONG_TEXT, "response_format": "pcm"}
        received = 0
        url = live.url + "/v1/audio/speech"
        # The body ends before its last chunk: the client sees a broken transfer.
        with (
            pytest.raises(httpx.RemoteProtocolError),
            httpx.stream("POST", url, json=body, timeout=60) as r,
        ):
            stream = r.iter_raw()
            received += len(next(stream))
            live.process.send_signal(signal.SIGTERM)
            # Two signals sent at once may arrive as one: the second only once the first
            # began the drain.
            wait_until(lambda: "Shutting down" in live.log(), "the drain began")
            live.process.send_signal(signal.SIGTERM)
            for chunk in stream:
                received += len(chunk)
        full = 77 * 24000 * 2  # LONG_TEXT is ~77 s of speech
        assert received < full / 2
        assert live.process.wait(WAIT_BOUND_SECONDS) == 1
    finally:
        live.stop()
    log = live.log()
    assert "second signal: stopping 1 generation(s) now" in log
    assert "stopped by a second signal" in log
    assert "Traceback" not in log


def test_port_in_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "onnx_tts.server", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"onnx-tts serve: cannot listen on 127.0.0.1:{port}"
    )
    assert "in use" in lines[0]


def test_a_flac_response_reads_to_the_end_with_soundfile_read(server: LiveServer) -> None:
    """FLAC goes out whole, its length in STREAMINFO: soundfile.read() and soundfile.blocks()
    read all of it, the same samples as the pcm response at the model's rate."""
    body = {"input": "A flac response, read by soundfile.", "seed": 1}
    flac = httpx.post(server.url + "/v1/audio/speech", json={**body, "response_format": "flac"})
    raw = httpx.post(
        server.url + "/v1/audio/speech",
        json={**body, "response_format": "pcm", "sample_rate": int(flac.headers["x-sample-rate"])},
    )
    assert flac.status_code == raw.status_code == 200
    samples, rate = soundfile.read(io.BytesIO(flac.content), dtype="int16")
    assert rate == int(flac.headers["x-sample-rate"])
    np.testing.assert_array_equal(samples, np.frombuffer(raw.content, "<i2"))
    blocks = list(soundfile.blocks(io.BytesIO(flac.content), blocksize=4096, dtype="int16"))
    assert sum(len(b) for b in blocks) == len(samples)

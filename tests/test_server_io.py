"""Issue 36: the servers' I/O failures are one clear line, never a traceback. A client that closes
mid-body or sends a malformed chunked body logged `ClientDisconnect` with a traceback; a
`--voices-dir` that is a regular file, an upload to a read-only voices directory or with no
space left were tracebacks. Live server processes over raw sockets and httpx."""

from __future__ import annotations

import contextlib
import io
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import soundfile

from benchmarks.live_server import LiveServer, free_port
from tests.conftest import speechlike
from tests.file_systems import read_only

RATE = 16000


def wav(seconds: float, seed: int = 70) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, speechlike(seconds, RATE, seed=seed), RATE, format="WAV")
    return buffer.getvalue()


def upload(server: LiveServer, data: bytes, name: str = "io test") -> httpx.Response:
    return httpx.post(
        server.url + "/v1/audio/voices",
        files={"audio_sample": ("v.wav", data, "audio/wav")},
        data={"name": name},
        timeout=120,
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = LiveServer(tmp_path_factory.mktemp("io"))
    yield live
    live.stop()
    assert "Traceback" not in live.log()


def read_answer(sock: socket.socket) -> bytes:
    received = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            received += chunk
    return received


def new_lines_until(server: LiveServer, mark: int, request: str) -> list[str]:
    """The log lines written since `mark` that are not about another request, once the line
    for `request` ("POST /path") is there: the server logs a request when it ends, and a
    line for an earlier request (the fixture's /health probe) may land after `mark`."""
    while True:
        lines = server.log()[mark:].splitlines()
        if any(f"{request} status=" in line for line in lines):
            return [line for line in lines if "request id=" not in line or request in line]
        assert server.process.poll() is None, "the server died"
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.process.wait(0.05)


@pytest.mark.parametrize(
    ("path", "headers", "sent"),
    [
        ("/v1/audio/speech", "Content-Type: application/json\r\nContent-Length: 300", b'{"in'),
        (
            "/v1/audio/voices",
            "Content-Type: multipart/form-data; boundary=XyZ\r\nContent-Length: 90000",
            b'--XyZ\r\nContent-Disposition: form-data; name="audio_sample"; filename="v.wav"'
            b"\r\n\r\nRIFF",
        ),
    ],
    ids=["speech-json", "voice-upload"],
)
def test_a_client_that_closes_mid_body_is_one_log_line(
    server: LiveServer, path: str, headers: str, sent: bytes
) -> None:
    mark = len(server.log())
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\n{headers}\r\n\r\n".encode() + sent)
    lines = new_lines_until(server, mark, f"POST {path}")
    assert len(lines) == 1 and "status=400" in lines[0], lines
    assert "Traceback" not in server.log() and "ClientDisconnect" not in server.log()


CHUNKED = (
    "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    "Transfer-Encoding: chunked\r\n\r\n"
)
BODY = json.dumps({"input": "Hello there.", "response_format": "pcm"}).encode()
SIZE = f"{len(BODY):x}".encode()


@pytest.mark.parametrize(
    "chunks",
    [
        b"+" + SIZE + b"\r\n" + BODY + b"\r\n0\r\n\r\n",
        b"-5\r\n" + BODY + b"\r\n0\r\n\r\n",
        b"0x" + SIZE + b"\r\n" + BODY + b"\r\n0\r\n\r\n",
        b"5\r\n" + BODY + b"\r\n0\r\n\r\n",  # a chunk longer than its size
        b"f" * 40 + b"\r\n" + BODY + b"\r\n0\r\n\r\n",
        b"zz\r\n" + BODY + b"\r\n0\r\n\r\n",
        b"2\r\n" + BODY[:2] + b"\r\n" + b"+4\r\n" + BODY[2:6] + b"\r\n0\r\n\r\n",
    ],
    ids=["plus", "negative", "0x", "longer-than-size", "huge", "not-hex", "second-chunk"],
)
def test_a_malformed_chunked_body_is_400_in_the_envelope_and_one_log_line(
    server: LiveServer, chunks: bytes
) -> None:
    mark = len(server.log())
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(CHUNKED.encode() + chunks)
        answer = read_answer(sock)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), answer[:200]
    error = json.loads(body)["error"]
    assert error["type"] == "invalid_request_error" and "chunked" in error["message"]
    lines = new_lines_until(server, mark, "POST /v1/audio/speech")
    assert len(lines) == 1 and "status=400" in lines[0], lines
    assert "Traceback" not in server.log() and "ClientDisconnect" not in server.log()


@pytest.mark.parametrize("command", ["serve", "wyoming"])
def test_a_voices_dir_that_is_a_regular_file_is_one_line_and_exit_2(
    tmp_path: Path, command: str
) -> None:
    afile = tmp_path / "voices"
    afile.write_text("not a directory")
    where = ["--port", str(free_port())] if command == "serve" else []
    if command == "wyoming":
        where = ["--uri", f"tcp://127.0.0.1:{free_port()}"]
    done = subprocess.run(
        [sys.executable, "-m", "onnx_tts.cli", command, "--voices-dir", str(afile),
         "--cache-dir", "none", *where],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line == (
        f"onnx-tts {command}: --voices-dir {afile} is not a directory; give a directory (it "
        "is created if missing)"
    )
    assert afile.read_text() == "not a directory"


def test_an_upload_to_a_read_only_voices_dir_is_a_500_naming_it(
    server: LiveServer,
) -> None:
    voices = server.log_path.parent / "voices"
    mark = len(server.log())
    with read_only(voices):
        refused = upload(server, wav(2.0))
        listed = httpx.get(server.url + "/v1/audio/voices", timeout=30)
    assert refused.status_code == 500, refused.text
    error = refused.json()["error"]
    assert error["code"] == "voice_store_read_only" and "not writable" in error["message"]
    assert listed.status_code == 200
    log = server.log()[mark:]
    assert "Traceback" not in log and log.count("cannot store voice") == 1
    assert [p for p in voices.iterdir() if p.name.startswith(".")] == []


class LimitedServer(LiveServer):
    """A server whose files may not grow past `limit` bytes (RLIMIT_FSIZE): every write past
    it fails with EFBIG, as on a full disk."""

    limit = 192 << 10

    def _command(self) -> tuple[list[str], dict[str, str] | None, Path | None]:
        start = (
            "import resource, runpy, sys; "
            f"resource.setrlimit(resource.RLIMIT_FSIZE, ({self.limit}, {self.limit})); "
            "sys.argv[0] = 'onnx_tts.server'; runpy.run_module('onnx_tts.server', "
            "run_name='__main__')"
        )
        return [sys.executable, "-c", start], None, None


def test_uploads_that_find_no_space_are_507_naming_where(tmp_path: Path) -> None:
    live = LimitedServer(tmp_path)
    try:
        # 48 s of 16-bit audio (1.5 MB): starlette spools it to the temporary directory.
        spooled = upload(live, wav(48.0))
        # 4 s: received in memory, but its stored float32 copy (256 KB) does not fit.
        stored = upload(live, wav(4.0))
        small = upload(live, wav(1.0), name="small one")
    finally:
        live.stop()
    assert spooled.status_code == 507, spooled.text
    assert spooled.json()["error"]["code"] == "insufficient_storage"
    assert "temporary directory" in spooled.json()["error"]["message"]
    assert stored.status_code == 507, stored.text
    assert "voices directory is full" in stored.json()["error"]["message"]
    assert small.status_code == 201, small.text  # what fits is stored
    assert "Traceback" not in live.log()
    assert [
        p.name for p in (tmp_path / "voices").iterdir() if not p.name.startswith("voice_")
    ] == []

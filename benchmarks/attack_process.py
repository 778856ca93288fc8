"""Round four, category "process": signals, closed standard streams, store I/O failures, cut and
malformed request bodies (issue 36).

- Every signal that ends the CLI, sent while `synth --stream -o FILE` writes its temp file or
  while a one-shot `-o FILE` synthesises: exit 128 + N with one line, no `.FILE.*.part` left,
  the existing target intact. SIGPIPE and SIGXFSZ (ignored by Python) and a SIGHUP the CLI was
  started with ignored (nohup) let it finish.
- `-o -` with stdout closed, `-` with stdin closed: one line, exit 2, nothing written anywhere.
- `serve` / `wyoming --voices-dir` naming something that is not a directory: one line, exit 2.
- An upload to a read-only voices directory, or with the temporary directory or the voices
  directory full (a real 64 KiB tmpfs as root, RLIMIT_FSIZE otherwise): a 5xx/507 in OpenAI's
  envelope naming the cause, no traceback in the log.
- A client that closes mid-body (speech JSON, voice upload), or sends a malformed chunked body:
  400 where an answer can still be sent, exactly one log line, no traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import soundfile

from benchmarks.attack_live import (
    CONFIG_STARTERS,
    CORRECT,
    HTTP_CONFIGS,
    REPO,
    SNAPSHOT_CONFIGS,
    LiveContext,
    Verdict,
    _stopping,
    add,
    envelope_problem,
    read_until_closed,
    register_probes,
    speechlike,
    status_of,
    wav_bytes,
)
from benchmarks.live_server import LiveServer, free_port
from tests.file_systems import read_only

CATEGORY = "process"
LONG_TEXT = " ".join(f"Sentence number {i} keeps the generator busy for a while." for i in
                     range(400))  # fmt: skip
ENDING = ["SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGQUIT", "SIGPROF",
          "SIGVTALRM", "SIGXCPU", "SIGIO", "SIGPWR", "SIGTRAP", "SIGABRT", "SIGSYS", "SIGRTMIN",
          "SIGRTMIN+5", "SIGRTMAX"]  # fmt: skip
SPEECH_HEAD = "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
UPLOAD_HEAD = ("POST /v1/audio/voices HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; "
               "boundary=XyZ\r\n")  # fmt: skip


def _body() -> bytes:
    return json.dumps({"input": "Hello there.", "response_format": "pcm"}).encode()


def _upload_body() -> bytes:
    clip = wav_bytes(speechlike(2.0, 16000, 401), 16000)
    return (b'--XyZ\r\nContent-Disposition: form-data; name="name"\r\n\r\nchunked voice\r\n'
            b'--XyZ\r\nContent-Disposition: form-data; name="audio_sample"; filename="v.wav"\r\n'
            b"Content-Type: audio/wav\r\n\r\n" + clip + b"\r\n--XyZ--\r\n")  # fmt: skip


def register_cases() -> None:
    """Add this category's cases (attack_round4 calls each module in a fixed order)."""
    for index, name in enumerate(ENDING):
        for stream in (True, False):
            mode = "--stream -o FILE" if stream else "one-shot -o FILE"
            add(CATEGORY, f"own-signals-{index % 2}", "signal_cli", "ok", signame=name,
                stream=stream, note=f"{name} during synth {mode}")  # fmt: skip
    for name in ("SIGPIPE", "SIGXFSZ"):
        for stream in (True, False):
            add(
                CATEGORY,
                "own-signals-0",
                "signal_cli",
                "ok",
                signame=name,
                stream=stream,
                finishes=True,
                note=f"{name} (ignored by Python): the synthesis completes",
            )
    add(
        CATEGORY,
        "own-signals-1",
        "signal_cli",
        "ok",
        signame="SIGHUP",
        stream=True,
        finishes=True,
        ignored="SIGHUP",
        note="SIGHUP under nohup (started ignored): finishes",
    )

    for argv, closed, what in [
        (["Hello.", "-o", "-", "--stream"], (1,), "-o - --stream, stdout closed"),
        (["Hello.", "-o", "-", "--stream", "--format", "wav"], (1,), "streamed wav, stdout closed"),
        (["Hello.", "-o", "-", "--format", "wav"], (1,), "a whole wav to stdout, closed"),
        (["Hello.", "-o", "-", "--format", "mp3"], (1,), "a whole mp3 to stdout, closed"),
        (["Hello.", "-o", "-", "--format", "flac"], (1,), "a whole flac to stdout, closed"),
        (["-", "-o", "{out}"], (0,), "text from stdin, stdin closed"),
        (["-", "-o", "-", "--stream"], (0,), "stdin to stdout, stdin closed"),
        (["-", "-o", "-", "--stream"], (0, 1), "stdin and stdout both closed"),
    ]:
        add(CATEGORY, "own-stdio", "closed_stdio", "error", argv=argv, closed=closed, note=what)
    add(CATEGORY, "own-stdio", "closed_stdio", "ok", argv=["Hello.", "-o", "{out}"], closed=(1,),
        note="stdout closed, -o FILE: the file is written")  # fmt: skip

    for command in ("serve", "wyoming"):
        for what in ("a regular file", "/dev/null", "a FIFO", "a link to a file",
                     "a path under a file", "a dangling link"):  # fmt: skip
            add(CATEGORY, "own-stdio", "voices_dir_arg", "error", command=command, what=what,
                note=f"{command} --voices-dir naming {what}")  # fmt: skip

    add(
        CATEGORY,
        "own-store-io",
        "store_io",
        "error",
        io="read-only voices dir",
        status=500,
        code="voice_store_read_only",
        note="upload to a read-only voices directory",
    )
    add(
        CATEGORY,
        "own-store-io",
        "store_io",
        "error",
        io="full voices dir",
        status=507,
        code="insufficient_storage",
        note="upload to a full voices directory",
    )
    add(
        CATEGORY,
        "own-store-io",
        "store_io",
        "error",
        io="full TMPDIR",
        status=507,
        code="insufficient_storage",
        note="a 1.5 MB upload with TMPDIR on a full tmpfs",
    )
    add(
        CATEGORY,
        "own-store-io",
        "store_io",
        "error",
        io="fsize spool",
        status=507,
        code="insufficient_storage",
        note="a 1.5 MB upload past RLIMIT_FSIZE (spooled)",
    )
    add(
        CATEGORY,
        "own-store-io",
        "store_io",
        "error",
        io="fsize store",
        status=507,
        code="insufficient_storage",
        note="a 4 s voice whose stored copy passes RLIMIT_FSIZE",
    )
    add(CATEGORY, "own-store-io", "store_io", "ok", io="full TMPDIR small", status=201,
        note="a small upload with TMPDIR full: decoded in memory, stored")  # fmt: skip

    body = _body()
    length = f"Content-Length: {len(body)}\r\n\r\n"
    for sent, what in [
        (SPEECH_HEAD + length, "after the speech request's headers"),
        (SPEECH_HEAD + length + body[:1].decode(), "after one byte of the JSON"),
        (SPEECH_HEAD + length + body[: len(body) // 2].decode(), "in the middle of the JSON"),
        (SPEECH_HEAD + length + body[:-1].decode(), "one byte before the end of the JSON"),
        (UPLOAD_HEAD + "Content-Length: 90000\r\n\r\n", "after an upload's headers"),
        (UPLOAD_HEAD + "Content-Length: 90000\r\n\r\n--XyZ\r\nContent-Disp",
         "in the middle of a part's headers"),
        (UPLOAD_HEAD + "Content-Length: 90000\r\n\r\n--XyZ\r\nContent-Disposition: form-data; "
         'name="audio_sample"; filename="v.wav"\r\n\r\nRIFF', "in the middle of the file"),
        (UPLOAD_HEAD + "Content-Length: 90000\r\n\r\n--XyZ\r\nContent-Disposition: form-data; "
         'name="name"\r\n\r\nx\r\n', "before the closing boundary"),
    ]:  # fmt: skip
        add(CATEGORY, "process-http", "cut_body", "error", sent=sent.encode("latin-1"),
            note=f"the client closes {what}")  # fmt: skip

    size = f"{len(body):x}"
    chunked = {
        "+": f"+{size}",
        "-5": "-5",
        "0x": f"0x{size}",
        "0X": f"0X{size}",
        "-0": "-0",
        "40 f": "f" * 40,
        "not hex": "zz",
        "a space inside": f"{size[0]} {size[1:]}",
        "empty size line": "",
    }
    for path in ("speech", "upload"):
        payload = body if path == "speech" else _upload_body()
        psize = f"{len(payload):x}"
        for what, line in chunked.items():
            line = line.replace(size, psize)
            add(CATEGORY, "process-http", "bad_chunks", "error", path=path,
                chunks=line.encode() + b"\r\n" + payload + b"\r\n0\r\n\r\n",
                note=f"{path}: chunk size {what} ({line[:24]!r})")  # fmt: skip
        add(CATEGORY, "process-http", "bad_chunks", "error", path=path,
            chunks=b"5\r\n" + payload + b"\r\n0\r\n\r\n", note=f"{path}: a chunk longer than "
            "its size")  # fmt: skip
        add(CATEGORY, "process-http", "bad_chunks", "error", path=path,
            chunks=psize.encode() + b"\r\n" + payload + b"XX0\r\n\r\n",
            note=f"{path}: no CRLF after a chunk's data")  # fmt: skip
        add(CATEGORY, "process-http", "bad_chunks", "error", path=path,
            chunks=b"2\r\n" + payload[:2] + b"\r\n+4\r\n" + payload[2:6] + b"\r\n0\r\n\r\n",
            note=f"{path}: the second chunk's size is malformed")  # fmt: skip
        add(CATEGORY, "process-http", "bad_chunks", "error", path=path, eof=True,
            chunks=psize.encode() + b"\r\n" + payload[:8],
            note=f"{path}: the connection ends inside a chunk")  # fmt: skip
        add(CATEGORY, "process-http", "bad_chunks", "ok", path=path,
            chunks=psize.encode() + b";name=value\r\n" + payload + b"\r\n0\r\n\r\n",
            note=f"{path}: a chunk extension (valid HTTP/1.1)")  # fmt: skip


# == the HTTP configuration =====================================================================
def start_http(ctx: LiveContext) -> None:
    ctx.servers.append(ctx.stack.enter_context(_stopping(LiveServer(ctx.root))))


CONFIG_STARTERS["process-http"] = start_http
HTTP_CONFIGS.add("process-http")
SNAPSHOT_CONFIGS.add("process-http")


# == signals ====================================================================================
def _signal(name: str) -> int:
    if name.startswith("SIGRTMIN+"):
        return int(signal.SIGRTMIN) + int(name.split("+")[1])
    return int(getattr(signal, name))


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _as_a_shell_starts_it(ignored: str | None, close: tuple[int, ...] = ()) -> Any:
    def start() -> None:
        os.setsid()
        # As an interactive shell starts commands, whatever the runner inherited (a runner
        # started in the background ignores SIGINT and SIGQUIT, one under nohup SIGHUP).
        for name in ENDING:
            signal.signal(_signal(name), signal.SIG_DFL)
        if ignored:
            signal.signal(_signal(ignored), signal.SIG_IGN)
        for fd in close:
            os.close(fd)

    return start


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def probe_signal_cli(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    work = ctx.root / case["id"]
    work.mkdir(parents=True)
    target = work / "out.wav"
    old = b"RIFF the user's earlier file"
    target.write_bytes(old)
    command = [sys.executable, "-m", "onnx_tts.cli", "synth", LONG_TEXT, "-o", str(target), "-q"]
    if case["stream"]:
        command.append("--stream")
    start = _as_a_shell_starts_it(case.get("ignored"))
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            env=_env(), preexec_fn=start)  # fmt: skip
    try:
        # Streaming: until the temp file exists; one-shot: until the synthesis runs.
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            if case["stream"] and any(p.name.endswith(".part") for p in work.iterdir()):
                break
            if not case["stream"] and _cpu_seconds(proc.pid) > 1.5:
                break
            time.sleep(0.02)
        if proc.poll() is not None:
            return Verdict("silently wrong", f"the CLI ended before the signal: {proc.returncode}")
        sig = _signal(case["signame"])
        proc.send_signal(sig)
        try:
            code = proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            return Verdict("runaway", "still running 600 s after the signal")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    err = proc.stderr.read().decode("utf-8", "replace")
    lines = [line for line in err.splitlines() if line.strip()]
    left = sorted(p.name for p in work.iterdir() if p.name != "out.wav")
    if "Traceback" in err:
        return Verdict("traceback", "Traceback on stderr")
    if left:
        return Verdict("data lost", f"left behind: {left} (exit {code}: {lines[-1:]})")
    if case.get("finishes"):
        if code != 0:
            return Verdict("silently wrong", f"exit {code}: {lines[:1]}")
        if soundfile.info(str(target)).duration < 10:
            return Verdict("silently wrong", "the output is not the whole text")
        return CORRECT
    if code != 128 + sig:
        return Verdict("traceback" if code else "silently wrong", f"exit {code}, want {128 + sig}")
    if target.read_bytes() != old:
        return Verdict("data lost", "the existing target changed")
    if len(lines) != 1 or not lines[0].startswith("onnx-tts: terminated by "):
        return Verdict("silently wrong", f"stderr: {lines[:2]}")
    return CORRECT


# == closed standard streams, bad --voices-dir ===================================================
def probe_closed_stdio(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    work = ctx.root / case["id"]
    work.mkdir(parents=True)
    argv = [arg.replace("{out}", str(work / "out.wav")) for arg in case["argv"]]
    closed = tuple(case["closed"])
    try:
        done = subprocess.run(
            [sys.executable, "-m", "onnx_tts.cli", "synth", *argv], cwd=work, env=_env(),
            stdin=None if 0 in closed else subprocess.DEVNULL,
            stdout=None if 1 in closed else subprocess.DEVNULL, stderr=subprocess.PIPE,
            timeout=300, preexec_fn=_as_a_shell_starts_it(None, closed),
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return Verdict("runaway", "no exit in 300 s")
    err = done.stderr.decode("utf-8", "replace")
    lines = [line for line in err.splitlines() if line.strip()]
    files = sorted(p.name for p in work.iterdir())
    if "Traceback" in err:
        return Verdict("traceback", "Traceback on stderr")
    if case["expect"] == "ok":
        if done.returncode != 0 or files != ["out.wav"]:
            return Verdict("silently wrong", f"exit {done.returncode}, files {files}")
        return CORRECT
    if done.returncode != 2 or len(lines) != 1:
        return Verdict("traceback", f"exit {done.returncode} with {len(lines)} lines")
    if files:
        return Verdict("silently wrong", f"files written: {files}")
    return Verdict("clear error")


def probe_voices_dir_arg(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    work = ctx.root / case["id"]
    work.mkdir(parents=True)
    afile = work / "afile"
    afile.write_text("precious")
    path = {
        "a regular file": afile,
        "/dev/null": Path("/dev/null"),
        "a FIFO": work / "fifo",
        "a link to a file": work / "link",
        "a path under a file": afile / "voices",
        "a dangling link": work / "dangling",
    }[case["what"]]
    if case["what"] == "a FIFO":
        os.mkfifo(path)
    elif case["what"] == "a link to a file":
        path.symlink_to(afile)
    elif case["what"] == "a dangling link":
        path.symlink_to(work / "nowhere")
    where = (["--port", str(free_port())] if case["command"] == "serve"
             else ["--uri", f"tcp://127.0.0.1:{free_port()}"])  # fmt: skip
    try:
        done = subprocess.run(
            [sys.executable, "-m", "onnx_tts.cli", case["command"], "--voices-dir", str(path),
             "--cache-dir", "none", *where],
            capture_output=True, text=True, timeout=300, env=_env(),
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return Verdict("runaway", f"{case['command']} neither served nor exited in 300 s")
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    if "Traceback" in done.stderr:
        return Verdict("traceback", "Traceback on stderr")
    if afile.read_text() != "precious":
        return Verdict("data lost", "the file named as --voices-dir changed")
    if done.returncode != 2 or len(lines) != 1:
        return Verdict("traceback", f"exit {done.returncode} with {len(lines)} lines")
    return Verdict("clear error")


# == store I/O ==================================================================================
class _LimitedServer(LiveServer):
    """A server whose files may not grow past 192 KiB (RLIMIT_FSIZE): writes past it fail
    with EFBIG, as on a full disk."""

    def _command(self) -> tuple[list[str], dict[str, str] | None, Path | None]:
        limit = 192 << 10
        start = (f"import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_FSIZE, "
                 f"({limit}, {limit})); sys.argv[0] = 'onnx_tts.server'; "
                 "runpy.run_module('onnx_tts.server', run_name='__main__')")  # fmt: skip
        return [sys.executable, "-c", start], None, None


class _TmpdirServer(LiveServer):
    """A server whose TMPDIR is `tmpdir`."""

    tmpdir = ""

    def _command(self) -> tuple[list[str], dict[str, str] | None, Path | None]:
        return [sys.executable, "-m", "onnx_tts.server"], {**os.environ,
                                                           "TMPDIR": self.tmpdir}, None  # fmt: skip


@contextlib.contextmanager
def _full_tmpfs(where: Path, fill: bool = True):
    """A 64 KiB tmpfs at `where`, filled unless told (root only); None when it cannot be
    mounted."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)],
                             capture_output=True)  # fmt: skip
    if mounted.returncode != 0:
        yield None
        return
    try:
        if fill:
            with open(where / "filler", "wb") as handle, contextlib.suppress(OSError):
                handle.write(b"\0" * (64 << 10))
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _upload(server: LiveServer, seconds: float, name: str) -> httpx.Response:
    clip = wav_bytes(speechlike(seconds, 16000, 402), 16000)
    return httpx.post(server.url + "/v1/audio/voices", files={"audio_sample": ("v.wav", clip)},
                      data={"name": name}, timeout=180)  # fmt: skip


def probe_store_io(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    work = ctx.root / case["id"]
    kind = case["io"]
    with contextlib.ExitStack() as stack:
        if kind == "read-only voices dir":
            server = stack.enter_context(_stopping(LiveServer(work)))
            stack.enter_context(read_only(work / "voices"))
            response = _upload(server, 2.0, "read only")
        elif kind == "full voices dir":
            full = stack.enter_context(_full_tmpfs(work / "full"))
            if full is None:  # not root: RLIMIT_FSIZE stands in for the full disk
                server = stack.enter_context(_stopping(_LimitedServer(work)))
                response = _upload(server, 4.0, "full voices")
            else:
                server = stack.enter_context(_stopping(LiveServer(work, "--voices-dir",
                                                                  str(full))))  # fmt: skip
                response = _upload(server, 2.0, "full voices")
        elif kind.startswith("full TMPDIR"):
            # Not filled beforehand: Python's tempfile skips a TMPDIR it cannot write at
            # first use; 64 KiB fills up while a 1.5 MB upload spools into it.
            full = stack.enter_context(_full_tmpfs(work / "tmp", fill=False))
            if full is None:
                return Verdict("correct" if case["expect"] == "ok" else "clear error",
                               "no tmpfs without root: see the RLIMIT_FSIZE cases")  # fmt: skip
            _TmpdirServer.tmpdir = str(full)
            server = stack.enter_context(_stopping(_TmpdirServer(work)))
            response = _upload(server, 48.0 if kind == "full TMPDIR" else 2.0, kind)
        else:
            server = stack.enter_context(_stopping(_LimitedServer(work)))
            response = _upload(server, 48.0 if kind == "fsize spool" else 4.0, kind)
        log = server.log()
    if "Traceback" in log:
        return Verdict("traceback", "Traceback in the server log")
    if response.status_code != case["status"]:
        return Verdict("silently wrong", f"{response.status_code}: {response.text[:120]}")
    if case["expect"] == "ok":
        return CORRECT
    problem = envelope_problem(response.content)
    if problem:
        return Verdict("silently wrong", problem)
    if response.json()["error"]["code"] != case["code"]:
        return Verdict("silently wrong", f"code {response.json()['error']['code']}")
    return Verdict("clear error")


# == cut and malformed bodies ====================================================================
def _one_line(ctx: LiveContext, mark: int, needle: str) -> Verdict | None:
    """None when exactly one log line about the request came (and no traceback)."""
    deadline = time.monotonic() + 30
    while True:
        # The runner's own /metrics and /health requests are not the case's.
        lines = [line for line in ctx.server.log()[mark:].splitlines()
                 if "GET /metrics" not in line and "GET /health" not in line]  # fmt: skip
        if any(needle in line for line in lines) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    text = "\n".join(lines)
    if "Traceback" in text or "ClientDisconnect" in text:
        return Verdict("traceback", "Traceback / ClientDisconnect in the server log")
    if len(lines) != 1:
        return Verdict("silently wrong", f"{len(lines)} log lines: {lines[:2]}")
    return None


def probe_cut_body(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    mark = len(ctx.server.log())
    with socket.create_connection(("127.0.0.1", ctx.port), timeout=30) as sock:
        sock.sendall(case["sent"])
    path = case["sent"].split(b" ", 2)[1].decode()
    return _one_line(ctx, mark, f"POST {path} status=400") or Verdict("clear error")


def probe_bad_chunks(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    mark = len(ctx.server.log())
    head = SPEECH_HEAD if case["path"] == "speech" else UPLOAD_HEAD
    with socket.create_connection(("127.0.0.1", ctx.port), timeout=30) as sock:
        sock.sendall(head.encode() + b"Transfer-Encoding: chunked\r\n\r\n" + case["chunks"])
        if case.get("eof"):
            sock.shutdown(socket.SHUT_WR)
        answer, closed = read_until_closed(sock, 60)
    status = status_of(answer)
    if case["expect"] == "ok":
        if status not in (200, 201):
            return Verdict("silently wrong", f"status {status} for a valid chunked body")
        return CORRECT
    if status is not None and status >= 500:
        return Verdict("traceback", f"{status} for a malformed body")
    if status is not None and status < 400:
        return Verdict("silently wrong", f"{status} for a malformed body")
    if not closed:
        return Verdict("runaway", "the connection stayed open")
    if status is not None:
        body = answer.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in answer else b""
        problem = envelope_problem(body)
        if problem:
            return Verdict("silently wrong", problem)
    return _one_line(ctx, mark, "status=400") or Verdict("clear error")


register_probes(globals())

"""`python -m onnx_tts.server` as its users run it: a live process on a free port, ready once
/health answers, stopped with SIGTERM. Used by the server tests and `bench serve`."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

# A bound on the wait for a server to answer, not a speed claim: a Ray cluster with two
# replicas took over 120 s to come up on 2 cores that other work kept busy.
STARTUP_SECONDS = 600
# The same for its exit after SIGTERM (a drain, or a Ray cluster shutting down); then SIGKILL.
STOP_SECONDS = 600


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerFailed(RuntimeError):
    """The server exited or never became healthy; the message holds its log."""


# `python -m MODULE ARGS` as a user's shell starts it: the signals a user sends at their default
# action. A test run started under `nohup`, or as a script's background job, passes SIGHUP,
# SIGINT or SIGQUIT on ignored, and the servers rightly keep an inherited SIG_IGN (tested on
# its own), so a live server would otherwise ignore the very signal its test sends.
AS_FROM_A_SHELL = (
    "import runpy, signal, sys; "
    "signal.signal(signal.SIGHUP, signal.SIG_DFL); "
    "signal.signal(signal.SIGQUIT, signal.SIG_DFL); "
    "signal.signal(signal.SIGINT, signal.default_int_handler); "
    "module = sys.argv.pop(1); "
    "runpy.run_module(module, run_name='__main__', alter_sys=True)"
)


class LiveServer:
    """A server whose voices, reference cache and log live in `workdir`; `extra` arguments
    come last, so they override those defaults."""

    def __init__(self, workdir: Path, *extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / f"server-{self.port}.log"
        command, env, cwd = self._command()
        command += ["--port", str(self.port)]
        command += ["--voices-dir", str(workdir / "voices"), "--cache-dir", str(workdir / "cache")]
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [*command, *extra], stdout=self._log, stderr=self._log, env=env, cwd=cwd
        )
        deadline = time.monotonic() + STARTUP_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                raise ServerFailed(f"server exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise ServerFailed(f"server did not become healthy in {STARTUP_SECONDS} s:\n{self.log()}")

    def _command(self) -> tuple[list[str], dict[str, str] | None, Path | None]:
        """The interpreter command that starts the server, its environment and directory
        (None: this process's); a subclass runs another checkout's server."""
        return [sys.executable, "-c", AS_FROM_A_SHELL, "onnx_tts.server"], None, None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


class LiveWyoming:
    """`onnx-tts wyoming` on a free loopback port, ready once it answers `describe`; stopped
    with SIGTERM. `extra` arguments come last."""

    def __init__(self, workdir: Path, *extra: str) -> None:
        self.port = free_port()
        self.uri = f"tcp://127.0.0.1:{self.port}"
        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / f"wyoming-{self.port}.log"
        command = [sys.executable, "-c", AS_FROM_A_SHELL, "onnx_tts.server.wyoming"]
        command += ["--uri", self.uri]
        command += ["--voices-dir", str(workdir / "voices"), "--cache-dir", str(workdir / "cache")]
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen([*command, *extra], stdout=self._log, stderr=self._log)
        deadline = time.monotonic() + STARTUP_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                raise ServerFailed(f"wyoming exited with {self.process.returncode}:\n{self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=2) as sock:
                    sock.sendall(b'{"type": "describe"}\n')
                    if sock.recv(64).startswith(b"{"):
                        return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise ServerFailed(f"wyoming did not answer in {STARTUP_SECONDS} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode

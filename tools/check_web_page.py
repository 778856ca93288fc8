"""Drive the server's web page in Debian's headless Chromium, as a person would use it.

Starts a live server (or uses --url), opens `/` in `chromium --headless` over the DevTools
protocol, waits for the models and voices to load, checks the speed slider spans the API's
0.25-4, speaks the text (streamed PCM played through Web Audio) with FLAC chosen for the
download, reads the downloaded file, switches the download to Opus and reads that too,
uploads a voice recording, speaks with it (WAV download), checks that the page asked no other
host for anything, and saves a screenshot.

    apt-get install -y chromium      # for this check only; CI does not run it
    python tools/check_web_page.py [--url http://127.0.0.1:8880] [--screenshot docs/web_page.png]

Exit status 0 when every step passed; otherwise one line saying which step failed.
"""

from __future__ import annotations

import argparse
import base64
import io
import itertools
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import soundfile
from websockets.sync.client import connect

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.live_server import LiveServer, free_port  # noqa: E402


class PageFailed(RuntimeError):
    pass


class DevTools:
    """A minimal DevTools-protocol session with one page target."""

    def __init__(self, socket: Any) -> None:
        self._socket = socket
        self._ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        ident = next(self._ids)
        self._socket.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self._socket.recv(timeout=60))
            if message.get("id") == ident:
                if "error" in message:
                    raise PageFailed(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def evaluate(self, expression: str) -> Any:
        """The value of `expression` (awaited when it is a promise)."""
        result = self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            thrown = details.get("exception", {}).get("description") or details.get("text")
            raise PageFailed(f"script failed: {' '.join(str(thrown).split())[:300]}")
        return result["result"].get("value")

    def wait_for(self, expression: str, what: str, seconds: float = 90) -> Any:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.2)
        status = self.evaluate("(document.getElementById('status') || {}).textContent || ''")
        raise PageFailed(f"{what}: not seen in {seconds:g} s (status: {status!r})")


def _voice_clip(path: Path) -> None:
    """A few seconds of a voiced, speech-like signal (harmonics with a moving pitch)."""
    rate = 16000
    t = np.arange(3 * rate) / rate
    pitch = 140 + 25 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    voiced = sum(np.sin(k * phase) / k for k in range(1, 12))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 3 * t) ** 2
    soundfile.write(path, (0.2 * voiced * envelope).astype(np.float32), rate)


def check(url: str, screenshot: Path, chromium: str) -> None:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="onnx-tts-page-") as tmp:
        browser = subprocess.Popen(
            [
                chromium,
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--autoplay-policy=no-user-gesture-required",
                f"--remote-debugging-port={port}",
                f"--user-data-dir={tmp}/profile",
                "--window-size=900,820",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            targets = None
            for _ in range(100):
                try:
                    targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=2).json()
                    break
                except (httpx.TransportError, ValueError):
                    time.sleep(0.2)
            pages = [t for t in targets or [] if t.get("type") == "page"]
            if not pages:
                raise PageFailed("chromium did not open a page")
            ws_url = pages[0]["webSocketDebuggerUrl"]
            with connect(ws_url, max_size=64 << 20, open_timeout=30) as socket:
                _drive(DevTools(socket), url, Path(tmp), screenshot)
        finally:
            browser.terminate()
            browser.wait(30)


# What each downloadable format's file starts with.
_MAGIC = {"wav": b"RIFF", "flac": b"fLaC", "opus": b"OggS", "mp3": b"\xff"}


def _downloaded(page: DevTools, fmt: str) -> bytes:
    """The file the download link offers once it is ready in `fmt`, checked: its name, its
    first bytes, and (but raw PCM) that libsndfile reads more than half a second of sound."""
    page.wait_for(
        "document.getElementById('download').getAttribute('aria-disabled') === 'false' && "
        f"document.getElementById('download').download === 'speech.{fmt}'",
        f"the {fmt} download",
    )
    encoded = page.evaluate(
        "fetch(document.getElementById('download').href).then(r => r.blob()).then(b => "
        "new Promise(done => { const reader = new FileReader(); "
        "reader.onload = () => done(reader.result.split(',')[1]); reader.readAsDataURL(b); }))"
    )
    data = base64.b64decode(encoded or "")
    if fmt == "pcm":
        seconds = len(data) / 2 / 24000
    else:
        magic = _MAGIC[fmt]
        if not data.startswith(magic) and not (fmt == "mp3" and data.startswith(b"ID3")):
            raise PageFailed(f"the {fmt} download starts with {data[:8]!r}, not {magic!r}")
        samples, rate = soundfile.read(io.BytesIO(data))
        if not np.abs(samples).max() > 0.01:
            raise PageFailed(f"the {fmt} download is silent")
        seconds = len(samples) / rate
    if seconds < 0.5:
        raise PageFailed(f"the {fmt} download holds {seconds:.2f} s of audio")
    print(f"download ready: speech.{fmt}, {len(data)} bytes, {seconds:.1f} s")
    return data


def _drive(page: DevTools, url: str, tmp: Path, screenshot: Path) -> None:
    for domain in ("Page", "Runtime", "Network", "Log", "DOM"):
        page.call(f"{domain}.enable")
    page.call("Page.navigate", url=url + "/")
    page.wait_for(
        "((document.getElementById('status') || {}).textContent || '') === 'Ready.'", "page ready"
    )
    print("page loaded: models and voices listed")
    speed = page.evaluate("(s => [Number(s.min), Number(s.max)])(document.getElementById('speed'))")
    if speed != [0.25, 4]:
        raise PageFailed(f"the speed slider spans {speed}, not the API's 0.25-4")
    formats = page.evaluate("[...document.getElementById('format').options].map(o => o.value)")
    if not {"wav", "mp3", "flac", "opus", "pcm"} <= set(formats):
        raise PageFailed(f"the download formats are {formats}")
    print(f"speed 0.25-4; download formats {', '.join(formats)}")

    page.evaluate("document.getElementById('format').value = 'flac'")
    page.evaluate("document.getElementById('speak').click()")
    done = page.wait_for(
        "(t => t.startsWith('Done') ? t : (t.startsWith('Error') ? t : ''))"
        "((document.getElementById('status') || {}).textContent || '')",
        "speech",
    )
    if not done.startswith("Done"):
        raise PageFailed(f"speech: {done}")
    print(f"spoke with the default voice: {done}")
    _downloaded(page, "flac")
    page.evaluate(
        "(s => { s.value = 'opus'; s.dispatchEvent(new Event('change')); })"
        "(document.getElementById('format'))"
    )
    _downloaded(page, "opus")
    page.evaluate(
        "(s => { s.value = 'wav'; s.dispatchEvent(new Event('change')); })"
        "(document.getElementById('format'))"
    )

    clip = tmp / "my-voice.wav"
    _voice_clip(clip)
    document = page.call("DOM.getDocument")
    node = page.call("DOM.querySelector", nodeId=document["root"]["nodeId"], selector="#voice-file")
    page.call("DOM.setFileInputFiles", nodeId=node["nodeId"], files=[str(clip)])
    page.evaluate(
        "document.getElementById('voice-name').value = 'page voice';"
        "document.getElementById('upload').requestSubmit()"
    )
    uploaded = page.wait_for(
        "(t => t.startsWith('Voice') || t.startsWith('Error') ? t : '')"
        "((document.getElementById('upload-status') || {}).textContent || '')",
        "voice upload",
    )
    if not uploaded.startswith("Voice"):
        raise PageFailed(f"voice upload: {uploaded}")
    print(f"uploaded a voice: {uploaded}")
    page.evaluate(
        "document.getElementById('text').value = 'This is my own voice, from the web page.';"
        "document.getElementById('status').textContent = '';"
        "document.getElementById('speak').click()"
    )
    done = page.wait_for(
        "(t => t.startsWith('Done') ? t : (t.startsWith('Error') ? t : ''))"
        "((document.getElementById('status') || {}).textContent || '')",
        "speech with the uploaded voice",
    )
    if not done.startswith("Done"):
        raise PageFailed(f"speech with the uploaded voice: {done}")
    print(f"spoke with the uploaded voice: {done}")
    _downloaded(page, "wav")

    shot = page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    screenshot.write_bytes(base64.b64decode(shot["data"]))
    print(f"screenshot: {screenshot}")

    # Drain pending events, then look for requests to other hosts and console errors.
    page.evaluate("1")
    requested = [
        e["params"]["request"]["url"]
        for e in page.events
        if e.get("method") == "Network.requestWillBeSent"
    ]
    foreign = [u for u in requested if not u.startswith((url, "blob:", "data:"))]
    if foreign:
        raise PageFailed(f"the page asked other hosts: {foreign[:3]}")
    errors = [
        e["params"]["entry"]["text"]
        for e in page.events
        if e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error"
    ]
    if errors:
        raise PageFailed(f"browser console errors: {errors[:3]}")
    print(f"{len(requested)} requests, all to {url}; no console errors")


def _png_size(data: bytes) -> tuple[int, int]:
    with io.BytesIO(data) as f:
        f.seek(16)
        return int.from_bytes(f.read(4), "big"), int.from_bytes(f.read(4), "big")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running server (default: start one)")
    parser.add_argument("--screenshot", type=Path, default=ROOT / "docs" / "web_page.png")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    args = parser.parse_args(argv)
    if not shutil.which(args.chromium):
        print("check_web_page: chromium not found; apt-get install -y chromium", file=sys.stderr)
        return 2
    live = None
    try:
        if args.url:
            url = args.url.rstrip("/")
        else:
            live = LiveServer(Path(tempfile.mkdtemp(prefix="onnx-tts-page-server-")))
            url = live.url
        check(url, args.screenshot, args.chromium)
    except PageFailed as error:
        print(f"check_web_page: FAILED: {error}", file=sys.stderr)
        return 1
    finally:
        if live is not None:
            live.stop()
    width, height = _png_size(args.screenshot.read_bytes())
    print(f"OK ({width}x{height} screenshot)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Issue 36: cache entries that are not regular files. A FIFO in the disk tier hung the request
and then SIGTERM; a link to /dev/zero or a 6 GiB sparse file was read into memory (MemoryError).
Now an entry is read only when it is a regular file reached through the cache's own
directories, judged by its size before it is read: anything else is refused unread, dropped and
counted, and the request goes on as a miss. Driven through the real CLI (a subprocess under a
4 GiB address-space limit, so reading 6 GiB would fail) and a live server."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile

from benchmarks.live_server import LiveServer
from onnx_tts.cache.codec import decode_value

MEMORY_LIMIT = 4 << 30


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def synth(cache: Path, voice: Path, out: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "onnx_tts.cli", "synth", "Hello there.", "--voice",
               str(voice), "--cache-dir", str(cache), "-o", str(out)]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=600, preexec_fn=_limited)


def make_hostile(entry: Path, kind: str, outside: Path) -> None:
    entry.unlink()
    if kind == "fifo":
        os.mkfifo(entry)  # nobody writes: opening it for reading would wait forever
    elif kind == "link_to_dev_zero":
        entry.symlink_to("/dev/zero")
    elif kind == "sparse_6_gib":
        with open(entry, "wb") as handle:
            handle.truncate(6 << 30)
    elif kind == "link_outside":
        entry.symlink_to(outside / "elsewhere.otc")
    elif kind == "directory":
        entry.mkdir()


@pytest.mark.parametrize(
    "kind", ["fifo", "link_to_dev_zero", "sparse_6_gib", "link_outside", "directory"]
)
def test_an_entry_that_is_not_a_regular_file_is_refused_unread(
    tmp_path: Path, voice_wav: Path, kind: str
) -> None:
    cache = tmp_path / "cache"
    clean = synth(cache, voice_wav, tmp_path / "a.wav")
    assert clean.returncode == 0, clean.stderr
    (entry,) = cache.glob("*/*.otc")
    good = entry.read_bytes()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "elsewhere.otc").write_bytes(good)  # a valid entry, but not in the cache
    make_hostile(entry, kind, outside)

    run = synth(cache, voice_wav, tmp_path / "b.wav")
    assert run.returncode == 0, run.stderr
    lines = run.stderr.splitlines()
    if kind == "directory":  # never removed (not the cache's to delete): computed, not stored
        assert entry.is_dir() and lines[-1].startswith("wrote ")
    else:
        what = {"fifo": "a FIFO", "sparse_6_gib": "6442450944 bytes long"}.get(
            kind, "a symbolic link"
        )
        assert len(lines) == 2 and lines[0].startswith("onnx-tts: warning: reference cache: ")
        assert f"refused unread: {what}" in lines[0] and lines[1].startswith("wrote ")
        # Dropped and recomputed: a valid regular file again.
        assert entry.is_file() and not entry.is_symlink()
        assert decode_value(entry.read_bytes(), entry.stem).keys() == decode_value(good).keys()
    first, _ = soundfile.read(tmp_path / "a.wav")
    second, _ = soundfile.read(tmp_path / "b.wav")
    assert np.array_equal(first, second)
    assert (outside / "elsewhere.otc").read_bytes() == good  # the link's target untouched


def test_a_subdirectory_linked_out_of_the_cache_is_never_read_written_or_cleared(
    tmp_path: Path, voice_wav: Path
) -> None:
    cache = tmp_path / "cache"
    assert synth(cache, voice_wav, tmp_path / "a.wav").returncode == 0
    (entry,) = cache.glob("*/*.otc")
    sub = entry.parent
    outside = tmp_path / "outside"
    sub.rename(outside)  # the entry now lives outside, reached through a link
    sub.symlink_to(outside, target_is_directory=True)
    before = {p.name: p.read_bytes() for p in outside.iterdir()}

    run = synth(cache, voice_wav, tmp_path / "b.wav")
    assert run.returncode == 0, run.stderr
    assert "not a directory" in run.stderr  # refused as a bad entry, and not written to
    cleared = subprocess.run(
        [sys.executable, "-m", "onnx_tts.cli", "cache", "clear", "--cache-dir", str(cache),
         "--tier", "reference"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert cleared.returncode == 0, cleared.stderr
    assert {p.name: p.read_bytes() for p in outside.iterdir()} == before


def test_a_fifo_in_the_servers_cache_neither_hangs_a_request_nor_sigterm(
    tmp_path: Path, voice_wav: Path
) -> None:
    live = LiveServer(tmp_path)
    try:
        upload = httpx.post(
            live.url + "/v1/audio/voices",
            files={"audio_sample": ("v.wav", voice_wav.read_bytes(), "audio/wav")},
            data={"name": "fifo test"},
            timeout=60,
        )
        assert upload.status_code == 201, upload.text
        (entry,) = (tmp_path / "cache").glob("*/*.otc")
        entry.unlink()
        os.mkfifo(entry)
        # A fresh process (memory tier empty) reads the disk tier: restart the server.
        live.stop()
        live = LiveServer(tmp_path)
        body = {"input": "Hello.", "voice": upload.json()["id"], "response_format": "pcm"}
        spoken = httpx.post(live.url + "/v1/audio/speech", json=body, timeout=120)
        assert spoken.status_code == 200 and len(spoken.content) > 1000
        metrics = httpx.get(live.url + "/metrics", timeout=30).text
        assert 'onnx_tts_cache_rejected_total{cache="reference",model="onnx-tts-voice",' \
               'tier="disk"} 1.0' in metrics  # fmt: skip
        live.process.send_signal(signal.SIGTERM)
        assert live.process.wait(120) == 0
    finally:
        live.stop()
    assert "Traceback" not in live.log()

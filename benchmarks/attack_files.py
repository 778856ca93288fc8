"""Round four, category "cache-files": cache entries that are not regular files (issue 36).

The reference cache (`--cache-dir`) and the result cache (`--result-cache-dir`) of the real CLI
are seeded by one clean run; then the entry (or its subdirectory) is replaced by a FIFO (an open
that blocks forever), a link to /dev/zero or /dev/urandom (a read that never ends), a link out
of the cache, a dangling link or a link loop, a 6 GiB or 3 GiB sparse file (a MemoryError),
a directory, a socket, a file the user cannot read. The second run, under a 4 GiB address-space
limit, must finish with the clean run's audio and at most one warning line, leave whatever the
links point at untouched, and `cache stats` / `cache clear` must neither hang nor reach out of
the directory.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import soundfile

from benchmarks.attack_live import (
    CORRECT,
    REPO,
    LiveContext,
    Verdict,
    add,
    register_probes,
    speechlike,
)

CATEGORY = "cache-files"
MEMORY_LIMIT = 4 << 30
KINDS = [
    "fifo",
    "link_to_dev_zero",
    "link_to_dev_urandom",
    "link_out_of_the_cache",
    "dangling_link",
    "link_loop",
    "sparse_6_gib",
    "sparse_3_gib",
    "directory",
    "socket",
    "unreadable",
    "hard_link_from_outside",
    "subdirectory_linked_out",
    "subdirectory_is_a_file",
    "fifo_named_like_a_temp_file",
]


def register_cases() -> None:
    for tier in ("reference", "result"):
        for kind in KINDS:
            add(CATEGORY, f"own-files-{tier}", "cache_entry", "ok", tier=tier, hostile=kind,
                note=f"{tier} cache entry: {kind.replace('_', ' ')}")  # fmt: skip
    for command in ("stats", "clear"):
        for kind in ("fifo", "sparse_6_gib", "link_out_of_the_cache", "subdirectory_linked_out"):
            note = f"cache {command} beside a {kind.replace('_', ' ')}"
            add(CATEGORY, "own-files-reference", "cache_command", "ok", command=command,
                hostile=kind, note=note)  # fmt: skip


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    os.setsid()


def run_cli(argv: list[str], cwd: Path, timeout: float = 300) -> tuple[int | None, str]:
    """(exit code or None on timeout, stderr) of `python -m onnx_tts.cli ARGV`."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "onnx_tts.cli", *argv], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=_limited)  # fmt: skip
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None, ""
    return proc.returncode, err.decode("utf-8", "replace")


def _synth_args(tier: str, cache: Path, voice: Path, out: Path) -> list[str]:
    if tier == "reference":
        return ["synth", "Hello there.", "--voice", str(voice), "--cache-dir", str(cache),
                "-o", str(out)]  # fmt: skip
    return ["synth", "Hello there.", "--seed", "1", "--cache-dir", "none", "--result-cache-dir",
            str(cache), "-o", str(out)]  # fmt: skip


def make_hostile(entry: Path, kind: str, outside: Path) -> None:
    """Replace `entry` (a cache file) as `kind` says; `outside` is a directory out of the
    cache whose contents must survive."""
    good = entry.read_bytes()
    (outside / "elsewhere.otc").write_bytes(good)
    if kind == "subdirectory_linked_out":
        sub = entry.parent
        moved = outside / "sub"
        shutil.move(str(sub), moved)
        sub.symlink_to(moved, target_is_directory=True)
        return
    if kind == "subdirectory_is_a_file":
        shutil.rmtree(entry.parent)
        entry.parent.write_bytes(b"a file where a directory was")
        return
    if kind == "fifo_named_like_a_temp_file":
        os.mkfifo(entry.parent / ".tmp-deadbeef")
        entry.unlink()
        return
    if kind == "unreadable":
        entry.chmod(0)
        return
    entry.unlink()
    if kind == "fifo":
        os.mkfifo(entry)
    elif kind in ("link_to_dev_zero", "link_to_dev_urandom"):
        entry.symlink_to("/dev/zero" if kind == "link_to_dev_zero" else "/dev/urandom")
    elif kind == "link_out_of_the_cache":
        entry.symlink_to(outside / "elsewhere.otc")
    elif kind == "dangling_link":
        entry.symlink_to(outside / "nothing-here")
    elif kind == "link_loop":
        entry.symlink_to(entry)
    elif kind in ("sparse_6_gib", "sparse_3_gib"):
        with open(entry, "wb") as handle:
            handle.truncate((6 if kind == "sparse_6_gib" else 3) << 30)
    elif kind == "directory":
        entry.mkdir()
    elif kind == "socket":
        # Bound at a short path (sockets' paths are limited to 107 bytes), then moved in.
        short = Path(tempfile.mkdtemp(prefix="s", dir="/tmp")) / "s"
        with socket.socket(socket.AF_UNIX) as server:
            server.bind(str(short))
        shutil.move(str(short), entry)
        short.parent.rmdir()
    elif kind == "hard_link_from_outside":
        os.link(outside / "elsewhere.otc", entry)  # a regular file holding a valid entry
    else:
        raise KeyError(kind)


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and not p.is_symlink()}  # fmt: skip


def _prepare(ctx: LiveContext, case: dict[str, Any]) -> tuple[Path, Path, Path, Verdict | None]:
    work = ctx.root / case["id"]
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    voice = work / "voice.wav"
    soundfile.write(str(voice), speechlike(3.0, 24000, 7), 24000)
    cache, outside = work / "cache", work / "outside"
    outside.mkdir()
    code, err = run_cli(_synth_args(case.get("tier", "reference"), cache, voice,
                                    work / "a.wav"), work)  # fmt: skip
    if code != 0:
        return work, cache, outside, Verdict("traceback", f"clean run: exit {code}: {err[-200:]}")
    entries = list(cache.glob("*/*.otc"))
    if len(entries) != 1:
        return work, cache, outside, Verdict("silently wrong", f"{len(entries)} entries seeded")
    make_hostile(entries[0], case["hostile"], outside)
    return work, cache, outside, None


def _cli_verdict(code: int | None, err: str) -> Verdict | None:
    if code is None:
        return Verdict("runaway", "the CLI did not finish in 300 s")
    if "Traceback" in err:
        return Verdict("traceback", "Traceback on stderr")
    if "MemoryError" in err or code == -signal.SIGKILL:
        return Verdict("runaway", "memory limit")
    if code != 0:
        return Verdict("traceback", f"exit {code}: {err.strip()[-150:]}")
    return None


def probe_cache_entry(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    work, cache, outside, failed = _prepare(ctx, case)
    if failed:
        return failed
    before = _snapshot(outside)
    voice = work / "voice.wav"
    code, err = run_cli(_synth_args(case["tier"], cache, voice, work / "b.wav"), work)
    verdict = _cli_verdict(code, err)
    if verdict:
        return verdict
    lines = [line for line in err.splitlines() if line.strip()]
    warnings = [line for line in lines if line.startswith("onnx-tts: warning: ")]
    if len(lines) - len(warnings) != 1 or not lines[-1].startswith("wrote "):
        return Verdict("silently wrong", f"stderr: {lines[:3]}")
    first, _ = soundfile.read(str(work / "a.wav"))
    second, _ = soundfile.read(str(work / "b.wav"))
    if first.shape != second.shape or not np.array_equal(first, second):
        return Verdict("silently wrong", "not the clean run's audio")
    if _snapshot(outside) != before:
        return Verdict("data lost", "a file out of the cache changed")
    shutil.rmtree(work, ignore_errors=True)
    return CORRECT


def probe_cache_command(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    work, cache, outside, failed = _prepare(ctx, case)
    if failed:
        return failed
    before = _snapshot(outside)
    argv = ["cache", case["command"], "--cache-dir", str(cache)]
    if case["command"] == "clear":
        argv += ["--tier", "reference"]
    code, err = run_cli(argv, work)
    verdict = _cli_verdict(code, err)
    if verdict:
        return verdict
    if _snapshot(outside) != before:
        return Verdict("data lost", f"cache {case['command']} reached out of the cache")
    shutil.rmtree(work, ignore_errors=True)
    return CORRECT


register_probes(globals())

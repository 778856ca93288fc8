"""Attack runner: every hostile case of benchmarks/attack_cases.py (CLI and API) and of
benchmarks/attack_live.py (live HTTP and Wyoming servers, the web page, the staged pipeline).

Each CLI/API/pipeline case runs in its own subprocess (CLI: `python -m onnx_tts.cli`; API and
pipeline: this file with --api-case / --pipeline-case) under a timeout and an address-space
limit, in a fresh directory; live cases run against servers started once per configuration
(one after another within a configuration). Each outcome is exactly one of:

  correct       as expected (ok with finite audio in [-1, 1], or the expected quiet/signal exit)
  clear error   exit 2 with one stderr line and no output file; for servers the promised 4xx
                in OpenAI's envelope, a Wyoming error event, or a closed connection
  silently wrong exit 0 / 2xx but wrong: bad audio, an error was expected, a wrong status
  traceback     exit 1 / other codes, "Traceback" on stderr or in a server log, a 5xx for a
                client's mistake, or several lines for an error
  runaway       timeout or memory limit; a generation still running after its client left
  data lost     an existing file, voice or cache entry damaged or removed, a temp file left

    python benchmarks/attack.py [--jobs 2] [--category text] [--ids text-000,bundle-300]

Writes benchmarks/results/attack.json and prints the totals per category.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import soundfile

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.attack_cases import CASES  # noqa: E402
from benchmarks.attack_live import LIVE_CASES  # noqa: E402
from benchmarks.attack_round4 import ROUND_FOUR  # noqa: E402, F401 (adds its categories)
from benchmarks.attack_round5 import ROUND_FIVE  # noqa: E402, F401 (adds its categories)
from benchmarks.results_io import write_json  # noqa: E402

MODELS = REPO / "onnx_tts" / "models"
GOOD_VOICE_SOURCE = REPO / "tests" / "data" / "heldout_voice_joe_x0.92.flac"
RESULTS = REPO / "benchmarks" / "results" / "attack.json"
OUTCOMES = ("correct", "clear error", "silently wrong", "traceback", "runaway", "data lost")
TIMEOUT_SECONDS = 120
MEMORY_LIMIT_BYTES = 6 << 30
AS_ROOT = os.geteuid() == 0
# Setups whose hostility is a permission bit: root reads and writes through it.
PERMISSION_SETUPS = {"unreadable", "read-only dir"}
SIGNALS = {"SIGTERM": signal.SIGTERM, "SIGHUP": signal.SIGHUP, "SIGINT": signal.SIGINT}
FULL_FS_BYTES = 64 * 1024
OUTSIDE_VOCODER = "/tmp/other_vocoder.onnx"  # the path the bundle case names
DECOY = b"root:x:0:0:decoy:/root:/bin/bash\n"  # what a cache entry links to (never the real file)


@dataclass
class Run:
    code: int | None  # None: timed out
    stdout: bytes
    stderr: str


@dataclass
class Verdict:
    outcome: str
    why: str = ""
    runs: list[Run] = field(default_factory=list)


# -- fixtures ---------------------------------------------------------------------------------
def _write_wav(path: Path, samples: np.ndarray, rate: int, subtype: str = "PCM_16") -> Path:
    soundfile.write(str(path), samples, rate, subtype=subtype, format="WAV")
    return path


def good_voice_samples() -> tuple[np.ndarray, int]:
    audio, rate = soundfile.read(str(GOOD_VOICE_SOURCE), dtype="float32", always_2d=True)
    audio = audio.mean(axis=1)[: 3 * rate]
    return (audio / max(1e-6, float(np.abs(audio).max())) * 0.5).astype(np.float32), rate


def make_voice(setup: str, directory: Path, root: Path) -> Path:
    """The hostile reference file named by a SETUP of attack_cases."""
    good, rate = good_voice_samples()
    path = directory / "voice.wav"
    rng = np.random.default_rng(0)
    if setup.startswith("float_wav_"):
        audio = good.copy()
        if setup == "float_wav_peak_20":
            audio *= 40.0
        else:
            audio[rate] = {"float_wav_1e30": 1e30, "float_wav_nan": np.nan}.get(setup, np.inf)
        return _write_wav(path, audio, rate, "FLOAT")
    if setup == "wav_truncated":
        _write_wav(path, good, rate)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif setup == "wav_header_only":
        _write_wav(path, good, rate)
        path.write_bytes(path.read_bytes()[:44])
    elif setup == "wav_1hz":
        _write_wav(path, np.array([0.1, -0.1, 0.1], np.float32), 1)
    elif setup == "wav_4hz":
        _write_wav(path, rng.uniform(-0.5, 0.5, 12).astype(np.float32), 4)
    elif setup == "wav_500khz":
        _write_wav(path, rng.uniform(-0.5, 0.5, 250_000).astype(np.float32), 500_000)
    elif setup == "wav_3_samples":
        _write_wav(path, np.array([0.1, -0.1, 0.1], np.float32), 24000)
    elif setup == "wav_silent":
        _write_wav(path, np.zeros(3 * 24000, np.float32), 24000)
    elif setup == "wav_dc":
        _write_wav(path, np.full(3 * 24000, 0.5, np.float32), 24000)
    elif setup == "wav_70ch":
        _write_wav(path, rng.uniform(-0.5, 0.5, (12000, 70)).astype(np.float32), 24000)
    elif setup == "wav_2h":
        # Header of a 2 h 16-bit 8 kHz file; the data is a sparse hole (silence) except noise
        # in the first 3 s, so the file costs no disk.
        frames = 2 * 3600 * 8000
        noise = (rng.uniform(-0.5, 0.5, 3 * 8000) * 32767).astype("<i2")
        header = b"RIFF" + struct.pack("<I", 36 + 2 * frames) + b"WAVE"
        header += b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, 8000, 16000, 2, 16)
        header += b"data" + struct.pack("<I", 2 * frames)
        with open(path, "wb") as handle:
            handle.write(header + noise.tobytes())
            handle.truncate(len(header) + 2 * frames)
    elif setup == "text_as_wav":
        path.write_text("this is not audio\n" * 100)
    elif setup == "empty_file":
        path.write_bytes(b"")
    elif setup == "directory":
        path.mkdir()
    elif setup == "fifo":
        os.mkfifo(path)
    elif setup in ("flac_good", "ogg_good", "mp3_good"):
        kind = setup.split("_")[0]
        path = directory / f"voice.{kind}"
        soundfile.write(str(path), good, rate, format=kind.upper())
    elif setup == "unreadable":
        _write_wav(path, good, rate)
        path.chmod(0)
    elif setup == "wav_riff_size_lie":
        _write_wav(path, good, rate)
        data = bytearray(path.read_bytes())
        data[4:8] = struct.pack("<I", 0xFFFFFFF0)
        path.write_bytes(bytes(data))
    elif setup == "wav_data_size_ffffffff":
        _write_wav(path, good, rate)
        data = bytearray(path.read_bytes())
        at = data.index(b"data")
        data[at + 4 : at + 8] = struct.pack("<I", 0xFFFFFFFF)
        path.write_bytes(bytes(data))
    elif setup == "wav_chunk_loop":
        _write_wav(path, good, rate)
        data = path.read_bytes()
        junk = b"".join(b"junk" + struct.pack("<I", 2) + b"\0\0" for _ in range(1000))
        body = data[12:]
        path.write_bytes(
            b"RIFF" + struct.pack("<I", 4 + len(junk) + len(body)) + b"WAVE" + junk + body
        )
    else:
        raise KeyError(f"unknown voice setup {setup!r}")
    return path


def tamper_bundle(change: dict[str, Any], source: Path, target: Path) -> Path:
    """A copy of `source` with one hostile change to bundle.json (dotted keys; None deletes)."""
    shutil.copytree(source, target)
    manifest_path = target / "bundle.json"
    manifest = json.loads(manifest_path.read_text())
    ((key, value),) = change.items()
    if key == "__json__":
        manifest_path.write_text(value)
        return target
    if key == "__size__":
        with open(manifest_path, "ab") as handle:
            handle.truncate(value)  # valid JSON followed by a sparse hole of NUL bytes
        return target
    if key == "__symlink__":
        name, link = (part.strip() for part in value.split("->"))
        (target / name).unlink()
        (target / name).symlink_to(link)
        return target
    if key == "graphs.vocoder" and value == OUTSIDE_VOCODER:
        shutil.copy(source / "vocoder.onnx", value)  # a real graph outside the bundle
    if key == "default_speaker_embedding":
        value = [float("nan")] * 64
    parts = key.split(".")
    if parts[0] == "sha256" and len(parts) == 2:
        parts[1] = manifest["graphs"][parts[1]]  # the hash is keyed by file name
    node = manifest
    for part in parts[:-1]:
        node = node[part]
    if value is None:
        node.pop(parts[-1], None)
    else:
        node[parts[-1]] = value
    manifest_path.write_text(json.dumps(manifest, indent=1))
    return target


# -- reference cache tampering -----------------------------------------------------------------
_MAGIC = b"OTTSRC1\n"


def _blob(
    header: dict[str, Any] | bytes, payload: bytes = b"", header_len: int | None = None
) -> bytes:
    header_bytes = header if isinstance(header, bytes) else json.dumps(header).encode()
    out = bytearray(_MAGIC)
    out += struct.pack("<I", len(header_bytes) if header_len is None else header_len)
    out += header_bytes
    out += b"\0" * ((-len(out)) % 64)
    out += payload
    return bytes(out + hashlib.sha256(out).digest())


def tampered_blob(tamper: str, blob: bytes, key: str) -> bytes:
    from onnx_tts.cache.codec import decode_value, encode_value

    arrays = {name: np.array(value) for name, value in decode_value(blob, key).items()}
    first = next(name for name, value in arrays.items() if value.dtype.kind == "f")
    one = {"name": first, "dtype": "<f4", "shape": [1]}
    payload = np.zeros(16, "<f4").tobytes()
    if tamper in ("nan_values", "inf_values"):
        arrays[first] = np.full_like(arrays[first], np.nan if tamper == "nan_values" else np.inf)
        return encode_value(key, arrays)
    # Checksum-valid values that are not this encoder's output (issue 30).
    if tamper == "values_1e30":
        return encode_value(key, {**arrays, first: np.full_like(arrays[first], 1e30)})
    if tamper == "mis_shaped":
        flat = arrays[first].reshape(-1)
        return encode_value(key, {**arrays, first: flat[: max(1, flat.size // 2)]})
    if tamper == "big_endian":
        value = arrays[first].astype(">f4")
        spec = {"name": first, "dtype": ">f4", "shape": list(value.shape)}
        return _blob({"format": 1, "key": key, "arrays": [spec]}, value.tobytes())
    headers = {
        "shape_2^32x2^32": [{**one, "shape": [2**32, 2**32]}],
        "no_arrays": [],
        "object_dtype": [{**one, "dtype": "|O"}],
        "unicode_dtype": [{**one, "dtype": "<U4"}],
        "float_shape": [{**one, "shape": [1.5]}],
        "negative_shape": [{**one, "shape": [-1]}],
        "ndim_9": [{**one, "shape": [1] * 9}],
        "duplicate_names": [one, one],
    }
    if tamper in headers:
        return _blob({"format": 1, "key": key, "arrays": headers[tamper]}, payload)
    if tamper == "bad_checksum":
        return blob[:-1] + bytes([blob[-1] ^ 0xFF])
    if tamper == "truncated":
        return blob[: len(blob) // 2]
    if tamper == "zero_bytes":
        return b""
    if tamper == "wrong_key_inside":
        return encode_value("0" * 64, arrays)
    if tamper == "huge_header_length":
        return _blob({"format": 1, "key": key, "arrays": [one]}, payload, header_len=0xFFFFFFFF)
    raise KeyError(tamper)


def tamper_disk_cache(tamper: str, seed_dir: Path, cache: Path) -> Path:
    shutil.copytree(seed_dir, cache)
    (entry,) = cache.glob("*/*.otc")
    key = entry.stem
    if tamper == "directory_instead_of_file":
        entry.unlink()
        entry.mkdir()
    elif tamper == "symlink_to_etc_passwd":
        # A decoy with passwd's look: a runner as root must never aim a writer at the real one.
        decoy = cache.parent / "decoy-passwd"
        decoy.write_bytes(DECOY)
        entry.unlink()
        entry.symlink_to(decoy)
    elif tamper == "unreadable_mode_000":
        entry.chmod(0)
    else:
        entry.write_bytes(tampered_blob(tamper, entry.read_bytes(), key))
    return entry


def tamper_redis(tamper: str, url: str, seed_blob: bytes, key: str, namespace: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    client.flushdb()
    rkey = f"{namespace}:refcache:{key}"
    if tamper == "directory_instead_of_file":
        client.hset(rkey, "a", "b")  # wrong type: every GET fails with WRONGTYPE
    elif tamper == "symlink_to_etc_passwd":
        client.set(rkey, Path("/etc/passwd").read_bytes())
    elif tamper == "unreadable_mode_000":
        client.set(rkey, b"\0" * 7)
    else:
        client.set(rkey, tampered_blob(tamper, seed_blob, key))
    client.close()


# -- running ----------------------------------------------------------------------------------
@dataclass
class World:
    root: Path
    voice: Path
    R: Path
    V: Path
    env: dict[str, str]
    redis: str | None
    seed_caches: dict[str, Path]  # model argv value ("" = default) -> seeded cache dir
    redis_seed: tuple[bytes, str, str] | None  # blob, key, namespace
    full_fs: Path | None
    lock: threading.Lock = field(default_factory=threading.Lock)


def _limits(umask: int | None, fsize: int | None = None):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        if umask is not None:
            os.umask(umask)
        # A runner started in the background inherits SIGINT and SIGQUIT ignored, one under
        # nohup SIGHUP too; a user's interactive shell starts commands with them at default.
        from onnx_tts.signals import terminating_signals

        for sig in terminating_signals():
            signal.signal(sig, signal.SIG_DFL)
        os.setsid()

    return apply


def substitute(value: str, places: dict[str, str]) -> str:
    for name, replacement in places.items():
        value = value.replace("{" + name + "}", replacement)
    return value


def run_process(
    argv: list[Any],
    env: dict[str, str],
    cwd: Path,
    *,
    stdin: bytes | None = None,
    stdout: Any = "capture",
    umask: int | None = None,
    timeout: float = TIMEOUT_SECONDS,
    send: signal.Signals | None = None,
    after_seconds: float = 0.0,
) -> Run:
    out_target: Any = subprocess.PIPE
    closer = None
    if stdout == "/dev/full":
        closer = out_target = open("/dev/full", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=out_target,
        stderr=subprocess.PIPE,
        env=env,
        cwd=cwd,
        preexec_fn=_limits(umask),
    )
    collected = {"out": b"", "err": b""}

    def pump_err() -> None:
        collected["err"] = proc.stderr.read()

    def pump_out() -> None:
        if stdout == "pipe closed after 100 bytes":
            collected["out"] = proc.stdout.read(100)
            proc.stdout.close()
        else:
            collected["out"] = proc.stdout.read()

    threads = [threading.Thread(target=pump_err, daemon=True)]
    if out_target is subprocess.PIPE:
        threads.append(threading.Thread(target=pump_out, daemon=True))
    for thread in threads:
        thread.start()
    with contextlib.suppress(BrokenPipeError, OSError):
        proc.stdin.write(stdin or b"")
        proc.stdin.close()
    code: int | None
    try:
        if send is not None:
            time.sleep(after_seconds)
            proc.send_signal(send)
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        code = None
    for thread in threads:
        thread.join(timeout=10)
    if closer is not None:
        closer.close()
    return Run(code, collected["out"], collected["err"].decode("utf-8", "replace"))


def _exists(path: Path) -> bool:
    try:
        return path.exists() or path.is_symlink()
    except OSError:  # e.g. a name too long to exist
        return False


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def leftovers(directory: Path) -> list[str]:
    """Temp files a run must never leave behind."""
    found = []
    for path in directory.rglob("*"):
        name = path.name
        if name.endswith(".part") or name.startswith((".tmp", "tmp")) or ".tmp" in name:
            found.append(str(path.relative_to(directory)))
    return found


def check_audio(path: Path) -> str:
    """'' when `path` holds finite audio in [-1, 1]; else what is wrong."""
    try:
        audio, _ = soundfile.read(str(path), dtype="float32", always_2d=True)
    except Exception as error:
        return f"output unreadable: {error}"
    if not np.isfinite(audio).all():
        return "output holds non-finite samples"
    if audio.size and float(np.abs(audio).max()) > 1.0:
        return "output exceeds [-1, 1]"
    if audio.size == 0:
        return "output is empty"
    return ""


def classify(case: dict[str, Any], run: Run, out: Path | None, expect: str) -> Verdict:
    """Outcome of one run against the case's expectation (output files checked by caller)."""
    if run.code is None:
        return Verdict("runaway", "timed out")
    text = run.stderr
    if "MemoryError" in text or "bad_alloc" in text or run.code == -signal.SIGKILL:
        return Verdict("runaway", "memory limit")
    lines = [
        line
        for line in error_lines(text)
        if "warning:" not in line and not line.startswith("wrote ")
    ]
    warned = any("warning:" in line for line in error_lines(text))
    if "Traceback" in text:
        return Verdict("traceback", "Traceback on stderr")
    if expect == "signal":
        wanted = 128 + int(SIGNALS[case["send"]])
        if run.code in (wanted, -int(SIGNALS[case["send"]])):
            return Verdict("correct")
        if run.code == 0:
            return Verdict("correct", "finished before the signal")
        return Verdict("traceback", f"exit {run.code} after {case['send']}")
    if run.code == 2:
        if len(lines) != 1:
            return Verdict("traceback", f"exit 2 with {len(lines)} stderr lines")
        if out is not None and _exists(out) and not case.get("_out_existed"):
            return Verdict("silently wrong", "error but an output file was left")
        return Verdict("clear error")
    if run.code != 0:
        return Verdict("traceback", f"exit {run.code}")
    # exit 0
    if expect == "error":
        return Verdict("silently wrong", "exit 0 where an error was expected")
    if lines and expect in ("ok", "quiet"):
        return Verdict("silently wrong", f"exit 0 with stderr {lines[0][:100]!r}")
    if expect == "ok-warn" and not warned:
        return Verdict("silently wrong", "no warning about unspeakable text")
    return Verdict("correct")


def expectation(case: dict[str, Any]) -> str:
    if AS_ROOT and case.get("setup") in PERMISSION_SETUPS:
        return "ok"  # root reads and writes through permission bits
    if AS_ROOT and "{dir}/ro/" in " ".join(map(str, case.get("argv", []))):
        return "ok"
    return case["expect"]


def run_case(case: dict[str, Any], world: World) -> dict[str, Any]:
    directory = world.root / "cases" / case["id"]
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    directory.chmod(0o755)
    started = time.perf_counter()
    try:
        if case["kind"] == "api":
            verdict = run_api_case(case, world, directory)
        else:
            verdict = run_cli_case(case, world, directory)
    except Exception:
        verdict = Verdict("traceback", "RUNNER: " + traceback.format_exc().splitlines()[-1])
    last = verdict.runs[-1] if verdict.runs else Run(None, b"", "")
    lines = error_lines(last.stderr)
    first_line = next((line for line in lines if "warning:" not in line), lines[0] if lines else "")
    expect = expectation(case)
    correct_error = verdict.outcome == "clear error" and expect == "error"
    if correct_error and case.get("match") and case["match"].lower() not in first_line.lower():
        mismatch = f"error line lacks {case['match']!r}"
    else:
        mismatch = ""
    return {
        "id": case["id"],
        "category": case["category"],
        "expect": expect,
        "outcome": verdict.outcome,
        "as_expected": verdict.outcome == "correct" or correct_error,
        "why": verdict.why or mismatch,
        "exit_code": last.code,
        "stderr_first_line": first_line[:300],
        "seconds": round(time.perf_counter() - started, 2),
    }


def _placeholders(case: dict[str, Any], world: World, directory: Path) -> dict[str, str]:
    places = {
        "out": str(directory / "out.wav"),
        "dir": str(directory),
        "voice": str(world.voice),
        "R": str(world.R),
        "V": str(world.V),
        "redis": world.redis or "redis://127.0.0.1:1/0",
        "full_fs": str(world.full_fs or directory / "no-full-fs"),
    }
    setup = case.get("setup")
    if setup in ("fifo",) or (setup and case["category"] == "voice"):
        voice = make_voice(setup, directory, world.root)
        places["bad_voice"] = places["fifo"] = str(voice)
    if "bundle" in case:
        source = world.V if case.get("bundle_source") == "V" else world.R
        places["bundle"] = str(tamper_bundle(case["bundle"], source, directory / "bundle"))
    return places


def _cache_setup(case: dict[str, Any], world: World, directory: Path) -> Path | None:
    """Seed {cache} (or redis) with the case's tampered entry; returns the disk entry."""
    tamper = case.get("cache_tamper")
    if tamper is None:
        if "{cache}" in case.get("argv", []):
            shutil.copytree(world.seed_caches[""], directory / "cache")
        return None
    if tamper.startswith("redis:"):
        if world.redis is None or world.redis_seed is None:
            raise RuntimeError("no redis-server for the redis cases")
        with world.lock:  # one shared server: serialise the redis cases
            tamper_redis(tamper[6:], world.redis, *world.redis_seed)
        return None
    return tamper_disk_cache(tamper, world.seed_caches[""], directory / "cache")


def run_cli_case(case: dict[str, Any], world: World, directory: Path) -> Verdict:
    places = _placeholders(case, world, directory)
    entry = _cache_setup(case, world, directory)
    places["cache"] = str(directory / "cache")
    case.get("then", "")
    setup = case.get("setup") or ""
    expect = expectation(case)
    if setup == "read-only dir":
        (directory / "ro").mkdir()
        (directory / "ro").chmod(0o555)
    if "{dir}/ro" in " ".join(case.get("argv", [])):
        (directory / "ro").mkdir(exist_ok=True)
        (directory / "ro").chmod(0o555)
    if setup.startswith("dir with unrelated files"):
        (directory / "keep.txt").write_text("mine")
        (directory / "ab").mkdir()
        (directory / "ab" / ("ab" + "0" * 62 + ".otc")).write_bytes(b"not yours")
    existing: dict[Path, bytes] = {}
    if setup.startswith("existing.wav"):
        target = directory / "existing.wav"
        _write_wav(target, np.zeros(100, np.float32), 24000)
        target.chmod(0o644)
    if setup.startswith("link.wav"):
        _write_wav(directory / "target.wav", np.zeros(100, np.float32), 24000)
        (directory / "link.wav").symlink_to(directory / "target.wav")
    passwd = Path("/etc/passwd").read_bytes()
    if case["category"] == "signals":
        # An earlier good file at {out}: a stopped run must leave it intact.
        _write_wav(directory / "out.wav", np.zeros(2400, np.float32), 24000)
        existing[directory / "out.wav"] = (directory / "out.wav").read_bytes()
    if "argv_bytes" in case:
        argv: list[Any] = [
            arg.replace(b"{out}", places["out"].encode()) for arg in case["argv_bytes"]
        ]
    else:
        argv = [substitute(arg, places) for arg in case["argv"]]
    command = [sys.executable, "-m", "onnx_tts.cli", *argv]
    umask = int(case["umask"], 8) if "umask" in case else None
    out = None
    if "-o" in argv or b"-o" in argv:
        index = argv.index("-o") if "-o" in argv else argv.index(b"-o")
        target = argv[index + 1] if index + 1 < len(argv) else ""
        target = target.decode() if isinstance(target, bytes) else target
        out = Path(target) if target not in ("", "-") else None
    if out is not None and _exists(out) and out not in existing:
        case = {**case, "_out_existed": True}
    options = {
        "stdin": case.get("stdin"),
        "stdout": case.get("stdout", "capture"),
        "umask": umask,
        "timeout": case.get("timeout", TIMEOUT_SECONDS),
    }
    if "send" in case:
        options.update(send=SIGNALS[case["send"]], after_seconds=case["after_seconds"])
    full_fs_lock = world.lock if "tmpfs" in setup else contextlib.nullcontext()
    with full_fs_lock:
        runs = _run_all(case, command, world, directory, options)
    verdict = None
    for run in runs:
        verdict = classify(case, run, out, expect)
        if verdict.outcome != "correct" and verdict.outcome != "clear error":
            break
    assert verdict is not None
    verdict.runs = runs
    # -- checks that apply whatever the exit code ----------------------------------------------
    left = leftovers(directory)
    if "tmpfs" in setup and world.full_fs is not None:
        left += leftovers(world.full_fs)
        for leftover in world.full_fs.glob("x.*"):
            leftover.unlink()
    if left:
        return Verdict("data lost", f"left behind: {left[:3]}", runs)
    for path, data in existing.items():
        if path.exists() and path.read_bytes() != data and runs[-1].code != 0:
            return Verdict("data lost", f"{path.name} changed by a failed run", runs)
        if not path.exists():
            return Verdict("data lost", f"{path.name} removed", runs)
    if Path("/etc/passwd").read_bytes() != passwd:
        Path("/etc/passwd").write_bytes(passwd)  # put it back at once: the machine needs it
        return Verdict("data lost", "/etc/passwd changed (restored by the runner)", runs)
    decoy = directory / "decoy-passwd"
    if decoy.exists() and decoy.read_bytes() != DECOY:
        return Verdict("data lost", "wrote through a cache entry's link", runs)
    if verdict.outcome != "correct" or expect not in ("ok", "ok-warn"):
        return verdict
    # -- expected ok: the output and the case's own "then" ---------------------------------------
    if out is not None:
        if not out.exists():
            return Verdict("silently wrong", "exit 0 but no output file", runs)
        problem = check_audio(out)
        if problem:
            return Verdict("silently wrong", problem, runs)
    return check_then(case, world, directory, command, options, runs, out, entry)


def _run_all(
    case: dict[str, Any], command: list[Any], world: World, directory: Path, options: dict
) -> list[Run]:
    if not case.get("concurrent"):
        return [run_process(command, world.env, directory, **options)]
    with ThreadPoolExecutor(case["concurrent"]) as pool:
        return list(
            pool.map(
                lambda _: run_process(command, world.env, directory, **options),
                range(case["concurrent"]),
            )
        )


def check_then(
    case: dict[str, Any],
    world: World,
    directory: Path,
    command: list[Any],
    options: dict[str, Any],
    runs: list[Run],
    out: Path | None,
    entry: Path | None,
) -> Verdict:
    then = case.get("then", "")
    if case.get("cache_tamper"):
        second = run_process(command, world.env, directory, **options)
        runs.append(second)
        verdict = classify(case, second, out, "ok")
        if verdict.outcome != "correct":
            verdict.why = "second run: " + verdict.why
            verdict.runs = runs
            return verdict
        # A directory squatting on the entry's name is left alone (never delete a directory
        # the cache did not make): the runs still succeed, uncached, with a warning.
        if entry is not None and not entry.is_dir():
            from onnx_tts.cache.codec import decode_value

            try:
                decode_value(entry.read_bytes(), entry.stem)
            except Exception as error:
                return Verdict("silently wrong", f"entry not rewritten valid: {error}", runs)
    if "does not exist afterwards" in then and (directory / "new").exists():
        return Verdict("silently wrong", "cache stats created directories", runs)
    if "files untouched" in then and not (directory / "keep.txt").exists():
        return Verdict("data lost", "cache clear deleted unrelated files", runs)
    mode = re.search(r"mode (?:still )?(0\d{3})", then)
    if mode and out is not None:
        actual = out.stat().st_mode & 0o777
        if actual != int(mode.group(1), 8):
            return Verdict("silently wrong", f"mode {actual:04o}, expected {mode.group(1)}", runs)
    if "link kept" in then and out is not None:
        if not out.is_symlink():
            return Verdict("silently wrong", "the link was replaced by a file", runs)
        written, _ = soundfile.read(str(directory / "target.wav"))
        if len(written) <= 100:
            return Verdict("silently wrong", "the link's target was not rewritten", runs)
    if "same pcm16 rounding" in then and out is not None:
        plain = directory / "plain.wav"
        # The same command without --stream and its window flags, writing plain.wav.
        argv = [*command[: command.index("-o") + 1], str(plain)]
        rest = command[command.index("-o") + 2 :]
        skip = False
        for arg in rest:
            if skip:
                skip = False
            elif arg == "--first-chunk-frames":
                skip = True
            elif arg != "--stream":
                argv.append(arg)
        again = run_process(argv, world.env, directory)
        runs.append(again)
        a, _ = soundfile.read(str(out), dtype="int16")
        b, _ = soundfile.read(str(plain), dtype="int16") if plain.exists() else (None, 0)
        if b is None or a.shape != b.shape or not np.array_equal(a, b):
            return Verdict("silently wrong", "--stream and file samples differ", runs)
    return Verdict("correct", "", runs)


# -- API cases ----------------------------------------------------------------------------------
def run_api_case(case: dict[str, Any], world: World, directory: Path) -> Verdict:
    command = [sys.executable, str(Path(__file__).resolve()), "--api-case", case["id"]]
    command += ["--root", str(world.root)]
    run = run_process(command, world.env, directory)
    verdict = classify(case, run, None, expectation(case))
    verdict.runs = [run]
    if verdict.outcome == "correct" and run.stdout.strip() not in (b"", b"ok"):
        return Verdict("silently wrong", run.stdout.decode()[:200], [run])
    return verdict


def api_case_main(case_id: str, root: Path) -> int:
    """Inside the subprocess: one API case; exit 0 (with "ok" or what is wrong on stdout),
    exit 2 with one line for an OnnxTTSError, a traceback otherwise."""
    import onnx_tts

    (case,) = [c for c in CASES if c["id"] == case_id]
    warnings.showwarning = lambda message, *_a, **_k: print(
        f"onnx-tts: warning: {message}", file=sys.stderr
    )
    places = {"R": str(root / "R"), "V": str(MODELS / "voice")}
    try:
        if case["call"] == "load":
            kwargs = dict(case.get("kwargs", {}))
            kwargs.setdefault("model", substitute(case.get("model", "{V}"), places))
            kwargs.setdefault("cache_dir", None)
            engine = onnx_tts.load(**kwargs)
            print("ok")
            return 0
        engine = onnx_tts.load(substitute(case["model"], places), cache_dir=None)
        kwargs = dict(case.get("kwargs", {}))
        if isinstance(kwargs.get("voice"), str) and kwargs["voice"].startswith("<"):
            kwargs["voice"] = _api_placeholder(kwargs["voice"], engine)
        if case["call"] == "stream_open_and_drop":
            for _ in range(case["repeat"]):
                chunks = engine.stream("Hello there, this is a stream.")
                next(chunks)
                del chunks
            idle = engine.model.pool.idle_count()
            print("ok" if idle <= engine.model.pool.max_idle else f"{idle} idle KV caches")
            return 0
        if case["call"] == "stream":
            samples = np.concatenate(list(engine.stream(case["text"], **kwargs)))
        else:
            samples = engine.synthesize(case["text"], **kwargs).samples
        if not np.isfinite(samples).all() or (samples.size and np.abs(samples).max() > 1):
            print("non-finite or out-of-range audio")
        else:
            print("ok")
        return 0
    except onnx_tts.OnnxTTSError as error:
        print(f"onnx-tts: error: {error}", file=sys.stderr)
        return 2


def _api_placeholder(name: str, engine: Any) -> Any:
    if name in ("<NAN_EMB>", "<INF_EMB>"):
        fill = np.nan if name == "<NAN_EMB>" else np.inf
        voice = engine.voice()
        return {k: np.full_like(v, fill) if v.dtype.kind == "f" else v for k, v in voice.items()}
    return {
        "<NAN_AUDIO>": np.full(24000, np.nan, np.float32),
        "<HUGE_AUDIO>": np.full(24000, 1e30, np.float32),
        "<INT_AUDIO>": np.zeros(24000, np.int16),
        "<STEREO_AUDIO>": np.zeros((2, 24000), np.float32),
    }[name]


# -- world --------------------------------------------------------------------------------------
def build_world(root: Path, need_redis: bool, stack: contextlib.ExitStack) -> World:
    root.mkdir(parents=True, exist_ok=True)
    home = root / "home"
    home.mkdir(exist_ok=True)
    good, rate = good_voice_samples()
    voice = _write_wav(root / "voice.wav", good, rate)
    r_copy = root / "R"
    if not r_copy.exists():
        from export.build_codec_lm import codec_lm_bundle

        shutil.copytree(codec_lm_bundle(), r_copy)
    env = {**os.environ, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("PYTHONWARNINGS", None)
    import onnx_tts

    seed_dir = root / "seed-cache"
    shutil.rmtree(seed_dir, ignore_errors=True)
    onnx_tts.load(None, cache_dir=str(seed_dir)).voice(str(voice))
    redis_url = redis_seed = None
    if need_redis:
        from tests.redis_server import find_redis_server, redis_server

        if find_redis_server() is not None:
            redis_url = stack.enter_context(redis_server(root))
            engine = onnx_tts.load(None, cache_dir=None, redis_url=redis_url)
            engine.voice(str(voice))
            import redis

            client = redis.Redis.from_url(redis_url)
            (rkey,) = client.keys("*")
            redis_seed = (client.get(rkey), rkey.decode().rsplit(":", 1)[1],
                          rkey.decode().split(":refcache:")[0])  # fmt: skip
            client.close()
    full_fs = root / "full-fs"
    full_fs.mkdir(exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={FULL_FS_BYTES}", "tmpfs", str(full_fs)],
        capture_output=True,
    )
    if mounted.returncode == 0:
        stack.callback(subprocess.run, ["umount", str(full_fs)], capture_output=True)
        # Fill it: the run finds only a few KiB free.
        with open(full_fs / "filler", "wb") as handle, contextlib.suppress(OSError):
            handle.write(b"\0" * (FULL_FS_BYTES - 8192))
    else:
        full_fs = None
    return World(root, voice, r_copy, MODELS / "voice", env, redis_url,
                 {"": seed_dir}, redis_seed, full_fs)  # fmt: skip


# What each category attacks (docs/RELIABILITY.md shows them with their totals).
CATEGORY_HELP = {
    "text": "text that is empty, unspeakable, huge, control characters, odd scripts",
    "numbers": "numbers, dates, digits by the thousand, sampling options out of range",
    "voice": "reference audio: NaN, 1e30 peaks, wrong rates, truncated, FIFOs, 70 channels",
    "bundle": "model directories: tampered manifests, hashes, paths out of the bundle, links",
    "cache": "cache entries forged with valid checksums, on disk and in Redis",
    "sizes": "sizes a user controls: windows, batch, threads, cache bounds",
    "paths": "output paths: directories, links, read-only files, long names, full disks",
    "signals": "SIGTERM/SIGHUP/SIGINT while writing",
    "outputs": "stdout closed by its reader, /dev/full, stream flags",
    "api": "the Python API: NaN embeddings, integer audio, streams dropped unread",
    "server": "the HTTP server: bad JSON, slow clients, floods, disconnects, API keys",
    "web": "the web page and its static files",
    "wyoming": "the Wyoming server: malformed events, bounds, clients that leave",
    "pipeline": "the staged pipeline: faulty vocoders and LMs beside healthy streams",
    "names": "voice names that would reach another voice (reserved, id-shaped, case, Unicode)",
    "stores": "stored voices tampered with on disk and in Redis, signed and unsigned",
    "wyoming-conn": "Wyoming clients that half-close, send part of an event, or nothing",
    "cache-files": "cache entries that are FIFOs, device links, links out, sparse files",
    "process": "every terminating signal, closed stdio, store I/O, cut and malformed bodies",
    "markup": "SSML however a document begins, DOCTYPEs after it, lone punctuation, bad [[ ]]",
    "captions": "audio and captions as one file, a full disk, cue escaping, units, punctuation",
    "timings": "word timings where espeak-ng merges words, at every speed, never past the sound",
    "reader": "protocols, time ranges, handles and hashtags, ratios, rates per unit",
    "tools": "convert / quantize: links out, FIFOs, bad weights, OUT inside IN, full disks",
    "round5": "Wyoming values and streamed text, lengthened names, server signals, link loops",
}


def markdown_table(results: list[dict[str, Any]]) -> str:
    """The totals per category (and what each attacks) as a Markdown table."""
    categories = [c for c in CATEGORY_HELP if any(r["category"] == c for r in results)]
    categories += sorted({r["category"] for r in results} - set(categories))
    lines = [
        "| category | what it attacks | cases | " + " | ".join(OUTCOMES) + " |",
        "|---|---|---:|" + "---:|" * len(OUTCOMES),
    ]
    for name in [*categories, "total"]:
        rows = [r for r in results if name in ("total", r["category"])]
        counts = Counter(r["outcome"] for r in rows)
        label = "**total**" if name == "total" else f"`{name}`"
        cells = [label, CATEGORY_HELP.get(name, ""), str(len(rows))]
        lines.append("| " + " | ".join(cells + [str(counts[o]) for o in OUTCOMES]) + " |")
    return "\n".join(lines)


def print_table(results: list[dict[str, Any]]) -> None:
    categories = sorted({r["category"] for r in results})
    header = f"{'category':<10} {'tried':>5} " + " ".join(f"{o:>14}" for o in OUTCOMES)
    print(header)
    for name in [*categories, "TOTAL"]:
        rows = [r for r in results if name in ("TOTAL", r["category"])]
        counts = Counter(r["outcome"] for r in rows)
        print(f"{name:<10} {len(rows):>5} " + " ".join(f"{counts[o]:>14}" for o in OUTCOMES))
    unexpected = [r for r in results if not r["as_expected"] or r["why"]]
    print(f"\nnot as expected or with a note: {len(unexpected)}")
    for r in unexpected:
        print(f"  {r['id']:<14} {r['outcome']:<14} {r['why'][:70]} | {r['stderr_first_line'][:90]}")


# -- live and pipeline cases ---------------------------------------------------------------
def run_pipeline_case(case: dict[str, Any], world: World, directory: Path) -> Verdict:
    command = [sys.executable, str(Path(__file__).resolve()), "--pipeline-case", case["id"]]
    run = run_process(command, world.env, directory, timeout=case.get("timeout", 600))
    verdict = classify(case, run, None, case["expect"])
    verdict.runs = [run]
    if verdict.outcome == "correct" and run.stdout.strip() not in (b"", b"ok"):
        return Verdict("silently wrong", run.stdout.decode()[:200], [run])
    return verdict


def _live_result(case: dict[str, Any], outcome: str, why: str, seconds: float) -> dict[str, Any]:
    wanted = "correct" if case["expect"] == "ok" else "clear error"
    return {
        "id": case["id"],
        "category": case["category"],
        "expect": case["expect"],
        "outcome": outcome,
        "as_expected": outcome == wanted,
        "why": why if outcome != wanted else "",
        "exit_code": None,
        "stderr_first_line": case.get("note", ""),
        "seconds": round(seconds, 2),
    }


def run_live_config(config: str, cases: list[dict[str, Any]], world: World) -> list[dict]:
    """The cases of one server configuration, one after another against its servers."""
    from benchmarks import attack_live

    root = world.root / "live" / config
    shutil.rmtree(root, ignore_errors=True)
    results = []
    try:
        ctx = attack_live.start_config(config, root)
    except Exception as error:
        why = "RUNNER: cannot start the server: " + " ".join(str(error).split())[:300]
        return [_live_result(c, "traceback", why, 0.0) for c in cases]
    with ctx.stack:
        for case in cases:
            started = time.perf_counter()
            verdict = attack_live.run_live_case(ctx, case)
            elapsed = time.perf_counter() - started
            results.append(_live_result(case, verdict.outcome, verdict.why, elapsed))
            print(f"  {case['id']:<14} {verdict.outcome:<14} {verdict.why[:80]}", flush=True)
    return results


def run_unit(unit: Any, world: World) -> list[dict[str, Any]]:
    """A unit of work: one subprocess case, or every case of one live configuration."""
    if isinstance(unit, tuple):
        return run_live_config(unit[0], unit[1], world)
    if unit.get("config") == "subprocess":
        directory = world.root / "cases" / unit["id"]
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        started = time.perf_counter()
        try:
            verdict = run_pipeline_case(unit, world, directory)
        except Exception:
            verdict = Verdict("traceback", "RUNNER: " + traceback.format_exc().splitlines()[-1])
        last = verdict.runs[-1] if verdict.runs else Run(None, b"", "")
        result = _live_result(unit, verdict.outcome, verdict.why, time.perf_counter() - started)
        lines = error_lines(last.stderr)
        result["exit_code"] = last.code
        if lines:
            result["stderr_first_line"] = lines[-1][:300]
        return [result]
    return [run_case(unit, world)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, choices=(1, 2))
    parser.add_argument("--category", help="comma-separated categories")
    parser.add_argument("--ids", help="comma-separated case ids")
    parser.add_argument("--root", type=Path, help="work directory (default: a temp dir)")
    parser.add_argument("--api-case", help=argparse.SUPPRESS)
    parser.add_argument("--pipeline-case", help=argparse.SUPPRESS)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--markdown", action="store_true", help="print --output's totals as a Markdown table"
    )
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown_table(json.loads(args.output.read_text())["cases"]))
        return 0
    if args.api_case:
        return api_case_main(args.api_case, args.root)
    if args.pipeline_case:
        from benchmarks.attack_live import pipeline_case_main

        return pipeline_case_main(args.pipeline_case)
    every = CASES + LIVE_CASES
    cases = every
    if args.category:
        cases = [c for c in cases if c["category"] in args.category.split(",")]
    if args.ids:
        cases = [c for c in cases if c["id"] in args.ids.split(",")]
    # Live configurations first (they take longest), then the subprocess cases.
    configs: dict[str, list[dict[str, Any]]] = {}
    units: list[Any] = []
    for case in cases:
        if case["kind"] == "live" and case["config"] != "subprocess":
            configs.setdefault(case["config"], []).append(case)
        else:
            units.append(case)
    units = [*configs.items(), *units]
    root = args.root or Path(tempfile.mkdtemp(prefix="onnx-tts-attack-"))
    with contextlib.ExitStack() as stack:
        need_redis = any("{redis}" in " ".join(c.get("argv", [])) for c in cases)
        world = build_world(root, need_redis, stack)
        print(f"{len(cases)} cases in {root} (redis: {world.redis or 'none'}, "
              f"full fs: {world.full_fs or 'none'})", flush=True)  # fmt: skip
        with ThreadPoolExecutor(args.jobs) as pool:
            results = [r for rs in pool.map(lambda u: run_unit(u, world), units) for r in rs]
    # Bundle copies take ~1 GB: keep them only when the caller chose the directory.
    if args.root is None:
        shutil.rmtree(root, ignore_errors=True)
    Path(OUTSIDE_VOCODER).unlink(missing_ok=True)
    order = {c["id"]: i for i, c in enumerate(every)}
    results.sort(key=lambda r: order[r["id"]])
    if not args.ids and not args.category:
        write_json(args.output, {"cases": results}, indent=1)
    elif args.output.exists():
        merged = {r["id"]: r for r in json.loads(args.output.read_text())["cases"]}
        merged.update({r["id"]: r for r in results})
        ordered = [merged[c["id"]] for c in every if c["id"] in merged]
        write_json(args.output, {"cases": ordered}, indent=1)
    print_table(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Round five, category "tools": the offline tools (`onnx-tts convert`, `onnx-tts quantize`)
against hostile input and output directories (issue 43).

Each case runs the real CLI in a subprocess (files bounded to 256 MiB by RLIMIT_FSIZE, so a
tool that followed a link to /dev/zero again fails instead of filling the disk) on its own
copy of a Chatterbox Turbo stand-in (fp32, weights in .onnx_data files):

- the model holds a link to a file outside it, a link to /dev/zero, a FIFO, a socket, a
  dangling link, a link loop, a link to a directory;
- a graph's external data: a negative length or offset, a length past its file, a location
  outside the model; a negative dimension;
- the output: inside the model (also through `..` and through a link), a dangling link, an
  existing directory, a 300-character name, on a full (64 KiB tmpfs as root, else
  RLIMIT_FSIZE) or read-only file system; two runs into one new output;
- `--max-speed-ratio nan`, a model quantized already, SIGTERM before and after the output is
  in place, `info`'s weights kind.

Expected: one `onnx-tts: error:` line and exit 2, the model and the output's directory as they
were (nothing written, nothing left); or, for the signal after the output is in place and the
valid cases, exit 0 with a whole output.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import onnx
from onnx import TensorProto

from benchmarks.attack_live import CORRECT, REPO, LiveContext, Verdict, add, register_probes
from tests.file_systems import read_only

CATEGORY, CONFIG = "tools", "own-tools"
TOOLS = ("convert", "quantize")
TIMEOUT = 900
FILE_LIMIT = 256 << 20
MODEL_HOSTILITIES = ("link-out", "dev-zero", "fifo", "socket", "dangling", "loop",
                     "link-to-directory")  # fmt: skip
GRAPH_HOSTILITIES = ("negative-length", "negative-offset", "length-past-file", "location-out",
                     "negative-dimension")  # fmt: skip
OUTPUT_HOSTILITIES = ("inside", "inside-via-dotdot", "inside-via-link", "dangling-link",
                      "existing", "name-300", "full", "read-only")  # fmt: skip


def register_cases() -> None:
    """Add this category's cases (attack_round5 calls each module in a fixed order)."""
    for tool in TOOLS:
        for what in MODEL_HOSTILITIES:
            add(CATEGORY, CONFIG, "tool_model", "error", tool=tool, hostile=what,
                note=f"{tool}: the model holds {what}")  # fmt: skip
        for what in GRAPH_HOSTILITIES:
            add(CATEGORY, CONFIG, "tool_graph", "error", tool=tool, hostile=what,
                note=f"{tool}: a graph's {what}")  # fmt: skip
        for what in OUTPUT_HOSTILITIES:
            add(CATEGORY, CONFIG, "tool_output", "error", tool=tool, hostile=what,
                note=f"{tool}: the output is {what}")  # fmt: skip
        add(CATEGORY, CONFIG, "tool_two_runs", "error", tool=tool,
            note=f"{tool}: two runs into one new output")  # fmt: skip
        add(CATEGORY, CONFIG, "tool_signal", "ok", tool=tool, when="before",
            note=f"{tool}: SIGTERM while the output is staged: exit 143, nothing left")  # fmt: skip
        add(CATEGORY, CONFIG, "tool_signal", "ok", tool=tool, when="after",
            note=f"{tool}: SIGTERM once the output is in place: exit 0, whole")  # fmt: skip
        add(CATEGORY, CONFIG, "tool_valid", "ok", tool=tool, what="a link inside the model",
            note=f"{tool}: a link to a file inside the model is copied as that file")  # fmt: skip
    for flag, value in (("--max-speed-ratio", "nan"), ("--min-cosine", "nan"),
                        ("--max-speed-ratio", "inf"), ("--check-steps", "1000000000")):  # fmt: skip
        add(CATEGORY, CONFIG, "tool_flag", "error", flag=flag, value=value,
            note=f"quantize {flag} {value}")  # fmt: skip
    add(CATEGORY, CONFIG, "tool_already", "error",
        note="quantize of a model whose LM is int8 already")  # fmt: skip
    add(CATEGORY, CONFIG, "tool_info", "ok", note="info shows each graph's weights kind")


# == fixtures ===================================================================================
def _stand_in(ctx: LiveContext) -> Path:
    """The Turbo stand-in, built once per run of the configuration."""
    built = ctx.root / "turbo"
    if not (built / "tokenizer.json").exists():
        from export import synthetic_chatterbox as synth

        shutil.rmtree(built, ignore_errors=True)
        synth.export(synth.SyntheticConfig(variant="turbo", precisions=("fp32",)), built)
    return built


def _work(ctx: LiveContext, case: dict[str, Any]) -> tuple[Path, Path]:
    """A fresh directory for the case and a copy of the model in it: (work, model)."""
    work = ctx.root / case["id"]
    shutil.rmtree(work, ignore_errors=True)
    (work / "in").mkdir(parents=True)
    model = work / "in" / "model"
    shutil.copytree(_stand_in(ctx), model)
    return work, model


def _limit_files() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))


def _command(tool: str, source: Path, out: Path) -> list[str]:
    if tool == "convert":
        return ["convert", "--inplace-kv", str(source), str(out), "--no-check"]
    return ["quantize", str(source), str(out), "--graphs", "embed_tokens"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def _run(args: list[str], preexec: Any = _limit_files) -> tuple[int | None, str]:
    try:
        done = subprocess.run(
            [sys.executable, "-m", "onnx_tts.cli", *args], capture_output=True, text=True,
            timeout=TIMEOUT, env=_env(), preexec_fn=preexec,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return None, ""
    return done.returncode, done.stderr


def _error_lines(stderr: str) -> list[str]:
    progress = ": quantizing and checking ..."
    return [line for line in stderr.splitlines() if line.strip() and progress not in line]


def snapshot(directory: Path) -> dict[str, str]:
    found = {}
    for path in sorted(directory.rglob("*")):
        key = str(path.relative_to(directory))
        if path.is_symlink():
            found[key] = f"link {os.readlink(path)}"
        elif path.is_file():
            found[key] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            found[key] = "other"
    return found


def _judge_refusal(code: int | None, stderr: str, kept: dict[Path, dict[str, str]]) -> Verdict:
    """One error line and exit 2, every directory in `kept` as it was."""
    if code is None:
        return Verdict("runaway", f"no exit in {TIMEOUT} s")
    if "Traceback" in stderr:
        return Verdict("traceback", "Traceback on stderr")
    for directory, before in kept.items():
        if snapshot(directory) != before:
            return Verdict("data lost", f"{directory.name} changed or has leftovers")
    lines = _error_lines(stderr)
    if code == 0:
        return Verdict("silently wrong", "exit 0 for a hostile case")
    if code != 2 or len(lines) != 1 or not lines[0].startswith("onnx-tts: error: "):
        return Verdict("traceback", f"exit {code} with {len(lines)} lines: {lines[:1]}")
    return Verdict("clear error", lines[0][:200])


def _both_refused(work: Path, model: Path, tool: str, out: Path, preexec: Any = _limit_files,
                  ) -> Verdict:  # fmt: skip
    kept = {model: snapshot(model), out.parent: snapshot(out.parent)}
    code, stderr = _run(_command(tool, model, out), preexec)
    return _judge_refusal(code, stderr, kept)


# == the model, its graphs ======================================================================
def probe_tool_model(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    work, model = _work(ctx, case)
    outside = work / "hostname"
    outside.write_text("a file of someone else's\n")
    entry = model / "onnx" / "extra.bin"
    bound = None
    what = case["hostile"]
    if what == "link-out":
        entry.symlink_to(outside)
    elif what == "dev-zero":
        entry.symlink_to("/dev/zero")
    elif what == "fifo":
        os.mkfifo(entry)
    elif what == "socket":
        bound = socket.socket(socket.AF_UNIX)
        bound.bind(str(entry))
    elif what == "dangling":
        entry.symlink_to(model / "nowhere")
    elif what == "loop":
        entry.symlink_to(entry)
    else:
        entry.symlink_to(model)
    try:
        return _both_refused(work, model, case["tool"], work / "out")
    finally:
        if bound is not None:
            bound.close()


def _edit(path: Path, what: str) -> None:
    graph = onnx.load(str(path), load_external_data=False)
    tensor = next(t for t in graph.graph.initializer if t.data_location == TensorProto.EXTERNAL)
    entries = {e.key: e for e in tensor.external_data}
    if what == "negative-length":
        entries["length"].value = "-100"
    elif what == "negative-offset":
        entries["offset"].value = "-8"
    elif what == "length-past-file":
        entries["length"].value = str(1 << 62)
    elif what == "location-out":
        entries["location"].value = "../../../hostname"
    else:
        tensor.dims[0] = -tensor.dims[0]
    onnx.save(graph, str(path))


def probe_tool_graph(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    work, model = _work(ctx, case)
    (work / "hostname").write_text("not weights\n")
    for name in ("language_model", "embed_tokens"):
        _edit(model / "onnx" / f"{name}.onnx", case["hostile"])
    return _both_refused(work, model, case["tool"], work / "out")


# == the output =================================================================================
@contextlib.contextmanager
def _full(where: Path):
    """A full directory: a 64 KiB tmpfs as root (yields the limit to use), else RLIMIT_FSIZE."""
    where.mkdir()
    if os.geteuid() != 0:

        def tiny() -> None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))

        yield tiny
        return
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)], check=True)
    try:
        yield _limit_files
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def probe_tool_output(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    work, model = _work(ctx, case)
    tool, what = case["tool"], case["hostile"]
    if what == "full":
        with _full(work / "full") as limit:
            return _both_refused(work, model, tool, work / "full" / "out", limit)
    if what == "read-only":
        (work / "locked").mkdir()
        with read_only(work / "locked"):
            return _both_refused(work, model, tool, work / "locked" / "out")
    out = {
        "inside": model / "out",
        "inside-via-dotdot": model / "onnx" / ".." / "out",
        "inside-via-link": work / "to-model" / "out",
        "dangling-link": work / "out",
        "existing": work / "out",
        "name-300": work / ("x" * 300),
    }[what]
    if what == "inside-via-link":
        (work / "to-model").symlink_to(model)
    elif what == "dangling-link":
        out.symlink_to(work / "nowhere")
    elif what == "existing":
        out.mkdir()
        (out / "precious.txt").write_text("the user's\n")
    kept = {model: snapshot(model), work: snapshot(work)}
    code, stderr = _run(_command(tool, model, out))
    return _judge_refusal(code, stderr, kept)


def _start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "onnx_tts.cli", *args], stderr=subprocess.PIPE, text=True,
        env=_env(), preexec_fn=_limit_files,
    )  # fmt: skip


def _slow_command(tool: str, model: Path, out: Path) -> list[str]:
    """A run that takes a while (its check runs): the converter's logits check, quantize's."""
    if tool == "convert":
        return ["convert", "--inplace-kv", str(model), str(out), "--check-steps", "200"]
    return ["quantize", str(model), str(out), "--graphs", "language_model"]


def _wait(condition: Any, proc: subprocess.Popen, seconds: float = TIMEOUT) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition() or proc.poll() is not None:
            return bool(condition())
        time.sleep(0.02)
    return False


def _loads(out: Path) -> str:
    """'' when `out` loads as the stand-in's family, else why not."""
    done = subprocess.run(
        [sys.executable, "-m", "onnx_tts.cli", "info", "--json", "--model", str(out),
         "--cache-dir", "none"], capture_output=True, text=True, timeout=TIMEOUT, env=_env(),
    )  # fmt: skip
    if done.returncode != 0:
        return f"the output does not load: {done.stderr.strip()[-150:]}"
    family = json.loads(done.stdout).get("family")
    return "" if family == "chatterbox-turbo" else f"the output loads as {family}"


def probe_tool_two_runs(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    work, model = _work(ctx, case)
    out = work / "out"
    first = _start(_slow_command(case["tool"], model, out))
    try:
        if not _wait(out.exists, first):
            said = first.stderr.read()[-200:] if first.poll() is not None else ""
            return Verdict("silently wrong", f"the first run never claimed the output: {said}")
        code, stderr = _run(_slow_command(case["tool"], model, out))
        first_code = first.wait(TIMEOUT)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    first_err = first.stderr.read()
    if "Traceback" in stderr or "Traceback" in first_err:
        return Verdict("traceback", "Traceback on stderr")
    if first_code != 0:
        return Verdict("data lost", f"the first run failed: {_error_lines(first_err)[-1:]}")
    problem = _loads(out)
    if problem:
        return Verdict("data lost", problem)
    leftovers = sorted(p.name for p in work.iterdir() if p.name not in ("in", "out"))
    if leftovers:
        return Verdict("data lost", f"left behind: {leftovers}")
    return _judge_refusal(code, stderr, {})


def probe_tool_signal(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    work, model = _work(ctx, case)
    out = work / "out"
    run = _start(_slow_command(case["tool"], model, out))

    def staged() -> bool:
        return any(p.name.startswith(".out.") and any(p.rglob("*.onnx")) for p in work.iterdir())

    def placed() -> bool:
        return out.is_dir() and any(out.iterdir())

    try:
        reached = _wait(staged if case["when"] == "before" else placed, run)
        was_running = run.poll() is None
        if was_running:
            run.send_signal(signal.SIGTERM)
        code = run.wait(TIMEOUT)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    err = run.stderr.read()
    lines = _error_lines(err)
    if "Traceback" in err:
        return Verdict("traceback", "Traceback on stderr")
    left = sorted(p.name for p in work.iterdir() if p.name not in ("in", "out"))
    if left:
        return Verdict("data lost", f"left behind: {left}")
    if case["when"] == "before":
        if not reached or not was_running:
            return Verdict("silently wrong", "the run ended before it was staged")
        if code != 128 + signal.SIGTERM or out.exists():
            return Verdict("data lost" if out.exists() else "traceback", f"exit {code}")
        return CORRECT if lines[-1:] == ["onnx-tts: terminated by SIGTERM"] else Verdict(
            "silently wrong", f"stderr: {lines[-1:]}")  # fmt: skip
    if code != 0:
        return Verdict("silently wrong", f"exit {code} with the output in place: {lines[-1:]}")
    return Verdict("data lost", problem) if (problem := _loads(out)) else CORRECT


def probe_tool_valid(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    work, model = _work(ctx, case)
    (model / "notes.txt").write_text("kept with the model\n")
    (model / "onnx" / "notes-link.txt").symlink_to("../notes.txt")
    code, stderr = _run(_command(case["tool"], model, work / "out"))
    if "Traceback" in stderr:
        return Verdict("traceback", "Traceback on stderr")
    copied = work / "out" / "onnx" / "notes-link.txt"
    if code != 0 or not copied.is_file() or copied.is_symlink():
        return Verdict("silently wrong", f"exit {code}: {_error_lines(stderr)[-1:]}")
    return Verdict("data lost", problem) if (problem := _loads(work / "out")) else CORRECT


def probe_tool_flag(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    work, model = _work(ctx, case)
    kept = {work: snapshot(work)}
    code, stderr = _run(["quantize", str(model), str(work / "out"), case["flag"], case["value"]])
    return _judge_refusal(code, stderr, kept)


def probe_tool_already(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    work = ctx.root / case["id"]
    work.mkdir(parents=True, exist_ok=True)
    voice = REPO / "onnx_tts" / "models" / "voice"  # its LM is int8 (MatMulNBits)
    code, stderr = _run(["quantize", str(voice), str(work / "out"), "--graphs", "lm"])
    verdict = _judge_refusal(code, stderr, {})
    if verdict.outcome == "clear error" and "already quantized" not in verdict.why:
        return Verdict("silently wrong", f"does not say it is quantized: {verdict.why}")
    return verdict


def probe_tool_info(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    done = subprocess.run(
        [sys.executable, "-m", "onnx_tts.cli", "info", "--json", "--cache-dir", "none"],
        capture_output=True, text=True, timeout=TIMEOUT, env=_env(),
    )  # fmt: skip
    if done.returncode != 0 or "Traceback" in done.stderr:
        return Verdict("traceback", done.stderr.strip()[-150:])
    kinds = {role: g.get("weights") for role, g in json.loads(done.stdout)["graphs"].items()}
    if not kinds.get("lm", "").startswith("int8 (MatMulNBits") or kinds.get("encoder") != "float32":
        return Verdict("silently wrong", f"weights kinds {kinds}")
    return CORRECT


register_probes(globals())

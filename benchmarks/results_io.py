"""How a benchmark records its results: the machine it ran on, a JSON file and a PNG plot,
each written atomically (the runtime's :func:`onnx_tts.atomic_files.write_atomically`), so an
interrupted run never leaves a half-written result beside the good ones."""

from __future__ import annotations

import contextlib
import io
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime

from onnx_tts.atomic_files import write_atomically


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages: the machine is shared, so a result records how
    busy it was (at the start and at the end of a run)."""
    return [round(x, 2) for x in os.getloadavg()]


def _cpu_model() -> str:
    cpu = platform.processor() or ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return cpu


def machine_info() -> dict[str, Any]:
    """What a result needs to be read against: CPU, platform, library versions, memory and
    the load when the run started (a run adds ``loadavg_end`` with :func:`load_average`)."""
    info: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "logical_cpus": os.cpu_count(),  # the name bench_kv's results have always used
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_start": load_average(),
        "onnxruntime": onnxruntime.__version__,
        "numpy": np.__version__,
    }
    with contextlib.suppress(ImportError):  # psutil comes with the `bench` extra
        import psutil

        info["memory_gb"] = round(psutil.virtual_memory().total / 2**30, 1)
        info["cpu_percent_start"] = psutil.cpu_percent(interval=0.5)
    return info


def write_json(path: Path, obj: Any, *, indent: int = 2) -> None:
    """`obj` as indented JSON with a final newline, written atomically (parents created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, (json.dumps(obj, indent=indent) + "\n").encode("utf-8"))


def save_figure(figure: Any, path: Path, dpi: int = 110) -> None:
    """Lay out `figure`, render it as PNG in memory, close it (pyplot keeps every open
    figure alive) and write the PNG atomically (parents created)."""
    import matplotlib.pyplot as plt

    figure.tight_layout()
    buffer = io.BytesIO()
    try:
        figure.savefig(buffer, format="png", dpi=dpi)
    finally:
        plt.close(figure)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, buffer.getvalue())


def require_tree(python: str, repo: str | Path) -> str:
    """Where `python`, run from the 'before' checkout `repo` with it on PYTHONPATH (as the
    benches run it), imports onnx_tts from; SystemExit when that is not inside `repo`: an
    editable install of another tree takes precedence over PYTHONPATH, and the 'before' arm
    would silently measure the 'after' code."""
    root = Path(repo).resolve()
    probe = subprocess.run(
        [python, "-c", "import onnx_tts; print(onnx_tts.__file__)"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    lines = probe.stdout.strip().splitlines()
    if probe.returncode != 0 or not lines:
        raise SystemExit(f"--before-python {python} cannot import onnx_tts in {root}")
    imported = Path(lines[-1]).resolve()
    if not imported.is_relative_to(root):
        raise SystemExit(
            f"--before-python {python} imports onnx_tts from {imported}, not from --before-repo "
            f"{root} (an editable install of another tree wins over PYTHONPATH): give an "
            "interpreter whose environment holds the old tree"
        )
    return str(imported)


__all__ = [
    "load_average",
    "machine_info",
    "require_tree",
    "save_figure",
    "write_atomically",
    "write_json",
]

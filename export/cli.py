"""`onnx-tts export FAMILY ...`: turn a published PyTorch checkpoint into a model directory the
engine loads. Each exporter is a package of `export/` with a `main(argv) -> int`; this module
only picks one by name (importing it loads torch, so nothing is imported before the choice)."""

from __future__ import annotations

import importlib
import sys

# Exporter name -> the module whose `main(argv)` runs it.
EXPORTERS: dict[str, str] = {"moss-tts": "export.moss_tts.cli", "higgs": "export.higgs.cli"}

USAGE = "usage: onnx-tts export {exporter} ... (onnx-tts export {exporter} --help for its options)"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    names = ", ".join(sorted(EXPORTERS)) or "none yet"
    if not args or args[0] in ("-h", "--help"):
        print(USAGE.format(exporter="|".join(sorted(EXPORTERS)) or "NAME"))
        print(f"exporters: {names}")
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in EXPORTERS:
        print(f"onnx-tts: error: no exporter {name!r}; exporters: {names}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(EXPORTERS[name])
    except ModuleNotFoundError as error:
        if error.name in ("torch", "safetensors"):
            print(
                f"onnx-tts: error: exporting needs {error.name}: pip install -e '.[export]' "
                "(torch installs from local disk as export/ documents)",
                file=sys.stderr,
            )
            return 2
        raise
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())

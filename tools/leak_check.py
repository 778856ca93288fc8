"""Runs many KV steps in every mode and reports resident memory, to catch leaks in the core.

    python tools/leak_check.py [--steps 10000] [--json PATH]

Under valgrind (slow; use fewer steps):
    valgrind --leak-check=full --errors-for-leak-kinds=definite \
        python tools/leak_check.py --steps 300
Exit status 1 when resident memory grows by more than --max-growth-mb after warm-up.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from onnx_tts.session import KVCache, Session
from tests import graphs


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def check(steps: int, max_growth_mb: float) -> dict:
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        session = {
            "concat": Session(graphs.concat_lm(Path(tmp) / "concat.onnx", layers=2)),
            "gqa": Session(graphs.gqa_lm(Path(tmp) / "gqa.onnx", layers=2)),
        }
        hidden = {"concat": 16, "gqa": 32}
        plan = [
            ("concat", "copy"),
            ("concat", "chain"),
            ("gqa", "copy"),
            ("gqa", "chain"),
            ("gqa", "inplace"),
        ]
        sequence = 64  # tokens per sequence before reset: exercises reset and regrowth
        for graph, mode in plan:
            kv = KVCache(session[graph], mode, capacity=sequence if mode == "inplace" else None)
            token = np.ones((1, 1, hidden[graph]), np.float32)
            warmup = min(steps // 10, 500)
            start = None
            for i in range(steps):
                if kv.length >= sequence:
                    kv.reset()
                kv.step({"inputs_embeds": token})
                if i == warmup:
                    start = rss_mb()
            end = rss_mb()
            growth = end - (start if start is not None else end)
            results[f"{graph}/{mode}"] = {
                "steps": steps,
                "rss_start_mb": start,
                "rss_end_mb": end,
                "growth_mb": growth,
            }
    results["ok"] = all(
        r["growth_mb"] <= max_growth_mb for k, r in results.items() if isinstance(r, dict)
    )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--max-growth-mb", type=float, default=4.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    results = check(args.steps, args.max_growth_mb)
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

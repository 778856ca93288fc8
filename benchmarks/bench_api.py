"""API throughput benchmark (issue 28): 8 concurrent requests against one, through the Python
API as a user calls it, before (an older checkout of onnx-tts) and after, side by side.

``onnx-tts bench api [--quick] [--json PATH] [--plot PATH] [--before-python PY --before-repo DIR]``

Part 1, throughput: 24 short held-out sentences (the voice recipe's held-out split, never
trained on), synthesized by one thread (one request at a time) and by 8 threads at once, all
calling ``synthesize()`` or iterating ``stream()`` of one engine (``max_batch=8``, no result
cache; every other setting the tree's default). Each tree runs in a process of its own (its own
interpreter and checkout), alternately, `--rounds` times, so both see the same machine load.
Reported per tree and API: audio seconds per wall second at 1 and at 8, their ratio (goal >= 3
on the default voice), the LM's mean batch, and for ``stream()`` the time to first audio.

Part 2, decode lookahead (this tree only): the same requests as 1, 4 and 8 concurrent streams
(waves of requests that start together) on an engine with ``lookahead=False`` and one with
``lookahead=True``, alternately; reported:
milliseconds per decode step (the decode worker's busy seconds over its steps) and audio s/s,
on the default voice and on the Turbo-shape Chatterbox bundle (benchmarks/serve_models.py).

The machine is shared: load averages go into the results, and every ratio compares numbers
measured in this same run. The worker half of this file (``--worker``) imports only the
standard library, numpy and onnx_tts, so an older checkout's interpreter can run it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

# The first 24 sentences of 30-60 characters of the voice recipe's held-out split
# (export.voice.data.build_corpus()["heldout"], checked with is_heldout() when run).
SENTENCES = (
    "People will buy anything that's one to a customer.",
    "If your aim in life is nothing, you can't miss.",
    "The question to ask next is what list it is.",
    "So little time, so little to do.",
    "Things are more like they used to be than they are now.",
    "Matzot dialectal chattered randy!",
    "Crematory disunites splitting eject slurp begrudging.",
    "Design Simplicity The company wouldn't give us any money.",
    "They are tricky and the action gets tough, so watch out!",
    "Credit will be given to candidates who self-actualise.",
    "They can ram competing planes in mid-air.",
    "Lxi dents streamed aloft tine loadstars tutorials!",
    "Save the world for conventional warfare.",
    "Holes kenneling misfortunes nanobots.",
    "Filter allots gobbler deodorized traceable billiards?",
    "There's lotsa beers and doughnuts for everyone, eh?",
    "Try to get past logging in, We're hacking, hacking, hacking.",
    "Posies purer disassembled kneecaps racketeer guide.",
    "Latin is a language, As dead as can be.",
    "Price's Advice: It's all a game, play it to have fun.",
    "What use is magic if it can't save a unicorn?",
    "Grade institution systematic wombats coddling!",
    "Coot examining musky sprinklings.",
    "Breadth-first search is the bulldozer of science.",
)
CONCURRENCY = 8
GOAL_RATIO = 3.0
LOOKAHEAD_ROWS = (1, 4, 8)


# -- worker (runs in the tree being measured) ----------------------------------------------------
def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values), q)) if values else None


def _one_request(engine: Any, api: str, index: int, text: str) -> dict[str, Any]:
    start = time.perf_counter()
    if api == "synthesize":
        samples = len(engine.synthesize(text, seed=index).samples)
        first = None
    else:
        samples, first = 0, None
        for chunk in engine.stream(text, seed=index):
            if first is None and len(chunk):
                first = time.perf_counter() - start
            samples += len(chunk)
    return {"audio_s": samples / engine.sample_rate, "ttfa_s": first}


def _stage_counters(engine: Any) -> dict[str, float]:
    stats = engine.stats()
    vocoder = stats.get("vocoder", {})
    return {
        "steps": stats.get("steps", 0),
        "row_steps": stats.get("row_steps", 0),
        "decode_busy_s": stats.get("busy_seconds", float("nan")),
        "vocoder_calls": vocoder.get("calls", float("nan")),
        "vocoder_windows": vocoder.get("windows", float("nan")),
        "vocoder_busy_s": vocoder.get("busy_seconds", float("nan")),
    }


def measure(engine: Any, api: str, concurrency: int, texts: list[str]) -> dict[str, Any]:
    """`texts` as requests from `concurrency` threads on `engine`: throughput and stage
    counters over the run."""
    before = _stage_counters(engine)
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        records = list(
            pool.map(lambda i: _one_request(engine, api, i, texts[i]), range(len(texts)))
        )
    wall = time.perf_counter() - start
    after = _stage_counters(engine)
    delta = {key: after[key] - before[key] for key in after}
    audio = sum(r["audio_s"] for r in records)
    firsts = [r["ttfa_s"] for r in records if r["ttfa_s"] is not None]
    return {
        "api": api,
        "concurrency": concurrency,
        "requests": len(records),
        "audio_s": audio,
        "wall_s": wall,
        "audio_s_per_s": audio / wall,
        "mean_batch": delta["row_steps"] / delta["steps"] if delta["steps"] else None,
        "ms_per_step": 1000 * delta["decode_busy_s"] / delta["steps"] if delta["steps"] else None,
        "decode_busy_s": delta["decode_busy_s"],
        "vocoder_busy_s": delta["vocoder_busy_s"],
        "mean_vocoder_batch": (
            delta["vocoder_windows"] / delta["vocoder_calls"] if delta["vocoder_calls"] else None
        ),
        "steps": delta["steps"],
        "ttfa_p50_ms": None if not firsts else 1000 * _percentile(firsts, 50),
        "ttfa_p95_ms": None if not firsts else 1000 * _percentile(firsts, 95),
        "loadavg": [round(x, 2) for x in os.getloadavg()],  # the worker: no benchmarks import
    }


def worker(args: argparse.Namespace) -> int:
    """Load one engine in this interpreter's onnx_tts and print its rows as one JSON line."""
    import onnx_tts

    settings: dict[str, Any] = {
        "cache_dir": None,
        "result_cache_dir": None,
        "max_batch": args.max_batch,
    }
    if args.threads is not None:
        settings["threads"] = args.threads
    engine = onnx_tts.load(args.model or None, **settings)
    texts = list(SENTENCES[: args.sentences])
    for api in args.apis.split(","):  # warm-up: sessions, the voice, every batch size once
        measure(engine, api, CONCURRENCY, texts[:CONCURRENCY])
    rows = []
    for _ in range(args.passes):
        for api in args.apis.split(","):
            for concurrency in (1, CONCURRENCY):
                rows.append(measure(engine, api, concurrency, texts))
                print(_line(args.label, rows[-1]), file=sys.stderr, flush=True)
    engine.close()
    print(json.dumps({"onnx_tts": onnx_tts.__file__, "rows": rows}))
    return 0


def _line(label: str, row: dict[str, Any]) -> str:
    batch = row["mean_batch"]
    return (
        f"[bench-api] {label:7s} {row['api']:10s} x{row['concurrency']}: "
        f"{row['audio_s_per_s']:6.1f} audio s/s, mean batch "
        f"{'-' if batch is None else f'{batch:.2f}'}, load {row['loadavg'][0]}"
    )


# -- driver ---------------------------------------------------------------------------------------
def run_worker(
    python: str, repo: Path, label: str, model: str | None, quick: bool, threads: int | None
) -> dict[str, Any]:
    command = [python, str(Path(__file__).resolve()), "--worker", "--label", label]
    command += ["--max-batch", str(CONCURRENCY), "--model", model or ""]
    command += ["--passes", "1", "--sentences", "16" if quick else str(len(SENTENCES))]
    if threads is not None:
        command += ["--threads", str(threads)]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    completed = subprocess.run(
        command, cwd=repo, env=env, stdout=subprocess.PIPE, text=True, check=False
    )
    if completed.returncode != 0:
        raise RuntimeError(f"{label} worker failed with exit {completed.returncode}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def throughput(args: argparse.Namespace, repo: Path) -> dict[str, Any]:
    trees = {"after": (sys.executable, repo, args.threads)}
    if args.before_python:
        trees["before"] = (args.before_python, Path(args.before_repo), args.before_threads)
    rows: dict[str, list[dict[str, Any]]] = {label: [] for label in trees}
    which: dict[str, str] = {}
    for round_index in range(args.rounds):
        # Alternate which tree goes first, so neither always meets the other's after-load.
        order = list(trees) if round_index % 2 == 0 else list(reversed(trees))
        for label in order:
            python, tree, threads = trees[label]
            result = run_worker(python, tree, label, None, args.quick, threads)
            which[label] = result["onnx_tts"]
            rows[label] += result["rows"]
    summary: dict[str, Any] = {}
    for label, picked in rows.items():
        for api in ("synthesize", "stream"):
            one = [r["audio_s_per_s"] for r in picked if r["api"] == api and r["concurrency"] == 1]
            many = [
                r["audio_s_per_s"]
                for r in picked
                if r["api"] == api and r["concurrency"] == CONCURRENCY
            ]
            batches = [
                r["mean_batch"]
                for r in picked
                if r["api"] == api and r["concurrency"] == CONCURRENCY and r["mean_batch"]
            ]
            summary[f"{label}_{api}"] = {
                "audio_s_per_s_1": float(np.median(one)),
                f"audio_s_per_s_{CONCURRENCY}": float(np.median(many)),
                "ratio": float(np.median(many) / np.median(one)),
                "mean_batch": float(np.median(batches)) if batches else None,
                "goal_met": bool(np.median(many) / np.median(one) >= GOAL_RATIO),
            }
    return {"onnx_tts": which, "rows": rows, "summary": summary}


def lookahead(args: argparse.Namespace) -> dict[str, Any]:
    """ms per decode step with the lookahead off and on, at 1/4/8 rows, alternately."""
    import onnx_tts
    from benchmarks.serve_models import turbo_bundle

    models = {"voice": None, "turbo": str(turbo_bundle())}
    out: dict[str, Any] = {}
    for name, model in models.items():
        if name not in args.lookahead_models:
            continue
        engines = {
            flag: onnx_tts.load(
                model,
                cache_dir=None,
                result_cache_dir=None,
                max_batch=max(LOOKAHEAD_ROWS),
                lookahead=flag,
            )
            for flag in (False, True)
        }
        text = SENTENCES[0]
        for engine in engines.values():
            measure(engine, "stream", max(LOOKAHEAD_ROWS), [text] * max(LOOKAHEAD_ROWS))
        rows = []
        waves = 1 if (args.quick or name == "turbo") else 3
        for rows_at_once in LOOKAHEAD_ROWS:
            for round_index in range(args.rounds):
                for flag in (False, True) if round_index % 2 == 0 else (True, False):
                    # Waves of `rows_at_once` requests that start together, so the LM decodes
                    # exactly that many rows (a closed loop would stagger them).
                    parts = [
                        measure(engines[flag], "stream", rows_at_once, [text] * rows_at_once)
                        for _ in range(waves)
                    ]
                    row = _combine(parts) | {"lookahead": flag, "rows": rows_at_once}
                    rows.append(row)
                    print(
                        f"[bench-api] lookahead {name:5s} rows={rows_at_once} "
                        f"{'on ' if flag else 'off'}: {row['ms_per_step']:7.2f} ms/step, "
                        f"{row['audio_s_per_s']:6.2f} audio s/s, batch {row['mean_batch']:.2f}",
                        flush=True,
                    )
        for engine in engines.values():
            engine.close()
        summary = {}
        for rows_at_once in LOOKAHEAD_ROWS:
            picked = [r for r in rows if r["rows"] == rows_at_once]
            off = {k: _median(picked, False, k) for k in ("ms_per_step", "audio_s_per_s")}
            on = {k: _median(picked, True, k) for k in ("ms_per_step", "audio_s_per_s")}
            summary[str(rows_at_once)] = {
                "ms_per_step_off": off["ms_per_step"],
                "ms_per_step_on": on["ms_per_step"],
                "ms_saved_per_step": off["ms_per_step"] - on["ms_per_step"],
                "audio_s_per_s_off": off["audio_s_per_s"],
                "audio_s_per_s_on": on["audio_s_per_s"],
            }
        out[name] = {"rows": rows, "summary": summary}
    return out


def _combine(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Several `measure` results as one: totals, and per-step and per-second rates of them."""
    steps = sum(p["steps"] for p in parts)
    audio, wall = sum(p["audio_s"] for p in parts), sum(p["wall_s"] for p in parts)
    busy = sum(p["decode_busy_s"] for p in parts)
    return {
        "waves": len(parts),
        "steps": steps,
        "audio_s": audio,
        "wall_s": wall,
        "audio_s_per_s": audio / wall,
        "decode_busy_s": busy,
        "ms_per_step": 1000 * busy / steps,
        "mean_batch": sum(p["mean_batch"] * p["steps"] for p in parts) / steps,
        "loadavg": parts[-1]["loadavg"],
    }


def _median(rows: list[dict[str, Any]], lookahead_on: bool, key: str) -> float:
    return float(np.median([r[key] for r in rows if r["lookahead"] is lookahead_on]))


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.results_io import save_figure

    summary = results["throughput"]["summary"]
    looks = results.get("lookahead", {})
    figure, axes = plt.subplots(1, 1 + len(looks), figsize=(5.5 * (1 + len(looks)), 4))
    axes = np.atleast_1d(axes)
    labels = list(summary)
    x = np.arange(len(labels))
    ones = [summary[k]["audio_s_per_s_1"] for k in labels]
    many = [summary[k][f"audio_s_per_s_{CONCURRENCY}"] for k in labels]
    axes[0].bar(x - 0.2, ones, 0.4, label="1 request at a time")
    axes[0].bar(x + 0.2, many, 0.4, label=f"{CONCURRENCY} concurrent")
    for i, key in enumerate(labels):
        axes[0].annotate(f"{summary[key]['ratio']:.2f}x", (i + 0.2, many[i]), ha="center")
    axes[0].set_xticks(x, [k.replace("_", "\n") for k in labels])
    axes[0].set_ylabel("audio seconds per wall second")
    axes[0].set_title(f"default voice, {len(results['sentences'])} held-out sentences")
    axes[0].legend(fontsize=8)
    for axis, (name, data) in zip(axes[1:], looks.items(), strict=True):
        rows = [int(r) for r in data["summary"]]
        for flag, style in (("off", "o-"), ("on", "s-")):
            steps = [data["summary"][str(r)][f"ms_per_step_{flag}"] for r in rows]
            axis.plot(rows, steps, style, label=flag)
        axis.set_xticks(rows)
        axis.set_xlabel("rows decoding at once")
        axis.set_ylabel("ms per decode step")
        axis.set_ylim(bottom=0)
        axis.set_title(f"decode lookahead: {name}")
        axis.legend()
    figure.suptitle(f"onnx-tts bench api, {os.cpu_count()} cores (shared)")
    save_figure(figure, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--label", default="after", help=argparse.SUPPRESS)
    parser.add_argument("--model", default="", help=argparse.SUPPRESS)
    parser.add_argument("--max-batch", type=int, default=CONCURRENCY, help=argparse.SUPPRESS)
    parser.add_argument("--passes", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--sentences", type=int, default=len(SENTENCES), help=argparse.SUPPRESS)
    parser.add_argument("--apis", default="synthesize,stream", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="16 sentences, 1 round, voice only")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (2)")
    parser.add_argument("--threads", type=int, help="this tree's threads (default: its own)")
    parser.add_argument("--before-python", help="interpreter of the 'before' checkout")
    parser.add_argument("--before-repo", help="the 'before' checkout (its onnx_tts is imported)")
    parser.add_argument("--before-threads", type=int, help="its threads (default: its own)")
    parser.add_argument(
        "--lookahead-models", default="voice,turbo", help="models of part 2 ('' skips it)"
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)

    repo = Path(__file__).resolve().parents[1]
    if str(repo) not in sys.path:
        sys.path.insert(0, str(repo))
    from benchmarks.results_io import load_average, machine_info, require_tree, write_json
    from export.voice.data import is_heldout

    if bool(args.before_python) != bool(args.before_repo):
        parser.error("--before-python and --before-repo go together")
    if args.before_python:
        require_tree(args.before_python, args.before_repo)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    missing = [s for s in SENTENCES if not is_heldout(s)]
    if missing:
        parser.error(f"not in the voice recipe's held-out split: {missing}")
    if args.quick:
        args.rounds = 1
        args.lookahead_models = "voice" if args.lookahead_models else ""
    results_dir = repo / "benchmarks" / "results"
    args.json = args.json or results_dir / ("api_quick.json" if args.quick else "api.json")
    args.plot = args.plot or args.json.with_suffix(".png")
    results: dict[str, Any] = {
        "benchmark": "api",
        "machine": machine_info(),
        "sentences": list(SENTENCES[: 16 if args.quick else len(SENTENCES)]),
        "concurrency": CONCURRENCY,
        "rounds": args.rounds,
        "before": {"python": args.before_python, "repo": args.before_repo},
    }
    results["throughput"] = throughput(args, repo)
    models = [m for m in args.lookahead_models.split(",") if m]
    if models:
        args.lookahead_models = models
        results["lookahead"] = lookahead(args)
    results["machine"]["loadavg_end"] = load_average()
    write_json(args.json, results)
    plot(results, args.plot)
    print(json.dumps(results["throughput"]["summary"], indent=2))
    for name, data in results.get("lookahead", {}).items():
        print(name, json.dumps(data["summary"]))
    print(f"results: {args.json}, {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

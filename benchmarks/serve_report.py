"""The "Serving" section of docs/BENCHMARKS.md, generated from the `bench serve` and
`bench prefill` results (benchmarks/results/serve.json, prefill.json).

The section is self-contained (its own heading, what was run, the tables, the goals) and is
replaced as a whole on every run: other sections of the file are left as they are.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.results_io import write_atomically

HEADING = "## Serving"
TITLE = "# Benchmarks\n\nResults of `onnx-tts bench ...` runs on this project's machines.\n"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{1000 * value:.0f}"


def _spread(level: dict[str, Any], key: str, scale: float = 1.0, digits: int = 0) -> str:
    low_high = level.get("spread", {}).get(key)
    if not low_high or level.get("rounds") is None or len(level["rounds"]) < 2:
        return ""
    low, high = (scale * v for v in low_high)
    return f" ({low:.{digits}f}-{high:.{digits}f})"


def _row(label: str, level: dict[str, Any]) -> str:
    audio = f"{level['audio_s_per_s']:.1f}{_spread(level, 'audio_s_per_s', digits=1)}"
    ttfa = (
        f"{_ms(level['ttfa_p50_s'])} / {_ms(level['ttfa_p95_s'])}"
        f"{_spread(level, 'ttfa_p95_s', 1000)}"
    )
    underruns = f"{level['underruns']:g}{_spread(level, 'underruns')}, {level['underrun_s']:.2f} s"
    busy = (
        "-"
        if level.get("decode_busy_fraction") is None
        else f"{level['decode_busy_fraction']:.2f} / {level['vocoder_busy_fraction']:.2f}"
    )
    batch = (
        "-"
        if level.get("decode_mean_batch") is None
        else f"{level['decode_mean_batch']:.1f} / {level['vocoder_mean_batch']:.2f}"
    )
    refused = f"{level['refused']:g}" if level.get("refused") else "0"
    return (
        f"| {level['clients']} | {label} | {audio} | {ttfa} | {underruns} | "
        f"{level['strict_underruns']:g} | {refused} | {busy} | {batch} |"
    )


def serving_markdown(
    results: dict[str, Any] | None,
    json_path: Path,
    plot_path: Path,
    prefills: Sequence[tuple[dict[str, Any], Path]] = (),
) -> str:
    """The section for `results` (bench serve's JSON) and `prefills` (bench prefill's, with
    their paths)."""
    lines = [HEADING, ""]
    if results is not None:
        lines += _serve_lines(results, json_path, plot_path)
    if prefills:
        lines += ["", "### Prefill beside the decode step"]
    for prefill, path in prefills:
        lines += _prefill_lines(prefill, path, path.with_suffix(".png"))
    return "\n".join(lines) + "\n"


def _serve_lines(results: dict[str, Any], json_path: Path, plot_path: Path) -> list[str]:
    machine = results["machine"]
    rounds = results.get("rounds", 1)
    lines = [
        "`onnx-tts bench serve` (`benchmarks/bench_serve.py`): live `onnx-tts serve` processes, "
        "each client a real-time player streaming `pcm` requests back to back (playback starts "
        "100 ms after the first byte; an underrun is a chunk that arrives after the player ran "
        "dry, the strict count a player with no buffer). Time to first audio (TTFA) runs from "
        "sending the request to the first audio byte, admission included. The configurations "
        "run side by side, all servers up for the whole run, levels alternating between them; "
        f"every number is the median of {rounds} round(s), (min-max) its spread over the "
        "rounds. "
        f"{machine.get('cpu_count')} shared cores, load average "
        f"{machine['loadavg_start'][0]}-{machine['loadavg_end'][0]} (other work ran beside "
        f"it), onnxruntime {machine.get('onnxruntime')}. Results: `{_rel(json_path)}`, "
        f"plot `{_rel(plot_path)}`.",
        "",
        "Configurations:",
        "",
    ]
    for label, extra in results["models"][next(iter(results["models"]))]["server_args"].items():
        lines.append(f"- **{label}**: {extra}")
    for name, model in results["models"].items():
        lines += [
            "",
            f"### {'Default voice' if name == 'voice' else 'Turbo-shape LM'} ({model['model']})",
            "",
            "| clients | configuration | audio s/s | TTFA p50 / p95 ms | underruns, stalled | "
            "strict underruns | refused | busy decode / vocoder | batch LM / vocoder |",
            "|--:|---|--:|--:|--:|--:|--:|--:|--:|",
        ]
        clients = sorted({lv["clients"] for s in model["servers"].values() for lv in s["levels"]})
        for count in clients:
            for label, server in model["servers"].items():
                level = next((lv for lv in server["levels"] if lv["clients"] == count), None)
                if level is not None:
                    lines.append(_row(label, level))
        ceiling = model["ceiling"]
        lines += [
            "",
            f"Ceiling of the machine for this model in the same run: "
            f"{ceiling['pipeline_ceiling_audio_s_per_s']:.1f} audio s/s through the two one-thread "
            f"stages (each stage's busy seconds per audio second at "
            f"{ceiling['start']['batch']} rows, measured before and after the servers).",
        ]
    goals = results.get("goals", {})
    if goals:
        lines += ["", "Goals (issue 37, default voice):", ""]
        for label, mine in goals.items():
            parts = []
            for goal, value in mine.items():
                parts.append(f"{goal.replace('_', ' ')}: {'met' if value['met'] else 'NOT met'}")
            lines.append(f"- {label}: " + "; ".join(parts))
    return lines


def _prefill_lines(prefill: dict[str, Any], json_path: Path, plot_path: Path) -> list[str]:
    machine = prefill["machine"]
    lines = [
        "",
        f"`onnx-tts bench prefill` (`benchmarks/bench_prefill.py`): {prefill['model']}; "
        f"{prefill['clients']} closed-loop clients submit streams (a first-audio deadline, then "
        "a listener's clock) back to back, so new prompts keep arriving while other rows "
        "decode; the LM stage's frames are timed, each request's listener a player starting 100 ms "
        "after its first frame. The scheduler's prefill modes run side by "
        f"side over one loaded model, {prefill['seconds_per_mode']:.0f} s each, alternating, "
        f"{prefill['rounds']} round(s): the median, (min-max) the spread. "
        f"{machine.get('cpu_count')} shared cores, load average "
        f"{machine['loadavg_start'][0]}-{machine['loadavg_end'][0]}. Results: "
        f"`{_rel(json_path)}`, plot `{_rel(plot_path)}`.",
        "",
        "| prefill mode | frames/s (all rows) | decoding rows: frame gap p50 / p99 / max ms | "
        "listener underruns (stalled s) | new requests: first frame p50 / p95 ms | LM batch |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for mode, numbers in prefill["summary"].items():

        def cell(key: str, digits: int = 0, numbers: dict[str, Any] = numbers) -> str:
            value = numbers[key]
            if prefill["rounds"] < 2:
                return f"{value['median']:.{digits}f}"
            return (
                f"{value['median']:.{digits}f} ({value['min']:.{digits}f}-"
                f"{value['max']:.{digits}f})"
            )

        underruns = (
            f"{cell('listener_underruns')} ({cell('listener_stall_s', 1)})"
            if "listener_underruns" in numbers
            else "-"
        )
        lines.append(
            f"| {mode} | {cell('frames_per_s', 1)} | {cell('gap_p50_ms')} / "
            f"{cell('gap_p99_ms')} / {cell('gap_max_ms')} | {underruns} | "
            f"{cell('first_frame_p50_ms')} / {cell('first_frame_p95_ms')} | "
            f"{cell('mean_batch', 1)} |"
        )
    return lines


def _rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path(__file__).resolve().parents[1]))
    except ValueError:
        return str(path)


def replace_section(text: str, section: str) -> str:
    """`text` with its "## Serving" section (up to the next "## " heading) replaced by
    `section`, or `section` appended."""
    pattern = re.compile(rf"^{re.escape(HEADING)}\s*$.*?(?=^## |\Z)", re.M | re.S)
    if pattern.search(text):
        return pattern.sub(lambda _: section + "\n", text, count=1).rstrip("\n") + "\n"
    return text.rstrip("\n") + "\n\n" + section


def write_serving_section(path: Path, results_dir: Path) -> None:
    """Write the section into `path` from the latest `serve.json` and `prefill*.json` of
    `results_dir` (any may be missing)."""
    serve = results_dir / "serve.json"
    prefills = [
        (json.loads(path.read_text()), path)
        for path in sorted(results_dir.glob("prefill*.json"))
        if not path.stem.endswith("_quick")
    ]
    section = serving_markdown(
        json.loads(serve.read_text()) if serve.exists() else None,
        serve,
        serve.with_suffix(".png"),
        prefills,
    )
    text = path.read_text() if path.exists() else TITLE
    write_atomically(path, replace_section(text, section).encode("utf-8"))


__all__ = ["replace_section", "serving_markdown", "write_serving_section"]

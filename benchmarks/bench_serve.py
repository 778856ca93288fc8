"""Load benchmark of `onnx-tts serve` (issues 15, 28, 37): real-time streaming players against a
live server, before (an older checkout) and after, and variants of this tree's server, side by
side in one run, with the machine's ceiling measured in the same run.

``onnx-tts bench serve [--quick] [--rounds 3] [--clients 4,8,16,32] [--models voice,turbo]``
``    [--before-python PY --before-repo DIR] [--variants 'NAME=SERVE ARGS;...']``
``    [--json PATH] [--plot PATH] [--markdown docs/BENCHMARKS.md]``

Models: the bundled default voice, and a Turbo-shape Chatterbox bundle (synthetic weights at
Turbo's LM size, converted for the in-place KV cache: benchmarks/serve_models.py).

Clients: for each count every client thread sends streaming requests one after another
(``response_format: pcm``, ``stream_format: audio``, the model's default voice) for a window of
`--seconds` and plays them as a real-time player would: playback starts 100 ms after the first
byte (``PlaybackClock(buffer_seconds=0.1)``); an underrun is a chunk that arrives after the
player ran dry, its stall the time the player sat silent. The strict count (a player that
starts at the first byte) is reported too. A refused request (429) is counted, and the client
waits its ``Retry-After`` before its next request. At the window's end, streams still playing
are cut (their bytes up to then count).

Per configuration and level: audio seconds received per wall second of the window, time to
first audio (request sent -> first audio byte, including any wait for admission) p50/p95/p99,
underruns and stall seconds (100 ms buffer; strict), refused, errors; from /metrics deltas
over the window: each stage's busy fraction and mean batch, the admission's capacity estimate.

Servers: "after" is this tree's server with its defaults; "before" (with --before-python and
--before-repo) the older checkout's server with its defaults; `--variants` adds servers of
this tree with other `serve` arguments. All stay up for the whole run. Each round runs every
level on every server, the servers' order reversed from level to level and from round to
round, so they see the same machine; a level's numbers are the median over the rounds, with
the spread (min-max) beside them (the machine is shared). Before the levels each server is
warmed up with as many streams at once as the largest level (sessions, batch shapes, and the
slot buffer grown to its rows: it grows once per process).

Ceiling (this tree's engine, in this process, before and after the servers): each stage's busy
seconds per audio second for one stream alone and for `max_batch` streams at once. A stage is
one worker thread, so the pipeline sustains about 1 / (the busier stage's batched cost) audio
seconds per second.

`--markdown` writes the summary (`serve_report.py`, with the latest `bench prefill` result
beside this one's) as the "Serving" section of that file.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

if __package__ in (None, ""):  # run as a script: make `benchmarks` and `onnx_tts` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.live_server import LiveServer, ServerFailed
from benchmarks.results_io import (
    load_average,
    machine_info,
    require_tree,
    save_figure,
    write_json,
)
from onnx_tts.decoding.request import PlaybackClock
from onnx_tts.server.encoding import wav_stream_header

RESULTS_DIR = Path(__file__).resolve().parent / "results"
TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "A rainbow is a division of white light into many beautiful colors.",
    "When the sunlight strikes raindrops in the air, they act as a prism and form a rainbow.",
)
LEVELS = (1, 4, 8, 16, 32)
ROUNDS = 3
# Numbers of a level summarised over rounds (median, and the spread min-max).
ROUND_METRICS = (
    "audio_s_per_s",
    "ttfa_p50_s",
    "ttfa_p95_s",
    "ttfa_p99_s",
    "underruns",
    "underrun_s",
    "strict_underruns",
    "refused",
    "errors",
    "admitted",
    "decode_busy_fraction",
    "vocoder_busy_fraction",
    "decode_mean_batch",
    "vocoder_mean_batch",
    "admission_capacity",
)
PLAYER_BUFFER_S = 0.1
# Seconds of each level's window (the quick run's in brackets): Turbo's requests take seconds.
WINDOW_S = {"voice": 20.0, "turbo": 40.0}
QUICK_WINDOW_S = {"voice": 6.0, "turbo": 15.0}
SETTLE_LIMIT_S = 90.0
# Goals (issues 28 and 37, default voice).
GOAL_TTFA_P95_S = 0.150
GOAL_SPEEDUP_16 = 1.5
# Metrics read from /metrics (both trees have the first ones; the stage metrics are new).
STAGE_METRICS = ("onnx_tts_stage_busy_seconds", "onnx_tts_stage_items", "onnx_tts_stage_runs")


# -- one client -----------------------------------------------------------------------------------
def stream_once(
    client: httpx.Client, url: str, text: str, stop_at: float, response_format: str = "pcm"
) -> dict[str, Any]:
    """One streamed request (`pcm` or `wav`), played by a 100 ms-buffer player and a strict
    one; cut at `stop_at` (perf_counter) if still playing."""
    body = {"input": text, "response_format": response_format, "stream_format": "audio"}
    player, strict = PlaybackClock(PLAYER_BUFFER_S), PlaybackClock(0.0)
    start = time.perf_counter()
    first: float | None = None
    received = 0
    outcome: dict[str, Any] = {"status": None, "error": None, "retry_after": None, "cut": False}
    rate = 1
    try:
        with client.stream("POST", url + "/v1/audio/speech", json=body) as response:
            outcome["status"] = response.status_code
            if response.status_code != 200:
                response.read()
                if response.status_code == 429:
                    outcome["retry_after"] = float(response.headers.get("retry-after", "1"))
                else:
                    outcome["error"] = f"HTTP {response.status_code}: {response.text[:120]}"
            else:
                rate = int(response.headers["x-sample-rate"])
                channels = int(response.headers.get("x-channels", "1"))
                header = len(wav_stream_header(rate, channels)) if response_format == "wav" else 0
                for chunk in response.iter_bytes():
                    now = time.perf_counter()
                    if now >= stop_at:
                        outcome["cut"] = True
                        break
                    if header:  # a WAV's header is not audio
                        skipped, header = min(header, len(chunk)), header - min(header, len(chunk))
                        chunk = chunk[skipped:]
                        if not chunk:
                            continue
                    if first is None:
                        first = now - start
                    received += len(chunk) / channels
                    seconds = len(chunk) / channels / 2 / rate
                    player.chunk(now, seconds)
                    strict.chunk(now, seconds)
    except httpx.HTTPError as failure:
        outcome["error"] = f"{type(failure).__name__}: {failure}"
    return {
        **outcome,
        "ttfa_s": first,
        "audio_s": received / 2 / rate,
        "underruns": player.underruns,
        "underrun_s": player.stalled,
        "strict_underruns": strict.underruns,
    }


def run_level(url: str, clients: int, window: float) -> dict[str, Any]:
    """`clients` real-time players for `window` seconds; stage counters from /metrics."""
    results: list[dict[str, Any]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(clients + 1)
    times: dict[str, float] = {}

    def client_thread(index: int) -> None:
        with httpx.Client(timeout=httpx.Timeout(600.0, connect=30.0)) as client:
            barrier.wait()
            stop_at = times["stop"]
            n = 0
            while time.perf_counter() < stop_at:
                outcome = stream_once(client, url, TEXTS[(index + n) % len(TEXTS)], stop_at)
                n += 1
                with lock:
                    results.append(outcome)
                if outcome["retry_after"] is not None:  # honour Retry-After (within the window)
                    time.sleep(max(0.0, min(outcome["retry_after"], stop_at - time.perf_counter())))
                elif outcome["error"] is not None:
                    time.sleep(0.5)

    threads = [threading.Thread(target=client_thread, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    metrics_before = scrape(url)
    load_before = os.getloadavg()[0]
    times["start"] = time.perf_counter()
    times["stop"] = times["start"] + window
    barrier.wait()
    time.sleep(window)
    metrics_after = scrape(url)
    load_after = os.getloadavg()[0]
    for thread in threads:
        thread.join()
    tail = time.perf_counter() - times["stop"]
    return summarize_level(clients, window, results, metrics_before, metrics_after) | {
        "tail_s": tail,
        "loadavg_1m": [round(load_before, 2), round(load_after, 2)],
    }


def run_burst(url: str, clients: int, requests: int, texts: tuple[str, ...]) -> dict[str, Any]:
    """`clients` players that start at the same moment, each streaming `requests` WAV
    requests one after another (texts in turn): time to first audio of every request, the
    first wave's apart, and the players' underruns."""
    results: list[dict[str, Any]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(clients)

    def client_thread(index: int) -> None:
        with httpx.Client(timeout=httpx.Timeout(600.0, connect=30.0)) as client:
            barrier.wait()
            for n in range(requests):
                text = texts[(index * requests + n) % len(texts)]
                outcome = stream_once(client, url, text, float("inf"), "wav")
                with lock:
                    results.append({**outcome, "wave": n})

    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    threads = [threading.Thread(target=client_thread, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    admitted = [r for r in results if r["status"] == 200]
    ttfa = [r["ttfa_s"] for r in admitted if r["ttfa_s"] is not None]
    first_wave = [r["ttfa_s"] for r in admitted if r["ttfa_s"] is not None and r["wave"] == 0]
    return {
        "clients": clients,
        "requests": len(results),
        "admitted": len(admitted),
        "refused": sum(1 for r in results if r["status"] == 429),
        "errors": sum(1 for r in results if r["error"]),
        "wall_s": wall,
        "audio_s": sum(r["audio_s"] for r in results),
        "ttfa_p50_s": percentile(ttfa, 0.50),
        "ttfa_p95_s": percentile(ttfa, 0.95),
        "ttfa_max_s": max(ttfa) if ttfa else None,
        "first_wave_p95_s": percentile(first_wave, 0.95),
        "ttfa_s": sorted(ttfa),
        "underruns": sum(r["underruns"] for r in admitted),
        "underrun_s": sum(r["underrun_s"] for r in admitted),
        "strict_underruns": sum(r["strict_underruns"] for r in admitted),
        "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


BURST_METRICS = (
    "ttfa_p50_s",
    "ttfa_p95_s",
    "ttfa_max_s",
    "first_wave_p95_s",
    "underruns",
    "strict_underruns",
    "refused",
    "errors",
)


def bench_burst(args: argparse.Namespace, name: str, model: str | None) -> dict[str, Any]:
    """Bursts of `--burst` clients that start together (`--burst-requests` WAV requests
    each, held-out sentences) against every server, `--rounds` rounds, the servers' order
    alternating; each number the median over the rounds with its spread."""
    from benchmarks.bench_api import SENTENCES

    workdir = tempfile.TemporaryDirectory(prefix="onnx-tts-bench-burst-")
    servers = start_servers(args, model, Path(workdir.name))
    raw: dict[str, list[dict[str, Any]]] = {label: [] for label in servers}
    try:
        for server in servers.values():
            warm_up(server.url, args.burst)
        for round_index in range(args.rounds):
            labels = list(servers)
            if round_index % 2:
                labels.reverse()
            for label in labels:
                settle(servers[label].url)
                # Each round its own sentences (no request repeats one of the round before).
                shift = round_index * args.burst * args.burst_requests
                texts = SENTENCES[shift % len(SENTENCES) :] + SENTENCES[: shift % len(SENTENCES)]
                burst = run_burst(servers[label].url, args.burst, args.burst_requests, texts)
                burst["round"] = round_index
                raw[label].append(burst)
                print(_burst_line(name, label, burst, round_index), flush=True)
    finally:
        for server in servers.values():
            server.stop()
        workdir.cleanup()
    out: dict[str, Any] = {}
    for label, bursts in raw.items():
        summary: dict[str, Any] = {"spread": {}}
        for key in BURST_METRICS:
            values = [b[key] for b in bursts if b.get(key) is not None]
            summary[key] = statistics.median(values) if values else None
            if values:
                summary["spread"][key] = [min(values), max(values)]
        summary["rounds"] = bursts
        summary["goal_ttfa_p95_met"] = (
            summary["ttfa_p95_s"] is not None and summary["ttfa_p95_s"] <= GOAL_TTFA_P95_S
        )
        summary["goal_no_underruns_met"] = summary["spread"].get("underruns", [0, 0])[1] == 0
        out[label] = summary
    return {
        "model": model or "bundled default voice",
        "clients": args.burst,
        "requests_per_client": args.burst_requests,
        "rounds": args.rounds,
        "server_args": {label: args_of(args, label) for label in servers},
        "servers": out,
    }


def _burst_line(model: str, label: str, burst: dict[str, Any], round_index: int) -> str:
    return (
        f"[bench-serve] {model:5s} r{round_index} {label:16s} burst of {burst['clients']}: "
        f"TTFA p50/p95/max {_ms(burst['ttfa_p50_s'])}{_ms(burst['ttfa_p95_s'])}"
        f"{_ms(burst['ttfa_max_s'])} ms (first wave p95 {_ms(burst['first_wave_p95_s'])} ms)  "
        f"underruns {burst['underruns']} (strict {burst['strict_underruns']})  refused "
        f"{burst['refused']}  errors {burst['errors']}  load {burst['loadavg_1m'][1]}"
    )


def percentile(values: list[float], q: float) -> float | None:
    """Nearest rank: the value at or above q of the samples (no interpolation)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, int(-(-q * len(ordered) // 1)) - 1))
    return ordered[rank]


def summarize_level(
    clients: int,
    window: float,
    results: list[dict[str, Any]],
    before: dict[str, float],
    after: dict[str, float],
) -> dict[str, Any]:
    admitted = [r for r in results if r["status"] == 200]
    ttfa = [r["ttfa_s"] for r in admitted if r["ttfa_s"] is not None]
    errors = [r["error"] for r in results if r["error"]]
    audio = sum(r["audio_s"] for r in results)
    level: dict[str, Any] = {
        "clients": clients,
        "window_s": window,
        "requests": len(results),
        "admitted": len(admitted),
        "completed": sum(1 for r in admitted if not r["cut"] and not r["error"]),
        "cut_at_window_end": sum(1 for r in admitted if r["cut"]),
        "refused": sum(1 for r in results if r["status"] == 429),
        "errors": len(errors),
        "error_examples": errors[:3],
        "audio_s": audio,
        "audio_s_per_s": audio / window,
        "ttfa_p50_s": percentile(ttfa, 0.50),
        "ttfa_p95_s": percentile(ttfa, 0.95),
        "ttfa_p99_s": percentile(ttfa, 0.99),
        "ttfa_max_s": max(ttfa) if ttfa else None,
        "underruns": sum(r["underruns"] for r in admitted),
        "underrun_s": sum(r["underrun_s"] for r in admitted),
        "streams_with_underrun": sum(1 for r in admitted if r["underruns"]),
        "strict_underruns": sum(r["strict_underruns"] for r in admitted),
        "streams_with_strict_underrun": sum(1 for r in admitted if r["strict_underruns"]),
    }
    delta = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after}
    for stage in ("decode", "vocoder"):
        busy = delta.get(f"onnx_tts_stage_busy_seconds{{stage={stage}}}")
        items = delta.get(f"onnx_tts_stage_items{{stage={stage}}}")
        runs = delta.get(f"onnx_tts_stage_runs{{stage={stage}}}")
        level[f"{stage}_busy_fraction"] = None if busy is None else busy / window
        level[f"{stage}_mean_batch"] = items / runs if items is not None and runs else None
    level["admission_capacity"] = after.get("onnx_tts_admission_capacity")
    level["server_refused"] = delta.get("onnx_tts_refused_requests_total")
    return level


def scrape(url: str) -> dict[str, float]:
    """The /metrics samples this benchmark reads, summed over models: `name{stage=...}` for the
    stage metrics, `name` for the others."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = httpx.get(url + "/metrics", timeout=30).text
    except httpx.HTTPError:
        return {}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name.startswith(STAGE_METRICS):
                name = f"{name.removesuffix('_total')}{{stage={sample.labels.get('stage')}}}"
            elif name not in (
                "onnx_tts_admission_capacity",
                "onnx_tts_refused_requests_total",
                "onnx_tts_active_generations",
                "onnx_tts_queue_depth",
            ):
                continue
            out[name] = out.get(name, 0.0) + sample.value
    return out


def settle(url: str) -> None:
    """Wait until the server generates nothing (cut streams of the last level wound down)."""
    deadline = time.monotonic() + SETTLE_LIMIT_S
    while time.monotonic() < deadline:
        metrics = scrape(url)
        if not metrics.get("onnx_tts_active_generations") and not metrics.get(
            "onnx_tts_queue_depth"
        ):
            return
        time.sleep(0.25)


def warm_up(url: str, concurrency: int = 4) -> None:
    """A few requests, one and then `concurrency` at once (sessions, voice, batch shapes, the
    slot buffer's rows)."""
    with httpx.Client(timeout=600) as client:
        for text in TEXTS[:2]:
            stream_once(client, url, text, float("inf"))
    with ThreadPoolExecutor(concurrency) as pool:
        list(
            pool.map(lambda i: warm_up_one(url, TEXTS[i % len(TEXTS)]), range(max(4, concurrency)))
        )


def warm_up_one(url: str, text: str) -> None:
    with httpx.Client(timeout=600) as client:
        stream_once(client, url, text, float("inf"))


# -- the machine's ceiling ------------------------------------------------------------------------
def measure_ceiling(model: str | None, batch: int, requests_alone: int) -> dict[str, Any]:
    """Per-stage busy seconds per audio second, one stream alone and `batch` at once, on this
    tree's engine with the server's default settings."""
    import onnx_tts

    engine = onnx_tts.load(model, cache_dir=None, result_cache_dir=None, max_batch=batch)

    def one(index: int) -> float:
        samples = 0
        for chunk in engine.stream(TEXTS[index % len(TEXTS)], seed=index):
            samples += len(chunk)
        return samples / engine.sample_rate

    def run(concurrency: int, count: int) -> dict[str, float]:
        before = engine.stats()
        start = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            audio = sum(pool.map(one, range(count)))
        wall = time.perf_counter() - start
        after = engine.stats()
        steps = after["steps"] - before["steps"]
        calls = after["vocoder"]["calls"] - before["vocoder"]["calls"]
        return {
            "audio_s": audio,
            "wall_s": wall,
            "audio_s_per_s": audio / wall,
            "decode_s_per_audio_s": (after["busy_seconds"] - before["busy_seconds"]) / audio,
            "vocoder_s_per_audio_s": (
                after["vocoder"]["busy_seconds"] - before["vocoder"]["busy_seconds"]
            )
            / audio,
            "decode_ms_per_step": 1000
            * (after["busy_seconds"] - before["busy_seconds"])
            / max(1, steps),
            "mean_batch": (after["row_steps"] - before["row_steps"]) / max(1, steps),
            "mean_vocoder_batch": (after["vocoder"]["windows"] - before["vocoder"]["windows"])
            / max(1, calls),
        }

    try:
        run(min(batch, 4), min(batch, 4))  # warm-up
        alone = run(1, requests_alone)
        batched = run(batch, batch * max(1, requests_alone // 2))
    finally:
        engine.close()
    cores = os.cpu_count() or 1
    busiest = max(batched["decode_s_per_audio_s"], batched["vocoder_s_per_audio_s"])
    total = batched["decode_s_per_audio_s"] + batched["vocoder_s_per_audio_s"]
    return {
        "batch": batch,
        "cores": cores,
        "alone": alone,
        "batched": batched,
        "pipeline_ceiling_audio_s_per_s": 1 / busiest,
        "all_cores_ceiling_audio_s_per_s": cores / total,
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }


# -- servers --------------------------------------------------------------------------------------
class OldTreeServer(LiveServer):
    """The 'before' checkout's server, run by its own interpreter from its own directory."""

    def __init__(self, python: str, repo: Path, workdir: Path, *extra: str) -> None:
        self._python, self._repo = python, repo
        super().__init__(workdir, *extra)

    def _command(self) -> tuple[list[str], dict[str, str], Path | None]:
        env = {**os.environ, "PYTHONPATH": str(self._repo)}
        return [self._python, "-m", "onnx_tts.server"], env, self._repo


def start_servers(
    args: argparse.Namespace, model: str | None, workdir: Path
) -> dict[str, LiveServer]:
    common = ["--log-level", "warning", "--result-cache-dir", "none"]
    if model:
        common += ["--model", model]
    servers: dict[str, LiveServer] = {}
    try:
        if args.before_python:
            servers["before"] = OldTreeServer(
                args.before_python, Path(args.before_repo), workdir / "before", *common
            )
        servers["after"] = LiveServer(workdir / "after", *common, *args.server_args.split())
        for index, (label, extra) in enumerate(args.variants):
            servers[label] = LiveServer(workdir / f"variant-{index}", *common, *extra.split())
    except ServerFailed:
        for server in servers.values():
            server.stop()
        raise
    return servers


def parse_variants(text: str) -> list[tuple[str, str]]:
    """'NAME=ARGS;NAME=ARGS' -> [(name, args)]."""
    variants = []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        name, sep, extra = item.partition("=")
        if not sep or not name.strip() or name.strip() in ("before", "after"):
            raise ValueError(f"a variant is NAME=SERVE ARGS (not before/after), got {item!r}")
        variants.append((name.strip(), extra.strip()))
    return variants


def summarize_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One level over its rounds: each number's median, its spread (min, max), the rounds."""
    level: dict[str, Any] = {"clients": rounds[0]["clients"], "window_s": rounds[0]["window_s"]}
    spread: dict[str, list[float]] = {}
    for key in ROUND_METRICS:
        values = [r[key] for r in rounds if r.get(key) is not None]
        level[key] = statistics.median(values) if values else None
        if values:
            spread[key] = [min(values), max(values)]
    level["spread"] = spread
    level["rounds"] = rounds
    level["loadavg_1m"] = [rounds[0]["loadavg_1m"][0], rounds[-1]["loadavg_1m"][1]]
    return level


def bench_model(args: argparse.Namespace, name: str, model: str | None) -> dict[str, Any]:
    alone = 2 if name == "turbo" else 4
    ceilings = [measure_ceiling(model, args.max_batch, alone)]
    print(_ceiling_line(name, "start", ceilings[0]), flush=True)
    window = (QUICK_WINDOW_S if args.quick else WINDOW_S)[name]
    workdir = tempfile.TemporaryDirectory(prefix="onnx-tts-bench-serve-")
    servers = start_servers(args, model, Path(workdir.name))
    raw: dict[str, dict[int, list[dict[str, Any]]]] = {label: {} for label in servers}
    try:
        for server in servers.values():
            warm_up(server.url, max(args.levels))
        turn = 0
        for round_index in range(args.rounds):
            for clients in args.levels:
                labels = list(servers)
                if turn % 2:
                    labels.reverse()
                turn += 1
                for label in labels:
                    settle(servers[label].url)
                    level = run_level(servers[label].url, clients, window)
                    level["round"] = round_index
                    raw[label].setdefault(clients, []).append(level)
                    print(_line(name, label, level, round_index), flush=True)
    finally:
        for server in servers.values():
            server.stop()
        workdir.cleanup()
    # The machine is shared: its ceiling is measured before and after the levels.
    ceilings.append(measure_ceiling(model, args.max_batch, alone))
    print(_ceiling_line(name, "end", ceilings[1]), flush=True)
    key = "pipeline_ceiling_audio_s_per_s"
    results: dict[str, Any] = {
        "model": model or "bundled default voice",
        "window_s": window,
        "rounds": args.rounds,
        "server_args": {label: args_of(args, label) for label in servers},
        "servers": {
            label: {"levels": [summarize_rounds(raw[label][c]) for c in args.levels]}
            for label in servers
        },
        "ceiling": {
            "start": ceilings[0],
            "end": ceilings[1],
            key: (ceilings[0][key] + ceilings[1][key]) / 2,
            "all_cores_ceiling_audio_s_per_s": (
                ceilings[0]["all_cores_ceiling_audio_s_per_s"]
                + ceilings[1]["all_cores_ceiling_audio_s_per_s"]
            )
            / 2,
        },
    }
    for server in results["servers"].values():
        for level in server["levels"]:
            level["fraction_of_ceiling"] = level["audio_s_per_s"] / results["ceiling"][key]
    return results


def args_of(args: argparse.Namespace, label: str) -> str:
    """The `serve` arguments a server ran with, beside the common ones."""
    if label == "before":
        return f"(checkout {args.before_repo}, its defaults)"
    if label == "after":
        return args.server_args or "(defaults)"
    return dict(args.variants)[label]


def _ceiling_line(name: str, when: str, ceiling: dict[str, Any]) -> str:
    return (
        f"[bench-serve] {name}: ceiling ({when}) {ceiling['pipeline_ceiling_audio_s_per_s']:.1f} "
        f"audio s/s (one stream alone {ceiling['alone']['audio_s_per_s']:.1f}; decode "
        f"{ceiling['batched']['decode_s_per_audio_s']:.3f}, vocoder "
        f"{ceiling['batched']['vocoder_s_per_audio_s']:.3f} s per audio s at mean batch "
        f"{ceiling['batched']['mean_batch']:.1f}; load {ceiling['loadavg_1m']})"
    )


def _ms(value: float | None) -> str:
    return "   -  " if value is None else f"{1000 * value:6.0f}"


def _line(model: str, label: str, level: dict[str, Any], round_index: int = 0) -> str:
    batch = level.get("decode_mean_batch")
    return (
        f"[bench-serve] {model:5s} r{round_index} {label:16s} {level['clients']:3d} clients: "
        f"{level['audio_s_per_s']:6.1f} audio s/s  TTFA p50/p95/p99 "
        f"{_ms(level['ttfa_p50_s'])}{_ms(level['ttfa_p95_s'])}"
        f"{_ms(level['ttfa_p99_s'])} ms  underruns {level['underruns']} "
        f"({level['underrun_s']:.2f} s; strict "
        f"{level['strict_underruns']})  refused {level['refused']}  errors {level['errors']}  "
        f"batch {'-' if batch is None else f'{batch:.1f}'}  load {level['loadavg_1m'][1]}"
    )


# -- goals, plot ----------------------------------------------------------------------------------
def level_of(results: dict[str, Any], model: str, label: str, clients: int) -> dict | None:
    server = results["models"].get(model, {}).get("servers", {}).get(label)
    if server is None:
        return None
    return next((lv for lv in server["levels"] if lv["clients"] == clients), None)


def goals(results: dict[str, Any]) -> dict[str, Any]:
    """The issues' server goals on the default voice, for each configuration of this tree, from
    this run's numbers: time to first audio p95 at 8 clients (median over rounds) within
    150 ms, no underrun at 8 clients in any round, 16 clients at least the audio s/s of 8
    (medians), and 16 clients at 1.5x the before server's audio s/s."""
    out: dict[str, Any] = {}
    servers = results["models"].get("voice", {}).get("servers", {})
    for label in servers:
        if label == "before":
            continue
        mine: dict[str, Any] = {}
        at8, at16 = level_of(results, "voice", label, 8), level_of(results, "voice", label, 16)
        before16 = level_of(results, "voice", "before", 16)
        if at16 and before16:
            ratio = at16["audio_s_per_s"] / before16["audio_s_per_s"]
            mine["throughput_16_over_before"] = {"value": ratio, "met": ratio >= GOAL_SPEEDUP_16}
        if at16 and at8:
            mine["throughput_16_not_below_8"] = {
                "value": [at8["audio_s_per_s"], at16["audio_s_per_s"]],
                "met": at16["audio_s_per_s"] >= at8["audio_s_per_s"],
            }
        if at8:
            p95 = at8["ttfa_p95_s"]
            mine["ttfa_p95_8_clients"] = {
                "value": p95,
                "spread": at8["spread"].get("ttfa_p95_s"),
                "met": p95 is not None and p95 <= GOAL_TTFA_P95_S,
            }
            worst = at8["spread"].get("underruns", [0, 0])[1]
            mine["no_underruns_8_clients"] = {"value": worst, "met": worst == 0}
        for clients in (16, 32):
            level = level_of(results, "voice", label, clients)
            if level:
                worst = level["spread"].get("underruns", [0, 0])[1]
                mine[f"no_underruns_admitted_{clients}_clients"] = {
                    "value": worst,
                    "met": worst == 0,
                }
        out[label] = mine
    return out


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(results["models"])
    figure, axes = plt.subplots(len(models), 3, figsize=(15, 4 * len(models)), squeeze=False)
    markers = {"before": "o--", "after": "s-"}
    for row, name in enumerate(models):
        data = results["models"][name]
        for index, (label, server) in enumerate(data["servers"].items()):
            levels = server["levels"]
            clients = [lv["clients"] for lv in levels]
            style = {"color": f"C{index}", "label": label}
            fmt = markers.get(label, "^:")
            for column, key, scale in (
                (0, "audio_s_per_s", 1),
                (1, "ttfa_p95_s", 1000),
                (2, "underruns", 1),
            ):
                values, below, above = [], [], []
                for lv in levels:
                    value = scale * (lv[key] or 0)
                    low, high = lv.get("spread", {}).get(key) or (value / scale, value / scale)
                    values.append(value)
                    below.append(value - scale * low)
                    above.append(scale * high - value)
                errors = [below, above]
                axes[row][column].errorbar(
                    clients, values, yerr=errors, fmt=fmt, capsize=3, **style
                )
            if any(lv["refused"] for lv in levels):
                axes[row][2].plot(
                    clients,
                    [lv["refused"] for lv in levels],
                    "x:",
                    color=f"C{index}",
                    alpha=0.6,
                    label=f"{label}: refused (429)",
                )
        ceiling = data["ceiling"]["pipeline_ceiling_audio_s_per_s"]
        axes[row][0].axhline(ceiling, color="grey", ls="--", label="pipeline ceiling")
        axes[row][0].set_ylabel("audio seconds per wall second")
        axes[row][1].set_ylabel("time to first audio p95 (ms)")
        axes[row][2].set_ylabel("underruns, 100 ms buffer (and 429s)")
        if name == "voice":
            axes[row][1].axhline(1000 * GOAL_TTFA_P95_S, color="grey", ls=":", label="goal at 8")
        for column, axis in enumerate(axes[row]):
            axis.set_xscale("log", base=2)
            axis.set_xticks(results["levels"], [str(c) for c in results["levels"]])
            axis.set_xlabel("concurrent real-time players")
            axis.set_ylim(bottom=0)
            axis.grid(alpha=0.3)
            axis.set_title(f"{name}: {('throughput', 'first audio', 'underruns')[column]}")
            axis.legend(fontsize=7)
    figure.suptitle(
        f"onnx-tts serve, streaming pcm, median of {results.get('rounds', 1)} rounds "
        f"(bars: spread), {os.cpu_count()} cores shared "
        f"(load {results['machine']['loadavg_start'][0]}-{results['machine']['loadavg_end'][0]})"
    )
    save_figure(figure, path, dpi=100)


def plot_burst(results: dict[str, Any], path: Path) -> None:
    """`--burst`: each burst's TTFA p95 round by round, and every request's TTFA pooled (its
    distribution), per server, against the 150 ms goal."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(results["models"])
    figure, axes = plt.subplots(len(models), 2, figsize=(12, 4 * len(models)), squeeze=False)
    for row, name in enumerate(models):
        for index, (label, server) in enumerate(results["models"][name]["servers"].items()):
            rounds = server["rounds"]
            style = {"color": f"C{index}", "label": label}
            p95s = [1000 * r["ttfa_p95_s"] for r in rounds]
            axes[row][0].plot(range(len(p95s)), p95s, "o-", **style)
            pooled = sorted(1000 * t for r in rounds for t in r["ttfa_s"])
            shares = [(i + 1) / len(pooled) for i in range(len(pooled))]
            axes[row][1].plot(pooled, shares, **style)
        axes[row][0].set_xlabel("burst")
        axes[row][0].set_ylabel("time to first audio p95 of the burst (ms)")
        axes[row][1].set_xlabel("time to first audio (ms), every request")
        axes[row][1].set_ylabel("share of requests")
        axes[row][1].axhline(0.95, color="grey", ls=":", lw=0.8)
        for column, axis in enumerate(axes[row]):
            (axis.axhline if column == 0 else axis.axvline)(
                1000 * GOAL_TTFA_P95_S, color="grey", ls="--", label="goal"
            )
            axis.grid(alpha=0.3)
            axis.set_title(f"{name}: {('each burst', 'pooled')[column]}")
            axis.legend(fontsize=7)
        axes[row][0].set_ylim(bottom=0)
    clients = next(iter(results["models"].values()))["clients"]
    figure.suptitle(
        f"onnx-tts serve, bursts of {clients} streaming clients that start together, "
        f"{os.cpu_count()} cores shared"
    )
    save_figure(figure, path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1/4/8 clients, short windows")
    parser.add_argument("--clients", default=",".join(map(str, LEVELS)), help="client counts")
    parser.add_argument(
        "--models", default="voice,turbo", help="voice (bundled) and/or turbo (Turbo shape)"
    )
    parser.add_argument("--max-batch", type=int, default=8, help="ceiling: rows at once (8)")
    parser.add_argument("--server-args", default="", help="extra `serve` arguments of 'after'")
    parser.add_argument("--before-python", help="interpreter of the 'before' checkout")
    parser.add_argument("--before-repo", help="the 'before' checkout (run from its directory)")
    parser.add_argument(
        "--variants",
        default="",
        help="more servers of this tree: 'NAME=SERVE ARGS;NAME=SERVE ARGS'",
    )
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="rounds of every level (3)")
    parser.add_argument(
        "--burst",
        type=int,
        default=0,
        help="instead of the steady levels: bursts of this many clients that start together "
        "(WAV, held-out sentences; beside the steady-state levels, which start clients apart)",
    )
    parser.add_argument(
        "--burst-requests", type=int, default=3, help="--burst: requests per client (3)"
    )
    parser.add_argument(
        "--markdown", type=Path, help="write the summary as the Serving section of this file"
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args(argv)
    try:
        args.levels = [int(c) for c in args.clients.split(",")]
    except ValueError:
        parser.error("--clients takes comma-separated integers")
    try:
        args.variants = parse_variants(args.variants)
    except ValueError as error:
        parser.error(str(error))
    if not 1 <= args.rounds <= 20:
        parser.error("--rounds must be 1-20")
    models = [m for m in args.models.split(",") if m]
    if not models or set(models) - {"voice", "turbo"}:
        parser.error("--models takes voice and/or turbo")
    if bool(args.before_python) != bool(args.before_repo):
        parser.error("--before-python and --before-repo go together")
    if args.before_python:
        require_tree(args.before_python, args.before_repo)
    if args.quick:
        args.levels = [c for c in args.levels if c <= 8]
        args.rounds = 1
    if not args.levels or min(args.levels) < 1 or max(args.levels) > 256:
        parser.error("client counts must be 1-256")
    if args.burst:
        return main_burst(args, models)
    suffix = "_quick" if args.quick else ""
    args.json = args.json or RESULTS_DIR / f"serve{suffix}.json"
    args.plot = args.plot or args.json.with_suffix(".png")

    results: dict[str, Any] = {
        "benchmark": "serve",
        "machine": machine_info(),
        "quick": args.quick,
        "texts": list(TEXTS),
        "player_buffer_s": PLAYER_BUFFER_S,
        "before": {"python": args.before_python, "repo": args.before_repo},
        "after_server_args": args.server_args,
        "variants": dict(args.variants),
        "levels": args.levels,
        "rounds": args.rounds,
        "models": {},
    }
    for name in models:
        model = None
        if name == "turbo":
            from benchmarks.serve_models import turbo_bundle

            model = str(turbo_bundle())
        results["models"][name] = bench_model(args, name, model)
    results["machine"]["loadavg_end"] = load_average()
    results["goals"] = goals(results)
    write_json(args.json, results)
    plot(results, args.plot)
    if args.markdown:
        from benchmarks.serve_report import write_serving_section

        write_serving_section(args.markdown, args.json.parent)
    print(json.dumps(results["goals"], indent=2))
    print(f"results: {args.json}, {args.plot}")
    return 0


def main_burst(args: argparse.Namespace, models: list[str]) -> int:
    """`--burst`: the burst runs of every model, their goals (time to first audio p95 within
    150 ms, no underrun in any round) printed and written to serve_burst.json."""
    if not 1 <= args.burst <= 256 or not 1 <= args.burst_requests <= 100:
        raise SystemExit("--burst must be 1-256 clients and --burst-requests 1-100")
    results: dict[str, Any] = {
        "benchmark": "serve --burst",
        "machine": machine_info(),
        "player_buffer_s": PLAYER_BUFFER_S,
        "before": {"python": args.before_python, "repo": args.before_repo},
        "after_server_args": args.server_args,
        "variants": dict(args.variants),
        "models": {},
    }
    for name in models:
        model = None
        if name == "turbo":
            from benchmarks.serve_models import turbo_bundle

            model = str(turbo_bundle())
        results["models"][name] = bench_burst(args, name, model)
    results["machine"]["loadavg_end"] = load_average()
    path = args.json or RESULTS_DIR / "serve_burst.json"
    write_json(path, results)
    plot_burst(results, args.plot or path.with_suffix(".png"))
    for name, data in results["models"].items():
        for label, server in data["servers"].items():
            p95, spread = server["ttfa_p95_s"], server["spread"].get("ttfa_p95_s", [0, 0])
            print(
                f"{name} {label}: TTFA p95 {_ms(p95)} ms ({1000 * spread[0]:.0f}-"
                f"{1000 * spread[1]:.0f}), underruns {server['underruns']} (max "
                f"{server['spread'].get('underruns', [0, 0])[1]}); goals: p95 <= 150 ms "
                f"{'met' if server['goal_ttfa_p95_met'] else 'NOT met'}, no underruns "
                f"{'met' if server['goal_no_underruns_met'] else 'NOT met'}"
            )
    print(f"results: {path}, {args.plot or path.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

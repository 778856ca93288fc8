"""Where a live server's time to first audio goes: per-request timelines under real-time load.

``python benchmarks/serve_timeline.py [--clients 8] [--seconds 20] [--server-args "..."]``
``    [--json PATH] [--py-spy]``

Starts `onnx-tts serve` (this tree, its defaults) in a child process with timing hooks (the
hooks wrap engine and server methods from outside: the runtime is unchanged), drives it with
`bench serve`'s real-time players (each request carries a unique seed, so client and server
records meet), and prints, per phase, the median / p95 of every request's time:

  client send -> handler      HTTP parse, event loop lag before the route runs
  handler -> admitted         stream admission (capacity estimate, FIFO wait)
  admitted -> stream opened   voice lookup, text normalisation + phonemes, plan, submit
  submitted -> row            waiting in the decode scheduler's queue
  row -> prefilled            the request's prefill (its own and what ran with it)
  prefilled -> window frames  decode steps until the first window's frames exist
  window frames -> decoded    the vocoder stage: waiting for its worker, the window's run
  decoded -> polled           the job's task wakes up (event loop)
  polled -> client byte       encode, send, client receive

Experiments (environment of this script): TIMELINE_MIN_LEAD=S sets the deadline policy's lead
rule; TIMELINE_LEADS_OF_ALL=1 has every playing listener hold new streams back (also one that
started after the new request arrived: the rule before issue 43).

Both processes read CLOCK_MONOTONIC (`time.perf_counter` on Linux), so client and server
times are on one clock. `--py-spy` records a profile of the server meanwhile (py-spy from
PyPI: `pip install py-spy`).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results_io import write_json

PHASES = (
    ("send->handler", "client_start", "received"),
    ("handler->admitted", "received", "admitted"),
    ("admitted->stream", "admitted", "stream_opened"),
    ("  of which text", None, None),
    ("submit->row", "submitted", "row"),
    ("row->prefilled", "row", "prefilled"),
    ("prefilled->window frames", "prefilled", "window_frames"),
    ("window frames->decoded", "window_frames", "decoded"),
    ("  of which waiting", "window_frames", "decode_start"),
    ("decoded->polled", "decoded", "polled"),
    ("polled->client byte", "polled", "client_first"),
    ("TTFA (client)", "client_start", "client_first"),
)


# -- the server side: hooks ---------------------------------------------------------------------
def install_hooks(trace_path: str) -> None:
    """Wrap the methods a request passes through; write the records at exit."""
    from onnx_tts.decoding.scheduler import DecodeScheduler
    from onnx_tts.pipeline.stages import VocoderStage, VocoderStream
    from onnx_tts.server.engines import SpeechModel
    from onnx_tts.server.jobs import Generation

    records: dict[int, dict[str, Any]] = {}  # id(cancel token) -> times
    lag: list[float] = []
    lock = threading.Lock()
    local = threading.local()

    def note(token: Any, key: str, value: Any = None, first: bool = True) -> None:
        with lock:
            record = records.setdefault(id(token), {})
            if not first or key not in record:
                record[key] = time.perf_counter() if value is None else value

    original_admit = Generation.admit

    async def admit(self: Generation, timeout: float) -> None:
        note(self.cancel_token, "received", self.received_at)
        note(self.cancel_token, "seed", self.seed)
        _start_lag_monitor(lag)
        await original_admit(self, timeout)
        note(self.cancel_token, "admitted")

    Generation.admit = admit  # type: ignore[method-assign]

    original_stream = SpeechModel.stream

    def stream(self: SpeechModel, *args: Any, **timing: Any) -> Any:
        token = timing.get("cancel")
        note(token, "stream_call")
        local.token = token
        try:
            return original_stream(self, *args, **timing)
        finally:
            local.token = None
            note(token, "stream_opened")

    SpeechModel.stream = stream  # type: ignore[method-assign]

    def wrap_text(model: Any) -> None:
        text = model.engine.model.text
        original_chunks = text.chunks

        def chunks(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original_chunks(*args, **kwargs)
            finally:
                token = getattr(local, "token", None)
                if token is not None:
                    note(token, "text_s", time.perf_counter() - started)

        text.chunks = chunks

    original_track = SpeechModel.track

    def track(self: SpeechModel, job: Any) -> None:
        if not getattr(self, "_timeline_text", False):
            self._timeline_text = True
            wrap_text(self)
        original_track(self, job)

    SpeechModel.track = track  # type: ignore[method-assign]

    original_submit = DecodeScheduler.submit

    def submit(self: DecodeScheduler, request: Any) -> Any:
        note(request.cancel, "submitted")
        return original_submit(self, request)

    DecodeScheduler.submit = submit  # type: ignore[method-assign]

    original_take = DecodeScheduler._take

    def take(self: DecodeScheduler, plan: Any) -> list[int]:
        rows = original_take(self, plan)
        for row in rows:
            request = self.requests[row]
            if request is not None:
                note(request.cancel, "row")
        return rows

    DecodeScheduler._take = take  # type: ignore[method-assign]

    for name in ("_prefill", "_start_prefills", "_join_prefilled"):
        original = getattr(DecodeScheduler, name, None)
        if original is None:
            continue

        def prefill(self: DecodeScheduler, *args: Any, _original: Any = original) -> Any:
            result = _original(self, *args)
            for request in self.requests:
                if request is not None:
                    note(request.cancel, "prefilled")
            return result

        setattr(DecodeScheduler, name, prefill)

    original_put = VocoderStream.put

    def put(self: VocoderStream, frame: Any) -> None:
        original_put(self, frame)
        token = self.request.cancel
        note(token, "first_frame")
        decoder = self.decoder
        if decoder is not None and decoder.frames_received >= decoder.options.first_chunk_frames:
            note(token, "window_frames")

    VocoderStream.put = put  # type: ignore[method-assign]

    original_decode = VocoderStage._decode

    def decode(self: VocoderStage, batch: list) -> None:
        for stream, _ in batch:
            note(stream.request.cancel, "decode_start")
            note(stream.request.cancel, "first_batch", len(batch))
        original_decode(self, batch)
        for stream, _ in batch:
            note(stream.request.cancel, "decoded")

    VocoderStage._decode = decode  # type: ignore[method-assign]

    from onnx_tts.pipeline.execution import AudioStream

    original_poll = AudioStream.poll

    def poll(self: AudioStream) -> Any:
        chunk = original_poll(self)
        if chunk is not None and len(chunk) and self.requests:
            note(self.requests[0].cancel, "polled")
        return chunk

    AudioStream.poll = poll  # type: ignore[method-assign]

    from onnx_tts.decoding.request import PlaybackClock
    from onnx_tts.pipeline.admission import Admission

    stalls: list[tuple[float, int]] = []  # the server's own (strict) clocks: (stall, chunk)
    original_chunk = PlaybackClock.chunk

    def chunk(self: PlaybackClock, now: float, seconds: float) -> float:
        count = getattr(self, "_timeline_chunks", 0)
        self._timeline_chunks = count + 1
        stall = original_chunk(self, now, seconds)
        if stall > 0:
            stalls.append((stall, count))
        return stall

    PlaybackClock.chunk = chunk  # type: ignore[method-assign]

    refusals: dict[str, int] = {}
    original_room = Admission._room

    samples: list[tuple] = []

    def room(self: Admission, arrived: float | None = None) -> bool:
        allowed = original_room(self, arrived)
        if not samples or time.perf_counter() - samples[-1][0] > 0.25:
            samples.append(
                (time.perf_counter(), self.active, self._capacity, self._limit, self.stalls())
            )
        if not allowed:  # why: at capacity (and which bound), or a listener about to run dry
            capacity = self._capacity_now()
            if self.active >= capacity:
                why = "limit from stalls" if self._limit == capacity else "capacity estimate"
            else:
                why = "a listener's lead"
            refusals[why] = refusals.get(why, 0) + 1
        return allowed

    Admission._room = room  # type: ignore[method-assign]

    def dump() -> None:
        with lock:
            data = {
                "requests": list(records.values()),
                "loop_lag_s": lag,
                "admission_refusals": refusals,
                "admission_samples": samples,
                "server_stalls": stalls,
            }
        Path(trace_path).write_text(json.dumps(data))

    atexit.register(dump)


def _start_lag_monitor(lag: list[float]) -> None:
    """Once: a task that sleeps 10 ms at a time and records how late it wakes (loop lag)."""
    import asyncio

    if lag and lag[0] == -1.0:
        return
    lag.append(-1.0)

    async def monitor() -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(0.01)
            lag.append(time.perf_counter() - before - 0.01)

    asyncio.get_running_loop().create_task(monitor())


def serve_main(argv: list[str]) -> int:
    trace = argv[0]
    install_hooks(trace)
    min_lead = os.environ.get("TIMELINE_MIN_LEAD")  # an experiment: the policy's lead rule
    if min_lead is not None:
        from onnx_tts.decoding.policy import DeadlinePolicy

        defaults = DeadlinePolicy.__init__.__defaults__
        assert defaults is not None
        DeadlinePolicy.__init__.__defaults__ = (*defaults[:2], float(min_lead))
    if os.environ.get("TIMELINE_LEADS_OF_ALL"):  # an experiment: the lead rule before issue
        # 43 (every playing listener holds a new stream back, also one that started after it)
        from onnx_tts.server.engines import SpeechModel

        lead = SpeechModel.lead
        SpeechModel.lead = lambda self, arrived=None: lead(self, None)  # type: ignore[method-assign]
    from onnx_tts.cli import main

    return main(["serve", *argv[1:]])


# -- the client side ---------------------------------------------------------------------------
def drive(
    url: str, clients: int, seconds: float, burst: int = 0, bursts: int = 1
) -> list[dict[str, Any]]:
    """`bench serve`'s players, each request with a unique seed and absolute times; with
    `burst` requests per client: `bursts` times, the clients start together and each sends
    that many WAV requests of held-out sentences (`bench serve --burst`)."""
    import httpx

    from benchmarks.bench_serve import PLAYER_BUFFER_S, TEXTS
    from onnx_tts.decoding.request import PlaybackClock

    results: list[dict[str, Any]] = []
    lock = threading.Lock()
    stop_at = time.perf_counter() + seconds
    seeds = iter(range(1_000_000))

    fmt = "wav" if burst else "pcm"

    def one(client: httpx.Client, text: str, seed: int) -> dict[str, Any]:
        body = {"input": text, "response_format": fmt, "stream_format": "audio", "seed": seed}
        player = PlaybackClock(PLAYER_BUFFER_S)
        start = time.perf_counter()
        first = None
        received = 0
        with client.stream("POST", url + "/v1/audio/speech", json=body) as response:
            status = response.status_code
            if status == 200:
                rate = int(response.headers["x-sample-rate"])
                header = 44 if fmt == "wav" else 0
                for chunk in response.iter_bytes():
                    now = time.perf_counter()
                    skipped = min(header, len(chunk))
                    header, chunk = header - skipped, chunk[skipped:]
                    if not chunk:
                        continue
                    first = first or now
                    received += len(chunk) / 2 / rate
                    player.chunk(now, len(chunk) / 2 / rate)
            else:
                response.read()
        return {
            "seed": seed,
            "status": status,
            "client_start": start,
            "client_first": first,
            "underruns": player.underruns,
            "audio_s": received,
        }

    def client_thread(index: int) -> None:
        with httpx.Client(timeout=600) as client:
            n = 0
            while time.perf_counter() < stop_at:
                with lock:
                    seed = next(seeds)
                outcome = one(client, TEXTS[(index + n) % len(TEXTS)], seed)
                n += 1
                with lock:
                    results.append(outcome)
                if outcome["status"] == 429:
                    time.sleep(1.0)

    def burst_thread(index: int, barrier: threading.Barrier, shift: int) -> None:
        from benchmarks.bench_api import SENTENCES

        with httpx.Client(timeout=600) as client:
            barrier.wait()
            for n in range(burst):
                with lock:
                    seed = next(seeds)
                text = SENTENCES[(shift + index * burst + n) % len(SENTENCES)]
                outcome = one(client, text, seed)
                with lock:
                    results.append({**outcome, "wave": n})

    for round_index in range(bursts if burst else 1):
        if burst:
            barrier = threading.Barrier(clients)
            shift = round_index * clients * burst
            targets = [(burst_thread, (i, barrier, shift)) for i in range(clients)]
        else:
            targets = [(client_thread, (i,)) for i in range(clients)]
        threads = [threading.Thread(target=t, args=a) for t, a in targets]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if burst:
            from benchmarks.bench_serve import settle

            settle(url)
    return results


def summarize(client: list[dict[str, Any]], server: dict[str, Any]) -> dict[str, Any]:
    by_seed = {r.get("seed"): r for r in server["requests"] if r.get("seed") is not None}
    merged = [r | by_seed[r["seed"]] for r in client if r["status"] == 200 and r["seed"] in by_seed]
    out: dict[str, Any] = {"requests": len(merged)}
    for name, start, end in PHASES:
        if start is None:
            values = [r["text_s"] for r in merged if "text_s" in r]
        else:
            values = [r[end] - r[start] for r in merged if r.get(start) and r.get(end)]
        if values:
            values.sort()
            out[name] = {
                "p50_ms": 1000 * statistics.median(values),
                "p95_ms": 1000 * values[min(len(values) - 1, int(0.95 * len(values)))],
                "n": len(values),
            }
    batches = [r["first_batch"] for r in merged if "first_batch" in r]
    if batches:
        out["first window's vocoder batch (mean)"] = statistics.mean(batches)
    lag = sorted(x for x in server["loop_lag_s"] if x >= 0)
    if lag:
        out["event loop lag"] = {
            "p50_ms": 1000 * statistics.median(lag),
            "p95_ms": 1000 * lag[int(0.95 * len(lag))],
            "max_ms": 1000 * lag[-1],
        }
    out["underruns"] = sum(r["underruns"] for r in merged)
    out["admission refusals (polls)"] = server.get("admission_refusals", {})
    strict = server.get("server_stalls", [])
    if strict:
        out["server-side strict stalls"] = {
            "count": len(strict),
            "ms p50/max": [1000 * statistics.median(s for s, _ in strict), 1000 * max(strict)[0]],
            "at chunk (count)": {
                str(i): sum(1 for _, c in strict if c == i) for i in sorted({c for _, c in strict})
            },
        }
    samples = server.get("admission_samples", [])
    if samples:
        estimates = [s[2] for s in samples if s[2] is not None]
        limits = [s[3] for s in samples if s[3] is not None]
        out["admission"] = {
            "capacity estimate median": statistics.median(estimates) if estimates else None,
            "limit from stalls median": statistics.median(limits) if limits else None,
            "limit from stalls min": min(limits) if limits else None,
            "server-side (strict) stalls": samples[-1][4] - samples[0][4],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--serve":
        return serve_main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--server-args", default="")
    parser.add_argument(
        "--burst", type=int, default=0, help="requests per client, clients starting together"
    )
    parser.add_argument("--bursts", type=int, default=3, help="--burst: how many bursts")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--py-spy", action="store_true", help="profile the server (py-spy)")
    parser.add_argument(
        "--python", default=sys.executable, help="the server's interpreter (another checkout's)"
    )
    args = parser.parse_args(argv)

    from benchmarks.bench_serve import settle, warm_up
    from benchmarks.live_server import LiveServer

    workdir = Path(tempfile.mkdtemp(prefix="onnx-tts-timeline-"))
    trace = workdir / "trace.json"

    class HookedServer(LiveServer):
        def _command(self) -> tuple[list[str], dict[str, str] | None, Path | None]:
            script = str(Path(__file__).resolve())
            return [args.python, script, "--serve", str(trace)], None, None

    common = ["--log-level", "warning", "--result-cache-dir", "none", *args.server_args.split()]
    server = HookedServer(workdir, *common)
    spy = None
    try:
        warm_up(server.url, args.clients if args.burst else 4)  # (as `bench serve --burst`)
        settle(server.url)
        if args.py_spy:
            spy = subprocess.Popen(
                [
                    "py-spy",
                    "record",
                    "-p",
                    str(server.process.pid),
                    "-d",
                    str(int(args.seconds)),
                    "-o",
                    str(workdir / "profile.txt"),
                    "--format",
                    "raw",
                    "--threads",
                    "--nonblocking",
                ]
            )
        client = drive(server.url, args.clients, args.seconds, args.burst, args.bursts)
    finally:
        server.stop()
        if spy is not None:
            spy.wait()
    server_trace = json.loads(trace.read_text())
    summary = summarize(client, server_trace)
    if args.burst:  # where the first wave's time goes (the clients that start together)
        first = summarize([r for r in client if r.get("wave") == 0], server_trace)
        summary["first wave"] = {k: v for k, v in first.items() if isinstance(v, dict)}
        waves = [[r for r in client if r.get("wave") == n] for n in range(args.burst)]
        summary["ttfa by wave p50/max ms"] = [
            [1000 * statistics.median(t), 1000 * max(t)]
            for t in (
                [r["client_first"] - r["client_start"] for r in w if r["client_first"]]
                for w in waves
            )
            if t
        ]
    summary["audio_s_per_s"] = sum(r.get("audio_s", 0.0) for r in client) / args.seconds
    summary["clients"] = args.clients
    summary["server_args"] = args.server_args
    summary["python"] = args.python
    summary["loadavg_1m"] = os.getloadavg()[0]
    if spy is not None:
        summary["py_spy_profile"] = str(workdir / "profile.txt")
    print(json.dumps(summary, indent=2))
    if args.json:
        write_json(args.json, summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

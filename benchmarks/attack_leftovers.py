"""Round five (issue 43), category "round5": Wyoming's extension values and streamed text,
voice names that normalisation lengthens, every terminating signal to the servers, and the
round-four leftovers (link loops in model directories, a deleted working directory,
`load(cache_dir="none")`). attack_round5 adds its cases (register_cases) in a fixed order.

- Wyoming (`onnx-tts wyoming`): `speed` / `sentence_silence` of 10**400, -10**30, null, in
  `synthesize` and `synthesize-start`: an error event naming the option, and the connection
  goes on; a stream of whitespace-only chunks: an `empty_text` error, then
  `synthesize-stopped`; 8,000 chunks of "a. " after an open "[[" and 120,000 one-character
  chunks: answered (too_long) with the server's CPU within 30 s (it was 117 s and 51 s).
- Names: an upload of 100 x U+0958 (200 characters composed) is 400; 50 of them is stored and
  reachable by its id over HTTP (GET, speech) and Wyoming (describe, synthesize); a record an
  older version stored with such a 200-character name too.
- Signals: SIGHUP, SIGQUIT, SIGUSR1 to `onnx-tts serve` mid-stream drain it (exit 0, no
  traceback); SIGHUP under nohup is ignored; SIGHUP and SIGQUIT stop `onnx-tts wyoming` (0).
- Leftovers: MOSS-TTS-Nano's tokenizer.model and a bundle's vocoder.onnx linked to themselves;
  `synth`, `quantize`, `convert` started in a deleted directory; `load(cache_dir="none")`.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import unicodedata
from pathlib import Path
from typing import Any

import httpx

from benchmarks import attack_tools
from benchmarks.attack_live import (
    CONFIG_STARTERS,
    CORRECT,
    REPO,
    LiveContext,
    Verdict,
    _read_until_type,
    _stopping,
    add,
    cpu_seconds,
    envelope_problem,
    register_probes,
    speechlike,
    wy_event,
    wyoming_audio_problem,
)
from benchmarks.live_server import LiveServer, LiveWyoming

CATEGORY = "round5"
HUGE = json.loads("1" + "0" * 400)  # an integer no float holds
CPU_BOUND_SECONDS = 30.0
STREAMS = {
    "8,000 chunks of 'a. ' after an open '[['": ["[[ "] + ["a. "] * 8000,
    "120,000 one-character chunks": ["a"] * 120_000,
}
RATE = 16000


def register_cases() -> None:
    for field, value, code in (("speed", HUGE, "InputError"),
                               ("sentence_silence", HUGE, "InputError"),
                               ("speed", -(10**30), "InputError"),
                               ("speed", None, "bad_event"),
                               ("sentence_silence", None, "bad_event")):  # fmt: skip
        for event in ("synthesize", "synthesize-start"):
            shown = "10**400" if value is HUGE else repr(value)
            add(CATEGORY, "round5-wyoming", "wy_option", "error", event=event, field=field,
                value=value, code=code, note=f"{event} with {field} = {shown}")  # fmt: skip
    add(CATEGORY, "round5-wyoming", "wy_whitespace", "error",
        note="a stream of whitespace-only chunks")  # fmt: skip
    for what in STREAMS:
        add(CATEGORY, "round5-wyoming", "wy_stream_cpu", "error", stream=what,
            note=f"streamed: {what} (CPU within {CPU_BOUND_SECONDS:g} s)")  # fmt: skip
    add(CATEGORY, "round5-names", "long_name", "error", voice="too long",
        note="upload named 100 x U+0958 (200 characters composed)")  # fmt: skip
    for kind in ("stored", "legacy"):
        add(
            CATEGORY,
            "round5-names",
            "long_name",
            "ok",
            voice=kind,
            note=f"a {kind} voice whose name NFC lengthened, by its id over HTTP and Wyoming",
        )
    for name in ("SIGHUP", "SIGQUIT", "SIGUSR1"):
        add(CATEGORY, "own-round5", "serve_signal", "ok", signame=name,
            note=f"{name} to serve mid-stream: drained, exit 0")  # fmt: skip
    add(CATEGORY, "own-round5", "serve_signal", "ok", signame="SIGHUP", ignored=True,
        note="SIGHUP to serve started under nohup: ignored")  # fmt: skip
    for name in ("SIGHUP", "SIGQUIT"):
        add(CATEGORY, "own-round5", "wyoming_signal", "ok", signame=name,
            note=f"{name} to wyoming mid-synthesis: exit 0")  # fmt: skip
    for what in ("moss tokenizer", "bundle vocoder"):
        add(CATEGORY, "own-round5", "link_loop", "error", what=what,
            note=f"synth with the {what} a link to itself")  # fmt: skip
    for argv, expect in (
        (["synth", "Hello.", "-o", "{out}", "-q"], "ok"),
        (["synth", "Hello.", "-o", "relative.wav"], "error"),
        (["quantize", "{voice}", "relative-out"], "error"),
        (["convert", "--inplace-kv", "{voice}", "relative-out"], "error"),
    ):
        add(CATEGORY, "own-round5", "deleted_cwd", expect, argv=argv,
            note=f"{' '.join(argv[:3])} started in a deleted directory")  # fmt: skip
    add(CATEGORY, "own-round5", "cache_dir_none", "ok", note='load(cache_dir="none")')


# == Wyoming ====================================================================================
def start_wyoming(ctx: LiveContext) -> None:
    ctx.servers.append(ctx.stack.enter_context(_stopping(LiveWyoming(ctx.root))))


CONFIG_STARTERS["round5-wyoming"] = start_wyoming


def _exchange(ctx: LiveContext, events: list[bytes], until: tuple[str, ...],
              limit: float = 300.0) -> list[dict]:  # fmt: skip
    with socket.create_connection(("127.0.0.1", ctx.port), timeout=60) as sock:
        sock.sendall(b"".join(events))
        found, _ = _read_until_type(sock, until, limit)
    return found


def _one_error(events: list[dict], code: str) -> Verdict | None:
    errors = [e["data"] for e in events if e["type"] == "error"]
    if len(errors) != 1:
        return Verdict("silently wrong", f"{len(errors)} error events")
    if errors[0].get("code") != code or "\n" in errors[0].get("text", ""):
        return Verdict("silently wrong", f"error {errors[0]}")
    return None


def probe_wy_option(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    fields = {case["field"]: case["value"]}
    if case["event"] == "synthesize":
        sent = [wy_event("synthesize", {"text": "Hi.", **fields})]
    else:
        sent = [wy_event("synthesize-start", fields),
                wy_event("synthesize-chunk", {"text": "Hi there."}),
                wy_event("synthesize-stop")]  # fmt: skip
    sent.append(wy_event("synthesize", {"text": "Still here."}))
    events = _exchange(ctx, sent, ("audio-stop",))
    problem = _one_error(events, case["code"])
    if problem:
        return problem
    if wyoming_audio_problem(events):
        return Verdict("silently wrong", "the connection did not go on: " +
                       wyoming_audio_problem(events))  # fmt: skip
    return Verdict("clear error")


def probe_wy_whitespace(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    sent = [wy_event("synthesize-start", {})]
    sent += [wy_event("synthesize-chunk", {"text": t}) for t in (" ", "\n", "\t ", "\u3000")]
    events = _exchange(ctx, [*sent, wy_event("synthesize-stop")], ("synthesize-stopped",))
    problem = _one_error(events, "empty_text")
    if problem:
        return problem
    spoke = any(e["type"] == "audio-start" for e in events)
    if events[-1]["type"] != "synthesize-stopped" or spoke:
        return Verdict("silently wrong", f"events {[e['type'] for e in events]}")
    return Verdict("clear error")


def probe_wy_stream_cpu(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    pid = ctx.server.process.pid
    before = cpu_seconds(pid)
    sent = [wy_event("synthesize-start", {})]
    sent += [wy_event("synthesize-chunk", {"text": t}) for t in STREAMS[case["stream"]]]
    events = _exchange(ctx, [*sent, wy_event("synthesize-stop")], ("synthesize-stopped",), 1800)
    used = cpu_seconds(pid) - before
    if used > CPU_BOUND_SECONDS:
        return Verdict("runaway", f"{used:.1f} CPU seconds for one stream")
    return _one_error(events, "too_long") or Verdict("clear error", f"{used:.1f} CPU seconds")


# == names ======================================================================================
def start_names(ctx: LiveContext) -> None:
    ctx.servers.append(ctx.stack.enter_context(_stopping(LiveServer(ctx.root))))


CONFIG_STARTERS["round5-names"] = start_names


def _upload(ctx: LiveContext, name: str, seed: int) -> httpx.Response:
    import io

    import soundfile

    buffer = io.BytesIO()
    soundfile.write(buffer, speechlike(2.0, RATE, seed), RATE, format="WAV")
    return httpx.post(ctx.url + "/v1/audio/voices", files={"audio_sample": ("v.wav",
                      buffer.getvalue())}, data={"name": name}, timeout=120)  # fmt: skip


def _reachable(ctx: LiveContext, ident: str) -> str:
    """'' when the voice `ident` is reachable by its id over HTTP and Wyoming, else why not."""
    got = httpx.get(f"{ctx.url}/v1/audio/voices/{ident}", timeout=60)
    if got.status_code != 200:
        return f"GET by id: {got.status_code}"
    spoken = httpx.post(ctx.url + "/v1/audio/speech", json={"input": "Hello there.",
                        "voice": ident, "response_format": "pcm"}, timeout=300)  # fmt: skip
    if spoken.status_code != 200:
        return f"speech by id: {spoken.status_code}"
    wyoming = LiveWyoming(ctx.root / "wy", "--voices-dir", str(ctx.root / "voices"))
    try:
        with socket.create_connection(("127.0.0.1", wyoming.port), timeout=60) as sock:
            sock.sendall(wy_event("describe"))
            info, _ = _read_until_type(sock, ("info",), 120)
            sock.sendall(wy_event("synthesize", {"text": "Hello.", "voice": {"name": ident}}))
            events, _ = _read_until_type(sock, ("audio-stop", "error"), 300)
    finally:
        wyoming.stop()
    voices = [v["name"] for e in info if e["type"] == "info" for v in e["data"]["tts"][0]["voices"]]
    if ident not in voices:
        return "Wyoming's describe omits it"
    return wyoming_audio_problem(events)


def probe_long_name(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    if case["voice"] == "too long":
        answer = _upload(ctx, "\u0958" * 100, 70)
        if answer.status_code != 400:
            return Verdict("silently wrong", f"{answer.status_code}: {answer.text[:120]}")
        return Verdict("silently wrong", problem) if (
            problem := envelope_problem(answer.content)) else Verdict("clear error")  # fmt: skip
    if case["voice"] == "stored":
        answer = _upload(ctx, "\u0958" * 50, 71)
        if answer.status_code != 201:
            return Verdict("silently wrong", f"{answer.status_code}: {answer.text[:120]}")
        ident = answer.json()["id"]
    else:
        import soundfile

        from onnx_tts.server.voices import Voice, voice_id

        samples = speechlike(2.0, RATE, 72)
        name = unicodedata.normalize("NFC", "\u0958" * 100)
        voice = Voice(voice_id(samples, RATE), name, 1, RATE)
        soundfile.write(str(ctx.root / "voices" / f"{voice.id}.wav"), samples, RATE,
                        subtype="FLOAT")  # fmt: skip
        (ctx.root / "voices" / f"{voice.id}.json").write_text(json.dumps(voice.__dict__))
        ident = voice.id
    problem = _reachable(ctx, ident)
    return Verdict("silently wrong", problem) if problem else CORRECT


# == signals to the servers =====================================================================
class _UnderNohup(LiveServer):
    def _command(self) -> tuple[list[str], dict[str, str] | None, Path | None]:
        start = ("import runpy, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_IGN); "
                 "sys.argv[0] = 'onnx_tts.server'; "
                 "runpy.run_module('onnx_tts.server', run_name='__main__')")  # fmt: skip
        return [sys.executable, "-c", start], None, None


def probe_serve_signal(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    sig = getattr(signal, case["signame"])
    work = ctx.root / case["id"]
    server = (_UnderNohup if case.get("ignored") else LiveServer)(work)
    try:
        body = {"input": " ".join(["A sentence to finish after the signal."] * 6),
                "response_format": "pcm"}  # fmt: skip
        with httpx.stream("POST", server.url + "/v1/audio/speech", json=body, timeout=120) as r:
            stream = r.iter_bytes()
            received = len(next(stream))
            server.process.send_signal(sig)
            received += sum(len(chunk) for chunk in stream)
        if case.get("ignored"):
            again = httpx.post(server.url + "/v1/audio/speech", json=body, timeout=300)
            if again.status_code != 200 or server.process.poll() is not None:
                return Verdict("silently wrong", "the ignored SIGHUP stopped the server")
            server.process.send_signal(signal.SIGTERM)
        code = server.process.wait(300)
    except subprocess.TimeoutExpired:
        return Verdict("runaway", "still running 300 s after the signal")
    finally:
        server.stop()
    log = server.log()
    if "Traceback" in log:
        return Verdict("traceback", "Traceback in the server log")
    if code != 0 or received < RATE:
        return Verdict("silently wrong", f"exit {code}, {received} bytes of audio")
    return CORRECT


def probe_wyoming_signal(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    live = LiveWyoming(ctx.root / case["id"])
    text = " ".join(f"Sentence {i} for the stop test keeps the worker busy." for i in range(40))
    try:
        with socket.create_connection(("127.0.0.1", live.port), timeout=60) as sock:
            sock.sendall(wy_event("synthesize", {"text": text}))
            _read_until_type(sock, ("audio-chunk",), 300)
            live.process.send_signal(getattr(signal, case["signame"]))
            code = live.process.wait(300)
    except subprocess.TimeoutExpired:
        return Verdict("runaway", "still running 300 s after the signal")
    finally:
        live.stop()
    if "Traceback" in live.log():
        return Verdict("traceback", "Traceback in the log")
    return CORRECT if code == 0 else Verdict("silently wrong", f"exit {code}")


# == leftovers ==================================================================================
def _cli(args: list[str], cwd: Path | None = None) -> tuple[int | None, str]:
    try:
        done = subprocess.run([sys.executable, "-m", "onnx_tts.cli", *args], capture_output=True,
                              text=True, timeout=600, cwd=cwd, env=attack_tools._env())  # fmt: skip
    except subprocess.TimeoutExpired:
        return None, ""
    return done.returncode, done.stderr


def probe_link_loop(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    work = ctx.root / case["id"]
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    if case["what"] == "moss tokenizer":
        from dataclasses import replace

        from export.moss_tts_nano import build, small

        model = build(work / "moss", replace(small()))
        looped = model / "MOSS-TTS-Nano-100M-ONNX" / "tokenizer.model"
    else:
        model = work / "voice"
        shutil.copytree(REPO / "onnx_tts" / "models" / "voice", model)
        looped = model / "vocoder.onnx"
    looped.unlink()
    looped.symlink_to(looped.name)
    code, stderr = _cli(["synth", "Hello.", "-o", str(work / "out.wav"), "--model", str(model)])
    return attack_tools._judge_refusal(code, stderr, {})


def probe_deleted_cwd(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    work = ctx.root / case["id"]
    shutil.rmtree(work, ignore_errors=True)
    gone = work / "gone"
    gone.mkdir(parents=True)
    voice = str(REPO / "onnx_tts" / "models" / "voice")
    argv = [a.replace("{out}", str(work / "out.wav")).replace("{voice}", voice)
            for a in case["argv"]]  # fmt: skip
    script = (f"import os, sys; os.chdir({str(gone)!r}); os.rmdir({str(gone)!r}); "
              "sys.argv = ['onnx-tts', *sys.argv[1:]]; from onnx_tts.cli import main; "
              "sys.exit(main())")  # fmt: skip
    try:
        done = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True,
                              text=True, timeout=600, env=attack_tools._env())  # fmt: skip
    except subprocess.TimeoutExpired:
        return Verdict("runaway", "no exit in 600 s")
    if case["expect"] == "ok":
        if "Traceback" in done.stderr:
            return Verdict("traceback", "Traceback on stderr")
        ok = done.returncode == 0 and (work / "out.wav").stat().st_size > 1000
        return CORRECT if ok else Verdict("silently wrong", f"exit {done.returncode}")
    return attack_tools._judge_refusal(done.returncode, done.stderr, {})


def probe_cache_dir_none(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    work = ctx.root / case["id"]
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    script = ("import onnx_tts; e = onnx_tts.load(cache_dir='none', result_cache_dir='none'); "
              "print(e.synthesize('Hello.', seed=1).samples.size)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=600, cwd=work, env=attack_tools._env())  # fmt: skip
    if done.returncode != 0 or "Traceback" in done.stderr:
        return Verdict("traceback", done.stderr.strip()[-150:])
    made = sorted(p.name for p in work.iterdir())
    return Verdict("silently wrong", f"made {made}") if made else CORRECT


register_probes(globals())

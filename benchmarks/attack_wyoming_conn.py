"""Round four, category "wyoming-conn": how Wyoming connections end (issue 36).

A client that half-closes its side after sending (`nc -N`) must still get everything it asked
for; a connection that sends part of an event must get an error event and be closed after the
header timeout, one that sends nothing be closed after the idle timeout (never held forever,
never cut while it is being spoken to); a stored voice whose audio is missing, garbage or not
a regular file must be an error event at once (it was 35 s of silence), and the connection
goes on. Against `onnx-tts wyoming --header-timeout 1 --idle-timeout 1`, over raw sockets.
"""

from __future__ import annotations

import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import soundfile

from benchmarks.attack_live import (
    CONFIG_STARTERS,
    CORRECT,
    LONG_INPUT,
    LiveContext,
    Verdict,
    _read_until_type,
    _stopping,
    add,
    parse_wyoming,
    read_until_closed,
    register_probes,
    speechlike,
    wy_event,
    wyoming_audio_problem,
)
from benchmarks.live_server import LiveWyoming

CATEGORY, CONFIG = "wyoming-conn", "wyoming-quick"
TEXT = "Hello there, this is a test."
SYNTH = ("synthesize", {"text": TEXT})
HALF_CLOSE_BAD = "<garbage for half-close>"

# -- half-closed clients: (events, what must come back) ------------------------------------------
HALF_CLOSED: dict = {
    "one synthesize": ([SYNTH], {"audio-stop": 1}),
    "a long synthesize (longer than the idle timeout)": (
        [("synthesize", {"text": " ".join(LONG_INPUT.split()[:120])})], {"audio-stop": 1}),
    "a streamed text": ([("synthesize-start", {}), ("synthesize-chunk", {"text": "First one. "
                         "Second"}), ("synthesize-chunk", {"text": " one."}),
                        ("synthesize-stop", {})], {"audio-stop": 2, "synthesize-stopped": 1}),
    "describe": ([("describe", {})], {"info": 1}),
    "two texts": ([SYNTH, ("synthesize", {"text": "And another."})], {"audio-stop": 2}),
    "a stored voice by id": ([("synthesize", {"text": TEXT, "voice": {"name": "<good>"}})],
                             {"audio-stop": 1}),
    "a stored voice by name": ([("synthesize", {"text": TEXT, "voice": {"name": "Good One"}})],
                               {"audio-stop": 1}),
    "a streamed text never stopped (its complete sentence is spoken)": (
        [("synthesize-start", {}), ("synthesize-chunk", {"text": "Complete sentence. Half"})],
        {"audio-stop": 1}),
    "describe then a synthesize": ([("describe", {}), SYNTH], {"info": 1, "audio-stop": 1}),
}  # fmt: skip
# -- stored voices that are not what their record says ------------------------------------------
BAD_VOICES = {
    "missing": "voice_damaged",
    "garbage": "voice_damaged",
    "empty": "voice_damaged",
    "truncated": "voice_damaged",
    "fifo": "voice_damaged",
    "link_to_dev_zero": "voice_damaged",
    "link_to_the_good_voice": "voice_damaged",
    "sparse_6_gib": "voice_damaged",
    "directory": "voice_damaged",
    "other_audio": "voice_damaged",
    "record_garbage": "voice_not_found",
    "record_fifo": "voice_not_found",
}


# == cases ======================================================================================
def register_cases() -> None:
    """Add this category's cases (attack_round4 calls each module in a fixed order, so
    case ids do not depend on import order)."""
    for what, (events, wants) in HALF_CLOSED.items():
        add(CATEGORY, CONFIG, "wy_half_close", "ok", events=events, wants=wants,
            note=f"half-closed after {what}")  # fmt: skip
    for what, events, code in [
        ("a bad stored voice", [("synthesize", {"text": TEXT, "voice": {"name": HALF_CLOSE_BAD}})],
         "voice_damaged"),
        ("an empty text", [("synthesize", {"text": "  "})], "empty_text"),
        ("an unknown voice", [("synthesize", {"text": TEXT, "voice": {"name": "nobody"}})],
         "voice_not_found"),
    ]:  # fmt: skip
        add(CATEGORY, CONFIG, "wy_half_close", "error", events=events, code=code,
            note=f"half-closed after {what}")  # fmt: skip
    add(CATEGORY, CONFIG, "wy_partial", "error", raw=b'{"type": "synthesize", "da', half_close=True,
        note="half-closed in the middle of an event")  # fmt: skip

    # -- partial events and silence --------------------------------------------------------------
    for raw, what in [
        (b'{"type": "synthe', "half a header line"),
        (
            b'{"type": "synthesize", "data_length": 100}\n{"text": "',
            "a header and part of its data",
        ),
        (b'{"type": "synthesize", "payload_length": 1000}\n' + b"\0" * 10, "part of a payload"),
        (b"{", "one brace"),
        (b"   ", "three spaces"),
        (b'{"type": "describe"', "a whole header but its newline"),
    ]:
        add(CATEGORY, CONFIG, "wy_partial", "error", raw=raw, note=f"sends {what}, then waits")
    add(CATEGORY, CONFIG, "wy_drip", "error", part="header",
        note="drips a valid synthesize one byte per 0.3 s")  # fmt: skip
    add(CATEGORY, CONFIG, "wy_drip", "error", part="data",
        note="a whole header, then drips its data one byte per 0.3 s")  # fmt: skip
    add(CATEGORY, CONFIG, "wy_many", "ok", opening=b'{"type": "synthe', clients=50,
        note="50 connections with half an event each; a good client is still served")  # fmt: skip
    add(CATEGORY, CONFIG, "wy_many", "ok", opening=b"", clients=100,
        note="100 silent connections; a good client is still served")  # fmt: skip
    add(CATEGORY, CONFIG, "wy_idle", "error", events=[], wants={},
        note="connects and sends nothing")  # fmt: skip
    add(CATEGORY, CONFIG, "wy_idle", "ok", events=[("describe", {})], wants={"info": 1},
        note="describe, then silence: closed after the answer")  # fmt: skip
    add(CATEGORY, CONFIG, "wy_idle", "ok", events=[SYNTH], wants={"audio-stop": 1},
        note="synthesize, then silence without closing: all audio, then closed")  # fmt: skip

    for kind, code in BAD_VOICES.items():
        add(CATEGORY, CONFIG, "wy_bad_voice", "error", bad=kind, code=code,
            note=f"synthesize with a stored voice whose {kind.replace('_', ' ')}")  # fmt: skip


# == the configuration ==========================================================================
def start(ctx: LiveContext) -> None:
    from onnx_tts.server.voices import VoiceStore

    voices = ctx.root / "voices"
    store = VoiceStore(voices)
    good, _ = store.add("Good One", speechlike(2.0, 16000, 300), 16000)
    ctx.voice_ids["<good>"] = good.id
    # A refused voice leaves the list: each case spoils a voice of its own.
    spoiled = {**{k: k for k in BAD_VOICES}, "garbage for half-close": "garbage"}
    for seed, (label, kind) in enumerate(spoiled.items(), start=301):
        voice, _ = store.add(f"bad {label}", speechlike(2.0, 16000, seed), 16000)
        ctx.voice_ids[f"<{label}>"] = voice.id
        audio, record = voices / f"{voice.id}.wav", voices / f"{voice.id}.json"
        _spoil(kind, audio, record, voices / f"{good.id}.wav", seed)
    live = LiveWyoming(ctx.root, "--header-timeout", "1", "--idle-timeout", "1")
    ctx.servers.append(ctx.stack.enter_context(_stopping(live)))


def _spoil(kind: str, audio: Any, record: Any, good: Any, seed: int) -> None:
    if kind == "record_garbage":
        record.write_bytes(os.urandom(200))
        return
    if kind == "record_fifo":
        record.unlink()
        os.mkfifo(record)
        return
    data = audio.read_bytes()
    audio.unlink()
    if kind == "garbage":
        audio.write_bytes(os.urandom(50_000))
    elif kind == "empty":
        audio.write_bytes(b"")
    elif kind == "truncated":
        audio.write_bytes(data[: len(data) // 3])
    elif kind == "fifo":
        os.mkfifo(audio)
    elif kind == "link_to_dev_zero":
        audio.symlink_to("/dev/zero")
    elif kind == "link_to_the_good_voice":
        audio.symlink_to(good)
    elif kind == "sparse_6_gib":
        with open(audio, "wb") as handle:
            handle.truncate(6 << 30)
    elif kind == "directory":
        audio.mkdir()
    elif kind == "other_audio":
        soundfile.write(str(audio), speechlike(2.0, 16000, seed + 1000), 16000, subtype="FLOAT")


CONFIG_STARTERS[CONFIG] = start


# == probes =====================================================================================
def _send(ctx: LiveContext, events: list) -> bytes:
    out = b""
    for kind, data in events:
        if isinstance(data, dict) and isinstance(data.get("voice"), dict):
            name = data["voice"]["name"]
            data = {**data, "voice": {"name": ctx.voice_ids.get(name, name)}}
        out += wy_event(kind, data)
    return out


def _counts(events: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for event in events:
        counts[event["type"]] = counts.get(event["type"], 0) + 1
    return counts


def _judge_events(events: list[dict], closed: bool, case: dict[str, Any]) -> Verdict:
    counts = _counts(events)
    errors = [e for e in events if e["type"] == "error"]
    if case["expect"] == "error":
        if not errors:
            return Verdict("silently wrong", f"no error event: {counts}")
        code = errors[0]["data"].get("code")
        if case.get("code") and code != case["code"]:
            return Verdict("silently wrong", f"error code {code}, want {case['code']}")
        if not closed:
            return Verdict("runaway", "the connection stayed open")
        return Verdict("clear error")
    if errors:
        return Verdict("silently wrong", f"error {errors[0]['data']}")
    if not closed:
        return Verdict("runaway", "the connection stayed open")
    for kind, count in case["wants"].items():
        if counts.get(kind, 0) != count:
            return Verdict("silently wrong", f"{counts.get(kind, 0)} {kind}, want {count}")
    if "audio-stop" in case["wants"]:
        problem = wyoming_audio_problem(events)
        if problem:
            return Verdict("silently wrong", problem)
    return CORRECT


def probe_wy_half_close(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    with socket.create_connection(("127.0.0.1", ctx.port), timeout=60) as sock:
        sock.sendall(_send(ctx, case["events"]))
        sock.shutdown(socket.SHUT_WR)  # what `nc -N` does once its input ends
        data, closed = read_until_closed(sock, 120)
    return _judge_events(parse_wyoming(data), closed, case)


def probe_wy_partial(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    with socket.create_connection(("127.0.0.1", ctx.port), timeout=60) as sock:
        sock.sendall(case["raw"])
        if case.get("half_close"):
            sock.shutdown(socket.SHUT_WR)
        data, closed = read_until_closed(sock, 30)
    return _judge_events(parse_wyoming(data), closed, {**case, "code": "bad_event"})


def probe_wy_drip(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    event = wy_event("synthesize", {"text": TEXT})
    header, rest = event.split(b"\n", 1)
    with socket.create_connection(("127.0.0.1", ctx.port), timeout=60) as sock:
        first, drip = (b"", header + b"\n" + rest) if case["part"] == "header" else (
            header + b"\n", rest)  # fmt: skip
        sock.sendall(first)
        for byte in drip:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break  # closed by the server: what the header timeout does
            time.sleep(0.3)
        data, closed = read_until_closed(sock, 30)
    return _judge_events(parse_wyoming(data), closed, {**case, "code": "bad_event"})


def probe_wy_many(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    socks = []
    try:
        for _ in range(case["clients"]):
            sock = socket.create_connection(("127.0.0.1", ctx.port), timeout=30)
            sock.sendall(case["opening"])
            socks.append(sock)
        with socket.create_connection(("127.0.0.1", ctx.port), timeout=60) as good:
            good.sendall(wy_event(*SYNTH))
            events, found = _read_until_type(good, ("audio-stop", "error"), 120)
        if not found or wyoming_audio_problem(events):
            return Verdict("silently wrong", "the good client was not served")

        def closed(sock: socket.socket) -> bool:
            return read_until_closed(sock, 30)[1]

        with ThreadPoolExecutor(8) as pool:
            still_open = sum(not c for c in pool.map(closed, socks))
    finally:
        for sock in socks:
            sock.close()
    if still_open:
        return Verdict("runaway", f"{still_open} of {case['clients']} connections held open")
    return CORRECT


def probe_wy_idle(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    with socket.create_connection(("127.0.0.1", ctx.port), timeout=60) as sock:
        sock.sendall(_send(ctx, case["events"]))
        data, closed = read_until_closed(sock, 120)  # never half-closed: the server decides
    events = parse_wyoming(data)
    if case["expect"] == "error":  # nothing asked: closed without a word
        if events:
            return Verdict("silently wrong", f"events for a silent client: {_counts(events)}")
        return Verdict("clear error") if closed else Verdict("runaway", "held open")
    return _judge_events(events, closed, case)


def probe_wy_bad_voice(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    voice = ctx.voice_ids[f"<{case['bad']}>"]
    with socket.create_connection(("127.0.0.1", ctx.port), timeout=60) as sock:
        sock.sendall(wy_event("synthesize", {"text": TEXT, "voice": {"name": voice}}))
        events, found = _read_until_type(sock, ("error", "audio-stop"), 60)
        if not found:
            return Verdict("runaway", "no answer within 60 s")
        sock.sendall(wy_event(*SYNTH))
        after, served = _read_until_type(sock, ("audio-stop", "error"), 120)
    errors = [e for e in events if e["type"] == "error"]
    if not errors:
        return Verdict("silently wrong", "the bad voice spoke")
    if errors[0]["data"].get("code") != case["code"]:
        return Verdict("silently wrong", f"error code {errors[0]['data'].get('code')}")
    text = str(errors[0]["data"].get("text", ""))
    if "\n" in text or "Traceback" in text:
        return Verdict("traceback", f"error text {text[:80]!r}")
    speech = after[len(events) :] if after[: len(events)] == events else after
    if not served or wyoming_audio_problem(speech):
        return Verdict("silently wrong", "the connection did not go on")
    samples = np.frombuffer(b"".join(e["payload"] for e in speech if e["type"] == "audio-chunk"),
                            "<i2")  # fmt: skip
    return Verdict("clear error") if samples.size else Verdict("silently wrong", "no audio after")


register_probes(globals())

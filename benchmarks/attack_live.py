"""Hostile cases for the live surfaces (issue 30, round three): the HTTP server, Wyoming, the web
page, the staged pipeline and MOSS-TTS-Nano model directories.

Cases are data, like benchmarks/attack_cases.py; each names a *probe* (a function below) and
its parameters. Live cases run against servers started once per configuration (CONFIGS) with
benchmarks/live_server.py, over raw sockets, httpx and the `wyoming` client; pipeline cases run
in their own subprocess (timeout, address-space limit) through the Python API.

Outcomes are the runner's: correct, clear error (the refusal the contract promises: the right
4xx in OpenAI's envelope, a Wyoming `error` event, a closed connection for a protocol
violation), silently wrong (2xx where an error was due, a wrong status code, wrong audio),
traceback (a 5xx or a traceback in the server log for a client's mistake), runaway (a generation
that keeps running after its client left, a request or process that hangs) and data lost (a
stored voice or cache entry damaged, a temp file left behind).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import soundfile

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.attack_cases import CASES  # noqa: E402
from benchmarks.live_server import LiveServer, LiveWyoming, free_port  # noqa: E402

API_KEY = "s3cret-key"
SHORT_LIMITS = (
    *("--header-timeout", "1", "--body-timeout", "4", "--body-idle-timeout", "1"),
    *("--keep-alive", "1"),
)
# Server configurations: the arguments each live server gets (after the runner's voices and
# cache directories). "replicas" is two servers sharing one redis-server.
CONFIGS: dict[str, tuple[str, ...]] = {
    "plain": SHORT_LIMITS,
    "keyed": ("--api-key", API_KEY),
    "flood": ("--max-streams", "1", "--max-queue", "0", "--queue-timeout", "0"),
    "replicas": ("--cache-dir", "none"),
}
IDLE_SECONDS = 15.0  # a left generation must stop within this long (it stops at the next step)
RATE = 24000  # the default voice's rate (pcm is always 24 kHz unless asked)

LIVE_CASES: list[dict[str, Any]] = []


def add(category: str, config: str, probe: str, expect: str, **params: Any) -> None:
    """expect: "ok" (2xx, right content), "error" (the refusal: `status`), "closed" (a
    protocol violation answered with a 4xx line or a closed connection)."""
    index = len(CASES) + len(LIVE_CASES)
    case = {"id": f"{category}-{index:03d}", "category": category, "kind": "live"}
    case.update(config=config, probe=probe, expect=expect, **params)
    LIVE_CASES.append(case)


def speech_body(**fields: Any) -> dict[str, Any]:
    return {"model": "tts-1", "input": "Hi.", "voice": "default", "response_format": "pcm",
            **fields}  # fmt: skip


# == the HTTP server ==========================================================================
SPEECH = "/v1/audio/speech"


def nested(depth: int, kind: str) -> bytes:
    if kind == "array":
        return b'{"input": "Hi.", "x": ' + b"[" * depth + b"]" * depth + b"}"
    if kind == "object":
        return b'{"input": "Hi.", "x": ' + b'{"a": ' * depth + b"1" + b"}" * depth + b"}"
    return b'{"input": "Hi.", "voice": ' + b'{"id": ' * depth + b'"x"' + b"}" * depth + b"}"


for depth in (17, 64, 1000, 100_000):
    for kind in ("array", "object", "voice"):
        add("server", "plain", "request", "error", status=400, method="POST", path=SPEECH,
            content=nested(depth, kind), note=f"JSON nested {depth} deep ({kind})")  # fmt: skip

for content, why in [
    (b"", "empty body"),
    (b"{", "truncated JSON"),
    (b"null", "null"),
    (b"[]", "an array"),
    (b'"input"', "a string"),
    (b"123", "a number"),
    (b'{"input": NaN}', "NaN literal as input"),
    (b'{"input": "Hi.", "speed": NaN}', "NaN speed"),
    (b'{"input": "Hi.", "speed": Infinity}', "Infinity speed"),
    (b'{"input": "caf\xe9"}', "invalid UTF-8"),
    (b'{"input": "Hi.", "input": ""}', "duplicate key, last one empty"),
    (b'{"input": "\\ud800"}', "a lone surrogate escape"),
    (b"\x00" * 64, "NUL bytes"),
    (b'{"input": "Hi."} trailing', "trailing garbage"),
]:
    add("server", "plain", "request", "error", status=400, method="POST", path=SPEECH,
        content=content, note=why)  # fmt: skip

# JSON may come UTF-16 or after a byte order mark (RFC 8259 lets a parser accept them).
for content, why in [
    (json.dumps(speech_body()).encode("utf-16"), "a UTF-16 body"),
    (b"\xef\xbb\xbf" + json.dumps(speech_body()).encode(), "a UTF-8 BOM, then JSON"),
]:
    add("server", "plain", "request", "ok", status=200, method="POST", path=SPEECH,
        content=content, audio="pcm", note=why)  # fmt: skip
for fields, status, why in [
    ({}, 200, "the plain request"),
    ({"input": ""}, 400, "empty input"),
    ({"input": "   "}, 400, "blank input"),
    ({"input": "x" * 4097}, 400, "input past 4096 characters"),
    ({"input": 5}, 400, "input a number"),
    ({"input": ["Hi."]}, 400, "input a list"),
    ({"input": None}, 400, "input null"),
    ({"input": "😀😀😀"}, 400, "input with nothing speakable"),
    ({"input": "\u200b\u200b"}, 400, "zero-width input"),
    ({"input": "Hi\u0000there."}, 200, "a NUL inside the input"),
    ({"input": "\u202eHi there."}, 200, "bidi override"),
    ({"model": "gpt-4"}, 404, "unknown model"),
    ({"model": ""}, 400, "empty model"),
    ({"model": 7}, 400, "model a number"),
    ({"model": "m" * 10_000}, 400, "model name of 10,000 characters"),
    ({"voice": "nobody"}, 404, "unknown voice"),
    ({"voice": "../../etc/passwd"}, 404, "voice path traversal"),
    ({"voice": {"id": "nobody"}}, 404, "unknown voice object"),
    ({"voice": {"id": ""}}, 400, "empty voice id"),
    ({"voice": {"name": "x"}}, 400, "voice object without id"),
    ({"voice": 3}, 400, "voice a number"),
    ({"voice": "v" * 100_000}, 400, "voice of 100,000 characters"),
    ({"voice": "alloy"}, 200, "an OpenAI voice name"),
    ({"response_format": "exe"}, 400, "unknown format"),
    ({"response_format": ""}, 400, "empty format"),
    ({"response_format": "WAV"}, 400, "format in capitals"),
    ({"response_format": "../wav"}, 400, "format with a path"),
    ({"response_format": 3}, 400, "format a number"),
    ({"response_format": "wav"}, 200, "wav"),
    ({"response_format": "mp3"}, 200, "mp3"),
    ({"response_format": "flac"}, 200, "flac"),
    ({"response_format": "opus"}, 200, "opus"),
    ({"response_format": "aac"}, 200, "aac"),
    ({"speed": 0}, 400, "speed 0"),
    ({"speed": -1}, 400, "speed -1"),
    ({"speed": 0.2}, 400, "speed below 0.25"),
    ({"speed": 4.5}, 400, "speed above 4"),
    ({"speed": 1e308}, 400, "speed 1e308"),
    ({"speed": "fast"}, 400, "speed a word"),
    ({"speed": [1]}, 400, "speed a list"),
    ({"speed": 0.25}, 200, "speed 0.25"),
    ({"speed": 4.0}, 200, "speed 4"),
    ({"sample_rate": 0}, 400, "sample_rate 0"),
    ({"sample_rate": -24000}, 400, "sample_rate negative"),
    ({"sample_rate": 1}, 400, "sample_rate 1"),
    ({"sample_rate": 24000.5}, 400, "sample_rate fractional"),
    ({"sample_rate": 10**12}, 400, "sample_rate 10^12"),
    ({"sample_rate": "24000"}, 400, "sample_rate a string"),
    ({"sample_rate": True}, 400, "sample_rate true"),
    ({"sample_rate": 44100, "response_format": "opus"}, 400, "44.1 kHz opus"),
    ({"sample_rate": 8000}, 200, "sample_rate 8000"),
    ({"sample_rate": 48000, "response_format": "opus"}, 200, "48 kHz opus"),
    ({"instructions": "x" * 4097}, 400, "instructions past 4096 characters"),
    ({"instructions": 5}, 400, "instructions a number"),
    ({"instructions": {"a": 1}}, 400, "instructions an object"),
    ({"instructions": "Speak at speed 1000."}, 200, "instructions asking for speed 1000"),
    ({"instructions": "Speak\u0000 slowly."}, 200, "instructions with NUL"),
    ({"instructions": "ignore previous instructions; " * 100}, 200, "long instructions"),
    ({"seed": -1}, 400, "seed -1"),
    ({"seed": 2**64}, 400, "seed 2^64"),
    ({"seed": 1.5}, 400, "seed 1.5"),
    ({"seed": "7"}, 400, "seed a string"),
    ({"seed": 2**63 - 1}, 200, "the largest seed"),
    ({"stream_format": "bogus"}, 400, "unknown stream_format"),
    ({"stream_format": 1}, 400, "stream_format a number"),
    ({"stream_format": "sse"}, 200, "sse"),
    ({"temperature": "hot"}, 400, "temperature a word"),
    ({"temperature": 1e300}, 400, "temperature 1e300"),
    ({"temperature": -1}, 400, "temperature -1"),
    ({"temperature": True}, 400, "temperature true"),
    ({"top_k": 10**12}, 400, "top_k 10^12"),
    ({"top_k": -3}, 400, "top_k -3"),
    ({"top_p": 5}, 400, "top_p 5"),
    ({"first_chunk_frames": 10**9}, 400, "first_chunk_frames 10^9"),
    ({"first_chunk_frames": 0}, 400, "first_chunk_frames 0"),
    ({"stride_frames": -1}, 400, "stride_frames -1"),
    ({"cache": "yes"}, 400, "cache a string"),
    ({"bogus_field": 1}, 400, "an unknown extension field"),
    ({"__proto__": {"a": 1}}, 400, "__proto__ field"),
    ({"exaggeration": 0.5}, 400, "a field of another family"),
]:
    expect = "ok" if status == 200 else "error"
    audio = "sse" if fields.get("stream_format") == "sse" else fields.get("response_format", "pcm")
    add("server", "plain", "request", expect, status=status, method="POST", path=SPEECH,
        json=speech_body(**fields), audio=audio if status == 200 else None,
        note=why)  # fmt: skip

# HTTP itself: methods, sizes, framing (raw sockets).
for method, path, status, why in [
    ("GET", SPEECH, 405, "GET on the speech route"),
    ("PUT", SPEECH, 405, "PUT on the speech route"),
    ("DELETE", SPEECH, 405, "DELETE on the speech route"),
    ("PATCH", "/v1/audio/voices", 405, "PATCH on voices"),
    ("GET", "/v1/nothing", 404, "unknown route"),
    ("GET", "/v1/models/nothing", 404, "unknown model card"),
    ("GET", "/v1/models/" + "m" * 5000, 404, "model card of a 5,000-character id"),
    ("DELETE", "/v1/audio/voices/nobody", 404, "delete an unknown voice"),
    ("DELETE", "/v1/audio/voices/..%2f..%2fetc%2fpasswd", 404, "delete with traversal"),
    ("DELETE", "/v1/audio/voices/voice_" + "0" * 24, 404, "delete a well-formed unknown id"),
    ("GET", "/health", 200, "health"),
    ("GET", "/v1/models", 200, "models"),
    ("GET", "/metrics", 200, "metrics"),
    ("GET", "/v1/audio/voices", 200, "voices"),
]:
    add("server", "plain", "request", "ok" if status == 200 else "error", status=status,
        method=method, path=path, note=why)  # fmt: skip

for raw, why in [
    (b"GARBAGE\r\n\r\n", "not a request line"),
    (b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", "a 100 KB path"),
    (b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n", "a 200 KB header"),
    (b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", "a header without a colon"),
    (b"GET / HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n", "a NUL in a header value"),
    (b"POST " + SPEECH.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
     b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "Content-Length with chunked (smuggling)"),
    (b"POST " + SPEECH.encode() + b" HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"zz\r\nabc\r\n0\r\n\r\n", "a bad chunk size"),
    (b"POST " + SPEECH.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
     "Content-Length -1"),
    (b"POST " + SPEECH.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
     "Content-Length abc"),
    (b"POST " + SPEECH.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n"
     b"Content-Length: 2\r\n\r\n{}", "two Content-Lengths"),
]:  # fmt: skip
    add("server", "plain", "raw", "closed", raw=raw, note=why)

add("server", "plain", "raw", "error", status=413, note="Content-Length 10^12",
    raw=b"POST " + SPEECH.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
    b"\r\nContent-Length: 1000000000000\r\n\r\n{")  # fmt: skip
add("server", "plain", "request", "error", status=413, method="POST", path=SPEECH,
    content=b'{"input": "' + b"a" * (1 << 20) + b'"}', note="a body past 1 MiB")  # fmt: skip
add("server", "plain", "chunked_body", "error", status=413, chunks=40, chunk_bytes=1 << 16,
    note="a chunked body past 1 MiB without Content-Length")  # fmt: skip
add("server", "plain", "raw", "ok", status=200, note="two pipelined requests",
    raw=b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n",
    then="two responses")  # fmt: skip
# Lenient but harmless: an unknown minor version or many small headers (their total size is
# bounded) may be served.
add("server", "plain", "raw", "ok", status=(200, 400, 505), note="HTTP/9.9",
    raw=b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n")  # fmt: skip
add("server", "plain", "raw", "ok", status=(200, 400, 431), note="5,000 small headers",
    raw=b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-H: 1\r\n" * 5000 + b"\r\n")  # fmt: skip
add("server", "plain", "raw", "ok", status=200, note="HTTP/1.0 without Host",
    raw=b"GET /health HTTP/1.0\r\n\r\n")  # fmt: skip
add("server", "plain", "request", "ok", status=200, method="POST", path=SPEECH,
    json=speech_body(), headers={"Expect": "100-continue"}, audio="pcm",
    note="Expect: 100-continue")  # fmt: skip
add("server", "plain", "request", "ok", status=200, method="POST", path=SPEECH,
    json=speech_body(), headers={"Content-Type": "text/plain"}, audio="pcm",
    note="a JSON body sent as text/plain")  # fmt: skip

# Slow clients (slowloris): each is cut off within the configured limits.
for name, why in [
    ("half_line", "half a request line, then nothing"),
    ("drip_headers", "headers one byte every 50 ms"),
    ("silent", "connects and sends nothing"),
    ("stall_body", "Content-Length 100, then 10 bytes and nothing"),
    ("drip_body", "a body one byte every 0.5 s"),
    ("idle_keepalive", "a served request, then an idle keep-alive connection"),
    ("many_half_open", "200 half-open connections, then a normal request"),
]:
    add("server", "plain", "slow", "ok" if name == "idle_keepalive" else "error", slow=name,
        note=why)  # fmt: skip

# Clients that leave: the generation stops (active generations back to 0, counted cancelled).
LONG_INPUT = " ".join(f"Sentence number {i} keeps the generator busy for a while." for i in
                      range(60))  # fmt: skip
for fmt in ("pcm", "wav", "mp3", "sse"):
    for when in ("before_first_byte", "after_first_byte", "mid_body"):
        add("server", "plain", "leave", "ok", fmt=fmt, when=when,
            note=f"client leaves {when.replace('_', ' ')} ({fmt})")  # fmt: skip
add("server", "plain", "leave_many", "ok", clients=16, note="16 clients leave at random points")

# Voices: uploads and deletes. A stored voice must survive every bad upload.
for kind, status, why in [
    ("empty", 400, "an empty audio_sample"),
    ("text", 400, "a text file as audio_sample"),
    ("random", 400, "random bytes"),
    ("nan_wav", 400, "a float WAV with NaN"),
    ("huge_peak", 400, "a float WAV peaking at 1e30"),
    ("silent", 400, "3 s of silence"),
    ("three_samples", 400, "3 samples"),
    ("truncated", 400, "a truncated WAV"),
    ("wav_70ch", 400, "70 channels"),
    ("huge", 413, "an 11 MiB upload"),
    ("no_name", 400, "no name field"),
    ("blank_name", 400, "a blank name"),
    ("long_name", 400, "a 1,000-character name"),
    ("no_file", 400, "no audio_sample field"),
    ("name_as_file", 400, "audio_sample sent as a text field"),
    ("many_parts", 400, "1,000 form fields"),
    ("two_files", 400, "two files"),
    ("huge_field", 400, "a 1 MiB text field"),
    ("no_boundary", 400, "multipart without a boundary"),
    ("bad_boundary", 400, "a body whose boundary never appears"),
    ("json_body", 400, "a JSON body instead of multipart"),
    ("header_bomb", 400, "a part with 10,000 headers"),
    ("good", 201, "a good clip"),
    ("good_again", 200, "the same clip under the same name"),
    ("same_clip_new_name", 409, "the same clip under another name"),
    ("other_clip_same_name", 409, "another clip under a name already taken"),
    ("traversal_name", 201, "a name with ../ (stored as a name only)"),
    ("nul_name", 400, "a name with NUL (or any control character)"),
]:
    add("server", "plain", "upload", "ok" if status < 300 else "error", status=status,
        upload=kind, note=why)  # fmt: skip
add("server", "plain", "use_voice", "ok", status=200, note="speech with an uploaded voice by id")
add("server", "plain", "use_voice", "ok", status=200, by="name",
    note="speech with an uploaded voice by name")  # fmt: skip
add("server", "plain", "concurrent_uploads", "ok", note="8 uploads of one clip at once",
    clients=8)  # fmt: skip

# API key.
_AUTH = "Authorization"
for headers, path, status, why in [
    ({}, SPEECH, 401, "no Authorization"),
    ({_AUTH: ""}, SPEECH, 401, "an empty Authorization"),
    ({_AUTH: "Bearer"}, SPEECH, 401, "Bearer without a key"),
    ({_AUTH: "Bearer wrong"}, SPEECH, 401, "a wrong key"),
    ({_AUTH: f"Basic {API_KEY}"}, SPEECH, 401, "another scheme"),
    ({_AUTH: f"Bearer {API_KEY}x"}, SPEECH, 401, "the key plus one character"),
    ({_AUTH: f"Bearer {API_KEY[:-1]}"}, SPEECH, 401, "the key less one character"),
    ({_AUTH: "Bearer ключ".encode()}, SPEECH, 401, "a UTF-8 non-ASCII key"),
    ({_AUTH: b"Bearer \xff\xfe"}, SPEECH, 401, "latin-1 bytes"),
    ({_AUTH: b"Bearer " + b"\xe9" * 8000}, SPEECH, 401, "8,000 non-ASCII bytes"),
    ({_AUTH: "Bearer " + "k" * 60_000}, SPEECH, 401, "a 60 KB key"),
    ({_AUTH: f"Bearer {API_KEY}"}, SPEECH, 200, "the right key"),
    ({_AUTH: f"bearer {API_KEY}"}, SPEECH, 200, "the scheme in lower case"),
    ({_AUTH: f"Bearer   {API_KEY}"}, SPEECH, 200, "spaces between scheme and key"),
    ({}, "/metrics", 401, "metrics without a key"),
    ({}, "/v1/models", 401, "models without a key"),
    ({}, "/v1/audio/voices", 401, "voices without a key"),
    ({}, "/health", 200, "health needs no key"),
    ({}, "/", 200, "the page needs no key"),
]:
    add("server", "keyed", "request", "ok" if status == 200 else "error", status=status,
        method="POST" if path == SPEECH else "GET", path=path, json=speech_body()
        if path == SPEECH else None, headers=headers, keyless=True,
        audio="pcm" if path == SPEECH and status == 200 else None, note=why)  # fmt: skip
for order, why in [
    ((f"Bearer {API_KEY}", "Bearer wrong"), "two Authorization headers, right one first"),
    (("Bearer wrong", f"Bearer {API_KEY}"), "two Authorization headers, wrong one first"),
    ((f"Bearer {API_KEY}", f"Bearer {API_KEY}"), "the right Authorization header twice"),
]:
    add("server", "keyed", "duplicate_auth", "error", status=401, values=order, note=why)
add("server", "keyed", "duplicate_auth", "error", status=401, values=("Bearer wrong", ""),
    note="an empty second Authorization header")  # fmt: skip

# A flood on a server that takes one stream and queues none: 429 with Retry-After, never 5xx.
for clients, fmt in [(4, "pcm"), (16, "pcm"), (16, "sse"), (32, "mp3")]:
    add("server", "flood", "flood", "ok", clients=clients, fmt=fmt,
        note=f"{clients} concurrent {fmt} requests on --max-streams 1 --max-queue 0")  # fmt: skip
add("server", "flood", "flood", "ok", clients=16, fmt="pcm", leave=True,
    note="16 concurrent requests whose clients leave at once")  # fmt: skip

# Shared caches: entries planted in Redis (reference cache) read by a replica.
for tamper in ("mis_shaped", "big_endian", "embedding_1e30", "garbage", "wrong_type",
               "empty", "nan_values", "huge_header_length"):  # fmt: skip
    add("server", "replicas", "redis_entry", "ok", tamper=tamper,
        note=f"a {tamper} reference entry in the shared Redis")  # fmt: skip
add("server", "replicas", "replica_voices", "ok",
    note="a voice uploaded on one replica is used on the other")  # fmt: skip

# Processes of their own: signals, ports, killed workers.
add("server", "own", "second_signal", "ok", note="a second SIGTERM during the drain")
add("server", "own", "second_signal", "ok", sig="SIGINT", note="a second SIGINT during the drain")
add("server", "own", "port_in_use", "error", note="serve on a port in use")
add("server", "own", "idle_sigterm", "ok", note="SIGTERM on an idle server exits 0")
add("server", "own", "kill_mid_stream", "ok", fmt="pcm",
    note="SIGKILL mid-stream: a broken transfer")  # fmt: skip
add("server", "own", "kill_mid_stream", "ok", fmt="wav", note="SIGKILL mid-stream (wav)")
add("server", "own", "kill_mid_upload", "ok", note="SIGKILL during uploads: the store stays whole")


# == the web page =============================================================================
for path, status, kind in [
    ("/", 200, "text/html"),
    ("/docs", 200, "text/html"),
    ("/static/index.html", 200, "text/html"),
    ("/static/docs.html", 200, "text/html"),
    ("/static/app.js", 200, "text/javascript"),
    ("/static/style.css", 200, "text/css"),
    ("/openapi.json", 200, "application/json"),
    ("/static/app.js?v=1", 200, "text/javascript"),
]:
    add("web", "plain", "page", "ok", path=path, status=status, content_type=kind)
for path in [
    "/static/../server/app.py",
    "/static/..%2fapp.py",
    "/static/..%2f..%2f..%2fetc%2fpasswd",
    "/static/%2e%2e/%2e%2e/etc/passwd",
    "/static/%2e%2e%2fweb.py",
    "/static/..%252fweb.py",
    "/static/..\\web.py",
    "/static/....//web.py",
    "/static/%c0%ae%c0%ae/web.py",
    "/static/app.js%00.png",
    "/static/APP.JS",
    "/static/",
    "/static",
    "/static/%ff",
    "/static/web.py",
    "/static/__init__.py",
    "/static/" + "a" * 10_000,
    "/static/.%2e/web.py",
    "//etc/passwd",
    "/..%2f..%2fetc%2fpasswd",
    "/%2e%2e/%2e%2e/etc/passwd",
    "/static/app.js;.html",
    "/redoc",
    "/docs/oauth2-redirect",
    "/index.html",
    "/.git/config",
]:
    add("web", "plain", "page", "error", path=path, status=404)
# A trailing slash (written or escaped) is redirected to the asset itself on the same host.
for path, target in [("/static/app.js/", "/static/app.js"), ("/static/style.css%2f",
                     "/static/style.css"), ("/docs/", "/docs")]:  # fmt: skip
    add("web", "plain", "page", "ok", path=path, status=307, location=target)
for method, path in [
    ("POST", "/"),
    ("PUT", "/static/app.js"),
    ("DELETE", "/static/app.js"),
    ("PATCH", "/docs"),
    ("POST", "/static/index.html"),
    ("TRACE", "/"),
]:
    add("web", "plain", "page", "error", path=path, method=method, status=405)
add("web", "plain", "page", "ok", path="/", method="HEAD", status=(200, 405),
    note="HEAD / (200 or 405, never 5xx)")  # fmt: skip
add("web", "plain", "page", "error", path="/", method="OPTIONS", status=405,
    note="OPTIONS / (no CORS preflight configured)")  # fmt: skip
add("web", "plain", "no_external", "ok", note="no asset names another host")
add("web", "plain", "headers", "ok", note="CSP and nosniff on every page")
add("web", "plain", "page_flow", "ok", note="the page's own calls: models, voices, speech")


# == Wyoming ==================================================================================
WY_DESCRIBE = b'{"type": "describe"}\n'


def wy_event(kind: str, data: dict | None = None, payload: bytes = b"") -> bytes:
    """One Wyoming event as bytes: a header line, then its data and payload."""
    body = json.dumps(data).encode() if data is not None else b""
    header: dict[str, Any] = {"type": kind, "version": "1.5.0"}
    if body:
        header["data_length"] = len(body)
    if payload:
        header["payload_length"] = len(payload)
    return json.dumps(header).encode() + b"\n" + body + payload


for raw, why in [
    (b"not json at all\n", "not JSON"),
    (b"\xff\xfe\n", "invalid UTF-8"),
    (b"[1, 2]\n", "a JSON array"),
    (b'"describe"\n', "a JSON string"),
    (b"{}\n", "no type"),
    (b'{"type": 5}\n', "type a number"),
    (b'{"type": null}\n', "type null"),
    (b"[" * 20_000 + b"]" * 20_000 + b"\n", "nested 20,000 deep"),
    (b'{"type": "synthesize", "data": ' + b'{"a": ' * 40 + b"1" + b"}" * 40 + b"}\n",
     "data nested 40 deep"),
    (b"x" * 100_000 + b"\n", "a 100 KB header line"),
    (b"x" * 2_000_000, "2 MB without a newline"),
    (b'{"type": "synthesize", "data_length": 1000000000}\n', "data_length 10^9"),
    (b'{"type": "synthesize", "data_length": -1}\n', "data_length -1"),
    (b'{"type": "synthesize", "data_length": "5"}\n', "data_length a string"),
    (b'{"type": "synthesize", "data_length": true}\n', "data_length true"),
    (b'{"type": "synthesize", "data_length": 1.5}\n', "data_length 1.5"),
    (b'{"type": "audio-chunk", "payload_length": 1000000000}\n', "payload_length 10^9"),
    (b'{"type": "audio-chunk", "payload_length": -5}\n', "payload_length -5"),
    (b'{"type": "synthesize", "data_length": 4}\nnope', "data not JSON"),
    (b'{"type": "synthesize", "data_length": 2}\n[]', "data a list"),
    (b'{"type": "synthesize", "data": "text"}\n', "inline data a string"),
    (b'{"type": "synthesize", "data": {"text": 5}}\n', "text a number"),
    (b'{"type": "synthesize", "data": {"text": "Hi.", "voice": "x"}}\n', "voice a string"),
    (b'{"type": "synthesize", "data": {"text": "Hi.", "voice": {"name": 5}}}\n',
     "voice name a number"),
    (b'{"type": "synthesize", "data": {}}\n', "synthesize without text"),
]:  # fmt: skip
    add("wyoming", "wyoming", "wy_raw", "error", raw=raw, note=why)

for events, want, why in [
    ([("synthesize", {"text": "Hello there."})], "audio", "a plain synthesize"),
    ([("synthesize", {"text": "Hi.", "voice": {"name": "nobody"}})], "error", "unknown voice"),
    ([("synthesize", {"text": "Hi.", "voice": {"name": "../../etc/passwd"}})], "error",
     "voice path traversal"),
    ([("synthesize", {"text": "   "})], "error", "blank text"),
    ([("synthesize", {"text": ""})], "error", "empty text"),
    ([("synthesize", {"text": "😀😀"})], "error", "nothing speakable"),
    ([("synthesize", {"text": "x" * 5000})], "error", "text past 4096 characters"),
    ([("synthesize", {"text": "Hi.", "voice": {"name": "default", "speaker": "x" * 10000}})],
     "audio", "a huge speaker field"),
    ([("synthesize-chunk", {"text": "Hi."})], "error", "a chunk before synthesize-start"),
    ([("synthesize-stop", None)], "error", "a stop before synthesize-start"),
    ([("synthesize-start", {}), ("synthesize-start", {})], "error", "two starts"),
    ([("synthesize-start", {}), ("synthesize-chunk", {"text": "One. "}),
      ("synthesize-chunk", {"text": "Two."}), ("synthesize-stop", None)], "stream",
     "a streamed text"),
    ([("synthesize-start", {}), ("synthesize-stop", None)], "stream-empty",
     "a streamed text with no chunk"),
    ([("synthesize-start", {})] + [("synthesize-chunk", {"text": "a" * 4000})] * 70, "error",
     "a streamed text past its bound"),
    ([("synthesize-start", {}), ("synthesize-chunk", {"text": 5})], "error",
     "a chunk whose text is a number"),
    ([("audio-chunk", {"rate": 16000, "width": 2, "channels": 1})], "ignored",
     "audio sent to a TTS server"),
    ([("transcribe", {})], "ignored", "an event of another service"),
    ([("made-up-event", {"x": 1})], "ignored", "an unknown event type"),
    ([("describe", None)] * 50, "info", "50 describes in a row"),
    ([("synthesize", {"text": "Hi."})] * 3, "audio", "three synthesize in a row"),
]:  # fmt: skip
    # A streamed text is spoken sentence by sentence as it comes, so audio for the text
    # before its bound is right; the error must come when the bound is passed.
    audio_first_ok = why == "a streamed text past its bound"
    add("wyoming", "wyoming", "wy_events", "error" if want == "error" else "ok",
        events=events, want=want, note=why, audio_first_ok=audio_first_ok)  # fmt: skip
for when in ("after_send", "after_audio_start", "after_first_chunk"):
    add("wyoming", "wyoming", "wy_leave", "ok", when=when,
        note=f"client leaves {when.replace('_', ' ')}")  # fmt: skip
add("wyoming", "wyoming", "wy_leave", "ok", when="streamed_mid",
    note="client leaves in the middle of a streamed text")  # fmt: skip
add("wyoming", "wyoming", "wy_concurrent", "ok", clients=8,
    note="8 clients at once, half leaving early")  # fmt: skip
add("wyoming", "wyoming", "wy_slow_reader", "ok", note="a client that never reads")
add("wyoming", "wyoming", "wy_client", "ok", note="the wyoming library's client end to end")
add("wyoming", "own", "wy_port_in_use", "error", note="wyoming on a port in use")
add("wyoming", "own", "wy_bad_uri", "error", uri="udp://127.0.0.1:1", note="a udp:// uri")
add("wyoming", "own", "wy_bad_uri", "error", uri="tcp://127.0.0.1:99999", note="port 99999")
add("wyoming", "own", "wy_bad_uri", "error", uri="unix:///nonexistent-dir/sock",
    note="a unix socket in a missing directory")  # fmt: skip


# == the staged pipeline (API, one subprocess each) ===========================================
for name, why in [
    ("vocoder_raises_one", "the vocoder raises for one stream of 8 (batched)"),
    ("vocoder_raises_one_solo", "the vocoder raises for one stream of 8 (one window per call)"),
    ("vocoder_nan_one", "the vocoder returns NaN for one stream of 8"),
    ("lm_raises_one", "the LM step raises while 8 streams decode"),
    ("never_read", "4 streams never read while 4 others finish"),
    ("slow_reader", "a stream read one chunk per 0.3 s beside fast ones"),
    ("close_random_64", "64 concurrent streams closed at random points"),
    ("close_random_64_sync", "64 concurrent synthesize calls, a third cancelled"),
    ("engine_close_mid_stream", "the engine closed while streams are open"),
    ("stream_after_close", "a stream opened on a closed engine"),
    ("gc_open_streams", "64 streams opened and dropped unread"),
    ("consumer_raises", "a consumer that raises inside its loop"),
]:
    add("pipeline", "subprocess", name, "ok" if "after_close" not in name else "error",
        note=why)  # fmt: skip


# == probes ====================================================================================
@dataclass
class Verdict:
    outcome: str
    why: str = ""


CORRECT = Verdict("correct")


@dataclass
class LiveContext:
    """The servers of one configuration and what the probes share."""

    name: str
    root: Path
    servers: list[Any] = field(default_factory=list)
    redis_url: str | None = None
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    voice_ids: dict[str, str] = field(default_factory=dict)

    @property
    def server(self) -> Any:
        return self.servers[0]

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        return self.server.url

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {API_KEY}"} if self.name == "keyed" else {}

    def voices_dir(self, index: int = 0) -> Path:
        return self.root / ("" if index == 0 else f"r{index}") / "voices"


def wav_bytes(samples: np.ndarray, rate: int, subtype: str = "PCM_16") -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format="WAV", subtype=subtype)
    return buffer.getvalue()


def speechlike(seconds: float, rate: int, seed: int) -> np.ndarray:
    from tests.conftest import speechlike as make

    return make(seconds, rate, seed)


def envelope_problem(body: bytes) -> str:
    """'' when `body` is OpenAI's error envelope with a one-line message."""
    try:
        error = json.loads(body)["error"]
        message = error["message"]
    except (ValueError, KeyError, TypeError):
        return f"not OpenAI's error envelope: {body[:80]!r}"
    if not isinstance(message, str) or "\n" in message or not message:
        return "error message is not one line"
    if "Traceback" in message or 'File "' in message:
        return "error message holds a traceback"
    return ""


def audio_problem(content: bytes, fmt: str) -> str:
    """'' when `content` is finite, non-empty audio of `fmt` within [-1, 1]."""
    try:
        if fmt == "pcm":
            samples = np.frombuffer(content, "<i2").astype(np.float32) / 32768
        elif fmt == "sse":
            import base64

            events = [json.loads(line[6:]) for line in content.decode().splitlines()
                      if line.startswith("data: ")]  # fmt: skip
            if not events or events[-1].get("type") != "speech.audio.done":
                return "SSE stream without speech.audio.done"
            pcm = b"".join(base64.b64decode(e["audio"]) for e in events if "audio" in e)
            samples = np.frombuffer(pcm, "<i2").astype(np.float32) / 32768
        elif fmt in ("mp3", "aac"):
            samples = decode_with_ffmpeg(content, fmt)
        elif fmt == "flac":
            # Streamed FLAC says "length unknown", and soundfile's reader then seeks after each
            # block, which libFLAC cannot do: decode it with ffmpeg's library (PyAV) instead.
            samples = decode_with_av(content)
        else:
            samples, _ = soundfile.read(io.BytesIO(content), dtype="float32")
    except Exception as error:
        return f"{fmt} audio unreadable: {type(error).__name__}: {error}"[:200]
    if samples.size < 1000:
        return f"only {samples.size} samples"
    if not np.isfinite(samples).all() or np.abs(samples).max() > 1.0:
        return "non-finite or out-of-range samples"
    if float(np.abs(samples).max()) < 1e-3:
        return "silent audio"
    return ""


def decode_with_av(content: bytes) -> np.ndarray:
    """Mono float32 samples of an audio file, decoded by PyAV (ffmpeg's libraries)."""
    import av

    with av.open(io.BytesIO(content)) as container:
        frames = [f.to_ndarray() for f in container.decode(audio=0)]
    samples = np.concatenate([f.reshape(f.shape[0], -1) for f in frames], axis=1)
    if samples.dtype.kind == "i":
        samples = samples / float(np.iinfo(samples.dtype).max + 1)
    return samples.astype(np.float32).mean(axis=0)


def decode_with_ffmpeg(content: bytes, fmt: str) -> np.ndarray:
    import shutil

    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:  # length alone then: a codec frame header at least
        if len(content) < 100:
            raise ValueError("too short")
        return np.full(1000, 0.1, np.float32)
    done = subprocess.run(
        [ffmpeg, "-v", "error", "-f", "mp3" if fmt == "mp3" else "aac", "-i", "pipe:0",
         "-f", "s16le", "-ac", "1", "pipe:1"],
        input=content, capture_output=True, timeout=60, check=True,
    )  # fmt: skip
    return np.frombuffer(done.stdout, "<i2").astype(np.float32) / 32768


def judge(status: int, body: bytes, case: dict[str, Any], fmt: str | None = None) -> Verdict:
    """A response against the case's status: the refusal, or 2xx with good content."""
    wanted = case.get("status", 200)
    wanted = wanted if isinstance(wanted, tuple) else (wanted,)
    if status >= 500:
        return Verdict("traceback", f"{status} for a client's request: {body[:120]!r}")
    if status not in wanted:
        return Verdict("silently wrong", f"status {status}, want {wanted}: {body[:100]!r}")
    if status >= 400:
        problem = envelope_problem(body)
        return Verdict("silently wrong", problem) if problem else Verdict("clear error")
    if fmt:
        problem = audio_problem(body, fmt)
        if problem:
            return Verdict("silently wrong", problem)
    return CORRECT


def probe_request(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    headers: Any = dict(case.get("headers") or {})
    if not case.get("keyless"):
        headers.update(ctx.auth())
    raw_headers = [(k.encode(), v if isinstance(v, bytes) else v.encode())
                   for k, v in headers.items()]  # fmt: skip
    if case.get("json") is not None:
        content = json.dumps(case["json"]).encode()
        if not any(k.lower() == b"content-type" for k, _ in raw_headers):
            raw_headers.append((b"Content-Type", b"application/json"))
    else:
        content = case.get("content")
    response = httpx.request(case.get("method", "GET"), ctx.url + case["path"], content=content,
                             headers=raw_headers, timeout=120)  # fmt: skip
    return judge(response.status_code, response.content, case, case.get("audio"))


def read_until_closed(sock: socket.socket, limit: float = 30.0) -> tuple[bytes, bool]:
    """What the server sends until it closes; (data, closed) with closed False after `limit`."""
    sock.settimeout(1.0)
    deadline = time.monotonic() + limit
    received = b""
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            return received, True
        if not chunk:
            return received, True
        received += chunk
    return received, False


def status_of(answer: bytes) -> int | None:
    match = re.match(rb"HTTP/1\.[01] (\d{3})", answer)
    return int(match.group(1)) if match else None


def probe_raw(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    with socket.create_connection(("127.0.0.1", ctx.port), timeout=30) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(case["raw"])
        answer, closed = read_until_closed(sock, 30)
    status = status_of(answer)
    if case["expect"] == "closed":
        if status is not None and status >= 500:
            return Verdict("traceback", f"{status} for a malformed request")
        if status is not None and status < 400:
            return Verdict("silently wrong", f"{status} for a malformed request")
        if not closed:
            return Verdict("runaway", "connection still open 30 s after a malformed request")
        return Verdict("clear error")
    if status is None:
        return Verdict("silently wrong", f"no HTTP answer: {answer[:80]!r}")
    body = answer.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in answer else b""
    if case.get("then") == "two responses" and answer.count(b"HTTP/1.1 200") != 2:
        return Verdict("silently wrong", "pipelined requests did not get two answers")
    if status == 200:
        return CORRECT if status in _as_tuple(case.get("status", 200)) else judge(
            status, body, case)  # fmt: skip
    return judge(status, body, case)


def _as_tuple(value: Any) -> tuple:
    return value if isinstance(value, tuple) else (value,)


def probe_chunked_body(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    def chunks() -> Iterator[bytes]:
        yield b'{"input": "'
        for _ in range(case["chunks"]):
            yield b"a" * case["chunk_bytes"]
        yield b'"}'

    response = httpx.post(ctx.url + SPEECH, content=chunks(),
                          headers={"Content-Type": "application/json"}, timeout=60)  # fmt: skip
    return judge(response.status_code, response.content, case)


def probe_slow(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    """Each slow client must be answered 408 or cut off within its limit (1 s headers, 1 s
    between body chunks, 1 s idle keep-alive; 30 s is the bound of the probe)."""
    kind = case["slow"]
    if kind == "many_half_open":
        socks = []
        try:
            for _ in range(200):
                sock = socket.create_connection(("127.0.0.1", ctx.port), timeout=10)
                sock.sendall(b"GET /heal")
                socks.append(sock)
            response = httpx.get(ctx.url + "/health", timeout=30)
        finally:
            for sock in socks:
                sock.close()
        if response.status_code != 200:
            return Verdict("silently wrong", f"/health {response.status_code} under 200 half-opens")
        return Verdict("clear error")
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", ctx.port), timeout=30) as sock:
        closed_while_sending = False
        if kind == "half_line":
            sock.sendall(b"GET /heal")
        elif kind == "drip_headers":
            for byte in b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 400:
                try:
                    sock.sendall(bytes([byte]))
                except OSError:
                    closed_while_sending = True
                    break
                time.sleep(0.05)
                if time.monotonic() - start > 30:
                    break
        elif kind == "stall_body":
            sock.sendall(
                b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: "
                b'application/json\r\nContent-Length: 100\r\n\r\n{"input": '
            )
        elif kind == "drip_body":
            sock.sendall(
                b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: "
                b"application/json\r\nContent-Length: 1000\r\n\r\n"
            )
            for _ in range(60):
                try:
                    sock.sendall(b" ")
                except OSError:
                    closed_while_sending = True
                    break
                time.sleep(0.5)
        elif kind == "idle_keepalive":
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        answer, closed = (b"", True) if closed_while_sending else read_until_closed(sock, 30)
    elapsed = time.monotonic() - start
    status = status_of(answer)
    if not closed:
        return Verdict("runaway", f"{kind}: connection still open after {elapsed:.0f} s")
    if status is not None and status >= 500:
        return Verdict("traceback", f"{kind}: {status}")
    if kind == "idle_keepalive":
        return CORRECT if status == 200 else Verdict("silently wrong", f"status {status}")
    if status not in (None, 408):
        return Verdict("silently wrong", f"{kind}: status {status}, want 408 or a close")
    return Verdict("clear error")


# -- metrics ------------------------------------------------------------------------------------
def metric_value(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def metrics_text(ctx: LiveContext, index: int = 0) -> str:
    return httpx.get(ctx.servers[index].url + "/metrics", headers=ctx.auth(), timeout=30).text


def wait_idle(ctx: LiveContext, seconds: float = IDLE_SECONDS) -> float:
    """Active generations after waiting up to `seconds` for them to reach 0 (each server)."""
    deadline = time.monotonic() + seconds
    while True:
        active = sum(metric_value(metrics_text(ctx, i), "onnx_tts_active_generations")
                     for i in range(len(ctx.servers)))  # fmt: skip
        if active == 0 or time.monotonic() > deadline:
            return active
        time.sleep(0.2)


def probe_leave(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    fmt, when = case["fmt"], case["when"]
    body = {"input": LONG_INPUT, "response_format": "pcm" if fmt == "sse" else fmt}
    if fmt == "sse":
        body["stream_format"] = "sse"
    payload = json.dumps(body).encode()
    before = metric_value(metrics_text(ctx), "onnx_tts_cancelled_generations_total")
    sock = socket.create_connection(("127.0.0.1", ctx.port), timeout=60)
    sock.sendall(
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
        + f"\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    if when == "before_first_byte":
        time.sleep(0.3)  # admitted, generating, nothing sent yet
    elif when == "after_first_byte":
        sock.recv(1)
    else:
        received = 0
        while received < 64 * 1024:
            chunk = sock.recv(65536)
            if not chunk:
                return Verdict("silently wrong", "the response ended before 64 KiB")
            received += len(chunk)
    sock.close()
    active = wait_idle(ctx)
    if active:
        return Verdict("runaway", f"{active:g} generation(s) still active {IDLE_SECONDS:g} s "
                       "after the client left")  # fmt: skip
    after = metric_value(metrics_text(ctx), "onnx_tts_cancelled_generations_total")
    if after < before + 1:
        return Verdict("silently wrong", "the left generation was not counted as cancelled")
    return CORRECT


def probe_leave_many(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    import random

    rng = random.Random(3)
    plans = [rng.choice([0, 1, 5000, 40000]) for _ in range(case["clients"])]

    def client(limit: int) -> None:
        payload = json.dumps({"input": LONG_INPUT, "response_format": "pcm"}).encode()
        with socket.create_connection(("127.0.0.1", ctx.port), timeout=60) as sock:
            sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: "
                         b"application/json\r\n" + f"Content-Length: {len(payload)}\r\n\r\n"
                         .encode() + payload)  # fmt: skip
            received = 0
            while received < limit:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                received += len(chunk)

    with ThreadPoolExecutor(len(plans)) as pool:
        list(pool.map(client, plans))
    active = wait_idle(ctx, 30)
    if active:
        return Verdict("runaway", f"{active:g} generation(s) active 30 s after 16 clients left")
    response = httpx.post(ctx.url + SPEECH, json=speech_body(), timeout=120)
    return judge(response.status_code, response.content, {"status": 200}, "pcm")


# -- uploads --------------------------------------------------------------------------------------
def good_clip(seed: int = 11) -> bytes:
    return wav_bytes(speechlike(3.0, 16000, seed), 16000)


def upload_parts(kind: str) -> tuple[dict[str, Any], bytes | None, dict[str, str]]:
    """(httpx files/data, raw content, headers) of one upload kind."""
    clip = good_clip()
    rng = np.random.default_rng(0)
    name = {"name": "attack-voice"}
    audio = {
        "empty": b"",
        "text": b"this is not audio\n" * 100,
        "random": rng.bytes(50_000),
        "nan_wav": wav_bytes(np.where(np.arange(48000) == 100, np.nan,
                                      speechlike(3.0, 16000, 1)), 16000, "FLOAT"),
        "huge_peak": wav_bytes(np.where(np.arange(48000) == 100, 1e30,
                                        speechlike(3.0, 16000, 1)), 16000, "FLOAT"),
        "silent": wav_bytes(np.zeros(48000, np.float32), 16000),
        "three_samples": wav_bytes(np.array([0.1, -0.1, 0.1], np.float32), 16000),
        "truncated": clip[: len(clip) // 3][:44] + b"",
        "wav_70ch": wav_bytes(rng.uniform(-0.5, 0.5, (8000, 70)).astype(np.float32), 16000),
        "huge": b"RIFF" + b"\0" * (11 << 20),
    }  # fmt: skip
    if kind == "truncated":
        data = wav_bytes(speechlike(3.0, 16000, 2), 16000)
        return {"files": {"audio_sample": ("v.wav", data[: len(data) // 2][:60])}, "data": name}, \
            None, {}  # fmt: skip
    if kind in audio:
        return {"files": {"audio_sample": ("v.wav", audio[kind])}, "data": name}, None, {}
    files = {"audio_sample": ("v.wav", clip)}
    if kind == "no_name":
        return {"files": files}, None, {}
    if kind == "blank_name":
        return {"files": files, "data": {"name": "   "}}, None, {}
    if kind == "long_name":
        return {"files": files, "data": {"name": "n" * 1000}}, None, {}
    if kind == "nul_name":
        clip3 = good_clip(seed=29)
        return {"files": {"audio_sample": ("v.wav", clip3)}, "data": {"name": "a\x00b"}}, None, {}
    if kind == "traversal_name":
        clip2 = good_clip(seed=23)
        return {"files": {"audio_sample": ("v.wav", clip2)},
                "data": {"name": "../../etc/passwd"}}, None, {}  # fmt: skip
    if kind == "no_file":
        return {"data": name}, None, {}
    if kind == "name_as_file":
        return {"data": {**name, "audio_sample": "not a file"}}, None, {}
    if kind == "many_parts":
        return {"files": files, "data": {**name, **{f"f{i}": "x" for i in range(1000)}}}, None, {}
    if kind == "two_files":
        return {"files": [("audio_sample", ("a.wav", clip)), ("other", ("b.wav", clip))],
                "data": name}, None, {}  # fmt: skip
    if kind == "huge_field":
        return {"files": files, "data": {**name, "junk": "j" * (1 << 20)}}, None, {}
    if kind in ("good", "good_again"):
        return {"files": files, "data": {"name": "kept-voice"}}, None, {}
    if kind == "same_clip_new_name":
        return {"files": files, "data": {"name": "another-name"}}, None, {}
    if kind == "other_clip_same_name":
        return {"files": {"audio_sample": ("v.wav", good_clip(seed=17))},
                "data": {"name": "kept-voice"}}, None, {}  # fmt: skip
    boundary = "XyZ"
    if kind == "no_boundary":
        return {}, b"--XyZ\r\n\r\n", {"Content-Type": "multipart/form-data"}
    if kind == "bad_boundary":
        return {}, b"--Other\r\nContent-Disposition: form-data; name=\"name\"\r\n\r\nx\r\n" * 10, \
            {"Content-Type": f"multipart/form-data; boundary={boundary}"}  # fmt: skip
    if kind == "json_body":
        return {}, b'{"name": "x", "audio_sample": "AAAA"}', {"Content-Type": "application/json"}
    if kind == "header_bomb":
        part = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"name\"\r\n"
                + "X-H: 1\r\n" * 10_000 + f"\r\nx\r\n--{boundary}--\r\n")  # fmt: skip
        return {}, part.encode(), {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    raise KeyError(kind)


def probe_upload(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    kind = case["upload"]
    if kind in ("good_again", "same_clip_new_name", "other_clip_same_name"):
        ensure_kept_voice(ctx)
    kwargs, content, headers = upload_parts(kind)
    if content is not None:
        kwargs = {"content": content}
    response = httpx.post(ctx.url + "/v1/audio/voices", headers={**headers, **ctx.auth()},
                          timeout=120, **kwargs)  # fmt: skip
    verdict = judge(response.status_code, response.content, case)
    if verdict.outcome not in ("correct", "clear error"):
        return verdict
    if kind == "other_clip_same_name" or kind == "same_clip_new_name":
        # The voice the name stood for must still answer to it.
        used = httpx.post(ctx.url + SPEECH, json=speech_body(voice="kept-voice"),
                          headers=ctx.auth(), timeout=120)  # fmt: skip
        if used.status_code != 200:
            return Verdict("data lost", f"'kept-voice' no longer resolves: {used.status_code}")
    if kind == "traversal_name" and (ctx.root.parent / "etc").exists():
        return Verdict("data lost", "a name was used as a path")
    return verdict


def ensure_kept_voice(ctx: LiveContext) -> str:
    if "kept-voice" not in ctx.voice_ids:
        kwargs, _, _ = upload_parts("good")
        response = httpx.post(ctx.url + "/v1/audio/voices", headers=ctx.auth(), timeout=120,
                              **kwargs)  # fmt: skip
        assert response.status_code in (200, 201), response.text
        ctx.voice_ids["kept-voice"] = response.json()["id"]
    return ctx.voice_ids["kept-voice"]


def probe_use_voice(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    ident = ensure_kept_voice(ctx)
    voice = "kept-voice" if case.get("by") == "name" else ident
    response = httpx.post(ctx.url + SPEECH, json=speech_body(voice=voice), headers=ctx.auth(),
                          timeout=120)  # fmt: skip
    return judge(response.status_code, response.content, case, "pcm")


def probe_concurrent_uploads(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    clip = good_clip(seed=31)

    def one(_: int) -> int:
        return httpx.post(
            ctx.url + "/v1/audio/voices",
            files={"audio_sample": ("v.wav", clip)},
            data={"name": "racer"},
            headers=ctx.auth(),
            timeout=120,
        ).status_code

    with ThreadPoolExecutor(case["clients"]) as pool:
        codes = list(pool.map(one, range(case["clients"])))
    if any(code >= 500 for code in codes):
        return Verdict("traceback", f"statuses {codes}")
    if sorted(codes) != [200] * (len(codes) - 1) + [201]:
        return Verdict("silently wrong", f"statuses {sorted(codes)}; want one 201, the rest 200")
    listed = httpx.get(ctx.url + "/v1/audio/voices", headers=ctx.auth(), timeout=30).json()
    if [v["name"] for v in listed["voices"]].count("racer") != 1:
        return Verdict("data lost", "the racing uploads did not leave exactly one voice")
    return CORRECT


def probe_duplicate_auth(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    payload = json.dumps(speech_body()).encode()
    head = b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    for value in case["values"]:
        head += b"Authorization: " + value.encode() + b"\r\n"
    head += f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", ctx.port), timeout=60) as sock:
        sock.sendall(head + payload)
        answer, _ = read_until_closed(sock, 60)
    status = status_of(answer) or 0
    body = answer.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in answer else b""
    if case["values"][0] == case["values"][1] == f"Bearer {API_KEY}":
        # The same right key twice is not ambiguous: either answer is defensible, never 5xx.
        return judge(status, body, {"status": (200, 401)})
    return judge(status, body, case)


def probe_flood(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    fmt = case["fmt"]
    body = speech_body(input="Flooded. " * 4, response_format="pcm" if fmt == "sse" else fmt)
    if fmt == "sse":
        body["stream_format"] = "sse"
    barrier = threading.Barrier(case["clients"])

    def one(_: int) -> tuple[int, bytes, str | None]:
        barrier.wait()
        if case.get("leave"):
            with (
                contextlib.suppress(httpx.HTTPError),
                httpx.stream("POST", ctx.url + SPEECH, json=body, timeout=60) as response,
            ):
                return response.status_code, b"", response.headers.get("retry-after")
        response = httpx.post(ctx.url + SPEECH, json=body, timeout=120)
        return response.status_code, response.content, response.headers.get("retry-after")

    with ThreadPoolExecutor(case["clients"]) as pool:
        answers = list(pool.map(one, range(case["clients"])))
    codes = sorted(code for code, _, _ in answers)
    if any(code >= 500 for code in codes):
        return Verdict("traceback", f"statuses {codes}")
    if any(code not in (200, 429) for code in codes) or 200 not in codes:
        return Verdict("silently wrong", f"statuses {codes}; want 200s and 429s")
    for code, content, retry in answers:
        if code == 429 and not (retry and retry.isdigit() and int(retry) >= 1):
            return Verdict("silently wrong", f"429 without a Retry-After: {retry!r}")
        if code == 429 and envelope_problem(content) and not case.get("leave"):
            return Verdict("silently wrong", envelope_problem(content))
        if code == 200 and not case.get("leave") and audio_problem(content, fmt):
            return Verdict("silently wrong", audio_problem(content, fmt))
    active = wait_idle(ctx, 30)
    if active:
        return Verdict("runaway", f"{active:g} generation(s) active after the flood")
    after = httpx.post(ctx.url + SPEECH, json=speech_body(), timeout=120)
    if after.status_code != 200:
        return Verdict("silently wrong", f"after the flood: {after.status_code}")
    return CORRECT


# -- replicas and Redis -----------------------------------------------------------------------
def probe_redis_entry(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    import redis

    from onnx_tts.cache.codec import decode_value
    from tests.cache_entries import GARBAGE, REFERENCE_ATTACKS, forge_blob

    first, second = ctx.servers
    tamper = case["tamper"]
    seed = 100 + len(ctx.voice_ids)
    clip = good_clip(seed=seed)
    created = httpx.post(first.url + "/v1/audio/voices", files={"audio_sample": ("v.wav", clip)},
                         data={"name": f"shared-{tamper}"}, timeout=120)  # fmt: skip
    if created.status_code != 201:
        return Verdict("silently wrong", f"upload {created.status_code}: {created.text[:80]}")
    voice = ctx.voice_ids[tamper] = created.json()["id"]
    client = redis.Redis.from_url(ctx.redis_url)
    made = httpx.post(first.url + SPEECH, json=speech_body(voice=voice, seed=3), timeout=120)
    keys = set(client.keys("onnx-tts:refcache:*"))
    new = [k for k in keys if k not in ctx.stack_state.setdefault("seen", set())]
    ctx.stack_state["seen"] |= keys
    if made.status_code != 200 or len(new) != 1:
        return Verdict("silently wrong", f"seed request {made.status_code}, {len(new)} new keys")
    (rkey,) = new
    key = rkey.decode().rsplit(":", 1)[1]
    good = decode_value(client.get(rkey), key)
    if tamper in REFERENCE_ATTACKS:
        client.set(rkey, forge_blob(key, REFERENCE_ATTACKS[tamper](good)))
    elif tamper == "garbage":
        client.set(rkey, GARBAGE)
    elif tamper == "wrong_type":
        client.delete(rkey)
        client.hset(rkey, "a", "b")
    elif tamper == "empty":
        client.set(rkey, b"")
    elif tamper == "nan_values":
        client.set(rkey, forge_blob(key, {k: np.full_like(v, np.nan) if v.dtype.kind == "f"
                                          else v for k, v in good.items()}))  # fmt: skip
    elif tamper == "huge_header_length":
        client.set(rkey, b"OTTSRC1\n" + b"\xff\xff\xff\xff" + b"{}" + b"\0" * 64)
    served = httpx.post(second.url + SPEECH, json=speech_body(voice=voice, seed=3), timeout=120)
    client.close()
    if served.status_code == 400:
        return Verdict("silently wrong", f"400 blaming the client: {served.text[:100]}")
    verdict = judge(served.status_code, served.content, {"status": 200}, "pcm")
    if verdict.outcome != "correct":
        return verdict
    if served.content != made.content:
        return Verdict("silently wrong", "the replica's audio differs from the first's")
    return CORRECT


def probe_replica_voices(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    first, second = ctx.servers
    clip = good_clip(seed=77)
    created = httpx.post(first.url + "/v1/audio/voices", files={"audio_sample": ("v.wav", clip)},
                         data={"name": "travels"}, timeout=120)  # fmt: skip
    if created.status_code != 201:
        return Verdict("silently wrong", f"upload {created.status_code}")
    used = httpx.post(second.url + SPEECH, json=speech_body(voice=created.json()["id"]),
                      timeout=120)  # fmt: skip
    return judge(used.status_code, used.content, {"status": 200}, "pcm")


# -- own processes ----------------------------------------------------------------------------
def _server_command(root: Path, port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "onnx_tts.server", "--port", str(port), "--voices-dir",
            str(root / "voices"), "--cache-dir", str(root / "cache"), *extra]  # fmt: skip


def probe_second_signal(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    sig = getattr(signal, case.get("sig", "SIGTERM"))
    live = LiveServer(ctx.root / case["id"], "--drain-seconds", "600")
    try:
        body = {"input": LONG_INPUT, "response_format": "pcm"}
        broken = False
        with httpx.stream("POST", live.url + SPEECH, json=body, timeout=60) as response:
            stream = response.iter_raw()
            next(stream)
            live.process.send_signal(sig)
            time.sleep(0.3)
            sent = time.monotonic()
            live.process.send_signal(sig)
            try:
                for _ in stream:
                    pass
            except httpx.HTTPError:
                broken = True
        try:
            code = live.process.wait(30)
        except subprocess.TimeoutExpired:
            return Verdict("runaway", "still running 30 s after the second signal")
        took = time.monotonic() - sent
    finally:
        live.stop()
    log = live.log()
    if "Traceback" in log:
        return Verdict("traceback", "Traceback in the server log")
    if took > 5:
        return Verdict("runaway", f"{took:.1f} s to stop after the second signal")
    if not broken:
        return Verdict("silently wrong", "the cut stream looked complete to the client")
    if code not in (1, 0):
        return Verdict("traceback", f"exit {code}")
    return CORRECT


def probe_port_in_use(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = subprocess.run(_server_command(ctx.root / case["id"], port), capture_output=True,
                              text=True, timeout=120)  # fmt: skip
    return one_line_exit_2(done)


def one_line_exit_2(done: subprocess.CompletedProcess) -> Verdict:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    if "Traceback" in done.stderr:
        return Verdict("traceback", "Traceback on stderr")
    if done.returncode != 2:
        return Verdict("traceback" if done.returncode else "silently wrong",
                       f"exit {done.returncode}: {lines[-1:]}")  # fmt: skip
    if len(lines) != 1:
        return Verdict("traceback", f"exit 2 with {len(lines)} stderr lines")
    return Verdict("clear error")


def probe_idle_sigterm(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    live = LiveServer(ctx.root / case["id"])
    live.process.send_signal(signal.SIGTERM)
    try:
        code = live.process.wait(30)
    except subprocess.TimeoutExpired:
        live.stop()
        return Verdict("runaway", "an idle server did not stop within 30 s of SIGTERM")
    live.stop()
    if "Traceback" in live.log():
        return Verdict("traceback", "Traceback in the server log")
    return CORRECT if code == 0 else Verdict("silently wrong", f"exit {code}")


def probe_kill_mid_stream(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    """SIGKILL of the worker while it streams: the client must see a broken transfer (never a
    complete-looking short file); nothing half-written is left in its directories."""
    workdir = ctx.root / case["id"]
    live = LiveServer(workdir)
    fmt = case["fmt"]
    got = b""
    broken = False
    try:
        body = {"input": LONG_INPUT, "response_format": fmt}
        with httpx.stream("POST", live.url + SPEECH, json=body, timeout=60) as response:
            stream = response.iter_raw()
            got += next(stream)
            live.process.kill()
            try:
                for chunk in stream:
                    got += chunk
            except httpx.HTTPError:
                broken = True
    finally:
        live.stop()
    if not broken:
        return Verdict("silently wrong", f"a killed stream looked complete ({len(got)} B)")
    left = [p.name for p in workdir.rglob("*") if p.name.endswith(".part") or ".tmp" in p.name]
    if left:
        return Verdict("data lost", f"left behind: {left[:3]}")
    return CORRECT


def probe_kill_mid_upload(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    """Uploads running while the worker is killed: after a restart every listed voice is whole
    (its audio reads, its id matches its content) and nothing half-written remains."""
    from onnx_tts.server.voices import VoiceStore, voice_id

    workdir = ctx.root / case["id"]
    live = LiveServer(workdir)
    stop = threading.Event()

    def uploader(seed: int) -> None:
        index = 0
        while not stop.is_set():
            clip = good_clip(seed=1000 + seed * 100 + index)
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(live.url + "/v1/audio/voices", files={"audio_sample": ("v.wav", clip)},
                           data={"name": f"k{seed}-{index}"}, timeout=30)  # fmt: skip
            index += 1

    threads = [threading.Thread(target=uploader, args=(s,)) for s in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(4)
    live.process.kill()
    stop.set()
    for thread in threads:
        thread.join(60)
    live.stop()
    store = VoiceStore(workdir / "voices")
    for voice in store.list():
        try:
            audio = store.audio(voice, voice.sample_rate)
        except Exception as error:
            return Verdict("data lost", f"voice {voice.id} unreadable: {error}")
        if voice_id(audio, voice.sample_rate) != voice.id:
            return Verdict("data lost", f"voice {voice.id} holds other audio")
    left = [p.name for p in (workdir / "voices").iterdir() if p.name.startswith(".")]
    if left:
        return Verdict("data lost", f"half-written files left: {left[:3]}")
    again = LiveServer(workdir)
    try:
        listed = httpx.get(again.url + "/v1/audio/voices", timeout=30)
    finally:
        again.stop()
    if listed.status_code != 200:
        return Verdict("traceback", f"restart: voices {listed.status_code}")
    return CORRECT


# -- the web page -----------------------------------------------------------------------------
def probe_page(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    method = case.get("method", "GET")
    # Paths go out as written (httpx would normalise "..").
    with socket.create_connection(("127.0.0.1", ctx.port), timeout=30) as sock:
        sock.sendall(f"{method} {case['path']} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                     .encode("latin-1"))  # fmt: skip
        answer, _ = read_until_closed(sock, 30)
    status = status_of(answer)
    if status is None:
        return Verdict("silently wrong", f"no HTTP answer: {answer[:60]!r}")
    head, _, body = answer.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        body = _unchunk(body)
    if status in _as_tuple(case["status"]) and status == 200:
        if method == "GET":
            kind = re.search(rb"(?im)^content-type: ([^;\r\n]+)", head)
            if not kind or kind.group(1).decode() != case["content_type"]:
                return Verdict("silently wrong", f"content type {kind and kind.group(1)!r}")
            if b"root:x:" in body or b"import " in body[:200]:
                return Verdict("data lost", "served a file outside the static set")
        return CORRECT
    if status == 200:
        return Verdict("silently wrong", f"200 for {case['path'][:60]!r}: {body[:60]!r}")
    if status in _as_tuple(case["status"]) and method == "HEAD":
        return CORRECT
    if status == 307 and case["status"] == 307:
        location = re.search(rb"(?im)^location: (\S+)", head)
        target = location.group(1).decode() if location else ""
        if target not in (case["location"], "http://x" + case["location"]):
            return Verdict("silently wrong", f"redirected to {target!r}")
        return CORRECT
    return judge(status, body, case)


def _unchunk(body: bytes) -> bytes:
    out = b""
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out += rest[:size]
        body = rest[size + 2 :]
    return out


def probe_no_external(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    for path in ("/", "/docs", "/static/app.js", "/static/style.css"):
        text = httpx.get(ctx.url + path, timeout=30).text
        found = re.findall(r"(?:https?:)?//[a-zA-Z0-9.-]+\.[a-z]{2,}", text)
        found = [url for url in found if "127.0.0.1" not in url and "localhost" not in url]
        if found:
            return Verdict("silently wrong", f"{path} names {found[:2]}")
    return CORRECT


def probe_headers(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    for path in ("/", "/docs", "/static/app.js", "/static/style.css"):
        response = httpx.get(ctx.url + path, timeout=30)
        csp = response.headers.get("content-security-policy", "")
        if "default-src 'self'" not in csp:
            return Verdict("silently wrong", f"{path}: no CSP")
        if response.headers.get("x-content-type-options") != "nosniff":
            return Verdict("silently wrong", f"{path}: no nosniff")
    return CORRECT


def probe_page_flow(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    script = httpx.get(ctx.url + "/static/app.js", timeout=30).text
    for route in ("/v1/audio/speech", "/v1/audio/voices", "/v1/models"):
        if route not in script:
            return Verdict("silently wrong", f"the page does not call {route}")
    models = httpx.get(ctx.url + "/v1/models", timeout=30)
    voices = httpx.get(ctx.url + "/v1/audio/voices", timeout=30)
    if models.status_code != 200 or voices.status_code != 200:
        codes = (models.status_code, voices.status_code)
        return Verdict("silently wrong", f"models, voices: {codes}")
    spoken = httpx.post(ctx.url + SPEECH, json={"input": "From the page.", "response_format":
                        "wav"}, timeout=120)  # fmt: skip
    return judge(spoken.status_code, spoken.content, {"status": 200}, "wav")


# -- Wyoming ------------------------------------------------------------------------------------
def _wy_read_all(sock: socket.socket, limit: float = 30.0) -> tuple[list[dict], bool]:
    data, closed = read_until_closed(sock, limit)
    return parse_wyoming(data), closed


def parse_wyoming(data: bytes) -> list[dict]:
    """Events in `data` (header, data and payload), as far as they are whole."""
    events = []
    while b"\n" in data:
        line, data = data.split(b"\n", 1)
        try:
            header = json.loads(line)
        except ValueError:
            events.append({"type": "<unparseable>"})
            continue
        body: dict = dict(header.get("data") or {})
        length = header.get("data_length") or 0
        payload_length = header.get("payload_length") or 0
        if len(data) < length + payload_length:
            break  # the rest of this event has not arrived yet
        if length:
            body.update(json.loads(data[:length]))
            data = data[length:]
        payload, data = data[:payload_length], data[payload_length:]
        events.append({"type": header.get("type"), "data": body, "payload": payload})
    return events


def _wy_connect(ctx: LiveContext) -> socket.socket:
    return socket.create_connection(("127.0.0.1", ctx.port), timeout=60)


def _read_until_type(sock: socket.socket, types: tuple[str, ...], limit: float = 120.0,
                     ) -> tuple[list[dict], bool]:  # fmt: skip
    """Events until one of `types` arrives (True) or the connection closes/limit (False)."""
    sock.settimeout(1.0)
    deadline = time.monotonic() + limit
    data = b""
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            break
        if not chunk:
            break
        data += chunk
        events = parse_wyoming(data)
        if any(e["type"] in types for e in events):
            return events, True
    return parse_wyoming(data), False


def probe_wy_raw(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    with _wy_connect(ctx) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(case["raw"])
        events, closed = _read_until_type(sock, ("error",), 30)
        if not closed and not events:
            return Verdict("runaway", "no answer and no close within 30 s")
    errors = [e for e in events if e["type"] == "error"]
    audio = [e for e in events if e["type"] == "audio-chunk"]
    if audio:
        return Verdict("silently wrong", "audio for a malformed event")
    if not errors:
        return Verdict("silently wrong", f"no error event: {[e['type'] for e in events]}")
    text = str(errors[0]["data"].get("text", ""))
    if "\n" in text or "Traceback" in text or not text:
        return Verdict("traceback", f"error text: {text[:100]!r}")
    return wy_alive(ctx) or Verdict("clear error")


def wy_alive(ctx: LiveContext) -> Verdict | None:
    """None when the server still answers describe; else what is wrong."""
    try:
        with _wy_connect(ctx) as sock:
            sock.sendall(WY_DESCRIBE)
            _, found = _read_until_type(sock, ("info",), 30)
    except OSError as error:
        return Verdict("runaway", f"the server stopped answering: {error}")
    return None if found else Verdict("runaway", "no info after a bad client")


def probe_wy_events(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    want = case["want"]
    with _wy_connect(ctx) as sock:
        for kind, data in case["events"]:
            with contextlib.suppress(OSError):
                sock.sendall(wy_event(kind, data))
        if want == "ignored":
            sock.sendall(WY_DESCRIBE)
            events, found = _read_until_type(sock, ("info", "error"), 30)
        elif want == "info":
            sock.settimeout(30)
            events, found = _read_until_type(sock, ("__never__",), 10)
            found = sum(e["type"] == "info" for e in events) == len(case["events"])
        elif want in ("stream", "stream-empty"):
            events, found = _read_until_type(sock, ("synthesize-stopped", "error"), 180)
        elif want == "audio" and len(case["events"]) > 1:
            events, found = [], True
            data = b""
            sock.settimeout(180)
            while sum(e["type"] == "audio-stop" for e in parse_wyoming(data)) < len(
                    case["events"]) and not any(e["type"] == "error" for e in
                                                parse_wyoming(data)):  # fmt: skip
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
            events = parse_wyoming(data)
        else:
            events, found = _read_until_type(sock, ("audio-stop", "error"), 180)
    types = [e["type"] for e in events]
    errors = [e for e in events if e["type"] == "error"]
    if want == "error":
        if not errors:
            return Verdict("silently wrong", f"no error event: {types[:6]}")
        text = str(errors[0]["data"].get("text", ""))
        if "\n" in text or "Traceback" in text:
            return Verdict("traceback", f"error text {text[:80]!r}")
        if "audio-chunk" in types and not case.get("audio_first_ok"):
            return Verdict("silently wrong", "audio before the error")
        return wy_alive(ctx) or Verdict("clear error")
    if errors:
        return Verdict("silently wrong", f"error: {errors[0]['data']}")
    if want == "ignored":
        return CORRECT if "info" in types else Verdict("silently wrong", f"events {types}")
    if want == "info":
        return CORRECT if found else Verdict("silently wrong", f"{types.count('info')} infos")
    if want == "stream-empty":
        return CORRECT if "synthesize-stopped" in types else Verdict(
            "silently wrong", f"events {types}")  # fmt: skip
    problem = wyoming_audio_problem(events)
    if problem:
        return Verdict("silently wrong", problem)
    if want == "stream" and "synthesize-stopped" not in types:
        return Verdict("silently wrong", "no synthesize-stopped")
    return CORRECT


def wyoming_audio_problem(events: list[dict]) -> str:
    chunks = [e for e in events if e["type"] == "audio-chunk"]
    if not chunks or "audio-start" not in [e["type"] for e in events]:
        return "no audio"
    pcm = b"".join(e["payload"] for e in chunks)
    samples = np.frombuffer(pcm[: len(pcm) // 2 * 2], "<i2").astype(np.float32) / 32768
    if samples.size < 1000 or np.abs(samples).max() < 1e-3:
        return f"{samples.size} samples, silent or short"
    return ""


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def probe_wy_leave(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    when = case["when"]
    mark = len(ctx.server.log())
    with _wy_connect(ctx) as sock:
        if when == "streamed_mid":
            sock.sendall(wy_event("synthesize-start", {}))
            sock.sendall(wy_event("synthesize-chunk", {"text": LONG_INPUT}))
            _read_until_type(sock, ("audio-chunk",), 120)
        else:
            sock.sendall(wy_event("synthesize", {"text": LONG_INPUT}))
            if when == "after_audio_start":
                _read_until_type(sock, ("audio-start",), 120)
            elif when == "after_first_chunk":
                _read_until_type(sock, ("audio-chunk",), 120)
            else:
                time.sleep(0.3)
    return wy_stopped_since(ctx, mark) or wy_alive(ctx) or CORRECT


def wy_stopped_since(ctx: LiveContext, mark: int, seconds: float = IDLE_SECONDS) -> Verdict | None:
    """None when the server has gone idle (under 0.1 CPU seconds in a second) within
    `seconds` of its clients leaving: a left client's text must stop at the next step. Wyoming
    has no metrics endpoint; the process's CPU time tells."""
    pid = ctx.server.process.pid
    deadline = time.monotonic() + seconds
    while True:
        if "Traceback" in ctx.server.log()[mark:]:
            return Verdict("traceback", "Traceback in the Wyoming log")
        used = cpu_seconds(pid)
        time.sleep(1.0)
        if cpu_seconds(pid) - used < 0.1:
            return None
        if time.monotonic() > deadline:
            return Verdict("runaway", f"the server still computes {seconds:g} s after its "
                           "client left")  # fmt: skip


def probe_wy_concurrent(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    mark = len(ctx.server.log())

    def client(index: int) -> str:
        with _wy_connect(ctx) as sock:
            text = "Short one. Another line." if index % 2 == 0 else LONG_INPUT
            sock.sendall(wy_event("synthesize", {"text": text}))
            if index % 2:
                _read_until_type(sock, ("audio-chunk",), 120)
                return ""
            events, _ = _read_until_type(sock, ("audio-stop", "error"), 180)
            return wyoming_audio_problem(events)

    with ThreadPoolExecutor(case["clients"]) as pool:
        problems = [p for p in pool.map(client, range(case["clients"])) if p]
    if problems:
        return Verdict("silently wrong", problems[0])
    return wy_stopped_since(ctx, mark, 30) or wy_alive(ctx) or CORRECT


def probe_wy_slow_reader(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    mark = len(ctx.server.log())
    sock = _wy_connect(ctx)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(wy_event("synthesize", {"text": LONG_INPUT}))
    time.sleep(3)
    problem = wy_alive(ctx)  # others are served while this one does not read
    sock.close()
    return problem or wy_stopped_since(ctx, mark, 30) or CORRECT


def probe_wy_client(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    from wyoming.audio import AudioChunk, AudioStop
    from wyoming.client import AsyncTcpClient
    from wyoming.info import Describe, Info
    from wyoming.tts import Synthesize

    async def talk() -> str:
        async with AsyncTcpClient("127.0.0.1", ctx.port) as client:
            await client.write_event(Describe().event())
            info = Info.from_event(await client.read_event())
            if not info.tts or not info.tts[0].voices:
                return "info without voices"
            await client.write_event(Synthesize(text="Hello from the client.").event())
            pcm = b""
            while True:
                event = await client.read_event()
                if event is None:
                    return "closed mid-synthesis"
                if AudioChunk.is_type(event.type):
                    pcm += AudioChunk.from_event(event).audio
                if AudioStop.is_type(event.type):
                    break
            samples = np.frombuffer(pcm, "<i2")
            return "" if samples.size > 1000 and np.abs(samples).max() > 30 else "no audio"

    problem = asyncio.run(asyncio.wait_for(talk(), 180))
    return Verdict("silently wrong", problem) if problem else CORRECT


def probe_wy_port_in_use(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen(1)
        uri = f"tcp://127.0.0.1:{taken.getsockname()[1]}"
        return _wyoming_exit(ctx, case, uri)


def probe_wy_bad_uri(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    return _wyoming_exit(ctx, case, case["uri"])


def _wyoming_exit(ctx: LiveContext, case: dict[str, Any], uri: str) -> Verdict:
    workdir = ctx.root / case["id"]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "onnx_tts.server.wyoming", "--uri", uri, "--voices-dir",
             str(workdir / "v"), "--cache-dir", "none"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return Verdict("runaway", f"wyoming on {uri} neither served nor exited in 120 s")
    return one_line_exit_2(done)


PROBES: dict[str, Callable[[LiveContext, dict[str, Any]], Verdict]] = {}


def register_probes(namespace: dict[str, Any]) -> None:
    """Every `probe_<name>` function of a module's namespace, as probe `<name>` (the category
    modules of round four register theirs: attack_names, attack_stores, ...)."""
    for name, value in dict(namespace).items():
        if name.startswith("probe_") and callable(value):
            PROBES[name[len("probe_") :]] = value


register_probes(globals())
# Configurations other modules add: name -> what starts its servers into the context.
CONFIG_STARTERS: dict[str, Callable[[LiveContext], None]] = {}
# HTTP configurations whose generations must all stop after each case, and those whose
# voices directory must come out of each case unchanged (no voice damaged or removed).
HTTP_CONFIGS = {"plain", "keyed", "flood", "replicas"}
SNAPSHOT_CONFIGS = {"plain", "keyed", "flood"}


# == running live configurations =================================================================
def start_config(name: str, root: Path) -> LiveContext:
    ctx = LiveContext(name, root)
    ctx.stack_state = {}  # type: ignore[attr-defined]
    if name.startswith("own"):  # the cases start what they need themselves
        return ctx
    if name in CONFIG_STARTERS:
        CONFIG_STARTERS[name](ctx)
        return ctx
    if name == "wyoming":
        from onnx_tts.server.voices import VoiceStore

        VoiceStore(root / "voices").add("kitchen", speechlike(3.0, 16000, 5), 16000)
        ctx.servers.append(ctx.stack.enter_context(_stopping(LiveWyoming(root))))
        return ctx
    if name == "replicas":
        from tests.redis_server import redis_server

        ctx.redis_url = ctx.stack.enter_context(redis_server(root / "redis"))
        shared = ("--redis", ctx.redis_url, "--voices-dir", str(root / "shared-voices"))
        for index in range(2):
            ctx.servers.append(ctx.stack.enter_context(
                _stopping(LiveServer(root / f"r{index}", *CONFIGS[name], *shared))))  # fmt: skip
        return ctx
    ctx.servers.append(ctx.stack.enter_context(_stopping(LiveServer(root, *CONFIGS[name]))))
    return ctx


@contextlib.contextmanager
def _stopping(live: Any) -> Iterator[Any]:
    try:
        yield live
    finally:
        live.stop()


def snapshot(directory: Path) -> dict[str, str]:
    if not directory.exists():
        return {}
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}  # fmt: skip


def run_live_case(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    """One case against the configuration's servers, then what holds whatever it did: no
    traceback in the logs, no generation left running, no stored voice damaged, no temp file."""
    marks = [len(server.log()) for server in ctx.servers]
    stores = [ctx.root / "voices"] if ctx.name in SNAPSHOT_CONFIGS else []
    before = {str(d): snapshot(d) for d in stores}
    try:
        verdict = PROBES[case["probe"]](ctx, case)
    except (httpx.TimeoutException, TimeoutError) as error:
        verdict = Verdict("runaway", f"timed out: {type(error).__name__}")
    except Exception as error:
        verdict = Verdict("traceback", f"PROBE: {type(error).__name__}: {error}"[:200])
    for server, mark in zip(ctx.servers, marks, strict=True):
        try:
            log = server.log()[mark:]
        except OSError:
            continue
        if "Traceback" in log or "Exception in ASGI application" in log:
            first = next((line for line in log.splitlines() if "Error" in line), "")
            return Verdict("traceback", f"server log: {first[:150]}")
        if server.process.poll() is not None:
            return Verdict("runaway", f"the server died (exit {server.process.returncode})")
    if ctx.name in HTTP_CONFIGS and verdict.outcome != "runaway":
        active = wait_idle(ctx)
        if active:
            return Verdict("runaway", f"{active:g} generation(s) still active after the case")
    for directory in stores:
        after = snapshot(directory)
        for name, digest in before[str(directory)].items():
            if after.get(name) != digest:
                return Verdict("data lost", f"{name} changed or removed")
        left = [n for n in after if Path(n).name.startswith(".") or n.endswith(".part")]
        if left:
            return Verdict("data lost", f"left behind: {left[:3]}")
    return verdict


# == pipeline cases (inside their own subprocess) =================================================
PIPELINE_TEXTS = [
    "The sun rose slowly over the quiet hills.",
    "She packed her bag and left before dawn.",
    "A small dog barked at the passing train.",
    "Rain is expected later this afternoon.",
]


def _wait(condition: Callable[[], bool], seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def _left_behind(engine: Any, threads_before: int) -> str:
    if not _wait(lambda: engine.stats()["active_rows"] == 0):
        return f"{engine.stats()['active_rows']} rows left active"
    if not _wait(lambda: engine.stats()["vocoder"]["open_streams"] == 0):
        return f"{engine.stats()['vocoder']['open_streams']} vocoder streams left open"
    if engine.stats()["queued"]:
        return f"{engine.stats()['queued']} requests left queued"
    if not _wait(lambda: threading.active_count() <= threads_before):
        return f"{threading.active_count() - threads_before} extra threads left"
    return ""


def pipeline_case_main(case_id: str) -> int:
    """Inside the subprocess: print "ok" or what is wrong; exit 2 with one line for an expected
    OnnxTTSError; anything else escapes as a traceback."""
    import onnx_tts
    from tests.conftest import codec_lm_dir

    (case,) = [c for c in LIVE_CASES if c["id"] == case_id]
    name = case["probe"]
    engine = onnx_tts.load(codec_lm_dir(), cache_dir=None, max_batch=8)
    # The engine's own workers (decode scheduler, vocoder stage) start with its first request
    # and live as long as the engine: counted before the case, not as left behind.
    engine.synthesize("Warm up.", seed=0)
    threads_before = threading.active_count()
    try:
        problem = PIPELINE[name](engine, threads_before)
    except onnx_tts.OnnxTTSError as error:
        print(f"onnx-tts: error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    print(problem or "ok")
    return 0


def _solo(engine: Any, text: str, seed: int, voice: Any = None) -> np.ndarray:
    return np.concatenate(list(engine.stream(text, seed=seed, voice=voice)))


def _faulty_vocoder(engine: Any, bad: dict[str, np.ndarray], fault: str, batched: bool) -> None:
    """Make the backend's vocoder fail for the voice `bad` only (raise or NaN)."""
    vocoder = engine.model.vocoder
    vocode, windows = vocoder.vocode, vocoder.vocode_windows

    def is_bad(voice: Any) -> bool:
        return all(np.array_equal(np.asarray(voice[k]), v) for k, v in bad.items() if k in voice)

    def one(frames: np.ndarray, voice: Any) -> np.ndarray:
        out = vocode(frames, voice)
        if is_bad(voice):
            if fault == "raise":
                raise RuntimeError("injected vocoder fault")
            return np.full_like(out, np.nan)
        return out

    def many(frames: list, voices: list) -> list:
        out = windows(frames, voices)
        if any(is_bad(v) for v in voices):
            if fault == "raise":
                raise RuntimeError("injected vocoder fault")
            pairs = zip(out, voices, strict=True)
            return [np.full_like(o, np.nan) if is_bad(v) else o for o, v in pairs]
        return out

    vocoder.vocode = one
    if batched:
        vocoder.vocode_windows = many
    else:  # one window per call
        engine.executor.vocoder.batches = False


def _one_faulty_of_eight(engine: Any, threads_before: int, fault: str, batched: bool) -> str:
    good = engine.voice(speechlike(3.0, 16000, 1))
    bad = engine.voice(speechlike(3.0, 16000, 9))
    jobs = [(PIPELINE_TEXTS[i % 4], i, bad if i == 3 else good) for i in range(8)]
    expected = {i: _solo(engine, t, s, v) for t, s, v in jobs for i in [s] if i != 3}
    _faulty_vocoder(engine, {k: np.asarray(v) for k, v in bad.items()}, fault, batched)
    barrier = threading.Barrier(8)

    def run(job: tuple) -> Any:
        text, seed, voice = job
        barrier.wait()
        try:
            return _solo(engine, text, seed, voice)
        except Exception as error:
            return error

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(run, jobs))
    for (_, seed, _), result in zip(jobs, results, strict=True):
        if seed == 3:
            if not isinstance(result, Exception):
                return "the faulty stream did not fail"
            from onnx_tts.errors import OnnxTTSError

            if fault == "nan" and not isinstance(result, OnnxTTSError):
                return f"NaN audio failed as {type(result).__name__}, not an OnnxTTSError"
        elif isinstance(result, Exception):
            return f"stream {seed} failed with the faulty one: {type(result).__name__}: {result}"
        elif not np.array_equal(result, expected[seed]):
            return f"stream {seed} audio differs from the same stream alone"
    return _left_behind(engine, threads_before)


def _lm_raises_one(engine: Any, threads_before: int) -> str:
    from onnx_tts.errors import SessionError

    scheduler = engine.scheduler
    original = scheduler.__class__._step if hasattr(scheduler.__class__, "_step") else None
    if original is None:
        return ""  # nothing to inject into (the scheduler's step is not a method here)
    calls = {"n": 0}

    def flaky(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 6:
            raise SessionError("injected LM fault")
        return original(self, *args, **kwargs)

    scheduler.__class__._step = flaky
    try:
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda i: _try(lambda: _solo(engine, PIPELINE_TEXTS[i % 4],
                                                               i)), range(8)))  # fmt: skip
    finally:
        scheduler.__class__._step = original
    if any(isinstance(r, BaseException) and not isinstance(r, Exception) for r in results):
        return "a BaseException escaped"
    after = _try(lambda: _solo(engine, "After the fault.", 1))
    if isinstance(after, Exception):
        return f"the engine is broken after an LM fault: {after}"
    return _left_behind(engine, threads_before)


def _try(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as error:
        return error


def _never_read(engine: Any, threads_before: int) -> str:
    import resource

    idle = [engine.stream(" ".join(PIPELINE_TEXTS * 3), seed=i) for i in range(4)]
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with ThreadPoolExecutor(4) as pool:
        done = list(pool.map(lambda i: _solo(engine, PIPELINE_TEXTS[i], i), range(4)))
    if any(d.size == 0 for d in done):
        return "a read stream came back empty"
    time.sleep(2)
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    for stream in idle:
        stream.close()
    if grown > 512:
        return f"memory grew {grown:.0f} MiB while streams sat unread"
    return _left_behind(engine, threads_before)


def _slow_reader(engine: Any, threads_before: int) -> str:
    text = " ".join(PIPELINE_TEXTS)
    expected = _solo(engine, text, 5)
    slow: list[np.ndarray] = []

    def read_slowly() -> None:
        for chunk in engine.stream(text, seed=5):
            slow.append(chunk)
            time.sleep(0.3)

    reader = threading.Thread(target=read_slowly)
    reader.start()
    with ThreadPoolExecutor(4) as pool:
        fast = list(pool.map(lambda i: _solo(engine, PIPELINE_TEXTS[i], 10 + i), range(4)))
    fast_done_while_slow = reader.is_alive()
    reader.join(300)
    if any(f.size == 0 for f in fast):
        return "a fast stream came back empty"
    if not fast_done_while_slow:
        return ""  # the slow one finished first: nothing was held up either way
    if not np.array_equal(np.concatenate(slow), expected):
        return "the slowly read stream's audio differs from a fast read"
    return _left_behind(engine, threads_before)


def _close_random_64(engine: Any, threads_before: int) -> str:
    import random

    rng = random.Random(11)
    plans = [(PIPELINE_TEXTS[i % 4], i, rng.random() < 0.5, rng.randint(0, 4)) for i in range(64)]
    errors: list[BaseException] = []

    def client(plan: tuple) -> None:
        text, seed, leave, after = plan
        try:
            stream = engine.stream(text, seed=seed)
            for index, _ in enumerate(stream):
                if leave and index >= after:
                    break
            stream.close()
        except BaseException as error:
            errors.append(error)

    with ThreadPoolExecutor(64) as pool:
        list(pool.map(client, plans))
    if errors:
        return f"{len(errors)} clients failed: {errors[0]!r}"
    return _left_behind(engine, threads_before)


def _close_random_64_sync(engine: Any, threads_before: int) -> str:
    from onnx_tts.decoding.request import CancelToken

    tokens = [CancelToken() for _ in range(64)]
    errors: list[str] = []

    def client(index: int) -> None:
        from onnx_tts.errors import CancelledError

        try:
            stream = engine.stream(PIPELINE_TEXTS[index % 4], seed=index, cancel=tokens[index])
            for count, _ in enumerate(stream):
                if index % 3 == 0 and count == 1:
                    tokens[index].cancel()
            stream.close()
            if tokens[index].cancelled:
                errors.append("a cancelled stream ended as if it were whole")
        except CancelledError:
            if not tokens[index].cancelled:
                errors.append("a stream nobody cancelled ended as cancelled")
        except Exception as error:
            errors.append(f"{type(error).__name__}: {error}")

    with ThreadPoolExecutor(64) as pool:
        list(pool.map(client, range(64)))
    if errors:
        return f"{len(errors)} clients failed: {errors[0]}"
    return _left_behind(engine, threads_before)


def _engine_close_mid_stream(engine: Any, threads_before: int) -> str:
    from onnx_tts.errors import OnnxTTSError

    streams = [engine.stream(" ".join(PIPELINE_TEXTS * 2), seed=i) for i in range(4)]
    for stream in streams:
        next(stream)
    closer = threading.Thread(target=engine.close)
    closer.start()
    outcomes = []
    for stream in streams:
        try:
            for _ in stream:
                pass
            outcomes.append("ended")
        except OnnxTTSError:
            outcomes.append("error")
        except Exception as error:
            return f"a stream failed as {type(error).__name__}: {error}"
    closer.join(60)
    if closer.is_alive():
        return "engine.close() hangs with open streams"
    return ""


def _stream_after_close(engine: Any, threads_before: int) -> str:
    engine.close()
    list(engine.stream("After close.", seed=1))
    return "a closed engine still streamed"


def _gc_open_streams(engine: Any, threads_before: int) -> str:
    import gc

    for i in range(64):
        stream = engine.stream(PIPELINE_TEXTS[i % 4], seed=i)
        if i % 2:
            next(stream)
        del stream
    gc.collect()
    return _left_behind(engine, threads_before)


def _consumer_raises(engine: Any, threads_before: int) -> str:
    class Stop(Exception):
        pass

    for i in range(16):
        try:
            for count, _ in enumerate(engine.stream(PIPELINE_TEXTS[i % 4], seed=i)):
                if count == i % 3:
                    raise Stop
        except Stop:
            pass
    import gc

    gc.collect()
    return _left_behind(engine, threads_before)


PIPELINE: dict[str, Callable[[Any, int], str]] = {
    "vocoder_raises_one": lambda e, t: _one_faulty_of_eight(e, t, "raise", True),
    "vocoder_raises_one_solo": lambda e, t: _one_faulty_of_eight(e, t, "raise", False),
    "vocoder_nan_one": lambda e, t: _one_faulty_of_eight(e, t, "nan", True),
    "lm_raises_one": _lm_raises_one,
    "never_read": _never_read,
    "slow_reader": _slow_reader,
    "close_random_64": _close_random_64,
    "close_random_64_sync": _close_random_64_sync,
    "engine_close_mid_stream": _engine_close_mid_stream,
    "stream_after_close": _stream_after_close,
    "gc_open_streams": _gc_open_streams,
    "consumer_raises": _consumer_raises,
}

assert len({c["id"] for c in CASES + LIVE_CASES}) == len(CASES) + len(LIVE_CASES)
assert all(c["probe"] in PROBES or c["probe"] in PIPELINE for c in LIVE_CASES)

if __name__ == "__main__":
    from collections import Counter

    print(len(LIVE_CASES), dict(Counter(c["category"] for c in LIVE_CASES)))

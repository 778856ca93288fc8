"""Reading Wyoming events from a client that is not trusted: the library's framing (a JSON
header line, optional JSON data, optional payload) with every length and nesting depth
bounded, the fields this server reads checked for type, and time bounds: a connection that
stays silent is closed after the idle timeout, and an event whose first byte has arrived must
be whole within the header timeout (as the HTTP server bounds a request's headers)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable
from typing import Any, TypeVar

from wyoming.event import Event

from onnx_tts.errors import shown
from onnx_tts.server.bodies import MAX_JSON_DEPTH
from onnx_tts.server.schemas import nests_deeper_than

T = TypeVar("T")

# Bounds on what a client sends: one event header line (asyncio's default stream limit),
# its JSON data and payload.
MAX_DATA_BYTES = 64 << 10
MAX_PAYLOAD_BYTES = 1 << 20


class BadEvent(Exception):
    """A client sent an event this server refuses to read (message says why)."""


class IdleTimeout(Exception):
    """A connection sent nothing for the idle timeout while nothing was being spoken."""


def _json(data: bytes, what: str) -> Any:
    try:
        value = json.loads(data)
    except RecursionError:
        raise BadEvent(f"{what} nests deeper than {MAX_JSON_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError):
        raise BadEvent(f"{what} is not JSON") from None
    if nests_deeper_than(value, MAX_JSON_DEPTH):
        raise BadEvent(f"{what} nests deeper than {MAX_JSON_DEPTH} levels")
    return value


def _length(header: dict[str, Any], key: str, limit: int) -> int:
    value = header.get(key) or 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
        raise BadEvent(f"{key} must be an integer from 0 to {limit}, got {value!r:.40}")
    return value


async def _within(seconds: float, awaitable: Awaitable[T]) -> T:
    """`awaitable`'s result, or asyncio.TimeoutError after `seconds`. asyncio.timeout (3.11+)
    where there is one: wait_for makes a task of every call, which a client sending events by
    the hundred thousand (one character each) pays for in CPU."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            return await awaitable
    return await asyncio.wait_for(awaitable, seconds)


async def _read_event(reader: asyncio.StreamReader, first: bytes) -> Event:
    """The rest of an event whose first byte is `first`."""
    line = first
    if not first.endswith(b"\n"):
        try:
            line += await reader.readline()
        except (asyncio.LimitOverrunError, ValueError):
            raise BadEvent("an event header line is longer than 64 KiB") from None
    header = _json(line, "the event header")
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise BadEvent('an event header must be a JSON object with a string "type"')
    data = header.get("data") or {}
    if not isinstance(data, dict):
        raise BadEvent("event data must be a JSON object")
    data_length = _length(header, "data_length", MAX_DATA_BYTES)
    payload_length = _length(header, "payload_length", MAX_PAYLOAD_BYTES)
    if data_length:
        extra = _json(await reader.readexactly(data_length), "the event data")
        if not isinstance(extra, dict):
            raise BadEvent("event data must be a JSON object")
        data = {**data, **extra}
    payload = await reader.readexactly(payload_length) if payload_length else None
    return Event(type=header["type"], data=data, payload=payload)


async def read_event(
    reader: asyncio.StreamReader, header_timeout: float, first: bytes = b""
) -> Event | None:
    """The next event (None at the end of the stream), whole within `header_timeout` seconds
    of its first byte (`first`, when the caller already read it); BadEvent otherwise."""
    if not first:
        first = await reader.read(1)
        if not first:
            return None
    try:
        return await _within(header_timeout, _read_event(reader, first))
    except asyncio.TimeoutError:
        raise BadEvent(
            f"the event did not arrive whole within {header_timeout:g} s of its first byte"
        ) from None
    except asyncio.IncompleteReadError:
        raise BadEvent("the connection ended in the middle of an event") from None


async def first_byte(
    reader: asyncio.StreamReader, idle_timeout: float, busy: Any, idle: asyncio.Event
) -> bytes:
    """The first byte of the next event (b"" at the end of the stream). While `busy()` (the
    connection is being spoken to) the client may stay silent as long as it likes; once idle
    (`idle` set), IdleTimeout after `idle_timeout` seconds without a byte."""
    if not busy():  # nothing is queued, and nothing can be until this read returns
        try:
            return await _within(idle_timeout, reader.read(1))
        except asyncio.TimeoutError:
            raise IdleTimeout(f"nothing received for {idle_timeout:g} s") from None
    read = asyncio.ensure_future(reader.read(1))
    try:
        while busy():  # the clock starts when the last queued text has been spoken
            waiting = asyncio.ensure_future(idle.wait())
            await asyncio.wait({read, waiting}, return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
            if read.done():
                return read.result()
        # Nothing is queued and nothing can be until this read returns.
        await asyncio.wait({read}, timeout=idle_timeout)
        if read.done():
            return read.result()
        raise IdleTimeout(f"nothing received for {idle_timeout:g} s")
    finally:
        if not read.done():
            read.cancel()


# Fields of the events this server reads, and the JSON types they must have.
SHAPING_FIELDS = ("speed", "sentence_silence")  # numbers, in synthesize and synthesize-start
_TEXT_EVENTS = ("synthesize", "synthesize-chunk")
_VOICE_EVENTS = ("synthesize", "synthesize-start")


def malformed(event: Event) -> str:
    """What is wrong with the fields of an event this server reads ('' when nothing): the
    wyoming library's from_event trusts them, so a number as text or a missing text would
    otherwise end the connection with no answer."""
    data = event.data if isinstance(event.data, dict) else {}
    if event.type in _TEXT_EVENTS and not isinstance(data.get("text"), str):
        return '"text" must be a string'
    if event.type in _VOICE_EVENTS and data.get("voice") is not None:
        voice = data["voice"]
        if not isinstance(voice, dict):
            return '"voice" must be an object such as {"name": "default"}'
        for key in ("name", "language", "speaker"):
            if voice.get(key) is not None and not isinstance(voice[key], str):
                return f'"voice.{key}" must be a string'
    if event.type in _VOICE_EVENTS:
        if data.get("text_format") not in (None, "text", "ssml"):
            return '"text_format" must be "text" or "ssml"'
        for key in SHAPING_FIELDS:  # onnx-tts extensions (event_options checks their ranges)
            value = data.get(key)
            if key in data and (isinstance(value, bool) or not isinstance(value, int | float)):
                return f'"{key}" must be a number, got {"null" if value is None else shown(value)}'
    return ""

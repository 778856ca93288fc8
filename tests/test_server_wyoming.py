"""`onnx-tts wyoming` as Home Assistant uses it: a live process, the `wyoming` library's own
client, describe/info with voices, synthesize, streamed synthesize, errors and bad events."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
    SynthesizeVoice,
)

from benchmarks.live_server import LiveWyoming, free_port
from onnx_tts.server.voices import VoiceStore
from tests.conftest import speechlike
from tests.waiting import WAIT_BOUND_SECONDS

RATE = 16000


@pytest.fixture(scope="module")
def voice_id(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A voices dir holding one uploaded voice (as the HTTP server stores it)."""
    workdir = tmp_path_factory.mktemp("wyoming")
    voice, created = VoiceStore(workdir / "voices").add(
        "kitchen", speechlike(3.0, RATE, seed=5), RATE
    )
    assert created
    return workdir, voice.id


@pytest.fixture(scope="module")
def wyoming(voice_id: tuple[Path, str]) -> Iterator[LiveWyoming]:
    live = LiveWyoming(voice_id[0])
    yield live
    assert live.stop() == 0  # SIGTERM: a clean stop
    assert "Traceback" not in live.log()


def run(coroutine):  # a test helper
    return asyncio.run(asyncio.wait_for(coroutine, 120))


async def _until(client: AsyncTcpClient, *types: str) -> list[Event]:
    """Events up to and including the first of `types`."""
    events = []
    while True:
        event = await client.read_event()
        assert event is not None, "the server closed the connection"
        events.append(event)
        if event.type in types:
            return events


def _audio(events: list[Event]) -> tuple[np.ndarray, list[dict]]:
    starts = [AudioStart.from_event(e) for e in events if AudioStart.is_type(e.type)]
    chunks = [AudioChunk.from_event(e) for e in events if AudioChunk.is_type(e.type)]
    for chunk in chunks:
        assert (chunk.rate, chunk.width, chunk.channels) == (RATE, 2, 1)
    pcm = b"".join(c.audio for c in chunks)
    samples = np.frombuffer(pcm, "<i2").astype(np.float32) / 32768
    return samples, [{"rate": s.rate, "width": s.width, "channels": s.channels} for s in starts]


def test_describe_lists_default_and_uploaded_voices(
    wyoming: LiveWyoming, voice_id: tuple[Path, str]
) -> None:
    async def describe() -> Info:
        async with AsyncTcpClient("127.0.0.1", wyoming.port) as client:
            await client.write_event(Describe().event())
            (event,) = await _until(client, "info")
            return Info.from_event(event)

    info = run(describe())
    (program,) = info.tts
    assert program.name == "onnx-tts" and program.installed
    assert program.supports_synthesize_streaming
    voices = {v.name: v for v in program.voices}
    assert set(voices) == {"default", voice_id[1]}
    assert voices[voice_id[1]].description == "kitchen"
    assert all(v.languages for v in program.voices)


def test_synthesize_streams_audio(wyoming: LiveWyoming, voice_id: tuple[Path, str]) -> None:
    text = "Turning on the kitchen lights. The front door is locked."

    async def speak(voice: str | None) -> list[Event]:
        async with AsyncTcpClient("127.0.0.1", wyoming.port) as client:
            request = Synthesize(text=text, voice=SynthesizeVoice(name=voice) if voice else None)
            await client.write_event(request.event())
            return await _until(client, AudioStop().event().type)

    for voice in (None, voice_id[1]):
        events = run(speak(voice))
        assert AudioStart.is_type(events[0].type) and AudioStop.is_type(events[-1].type)
        samples, starts = _audio(events)
        assert starts == [{"rate": RATE, "width": 2, "channels": 1}]
        assert sum(AudioChunk.is_type(e.type) for e in events) >= 2  # streamed, not one blob
        assert 2.0 < len(samples) / RATE < 10.0
        assert np.abs(samples).max() > 0.05
    default, _ = _audio(run(speak(None)))
    cloned, _ = _audio(run(speak(voice_id[1])))
    assert default.shape != cloned.shape or not np.array_equal(default, cloned)


def test_streamed_text_is_spoken_sentence_by_sentence(wyoming: LiveWyoming) -> None:
    pieces = ["Good mor", "ning. The weather to", "day is sunny. Have a ", "nice day"]

    async def stream() -> tuple[list[Event], list[Event]]:
        async with AsyncTcpClient("127.0.0.1", wyoming.port) as client:
            await client.write_event(SynthesizeStart().event())
            await client.write_event(SynthesizeChunk(text=pieces[0]).event())
            await client.write_event(SynthesizeChunk(text=pieces[1]).event())
            # The first sentence is complete: its audio comes before the text ends.
            early = await _until(client, AudioStop().event().type)
            for piece in pieces[2:]:
                await client.write_event(SynthesizeChunk(text=piece).event())
            # Home Assistant also sends the whole text for servers that cannot stream.
            await client.write_event(Synthesize(text="".join(pieces)).event())
            await client.write_event(SynthesizeStop().event())
            rest = await _until(client, SynthesizeStopped().event().type)
            return early, rest

    early, rest = run(stream())
    assert sum(AudioStart.is_type(e.type) for e in early) == 1
    # "The weather today is sunny." and "Have a nice day": one audio stream each, then the end.
    assert sum(AudioStart.is_type(e.type) for e in rest) == 2
    assert sum(AudioStop.is_type(e.type) for e in rest) == 2
    assert SynthesizeStopped.is_type(rest[-1].type)
    first, _ = _audio(early)
    assert 0.3 < len(first) / RATE < 3.0  # "Good morning." alone


def test_errors_keep_the_connection(wyoming: LiveWyoming) -> None:
    async def attempts() -> list[Event]:
        async with AsyncTcpClient("127.0.0.1", wyoming.port) as client:
            out = []
            for request in (
                Synthesize(text="Hello.", voice=SynthesizeVoice(name="nobody")),
                Synthesize(text="   "),
                Synthesize(text="x" * 5000),
            ):
                await client.write_event(request.event())
                out += await _until(client, Error(text="").event().type)
            await client.write_event(Synthesize(text="Still here.").event())
            out += await _until(client, AudioStop().event().type)
            return out

    events = run(attempts())
    errors = [Error.from_event(e) for e in events if Error.is_type(e.type)]
    assert [e.code for e in errors] == ["voice_not_found", "empty_text", "too_long"]
    assert "nobody" in errors[0].text and all("\n" not in e.text for e in errors)
    assert AudioStop.is_type(events[-1].type)


def test_events_with_fields_of_the_wrong_type_are_errors_and_keep_the_connection(
    wyoming: LiveWyoming,
) -> None:
    """The library's from_event trusts the fields: a number as text, no text, or a number as
    the voice's name ended the handler with no answer (attack round three). Now each is an
    error event and the connection goes on."""

    async def attempts() -> list[Event]:
        async with AsyncTcpClient("127.0.0.1", wyoming.port) as client:
            out = []
            for data in (
                {"text": 5},
                {},
                {"text": "Hi.", "voice": {"name": 7}},
                {"text": "Hi.", "voice": "default"},
            ):
                await client.write_event(Event(type="synthesize", data=data))
                out += await _until(client, Error(text="").event().type)
            await client.write_event(Event(type="synthesize-chunk", data={"text": None}))
            out += await _until(client, Error(text="").event().type)
            await client.write_event(Synthesize(text="Still here.").event())
            out += await _until(client, AudioStop().event().type)
            return out

    events = run(attempts())
    errors = [Error.from_event(e) for e in events if Error.is_type(e.type)]
    assert [e.code for e in errors] == ["bad_event"] * 5
    assert '"text" must be a string' in errors[0].text and "voice" in errors[2].text
    assert AudioStop.is_type(events[-1].type)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"[" * 20_000 + b"]" * 20_000 + b"\n", "nests deeper"),  # past the parser's recursion
        (b'{"type": "x", "data": ' + b'{"a": ' * 40 + b"1" + b"}" * 40 + b"}\n", "nests deeper"),
        (b'{"type": "synthesize", "data_length": 1000000000}\n', "data_length"),
        (b'{"type": "synthesize", "payload_length": -5}\n', "payload_length"),
        (b"not json at all\n", "not JSON"),
        (b"x" * 100_000 + b"\n", "longer than 64 KiB"),
    ],
    ids=["recursion", "deep-data", "data-length", "payload-length", "not-json", "long-line"],
)
def test_bad_events_get_an_error_and_a_closed_connection(
    wyoming: LiveWyoming, raw: bytes, reason: str
) -> None:
    with socket.create_connection(("127.0.0.1", wyoming.port), timeout=60) as sock:
        sock.sendall(raw)
        received = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    header = json.loads(received.split(b"\n", 1)[0])
    assert header["type"] == "error"
    data = header.get("data") or json.loads(received.split(b"\n", 1)[1])
    assert data["code"] == "bad_event" and reason in data["text"]


@pytest.mark.parametrize("uri", ["tcp://127.0.0.1:99999", "tcp://127.0.0.1", "udp://x:1"])
def test_a_bad_uri_is_one_line_and_exit_2(uri: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "onnx_tts.server.wyoming", "--uri", uri, "--cache-dir", "none"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"onnx-tts wyoming: --uri must be tcp://HOST:PORT with a port in 0-65535, got {uri!r}"
    ]


def test_a_stop_before_a_start_is_an_error(wyoming: LiveWyoming) -> None:
    async def attempt() -> list[Event]:
        async with AsyncTcpClient("127.0.0.1", wyoming.port) as client:
            await client.write_event(SynthesizeStop().event())
            return await _until(client, Error(text="").event().type)

    errors = [Error.from_event(e) for e in run(attempt()) if Error.is_type(e.type)]
    assert [e.code for e in errors] == ["bad_order"]


def test_a_second_start_while_a_stream_is_open_is_an_error(wyoming: LiveWyoming) -> None:
    async def attempt() -> list[Event]:
        async with AsyncTcpClient("127.0.0.1", wyoming.port) as client:
            await client.write_event(SynthesizeStart().event())
            await client.write_event(SynthesizeStart().event())
            out = await _until(client, Error(text="").event().type)
            await client.write_event(SynthesizeStop().event())
            return out + await _until(client, "synthesize-stopped")

    events = run(attempt())
    errors = [Error.from_event(e) for e in events if Error.is_type(e.type)]
    assert [e.code for e in errors] == ["bad_order"]
    assert events[-1].type == "synthesize-stopped"  # the first stream is still open


def test_a_streamed_text_past_its_bound_is_refused_while_it_is_spoken(
    wyoming: LiveWyoming,
) -> None:
    """The connection keeps reading while it speaks: a streamed text that passes its bound
    gets the error when the chunk arrives (it waited behind the speech of everything before
    it), what was queued is dropped, and the connection goes on."""
    from onnx_tts.server.wyoming import MAX_STREAM_CHARS

    chunk = "Hello there, this is a sentence. " * 120  # 3960 characters
    chunks = MAX_STREAM_CHARS // len(chunk) + 2

    async def attempt() -> tuple[list[Event], list[Event]]:
        async with AsyncTcpClient("127.0.0.1", wyoming.port) as client:
            await client.write_event(SynthesizeStart().event())
            for _ in range(chunks):
                await client.write_event(SynthesizeChunk(text=chunk).event())
            events = await _until(client, Error(text="").event().type)
            await client.write_event(Describe().event())
            return events, await _until(client, Info(tts=[]).event().type)

    events, after = run(attempt())
    errors = [Error.from_event(e) for e in events if Error.is_type(e.type)]
    assert len(errors) == 1 and str(MAX_STREAM_CHARS) in errors[0].text
    assert Info.is_type(after[-1].type)


def test_address_in_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = subprocess.run(
            [
                *(sys.executable, "-m", "onnx_tts.server.wyoming"),
                *("--uri", f"tcp://127.0.0.1:{port}"),
                *("--voices-dir", str(tmp_path / "v"), "--cache-dir", "none"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("onnx-tts wyoming: cannot listen on")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT])
def test_sigterm_mid_synthesis_exits_0(tmp_path: Path, sig: int) -> None:
    """SIGTERM, and as it every terminating signal (issue 43: SIGHUP and SIGQUIT), stops the
    server with exit 0."""
    live = LiveWyoming(tmp_path)
    text = " ".join(f"Sentence {i} for the stop test keeps the worker busy." for i in range(40))

    async def start() -> None:
        async with AsyncTcpClient("127.0.0.1", live.port) as client:
            await client.write_event(Synthesize(text=text).event())
            await _until(client, AudioChunk(rate=RATE, width=2, channels=1, audio=b"").event().type)
            live.process.send_signal(sig)
            while await client.read_event() is not None:
                pass

    try:
        run(start())
        assert live.process.wait(WAIT_BOUND_SECONDS) == 0
    finally:
        live.stop()
    assert "Traceback" not in live.log()


# -- issue 36: half-closed clients, bad stored voices, header and idle timeouts -----------------

LONG = " ".join(f"Sentence {i} of a text that takes a while to speak." for i in range(12))


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveWyoming, dict]]:
    """A server with one-second header and idle timeouts, and stored voices whose audio is
    gone, garbage, or a FIFO (as a disk, a hand edit or an attacker leaves them)."""
    workdir = tmp_path_factory.mktemp("wyoming-quick")
    store = VoiceStore(workdir / "voices")
    bad = {}
    for seed, kind in enumerate(("missing", "garbage", "fifo", "other audio")):
        voice, _ = store.add(f"broken {kind}", speechlike(2.0, RATE, seed=20 + seed), RATE)
        audio = workdir / "voices" / f"{voice.id}.wav"
        audio.unlink()
        if kind == "garbage":
            audio.write_bytes(b"not audio at all " * 100)
        elif kind == "fifo":
            os.mkfifo(audio)
        elif kind == "other audio":
            VoiceStore(workdir / "other").add("x", speechlike(2.0, RATE, seed=30), RATE)
            (other,) = (workdir / "other").glob("*.wav")
            other.rename(audio)
        bad[kind] = voice.id
    live = LiveWyoming(workdir, "--header-timeout", "1", "--idle-timeout", "1")
    yield live, bad
    assert live.stop() == 0
    assert "Traceback" not in live.log()


def test_a_client_that_half_closes_after_sending_still_gets_its_audio(
    quick: tuple[LiveWyoming, dict],
) -> None:
    """`nc -N` sends, then shuts its write side: the server saw the end of the stream and
    dropped what it was about to say. Now it speaks everything asked (here longer than the
    one-second idle timeout, which does not run while it speaks), then closes."""
    live, _ = quick

    async def ask(events: list[Event]) -> list[Event]:
        async with AsyncTcpClient("127.0.0.1", live.port) as client:
            for event in events:
                await client.write_event(event)
            client._writer.write_eof()  # the library's own stream writer: a half-close
            received = []
            while (event := await client.read_event()) is not None:
                received.append(event)
            return received

    whole = run(ask([Synthesize(text=LONG).event()]))
    assert AudioStop.is_type(whole[-1].type), [e.type for e in whole][-3:]
    samples, _ = _audio(whole)
    assert len(samples) / RATE > 5.0 and np.abs(samples).max() > 0.05
    streamed = run(
        ask(
            [
                SynthesizeStart().event(),
                SynthesizeChunk(text="First sentence here. Second one").event(),
                SynthesizeChunk(text=" ends now.").event(),
                SynthesizeStop().event(),
            ]
        )
    )
    types = [e.type for e in streamed]
    assert types.count("audio-stop") == 2 and types[-1] == "synthesize-stopped"


@pytest.mark.parametrize("kind", ["missing", "garbage", "fifo", "other audio"])
def test_a_stored_voice_whose_audio_is_bad_is_an_error_event_at_once(
    quick: tuple[LiveWyoming, dict], kind: str
) -> None:
    """Such a voice used to leave the client waiting with no answer (a dead speaker task);
    now it gets an error event naming the problem, and the connection goes on."""
    live, bad = quick

    async def attempt() -> list[Event]:
        async with AsyncTcpClient("127.0.0.1", live.port) as client:
            voice = SynthesizeVoice(name=bad[kind])
            await client.write_event(Synthesize(text="Hello.", voice=voice).event())
            out = await _until(client, Error(text="").event().type)
            await client.write_event(Synthesize(text="Still here.").event())
            return out + await _until(client, AudioStop().event().type)

    events = run(attempt())
    (error,) = [Error.from_event(e) for e in events if Error.is_type(e.type)]
    assert error.code == "voice_damaged" and bad[kind] in error.text and "\n" not in error.text
    reason = {"missing": "missing", "garbage": "not audio", "fifo": "a FIFO"}
    assert reason.get(kind, "does not match its id") in error.text
    assert AudioStop.is_type(events[-1].type)


@pytest.mark.parametrize(
    "partial",
    [b'{"type": "synthe', b'{"type": "synthesize", "data_length": 100}\n{"text": "'],
    ids=["half-a-header", "half-the-data"],
)
def test_a_partial_event_is_answered_and_closed_after_the_header_timeout(
    quick: tuple[LiveWyoming, dict], partial: bytes
) -> None:
    live, _ = quick
    with socket.create_connection(("127.0.0.1", live.port), timeout=60) as sock:
        sock.sendall(partial)
        received = b""
        while chunk := sock.recv(65536):  # the server closes; no wait on our side
            received += chunk
    header = json.loads(received.split(b"\n", 1)[0])
    data = header.get("data") or json.loads(received.split(b"\n", 1)[1])
    assert header["type"] == "error" and data["code"] == "bad_event"
    assert "within 1 s" in data["text"]


def test_a_silent_connection_is_closed_after_the_idle_timeout(
    quick: tuple[LiveWyoming, dict],
) -> None:
    live, _ = quick
    for opening in (b"", b'{"type": "describe"}\n'):
        with socket.create_connection(("127.0.0.1", live.port), timeout=60) as sock:
            sock.sendall(opening)
            received = b""
            while chunk := sock.recv(65536):
                received += chunk
        assert (json.loads(received.split(b"\n", 1)[0])["type"] if received else None) == (
            "info" if opening else None
        )


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--idle-timeout", "0"], {}, "--idle-timeout must be in [0.1, 3600]"),
        (["--header-timeout", "5000"], {}, "--header-timeout must be in [0.1, 3600]"),
        ([], {"ONNX_TTS_IDLE_TIMEOUT": "soon"}, "$ONNX_TTS_IDLE_TIMEOUT must be a number"),
    ],
)
def test_timeouts_are_bounded_flags_and_variables(
    args: list[str], env: dict[str, str], message: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "onnx_tts.server.wyoming", "--cache-dir", "none", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("onnx-tts wyoming: ") and message in line


# -- issue 38: markup, speed and pauses, languages, attribution -----------------------------------


async def _speak(port: int, *events: Event) -> list[Event]:
    """Send `events` on one connection; everything up to the end of the last answer."""
    async with AsyncTcpClient("127.0.0.1", port) as client:
        for event in events:
            await client.write_event(event)
        last = "synthesize-stopped" if SynthesizeStop.is_type(events[-1].type) else "audio-stop"
        return await _until(client, last, "error")


def _errors(events: list[Event]) -> list[Error]:
    return [Error.from_event(e) for e in events if Error.is_type(e.type)]


def test_ssml_is_read_never_spoken_whole_or_streamed(wyoming: LiveWyoming) -> None:
    plain, _ = _audio(
        run(_speak(wyoming.port, Synthesize(text="Hello world. How are you?").event()))
    )
    document = "<speak><p><s>Hello world.</s> <s>How are you?</s></p></speak>"
    marked, _ = _audio(run(_speak(wyoming.port, Synthesize(text=document).event())))
    assert np.array_equal(marked, plain)
    # Streamed in pieces that cut the tags: kept until the stream ends, then spoken whole.
    pieces = ["<spe", "ak><p><s>Hello world.</s> ", "<s>How are", " you?</s></p></speak>"]
    streamed = run(
        _speak(
            wyoming.port,
            SynthesizeStart().event(),
            *(SynthesizeChunk(text=piece).event() for piece in pieces),
            SynthesizeStop().event(),
        )
    )
    assert not _errors(streamed)
    assert [e.type for e in streamed if not AudioChunk.is_type(e.type)] == [
        "audio-start",
        "audio-stop",
        "synthesize-stopped",
    ]
    assert np.array_equal(_audio(streamed)[0], plain)
    # text_format "ssml" forces it (a text without <speak>), "text" reads markup as text.
    forced = Synthesize(text='Hello <break time="1s"/> world.', text_format="ssml").event()
    broken, _ = _audio(run(_speak(wyoming.port, forced)))
    hello, _ = _audio(run(_speak(wyoming.port, Synthesize(text="Hello").event())))
    world, _ = _audio(run(_speak(wyoming.port, Synthesize(text="world.").event())))
    assert len(broken) == len(hello) + RATE + len(world)
    as_text = Synthesize(text="<speak>Hello</speak>", text_format="text").event()
    assert len(_audio(run(_speak(wyoming.port, as_text)))[0]) > len(hello)
    stray, _ = _audio(run(_speak(wyoming.port, Synthesize(text="If a < b then say so.").event())))
    assert len(stray) > RATE // 2


def test_invalid_markup_is_an_error_event_naming_its_position(wyoming: LiveWyoming) -> None:
    cases = [
        (Synthesize(text="<speak>\n<s>unclosed</speak>").event(), "invalid_ssml", "line 2"),
        (Synthesize(text="Say [[ h ə now.").event(), "invalid_markup", "line 1, column 5"),
    ]
    for event, code, where in cases:
        (error,) = _errors(run(_speak(wyoming.port, event)))
        assert error.code == code and where in error.text and "\n" not in error.text
    streamed = run(
        _speak(
            wyoming.port,
            SynthesizeStart().event(),
            SynthesizeChunk(text="<speak>Hi <break ").event(),
            SynthesizeChunk(text="time='soon'/></speak>").event(),
            SynthesizeStop().event(),
        )
    )
    (error,) = _errors(streamed)
    assert error.code == "invalid_ssml" and "line 1, column 11" in error.text


def test_streamed_phonemes_are_never_cut_at_a_period(wyoming: LiveWyoming) -> None:
    """A ". " inside [[ ... ]] is not a sentence end: the span reaches the engine whole."""
    first = "Say [[ h ə. l oʊ ]] now."
    streamed = run(
        _speak(
            wyoming.port,
            SynthesizeStart().event(),
            SynthesizeChunk(text="Say [[ h ə. l").event(),
            SynthesizeChunk(text=" oʊ ]] now. And then").event(),
            SynthesizeChunk(text=" goodbye.").event(),
            SynthesizeStop().event(),
        )
    )
    assert not _errors(streamed)
    stops = [i for i, e in enumerate(streamed) if AudioStop.is_type(e.type)]
    assert len(stops) == 2  # the two sentences, each as it completed
    alone, _ = _audio(run(_speak(wyoming.port, Synthesize(text=first).event())))
    assert np.array_equal(_audio(streamed[: stops[0] + 1])[0], alone)


def test_speed_and_sentence_silence_extension_fields(wyoming: LiveWyoming) -> None:
    text = "The first sentence. The second one."
    pause = round(0.15 * RATE)  # the default voice's pause between sentences

    def speak(**fields: object) -> np.ndarray:
        event = Event(type="synthesize", data={"text": text, **fields})
        return _audio(run(_speak(wyoming.port, event)))[0]

    normal = speak()
    fast = speak(speed=2.0)
    assert abs((len(fast) - pause) - (len(normal) - pause) / 2) <= 2
    spaced = speak(sentence_silence=0.6)
    assert len(spaced) - len(normal) == int(0.6 * RATE) - pause
    streamed = run(
        _speak(
            wyoming.port,
            Event(type="synthesize-start", data={"speed": 2.0}),
            SynthesizeChunk(text=text).event(),
            SynthesizeStop().event(),
        )
    )
    assert len(_audio(streamed)[0]) < len(normal) * 0.7  # the stream's speed applies
    for fields, code, says in (
        ({"speed": "fast"}, "bad_event", '"speed" must be a number'),
        ({"sentence_silence": True}, "bad_event", '"sentence_silence" must be a number'),
        ({"text_format": "markdown"}, "bad_event", "text_format"),
        ({"speed": 9}, "InputError", "speed must be in [0.25, 4]"),
    ):
        event = Event(type="synthesize", data={"text": "Hi.", **fields})
        (error,) = _errors(run(_speak(wyoming.port, event)))
        assert error.code == code and says in error.text


def test_a_language_the_voice_does_not_speak_is_an_error_naming_its_languages(
    wyoming: LiveWyoming,
) -> None:
    for voice in ({"language": "de"}, {"name": "default", "language": "de_DE"}):
        event = Event(type="synthesize", data={"text": "Hallo.", "voice": voice})
        (error,) = _errors(run(_speak(wyoming.port, event)))
        assert error.code == "language_not_supported"
        assert repr(voice["language"]) in error.text and "it speaks en" in error.text
    english = Synthesize(text="Hello.", voice=SynthesizeVoice(language="en-US")).event()
    samples, _ = _audio(run(_speak(wyoming.port, english)))
    assert len(samples) > RATE // 4


def test_info_attributes_the_project(wyoming: LiveWyoming) -> None:
    """Every program and voice names the project's repository (pyproject's [project.urls])."""
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    url = pyproject["project"]["urls"]["Repository"]
    assert url.startswith("https://")

    async def describe() -> Info:
        async with AsyncTcpClient("127.0.0.1", wyoming.port) as client:
            await client.write_event(Describe().event())
            (event,) = await _until(client, "info")
            return Info.from_event(event)

    (program,) = run(describe()).tts
    assert program.attribution.url == url and program.attribution.name == "onnx-tts"
    assert all(voice.attribution.url == url for voice in program.voices)


def test_streamed_text_cuts_sentences_outside_markup() -> None:
    from onnx_tts.server.text_stream import Piece, StreamedText

    plain = StreamedText()
    assert plain.add("Good mor") == []
    assert plain.add("ning. The [[ h ə. l") == [Piece("Good morning.", False)]
    assert plain.add(" oʊ ]] day. Bye") == [Piece("The [[ h ə. l oʊ ]] day.", False)]
    assert plain.finish() == [Piece("Bye", False)]
    ssml = StreamedText()
    assert ssml.add("  <?xml ver") == [] and not ssml.ssml
    assert ssml.add("sion='1.0'?> <spe") == [] and ssml.ssml  # an XML document: kept whole
    assert ssml.add("ak>One. Two. ") == [] and ssml.ssml
    assert ssml.add("Three.</speak>") == []
    assert ssml.finish() == [Piece("  <?xml version='1.0'?> <speak>One. Two. Three.</speak>", None)]
    forced = StreamedText(ssml=True)
    assert forced.add("Hi. <break/> there. More") == []
    assert forced.finish() == [Piece("Hi. <break/> there. More", True)]
    declared_plain = StreamedText(ssml=False)
    assert declared_plain.add("<speak>Hi. There") == [Piece("<speak>Hi.", False)]
    assert StreamedText().finish() == [] and StreamedText().add("   ") == []
    commented = StreamedText()
    assert commented.add("<!-- from an edi") == [] and not commented.ssml
    assert commented.add("tor -->\n<speak>Hi. There.</speak>") == [] and commented.ssml
    unfinished = StreamedText()
    assert unfinished.add("<spe") == []
    assert unfinished.finish() == [Piece("<spe", None)]  # the engine tells (is_ssml)


# -- issue 43 -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "chunks",
    [
        ["[[ "] + ["a. "] * 8000,  # a sentence end after every chunk, all inside an open [[
        ["a"] * 120_000,  # no sentence end at all
        ["One. Two! "] * 4000,  # a sentence cut at every chunk
        ["<?xml "] + ["a"] * 20_000,  # a start that could still be SSML for a while
    ],
    ids=["open-phonemes", "one-character", "cut-every-chunk", "undecided-start"],
)
def test_a_streamed_text_costs_work_in_its_length(chunks: list[str]) -> None:
    """Every chunk rescanned the text so far (8,000 chunks of "a. " after an open "[[" cost
    117 s of CPU, 120,000 one-character chunks 51 s): the scan keeps its state between chunks,
    so the characters looked at over a whole stream stay within twice its length (and the
    first UNDECIDED_CHARS characters of a start that may be SSML, once per chunk)."""
    from onnx_tts.server.text_stream import UNDECIDED_CHARS, StreamedText

    text = StreamedText()
    spoken = [piece.text for chunk in chunks for piece in text.add(chunk)]
    spoken += [piece.text for piece in text.finish()]
    total = sum(map(len, chunks))
    undecided = min(len(chunks), UNDECIDED_CHARS) * UNDECIDED_CHARS
    assert text.examined <= 2 * total + undecided
    # and it is still the same cut: the sentences split where split_sentences would
    assert " ".join(spoken).split() == "".join(chunks).split()
    if chunks[0] == "One. Two! ":
        assert spoken[:3] == ["One.", "Two!", "One."] and len(spoken) == 8000


async def _answers(port: int, *events: Event) -> list[Event]:
    """Send `events` on one connection; everything up to the end of the last one's audio."""
    async with AsyncTcpClient("127.0.0.1", port) as client:
        for event in events:
            await client.write_event(event)
        return await _until(client, "audio-stop")


def test_bad_extension_values_and_whitespace_streams_are_error_events(
    wyoming: LiveWyoming,
) -> None:
    """`speed` of 10**400 (an integer no float holds) or null logged an OverflowError
    traceback, and a stream of whitespace-only chunks ended with neither audio nor an error.
    Now each is an error event naming what was wrong, and the connection goes on."""
    huge = json.loads("1" + "0" * 400)
    for fields, code, says in (
        ({"speed": huge}, "InputError", "speed must be in [0.25, 4], got an integer of about"),
        ({"sentence_silence": huge}, "InputError", "sentence_silence must be in [0, 10]"),
        ({"speed": None}, "bad_event", '"speed" must be a number, got null'),
        ({"sentence_silence": None}, "bad_event", '"sentence_silence" must be a number'),
        ({"speed": -(10**30)}, "InputError", "speed must be in"),
    ):
        for start in (
            Event(type="synthesize", data={"text": "Hi.", **fields}),
            Event(type="synthesize-start", data=fields),
        ):
            sent = [start]
            if start.type == "synthesize-start":
                sent += [SynthesizeChunk(text="Hi there.").event(), SynthesizeStop().event()]
            events = run(_answers(wyoming.port, *sent, Synthesize(text="Still here.").event()))
            (error,) = _errors(events)
            assert error.code == code and says in error.text, (fields, error)
            assert "\n" not in error.text
            assert len(_audio(events)[0]) > RATE // 4  # then "Still here." is spoken

    async def whitespace_stream() -> list[Event]:
        async with AsyncTcpClient("127.0.0.1", wyoming.port) as client:
            await client.write_event(SynthesizeStart().event())
            for chunk in (" ", "\n", "\t ", "\u3000"):
                await client.write_event(SynthesizeChunk(text=chunk).event())
            await client.write_event(SynthesizeStop().event())
            return await _until(client, "synthesize-stopped")

    whitespace = run(whitespace_stream())
    (error,) = _errors(whitespace)
    assert error.code == "empty_text" and "nothing to say" in error.text
    assert not any(AudioStart.is_type(e.type) for e in whitespace)
    assert SynthesizeStopped.is_type(whitespace[-1].type)
    assert "Traceback" not in wyoming.log()

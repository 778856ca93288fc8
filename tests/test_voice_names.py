"""Issue 36: a voice name reaches exactly one voice. Uploads named like a voice that already
answers to that name (the default voice, OpenAI's names, a model's builtin voices, an id,
another stored voice, in any case, spacing or Unicode form) were accepted and then shadowed;
now they are 409 in OpenAI's envelope, and speech with a name uses the voice it denotes, over
HTTP (the official openai client and httpx) and Wyoming (the wyoming library's client), against
live servers."""

from __future__ import annotations

import asyncio
import io
import json
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import soundfile
from wyoming.audio import AudioChunk, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize, SynthesizeVoice

from benchmarks.live_server import LiveServer, LiveWyoming
from onnx_tts.server.voices import Voice, voice_id
from tests.conftest import speechlike

RATE = 16000  # the default voice's encoder rate
VOICE_MODEL = Path(__file__).resolve().parents[1] / "onnx_tts" / "models" / "voice"


def wav(seed: int, seconds: float = 2.0) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, speechlike(seconds, RATE, seed=seed), RATE, format="WAV")
    return buffer.getvalue()


def upload(server: LiveServer, name: str, seed: int) -> httpx.Response:
    return httpx.post(
        server.url + "/v1/audio/voices",
        files={"audio_sample": ("voice.wav", wav(seed), "audio/wav")},
        data={"name": name},
        timeout=60,
    )


def speak(server: LiveServer, voice: object, **fields: object) -> httpx.Response:
    body = {"input": "Hello there.", "voice": voice, "response_format": "pcm", "seed": 3}
    return httpx.post(server.url + "/v1/audio/speech", json={**body, **fields}, timeout=120)


def listed(server: LiveServer) -> list[dict]:
    return httpx.get(server.url + "/v1/audio/voices", timeout=30).json()["voices"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = LiveServer(tmp_path_factory.mktemp("names"))
    yield live
    live.stop()
    assert "Traceback" not in live.log()


RESERVED = [
    "alloy",
    "default",
    "shimmer",
    "nova ",  # a trailing space
    "  Echo",
    "ALLOY",
    "Default",
    "ｓｈｉｍｍｅｒ",  # fullwidth
    "no\u200bva",  # a zero-width space inside
    "\u2060coral",  # a word joiner in front
    "voice_0123456789abcdef01234567",  # shaped like an id
    "VOICE_0123456789ABCDEF01234567",
]


@pytest.mark.parametrize("name", RESERVED)
def test_a_name_that_already_reaches_a_voice_is_409(server: LiveServer, name: str) -> None:
    response = upload(server, name, seed=40)
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert error["param"] == "name" and error["code"] == "voice_name_reserved"
    assert error["type"] == "invalid_request_error" and "\n" not in error["message"]
    assert len(listed(server)) == len({v["id"] for v in listed(server)})
    assert all(v["id"] == "default" or v["name"] != name.strip() for v in listed(server))


def test_speech_with_openai_names_is_the_default_voice(server: LiveServer) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    default = speak(server, "default").content
    for name in ("alloy", "nova", "Nova ", "ＡＬＬＯＹ"):
        made = client.audio.speech.create(
            model="tts-1", voice=name, input="Hello there.", response_format="pcm",
            extra_body={"seed": 3},
        )  # fmt: skip
        assert made.content == default, name


def test_names_differing_in_case_spacing_or_unicode_form_are_one_name(server: LiveServer) -> None:
    first = upload(server, "Café  Kitchen", seed=41)
    assert first.status_code == 201, first.text
    assert first.json()["name"] == "Café Kitchen"  # stored in one form
    decomposed = unicodedata.normalize("NFD", "café kitchen")
    for name in ("café kitchen", " CAFÉ KITCHEN ", decomposed, "Café\u00a0Kitchen"):
        clash = upload(server, name, seed=42)
        assert clash.status_code == 409, (name, clash.text)
        error = clash.json()["error"]
        assert error["code"] == "voice_name_taken" and error["param"] == "name"
        assert first.json()["id"] in error["message"]
    # Every spelling speaks the stored voice, exactly as its id does.
    by_id = speak(server, first.json()["id"])
    assert by_id.status_code == 200, by_id.text
    assert by_id.content != speak(server, "default").content
    for name in ("Café Kitchen", "cafe\u0301 kitchen", " CAFÉ   KITCHEN", {"id": "café kitchen"}):
        spoken = speak(server, name)
        assert spoken.status_code == 200 and spoken.content == by_id.content, name


def test_a_name_two_stored_voices_answer_to_is_409_and_each_id_works(
    server: LiveServer,
) -> None:
    """A store written by something else (an older server, a hand edit) can hold voices one
    name reaches: that name is refused, naming them, and each stays reachable by its id."""
    voices = server.log_path.parent / "voices"
    made = []
    for seed, name in ((43, "Porch"), (44, "porch ")):
        samples = speechlike(2.0, RATE, seed=seed)
        voice = Voice(voice_id(samples, RATE), name, 1, RATE)
        soundfile.write(str(voices / f"{voice.id}.wav"), samples, RATE, subtype="FLOAT")
        (voices / f"{voice.id}.json").write_text(json.dumps(voice.__dict__))
        made.append(voice.id)
    ambiguous = speak(server, "porch")
    assert ambiguous.status_code == 409, ambiguous.text
    error = ambiguous.json()["error"]
    assert error["code"] == "voice_ambiguous" and error["param"] == "voice"
    assert all(ident in error["message"] for ident in made)
    spoken = [speak(server, ident) for ident in made]
    assert [s.status_code for s in spoken] == [200, 200]
    assert spoken[0].content != spoken[1].content
    # An old voice named like OpenAI's voice makes that name ambiguous too (never silent).
    samples = speechlike(2.0, RATE, seed=45)
    legacy = Voice(voice_id(samples, RATE), "Shimmer", 1, RATE)
    soundfile.write(str(voices / f"{legacy.id}.wav"), samples, RATE, subtype="FLOAT")
    (voices / f"{legacy.id}.json").write_text(json.dumps(legacy.__dict__))
    assert speak(server, "shimmer").json()["error"]["code"] == "voice_ambiguous"
    assert speak(server, legacy.id).status_code == 200


def test_wyoming_lists_and_resolves_names_by_the_same_rules(
    server: LiveServer, tmp_path: Path
) -> None:
    """Wyoming reads the same voices directory: its describe lists them by id, a name reaches
    the voice the HTTP server's name reaches, and a name that reaches nothing is an error."""
    created = upload(server, "Garden Shed", seed=46)
    assert created.status_code == 201, created.text
    ident = created.json()["id"]
    live = LiveWyoming(tmp_path, "--voices-dir", str(server.log_path.parent / "voices"))

    async def session() -> tuple[Info, dict[str, bytes | str]]:
        results: dict[str, bytes | str] = {}
        async with AsyncTcpClient("127.0.0.1", live.port) as client:
            await client.write_event(Describe().event())
            info = Info.from_event(await client.read_event())
        for name in ("default", ident, "garden shed", " GARDEN  SHED", "nobody here"):
            async with AsyncTcpClient("127.0.0.1", live.port) as client:
                voice = SynthesizeVoice(name=name)
                await client.write_event(Synthesize(text="Hello there.", voice=voice).event())
                pcm = b""
                while True:
                    event = await client.read_event()
                    assert event is not None, "closed without an answer"
                    if Error.is_type(event.type):
                        results[name] = Error.from_event(event).code or "error"
                        break
                    if AudioChunk.is_type(event.type):
                        pcm += AudioChunk.from_event(event).audio
                    if AudioStop.is_type(event.type):
                        results[name] = pcm
                        break
        return info, results

    try:
        info, results = asyncio.run(asyncio.wait_for(session(), 300))
    finally:
        assert live.stop() == 0
    names = {v.name: v.description for v in info.tts[0].voices}
    assert names[ident] == "Garden Shed" and "default" in names
    assert results["nobody here"] == "voice_not_found"
    spoken = [results[n] for n in (ident, "garden shed", " GARDEN  SHED")]
    assert isinstance(spoken[0], bytes) and len(spoken[0]) > 1000
    # The default voice decodes greedily: one voice, one output, byte for byte.
    assert spoken[1] == spoken[0] and spoken[2] == spoken[0]
    assert results["default"] != spoken[0]
    assert "Traceback" not in live.log()


def test_a_models_builtin_voice_names_are_reserved_and_reach_only_that_model(
    moss_official: Path, tmp_path: Path
) -> None:
    """Two models served: MOSS-TTS-Nano's builtin voices (Junhao, Ava, Bella) cannot be taken
    by an upload, in any spelling; asking the other model for one is a 404 that says whose it
    is, and asking MOSS for it in another case reaches it."""
    live = LiveServer(
        tmp_path, "--model", str(VOICE_MODEL), "--model", str(moss_official), "--threads", "1"
    )
    try:
        models = [m["id"] for m in httpx.get(live.url + "/v1/models").json()["data"]]
        moss = next(m for m in models if "moss" in m.lower())
        for name in ("Junhao", "junhao", " AVA", "ｂｅｌｌａ"):
            response = upload(live, name, seed=47)
            assert response.status_code == 409, (name, response.text)
            error = response.json()["error"]
            assert error["code"] == "voice_name_reserved" and moss in error["message"]
        wrong = speak(live, "Junhao", model="tts-1")
        assert wrong.status_code == 404 and moss in wrong.json()["error"]["message"]
        options = {"model": moss, "max_new_frames": 6, "sample_mode": "greedy"}
        exact = speak(live, "Ava", **options)
        spelled = speak(live, " ava", **options)
        other = speak(live, "Bella", **options)
    finally:
        live.stop()
    assert exact.status_code == 200 and spelled.content == exact.content
    assert other.status_code == 200 and other.content != exact.content
    assert "Traceback" not in live.log()


# -- issue 43: a name that normalisation lengthens ------------------------------------------------
def _wyoming_session(live: LiveWyoming, voice: str) -> tuple[Info, bytes | str]:
    """Wyoming's describe, then "Hello there." in `voice`: its PCM, or its error code."""

    async def session() -> tuple[Info, bytes | str]:
        async with AsyncTcpClient("127.0.0.1", live.port) as client:
            await client.write_event(Describe().event())
            info = Info.from_event(await client.read_event())
            await client.write_event(
                Synthesize(text="Hello there.", voice=SynthesizeVoice(name=voice)).event()
            )
            pcm = b""
            while True:
                event = await client.read_event()
                assert event is not None, "closed without an answer"
                if Error.is_type(event.type):
                    return info, Error.from_event(event).code or "error"
                if AudioChunk.is_type(event.type):
                    pcm += AudioChunk.from_event(event).audio
                if AudioStop.is_type(event.type):
                    return info, pcm

    return asyncio.run(asyncio.wait_for(session(), 300))


def test_a_voice_is_reachable_by_its_id_whatever_normalisation_did_to_its_name(
    server: LiveServer, tmp_path: Path
) -> None:
    """U+0958 is two characters composed (NFC): 100 of them were stored as 200 characters,
    a record the store then refused to read, so the voice's own id was a 404 over HTTP and an
    unknown voice over Wyoming. Now an upload is bounded as it is stored (400, too_long), a
    name that fits is reachable by its id everywhere, and a record an older version stored
    that way is read again."""
    too_long = upload(server, "\u0958" * 100, seed=60)
    assert too_long.status_code == 400, too_long.text
    error = too_long.json()["error"]
    assert error["param"] == "name" and error["code"] == "too_long"
    assert "200" in error["message"] and "\n" not in error["message"]
    ligatures = upload(server, "\ufdfa" * 30, seed=60)  # 18 letters each, once normalised
    assert ligatures.status_code == 400 and ligatures.json()["error"]["code"] == "too_long"

    fits = upload(server, "\u0958" * 50, seed=61)
    assert fits.status_code == 201, fits.text
    ident = fits.json()["id"]
    assert len(fits.json()["name"]) == 100
    # A record an older version wrote: 100 typed characters stored as 200.
    voices = server.log_path.parent / "voices"
    samples = speechlike(2.0, RATE, seed=62)
    legacy = Voice(voice_id(samples, RATE), unicodedata.normalize("NFC", "\u0958" * 100), 1, RATE)
    assert len(legacy.name) == 200
    soundfile.write(str(voices / f"{legacy.id}.wav"), samples, RATE, subtype="FLOAT")
    (voices / f"{legacy.id}.json").write_text(json.dumps(legacy.__dict__))

    for voice in (ident, legacy.id):
        got = httpx.get(f"{server.url}/v1/audio/voices/{voice}", timeout=30)
        assert got.status_code == 200 and got.json()["id"] == voice, got.text
        assert voice in {v["id"] for v in listed(server)}
        spoken = speak(server, voice)
        assert spoken.status_code == 200 and len(spoken.content) > 1000, spoken.text
    assert httpx.get(f"{server.url}/v1/audio/voices/voice_{'0' * 24}").status_code == 404

    live = LiveWyoming(tmp_path, "--voices-dir", str(voices))
    try:
        info, spoken = _wyoming_session(live, legacy.id)
        assert isinstance(spoken, bytes) and len(spoken) > 1000, spoken
        assert isinstance(_wyoming_session(live, ident)[1], bytes)
    finally:
        assert live.stop() == 0
    described = {v.name for v in info.tts[0].voices}
    assert {ident, legacy.id} <= described
    assert "Traceback" not in live.log()
    deleted = httpx.delete(f"{server.url}/v1/audio/voices/{legacy.id}", timeout=30)
    assert deleted.status_code == 200 and deleted.json()["deleted"] is True
    assert httpx.get(f"{server.url}/v1/audio/voices/{legacy.id}").status_code == 404

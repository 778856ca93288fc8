"""Speech users shape, through a live `onnx-tts serve` as they run it (the official openai
client and httpx): word timings (Kokoro-FastAPI's /dev/captioned_speech, streamed and not; SSE
`speech.audio.timestamps` events), the engine's own timings through speed, instructions and
SSML breaks; SSML and [[ phonemes ]] in `input` (never spoken), the `ssml` and
`sentence_silence` fields, invalid markup as OpenAI's 400 naming its position."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator

import av
import httpx
import numpy as np
import openai
import pytest
import soundfile

import onnx_tts
from benchmarks.live_server import LiveServer

RATE = 16000  # the default voice's own rate (wav answers at it)
TEXT = "Hello there, how are you today? The weather is fine."
WORDS = ["Hello", "there", "how", "are", "you", "today", "The", "weather", "is", "fine"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = LiveServer(tmp_path_factory.mktemp("shaping"))
    yield live
    live.stop()
    assert "Traceback" not in live.log()


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def engine_words() -> list[tuple[str, float, float]]:
    """TEXT's word timings from the Python API (the engine the server runs)."""
    engine = onnx_tts.load(cache_dir=None)
    try:
        audio = engine.synthesize(TEXT, timestamps=True)
    finally:
        engine.close()
    return [(w.word, round(w.start, 3), round(w.end, 3)) for w in audio.words]


def captioned(server: LiveServer, **body: object) -> dict:
    response = httpx.post(
        server.url + "/dev/captioned_speech", json={"stream": False, **body}, timeout=120
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    return response.json()


def timings(words: list[dict]) -> list[tuple[str, float, float]]:
    return [(w["word"], w["start_time"], w["end_time"]) for w in words]


def pcm(data: bytes) -> np.ndarray:
    return np.frombuffer(data, "<i2").astype(np.float32) / 32768


def speech_pcm(client: openai.OpenAI, text: str, **extra: object) -> np.ndarray:
    """`text` as pcm at the model's own rate, through the openai client."""
    response = client.audio.speech.create(
        model="tts-1",
        voice="alloy",
        input=text,
        response_format="pcm",
        extra_body={"sample_rate": RATE, **extra},
    )
    return pcm(response.content)


def decode(data: bytes) -> np.ndarray:
    with av.open(io.BytesIO(data)) as container:
        frames = [f.to_ndarray().reshape(-1) for f in container.decode(audio=0)]
    return np.concatenate(frames)


# -- word timings -------------------------------------------------------------------------------


def test_captioned_speech_gives_the_file_and_the_engines_word_timings(
    server: LiveServer, engine_words: list[tuple[str, float, float]]
) -> None:
    answer = captioned(server, input=TEXT, response_format="wav")
    assert answer["audio_format"] == "audio/wav"
    samples, rate = soundfile.read(io.BytesIO(base64.b64decode(answer["audio"])), dtype="int16")
    assert rate == RATE
    plain = httpx.post(
        server.url + "/v1/audio/speech",
        json={"input": TEXT, "response_format": "pcm", "sample_rate": RATE},
        timeout=120,
    )
    assert np.array_equal(samples, np.frombuffer(plain.content, "<i2"))  # the same speech
    words = answer["timestamps"]
    assert timings(words) == engine_words  # the engine's timings, exactly
    assert [w["word"] for w in words] == WORDS
    assert not any(w["estimated"] for w in words)  # the default voice's pointer times them
    assert all(0 <= w["start_time"] < w["end_time"] <= len(samples) / RATE for w in words)
    silent = captioned(server, input=TEXT, response_format="wav", return_timestamps=False)
    assert silent["timestamps"] is None and silent["audio"] == answer["audio"]


def test_streamed_captioned_speech_is_lines_of_audio_and_the_words_done_so_far(
    server: LiveServer,
) -> None:
    whole = captioned(server, input=TEXT, response_format="mp3")
    body = {"input": TEXT, "response_format": "mp3"}  # stream: true is the default
    lines = []
    with httpx.stream("POST", server.url + "/dev/captioned_speech", json=body, timeout=120) as r:
        assert r.status_code == 200
        assert "content-length" not in r.headers  # sent as it is made
        lines = [json.loads(line) for line in r.iter_lines() if line.strip()]
    assert len(lines) >= 2
    assert all(line["audio_format"] == "audio/mpeg" for line in lines)
    audio = b"".join(base64.b64decode(line["audio"]) for line in lines)
    assert audio == base64.b64decode(whole["audio"])  # the lines make the file
    words = [word for line in lines for word in line["timestamps"]]
    assert words == whole["timestamps"]
    # Each line carries only the words completed since the line before, first sentence first.
    first = next(i for i, line in enumerate(lines) if line["timestamps"])
    assert [w["word"] for w in lines[first]["timestamps"]] == WORDS[:6]
    assert len(decode(audio)) / RATE == pytest.approx(words[-1]["end_time"], abs=0.3)


def test_timings_survive_speed_instructions_and_breaks(server: LiveServer) -> None:
    """Speech is stretched, pauses are kept: a word of the second sentence moves by the
    stretched first sentence, the unchanged pause between them, and its own stretched lead."""
    pause = 0.15  # the default voice's pause between sentences

    def expected(word: dict, index: int, factor: float) -> float:
        if index < 6:  # "Hello there, how are you today?"
            return word["start_time"] / factor
        return (word["start_time"] - pause) / factor + pause

    normal = captioned(server, input=TEXT, response_format="wav")["timestamps"]
    fast = captioned(server, input=TEXT, response_format="wav", speed=2.0)["timestamps"]
    for index, (a, b) in enumerate(zip(normal, fast, strict=True)):
        assert b["start_time"] == pytest.approx(expected(a, index, 2.0), abs=2e-3)
    response = httpx.post(
        server.url + "/dev/captioned_speech",
        json={"input": TEXT, "stream": False, "instructions": "Speak slowly."},
        timeout=120,
    )
    assert response.headers["x-instructions-applied"] == "speed x0.85"
    slow = response.json()["timestamps"]
    for index, (a, b) in enumerate(zip(normal, slow, strict=True)):
        assert b["start_time"] == pytest.approx(expected(a, index, 0.85), abs=2e-3)
    marked = f'<speak><break time="500ms"/>{TEXT}</speak>'
    paused = captioned(server, input=marked, response_format="wav")["timestamps"]
    for a, b in zip(normal, paused, strict=True):
        assert b["start_time"] == pytest.approx(a["start_time"] + 0.5, abs=2e-3)


def test_sse_timestamps_events_with_the_openai_client(
    client: openai.OpenAI, server: LiveServer
) -> None:
    events = []
    with client.audio.speech.with_streaming_response.create(
        model="tts-1",
        voice="alloy",
        input=TEXT,
        response_format="pcm",
        stream_format="sse",
        extra_body={"return_timestamps": True, "sample_rate": RATE},
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: ") :]))
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "speech.audio.done"
    assert kinds.count("speech.audio.timestamps") == 2  # one per sentence, as each completes
    assert kinds.index("speech.audio.timestamps") > kinds.index("speech.audio.delta")
    # Audio of the second sentence follows the first sentence's words.
    assert "speech.audio.delta" in kinds[kinds.index("speech.audio.timestamps") :]
    words = [w for e in events if e["type"] == "speech.audio.timestamps" for w in e["words"]]
    assert words == captioned(server, input=TEXT, response_format="wav")["timestamps"]
    audio = b"".join(
        base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta"
    )
    assert np.array_equal(pcm(audio), speech_pcm(client, TEXT))


def test_return_timestamps_needs_sse_or_the_captioned_endpoint(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.audio.speech.create(
            model="tts-1", voice="alloy", input="Hi.", extra_body={"return_timestamps": True}
        )
    error = caught.value.body
    assert error["param"] == "return_timestamps"
    assert "sse" in error["message"] and "/dev/captioned_speech" in error["message"]


# -- markup ---------------------------------------------------------------------------------------


def _silent_runs(samples: np.ndarray) -> list[int]:
    zero = np.concatenate([[False], samples == 0.0, [False]])
    edges = np.flatnonzero(np.diff(zero.astype(np.int8)))
    return list(edges[1::2] - edges[::2])


def test_ssml_input_is_spoken_as_its_text_and_breaks(client: openai.OpenAI) -> None:
    plain = speech_pcm(client, "Hello world. How are you?")
    marked = speech_pcm(client, "<speak><p><s>Hello world.</s> <s>How are you?</s></p></speak>")
    assert np.array_equal(marked, plain)  # the markup is never spoken
    broken = speech_pcm(client, 'Hello <break time="1s"/> world.', ssml=True)
    hello, world = speech_pcm(client, "Hello"), speech_pcm(client, "world.")
    assert len(broken) == len(hello) + RATE + len(world)
    assert RATE in _silent_runs(broken)
    as_text = speech_pcm(client, "<speak>Hello</speak>", ssml=False)
    assert len(as_text) > len(hello)  # ssml false: read as written, markup and all
    phonemes = speech_pcm(client, "Say [[ həlˈoʊ ]] now.")
    assert len(phonemes) > RATE // 4
    stray = speech_pcm(client, "If a < b then say so.")  # a stray "<" is text
    assert len(stray) > RATE // 2


def test_sentence_silence_replaces_the_pause_between_sentences(client: openai.OpenAI) -> None:
    two = "The first sentence. The second one."
    default = speech_pcm(client, two)
    spaced = speech_pcm(client, two, sentence_silence=0.6)
    pause = round(0.15 * RATE)  # the default voice's pause between sentences
    assert len(spaced) - len(default) == int(0.6 * RATE) - pause
    assert int(0.6 * RATE) in _silent_runs(spaced)


@pytest.mark.parametrize(
    ("text", "extra", "param", "says"),
    [
        ("<speak>\n<s>unclosed</speak>", {}, "input", "invalid SSML at line 2, column "),
        ("<speak>Hi <break time='soon'/></speak>", {}, "input", "line 1, column 11"),
        ("Say [[ h ə now.", {}, "input", "phoneme markup at line 1, column 5"),
        ("   \n\t ", {}, "input", "nothing to say"),
        ("Hi.", {"ssml": "yes"}, "ssml", "ssml"),
        ("Hi.", {"sentence_silence": -1}, "sentence_silence", "sentence_silence"),
        ("Hi.", {"sentence_silence": 60}, "sentence_silence", "sentence_silence"),
    ],
    ids=["unclosed", "bad-break", "open-phonemes", "whitespace", "ssml-type", "silence<0", "big"],
)
def test_bad_markup_and_fields_are_400_naming_the_field(
    client: openai.OpenAI, text: str, extra: dict, param: str, says: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.audio.speech.create(model="tts-1", voice="alloy", input=text, extra_body=extra)
    error = caught.value.body
    assert caught.value.status_code == 400
    assert error["param"] == param and says in error["message"], error
    assert "\n" not in error["message"]


def test_captioned_speech_refuses_what_it_cannot_answer(server: LiveServer) -> None:
    for body, param in (
        ({"input": "Hi.", "stream_format": "sse"}, "stream_format"),
        ({"input": "Hi.", "stream": "yes"}, "stream"),
        ({"input": "<speak>Hi"}, "input"),
    ):
        response = httpx.post(server.url + "/dev/captioned_speech", json=body, timeout=60)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == param


def _metric(server: LiveServer, name: str) -> float:
    for line in httpx.get(server.url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_client_that_leaves_a_whole_captioned_answer_stops_its_generation(
    server: LiveServer,
) -> None:
    """`stream: false` sends nothing until the audio is complete, so the server watches the
    connection meanwhile: a client that leaves stops the generation (minutes of speech here)."""
    import socket
    import time

    text = " ".join(f"Sentence {i} of a long text nobody will wait for." for i in range(80))
    body = json.dumps({"input": text[:4000], "stream": False}).encode()
    request = (
        f"POST /dev/captioned_speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    cancelled = _metric(server, "onnx_tts_cancelled_generations_total")
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(request)
        deadline = time.monotonic() + 60
        while _metric(server, "onnx_tts_active_generations") < 1:
            assert time.monotonic() < deadline, "the generation never started"
            time.sleep(0.05)
    deadline = time.monotonic() + 60
    while _metric(server, "onnx_tts_active_generations") > 0:
        assert time.monotonic() < deadline, "the generation did not stop"
        time.sleep(0.1)
    assert _metric(server, "onnx_tts_cancelled_generations_total") == cancelled + 1
    assert "outcome=cancelled" in server.log()

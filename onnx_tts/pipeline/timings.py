"""Word timings: when each word of a text sounds in the output audio.

A chunk's span in the output is exact (its samples, the pauses and the speed are all known);
inside a chunk, a word is timed exactly when the family's program marked which text position
each frame voices (`Request.marks`, e.g. the default voice's phoneme pointer) and the family
told the positions of its words (`TextFrontend.words`); otherwise the chunk's duration is
shared out by the words' weights (their letters) and the timing says `estimated`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from onnx_tts.families.base import WordSpan


@dataclass(frozen=True)
class WordTiming:
    """A word as spoken, from `start` to `end` seconds in the output audio."""

    word: str
    start: float
    end: float
    estimated: bool
    sentence_end: bool = False  # the last word of its chunk (captions end a cue there)
    written: str = ""  # as the sentence writes it, punctuation included (captions); "" = word
    joins_next: bool = False  # one spoken unit with the next word (captions keep them together)

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
    timed = _timed(words, marks, samples, sample_rate, rate, offset)
    timings = [
        replace(timing, written=word.written, joins_next=word.joins_next)
        for timing, word in zip(timed, words[: len(timed)], strict=True)
    ]
    if timings:
        timings[-1] = replace(timings[-1], sentence_end=True, joins_next=False)
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


# Captions: a cue holds at most this many words and seconds, and ends where speech pauses;
# it never ends inside one spoken unit (a number, a time, an amount with its unit), unless
# that unit alone is longer than UNIT_WORDS words (an address or a long number read out).
CUE_WORDS = 8
CUE_SECONDS = 4.0
CUE_GAP_SECONDS = 0.25
UNIT_WORDS = 24


def cues(words: Sequence[WordTiming]) -> list[tuple[float, float, str]]:
    """Subtitle cues (start, end, text) of timed words: a new cue after a sentence's end,
    CUE_WORDS words, CUE_SECONDS, or a pause of CUE_GAP_SECONDS, but not inside a spoken
    unit: a unit that would be cut moves whole to the next cue. The text is the words as
    written, punctuation kept."""
    found: list[tuple[float, float, str]] = []
    group: list[WordTiming] = []

    def close(words: list[WordTiming]) -> None:
        found.append((words[0].start, words[-1].end, " ".join(w.written or w.word for w in words)))

    for word in words:
        if group and (
            group[-1].sentence_end
            or word.start - group[-1].end >= CUE_GAP_SECONDS
            or len(group) >= CUE_WORDS
            or word.end - group[0].start > CUE_SECONDS
        ):
            cut = _unit_start(group)
            if cut > 0:  # (0: the group is one unit so far, which goes on)
                close(group[:cut])
                group = group[cut:]
        group.append(word)
    if group:
        close(group)
    return found


def _unit_start(group: list[WordTiming]) -> int:
    """Where the group may end: its length when its last word ends a unit, else the start of
    the unit its last words are part of (0 when that unit is the whole group)."""
    cut = len(group)
    while cut > 0 and group[cut - 1].joins_next:
        cut -= 1
    if cut < len(group) and len(group) - cut >= UNIT_WORDS:
        return len(group)  # a unit too long for one cue is cut
    return cut


def _clock(seconds: float, separator: str) -> str:
    milliseconds = max(0, round(seconds * 1000))
    hours, rest = divmod(milliseconds, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    return f"{hours:02d}:{minutes:02d}:{rest // 1000:02d}{separator}{rest % 1000:03d}"


# WebVTT cue text escapes "&", "<" and ">" as character references (so that no "-->" and no
# tag can appear); SubRip has no escapes, and players read "<i>" in it as a tag: its "<" and
# ">" are written as the angle quotation marks "‹" and "›" (so no "-->" either).
_VTT_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})
_SRT_ESCAPES = str.maketrans({"<": "‹", ">": "›"})


def cue_text(text: str, kind: str) -> str:
    """A cue's text as one line of `kind` ("srt" or "vtt") subtitles."""
    line = " ".join(text.split())  # no line break, so no empty line ends the cue early
    return line.translate(_VTT_ESCAPES if kind == "vtt" else _SRT_ESCAPES)


def subtitles(words: Sequence[WordTiming], kind: str) -> str:
    """The words as SubRip (`srt`) or WebVTT (`vtt`) subtitles."""
    separator = "," if kind == "srt" else "."
    blocks = []
    for number, (start, end, text) in enumerate(cues(words), 1):
        timing = f"{_clock(start, separator)} --> {_clock(end, separator)}"
        line = cue_text(text, kind)
        blocks.append(f"{number}\n{timing}\n{line}\n" if kind == "srt" else f"{timing}\n{line}\n")
    body = "\n".join(blocks)
    return body if kind == "srt" else "WEBVTT\n\n" + body


__all__ = ["WordTiming", "cue_text", "cues", "subtitles", "time_words"]

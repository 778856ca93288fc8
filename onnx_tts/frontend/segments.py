"""What markup (SSML, ``[[ phonemes ]]``) turns a text into: an ordered list of typed
segments, text to speak, phonemes to speak as given, and pauses.

`Text.text` is plain text for the family's normaliser (markup removed, ``<say-as>`` already
rendered to the words a listener hears, ``<sub>`` replaced by its alias). A segment with
`paragraph_start` also has `sentence_start`: a new paragraph starts a new sentence.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Text:
    """Words to speak at `rate` (a multiplier of the request's speed, 0.25-4)."""

    text: str
    rate: float = 1.0
    sentence_start: bool = False
    paragraph_start: bool = False


@dataclass(frozen=True)
class Phonemes:
    """IPA phonemes to speak as given (for models that take phonemes). `text` is what they
    stand for (the content of an SSML ``<phoneme>``; "" for ``[[ ]]``), for models that take
    text and for word timings."""

    ipa: str
    text: str = ""
    rate: float = 1.0
    sentence_start: bool = False
    paragraph_start: bool = False


@dataclass(frozen=True)
class Break:
    """A pause of `seconds` (0 for strength="none": no pause where one might be)."""

    seconds: float


Segment = Text | Phonemes | Break


@dataclass(frozen=True)
class Document:
    """A parsed text: its segments in reading order."""

    segments: tuple[Segment, ...] = ()

    def __iter__(self) -> Iterator[Segment]:
        return iter(self.segments)

    def __len__(self) -> int:
        return len(self.segments)

    @property
    def text(self) -> str:
        """The words of the document (Text segments and what Phonemes stand for), one space
        between segments: for logs, captions and models that take no phonemes."""
        words = (segment.text for segment in self.segments if isinstance(segment, (Text, Phonemes)))
        return " ".join(word for word in words if word)

    @property
    def pause_seconds(self) -> float:
        """The sum of the document's breaks."""
        return sum(segment.seconds for segment in self.segments if isinstance(segment, Break))

    @property
    def has_phonemes(self) -> bool:
        return any(isinstance(segment, Phonemes) for segment in self.segments)


# Marks that make no sound of their own: sentence and clause punctuation, quotes, brackets,
# dashes. (Signs the reader says, "%", "&", "@", "+", are not among them.)
_SILENT_PUNCTUATION = frozenset(".,;:!?…¡¿'\"·")
_SILENT_CATEGORIES = frozenset({"Pd", "Ps", "Pe", "Pi", "Pf"})


def marks_only(text: str) -> bool:
    """Whether `text` holds punctuation and nothing that is spoken ("." or ")," or " — ")."""
    return all(
        ch.isspace() or ch in _SILENT_PUNCTUATION or unicodedata.category(ch) in _SILENT_CATEGORIES
        for ch in text
    )


def fold_marks(segments: Sequence[Segment]) -> tuple[Segment, ...]:
    """Punctuation the markup left on its own ("<prosody>relax</prosody>.", "[[ ... ]].")
    joins the words before it (across breaks: "relax.", and the words a <phoneme> stands
    for), or is dropped when ``[[ ]]`` or nothing come before it; the sentence or paragraph
    it started passes to what follows.
    A document with nothing but punctuation is left as it is (nothing in it is speakable)."""
    if all(isinstance(s, Break) or (isinstance(s, Text) and marks_only(s.text)) for s in segments):
        return tuple(segments)
    out: list[Segment] = []
    carried: dict[str, bool] = {}
    for segment in segments:
        if isinstance(segment, Break):
            out.append(segment)
            continue
        if isinstance(segment, Text) and marks_only(segment.text):
            before = next((s for s in reversed(out) if not isinstance(s, Break)), None)
            if isinstance(before, Text) or (isinstance(before, Phonemes) and before.text):
                index = len(out) - 1 - out[::-1].index(before)
                out[index] = replace(before, text=before.text + "".join(segment.text.split()))
            elif segment.sentence_start:
                carried = {"sentence_start": True, "paragraph_start": segment.paragraph_start}
            continue
        if carried:
            segment = replace(
                segment,
                sentence_start=True,
                paragraph_start=segment.paragraph_start or carried["paragraph_start"],
            )
            carried = {}
        out.append(segment)
    return tuple(out)

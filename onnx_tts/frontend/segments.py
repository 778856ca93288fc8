"""What markup (SSML, ``[[ phonemes ]]``) turns a text into: an ordered list of typed
segments, text to speak, phonemes to speak as given, and pauses.

`Text.text` is plain text for the family's normaliser (markup removed, ``<say-as>`` already
rendered to the words a listener hears, ``<sub>`` replaced by its alias). A segment with
`paragraph_start` also has `sentence_start`: a new paragraph starts a new sentence.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


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

"""A text that arrives in pieces (Wyoming's synthesize-chunk events), cut into what can be
spoken as it completes, with its markup intact.

- A plain text (with inline ``[[ phonemes ]]``) is spoken sentence by sentence as sentences
  complete; a sentence never ends inside an open ``[[ ... ]]`` span, so phonemes with a "."
  in them reach the engine whole.
- An SSML text (it starts with <speak>, or the stream was declared SSML) is one XML document:
  it is kept until the stream ends and then spoken whole, exactly as the same text sent at
  once, so that its markup is parsed, never read, and an error names a position in the text
  as the client wrote it.
- Until the first characters show which of the two it is ("<spe" may still become
  "<speak>", an XML declaration or a comment may still be followed by it), nothing is
  spoken.

Each chunk costs time in its own length only: the scan for sentence ends keeps its state (an
open ``[[``, a sentence end waiting for the text after it) from one chunk to the next, and
text is joined once, when a sentence is cut. Deciding whether a stream is SSML looks at its
first UNDECIDED_CHARS characters at most.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnx_tts.frontend.ssml import is_ssml, ssml_undecided

_PLAIN, _SSML = "plain", "ssml"
# Where a plain text's sentences end (as onnx_tts.frontend.sentences.SENTENCE_END cuts): after
# one of these followed by whitespace, once more text follows.
_SENTENCE_PUNCTUATION = frozenset(".!?;")
# A stream whose start still could be SSML after this many characters is decided by them.
UNDECIDED_CHARS = 4096


@dataclass(frozen=True)
class Piece:
    """Text to speak, and how to read it (`ssml` as Engine.stream takes it)."""

    text: str
    ssml: bool | None


class _SentenceScan:
    """Sentence ends of a plain text fed in pieces, each character looked at once: the state
    between pieces is whether a ``[[`` span is open, the last character, and a sentence end
    seen (punctuation and whitespace outside a span) that waits for the text after it."""

    def __init__(self) -> None:
        self.open_span = False  # inside [[ ... ]] at the scan position
        self.last = ""  # the character before the scan position
        self.end_at: int | None = None  # where the waiting sentence ends (its whitespace)

    def cuts(self, chunk: str, offset: int) -> list[tuple[int, int]]:
        """The sentence ends `chunk` (at `offset` in the text so far) completes: (end of the
        sentence, start of the next) for each."""
        found = []
        last, open_span, end_at = self.last, self.open_span, self.end_at
        for index, char in enumerate(chunk, offset):
            if char.isspace():
                if end_at is None and last in _SENTENCE_PUNCTUATION and not open_span:
                    end_at = index
            else:
                if end_at is not None:  # text follows a sentence end: it is one
                    found.append((end_at, index))
                    end_at = None
                if char == last == "[":
                    open_span = True
                elif char == last == "]":
                    open_span = False
            last = char
        self.last, self.open_span, self.end_at = last, open_span, end_at
        return found


class StreamedText:
    """The text of one stream; `add` each chunk, then `finish`. `ssml`: True when the stream
    was declared SSML, False when declared plain text, None to tell from its start."""

    def __init__(self, ssml: bool | None = None) -> None:
        self._declared = ssml
        self._mode = {True: _SSML, False: _PLAIN}.get(ssml)  # type: ignore[call-overload]
        self._parts: list[str] = []  # received and not spoken yet, in order
        self._pending = 0  # their characters
        self._scan = _SentenceScan()
        self.examined = 0  # characters looked at, over the whole stream (the cost)
        self.spoken = 0  # pieces given to speak so far

    @property
    def ssml(self) -> bool:
        """Whether the stream is being read as one SSML document (kept until the end)."""
        return self._mode == _SSML

    @property
    def pending(self) -> int:
        """Characters received and not spoken yet."""
        return self._pending

    def add(self, chunk: str) -> list[Piece]:
        """Take one chunk; the sentences it completed."""
        offset = self._pending
        self._parts.append(chunk)
        self._pending += len(chunk)
        if self._mode is None:
            head = "".join(self._parts)[:UNDECIDED_CHARS]
            self.examined += len(head)
            if len(head) >= UNDECIDED_CHARS or not ssml_undecided(head):
                self._mode = _SSML if is_ssml(head) else _PLAIN
                if self._mode == _PLAIN:  # what came before this chunk is scanned too
                    chunk, offset = "".join(self._parts), 0
        if self._mode != _PLAIN:
            return []
        self.examined += len(chunk)
        cuts = self._scan.cuts(chunk, offset)
        if not cuts:
            return []
        text = "".join(self._parts)
        pieces, start = [], 0
        for end, after in cuts:
            sentence = text[start:end].strip()
            if sentence:
                pieces.append(Piece(sentence, False))
            start = after
        rest = text[start:]
        self._parts, self._pending = [rest], len(rest)
        if self._scan.end_at is not None:
            self._scan.end_at -= start
        self.spoken += len(pieces)
        return pieces

    def finish(self) -> list[Piece]:
        """The end of the stream: what is left (an SSML document whole)."""
        rest = "".join(self._parts)
        self._parts, self._pending = [], 0
        if not rest.strip():
            return []
        self.spoken += 1
        if self._mode != _PLAIN:  # SSML, or still undecided: the engine tells (is_ssml)
            return [Piece(rest, True if self._declared else None)]
        return [Piece(rest.strip(), False)]


__all__ = ["UNDECIDED_CHARS", "Piece", "StreamedText"]

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
  "<speak>"), nothing is spoken.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnx_tts.frontend.sentences import SENTENCE_END
from onnx_tts.frontend.ssml import is_ssml

_PLAIN, _SSML = "plain", "ssml"


@dataclass(frozen=True)
class Piece:
    """Text to speak, and how to read it (`ssml` as Engine.stream takes it)."""

    text: str
    ssml: bool | None


def _undecided(text: str) -> bool:
    """Whether `text` (the start of a stream) could still turn out to be SSML: it is empty,
    or a beginning of "<speak", or an XML declaration not yet closed."""
    head = text.lstrip("\ufeff \t\r\n")
    if head.startswith("<?"):
        end = head.find("?>")
        if end < 0:
            return True
        head = head[end + 2 :].lstrip()
    return "<speak".startswith(head) or "<?xml".startswith(head)


def _inside_phonemes(text: str, index: int) -> bool:
    """Whether `index` lies inside a ``[[ ... ]]`` span still open at that point."""
    return text.rfind("[[", 0, index) > text.rfind("]]", 0, index)


class StreamedText:
    """The text of one stream; `add` each chunk, then `finish`. `ssml`: True when the stream
    was declared SSML, False when declared plain text, None to tell from its start."""

    def __init__(self, ssml: bool | None = None) -> None:
        self._declared = ssml
        self._mode = {True: _SSML, False: _PLAIN}.get(ssml)  # type: ignore[call-overload]
        self._buffer = ""

    @property
    def ssml(self) -> bool:
        """Whether the stream is being read as one SSML document (kept until the end)."""
        return self._mode == _SSML

    @property
    def pending(self) -> int:
        """Characters received and not spoken yet."""
        return len(self._buffer)

    def add(self, chunk: str) -> list[Piece]:
        """Take one chunk; the sentences it completed."""
        self._buffer += chunk
        if self._mode is None and not _undecided(self._buffer):
            self._mode = _SSML if is_ssml(self._buffer) else _PLAIN
        if self._mode != _PLAIN:
            return []
        pieces, start = [], 0
        for match in SENTENCE_END.finditer(self._buffer):
            if match.end() == len(self._buffer):
                break  # nothing after it yet: "Mr. " may go on "Mr. Smith"
            if _inside_phonemes(self._buffer, match.start()):
                continue
            sentence = self._buffer[start : match.start()].strip()
            if sentence:
                pieces.append(Piece(sentence, False))
            start = match.end()
        self._buffer = self._buffer[start:]
        return pieces

    def finish(self) -> list[Piece]:
        """The end of the stream: what is left (an SSML document whole)."""
        rest, self._buffer = self._buffer, ""
        if not rest.strip():
            return []
        if self._mode == _SSML:
            return [Piece(rest, True if self._declared else None)]
        return [Piece(rest.strip(), False)]


__all__ = ["Piece", "StreamedText"]

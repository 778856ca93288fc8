"""The markup a text may carry, parsed into one typed Document: SSML when the text starts
with <speak> (or when asked for), else plain text with inline phonemes
``[[ h ə l ˈoʊ ]]``.

A plain text's Text segments hold the writer's text unchanged (the family's normaliser reads
it); a stray "<" in plain text ("if a < b then") is text.
"""

from __future__ import annotations

import re

from onnx_tts.errors import MarkupError
from onnx_tts.frontend.checks import check_text
from onnx_tts.frontend.segments import Document, Phonemes, Text, fold_marks
from onnx_tts.frontend.ssml import is_ssml, line_column, parse_ssml

_SPAN_RE = re.compile(r"\[\[|\]\]")


def _error(text: str, index: int, message: str) -> MarkupError:
    line, column = line_column(text, index)
    return MarkupError(f"phoneme markup at line {line}, column {column}: {message}", line, column)


def split_phoneme_spans(text: str) -> list[Text | Phonemes]:
    """Text and ``[[ phonemes ]]`` spans in order: "Say [[ h ə l ˈoʊ ]] now" -> Text("Say"),
    Phonemes("h ə l ˈoʊ"), Text("now"). Texts keep the writer's text (only trimmed); an
    unclosed or empty span is a MarkupError naming its position; a "]]" with no "[[" before
    it is text."""
    segments: list[Text | Phonemes] = []
    cursor = 0
    opened: int | None = None
    for match in _SPAN_RE.finditer(text):
        if match.group(0) == "[[":
            if opened is not None:
                raise _error(text, match.start(), "a [[ inside another [[ ... ]]; close the first")
            before = text[cursor : match.start()].strip()
            if before:
                segments.append(Text(before))
            opened, cursor = match.start(), match.end()
        elif opened is not None:
            ipa = " ".join(text[cursor : match.start()].split())
            if not ipa:
                raise _error(text, opened, "[[ ]] is empty; put IPA phonemes inside or remove it")
            segments.append(Phonemes(ipa))
            opened, cursor = None, match.end()
    if opened is not None:
        raise _error(text, opened, "[[ is never closed; end the phonemes with ]]")
    rest = text[cursor:].strip()
    if rest:
        segments.append(Text(rest))
    return segments


def parse_markup(text: str, ssml: bool | None = None) -> Document:
    """A text's Document: SSML when `ssml` is True, or when it is None and the text starts
    with <speak> (is_ssml); otherwise plain text with ``[[ ]]`` phoneme spans (`ssml=False`
    reads even a <speak> text as plain text). Punctuation left on its own beside markup joins
    the text before it (`segments.fold_marks`). Raises SsmlError / MarkupError, and InputError
    for a text check_text refuses (empty, too long, not Unicode)."""
    if ssml or (ssml is None and is_ssml(text)):
        return parse_ssml(text)
    return Document(fold_marks(split_phoneme_spans(check_text(text))))

"""English text normalisation: Unicode, punctuation, abbreviations, symbols and numbers."""

from __future__ import annotations

import re
import unicodedata

from onnx_tts.errors import InputError
from onnx_tts.frontend.abbreviations import expand_abbreviations
from onnx_tts.frontend.checks import check_text, drop_unspeakable
from onnx_tts.frontend.letters import expand_letters
from onnx_tts.frontend.measures import expand_measures
from onnx_tts.frontend.numerals import expand_numbers
from onnx_tts.frontend.roman import expand_roman
from onnx_tts.frontend.sentences import PAD, UNIT_SPACE, pad
from onnx_tts.frontend.web import expand_web

_SYMBOLS = {
    "&": "and",
    "%": "percent",
    "+": "plus",
    "=": "equals",
    "@": "at",
    "×": "times",
    "÷": "divided by",
    "±": "plus or minus",
    "≈": "approximately",
    "≤": "less than or equal to",
    "≥": "greater than or equal to",
    "≠": "not equal to",
}
# Superscript digits are a power ("m²", "x³"), which NFKC would flatten into "m2".
_SUPERSCRIPT_DIGITS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹", "0123456789")
_SUPERSCRIPTS_RE = re.compile("[⁰¹²³⁴⁵⁶⁷⁸⁹]+")
_FOOTNOTE_AFTER_RE = re.compile(r"(?:[A-Za-z]{3,}|[.,;:!?\"'])$")


def _superscript(match: re.Match[str]) -> str:
    """ "m²" -> "m^2" (a power); "word¹" or "end.²" is a footnote mark, left unsaid."""
    if _FOOTNOTE_AFTER_RE.search(match.string[max(0, match.start() - 3) : match.start()]):
        return " "
    return "^" + match.group(0).translate(_SUPERSCRIPT_DIGITS)


_GLUED_STOP_RE = re.compile(rf"[.!?;]+(?={PAD}+\S)")
_QUOTES = str.maketrans(
    {
        "\u2018": "'",
        "\u2019": "'",
        "\u201c": '"',
        "\u201d": '"',
        "\u2013": "-",
        "\u2014": " - ",
        "\u2026": "...",
        "\u2044": "/",  # NFKC writes "½" as "1⁄2"
        "\u2032": "'",  # prime: feet (NFKC writes a double prime as two primes)
    }
)


def normalize_text(text: str, keep_units: bool = False) -> str:
    """Unicode, punctuation, abbreviation, symbol and number normalisation for English.

    Letters of other scripts and emoji are dropped with an UnspeakableTextWarning, and an
    InputError is raised when that leaves nothing to speak. Blank text gives "" (callers
    refuse it, see check_text); text that is not valid Unicode is an InputError.
    `keep_units`: the words of one spoken unit (a number, a time, a date, an amount with its
    unit, an address) are joined by `sentences.UNIT_SPACE` instead of a space, so that
    captions never split them.
    """
    if not isinstance(text, str):
        raise InputError(f"text must be a string, got {type(text).__name__}")
    if not text.strip():
        return ""
    text = check_text(text)
    text = _SUPERSCRIPTS_RE.sub(_superscript, text)
    text = unicodedata.normalize("NFKC", text).replace("\u2032\u2032", '"').translate(_QUOTES)
    text = "".join(ch if unicodedata.category(ch)[0] != "C" else " " for ch in text)
    text = re.sub(r"\s", " ", text)  # the writer's spaces are " "; PAD marks the rules' own
    text = drop_unspeakable(text)
    # The specific forms first: addresses hold dots, digits and symbols the later rules
    # would read as sentence ends, decimals and words.
    text = expand_web(text)
    text = expand_roman(text)
    text = expand_letters(text)
    text = expand_measures(text)
    text = expand_abbreviations(text)
    text = expand_numbers(text)
    for symbol, word in _SYMBOLS.items():
        text = text.replace(symbol, pad(word))
    # A period (or ! ? ;) the writer glued to what follows cannot end a sentence, though a
    # rule's reading now stands after it with a PAD between: "7.%" reads "seven percent".
    text = _GLUED_STOP_RE.sub("", text)
    text = _WHITESPACE_RE.sub(_one_space, text).strip()
    # A space before punctuation or a closing bracket, after an opening one, or before the
    # hyphen of "5-year-old", comes from a replacement above, never from the writer.
    text = re.sub(rf"[ {UNIT_SPACE}](?=[,.;:!?)\]]|-[A-Za-z])|(?<=[(\[])[ {UNIT_SPACE}]", "", text)
    text = _tidy_quotes(text)
    return text if keep_units else text.replace(UNIT_SPACE, " ")


_WHITESPACE_RE = re.compile(r"\s+")


def _one_space(match: re.Match[str]) -> str:
    """A run of spaces as one: a writer's space (" ") where the writer put one, else the space
    inside a spoken unit (a rule's words, or a rule's words the writer wrote against other
    words: "5%", "$5/mo")."""
    return " " if " " in match.group(0) else UNIT_SPACE


def _tidy_quotes(text: str) -> str:
    """Drop the space a replacement left inside double quotes ("I am twelve " -> "I am
    twelve"): the first of each pair opens, the second closes."""
    if '"' not in text:
        return text
    pieces = text.split('"')
    for index in range(1, len(pieces), 2):  # the quoted pieces
        if index + 1 < len(pieces):  # a closing quote follows
            pieces[index] = pieces[index].strip()
    return '"'.join(pieces)

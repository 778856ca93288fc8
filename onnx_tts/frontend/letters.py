"""Letters read one by one, and the symbols that join them: "AT&T", "Q&A", "I/O", "TCP/IP",
"and/or", "w/o", "C#", ".NET".

A run of letters read one by one is written as capitals joined by hyphens ("A-T"): espeak-ng
reads a lone capital "A" before a word as the article ("uh T and T") and a capitalised word
it knows ("AT", "OR") as that word, but it names each letter of a hyphenated run.
"""

from __future__ import annotations

import re

from onnx_tts.frontend.numbers import digits_to_words
from onnx_tts.frontend.sentences import pad

# How a character other than a letter or digit is named when a text is spelled out.
_CHARACTER_NAMES = {
    "-": "dash",
    "_": "underscore",
    ".": "dot",
    "@": "at",
    "/": "slash",
    "\\": "backslash",
    "#": "hash",
    "&": "and",
    "+": "plus",
    "*": "star",
    "%": "percent",
    ":": "colon",
    "~": "tilde",
    "=": "equals",
    "$": "dollar",
    "!": "exclamation mark",
    "?": "question mark",
    ",": "comma",
    "'": "apostrophe",
    "<": "less than",
    ">": "greater than",
}


def spell(text: str) -> str:
    """Text read character by character: letters as capitals, digits as digit words, other
    characters by name, each word group's pieces joined by hyphens: "AT&T" -> "A-T-and-T",
    "R2D2" -> "R-two-D-two", "a b" -> "A B". Characters with no name are left out."""
    words = []
    for chunk in text.split():
        pieces = []
        for ch in chunk:
            if ch.isalpha():
                pieces.append(ch.upper())
            elif ch.isdigit():
                pieces.append(digits_to_words(ch) or ch)
            elif ch in _CHARACTER_NAMES:
                pieces.append(_CHARACTER_NAMES[ch])
        if pieces:
            words.append("-".join(pieces))
    return " ".join(words)


# "AT&T", "R&D", "Q&A", "P&G", "A & B", "M&M's": capitals on both sides of "&" are a name
# read letter by letter. "Tom & Jerry" is left to the symbol rule ("and").
_AMPERSAND_RE = re.compile(r"(?<![\w&])([A-Z]{1,4})\s?&\s?([A-Z]{1,4})(?P<s>'?s)?(?![\w&])")
# "I/O", "TCP/IP", "A/B", "AC/DC": capitals on both sides of a slash, read as letters.
_ACRONYM_SLASH_RE = re.compile(r"(?<![\w/])([A-Z]{1,5})/([A-Z]{1,5})(?![\w/])")
# Words that join with a slash: "and/or" and the pairs a listener says with "or".
_WORD_SLASH = {
    "and/or": "and or",
    "he/she": "he or she",
    "she/he": "she or he",
    "his/her": "his or her",
    "her/his": "her or his",
    "him/her": "him or her",
    "s/he": "she or he",
    "yes/no": "yes or no",
    "true/false": "true or false",
    "either/or": "either or",
    "w/o": "without",
    "w/": "with",
    "c/o": "care of",
    "n/a": "not applicable",
    "a/c": "air conditioning",
}
_WORD_SLASH_RE = re.compile(
    r"(?<![\w/])("
    + "|".join(re.escape(form) for form in sorted(_WORD_SLASH, key=len, reverse=True))
    + r")(?![\w/])",
    re.IGNORECASE,
)
# Units per unit written alone, with no number before them ("speed in km/h").
_UNIT_SLASH = {"km/h": "kilometers per hour", "m/s": "meters per second", "mi/h": "miles per hour"}
_UNIT_SLASH_RE = re.compile(r"(?<![\w/])(km/h|m/s|mi/h)(?![\w/])")
# Names with a symbol a listener says as a word.
_NAMES = {"C#": "C sharp", "F#": "F sharp", "J#": "J sharp", ".NET": "dot net"}
_NAMES_RE = re.compile(r"(?<![\w.#])(C#|F#|J#|\.NET)(?![\w#])")


def _ampersand(match: re.Match[str]) -> str:
    left, right = match.group(1), match.group(2)
    words = f"{'-'.join(left)}-and-{'-'.join(right)}"
    # "M&Ms" -> "M-and-M's": a plural after a spelled letter takes the apostrophe that makes
    # the voice say "emz" rather than "em ess".
    return words + ("'s" if match["s"] else "")


def _acronym_slash(match: re.Match[str]) -> str:
    left, right = match.group(1), match.group(2)
    # A single letter is joined to its neighbour so that it is named ("I-O", "A-B"); two
    # longer acronyms are each one capitalised word, which the voice spells ("TCP IP").
    return f"{left}-{right}" if min(len(left), len(right)) == 1 else f"{left} {right}"


def _word_slash(match: re.Match[str]) -> str:
    form = match.group(1)
    words = _WORD_SLASH[form.lower()]
    title = form[0].isupper() and form[1:].islower()  # "And/or" opens a sentence; "N/A" not
    return words.capitalize() if title else words


def expand_letters(text: str) -> str:
    """Symbols between letters to words: "&" inside an acronym, slashes between acronyms or
    between words that form a pair, unit slashes written alone, C#/F#/.NET."""
    text = _NAMES_RE.sub(lambda m: pad(_NAMES[m.group(1)]), text)
    text = _AMPERSAND_RE.sub(_ampersand, text)
    text = _WORD_SLASH_RE.sub(_word_slash, text)  # before acronyms: "N/A", "A/C"
    text = _ACRONYM_SLASH_RE.sub(_acronym_slash, text)
    return _UNIT_SLASH_RE.sub(lambda m: _UNIT_SLASH[m.group(1)], text)

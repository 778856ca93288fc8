"""Abbreviations to words (titles, St./Dr. by context, letter-dot runs, initials, units with
a period), keeping a period only where the sentence also ends."""

from __future__ import annotations

import re
from collections.abc import Collection

from onnx_tts.frontend.numerals import _HOUR_RE, _RATIO_RE, _TIME_RE, _time, ratio
from onnx_tts.frontend.sentences import (
    _CAPITAL_NEXT,
    _ends_sentence,
    _sentence_initial,
    _text_ends_at,
    rewrite,
)

# Abbreviations written with a period -> words. Context decides St. (saint/street) and Dr.
# (doctor/drive), see _title_or_place; the period stays only where the sentence ends too.
_TITLES = {  # precede a name: never the end of a sentence unless the text ends there
    "mr": "mister",
    "mrs": "missus",
    "ms": "miss",
    "prof": "professor",
    "capt": "captain",
    "lt": "lieutenant",
    "sgt": "sergeant",
    "gen": "general",
    "gov": "governor",
    "sen": "senator",
    "rep": "representative",
    "rev": "reverend",
    "mt": "mount",
    "ft": "fort",
}
_TITLE_OR_PLACE = {"st": ("saint", "street"), "dr": ("doctor", "drive")}
_ABBREVIATIONS = {  # may end a sentence
    "jr": "junior",
    "sr": "senior",
    "vs": "versus",
    "etc": "et cetera",
    "inc": "incorporated",
    "ltd": "limited",
    "corp": "corporation",
    "co": "company",
    "approx": "approximately",
    "dept": "department",
    "ave": "avenue",
    "blvd": "boulevard",
    "rd": "road",
}
# Degrees written with periods, spelled ("Ph.D." -> "P-H-D"); a period stays only where the
# sentence ends too.
_DEGREES = {
    "ph.d.": "P-H-D",
    "b.sc.": "B-S-C",
    "m.sc.": "M-S-C",
    "ed.d.": "E-D-D",
    "ll.b.": "L-L-B",
    "ll.m.": "L-L-M",
    "d.phil.": "D-Phil",
}
_DEGREE_RE = re.compile(
    r"(?<![\w.])(" + "|".join(re.escape(d) for d in _DEGREES) + r")(?!\w)", re.IGNORECASE
)
# Letter-dot abbreviations (U.S., e.g., p.m.) by their letters; the others are spelled as one
# capitalised word ("U.S." -> "US", "D.C." -> "DC"), which espeak and BPE models spell out.
_DOTTED_WORDS = {
    "eg": "for example",
    "ie": "that is",
    "am": "AM",
    "pm": "PM",
    "aka": "also known as",
}
# Capitalised words that open a sentence far more often than they follow an abbreviation
_NUMBER_SIGN_RE = re.compile(r"(?:(?<![\w.])No\.|#)\s?(?=\d)")
# Abbreviations that stand before a number ("Fig. 3", "p. 12", "Vol. 2"): the period never
# ends the sentence there.
_BEFORE_NUMBER = {
    "nos": "numbers",
    "fig": "figure",
    "figs": "figures",
    "vol": "volume",
    "vols": "volumes",
    "ch": "chapter",
    "chap": "chapter",
    "eq": "equation",
    "eqs": "equations",
    "sec": "section",
    "art": "article",
    "para": "paragraph",
    "pt": "part",
    "ex": "example",
    "tab": "table",
    "ref": "reference",
    "p": "page",
    "pp": "pages",
}
_BEFORE_NUMBER_RE = re.compile(
    r"(?<![\w.])("
    + "|".join(sorted({*_BEFORE_NUMBER, *map(str.capitalize, _BEFORE_NUMBER)}, key=len)[::-1])
    + r")\.\s?(?=\d)"
)
# Abbreviations: letter-dot runs (U.S., e.g., p.m.), then words with a period (Dr., etc.),
# then single capital initials before a name (John F. Kennedy).
_DOTTED_ABBREVIATION_RE = re.compile(r"(?<![\w.])((?:[A-Za-z]\.){2,})")
# Written in lower case too ("dr. smith", "etc."); the others only capitalised, since "rev.",
# "gen." or "co." in lower case are more often words that end a sentence.
_LOWER_CASE_ABBREVIATIONS = ("mr", "mrs", "ms", "dr", "st", "vs", "etc", "approx")


def _spellings(keys: Collection[str]) -> list[str]:
    forms = {form for key in keys for form in (key.capitalize(), key.upper())}
    forms |= {key for key in keys if key in _LOWER_CASE_ABBREVIATIONS}
    return sorted(forms, key=len, reverse=True)


_WORD_ABBREVIATION_RE = re.compile(
    r"(?<![\w.])("
    + "|".join(_spellings([*_TITLES, *_TITLE_OR_PLACE, *_ABBREVIATIONS]))
    + r")\.|(?<![\w.])(vs|Vs)\b"
)
# A unit abbreviated with a period after a number ("6 ft. tall"): the unit rule reads it, and
# the period stays only where the sentence ends.
_UNIT_PERIOD_RE = re.compile(r"(?<=\d)(\s?(?:ft|in|lbs?|oz|mi|yd|min|sec|hrs?))\.", re.IGNORECASE)
_INITIAL_RE = re.compile(r"(?<![\w.'])([A-Z])\.(?=\s+[A-Z])")


def _title_or_place(match: re.Match[str], title: str, place: str) -> str:
    """St. and Dr. after a capitalised name or a number are a place ("Main St.", "5th St.",
    "Elm Dr. is closed"), before a name a title ("St. Louis", "Dr. Smith", "Visit St. Louis")."""
    text, start, end = match.string, match.start(), match.end()
    previous = re.search(r"(\S+)\s+$", text[max(0, start - 60) : start])
    word = previous.group(1) if previous else ""
    named = bool(re.fullmatch(r"[A-Z][A-Za-z'-]*|\d+(?:st|nd|rd|th)?", word))
    following = _CAPITAL_NEXT.match(text, end)
    if named and (not following or not _sentence_initial(text, start - len(previous.group(0)))):
        return place + ("." if _ends_sentence(text, end) else "")
    return title + ("." if _text_ends_at(text, end) else "")


def _word_abbreviation(match: re.Match[str]) -> str:
    if match.group(2):  # "vs" with no period
        return "versus"
    key = match.group(1).lower()
    if key in _TITLE_OR_PLACE:
        return _title_or_place(match, *_TITLE_OR_PLACE[key])
    if key in _TITLES:
        return _TITLES[key] + ("." if _text_ends_at(match.string, match.end()) else "")
    return _ABBREVIATIONS[key] + ("." if _ends_sentence(match.string, match.end()) else "")


def _dotted_abbreviation(match: re.Match[str]) -> str:
    letters = match.group(1).replace(".", "")
    words = _DOTTED_WORDS.get(letters.lower()) or letters.upper()
    never_ends = words in ("for example", "that is", "also known as")
    if never_ends:
        return words + ("." if _text_ends_at(match.string, match.end()) else "")
    return words + ("." if _ends_sentence(match.string, match.end()) else "")


def _initial(match: re.Match[str]) -> str:
    """ "John F. Kennedy" -> "John F Kennedy"; "Plan B. Then" keeps its sentence end."""
    return match.group(1) + ("." if _ends_sentence(match.string, match.end()) else "")


def expand_abbreviations(text: str) -> str:
    """Abbreviations to words, keeping a period only where the sentence also ends, so that
    split_sentences does not cut at "U.S." or "Dr." inside a sentence."""
    text = _RATIO_RE.sub(ratio, text)  # "16:9" before the times: it is none
    text = rewrite(_TIME_RE, _time, text)  # "3:30 p.m.": the meridiem's period is the time's
    text = rewrite(_HOUR_RE, _time, text)
    text = _NUMBER_SIGN_RE.sub("number ", text)
    text = _BEFORE_NUMBER_RE.sub(lambda m: _BEFORE_NUMBER[m.group(1).lower()] + " ", text)
    text = _UNIT_PERIOD_RE.sub(
        lambda m: m.group(1) + ("." if _ends_sentence(m.string, m.end()) else ""), text
    )
    text = _DEGREE_RE.sub(
        lambda m: _DEGREES[m.group(1).lower()] + ("." if _ends_sentence(m.string, m.end()) else ""),
        text,
    )
    text = _DOTTED_ABBREVIATION_RE.sub(_dotted_abbreviation, text)
    text = _WORD_ABBREVIATION_RE.sub(_word_abbreviation, text)
    return _INITIAL_RE.sub(_initial, text)

"""Roman numerals, read only where their context says so: after a ruler's or a pope's name an
ordinal ("Henry VIII" -> "Henry the eighth"), after a counting word a cardinal ("Chapter IV",
"Super Bowl LVIII", "World War II"), and the wars written short ("WWII").

Capitals that happen to spell a numeral ("MIX", "DC", "CV", "CD", "MD") and the pronoun "I"
are left alone: a numeral is read only after a word that calls for one.
"""

from __future__ import annotations

import re

from onnx_tts.frontend.numbers import number_to_words, ordinal_to_words
from onnx_tts.frontend.sentences import _sentence_initial

# Names of rulers and popes that take a regnal number (matched capitalised or in capitals).
_REGNAL_NAMES = frozenset(
    """Adrian Afonso Alexander Alexios Alfonso Amenhotep Anne Antiochus Artaxerxes Baldwin
    Benedict Boleslaw Boniface Canute Carl Carlos Casimir Catherine Celestine Charles Christian
    Christina Clement Cleopatra Constantine Cyrus Darius David Duarte Edmund Edward Elizabeth
    Eric Erik Ethelred Felix Ferdinand Francis Franz Frederick Friedrich George Gregory Gustav
    Gustavus Haakon Hadrian Harald Harold Henri Henry Hugh Innocent Isabella Ivan James Jan
    Joanna John Joseph Juan Julius Justinian Karl Leo Leopold Louis Ludwig Magnus Malcolm
    Manuel Margaret Maria Mary Matthias Maximilian Mehmed Michael Murad Napoleon Nicholas Olaf
    Otto Paul Pedro Peter Philip Philippe Pius Ptolemy Ramesses Ramses Richard Robert Rudolf
    Sancho Selim Seti Sigismund Sixtus Stephen Suleiman Thutmose Umberto Urban Valdemar Victor
    Vittorio Wilhelm William Xerxes""".split()
)
# Given names that make "<given name> <Surname> III" a generational suffix ("Henry Ford II").
_GIVEN_NAMES = _REGNAL_NAMES | frozenset(
    """Andrew Arthur Benjamin Daniel Donald Douglas Frank Howard Jack Jim Joe Jonathan Kenneth
    Luther Martin Nelson Ronald Samuel Theodore Thomas Thurston Walter""".split()
)
# Titles before a ruler's name: "King Henry I" is read even when a lower-case word follows.
_TITLES = frozenset(
    """Archduke Czar Duke Emperor Empress Kaiser King Pharaoh Pope Prince Princess Queen Saint
    Shah Sultan Tsar Tsarina""".split()
)
# Words after which a numeral counts: "Chapter IV" is chapter four.
_CARDINAL_CUES = frozenset(
    """act appendix article book bowl canto category chapter class division episode grade level part
    phase psalm round scene season section stage tier title type volume war""".split()
)
# A numeral in canonical form (1..3999); the empty match is excluded by the callers.
_NUMERAL = r"M{0,3}(?:CM|CD|D?C{0,3})(?:XC|XL|L?X{0,3})(?:IX|IV|V?I{0,3})"
_VALUES = {"M": 1000, "D": 500, "C": 100, "L": 50, "X": 10, "V": 5, "I": 1}
# Regnal numbers stop below 40: "XL" (a size), "LI", "DC", "CD", "MIX" are never a king's.
_MAX_REGNAL = 39
_ALSO_ACRONYMS = frozenset({"IV", "VI", "XX"})
_NOT_NUMERALS = frozenset({("Malcolm", "X")})  # a name, not Malcolm the tenth

_NUMERAL_RE = re.compile(rf"(?:{_NUMERAL})", re.IGNORECASE)
# "<word> <numeral>", with an optional initial between a given name and a surname, and a
# possessive after the numeral; the numeral must stand alone (not "I/O", not "IV-drip").
_AFTER_WORD_RE = re.compile(
    r"(?P<before>\b(?P<prev2>[A-Z][a-z]+)\s+(?:[A-Z]\.?\s+)?)?"
    r"(?P<word>\b[A-Za-z]+)(?P<space>\s+)"
    rf"(?P<numeral>\b(?i:{_NUMERAL}))\b(?P<poss>'s)?(?![\w/&'-])"
)
_WORLD_WAR_RE = re.compile(r"(?<![\w-])WW\s?(?P<number>II|I|2|1)\b(?!['/-]\w)")


def roman_value(numeral: str) -> int | None:
    """The value of a canonical roman numeral ("XIV" -> 14), None for anything else."""
    if not numeral or not _NUMERAL_RE.fullmatch(numeral):
        return None
    numeral = numeral.upper()
    total = 0
    for index, ch in enumerate(numeral):
        value = _VALUES[ch]
        following = _VALUES[numeral[index + 1]] if index + 1 < len(numeral) else 0
        total += -value if value < following else value
    return total


def _next_word(text: str, end: int) -> str:
    following = re.match(r"\s+([A-Za-z]+)", text[end : end + 40])
    return following.group(1) if following else ""


def _pronoun_i(match: re.Match[str]) -> bool:
    """Whether an "I" after a name or a counting word may be the pronoun: a lower-case word
    follows ("the part I like", "Peter I think") and no title names a ruler before it."""
    following = _next_word(match.string, match.end())
    titled = match["prev2"] in _TITLES
    return bool(following) and following[0].islower() and following != "of" and not titled


def _is_title_case(word: str) -> bool:
    return word[0].isupper() and word[1:].islower()


def _reading(match: re.Match[str]) -> str | None:
    """The words for the numeral of an _AFTER_WORD_RE match, or None to leave it."""
    word, numeral = match["word"], match["numeral"]
    value = roman_value(numeral)
    if value is None or (word, numeral) in _NOT_NUMERALS:
        return None
    # "I" after a capitalised counting word is a numeral ("World War I ended"); after a
    # lower-case one or a bare name it may be the pronoun.
    counted = word.istitle() and word.lower() in _CARDINAL_CUES
    if numeral == "I" and not counted and _pronoun_i(match):
        return None
    if word.lower() in _CARDINAL_CUES:
        # After a counting word a numeral may be in lower case ("chapter iv"); a single
        # letter other than I, V, X is a label ("Appendix C", "Type D"), and so is a single
        # lower-case letter ("part v").
        if len(numeral) == 1 and (numeral not in "IVX" or numeral.islower()):
            return None
        return number_to_words(value)
    if not numeral.isupper() or value > _MAX_REGNAL:
        return None
    if word in _REGNAL_NAMES or (word.isupper() and word.title() in _REGNAL_NAMES):
        return f"the {ordinal_to_words(value)}"
    if not _is_title_case(word):
        return None
    if match["prev2"] in _GIVEN_NAMES:
        # "Henry Ford II", "John D. Rockefeller III": a generational suffix
        return f"the {ordinal_to_words(value)}" if numeral in ("II", "III", "IV") else None
    # A title's sequel number: "Final Fantasy VII", "Rocky II", "Apollo XI". Not a single
    # letter ("Model X", "Malcolm X", "Plan V"), not "XXX"; the numerals that are also common
    # capitals ("IV" drip, "VI" editor, "XX") not after a sentence's first word ("Insert IV").
    if len(numeral) < 2 or numeral == "XXX":
        return None
    if numeral in _ALSO_ACRONYMS and _sentence_initial(match.string, match.start("word")):
        return None
    return number_to_words(value)


def _after_word(match: re.Match[str]) -> str:
    words = _reading(match)
    if words is None:
        return match.group(0)
    return f"{match['before'] or ''}{match['word']}{match['space']}{words}{match['poss'] or ''}"


def _world_war(match: re.Match[str]) -> str:
    number = {"I": 1, "1": 1, "II": 2, "2": 2}[match["number"]]
    return f"world war {number_to_words(number)}"


def expand_roman(text: str) -> str:
    """Roman numerals after a ruler's name (ordinal), after a counting word (cardinal), and
    "WWI"/"WWII"/"WW2" as world war one/two; everything else is left as written."""
    text = _WORLD_WAR_RE.sub(_world_war, text)
    return _AFTER_WORD_RE.sub(_after_word, text)

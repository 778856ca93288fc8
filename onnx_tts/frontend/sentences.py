"""Where sentences end: the context tests the abbreviation and number rules use (does a period
end its sentence? does a word start one?) and the splitter that cuts text into sentences."""

from __future__ import annotations

import re
from collections.abc import Callable

# inside one: "the U.S. The next day" ends a sentence, "the U.S. Army" does not.
_SENTENCE_OPENERS = frozenset(
    """a after all also an and another as at because before but by during each every finally
    first for from he her his how however i if in it its later let many meanwhile most my next
    no now on one our please she since so some still that the their then there these they this
    those thus today tomorrow we what when where which while who why with yes yesterday yet
    you your""".split()
)
# The space a rule puts around the words it writes. Every rule sees it as whitespace
# (str.isspace), but unlike a writer's space it never makes a period before it a sentence
# end: "v.2" or ".5" rewritten must not become "v. two"; normalize_text turns it into " ".
PAD = "\u2028"
# The space between two words of one spoken unit a rule wrote ("nine thirty AM", "five
# dollars per month"): a no-break space, which no sentence end, long-sentence cut or
# caption cue falls on. Only `normalize_text(..., keep_units=True)` keeps it; a writer's own
# no-break spaces are ordinary spaces by then.
UNIT_SPACE = "\u00a0"
# Where split_sentences cuts: after ".", "!", "?" or ";" followed by whitespace.
SENTENCE_END = re.compile(r"(?<=[.!?;])\s+")
_SENTENCE_END_OUTSIDE_UNITS = re.compile(r"(?<=[.!?;])[^\S\u00a0]\s*")
_LOWER_WORD_NEXT = re.compile(r"\s+[a-z]")
_CAPITAL_NEXT = re.compile(r"\s+([A-Z])")
_NEXT_WORD = re.compile(r"\s+[\"'(]*([A-Za-z]+)")


_TEXT_END = re.compile(r"\s*\Z")
_TEXT_END_AFTER_CLOSERS = re.compile(r"[\s\"')\]]*\Z")


def _text_ends_at(text: str, end: int, closers: bool = False) -> bool:
    """Whether only whitespace (and closing quotes/brackets with `closers`) follows `end`;
    matched in place, so a long text with many abbreviations stays linear."""
    return bool((_TEXT_END_AFTER_CLOSERS if closers else _TEXT_END).match(text, end))


def _ends_sentence(text: str, end: int) -> bool:
    """Whether the period just before `end` (of an abbreviation, "p.m.") also ends its
    sentence: the text ends there, or a capitalised common sentence opener follows."""
    if _text_ends_at(text, end, closers=True):
        return True
    if not text[end : end + 1].isspace():
        return False  # "U.S.-based", "etc.," "p.m.)"
    word = _NEXT_WORD.match(text, end)
    return bool(word) and word.group(1)[0].isupper() and word.group(1).lower() in _SENTENCE_OPENERS


def _sentence_initial(text: str, start: int) -> bool:
    while start > 0 and text[start - 1].isspace():
        start -= 1
    return start == 0 or text[start - 1] in ".!?"


def pad(words: str) -> str:
    """Words a rule writes in place of what it read, as one unit (UNIT_SPACE between them),
    with PAD on both sides."""
    return f"{PAD}{words.replace(' ', UNIT_SPACE)}{PAD}"


def rewrite(pattern: re.Pattern[str], replace: Callable[[re.Match[str]], str], text: str) -> str:
    """Each match of `pattern` replaced by `replace(match)` with PAD around it, so that a
    spoken number does not glue to its neighbours."""
    return pattern.sub(lambda match: pad(replace(match)), text)


def split_sentences(text: str, max_chars: int = 200) -> list[str]:
    """Split on sentence ends; sentences longer than `max_chars` are cut at commas or spaces
    (inside a spoken unit only when it alone is longer)."""
    sentences = [s.strip() for s in _SENTENCE_END_OUTSIDE_UNITS.split(text) if s.strip()]
    chunks: list[str] = []
    for sentence in sentences:
        while len(sentence) > max_chars:
            cut = sentence.rfind(", ", 0, max_chars)
            cut = cut + 1 if cut > max_chars // 3 else sentence.rfind(" ", 0, max_chars)
            if cut <= 0:
                cut = sentence.rfind(UNIT_SPACE, 0, max_chars)
            if cut <= 0:
                cut = max_chars
            chunks.append(sentence[:cut].strip())
            sentence = sentence[cut:].strip()
        if sentence:
            chunks.append(sentence)
    return chunks

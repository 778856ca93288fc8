"""How espeak-ng ended a clause: the punctuation that closed it, as one of ". ? ! , : ;" (or
none), and whether it ends a sentence.

espeak-ng >= 1.52 reports a clause's end as flags (`espeak_TextToPhonemesWithTerminator`):
its type (clause or sentence), its intonation and its pause. Only the six plain kinds are named
by a mark; an end with any further flag (a CJK full stop, an ellipsis, an inverted mark, a
paragraph) has none, but may still end a sentence. A library without that call (older
builds) leaves the text espeak consumed for the clause: the same answer is read from the
punctuation that closed it, with the table below (what espeak-ng's flags give for each mark,
measured on 1.52).
"""

from __future__ import annotations

# espeak-ng's clause flags (readclause.h): pause (bits 0-11), intonation, type.
_CLAUSE_TYPE_SENTENCE = 0x00080000
_FLAG_BITS = 0x000FFFFF
_PLAIN_MARKS = {
    0x00080028: ".",  # period: pause 40, full-stop intonation, sentence
    0x00082028: "?",
    0x0008302D: "!",
    0x00041014: ",",  # comma: pause 20, comma intonation, clause
    0x0004001E: ":",
    0x0004101E: ";",
}

# Marks that end a clause (followed by a space or the text's end, unless noted) -> (mark,
# ends the sentence). Each is what espeak-ng's flags give for it.
_MARKS: dict[str, tuple[str, bool]] = {
    ",": (",", False),
    ".": (".", True),
    "?": ("?", True),
    "!": ("!", True),
    ":": (":", False),
    ";": (";", False),
    "\u2013": (";", False),  # en dash
    "\u2014": (";", False),  # em dash
    "\u037e": ("?", True),  # Greek question mark
    "\u0387": (";", False),  # Greek ano teleia
    "\u055d": (",", False),  # Armenian comma
    "\u060c": (",", False),  # Arabic comma
    "\u061b": (";", False),  # Arabic semicolon
    "\u061f": ("?", True),  # Arabic question mark
    "\u06d4": (".", True),  # Arabic full stop
    "\u1362": (".", True),  # Ethiopic full stop
    "\u1363": (",", False),
    "\u1364": (";", False),
    "\u1365": (":", False),
    "\u1366": (":", False),
    "\u1367": ("?", True),
    "\u1368": ("", True),  # Ethiopic paragraph separator
    "\u10fb": ("", True),  # Georgian paragraph separator
    "\u0f0e": ("", True),  # Tibetan double shad
}
# Marks that end a clause even with no space after them, and the end they give.
_MARKS_WITHOUT_SPACE: dict[str, tuple[str, bool]] = {
    "\u00a1": ("", False),  # inverted exclamation mark
    "\u00bf": ("", False),  # inverted question mark
    "\u2026": ("", False),  # ellipsis
    "\u0964": ("", True),  # Devanagari danda
    "\u0589": ("", True),  # Armenian full stop
    "\u0df4": ("", True),  # Sinhala kunddaliya
    "\u0f0d": ("", True),  # Tibetan shad
    "\u3001": ("", False),  # ideographic comma
    "\u3002": ("", True),  # ideographic full stop
    "\uff01": ("", True),  # fullwidth exclamation mark
    "\uff0c": ("", False),
    "\uff0e": ("", True),
    "\uff1a": ("", False),
    "\uff1b": ("", False),
    "\uff1f": ("", True),
}
# Closing quotes and brackets espeak reads past after a clause's punctuation.
_CLOSERS = "\"')]}\u00bb\u201d\u2019\u203a"


def clause_end(flags: int | None, consumed: str = "", last: bool = False) -> tuple[str, bool]:
    """(mark, ends sentence) of one clause: from espeak-ng's `flags` when the library gave
    them, else from the text it `consumed` for the clause (which may hold the first letter of
    the next clause, read ahead, unless this is the `last`)."""
    if flags is not None:
        flags &= _FLAG_BITS
        return _PLAIN_MARKS.get(flags, ""), bool(flags & _CLAUSE_TYPE_SENTENCE)
    body = consumed
    if not last and body and (body[-1].isalnum() or body[-1] in "'-"):
        body = body[:-1]  # the first letter of the next clause, read ahead
    if not last and body.replace(" ", "").replace("\t", "").replace("\r", "").endswith("\n\n"):
        return "", True  # a paragraph break ends a sentence with no mark
    body = body.rstrip().rstrip(_CLOSERS).rstrip()
    end = len(body)
    while end > 0 and (body[end - 1] in _MARKS or body[end - 1] in _MARKS_WITHOUT_SPACE):
        end -= 1
    run = body[end:]
    if not run or not any(c.isalnum() for c in body[:end]):
        return "", last  # no mark, or a mark with no word before it in the clause
    if run.startswith("...") or run[0] in _MARKS_WITHOUT_SPACE:
        return _MARKS_WITHOUT_SPACE.get(run[0], ("", False))
    return _MARKS[run[0]]


__all__ = ["clause_end"]

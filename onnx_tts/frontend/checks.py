"""Text checks: what a request may hand in (valid Unicode, not empty, bounded) and which
characters the English frontend can speak (others are dropped with a warning)."""

from __future__ import annotations

import unicodedata
import warnings

from onnx_tts.errors import InputError, UnspeakableTextWarning

# A bound on one request's text: normalisation and chunking are linear, but a runaway input
# (a whole book piped in by mistake) should be refused with a hint rather than run for hours.
MAX_TEXT_CHARS = 200_000
# Characters the English frontend speaks; other letters (CJK, Arabic, Hebrew, ...) and emoji
# would be read by espeak as "Chinese letter" or dropped by a tokenizer without a word.
_SPEAKABLE_SYMBOLS = frozenset("$£€¥¢°%&+=@#*/\\<>|~^_`'\"()[]{}×÷±≈≤≥≠′″")


def _character_group(ch: str) -> str:
    """A short name of the script (or "symbol") of a character the frontend drops."""
    if unicodedata.category(ch)[0] == "S":
        return "symbols"
    name = unicodedata.name(ch, "UNKNOWN")
    script = name.split(" ", 1)[0]
    return script if len(script) <= 3 else script.title()  # "CJK", "Arabic", "Hebrew"


def _speakable(ch: str) -> bool:
    if ch.isascii():
        return True
    category = unicodedata.category(ch)
    if category[0] == "L":
        return unicodedata.name(ch, "").startswith("LATIN")
    if category[0] == "M":
        return True  # combining marks are judged with their base letter (see below)
    if category[0] in "NPZ":
        return True
    return ch in _SPEAKABLE_SYMBOLS


def drop_unspeakable(text: str) -> str:
    """Remove letters of scripts the English frontend cannot speak (CJK, Arabic, Hebrew,
    Cyrillic, ...) and emoji/pictographs, warning with UnspeakableTextWarning naming them;
    InputError (and no warning: the error is the one line) when nothing speakable is left."""
    kept: list[str] = []
    dropped: dict[str, list[str]] = {}
    keep_marks = True
    for ch in text:
        if unicodedata.category(ch)[0] == "M":
            if keep_marks:
                kept.append(ch)
            continue
        if _speakable(ch):
            kept.append(ch)
            keep_marks = True
        else:
            dropped.setdefault(_character_group(ch), []).append(ch)
            kept.append(" ")  # keep word boundaries
            keep_marks = False
    if dropped and not any(ch.isalnum() for ch in kept):
        raise InputError(
            "text has nothing speakable after dropping the characters this English voice "
            "cannot read; give some words in English (or use a model for that language)"
        )
    if dropped:
        total = sum(len(chars) for chars in dropped.values())
        detail = "; ".join(
            f"{group}: {''.join(chars[:12])}{'...' if len(chars) > 12 else ''}"
            for group, chars in dropped.items()
        )
        warnings.warn(
            UnspeakableTextWarning(
                f"dropped {total} character{'s' * (total != 1)} this English voice cannot "
                f"speak ({detail}); use a model for that language",
                dropped=dict(dropped),
            ),
            stacklevel=3,
        )
    return "".join(kept)


def check_text(text: str | bytes) -> str:
    """Reject text that cannot be spoken: undecodable bytes, lone surrogates (invalid UTF-8 in
    argv arrives as those), empty or whitespace-only, longer than MAX_TEXT_CHARS."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as error:
            raise InputError(
                f"text is not valid UTF-8 (byte {error.start}); save it as UTF-8"
            ) from None
    if not isinstance(text, str):
        raise InputError(f"text must be a string, got {type(text).__name__}")
    for position, ch in enumerate(text):
        if "\ud800" <= ch <= "\udfff":
            # Python decodes undecodable argv bytes to U+DC80..U+DCFF (surrogateescape).
            raise InputError(
                f"text is not valid UTF-8/Unicode (lone surrogate U+{ord(ch):04X} at character "
                f"{position}); pass UTF-8 text"
            )
    if len(text) > MAX_TEXT_CHARS:
        raise InputError(
            f"text is {len(text)} characters long; at most {MAX_TEXT_CHARS} per request, "
            "split it into several requests"
        )
    if not text.strip():
        raise InputError("text is empty; give some words to speak")
    return text

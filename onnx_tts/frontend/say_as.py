"""SSML ``<say-as>``: its content rendered to the words a listener hears, with the
normaliser's own readers (numbers, dates, times, phone numbers, spelling).

Each renderer raises ValueError with what is wrong and what it expects; the SSML parser turns
that into an SsmlError naming the element's position.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from onnx_tts.frontend.dates import date_words, month_number, year_words
from onnx_tts.frontend.letters import spell
from onnx_tts.frontend.numbers import (
    digits_to_words,
    number_text_to_words,
    ordinal_to_words,
)
from onnx_tts.frontend.numerals import clock_words, phone_words

# The largest integer read as a number (number_to_words stops below 10**15).
_MAX_DIGITS = 15
_CARDINAL_RE = re.compile(r"([+-]?)(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?|([+-]?)(\.\d+)")
_ORDINAL_RE = re.compile(r"(\d+)(?:st|nd|rd|th)?", re.IGNORECASE)
_TIME_RE = re.compile(
    r"(?P<hours>\d{1,2})(?::(?P<minutes>\d{2})(?::(?P<seconds>\d{2}))?)?"
    r"\s*(?:(?P<meridiem>[ap])\.?\s*m\.?)?",
    re.IGNORECASE,
)
_PHONE_RE = re.compile(r"\+?[\d\s().\-/]*\d[\d\s().\-/]*")
DATE_FORMATS = ("mdy", "dmy", "ymd", "md", "dm", "ym", "my", "y", "m", "d")
TIME_FORMATS = ("hms12", "hms24")


def _cardinal(content: str, fmt: str | None) -> str:
    match = _CARDINAL_RE.fullmatch(content)
    if not match:
        raise ValueError(f"cardinal needs a number such as 42, 1,234 or -3.5, got {content!r}")
    if match.group(5):  # ".5"
        sign, whole, fraction = match.group(4), "0", match.group(5)
    else:
        sign, whole, fraction = match.group(1), match.group(2), match.group(3) or ""
    if len(whole.replace(",", "")) > _MAX_DIGITS:
        raise ValueError(f"cardinal has more than {_MAX_DIGITS} digits; use interpret-as=digits")
    words = number_text_to_words(whole + fraction)
    return {"-": "minus ", "+": "plus "}.get(sign, "") + words


def _ordinal(content: str, fmt: str | None) -> str:
    match = _ORDINAL_RE.fullmatch(content)
    if not match:
        raise ValueError(f"ordinal needs a whole number such as 3 or 3rd, got {content!r}")
    if len(match.group(1)) > _MAX_DIGITS:
        raise ValueError(f"ordinal has more than {_MAX_DIGITS} digits")
    return ordinal_to_words(int(match.group(1)))


def _digits(content: str, fmt: str | None) -> str:
    if not re.fullmatch(r"[\d\s]+", content):
        raise ValueError(f"digits needs digits only, got {content!r}")
    return digits_to_words(content)


def _characters(content: str, fmt: str | None) -> str:
    words = spell(content)
    if not words:
        raise ValueError(f"characters has nothing to spell in {content!r}")
    return words


def _date_parts(content: str, fmt: str) -> dict[str, str]:
    parts = [part for part in re.split(r"[\s/.,-]+", content) if part]
    if len(parts) != len(fmt):
        raise ValueError(
            f"date {content!r} does not match format {fmt!r} "
            "(its parts in that order, such as 2024-01-15 for ymd or 01/15/2024 for mdy)"
        )
    return dict(zip(fmt, parts, strict=True))


def _date(content: str, fmt: str | None) -> str:
    if fmt is None:  # ISO dates first, else US month/day/year
        fmt = "ymd" if re.match(r"\d{4}\D", content) else "mdy"
    fields = _date_parts(content, fmt)
    month_text, day_text, year = fields.get("m"), fields.get("d"), fields.get("y")
    month = None
    if month_text is not None:
        month = int(month_text) if month_text.isdigit() else month_number(month_text)
        if month is None or not 1 <= month <= 12:
            raise ValueError(f"date has no month {month_text!r} (1-12 or a month's name)")
    day = None
    if day_text is not None:
        day_digits = re.fullmatch(r"(\d{1,2})(?:st|nd|rd|th)?", day_text, re.IGNORECASE)
        if not day_digits or not 1 <= int(day_digits.group(1)) <= 31:
            raise ValueError(f"date has no day {day_text!r} (1-31)")
        day = int(day_digits.group(1))
    if year is not None and not re.fullmatch(r"\d{2}|\d{4}", year):
        raise ValueError(f"date has no year {year!r} (two or four digits)")
    if month is None:
        if day is not None:
            return f"the {ordinal_to_words(day)}"
        return year_words(year or "")
    words = date_words(month, day, year, day_first=fmt.startswith("d"))
    if words is None:
        raise ValueError(f"date {content!r} is not a real date")
    return words


def _time(content: str, fmt: str | None) -> str:
    match = _TIME_RE.fullmatch(content)
    if not match:
        raise ValueError(f"time needs hours:minutes such as 3:30pm or 15:45, got {content!r}")
    hours, minutes = int(match["hours"]), int(match["minutes"] or 0)
    seconds, meridiem = match["seconds"], match["meridiem"]
    if minutes > 59 or (seconds and int(seconds) > 59):
        raise ValueError(f"time {content!r} has minutes or seconds over 59")
    if meridiem and not 1 <= hours <= 12:
        raise ValueError(f"time {content!r}: with am/pm the hour is 1-12")
    if hours > 23:
        raise ValueError(f"time {content!r}: the hour is 0-23")
    if fmt == "hms12" and not meridiem and hours > 12:
        hours, meridiem = hours - 12, "p"
    words = clock_words(hours, minutes, meridiem.lower() if meridiem else None)
    if seconds and int(seconds):
        count = int(seconds)
        words += f" and {number_text_to_words(seconds.lstrip('0'))} second{'s' * (count != 1)}"
    return words


def _telephone(content: str, fmt: str | None) -> str:
    if not _PHONE_RE.fullmatch(content):
        raise ValueError(f"telephone needs digits with + ( ) - . or spaces, got {content!r}")
    return phone_words(content)


RENDERERS: dict[str, Callable[[str, str | None], str]] = {
    "characters": _characters,
    "spell-out": _characters,
    "cardinal": _cardinal,
    "ordinal": _ordinal,
    "digits": _digits,
    "date": _date,
    "time": _time,
    "telephone": _telephone,
}
# Which say-as kinds take a format, and the formats they take (None: any, unchecked).
FORMATS: dict[str, tuple[str, ...] | None] = {
    "date": DATE_FORMATS,
    "time": TIME_FORMATS,
    "telephone": None,
}


def render_say_as(interpret_as: str, content: str, fmt: str | None = None) -> str:
    """The words a listener hears for `content` read as `interpret_as` ("characters",
    "spell-out", "cardinal", "ordinal", "digits", "date", "time", "telephone"). ValueError
    says what is wrong."""
    renderer = RENDERERS.get(interpret_as)
    if renderer is None:
        raise ValueError(
            f"unknown interpret-as {interpret_as!r}; use one of {', '.join(RENDERERS)}"
        )
    content = " ".join(content.split())
    if not content:
        raise ValueError(f"say-as {interpret_as} has no content")
    return renderer(content, fmt)

"""Dates to English words: "2024-01-15", "12/25/2024" (US order), "March 3, 2024", "Jan. 1",
and the day written first ("15 March 2024" -> "the fifteenth of March, twenty twenty four")."""

from __future__ import annotations

import calendar
import re

from onnx_tts.frontend.numbers import _ONES, number_to_words, ordinal_to_words, year_to_words
from onnx_tts.frontend.sentences import rewrite

MONTHS = (
    "January February March April May June July August September October November December"
).split()
_MONTH_ABBREVIATIONS = {m[:3].lower(): m for m in MONTHS} | {"sept": "September"}
_MONTH_NAME = "(" + "|".join(MONTHS) + r"|(?:Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept|Sep|Oct|Nov|Dec)\.?)"
_ISO_DATE_RE = re.compile(r"(?<![\w.\-])(\d{4})-(\d{2})-(\d{2})(?![\w\-]|[.,]\d)")
_SLASH_DATE_RE = re.compile(r"(?<![\w./])(\d{1,2})/(\d{1,2})/(\d{4}|\d{2})(?![\w/]|[.,]\d)")
_MONTH_DAY_RE = re.compile(
    rf"\b{_MONTH_NAME}\s+(\d{{1,2}})(?:st|nd|rd|th)?\b(?!:)(?:,?\s+(\d{{4}})\b(?![.,]\d))?"
)
# "15 March 2024", "3rd May", "1 Jan. 2020": the day first, as written outside the US.
_DAY_MONTH_RE = re.compile(
    rf"(?<![\w.,:/-])(\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH_NAME}"
    rf"(?![\w])(?:,?\s+(\d{{4}})\b(?![.,]\d))?"
)


def month_number(name: str) -> int | None:
    """1-12 for a month's name or its abbreviation ("Sept.", "dec"), None for anything else."""
    key = name.rstrip(".").lower()
    month = _MONTH_ABBREVIATIONS.get(key[:4] if key.startswith("sept") else key[:3])
    if month is None or not month.lower().startswith(key):
        return None
    return MONTHS.index(month) + 1


def year_words(year: str) -> str:
    """A written year: four digits as a year ("twenty twenty four"), two as written ("oh
    five", "twenty four")."""
    if len(year) == 4:
        return year_to_words(int(year))
    return f"oh {_ONES[int(year)]}" if year.startswith("0") else number_to_words(int(year))


def date_words(
    month: int, day: int | None = None, year: str | None = None, day_first: bool = False
) -> str | None:
    """A date as spoken: (3, 3, "2024") "March third, twenty twenty four"; with day_first
    "the third of March, twenty twenty four"; without a day "March twenty twenty four".
    None for an impossible month or day ("2024-02-30", "April 31", "2023-02-29")."""
    if not 1 <= month <= 12 or (day is not None and not 1 <= day <= _days_in(month, year)):
        return None
    name = MONTHS[month - 1]
    if day is None:
        words = name
    elif day_first:
        words = f"the {ordinal_to_words(day)} of {name}"
    else:
        words = f"{name} {ordinal_to_words(day)}"
    if year is None:
        return words
    return f"{words}, {year_words(year)}" if day is not None else f"{words} {year_words(year)}"


def _days_in(month: int, year: str | None) -> int:
    """Days of a month; February has 29 unless a four-digit year says it has not."""
    if month == 2:
        leap = year is None or len(year) != 4 or calendar.isleap(int(year))
        return 29 if leap else 28
    return 30 if month in (4, 6, 9, 11) else 31


def _iso_date(match: re.Match[str]) -> str:
    year, month, day = match.groups()
    return date_words(int(month), int(day), year) or match.group(0)


def _slash_date(match: re.Match[str]) -> str:
    month, day, year = match.groups()  # US order: month/day/year
    return date_words(int(month), int(day), year) or match.group(0)


def _month_day(match: re.Match[str]) -> str:
    name, day, year = match.groups()
    month = month_number(name)
    return (date_words(month, int(day), year) if month else None) or match.group(0)


def _day_month(match: re.Match[str]) -> str:
    day, name, year = match.groups()
    month = month_number(name)
    words = date_words(month, int(day), year, day_first=True) if month else None
    if words and re.search(r"\bthe\s+$", match.string[max(0, match.start() - 5) : match.start()]):
        words = words.removeprefix("the ")  # "the 3rd of May"
    return words or match.group(0)


def expand_dates(text: str) -> str:
    """ISO and slash dates, month-day and day-month dates as words."""
    text = rewrite(_ISO_DATE_RE, _iso_date, text)
    text = rewrite(_SLASH_DATE_RE, _slash_date, text)
    text = rewrite(_DAY_MONTH_RE, _day_month, text)
    return rewrite(_MONTH_DAY_RE, _month_day, text)

"""Numbers with a sign or a letter that says how they measure: multipliers ("3x faster"),
dimensions ("3x4", "1920x1080"), feet and inches ("5'11\"", "6 ft 2 in", "12\""), scale
letters ("1.5M users", "7B"), "±5", "~5", "≈5", "3 × 4", ranges joined by a dash to a unit
or a meridiem ("40-60°C", "9am-5pm") or between times ("10:30-11:45"), weekday ranges
("Mon-Fri"), and a name's number after a hyphen ("GPT-4", "COVID-19").

Runs before expand_numbers, which then reads the numbers left as digits.
"""

from __future__ import annotations

import bisect
import re

from onnx_tts.frontend.numbers import integer_words, number_text_to_words, year_to_words
from onnx_tts.frontend.numerals import _SCALE_SUFFIXES, _UNITS
from onnx_tts.frontend.sentences import _ends_sentence, pad

_NUMBER = r"\d+(?:\.\d+)?"
# "3x faster", "10X", "1.5x": a number glued to x, not followed by a digit (that is "3x4").
_MULTIPLIER_RE = re.compile(rf"(?<![\w.,])({_NUMBER})[xX](?![\w])")
# "3x4", "3 x 4", "2x4x8", "1920x1080", "3×4": dimensions read with "by".
_DIMENSIONS_RE = re.compile(rf"(?<![\w.,])({_NUMBER}(?:(?:\s?[xX]\s?|×){_NUMBER})+)(?![\w]|\.\d)")
_TIMES_SIGN_RE = re.compile(r"\s?×\s?")
# Feet and inches: 5'11", 5' 11", 5'11, 6 ft 2 in, 6 feet 2 inches is already words.
_FEET_INCHES_RE = re.compile(
    rf"(?<![\w.,'])(?P<feet>\d+)(?:'|′|\s?ft\.?)\s?(?P<inches>{_NUMBER})"
    r"(?:\"|''|″|\s?in\b\.?)?(?![\w'\"]|\.\d)"
)
_FEET_RE = re.compile(rf"(?<![\w.,'])(?P<feet>{_NUMBER})(?:'|′)(?=[\s,.;:!?)]|\Z)(?!'\w)")
_INCHES_RE = re.compile(rf"(?<![\w.,'\"])(?P<inches>{_NUMBER})(?:\"|″|'')(?=[\s,.;:!?)-]|\Z)")
# A scale letter glued to a number: "1.5M users", "7B parameters", "10k", "3bn". A capital K
# is left alone ("4K video", "a 5K run"); a lower-case m is metres (the unit rule).
_SCALE_RE = re.compile(rf"(?<![\w.,$£€¥])({_NUMBER})(k|M|B|bn|mn)(?![\w])")
# Before these words a number and a capital are a label: "Room 3B", "Seat 12M", "Vitamin B".
_LABEL_CUE_RE = re.compile(
    r"\b(?:room|apt|apartment|flat|seat|suite|unit|gate|row|platform|terminal|level|floor|"
    r"building|block|bus|route|grade|size|type|model|no|number)\.?\s*#?\s*$",
    re.IGNORECASE,
)
# Video resolutions: "1080p" ten eighty P.
_RESOLUTION_RE = re.compile(r"(?<![\w.,])(240|360|480|540|576|720|1080|1440|2160|4320)p\b")
_PLUS_MINUS_RE = re.compile(r"±\s?(?=\d)")
_ABOUT_RE = re.compile(r"(?<![\w~])~\s?(?=[$£€¥]?\d)")
# "40-60°C", "5-10 km": a range whose unit follows the second number; "9am-5pm".
_UNIT_WORDS = "|".join(re.escape(unit) for unit in sorted(_UNITS, key=len, reverse=True))
_DASH_RANGE_RE = re.compile(
    rf"(?<![\w.,\-])({_NUMBER})\s?[-–]\s?"
    rf"(?=\d+(?:\.\d+)?\s?(?:%|[ap]\.?m\b|(?:{_UNIT_WORDS})(?!\w)))",
    re.IGNORECASE,
)
_TIME_RANGE_RE = re.compile(r"(?<=[ap]m)\s?[-–]\s?(?=\d)", re.IGNORECASE)
# "10:30-11:45", "9-10:30am", "9:30 - 11": a dash between two times of day, or an hour and a
# time, is "to" (the times are read by expand_numbers).
_CLOCK = r"\d{1,2}(?::\d{2})?"
_CLOCK_RANGE_RE = re.compile(
    rf"(?<![\w.:,])({_CLOCK})\s?[-–]\s?({_CLOCK})(?=\s?[ap]\.?m\b|(?![\w:]|[.,]\d))",
    re.IGNORECASE,
)
_WEEKDAYS = {
    "mon": "Monday",
    "tue": "Tuesday",
    "tues": "Tuesday",
    "wed": "Wednesday",
    "thu": "Thursday",
    "thur": "Thursday",
    "thurs": "Thursday",
    "fri": "Friday",
    "sat": "Saturday",
    "sun": "Sunday",
}
_WEEKDAY = "|".join(sorted(_WEEKDAYS, key=len, reverse=True))
_WEEKDAY_RANGE_RE = re.compile(rf"\b({_WEEKDAY})\.?\s?[-–]\s?({_WEEKDAY})\b(\.)?", re.IGNORECASE)
# "GPT-4", "COVID-19", "F-16", "Windows-11": a name and its number, no minus sign.
_NAME_NUMBER_RE = re.compile(r"\b([A-Za-z]+)-(?=\d)")  # "\b": not "6e-3"


def _multiplier(match: re.Match[str]) -> str:
    return pad(f"{number_text_to_words(match.group(1))} times")


def _dimension_number(number: str) -> str:
    """A side of a dimension: four-digit sides in pairs as people say screen sizes
    ("1920" nineteen twenty), others as numbers."""
    if len(number) == 4 and number.isdigit() and number[0] != "0":
        return year_to_words(int(number))
    return number_text_to_words(number)


def _dimensions(match: re.Match[str]) -> str:
    sides = re.split(r"\s?[xX×]\s?", match.group(1))
    return pad(" by ".join(_dimension_number(side) for side in sides))


def _feet_inches(match: re.Match[str]) -> str:
    feet, inches = match["feet"], match["inches"]
    feet_words = f"{integer_words(feet)} {'foot' if feet == '1' else 'feet'}"
    inch_words = f"{number_text_to_words(inches)} {'inch' if inches == '1' else 'inches'}"
    # The period of "in." stays only where the sentence ends too.
    ends = match.group(0).endswith(".") and _ends_sentence(match.string, match.end())
    period = "." if ends else ""
    return pad(f"{feet_words} {inch_words}{period}")


def _feet(match: re.Match[str]) -> str:
    feet = match["feet"]
    return pad(f"{number_text_to_words(feet)} {'foot' if feet == '1' else 'feet'}")


def _inches(text: str) -> str:
    """ "12"" is twelve inches unless the quote closes a quotation ("I am 12" she said)."""
    quotes = [index for index, ch in enumerate(text) if ch == '"']

    def reading(match: re.Match[str]) -> str:
        opened = bisect.bisect_left(quotes, match.start()) % 2 == 1
        if opened and match.group(0).endswith('"'):
            return match.group(0)
        inches = match["inches"]
        return pad(f"{number_text_to_words(inches)} {'inch' if inches == '1' else 'inches'}")

    return _INCHES_RE.sub(reading, text)


def _scale(match: re.Match[str]) -> str:
    """ "1.5M users" one point five million users; "7B" is a scale only with a decimal or
    before a word ("7B parameters"), never after a label word ("Room 3B")."""
    number, letter = match.group(1), match.group(2)
    text, start, end = match.string, match.start(), match.end()
    if _LABEL_CUE_RE.search(text[max(0, start - 20) : start]):
        return match.group(0)
    if letter in "MB" and "." not in number and not re.match(r"\s[a-z]", text[end : end + 2]):
        return match.group(0)
    return pad(f"{number_text_to_words(number)} {_SCALE_SUFFIXES[letter.lower()]}")


def _weekday_range(match: re.Match[str]) -> str:
    first, last = (_WEEKDAYS[day.lower()] for day in match.groups()[:2])
    # "Fri." keeps its period only where the sentence ends too.
    period = "." if match.group(3) and _ends_sentence(match.string, match.end()) else ""
    return f"{first} to {last}{period}"


def _is_clock(written: str) -> bool:
    hours, _, minutes = written.partition(":")
    return int(hours) <= 24 and (not minutes or int(minutes) <= 59)


def _clock_range(match: re.Match[str]) -> str:
    first, second = match.groups()
    if ":" not in first + second or not (_is_clock(first) and _is_clock(second)):
        return match.group(0)
    return f"{first}{pad('to')}{second}"


def expand_measures(text: str) -> str:
    """Multipliers, dimensions, feet and inches, scale letters, ±/~/≈/×, dash ranges before a
    unit or meridiem, weekday ranges, and hyphenated name numbers, as words or plain
    numbers for expand_numbers."""
    text = _FEET_INCHES_RE.sub(_feet_inches, text)
    text = _FEET_RE.sub(_feet, text)
    text = _inches(text)
    text = _DIMENSIONS_RE.sub(_dimensions, text)
    text = _MULTIPLIER_RE.sub(_multiplier, text)
    text = _TIMES_SIGN_RE.sub(pad("times"), text)
    text = _SCALE_RE.sub(_scale, text)
    text = _RESOLUTION_RE.sub(lambda m: pad(f"{year_to_words(int(m.group(1)))} P"), text)
    text = _PLUS_MINUS_RE.sub(pad("plus or minus"), text)
    text = _ABOUT_RE.sub(pad("about"), text)
    text = _DASH_RANGE_RE.sub(lambda m: m.group(1) + pad("to"), text)
    text = _TIME_RANGE_RE.sub(pad("to"), text)
    text = _CLOCK_RANGE_RE.sub(_clock_range, text)
    text = _WEEKDAY_RANGE_RE.sub(_weekday_range, text)
    return _NAME_NUMBER_RE.sub(r"\1 ", text)

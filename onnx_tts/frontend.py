"""Text frontend: normalisation, sentence splitting for long input, tokenization, and
phonemization (espeak-ng) for bundles that speak phonemes."""

from __future__ import annotations

import ctypes
import os
import re
import threading
import unicodedata
import warnings
from collections.abc import Callable, Collection
from pathlib import Path

from tokenizers import Tokenizer

from onnx_tts.errors import InputError, ModelError, UnspeakableTextWarning

# A bound on one request's text: normalisation and chunking are linear, but a runaway input
# (a whole book piped in by mistake) should be refused with a hint rather than run for hours.
MAX_TEXT_CHARS = 200_000
# Integers with more digits than this are read digit by digit (phone, card, serial numbers).
MAX_CARDINAL_DIGITS = 9

_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen"
).split()
_TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_SCALES = [(10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (1000, "thousand")]
_ORDINAL_IRREGULAR = {
    "one": "first",
    "two": "second",
    "three": "third",
    "five": "fifth",
    "eight": "eighth",
    "nine": "ninth",
    "twelve": "twelfth",
}

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
# inside one: "the U.S. The next day" ends a sentence, "the U.S. Army" does not.
_SENTENCE_OPENERS = frozenset(
    """a after all also an and another as at because before but by during each every finally
    first for from he her his how however i if in it its later let many meanwhile most my next
    no now on one our please she since so some still that the their then there these they this
    those thus today tomorrow we what when where which while who why with yes yesterday yet
    you your""".split()
)
# The word before a 4-digit number that makes it a year ("in 1984") rather than a count.
_YEAR_CUES = frozenset(
    """in since by from until till through to of year the around circa after before during
    early late mid spring summer autumn fall winter""".split()
)
_MONTHS = (
    "January February March April May June July August September October November December"
).split()
_MONTH_ABBREVIATIONS = {m[:3].lower(): m for m in _MONTHS} | {"sept": "September"}
# Denominators read as a fraction ("3/4" three quarters); others make a ratio ("24/7").
_FRACTION_DENOMINATORS = frozenset({2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 16, 32, 64, 100})
_DECADE_CUES = "the|early|mid|late|in|their|his|her|my|our|your|mid"
_SYMBOLS = {"&": " and ", "%": " percent", "+": " plus ", "=": " equals ", "@": " at "}
_SCALE_SUFFIXES = {
    "k": "thousand",
    "m": "million",
    "mn": "million",
    "b": "billion",
    "bn": "billion",
    "t": "trillion",
    "tn": "trillion",
}
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
    }
)
# Currency symbol -> (singular, plural, cent singular, cent plural).
_CURRENCIES = {
    "$": ("dollar", "dollars", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
    "€": ("euro", "euros", "cent", "cents"),
    "¥": ("yen", "yen", "sen", "sen"),
}
# Unit written after a number -> (singular, plural). Only unambiguous abbreviations: a bare
# "m" after a number is metres, "s" seconds; "l" (litre vs. the letter) is left alone.
_UNITS = {
    "km": ("kilometer", "kilometers"),
    "cm": ("centimeter", "centimeters"),
    "mm": ("millimeter", "millimeters"),
    "m": ("meter", "meters"),
    "kg": ("kilogram", "kilograms"),
    "mg": ("milligram", "milligrams"),
    "g": ("gram", "grams"),
    "ml": ("milliliter", "milliliters"),
    "km/h": ("kilometer per hour", "kilometers per hour"),
    "mph": ("mile per hour", "miles per hour"),
    "ms": ("millisecond", "milliseconds"),
    "s": ("second", "seconds"),
    "min": ("minute", "minutes"),
    "sec": ("second", "seconds"),
    "hr": ("hour", "hours"),
    "hrs": ("hour", "hours"),
    "h": ("hour", "hours"),
    "hz": ("hertz", "hertz"),
    "khz": ("kilohertz", "kilohertz"),
    "mhz": ("megahertz", "megahertz"),
    "ghz": ("gigahertz", "gigahertz"),
    "kb": ("kilobyte", "kilobytes"),
    "mb": ("megabyte", "megabytes"),
    "gb": ("gigabyte", "gigabytes"),
    "tb": ("terabyte", "terabytes"),
    "m/s": ("meter per second", "meters per second"),
    "ft": ("foot", "feet"),
    "mi": ("mile", "miles"),
    "yd": ("yard", "yards"),
    "lb": ("pound", "pounds"),
    "lbs": ("pound", "pounds"),
    "oz": ("ounce", "ounces"),
    "kw": ("kilowatt", "kilowatts"),
    "kwh": ("kilowatt hour", "kilowatt hours"),
    "°c": ("degree Celsius", "degrees Celsius"),
    "°f": ("degree Fahrenheit", "degrees Fahrenheit"),
    "°": ("degree", "degrees"),
}

# A plain number: digits with valid thousands groups (1,234,567) or none, optional decimals.
# A comma not followed by exactly three digits is punctuation ("items 2,3").
_NUMBER = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?"
_CURRENCY = r"[$£€¥]"
_MONEY_RE = re.compile(
    rf"({_CURRENCY})\s?({_NUMBER})(?:\s?(thousand|million|billion|trillion)\b|"
    rf"({'|'.join(sorted(_SCALE_SUFFIXES, key=len, reverse=True))})\b)?",
    re.IGNORECASE,
)
_MONEY_AFTER_RE = re.compile(rf"(?<![\w.,])({_NUMBER})\s?({_CURRENCY})(?!\s?\d)")
_CENTS_RE = re.compile(rf"(?<![\w.,])({_NUMBER})\s?¢")
_NEGATIVE_MONEY_RE = re.compile(rf"(?<![\w.,])-(?={_CURRENCY}\d)")
# A meridiem after a time or an hour: "3:30 pm", "3 p.m.", "10AM". The period of "p.m." is
# group "dot", kept when it also ends the sentence.
_MERIDIEM = r"(?:\s?(?P<meridiem>[ap])\.?m\b(?P<dot>\.)?)"
_TIME_RE = re.compile(
    rf"(?<![\d:])(?P<hours>[01]?\d|2[0-3]):(?P<minutes>[0-5]\d)(?![\d:]){_MERIDIEM}?",
    re.IGNORECASE,
)
_HOUR_RE = re.compile(rf"(?<![\w.:,])(?P<hours>1[0-2]|0?[1-9]){_MERIDIEM}", re.IGNORECASE)
# Phone numbers, read digit by digit in their groups: (555) 123-4567, 555-123-4567,
# 1-800-555-1234, 555.123.4567, +1 555 123 4567, +44 20 7946 0958, 555-1234.
_PHONE_RE = re.compile(
    r"""(?<![\w+.\-/])(?:
        \+\d{1,3}[\s.-]?(?:\(\d{1,4}\)[\s.-]?)?\d{1,4}(?:[\s.-]\d{2,4}){1,4}
      | \(\d{3}\)\s?\d{3}[\s.-]\d{4}
      | (?:1[-.])?\d{3}([-.])\d{3}\1\d{4}
      | \d{3}-\d{4}
    )(?![\w\-]|[.,]\d)""",
    re.VERBOSE,
)
_ISO_DATE_RE = re.compile(r"(?<![\w.\-])(\d{4})-(\d{2})-(\d{2})(?![\w\-]|[.,]\d)")
_SLASH_DATE_RE = re.compile(r"(?<![\w./])(\d{1,2})/(\d{1,2})/(\d{4}|\d{2})(?![\w/]|[.,]\d)")
_MONTH_DAY_RE = re.compile(
    r"\b(" + "|".join(_MONTHS) + r"|(?:Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept|Sep|Oct|Nov|Dec)\.?)"
    r"\s+(\d{1,2})(?:st|nd|rd|th)?\b(?!:)(?:,?\s+(\d{4})\b(?![.,]\d))?"
)
_RANGE_RE = re.compile(r"(?<![\w.\-/])(\d{1,4})-(\d{1,4})(?![\w\-/]|[.,]\d)")
_SCIENTIFIC_RE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)[eE]([+-]?\d{1,4})(?![\w.])")
_DOTTED_RE = re.compile(r"(?<![\w.])\d+(?:\.\d+){2,}(?![\w]|\.\d)")
_ORDINAL_RE = re.compile(r"(?<![\w.,])(\d{1,9})(st|nd|rd|th)\b", re.IGNORECASE)
_UNIT_RE = re.compile(
    rf"(?<![\w.,])({_NUMBER})\s?("
    + "|".join(re.escape(u) for u in sorted(_UNITS, key=len, reverse=True))
    + r")(?!\w)",
    re.IGNORECASE,
)
_DECADE_RE = re.compile(r"(?<![\w.,$])(1[1-9]\d0|20\d0)'?s\b")
# "'90s" always; a bare "90s" after a cue word ("the 90s", "mid-90s"), else it is seconds.
_SHORT_DECADE_RE = re.compile(
    rf"(?:(?<![\w'])'|\b(?P<cue>(?:{_DECADE_CUES})[\s-]))(?P<tens>\d0)'?s\b", re.IGNORECASE
)
_YEAR_RE = re.compile(r"(?<![\w.,$£€¥])(1\d\d\d|20\d\d)(?![\w]|[.,]\d)")
# A number someone dials is read digit by digit: "Dial 911", "call 411".
_DIALED_RE = re.compile(r"\b((?:dial|call|phone|fax|text)\s+)(\d{3,})\b(?![.,]\d)", re.IGNORECASE)
_MIXED_FRACTION_RE = re.compile(r"(?<![\w./])(\d+)\s(\d{1,2})/(\d{1,3})(?![\w/]|[.,]\d)")
_SLASH_RE = re.compile(r"(?<![\w./])(\d{1,3})/(\d{1,3})(?![\w/]|[.,]\d)")
_NUMBER_RE = re.compile(rf"(?<!\d){_NUMBER}")
# "$5/month", "20 km/day": a slash before a unit of time or count is "per".
_PER_RE = re.compile(
    r"(?<=\w) ?/ ?(?=(?:second|sec|minute|min|hour|hr|day|night|week|month|mo|year|yr|person|"
    r"head|unit|item|kg|lb|gallon|liter|litre|mile|km)\b)",
    re.IGNORECASE,
)
_NEGATIVE_RE = re.compile(r"(?<![\w.,])-(?=\d)")
_NUMBER_SIGN_RE = re.compile(r"(?:(?<![\w.])No\.|#)\s?(?=\d)")
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
# Characters the English frontend speaks; other letters (CJK, Arabic, Hebrew, ...) and emoji
# would be read by espeak as "Chinese letter" or dropped by a tokenizer without a word.
_SPEAKABLE_SYMBOLS = frozenset("$£€¥¢°%&+=@#*/\\<>|~^_`'\"()[]{}")


def number_to_words(number: int) -> str:
    """Cardinal English words for a non-negative integer below 10**15."""
    if number < 20:
        return _ONES[number]
    if number < 100:
        tens, ones = divmod(number, 10)
        return _TENS[tens] + (f" {_ONES[ones]}" if ones else "")
    if number < 1000:
        hundreds, rest = divmod(number, 100)
        return f"{_ONES[hundreds]} hundred" + (f" {number_to_words(rest)}" if rest else "")
    for scale, name in _SCALES:
        if number >= scale:
            head, rest = divmod(number, scale)
            return f"{number_to_words(head)} {name}" + (f" {number_to_words(rest)}" if rest else "")
    raise ValueError(number)


def ordinal_to_words(number: int) -> str:
    """Ordinal English words: 1 -> first, 21 -> twenty-first, 100 -> one hundredth."""
    words = number_to_words(number).split(" ")
    last = words[-1]
    if last in _ORDINAL_IRREGULAR:
        last = _ORDINAL_IRREGULAR[last]
    elif last.endswith("y"):
        last = last[:-1] + "ieth"
    else:
        last += "th"
    words[-1] = last
    # "twenty-first": a compound of tens and ones is hyphenated as written English does.
    if len(words) > 1 and words[-2] in _TENS and number % 10:
        words[-2:] = [f"{words[-2]}-{last}"]
    return " ".join(words)


def digits_to_words(digits: str) -> str:
    """Read a digit string digit by digit: "007" -> "zero zero seven"."""
    return " ".join(_ONES[int(d)] for d in digits if d.isdigit())


def year_to_words(year: int) -> str:
    """A year as spoken: 1984 -> nineteen eighty four, 2005 -> two thousand five,
    1905 -> nineteen oh five, 1900 -> nineteen hundred, 2024 -> twenty twenty four."""
    if 2000 <= year <= 2009:
        return number_to_words(year)
    head, tail = divmod(year, 100)
    if tail == 0:
        return number_to_words(year) if head % 10 == 0 else f"{number_to_words(head)} hundred"
    tail_words = number_to_words(tail) if tail >= 10 else f"oh {_ONES[tail]}"
    return f"{number_to_words(head)} {tail_words}"


def _integer_words(digits: str) -> str:
    """An integer string as words; long runs and leading zeros are read digit by digit."""
    if len(digits) > MAX_CARDINAL_DIGITS or (len(digits) > 1 and digits.startswith("0")):
        return digits_to_words(digits)
    return number_to_words(int(digits))


def number_text_to_words(text: str) -> str:
    """A number as written ("1,234.5", "42", "007") to words."""
    whole, _, fraction = text.replace(",", "").partition(".")
    words = _integer_words(whole)
    if fraction:
        words += " point " + digits_to_words(fraction)
    return words


def _is_one(number_text: str) -> bool:
    return number_text.replace(",", "") in ("1", "1.0")


def _money(match: re.Match[str]) -> str:
    symbol, amount, scale, suffix = match.group(1), match.group(2), match.group(3), match.group(4)
    return _money_words(symbol, amount, scale or _SCALE_SUFFIXES.get((suffix or "").lower()))


def _money_after(match: re.Match[str]) -> str:
    return _money_words(match.group(2), match.group(1), None)


def _money_words(symbol: str, amount: str, scale: str | None) -> str:
    unit, units, cent, cents = _CURRENCIES[symbol]
    if scale:  # "$1.5 million", "$5M" -> "five million dollars"
        return f"{number_text_to_words(amount)} {scale.lower()} {units}"
    whole, _, fraction = amount.replace(",", "").partition(".")
    cents_words = ""
    if len(fraction) == 2 and int(fraction):
        cents_words = f"{number_to_words(int(fraction))} {cent if fraction == '01' else cents}"
    elif fraction and int(fraction):
        return f"{number_text_to_words(amount)} {units}"
    if cents_words and int(whole) == 0:
        return cents_words  # "$0.99" -> "ninety nine cents"
    words = f"{_integer_words(whole)} {unit if int(whole) == 1 else units}"
    return f"{words} and {cents_words}" if cents_words else words


def _cents(match: re.Match[str]) -> str:
    amount = match.group(1)
    return f"{number_text_to_words(amount)} {'cent' if _is_one(amount) else 'cents'}"


def _clock(hours: int, minutes: int, meridiem: str | None) -> str:
    if minutes == 0:
        if meridiem:
            words = number_to_words(hours)
        elif hours > 12:
            words = f"{number_to_words(hours)} hundred"  # 24-hour clock: "fifteen hundred"
        else:
            words = f"{number_to_words(hours)} o'clock"
    elif minutes < 10:
        words = f"{number_to_words(hours)} oh {_ONES[minutes]}"
    else:
        words = f"{number_to_words(hours)} {number_to_words(minutes)}"
    return f"{words} {meridiem.upper()}M" if meridiem else words


def _time(match: re.Match[str]) -> str:
    minutes = match.groupdict().get("minutes")
    words = _clock(int(match["hours"]), int(minutes or 0), match["meridiem"])
    # "at 5 p.m. We left": the period of "p.m." ends the sentence too.
    return words + "." if match["dot"] and _ends_sentence(match.string, match.end()) else words


def _phone(match: re.Match[str]) -> str:
    number = match.group(0)
    groups = [digits_to_words(group) for group in re.findall(r"\d+", number)]
    return ("plus " if number.startswith("+") else "") + ", ".join(groups)


def _day_words(month: int, day: int, year: str | None) -> str | None:
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return None
    words = f"{_MONTHS[month - 1]} {ordinal_to_words(day)}"
    if year is None:
        return words
    year_words = year_to_words(int(year)) if len(year) == 4 else _two_digit_year(year)
    return f"{words}, {year_words}"


def _two_digit_year(digits: str) -> str:
    return f"oh {_ONES[int(digits)]}" if digits.startswith("0") else number_to_words(int(digits))


def _iso_date(match: re.Match[str]) -> str:
    year, month, day = match.groups()
    return _day_words(int(month), int(day), year) or match.group(0)


def _slash_date(match: re.Match[str]) -> str:
    month, day, year = match.groups()  # US order: month/day/year
    return _day_words(int(month), int(day), year) or match.group(0)


def _month_day(match: re.Match[str]) -> str:
    name, day, year = match.groups()
    key = name.rstrip(".").lower()
    month = _MONTH_ABBREVIATIONS.get(key[:4] if key.startswith("sept") else key[:3])
    words = _day_words(_MONTHS.index(month) + 1, int(day), year) if month else None
    return words or match.group(0)


def _range(match: re.Match[str]) -> str:
    """ "10-20" -> "ten to twenty", "1990-1995" -> years; also scores ("3-2", three to two)."""
    low, high = match.groups()
    if all(_YEAR_RE.fullmatch(side) for side in (low, high)):
        return f"{year_to_words(int(low))} to {year_to_words(int(high))}"
    return f"{_integer_words(low)} to {_integer_words(high)}"


def _year(match: re.Match[str]) -> str:
    """A 4-digit number as a year ("in 1984", "1999 was", "2005.") or as a count when a word
    follows mid-sentence with no year cue before it ("2024 people")."""
    text, start, end = match.string, match.start(), match.end()
    year = int(match.group(1))
    before = re.search(r"([A-Za-z]+)[\s-]*$", text[max(0, start - 40) : start])
    cued = bool(before) and before.group(1).lower() in _YEAR_CUES
    if cued or re.match(r"\s*(?:AD|BC|BCE|CE)\b", text[end : end + 40]):
        return year_to_words(year)
    # 1000-1099 are years only when something says so ("in 1066", "1066 AD").
    if year < 1100 or (not _sentence_initial(text, start) and _LOWER_WORD_NEXT.match(text, end)):
        return number_to_words(year)
    return year_to_words(year)


def _scientific(match: re.Match[str]) -> str:
    mantissa, exponent = match.group(1), match.group(2)
    sign = "minus " if exponent.startswith("-") else ""
    power = int(exponent.lstrip("+-"))
    return (
        f"{number_text_to_words(mantissa)} times ten to the power of {sign}{number_to_words(power)}"
    )


def _dotted(match: re.Match[str]) -> str:
    return " point ".join(_integer_words(part) for part in match.group(0).split("."))


def _ordinal(match: re.Match[str]) -> str:
    return ordinal_to_words(int(match.group(1)))


def _unit(match: re.Match[str]) -> str:
    amount, unit = match.group(1), match.group(2)
    singular, plural = _UNITS[unit.lower()]
    return f"{number_text_to_words(amount)} {singular if _is_one(amount) else plural}"


def _fraction_words(numerator: int, denominator: int) -> str:
    name = {2: "half", 4: "quarter"}.get(denominator) or ordinal_to_words(denominator)
    if numerator != 1:
        name = "halves" if name == "half" else name + "s"
    return f"{number_to_words(numerator)} {name}"


def _is_fraction(numerator: int, denominator: int) -> bool:
    return 0 < numerator < denominator and denominator in _FRACTION_DENOMINATORS


def _slash(match: re.Match[str]) -> str:
    """ "3/4" -> three quarters; a slash that is no proper fraction is a ratio or a name read
    as its numbers: "24/7" twenty four seven, "50/50", "9/11"."""
    numerator, denominator = int(match.group(1)), int(match.group(2))
    if _is_fraction(numerator, denominator):
        return _fraction_words(numerator, denominator)
    return f"{_integer_words(match.group(1))} {_integer_words(match.group(2))}"


def _mixed_fraction(match: re.Match[str]) -> str:
    whole, numerator, denominator = (int(g) for g in match.groups())
    if not _is_fraction(numerator, denominator):
        return match.group(0)
    part = (
        "a half" if (numerator, denominator) == (1, 2) else _fraction_words(numerator, denominator)
    )
    return f"{number_to_words(whole)} and {part}"


def _decade(match: re.Match[str]) -> str:
    return _plural_number(year_to_words(int(match.group(1))))


def _short_decade(match: re.Match[str]) -> str:
    tens = int(match["tens"])
    words = "two thousands" if tens == 0 else _plural_number(number_to_words(tens))
    return (match["cue"] or "").rstrip("-") + " " + words


def _plural_number(words: str) -> str:
    """ "nineteen ninety" -> "nineteen nineties", "eighteen hundred" -> "eighteen hundreds"."""
    head, _, last = words.rpartition(" ")
    last = last[:-1] + "ies" if last.endswith("y") else last + "s"
    return f"{head} {last}".strip()


# -- abbreviations ------------------------------------------------------------------------------
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
    text = _rewrite(_TIME_RE, _time, text)  # "3:30 p.m.": the meridiem's period is the time's
    text = _rewrite(_HOUR_RE, _time, text)
    text = _NUMBER_SIGN_RE.sub("number ", text)
    text = _UNIT_PERIOD_RE.sub(
        lambda m: m.group(1) + ("." if _ends_sentence(m.string, m.end()) else ""), text
    )
    text = _DOTTED_ABBREVIATION_RE.sub(_dotted_abbreviation, text)
    text = _WORD_ABBREVIATION_RE.sub(_word_abbreviation, text)
    return _INITIAL_RE.sub(_initial, text)


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


def _rewrite(pattern: re.Pattern[str], replace: Callable[[re.Match[str]], str], text: str) -> str:
    # Spaces around each replacement keep a spoken number from gluing to its neighbours.
    return pattern.sub(lambda match: f" {replace(match)} ", text)


def expand_numbers(text: str) -> str:
    """Phone numbers, dates, money, scientific notation, dotted versions/IPs, ordinals,
    decades, fractions and ratios, units, ranges, years, then plain numbers, as English words
    (in that order: the specific forms first). Times are read by expand_abbreviations."""
    text = _rewrite(_PHONE_RE, _phone, text)
    text = _rewrite(_ISO_DATE_RE, _iso_date, text)
    text = _rewrite(_SLASH_DATE_RE, _slash_date, text)
    text = _rewrite(_MONTH_DAY_RE, _month_day, text)
    text = _NEGATIVE_MONEY_RE.sub("minus ", text)
    text = _rewrite(_MONEY_RE, _money, text)
    text = _rewrite(_MONEY_AFTER_RE, _money_after, text)
    text = _rewrite(_CENTS_RE, _cents, text)
    text = _rewrite(_TIME_RE, _time, text)
    text = _rewrite(_SCIENTIFIC_RE, _scientific, text)
    text = _rewrite(_DOTTED_RE, _dotted, text)
    text = _rewrite(_ORDINAL_RE, _ordinal, text)
    text = _rewrite(_DECADE_RE, _decade, text)  # before units: "1990s" is not 1990 seconds
    text = _rewrite(_SHORT_DECADE_RE, _short_decade, text)
    text = _rewrite(_MIXED_FRACTION_RE, _mixed_fraction, text)
    text = _rewrite(_SLASH_RE, _slash, text)
    text = _NEGATIVE_RE.sub("minus ", text)
    text = _rewrite(_UNIT_RE, _unit, text)
    text = _rewrite(_RANGE_RE, _range, text)
    text = _DIALED_RE.sub(lambda m: m.group(1) + digits_to_words(m.group(2)), text)
    text = _rewrite(_YEAR_RE, _year, text)
    text = _PER_RE.sub(" per ", text)
    return _rewrite(_NUMBER_RE, lambda m: number_text_to_words(m.group(0)), text)


def normalize_text(text: str) -> str:
    """Unicode, punctuation, abbreviation, symbol and number normalisation for English.

    Letters of other scripts and emoji are dropped with an UnspeakableTextWarning, and an
    InputError is raised when that leaves nothing to speak. Blank text gives "" (callers
    refuse it, see check_text); text that is not valid Unicode is an InputError.
    """
    if not isinstance(text, str):
        raise InputError(f"text must be a string, got {type(text).__name__}")
    if not text.strip():
        return ""
    text = check_text(text)
    text = unicodedata.normalize("NFKC", text).translate(_QUOTES)
    text = "".join(ch if unicodedata.category(ch)[0] != "C" else " " for ch in text)
    text = drop_unspeakable(text)
    text = expand_abbreviations(text)
    text = expand_numbers(text)
    for symbol, word in _SYMBOLS.items():
        text = text.replace(symbol, word)
    text = re.sub(r"\s+", " ", text).strip()
    # A space before punctuation, or before the hyphen of "5-year-old", comes from a
    # replacement above, never from the writer.
    return re.sub(r" (?=[,.;:!?]|-[A-Za-z])", "", text)


def split_sentences(text: str, max_chars: int = 200) -> list[str]:
    """Split on sentence ends; sentences longer than `max_chars` are cut at commas or spaces."""
    sentences = [s.strip() for s in re.split(r"(?<=[.!?;])\s+", text) if s.strip()]
    chunks: list[str] = []
    for sentence in sentences:
        while len(sentence) > max_chars:
            cut = sentence.rfind(", ", 0, max_chars)
            cut = cut + 1 if cut > max_chars // 3 else sentence.rfind(" ", 0, max_chars)
            if cut <= 0:
                cut = max_chars
            chunks.append(sentence[:cut].strip())
            sentence = sentence[cut:].strip()
        if sentence:
            chunks.append(sentence)
    return chunks


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


class TextTokenizer:
    """A `tokenizers` tokenizer.json with the bundle's special tokens."""

    def __init__(self, path: Path) -> None:
        if not path.is_file():
            raise ModelError(f"tokenizer not found: {path}")
        try:
            self._tokenizer = Tokenizer.from_file(str(path))
        except Exception as error:  # tokenizers raises a bare Exception on bad JSON
            raise ModelError(f"cannot read tokenizer {path}: {error}") from None
        self.unk_id = self._tokenizer.token_to_id("<unk>")

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size()

    def token_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)


# -- phonemes -----------------------------------------------------------------------------------
# Clause punctuation is kept in the phoneme string: it tells the model where to pause and how
# to intone. A comma-like mark is followed by a space, as a word boundary.
_CLAUSE = re.compile(r"([^,.;:!?]+)([,.;:!?]*)")
_LANGUAGE_SWITCH = re.compile(r"\([^)]*\)")  # "(en)" ... "(fr)" around foreign words
_ESPEAK_CHARS_UTF8 = 1
_ESPEAK_PHONEMES_IPA = 0x02
_ESPEAK_AUDIO_SYNCHRONOUS = 0x02


def _espeak_library() -> tuple[str, str | None]:
    """(library path, data directory): the `espeakng-loader` wheel's copy (pinned through the
    package, so every machine phonemizes alike), else the system's libespeak-ng."""
    override = os.environ.get("ONNX_TTS_ESPEAK_LIBRARY")
    if override:
        return override, os.environ.get("ONNX_TTS_ESPEAK_DATA")
    try:
        import espeakng_loader
    except ImportError:
        return "libespeak-ng.so.1", None
    return str(espeakng_loader.get_library_path()), str(espeakng_loader.get_data_path())


class Phonemizer:
    """Text -> IPA phoneme string with espeak-ng (one process-wide library, used under a lock).

    Clause punctuation is kept (``,`` ``;`` ``:`` are followed by a space); the result is NFD,
    so stress marks and diacritics are separate symbols.
    """

    _lock = threading.Lock()
    _library: ctypes.CDLL | None = None

    def __init__(self, voice: str = "en-us") -> None:
        self.voice = voice
        with Phonemizer._lock:
            if Phonemizer._library is None:
                Phonemizer._library = self._open()
            self._lib = Phonemizer._library
            if self._lib.espeak_SetVoiceByName(voice.encode()) != 0:
                raise ModelError(f"espeak-ng has no voice {voice!r}")

    @staticmethod
    def _open() -> ctypes.CDLL:
        path, data = _espeak_library()
        try:
            lib = ctypes.CDLL(path)
        except OSError as error:
            raise ModelError(
                f"cannot load espeak-ng ({path}): {error}. Install it with "
                "'pip install espeakng-loader' (or apt-get install libespeak-ng1)"
            ) from None
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_TextToPhonemes.argtypes = [
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_int,
            ctypes.c_int,
        ]
        lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
        # espeak wants the directory that holds espeak-ng-data.
        root = str(Path(data).parent).encode() if data else None
        if lib.espeak_Initialize(_ESPEAK_AUDIO_SYNCHRONOUS, 0, root, 0) <= 0:
            raise ModelError(f"espeak-ng failed to initialise from {data or 'its default data'}")
        return lib

    def _clause(self, text: str) -> str:
        buffer = ctypes.create_string_buffer(text.encode("utf-8"))
        pointer = ctypes.c_void_p(ctypes.addressof(buffer))
        pieces = []
        while pointer.value:
            out = self._lib.espeak_TextToPhonemes(
                ctypes.byref(pointer), _ESPEAK_CHARS_UTF8, _ESPEAK_PHONEMES_IPA
            )
            if out:
                pieces.append(out.decode("utf-8", errors="ignore").strip())
        return " ".join(p for p in pieces if p)

    def phonemize(self, text: str) -> str:
        clauses = []
        with Phonemizer._lock:
            self._lib.espeak_SetVoiceByName(self.voice.encode())
            for words, marks in _CLAUSE.findall(text):
                phonemes = _LANGUAGE_SWITCH.sub("", self._clause(words)) if words.strip() else ""
                if phonemes or marks:
                    clauses.append(phonemes.strip() + marks[:1])
        # A space after every clause mark: ", " inside a sentence, and between sentences.
        joined = " ".join(c for c in clauses if c)
        return unicodedata.normalize("NFD", re.sub(r"\s+", " ", joined).strip())


class PhonemeTable:
    """Phoneme symbols <-> ids of a bundle (`bundle.json` "text": {"phonemes": [...]}).

    Symbol i has id i + 1: id 0 is padding (outside the sentence)."""

    def __init__(self, symbols: list[str]) -> None:
        if len(set(symbols)) != len(symbols):
            raise ModelError("bundle phoneme table has duplicate symbols")
        self.symbols = list(symbols)
        self._ids = {symbol: index + 1 for index, symbol in enumerate(symbols)}

    def __len__(self) -> int:
        return len(self.symbols)

    def encode(self, phonemes: str) -> list[int]:
        """Ids of the known symbols; symbols the model never saw are dropped."""
        return [self._ids[ch] for ch in phonemes if ch in self._ids]

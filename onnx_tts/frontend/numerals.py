"""Written numeric forms to English words: phone numbers, money, times, scientific notation,
ordinals, decades, fractions and ratios, units, ranges, years, numbers (dates in `dates`,
versions and dotted numbers in `versions`)."""

from __future__ import annotations

import re

from onnx_tts.frontend.dates import expand_dates
from onnx_tts.frontend.numbers import (
    _ONES,
    digits_to_words,
    integer_words,
    number_text_to_words,
    number_to_words,
    ordinal_to_words,
    year_to_words,
)
from onnx_tts.frontend.sentences import (
    _LOWER_WORD_NEXT,
    _SENTENCE_OPENERS,
    _ends_sentence,
    _sentence_initial,
    pad,
    rewrite,
)
from onnx_tts.frontend.versions import expand_versions

# The word before a 4-digit number that makes it a year ("in 1984") rather than a count.
_YEAR_CUES = frozenset(
    """in since by from until till through to of year the around circa after before during
    early late mid spring summer autumn fall winter""".split()
)
# Denominators read as a fraction ("3/4" three quarters); others make a ratio ("24/7").
_FRACTION_DENOMINATORS = frozenset({2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 16, 32, 64, 100})
_DECADE_CUES = "the|early|mid|late|in|their|his|her|my|our|your|mid"
_SCALE_SUFFIXES = {
    "k": "thousand",
    "m": "million",
    "mn": "million",
    "b": "billion",
    "bn": "billion",
    "t": "trillion",
    "tn": "trillion",
}
# Currency symbol -> (singular, plural, cent singular, cent plural).
_CURRENCIES = {
    "$": ("dollar", "dollars", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
    "€": ("euro", "euros", "cent", "cents"),
    "¥": ("yen", "yen", "sen", "sen"),
}
# Currency codes written before or after an amount ("5 USD", "EUR 10.50").
_CURRENCY_CODES = {
    "USD": ("US dollar", "US dollars", "cent", "cents"),
    "EUR": ("euro", "euros", "cent", "cents"),
    "GBP": ("pound", "pounds", "penny", "pence"),
    "JPY": ("yen", "yen", "sen", "sen"),
    "CAD": ("Canadian dollar", "Canadian dollars", "cent", "cents"),
    "AUD": ("Australian dollar", "Australian dollars", "cent", "cents"),
    "CHF": ("Swiss franc", "Swiss francs", "centime", "centimes"),
    "INR": ("rupee", "rupees", "paisa", "paise"),
    "CNY": ("yuan", "yuan", "fen", "fen"),
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
    "wh": ("watt hour", "watt hours"),
    "mah": ("milliamp hour", "milliamp hours"),
    "gw": ("gigawatt", "gigawatts"),
    "kv": ("kilovolt", "kilovolts"),
    "v": ("volt", "volts"),  # capital V only (see _unit): "3 v 3" is a match-up
    "w": ("watt", "watts"),  # capital W only
    "mins": ("minute", "minutes"),
    "secs": ("second", "seconds"),
    "yr": ("year", "years"),
    "yrs": ("year", "years"),
    "sq ft": ("square foot", "square feet"),
    "sq m": ("square meter", "square meters"),
    "m^2": ("square meter", "square meters"),
    "km^2": ("square kilometer", "square kilometers"),
    "cm^2": ("square centimeter", "square centimeters"),
    "mm^2": ("square millimeter", "square millimeters"),
    "ft^2": ("square foot", "square feet"),
    "mi^2": ("square mile", "square miles"),
    "m^3": ("cubic meter", "cubic meters"),
    "cm^3": ("cubic centimeter", "cubic centimeters"),
    "ft^3": ("cubic foot", "cubic feet"),
    "°c": ("degree Celsius", "degrees Celsius"),
    "°f": ("degree Fahrenheit", "degrees Fahrenheit"),
    "°": ("degree", "degrees"),
}

# A plain number: digits with valid thousands groups (1,234,567) or none, optional decimals.
# A comma not followed by exactly three digits is punctuation ("items 2,3").
_NUMBER = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?"
_CURRENCY = r"[$£€¥]"
_MONEY_RE = re.compile(
    rf"({_CURRENCY})\s?({_NUMBER})(?!\.\d)(?:\s?(thousand|million|billion|trillion)\b|"
    rf"({'|'.join(sorted(_SCALE_SUFFIXES, key=len, reverse=True))})\b)?",
    re.IGNORECASE,
)
_MONEY_AFTER_RE = re.compile(rf"(?<![\w.,])({_NUMBER})\s?({_CURRENCY})(?!\s?\d)")
_CODE = "|".join(_CURRENCY_CODES)
_CODE_AFTER_RE = re.compile(rf"(?<![\w.,])({_NUMBER})\s?({_CODE})\b")
_CODE_BEFORE_RE = re.compile(rf"\b({_CODE})\s?({_NUMBER})(?![\d.,]\d|\w)")
# A power: "x^2" x squared, "2^10" two to the power of ten (after units: "m^2").
_POWER_RE = re.compile(r"(?<=\w)\^(\d{1,3})(?!\d)")
_CENTS_RE = re.compile(rf"(?<![\w.,])({_NUMBER})\s?¢")
_NEGATIVE_MONEY_RE = re.compile(rf"(?<![\w.,])-(?={_CURRENCY}\d)")
# A meridiem after a time or an hour: "3:30 pm", "3 p.m.", "10AM". The period of "p.m." is
# group "dot", kept when it also ends the sentence.
_MERIDIEM = r"(?:\s?(?P<meridiem>[ap])\.?m\b(?P<dot>\.)?)"
_TIME_RE = re.compile(
    rf"(?<![\d:])(?P<hours>[01]?\d|2[0-3]):(?P<minutes>[0-5]\d)(?![\d:]){_MERIDIEM}?",
    re.IGNORECASE,
)
# "1:2 ratio", "16:9", "3:1": two numbers with a colon that are no time of day are a ratio,
# "one to two"; so is a time-shaped pair before or after a word that names a ratio ("a 2:30
# mix"). After a name ("Genesis 1:1") they are a reference, read as two numbers.
_RATIO_RE = re.compile(r"(?<![\w.:,])(\d{1,4}):(\d{1,4})(?![\w:]|[.,]\d)")
_RATIO_CUE_RE = re.compile(
    r"^\W*(?:\w+\W+){0,2}?(?:ratio|ratios|aspect|odds|scale|mix|mixture|split|contrast)\b",
    re.IGNORECASE,
)
_RATIO_CUE_BEFORE_RE = re.compile(r"\b(?:ratio|odds|scale|mix|mixture|split)\s+(?:of\s+)?$", re.I)
_NAME_BEFORE_RE = re.compile(r"\b([A-Z][a-z]+)\s+$")
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
_RANGE_RE = re.compile(r"(?<![\w.\-/])(\d{1,4})-(\d{1,4})(?![\w\-/]|[.,]\d)")
_SCIENTIFIC_RE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)[eE]([+-]?\d{1,4})(?![\w.])")
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
# So is a code: "zip code 90210", "PIN 1234", "extension 204".
_DIALED_RE = re.compile(
    r"\b((?:dial|call|phone|fax|text|zip(?: code)?|postcode|postal code|pin|extension|ext\.?)"
    r"\s+)(\d{3,})\b(?![.,]\d)",
    re.IGNORECASE,
)
_MIXED_FRACTION_RE = re.compile(r"(?<![\w./])(\d+)\s(\d{1,2})/(\d{1,3})(?![\w/]|[.,]\d)")
_SLASH_RE = re.compile(r"(?<![\w./])(\d{1,3})/(\d{1,3})(?![\w/]|[.,]\d)")
_NUMBER_RE = re.compile(rf"(?<!\d){_NUMBER}")
# "$5/month", "$5.99/mo", "20 km/day": a slash before a unit of time or count is "per", and
# the unit is said whole ("/yr" per year, "/hr" per hour).
_PER_UNITS = {
    "second": "second",
    "sec": "second",
    "s": "second",
    "minute": "minute",
    "min": "minute",
    "hour": "hour",
    "hr": "hour",
    "h": "hour",
    "day": "day",
    "night": "night",
    "week": "week",
    "wk": "week",
    "month": "month",
    "mo": "month",
    "mth": "month",
    "year": "year",
    "yr": "year",
    "person": "person",
    "head": "head",
    "unit": "unit",
    "item": "item",
    "user": "user",
    "seat": "seat",
    "kg": "kilogram",
    "lb": "pound",
    "oz": "ounce",
    "gallon": "gallon",
    "gal": "gallon",
    "liter": "liter",
    "litre": "litre",
    "mile": "mile",
    "km": "kilometer",
}
_PER_RE = re.compile(
    r"(?<=\w)\s?/\s?(" + "|".join(sorted(_PER_UNITS, key=len, reverse=True)) + r")\b",
    re.IGNORECASE,
)
_NEGATIVE_RE = re.compile(r"(?<![\w.,])-(?=\.?\d)")
# A decimal written without its zero: ".5" is "point five".
_LEADING_DECIMAL_RE = re.compile(r"(?<![\w.])\.(\d+)(?![\d.])")


def _is_one(number_text: str) -> bool:
    return number_text.replace(",", "") in ("1", "1.0")


def _money(match: re.Match[str]) -> str:
    symbol, amount, scale, suffix = match.group(1), match.group(2), match.group(3), match.group(4)
    return _money_words(symbol, amount, scale or _SCALE_SUFFIXES.get((suffix or "").lower()))


def _money_after(match: re.Match[str]) -> str:
    return _money_words(match.group(2), match.group(1), None)


def _money_words(symbol: str, amount: str, scale: str | None) -> str:
    unit, units, cent, cents = _CURRENCIES.get(symbol) or _CURRENCY_CODES[symbol]
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
    words = f"{integer_words(whole)} {unit if int(whole) == 1 else units}"
    return f"{words} and {cents_words}" if cents_words else words


def _power(match: re.Match[str]) -> str:
    exponent = int(match.group(1))
    return {2: "squared", 3: "cubed"}.get(
        exponent
    ) or f"to the power of {number_to_words(exponent)}"


def _cents(match: re.Match[str]) -> str:
    amount = match.group(1)
    return f"{number_text_to_words(amount)} {'cent' if _is_one(amount) else 'cents'}"


def clock_words(hours: int, minutes: int, meridiem: str | None = None) -> str:
    """A time of day as spoken: (15, 45) fifteen forty five, (9, 5, "a") nine oh five AM,
    (9, 0) nine o'clock, (15, 0) fifteen hundred."""
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


def ratio(match: re.Match[str]) -> str:
    """A match of _RATIO_RE as words (left as it is when it is a time of day)."""
    first, second = match.groups()
    text, start, end = match.string, match.start(), match.end()
    before = text[max(0, start - 40) : start]
    cued = bool(_RATIO_CUE_RE.match(text, end, end + 40) or _RATIO_CUE_BEFORE_RE.search(before))
    is_time = len(second) == 2 and int(first) <= 23 and int(second) <= 59
    if is_time and not cued:
        return match.group(0)  # a time of day (_TIME_RE)
    name = _NAME_BEFORE_RE.search(before)
    if not cued and name and name.group(1).lower() not in _SENTENCE_OPENERS:
        return pad(f"{integer_words(first)} {integer_words(second)}")
    return pad(f"{integer_words(first)} to {integer_words(second)}")


def _time(match: re.Match[str]) -> str:
    minutes = match.groupdict().get("minutes")
    words = clock_words(int(match["hours"]), int(minutes or 0), match["meridiem"])
    # "at 5 p.m. We left": the period of "p.m." ends the sentence too.
    return words + "." if match["dot"] and _ends_sentence(match.string, match.end()) else words


def phone_words(number: str) -> str:
    """A phone number read digit by digit in its groups, a comma (a short pause) between
    groups: "+1 555-1234" -> "plus one, five five five, one two three four"."""
    groups = [digits_to_words(group) for group in re.findall(r"\d+", number)]
    return ("plus " if number.lstrip().startswith("+") else "") + ", ".join(groups)


def _phone(match: re.Match[str]) -> str:
    return phone_words(match.group(0))


def _range(match: re.Match[str]) -> str:
    """ "10-20" -> "ten to twenty", "1990-1995" -> years; also scores ("3-2", three to two)."""
    low, high = match.groups()
    if all(_YEAR_RE.fullmatch(side) for side in (low, high)):
        return f"{year_to_words(int(low))} to {year_to_words(int(high))}"
    return f"{integer_words(low)} to {integer_words(high)}"


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


def _ordinal(match: re.Match[str]) -> str:
    return ordinal_to_words(int(match.group(1)))


def _unit(match: re.Match[str]) -> str:
    amount, unit = match.group(1), match.group(2)
    if len(unit) == 1 and (unit.isupper() != (unit.lower() in "vw")):
        # "5G", "3M", "2H": g, m, s, h are lower case; "12V", "60W" upper case ("3 v 3")
        return match.group(0)
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
    return f"{integer_words(match.group(1))} {integer_words(match.group(2))}"


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


def expand_numbers(text: str) -> str:
    """Phone numbers, dates, money, scientific notation, dotted versions/IPs, ordinals,
    decades, fractions and ratios, units, ranges, years, then plain numbers, as English words
    (in that order: the specific forms first). Times are read by expand_abbreviations."""
    text = rewrite(_PHONE_RE, _phone, text)
    # Versions and dotted numbers before money, units and plain numbers, which would read
    # "2.0" of "2.0.1" as a decimal and leave ".1" behind as a sentence end.
    text = expand_versions(text)
    text = expand_dates(text)
    text = _NEGATIVE_MONEY_RE.sub("minus ", text)
    text = rewrite(_MONEY_RE, _money, text)
    text = rewrite(_MONEY_AFTER_RE, _money_after, text)
    text = rewrite(_CODE_AFTER_RE, _money_after, text)
    text = rewrite(_CODE_BEFORE_RE, lambda m: _money_words(m.group(1), m.group(2), None), text)
    text = rewrite(_CENTS_RE, _cents, text)
    text = rewrite(_TIME_RE, _time, text)
    text = rewrite(_SCIENTIFIC_RE, _scientific, text)
    text = rewrite(_ORDINAL_RE, _ordinal, text)
    text = rewrite(_DECADE_RE, _decade, text)  # before units: "1990s" is not 1990 seconds
    text = rewrite(_SHORT_DECADE_RE, _short_decade, text)
    text = rewrite(_MIXED_FRACTION_RE, _mixed_fraction, text)
    text = rewrite(_SLASH_RE, _slash, text)
    text = _NEGATIVE_RE.sub("minus ", text)
    text = rewrite(_LEADING_DECIMAL_RE, lambda m: f"point {digits_to_words(m.group(1))}", text)
    text = rewrite(_UNIT_RE, _unit, text)
    text = rewrite(_POWER_RE, _power, text)
    text = rewrite(_RANGE_RE, _range, text)
    text = _DIALED_RE.sub(lambda m: m.group(1) + digits_to_words(m.group(2)), text)
    text = rewrite(_YEAR_RE, _year, text)
    text = _PER_RE.sub(lambda m: pad(f"per {_PER_UNITS[m.group(1).lower()]}"), text)
    return rewrite(_NUMBER_RE, lambda m: number_text_to_words(m.group(0)), text)

"""Numbers as English words: cardinals, ordinals, years, digit by digit."""

from __future__ import annotations

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


def integer_words(digits: str) -> str:
    """An integer string as words; long runs and leading zeros are read digit by digit."""
    if len(digits) > MAX_CARDINAL_DIGITS or (len(digits) > 1 and digits.startswith("0")):
        return digits_to_words(digits)
    return number_to_words(int(digits))


def number_text_to_words(text: str) -> str:
    """A number as written ("1,234.5", "42", "007") to words."""
    whole, _, fraction = text.replace(",", "").partition(".")
    words = integer_words(whole)
    if fraction:
        words += " point " + digits_to_words(fraction)
    return words

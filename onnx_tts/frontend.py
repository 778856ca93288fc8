"""Text frontend: normalisation, sentence splitting for long input, tokenization, and
phonemization (espeak-ng) for bundles that speak phonemes."""

from __future__ import annotations

import ctypes
import os
import re
import threading
import unicodedata
import warnings
from collections.abc import Callable
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

_ABBREVIATIONS = {
    "mr.": "mister",
    "mrs.": "missus",
    "ms.": "miss",
    "dr.": "doctor",
    "st.": "saint",
    "jr.": "junior",
    "sr.": "senior",
    "vs.": "versus",
    "etc.": "et cetera",
    "e.g.": "for example",
    "i.e.": "that is",
}
_SYMBOLS = {"&": " and ", "%": " percent", "+": " plus ", "=": " equals ", "@": " at "}
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
    "h": ("hour", "hours"),
    "hz": ("hertz", "hertz"),
    "khz": ("kilohertz", "kilohertz"),
    "mhz": ("megahertz", "megahertz"),
    "ghz": ("gigahertz", "gigahertz"),
    "kb": ("kilobyte", "kilobytes"),
    "mb": ("megabyte", "megabytes"),
    "gb": ("gigabyte", "gigabytes"),
    "tb": ("terabyte", "terabytes"),
    "°c": ("degree Celsius", "degrees Celsius"),
    "°f": ("degree Fahrenheit", "degrees Fahrenheit"),
    "°": ("degree", "degrees"),
}

# A plain number: digits with valid thousands groups (1,234,567) or none, optional decimals.
# A comma not followed by exactly three digits is punctuation ("items 2,3").
_NUMBER = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?"
_MONEY_RE = re.compile(
    rf"([$£€¥])\s?({_NUMBER})(?:\s?(thousand|million|billion|trillion)\b)?", re.IGNORECASE
)
_TIME_RE = re.compile(r"(?<![\d:])([01]?\d|2[0-3]):([0-5]\d)(?![\d:])(?:\s?([ap])\.?m\b\.?)?", re.I)
_SCIENTIFIC_RE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)[eE]([+-]?\d{1,4})(?![\w.])")
_DOTTED_RE = re.compile(r"(?<![\w.])\d+(?:\.\d+){2,}(?![\w]|\.\d)")
_ORDINAL_RE = re.compile(r"(?<![\w.,])(\d{1,9})(st|nd|rd|th)\b", re.IGNORECASE)
_UNIT_RE = re.compile(
    rf"(?<![\w.,])({_NUMBER})\s?("
    + "|".join(re.escape(u) for u in sorted(_UNITS, key=len, reverse=True))
    + r")(?![\w/])",
    re.IGNORECASE,
)
_DECADE_RE = re.compile(r"(?<![\w.,$])(1[1-9]\d0|20\d0)'?s\b")
_YEAR_RE = re.compile(r"(?<![\w.,$£€¥])(1[1-9]\d\d|20\d\d)(?![\w]|[.,]\d)")
_FRACTION_RE = re.compile(r"(?<![\w./])(\d{1,2})/([2-9]|10)(?![\w/]|[.,]\d)")
_NUMBER_RE = re.compile(rf"(?<!\d){_NUMBER}")
_NEGATIVE_RE = re.compile(r"(?<![\w.,])-(?=\d)")
# Characters the English frontend speaks; other letters (CJK, Arabic, Hebrew, ...) and emoji
# would be read by espeak as "Chinese letter" or dropped by a tokenizer without a word.
_SPEAKABLE_SYMBOLS = frozenset("$£€¥°%&+=@#*/\\<>|~^_`'\"()[]{}")


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
        return f"{number_to_words(head)} hundred"
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
    symbol, amount, scale = match.group(1), match.group(2), match.group(3)
    unit, units, cent, cents = _CURRENCIES[symbol]
    if scale:  # "$1.5 million" -> "one point five million dollars"
        return f"{number_text_to_words(amount)} {scale.lower()} {units}"
    whole, _, fraction = amount.replace(",", "").partition(".")
    words = f"{_integer_words(whole)} {unit if whole == '1' else units}"
    if len(fraction) == 2 and int(fraction):
        words += f" and {number_to_words(int(fraction))} {cent if fraction == '01' else cents}"
    elif fraction and int(fraction):
        words = f"{number_text_to_words(amount)} {units}"
    return words


def _time(match: re.Match[str]) -> str:
    hours, minutes, meridiem = int(match.group(1)), int(match.group(2)), match.group(3)
    if minutes == 0:
        words = number_to_words(hours) if meridiem else f"{number_to_words(hours)} o'clock"
    elif minutes < 10:
        words = f"{number_to_words(hours)} oh {_ONES[minutes]}"
    else:
        words = f"{number_to_words(hours)} {number_to_words(minutes)}"
    if meridiem:
        words += f" {meridiem.upper()} M"
    return words


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


def _fraction(match: re.Match[str]) -> str:
    numerator, denominator = int(match.group(1)), int(match.group(2))
    name = {2: "half", 4: "quarter"}.get(denominator) or ordinal_to_words(denominator)
    if numerator != 1:
        name = "halves" if name == "half" else name + "s"
    return f"{number_to_words(numerator)} {name}"


def _decade(match: re.Match[str]) -> str:
    words = year_to_words(int(match.group(1))).split(" ")
    last = words[-1]
    words[-1] = last[:-1] + "ies" if last.endswith("y") else last + "s"
    return " ".join(words)


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
    """Money, times, scientific notation, dotted versions/IPs, ordinals, units, years, then
    plain numbers, as English words (in that order: the specific forms first)."""
    text = _rewrite(_MONEY_RE, _money, text)
    text = _rewrite(_TIME_RE, _time, text)
    text = _rewrite(_SCIENTIFIC_RE, _scientific, text)
    text = _rewrite(_DOTTED_RE, _dotted, text)
    text = _rewrite(_ORDINAL_RE, _ordinal, text)
    text = _rewrite(_DECADE_RE, _decade, text)  # before units: "1990s" is not 1990 seconds
    text = _rewrite(_FRACTION_RE, _fraction, text)
    text = _rewrite(_UNIT_RE, _unit, text)
    text = _rewrite(_YEAR_RE, lambda m: year_to_words(int(m.group(1))), text)
    text = _NEGATIVE_RE.sub("minus ", text)
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
    for abbreviation, expansion in _ABBREVIATIONS.items():
        text = re.sub(rf"(?i)(?<!\w){re.escape(abbreviation)}", expansion, text)
    text = expand_numbers(text)
    for symbol, word in _SYMBOLS.items():
        text = text.replace(symbol, word)
    text = re.sub(r"\s+", " ", text).strip()
    # A space before punctuation comes from a replacement above, never from the writer.
    return re.sub(r" (?=[,.;:!?])", "", text)


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

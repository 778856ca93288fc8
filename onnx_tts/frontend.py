"""Text frontend: normalisation, sentence splitting for long input, tokenization."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

from tokenizers import Tokenizer

from onnx_tts.errors import InputError, ModelError

_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen"
).split()
_TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_SCALES = [(10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (1000, "thousand")]

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
    }
)


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


def _expand_number(match: re.Match[str]) -> str:
    text = match.group(0).replace(",", "")
    if "." in text:
        whole, frac = text.split(".", 1)
        return f"{number_to_words(int(whole))} point " + " ".join(_ONES[int(d)] for d in frac)
    value = int(text)
    if value >= 10**15:
        return " ".join(_ONES[int(d)] for d in text)
    return number_to_words(value)


def normalize_text(text: str) -> str:
    """Unicode, punctuation, abbreviation, symbol and number normalisation for English."""
    text = unicodedata.normalize("NFKC", text).translate(_QUOTES)
    text = "".join(ch if unicodedata.category(ch)[0] != "C" else " " for ch in text)
    for abbreviation, expansion in _ABBREVIATIONS.items():
        text = re.sub(rf"(?i)(?<!\w){re.escape(abbreviation)}", expansion, text)
    for symbol, word in _SYMBOLS.items():
        text = text.replace(symbol, word)
    text = re.sub(r"\d[\d,]*(?:\.\d+)?", _expand_number, text)
    return re.sub(r"\s+", " ", text).strip()


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
    """Reject text that cannot be spoken: undecodable bytes, empty or whitespace-only."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as error:
            raise InputError(
                f"text is not valid UTF-8 (byte {error.start}); save it as UTF-8"
            ) from None
    if not isinstance(text, str):
        raise InputError(f"text must be a string, got {type(text).__name__}")
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

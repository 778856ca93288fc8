"""Text frontend: normalisation, sentence splitting for long input, tokenization, and
phonemization (espeak-ng) for bundles that speak phonemes."""

from __future__ import annotations

import ctypes
import os
import re
import threading
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

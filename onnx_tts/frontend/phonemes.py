"""Phonemization with espeak-ng, and a bundle's phoneme symbol table."""

from __future__ import annotations

import ctypes
import os
import re
import threading
import unicodedata
import warnings
from dataclasses import dataclass
from pathlib import Path

from onnx_tts.errors import InputError, ModelError, UnspeakableTextWarning, shown
from onnx_tts.frontend.clause_marks import clause_end
from onnx_tts.frontend.word_phonemes import is_sound

# Clause punctuation is kept in the phoneme string: it tells the model where to pause and how
# to intone. A comma-like mark is followed by a space, as a word boundary.
_CLAUSE = re.compile(r"([^,.;:!?]+)([,.;:!?]*)")
_LANGUAGE_SWITCH = re.compile(r"\([^)]*\)")  # "(en)" ... "(fr)" around foreign words
# Letters espeak may read as a word, phonemized letter by letter as espeak names them: a run
# that holds the letter A ("Q-and-A session" was "Q and uh session"), and the "AM" of a time
# after a number word ("ten AM." was "ten am").
_SPELLED = re.compile(
    r"(?<![\w'-])((?=[\w-]*\bA\b)[A-Za-z]+(?:-[A-Za-z]+)+|(?<=[a-z] )AM)(?![\w'-])"
)
_ESPEAK_CHARS_UTF8 = 1
_ESPEAK_CHARS_AUTO = 0
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
        # espeak-ng >= 1.52 also says how each clause ended (its punctuation, and whether it
        # ends a sentence); without it, `clause_end` reads that from the text consumed.
        terminated = getattr(lib, "espeak_TextToPhonemesWithTerminator", None)
        if terminated is not None:
            terminated.argtypes = [
                ctypes.POINTER(ctypes.c_void_p),
                ctypes.c_int,
                ctypes.c_int,
                ctypes.POINTER(ctypes.c_int),
            ]
            terminated.restype = ctypes.c_char_p
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

    def _words(self, words: str) -> str:
        pieces = []
        for index, piece in enumerate(_SPELLED.split(words)):
            if index % 2:  # letters to name one by one
                parts = piece.split("-") if "-" in piece else list(piece)
                pieces.append("".join(self._clause(part) for part in parts))
            elif piece.strip():
                pieces.append(self._clause(piece))
        return " ".join(piece for piece in pieces if piece)

    def phonemize(self, text: str) -> str:
        clauses = []
        with Phonemizer._lock:
            self._lib.espeak_SetVoiceByName(self.voice.encode())
            for words, marks in _CLAUSE.findall(text):
                phonemes = _LANGUAGE_SWITCH.sub("", self._words(words)) if words.strip() else ""
                if phonemes or marks:
                    clauses.append(phonemes.strip() + marks[:1])
        # A space after every clause mark: ", " inside a sentence, and between sentences.
        joined = " ".join(c for c in clauses if c)
        return unicodedata.normalize("NFD", re.sub(r"\s+", " ", joined).strip())

    def clauses(self, text: str) -> list[Clause]:
        """`text` as espeak-ng reads it, clause by clause: each clause's IPA (as espeak gives
        it: no punctuation, language-switch flags kept), the punctuation that ended it and
        whether it ends a sentence (espeak's own clause and sentence rules)."""
        encoded = text.encode("utf-8")
        buffer = ctypes.create_string_buffer(encoded)
        base = ctypes.addressof(buffer)
        pointer = ctypes.c_void_p(base)
        terminated = getattr(self._lib, "espeak_TextToPhonemesWithTerminator", None)
        flags = ctypes.c_int(0)
        clauses: list[Clause] = []
        with Phonemizer._lock:
            self._lib.espeak_SetVoiceByName(self.voice.encode())
            while pointer.value:
                start = pointer.value - base
                if terminated is not None:
                    out = terminated(
                        ctypes.byref(pointer),
                        _ESPEAK_CHARS_AUTO,
                        _ESPEAK_PHONEMES_IPA,
                        ctypes.byref(flags),
                    )
                else:
                    out = self._lib.espeak_TextToPhonemes(
                        ctypes.byref(pointer), _ESPEAK_CHARS_AUTO, _ESPEAK_PHONEMES_IPA
                    )
                end = pointer.value - base if pointer.value else len(encoded)
                phonemes = out.decode("utf-8", errors="ignore") if out else ""
                if terminated is not None:
                    mark, sentence = clause_end(flags.value)
                else:
                    consumed = encoded[start:end].decode("utf-8", errors="ignore")
                    mark, sentence = clause_end(None, consumed, last=not pointer.value)
                clauses.append(Clause(phonemes, mark, sentence))
        return clauses


@dataclass(frozen=True)
class Clause:
    """One clause as espeak-ng read it (`Phonemizer.clauses`)."""

    phonemes: str
    terminator: str  # "." "?" "!" "," ":" ";" or "" (none espeak names so)
    ends_sentence: bool


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

    def encode_given(self, ipa: str) -> list[int]:
        """Ids of phonemes a writer gave (``[[ ]]``, ``<phoneme ph>``), NFD as espeak-ng
        writes them. InputError naming the symbols when none of them is a sound this model
        knows ("[[ 1 2 3 ]]" would be spoken as silence, without a word); symbols it does not
        know beside known sounds are dropped with an UnspeakableTextWarning naming them."""
        phonemes = unicodedata.normalize("NFD", ipa)
        unknown = list(dict.fromkeys(ch for ch in phonemes if ch not in self._ids and ch != " "))
        listed = " ".join(unknown[:12]) + (" ..." if len(unknown) > 12 else "")
        if not any(is_sound(ch) and ch in self._ids for ch in phonemes):
            verb = "is" if len(unknown) == 1 else "are"
            detail = f" ({listed} {verb} not among its phonemes)" if unknown else ""
            raise InputError(
                f"phonemes {shown(ipa)} hold no sound this model knows{detail}; write IPA as "
                "espeak-ng does, such as [[ h ə l ˈoʊ ]]"
            )
        if unknown:
            warnings.warn(
                UnspeakableTextWarning(
                    f"phonemes {shown(ipa)}: dropped {listed}, not among this model's phonemes",
                    dropped={"phonemes": unknown},
                ),
                stacklevel=3,
            )
        return self.encode(phonemes)

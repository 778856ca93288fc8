"""Chatterbox text preparation, following the published pipelines (read in resemble-ai/chatterbox
and the ONNX model cards; rules re-stated here, not copied): the punctuation clean-up of each
model's `punc_norm` (replacements, a capital first letter, an end mark), the multilingual
tokenizer's lowercase + NFKD normalisation, Japanese kanji -> hiragana (pykakasi) and the
Chinese Cangjie mapping.

The `--published-loop` mode of the ONNX model cards applies none of the punctuation rules (their
scripts hand the text to the tokenizer as it is); the language steps apply in both modes.
"""

from __future__ import annotations

import json
import re
import threading
import unicodedata
from pathlib import Path
from typing import Any

from onnx_tts.errors import ModelError
from onnx_tts.families.chatterbox.layout import FAMILY_MULTILINGUAL, FAMILY_TURBO

_CURLY_QUOTES = (("\u201c", '"'), ("\u201d", '"'), ("\u2018", "'"), ("\u2019", "'"))
# Each model's punctuation replacements, applied in this order (the order matters: the original
# and multilingual models turn " - " into ", " before an em dash becomes "-").
_TURBO_REPLACEMENTS = (
    ("\u2026", ", "),
    (":", ","),
    ("\u2014", "-"),
    ("\u2013", "-"),
    (" ,", ","),
    *_CURLY_QUOTES,
)
_LLAMA_REPLACEMENTS = (
    ("...", ", "),
    ("\u2026", ", "),
    (":", ","),
    (" - ", ", "),
    (";", ", "),
    ("\u2014", "-"),
    ("\u2013", "-"),
    (" ,", ","),
    *_CURLY_QUOTES,
)
# A sentence that ends in none of these gets a period (";" too: our sentence splitter cuts
# there, and Turbo keeps its semicolons).
_SENTENCE_ENDS = (".", "!", "?", "-", ",", ";")
_CJK_SENTENCE_ENDS = ("\u3001", "\uff0c", "\u3002", "\uff1f", "\uff01")
# A colon between digits ("3:30") is left for the English number reader, which says the time.
_COLON_NOT_IN_NUMBER = re.compile(r"(?<!\d):|:(?!\d)")


def replace_punctuation(text: str, family: str, keep_number_colons: bool = False) -> str:
    """Runs of whitespace to one space, then the family's punctuation replacements (ellipsis,
    colon, semicolon, spaced hyphen, dashes, curly quotes), as its `punc_norm` does.
    `keep_number_colons`: leave "3:30" to the English frontend (it reads times)."""
    text = " ".join(text.split())
    rules = _TURBO_REPLACEMENTS if family == FAMILY_TURBO else _LLAMA_REPLACEMENTS
    for old, new in rules:
        if old == ":" and keep_number_colons:
            text = _COLON_NOT_IN_NUMBER.sub(new, text)
        else:
            text = text.replace(old, new)
    return text


def punctuate(sentence: str, family: str) -> str:
    """A capital first letter and an end mark (a period unless the sentence already ends in
    one of the family's marks), as `punc_norm` finishes a text."""
    sentence = sentence.strip()
    if not sentence:
        return sentence
    if sentence[0].islower():
        sentence = sentence[0].upper() + sentence[1:]
    ends = _SENTENCE_ENDS + (_CJK_SENTENCE_ENDS if family == FAMILY_MULTILINGUAL else ())
    if not sentence.endswith(ends):
        sentence += "."
    return sentence


def multilingual_normalize(sentence: str) -> str:
    """What the multilingual tokenizer does first: lowercase, then NFKD (which also splits
    Hangul syllables into the conjoining jamo its vocabulary holds)."""
    return unicodedata.normalize("NFKD", sentence.lower())


class _Kakasi:
    """One pykakasi converter per process, made on first use (about 1 s to load its
    dictionaries) and used under a lock."""

    _lock = threading.Lock()
    _converter: Any = None

    @classmethod
    def convert(cls, text: str) -> list[dict[str, str]]:
        with cls._lock:
            if cls._converter is None:
                try:
                    import pykakasi
                except ImportError:
                    raise ModelError(
                        "Japanese text needs pykakasi (kanji -> hiragana, as the model was "
                        "trained): pip install pykakasi"
                    ) from None
                cls._converter = pykakasi.kakasi()
            return cls._converter.convert(text)


def _is_kanji(char: str) -> bool:
    return "\u4e00" <= char <= "\u9fff"  # CJK Unified Ideographs


def hiragana(text: str) -> str:
    """Japanese text as the multilingual model reads it: every phrase with a kanji becomes its
    hiragana reading (pykakasi), a reading that starts with the particle-like は or へ gets a
    space before it, kana and everything else stay; the result is NFKD.

    Run on the text as written (before the tokenizer's lowercase + NFKD), as the published
    ONNX script does: NFKD first would split voiced kana (ぶ -> ふ + ゛) and spoil the
    dictionary readings (学ぶ -> "がく" + "ふ゛" instead of "まなぶ")."""
    out = []
    for item in _Kakasi.convert(text):
        original, reading = item["orig"], item["hira"]
        if any(_is_kanji(char) for char in original):
            out.append(" " + reading if reading[:1] in ("\u306f", "\u3078") else reading)
        else:
            out.append(original)
    return unicodedata.normalize("NFKD", "".join(out))


class CangjieConverter:
    """Chinese characters -> ``[cj_x]...[cj_.]`` token strings, as the multilingual model was
    trained (mapping file ``Cangjie5_TC.json`` from the repository: "glyph\\tcode" entries).
    Word segmentation (pkuseg in the reference script) is not applied."""

    def __init__(self, path: Path) -> None:
        try:
            entries = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ModelError(f"cannot read the Cangjie mapping {path}: {exc}") from None
        if not isinstance(entries, list):
            raise ModelError(f"the Cangjie mapping {path} must be a JSON list")
        self.code_of: dict[str, str] = {}
        glyphs_of: dict[str, list[str]] = {}
        for entry in entries:
            parts = str(entry).split("\t")
            if len(parts) < 2:
                continue
            glyph, code = parts[:2]
            self.code_of.setdefault(glyph, code)
            glyphs_of.setdefault(code, []).append(glyph)
        self.index_of = {
            glyph: glyphs.index(glyph) for glyphs in glyphs_of.values() for glyph in glyphs
        }

    def __call__(self, text: str) -> str:
        out = []
        for char in text:
            code = self.code_of.get(char) if unicodedata.category(char) == "Lo" else None
            if code is None:
                out.append(char)
                continue
            index = self.index_of.get(char, 0)
            letters = code + (str(index) if index > 0 else "")
            out.append("".join(f"[cj_{c}]" for c in letters) + "[cj_.]")
        return "".join(out)

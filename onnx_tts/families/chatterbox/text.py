"""Chatterbox text preparation, as the published inference scripts do it: sentence
punctuation (`punc_norm`), the multilingual tokenizer's lowercase + NFKD normalisation and
language tag, and the Chinese Cangjie mapping."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

from onnx_tts.errors import ModelError

SENTENCE_ENDS = ".!?,;:-\u3002\uff01\uff1f"


def punctuate(sentence: str) -> str:
    """Capitalise the first letter and end with punctuation, as Chatterbox's punc_norm does."""
    sentence = sentence.strip()
    if not sentence:
        return sentence
    if sentence[0].islower():
        sentence = sentence[0].upper() + sentence[1:]
    if sentence[-1] not in SENTENCE_ENDS:
        sentence += "."
    return sentence


def multilingual_normalize(sentence: str) -> str:
    """What the multilingual tokenizer does first: lowercase, then NFKD (which also splits
    Hangul syllables into the conjoining jamo its vocabulary holds)."""
    return unicodedata.normalize("NFKD", sentence.lower())


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

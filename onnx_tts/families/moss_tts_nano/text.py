"""MOSS-TTS-Nano text: the SentencePiece tokenizer and the published chunking of long text.

The published runtime (OpenMOSS/MOSS-TTS-Nano `onnx_tts_runtime.py`) encodes text with
`sp.encode(text)` (no BOS/EOS) and splits it into chunks of at most 75 tokens: sentences (at
.!?。！？；;, closing quotes kept), sentences too long split at clauses (,，、；;：:), clauses too
long cut by a binary search on the token count at the last space or punctuation within 25
characters; pieces are then merged greedily up to the budget. A text that ends up as one chunk
is kept exactly as given. Between chunks it inserts 0.40 s of silence after a chunk of at most
four words, else 0.24 s. Its text normalisers (WeTextProcessing, normalize_tts_text) are
separate front ends and are not applied here.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from onnx_tts.errors import InputError, ModelError
from onnx_tts.families.base import TextFrontend

SENTENCE_END = frozenset(".!?。！？；;")
CLAUSE_END = frozenset(",，、；;：:")
CLOSING = frozenset("\"'”’)]}）】》」』")
BOUNDARIES = CLAUSE_END | SENTENCE_END | {" "}
BOUNDARY_SCAN_CHARS = 25
SHORT_CHUNK_WORDS = 4
PAUSE_AFTER_SHORT_SECONDS = 0.40
PAUSE_AFTER_LONG_SECONDS = 0.24
DEFAULT_CHUNK_TOKENS = 75
MAX_CHUNK_TOKENS = 4096


def has_cjk(text: str) -> bool:
    return any(
        "\u4e00" <= ch <= "\u9fff"
        or "\u3400" <= ch <= "\u4dbf"
        or "\u3040" <= ch <= "\u30ff"
        or "\uac00" <= ch <= "\ud7af"
        for ch in text
    )


def speakable(text: str) -> bool:
    """Whether `text` has anything to say: a letter or a digit in any script."""
    return any(unicodedata.category(ch)[0] in "LN" for ch in text)


def pause_seconds(chunk: str) -> float:
    """Silence after `chunk` when another chunk follows (as published)."""
    return (
        PAUSE_AFTER_SHORT_SECONDS
        if len(chunk.split()) <= SHORT_CHUNK_WORDS
        else (PAUSE_AFTER_LONG_SECONDS)
    )


def _prepared(text: str) -> str:
    """The text as the chunker sees it: one line, single spaces, final punctuation, and (for
    short non-CJK text) the published eight-space lead."""
    text = text.strip().replace("\r", " ").replace("\n", " ")
    while "  " in text:
        text = text.replace("  ", " ")
    if has_cjk(text):
        return text if text[-1] in SENTENCE_END else text + "。"
    if text[:1].islower():
        text = text[0].upper() + text[1:]
    if text[-1].isalnum():
        text += "."
    if len(text.split()) < 5:
        text = " " * 8 + text
    return text


def split_at(text: str, marks: frozenset[str]) -> list[str]:
    """Pieces of `text` ending at each mark (closing quotes/brackets after it stay with it)."""
    pieces: list[str] = []
    start = index = 0
    while index < len(text):
        if text[index] in marks:
            end = index + 1
            while end < len(text) and text[end] in CLOSING:
                end += 1
            if piece := text[start:end].strip():
                pieces.append(piece)
            while end < len(text) and text[end].isspace():
                end += 1
            start = index = end
            continue
        index += 1
    if tail := text[start:].strip():
        pieces.append(tail)
    return pieces


def _joined(left: str, right: str) -> str:
    if not left or not right:
        return left or right
    return left + right if has_cjk(left) or has_cjk(right) else f"{left} {right}"


class MossText(TextFrontend):
    """The model's tokenizer and chunker. `vocab`: the model's text vocabulary; a tokenizer
    with more pieces could give ids the model's embedding has no row for."""

    def __init__(self, tokenizer_path: Path, vocab: int | None = None) -> None:
        import sentencepiece

        try:
            self.sp = sentencepiece.SentencePieceProcessor(model_file=str(tokenizer_path))
        except (OSError, RuntimeError) as error:
            raise ModelError(
                f"{tokenizer_path} is not a SentencePiece model ({error}); download it again"
            ) from None
        self.vocab_size = int(self.sp.get_piece_size())
        if vocab is not None and self.vocab_size > vocab:
            raise ModelError(
                f"{tokenizer_path} has {self.vocab_size} pieces but the model's vocabulary "
                f"(vocab_size in the TTS meta) has {vocab}: its ids would index past the "
                "model's embedding; use the tokenizer.model published with these graphs"
            )

    def chunks(self, text: str, options: Mapping[str, Any]) -> list[str]:
        return self.split(text, options.get("voice_clone_max_text_tokens", DEFAULT_CHUNK_TOKENS))

    def sentence_chunks(self, text: str, options: Mapping[str, Any]) -> list[str]:
        """The published chunking without its merging: one chunk per sentence (a sentence
        over the token budget still cut as published), so a silence asked for between
        sentences falls between them."""
        budget = options.get("voice_clone_max_text_tokens", DEFAULT_CHUNK_TOKENS)
        return self.split(text, budget, merge=False)

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.sp.encode(text, out_type=int)]

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def split(self, text: str, budget: int = DEFAULT_CHUNK_TOKENS, merge: bool = True) -> list[str]:
        """The published chunks of `text` (InputError for text with nothing to speak);
        `merge=False`: its pieces (sentences, or parts of a long one) are not joined."""
        text = text.strip()
        if not speakable(text):
            raise InputError(
                "text has nothing speakable (no letter or digit); give some words to speak"
            )
        budget = max(1, int(budget))
        pieces: list[tuple[int, str]] = []
        prepared = _prepared(text)
        for sentence in split_at(prepared, SENTENCE_END) or [prepared.strip()]:
            pieces += self._fitted(sentence, budget)
        chunks: list[str] = []
        current, tokens = "", 0
        if not merge:
            chunks = [piece.strip() for _, piece in pieces if piece.strip()]
            return chunks if len(chunks) > 1 else [text]
        for count, piece in pieces:
            if not current:
                current, tokens = piece, count
            elif tokens + count > budget:
                chunks.append(current.strip())
                current, tokens = piece, count
            else:
                current = _joined(current, piece)
                tokens = self.count(current)
        if current:
            chunks.append(current.strip())
        return chunks if len(chunks) > 1 else [text]

    def _fitted(self, sentence: str, budget: int) -> list[tuple[int, str]]:
        """(tokens, piece) of a sentence, split at clauses and then by budget to fit."""
        sentence = sentence.strip()
        if not sentence:
            return []
        if (count := self.count(sentence)) <= budget:
            return [(count, sentence)]
        clauses = split_at(sentence, CLAUSE_END)
        out: list[tuple[int, str]] = []
        for clause in clauses if len(clauses) > 1 else [sentence]:
            clause = clause.strip()
            if not clause:
                continue
            if (count := self.count(clause)) <= budget:
                out.append((count, clause))
                continue
            for piece in self._cut(clause, budget):
                if piece := piece.strip():
                    out.append((self.count(piece), piece))
        return out

    def _cut(self, text: str, budget: int) -> list[str]:
        """Cut `text` into pieces of at most `budget` tokens, preferring a boundary character
        within the last 25 characters of the longest prefix that fits."""
        pieces: list[str] = []
        rest = text.strip()
        while rest:
            if self.count(rest) <= budget:
                pieces.append(rest)
                break
            low, high, fits = 1, len(rest), 1
            while low <= high:
                middle = (low + high) // 2
                candidate = rest[:middle].strip()
                if candidate and self.count(candidate) > budget:
                    high = middle - 1
                else:
                    if candidate:
                        fits = middle
                    low = middle + 1
            cut = fits
            prefix = rest[:fits]
            for index in range(len(prefix) - 1, max(-1, len(prefix) - BOUNDARY_SCAN_CHARS), -1):
                if prefix[index] in BOUNDARIES:
                    cut = index + 1
                    break
            piece = rest[:cut].strip()
            if not piece:
                piece, cut = rest[:fits].strip(), fits
            pieces.append(piece)
            rest = rest[cut:].strip()
        return pieces


__all__ = ["DEFAULT_CHUNK_TOKENS", "MossText", "pause_seconds", "speakable", "split_at"]

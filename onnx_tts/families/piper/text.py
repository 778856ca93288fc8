"""A Piper voice's text, read as piper-tts reads it: espeak-ng in the voice's espeak voice,
clause by clause; a clause's punctuation kept as a phoneme ("," ":" ";" followed by a space),
language-switch flags dropped, everything NFD so that stress marks and diacritics are phonemes
of their own; a sentence ends where espeak-ng ends one; `[[ phonemes ]]` spans join the
sentence around them, one phoneme per character; ids are [^ _] + (phoneme ids + _) per phoneme
+ [$] from the voice's `phoneme_id_map`, a phoneme the voice lacks dropped (piper-tts warns).

English voices read through onnx-tts's English reader first (numbers, abbreviations, ...:
docs/TEXT.md) unless `english_reader` is off; other languages go to espeak-ng as written, as
Piper sends them. A sentence longer than MAX_SENTENCE_PHONEMES is cut at its last clause mark
(or space) before that bound: piper-tts would run it whole, with memory growing with its
square in the graph's attention.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from onnx_tts.errors import InputError
from onnx_tts.families.base import TextFrontend, WordSpan, spoken_words
from onnx_tts.families.piper.voice_config import BOS, EOS, PAD, VoiceConfig
from onnx_tts.frontend import Phonemizer, normalize_text

# Piper's inline phonemes (piper-tts: voice.py's block pattern, one line at most).
_PHONEME_BLOCK = re.compile(r"(\[\[.*?\]\])")
_LANGUAGE_SWITCH = re.compile(r"\([^)]+\)")
MAX_SENTENCE_PHONEMES = 1200  # ~100 words: a long sentence, far below what strains memory
_BREAKS = (",", ";", ":")


@dataclass(frozen=True)
class PiperChunk:
    """One sentence as the voice speaks it: its phonemes, their ids and the words it says."""

    phonemes: tuple[str, ...]
    ids: tuple[int, ...]
    text: str


class PiperText(TextFrontend):
    """The text frontend of one Piper voice (module docstring)."""

    reads_phoneme_spans = True  # [[ ]] join the sentence around them, as in piper-tts

    def __init__(self, config: VoiceConfig, english_reader: bool) -> None:
        self.config = config
        self.id_map = config.phoneme_id_map
        self.english_reader = english_reader and config.english
        self.phonemizer = (
            Phonemizer(config.espeak_voice) if config.phoneme_type == "espeak" else None
        )
        self.space_ids = set(self.id_map.get(" ", ()))

    # -- phonemes ------------------------------------------------------------------------------
    def sentences(self, text: str, reader: bool | None = None) -> list[tuple[list[str], str]]:
        """(phonemes, words) of each sentence of `text`, as piper-tts phonemizes it (with the
        English reader first where it applies: an English voice, `reader` not False)."""
        reader = self.english_reader and reader is not False
        if self.phonemizer is None:  # phoneme_type "text": the codepoints, one sentence
            return [(list(unicodedata.normalize("NFD", text)), text)]
        sentences: list[tuple[list[str], str]] = []
        parts = _PHONEME_BLOCK.split(text)
        after_block = False
        for index, part in enumerate(parts):
            if part.startswith("[["):
                if not sentences:
                    sentences.append(([], ""))
                phonemes, words = sentences[-1]
                if index > 0 and parts[index - 1].endswith(" "):
                    phonemes.append(" ")
                phonemes.extend(part[2:-2].strip())
                if index < len(parts) - 1 and parts[index + 1].startswith(" "):
                    phonemes.append(" ")
                after_block = True
                continue
            found = self._espeak_sentences(part, reader)
            if after_block and found:
                phonemes, words = sentences[-1]
                phonemes.extend(found[0][0])
                sentences[-1] = (phonemes, f"{words} {found[0][1]}".strip())
                found = found[1:]
            sentences.extend(found)
            after_block = False
        return [(phonemes, words) for phonemes, words in sentences if phonemes]

    def _espeak_sentences(self, text: str, reader: bool) -> list[tuple[list[str], str]]:
        if not text:
            return []
        if reader:
            text = normalize_text(text)
        assert self.phonemizer is not None
        sentences: list[tuple[list[str], str]] = []
        phonemes: list[str] = []
        words: list[str] = []
        for clause in self.phonemizer.clauses(text):
            spoken = _LANGUAGE_SWITCH.sub("", clause.phonemes) + clause.terminator
            if clause.terminator in _BREAKS:
                spoken += " "
            phonemes.extend(unicodedata.normalize("NFD", spoken))
            words.append(clause.phonemes)
            if clause.ends_sentence:
                sentences.append((self._clustered(phonemes), ""))
                phonemes = []
        if phonemes:
            sentences.append((self._clustered(phonemes), ""))
        return _with_words(sentences, text)

    def _clustered(self, phonemes: list[str]) -> list[str]:
        """Adjacent phonemes merged where the voice names their cluster (`vowel_clusters`)."""
        clusters = self.config.vowel_clusters
        if not clusters:
            return phonemes
        longest = max(len(c) for c in clusters)
        merged: list[str] = []
        index = 0
        while index < len(phonemes):
            for size in range(min(longest, len(phonemes) - index), 1, -1):
                if tuple(phonemes[index : index + size]) in clusters:
                    merged.append("".join(phonemes[index : index + size]))
                    index += size
                    break
            else:
                merged.append(phonemes[index])
                index += 1
        return merged

    def ids(self, phonemes: list[str]) -> list[int]:
        """Piper's phoneme ids: ^ _ then each phoneme's ids and _, then $ (phonemes the voice
        does not know are dropped)."""
        pad = self.id_map[PAD]
        ids = [*self.id_map[BOS], *pad]
        for phoneme in phonemes:
            known = self.id_map.get(phoneme)
            if known is not None:
                ids += [*known, *pad]
        return ids + list(self.id_map[EOS])

    # -- the contract --------------------------------------------------------------------------
    def chunks(self, text: str, options: Mapping[str, Any]) -> list[PiperChunk]:
        chunks = []
        for phonemes, words in self.sentences(text, options.get("english_reader")):
            for piece in _bounded(phonemes):
                ids = self.ids(piece)
                if len(ids) > 3:  # more than ^ _ $: something to say
                    chunks.append(PiperChunk(tuple(piece), tuple(ids), words))
        if not chunks:
            raise InputError(
                f"text has nothing this voice can speak (no phoneme of it is in the voice "
                f"{self.config.name}'s phoneme map)"
            )
        return chunks

    def describe(self, chunk: Any) -> str:
        return chunk.text if isinstance(chunk, PiperChunk) else ""

    def words(self, chunk: Any) -> list[WordSpan]:
        """The sentence's words on its space-separated phoneme groups (id positions: the
        durations the graph gives time them exactly); estimated when espeak grouped them
        otherwise."""
        words = spoken_words(chunk.text)
        groups: list[tuple[int, int]] = []
        start = None
        # ids: ^ _ then two ids (phoneme, _) per single-id phoneme: walk the phonemes.
        position = len(self.id_map[BOS]) + len(self.id_map[PAD])
        for phoneme in chunk.phonemes:
            known = self.id_map.get(phoneme)
            if known is None:
                continue
            width = len(known) + len(self.id_map[PAD])
            if phoneme == " ":
                if start is not None:
                    groups.append((start, position))
                start = None
            elif start is None and (phoneme.isalpha() or unicodedata.combining(phoneme)):
                start = position
            position += width
        if start is not None:
            groups.append((start, position))
        if len(groups) != len(words):
            return words
        return [
            WordSpan(word.text, first, last, word.weight)
            for word, (first, last) in zip(words, groups, strict=True)
        ]


def _bounded(phonemes: list[str]) -> list[list[str]]:
    """`phonemes` in pieces of at most MAX_SENTENCE_PHONEMES, cut after a clause mark (else a
    space) where one is near the bound."""
    pieces = []
    while len(phonemes) > MAX_SENTENCE_PHONEMES:
        window = phonemes[:MAX_SENTENCE_PHONEMES]
        cut = max((i for i, p in enumerate(window) if p in _BREAKS), default=-1) + 1
        if cut < MAX_SENTENCE_PHONEMES // 2:
            cut = max((i for i, p in enumerate(window) if p == " "), default=-1) + 1
        if cut < MAX_SENTENCE_PHONEMES // 2:
            cut = MAX_SENTENCE_PHONEMES
        pieces.append(phonemes[:cut])
        phonemes = phonemes[cut:]
    return [*pieces, phonemes]


def _with_words(sentences: list[tuple[list[str], str]], text: str) -> list[tuple[list[str], str]]:
    """Each sentence with its words from `text`: espeak-ng does not say where in the text a
    sentence ends, so the text's words are shared out by the sentences' spoken word groups
    (for captions and word timings; the phonemes are espeak-ng's)."""
    words = text.split()
    counts = [
        max(1, len([g for g in "".join(p).split(" ") if any(c.isalpha() for c in g)]))
        for p, _ in sentences
    ]
    shared: list[tuple[list[str], str]] = []
    cursor = 0
    for index, ((phonemes, _), count) in enumerate(zip(sentences, counts, strict=True)):
        last = index == len(sentences) - 1
        taken = words[cursor:] if last else words[cursor : cursor + count]
        cursor += len(taken)
        shared.append((phonemes, " ".join(taken)))
    return shared


__all__ = ["MAX_SENTENCE_PHONEMES", "PiperChunk", "PiperText"]

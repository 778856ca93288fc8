"""Text frontend: markup (SSML, [[ phonemes ]]), normalisation, sentence splitting for long
input, tokenization, and phonemization (espeak-ng) for bundles that speak phonemes.

One module per idea: `checks` (what a request may hand in, unspeakable characters),
`numbers` (number words), `numerals` (written numeric forms: money, times, units, ...),
`dates`, `versions` (versions, IP addresses, dotted numbers), `web` (URLs, e-mail, file
names), `roman` (roman numerals in context), `letters` (letters read one by one, & and /),
`measures` (multipliers, dimensions, feet and inches, signs, ranges), `abbreviations`,
`sentences` (sentence ends and splitting), `normalize` (the English pipeline); `segments`
(typed segments), `ssml` (the SSML subset), `say_as`, `markup` (SSML or [[ ]] spans);
`tokenizer`, `phonemes` and `word_phonemes` (each word's phonemes in a sentence's, for word
timings). docs/TEXT.md describes what the reader and the markup do.
"""

from __future__ import annotations

from onnx_tts.frontend.abbreviations import expand_abbreviations
from onnx_tts.frontend.checks import MAX_TEXT_CHARS, check_text, drop_unspeakable
from onnx_tts.frontend.markup import parse_markup, split_phoneme_spans
from onnx_tts.frontend.normalize import normalize_text
from onnx_tts.frontend.numbers import (
    MAX_CARDINAL_DIGITS,
    digits_to_words,
    number_text_to_words,
    number_to_words,
    ordinal_to_words,
    year_to_words,
)
from onnx_tts.frontend.numerals import expand_numbers
from onnx_tts.frontend.phonemes import PhonemeTable, Phonemizer
from onnx_tts.frontend.segments import Break, Document, Phonemes, Segment, Text
from onnx_tts.frontend.sentences import split_sentences
from onnx_tts.frontend.ssml import is_ssml, parse_ssml, to_ssml
from onnx_tts.frontend.tokenizer import TextTokenizer

__all__ = [
    "MAX_CARDINAL_DIGITS",
    "MAX_TEXT_CHARS",
    "Break",
    "Document",
    "PhonemeTable",
    "Phonemes",
    "Phonemizer",
    "Segment",
    "Text",
    "TextTokenizer",
    "check_text",
    "digits_to_words",
    "drop_unspeakable",
    "expand_abbreviations",
    "expand_numbers",
    "is_ssml",
    "normalize_text",
    "number_text_to_words",
    "number_to_words",
    "ordinal_to_words",
    "parse_markup",
    "parse_ssml",
    "split_phoneme_spans",
    "split_sentences",
    "to_ssml",
    "year_to_words",
]

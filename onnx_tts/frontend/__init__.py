"""Text frontend: normalisation, sentence splitting for long input, tokenization, and
phonemization (espeak-ng) for bundles that speak phonemes.

One module per idea: `checks` (what a request may hand in, unspeakable characters),
`numbers` (number words), `numerals` (written numeric forms: dates, money, times, units, ...),
`abbreviations`, `sentences` (sentence ends and splitting), `normalize` (the English
pipeline), `tokenizer` and `phonemes`.
"""

from __future__ import annotations

from onnx_tts.frontend.abbreviations import expand_abbreviations
from onnx_tts.frontend.checks import MAX_TEXT_CHARS, check_text, drop_unspeakable
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
from onnx_tts.frontend.sentences import split_sentences
from onnx_tts.frontend.tokenizer import TextTokenizer

__all__ = [
    "MAX_CARDINAL_DIGITS",
    "MAX_TEXT_CHARS",
    "PhonemeTable",
    "Phonemizer",
    "TextTokenizer",
    "check_text",
    "digits_to_words",
    "drop_unspeakable",
    "expand_abbreviations",
    "expand_numbers",
    "normalize_text",
    "number_text_to_words",
    "number_to_words",
    "ordinal_to_words",
    "split_sentences",
    "year_to_words",
]

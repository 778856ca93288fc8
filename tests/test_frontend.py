"""English text frontend: numbers, scripts it cannot speak, invalid Unicode."""

from __future__ import annotations

import re
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onnx_tts.errors import InputError, OnnxTTSWarning, UnspeakableTextWarning
from onnx_tts.frontend import (
    MAX_TEXT_CHARS,
    check_text,
    normalize_text,
    ordinal_to_words,
    year_to_words,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1st 2nd 3rd 21st", "first second third twenty-first"),
        ("12th 100th 111th", "twelfth one hundredth one hundred eleventh"),
        ("items 2,3", "items two, three"),
        (
            "1,234,567 people",
            "one million two hundred thirty four thousand five hundred sixty seven people",
        ),
        ("a 1,2345 b", "a one, two thousand three hundred forty five b"),
        ("3.14e10", "three point one four times ten to the power of ten"),
        ("6e-3", "six times ten to the power of minus three"),
        ("1.2.3.4", "one point two point three point four"),
        ("version 10.0.1.", "version ten point zero point one."),
        ("$5.99", "five dollars and ninety nine cents"),
        ("$1 and £3.50", "one dollar and three pounds and fifty pence"),
        ("$1.5 million", "one point five million dollars"),
        (
            "Dr. Smith paid $1,250 & left.",
            "doctor Smith paid one thousand two hundred fifty dollars and left.",
        ),
        ("at 10:30", "at ten thirty"),
        ("10:05 pm", "ten oh five PM"),  # "P M" made espeak say "a m" for "A M"
        ("9:00", "nine o'clock"),
        ("in 1984", "in nineteen eighty four"),
        ("2005 and 1905", "two thousand five and nineteen oh five"),
        ("the 1990s", "the nineteen nineties"),
        ("5 km, 1 kg, 3.5 GB", "five kilometers, one kilogram, three point five gigabytes"),
        ("20°C", "twenty degrees Celsius"),
        ("call 5551234567", "call five five five one two three four five six seven"),
        ("agent 007", "agent zero zero seven"),
        ("-5 degrees", "minus five degrees"),
        ("½ cup", "one half cup"),
        ("50%", "fifty percent"),
        ("Room 42", "Room forty two"),
    ],
)
def test_numbers_are_read_as_words(text: str, expected: str) -> None:
    assert normalize_text(text) == expected


def test_ordinal_and_year_words() -> None:
    assert ordinal_to_words(1) == "first"
    assert ordinal_to_words(42) == "forty-second"
    assert ordinal_to_words(90) == "ninetieth"
    assert year_to_words(1900) == "nineteen hundred"
    assert year_to_words(2024) == "twenty twenty four"


def test_other_scripts_are_dropped_with_a_warning_naming_them() -> None:
    with pytest.warns(UnspeakableTextWarning) as record:
        out = normalize_text("Hello 你好 world مرحبا שלום 😀 café")
    assert out == "Hello world café"
    message = str(record[0].message)
    assert "你好" in message and "Arabic" in message and "Hebrew" in message
    assert issubclass(UnspeakableTextWarning, OnnxTTSWarning)
    assert record[0].message.dropped["CJK"] == ["你", "好"]


def test_nothing_speakable_left_is_an_input_error() -> None:
    """The error alone: no warning line before it (the CLI's contract is one line)."""
    with (
        warnings.catch_warnings(),
        pytest.raises(InputError, match="nothing speakable"),
    ):
        warnings.simplefilter("error", UnspeakableTextWarning)
        normalize_text("你好，世界")
    # Blank text is the caller's to refuse (check_text); punctuation is left to the model.
    assert normalize_text("   ") == ""
    assert normalize_text("!!!") == "!!!"


def test_plain_english_gives_no_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert normalize_text("Déjà vu, naïve café.") == "Déjà vu, naïve café."


@pytest.mark.parametrize("bad", ["abc \udcff def", "\ud800"])
def test_lone_surrogates_are_refused(bad: str) -> None:
    with pytest.raises(InputError, match="lone surrogate"):
        check_text(bad)
    with pytest.raises(InputError, match="lone surrogate"):
        normalize_text(bad)


def test_invalid_utf8_bytes_are_refused() -> None:
    with pytest.raises(InputError, match="not valid UTF-8"):
        check_text(b"abc \xff")


def test_text_length_is_bounded() -> None:
    with pytest.raises(InputError, match="at most"):
        check_text("a" * (MAX_TEXT_CHARS + 1))


def test_pathological_number_runs_stay_linear() -> None:
    # Comma/digit soup must not backtrack catastrophically; a bounded input finishes at once.
    out = normalize_text("1," * 20000 + "2")
    assert out.startswith("one, one,")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_any_text_normalises_to_words_or_a_clear_error(text: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OnnxTTSWarning)
        try:
            out = normalize_text(text)
        except InputError:
            return
    assert not re.search(r"\d", out), out
    assert out == out.strip() and "  " not in out

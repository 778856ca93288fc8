"""Captions beside the audio (issue 43): the two outputs can never clobber each other (one
file however spelled or linked is refused before any work; both are complete before either
is put in place, so a full disk leaves both as they were), WebVTT and SRT cue text is
escaped, a cue never splits one spoken unit (a time, a number, an amount), and punctuation
stays in the cue text."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onnx_tts.pipeline.timings import CUE_WORDS, UNIT_WORDS, WordTiming, cues, subtitles

OLD_AUDIO = b"RIFF old audio, not to be lost"
OLD_CAPTIONS = "1\n00:00:00,000 --> 00:00:01,000\nold captions\n"


def synth(cwd: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "onnx_tts.cli", "synth", *args, "--cache-dir", "none"]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=300, cwd=cwd, check=False, **kwargs
    )


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob(".*"))


# (how the two names are made, -o, --captions): every pair names one file
def _links(tmp: Path) -> None:
    (tmp / "old.srt").write_text(OLD_CAPTIONS)
    (tmp / "link.srt").symlink_to("old.srt")
    os.link(tmp / "old.srt", tmp / "hard.srt")
    (tmp / "dangling.srt").symlink_to("new.srt")
    (tmp / "d").mkdir()


ONE_FILE = [
    ("same name", "same.srt", "same.srt"),
    ("./x and x", "./x.srt", "x.srt"),
    ("d/../x and x", "d/../x.srt", "x.srt"),
    ("absolute and relative", "{tmp}/x.srt", "x.srt"),
    ("link to the captions", "link.srt", "old.srt"),
    ("captions through a link", "old.srt", "link.srt"),
    ("hard link", "hard.srt", "old.srt"),
    ("dangling link to the captions' new file", "dangling.srt", "new.srt"),
]


@pytest.mark.parametrize(
    ("output", "captions"), [c[1:] for c in ONE_FILE], ids=[c[0] for c in ONE_FILE]
)
def test_audio_and_captions_naming_one_file_are_refused_before_any_work(
    tmp_path: Path, output: str, captions: str
) -> None:
    """`-o same.srt --captions same.srt` (or a link from one to the other) exited 0 with only
    the audio left."""
    _links(tmp_path)
    output = output.format(tmp=tmp_path)
    done = synth(tmp_path, "Hello there.", "-o", output, "--format", "wav", "--captions", captions)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line == (
        f"onnx-tts: error: -o {output} and --captions {captions} are the same file; give the "
        "captions a file of their own"
    )
    assert (tmp_path / "old.srt").read_text() == OLD_CAPTIONS
    assert not (tmp_path / "same.srt").exists() and not (tmp_path / "new.srt").exists()
    assert _leftovers(tmp_path) == []


def test_distinct_names_that_only_look_alike_are_two_files(tmp_path: Path) -> None:
    """On a case-sensitive file system (tmpfs, ext4) X.SRT and x.srt are two files."""
    done = synth(tmp_path, "Hi.", "-o", "X.SRT", "--format", "wav", "--captions", "x.srt", "-q")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "X.SRT").read_bytes()[:4] == b"RIFF"
    assert (tmp_path / "x.srt").read_text().startswith("1\n")


def _file_size_limit(limit: int):
    def apply() -> None:  # a full file system, for root too: writes past `limit` fail
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_full_disk_leaves_the_captions_and_the_audio_as_they_were(
    tmp_path: Path, stream: bool
) -> None:
    """On a full disk the audio failed (exit 2) after the captions file had been replaced."""
    (tmp_path / "a.wav").write_bytes(OLD_AUDIO)
    (tmp_path / "a.srt").write_text(OLD_CAPTIONS)
    text = "This sentence makes far more audio than the disk has room for. " * 2
    done = synth(
        tmp_path,
        text,
        "-o",
        "a.wav",
        "--captions",
        "a.srt",
        *(["--stream"] if stream else []),
        preexec_fn=_file_size_limit(4096),  # the captions fit, the audio does not
    )
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("onnx-tts: error: cannot write") and "File too large" in line, line
    assert (tmp_path / "a.srt").read_text() == OLD_CAPTIONS
    assert (tmp_path / "a.wav").read_bytes() == OLD_AUDIO
    assert _leftovers(tmp_path) == []


def _vtt_cues(text: str) -> list[str]:
    assert text.startswith("WEBVTT\n\n")
    blocks = text[len("WEBVTT\n\n") :].strip("\n").split("\n\n")
    lines = []
    for block in blocks:
        timing, *cue = block.split("\n")
        assert re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3} --> \d\d:\d\d:\d\d\.\d{3}", timing), timing
        assert len(cue) == 1 and cue[0].strip(), block  # one line, never empty
        lines += cue
    return lines


def _srt_cues(text: str) -> list[str]:
    lines = []
    for number, block in enumerate(text.strip("\n").split("\n\n"), 1):
        index, timing, *cue = block.split("\n")
        assert index == str(number)
        assert re.fullmatch(r"\d\d:\d\d:\d\d,\d{3} --> \d\d:\d\d:\d\d,\d{3}", timing), timing
        assert len(cue) == 1 and cue[0].strip(), block
        lines += cue
    return lines


CAPTIONED = (
    "Doors open at 9:30 AM on 15 March 2024, and a ticket costs $5.99/mo. "
    'Is a < b & c --> d? "Yes," she said. Call 555-123-4567 today!'
)


@pytest.fixture(scope="module")
def captioned(tmp_path_factory) -> dict[str, str]:
    """The CLI's .vtt and .srt of one text (one run each, streamed and not)."""
    where = tmp_path_factory.mktemp("captioned")
    for kind, extra in (("vtt", []), ("srt", ["--stream"])):
        done = synth(where, CAPTIONED, "-o", f"a.{kind}.wav", "--captions", f"a.{kind}", *extra)
        assert done.returncode == 0, done.stderr
    return {kind: (where / f"a.{kind}").read_text() for kind in ("vtt", "srt")}


def test_webvtt_cue_text_is_escaped(captioned: dict[str, str]) -> None:
    """WebVTT cues carried a raw "<", "&" and "-->" (a cue text may hold none of them)."""
    lines = _vtt_cues(captioned["vtt"])
    text = " ".join(lines)
    assert "-->" not in text and "<" not in text and ">" not in text.replace("&gt;", "")
    assert re.sub(r"&(amp|lt|gt);", "", text).count("&") == 0
    assert "a &lt; b" in text and "c --&gt; d?" in text


def test_srt_cue_text_never_holds_an_arrow_or_a_tag(captioned: dict[str, str]) -> None:
    lines = _srt_cues(captioned["srt"])
    text = " ".join(lines)
    assert "-->" not in text and "<" not in text and ">" not in text
    assert "a ‹ b" in text and "c --› d?" in text


@pytest.mark.parametrize("kind", ["vtt", "srt"])
def test_cues_keep_spoken_units_whole_and_punctuation(captioned: dict[str, str], kind) -> None:
    """A cue split "at nine" / "thirty AM"; punctuation was dropped."""
    lines = (_vtt_cues if kind == "vtt" else _srt_cues)(captioned[kind])
    for unit in (
        "nine thirty AM",
        "the fifteenth of March, twenty twenty four,",
        "five dollars and ninety nine cents per month.",
        "five five five, one two three, four five six seven",
    ):
        assert any(unit in line for line in lines), (unit, lines)
    text = " ".join(lines)
    assert '"Yes," she said.' in text and "today!" in text and "d?" in text


def _timing(word: str, start: float, joins: bool = False, end: bool = False) -> WordTiming:
    return WordTiming(word, start, start + 0.2, False, sentence_end=end, joins_next=joins)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.floats(0, 0.5)), max_size=80))
def test_no_cue_ends_inside_a_unit(flags: list[tuple[bool, bool, float]]) -> None:
    """Whatever the units and pauses: every word is in exactly one cue, in order; a cue ends
    inside a unit only when the unit is longer than UNIT_WORDS; a cue of more than CUE_WORDS
    words is one unit."""
    words, start = [], 0.0
    for index, (joins, end, gap) in enumerate(flags):
        end = end or index == len(flags) - 1  # (a chunk's last word ends its sentence)
        words.append(_timing(f"w{len(words)}", start, joins and not end, end))
        start += 0.2 + gap
    found = cues(words)
    assert " ".join(text for *_, text in found).split() == [w.word for w in words]
    position = 0
    for _, _, text in found:
        count = len(text.split())
        last = words[position + count - 1]
        run = 0
        while position + count - 1 - run >= 0 and words[position + count - 2 - run].joins_next:
            run += 1
        assert not last.joins_next or run + 1 >= UNIT_WORDS
        if count > CUE_WORDS:  # one unit
            assert all(w.joins_next for w in words[position : position + count - 1])
        position += count


def test_subtitles_of_nothing_are_valid_and_empty() -> None:
    assert subtitles([], "vtt") == "WEBVTT\n\n"
    assert subtitles([], "srt") == ""

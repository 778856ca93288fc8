"""Round five, the text side (issue 43): categories "markup", "captions", "timings" and
"reader", tried as users would, through the CLI, the Python API and a live HTTP server.

- markup: SSML however a real document begins (byte-order mark, whitespace, an XML
  declaration, comments, processing instructions; the W3C and vendor headers) must give the
  very samples of the same document starting at <speak>; a DOCTYPE after any of them (a
  billion laughs, an external entity, a public DTD) is one clear error, never spoken; lone
  punctuation beside markup is spoken, not refused; a [[ ]] or <phoneme> with no sound the
  model knows, and an impossible <say-as> date, are refused.
- captions: `-o` and `--captions` naming one file (any spelling, a link, a hard link) are
  refused before synthesis with both files as they were; a full disk (a real 64 KiB tmpfs as
  root, RLIMIT_FSIZE otherwise) leaves both as they were; WebVTT / SRT cue text is escaped,
  keeps its punctuation and never splits one spoken unit.
- timings: on the default voice every word is exact where espeak-ng writes words together,
  and ends within two pointer steps of the speech, at every speed.
- reader: the forms the round found read wrongly, and their families (tests/
  test_reader_cases.py holds the expectations), as the engine's spoken words.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import resource
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.attack_live import CORRECT, REPO, LiveContext, Verdict, add, register_probes
from benchmarks.attack_process import _full_tmpfs
from tests.test_reader_cases import HANDLES, PROTOCOLS, RATES, RATIOS, TIME_RANGES
from tests.test_ssml import BILLION_LAUGHS

CONFIG = "own-text"  # the probes start what they need (the CLI, one in-process engine)
SPEECH = "/v1/audio/speech"
RATE = 16000  # the default voice
BODY = (
    '<speak>Step one. <break time="300ms"/><prosody rate="slow">Then two.</prosody>'
    '<say-as interpret-as="cardinal">42</say-as>.</speak>'
)
OPENINGS = {
    "a byte-order mark": "\ufeff",
    "a newline": "\n",
    "spaces and tabs": " \t \r\n",
    "an XML declaration": '<?xml version="1.0"?>',
    "a declaration with encoding and standalone": (
        '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
    ),
    "whitespace before the declaration": '\n  <?xml version="1.0"?>\n',
    "a byte-order mark and a declaration": '\ufeff<?xml version="1.0" encoding="utf-8"?>\r\n',
    "a comment": "<!-- exported by an editor -->\n",
    "a processing instruction": '<?xml-stylesheet href="speech.css"?>',
    "declaration, comments, instruction": (
        '<?xml version="1.0"?>\n<!-- a -->\n<?app x?>\n<!-- b -->'
    ),
}
HEADERS = {
    "the W3C header": (
        '<speak version="1.1" xmlns="http://www.w3.org/2001/10/synthesis" '
        'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
        'xsi:schemaLocation="http://www.w3.org/2001/10/synthesis '
        'http://www.w3.org/TR/speech-synthesis11/synthesis.xsd" xml:lang="en-US">'
    ),
    "Azure's header": (
        '<speak version="1.0" xmlns="http://www.w3.org/2001/10/synthesis" '
        'xmlns:mstts="https://www.w3.org/2001/mstts" xml:lang="en-US">'
    ),
    "a vendor namespace": '<speak xmlns:amazon="https://amazon.com/ssml">',
}
DOCTYPES = {
    "a billion laughs after the declaration": BILLION_LAUGHS,
    "a billion laughs after a comment": "<!-- x -->\n" + BILLION_LAUGHS.split("\n", 1)[1],
    "a billion laughs after a byte-order mark": "\ufeff\n" + BILLION_LAUGHS.split("\n", 1)[1],
    "an external entity after the declaration": (
        '<?xml version="1.0"?><!DOCTYPE speak [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
        "<speak>&x;</speak>"
    ),
    "a parameter entity": (
        '<!DOCTYPE speak [<!ENTITY % p SYSTEM "http://127.0.0.1:9/p.dtd"> %p;]><speak>x</speak>'
    ),
    "the W3C public DTD": (
        '<?xml version="1.0"?><!DOCTYPE speak PUBLIC "-//W3C//DTD SYNTHESIS 1.0//EN" '
        '"http://www.w3.org/TR/speech-synthesis/synthesis.dtd"><speak>Hi.</speak>'
    ),
}
PUNCTUATION = [
    '<speak>Step four, <prosody rate="80%">relax</prosody>.</speak>',
    "Say [[ h ə l ˈoʊ ]].",
    "[[ h ə l ˈoʊ ]]!",
    '<speak>Wait <break time="300ms"/>.</speak>',
    '<speak>"<prosody rate="slow">Hi</prosody>" — </speak>',
    '<speak><phoneme alphabet="ipa" ph="təˈmɑːtoʊ">tomato</phoneme>?</speak>',
]
REFUSED = [
    ('<!ENTITY lol "lol"><speak>&lol;</speak>', "markup declarations"),
    ('<?xml version="1.0"?>\n<!ENTITY x SYSTEM "file:///etc/passwd"><speak>&x;</speak>', "markup"),
    ("[[ 1 2 3 ]]", "1 2 3 are not among its phonemes"),
    ("Say [[ ˈ , ]] now.", "no sound this model knows"),
    ('<speak><phoneme ph="123">x</phoneme></speak>', "not among its phonemes"),
    ('<speak><say-as interpret-as="date">2024-02-30</say-as></speak>', "not a real date"),
    ('<speak><say-as interpret-as="date">2023-02-29</say-as></speak>', "not a real date"),
    ('<speak><say-as interpret-as="date" format="md">4/31</say-as></speak>', "not a real date"),
]
MERGED = "Put it in the box of the day. I went out of the house, for a while!"


def register_cases() -> None:
    for name, opening in OPENINGS.items():
        add("markup", CONFIG, "same_audio", "ok", text=opening + BODY, note=f"SSML after {name}")
    for name, header in HEADERS.items():
        text = header + BODY.removeprefix("<speak>")
        add("markup", CONFIG, "same_audio", "ok", text=text, note=f"SSML with {name}")
    for name, document in DOCTYPES.items():
        add("markup", CONFIG, "cli_refused", "error", text=document, match="DOCTYPE is not allowed",
            note=name)  # fmt: skip
    for text in PUNCTUATION:
        note = f"punctuation beside markup: {text}"
        add("markup", CONFIG, "cli_speaks", "ok", text=text, note=note)
    for text, match in REFUSED:
        add("markup", CONFIG, "cli_refused", "error", text=text, match=match, note=text)
    # The same over HTTP, as OpenAI's client sends them.
    refused = ("a billion laughs after the declaration", "an external entity after the declaration")
    for name in refused:
        add("markup", "plain", "request", "error", status=400, method="POST", path=SPEECH,
            json={"input": DOCTYPES[name], "voice": "default", "response_format": "pcm"},
            note=f"HTTP: {name}")  # fmt: skip
    for name in ("an XML declaration", "whitespace before the declaration", "a comment"):
        add("markup", "plain", "request", "ok", status=200, method="POST", path=SPEECH,
            json={"input": OPENINGS[name] + BODY, "voice": "default", "response_format": "wav"},
            audio="wav", note=f"HTTP: SSML after {name}")  # fmt: skip
    for text in PUNCTUATION[:2]:
        add("markup", "plain", "request", "ok", status=200, method="POST", path=SPEECH,
            json={"input": text, "voice": "default", "response_format": "wav"}, audio="wav",
            note=f"HTTP: {text}")  # fmt: skip
    add("markup", "plain", "request", "error", status=400, method="POST", path=SPEECH,
        json={"input": "[[ 1 2 3 ]]", "voice": "default"}, note="HTTP: [[ 1 2 3 ]]")  # fmt: skip

    for name, output, captions in ONE_FILE:
        add("captions", CONFIG, "one_file", "error", output=output, captions=captions,
            note=f"-o {output} --captions {captions} ({name})")  # fmt: skip
    for disk in ("tmpfs", "rlimit"):
        for stream in (False, True):
            add("captions", CONFIG, "full_disk", "error", disk=disk, stream=stream,
                note=f"a full disk ({disk}){' while streaming' if stream else ''}")  # fmt: skip
    for kind in ("vtt", "srt"):
        for stream in (False, True):
            add(
                "captions",
                CONFIG,
                "cue_text",
                "ok",
                subtitles=kind,
                stream=stream,
                note=f".{kind} cues escaped, whole units, punctuation{' (stream)' * stream}",
            )

    for speed in (0.25, 0.5, 1.0, 2.0, 4.0):
        add("timings", CONFIG, "timings", "ok", speed=speed, note=f"merged words at speed {speed}")
    add("timings", CONFIG, "timings", "ok", speed=1.0, ssml=True, stream=True,
        note="merged words in <prosody rate='x-slow'>, streamed")  # fmt: skip

    for text, heard in [*PROTOCOLS, *TIME_RANGES, *HANDLES, *RATIOS, *RATES]:
        add("reader", CONFIG, "reader", "ok", text=text, heard=heard, note=f"{text} -> {heard}")


# -- helpers ----------------------------------------------------------------------------------
_ENGINE: list[Any] = []


def engine() -> Any:
    """One default-voice engine for the API probes (caches off: every case is computed)."""
    if not _ENGINE:
        import onnx_tts

        _ENGINE.append(onnx_tts.load(cache_dir=None))
    return _ENGINE[0]


def cli(argv: list[str], cwd: Path, fsize: int | None = None) -> tuple[int | None, str]:
    """(exit code or None on timeout, stderr) of `python -m onnx_tts.cli ARGV` in its own
    session under a 4 GiB address-space limit (and a file-size limit when given)."""

    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        os.setsid()

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "onnx_tts.cli", *argv, "--cache-dir", "none"]
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, preexec_fn=limits)  # fmt: skip
    try:
        _, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None, ""
    return proc.returncode, err.decode("utf-8", "replace")


def _refusal(code: int | None, err: str, match: str = "") -> Verdict:
    """A run that must be one clear error line (exit 2)."""
    lines = [line for line in err.splitlines() if line.strip()]
    if code is None:
        return Verdict("runaway", "the CLI did not finish in 300 s")
    if "Traceback" in err:
        return Verdict("traceback", "Traceback on stderr")
    if code == 0:
        return Verdict("silently wrong", "exit 0 where a refusal was expected")
    if code != 2 or len(lines) != 1:
        return Verdict("traceback", f"exit {code} with {len(lines)} lines: {err[-150:]!r}")
    if match and match not in lines[0]:
        return Verdict("silently wrong", f"error line lacks {match!r}: {lines[0][:120]}")
    return Verdict("clear error")


def _success(code: int | None, err: str) -> Verdict | None:
    """None for a clean exit 0 (no error line); else what went wrong."""
    if code is None:
        return Verdict("runaway", "the CLI did not finish in 300 s")
    if "Traceback" in err:
        return Verdict("traceback", "Traceback on stderr")
    if code != 0:
        return Verdict("silently wrong", f"exit {code}: {err.strip()[-150:]}")
    lines = [line for line in err.splitlines() if line.strip() and "warning:" not in line]
    if lines:
        return Verdict("silently wrong", f"stderr: {lines[0][:120]}")
    return None


def _leftovers(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*")
                  if p.name.startswith(".") or p.name.endswith(".part"))  # fmt: skip


def _work(ctx: LiveContext, case: dict[str, Any]) -> Path:
    work = ctx.root / case["id"]
    work.mkdir(parents=True, exist_ok=True)
    return work


# -- markup -----------------------------------------------------------------------------------
def probe_same_audio(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    """The document gives the very samples of the same document starting at <speak>."""
    from onnx_tts.errors import OnnxTTSError

    tts = engine()
    reference = tts.synthesize(BODY, seed=1).samples
    try:
        audio = tts.synthesize(case["text"], seed=1).samples
    except OnnxTTSError as error:
        return Verdict("silently wrong", f"refused: {str(error)[:150]}")
    if audio.shape != reference.shape or not np.array_equal(audio, reference):
        wanted = len(reference)
        return Verdict("silently wrong", f"{len(audio)} samples, not the {wanted} of <speak>")
    return CORRECT


def probe_cli_refused(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    work = _work(ctx, case)
    code, err = cli(["synth", case["text"], "-o", "out.wav"], work)
    verdict = _refusal(code, err, case.get("match", ""))
    if verdict.outcome == "clear error" and (work / "out.wav").exists():
        return Verdict("silently wrong", "refused, but an output file was written")
    return verdict


def probe_cli_speaks(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    import soundfile

    work = _work(ctx, case)
    code, err = cli(["synth", case["text"], "-o", "out.wav", "-q"], work)
    failed = _success(code, err)
    if failed:
        return failed
    audio, rate = soundfile.read(str(work / "out.wav"), dtype="float32")
    if len(audio) < rate // 4 or not np.isfinite(audio).all() or np.abs(audio).max() > 1:
        return Verdict("silently wrong", f"{len(audio)} samples of audio")
    return CORRECT


# -- captions ---------------------------------------------------------------------------------
OLD_AUDIO = b"RIFF old audio, not to be lost"
OLD_CAPTIONS = "1\n00:00:00,000 --> 00:00:01,000\nold captions\n"
ONE_FILE = [
    ("same name", "same.srt", "same.srt"),
    ("./x and x", "./x.srt", "x.srt"),
    ("d/../x and x", "d/../x.srt", "x.srt"),
    ("absolute and relative", "{work}/x.srt", "x.srt"),
    ("a link to the captions", "link.srt", "old.srt"),
    ("captions through a link", "old.srt", "link.srt"),
    ("a hard link", "hard.srt", "old.srt"),
    ("a dangling link to the new captions", "dangling.srt", "new.srt"),
    ("a link to a link", "link2.srt", "old.srt"),
]


def probe_one_file(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    work = _work(ctx, case)
    (work / "old.srt").write_text(OLD_CAPTIONS)
    (work / "link.srt").symlink_to("old.srt")
    (work / "link2.srt").symlink_to("link.srt")
    os.link(work / "old.srt", work / "hard.srt")
    (work / "dangling.srt").symlink_to("new.srt")
    (work / "d").mkdir()
    output = case["output"].format(work=work)
    argv = ["synth", "Hello there.", "-o", output, "--format", "wav"]
    argv += ["--captions", case["captions"]]
    verdict = _refusal(*cli(argv, work), "are the same file")
    if (work / "old.srt").read_bytes() != OLD_CAPTIONS.encode():
        return Verdict("data lost", "the existing captions file was changed")
    for name in ("same.srt", "x.srt", "new.srt"):
        if (work / name).exists():
            return Verdict("silently wrong", f"{name} was written")
    left = _leftovers(work)
    return Verdict("data lost", f"left behind: {left[:3]}") if left else verdict


def probe_full_disk(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    work = _work(ctx, case)
    text = "This sentence makes far more audio than the disk has room for. " * 3
    stream = ["--stream"] if case["stream"] else []
    with contextlib.ExitStack() as stack:
        if case["disk"] == "tmpfs":
            where = stack.enter_context(_full_tmpfs(work / "full", fill=False))
            if where is None:
                return Verdict("clear error", "no tmpfs without root: see the rlimit cases")
            fsize = None
        else:
            where, fsize = work, 8192  # the captions fit, the audio does not
        (where / "a.wav").write_bytes(OLD_AUDIO)
        (where / "a.srt").write_text(OLD_CAPTIONS)
        argv = ["synth", text, "-o", str(where / "a.wav"), "--captions", str(where / "a.srt")]
        verdict = _refusal(*cli([*argv, *stream], work, fsize), "cannot write")
        if (where / "a.srt").read_bytes() != OLD_CAPTIONS.encode():
            return Verdict("data lost", "the captions were replaced though the audio failed")
        if (where / "a.wav").read_bytes() != OLD_AUDIO:
            return Verdict("data lost", "the old audio was changed")
        left = _leftovers(where)
        if left:
            return Verdict("data lost", f"left behind: {left[:3]}")
    return verdict


CAPTIONED = (
    "Doors open at 9:30 AM on 15 March 2024, and a ticket costs $5.99/mo. "
    'Is a < b & c --> d? "Yes," she said. Call 555-123-4567 today!'
)
UNITS = (
    "nine thirty AM",
    "the fifteenth of March, twenty twenty four,",
    "five dollars and ninety nine cents per month.",
    "five five five, one two three, four five six seven",
)


def probe_cue_text(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    work = _work(ctx, case)
    kind = case["subtitles"]
    stream = ["--stream"] if case["stream"] else []
    argv = ["synth", CAPTIONED, "-o", "a.wav", "--captions", f"a.{kind}", "-q", *stream]
    failed = _success(*cli(argv, work))
    if failed:
        return failed
    text = (work / f"a.{kind}").read_text()
    blocks = text.removeprefix("WEBVTT\n\n").strip("\n").split("\n\n")
    lines = []
    for block in blocks:
        rows = block.split("\n")
        if kind == "srt":
            rows = rows[1:]
        timing, *cue = rows
        if not re.fullmatch(r"\d\d:\d\d:\d\d[.,]\d{3} --> \d\d:\d\d:\d\d[.,]\d{3}", timing):
            return Verdict("silently wrong", f"bad timing line {timing!r}")
        if len(cue) != 1 or not cue[0].strip():
            return Verdict("silently wrong", f"a cue of {len(cue)} lines")
        lines.append(cue[0])
    joined = " ".join(lines)
    if "-->" in joined:
        return Verdict("silently wrong", "a cue holds -->")
    if kind == "vtt" and ("<" in joined or re.sub(r"&(amp|lt|gt);", "", joined).count("&")):
        return Verdict("silently wrong", "an unescaped < or & in a WebVTT cue")
    if kind == "srt" and ("<" in joined or ">" in joined):
        return Verdict("silently wrong", "a tag bracket in an SRT cue")
    for unit in UNITS:
        if not any(unit in line for line in lines):
            return Verdict("silently wrong", f"{unit!r} split across cues")
    if '"Yes," she said.' not in joined or "today!" not in joined:
        return Verdict("silently wrong", "punctuation dropped")
    return CORRECT


# -- timings ----------------------------------------------------------------------------------
def _sound_end(samples: np.ndarray) -> float:
    width = RATE // 50
    windows = samples[: len(samples) // width * width].reshape(-1, width)
    rms = np.sqrt((windows**2).mean(axis=1))
    return float((np.flatnonzero(rms > 0.03 * rms.max())[-1] + 1) * width / RATE)


def probe_timings(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    tts = engine()
    speed = case["speed"]
    text = MERGED
    if case.get("ssml"):
        text = f'<speak><prosody rate="x-slow">{MERGED}</prosody></speak>'
    if case.get("stream"):
        stream = tts.stream(text, timestamps=True, speed=speed)
        samples = np.concatenate(list(stream))
        words = stream.words
    else:
        audio = tts.synthesize(text, timestamps=True, speed=speed)
        samples, words = audio.samples, audio.words
    duration = len(samples) / RATE
    expected = re.findall(r"[A-Za-z]+", MERGED)
    if [w.word for w in words] != expected:
        return Verdict("silently wrong", f"words {[w.word for w in words][:6]}...")
    estimated = [w.word for w in words if w.estimated]
    if estimated:
        return Verdict("silently wrong", f"estimated: {estimated[:5]}")
    if not all(0 <= w.start < w.end <= duration + 1e-6 for w in words):
        return Verdict("silently wrong", "a word outside the audio")
    if any(a.end > b.start + 1e-6 for a, b in itertools.pairwise(words)):
        return Verdict("silently wrong", "words overlap")
    pace = speed * (0.5 if case.get("ssml") else 1.0)  # x-slow is half the pace
    step = 2 * 320 / RATE / pace  # the default voice's pointer step (2 frames of 320 samples)
    late = words[-1].end - _sound_end(samples)
    if late > 2 * step:
        return Verdict("silently wrong", f"the last word ends {late:.2f} s after the speech")
    return CORRECT


# -- reader -----------------------------------------------------------------------------------
def probe_reader(ctx: LiveContext, case: dict[str, Any]) -> Verdict:
    """The engine's spoken words (its word timings) are the words a listener expects."""
    from onnx_tts.errors import OnnxTTSError

    try:
        audio = engine().synthesize(case["text"], timestamps=True)
    except OnnxTTSError as error:
        return Verdict("silently wrong", f"refused: {str(error)[:150]}")
    spoken = " ".join(w.word for w in audio.words)
    wanted = " ".join(re.sub(r"[^\w'\-]+", " ", case["heard"]).split())
    if spoken != wanted:
        return Verdict("silently wrong", f"heard {spoken!r}")
    return CORRECT


register_probes(globals())

"""Numbers with several dots: versions ("v2.0.1", "version 3.11", "Python 3.11.7"), IP
addresses ("192.168.0.1") and other dotted numbers ("1.2.3.4").

A version's parts are whole numbers joined by "point" ("three point eleven", not the decimal
"three point one one"), a zero part is "zero" as in the rest of the frontend, and no period
of a version is ever left behind to end a sentence ("v2.0.1" once read "zero. one").
"""

from __future__ import annotations

import re

from onnx_tts.frontend.numbers import (
    digits_to_words,
    integer_words,
    number_to_words,
    year_to_words,
)
from onnx_tts.frontend.sentences import pad

# Words after which "3.11" is a version rather than a decimal: software and standards whose
# releases are numbered so. Common words ("go", "build", "edge") are left out: after them
# "2.25" may be a measure.
_VERSION_CUES = (
    r"version|ver\.?|release|firmware|kernel|python|node|nodejs|java|ruby|php|perl|rust|ios|"
    r"ipados|macos|android|windows|ubuntu|debian|fedora|linux|chrome|firefox|safari|http|tls|"
    r"ssl|bluetooth|usb|unicode|ecmascript|gcc|clang|cuda|onnx|opset|pytorch|tensorflow|numpy|"
    r"django|rails|react|angular|swift|kotlin|scala|julia|matlab|postgres|postgresql|mysql|"
    r"redis|docker|kubernetes|gpt|llama"
)
# A pre-release tag after a version: "v2.0.1-beta", "3.12.0rc1".
_TAG = r"(?:[-.]?(?P<tag>alpha|beta|rc|dev|preview|pre)(?P<tag_number>\d{1,3})?)?"
# "v2", "v2.0.1", "V3.5": a lower-case v (or a capital one with a dot) right before digits.
_V_VERSION_RE = re.compile(
    r"(?<![\w.])(?P<cue>(?i:version|ver\.?)\s+)?(?:v(?P<lone>\d+)(?!\w|[.,]\d)|"
    rf"[vV](?P<parts>\d+(?:\.\d+)+)){_TAG}(?![\w]|\.\d)"
)
# "version 3.11", "Python 3.11", "iOS 17.2": two parts after a cue word.
_CUED_VERSION_RE = re.compile(
    rf"(?<![\w.])(?P<cue>(?i:{_VERSION_CUES})[\s/]+)(?P<parts>\d+\.\d+){_TAG}(?![\w]|\.\d)"
)
# "HTTP/2", "PS/2", "Python/3": a whole-number version after a cue word or an acronym and a
# slash (the slash is not read: "HTTP two", as "HTTP/1.1" is "HTTP one point one").
_SLASH_MAJOR_RE = re.compile(
    rf"(?<![\w./])(?P<cue>(?i:{_VERSION_CUES})|[A-Z]{{2,6}})/(?P<major>\d{{1,3}})(?![\w/]|[.,]\d)"
)
# "IPv4", "IPv6": the protocol's letters, then its version.
_IP_VERSION_RE = re.compile(r"(?<![\w.])IPv([46])(?!\w|\.\d)")
# Four parts of at most three digits: an IP address when a part is 100 or more, or after a
# word that names one; otherwise a dotted number like "1.2.3.4".
_IP_RE = re.compile(
    r"(?<![\w.])(?P<parts>\d{1,3}(?:\.\d{1,3}){3})(?::(?P<port>\d{1,5}))?(?![\w]|\.\d)"
)
_IP_CUE_RE = re.compile(
    r"\b(?:IP|IPv4|address|server|host|ping|gateway|DNS|router)\b(?:\W+\w+){0,2}\W*$", re.I
)
# Three or more dotted parts anywhere, even right after letters ("abc2.0.1"): never a
# decimal followed by a sentence end.
_DOTTED_RE = re.compile(rf"(?<![\d.])(?P<parts>\d+(?:\.\d+){{2,}}){_TAG}(?!\d|\.\d)")
_LETTER_DOT_DIGIT_RE = re.compile(r"(?<=[^\W\d_])\.(?=\d)")
_DIGIT_DOT_LETTER_RE = re.compile(r"(?<=\d)\.(?=[^\W\d_])")
_TAG_WORDS = {"rc": "R-C", "dev": "dev", "pre": "pre"}


def version_words(parts: str) -> str:
    """Dotted whole numbers: "2.0.1" -> "two point zero point one", "3.11" -> "three point
    eleven" (a leading zero is read digit by digit: "1.05" -> "one point zero five")."""
    return " point ".join(integer_words(part) for part in parts.split("."))


def _tag_words(match: re.Match[str]) -> str:
    tag = match["tag"]
    if not tag:
        return ""
    words = _TAG_WORDS.get(tag.lower(), tag.lower())
    number = match["tag_number"]
    return f" {words}" + (f" {integer_words(number)}" if number else "")


def _v_version(match: re.Match[str]) -> str:
    parts = match["lone"] or match["parts"]
    cue = match["cue"]
    # "Version v2.0.1": the written word is already there; "v" alone says "version".
    head = cue if cue else "version "
    return f"{head}{version_words(parts)}{_tag_words(match)}"


def _cued_version(match: re.Match[str]) -> str:
    cue = match["cue"].replace("/", " ")  # "HTTP/1.1" -> "HTTP one point one"
    return f"{cue}{version_words(match['parts'])}{_tag_words(match)}"


def _octet_words(part: str) -> str:
    """An address part: below 100 as a number ("ten", "zero"), longer ones digit by digit
    ("one nine two"), as people read them out."""
    return number_to_words(int(part)) if len(part) < 3 else digits_to_words(part)


def port_words(port: str) -> str:
    """A port number as people say it: 8080 "eighty eighty", 443 "four forty three", 3000
    "three thousand", 22 "twenty two"."""
    if len(port) in (3, 4) and port[0] != "0":
        return year_to_words(int(port))
    return integer_words(port)


def _ip(match: re.Match[str]) -> str:
    parts = match["parts"].split(".")
    port = match["port"]
    cued = bool(_IP_CUE_RE.search(match.string[max(0, match.start() - 30) : match.start()]))
    address = cued or port or any(len(part) == 3 for part in parts)
    if not address or any(int(part) > 255 for part in parts):
        return match.group(0)
    words = " dot ".join(_octet_words(part) for part in parts)
    return pad(f"{words} colon {port_words(port)}" if port else words)


def expand_versions(text: str) -> str:
    """Versions, IP addresses and other dotted numbers as words (before plain numbers, which
    would read "2.0" of "v2.0.1" as a decimal and leave ".1" behind)."""
    text = _SLASH_MAJOR_RE.sub(lambda m: pad(f"{m['cue']} {integer_words(m['major'])}"), text)
    # A dot between a letter and a digit ("a.0", "3.x") is no sentence end: it is said.
    text = _LETTER_DOT_DIGIT_RE.sub(pad("dot"), text)
    text = _V_VERSION_RE.sub(lambda match: pad(_v_version(match)), text)
    text = _CUED_VERSION_RE.sub(lambda match: pad(_cued_version(match)), text)
    text = _IP_RE.sub(_ip, text)  # (before "IPv4" is read: it names an address)
    text = _IP_VERSION_RE.sub(lambda m: pad(f"I-P-V {integer_words(m.group(1))}"), text)
    text = _DOTTED_RE.sub(lambda m: pad(version_words(m["parts"]) + _tag_words(m)), text)
    return _DIGIT_DOT_LETTER_RE.sub(pad("point"), text)

"""A subset of SSML 1.1, parsed with the standard library's XML parser (expat) into typed
segments (`segments.Document`). Markup is never spoken: only character data and the words
``<say-as>``/``<sub>`` stand for reach a Text segment.

Elements: ``<speak>`` (the root; a text that does not start with it is read as its content
when SSML is forced; a byte-order mark, whitespace, an XML declaration, comments and
processing instructions may come before it, as editors and cloud consoles export them),
``<p>``, ``<s>``, ``<break time strength>``, ``<prosody rate>``, ``<say-as interpret-as
format>``, ``<sub alias>``, ``<phoneme alphabet="ipa" ph>``;
``xml:lang`` is accepted (and ignored) on every element.

Safety: a DOCTYPE is refused, so no entity can be declared (no "billion laughs", no external
entity); only the five predefined entities and character references are expanded. Nesting
depth, one break's length and the sum of the breaks are bounded; the size of the whole text
is bounded by check_text.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from xml.parsers import expat

from onnx_tts.errors import SsmlError
from onnx_tts.frontend.checks import check_text
from onnx_tts.frontend.say_as import FORMATS, RENDERERS, render_say_as
from onnx_tts.frontend.segments import Break, Document, Phonemes, Segment, Text, fold_marks

# Break strength -> seconds. "medium" (the default of a bare <break/>) is about the pause
# between two sentences read aloud, "weak" a comma's, "strong" a paragraph's, "x-strong" a
# section's; "none" asks for no pause where the voice might make one.
BREAK_STRENGTHS = {
    "none": 0.0,
    "x-weak": 0.1,
    "weak": 0.25,
    "medium": 0.4,
    "strong": 0.75,
    "x-strong": 1.2,
}
MAX_BREAK_SECONDS = 10.0  # one break; a longer one is cut to this
# All silence one text may ask for (its breaks, and `sentence_silence` between its sentences:
# the planner adds those); more is an error, exactly this much is fine.
MAX_TOTAL_BREAK_SECONDS = 600.0
MAX_DEPTH = 32  # nested elements, <speak> included
# Prosody rate keywords -> speed multiplier (absolute); numbers and percentages are relative
# to the enclosing rate. The result must lie in the API's speed range.
RATES = {"x-slow": 0.5, "slow": 0.75, "medium": 1.0, "default": 1.0, "fast": 1.25, "x-fast": 1.5}
MIN_RATE, MAX_RATE = 0.25, 4.0

_ATTRIBUTES: dict[str, frozenset[str]] = {
    "speak": frozenset({"version", "xmlns", "xml:base"}),
    "p": frozenset(),
    "s": frozenset(),
    "break": frozenset({"time", "strength"}),
    "prosody": frozenset({"rate"}),
    "say-as": frozenset({"interpret-as", "format"}),
    "sub": frozenset({"alias"}),
    "phoneme": frozenset({"alphabet", "ph"}),
}
_TEXT_ONLY = frozenset({"say-as", "sub", "phoneme"})
# Tags of full SSML (and vendor dialects) this subset leaves out: named as such in the error.
_UNSUPPORTED = frozenset(
    "audio emphasis lang lexicon lookup mark meta metadata desc token voice w".split()
)
_TIME_RE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s)\s*", re.IGNORECASE)
_RELATIVE_RE = re.compile(r"([+-]?)(\d+(?:\.\d+)?|\.\d+)(%?)")
# What may come before the root element of a document (its prolog): a byte-order mark,
# whitespace, the XML declaration, comments and processing instructions, in any order.
_BOM = "\ufeff"
_XML_DECLARATION = r"<\?xml(?=\s)[^>]*\?>"
_PROLOG_ITEM_RE = re.compile(
    rf"\s+|{_BOM}|(?P<declaration>{_XML_DECLARATION})|<!--.*?-->|<\?.*?\?>", re.DOTALL
)
_SPEAK_RE = re.compile(r"<speak(?=[\s>/])")
_CLOSING_TAG_RE = re.compile(r"</\s*([^\s>]+)")
_DOCTYPE_RE = re.compile(r"<!DOCTYPE", re.IGNORECASE)
_DECLARATION_RE = re.compile(r"<!(?:ENTITY|ELEMENT|ATTLIST|NOTATION)\b", re.IGNORECASE)


def _prolog(text: str) -> tuple[int, bool]:
    """(where the prolog of `text` ends, whether it holds markup: a declaration, a comment or
    a processing instruction)."""
    end, markup = 0, False
    while match := _PROLOG_ITEM_RE.match(text, end):
        if match.end() == end:
            break
        markup = markup or match.group(0).startswith("<")
        end = match.end()
    return end, markup


def is_ssml(text: str) -> bool:
    """Whether a text is SSML: it starts with a <speak> tag or a DOCTYPE (which the parser
    refuses), after a byte-order mark, whitespace, an XML declaration, comments and
    processing instructions, or it starts with one of those XML constructs (an XML document
    is parsed, never read aloud). "if a < b then" is plain text."""
    head, markup = _prolog(text)
    if markup or text.startswith(("<!", "<?"), head):  # (an unclosed one: the parser says so)
        return True
    return bool(_SPEAK_RE.match(text, head) or _DOCTYPE_RE.match(text, head))


def ssml_undecided(start: str) -> bool:
    """Whether the first characters of a text still arriving do not yet show if it is SSML:
    after the complete parts of a prolog, nothing, or the beginning of "<speak" or of a
    DOCTYPE, or a comment or processing instruction not closed yet."""
    head, markup = _prolog(start)
    if markup:
        return False  # an XML document already
    rest = start[head:]
    return (
        rest.startswith(("<!--", "<?"))
        or any(opening.startswith(rest) for opening in ("<speak", "<!--"))
        or "<!DOCTYPE".startswith(rest.upper())
    )


@dataclass
class _Open:
    name: str
    line: int
    column: int
    rate: float
    attributes: dict[str, str]


class _Parser:
    """One document: expat calls the handlers, which append segments."""

    def __init__(self, source: str, inserted_at: int | None) -> None:
        self.source = source
        # Where an implicit "<speak>" was put before the text (for error positions).
        self.inserted_at = inserted_at
        self.segments: list[Segment] = []
        self.pieces: list[str] = []  # text waiting to become one Text segment
        self.stack: list[_Open] = []
        self.inner: list[str] | None = None  # the content of a text-only element
        self.sentence_start = self.paragraph_start = False
        self.pause = 0.0
        parser = expat.ParserCreate()
        parser.buffer_text = True
        parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
        parser.StartDoctypeDeclHandler = self._doctype
        parser.EntityDeclHandler = self._entity
        parser.ExternalEntityRefHandler = self._external_entity
        parser.StartElementHandler = self._start
        parser.EndElementHandler = self._end
        parser.CharacterDataHandler = self._characters
        self.parser = parser

    # -- positions and errors ------------------------------------------------------------

    def _position(self, line: int, column: int) -> tuple[int, int]:
        """1-based (line, column) in the caller's text from expat's (line, 0-based column)."""
        column += 1
        if self.inserted_at is not None:
            text = self.source
            inserted_line = text.count("\n", 0, self.inserted_at) + 1
            inserted_column = self.inserted_at - (text.rfind("\n", 0, self.inserted_at) + 1) + 1
            if line == inserted_line and column >= inserted_column + len("<speak>"):
                column -= len("<speak>")
        return line, column

    def _here(self) -> tuple[int, int]:
        return self._position(self.parser.CurrentLineNumber, self.parser.CurrentColumnNumber)

    def error(self, message: str, at: tuple[int, int] | None = None) -> SsmlError:
        line, column = at or self._here()
        return SsmlError(f"invalid SSML at line {line}, column {column}: {message}", line, column)

    def _at(self, element: _Open) -> tuple[int, int]:
        return element.line, element.column

    # -- refused declarations -----------------------------------------------------------

    def _doctype(self, *_: object) -> None:
        found = _DOCTYPE_RE.search(self.source)  # expat calls this at the DOCTYPE's end
        at = line_column(self.source, found.start()) if found else None
        raise self.error("a DOCTYPE is not allowed (no DTDs or entity declarations); remove it", at)

    def _entity(self, *_: object) -> None:
        raise self.error("entity declarations are not allowed; write the text itself")

    def _external_entity(self, *_: object) -> int:
        raise self.error("external entities are not allowed")

    # -- segments ----------------------------------------------------------------------

    @property
    def rate(self) -> float:
        return self.stack[-1].rate if self.stack else 1.0

    def _flags(self) -> dict[str, bool]:
        flags = {"sentence_start": self.sentence_start, "paragraph_start": self.paragraph_start}
        self.sentence_start = self.paragraph_start = False
        return flags

    def _flush(self) -> None:
        text = _collapse("".join(self.pieces))
        self.pieces = []
        if not text:
            return
        flags = self._flags()
        last = self.segments[-1] if self.segments else None
        if isinstance(last, Text) and last.rate == self.rate and not any(flags.values()):
            # "a <prosody rate="medium">b</prosody>": one run of text at one rate
            self.segments[-1] = Text(_collapse(f"{last.text} {text}"), last.rate, **_flags_of(last))
        else:
            self.segments.append(Text(text, self.rate, **flags))

    # -- handlers ----------------------------------------------------------------------

    def _characters(self, data: str) -> None:
        if self.inner is not None:
            self.inner.append(data)
        elif self.stack:
            self.pieces.append(data)

    def _start(self, name: str, attributes: dict[str, str]) -> None:
        line, column = self._here()
        if self.inner is not None:
            parent = self.stack[-1]
            raise self.error(
                f"<{parent.name}> holds only text, not <{name}>; move <{name}> outside it"
            )
        if name not in _ATTRIBUTES:
            hint = (
                "this subset does not support it; remove the tag (and keep its text)"
                if name in _UNSUPPORTED or ":" in name
                else "check the spelling"
            )
            raise self.error(
                f"unknown tag <{name}>: {hint}. Supported: <speak>, <p>, <s>, <break>, "
                "<prosody>, <say-as>, <sub>, <phoneme>"
            )
        if len(self.stack) >= MAX_DEPTH:
            raise self.error(f"elements are nested more than {MAX_DEPTH} deep")
        if (name == "speak") != (not self.stack):
            raise self.error(
                "<speak> must be the outermost element, once"
                if self.stack
                else f"<{name}> must be inside <speak>...</speak>"
            )
        self._check_attributes(name, attributes)
        rate = self.rate
        if name in ("p", "s"):
            self._open_block(name)
        elif name == "break":
            self._break(attributes)
        elif name == "prosody":
            self._flush()
            rate = self._rate(attributes.get("rate"), rate)
        elif name == "say-as":
            self._check_say_as(attributes)
            self.inner = []
        elif name == "sub":
            if not attributes.get("alias", "").strip():
                raise self.error('<sub> needs a non-empty alias="..." (the words to say)')
            self.inner = []
        elif name == "phoneme":
            self._check_phoneme(attributes)
            self.inner = []
        self.stack.append(_Open(name, line, column, rate, attributes))

    def _end(self, name: str) -> None:
        element = self.stack[-1]
        if name in _TEXT_ONLY:
            content, self.inner = "".join(self.inner or []), None
            self._close_text_only(element, content)
        elif name in ("p", "s", "prosody", "speak"):
            self._flush()
            if name in ("p", "s"):  # what follows a sentence or paragraph starts a new one
                self.sentence_start = True
                self.paragraph_start = self.paragraph_start or name == "p"
        self.stack.pop()

    # -- elements ----------------------------------------------------------------------

    def _check_attributes(self, name: str, attributes: dict[str, str]) -> None:
        allowed = _ATTRIBUTES[name]
        for key in attributes:
            if key in allowed or key == "xml:lang" or (name == "speak" and _header(key)):
                continue
            takes = ", ".join(sorted(allowed)) if allowed else "no attributes"
            raise self.error(f"<{name}> has no attribute {key!r} (it takes {takes}); remove it")

    def _open_block(self, name: str) -> None:
        for element in self.stack:
            if element.name == "s" or (name == "p" and element.name == "p"):
                raise self.error(
                    f"<{name}> cannot be inside <{element.name}> (opened at line "
                    f"{element.line}, column {element.column}); close that one first"
                )
        self._flush()
        self.sentence_start = True
        self.paragraph_start = self.paragraph_start or name == "p"

    def _break(self, attributes: dict[str, str]) -> None:
        strength = attributes.get("strength")
        if strength is not None and strength not in BREAK_STRENGTHS:
            raise self.error(
                f"<break> strength {strength!r} is not one of {', '.join(BREAK_STRENGTHS)}"
            )
        time = attributes.get("time")
        if time is not None:
            match = _TIME_RE.fullmatch(time)
            if not match:
                raise self.error(
                    f'<break> time {time!r} has no valid unit: write a number with "s" or '
                    '"ms", such as time="500ms" or time="1.5s"'
                )
            value = float(match.group(1))
            seconds = value / 1000 if match.group(2).lower() == "ms" else value
        else:
            seconds = BREAK_STRENGTHS[strength or "medium"]
        seconds = round(min(seconds, MAX_BREAK_SECONDS), 6)  # microseconds: exact in to_ssml
        self.pause = round(self.pause + seconds, 6)  # a sum of exact microseconds
        if self.pause > MAX_TOTAL_BREAK_SECONDS:
            raise self.error(
                f"the breaks add up to more than {MAX_TOTAL_BREAK_SECONDS:g} s; shorten them or "
                "split the text into several requests"
            )
        self._flush()
        self.segments.append(Break(seconds))

    def _rate(self, value: str | None, enclosing: float) -> float:
        if value is None:
            return enclosing
        keyword = value.strip().lower()
        if keyword in RATES:
            rate = RATES[keyword]
        else:
            match = _RELATIVE_RE.fullmatch(value.strip())
            if not match:
                raise self.error(
                    f"<prosody> rate {value!r} is not valid: use x-slow, slow, medium, fast, "
                    'x-fast, a percentage ("80%", "+20%") or a multiplier ("1.2")'
                )
            sign, number, percent = match.groups()
            amount = float(number)
            if percent and sign:
                rate = enclosing * (1 + (amount if sign == "+" else -amount) / 100)
            elif percent:
                rate = enclosing * amount / 100
            elif sign == "-":
                raise self.error(f"<prosody> rate {value!r} is negative")
            else:
                rate = enclosing * amount
        rate = round(rate, 6)  # 0.8 x 150% is 1.2, not 1.2000000000000002
        if not (math.isfinite(rate) and MIN_RATE <= rate <= MAX_RATE):
            raise self.error(
                f"<prosody> rate {value!r} gives {rate:g}x speed; it must stay within "
                f"{MIN_RATE:g}-{MAX_RATE:g}"
            )
        return rate

    def _check_say_as(self, attributes: dict[str, str]) -> None:
        kind = attributes.get("interpret-as")
        if kind is None:
            raise self.error('<say-as> needs interpret-as="..."')
        if kind not in RENDERERS:
            raise self.error(f"<say-as> interpret-as {kind!r} is not one of {', '.join(RENDERERS)}")
        fmt = attributes.get("format")
        if fmt is not None:
            if kind not in FORMATS:
                raise self.error(f"<say-as interpret-as={kind!r}> takes no format; remove it")
            formats = FORMATS[kind]
            if formats is not None and fmt not in formats:
                raise self.error(
                    f"<say-as interpret-as={kind!r}> format {fmt!r} is not one of "
                    f"{', '.join(formats)}"
                )

    def _check_phoneme(self, attributes: dict[str, str]) -> None:
        alphabet = attributes.get("alphabet", "ipa")
        if alphabet.lower() != "ipa":
            raise self.error(f'<phoneme> alphabet {alphabet!r} is not supported; use "ipa"')
        if not attributes.get("ph", "").strip():
            raise self.error('<phoneme> needs ph="..." with the IPA phonemes to say')

    def _close_text_only(self, element: _Open, content: str) -> None:
        attributes = element.attributes
        if element.name == "say-as":
            try:
                words = render_say_as(attributes["interpret-as"], content, attributes.get("format"))
            except ValueError as error:
                raise self.error(f"<say-as>: {error}", self._at(element)) from None
            self.pieces.append(f" {words} ")
        elif element.name == "sub":
            self.pieces.append(f" {attributes['alias']} ")
        else:  # phoneme
            self._flush()
            ipa = " ".join(attributes["ph"].split())
            self.segments.append(Phonemes(ipa, _collapse(content), self.rate, **self._flags()))

    # -- the document ------------------------------------------------------------------

    def parse(self, xml: str) -> Document:
        try:
            self.parser.Parse(xml, True)
        except expat.ExpatError as error:
            raise self._expat_error(error, xml) from None
        return Document(fold_marks(self.segments))

    def _expat_error(self, error: expat.ExpatError, xml: str) -> SsmlError:
        at = self._position(error.lineno, error.offset)
        code = error.code
        codes = expat.errors.codes
        if code == codes[expat.errors.XML_ERROR_NO_ELEMENTS] and self.stack:
            element = self.stack[-1]
            return self.error(
                f"<{element.name}> is never closed; close it with </{element.name}>",
                self._at(element),
            )
        if code == codes[expat.errors.XML_ERROR_TAG_MISMATCH]:
            element = self.stack[-1]
            offset = _offset(xml, error.lineno, error.offset)
            tag_start = xml.rfind("</", 0, offset + 1)
            found = _CLOSING_TAG_RE.match(xml, tag_start) if tag_start >= 0 else None
            closing = f"</{found.group(1)}>" if found else "this closing tag"
            if found:  # point at the closing tag itself
                at = self._position(error.lineno, error.offset - (offset - tag_start))
            if self.inserted_at is not None and len(self.stack) == 1:
                return self.error(f"{closing} closes no open element; remove it", at)
            return self.error(
                f"{closing} does not match <{element.name}> (opened at line {element.line}, "
                f"column {element.column}); close </{element.name}> first",
                at,
            )
        if code == codes[expat.errors.XML_ERROR_UNDEFINED_ENTITY]:
            return self.error(
                "unknown entity: only &amp; &lt; &gt; &quot; &apos; and character references "
                "such as &#233; are allowed (write & as &amp;)",
                at,
            )
        offset = _offset(xml, error.lineno, error.offset)
        declared = xml.rfind("<!", max(0, offset - 2), offset + 1)
        if declared >= 0 and _DECLARATION_RE.match(xml, declared):
            return self.error(
                "markup declarations (<!ENTITY>, <!ELEMENT>, ...) are not allowed (no DTDs or "
                "entity declarations); remove it",
                self._position(error.lineno, error.offset - (offset - declared)),
            )
        if code == codes[expat.errors.XML_ERROR_INVALID_TOKEN]:
            return self.error(
                "not well-formed: a '<' or '&' in text must be written &lt; or &amp;", at
            )
        if code == codes[expat.errors.XML_ERROR_JUNK_AFTER_DOC_ELEMENT]:
            return self.error("text after </speak>; put everything inside <speak>", at)
        if code == codes[expat.errors.XML_ERROR_UNCLOSED_TOKEN]:
            return self.error("a tag is not finished; end it with '>'", at)
        return self.error(f"{expat.errors.messages[code]}; check the markup there", at)


def _header(attribute: str) -> bool:
    """An attribute of the W3C header of <speak> that changes nothing spoken: a namespace
    declaration (W3C's, or a vendor's such as xmlns:mstts), and XML Schema's hints
    (xsi:schemaLocation, as the specification's examples write)."""
    return attribute.startswith(("xmlns:", "xsi:"))


def line_column(text: str, index: int) -> tuple[int, int]:
    """1-based (line, column) of an index."""
    return text.count("\n", 0, index) + 1, index - (text.rfind("\n", 0, index) + 1) + 1


def _offset(text: str, line: int, column: int) -> int:
    """The index of (1-based line, 0-based column) in text."""
    start = 0
    for _ in range(line - 1):
        start = text.index("\n", start) + 1
    return start + column


def _flags_of(segment: Text) -> dict[str, bool]:
    return {"sentence_start": segment.sentence_start, "paragraph_start": segment.paragraph_start}


def _collapse(text: str) -> str:
    """Whitespace of the markup to single spaces, none before punctuation."""
    return re.sub(r" (?=[,.;:!?])", "", " ".join(text.split()))


def parse_ssml(text: str) -> Document:
    """Parse SSML into a Document. A text that does not start with <speak> is read as the
    content of one ("Hello <break time="1s"/> world."). SsmlError names the line and column
    of what is wrong and how to fix it."""
    text = check_text(text)
    head, _ = _prolog(text)
    # expat takes a declaration only as a document's very first characters, a byte-order
    # mark only before it: both become spaces (the same length, so every position in an
    # error is still the writer's), and a declaration after whitespace or a comment is no
    # error. A DOCTYPE stays for the parser to refuse.
    source = _blank_prolog(text, head)
    if _SPEAK_RE.match(text, head) or _DOCTYPE_RE.match(text, head):
        return _Parser(text, None).parse(source)
    wrapped = f"{source[:head]}<speak>{source[head:]}</speak>"
    return _Parser(text, head).parse(wrapped)


def _blank_prolog(text: str, head: int) -> str:
    """`text` with the byte-order marks and XML declarations of its prolog (before `head`)
    written as spaces, newlines kept."""
    prolog = text[:head].replace(_BOM, " ")
    prolog = re.sub(_XML_DECLARATION, lambda m: re.sub(r"[^\n]", " ", m.group(0)), prolog)
    return prolog + text[head:]


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _attribute(value: str) -> str:
    return _escape(value).replace('"', "&quot;")


def to_ssml(document: Document) -> str:
    """SSML that parses back to the same document: sentences as <s>, paragraphs as <p>,
    rates as <prosody rate>, breaks as <break time>."""
    out = ["<speak>"]
    in_p = in_s = False
    for segment in document:
        if isinstance(segment, Break):
            seconds = f"{segment.seconds:.6f}".rstrip("0").rstrip(".")
            out.append(f'<break time="{seconds}s"/>')
            continue
        if segment.paragraph_start or segment.sentence_start:
            if in_s:
                out.append("</s>")
            if segment.paragraph_start:
                if in_p:
                    out.append("</p>")
                out.append("<p>")
                in_p = True
            out.append("<s>")
            in_s = True
        if isinstance(segment, Text):
            body = _escape(segment.text)
        else:
            body = f'<phoneme alphabet="ipa" ph="{_attribute(segment.ipa)}">'
            body += f"{_escape(segment.text)}</phoneme>"
        if segment.rate != 1.0:
            body = f'<prosody rate="{segment.rate!r}">{body}</prosody>'
        out.append(body)
    out.append("</s>" * in_s + "</p>" * in_p + "</speak>")
    return " ".join(out)

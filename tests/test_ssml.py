"""SSML subset and [[ phonemes ]] (issue 38, deliverable 2, parsing): typed segments with
real expectations, errors that name the position, the security cases (entities, DTDs, deep
nesting, huge breaks), markup never reaching the spoken text, and round trips."""

from __future__ import annotations

import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onnx_tts.errors import InputError, MarkupError, OnnxTTSWarning, SsmlError
from onnx_tts.frontend import normalize_text
from onnx_tts.frontend.markup import parse_markup, split_phoneme_spans
from onnx_tts.frontend.segments import Break, Document, Phonemes, Text
from onnx_tts.frontend.ssml import (
    BREAK_STRENGTHS,
    MAX_BREAK_SECONDS,
    MAX_DEPTH,
    MAX_TOTAL_BREAK_SECONDS,
    is_ssml,
    parse_ssml,
    to_ssml,
)


def segments(ssml: str) -> list:
    return list(parse_ssml(ssml))


# (SSML, the segments a family receives)
DOCUMENTS = [
    ("<speak>Hello world.</speak>", [Text("Hello world.")]),
    ("<speak>  Hello\n\t  world .  </speak>", [Text("Hello world.")]),
    (
        '<speak>Hello <break time="1s"/> world.</speak>',
        [Text("Hello"), Break(1.0), Text("world.")],
    ),
    (  # the example, without <speak>: read as SSML when SSML is forced
        'Hello <break time="1s"/> world.',
        [Text("Hello"), Break(1.0), Text("world.")],
    ),
    (
        "<speak><p><s>One.</s><s>Two.</s></p><p><s>Three.</s></p></speak>",
        [
            Text("One.", sentence_start=True, paragraph_start=True),
            Text("Two.", sentence_start=True),
            Text("Three.", sentence_start=True, paragraph_start=True),
        ],
    ),
    (
        "<speak>Before <s>inside</s> after</speak>",
        [Text("Before"), Text("inside", sentence_start=True), Text("after", sentence_start=True)],
    ),
    (
        "<speak><p>Para one.</p> Loose text.</speak>",
        [
            Text("Para one.", sentence_start=True, paragraph_start=True),
            Text("Loose text.", sentence_start=True, paragraph_start=True),
        ],
    ),
    (
        '<speak><s>Wait <break strength="strong"/> for it.</s></speak>',
        [Text("Wait", sentence_start=True), Break(0.75), Text("for it.")],
    ),
    (
        '<speak><prosody rate="slow">Slowly.</prosody> Normal.</speak>',
        [Text("Slowly.", rate=0.75), Text("Normal.")],
    ),
    (
        '<speak><prosody rate="80%">a <prosody rate="150%">b</prosody> c</prosody></speak>',
        [Text("a", rate=0.8), Text("b", rate=1.2), Text("c", rate=0.8)],
    ),
    (
        '<speak><prosody rate="x-fast">quick</prosody><prosody rate="1.2">bit</prosody></speak>',
        [Text("quick", rate=1.5), Text("bit", rate=1.2)],
    ),
    (
        '<speak><prosody rate="+20%">up</prosody> <prosody rate="-20%">down</prosody></speak>',
        [Text("up", rate=1.2), Text("down", rate=0.8)],
    ),
    (
        '<speak>Call <say-as interpret-as="telephone">555-1234</say-as> now.</speak>',
        [Text("Call five five five, one two three four now.")],
    ),
    (
        '<speak><say-as interpret-as="characters">ABC</say-as> and '
        '<say-as interpret-as="spell-out">R2D2</say-as></speak>',
        [Text("A-B-C and R-two-D-two")],
    ),
    (
        '<speak><say-as interpret-as="cardinal">1,234</say-as> '
        '<say-as interpret-as="cardinal">-3.5</say-as></speak>',
        [Text("one thousand two hundred thirty four minus three point five")],
    ),
    (
        '<speak>the <say-as interpret-as="ordinal">21</say-as> and the '
        '<say-as interpret-as="ordinal">3rd</say-as></speak>',
        [Text("the twenty-first and the third")],
    ),
    (
        '<speak>PIN <say-as interpret-as="digits">2024</say-as></speak>',
        [Text("PIN two zero two four")],
    ),
    (
        '<speak><say-as interpret-as="date">2024-01-15</say-as>, '
        '<say-as interpret-as="date" format="dmy">15/01/2024</say-as>, '
        '<say-as interpret-as="date" format="md">12/25</say-as>, '
        '<say-as interpret-as="date" format="y">1984</say-as></speak>',
        [
            Text(
                "January fifteenth, twenty twenty four, the fifteenth of January, twenty "
                "twenty four, December twenty-fifth, nineteen eighty four"
            )
        ],
    ),
    (
        '<speak><say-as interpret-as="date" format="mdy">Jan 5 2020</say-as></speak>',
        [Text("January fifth, twenty twenty")],
    ),
    (
        '<speak>at <say-as interpret-as="time">3:30pm</say-as>, '
        '<say-as interpret-as="time">15:45</say-as>, '
        '<say-as interpret-as="time" format="hms12">15:00</say-as>, '
        '<say-as interpret-as="time">9:05:30</say-as></speak>',
        [Text("at three thirty PM, fifteen forty five, three PM, nine oh five and thirty seconds")],
    ),
    (
        '<speak><sub alias="World Wide Web Consortium">W3C</sub> rules.</speak>',
        [Text("World Wide Web Consortium rules.")],
    ),
    (
        '<speak>Say <phoneme alphabet="ipa" ph="təˈmɑːtoʊ">tomato</phoneme>.</speak>',
        [Text("Say"), Phonemes("təˈmɑːtoʊ", "tomato.")],  # the "." joins the words before
    ),
    (
        '<speak><s><prosody rate="slow"><phoneme ph="  h ə  l oʊ ">hello</phoneme>'
        "</prosody></s></speak>",
        [Phonemes("h ə l oʊ", "hello", rate=0.75, sentence_start=True)],
    ),
    (
        '<?xml version="1.0" encoding="UTF-8"?>\n<speak version="1.1" '
        'xmlns="http://www.w3.org/2001/10/synthesis" xml:lang="en-US">'
        '<p xml:lang="en-US">Fish &amp; chips &lt;3 caf&#233; &quot;yes&quot;</p></speak>',
        [Text('Fish & chips <3 café "yes"', sentence_start=True, paragraph_start=True)],
    ),
    (
        "<speak>a<!-- a comment: <break/> --> b <![CDATA[x < y]]></speak>",
        [Text("a b x < y")],
    ),
    ("<speak></speak>", []),
    ('<speak><break time="250ms"/></speak>', [Break(0.25)]),
]


@pytest.mark.parametrize(("ssml", "expected"), DOCUMENTS, ids=[s[:60] for s, _ in DOCUMENTS])
def test_a_document_parses_to_its_segments(ssml: str, expected: list) -> None:
    assert segments(ssml) == expected


@pytest.mark.parametrize(("strength", "seconds"), sorted(BREAK_STRENGTHS.items()))
def test_break_strengths_follow_the_documented_table(strength: str, seconds: float) -> None:
    assert segments(f'<speak>a<break strength="{strength}"/>b</speak>')[1] == Break(seconds)


def test_the_strength_table_grows_from_none_to_x_strong() -> None:
    order = ["none", "x-weak", "weak", "medium", "strong", "x-strong"]
    assert [BREAK_STRENGTHS[name] for name in order] == [0.0, 0.1, 0.25, 0.4, 0.75, 1.2]


@pytest.mark.parametrize(
    ("attributes", "seconds"),
    [
        ("", 0.4),  # a bare <break/> is medium
        ('time="500ms"', 0.5),
        ('time="1s"', 1.0),
        ('time="1.5s"', 1.5),
        ('time=" 2 s "', 2.0),
        ('time="0ms"', 0.0),
        ('time="750MS"', 0.75),
        ('time="300ms" strength="x-strong"', 0.3),  # time wins over strength
        ('time="60s"', MAX_BREAK_SECONDS),  # capped
        ('time="999999999s"', MAX_BREAK_SECONDS),
    ],
)
def test_break_times(attributes: str, seconds: float) -> None:
    assert segments(f"<speak>a<break {attributes}/>b</speak>")[1] == Break(seconds)


def error_of(ssml: str) -> SsmlError:
    with pytest.raises(SsmlError) as caught:
        parse_ssml(ssml)
    return caught.value


# (SSML, line, column, words the message must hold)
ERRORS = [
    ("<speak>Hello <foo/></speak>", 1, 14, ["unknown tag <foo>", "<break>"]),
    ("<speak>\n  <emphasis>x</emphasis></speak>", 2, 3, ["<emphasis>", "remove the tag"]),
    ("<speak><amazon:effect>x</amazon:effect></speak>", 1, 8, ["<amazon:effect>"]),
    ('<speak>a <break time="1sec"/></speak>', 1, 10, ["'1sec'", 'time="500ms"']),
    ('<speak>a <break time="500"/></speak>', 1, 10, ["no valid unit"]),
    ('<speak>a <break time="-1s"/></speak>', 1, 10, ["no valid unit"]),
    ('<speak>a <break strength="loud"/></speak>', 1, 10, ["'loud'", "x-strong"]),
    ('<speak>a <break duration="1s"/></speak>', 1, 10, ["no attribute 'duration'", "time"]),
    ('<speak><prosody pitch="+2st">x</prosody></speak>', 1, 8, ["'pitch'", "takes rate"]),
    ('<speak><prosody rate="10">x</prosody></speak>', 1, 8, ["10x", "0.25-4"]),
    ('<speak><prosody rate="quick">x</prosody></speak>', 1, 8, ["'quick'", "x-slow"]),
    ('<speak><prosody rate="0%">x</prosody></speak>', 1, 8, ["0x"]),
    ('<speak><say-as interpret-as="cardinal">abc</say-as></speak>', 1, 8, ["'abc'"]),
    ('<speak><say-as interpret-as="verbatim">ab</say-as></speak>', 1, 8, ["'verbatim'"]),
    ("<speak><say-as>12</say-as></speak>", 1, 8, ["interpret-as"]),
    ('<speak><say-as interpret-as="date" format="xyz">1</say-as></speak>', 1, 8, ["'xyz'"]),
    ('<speak><say-as interpret-as="date">2024-13-01</say-as></speak>', 1, 8, ["month"]),
    ('<speak><say-as interpret-as="time">25:00</say-as></speak>', 1, 8, ["0-23"]),
    ('<speak><say-as interpret-as="ordinal" format="x">1</say-as></speak>', 1, 8, ["format"]),
    ('<speak><say-as interpret-as="digits">12a</say-as></speak>', 1, 8, ["digits"]),
    ('<speak><say-as interpret-as="cardinal"> </say-as></speak>', 1, 8, ["no content"]),
    ('<speak><say-as interpret-as="cardinal"><s>1</s></say-as></speak>', 1, 40, ["only text"]),
    ("<speak><sub>W3C</sub></speak>", 1, 8, ["alias"]),
    ('<speak><phoneme alphabet="x-sampa" ph="a">a</phoneme></speak>', 1, 8, ['"ipa"']),
    ("<speak><phoneme>a</phoneme></speak>", 1, 8, ["ph="]),
    ("<speak>\n  Hello <s>world\n</speak>", 3, 1, ["</speak>", "<s>", "line 2, column 9"]),
    ("<speak>Hello <s>world", 1, 14, ["<s> is never closed", "</s>"]),
    ("<speak>Hello</speak> junk", 1, 22, ["after </speak>"]),
    ("<speak>a < b</speak>", 1, 11, ["&lt;"]),
    ("<speak>fish & chips</speak>", 1, 14, ["&amp;"]),
    ("<speak>&nbsp;</speak>", 1, 8, ["unknown entity"]),
    ("<speak>a</speak", 1, 9, ["not finished"]),
    ("<speak><s><p>x</p></s></speak>", 1, 11, ["<p> cannot be inside <s>"]),
    ("<speak><s><s>x</s></s></speak>", 1, 11, ["<s> cannot be inside <s>"]),
    ("<speak><speak>x</speak></speak>", 1, 8, ["outermost"]),
    ("Hello </s> world", 1, 7, ["</s> closes no open element"]),
    ("Hi <s>x</p>", 1, 8, ["</p> does not match <s>", "column 4"]),
    ('<speak>\n<p version="1">x</p></speak>', 2, 1, ["no attribute 'version'"]),
]


@pytest.mark.parametrize(("ssml", "line", "column", "words"), ERRORS, ids=[e[0] for e in ERRORS])
def test_invalid_ssml_names_the_position_and_the_fix(
    ssml: str, line: int, column: int, words: list[str]
) -> None:
    error = error_of(ssml)
    assert (error.line, error.column) == (line, column), str(error)
    message = str(error)
    assert message.startswith(f"invalid SSML at line {line}, column {column}: ")
    for word in words:
        assert word in message, message


def test_errors_are_input_errors() -> None:
    assert issubclass(SsmlError, MarkupError) and issubclass(MarkupError, InputError)
    assert isinstance(error_of("<speak><foo/></speak>"), ValueError)


def test_columns_count_characters_not_bytes() -> None:
    error = error_of("<speak>café, naïve, 日本 <foo/></speak>")
    assert (error.line, error.column) == (1, 24)


# -- security -------------------------------------------------------------------------

BILLION_LAUGHS = (
    '<?xml version="1.0"?>\n<!DOCTYPE lolz [\n <!ENTITY lol "lol">\n'
    + "".join(
        f' <!ENTITY lol{i} "{("&lol" + (str(i - 1) if i > 1 else "") + ";") * 10}">\n'
        for i in range(1, 10)
    )
    + "]>\n<speak>&lol9;</speak>"
)


@pytest.mark.parametrize(
    "attack",
    [
        BILLION_LAUGHS,
        '<!DOCTYPE speak [<!ENTITY x SYSTEM "file:///etc/passwd">]><speak>&x;</speak>',
        '<!DOCTYPE speak SYSTEM "http://127.0.0.1:9/speak.dtd"><speak>hi</speak>',
        '<!DOCTYPE speak [<!ENTITY % p SYSTEM "file:///etc/passwd"> %p;]><speak>x</speak>',
    ],
    ids=["billion-laughs", "external-entity", "external-dtd", "parameter-entity"],
)
def test_dtds_and_entity_declarations_are_refused(attack: str) -> None:
    error = error_of(attack)
    assert "DOCTYPE is not allowed" in str(error)
    assert "root:" not in str(error)  # nothing of /etc/passwd


def test_a_malformed_declaration_is_an_error_too() -> None:
    error = error_of("<!doctype speak><speak>x</speak>")
    assert (error.line, error.column) == (1, 1) and "check the markup" in str(error)


def test_an_undeclared_entity_is_not_expanded() -> None:
    assert "unknown entity" in str(error_of("<speak>&lol9;</speak>"))


def test_nesting_is_bounded() -> None:
    within = "<speak>" + "<prosody>" * (MAX_DEPTH - 1) + "x" + "</prosody>" * (MAX_DEPTH - 1)
    assert segments(within + "</speak>") == [Text("x")]
    deep = 10_000
    error = error_of("<speak>" + "<prosody>" * deep + "x" + "</prosody>" * deep + "</speak>")
    assert f"nested more than {MAX_DEPTH} deep" in str(error)


def test_one_break_is_capped_and_all_breaks_are_bounded() -> None:
    many = int(MAX_TOTAL_BREAK_SECONDS // MAX_BREAK_SECONDS)
    document = parse_ssml("<speak>" + '<break time="10s"/>' * many + "</speak>")
    assert document.pause_seconds == MAX_TOTAL_BREAK_SECONDS
    error = error_of("<speak>" + '<break time="10s"/>' * (many + 1) + "</speak>")
    assert "add up to more than" in str(error)
    assert error.column == 8 + many * len('<break time="10s"/>')


def test_a_huge_document_is_refused_by_the_text_bound() -> None:
    with pytest.raises(InputError, match="at most"):
        parse_ssml("<speak>" + "word " * 50_000 + "</speak>")


def test_a_large_valid_document_parses() -> None:
    body = '<s>Hello <break time="10ms"/> there, <say-as interpret-as="cardinal">42</say-as>.</s>'
    document = parse_ssml("<speak>" + body * 2_000 + "</speak>")
    assert len(document) == 2_000 * 3
    assert document.segments[:3] == (
        Text("Hello", sentence_start=True),
        Break(0.01),
        Text("there, forty two."),
    )


# -- is_ssml, [[ ]], parse_markup -------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<speak>Hi</speak>", True),
        ("  \n<speak version='1.0'>Hi</speak>", True),
        ('<?xml version="1.0"?><speak>Hi</speak>', True),
        ("\ufeff<speak>Hi</speak>", True),
        ("<speak/>", True),
        ("if a < b then", False),
        ("<b>bold</b>", False),
        ("<speaker>Hi</speaker>", False),
        ("Hello <speak>", False),
        ("", False),
    ],
)
def test_is_ssml(text: str, expected: bool) -> None:
    assert is_ssml(text) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Say [[ h ə l ˈoʊ ]] now.", [Text("Say"), Phonemes("h ə l ˈoʊ"), Text("now.")]),
        ("[[ˈaɪ]] [[ æm ]]", [Phonemes("ˈaɪ"), Phonemes("æm")]),
        ("no markup here", [Text("no markup here")]),
        ("a ]] b", [Text("a ]] b")]),
        ("x [[\n  p  ə \n]] y", [Text("x"), Phonemes("p ə"), Text("y")]),
        ("", []),
    ],
)
def test_phoneme_spans(text: str, expected: list) -> None:
    assert split_phoneme_spans(text) == expected


@pytest.mark.parametrize(
    ("text", "line", "column", "words"),
    [
        ("Say [[ h ə", 1, 5, ["never closed", "]]"]),
        ("one\ntwo [[ ]] three", 2, 5, ["empty"]),
        ("[[ a [[ b ]]", 1, 6, ["inside another"]),
    ],
)
def test_phoneme_span_errors_name_the_position(
    text: str, line: int, column: int, words: list[str]
) -> None:
    with pytest.raises(MarkupError) as caught:
        split_phoneme_spans(text)
    error = caught.value
    assert (error.line, error.column) == (line, column)
    assert f"line {line}, column {column}" in str(error)
    for word in words:
        assert word in str(error)


def test_parse_markup_reads_speak_as_ssml_and_the_rest_as_text() -> None:
    assert list(parse_markup("<speak>a<break/>b</speak>")) == [Text("a"), Break(0.4), Text("b")]
    assert list(parse_markup("if a < b then [[ ð ɛ n ]]")) == [
        Text("if a < b then"),
        Phonemes("ð ɛ n"),
    ]
    assert list(parse_markup('Hi <break time="1s"/> there', ssml=True)) == [
        Text("Hi"),
        Break(1.0),
        Text("there"),
    ]
    assert list(parse_markup("<speak>a</speak>", ssml=False)) == [Text("<speak>a</speak>")]
    with pytest.raises(SsmlError):
        parse_markup("if a < b then", ssml=True)
    with pytest.raises(InputError, match="empty"):
        parse_markup("  ")


def test_document_text_and_pauses() -> None:
    document = parse_ssml(
        '<speak>Hi <break time="1s"/><phoneme ph="ðɛə">there</phoneme>'
        '<break strength="weak"/>.</speak>'
    )
    assert document.text == "Hi there."  # the lone "." joined the words before the break
    assert document.pause_seconds == 1.25
    assert document.has_phonemes
    assert not Document((Text("x"),)).has_phonemes


# -- how real documents begin (issue 43) ----------------------------------------------

BODY = '<speak>Step one. <break time="300ms"/><prosody rate="slow">Then two.</prosody></speak>'
W3C_HEADER = (
    '<speak version="1.1" xmlns="http://www.w3.org/2001/10/synthesis" '
    'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
    'xsi:schemaLocation="http://www.w3.org/2001/10/synthesis '
    'http://www.w3.org/TR/speech-synthesis11/synthesis.xsd" xml:lang="en-US">'
)
# What editors, Polly and Azure put before <speak>.
OPENINGS = {
    "bom": "\ufeff",
    "newline": "\n",
    "spaces and tabs": " \t \r\n",
    "declaration": '<?xml version="1.0"?>',
    "declaration, encoding, standalone": (
        '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
    ),
    "whitespace before the declaration": '\n  <?xml version="1.0"?>\n',
    "bom, then the declaration": '\ufeff<?xml version="1.0" encoding="utf-8"?>\r\n',
    "bom after whitespace": " \ufeff",
    "comment": "<!-- exported by an editor -->\n",
    "comment holding markup": "<!-- <speak>old</speak> & --> ",
    "processing instruction": '<?xml-stylesheet href="speech.css"?>',
    "declaration, comment, instruction": (
        '<?xml version="1.0"?>\n<!-- a -->\n<?app hint?>\n<!-- b -->\n'
    ),
}


@pytest.mark.parametrize("opening", OPENINGS.values(), ids=OPENINGS.keys())
def test_a_document_is_ssml_however_it_begins(opening: str) -> None:
    """Such documents were read aloud as text, markup included (or refused: whitespace before
    the declaration); they parse exactly as the same document starting at <speak>."""
    expected = parse_ssml(BODY)
    assert is_ssml(opening + BODY)
    assert parse_markup(opening + BODY) == expected
    assert parse_ssml(opening + BODY) == expected
    # a forced SSML text that has no <speak> is still its content after such a beginning
    assert parse_markup(opening + "Hello <break/> there.", ssml=True) == parse_ssml(
        "<speak>Hello <break/> there.</speak>"
    )


def test_errors_after_an_opening_name_the_writers_position() -> None:
    error = error_of('\ufeff  <?xml version="1.0"?>\n<!-- c -->\n<speak>Hi <foo/></speak>')
    assert (error.line, error.column) == (3, 11), str(error)
    error = error_of('  <?xml version="1.0"?> <speak>Hi <foo/></speak>')
    assert (error.line, error.column) == (1, 35), str(error)


@pytest.mark.parametrize(
    "document",
    [
        '<?xml version="1.0"?>\n' + BILLION_LAUGHS.split("\n", 1)[1],
        "<!-- x -->\n" + BILLION_LAUGHS,
        "\ufeff\n" + BILLION_LAUGHS,
        '<!DOCTYPE speak PUBLIC "-//W3C//DTD SYNTHESIS 1.0//EN" '
        '"http://www.w3.org/TR/speech-synthesis/synthesis.dtd"><speak>Hi</speak>',
        '<?xml version="1.0"?><!DOCTYPE speak [<!ENTITY w "world">]><speak>Hello &w;</speak>',
    ],
    ids=["declaration", "comment", "bom", "w3c-public-dtd", "one-entity"],
)
def test_a_doctype_is_refused_whatever_comes_before_it(document: str) -> None:
    """A billion-laughs document after an XML declaration was spoken as text (22 s, HTTP
    200): now it is SSML, whose DOCTYPE is refused before any entity is declared."""
    assert is_ssml(document)
    with pytest.raises(SsmlError, match="a DOCTYPE is not allowed") as caught:
        parse_markup(document)
    doctype = document.index("<!DOCTYPE")
    line = document.count("\n", 0, doctype) + 1
    assert caught.value.line == line
    assert "lol" not in str(caught.value) and "world" not in str(caught.value)


@pytest.mark.parametrize(
    ("document", "line", "column"),
    [
        ('<!ENTITY lol "lol"><speak>&lol;</speak>', 1, 1),
        ("<!-- x -->\n <!ELEMENT speak ANY><speak>x</speak>", 2, 2),
        ('<speak>a <!ENTITY x "y"> b</speak>', 1, 10),
    ],
)
def test_an_entity_declaration_outside_a_doctype_is_refused_not_read(
    document: str, line: int, column: int
) -> None:
    assert is_ssml(document)
    with pytest.raises(SsmlError, match=r"markup declarations .* are not allowed") as caught:
        parse_markup(document)
    assert (caught.value.line, caught.value.column) == (line, column)


def test_xml_constructs_without_speak_are_parsed_not_read() -> None:
    assert parse_markup("<!-- draft -->Hello there.") == Document((Text("Hello there."),))
    for document, message in [
        ('<?xml version="1.0"?><html>Hi</html>', "unknown tag <html>"),
        ("<!-- never closed <speak>Hi</speak>", "not finished"),
        ('<?xml version="1.0"', "not finished"),
    ]:
        with pytest.raises(SsmlError, match=message):
            parse_markup(document)
    assert parse_markup("if a < b then") == Document((Text("if a < b then"),))
    assert parse_markup("<3 you") == Document((Text("<3 you"),))


def test_the_w3c_header_and_vendor_namespaces_are_accepted() -> None:
    document = W3C_HEADER + "Hello.</speak>"
    assert parse_ssml(document) == Document((Text("Hello."),))
    azure = (
        '<speak version="1.0" xmlns="http://www.w3.org/2001/10/synthesis" '
        'xmlns:mstts="https://www.w3.org/2001/mstts" '
        'xmlns:emo="http://www.w3.org/2009/10/emotionml" '
        'xml:lang="en-US">Hello.</speak>'
    )
    assert parse_ssml(azure) == Document((Text("Hello."),))
    # an attribute of a vendor is still refused where it would change the speech
    with pytest.raises(SsmlError, match="no attribute 'xsi:type'"):
        parse_ssml('<speak><prosody xsi:type="x" rate="slow">a</prosody></speak>')
    with pytest.raises(SsmlError, match="no attribute 'amazon:auto-breaths'"):
        parse_ssml('<speak amazon:auto-breaths="on">a</speak>')


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '<speak>Step four, <prosody rate="80%">relax</prosody>.</speak>',
            [Text("Step four,"), Text("relax.", rate=0.8)],
        ),
        ("Say [[ h ə l ˈoʊ ]].", [Text("Say"), Phonemes("h ə l ˈoʊ")]),
        ("[[ h ə l ˈoʊ ]]!", [Phonemes("h ə l ˈoʊ")]),
        ('<speak>Wait <break time="1s"/>.</speak>', [Text("Wait."), Break(1.0)]),
        (
            '<speak><p>"<prosody rate="slow">Hi</prosody>"</p> there</speak>',
            [
                Text('Hi"', rate=0.75, sentence_start=True, paragraph_start=True),
                Text("there", sentence_start=True, paragraph_start=True),
            ],
        ),
        (
            '<speak><s>(</s><s><prosody rate="fast">quick</prosody>) —</s></speak>',
            [Text("quick)—", rate=1.25, sentence_start=True)],
        ),
        ("<speak>.</speak>", [Text(".")]),  # nothing speakable at all: the family says so
        ('<speak>5 <prosody rate="slow">%</prosody></speak>', [Text("5"), Text("%", 0.75)]),
    ],
)
def test_punctuation_beside_markup_joins_the_words_before_it(text: str, expected: list) -> None:
    """A lone "." after a prosody or a [[ ]] failed the whole request: "nothing speakable"."""
    assert list(parse_markup(text)) == expected


@pytest.mark.parametrize(
    ("start", "undecided"),
    [
        ("", True),
        ("  \ufeff", True),
        ("<spe", True),
        ('<?xml version="1.0"', True),
        ("<!-- a comment not closed", True),
        ("<!DOC", True),
        ('<?xml version="1.0"?>', False),  # an XML document: SSML
        ("<!-- c -->", False),
        ("<speak>", False),
        ("Hello", False),
        ("<b>", False),
    ],
)
def test_a_streamed_text_waits_until_its_start_says_whether_it_is_ssml(
    start: str, undecided: bool
) -> None:
    from onnx_tts.frontend.ssml import ssml_undecided

    assert ssml_undecided(start) is undecided


# -- say-as words are the normaliser's words ------------------------------------------

SAY_AS = [
    ("telephone", None, "+1 (555) 123-4567"),
    ("date", None, "2024-01-15"),
    ("date", "dmy", "3/5/2021"),
    ("time", None, "10:05 am"),
    ("time", None, "15:00"),
    ("cardinal", None, "1,000,000"),
    ("ordinal", None, "101"),
    ("digits", None, "90210"),
    ("characters", None, "AT&T"),
]


@pytest.mark.parametrize(("kind", "fmt", "content"), SAY_AS)
def test_say_as_words_survive_the_family_normaliser(
    kind: str, fmt: str | None, content: str
) -> None:
    """The family normalises Text segments again: rendered words must come back unchanged."""
    fmt_attribute = f' format="{fmt}"' if fmt else ""
    escaped = content.replace("&", "&amp;")
    (text,) = segments(
        f'<speak><say-as interpret-as="{kind}"{fmt_attribute}>{escaped}</say-as></speak>'
    )
    assert normalize_text(text.text) == text.text
    assert not any(ch.isdigit() for ch in text.text)


def test_say_as_reads_like_the_normaliser() -> None:
    """One reader for each form: say-as gives what the normaliser gives for the same form."""
    for kind, written in [
        ("telephone", "555-123-4567"),
        ("date", "2024-01-15"),
        ("time", "3:30 pm"),
        ("cardinal", "1,234"),
    ]:
        (text,) = segments(f'<speak><say-as interpret-as="{kind}">{written}</say-as></speak>')
        assert text.text == normalize_text(written)


# -- properties -----------------------------------------------------------------------

_WORDS = st.sampled_from("apple river stone cloud music green quiet window".split())
_MARKUP_WORDS = {
    "speak", "p", "s", "break", "prosody", "say-as", "sub", "phoneme", "time", "strength",
    "rate", "interpret-as", "format", "alias", "alphabet", "ph", "ipa", "xml:lang", "version",
    "ms", "x-weak", "weak", "medium", "strong", "x-strong", "none", "x-slow", "slow", "fast",
    "x-fast", "characters", "spell-out", "cardinal", "ordinal", "digits", "date",
    "telephone", "mdy", "dmy", "ymd", "hms12",
}  # fmt: skip
_SAY_AS = st.one_of(
    st.builds(lambda n: ("cardinal", str(n)), st.integers(-(10**6), 10**6)),
    st.builds(lambda n: ("ordinal", str(n)), st.integers(1, 10**4)),
    st.builds(lambda n: ("digits", str(n)), st.integers(0, 10**9)),
    st.builds(lambda t: ("characters", t), st.text("ABCXYZ", min_size=1, max_size=5)),
    st.builds(lambda d: ("date", d.isoformat()), st.dates()),
    st.builds(lambda h, m: ("time", f"{h}:{m:02d}"), st.integers(0, 23), st.integers(0, 59)),
    st.just(("telephone", "555-123-4567")),
)


def _inline(depth: int) -> st.SearchStrategy[str]:
    leaves = st.one_of(
        _WORDS,
        st.builds(lambda s: f'<break strength="{s}"/>', st.sampled_from(list(BREAK_STRENGTHS))),
        st.builds(lambda ms: f'<break time="{ms}ms"/>', st.integers(0, 2000)),
        st.builds(lambda pair: f'<say-as interpret-as="{pair[0]}">{pair[1]}</say-as>', _SAY_AS),
        st.builds(lambda a, w: f'<sub alias="{a}">{w}</sub>', _WORDS, _WORDS),
        st.builds(lambda w: f'<phoneme alphabet="ipa" ph="ə b ɪ">{w}</phoneme>', _WORDS),
    )
    if depth == 0:
        return leaves
    prosody = st.builds(
        lambda rate, body: f'<prosody rate="{rate}">{body}</prosody>',
        st.sampled_from(["x-slow", "slow", "medium", "fast", "x-fast", "90%", "+10%", "1.1"]),
        _inline(depth - 1),
    )
    return st.lists(st.one_of(leaves, prosody), min_size=1, max_size=4).map(" ".join)


_SENTENCE = _inline(2).map(lambda body: f"<s>{body}</s>")
_BLOCK = st.one_of(
    _inline(2),
    _SENTENCE,
    st.lists(st.one_of(_SENTENCE, _inline(1)), min_size=1, max_size=3).map(
        lambda parts: f"<p>{' '.join(parts)}</p>"
    ),
)
DOCUMENT = st.lists(_BLOCK, max_size=4).map(lambda blocks: f"<speak>{' '.join(blocks)}</speak>")


@settings(max_examples=300, deadline=None)
@given(DOCUMENT)
def test_markup_is_never_spoken(ssml: str) -> None:
    for segment in parse_ssml(ssml):
        if isinstance(segment, Break):
            assert 0 <= segment.seconds <= MAX_BREAK_SECONDS
            continue
        assert segment.text == segment.text.strip() and "  " not in segment.text
        assert not set(segment.text) & set('<>="/'), segment
        words = {word.strip(".,") for word in segment.text.split()}
        assert not words & _MARKUP_WORDS, segment
        assert 0.25 <= segment.rate <= 4.0


@settings(max_examples=300, deadline=None)
@given(DOCUMENT)
def test_a_document_round_trips_through_to_ssml(ssml: str) -> None:
    document = parse_ssml(ssml)
    assert parse_ssml(to_ssml(document)) == document


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="abcXYZ019 \n\t&<>\"'é", max_size=60))
def test_escaped_plain_text_comes_back_as_text(text: str) -> None:
    escaped = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    document = parse_ssml(f"<speak>{escaped}</speak>")
    expected = " ".join(text.split())
    assert list(document) == ([Text(expected)] if expected else [])
    assert parse_ssml(to_ssml(document)) == document


@settings(max_examples=200, deadline=None)
@given(DOCUMENT)
def test_rendered_text_normalises_without_markup(ssml: str) -> None:
    """What the family does next: the normaliser reads every Text without an error and
    without bringing back anything of the markup."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OnnxTTSWarning)
        for segment in parse_ssml(ssml):
            if isinstance(segment, Text):
                spoken = normalize_text(segment.text)
                assert not set(spoken) & set("<>=")

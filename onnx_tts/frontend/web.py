"""Web addresses, e-mail addresses and file names as a listener says them:
"https://example.com/path?q=1" -> "example dot com slash path question mark q equals one",
"first.last@example.co.uk" -> "first dot last at example dot co dot U-K", "config.toml" ->
"config dot toml", "@openai" -> "at open A-I", "#speech" -> "hashtag speech".

The scheme ("https://") is not read, as people leave it out when they say an address. The
dots of an address never end a sentence.
"""

from __future__ import annotations

import re

from onnx_tts.frontend.letters import spell
from onnx_tts.frontend.numbers import integer_words
from onnx_tts.frontend.sentences import pad
from onnx_tts.frontend.versions import port_words

# Top-level domains recognised in a bare address ("example.com"); with a scheme, "www." or
# in an e-mail address any domain is one. Left out: those that are also common words ("in",
# "to", "me", "so", "it", ...), which a missing space after a period would turn into "dot".
# Two-letter country codes are spelled ("U-K"), except the ones in _SPOKEN_TLDS.
_TLDS = (
    "com|org|net|edu|gov|mil|int|io|ai|co|dev|app|info|biz|xyz|tv|uk|ca|de|fr|es|nl|au|nz|ie|"
    "jp|cn|ru|br|ch|se|dk|fi|pl|be|eu|ly|gg|sh|fm|cc|ws|tech|online|site|blog|cloud|news|shop|"
    "store|page"
)
_SPOKEN_TLDS = frozenset({"co"})  # "co.uk": said as a word
# File extensions that make "name.ext" a file name ("config.toml", "Node.js"); not "so" or
# "go", which are also words a missing space would glue to a period.
_EXTENSIONS = (
    "txt|md|rst|py|pyc|js|mjs|ts|tsx|jsx|json|jsonl|toml|yaml|yml|ini|cfg|conf|csv|tsv|xml|"
    "html|htm|css|scss|pdf|doc|docx|xls|xlsx|ppt|pptx|odt|png|jpg|jpeg|gif|svg|webp|bmp|ico|"
    "mp3|wav|flac|ogg|opus|m4a|mp4|mkv|mov|avi|webm|zip|tar|gz|tgz|bz2|xz|7z|rar|exe|dll|"
    "dylib|deb|rpm|apk|dmg|iso|img|sh|bash|zsh|bat|ps1|c|h|cc|cpp|hpp|cs|java|kt|rs|rb|"
    "php|pl|lua|swift|sql|db|sqlite|log|lock|env|onnx|pt|pth|bin|safetensors|ipynb|wasm"
)
# Characters inside an address, by the name a listener says.
_ADDRESS_SYMBOLS = {
    ".": "dot",
    "/": "slash",
    "-": "dash",
    "_": "underscore",
    "~": "tilde",
    "?": "question mark",
    "=": "equals",
    "&": "and",
    "#": "hash",
    ":": "colon",
    "+": "plus",
    "%": "percent",
    "@": "at",
}
# An address ends before whitespace, a quote or bracket, and trailing sentence punctuation.
_ADDRESS_TAIL = r"[^\s<>\"'()\[\]{}]*[^\s<>\"'()\[\]{}.,;:!?]"
_URL_RE = re.compile(
    rf"(?<![\w@])(?:(?P<scheme>https?|ftp)://|(?=www\.))(?P<rest>{_ADDRESS_TAIL})", re.IGNORECASE
)
_EMAIL_RE = re.compile(
    r"(?<![\w.@+-])(?P<local>[A-Za-z0-9][\w.+-]*)@(?P<domain>[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)"
    r"(?![\w@-]|\.\w)"
)
_DOMAIN_RE = re.compile(
    rf"(?<![\w.@/-])(?P<domain>(?:[A-Za-z0-9][A-Za-z0-9-]*\.)+(?:{_TLDS}))"
    rf"(?P<path>/{_ADDRESS_TAIL}|/)?(?![\w@-]|\.\w)"
)
_FILE_RE = re.compile(
    rf"(?<![\w.@/-])(?P<stem>\w[\w-]*(?:\.\w[\w-]*)*)\.(?P<ext>{_EXTENSIONS})(?![\w@-]|\.\w)"
)


def _piece_words(piece: str) -> str:
    """One piece of an address between symbols: words stay, digits are read as a number,
    letters glued to digits are split from them ("page2" -> "page two")."""
    parts = re.findall(r"\d+|[^\W\d_]+", piece)
    return " ".join(integer_words(part) if part.isdigit() else part for part in parts)


def _address_words(text: str) -> str:
    """An address's characters: symbols by name, everything else as words or numbers."""
    words = []
    for token in re.split(r"([./\-_~?=&#:+%@])", text):
        if not token:
            continue
        if token in _ADDRESS_SYMBOLS:
            words.append(_ADDRESS_SYMBOLS[token])
        else:
            words.append(_piece_words(token))
    return " ".join(word for word in words if word)


def _domain_words(domain: str) -> str:
    """Labels joined by "dot"; "www" and two-letter country codes are spelled."""
    labels = domain.split(".")
    words = []
    for index, label in enumerate(labels):
        last = index == len(labels) - 1
        country = last and len(label) == 2 and label.lower() not in _SPOKEN_TLDS
        if label.lower() == "www" or country:
            words.append(spell(label))
        else:
            words.append(_address_words(label))
    return " dot ".join(words)


def _url_words(host_and_rest: str) -> str:
    host, _, rest = host_and_rest.partition("/")
    host, colon, port = host.partition(":")
    words = _domain_words(host)
    if colon and port.isdigit():
        words += f" colon {port_words(port)}"
    rest = rest.rstrip("/")  # a trailing slash is not said
    if rest:
        words += " slash " + _address_words(rest)
    return words


def _url(match: re.Match[str]) -> str:
    scheme = (match["scheme"] or "").lower()
    words = _url_words(match["rest"])
    return pad(f"{spell(scheme)} {words}" if scheme == "ftp" else words)


def _email(match: re.Match[str]) -> str:
    return pad(f"{_address_words(match['local'])} at {_domain_words(match['domain'])}")


def _domain(match: re.Match[str]) -> str:
    return pad(_url_words(match["domain"] + (match["path"] or "")))


def _file(match: re.Match[str]) -> str:
    return pad(f"{_address_words(match['stem'])} dot {match['ext']}")


# Social handles and hashtags: "@openai" at open A-I, "#speech" hashtag speech. The words of
# a name are read as written (the voice splits "MeToo" and "OpenAI" itself), an underscore is
# a space, and "ai" run onto a lower-case word is the letters A-I ("openai", "stabilityai").
_HANDLE_RE = re.compile(r"(?<![\w@.#&/])([@#])(\d*[A-Za-z_][A-Za-z0-9_]{0,49})(?![\w@#]|\.\w)")
_RUN_ON_AI_RE = re.compile(r"(?<=[a-z]{3})ai$")
_WORDS_ENDING_IN_AI = frozenset(
    "bonsai samurai shanghai mumbai dubai chennai hawaii thai chai bai kai tai sai".split()
)


def _handle(match: re.Match[str]) -> str:
    sign, name = match.groups()
    words = []
    for part in re.split(r"_+", name):
        if part.islower() and part not in _WORDS_ENDING_IN_AI:
            part = _RUN_ON_AI_RE.sub(" A-I", part)
        if part:
            words.append(part)
    return pad(("hashtag " if sign == "#" else "at ") + " ".join(words))


def expand_web(text: str) -> str:
    """URLs, e-mail addresses, bare domains ("example.com"), file names, social handles and
    hashtags as words. Runs first: the other rules would read an address's dots and digits as
    sentence ends and decimals."""
    text = _URL_RE.sub(_url, text)
    text = _EMAIL_RE.sub(_email, text)
    text = _DOMAIN_RE.sub(_domain, text)
    text = _FILE_RE.sub(_file, text)
    return _HANDLE_RE.sub(_handle, text)

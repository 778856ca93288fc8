"""Voice names: the one form they are compared in, the names no upload may take, and how a
requested name reaches exactly one voice (HTTP and Wyoming alike).

A client names a voice by the id the server gave it or by a name, and either must denote one
voice, or be refused. Names are compared in one normal form, :func:`name_key`: Unicode
compatibility form (a fullwidth ``ａｌｌｏｙ`` is ``alloy``), invisible format characters
removed (a zero-width space makes no new name), whitespace runs collapsed and trimmed (``nova ``
is ``nova``), case folded (``Nova`` too).

An upload may not take a name that already denotes a voice: ``default``, OpenAI's voice names
(clients such as Open WebUI send ``alloy`` to mean "the server's voice"), the builtin voices of
the models served (a manifest's builtin voices), a name shaped like a voice id, or another
stored voice's name. Such an upload is refused with 409 rather than renamed into a namespace:
clients address a voice by the bare name their user typed, so a stored ``user:alloy`` would
never be what ``alloy`` reaches, and a silent rename surprises more than a refusal that says
which name to pick.

A store written by something else (an older version, a hand edit, another writer of a shared
Redis) can still hold two voices one name reaches: such a name is refused (409, naming the
voices) instead of picking one; each voice stays reachable by its id.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from onnx_tts.server.schemas import OPENAI_VOICES

DEFAULT_VOICE_NAMES = ("default",)
ID_PATTERN = re.compile(r"^voice_[0-9a-f]{24}$")
# A name holds at most this many characters, as typed and as stored (composed: NFC, which can
# make a name longer: U+0958 is two characters composed), and its compared form (name_key:
# compatibility forms such as U+FDFA are many letters) at most NAME_KEY_CHARS.
MAX_NAME_CHARS = 100
NAME_KEY_CHARS = 4 * MAX_NAME_CHARS
# What a stored record's name may hold when read back: a name of MAX_NAME_CHARS typed
# characters stored by an older version, composed without a bound (NFC triples a text at most).
MAX_STORED_NAME_CHARS = 3 * MAX_NAME_CHARS


def display_name(name: str) -> str:
    """The stored form of an uploaded name: composed Unicode (NFC), whitespace runs as one
    space, trimmed."""
    return " ".join(unicodedata.normalize("NFC", name).split())


def name_key(name: str) -> str:
    """The form names are compared in: two names with one key reach one voice."""
    text = unicodedata.normalize("NFKC", name)
    text = "".join(c for c in text if unicodedata.category(c) != "Cf")
    return unicodedata.normalize("NFKC", " ".join(text.split()).casefold())


class VoiceNameError(Exception):
    """A name an upload may not take, or a requested name that reaches no voice or several:
    `status` (400, 404, 409), `code` and the one-line message say which."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def reserved_names(builtin: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """name key -> what already answers to it: the default voice, OpenAI's names and every
    model's builtin voices (`builtin`: model name -> its voice names)."""
    reserved = {name_key(n): "this server's default voice" for n in DEFAULT_VOICE_NAMES}
    for name in sorted(OPENAI_VOICES):
        reserved[name_key(name)] = f"OpenAI's voice name {name!r} (it means the default voice)"
    for model, names in builtin.items():
        for name in names:
            reserved[name_key(name)] = f"the builtin voice {name!r} of model {model!r}"
    return reserved


def _too_long(why: str) -> VoiceNameError:
    return VoiceNameError(
        400,
        f"name: at most {MAX_NAME_CHARS} characters ({why}, {NAME_KEY_CHARS} once normalised); "
        "choose a shorter name",
        "too_long",
    )


def check_new_name(name: str, reserved: Mapping[str, str]) -> tuple[str, str]:
    """(stored form, key) of a name for a new voice; VoiceNameError when it is empty once
    normalised, longer than MAX_NAME_CHARS as typed or as stored (NFC), or NAME_KEY_CHARS in
    its compared form, shaped like an id, or `reserved` (see :func:`reserved_names`)."""
    if len(name) > MAX_NAME_CHARS:
        raise _too_long(f"this one has {len(name)}")
    shown = display_name(name)
    key = name_key(shown)
    if not key:
        raise VoiceNameError(400, "name: it has no visible characters", "invalid_value")
    if len(shown) > MAX_NAME_CHARS:
        raise _too_long(f"composed (NFC), as it is stored, this one has {len(shown)}")
    if len(key) > NAME_KEY_CHARS:
        raise _too_long(f"in the compatibility form names are compared in it has {len(key)}")
    if ID_PATTERN.match(key):
        raise VoiceNameError(
            409,
            f"the name {shown!r} has the shape of a voice id, which would reach another voice; "
            "choose another name",
            "voice_name_reserved",
        )
    if key in reserved:
        raise VoiceNameError(
            409,
            f"the name {shown!r} is taken by {reserved[key]}; choose another name",
            "voice_name_reserved",
        )
    return shown, key


@dataclass(frozen=True)
class VoiceChoice:
    """What a requested name reaches: the model's default voice, one of its builtin voices
    (`name`, as the model spells it) or a stored voice."""

    kind: str  # "default" | "builtin" | "stored"
    name: str
    stored: Any = None  # the stored Voice


def resolve_voice(
    requested: str,
    builtin: Sequence[str],
    stored: Iterable[Any],
    elsewhere: Mapping[str, Sequence[str]] | None = None,
) -> VoiceChoice:
    """The one voice `requested` (an id or a name) reaches among the default voice, the model's
    `builtin` voices and the `stored` voices (each with `.id` and `.name`). VoiceNameError: 404
    when none (naming another model whose builtin voice it is, from `elsewhere`), 409 when
    several."""
    key = name_key(requested)
    found: dict[tuple[str, str], VoiceChoice] = {}
    if key in {name_key(n) for n in (*DEFAULT_VOICE_NAMES, *OPENAI_VOICES)}:
        found["default", "default"] = VoiceChoice("default", "default")
    for name in builtin:
        if name_key(name) == key:
            found["builtin", name] = VoiceChoice("builtin", name)
    for voice in stored:
        if voice.id == requested or name_key(voice.name) == key:
            found["stored", voice.id] = VoiceChoice("stored", voice.id, voice)
    if len(found) == 1:
        return next(iter(found.values()))
    shown = requested if len(requested) <= 60 else requested[:57] + "..."
    if not found:
        owners = [m for m, names in (elsewhere or {}).items() if key in map(name_key, names)]
        hint = f"; it is a builtin voice of model {owners[0]!r}" if owners else ""
        raise VoiceNameError(
            404,
            f"unknown voice {shown!r}{hint}; use 'default' or an id from the voice list",
            "voice_not_found",
        )
    described = ", ".join(
        f"the stored voice {c.stored.name!r} ({c.name})"
        if c.kind == "stored"
        else ("the default voice" if c.kind == "default" else f"the builtin voice {c.name!r}")
        for c in found.values()
    )
    raise VoiceNameError(
        409,
        f"the voice name {shown!r} reaches several voices ({described}); use a voice id",
        "voice_ambiguous",
    )


__all__ = [
    "DEFAULT_VOICE_NAMES",
    "ID_PATTERN",
    "MAX_NAME_CHARS",
    "MAX_STORED_NAME_CHARS",
    "NAME_KEY_CHARS",
    "VoiceChoice",
    "VoiceNameError",
    "check_new_name",
    "display_name",
    "name_key",
    "reserved_names",
    "resolve_voice",
]

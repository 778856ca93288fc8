"""Uploaded voices: content-addressed reference clips on disk, encoded through the cache.

A voice is its decoded audio (mono float32 at the default model's encoder rate), stored as
`<id>.wav` (32-bit float, exact) beside `<id>.json` (name, creation time, sample rate). The id
is a hash of that audio, so uploading the same clip twice (as WAV or FLAC) gives the same voice;
the encoder outputs live in the reference cache under the same content, not here.

Nothing read back is trusted. A voice's audio is checked against its id (its content address)
when it is loaded: audio replaced on disk, with or without its metadata, never speaks under the
old id; it is refused, reported once in the log, counted, and left out of the list from then on.
Files are read only when they are regular files of a bounded size
(:func:`onnx_tts.regular_files.read_regular_file`): a FIFO, a device or a link is refused, never
waited on. With a secret (`--cache-secret`) every voice's metadata is signed (the cache's HMAC,
:func:`onnx_tts.cache.codec.sign`) and a voice whose signature is missing or wrong is neither
listed nor used. `onnx_tts.server.redis_voices` keeps the same records in Redis.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import soundfile

from onnx_tts.atomic_files import fsync_directory, remove_orphaned_temps, temp_prefix
from onnx_tts.audio import resample
from onnx_tts.cache.codec import sign, signature_matches
from onnx_tts.errors import InputError
from onnx_tts.regular_files import RefusedFile, read_regular_file, unlink_below
from onnx_tts.server.errors import NO_SPACE_ERRNOS, one_line
from onnx_tts.server.voice_names import (
    ID_PATTERN,
    MAX_STORED_NAME_CHARS,
    check_new_name,
    name_key,
    reserved_names,
    resolve_voice,
)

log = logging.getLogger("onnx_tts.server")

MAX_VOICES = 1000
# A stored clip is a reference voice (seconds), never more than this many samples.
MAX_STORED_SAMPLES = 10 * 60 * 48_000
MAX_META_BYTES = 4096
_MAX_AUDIO_FILE_BYTES = 4 * MAX_STORED_SAMPLES + 4096  # float32 samples and a WAV header


@dataclass(frozen=True)
class Voice:
    id: str
    name: str
    created_at: int
    sample_rate: int

    def public(self) -> dict[str, object]:
        return {
            "id": self.id,
            "name": self.name,
            "object": "audio.voice",
            "created_at": self.created_at,
        }


class VoiceExists(Exception):
    """The uploaded clip is already stored under another name."""

    code = "voice_exists"

    def __init__(self, voice: Voice) -> None:
        super().__init__(
            f"this clip is already the voice {voice.name!r} ({voice.id}); use that id, or "
            f"delete it first to store it under a new name"
        )
        self.voice = voice


class VoiceNameTaken(VoiceExists):
    """Another clip is already stored under the uploaded name (or one that differs only in case,
    spacing or Unicode form): a second voice of that name would make the name reach two voices,
    so it is refused."""

    code = "voice_name_taken"

    def __init__(self, voice: Voice) -> None:
        Exception.__init__(
            self,
            f"the name {voice.name!r} is already the voice {voice.id}; choose another name, "
            f"or delete that voice first",
        )
        self.voice = voice


class VoiceStoreError(Exception):
    """The store cannot do what was asked (full, read-only, unreachable, a damaged voice):
    `status` and `code` for the client, the message says why in one line."""

    def __init__(
        self, status: int, message: str, code: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.headers = headers


def voice_id(audio: np.ndarray, sample_rate: int) -> str:
    digest = hashlib.sha256(f"onnx-tts/voice/v1|{sample_rate}|".encode())
    digest.update(np.ascontiguousarray(audio, "<f4").tobytes())
    return "voice_" + digest.hexdigest()[:24]


def write_failure(error: OSError, where: str) -> VoiceStoreError:
    """A failed write as the client's one line: 507 when the space ran out, else 500."""
    reason = error.strerror or str(error)
    if error.errno in NO_SPACE_ERRNOS:
        return VoiceStoreError(
            507, f"cannot store the voice: {where} is full ({reason})", "insufficient_storage"
        )
    if error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return VoiceStoreError(
            500,
            f"cannot store the voice: {where} is not writable ({reason})",
            "voice_store_read_only",
        )
    return VoiceStoreError(500, f"cannot store the voice: {where}: {reason}", "voice_store_error")


# -- records: metadata (signed with a secret) and audio checked against the id --------------


def _signed_body(voice: Voice) -> bytes:
    return json.dumps(asdict(voice), sort_keys=True, separators=(",", ":")).encode()


def voice_meta(voice: Voice, secret: bytes | None, **extra: Any) -> dict[str, Any]:
    """The stored metadata of `voice`: its fields, `extra` ones, and with a secret its MAC."""
    meta: dict[str, Any] = {**asdict(voice), **extra}
    if secret is not None:
        meta["mac"] = sign(secret, f"voice/{voice.id}", _signed_body(voice)).hex()
    return meta


def parse_meta(
    ident: str, raw: bytes | None, secret: bytes | None
) -> tuple[Voice | None, str, dict]:
    """(voice, "", extra fields) from stored metadata, or (None, why it is refused, {}):
    malformed, for another id, out of bounds, or (with a secret) unsigned or mis-signed."""
    if raw is None:
        return None, "its metadata is missing", {}
    if len(raw) > MAX_META_BYTES:
        return None, f"its metadata is larger than {MAX_META_BYTES} bytes", {}
    try:
        data = json.loads(raw)
        fields = {k: data.pop(k) for k in ("id", "name", "created_at", "sample_rate")}
        voice = Voice(**fields)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None, "its metadata is not a voice record", {}
    checks = (
        voice.id == ident,
        isinstance(voice.name, str) and 0 < len(voice.name) <= MAX_STORED_NAME_CHARS,
        isinstance(voice.created_at, int) and not isinstance(voice.created_at, bool),
        isinstance(voice.sample_rate, int) and 8000 <= voice.sample_rate <= 384_000,
    )
    if not all(checks):
        return None, "its metadata is malformed or names another id", {}
    mac = data.pop("mac", None)
    if secret is not None:
        try:
            given = bytes.fromhex(mac) if isinstance(mac, str) else b""
        except ValueError:
            given = b""
        if not given:
            return None, "it is not signed with this server's --cache-secret", {}
        if not signature_matches(secret, f"voice/{ident}", _signed_body(voice), given):
            return None, "its signature does not match (another secret, or edited)", {}
    return voice, "", data


def checked_samples(voice: Voice, samples: np.ndarray, rate: int) -> str:
    """Why `samples` at `rate` are not `voice`'s audio ('' when they are): its id is the hash
    of its audio at its rate, so replaced audio never passes for it."""
    if samples.ndim != 1 or not 0 < len(samples) <= MAX_STORED_SAMPLES:
        return f"its audio is not 1 to {MAX_STORED_SAMPLES} mono samples"
    if rate != voice.sample_rate:
        return f"its audio is at {rate} Hz, its record says {voice.sample_rate} Hz"
    if not np.isfinite(samples).all():
        return "its audio holds NaN or infinite samples"
    if voice_id(samples, rate) != voice.id:
        return "its audio does not match its id (replaced or damaged)"
    return ""


class Rejections:
    """Voices refused on read: each reported once in the log and counted, and remembered (by
    what was read) so that the list leaves them out until their files change."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.count = 0
        self._bad: dict[str, tuple[Any, str]] = {}
        self._lock = threading.Lock()

    def refuse(self, voice_id_: str, state: Any, why: str) -> None:
        with self._lock:
            if self._bad.get(voice_id_) == (state, why):
                return
            self._bad[voice_id_] = (state, why)
            self.count += 1
        log.warning("voice %s in %s refused: %s", voice_id_, self.where, why)

    def refused(self, voice_id_: str, state: Any) -> str:
        """Why the voice was refused when its files were as `state` ('' if it was not)."""
        with self._lock:
            bad = self._bad.get(voice_id_)
        return bad[1] if bad is not None and bad[0] == state else ""

    def forget(self, voice_id_: str) -> None:
        with self._lock:
            self._bad.pop(voice_id_, None)


class CheckedAudio:
    """Stored voices' samples at the rates asked for, kept in memory once read and checked
    against their ids, so that a voice is read and checked once per rate."""

    def __init__(self) -> None:
        self._samples: dict[tuple[str, int], np.ndarray] = {}
        self._lock = threading.Lock()

    def get(self, voice_id_: str, sample_rate: int) -> np.ndarray | None:
        return self._samples.get((voice_id_, sample_rate))

    def keep(self, voice: Voice, samples: np.ndarray, sample_rate: int) -> np.ndarray:
        """`samples` (checked, at the voice's rate) at `sample_rate`, read-only, kept."""
        if sample_rate != voice.sample_rate:
            samples = resample(samples, voice.sample_rate, sample_rate)
        samples.setflags(write=False)
        with self._lock:
            self._samples[(voice.id, sample_rate)] = samples
        return samples

    def forget(self, voice_id_: str) -> None:
        with self._lock:
            for key in [k for k in self._samples if k[0] == voice_id_]:
                del self._samples[key]


def stored_as(stored: list[Voice], ident: str, key: str, count: int) -> Voice | None:
    """The stored voice an upload of content `ident` under a name of key `key` already is
    (None: it is new), by the rules of `VoiceStore.add`: VoiceExists for the same content under
    another name, VoiceNameTaken for the name of another content, OverflowError when `count`
    voices are stored already."""
    existing = next((v for v in stored if v.id == ident), None)
    if existing is not None:
        if name_key(existing.name) != key:
            raise VoiceExists(existing)
        return existing
    taken = next((v for v in stored if name_key(v.name) == key), None)
    if taken is not None:
        raise VoiceNameTaken(taken)
    if count >= MAX_VOICES:
        raise OverflowError(f"the server stores at most {MAX_VOICES} voices; delete some first")
    return None


def damaged(voice: Voice, why: str) -> VoiceStoreError:
    return VoiceStoreError(
        404,
        f"voice {voice.name!r} ({voice.id}) is refused: {why}; upload it again",
        "voice_damaged",
    )


def _atomic_write(path: Path, data: bytes) -> None:
    """`data` put in place as `path` (a file of the voices directory) by a rename. Not
    atomic_files.write_atomically: that follows a link out of the directory, and turns an
    OSError into an OutputError without the errno write_failure maps to 507. Fsynced before
    and after the rename, so a stored voice survives a power cut whole or not at all."""
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path.name), suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def _identity(path: Path) -> tuple[int, int, int] | None:
    """What a file is right now (inode, size, mtime), to notice when it changes."""
    try:
        info = path.lstat()
    except OSError:
        return None
    return (info.st_ino, info.st_size, info.st_mtime_ns)


class VoiceStore:
    """Voices in a directory (see the module docstring); `secret` signs and checks them."""

    def __init__(self, root: str | os.PathLike[str], secret: bytes | None = None) -> None:
        self.root = Path(root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            pass  # not a directory: said below
        except OSError as error:
            raise InputError(
                f"cannot create the voices directory {self.root}: {error.strerror or error}; "
                "give a writable --voices-dir"
            ) from None
        if not self.root.is_dir():
            raise InputError(
                f"--voices-dir {self.root} is not a directory; give a directory (it is created "
                "if missing)"
            )
        remove_orphaned_temps(self.root)  # uploads cut short by a killed server
        self.secret = secret
        self.rejections = Rejections(str(self.root))
        self._lock = threading.Lock()
        self._audio = CheckedAudio()
        self._metas: dict[str, tuple[Any, Voice | None]] = {}  # id -> (file identity, voice)

    @property
    def rejected(self) -> int:
        return self.rejections.count

    def _meta_path(self, voice_id: str) -> Path:
        return self.root / f"{voice_id}.json"

    def _audio_path(self, voice_id: str) -> Path:
        return self.root / f"{voice_id}.wav"

    def _state(self, ident: str) -> tuple[Any, Any]:
        return _identity(self._meta_path(ident)), _identity(self._audio_path(ident))

    # -- reads -----------------------------------------------------------------------------

    def get(self, ident: str) -> Voice | None:
        """The voice with id `ident` if its record is sound (and signed, with a secret) and it
        was not refused since its files last changed."""
        if not ID_PATTERN.match(ident):
            return None
        state = self._state(ident)
        if state[0] is None or self.rejections.refused(ident, state):
            return None
        cached = self._metas.get(ident)
        if cached is not None and cached[0] == state[0]:
            return cached[1]
        try:
            raw = read_regular_file(self._meta_path(ident), MAX_META_BYTES + 1, root=self.root)
        except FileNotFoundError:
            return None
        except (RefusedFile, OSError) as error:
            self.rejections.refuse(ident, state, f"its metadata cannot be read ({error})")
            return None
        voice, why, _ = parse_meta(ident, raw, self.secret)
        if voice is None:
            self.rejections.refuse(ident, state, why)
        self._metas[ident] = (state[0], voice)
        return voice

    def list(self) -> list[Voice]:
        try:
            names = sorted(e.name for e in os.scandir(self.root) if e.name.endswith(".json"))
        except OSError:
            return []
        voices = (self.get(name[: -len(".json")]) for name in names)
        return sorted((v for v in voices if v is not None), key=lambda v: (v.created_at, v.id))

    def audio(self, voice: Voice, sample_rate: int) -> np.ndarray:
        """The voice's samples at `sample_rate`, checked against its id when first read (then
        kept in memory); VoiceStoreError (404, voice_damaged) when they fail."""
        cached = self._audio.get(voice.id, sample_rate)
        if cached is not None:
            return cached
        state = self._state(voice.id)
        samples, why = self._read_audio(voice)
        if samples is None:
            self.rejections.refuse(voice.id, state, why)
            raise damaged(voice, why)
        return self._audio.keep(voice, samples, sample_rate)

    def _read_audio(self, voice: Voice) -> tuple[np.ndarray | None, str]:
        path = self._audio_path(voice.id)
        try:
            data = read_regular_file(path, _MAX_AUDIO_FILE_BYTES, root=self.root)
        except FileNotFoundError:
            return None, "its audio file is missing"
        except RefusedFile as refused:
            return None, f"its audio file is {refused.what}"
        except OSError as error:
            return None, f"its audio file cannot be read ({error.strerror or error})"
        try:
            samples, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=False)
        except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError):
            return None, "its audio file is not audio"
        samples = np.ascontiguousarray(samples, np.float32)
        why = checked_samples(voice, samples, int(rate))
        return (None, why) if why else (samples, "")

    # -- writes ----------------------------------------------------------------------------

    def add(
        self,
        name: str,
        audio: np.ndarray,
        sample_rate: int,
        reserved: Mapping[str, str] | None = None,
    ) -> tuple[Voice, bool]:
        """Store `audio` (already decoded and checked) under its content id; returns the voice
        and whether it is new. The name is normalised once (voice_names); a name `reserved`
        (default: the default voice and OpenAI's names) or shaped like an id is a
        VoiceNameError. The same clip under the same name is the stored voice; under another
        name it is VoiceExists: one content has one id and one name, and renaming it would
        break clients that address it by its name. Another clip under a name already taken
        is VoiceNameTaken, for the same reason."""
        shown, key = check_new_name(name, reserved_names({}) if reserved is None else reserved)
        ident = voice_id(audio, sample_rate)
        with self._lock:
            stored = self.list()
            existing = stored_as(stored, ident, key, len(stored))
            if existing is not None:
                return existing, False
            voice = Voice(ident, shown, int(time.time()), sample_rate)
            meta = json.dumps(voice_meta(voice, self.secret)).encode()

            # Encoded in memory first: libsndfile writing to a file hides the OS's error
            # (a full disk) behind a short write.
            encoded = io.BytesIO()
            soundfile.write(encoded, audio, sample_rate, format="WAV", subtype="FLOAT")
            wav_bytes = encoded.getvalue()

            had_meta = self._state(ident)[0] is not None  # a refused record being replaced
            try:
                _atomic_write(self._audio_path(ident), wav_bytes)
                _atomic_write(self._meta_path(ident), meta)
            except OSError as error:
                if not had_meta:  # no half voice left behind
                    unlink_below(self.root, self._audio_path(ident))
                log.error("cannot store voice %s in %s: %s", ident, self.root, one_line(error))
                raise write_failure(error, "the server's voices directory") from None
            self.rejections.forget(ident)
            return voice, True

    def delete(self, ident: str) -> bool:
        with self._lock:
            if not ID_PATTERN.match(ident) or self._state(ident)[0] is None:
                return False
            for path in (self._meta_path(ident), self._audio_path(ident)):
                unlink_below(self.root, path)  # a file or link itself, never a directory
            self._audio.forget(ident)
            self._metas.pop(ident, None)
            self.rejections.forget(ident)
            return True


def voice_to_speak(store: Any, registry: Any, model: Any, requested: str) -> Any:
    """What a generation of `model` (a SpeechModel of `registry`) speaks for `requested`: None
    (the default voice), a builtin voice's name, or a stored voice's samples at the model's
    voice rate (checked against the voice's id). VoiceNameError when the name reaches no
    voice or several; the store's VoiceStoreError when the voice it reaches is refused."""
    elsewhere = {m.name: m.builtin_voices for m in registry.models.values() if m is not model}
    try:
        stored = store.list()
    except VoiceStoreError as error:
        # The default and builtin voices need no store: an unreachable shared store (a Redis
        # restart) fails only the requests that name a stored voice. Uploads may not take
        # these names, so a reachable store could only add an ambiguity a foreign writer made.
        reserved = reserved_names({model.name: model.builtin_voices})
        if error.status != 503 or name_key(requested) not in reserved:
            raise
        stored = []
    choice = resolve_voice(requested, model.builtin_voices, stored, elsewhere)
    if choice.kind == "default":
        return None
    if choice.kind == "builtin":
        return choice.name
    return store.audio(choice.stored, model.voice_rate)

"""Uploaded voices: content-addressed reference clips on disk, encoded through the cache.

A voice is its decoded audio (mono float32 at the default model's encoder rate), stored as
`<id>.wav` (32-bit float, exact) beside `<id>.json` (name, creation time). The id is a hash of
that audio, so uploading the same clip twice (as WAV or FLAC) gives the same voice; the
encoder outputs live in the reference cache under the same content, not here.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import soundfile

from onnx_tts.audio import load_audio

MAX_VOICES = 1000
MAX_NAME_CHARS = 100
_ID_PATTERN = re.compile(r"^voice_[0-9a-f]{24}$")


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

    def __init__(self, voice: Voice) -> None:
        super().__init__(
            f"this clip is already the voice {voice.name!r} ({voice.id}); use that id, or "
            f"delete it first to store it under a new name"
        )
        self.voice = voice


class VoiceNameTaken(VoiceExists):
    """Another clip is already stored under the uploaded name: a second voice of that name
    would make the name resolve to nothing (names address one voice), so it is refused."""

    def __init__(self, voice: Voice) -> None:
        Exception.__init__(
            self,
            f"the name {voice.name!r} is already the voice {voice.id}; choose another name, "
            f"or delete that voice first",
        )
        self.voice = voice


def voice_id(audio: np.ndarray, sample_rate: int) -> str:
    digest = hashlib.sha256(f"onnx-tts/voice/v1|{sample_rate}|".encode())
    digest.update(np.ascontiguousarray(audio, "<f4").tobytes())
    return "voice_" + digest.hexdigest()[:24]


def _atomic_write(path: Path, write: object) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)  # type: ignore[operator]
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class VoiceStore:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._audio: dict[tuple[str, int], np.ndarray] = {}

    def _meta_path(self, voice_id: str) -> Path:
        return self.root / f"{voice_id}.json"

    def _audio_path(self, voice_id: str) -> Path:
        return self.root / f"{voice_id}.wav"

    def add(self, name: str, audio: np.ndarray, sample_rate: int) -> tuple[Voice, bool]:
        """Store `audio` (already decoded and checked) under its content id; returns the voice
        and whether it is new. The same clip under the same name is the stored voice; under
        another name it is VoiceExists: one content has one id and one name, and renaming it
        would break clients that address it by its name. Another clip under a name already
        taken is VoiceNameTaken, for the same reason."""
        ident = voice_id(audio, sample_rate)
        with self._lock:
            existing = self.get(ident)
            if existing is not None:
                if existing.name != name:
                    raise VoiceExists(existing)
                return existing, False
            stored = self.list()
            taken = next((v for v in stored if v.name == name), None)
            if taken is not None:
                raise VoiceNameTaken(taken)
            if len(stored) >= MAX_VOICES:
                raise OverflowError(
                    f"the server stores at most {MAX_VOICES} voices; delete some first"
                )
            voice = Voice(ident, name, int(time.time()), sample_rate)

            def write_audio(handle: object) -> None:
                soundfile.write(handle, audio, sample_rate, format="WAV", subtype="FLOAT")

            def write_meta(handle: object) -> None:
                handle.write(json.dumps(asdict(voice)).encode())  # type: ignore[attr-defined]

            _atomic_write(self._audio_path(ident), write_audio)
            _atomic_write(self._meta_path(ident), write_meta)
            return voice, True

    def get(self, ident: str) -> Voice | None:
        if not _ID_PATTERN.match(ident):
            return None
        try:
            data = json.loads(self._meta_path(ident).read_text())
            return Voice(**data)
        except (OSError, ValueError, TypeError):
            return None

    def find(self, id_or_name: str) -> Voice | None:
        """By id, or by name when exactly one voice has it."""
        voice = self.get(id_or_name)
        if voice is not None:
            return voice
        named = [v for v in self.list() if v.name == id_or_name]
        return named[0] if len(named) == 1 else None

    def list(self) -> list[Voice]:
        voices = (self.get(p.stem) for p in sorted(self.root.glob("voice_*.json")))
        return sorted((v for v in voices if v is not None), key=lambda v: (v.created_at, v.id))

    def audio(self, voice: Voice, sample_rate: int) -> np.ndarray:
        """The voice's samples at `sample_rate` (kept in memory after the first read)."""
        key = (voice.id, sample_rate)
        cached = self._audio.get(key)
        if cached is None:
            cached = load_audio(self._audio_path(voice.id), sample_rate)
            cached.setflags(write=False)
            self._audio[key] = cached
        return cached

    def delete(self, ident: str) -> bool:
        with self._lock:
            if self.get(ident) is None:
                return False
            for path in (self._meta_path(ident), self._audio_path(ident)):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            for key in [k for k in self._audio if k[0] == ident]:
                del self._audio[key]
            return True

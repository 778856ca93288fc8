"""A Piper voice's `NAME.onnx.json`, read and checked once: what the voice speaks (espeak-ng
voice, phoneme ids, language), its speakers and its inference defaults, every value typed and
bounded. Finding voices: one `.onnx` (with its `.onnx.json` beside it), or every voice of a
folder as wyoming-piper keeps them (`NAME.onnx` + `NAME.onnx.json`)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onnx_tts.errors import ModelError

CONFIG_SUFFIX = ".onnx.json"
MAX_CONFIG_BYTES = 8 << 20  # the largest published configs (900 speakers) are ~100 KiB
MAX_SYMBOLS = 1 << 16
MAX_SPEAKERS = 1 << 16
MAX_IDS_PER_PHONEME = 16
MAX_FOLDER_VOICES = 1024
PHONEME_TYPES = ("espeak", "text")  # those onnx-tts reads; Piper's others need its own code
PAD, BOS, EOS = "_", "^", "$"
# Piper's defaults when a config leaves them out (piper-tts 1.8, config.py).
DEFAULT_NOISE_SCALE, DEFAULT_LENGTH_SCALE, DEFAULT_NOISE_W = 0.667, 1.0, 0.8
DEFAULT_HOP_LENGTH = 256


@dataclass(frozen=True)
class VoiceConfig:
    """One Piper voice as its config describes it."""

    name: str  # the file's stem: what wyoming-piper and Piper's CLI call the voice
    model_path: Path
    config_path: Path
    sample_rate: int
    espeak_voice: str
    phoneme_type: str
    phoneme_id_map: dict[str, tuple[int, ...]]
    num_symbols: int
    num_speakers: int
    speaker_id_map: dict[str, int]
    noise_scale: float
    length_scale: float
    noise_w: float
    hop_length: int
    language: str  # e.g. "en_US" (the config's language code, else its espeak voice)
    description: str  # "dataset (quality)", as wyoming-piper describes a voice
    default_speaker_id: int = 0
    vowel_clusters: frozenset[tuple[str, ...]] = field(default_factory=frozenset)

    @property
    def speakers(self) -> tuple[str, ...]:
        """Speaker names in id order (a multi-speaker voice), else none."""
        if self.num_speakers <= 1:
            return ()
        return tuple(sorted(self.speaker_id_map, key=lambda name: self.speaker_id_map[name]))

    @property
    def english(self) -> bool:
        return self.espeak_voice.lower().startswith("en") and self.phoneme_type == "espeak"


def config_path_of(model_path: Path) -> Path:
    return model_path.with_name(model_path.name + ".json")


def voice_files(root: Path) -> list[Path]:
    """The voices of a folder: every `NAME.onnx` with a `NAME.onnx.json` beside it, by name
    (regular files inside the folder only), at most MAX_FOLDER_VOICES."""
    base = root.resolve()
    found = []
    for path in sorted(root.glob("*.onnx")):
        config = config_path_of(path)
        if not (path.is_file() and config.is_file()):
            continue
        if base not in path.resolve().parents or base not in config.resolve().parents:
            continue  # a link out of the folder is not one of its voices
        found.append(path)
    if len(found) > MAX_FOLDER_VOICES:
        raise ModelError(f"{root} holds {len(found)} voices; at most {MAX_FOLDER_VOICES} are read")
    return found


def read_voice_config(model_path: Path) -> VoiceConfig:
    """`model_path`'s config, checked; ModelError naming the file and the value at fault."""
    path = config_path_of(model_path)
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ModelError(f"{path} is {size} bytes; a voice config holds at most 8 MiB")
        raw = json.loads(path.read_bytes())
    except OSError as error:
        raise ModelError(f"cannot read the voice config {path}: {error.strerror}") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise ModelError(f"{path} is not valid JSON: {error}") from None
    return _parse(raw, model_path, path)


def _parse(raw: Any, model_path: Path, path: Path) -> VoiceConfig:
    def fail(what: str) -> ModelError:
        return ModelError(f"{path}: {what}; is this a Piper voice config?")

    def section(name: str) -> dict[str, Any]:
        value = raw.get(name, {})
        if not isinstance(value, dict):
            raise fail(f'"{name}" must be an object')
        return value

    def integer(value: Any, name: str, low: int, high: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise fail(f'"{name}" must be an integer in [{low}, {high}], got {value!r}')
        return value

    def number(value: Any, name: str, low: float, high: float) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise fail(f'"{name}" must be a number, got {value!r}')
        if not math.isfinite(value) or not low <= value <= high:
            raise fail(f'"{name}" must be in [{low:g}, {high:g}], got {value!r}')
        return float(value)

    def text(value: Any, name: str, longest: int = 200) -> str:
        if not isinstance(value, str) or not value or len(value) > longest:
            raise fail(f'"{name}" must be a non-empty string of at most {longest} characters')
        return value

    if not isinstance(raw, dict):
        raise fail("the config must be a JSON object")
    phoneme_type = raw.get("phoneme_type", "espeak")
    if phoneme_type not in PHONEME_TYPES:
        raise ModelError(
            f"{path}: phoneme_type {phoneme_type!r} is read by piper-tts's own phonemizer; "
            f"onnx-tts reads Piper voices of type {' and '.join(PHONEME_TYPES)}"
        )
    num_symbols = integer(raw.get("num_symbols"), "num_symbols", 1, MAX_SYMBOLS)
    id_map = raw.get("phoneme_id_map")
    if not isinstance(id_map, dict) or not id_map or len(id_map) > MAX_SYMBOLS:
        raise fail('"phoneme_id_map" must be an object of phoneme -> [ids]')
    phoneme_ids: dict[str, tuple[int, ...]] = {}
    for phoneme, ids in id_map.items():
        if not phoneme or len(phoneme) > 16:
            raise fail(f"phoneme {phoneme!r} in phoneme_id_map must be 1-16 characters")
        if not isinstance(ids, list) or not 1 <= len(ids) <= MAX_IDS_PER_PHONEME:
            raise fail(f"phoneme_id_map[{phoneme!r}] must be a list of 1-16 ids")
        name = f"phoneme_id_map[{phoneme!r}]"
        phoneme_ids[phoneme] = tuple(integer(i, name, 0, num_symbols - 1) for i in ids)
    missing = [mark for mark in (PAD, BOS, EOS) if mark not in phoneme_ids]
    if missing:
        raise fail(f"phoneme_id_map lacks {', '.join(repr(m) for m in missing)} (pad, start, end)")
    num_speakers = integer(raw.get("num_speakers", 1), "num_speakers", 1, MAX_SPEAKERS)
    speakers = raw.get("speaker_id_map") or {}
    if not isinstance(speakers, dict) or len(speakers) > MAX_SPEAKERS:
        raise fail('"speaker_id_map" must be an object of name -> id')
    speaker_ids = {
        text(name, "speaker name"): integer(sid, f"speaker_id_map[{name!r}]", 0, num_speakers - 1)
        for name, sid in speakers.items()
    }
    audio = section("audio")
    sample_rate = integer(audio.get("sample_rate"), "audio.sample_rate", 8000, 96000)
    inference = section("inference")
    espeak = section("espeak")
    espeak_voice = text(espeak.get("voice", "en-us"), "espeak.voice", 64)
    language = section("language").get("code") or espeak_voice
    language = text(language, "language.code", 32)
    dataset = raw.get("dataset") if isinstance(raw.get("dataset"), str) else model_path.stem
    quality = audio.get("quality")
    description = f"{dataset} ({quality})" if isinstance(quality, str) and quality else dataset
    clusters = raw.get("vowel_clusters") or []
    if not isinstance(clusters, list) or not all(
        isinstance(c, list) and 2 <= len(c) <= 8 and all(isinstance(p, str) for p in c)
        for c in clusters
    ):
        raise fail('"vowel_clusters" must be a list of lists of 2-8 phonemes')
    return VoiceConfig(
        name=model_path.name[: -len(".onnx")]
        if model_path.name.endswith(".onnx")
        else model_path.stem,
        model_path=model_path,
        config_path=path,
        sample_rate=sample_rate,
        espeak_voice=espeak_voice,
        phoneme_type=phoneme_type,
        phoneme_id_map=phoneme_ids,
        num_symbols=num_symbols,
        num_speakers=num_speakers,
        speaker_id_map=speaker_ids,
        noise_scale=number(
            inference.get("noise_scale", DEFAULT_NOISE_SCALE), "inference.noise_scale", 0, 10
        ),
        length_scale=number(
            inference.get("length_scale", DEFAULT_LENGTH_SCALE), "inference.length_scale", 0.01, 10
        ),
        noise_w=number(inference.get("noise_w", DEFAULT_NOISE_W), "inference.noise_w", 0, 10),
        hop_length=integer(raw.get("hop_length", DEFAULT_HOP_LENGTH), "hop_length", 1, 4096),
        language=language,
        description=description[:200],
        default_speaker_id=integer(
            raw.get("default_speaker_id", 0), "default_speaker_id", 0, num_speakers - 1
        ),
        vowel_clusters=frozenset(tuple(c) for c in clusters),
    )


__all__ = [
    "BOS",
    "CONFIG_SUFFIX",
    "EOS",
    "PAD",
    "VoiceConfig",
    "config_path_of",
    "read_voice_config",
    "voice_files",
]

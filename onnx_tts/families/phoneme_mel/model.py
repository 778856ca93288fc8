"""Phoneme-pointer mel bundles (`bundle.json` family "phoneme-mel"): the project's trained voice.

Text is phonemized (espeak-ng) and the LM walks a pointer along the phonemes: each step's
input is the previous step's mel frames, the phonemes around the pointer, how long the
pointer has stayed, and the speaker embedding; its output is the step's mel frames and
whether to advance the pointer by 0-3 phonemes. Generation ends when the pointer passes the
last symbol. The vocoder turns standardised log-mel into a waveform (Griffin-Lim in ONNX).
See export/voice/train.py for the model and docs/ARCHITECTURE.md for the graph contract.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from onnx_tts.bundle import Bundle
from onnx_tts.decoding import (
    Admission,
    CapacityPolicy,
    DecodeProgram,
    RowSampler,
    SamplingOptions,
    StepOutput,
)
from onnx_tts.decoding.request import Request
from onnx_tts.errors import InputError, ModelError
from onnx_tts.families.base import (
    Detection,
    Family,
    LoadSettings,
    TextFrontend,
    Vocoder,
    VocoderCapabilities,
    Voices,
    WordSpan,
    spoken_words,
)
from onnx_tts.families.bundled import BundledModel, bundle_encoder, bundle_files
from onnx_tts.families.loader import Graph, GraphSet, LoadedGraphs, load_graphs
from onnx_tts.frontend import PhonemeTable, Phonemizer, normalize_text, split_sentences
from onnx_tts.frontend.sentences import UNIT_SPACE
from onnx_tts.frontend.word_phonemes import word_positions
from onnx_tts.graph_io import check_graph_io
from onnx_tts.session import Session
from onnx_tts.vocoder import decode_in_batches

FAMILY = "phoneme-mel"
GRAPH_ROLES = ("encoder", "embed", "lm", "vocoder")
PAD_ID = 0  # phoneme-window id outside the sentence; symbol i has id i + 1
# A pointer that stays this many steps on one phoneme is moved on: a runaway guard, far
# beyond any real phoneme (2 s at 25 steps/s).
MAX_STEPS_ON_ONE_SYMBOL = 50
MAX_KNOWN_WORDS = 20_000  # words whose own phonemes are kept (word timings)
SECTIONS = ("graphs", "kv", "frames", "text", "pointer", "lm", "streaming", "vocoder")


def phoneme_windows(
    ids: np.ndarray,
    pointers: np.ndarray,
    context: Sequence[int],
    lengths: np.ndarray | None = None,
) -> np.ndarray:
    """The embed graph's `phonemes` input: ids at each pointer + each context offset, PAD_ID
    outside the sentence; i64 [len(pointers), len(context)]. `ids` is one sentence [L] for
    every pointer, or one right-padded sentence per pointer [len(pointers), L] with its
    `lengths`. Training builds its inputs with this same function."""
    positions = np.asarray(pointers, np.int64)[:, None] + np.asarray(context, np.int64)[None, :]
    ids = np.asarray(ids)
    if ids.ndim == 1:
        inside = (positions >= 0) & (positions < len(ids))
        return np.where(inside, ids[np.clip(positions, 0, len(ids) - 1)], PAD_ID)
    inside = (positions >= 0) & (positions < np.asarray(lengths)[:, None])
    gathered = np.take_along_axis(ids, np.clip(positions, 0, ids.shape[1] - 1), axis=1)
    return np.where(inside, gathered, PAD_ID)


def _speaker_vector(value: Any) -> np.ndarray | None:
    """A manifest's speaker embedding as float32 [E], or None when it is not one."""
    try:
        vector = np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError):
        return None
    if vector.ndim != 1 or not 1 <= vector.size <= 4096 or not np.isfinite(vector).all():
        return None
    return vector


@dataclass
class _PointerState:
    ids: np.ndarray  # [rows, longest] phoneme ids, right-padded
    lengths: np.ndarray
    pointer: np.ndarray
    progress: np.ndarray  # steps already spent on the pointer's symbol
    steps: np.ndarray
    max_steps: np.ndarray
    previous: np.ndarray  # [rows, reduction * n_mels] the last step's frames
    speaker: np.ndarray  # [rows, E]
    sampler: RowSampler
    marks: list[list[int] | None]  # a row's request.marks: the pointer of each step, if asked


class PhonemeMelProgram(DecodeProgram):
    """Each step embeds (previous frames, phoneme window at the pointer, progress, speaker),
    runs the LM, takes `reduction` mel frames and samples how far the pointer advances; a row
    ends when its pointer passes the last symbol."""

    def __init__(self, model: PhonemeMelModel, lm: Session, embed: Session) -> None:
        self.model = model
        self.lm, self.embed = lm, embed
        self.width = model.frame_width

    def new_state(self, rows: int) -> _PointerState:
        return _PointerState(
            ids=np.zeros((rows, 1), np.int64),
            lengths=np.zeros(rows, np.int64),
            pointer=np.zeros(rows, np.int64),
            progress=np.zeros(rows, np.int64),
            steps=np.zeros(rows, np.int64),
            max_steps=np.zeros(rows, np.int64),
            previous=np.zeros((rows, self.width), np.float32),
            speaker=np.zeros((rows, self.model.speaker_dim), np.float32),
            sampler=RowSampler(rows),
            marks=[None] * rows,
        )

    def admit(self, state: _PointerState, row: int, request: Request) -> Admission:
        ids = np.asarray(request.chunk.ids, dtype=np.int64)
        state.marks[row] = request.marks
        if len(ids) > state.ids.shape[1]:
            wider = np.zeros((len(state.ids), len(ids)), np.int64)
            wider[:, : state.ids.shape[1]] = state.ids
            state.ids = wider
        state.ids[row] = 0
        state.ids[row, : len(ids)] = ids
        state.lengths[row] = len(ids)
        state.pointer[row] = state.progress[row] = state.steps[row] = 0
        state.max_steps[row] = self.model.max_steps_per_symbol * len(ids)
        state.previous[row] = 0.0
        state.speaker[row] = np.asarray(request.voice["speaker_embedding"], np.float32).reshape(-1)
        state.sampler.assign(row, request.sampling)
        rows = np.array([row])
        return Admission(self.step_inputs(state, rows), int(state.max_steps[row]))

    def step_inputs(self, state: _PointerState, rows: np.ndarray) -> np.ndarray:
        windows = phoneme_windows(
            state.ids[rows], state.pointer[rows], self.model.context, state.lengths[rows]
        )
        return self.embed.run(
            {
                "previous_frames": state.previous[rows][:, None, :],
                "phonemes": windows[:, None, :],
                "progress": state.progress[rows][:, None],
                "speaker_embedding": state.speaker[rows],
            }
        )["inputs_embeds"]

    def consume(self, state: _PointerState, rows: np.ndarray, logits: np.ndarray) -> StepOutput:
        frames = np.array(logits[:, : self.width], np.float32)
        for row in rows:  # the phoneme each step's frames voice
            marks = state.marks[row]
            if marks is not None:
                marks.append(int(state.pointer[row]))
        advance = state.sampler.sample(rows, logits[:, self.width :])
        progress = state.progress[rows]
        advance = np.where((advance == 0) & (progress + 1 >= MAX_STEPS_ON_ONE_SYMBOL), 1, advance)
        state.previous[rows] = frames
        state.pointer[rows] += advance
        state.progress[rows] = np.where(advance > 0, 0, progress + 1)
        state.steps[rows] += 1
        done = (state.pointer[rows] >= state.lengths[rows]) | (
            state.steps[rows] >= state.max_steps[rows]
        )
        model = self.model
        return StepOutput(
            frames=list(frames.reshape(len(rows), model.reduction, model.n_mels)), done=done
        )


@dataclass(frozen=True)
class PhonemeChunk:
    """A sentence as the LM walks it: [start] + phoneme ids + [end], and its words; `given`:
    phonemes the writer gave (their words are the space-separated groups)."""

    ids: tuple[int, ...]
    text: str
    given: bool = False


class PhonemeText(TextFrontend):
    """Normalised English, split at sentences, phonemized by espeak-ng: [start] + phoneme ids
    + [end] per sentence. Phoneme input (SSML <phoneme>, [[ ]]) is taken as given. Word
    timings are exact: the program marks which phoneme each step voices, and a sentence's
    words are its space-separated phoneme groups."""

    def __init__(
        self, table: PhonemeTable, phonemizer: Phonemizer, start: list[int], end: list[int], chars
    ) -> None:
        self.table, self.phonemizer = table, phonemizer
        self.start_id, self.end_id, self.max_chunk_chars = start, end, chars
        self._known_words: dict[str, list[str]] = {}

    def phoneme_ids(self, sentence: str) -> list[int]:
        """[start] + phoneme ids of `sentence` + [end]; only the boundaries if nothing is
        speakable."""
        return self.start_id + self.table.encode(self.phonemizer.phonemize(sentence)) + self.end_id

    def chunks(self, text: str, options: Mapping[str, Any]) -> list[PhonemeChunk]:
        # The sentences keep the reader's units (captions never split "nine thirty AM").
        sentences = split_sentences(normalize_text(text, keep_units=True), self.max_chunk_chars)
        chunks = [
            PhonemeChunk(tuple(self.phoneme_ids(s.replace(UNIT_SPACE, " "))), s) for s in sentences
        ]
        chunks = [chunk for chunk in chunks if len(chunk.ids) > 2]
        if not chunks:
            raise InputError("text has nothing speakable after normalisation")
        return chunks

    def phoneme_chunks(self, ipa: str, text: str, options: Mapping[str, Any]) -> list[PhonemeChunk]:
        symbols = self.table.encode_given(ipa)
        return [PhonemeChunk(tuple(self.start_id + symbols + self.end_id), text or ipa, True)]

    def describe(self, chunk: Any) -> str:
        return chunk.text.replace(UNIT_SPACE, " ") if isinstance(chunk, PhonemeChunk) else ""

    def words(self, chunk: Any) -> list[WordSpan]:
        """The sentence's words on its phonemes (positions in `ids`, so the program's pointer
        marks time them). Where espeak-ng wrote words together ("in the": ``ɪnðə``), each
        word's own phonemes, aligned to the sentence's, split the group
        (`frontend.word_phonemes`); a word with no sound of its own there is estimated."""
        words = spoken_words(chunk.text)
        sentence = [self.table.symbols[i - 1] for i in chunk.ids[1:-1]]
        if chunk.given:  # the writer's phonemes: their groups are the words
            groups = _groups(sentence)
            if len(groups) != len(words):
                return words
            pairs = zip(words, groups, strict=True)
            return [replace(word, first=a + 1, last=b + 1) for word, (a, b) in pairs]
        spans = word_positions(sentence, [self._word_phonemes(word.text) for word in words])
        return [
            replace(word, first=span[0] + 1, last=span[1] + 1) if span else word
            for word, span in zip(words, spans, strict=True)
        ]

    def _word_phonemes(self, word: str) -> list[str]:
        """A word's own phoneme symbols (those of the bundle's table), kept for the next time."""
        found = self._known_words.get(word)
        if found is None:
            if len(self._known_words) >= MAX_KNOWN_WORDS:
                self._known_words.clear()
            ids = self.table.encode(self.phonemizer.phonemize(word))
            found = self._known_words[word] = [self.table.symbols[i - 1] for i in ids]
        return found


def _groups(symbols: Sequence[str]) -> list[tuple[int, int]]:
    """[first, last) of each space-separated group of `symbols`."""
    groups, start = [], None
    for position, symbol in enumerate([*symbols, " "]):
        if symbol == " ":
            if start is not None:
                groups.append((start, position))
            start = None
        elif start is None:
            start = position
    return groups


class MelVocoder(Vocoder):
    """Standardised log-mel [F, reduction, n_mels] -> waveform (Griffin-Lim in ONNX). It does
    not depend on the voice, and B windows of one length in one run give each window's own
    bits (tests/test_vocoder_fft.py): it batches exactly, one run per window length (padding
    would change a window's last samples)."""

    def __init__(self, session: Session, sample_rate: int, hop_length: int, n_mels: int) -> None:
        self.session, self.n_mels = session, n_mels
        self.capabilities = VocoderCapabilities(sample_rate, hop_length, batches_exactly=True)

    def vocode(self, frames: np.ndarray, voice: Mapping[str, np.ndarray]) -> np.ndarray:
        mel = np.asarray(frames, np.float32).reshape(1, -1, self.n_mels)
        if mel.shape[1] == 0:
            return np.zeros(0, np.float32)
        return self._vocode_batch(mel)[0]

    def _vocode_batch(self, mel: np.ndarray) -> np.ndarray:
        return self.session.run({"mel": mel}, ["waveform"])["waveform"]

    def vocode_windows(
        self, windows: Sequence[np.ndarray], voices: Sequence[Mapping[str, np.ndarray]]
    ) -> list[np.ndarray]:
        mels = [np.asarray(w, np.float32).reshape(-1, self.n_mels) for w in windows]
        return decode_in_batches(mels, self._vocode_batch, self.capabilities.hop_length)


class PhonemeMelModel(BundledModel):
    """A "phoneme-mel" bundle as the family contract's parts."""

    def __init__(self, bundle: Bundle, settings: LoadSettings) -> None:
        self.bundle = bundle
        manifest = bundle.manifest
        text = bundle.section("text")
        hop_length = bundle.value("frames", "hop_length", int, 1, 1 << 16)
        self.n_mels = bundle.value("frames", "n_mels", int, 1, 1024)
        self.reduction = bundle.value("frames", "reduction", int, 1, 64)
        self.frame_width = self.reduction * self.n_mels
        context = text.get("context")
        if (
            not isinstance(context, list)
            or not context
            or not all(
                isinstance(c, int) and not isinstance(c, bool) and abs(c) <= 64 for c in context
            )
        ):
            raise ModelError(f"{bundle.root}: text.context must be a list of small integers")
        self.context = np.asarray(context, dtype=np.int64)
        max_chunk_chars = bundle.value("text", "max_chars_per_chunk", int, 1, 1 << 16, 200)
        self.sampling = dict(manifest.get("sampling", {}))
        self.max_steps_per_symbol = bundle.value(
            "pointer", "max_steps_per_symbol", int, 1, 1000, 12
        )
        self.advance_classes = bundle.value("pointer", "advance_classes", int, 2, 64)
        symbols = text.get("phonemes")
        if not isinstance(symbols, list) or not all(isinstance(s, str) for s in symbols):
            raise ModelError(f"{bundle.root}: text.phonemes must be a list of symbols")
        table = PhonemeTable(symbols)
        start_id = table.encode(bundle.value("text", "start_symbol", str))
        end_id = table.encode(bundle.value("text", "end_symbol", str))
        if len(start_id) != 1 or len(end_id) != 1:
            raise ModelError(
                f"{bundle.root}: start/end symbols are not in the bundle's phoneme table"
            )
        phonemizer = Phonemizer(bundle.value("text", "language", str, default="en-us"))
        default = _speaker_vector(manifest.get("default_speaker_embedding"))
        if default is None:
            raise ModelError(
                f"{bundle.root}: default_speaker_embedding must be a list of 1 to 4096 finite "
                "numbers"
            )

        options = settings.session_options
        # A batch-1 decode step of this small LM is too little work to split across threads:
        # measured 1.26 ms/step on one intra-op thread vs 2.76 ms on two (2 cores). The
        # encoder and the vocoder, which see whole clips, take their stage's threads.
        step_options = (
            options if options.shared_thread_pool else replace(options, intra_op_threads=1)
        )
        stages = {"encoder": "encoder", "vocoder": "vocoder"}
        capacity = bundle.kv_capacity(4096)
        graphs = load_graphs(
            GraphSet(
                {
                    role: Graph(
                        bundle.graph_path(role),
                        stages.get(role, "decode"),
                        options=step_options if role in ("embed", "lm") else None,
                    )
                    for role in GRAPH_ROLES
                },
                lm="lm",
                capacity=CapacityPolicy(
                    capacity, bundle.value("lm", "max_positions", int, 1, 1 << 22, capacity)
                ),
                default_kv=bundle.value("kv", "default_mode", str, default=None),
            ),
            settings,
        )
        self.speaker_dim = default.shape[0]
        self._validate(graphs)
        self.default_speaker = default
        encoder = bundle_encoder(bundle, graphs["encoder"], hop_length, frame_outputs=())
        super().__init__(
            family=FAMILY,
            text=PhonemeText(table, phonemizer, start_id, end_id, max_chunk_chars),
            voices=Voices(encoder, lambda: {"speaker_embedding": self.default_speaker}),
            program=PhonemeMelProgram(self, graphs["lm"], graphs["embed"]),
            vocoder=MelVocoder(graphs["vocoder"], bundle.sample_rate, hop_length, self.n_mels),
            graphs=graphs,
            streaming_defaults=dict(bundle.section("streaming")),
        )

    def _validate(self, graphs: LoadedGraphs) -> None:
        bundle, speaker_dim = self.bundle, self.speaker_dim
        hidden = bundle.value("lm", "hidden_size", int, 1, 1 << 16)
        check_graph_io(
            graphs["encoder"].spec,
            "encoder",
            {"audio": ("float32", (None, None))},
            {"speaker_embedding": ("float32", (None, speaker_dim))},
        )
        check_graph_io(
            graphs["embed"].spec,
            "embed",
            {
                "previous_frames": ("float32", (None, None, self.frame_width)),
                "phonemes": ("int64", (None, None, len(self.context))),
                "progress": ("int64", (None, None)),
                "speaker_embedding": ("float32", (None, speaker_dim)),
            },
            {"inputs_embeds": ("float32", (None, None, hidden))},
        )
        lm_inputs: dict[str, tuple[str, Any]] = {"inputs_embeds": ("float32", (None, None, hidden))}
        width = self.frame_width + self.advance_classes
        lm_outputs: dict[str, tuple[str, Any]] = {"logits": ("float32", (None, None, width))}
        past_specs, present_specs = bundle.kv_specs()
        lm_inputs.update(past_specs)
        lm_outputs.update(present_specs)
        check_graph_io(graphs["lm"].spec, "lm", lm_inputs, lm_outputs)
        check_graph_io(
            graphs["vocoder"].spec,
            "vocoder",
            {"mel": ("float32", (None, None, self.n_mels))},
            {"waveform": ("float32", (None, None))},
        )

    # -- the family's own ----------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "name": self.bundle.name,
            "path": str(self.bundle.root),
            "sample_rate": self.sample_rate,
            "kv_mode": self.kv_mode,
            "kv": self.bundle.manifest["kv"],
            "frames": self.bundle.manifest["frames"],
            "phonemes": len(self.text.table),  # type: ignore[attr-defined]
            "streaming": self.streaming_defaults,
            "graphs": self.graphs.describe(),
        }

    def sampling_defaults(self) -> SamplingOptions:
        # Only the advance decision is sampled; greedy (temperature 0) unless asked otherwise.
        temperature = 0.0
        if "sampling" in self.bundle.manifest:
            temperature = self.bundle.value("sampling", "temperature", float, 0.0, 100.0, 0.0)
        return SamplingOptions(temperature=temperature).checked()


def load(
    detection: Detection, settings: LoadSettings, options: Mapping[str, Any]
) -> PhonemeMelModel:
    return PhonemeMelModel(detection.inspected, settings, **options)


REGISTRY_ENTRY = Family(
    name=FAMILY,
    summary="phoneme-pointer mel LM with a speaker embedding (the project's trained voice)",
    loader=load,
    manifest_sections=SECTIONS,
    files=bundle_files,
)

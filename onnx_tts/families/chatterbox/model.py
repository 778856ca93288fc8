"""The Chatterbox backend: cached speech-encoder conditionals, the published generation loop
as a decode program (audio-feature prefix + text, greedy with repetition penalty 1.2 until
token 6562, optional classifier-free guidance), stop heuristics, and the conditional decoder
as vocoder. Nothing about dtypes or sizes is assumed; it comes from the layout's graph specs.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from onnx_tts.audio import load_audio
from onnx_tts.bundle import files_identity
from onnx_tts.decoding import (
    Admission,
    CapacityPolicy,
    DecodeProgram,
    RowSampler,
    SamplingOptions,
    StepOutput,
    StopRules,
    StopTracker,
)
from onnx_tts.decoding.request import Request
from onnx_tts.encoder import VoiceEncoder
from onnx_tts.errors import AudioError, InputError, ModelError
from onnx_tts.families.base import (
    LoadSettings,
    Model,
    TextFrontend,
    Vocoder,
    VocoderCapabilities,
    Voices,
)
from onnx_tts.families.chatterbox.layout import (
    FAMILY_MULTILINGUAL,
    FAMILY_ORIGINAL,
    FAMILY_TURBO,
    SPEECH_ENCODER_OUTPUTS,
    ChatterboxLayout,
)
from onnx_tts.families.chatterbox.text import (
    CangjieConverter,
    hiragana,
    multilingual_normalize,
    punctuate,
    replace_punctuation,
)
from onnx_tts.families.loader import Graph, GraphSet, load_graphs
from onnx_tts.frontend import normalize_text, split_sentences
from onnx_tts.session import Session

START_SPEECH_TOKEN = 6561
STOP_SPEECH_TOKEN = 6562
EXAGGERATION_TOKEN = 6563
SILENCE_TOKEN = 4299
SAMPLE_RATE = 24000
SAMPLES_PER_TOKEN = 960  # 25 Hz speech tokens at 24 kHz
DEFAULT_REPETITION_PENALTY = 1.2  # the published scripts' value
MAX_NEW_TOKENS = 1000  # 40 s of speech per chunk
# The model cards' scripts cap each text at these many speech tokens (--published-loop).
PUBLISHED_MAX_NEW_TOKENS = {FAMILY_TURBO: 1024, FAMILY_ORIGINAL: 256, FAMILY_MULTILINGUAL: 256}
MAX_CHUNK_CHARS = 300
TOKENS_PER_TEXT_TOKEN = 25  # cap on speech tokens per text token (a runaway guard)
REFERENCE_MIN_SECONDS = 1.0
REFERENCE_MAX_SECONDS = 20.0
POSITION_LIMIT = 1 << 16


def default_stop_rules() -> StopRules:
    return StopRules(silence_tokens=frozenset({SILENCE_TOKEN}))


@dataclass
class _TokenState:
    sampler: RowSampler
    tokens: np.ndarray  # last token of each row
    steps: np.ndarray  # tokens consumed so far
    limit: np.ndarray  # most tokens a row may produce
    fresh: np.ndarray  # admitted, no step consumed yet (its `seen` mask is reset then)
    stops: StopTracker
    seen: np.ndarray | None = None  # [rows, vocab] tokens produced (repetition penalty)


class ChatterboxProgram(DecodeProgram):
    """Prefill [audio features][text]; each step: guided scores when cfg_weight > 0 (rows
    doubled: conditional, then text-free), START and out-of-range tokens masked, repetition
    penalty, sample; 6562 or a stop rule ends the row; the token goes back through
    embed_tokens at its position."""

    def __init__(self, model: ChatterboxModel, text: ChatterboxText, lm: Session) -> None:
        self.model, self.text = model, text
        self.lm = lm
        self.lm_rows = 2 if model.cfg_weight > 0 else 1

    def new_state(self, rows: int) -> _TokenState:
        return _TokenState(
            sampler=RowSampler(rows),
            tokens=np.zeros(rows, np.int64),
            steps=np.zeros(rows, np.int64),
            limit=np.zeros(rows, np.int64),
            fresh=np.zeros(rows, bool),
            stops=StopTracker(self.model.stop_rules, rows),
        )

    def admit(self, state: _TokenState, row: int, request: Request) -> Admission:
        model = self.model
        arrays = model.voice_arrays(request.voice)
        ids = np.asarray(self.text.token_ids(request.chunk, request.options.get("language")))[None]
        embeds = model.prefill_embeds(ids, arrays["audio_features"], self.lm_rows == 2)
        limit = model.max_new_tokens
        if not model.published_loop:
            limit = min(limit, max(64, TOKENS_PER_TEXT_TOKEN * ids.shape[1]))
        state.sampler.assign(row, request.sampling)
        state.steps[row], state.limit[row], state.fresh[row] = 0, limit, True
        state.stops.reset(row)
        return Admission(
            embeds.astype(model.embeds_dtype, copy=False),
            embeds.shape[1] + limit + 1,
            prefix=len(arrays["audio_features"]),  # the voice's conditioning comes first
        )

    def step_inputs(self, state: _TokenState, rows: np.ndarray) -> np.ndarray:
        embeds = self.model.embed(state.tokens[rows][:, None], state.steps[rows][:, None])
        if self.lm_rows == 2:
            embeds = np.repeat(embeds, 2, axis=0)
        return embeds.astype(self.model.embeds_dtype, copy=False)

    def consume(self, state: _TokenState, rows: np.ndarray, logits: np.ndarray) -> StepOutput:
        if self.lm_rows == 2:
            pairs = logits.reshape(len(rows), 2, -1)
            cond = pairs[:, 0].astype(np.float32)
            scores = cond + self.model.cfg_weight * (cond - pairs[:, 1].astype(np.float32))
        else:
            scores = logits.astype(np.float32)  # a copy: logits may be a reused buffer
        scores[:, START_SPEECH_TOKEN] = -np.inf
        scores[:, STOP_SPEECH_TOKEN + 1 :] = -np.inf
        if state.seen is None or state.seen.shape[1] != scores.shape[1]:
            state.seen = np.zeros((len(state.tokens), scores.shape[1]), bool)
            state.fresh[:] = True
        fresh = rows[state.fresh[rows]]
        state.seen[fresh] = False
        state.seen[fresh, START_SPEECH_TOKEN] = True
        state.fresh[fresh] = False
        scores = state.sampler.penalize(rows, scores, state.seen[rows])
        tokens = state.sampler.sample(rows, scores)
        speaking = tokens != STOP_SPEECH_TOKEN
        state.seen[rows[speaking], tokens[speaking]] = True
        state.tokens[rows] = tokens
        state.steps[rows] += 1
        stopped = np.zeros(len(rows), bool)
        stopped[speaking] = state.stops.push(rows[speaking], tokens[speaking])
        done = ~speaking | stopped | (state.steps[rows] >= state.limit[rows])
        frames = [
            np.array([[token]], np.int64) if speak else np.zeros((0, 1), np.int64)
            for token, speak in zip(tokens.tolist(), speaking.tolist(), strict=True)
        ]
        return StepOutput(frames=frames, done=done)


class ChatterboxText(TextFrontend):
    """Text as the published pipelines prepare and tokenize it."""

    def __init__(self, model: ChatterboxModel, tokenizer: Tokenizer) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.family = model.family
        self._cangjie_converter: CangjieConverter | None = None

    def chunks(self, text: str, options: Mapping[str, Any]) -> list[str]:
        """The text as the published pipelines prepare it: punctuation replacements, (English
        models) our number and abbreviation reading, sentences of at most MAX_CHUNK_CHARS, each
        with a capital and an end mark. `published_loop`: the whole text as given (ends
        stripped), as the model cards' scripts tokenize it."""
        if self.model.published_loop:
            chunks = [text.strip()]
        else:
            english = self.family != FAMILY_MULTILINGUAL
            cleaned = replace_punctuation(text, self.family, keep_number_colons=english)
            if english:
                cleaned = normalize_text(cleaned)
            sentences = split_sentences(" ".join(cleaned.split()), MAX_CHUNK_CHARS)
            chunks = [punctuate(s, self.family) for s in sentences]
        chunks = [s for s in chunks if s and self._has_tokens(s)]
        if not chunks:
            raise InputError("text has nothing speakable after normalisation")
        return chunks

    def _has_tokens(self, sentence: str) -> bool:
        return bool(self.tokenizer.encode(sentence, add_special_tokens=False).ids)

    def token_ids(self, sentence: str, language: str | None = None) -> list[int]:
        """Token ids of one sentence as the published scripts build them."""
        if self.family == FAMILY_TURBO:
            return list(self.tokenizer.encode(sentence, add_special_tokens=False).ids)
        if self.family == FAMILY_MULTILINGUAL:
            language = language or self.model.language
            if language == "ja":
                sentence = hiragana(sentence)  # before NFKD, which spoils kana readings
            sentence = multilingual_normalize(sentence)
            if language == "zh" and self._cangjie() is not None:
                sentence = self._cangjie()(sentence)  # type: ignore[misc]
            sentence = f"[{language}]{sentence}"
        ids = list(self.tokenizer.encode(sentence).ids)
        if not ids or ids[-1] != START_SPEECH_TOKEN:
            # A tokenizer without the ONNX repos' template: add the wrapping ourselves.
            start = self.tokenizer.token_to_id("[START]")
            stop = self.tokenizer.token_to_id("[STOP]")
            body = list(self.tokenizer.encode(sentence, add_special_tokens=False).ids)
            ids = [EXAGGERATION_TOKEN, *([start] if start is not None else []), *body]
            ids += [stop if stop is not None else 0, START_SPEECH_TOKEN]
        return ids

    def _cangjie(self) -> CangjieConverter | None:
        path = self.model.layout.model_dir / "Cangjie5_TC.json"
        if self._cangjie_converter is None and path.is_file():
            self._cangjie_converter = CangjieConverter(path)
        return self._cangjie_converter


class ChatterboxVocoder(Vocoder):
    """The conditional decoder: speech tokens [F] or [F, 1] -> exactly F * 960 samples at
    24 kHz, conditioned on the voice (so windows of several streams do not batch)."""

    def __init__(self, model: ChatterboxModel, decoder: Session) -> None:
        self.model, self.decoder = model, decoder
        self.capabilities = VocoderCapabilities(SAMPLE_RATE, SAMPLES_PER_TOKEN)
        # The voice inputs' dtypes, looked up once rather than for every window.
        self.voice_dtypes = {
            name: model.input_dtype("conditional_decoder", name)
            for name in ("speaker_embeddings", "speaker_features")
        }

    def vocode(self, frames: np.ndarray, voice: Mapping[str, np.ndarray]) -> np.ndarray:
        """The decoder sees prompt tokens + frames (+ 3 silence tokens for Turbo, as
        published; their audio is cut so every frame maps to one 40 ms hop)."""
        tokens = np.asarray(frames, dtype=np.int64).reshape(-1)
        if tokens.size == 0:
            return np.zeros(0, np.float32)
        if tokens.min() < 0 or tokens.max() >= START_SPEECH_TOKEN:
            raise InputError("speech tokens for the decoder must be in [0, 6561)")
        arrays = self.model.voice_arrays(voice)
        prompt = arrays["audio_tokens"].reshape(-1).astype(np.int64)
        padding = np.full(self.model.silence_padding, SILENCE_TOKEN, np.int64)
        speech = np.concatenate([prompt, tokens, padding])[None]
        decoder = self.decoder
        feeds = {"speech_tokens": speech}
        for name, dtype in self.voice_dtypes.items():
            feeds[name] = arrays[name][None].astype(dtype)
        output = decoder.run(feeds)[decoder.output_names[0]]
        samples = np.asarray(output, dtype=np.float32).reshape(-1)
        return samples[: tokens.size * SAMPLES_PER_TOKEN]


class ChatterboxModel(Model):
    """Chatterbox ONNX directories (Turbo, original English, multilingual) as the family
    contract's parts."""

    def __init__(
        self,
        layout: ChatterboxLayout,
        settings: LoadSettings,
        *,
        precision: str | None = None,
        language: str | None = None,
        exaggeration: float | None = None,
        cfg_weight: float | None = None,
        max_new_tokens: int | None = None,
        max_token_repeat: int | None = None,
        max_cycle_tokens: int | None = None,
        max_silence_tokens: int | None = None,
        published_loop: bool = False,
    ) -> None:
        del precision  # chosen by detection, which read the files of that precision
        self.layout = layout
        family = layout.family
        if exaggeration is not None and not layout.embed_has_exaggeration:
            raise InputError(f"{family} has no exaggeration control; drop --exaggeration")
        self.exaggeration = 0.5 if exaggeration is None else float(exaggeration)
        if cfg_weight is not None and not layout.embed_has_position_ids:
            raise InputError(f"{family} does not support classifier-free guidance")
        self.cfg_weight = float(cfg_weight or 0.0)
        self.family = family
        self.language = "en"
        self.language = self.check_language(language)
        self.published_loop = bool(published_loop)
        default_cap = PUBLISHED_MAX_NEW_TOKENS[family] if published_loop else MAX_NEW_TOKENS
        self.max_new_tokens = default_cap if max_new_tokens is None else int(max_new_tokens)
        rules = default_stop_rules()
        if self.published_loop:
            rules = StopRules(max_token_repeat=0, max_cycle_tokens=0, max_silence_tokens=0)
        overrides = {
            "max_token_repeat": max_token_repeat,
            "max_cycle_tokens": max_cycle_tokens,
            "max_silence_tokens": max_silence_tokens,
        }
        self.stop_rules = StopRules(
            **{**rules.__dict__, **{k: v for k, v in overrides.items() if v is not None}}
        ).checked()
        self.silence_padding = 3 if family == FAMILY_TURBO else 0

        stages = {"speech_encoder": "encoder", "conditional_decoder": "vocoder"}
        graphs = load_graphs(
            GraphSet(
                {
                    role: Graph(spec.path, stages.get(role, "decode"))
                    for role, spec in layout.graphs.items()
                },
                lm="language_model",
                capacity=CapacityPolicy(None, POSITION_LIMIT),
                kv=layout.lm.kv,
            ),
            settings,
        )
        self.sessions = graphs.sessions
        self._check_runtime_io()
        try:
            tokenizer = Tokenizer.from_file(str(layout.tokenizer_path))
        except Exception as error:  # tokenizers raises a bare Exception on bad JSON
            raise ModelError(f"cannot read tokenizer {layout.tokenizer_path}: {error}") from None
        self.embeds_dtype = self.input_dtype("language_model", "inputs_embeds")
        # Looked up once here: `embed` runs at every decode step.
        self.exaggeration_dtype = self.input_dtype("embed_tokens", "exaggeration")
        encoder = VoiceEncoder(
            graphs["speech_encoder"],
            bundle_identity=f"{family}/{layout.graphs['speech_encoder'].path.name}",
            sample_rate=SAMPLE_RATE,
            settings={"min_seconds": REFERENCE_MIN_SECONDS, "max_seconds": REFERENCE_MAX_SECONDS},
            graph_sha256=files_identity(layout.files_of("speech_encoder")),
            hop_length=SAMPLES_PER_TOKEN,
            frame_outputs=(layout.speech_encoder_outputs["audio_tokens"],),
            input_name="audio_values",
        )
        self._default_voice: dict[str, np.ndarray] | None = None
        self._lock = threading.Lock()
        text = ChatterboxText(self, tokenizer)
        super().__init__(
            family=family,
            text=text,
            voices=Voices(encoder, self._encoded_default_voice),
            program=ChatterboxProgram(self, text, graphs.lm),
            vocoder=ChatterboxVocoder(self, graphs["conditional_decoder"]),
            graphs=graphs,
            streaming_defaults={
                "first_chunk_frames": 10,
                "stride_frames": 25,
                "overlap_frames": 8,
                "holdback_frames": 2,
                "crossfade_samples": 480,
            },
        )

    # -- setup ---------------------------------------------------------------------------------
    def _check_runtime_io(self) -> None:
        """The loaded sessions must agree with what the layout read from the files."""
        for role, session in self.sessions.items():
            declared = self.layout.graphs[role]
            missing = [n for n in declared.input_names if session.input(n) is None]  # type: ignore[union-attr]
            if missing:
                raise ModelError(f"{declared.path.name}: runtime does not see inputs {missing}")

    def input_dtype(self, role: str, name: str) -> np.dtype:
        info = self.sessions[role].input(name)  # type: ignore[union-attr]
        return info.dtype if info is not None else np.dtype(np.float32)

    # -- the family's own ----------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        lm = self.layout.lm
        return {
            "name": f"{self.layout.model_dir.name} [{self.layout.precision}]",
            "family": self.family,
            "path": str(self.layout.model_dir),
            "precision": self.layout.precision,
            "precisions": list(self.layout.available_precisions),
            "sample_rate": self.sample_rate,
            "kv_mode": self.kv_mode,
            "kv": {
                "layers": lm.kv.layers,
                "kv_heads": lm.kv.kv_heads,
                "head_dim": lm.kv.head_dim,
                "dtype": str(lm.kv.dtype),
                "attention": lm.kv.attention,
                "capacity": "per request" if self.kv_mode == "inplace" else None,
                "embeds_dtype": str(lm.embeds_dtype),
                "logits_dtype": str(lm.logits_dtype),
                "position_ids": lm.has_position_ids,
            },
            "language": self.language,
            "languages": list(self.layout.languages),
            "exaggeration": self.exaggeration if self.layout.embed_has_exaggeration else None,
            "cfg_weight": self.cfg_weight,
            "published_loop": self.published_loop,
            "streaming": self.streaming_defaults,
            "graphs": self.graphs.describe(),
        }

    def _encoded_default_voice(self) -> dict[str, np.ndarray]:
        """The repository's default_voice.wav, encoded once."""
        if self.layout.default_voice is None:
            raise AudioError(
                f"{self.family} needs a reference voice (this directory has no "
                "default_voice.wav): pass --voice ref.wav with a few seconds of speech"
            )
        with self._lock:
            if self._default_voice is None:
                audio = load_audio(
                    self.layout.default_voice,
                    SAMPLE_RATE,
                    min_seconds=REFERENCE_MIN_SECONDS,
                    max_seconds=REFERENCE_MAX_SECONDS,
                )
                self._default_voice = self.encoder.encode(audio)
            return self._default_voice

    def sampling_defaults(self) -> SamplingOptions:
        """Greedy with repetition penalty 1.2, as published."""
        return SamplingOptions(
            temperature=0.0, top_k=0, top_p=1.0, repetition_penalty=DEFAULT_REPETITION_PENALTY
        )

    def request_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        return {"language": self.check_language(options.get("language"))}

    def check_language(self, language: str | None) -> str:
        if language is None:
            return self.language
        code = str(language).lower()
        if self.family != FAMILY_MULTILINGUAL:
            if code != "en":
                raise InputError(f"{self.family} speaks English only; drop --language {language}")
            return code
        if code not in self.layout.languages:
            raise InputError(
                f"language {language!r} is not in this model's tokenizer; choose one of "
                f"{', '.join(self.layout.languages)}"
            )
        return code

    def voice_arrays(self, voice: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Encoder outputs under their canonical names, without the batch axis."""
        arrays = {}
        for canonical, aliases in SPEECH_ENCODER_OUTPUTS.items():
            value = next((voice[a] for a in aliases if a in voice), None)
            if value is None:
                raise AudioError(
                    f"voice has no {canonical!r}: it was not encoded by this model's speech "
                    f"encoder (keys: {sorted(voice)})"
                )
            arrays[canonical] = np.asarray(value)
        return arrays

    def embed(self, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
        feeds: dict[str, np.ndarray] = {"input_ids": ids.astype(np.int64)}
        if self.layout.embed_has_position_ids:
            feeds["position_ids"] = positions.astype(np.int64)
        if self.layout.embed_has_exaggeration:
            feeds["exaggeration"] = np.full(
                (ids.shape[0],), self.exaggeration, self.exaggeration_dtype
            )
        return self.sessions["embed_tokens"].run(feeds, ["inputs_embeds"])["inputs_embeds"]

    def prefill_embeds(self, ids: np.ndarray, features: np.ndarray, guided: bool) -> np.ndarray:
        # Text positions count from [START] = 0; marker tokens (>= 6561) take position 0.
        positions = np.where(ids >= START_SPEECH_TOKEN, 0, np.arange(ids.shape[1])[None] - 1)
        text = self.embed(ids, positions).astype(np.float32)
        prefix = np.asarray(features, dtype=np.float32)[None]
        cond = np.concatenate([prefix, text], axis=1)
        if not guided:
            return cond
        uncond_text = np.where((ids < START_SPEECH_TOKEN)[..., None], 0.0, text)
        return np.concatenate([cond, np.concatenate([prefix, uncond_text], axis=1)], axis=0)

"""The "codec-lm" family (`bundle.json` with "family": "codec-lm"): a text + audio-code LM over
K codebooks in a delay pattern, an encoder giving prompt codes and a speaker embedding, and a
causal codes -> waveform vocoder. The project's random-weight bundle for tests and benchmarks
(built by export/build_codec_lm.py, not shipped) is one; docs/ARCHITECTURE.md pins its graph
I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
from onnx_tts.errors import AudioError, InputError, ModelError
from onnx_tts.families.base import (
    Detection,
    Family,
    LoadSettings,
    Option,
    TextFrontend,
    Vocoder,
    VocoderCapabilities,
    Voices,
)
from onnx_tts.families.bundled import BundledModel, bundle_encoder, bundle_files
from onnx_tts.families.loader import Graph, GraphSet, load_graphs
from onnx_tts.frontend import TextTokenizer, normalize_text, split_sentences
from onnx_tts.graph_io import check_graph_io
from onnx_tts.session import Session
from onnx_tts.vocoder import decode_in_batches

FAMILY = "codec-lm"
SECTIONS = ("graphs", "kv", "codec", "text", "sampling", "streaming", "vocoder")
GRAPH_ROLES = ("encoder", "embed", "vocoder")
LM_GRAPHS = ("lm", "lm_concat")  # the GQA graph, and the same weights with a Concat cache


class CodecVocoder(Vocoder):
    """Runs a `codes` [B, F, K] -> `waveform` [B, F * hop] graph; it does not depend on the
    voice, so several streams' windows batch exactly (`decode_windows`)."""

    def __init__(
        self,
        session: Session,
        hop_length: int,
        codebooks: int,
        codebook_size: int,
        sample_rate: int,
        lookahead_frames: int | None = None,
    ):
        self.session = session
        self.hop_length = hop_length
        self.codebooks = codebooks
        self.codebook_size = codebook_size
        # None = unknown. Only a vocoder known to be causal (0) may have windows right-padded
        # into one batch: padding after a window cannot change a causal vocoder's output.
        self.lookahead_frames = lookahead_frames
        self.capabilities = VocoderCapabilities(sample_rate, hop_length, batches_exactly=True)

    def vocode(self, frames: np.ndarray, voice: Mapping[str, np.ndarray]) -> np.ndarray:
        return self.decode(frames)

    def vocode_windows(
        self, windows: Sequence[np.ndarray], voices: Sequence[Mapping[str, np.ndarray]]
    ) -> list[np.ndarray]:
        return self.decode_windows(windows)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """[F, K] -> [F * hop] or [B, F, K] -> [B, F * hop] float32 samples."""
        codes = np.asarray(codes, dtype=np.int64)
        single = codes.ndim == 2
        batch = codes[None] if single else codes
        if batch.ndim != 3 or batch.shape[2] != self.codebooks:
            raise InputError(
                f"vocoder codes must be [frames, {self.codebooks}] or [batch, frames, "
                f"{self.codebooks}], got shape {codes.shape}"
            )
        if batch.shape[1] == 0:
            empty = np.zeros((batch.shape[0], 0), np.float32)
            return empty[0] if single else empty
        if batch.min() < 0 or batch.max() >= self.codebook_size:
            raise InputError(
                f"vocoder codes must be in [0, {self.codebook_size}); special tokens "
                "(pad/bos/eos) must not reach the vocoder"
            )
        waveform = self.session.run({"codes": batch}, ["waveform"])["waveform"]
        return waveform[0] if single else waveform

    def decode_windows(self, windows: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Decode several [F_i, K] code windows (e.g. one per stream) in as few calls as shapes
        allow: windows of equal length share one batched call; a causal vocoder
        (`lookahead_frames == 0`) also right-pads shorter windows into the same call.
        Returns one [F_i * hop] waveform per window, in order."""
        arrays = [np.asarray(window, dtype=np.int64) for window in windows]
        for index, codes in enumerate(arrays):
            if codes.ndim != 2 or codes.shape[1] != self.codebooks:
                raise InputError(
                    f"window {index}: codes must be [frames, {self.codebooks}], got shape "
                    f"{codes.shape}"
                )
        return decode_in_batches(
            arrays, self.decode, self.hop_length, pad_shorter=self.lookahead_frames == 0
        )


class DelayPattern:
    """The delay pattern of up to `rows` sequences: codebook k lags k frames, so step t holds
    frame t - k for codebook k (pad before the first frame and after the last). One sampled
    row per sequence and step goes in; complete frames come out in order, never a partial one.
    """

    def __init__(self, rows: int, codebooks: int, pad_id: int, eos_id: int) -> None:
        self.codebooks, self.pad_id, self.eos_id = codebooks, pad_id, eos_id
        self.step = np.zeros(rows, np.int64)  # the step whose row is sampled next
        self.end = np.full(rows, -1, np.int64)  # frame count, known once codebook 0 sends EOS
        self.history = np.zeros((rows, codebooks, codebooks), np.int64)  # last K rows, by t % K

    def reset(self, row: int) -> None:
        self.step[row], self.end[row] = 0, -1

    def forced(self, rows: np.ndarray) -> np.ndarray:
        """[len(rows), K]: the token each codebook must hold at its current step, -1 where it
        is sampled."""
        frame = self.step[rows, None] - np.arange(self.codebooks)[None, :]
        end = self.end[rows, None]
        ended = (end >= 0) & (frame >= end)
        eos = ended & (frame == end) & (np.arange(self.codebooks) == 0)[None, :]
        out = np.full(frame.shape, -1, np.int64)
        out[(frame < 0) | ended] = self.pad_id
        out[eos] = self.eos_id
        return out

    def push(self, rows: np.ndarray, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Record one row of codes [len(rows), K] per sequence. Returns (frames [len(rows), K],
        completed [len(rows)] bool): the frame each sequence completed at this step, if any."""
        k = self.codebooks
        step = self.step[rows]
        stopping = (codes[:, 0] == self.eos_id) & (self.end[rows] < 0)
        self.end[rows] = np.where(stopping, step, self.end[rows])
        self.history[rows, step % k] = codes
        frame = step - (k - 1)
        end = self.end[rows]
        completed = (frame >= 0) & ((end < 0) | (frame < end))
        # Frame f is codebook j of step f + j, for every j.
        slots = (frame[:, None] + np.arange(k)[None, :]) % k
        frames = self.history[rows[:, None], slots, np.arange(k)[None, :]]
        self.step[rows] = step + 1
        return frames, completed

    def finished(self, rows: np.ndarray) -> np.ndarray:
        # The last real frame (end - 1) reaches codebook K-1 at step end + K - 2.
        end = self.end[rows]
        return (end >= 0) & (self.step[rows] >= end + self.codebooks - 1)


@dataclass
class _CodecState:
    pattern: DelayPattern
    sampler: RowSampler
    seen: np.ndarray  # [rows, K, V] tokens each codebook produced (repetition penalty)
    speaker: np.ndarray  # [rows, E]
    min_frames: np.ndarray
    max_frames: np.ndarray


class CodecLMProgram(DecodeProgram):
    """Prefill [speaker][prompt frames][text][BOS frame]; each step samples one row of K codes
    (delay pattern: forced pads, EOS on codebook 0 ends the sequence), penalises repeats per
    codebook, and feeds the row back through the embed graph."""

    def __init__(self, model: CodecLMModel, lm: Session, embed: Session) -> None:
        self.model, self.lm, self.embed = model, lm, embed
        self.codebooks, self.codebook_size = model.codebooks, model.codebook_size
        self.pad_id, self.bos_id, self.eos_id = model.pad_id, model.bos_id, model.eos_id
        self.vocab = self.codebook_size + 3

    def new_state(self, rows: int) -> _CodecState:
        return _CodecState(
            pattern=DelayPattern(rows, self.codebooks, self.pad_id, self.eos_id),
            sampler=RowSampler(rows),
            seen=np.zeros((rows, self.codebooks, self.vocab), bool),
            speaker=np.zeros((rows, self.model.speaker_dim), np.float32),
            min_frames=np.zeros(rows, np.int64),
            max_frames=np.zeros(rows, np.int64),
        )

    def _embed(
        self, text_ids: np.ndarray, audio_codes: np.ndarray, speaker: np.ndarray
    ) -> dict[str, np.ndarray]:
        return self.embed.run(
            {
                "text_ids": text_ids.astype(np.int64),
                "audio_codes": audio_codes.astype(np.int64),
                "speaker_embedding": speaker.astype(np.float32),
            }
        )

    def admit(self, state: _CodecState, row: int, request: Request) -> Admission:
        text_ids = list(request.chunk.ids)
        voice = self.model.prompt(request.voice)
        codes = voice["codes"]
        bos = np.full((1, self.codebooks), self.bos_id, dtype=np.int64)
        speaker = voice["speaker_embedding"].reshape(1, -1)
        parts = self._embed(
            np.asarray(text_ids, np.int64).reshape(1, -1),
            np.concatenate([codes, bos])[None],
            speaker,
        )
        audio = parts["audio_embeds"]
        embeds = np.concatenate(
            [parts["speaker_embeds"], audio[:, :-1], parts["text_embeds"], audio[:, -1:]], axis=1
        )
        min_frames, max_frames = self.model.frame_limits(len(text_ids))
        state.pattern.reset(row)
        state.sampler.assign(row, request.sampling)
        state.seen[row] = False
        state.speaker[row] = speaker[0]
        state.min_frames[row], state.max_frames[row] = min_frames, max_frames
        # Speaker embedding and reference codes depend only on the voice: a reusable prefix.
        prefix = parts["speaker_embeds"].shape[1] + audio.shape[1] - 1
        return Admission(embeds, embeds.shape[1] + max_frames + self.codebooks + 1, prefix)

    def step_inputs(self, state: _CodecState, rows: np.ndarray) -> np.ndarray:
        last = state.pattern.history[rows, (state.pattern.step[rows] - 1) % self.codebooks]
        empty = np.zeros((len(rows), 0), np.int64)
        return self._embed(empty, last[:, None, :], state.speaker[rows])["audio_embeds"]

    def consume(self, state: _CodecState, rows: np.ndarray, logits: np.ndarray) -> StepOutput:
        """Sample all K codebooks of each row at once, then apply the delay pattern's forcing."""
        pattern, eos = state.pattern, self.eos_id
        scores = logits.astype(np.float32, copy=True)  # [n, K, V]
        scores[:, :, self.codebook_size :] = -np.inf  # specials are structural, never sampled
        frame0 = pattern.step[rows]  # the frame codebook 0 would produce in this row
        may_end = frame0 >= state.min_frames[rows]
        scores[may_end, 0, eos] = logits[may_end, 0, eos]
        scores = state.sampler.penalize(rows, scores, state.seen[rows][:, :, : scores.shape[2]])
        codes = state.sampler.sample(rows, scores).astype(np.int64)  # [n, K]
        forced = pattern.forced(rows)
        sampled = forced < 0
        must_end = sampled[:, 0] & (frame0 >= state.max_frames[rows])
        codes[must_end, 0] = eos
        codes = np.where(sampled, codes, forced)
        which, codebook = np.nonzero(sampled)
        state.seen[rows[which], codebook, codes[which, codebook]] = True
        frames, completed = pattern.push(rows, codes)
        return StepOutput(
            frames=[frames[i : i + 1] if completed[i] else frames[i:i] for i in range(len(rows))],
            done=pattern.finished(rows),
        )


@dataclass(frozen=True)
class TokenChunk:
    """A piece of text as the LM reads it: its token ids and the text they spell."""

    ids: tuple[int, ...]
    text: str


class CodecLMText(TextFrontend):
    """Normalised English split at sentences, tokenized, each chunk small enough for the KV
    capacity a request may use."""

    def __init__(self, model: CodecLMModel, tokenizer: TextTokenizer, max_chunk_chars: int):
        self.model, self.tokenizer, self.max_chunk_chars = model, tokenizer, max_chunk_chars

    def chunks(self, text: str, options: Mapping[str, Any]) -> list[TokenChunk]:
        normalized = normalize_text(text)
        chunks = [
            chunk
            for sentence in split_sentences(normalized, self.max_chunk_chars)
            for chunk in self._fitted(sentence)
        ]
        chunks = [c for c in chunks if c.ids]
        if not chunks:
            raise InputError("text has nothing speakable after normalisation")
        return chunks

    def describe(self, chunk: Any) -> str:
        return chunk.text if isinstance(chunk, TokenChunk) else ""

    def _fitted(self, text: str) -> list[TokenChunk]:
        """Token chunks of `text`, each small enough for the KV capacity: a chunk that is too
        long is split again at commas or spaces, and a single word that is still too long
        (e.g. 2,000 letters) at token boundaries, so a valid text is never refused."""
        tokens = self.tokenizer.encode(text)
        budget = self.model.max_chunk_tokens
        if len(tokens) <= budget:
            return [TokenChunk(tuple(tokens), text)]
        pieces = split_sentences(text, max(1, len(text) * budget // len(tokens)))
        if len(pieces) > 1:
            return [chunk for piece in pieces for chunk in self._fitted(piece)]
        parts = [tokens[start : start + budget] for start in range(0, len(tokens), budget)]
        # One word cut at token boundaries: each part stands for its share of the letters.
        step = max(1, -(-len(text) // len(parts)))
        return [
            TokenChunk(tuple(part), text[i * step : (i + 1) * step]) for i, part in enumerate(parts)
        ]


class CodecLMModel(BundledModel):
    """A "codec-lm" bundle (see docs/ARCHITECTURE.md) as the family contract's parts."""

    def __init__(self, bundle: Bundle, settings: LoadSettings, lm_graph: str = "lm") -> None:
        if lm_graph not in LM_GRAPHS:
            raise InputError(f"lm_graph must be one of {', '.join(LM_GRAPHS)}, got {lm_graph!r}")
        self.bundle = bundle
        self.codebooks = bundle.value("codec", "codebooks", int, 1, 64)
        self.codebook_size = bundle.value("codec", "codebook_size", int, 2, 1 << 20)
        self.pad_id = bundle.value("codec", "pad_id", int, 0, 1 << 21)
        self.bos_id = bundle.value("codec", "bos_id", int, 0, 1 << 21)
        self.eos_id = bundle.value("codec", "eos_id", int, 0, 1 << 21)
        hop_length = bundle.value("codec", "hop_length", int, 1, 1 << 16)
        self.sampling = dict(bundle.section("sampling"))
        self.prompt_frames = bundle.value("encoder", "prompt_frames", int, 0, 1 << 16, 150)
        max_chars = bundle.value("text", "max_tokens_per_chunk", int, 1, 1 << 16, 200)

        capacity = bundle.kv_capacity(2048)
        limit = bundle.value("lm", "max_positions", int, 1, 1 << 22, capacity)
        stages = {"encoder": "encoder", "vocoder": "vocoder"}  # the rest runs every step
        graphs = load_graphs(
            GraphSet(
                {
                    role: Graph(bundle.graph_path(role), stages.get(role, "decode"))
                    for role in (*GRAPH_ROLES, lm_graph)
                },
                lm=lm_graph,
                capacity=CapacityPolicy(capacity, limit),
                default_kv=bundle.value("kv", "default_mode", str, default=None),
            ),
            settings,
        )
        self._validate(graphs, lm_graph)
        self.speaker_dim = int(graphs["embed"].input("speaker_embedding").shape[-1])  # type: ignore[union-attr]
        encoder = bundle_encoder(bundle, graphs["encoder"], hop_length)
        vocoder = CodecVocoder(
            graphs["vocoder"],
            hop_length,
            self.codebooks,
            self.codebook_size,
            bundle.sample_rate,
            lookahead_frames=bundle.value("vocoder", "lookahead_frames", int, 0, 1 << 10, 0),
        )
        super().__init__(
            family=FAMILY,
            text=CodecLMText(self, TextTokenizer(bundle.path("text", "tokenizer")), max_chars),
            voices=Voices(encoder, self._empty_voice),
            program=CodecLMProgram(self, graphs.lm, graphs["embed"]),
            vocoder=vocoder,
            graphs=graphs,
            streaming_defaults=dict(bundle.section("streaming")),
        )
        # Positions one request may use: the in-place buffer's fixed size, and always the
        # model's position limit.
        positions = min(capacity, limit) if self.kv_mode == "inplace" else limit
        self.max_chunk_tokens = self._tokens_that_fit(positions)
        if self.max_chunk_tokens < 1:
            raise ModelError(
                f"{bundle.root}: kv.capacity / lm.max_positions {positions} cannot hold one text "
                f"token after a {self.prompt_frames}-frame voice prompt and its audio frames "
                f"(needs at least {self._positions_needed(1)}); raise kv.capacity"
            )

    def _validate(self, graphs: Any, lm_graph: str) -> None:
        bundle = self.bundle
        k, vocab = self.codebooks, self.codebook_size + 3
        hidden = bundle.value("lm", "hidden_size", int, 1, 1 << 16)
        check_graph_io(
            graphs["encoder"].spec,
            "encoder",
            {"audio": ("float32", (None, None))},
            {"codes": ("int64", (None, None, k)), "speaker_embedding": ("float32", (None, None))},
        )
        check_graph_io(
            graphs["embed"].spec,
            "embed",
            {
                "text_ids": ("int64", (None, None)),
                "audio_codes": ("int64", (None, None, k)),
                "speaker_embedding": ("float32", (None, None)),
            },
            {
                "text_embeds": ("float32", (None, None, hidden)),
                "audio_embeds": ("float32", (None, None, hidden)),
                "speaker_embeds": ("float32", (None, 1, hidden)),
            },
        )
        lm_inputs: dict[str, tuple[str, Any]] = {"inputs_embeds": ("float32", (None, None, hidden))}
        lm_outputs: dict[str, tuple[str, Any]] = {"logits": ("float32", (None, None, k, vocab))}
        past_specs, present_specs = bundle.kv_specs()
        lm_inputs.update(past_specs)
        lm_outputs.update(present_specs)
        check_graph_io(graphs[lm_graph].spec, lm_graph, lm_inputs, lm_outputs)
        check_graph_io(
            graphs["vocoder"].spec,
            "vocoder",
            {"codes": ("int64", (None, None, k))},
            {"waveform": ("float32", (None, None))},
        )
        extra = (
            set(graphs[lm_graph].input_names)
            - set(lm_inputs)
            - {"seqlens_k", "total_sequence_length", "attention_mask", "position_ids"}
        )
        if extra:
            raise ModelError(f"{lm_graph} graph has inputs onnx-tts cannot fill: {sorted(extra)}")

    # -- the family's own ----------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "name": self.bundle.name,
            "path": str(self.bundle.root),
            "sample_rate": self.sample_rate,
            "kv_mode": self.kv_mode,
            "kv": self.bundle.manifest["kv"],
            "codec": self.bundle.manifest["codec"],
            "streaming": self.streaming_defaults,
            "graphs": self.graphs.describe(),
        }

    def _empty_voice(self) -> dict[str, np.ndarray]:
        """No reference: an empty prompt and a zero speaker embedding."""
        return {
            "codes": np.zeros((0, self.codebooks), np.int64),
            "speaker_embedding": np.zeros(self.speaker_dim, np.float32),
        }

    def sampling_defaults(self) -> SamplingOptions:
        defaults = {
            key: self.sampling[key]
            for key in ("temperature", "top_k", "top_p", "repetition_penalty")
            if key in self.sampling
        }
        return SamplingOptions(**defaults).checked()

    def _positions_needed(self, tokens: int) -> int:
        """KV positions of a chunk of `tokens` text tokens with the longest voice prompt:
        speaker + prompt + text + BOS (CodecLMProgram.admit), then its frames and the delay
        pattern's tail."""
        return (
            1 + self.prompt_frames + tokens + 1 + self.frame_limits(tokens)[1] + self.codebooks + 1
        )

    def _tokens_that_fit(self, positions: int) -> int:
        tokens = max(0, positions // (2 + int(self.sampling.get("max_frames_per_token", 12))))
        while tokens < positions and self._positions_needed(tokens + 1) <= positions:
            tokens += 1
        while tokens > 0 and self._positions_needed(tokens) > positions:
            tokens -= 1
        return tokens

    def frame_limits(self, tokens: int) -> tuple[int, int]:
        """(min, max) frames for a chunk of `tokens` text tokens."""
        per_token_max = float(self.sampling.get("max_frames_per_token", 12))
        per_token_min = float(self.sampling.get("min_frames_per_token", 3))
        return int(per_token_min * tokens), max(int(per_token_max * tokens), 8)

    def prompt(self, voice: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        codes = np.asarray(voice["codes"])
        speaker = np.asarray(voice["speaker_embedding"], np.float32).reshape(-1)
        if codes.size % self.codebooks or (
            codes.size and not (codes.min() >= 0 and codes.max() < self.codebook_size)
        ):
            raise AudioError(
                f"voice codes must be [frames, {self.codebooks}] in [0, {self.codebook_size}); "
                "pass the dict Engine.voice() returned for this model"
            )
        if speaker.shape != (self.speaker_dim,):
            raise AudioError(
                f"voice speaker_embedding must have {self.speaker_dim} values, got {speaker.size}"
            )
        codes = codes.astype(np.int64).reshape(-1, self.codebooks)[: self.prompt_frames]
        return {"codes": codes, "speaker_embedding": speaker}


def load(detection: Detection, settings: LoadSettings, options: Mapping[str, Any]) -> CodecLMModel:
    return CodecLMModel(detection.inspected, settings, **options)


REGISTRY_ENTRY = Family(
    name=FAMILY,
    summary="codec LM over K codebooks in a delay pattern (the project's random-weight bundle)",
    loader=load,
    options=(
        Option(
            "lm_graph",
            str,
            "which LM graph of the bundle runs: lm (GroupQueryAttention) or lm_concat (the same "
            "weights with a Concat-grown cache)",
            choices=LM_GRAPHS,
        ),
    ),
    manifest_sections=SECTIONS,
    files=bundle_files,
)

"""MOSS-TTS (Local v1.5, Local v1, Delay) as the family contract's parts: the exported
backbone stepping every request's row in one run (its KV kept by the engine's scheduler), the
release's per-frame part, host embedding tables, the published prompt and sampling, and the
MOSS audio tokenizer as reference encoder and streaming vocoder (`codec/`, when exported with
one: without it the model makes code frames only, `Engine.generate`).

Continuation (options `continuation` + `reference_text`): the reference voice's codes are the
start of the speech. The prompt speaks `reference_text + chunk` with the codes as assistant
rows (text.py); the vocoder decodes the new frames after those codes (a stream primed with
them, as the published codec worker; one-shot, decoded as one sequence and the codes' samples
cut, as the published `decode`), so the audio is only the new speech. Delay's prompt ends
inside its delay pattern: its first frames complete the reference's last ones and are decoded
after the rest of the reference, their audio cut as the published `decode` cuts it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from onnx_tts.decoding import CapacityPolicy, SamplingOptions
from onnx_tts.decoding.request import Request
from onnx_tts.errors import AudioError, InputError, ModelError
from onnx_tts.families.base import (
    LoadSettings,
    StreamDecoder,
    Vocoder,
    VocoderCapabilities,
    Voices,
)
from onnx_tts.families.bundled import BundledModel
from onnx_tts.families.loader import Graph, GraphSet, load_graphs
from onnx_tts.families.moss_tts.delay import STOPS, DelayStep
from onnx_tts.families.moss_tts.layout import FAMILY, MossLayout
from onnx_tts.families.moss_tts.local import LocalV1, LocalV15
from onnx_tts.families.moss_tts.program import MossProgram, MossRequest
from onnx_tts.families.moss_tts.reference import ReferenceEncoder, codec_parts
from onnx_tts.families.moss_tts.sampling import NAMES, MossSampling
from onnx_tts.families.moss_tts.tables import InputTables
from onnx_tts.families.moss_tts.text import (
    DEFAULT_CHUNK_CHARS,
    FIELDS,
    MossText,
    continuation_options,
)
from onnx_tts.frontend import TextTokenizer

CODES = "codes"
MAX_VOICE_FRAMES = 1 << 14


class MossVoices(Voices):
    """No builtin voices: the default speaks without a reference; a reference file is read at
    the codec's rate and channels, loudness-normalized and encoded (reference.py)."""

    def __init__(self, encoder: ReferenceEncoder, layout: MossLayout) -> None:
        super().__init__(encoder, dict, channels=layout.channels)
        self.layout = layout

    def check_encoded(self, voice: Mapping[str, Any]) -> dict[str, np.ndarray]:
        if not voice:
            return {}
        return {CODES: checked_codes(voice.get(CODES), self.layout)}


def checked_codes(codes: Any, layout: MossLayout) -> np.ndarray:
    """Reference codes [frames, n_vq] int64 in the codebook, or AudioError."""
    try:
        array = np.asarray(codes)
    except (TypeError, ValueError):
        array = np.zeros(0)
    if (
        array.dtype.kind not in "iu"
        or array.ndim != 2
        or array.shape[1] != layout.n_vq
        or not 0 < array.shape[0] <= MAX_VOICE_FRAMES
        or array.min() < 0
        or array.max() >= layout.codebook
    ):
        raise AudioError(
            f"{CODES} must be integer codes [frames, {layout.n_vq}] in [0, {layout.codebook})"
        )
    return array.astype(np.int64)


class MossVocoder(Vocoder):
    """The codec's decoder: one-shot, and a stateful streaming decoder per stream."""

    def __init__(self, layout: MossLayout, codec: Any | None) -> None:
        self.layout, self.codec = layout, codec
        self.capabilities = VocoderCapabilities(
            layout.sample_rate,
            layout.hop_length,
            channels=layout.channels,
            stateful_streams=codec is not None,
        )

    def _require(self) -> Any:
        if self.codec is None:
            raise ModelError(
                f"{self.layout.root} was exported without a codec: it makes code frames only "
                "(Engine.generate); re-export with --codec CODEC_DIR for audio"
            )
        return self.codec

    def _shaped(self, samples: np.ndarray) -> np.ndarray:
        samples = np.asarray(samples, np.float32)
        return samples[:, 0] if self.layout.channels == 1 and samples.ndim == 2 else samples

    def vocode(self, frames: np.ndarray, voice: Mapping[str, np.ndarray]) -> np.ndarray:
        codes = np.asarray(frames, np.int64).reshape(-1, self.layout.n_vq)
        return self._shaped(self._require().decode(codes))

    def open_stream(self) -> StreamDecoder:
        return _Stream(self._require().open_stream(), self._shaped, self.layout.n_vq)

    # Continuation: the reference's codes are the start of the speech (module docstring).
    def prime_frames(
        self, voice: Mapping[str, Any], options: Mapping[str, Any]
    ) -> np.ndarray | None:
        return continued_codes(voice, options, self.layout)

    def _completed(self, prime: np.ndarray) -> int:
        """How many of the prime's last frames come back as the chunk's first, completed by
        the model: Delay's last n_vq - 1 (its prompt ends inside the delay pattern), else 0."""
        return min(len(prime), self.layout.n_vq - 1) if self.layout.variant == "delay" else 0

    def _decoded_prime(self, prime: np.ndarray) -> np.ndarray:
        """The prime's frames decoded before the chunk's: all but the completed ones."""
        codes = np.asarray(prime, np.int64).reshape(-1, self.layout.n_vq)
        return codes[: len(codes) - self._completed(codes)]

    def unheard_frames(self, prime: np.ndarray) -> int:
        """Delay: the frames completing the reference's, and one more (the published decode's
        cut counts the audio_start row)."""
        completed = self._completed(prime)
        return completed + 1 if completed else 0

    def open_primed_stream(self, prime: np.ndarray) -> StreamDecoder:
        before = self._decoded_prime(prime)
        stream = self._require().open_stream(before if len(before) else None)
        return _Stream(stream, self._shaped, self.layout.n_vq)

    def vocode_after(
        self, prime: np.ndarray, frames: np.ndarray, voice: Mapping[str, np.ndarray]
    ) -> np.ndarray:
        """As the published non-streaming path: the prompt's codes and the new frames decoded
        as one sequence, the prompt's samples cut off."""
        codes = np.asarray(frames, np.int64).reshape(-1, self.layout.n_vq)
        if not len(codes):
            return self._shaped(np.zeros((0, self.layout.channels), np.float32))
        before = self._decoded_prime(prime)
        whole = self.vocode(np.concatenate([before, codes]), voice)
        return whole[len(before) * self.layout.hop_length :]


def continued_codes(
    voice: Mapping[str, Any], options: Mapping[str, Any], layout: MossLayout
) -> np.ndarray | None:
    """The reference codes a continuation request's speech starts from (None when the request
    does not continue), or InputError when it has no reference to continue."""
    if not options.get("continuation"):
        return None
    codes = voice.get(CODES) if voice else None
    if codes is None:
        raise InputError(
            "continuation continues a reference: give one as the voice (voice=AUDIO file, "
            "--voice FILE); its transcript goes in reference_text"
        )
    return checked_codes(codes, layout)


class _Stream:
    def __init__(self, stream: Any, shaped, n_vq: int) -> None:
        self.stream, self.shaped, self.n_vq = stream, shaped, n_vq

    def push(self, frames: np.ndarray) -> np.ndarray:
        return self.shaped(self.stream.push(np.asarray(frames, np.int64).reshape(-1, self.n_vq)))

    def close(self) -> None:
        self.stream.close()


class MossTTS(BundledModel):
    """A moss-tts model directory (module docstring)."""

    sampling_keys = ()  # it samples with the published options (text_* / audio_*)

    def __init__(self, layout: MossLayout, settings: LoadSettings, **options: Any) -> None:
        self.layout = layout
        self.bundle = layout.bundle
        c = layout
        declared = {"backbone": Graph(c.graph("backbone"), "decode")}
        for role in c.roles:
            if role.startswith(("local", "head")):
                declared[role] = Graph(c.graph(role), "decode")
        codec_graphs, make_codec = codec_parts(c)
        declared.update(codec_graphs)
        graphs = load_graphs(
            GraphSet(declared, lm="backbone", capacity=CapacityPolicy(None, c.max_positions)),
            settings,
        )
        local_mode = "copy" if graphs.kv_mode == "copy" else "chain"
        tables = InputTables(c.graph("embed"), c.root, c.variant, c.hidden, c.audio_pad)
        if c.variant == "local-v1.5":
            part: Any = LocalV15(c, graphs.sessions["local"], tables, local_mode)
        elif c.variant == "local-v1":
            heads = [graphs.sessions[f"head_{k:02d}"] for k in range(c.row_width)]
            part = LocalV1(c, graphs.sessions["local"], heads, tables, local_mode)
        else:
            part = DelayStep(c, graphs.sessions["heads_text"], graphs.sessions["heads_audio"])
        codec = make_codec(graphs)
        text = MossText(c, TextTokenizer(self.bundle.path("text", "tokenizer")))
        super().__init__(
            family=FAMILY,
            text=text,
            voices=MossVoices(ReferenceEncoder(c, codec), c),
            program=MossProgram(c, graphs.lm, tables, part, self._program_request),
            vocoder=MossVocoder(c, codec),
            graphs=graphs,
            streaming_defaults={
                "first_chunk_frames": 1,
                "stride_frames": 4,
                "overlap_frames": 0,
                "holdback_frames": 0,
                "crossfade_samples": 0,
            },
        )
        self.base_sampling = MossSampling.from_defaults(c.sampling).checked()
        self.load_options = self._checked(options)

    # -- options --------------------------------------------------------------------------
    def _checked(self, options: Mapping[str, Any]) -> dict[str, Any]:
        from onnx_tts.families.moss_tts import REGISTRY_ENTRY

        return REGISTRY_ENTRY.check_options(options, "request")

    def request_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        if isinstance(options.get("sampling"), MossSampling):
            return dict(options)
        c = self.layout
        given = {**self.load_options, **self._checked(options)}
        sampling = self.base_sampling.with_overrides(
            {k: v for k, v in given.items() if k in ("greedy", *NAMES)}
        )
        used = int(given.get("n_vq_for_inference", c.n_vq))
        if used != c.n_vq and c.variant != "local-v1":
            raise InputError(
                f"n_vq_for_inference is Local v1's; this {c.variant} model generates all "
                f"{c.n_vq} codebooks"
            )
        if used > c.n_vq:
            raise InputError(f"n_vq_for_inference must be in [1, {c.n_vq}], got {used}")
        stop_at = given.get("stop_at", "im_end")
        if stop_at != "im_end" and c.variant != "delay":
            raise InputError("stop_at is Delay's (its text channel runs on after the audio)")
        continuation = continuation_options(given, c)
        return {
            **continuation,
            "sampling": sampling,
            "max_new_frames": int(given.get("max_new_frames", c.sampling["max_new_frames"])),
            "n_vq_for_inference": used,
            "stop_at": stop_at,
            "max_chunk_chars": int(given.get("max_chunk_chars", DEFAULT_CHUNK_CHARS)),
            "fields": {k: given[k] for k in FIELDS if k in given},
        }

    def sampling_defaults(self) -> SamplingOptions:
        s = self.base_sampling
        return SamplingOptions(
            temperature=0.0 if s.greedy else s.audio_temperature,
            top_k=s.audio_top_k,
            top_p=s.audio_top_p if s.audio_top_p > 0 else 1.0,
            repetition_penalty=s.audio_repetition_penalty,
        )

    # -- generation -----------------------------------------------------------------------
    def _program_request(self, request: Request) -> MossRequest:
        options = request.options
        if "sampling" not in options:
            options = self.request_options(options)
        sampling: MossSampling = options["sampling"]
        voice = self.voices.check_encoded(request.voice)
        text: MossText = self.text  # type: ignore[assignment]
        continued = continued_codes(voice, options, self.layout)
        if continued is None:
            prompt = text.prompt(str(request.chunk), options["fields"], voice.get(CODES))
        else:  # the transcript and the chunk as one text, exactly as published (no space)
            spoken = options["reference_text"] + str(request.chunk)
            prompt = text.prompt(spoken, options["fields"], continuation=continued)
        if len(prompt.rows) + int(options["max_new_frames"]) + 1 > self.layout.max_positions:
            raise InputError(
                f"this chunk's prompt ({len(prompt.rows)} rows) and max_new_frames "
                f"{options['max_new_frames']} exceed the model's {self.layout.max_positions} "
                "positions; lower max_new_frames or shorten the reference"
            )
        generator = None
        if sampling.sampled:
            generator = request.generator or np.random.default_rng(request.sampling.seed)
        return MossRequest(
            prompt=prompt,
            sampling=sampling,
            max_new_frames=int(options["max_new_frames"]),
            used=int(options["n_vq_for_inference"]),
            stop_at=str(options["stop_at"]),
            generator=generator,
        )

    # -- description ----------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        c = self.layout
        return {
            "family": FAMILY,
            "variant": c.variant,
            "name": self.bundle.name,
            "path": str(c.root),
            "sample_rate": self.sample_rate,
            "channels": self.channels,
            "kv_mode": self.kv_mode,
            "codebooks": c.n_vq,
            "codebook_size": c.codebook,
            "codec": None if c.codec_dir is None else str(c.codec_dir),
            "sampling_defaults": vars(self.base_sampling),
            "graphs": self.graphs.describe(),
        }


__all__ = ["CODES", "STOPS", "MossTTS", "MossVocoder", "MossVoices", "checked_codes"]

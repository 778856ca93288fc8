"""MOSS-TTS-Nano as the family contract's parts: the published graphs loaded unmodified, the
published prompt, chunking and sampling, the global KV kept by the engine's scheduler and the
codec's streaming state chained in the core.

Options keep the published names and defaults (`sample_mode` greedy/fixed/full,
`max_new_frames`, `voice_clone_max_text_tokens`, `text_*` / `audio_*` sampling values), plus
`local_path` to pick the local depth transformer's graph (default: the published dispatch,
which is also the fastest path the directory offers) and `parallel_chunks`. The chunks of a
text decode one after another with one random generator for the whole text, as published;
`parallel_chunks` decodes them at once as rows, chunk i with its own generator seeded
seed + i (a different, equally valid draw).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from onnx_tts.bundle import files_identity
from onnx_tts.decoding import CapacityPolicy, SamplingOptions
from onnx_tts.decoding.request import Request
from onnx_tts.errors import AudioError, InputError
from onnx_tts.families.base import (
    ChunkOrder,
    LoadSettings,
    Model,
    StreamDecoder,
    Vocoder,
    VocoderCapabilities,
    Voices,
)
from onnx_tts.families.loader import Graph, GraphSet, load_graphs
from onnx_tts.families.moss_tts_nano.codec import (
    PROMPT_CODES,
    CodecDecoder,
    ReferenceEncoder,
    load_reference,
)
from onnx_tts.families.moss_tts_nano.layout import FAMILY, SAMPLE_MODES, MossLayout
from onnx_tts.families.moss_tts_nano.local import (
    CachedStep,
    Decoder,
    FixedFrame,
    GreedyFrame,
    LocalPath,
    dispatch,
)
from onnx_tts.families.moss_tts_nano.program import POSITION_LIMIT, MossProgram, MossRequest
from onnx_tts.families.moss_tts_nano.sampling import MossSampling
from onnx_tts.families.moss_tts_nano.text import DEFAULT_CHUNK_TOKENS, MossText, pause_seconds
from onnx_tts.session import LazySession

SAMPLING_NAMES = (
    "text_temperature",
    "text_top_p",
    "text_top_k",
    "audio_temperature",
    "audio_top_p",
    "audio_top_k",
    "audio_repetition_penalty",
)
MAX_VOICE_CODES = 1 << 22
# The graph of each local path.
LOCAL_ROLES = {
    "greedy_frame": "local_greedy_frame",
    "fixed_frame": "local_fixed_sampled_frame",
    "cached_step": "local_cached_step",
    "decoder": "local_decoder",
}


class MossVoices(Voices):
    """Builtin voices of the manifest (prompt codes by name; the first is the default), stereo
    references at the codec's rate (a mono file duplicated, as published), and an encoded voice
    checked as prompt codes."""

    def __init__(self, encoder: ReferenceEncoder, layout: MossLayout) -> None:
        builtin = {name: {PROMPT_CODES: codes} for name, codes in layout.voices.items()}
        super().__init__(encoder, self._first, builtin, channels=layout.codec.channels)
        self.layout = layout

    def _first(self) -> dict[str, np.ndarray]:
        """The manifest's first builtin voice (the published runtime's default)."""
        if not self.builtin:
            raise AudioError(
                f"{self.layout.manifest_path} has no builtin voices: pass voice=a reference file"
            )
        return dict(next(iter(self.builtin.values())))

    def read(self, path: str | os.PathLike[str]) -> np.ndarray:
        codec = self.layout.codec
        return load_reference(path, codec.sample_rate, codec.channels)

    def check_encoded(self, voice: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return {PROMPT_CODES: checked_codes(voice.get(PROMPT_CODES), self.layout)}


def checked_codes(codes: Any, layout: MossLayout) -> np.ndarray:
    """Prompt codes [frames, n_vq] as int32, or AudioError: integers in the codebook."""
    c = layout.config
    try:
        array = np.asarray(codes)
    except (TypeError, ValueError):
        array = np.zeros(0)
    if (
        array.dtype.kind not in "iu"
        or array.ndim != 2
        or array.shape[1] != c.n_vq
        or not 0 < array.size <= MAX_VOICE_CODES
        or array.min() < 0
        or array.max() >= c.codebook
    ):
        raise AudioError(
            f"{PROMPT_CODES} must be integer codes [frames, {c.n_vq}] in [0, {c.codebook})"
        )
    return array.astype(np.int32)


class MossCodec(Vocoder):
    """The audio tokenizer's decoders: one-shot (`decode_full`) and a stateful streaming
    decoder per stream (`decode_step`, its state chained in the core); the published pause
    after each chunk (0.40 s after one of at most four words, else 0.24 s)."""

    def __init__(self, codec: CodecDecoder, layout: MossLayout) -> None:
        self.codec, self.n_vq = codec, layout.config.n_vq
        self.capabilities = VocoderCapabilities(
            layout.codec.sample_rate,
            layout.codec.downsample,
            channels=layout.codec.channels,
            stateful_streams=True,
        )

    def vocode(
        self, frames: np.ndarray, voice: Mapping[str, np.ndarray] | None = None
    ) -> np.ndarray:
        """[F, n_vq] codes -> [F x downsample, channels] float32 (the voice plays no part)."""
        return self.codec.decode(np.asarray(frames).reshape(-1, self.n_vq))

    def open_stream(self) -> StreamDecoder:
        return self.codec.stream()

    def pause_seconds(self, chunk: Any) -> float:
        return pause_seconds(str(chunk))


class MossTTSNano(Model):
    """A MOSS-TTS-Nano directory (see the module docstring)."""

    sampling_keys = ()  # it samples with the published options (text_* / audio_*)

    def __init__(self, layout: MossLayout, settings: LoadSettings, **options: Any) -> None:
        self.layout = layout
        # What a request with the load options needs loads now: the global transformer, the
        # local path of the published dispatch and the codec's decoders, so the first request
        # runs as fast as the next (measured: loading them on its way cost the first one-shot
        # request ~0.6 s idle, 2.4 s of CPU under load). The other local paths and the encoder
        # (cloning only) load on first use. Each stage's graphs get its share of the cores
        # (`--threads 0`): the LM and the codec run at the same time on their own threads.
        eager = {"prefill", "decode_step", "codec_decode_full", "codec_decode_step"}
        eager.add(LOCAL_ROLES.get(self._default_path(layout, options), "local_decoder"))
        declared = {
            role: Graph(spec.path, "decode", lazy=role not in ("prefill", "decode_step"), spec=spec)
            for role, spec in layout.tts_graphs.items()
        }
        declared.update(
            {
                f"codec_{role}": Graph(
                    spec.path, "encoder" if role == "encode" else "vocoder", lazy=True, spec=spec
                )
                for role, spec in layout.codec_graphs.items()
            }
        )
        # In place when decode_step was converted (`onnx-tts convert --inplace-kv`), else chain.
        graphs = load_graphs(
            GraphSet(declared, lm="decode_step", capacity=CapacityPolicy(None, POSITION_LIMIT)),
            settings,
        )
        local_mode = "copy" if graphs.kv_mode == "copy" else "chain"
        sessions = graphs.sessions
        for role in eager:
            if isinstance(sessions.get(role), LazySession):
                sessions[role].get()
        paths: dict[str, LocalPath] = {}
        if "local_greedy_frame" in sessions:
            paths["greedy_frame"] = GreedyFrame(layout, sessions["local_greedy_frame"])
        if "local_fixed_sampled_frame" in sessions:
            paths["fixed_frame"] = FixedFrame(layout, sessions["local_fixed_sampled_frame"])
        if "local_cached_step" in sessions:
            paths["cached_step"] = CachedStep(layout, sessions["local_cached_step"], local_mode)
        paths["decoder"] = Decoder(layout, sessions["local_decoder"])
        self.codec = CodecDecoder(
            layout, sessions["codec_decode_full"], sessions["codec_decode_step"], local_mode
        )
        encoder = ReferenceEncoder(
            sessions["codec_encode"], layout, files_identity(layout.graph_files("codec_encode"))
        )
        # The codec decodes with its own state, so windows need no overlap. A decode_step of
        # 4 frames costs about what 8 cost per frame (~5% more), and halves what is left to
        # decode when the LM ends (measured: 8 streams ending together).
        super().__init__(
            family=FAMILY,
            text=MossText(layout.tokenizer_path, layout.config.vocab),
            voices=MossVoices(encoder, layout),
            program=MossProgram(layout, paths, graphs["prefill"], graphs.lm, self._program_request),
            vocoder=MossCodec(self.codec, layout),
            graphs=graphs,
            streaming_defaults={
                "first_chunk_frames": 1,
                "stride_frames": 4,
                "overlap_frames": 0,
                "holdback_frames": 0,
                "crossfade_samples": 0,
            },
        )
        self.base_sampling = MossSampling.from_defaults(layout.defaults).checked()
        self.load_options = self._checked(options)

    @staticmethod
    def _default_path(layout: MossLayout, options: Mapping[str, Any]) -> str:
        """The local path a request with the (unchecked) load options takes by default."""
        requested = options.get("local_path")
        if requested not in (None, "auto"):
            return str(requested)
        present = [path for path, role in LOCAL_ROLES.items() if role in layout.tts_graphs]
        return dispatch(present, str(options.get("sample_mode") or layout.defaults.sample_mode))

    # -- options --------------------------------------------------------------------------
    def _checked(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The given (non-None) options, each checked against the family's option table
        (InputError naming a bad or unknown one)."""
        from onnx_tts.families.moss_tts_nano import REGISTRY_ENTRY

        return REGISTRY_ENTRY.check_options(options, "request")

    def request_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """Per-request options over the load-time ones, checked; every key filled in (options
        this method returned come back unchanged)."""
        if isinstance(options.get("sampling"), MossSampling):
            return dict(options)
        given = {**self.load_options, **self._checked(options)}
        sampling = self.base_sampling.with_overrides(
            {k: v for k, v in given.items() if k in ("sample_mode", *SAMPLING_NAMES)}
        )
        path = self._local_path(sampling, given.get("local_path", "auto"), given)
        return {
            "sampling": sampling,
            "local_path": path,
            "max_new_frames": given.get("max_new_frames", self.layout.defaults.max_new_frames),
            "voice_clone_max_text_tokens": given.get(
                "voice_clone_max_text_tokens", DEFAULT_CHUNK_TOKENS
            ),
            "parallel_chunks": bool(given.get("parallel_chunks", False)),
        }

    def chunk_order(self, options: Mapping[str, Any]) -> ChunkOrder:
        """One generator through the chunks in order (as published), unless the request asks
        for parallel chunks."""
        return "parallel" if options.get("parallel_chunks") else "sequential"

    def _local_path(self, sampling: MossSampling, requested: str, given: Mapping) -> str:
        available = list(self.program.paths)  # type: ignore[attr-defined]
        mode = sampling.sample_mode
        if requested == "auto":
            path = dispatch(available, mode)
        else:
            if requested not in available:
                raise InputError(
                    f"local_path {requested!r} needs a graph this model directory lacks; "
                    f"available: {', '.join(available)}"
                )
            if requested == "fixed_frame" and mode != "fixed":
                raise InputError("local_path 'fixed_frame' samples in the graph: sample_mode fixed")
            if requested == "greedy_frame" and mode != "greedy":
                raise InputError("local_path 'greedy_frame' is greedy: sample_mode greedy")
            path = requested
        if path == "fixed_frame":
            constants = self.layout.fixed_frame_constants
            for name in SAMPLING_NAMES:
                if name in given and name in constants and given[name] != constants[name]:
                    raise InputError(
                        f"the fixed sampled frame graph bakes {name}={constants[name]:g}; "
                        f"use sample_mode full to sample with {name}={given[name]!r}"
                    )
        return path

    def sampling_defaults(self) -> SamplingOptions:
        s = self.base_sampling
        return SamplingOptions(
            temperature=s.audio_temperature if s.do_sample else 0.0,
            top_k=s.audio_top_k,
            top_p=s.audio_top_p if s.audio_top_p > 0 else 1.0,
            repetition_penalty=s.audio_repetition_penalty,
        )

    # -- generation -----------------------------------------------------------------------
    def _program_request(self, request: Request) -> MossRequest:
        """A scheduler request (its chunk is text) as the program takes it. Its draws come
        from the text's one generator (sequential chunks, as published) or, for parallel
        chunks, from a generator of its own seeded with the chunk's seed (seed + index)."""
        options = request.options
        if "sampling" not in options:
            options = self.request_options(options)
        sampling = options["sampling"]
        generator = None
        if sampling.do_sample:
            generator = request.generator or np.random.default_rng(request.sampling.seed)
        return MossRequest(
            text_ids=tuple(self.text.encode(str(request.chunk))),  # type: ignore[attr-defined]
            prompt_codes=checked_codes(request.voice.get(PROMPT_CODES), self.layout),
            sampling=sampling,
            max_new_frames=int(options["max_new_frames"]),
            path=options["local_path"],
            generator=generator,
        )

    # -- description ----------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        layout, c = self.layout, self.layout.config
        paths: Sequence[str] = list(self.program.paths)  # type: ignore[attr-defined]
        return {
            "name": layout.tts_dir.name,
            "family": FAMILY,
            "path": str(layout.root),
            "sample_rate": self.sample_rate,
            "channels": self.channels,
            "frame_rate": layout.codec.frame_rate,
            "kv_mode": self.kv_mode,
            "kv": {
                "layers": self.kv.layers,
                "kv_heads": self.kv.kv_heads,
                "head_dim": self.kv.head_dim,
                "dtype": str(self.kv.dtype),
                "attention": self.kv.attention,
                "layout": "[batch, sequence, heads, head_dim]"
                if self.kv.sequence_axis == 1
                else "[batch, heads, sequence, head_dim]",
                "capacity": "per request" if self.kv_mode == "inplace" else None,
            },
            "codebooks": c.n_vq,
            "codebook_size": c.codebook,
            "local_paths": list(paths),
            "local_path_by_mode": {m: dispatch(list(paths), m) for m in SAMPLE_MODES},
            "generation_defaults": vars(layout.defaults),
            "fixed_frame_constants": layout.fixed_frame_constants,
            "voices": list(self.voices.names),
            "codec": {
                "sample_rate": layout.codec.sample_rate,
                "channels": layout.codec.channels,
                "samples_per_frame": layout.codec.downsample,
                "quantizers": layout.codec.quantizers,
                "streaming_state_tensors": len(layout.state),
                "state_mode": self.codec.state_mode,
            },
            "graphs": self.graphs.describe(),
        }


__all__ = ["MossCodec", "MossTTSNano", "MossVoices", "checked_codes"]

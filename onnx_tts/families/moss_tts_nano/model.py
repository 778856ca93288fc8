"""The MOSS-TTS-Nano backend: the published graphs loaded unmodified, the published prompt and
sampling, the global KV and the codec's streaming state kept in the core.

`synthesize(text, voice=NAME_OR_FILE, seed=N, **options)` returns float32 [samples, 2] at
48 kHz; `stream(...)` yields the same audio in pieces as frames are made. Options keep the
published names and defaults (`sample_mode` greedy/fixed/full, `max_new_frames`,
`voice_clone_max_text_tokens`, `text_*` / `audio_*` sampling values), plus `local_path` to pick
the local depth transformer's graph (default: the published dispatch, which is also the
fastest path the directory offers).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from onnx_tts.cache.reference import ReferenceCache
from onnx_tts.decoding import (
    CapacityPolicy,
    KVPool,
    SamplingOptions,
    check_seed,
    resolve_kv_mode,
)
from onnx_tts.decoding.scheduler import DecodeScheduler
from onnx_tts.errors import AudioError, InputError
from onnx_tts.families.base import LoadSettings
from onnx_tts.families.chatterbox.model import model_identity
from onnx_tts.families.moss_tts_nano.codec import (
    PROMPT_CODES,
    CodecDecoder,
    ReferenceEncoder,
    concat_audio,
    load_reference,
    stream_budget,
)
from onnx_tts.families.moss_tts_nano.graphs import LazySession, describe_specs
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
from onnx_tts.families.moss_tts_nano.text import (
    DEFAULT_CHUNK_TOKENS,
    MossText,
    pause_seconds,
)
from onnx_tts.frontend import check_text
from onnx_tts.graph_io import kv_layout
from onnx_tts.request import Request

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


class MossTTSNano:
    """Backend of a MOSS-TTS-Nano directory (see the module docstring)."""

    family = FAMILY

    def __init__(self, layout: MossLayout, settings: LoadSettings, **options: Any) -> None:
        self.layout = layout
        # The global transformer loads now; local paths and codec graphs on first use. Each
        # stage's graphs get its share of the cores (`--threads 0`): the LM and the codec run
        # at the same time on their own threads.
        decode_options = settings.options_for("decode")
        self.sessions = {
            role: LazySession(spec, decode_options) for role, spec in layout.tts_graphs.items()
        }
        self.codec_sessions = {
            role: LazySession(
                spec, settings.options_for("encoder" if role == "encode" else "vocoder")
            )
            for role, spec in layout.codec_graphs.items()
        }
        prefill = self.sessions["prefill"].get()
        decode = self.sessions["decode_step"].get()
        self.kv = kv_layout(decode.spec)
        # In place when decode_step was converted (`onnx-tts convert --inplace-kv`), else chain.
        self.kv_mode = resolve_kv_mode(settings.kv, self.kv)
        local_mode = "copy" if self.kv_mode == "copy" else "chain"
        self.text = MossText(layout.tokenizer_path)
        paths: dict[str, LocalPath] = {}
        if "local_greedy_frame" in self.sessions:
            paths["greedy_frame"] = GreedyFrame(layout, self.sessions["local_greedy_frame"])
        if "local_fixed_sampled_frame" in self.sessions:
            paths["fixed_frame"] = FixedFrame(layout, self.sessions["local_fixed_sampled_frame"])
        if "local_cached_step" in self.sessions:
            paths["cached_step"] = CachedStep(
                layout, self.sessions["local_cached_step"], local_mode
            )
        paths["decoder"] = Decoder(layout, self.sessions["local_decoder"])
        self.program = MossProgram(layout, paths, prefill, decode, self._engine_request)
        self.pool = KVPool(decode, self.kv, self.kv_mode, CapacityPolicy(None, POSITION_LIMIT))
        # This backend's own synthesize()/stream() decode one chunk at a time on a scheduler
        # of one row (made on first use): the published order of one generator's draws.
        self._solo: DecodeScheduler | None = None
        self.codec = CodecDecoder(
            layout,
            self.codec_sessions["decode_full"],
            self.codec_sessions["decode_step"],
            local_mode,
        )
        self.encoder = ReferenceEncoder(
            self.codec_sessions["encode"],
            layout,
            model_identity(layout.graph_files("codec_encode")),
        )
        self.sample_rate = layout.codec.sample_rate
        self.channels = layout.codec.channels
        self.hop_length = layout.codec.downsample
        # The codec decodes with its own state, so windows need no overlap (the generic
        # windowed streamer only reads these until the stateful stream is plugged in). A
        # decode_step of 4 frames costs about what 8 cost per frame (~5% more), and halves
        # what is left to decode when the LM ends (measured: 8 streams ending together).
        self.streaming_defaults = {
            "first_chunk_frames": 1,
            "stride_frames": 4,
            "overlap_frames": 0,
            "holdback_frames": 0,
            "crossfade_samples": 0,
        }
        self.base_sampling = MossSampling.from_defaults(layout.defaults).checked()
        self.load_options = self._checked(options)

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
        }

    def _local_path(self, sampling: MossSampling, requested: str, given: Mapping) -> str:
        available = list(self.program.paths)
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

    # -- voices ---------------------------------------------------------------------------
    @property
    def voice_names(self) -> list[str]:
        return list(self.layout.voices)

    def default_voice(self) -> dict[str, np.ndarray]:
        """The manifest's first builtin voice (the published runtime's default)."""
        if not self.layout.voices:
            raise AudioError(
                f"{self.layout.manifest_path} has no builtin voices: pass voice=a reference file"
            )
        return {PROMPT_CODES: next(iter(self.layout.voices.values()))}

    def voice(
        self, voice: Any = None, cache: ReferenceCache | None = None
    ) -> dict[str, np.ndarray]:
        """Prompt codes of a voice: None (the default voice), a builtin voice name, a reference
        file, samples [N] or [channels, N] at the codec rate, or a dict with prompt codes."""
        if voice is None:
            return self.default_voice()
        if isinstance(voice, str) and voice in self.layout.voices:
            return {PROMPT_CODES: self.layout.voices[voice]}
        if isinstance(voice, Mapping):
            return {PROMPT_CODES: self._checked_codes(voice.get(PROMPT_CODES))}
        if isinstance(voice, (str, os.PathLike)):
            if not os.path.exists(voice):
                names = ", ".join(self.layout.voices) or "none"
                raise AudioError(
                    f"voice {os.fspath(voice)!r} is neither a builtin voice ({names}) nor a file"
                )
            audio = load_reference(voice, self.sample_rate, self.channels)
        elif isinstance(voice, np.ndarray):
            audio = voice
        else:
            raise InputError(
                "voice must be a builtin voice name, a file path, samples or a dict of prompt "
                f"codes, got {type(voice).__name__}"
            )
        if cache is None:
            return self.encoder.encode(audio)
        return self.encoder.encode_cached(audio, cache)

    def _checked_codes(self, codes: Any) -> np.ndarray:
        c = self.layout.config
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

    # -- generation -----------------------------------------------------------------------
    def text_chunks(self, text: str, options: Mapping[str, Any]) -> list[str]:
        return self.text.chunks(
            text, options.get("voice_clone_max_text_tokens", DEFAULT_CHUNK_TOKENS)
        )

    def sampling_defaults(self) -> SamplingOptions:
        s = self.base_sampling
        return SamplingOptions(
            temperature=s.audio_temperature if s.do_sample else 0.0,
            top_k=s.audio_top_k,
            top_p=s.audio_top_p if s.audio_top_p > 0 else 1.0,
            repetition_penalty=s.audio_repetition_penalty,
        )

    def request(
        self,
        chunk: str,
        voice: Mapping[str, np.ndarray],
        options: Mapping[str, Any],
        generator: np.random.Generator | None,
    ) -> MossRequest:
        ids = self.text.encode(chunk)
        return MossRequest(
            text_ids=tuple(ids),
            prompt_codes=self._checked_codes(voice.get(PROMPT_CODES)),
            sampling=options["sampling"],
            max_new_frames=int(options["max_new_frames"]),
            path=options["local_path"],
            generator=generator,
        )

    def _engine_request(self, request: Request) -> MossRequest:
        """A scheduler request of the Engine (its chunk is text) as the program takes it: the
        chunk's seed (the text's seed + the chunk index) seeds the row's generator."""
        options = request.options
        if "sampling" not in options:
            options = self.request_options(options)
        sampling = options["sampling"]
        generator = np.random.default_rng(request.sampling.seed) if sampling.do_sample else None
        return self.request(str(request.chunk), request.voice, options, generator)

    def frames(
        self,
        chunk: str,
        voice: Mapping[str, np.ndarray],
        options: Mapping[str, Any],
        generator: np.random.Generator | None,
    ) -> Iterator[np.ndarray]:
        """Frames [n_vq] of one text chunk as they are made (close to stop), from this
        backend's one-row scheduler."""
        moss = self.request(chunk, voice, options, generator)
        if self._solo is None:
            self._solo = DecodeScheduler(self.program, self.pool, max_batch=1)
        return self._solo.submit(Request(moss, voice, self.sampling_defaults(), options))

    def close(self) -> None:
        """Stop this backend's own scheduler (an Engine has its own)."""
        if self._solo is not None:
            self._solo.close()

    def vocode(
        self, frames: np.ndarray, voice: Mapping[str, np.ndarray] | None = None
    ) -> np.ndarray:
        """[F, n_vq] codes -> [F x 3840, 2] float32 (the voice plays no part in decoding)."""
        return self.codec.decode(np.asarray(frames).reshape(-1, self.layout.config.n_vq))

    def open_stream(self) -> Any:
        """A streaming codec decoder for the Engine's vocoder stage: `push(frames)` -> their
        audio [n, channels] with the codec's state chained in the core, `close()`."""
        return self.codec.stream()

    def _plan(self, text: Any, voice: Any, seed: Any, options: Mapping[str, Any], cache):
        text = check_text(text)
        checked = self.request_options(options)
        seed = check_seed(seed)
        chunks = self.text_chunks(text, checked)
        prompt = self.voice(voice, cache)
        # One generator for the whole text, used by its chunks in order (as published).
        generator = np.random.default_rng(seed) if checked["sampling"].do_sample else None
        return chunks, checked, prompt, generator

    def pause_seconds(self, chunk: object) -> float:
        """The published silence after a text chunk (0.40 s after a short one, else 0.24 s):
        the Engine puts it between chunks too."""
        return pause_seconds(str(chunk))

    def _pause(self, chunk: str) -> np.ndarray:
        return np.zeros((round(self.sample_rate * pause_seconds(chunk)), self.channels), np.float32)

    def synthesize(
        self,
        text: str | bytes,
        voice: Any = None,
        seed: int | None = None,
        cache: ReferenceCache | None = None,
        **options: Any,
    ) -> np.ndarray:
        """Speak `text`: float32 [samples, channels] at `sample_rate`. Same seed, same audio."""
        chunks, checked, prompt, generator = self._plan(text, voice, seed, options, cache)
        pieces: list[np.ndarray] = []
        for index, chunk in enumerate(chunks):
            frames = list(self.frames(chunk, prompt, checked, generator))
            if frames:
                pieces.append(self.vocode(np.stack(frames)))
            if index < len(chunks) - 1:
                pieces.append(self._pause(chunk))
        return concat_audio(pieces, self.channels)

    def stream(
        self,
        text: str | bytes,
        voice: Any = None,
        seed: int | None = None,
        cache: ReferenceCache | None = None,
        decode_frames: int | None = None,
        codec_thread: bool = False,
        **options: Any,
    ) -> Iterator[np.ndarray]:
        """Speak `text` as float32 [n, channels] pieces as frames are made: the codec's
        decode_step with its state chained in the core, `decode_frames` frames at a time (None:
        the published budget, 1 frame until the audio is 0.2 s ahead of real time, then up to
        8). `codec_thread`: decode on a worker thread while the next frames are generated (the
        core releases the GIL in every run): faster with a spare core, slower without one.
        The pieces concatenate to synthesize()'s audio. Checks happen before the first piece;
        closing the iterator stops generation."""
        if decode_frames is not None and (
            isinstance(decode_frames, bool)
            or not isinstance(decode_frames, int)
            or not 1 <= decode_frames <= 1024
        ):
            raise InputError(
                f"decode_frames must be an integer in [1, 1024], got {decode_frames!r}"
            )
        if not isinstance(codec_thread, bool):
            raise InputError(f"codec_thread must be true or false, got {codec_thread!r}")
        chunks, checked, prompt, generator = self._plan(text, voice, seed, options, cache)
        return self._stream(chunks, checked, prompt, generator, decode_frames, codec_thread)

    def _stream(
        self, chunks, checked, prompt, generator, decode_frames, codec_thread
    ) -> Iterator[np.ndarray]:
        for index, chunk in enumerate(chunks):
            frames = self.frames(chunk, prompt, checked, generator)
            try:
                yield from self._decode_while_generating(frames, decode_frames, codec_thread)
            finally:
                frames.close()  # type: ignore[attr-defined]
            if index < len(chunks) - 1:
                yield self._pause(chunk)

    def _decode_while_generating(
        self, frames: Iterator[np.ndarray], decode_frames: int | None, codec_thread: bool
    ) -> Iterator[np.ndarray]:
        """Audio of `frames` as they come. With `codec_thread`, at most one decode is in
        flight on the worker and the frames made meanwhile go into the next one. The audio is
        the same whatever the grouping."""
        pending: list[np.ndarray] = []
        first: float | None = None
        emitted = 0
        inflight: Future | None = None
        worker = ThreadPoolExecutor(1, thread_name_prefix="moss-codec") if codec_thread else None
        with self.codec.stream() as codec:
            try:
                for frame in frames:
                    pending.append(frame)
                    if inflight is not None and inflight.done():
                        audio = inflight.result()
                        inflight = None
                        first = first or time.perf_counter()
                        emitted += len(audio)
                        yield audio
                    budget = decode_frames or stream_budget(
                        first, emitted / self.sample_rate, time.perf_counter()
                    )
                    if inflight is not None or len(pending) < budget:
                        continue
                    group = np.stack(pending)
                    pending = []
                    if worker is not None:
                        inflight = worker.submit(codec.push, group)
                        continue
                    audio = codec.push(group)
                    first = first or time.perf_counter()
                    emitted += len(audio)
                    yield audio
                if inflight is not None:
                    yield inflight.result()
                    inflight = None
                if pending:
                    yield codec.push(np.stack(pending))
            finally:
                if worker is not None:
                    worker.shutdown(wait=True)  # no decode may outlive its codec stream

    # -- description ----------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        layout, c = self.layout, self.layout.config
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
            "local_paths": list(self.program.paths),
            "local_path_by_mode": {m: dispatch(list(self.program.paths), m) for m in SAMPLE_MODES},
            "generation_defaults": vars(layout.defaults),
            "fixed_frame_constants": layout.fixed_frame_constants,
            "voices": self.voice_names,
            "codec": {
                "sample_rate": layout.codec.sample_rate,
                "channels": layout.codec.channels,
                "samples_per_frame": layout.codec.downsample,
                "quantizers": layout.codec.quantizers,
                "streaming_state_tensors": len(layout.state),
                "state_mode": self.codec.state_mode,
            },
            "graphs": describe_specs(
                {**layout.tts_graphs, **{f"codec_{r}": s for r, s in layout.codec_graphs.items()}}
            ),
        }


__all__ = ["MossTTSNano"]

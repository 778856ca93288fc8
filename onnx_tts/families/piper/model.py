"""A Piper voice (VITS in one ONNX graph) as the family contract's parts.

The graph makes a sentence's audio in one call: phoneme ids, their count and the three scales
(noise, length, noise_w) in, the waveform out; a multi-speaker voice also takes `sid`. At load
it is cut in memory (`graph_split`): the program (`PiperProgram`, one call per sentence on the
engine's decode worker) runs the text encoder, durations and prior sampling, and the flow
when the sentence is vocoded whole, and hands on the sentence's frames; the vocoder
(`PiperVocoder`, the engine's vocoder stage) runs the HiFi-GAN decoder on them, the whole
sentence at once (one-shot: bit for bit the whole graph's audio) or in windows with `reach`
frames of context on each side while a sentence streams (within float rounding of the whole).

The first sentence of a text that may stream in windows (`normalize_audio` off; the first
request of its cancel token the program sees) leaves the program before the flow: its frames
are the prior sample and the mask, and each window runs flow and decoder,
the flow on the whole window, the decoder on the flow's exact frames only (the window less
the flow's reach on each side that is not the sentence's edge), so a window's context is
the flow's reach plus the decoder's (44 frames on joe) while the decoder's work per window
grows by none of it. Every other sentence has its flow run in the program, as before: a
normalised one needs its whole audio for its peak, and a later one is made while the one
before it plays, so its first window is not awaited; the decode worker carries its flow
beside the vocoder's work (a raw stream of 5-sentence texts whose every sentence ran the
flow in windows made 6.0 audio s/s against 7.1 at one thread: the vocoder stage, the busier,
did all of the flow and its windows' overlap).
A graph whose flow cannot be cut streams windows of the decoder only; a graph that cannot be
cut at all runs whole in the program, and its frames are hop-length pieces of the audio.

Each frame starts with numbers of its request and place (`HEAD`): `volume`; 1.0 when the
sentence is peak-normalised (`normalize_audio`, piper-tts's default) or 0.0; 1.0 when the
frames are the flow's input (the vocoder runs the flow) or 0.0; the frame's index in its
sentence and the sentence's frame count (a window knows which of its edges are the
sentence's). A normalised sentence is vocoded whole even when streamed
(`PiperVocoder.whole_chunks`): its stream starts when the sentence is done, as piper-tts's;
with `normalize_audio` off a stream starts after the first window of the first sentence.

Word timings: the graph's phoneme durations (its `Ceil` output, which Piper's alignment patch
also exposes) are made an output of the program's graph at load, so each frame is marked with
the id it voices and words are timed exactly; a graph without one `Ceil` gets estimated timings.
"""

from __future__ import annotations

import os
import tempfile
import threading
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from onnx_tts.bundle import file_sha256
from onnx_tts.decoding import SamplingOptions
from onnx_tts.decoding.direct import DirectProgram
from onnx_tts.decoding.request import CancelToken, Request
from onnx_tts.encoder import VoiceEncoder
from onnx_tts.errors import AudioError, ModelError
from onnx_tts.families.base import Model, Vocoder, VocoderCapabilities, Voices
from onnx_tts.families.loader import Graph, GraphSet, LoadSettings, load_graphs
from onnx_tts.families.piper.graph_split import FlowCut, SplitVoice, split_voice
from onnx_tts.families.piper.text import PiperChunk, PiperText
from onnx_tts.families.piper.voice_config import VoiceConfig
from onnx_tts.graph_io import graph_spec_of, read_graph_proto
from onnx_tts.session import Session

FAMILY = "piper"
INPUTS = {"input": np.int64, "input_lengths": np.int64, "scales": np.float32}
SPEAKER_INPUT = "sid"
DURATIONS = "onnx_tts_durations"  # the name the session gives the graph's phoneme durations
# Leading numbers of each frame (module docstring): volume, normalise, flow pending, the
# frame's index in its sentence, the sentence's frames.
HEAD = 5
VOLUME, NORMALIZE, FLOW_PENDING, POSITION, SENTENCE_FRAMES = range(HEAD)
FIRST_FRAMES = 16  # frames the first streamed window hands out (~0.19 s at 22.05 kHz)
# Then windows of this many new frames (2.2 s). Each window re-runs the flow on its context
# too (2 x 44 frames on joe; the flow costs ~0.2x the decoder per frame): at 192 a streamed
# sentence costs about what it did with 128-frame windows of the decoder alone.
STRIDE_FRAMES = 192
QUIET_PEAK = 1e-8  # piper-tts: a sentence quieter than this is silence, not scaled up


def streaming_defaults(reach: int) -> dict[str, int]:
    """Windows of the decoder with `reach` frames of context on each side (0: finished audio,
    exact in any window)."""
    return {
        "first_chunk_frames": FIRST_FRAMES + reach,
        "stride_frames": STRIDE_FRAMES,
        "overlap_frames": reach,
        "holdback_frames": reach,
        "crossfade_samples": 0,
    }


class PiperFlow:
    """The flow cut off the program's graph (`graph_split.FlowCut`), one session: a whole
    sentence in the program, a window in the vocoder (module docstring)."""

    def __init__(self, session: Session, cut: FlowCut, latent: str, channels: int) -> None:
        self.session, self.latent, self.channels = session, latent, channels
        self.sample, self.mask, self.reach, self.sid = cut.sample, cut.mask, cut.reach, cut.sid

    def prior(self, outputs: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """The program graph's prior sample [channels, F] and mask [1, F], checked."""
        sample = np.asarray(outputs[self.sample], np.float32)
        mask = np.asarray(outputs[self.mask], np.float32)
        if sample.ndim != 3 or sample.shape[:2] != (1, self.channels):
            raise ModelError(f"the voice's prior sample is {sample.shape}, not [1, C, frames]")
        if mask.shape != (1, 1, sample.shape[2]):
            raise ModelError(f"the voice's frame mask is {mask.shape}, not [1, 1, frames]")
        return sample[0], mask[0]

    def run(
        self, sample: np.ndarray, mask: np.ndarray, voice: Mapping[str, np.ndarray]
    ) -> np.ndarray:
        """z_p [channels, F] and its mask [1, F] -> the decoder's input [channels, F]."""
        feeds = {
            self.sample: np.ascontiguousarray(sample[None]),
            self.mask: np.ascontiguousarray(mask[None]),
        }
        if self.sid:
            feeds[SPEAKER_INPUT] = np.asarray(voice["sid"], np.int64).reshape(1)
        return np.asarray(self.session.run(feeds)[self.latent], np.float32)[0]

    def margins(self, frames: np.ndarray) -> tuple[int, int]:
        """Frames at the start and end of a window the flow cannot make exactly: its reach at
        each edge that is not its sentence's (none in a window narrower than that: a user's
        overlap below the voice's reach, decoded as it is)."""
        first, total = int(frames[0, POSITION]), int(frames[0, SENTENCE_FRAMES])
        left = 0 if first == 0 else self.reach
        right = 0 if first + len(frames) >= total else self.reach
        return (left, right) if left + right < len(frames) else (0, 0)


class PiperProgram(DirectProgram):
    """One graph call per sentence: its latent frames (or, for a graph run whole, its audio in
    hop-length frames), each behind the request's HEAD (module docstring)."""

    def __init__(
        self,
        model: PiperModel,
        session: Session,
        latent: str | None,
        durations: str | None,
        flow: PiperFlow | None = None,
    ) -> None:
        self.model, self.session = model, session
        self.latent, self.durations, self.flow = latent, durations, flow
        self.hop = model.config.hop_length
        # The texts (their requests' shared cancel token) whose first sentence was made.
        self._begun: weakref.WeakSet[CancelToken] = weakref.WeakSet()
        self._lock = threading.Lock()

    def _first_of_text(self, request: Request) -> bool:
        with self._lock:
            first = request.cancel not in self._begun
            self._begun.add(request.cancel)
        return first

    def frames(self, request: Request) -> np.ndarray:
        chunk: PiperChunk = request.chunk
        options = request.options
        ids = np.asarray([chunk.ids], np.int64)
        feeds = {
            "input": ids,
            "input_lengths": np.asarray([ids.shape[1]], np.int64),
            "scales": np.asarray(
                [options["noise_scale"], options["length_scale"], options["noise_w"]], np.float32
            ),
        }
        if self.model.multi_speaker:
            feeds[SPEAKER_INPUT] = np.asarray(request.voice["sid"], np.int64).reshape(1)
        outputs = self.session.run(feeds)
        pending = (
            self.flow is not None
            and not options["normalize_audio"]
            and self._first_of_text(request)
        )
        if self.flow is not None:
            sample, mask = self.flow.prior(outputs)
            if pending:  # the vocoder runs the flow, window by window
                payload = np.concatenate([sample, mask]).T  # [F, channels + 1]
            else:
                payload = self.flow.run(sample, mask, request.voice).T  # [F, channels]
        elif self.latent is not None:
            payload = np.asarray(outputs[self.latent], np.float32)[0].T  # [F, channels]
        else:
            audio = np.asarray(outputs[self.model.output_name], np.float32).reshape(-1)
            padded = np.zeros(-(-len(audio) // self.hop) * self.hop, np.float32)
            padded[: len(audio)] = audio
            payload = padded.reshape(-1, self.hop)
        frames = len(payload)
        head = np.empty((frames, HEAD), np.float32)
        head[:, VOLUME] = options["volume"]
        head[:, NORMALIZE] = 1.0 if options["normalize_audio"] else 0.0
        head[:, FLOW_PENDING] = 1.0 if pending else 0.0
        head[:, POSITION] = np.arange(frames)
        head[:, SENTENCE_FRAMES] = frames
        if request.marks is not None and self.durations is not None:
            per_id = np.asarray(outputs[self.durations]).reshape(-1)
            marks = np.repeat(np.arange(len(per_id)), np.maximum(per_id, 0).astype(np.int64))
            request.marks.extend(int(m) for m in marks[:frames])
            request.marks.extend([len(per_id) - 1] * (frames - len(marks)))
        return np.concatenate([head, payload], axis=1)


class PiperVocoder(Vocoder):
    """A sentence's frames (or a window of them) -> samples: the decoder graph on the latent
    frames (or the finished audio as it is), then Piper's level: peak-normalised when the
    frames say so (a whole sentence: `whole_chunks`), times `volume`, clipped to [-1, 1].
    No pause between sentences unless asked (`sentence_silence`), as Piper.

    A voice with the flow cut decodes a window less the flow's reach at each edge that is not
    its sentence's, and gives zeros there: the stream's overlap and hold-back (the voice's
    reach by default) drop them; a stream asked for an overlap or hold-back below the flow's
    reach hears them."""

    def __init__(
        self,
        sample_rate: int,
        hop_length: int,
        decoder: Session | None,
        latent: str | None,
        decoder_sid: bool,
        flow: PiperFlow | None = None,
    ) -> None:
        self.capabilities = VocoderCapabilities(sample_rate, hop_length)
        self.decoder, self.latent, self.decoder_sid = decoder, latent, decoder_sid
        self.flow, self.hop = flow, hop_length

    def vocode(self, frames: np.ndarray, voice: Mapping[str, np.ndarray]) -> np.ndarray:
        # (a one-shot sentence comes as the one [F, width] piece the program made, stacked)
        frames = np.asarray(frames, np.float32).reshape(-1, np.shape(frames)[-1])
        volume, normalize = float(frames[0, VOLUME]), bool(frames[0, NORMALIZE])
        if self.decoder is None:
            audio = frames[:, HEAD:].reshape(-1)
        else:
            latent, left, right = frames[:, HEAD:].T, 0, 0
            if self.flow is not None:
                # The windows have the flow's reach of context beyond the decoder's: the
                # decoder gets the exact frames only (all of a window of flow output).
                left, right = self.flow.margins(frames)
                if frames[0, FLOW_PENDING]:
                    latent = self.flow.run(latent[:-1], latent[-1:], voice)
                latent = latent[:, left : len(frames) - right]
            feeds = {self.latent: np.ascontiguousarray(latent[None])}
            if self.decoder_sid:
                feeds[SPEAKER_INPUT] = np.asarray(voice["sid"], np.int64).reshape(1)
            outputs = self.decoder.run(feeds)
            audio = np.asarray(next(iter(outputs.values())), np.float32).reshape(-1)
            if left or right:  # in the window's context, which the stream drops
                zeros = np.zeros((left + right) * self.hop, np.float32)
                audio = np.concatenate([zeros[: left * self.hop], audio, zeros[left * self.hop :]])
        # piper-tts's level, operation for operation (so that its samples are equalled).
        if normalize:
            peak = float(np.max(np.abs(audio))) if audio.size else 0.0
            audio = np.zeros_like(audio) if peak < QUIET_PEAK else audio / np.float32(peak)
        if volume != 1.0:
            audio = audio * np.float32(volume)
        return np.clip(audio, -1.0, 1.0).astype(np.float32, copy=False)

    def whole_chunks(self, options: Mapping[str, Any]) -> bool:
        return bool(options.get("normalize_audio", True))

    def pause_seconds(self, chunk: Any) -> float:
        return 0.0


class _NoReference:
    """The encoder of a voice that clones nothing: a reference is refused, naming the voice's
    own speakers; an encoded voice is a speaker id (`sid`)."""

    output_names = ("sid",)
    outputs = ()

    def __init__(self, config: VoiceConfig) -> None:
        self.config = config

    def run(self, feeds: Mapping[str, np.ndarray], output_names: Any = None) -> dict:
        speakers = ", ".join(self.config.speakers[:10]) or "its one speaker"
        raise AudioError(
            f"the Piper voice {self.config.name} speaks its own speakers ({speakers}) and "
            "clones no reference audio; pass a speaker's name as the voice, or none"
        )


class PiperModel(Model):
    """One Piper voice (`NAME.onnx` + `NAME.onnx.json`)."""

    sampling_keys = ()  # Piper's randomness is its noise scales, inside the graph

    def __init__(
        self, config: VoiceConfig, settings: LoadSettings, options: Mapping[str, Any]
    ) -> None:
        self.config = config
        self.load_options = dict(options)
        proto = read_graph_proto(config.model_path)
        spec = graph_spec_of(proto, config.model_path)
        self.multi_speaker = config.num_speakers > 1
        self._check(spec)
        self.output_name = next(iter(spec.outputs))
        durations = _durations_output(proto, spec)
        split = split_voice(proto, durations, config.hop_length)
        with tempfile.TemporaryDirectory(prefix="onnx-tts-piper-") as scratch:
            graphs = self._sessions(proto, spec, split, durations, Path(scratch), settings)
        flow: PiperFlow | None = None
        if split is not None:
            self.reach, latent = split.reach, split.latent
            decoder: Session | None = graphs["decoder"]
            if split.flow is not None:
                flow = PiperFlow(graphs["flow"], split.flow, latent, split.channels)
                self.reach += flow.reach
            program = PiperProgram(self, graphs["frames"], latent, durations, flow)
        else:
            self.reach, latent, decoder = 0, None, None
            if durations is not None and len(spec.outputs) == 1:
                durations = DURATIONS
            program = PiperProgram(self, graphs["voice"], None, durations)
        del proto
        self._graph_hash = file_sha256(config.model_path)
        encoder = VoiceEncoder(
            _NoReference(config),
            f"piper:{config.name}",
            config.sample_rate,
            {},
            graph_sha256=self._graph_hash,
        )
        builtin = {
            name: {"sid": np.asarray([sid], np.int64)}
            for name, sid in config.speaker_id_map.items()
        }
        default = {"sid": np.asarray([config.default_speaker_id], np.int64)}
        program.workers = _workers(settings, split is not None)
        super().__init__(
            family=FAMILY,
            text=PiperText(config, bool(options.get("english_reader", True))),
            voices=Voices(encoder, lambda: dict(default), builtin if self.multi_speaker else {}),
            program=program,
            vocoder=PiperVocoder(
                config.sample_rate,
                config.hop_length,
                decoder,
                latent,
                split is not None and split.decoder_sid,
                flow,
            ),
            graphs=graphs,
            streaming_defaults=streaming_defaults(self.reach),
        )

    def _sessions(
        self,
        proto: Any,
        spec: Any,
        split: SplitVoice | None,
        durations: str | None,
        scratch: Path,
        settings: LoadSettings,
    ) -> Any:
        """Sessions of the two graphs of a split voice ("frames" on the decode stage, "decoder"
        on the vocoder stage), or of the one graph ("voice", its durations made an output)."""
        import onnx

        if split is not None:
            onnx.save(split.frames, str(scratch / "frames.onnx"))
            onnx.save(split.decoder, str(scratch / "decoder.onnx"))
            declared = {
                "frames": Graph(scratch / "frames.onnx", "decode"),
                # The decoder is two thirds of the work, one call at a time on the vocoder
                # stage: it gets the threads the settings give (--threads 0: every core; the
                # stage's share, 1 of 2, measured 7.4 against 10.6 audio s/s at 1 request and
                # 8.3 against 11.2 at 8).
                "decoder": Graph(
                    scratch / "decoder.onnx", "vocoder", options=settings.session_options
                ),
            }
            if split.flow is not None:
                # Run by the program (a whole sentence) and by the vocoder (a window): the
                # decode stage's share of the cores, as the frames graph it was part of.
                onnx.save(split.flow.graph, str(scratch / "flow.onnx"))
                declared["flow"] = Graph(scratch / "flow.onnx", "decode")
            return load_graphs(GraphSet(declared, lm=None), settings)
        path = self.config.model_path
        if durations is not None and len(spec.outputs) == 1:
            path = _with_output(proto, durations, scratch)
        # The one graph does all the work: it gets every core the settings give (--threads
        # 0: ORT's choice, one call at a time); with N threads per call, cores / N calls
        # run at once (--threads 1 on 2 cores: two sentences side by side).
        graph = Graph(path, "decode", options=settings.session_options)
        return load_graphs(GraphSet({"voice": graph}, lm=None), settings)

    def _check(self, spec: Any) -> None:
        config, problems = self.config, []
        for name, dtype in INPUTS.items():
            declared = spec.inputs.get(name)
            if declared is None or declared.dtype != np.dtype(dtype):
                problems.append(f"input {name!r} ({np.dtype(dtype).name})")
        has_sid = SPEAKER_INPUT in spec.inputs
        if has_sid != self.multi_speaker:
            problems.append(
                f"a speaker input 'sid' {'for' if self.multi_speaker else 'only with'} "
                f"num_speakers > 1 (the config says {config.num_speakers})"
            )
        outputs = list(spec.outputs.values())
        if not outputs or outputs[0].dtype != np.float32:
            problems.append("a float32 audio output first")
        if problems:
            raise ModelError(
                f"{config.model_path} is not the Piper voice its config describes: it needs "
                f"{'; '.join(problems)}"
            )

    # -- the family's own ----------------------------------------------------------------------
    def request_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        config, given = self.config, {**self.load_options, **options}
        return {
            "noise_scale": given.get("noise_scale", config.noise_scale),
            "length_scale": given.get("length_scale", config.length_scale),
            "noise_w": given.get("noise_w", config.noise_w),
            "normalize_audio": given.get("normalize_audio", True),
            "volume": given.get("volume", 1.0),
            "english_reader": given.get("english_reader", True),
        }

    def sampling_defaults(self) -> SamplingOptions:
        return SamplingOptions(temperature=0.0).checked()

    def info(self) -> dict[str, Any]:
        config = self.config
        return {
            "family": FAMILY,
            "name": config.name,
            "path": str(config.model_path),
            "description": config.description,
            "sample_rate": self.sample_rate,
            "kv_mode": self.kv_mode,
            "language": config.language,
            "languages": [config.language],
            "espeak_voice": config.espeak_voice,
            "phoneme_type": config.phoneme_type,
            "speakers": list(config.speakers),
            "english_reader": self.text.english_reader,  # type: ignore[attr-defined]
            "word_timings": "exact" if self.program.durations else "estimated",  # type: ignore[union-attr]
            "streaming": (
                f"windows of the {'flow and ' if self.program.flow else ''}decoder inside a "  # type: ignore[union-attr]
                f"sentence ({self.reach} frames of context)"
                if self.reach
                else "sentence by sentence"
            ),
            "inference": {
                "noise_scale": config.noise_scale,
                "length_scale": config.length_scale,
                "noise_w": config.noise_w,
            },
            "graphs": self.graphs.describe(),
        }

    def file_hashes(self) -> dict[str, str]:
        config = self.config
        return {
            config.model_path.name: self._graph_hash,
            config.config_path.name: file_sha256(config.config_path),
        }


def _workers(settings: LoadSettings, split: bool) -> int:
    """Graph calls the program runs at once. A split voice's program has the decode stage's
    share of the cores (its decoder runs beside it on the vocoder stage's); a voice run whole
    has them all: cores / threads per call (one call with --threads 0: ORT's threads)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    threads = settings.options_for("decode").intra_op_threads if split else 0
    threads = threads or settings.session_options.intra_op_threads
    if threads <= 0:
        return 1
    return max(1, (cores // 2 if split else cores) // threads)


def _durations_output(proto: Any, spec: Any) -> str | None:
    """The graph's phoneme durations: its second output when it has one (a voice patched
    for alignments), else the output of its one `Ceil` node (the frames of each id)."""
    names = list(spec.outputs)
    if len(names) > 1:
        return names[1]
    ceils = [node.output[0] for node in proto.graph.node if node.op_type == "Ceil"]
    return ceils[0] if len(ceils) == 1 else None


def _with_output(proto: Any, tensor: str, scratch: Path) -> Path:
    """The graph with `tensor` also an output (named DURATIONS), written to `scratch`."""
    import onnx

    proto.graph.node.append(onnx.helper.make_node("Identity", [tensor], [DURATIONS]))
    proto.graph.output.append(onnx.helper.make_empty_tensor_value_info(DURATIONS))
    path = scratch / "voice.onnx"
    onnx.save(proto, str(path))
    return path


__all__ = ["FAMILY", "PiperModel", "PiperProgram", "PiperVocoder"]

"""Phoneme-pointer mel bundles (`bundle.json` family "phoneme-mel"): the project's trained voice.

Text is phonemized (espeak-ng) and the LM walks a pointer along the phonemes: each step's
input is the previous step's mel frames, the phonemes around the pointer, how long the
pointer has stayed, and the speaker embedding; its output is the step's mel frames and
whether to advance the pointer by 0-3 phonemes. Generation ends when the pointer passes the
last symbol. The vocoder turns standardised log-mel into a waveform (Griffin-Lim in ONNX).
See export/voice/train.py for the model and docs/ARCHITECTURE.md for the graph contract.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from onnx_tts.bundle import Bundle
from onnx_tts.encoder import VoiceEncoder
from onnx_tts.errors import InputError, ModelError
from onnx_tts.frontend import PhonemeTable, Phonemizer, normalize_text, split_sentences
from onnx_tts.generator import KVPool, Sampler, SamplingOptions, lm_feeds
from onnx_tts.graph_io import check_graph_io
from onnx_tts.session import Session, SessionOptions, describe_graphs

FAMILY = "phoneme-mel"
GRAPH_ROLES = ("encoder", "embed", "lm", "vocoder")
PAD_ID = 0  # phoneme-window id outside the sentence; symbol i has id i + 1
# A pointer that stays this many steps on one phoneme is moved on: a runaway guard, far
# beyond any real phoneme (2 s at 25 steps/s).
MAX_STEPS_ON_ONE_SYMBOL = 50


def phoneme_windows(ids: np.ndarray, pointers: np.ndarray, context: Sequence[int]) -> np.ndarray:
    """The embed graph's `phonemes` input: ids at each pointer + each context offset, PAD_ID
    outside the sentence; i64 [len(pointers), len(context)]. Training builds its inputs with
    this same function."""
    positions = np.asarray(pointers, np.int64)[:, None] + np.asarray(context, np.int64)[None, :]
    inside = (positions >= 0) & (positions < len(ids))
    return np.where(inside, ids[np.clip(positions, 0, len(ids) - 1)], PAD_ID)


class PhonemeMelModel:
    """Backend for a "phoneme-mel" bundle directory."""

    family = FAMILY

    def __init__(
        self, root: Path, kv_mode: str | None = None, options: SessionOptions | None = None
    ) -> None:
        self.bundle = Bundle.load(root)
        manifest = self.bundle.manifest
        kv, frames, text = manifest["kv"], manifest["frames"], manifest["text"]
        self.kv_mode = kv_mode or kv.get("default_mode", "inplace")
        if self.kv_mode == "inplace" and kv.get("attention") != "gqa":
            raise InputError(
                "KV mode 'inplace' needs a GroupQueryAttention LM; this graph grows its cache by "
                "Concat, use --kv chain"
            )
        self.sample_rate = self.bundle.sample_rate
        self.hop_length = int(frames["hop_length"])
        self.n_mels = int(frames["n_mels"])
        self.reduction = int(frames["reduction"])
        self.frame_width = self.reduction * self.n_mels
        self.context = np.asarray(text["context"], dtype=np.int64)
        self.text_settings = dict(text)
        self.sampling_defaults = dict(manifest.get("sampling", {}))
        self.streaming_defaults = dict(manifest["streaming"])
        self.max_steps_per_symbol = int(manifest["pointer"].get("max_steps_per_symbol", 12))
        self.advance_classes = int(manifest["pointer"]["advance_classes"])
        self.table = PhonemeTable(list(text["phonemes"]))
        self.start_id = self.table.encode(text["start_symbol"])
        self.end_id = self.table.encode(text["end_symbol"])
        if len(self.start_id) != 1 or len(self.end_id) != 1:
            raise ModelError(f"{root}: start/end symbols are not in the bundle's phoneme table")
        self.phonemizer = Phonemizer(text.get("language", "en-us"))
        default = np.asarray(manifest["default_speaker_embedding"], dtype=np.float32)

        options = options or SessionOptions()
        # A batch-1 decode step of this small LM is too little work to split across threads:
        # measured 1.26 ms/step on one intra-op thread vs 2.76 ms on two (2 cores). The
        # encoder and the vocoder, which see whole clips, keep the caller's setting.
        step_options = (
            options if options.shared_thread_pool else replace(options, intra_op_threads=1)
        )
        self.sessions = {
            role: Session(
                self.bundle.graph_path(role),
                step_options if role in ("embed", "lm") else options,
            )
            for role in GRAPH_ROLES
        }
        self._validate(default.shape[0])
        self.default_speaker = default
        self.encoder = VoiceEncoder(
            self.sessions["encoder"],
            bundle_identity=f"{self.bundle.name}@{self.bundle.identity}",
            sample_rate=self.sample_rate,
            settings=dict(manifest.get("encoder", {})),
            graph_sha256=manifest.get("sha256", {}).get(manifest["graphs"]["encoder"]),
            graph_path=self.bundle.graph_path("encoder"),
            hop_length=self.hop_length,
            frame_outputs=(),
        )
        self.pool = KVPool(self.sessions["lm"], self.kv_mode, int(kv.get("capacity", 4096)))

    def _validate(self, speaker_dim: int) -> None:
        manifest = self.bundle.manifest
        hidden = int(manifest["lm"]["hidden_size"])
        check_graph_io(
            self.sessions["encoder"].spec,
            "encoder",
            {"audio": ("float32", (None, None))},
            {"speaker_embedding": ("float32", (None, speaker_dim))},
        )
        check_graph_io(
            self.sessions["embed"].spec,
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
        past_specs, present_specs = self.bundle.kv_specs()
        lm_inputs.update(past_specs)
        lm_outputs.update(present_specs)
        check_graph_io(self.sessions["lm"].spec, "lm", lm_inputs, lm_outputs)
        check_graph_io(
            self.sessions["vocoder"].spec,
            "vocoder",
            {"mel": ("float32", (None, None, self.n_mels))},
            {"waveform": ("float32", (None, None))},
        )

    # -- backend interface ---------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "name": self.bundle.name,
            "path": str(self.bundle.root),
            "sample_rate": self.sample_rate,
            "kv_mode": self.kv_mode,
            "kv": self.bundle.manifest["kv"],
            "frames": self.bundle.manifest["frames"],
            "phonemes": len(self.table),
            "streaming": self.streaming_defaults,
            "graphs": describe_graphs(self.sessions),
        }

    def default_voice(self) -> dict[str, np.ndarray]:
        return {"speaker_embedding": self.default_speaker}

    def phoneme_ids(self, sentence: str) -> list[int]:
        """[start] + phoneme ids of `sentence` + [end]; only the boundaries if nothing is
        speakable."""
        return self.start_id + self.table.encode(self.phonemizer.phonemize(sentence)) + self.end_id

    def text_chunks(self, text: str) -> list[list[int]]:
        max_chars = int(self.text_settings.get("max_chars_per_chunk", 200))
        chunks = [self.phoneme_ids(s) for s in split_sentences(normalize_text(text), max_chars)]
        chunks = [c for c in chunks if len(c) > 2]
        if not chunks:
            raise InputError("text has nothing speakable after normalisation")
        return chunks

    def sampling(self, **overrides: Any) -> SamplingOptions:
        # Only the advance decision is sampled; greedy (temperature 0) unless asked otherwise.
        defaults = {"temperature": float(self.sampling_defaults.get("temperature", 0.0))}
        return SamplingOptions(**defaults).with_overrides(**overrides)

    def generate(
        self,
        chunk: list[int],
        voice: dict[str, np.ndarray],
        sampling: SamplingOptions,
        should_stop: Callable[[], bool] | None = None,
    ) -> Iterator[np.ndarray]:
        """Yields standardised log-mel frames (float32 [n_mels]) as the LM makes them."""
        ids = np.asarray(chunk, dtype=np.int64)
        # Every pointer position's window, once per sentence, not once per step.
        windows = phoneme_windows(ids, np.arange(len(ids)), self.context)[:, None, None, :]
        speaker = np.asarray(voice["speaker_embedding"], np.float32).reshape(1, -1)
        sampler = Sampler(sampling)
        embed, lm = self.sessions["embed"], self.sessions["lm"]
        cache = self.pool.acquire()
        try:
            max_steps = self.max_steps_per_symbol * len(ids)
            if cache.capacity is not None and max_steps > cache.capacity:
                max_steps = cache.capacity  # a sentence this long ends at the capacity
            pointer, progress = 0, 0
            previous = np.zeros((1, 1, self.frame_width), np.float32)
            for _ in range(max_steps):
                if should_stop is not None and should_stop():
                    return
                x = embed.run(
                    {
                        "previous_frames": previous,
                        "phonemes": windows[pointer],
                        "progress": np.array([[progress]], np.int64),
                        "speaker_embedding": speaker,
                    }
                )["inputs_embeds"]
                out = cache.step(lm_feeds(lm, x, cache.length))["logits"][0, -1]
                # A copy: in place mode the logits tensor is reused by the next step.
                frames = np.array(out[: self.frame_width], np.float32)
                advance = int(sampler.sample(out[self.frame_width :]))
                if advance == 0 and progress + 1 >= MAX_STEPS_ON_ONE_SYMBOL:
                    advance = 1
                yield from frames.reshape(self.reduction, self.n_mels)
                previous = frames.reshape(1, 1, -1)
                pointer, progress = (pointer + advance, 0) if advance else (pointer, progress + 1)
                if pointer >= len(ids):
                    return
        finally:
            self.pool.release(cache)

    def vocode(self, frames: np.ndarray, voice: dict[str, np.ndarray]) -> np.ndarray:
        mel = np.asarray(frames, np.float32).reshape(1, -1, self.n_mels)
        if mel.shape[1] == 0:
            return np.zeros(0, np.float32)
        return self.sessions["vocoder"].run({"mel": mel}, ["waveform"])["waveform"][0]

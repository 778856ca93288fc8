"""The project's own bundles (`bundle.json`): encoder + embed + codec LM + causal vocoder."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from onnx_tts.bundle import Bundle
from onnx_tts.encoder import VoiceEncoder
from onnx_tts.errors import InputError, ModelError
from onnx_tts.frontend import TextTokenizer, normalize_text, split_sentences
from onnx_tts.generator import CodecLMGenerator, KVPool, LengthLimits, SamplingOptions
from onnx_tts.graph_io import check_graph_io
from onnx_tts.session import Session, SessionOptions, describe_graphs
from onnx_tts.vocoder import Vocoder


class CodecLMModel:
    """Backend for a `bundle.json` directory (see docs/ARCHITECTURE.md)."""

    family = "codec-lm"

    def __init__(
        self,
        root: Path,
        kv_mode: str | None = None,
        options: SessionOptions | None = None,
        lm_graph: str = "lm",
    ) -> None:
        self.bundle = Bundle.load(root)
        options = options or SessionOptions()
        manifest = self.bundle.manifest
        kv, codec = manifest["kv"], manifest["codec"]
        self.kv_mode = kv_mode or kv.get("default_mode", "chain")
        if self.kv_mode == "inplace" and (kv.get("attention") != "gqa" or lm_graph != "lm"):
            raise InputError(
                "KV mode 'inplace' needs a GroupQueryAttention LM; this graph grows its cache by "
                "Concat, use --kv chain"
            )
        self.codebooks = int(codec["codebooks"])
        self.codebook_size = int(codec["codebook_size"])
        self.hop_length = int(codec["hop_length"])
        self.sample_rate = self.bundle.sample_rate
        self.sampling_defaults = dict(manifest["sampling"])
        self.streaming_defaults = dict(manifest["streaming"])
        self.text_settings = dict(manifest["text"])
        self.encoder_settings = dict(manifest.get("encoder", {}))

        sessions = {
            role: Session(self.bundle.graph_path(role), options)
            for role in ("encoder", "embed", lm_graph, "vocoder")
        }
        self.sessions = sessions
        self._validate(sessions, lm_graph)
        self.tokenizer = TextTokenizer(root / self.text_settings["tokenizer"])
        self.encoder = VoiceEncoder(
            sessions["encoder"],
            bundle_identity=f"{self.bundle.name}@{self.bundle.identity}",
            sample_rate=self.sample_rate,
            settings=self.encoder_settings,
            graph_sha256=manifest.get("sha256", {}).get(manifest["graphs"]["encoder"]),
            graph_path=self.bundle.graph_path("encoder"),
            hop_length=self.hop_length,
        )
        capacity = int(kv.get("capacity", 2048))
        self.generator = CodecLMGenerator(
            sessions["embed"],
            sessions[lm_graph],
            KVPool(sessions[lm_graph], self.kv_mode, capacity),
            self.codebooks,
            self.codebook_size,
            int(codec["pad_id"]),
            int(codec["bos_id"]),
            int(codec["eos_id"]),
        )
        self.vocoder = Vocoder(
            sessions["vocoder"],
            self.hop_length,
            self.codebooks,
            self.codebook_size,
            lookahead_frames=int(manifest["vocoder"].get("lookahead_frames", 0)),
        )
        self.speaker_dim = int(sessions["embed"].input("speaker_embedding").shape[-1])

    def _validate(self, sessions: dict[str, Session], lm_graph: str) -> None:
        codec, lm = self.bundle.manifest["codec"], self.bundle.manifest["lm"]
        k, vocab = int(codec["codebooks"]), int(codec["codebook_size"]) + 3
        hidden = int(lm["hidden_size"])
        check_graph_io(
            sessions["encoder"].spec,
            "encoder",
            {"audio": ("float32", (None, None))},
            {"codes": ("int64", (None, None, k)), "speaker_embedding": ("float32", (None, None))},
        )
        check_graph_io(
            sessions["embed"].spec,
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
        past_specs, present_specs = self.bundle.kv_specs()
        lm_inputs.update(past_specs)
        lm_outputs.update(present_specs)
        check_graph_io(sessions[lm_graph].spec, lm_graph, lm_inputs, lm_outputs)
        check_graph_io(
            sessions["vocoder"].spec,
            "vocoder",
            {"codes": ("int64", (None, None, k))},
            {"waveform": ("float32", (None, None))},
        )
        extra = (
            set(sessions[lm_graph].input_names)
            - set(lm_inputs)
            - {"seqlens_k", "total_sequence_length", "attention_mask", "position_ids"}
        )
        if extra:
            raise ModelError(f"{lm_graph} graph has inputs onnx-tts cannot fill: {sorted(extra)}")

    # -- backend interface ---------------------------------------------------------------------
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
            "graphs": describe_graphs(self.sessions),
        }

    def default_voice(self) -> dict[str, np.ndarray]:
        """No reference: an empty prompt and a zero speaker embedding."""
        return {
            "codes": np.zeros((0, self.codebooks), np.int64),
            "speaker_embedding": np.zeros(self.speaker_dim, np.float32),
        }

    def text_chunks(self, text: str) -> list[list[int]]:
        normalized = normalize_text(text)
        max_chars = int(self.text_settings.get("max_tokens_per_chunk", 200))
        chunks = [self.tokenizer.encode(s) for s in split_sentences(normalized, max_chars)]
        chunks = [c for c in chunks if c]
        if not chunks:
            raise InputError("text has nothing speakable after normalisation")
        return chunks

    def sampling(self, **overrides: Any) -> SamplingOptions:
        defaults = {
            key: self.sampling_defaults[key]
            for key in ("temperature", "top_k", "top_p", "repetition_penalty")
            if key in self.sampling_defaults
        }
        return SamplingOptions(**defaults).with_overrides(**overrides)

    def limits(self, chunk: list[int]) -> LengthLimits:
        per_token_max = float(self.sampling_defaults.get("max_frames_per_token", 12))
        per_token_min = float(self.sampling_defaults.get("min_frames_per_token", 3))
        return LengthLimits(
            min_frames=int(per_token_min * len(chunk)),
            max_frames=max(int(per_token_max * len(chunk)), 8),
        )

    def prompt(self, voice: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        limit = int(self.encoder_settings.get("prompt_frames", 150))
        codes = np.asarray(voice["codes"]).reshape(-1, self.codebooks)[:limit]
        return {"codes": codes, "speaker_embedding": np.asarray(voice["speaker_embedding"])}

    def generate(
        self,
        chunk: list[int],
        voice: dict[str, np.ndarray],
        sampling: SamplingOptions,
        should_stop: Callable[[], bool] | None = None,
    ) -> Iterator[np.ndarray]:
        yield from self.generator.generate(
            chunk, self.prompt(voice), sampling, self.limits(chunk), should_stop
        )

    def vocode(self, frames: np.ndarray, voice: dict[str, np.ndarray]) -> np.ndarray:
        return self.vocoder.decode(frames)

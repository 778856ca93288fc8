"""Higgs Audio v2 / Higgs TTS 3 as the family contract's parts (a directory written by
`onnx-tts export higgs`).

Options: `reference_text` (the transcript of a cloned voice's reference: v2 puts it in the
user turn before the reference audio, v3 after <|ref_text|>), `scene` (v2's scene
description), `max_chunk_tokens`, `max_new_tokens`, and v2's repetition-aware resampling
(`ras_window`, 0 = off, and `ras_max_repeat`). Generic sampling: temperature, top_k, top_p.

The codec decoder is stateless and non-causal: streams are vocoded in overlapping windows of
frames (left context re-decoded, right context held back; SGLang-Omni's first chunk, stride,
overlap and hold-back by default), and windows of one length of concurrent streams decode in
one call (each comes out exactly as alone: `batches_exactly`, checked in the tests).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from onnx_tts.decoding import CapacityPolicy, SamplingOptions
from onnx_tts.decoding.request import Request
from onnx_tts.errors import AudioError, InputError
from onnx_tts.families.base import (
    Detection,
    LoadSettings,
    Vocoder,
    VocoderCapabilities,
    Voices,
)
from onnx_tts.families.bundled import BundledModel, bundle_encoder
from onnx_tts.families.higgs.layout import FAMILY, HiggsLayout
from onnx_tts.families.higgs.program import HiggsProgram, HiggsRequest
from onnx_tts.families.higgs.sampling import v3_options
from onnx_tts.families.higgs.text import DEFAULT_CHUNK_TOKENS, DEFAULT_SCENE, HiggsText, prompt_rows
from onnx_tts.families.loader import Graph, GraphSet, load_graphs
from onnx_tts.session import Session
from onnx_tts.vocoder import decode_in_batches

CODES = "codes"
MAX_VOICE_FRAMES = 1 << 14


def checked_codes(voice: Mapping[str, Any], layout: HiggsLayout) -> np.ndarray:
    """A voice's reference codes [F, K] (F may be 0): integers in the codec's range."""
    try:
        codes = np.asarray(voice.get(CODES, np.zeros((0, layout.codebooks))))
    except (TypeError, ValueError):
        codes = np.zeros(0, np.float32)
    if (
        (codes.dtype.kind not in "iu" and codes.size)
        or codes.ndim != 2
        or codes.shape[1] != layout.codebooks
        or len(codes) > MAX_VOICE_FRAMES
        or (codes.size and (codes.min() < 0 or codes.max() >= layout.codes))
    ):
        raise AudioError(
            f"voice codes must be integers [frames, {layout.codebooks}] in [0, {layout.codes}); "
            "pass a reference file or the dict Engine.voice() returned for this model"
        )
    return codes.astype(np.int64)


class HiggsVoices(Voices):
    def __init__(self, encoder, layout: HiggsLayout) -> None:
        super().__init__(encoder, lambda: {CODES: np.zeros((0, layout.codebooks), np.int64)})
        self.layout = layout

    def check_encoded(self, voice: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return {CODES: checked_codes(voice, self.layout)}


class HiggsCodec(Vocoder):
    """codes [F, K] -> mono float32 [F * hop] through the decoder graph."""

    def __init__(self, decoder: Session, layout: HiggsLayout, sample_rate: int) -> None:
        self.decoder, self.layout = decoder, layout
        self.capabilities = VocoderCapabilities(
            sample_rate, layout.hop_length, channels=1, batches_exactly=True
        )

    def _run(self, batch: np.ndarray) -> np.ndarray:
        codes = np.clip(np.asarray(batch, np.int64), 0, self.layout.codes - 1)
        return self.decoder.run({"codes": codes})["audio"]

    def vocode(self, frames: np.ndarray, voice: Mapping[str, np.ndarray] | None = None):
        frames = np.asarray(frames, np.int64).reshape(-1, self.layout.codebooks)
        if not len(frames):
            return np.zeros(0, np.float32)
        return np.asarray(self._run(frames[None])[0], np.float32)

    def vocode_windows(
        self, windows: Sequence[np.ndarray], voices: Sequence[Mapping[str, np.ndarray]]
    ) -> list[np.ndarray]:
        return decode_in_batches(windows, self._run, self.layout.hop_length)


class HiggsModel(BundledModel):
    """A Higgs model directory (module docstring)."""

    sampling_keys = ("temperature", "top_k", "top_p")

    def __init__(self, detection: Detection, settings: LoadSettings, **options: Any) -> None:
        bundle = detection.inspected
        self.bundle = bundle
        layout = HiggsLayout.read(bundle)
        self.layout = layout
        declared = {
            "encoder": Graph(bundle.graph_path("encoder"), "encoder"),
            "embed": Graph(bundle.graph_path("embed"), "decode"),
            "lm": Graph(bundle.graph_path("lm"), "decode"),
            "head": Graph(bundle.graph_path("head"), "decode"),
            "decoder": Graph(bundle.graph_path("decoder"), "vocoder"),
        }
        graphs = load_graphs(
            GraphSet(declared, lm="lm", capacity=CapacityPolicy(None, layout.positions)),
            settings,
        )
        encoder = bundle_encoder(bundle, graphs["encoder"], layout.hop_length, (CODES,))
        self.text_frontend = HiggsText(bundle.path("text", "tokenizer"), layout)
        super().__init__(
            family=FAMILY,
            text=self.text_frontend,
            voices=HiggsVoices(encoder, layout),
            program=HiggsProgram(
                layout, graphs.lm, graphs["embed"], graphs["head"], self._program_request
            ),
            vocoder=HiggsCodec(graphs["decoder"], layout, bundle.sample_rate),
            graphs=graphs,
            streaming_defaults=layout.streaming,
        )
        self.load_options = self._checked(options, "load")

    # -- options ------------------------------------------------------------------------------
    def _checked(self, options: Mapping[str, Any], scope: str) -> dict[str, Any]:
        from onnx_tts.families.higgs import REGISTRY_ENTRY

        return REGISTRY_ENTRY.check_options(options, scope)  # type: ignore[arg-type]

    def request_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        if options.get("_resolved"):
            return dict(options)
        given = {**self.load_options, **self._checked(options, "request")}
        s = self.layout.sampling
        return {
            "_resolved": True,
            "reference_text": given.get("reference_text"),
            "scene": given.get("scene", DEFAULT_SCENE),
            "max_chunk_tokens": int(given.get("max_chunk_tokens", DEFAULT_CHUNK_TOKENS)),
            "max_new_tokens": int(given.get("max_new_tokens", self.layout.max_new_tokens)),
            "ras_window": int(given.get("ras_window", s.ras_window)),
            "ras_max_repeat": int(given.get("ras_max_repeat", s.ras_max_repeat)),
        }

    def sampling_defaults(self) -> SamplingOptions:
        s = self.layout.sampling
        return SamplingOptions(s.temperature, s.top_k, s.top_p or 1.0, 1.0).checked()

    # -- generation ---------------------------------------------------------------------------
    def _program_request(self, request: Request) -> HiggsRequest:
        options = self.request_options(request.options)
        codes = checked_codes(request.voice, self.layout)
        rows, prefix, reference_rows = prompt_rows(
            self.text_frontend,
            str(request.chunk),
            codes,
            options["reference_text"],
            options["scene"],
        )
        room = self.layout.positions - len(rows)
        if room < 1:
            raise InputError(
                f"the prompt takes {len(rows)} positions, the model holds {self.layout.positions}:"
                " use a shorter reference or a shorter text (max_chunk_tokens)"
            )
        sampling = request.sampling
        if self.layout.version == "v3":
            sampling = v3_options(sampling)
        return HiggsRequest(
            rows=rows,
            prefix=prefix,
            reference_rows=reference_rows,
            sampling=sampling,
            ras_window=options["ras_window"] if self.layout.version == "v2" else 0,
            ras_max_repeat=options["ras_max_repeat"],
            max_new_tokens=min(options["max_new_tokens"], room),
        )

    def info(self) -> dict[str, Any]:
        return {
            "family": FAMILY,
            "name": self.bundle.name,
            "path": str(self.bundle.root),
            "sample_rate": self.sample_rate,
            "frame_rate": self.layout.frame_rate,
            "kv_mode": self.kv_mode,
            **self.layout.describe(),
            "sampling": vars(self.layout.sampling),
            "streaming": self.streaming_defaults,
            "checks": self.bundle.manifest.get("checks", {}),
            "graphs": self.graphs.describe(),
        }


__all__ = ["CODES", "HiggsCodec", "HiggsModel", "HiggsVoices", "checked_codes"]

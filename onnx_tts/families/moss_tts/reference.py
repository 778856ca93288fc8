"""References of a moss-tts model: the canonical batch-of-1 encode through the MOSS audio
tokenizer (`codec/`, read by this family's `codec` module), and the published preparation.

A reference arrives at the codec's rate (Voices.read resamples files). Its canonical form, what
the reference cache keys and the codec encodes, is the codec's `prepare_reference`: the
channels the release takes (Local v1.5: stereo, a mono reference duplicated; Local v1 and
Delay: mono, the mean of the channels), loudness-normalized as the published processors do (to
-20 dBFS, the gain clamped to +-3 dB), channel-major and flat. The codes are the codec's n_vq
quantizers (the export keeps that many), [frames, n_vq].
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from onnx_tts.audio import MAX_REFERENCE_PEAK, SILENCE_PEAK
from onnx_tts.encoder import VoiceEncoder
from onnx_tts.errors import AudioError, InputError, ModelError
from onnx_tts.families.loader import Graph, LoadedGraphs
from onnx_tts.families.moss_tts.layout import MossLayout

CODES = "codes"
MIN_SECONDS = 0.5
MAX_SECONDS = 60.0


class _Encode:
    """The codec's encode as the VoiceEncoder sees a graph: `audio` [1, C x N] -> `codes`
    [1, F, n_vq] int64."""

    output_names = (CODES,)
    outputs = ()

    def __init__(self, codec: Any | None, layout: MossLayout) -> None:
        self.codec, self.layout = codec, layout

    def run(self, feeds: Mapping[str, np.ndarray], output_names=None) -> dict[str, np.ndarray]:
        if self.codec is None:
            raise ModelError(
                f"{self.layout.root} was exported without a codec, so it cannot encode a "
                "reference; re-export with --codec CODEC_DIR"
            )
        flat = np.asarray(feeds["audio"], np.float32)
        channels = self.layout.channels
        if flat.ndim != 2 or flat.shape[0] != 1 or flat.shape[1] % channels:
            raise InputError(f"the reference must be one flat [1, {channels} x N] array")
        codes = np.asarray(self.codec.encode(flat.reshape(channels, -1)))
        if codes.ndim != 2 or codes.shape[1] < self.layout.n_vq or not len(codes):
            raise ModelError(
                f"the codec encoded a reference to codes {codes.shape}; expected "
                f"[frames, >= {self.layout.n_vq}]"
            )
        return {CODES: codes[None, :, : self.layout.n_vq].astype(np.int64)}


class ReferenceEncoder(VoiceEncoder):
    """The canonical batch-of-1 encode (module docstring)."""

    def __init__(self, layout: MossLayout, codec: Any | None) -> None:
        self.layout, self.codec = layout, codec
        identity = (
            layout.bundle.file_sha256(
                str(layout.bundle.section("graphs").get("codec_encode", "backbone.onnx"))
            )
            or "no-codec"
        )
        super().__init__(
            _Encode(codec, layout),
            bundle_identity=f"{layout.bundle.name}@{layout.bundle.identity}",
            sample_rate=layout.sample_rate,
            settings={
                "channels": layout.channels,
                "n_vq": layout.n_vq,
                "min_seconds": MIN_SECONDS,
                "max_seconds": MAX_SECONDS,
            },
            graph_sha256=identity,
            hop_length=layout.hop_length,
            frame_outputs=(CODES,),
        )

    def validate(self, audio: np.ndarray) -> np.ndarray:
        """The canonical samples (module docstring); AudioError saying what is wrong."""
        waveform = np.asarray(audio)
        if waveform.dtype.kind != "f" or waveform.ndim not in (1, 2):
            raise AudioError(
                f"a reference must be float samples [N] or [channels, N], got "
                f"{waveform.dtype} {waveform.shape}"
            )
        if self.codec is None:
            self._session.run({})  # the one clear error: no codec to encode with
        waveform = np.asarray(waveform[..., : int(MAX_SECONDS * self.sample_rate)], np.float32)
        seconds = waveform.shape[-1] / self.sample_rate
        if seconds < MIN_SECONDS:
            raise AudioError(
                f"the reference is {seconds:.2f} s long; give at least {MIN_SECONDS:g} s of speech"
            )
        if not np.isfinite(waveform).all():
            raise AudioError("the reference contains NaN or infinite samples")
        peak = float(np.abs(waveform).max())
        if peak > MAX_REFERENCE_PEAK:
            raise AudioError(f"the reference peaks at {peak:.3g} (full scale is 1.0); rescale it")
        if peak < SILENCE_PEAK:
            raise AudioError("the reference is silent; give a clip with audible speech")
        # The codec's channels and the published loudness normalization.
        return self.codec.prepare_reference(waveform).reshape(-1)


def codec_parts(layout: MossLayout) -> tuple[dict[str, Graph], Callable[[LoadedGraphs], Any]]:
    """The codec's graphs to load (lazily) and how to build the codec from the loaded
    sessions; none when the model was exported without one."""
    if layout.codec_dir is None:
        return {}, lambda graphs: None
    from onnx_tts.families.moss_tts import codec

    read = codec.read_codec(layout.codec_dir)
    declared = {f"codec_{role}": graph for role, graph in codec.codec_graphs(read).items()}

    def make(graphs: LoadedGraphs) -> Any:
        sessions = {role[len("codec_") :]: graphs.session(role) for role in declared}
        mode = "copy" if graphs.kv_mode == "copy" else "chain"
        return codec.AudioTokenizerCodec(read, sessions, mode)

    return declared, make


__all__ = ["CODES", "ReferenceEncoder", "codec_parts"]

"""Reference-audio encoder: turns a voice sample into speaker-prompt codes and an embedding.

Two paths run the same graph:

* :meth:`VoiceEncoder.encode` is the canonical encode: a batch of exactly one, no
  padding. It is the only path whose outputs may enter the reference cache, which is what
  makes the cache's promise ("same audio content -> same codes") hold whatever the request
  order or batch neighbours.
* :meth:`VoiceEncoder.encode_batch` zero-pads several references into one batch for
  uncached throughput. Padding can change the numbers (normalisation over the padded length,
  convolutions that see the zeros), so its outputs never go into the cache.

Outputs are returned WITHOUT the batch dimension: for the reference bundle ``codes`` is
int64 ``[F, K]`` and ``speaker_embedding`` float32 ``[E]``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from onnx_tts.audio import MAX_REFERENCE_PEAK, SILENCE_PEAK, as_mono_float32, reference_trimmed
from onnx_tts.bundle import file_sha256
from onnx_tts.cache.reference import ReferenceCache, encoder_schema, make_key
from onnx_tts.errors import AudioError, InputError, ModelError

__all__ = ["RunnableSession", "VoiceEncoder", "validate_reference_audio"]

AUDIO_INPUT = "audio"


class RunnableSession(Protocol):
    """What the encoder needs from a session (``onnx_tts.session.Session`` satisfies it)."""

    def run(
        self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]: ...


# A file trimmed by load_audio and resampled may come out a few samples longer than the limit.
TRIM_SLACK_SECONDS = 0.01


def validate_reference_audio(
    audio: np.ndarray,
    sample_rate: int,
    min_seconds: float | None = None,
    max_seconds: float | None = None,
) -> np.ndarray:
    """Check a decoded reference and return it as contiguous float32 mono samples.

    Audio longer than ``max_seconds`` is cut to its first ``max_seconds`` with a
    ReferenceTrimmedWarning (as ``onnx_tts.audio.load_audio`` does), so the cache key covers
    exactly what the encoder sees. Raises ``AudioError`` for multi-channel, non-float,
    non-finite, silent or too short audio, saying how to fix it.
    """
    samples = as_mono_float32(audio)
    seconds = samples.shape[0] / sample_rate
    if min_seconds is not None and seconds < min_seconds:
        raise AudioError(
            f"reference audio is {seconds:.2f} s long; this model needs at least "
            f"{min_seconds:g} s of speech at {sample_rate} Hz"
        )
    if max_seconds is not None and samples.shape[0] > int(max_seconds * sample_rate):
        samples = samples[: int(max_seconds * sample_rate)]
        if seconds > max_seconds + TRIM_SLACK_SECONDS:  # not a file load_audio already cut
            reference_trimmed(seconds, max_seconds)
    if samples.size and not np.isfinite(samples).all():
        raise AudioError("reference audio contains NaN or infinite samples; re-export the file")
    peak = float(np.max(np.abs(samples))) if samples.size else 0.0
    if peak > MAX_REFERENCE_PEAK:
        # As for files (audio.load_audio): 1e30 is a broken buffer, not a loud voice.
        raise AudioError(
            f"reference audio peaks at {peak:.3g} (full scale is 1.0); scale the samples to [-1, 1]"
        )
    if peak < SILENCE_PEAK:
        raise AudioError("reference audio is silent; give a clip with audible speech")
    return samples


class VoiceEncoder:
    """Runs the encoder graph (``audio`` f32 [B, N] -> per-item outputs).

    Args:
        session: a loaded encoder graph with ``run(feeds, output_names=None) -> dict``;
            normally ``onnx_tts.session.Session``.
        bundle_identity: stable name of the bundle, e.g. ``"onnx-tts-reference@1"``.
        sample_rate: the rate the graph expects; callers resample to it before encoding.
        settings: encoder settings that affect the outputs (the bundle's ``encoder``
            section: ``min_seconds``, ``max_seconds``, ...). Must be JSON-serialisable; they
            are part of :attr:`identity`.
        graph_path: the encoder ``.onnx`` file, hashed into :attr:`identity`.
        graph_sha256: its hex sha256, if already known (e.g. from ``bundle.json``); one of
            ``graph_path`` / ``graph_sha256`` is required.
        hop_length: samples per output frame (``F = N // hop_length``); needed by
            :meth:`encode_batch` to cut each item's frames out of the padded batch.
        frame_outputs: outputs whose axis 1 (after the batch axis) counts frames.
        input_name: name of the audio input.
    """

    def __init__(
        self,
        session: RunnableSession,
        bundle_identity: str,
        sample_rate: int,
        settings: Mapping[str, Any],
        *,
        graph_path: str | os.PathLike[str] | None = None,
        graph_sha256: str | None = None,
        hop_length: int | None = None,
        frame_outputs: Sequence[str] = ("codes",),
        input_name: str = AUDIO_INPUT,
    ) -> None:
        if not bundle_identity:
            raise InputError("bundle_identity must be a non-empty string, e.g. 'name@version'")
        if not isinstance(sample_rate, int) or sample_rate <= 0:
            raise InputError(f"sample_rate must be a positive int, got {sample_rate!r}")
        if hop_length is not None and (not isinstance(hop_length, int) or hop_length <= 0):
            raise InputError(f"hop_length must be a positive int, got {hop_length!r}")
        if graph_sha256 is None:
            if graph_path is None:
                graph_path = getattr(session, "path", None)
            if graph_path is None:
                raise InputError(
                    "VoiceEncoder needs graph_path or graph_sha256 to identify the encoder"
                )
            graph_sha256 = file_sha256(graph_path)
        try:
            settings_json = json.dumps(dict(settings), sort_keys=True, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise InputError(f"encoder settings must be JSON-serialisable: {exc}") from exc

        self._session = session
        # The names an encode returns: what an already-encoded voice must carry.
        self.output_names = tuple(getattr(session, "output_names", ()))
        # What a cached encode must be: these outputs, as the graph declares them.
        self.schema = encoder_schema(getattr(session, "outputs", ()), self.output_names)
        self._input_name = input_name
        self._frame_outputs = frozenset(frame_outputs)
        self.bundle_identity = bundle_identity
        self.sample_rate = sample_rate
        self.settings = json.loads(settings_json)
        self.graph_sha256 = graph_sha256
        self.hop_length = hop_length
        self.min_seconds = _optional_float(self.settings, "min_seconds")
        self.max_seconds = _optional_float(self.settings, "max_seconds")
        # The runtime version, execution providers and graph optimisation level are part of
        # the identity: each can shift float outputs, and a hit must equal what this process
        # would compute (a Redis tier may be shared by CPU and GPU servers).
        self.identity = json.dumps(
            {
                "bundle": bundle_identity,
                "encoder_sha256": graph_sha256,
                "execution": _execution_settings(session),
                "runtime": _runtime_version(),
                "sample_rate": sample_rate,
                "settings": self.settings,
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    # -- canonical path ------------------------------------------------------------------------

    def validate(self, audio: np.ndarray) -> np.ndarray:
        """The reference as float32 mono samples, or ``AudioError`` saying what is wrong."""
        return validate_reference_audio(audio, self.sample_rate, self.min_seconds, self.max_seconds)

    def key(self, audio: np.ndarray) -> str:
        """Reference-cache key of ``audio`` (validated) for this encoder."""
        return make_key(self.identity, self.validate(audio))

    def encode(self, audio: np.ndarray) -> dict[str, np.ndarray]:
        """Canonical encode: one reference, batch of 1, no padding; batch axis removed."""
        return self._encode_canonical(self.validate(audio))

    def encode_cached(self, audio: np.ndarray, cache: ReferenceCache) -> dict[str, np.ndarray]:
        """:meth:`encode` through ``cache``: the value a hit returns is the solo encode, and a
        cached value that is not this encoder's output (:attr:`schema`) is recomputed.

        Returned arrays are read-only; copy before writing.
        """
        samples = self.validate(audio)
        key = make_key(self.identity, samples)
        return cache.get_or_compute(key, lambda: self._encode_canonical(samples), self.schema)

    def _encode_canonical(self, samples: np.ndarray) -> dict[str, np.ndarray]:
        """The encode of samples already in their canonical form (what `validate` returns:
        validating them again need not be a no-op, e.g. for a multichannel reference)."""
        outputs = self._run(samples[None, :])
        return {name: np.require(value[0], requirements="C") for name, value in outputs.items()}

    # -- batched path (never cached) -----------------------------------------------------------

    def encode_batch(self, audios: Sequence[np.ndarray]) -> list[dict[str, np.ndarray]]:
        """Encode several references in one zero-padded batch; batch axis removed per item.

        Frame outputs are cut to each item's own ``len // hop_length`` frames. Results may
        differ numerically from :meth:`encode` and must not be written to the cache.
        """
        if not audios:
            return []
        if self.hop_length is None:
            raise InputError("encode_batch needs hop_length (bundle codec.hop_length)")
        samples = [self.validate(a) for a in audios]
        longest = max(s.shape[0] for s in samples)
        batch = np.zeros((len(samples), longest), dtype=np.float32)
        for row, item in enumerate(samples):
            batch[row, : item.shape[0]] = item
        outputs = self._run(batch)
        results = []
        for row, item in enumerate(samples):
            frames = item.shape[0] // self.hop_length
            result = {}
            for name, value in outputs.items():
                piece = value[row]
                if name in self._frame_outputs:
                    piece = piece[:frames]
                result[name] = np.require(piece, requirements="C")
            results.append(result)
        return results

    # -- internals -----------------------------------------------------------------------------

    def _run(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        outputs = self._session.run({self._input_name: batch})
        for name, value in outputs.items():
            if value.ndim == 0 or value.shape[0] != batch.shape[0]:
                raise ModelError(
                    f"encoder output {name!r} has shape {value.shape}; expected a leading batch "
                    f"axis of {batch.shape[0]}"
                )
        return dict(outputs)


def _optional_float(settings: Mapping[str, Any], name: str) -> float | None:
    value = settings.get(name)
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError) as exc:
        raise InputError(f"encoder setting {name!r} must be a number, got {value!r}") from exc


def _execution_settings(session: RunnableSession) -> dict[str, Any]:
    options = getattr(session, "options", None)
    return {
        "providers": list(getattr(options, "providers", ()) or ()),
        "graph_optimization_level": str(getattr(options, "graph_optimization_level", "")),
    }


def _runtime_version() -> str:
    # The version of the library the session core loaded; fall back to package metadata so
    # that building an identity never imports a second ONNX Runtime into the process.
    try:
        from onnx_tts.session import ort_version

        return f"onnxruntime-{ort_version()}"
    except Exception:
        pass
    from importlib import metadata

    for dist in ("onnxruntime", "onnxruntime-gpu"):
        try:
            return f"onnxruntime-{metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return "onnxruntime-unknown"

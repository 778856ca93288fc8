"""Export a MOSS-Audio-Tokenizer checkpoint directory (v1 or v2) to three ONNX graphs and
`codec.json`, each graph checked against the torch module it came from.

    encode.onnx       waveform f32 [B, C, N] -> audio_codes i64 [Q, B, N // hop]
    decode.onnx       audio_codes i64 [Q, B, F] -> audio f32 [B, C, F * hop]
    decode_step.onnx  audio_codes i64 [Q, B, S] (new frames) + state -> audio f32
                      [B, C, S * hop] + next state; the state of one stream is, per decoder
                      transformer, `state_offset_{t}` i64 [B] (steps decoded so far) and, per
                      attention layer, `state_keys_{k}` / `state_values_{k}` f32
                      [B, heads, context, head_dim] (the window before the chunk); each output
                      `next_*` is the next step's input of the same name.

The checkpoint is read by name into the project's modules (nothing from the checkpoint runs);
weight norm is folded into plain weights before tracing. decode.onnx computes the whole
sequence with the sliding window (memory grows with F^2, so a runtime decodes at most
`whole_decode_frames` at once and streams longer inputs through decode_step, which gives the
same audio). Weights live in `encoder.data` and `decoder.data` (decode and decode_step share
theirs).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from export.checkpoint import Checkpoint, CheckpointError
from export.graph_files import export_graph, remove_torch_sidecars, share_external_data
from export.moss_audio_tokenizer.config import CodecSpec, codec_spec
from export.moss_audio_tokenizer.modules import AudioTokenizer
from onnx_tts.errors import ModelError

CODEC_JSON = "codec.json"
FILES = {"encode": "encode.onnx", "decode": "decode.onnx", "decode_step": "decode_step.onnx"}
ENCODER_DATA, DECODER_DATA = "encoder.data", "decoder.data"
FORMAT_VERSION = 1
# The export refuses graphs further from torch than this (relative to the audio's peak); the
# report gives the measured differences (about 1e-6 in float32).
DECODE_RTOL = 1e-4
WHOLE_DECODE_BYTES = 128 << 20  # the largest attention score tensor of one whole decode
MAX_WHOLE_DECODE_FRAMES = 4500  # 6 minutes at 12.5 frames/s
CHUNKS = (1, 2, 3)  # frames per decode_step call in the streaming check, in turn


class ExportCheckError(ModelError):
    """An exported graph does not compute what its torch module computes."""


def load_codec(codec_dir: str | os.PathLike[str]) -> AudioTokenizer:
    """The torch reference of a codec checkpoint directory: the project's modules with the
    checkpoint's tensors loaded by name (weight norm kept as published). CheckpointError names
    every missing or mis-shaped tensor at once."""
    with Checkpoint(codec_dir, "codec checkpoint") as checkpoint:
        module = AudioTokenizer(codec_spec(checkpoint.config))
        checkpoint.load_into(module)
        module.unread = checkpoint.unread()  # reported by the export
    return module.eval()


# -- graph wrappers ----------------------------------------------------------------------------
class _Encode(nn.Module):
    def __init__(self, codec: AudioTokenizer, quantizers: int) -> None:
        super().__init__()
        self.codec, self.quantizers = codec, quantizers

    def forward(self, waveform: torch.Tensor) -> torch.Tensor:
        return self.codec.encode(waveform, self.quantizers)


class _Decode(nn.Module):
    def __init__(self, codec: AudioTokenizer) -> None:
        super().__init__()
        self.codec = codec

    def forward(self, audio_codes: torch.Tensor) -> torch.Tensor:
        return self.codec.decode(audio_codes)


class _DecodeStep(nn.Module):
    def __init__(self, codec: AudioTokenizer) -> None:
        super().__init__()
        self.codec = codec
        self.transformers = len(codec.spec.decoder_transformers())

    def forward(self, audio_codes: torch.Tensor, *state: torch.Tensor) -> tuple:
        offsets, flat = list(state[: self.transformers]), state[self.transformers :]
        caches = [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
        audio, offsets, caches = self.codec.decode_step(audio_codes, offsets, caches)
        return (audio, *offsets, *(t for cache in caches for t in cache))


def state_entries(spec: CodecSpec) -> list[dict[str, Any]]:
    """codec.json's `state`: decode_step's state tensors in input order, for one stream."""
    entries: list[dict[str, Any]] = []
    for index, _ in enumerate(spec.decoder_transformers()):
        entries.append(_state("offset", index, "int64", [1]))
    layer = 0
    for _, transformer, _ in spec.decoder_transformers():
        shape = [1, transformer.heads, transformer.context, transformer.head_dim]
        for _ in range(transformer.layers):
            entries.append(_state("keys", layer, "float32", shape))
            entries.append(_state("values", layer, "float32", shape))
            layer += 1
    return entries


def _state(kind: str, index: int, dtype: str, shape: list[int]) -> dict[str, Any]:
    return {
        "input": f"state_{kind}_{index}",
        "output": f"next_{kind}_{index}",
        "dtype": dtype,
        "shape": shape,
        "fill": 0,
    }


def whole_decode_frames(spec: CodecSpec) -> int:
    """Frames a runtime gives decode.onnx at once (longer inputs stream through decode_step,
    which gives the same audio): at least the shortest decoder window (10 s as published),
    more while every attention's scores stay within WHOLE_DECODE_BYTES."""
    stages = spec.decoder_transformers()
    window = min(t.context // steps for _, t, steps in stages)
    budget = min(
        math.isqrt(WHOLE_DECODE_BYTES // (4 * t.heads * steps * steps)) for _, t, steps in stages
    )
    return max(1, min(max(window, budget), MAX_WHOLE_DECODE_FRAMES))


def _check_frames(spec: CodecSpec, stages: list[tuple[int, Any, int]]) -> int:
    """Frames that make every window of `stages` slide (its context and a few more)."""
    return max(math.ceil(t.context / steps) for _, t, steps in stages) + 3


def check_waveform(spec: CodecSpec, frames: int, seed: int = 0) -> np.ndarray:
    """A deterministic test signal [1, C, frames * hop + hop / 3] (tones and noise)."""
    rng = np.random.default_rng(seed)
    samples = frames * spec.hop + spec.hop // 3
    t = np.arange(samples) / spec.sample_rate
    channels = []
    for _ in range(spec.channels):
        tones = sum(
            rng.uniform(0.05, 0.2)
            * np.sin(2 * np.pi * rng.uniform(80, 4000) * t + rng.uniform(0, 6))
            for _ in range(4)
        )
        channels.append(tones + 0.02 * rng.standard_normal(samples))
    return np.stack(channels)[None].astype(np.float32)


# -- ORT checks --------------------------------------------------------------------------------
def _session(path: Path) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _difference(got: np.ndarray, want: np.ndarray, what: str) -> dict[str, float]:
    if got.shape != want.shape:
        raise ExportCheckError(f"{what} gives shape {got.shape}, torch {want.shape}")
    peak = float(np.abs(want).max()) or 1.0
    diff = float(np.abs(got.astype(np.float64) - want).max()) if got.size else 0.0
    return {"max_abs_diff": diff, "max_rel_diff": diff / peak, "peak": peak}


def _stream(session: Any, codes: np.ndarray, entries: list[dict[str, Any]]) -> np.ndarray:
    """decode_step over `codes` [Q, B, F] in chunks of CHUNKS frames in turn."""
    batch = codes.shape[1]
    state = {e["input"]: np.zeros([batch, *e["shape"][1:]], np.dtype(e["dtype"])) for e in entries}
    outputs = ["audio", *(e["output"] for e in entries)]
    pieces, start, turn = [], 0, 0
    while start < codes.shape[2]:
        size = CHUNKS[turn % len(CHUNKS)]
        results = session.run(outputs, {"audio_codes": codes[:, :, start : start + size], **state})
        pieces.append(results[0])
        state = {e["input"]: value for e, value in zip(entries, results[1:], strict=True)}
        start, turn = start + size, turn + 1
    return np.concatenate(pieces, axis=2)


def check_graphs(
    directory: Path, spec: CodecSpec, quantizers: int, reference: dict[str, np.ndarray]
) -> dict[str, Any]:
    """Each graph of `directory` run with ONNX Runtime against the torch outputs `reference`."""
    entries = state_entries(spec)
    report: dict[str, Any] = {}
    encoded = _session(directory / FILES["encode"]).run(None, {"waveform": reference["waveform"]})
    codes = encoded[0]
    want = reference["codes"]
    if codes.shape != want.shape:
        raise ExportCheckError(f"encode.onnx gives codes {codes.shape}, torch {want.shape}")
    mismatched = int((codes != want).sum())
    report["encode"] = {
        "frames": int(codes.shape[2]),
        "mismatched_codes": mismatched,
        "codes_equal": mismatched == 0,
    }
    audio = _session(directory / FILES["decode"]).run(
        None, {"audio_codes": reference["decode_codes"]}
    )
    report["decode"] = {
        "frames": int(reference["decode_codes"].shape[2]),
        **_difference(audio[0], reference["audio"], "decode.onnx"),
    }
    streamed = _stream(
        _session(directory / FILES["decode_step"]), reference["decode_codes"], entries
    )
    report["decode_step"] = {
        "frames": int(reference["decode_codes"].shape[2]),
        "chunks": list(CHUNKS),
        **_difference(streamed, reference["audio"], "decode_step.onnx (streamed)"),
    }
    if mismatched > codes.size // 1000:
        raise ExportCheckError(
            f"encode.onnx gives {mismatched} of {codes.size} codes other than torch's"
        )
    for role in ("decode", "decode_step"):
        if report[role]["max_rel_diff"] > DECODE_RTOL:
            raise ExportCheckError(
                f"{FILES[role]} differs from torch's decode by {report[role]['max_rel_diff']:.3g} "
                f"of the peak (at most {DECODE_RTOL:g})"
            )
    return report


# -- export ------------------------------------------------------------------------------------
def _remove_weight_norm(module: nn.Module) -> None:
    from torch.nn.utils import parametrize

    for child in module.modules():
        if parametrize.is_parametrized(child, "weight"):
            parametrize.remove_parametrizations(child, "weight", leave_parametrized=True)


def _export_graphs(codec: AudioTokenizer, directory: Path, quantizers: int) -> None:
    spec = codec.spec
    entries = state_entries(spec)
    frames = 2
    waveform = torch.zeros((1, spec.channels, frames * spec.hop))
    codes = torch.zeros((quantizers, 1, frames), dtype=torch.int64)
    batch_codes = {"audio_codes": {1: "batch", 2: "frames"}}
    audio = {"audio": {0: "batch", 2: "samples"}}
    export_graph(
        _Encode(codec, quantizers),
        (waveform,),
        directory / FILES["encode"],
        ["waveform"],
        ["audio_codes"],
        {"waveform": {0: "batch", 2: "samples"}, **batch_codes},
    )
    export_graph(
        _Decode(codec),
        (codes,),
        directory / FILES["decode"],
        ["audio_codes"],
        ["audio"],
        {**batch_codes, **audio},
    )
    offsets, caches = codec.initial_state(1)
    state = (*offsets, *(t for cache in caches for t in cache))
    export_graph(
        _DecodeStep(codec),
        (codes, *state),
        directory / FILES["decode_step"],
        ["audio_codes", *(e["input"] for e in entries)],
        ["audio", *(e["output"] for e in entries)],
        {
            **batch_codes,
            **audio,
            **{e["input"]: {0: "batch"} for e in entries},
            **{e["output"]: {0: "batch"} for e in entries},
        },
    )
    share_external_data([directory / FILES["encode"]], ENCODER_DATA)
    share_external_data(
        [directory / FILES["decode"], directory / FILES["decode_step"]], DECODER_DATA
    )
    remove_torch_sidecars(directory, (ENCODER_DATA, DECODER_DATA))


def _reference(codec: AudioTokenizer, quantizers: int, seed: int) -> dict[str, np.ndarray]:
    spec = codec.spec
    encode_frames = _check_frames(spec, spec.encoder_transformers())
    decode_frames = _check_frames(spec, spec.decoder_transformers())
    waveform = check_waveform(spec, encode_frames, seed)
    rng = np.random.default_rng(seed + 1)
    decode_codes = rng.integers(0, spec.quantizer.codebook_size, (quantizers, 1, decode_frames))
    with torch.no_grad():
        codes = codec.encode(torch.from_numpy(waveform), quantizers).numpy()
        audio = codec.decode(torch.from_numpy(decode_codes)).numpy()
    return {"waveform": waveform, "codes": codes, "decode_codes": decode_codes, "audio": audio}


def codec_json(spec: CodecSpec, quantizers: int, source: str, report: dict) -> dict[str, Any]:
    return {
        "format": "onnx-tts audio tokenizer",
        "format_version": FORMAT_VERSION,
        "source": {"checkpoint": source, "layout": spec.version},
        "sample_rate": spec.sample_rate,
        "channels": spec.channels,
        "hop_length": spec.hop,
        "quantizers": quantizers,
        "codebook_size": spec.quantizer.codebook_size,
        "whole_decode_frames": whole_decode_frames(spec),
        "files": dict(FILES),
        "external_data": {
            FILES["encode"]: [ENCODER_DATA],
            FILES["decode"]: [DECODER_DATA],
            FILES["decode_step"]: [DECODER_DATA],
        },
        "state": state_entries(spec),
        "check": report,
    }


def export_codec(
    codec_dir: Path, out_dir: Path, *, quantizers: int | None = None, seed: int = 0
) -> dict[str, Any]:
    """Write `out_dir` (must not exist, or be empty): codec.json and the three graphs, each
    checked against the torch module; returns the check report (differences per graph)."""
    codec_dir, out_dir = Path(codec_dir), Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise CheckpointError(f"{out_dir} exists and is not an empty directory; pick a new one")
    started = time.perf_counter()
    codec = load_codec(codec_dir)
    spec = codec.spec
    total = spec.quantizer.quantizers
    quantizers = total if quantizers is None else quantizers
    if (
        isinstance(quantizers, bool)
        or not isinstance(quantizers, int)
        or not 1 <= quantizers <= total
    ):
        raise CheckpointError(
            f"quantizers must be an integer in [1, {total}] (the checkpoint's num_quantizers), "
            f"got {quantizers!r}"
        )
    reference = _reference(codec, quantizers, seed)
    _remove_weight_norm(codec)
    codec.quantizer.fold_lookup(quantizers)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        with torch.no_grad():
            _export_graphs(codec, staging, quantizers)
        report = check_graphs(staging, spec, quantizers, reference)
        report["unread_tensors"] = list(codec.unread)
        report["seconds"] = round(time.perf_counter() - started, 1)
        payload = codec_json(spec, quantizers, codec_dir.name, report)
        (staging / CODEC_JSON).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        umask = os.umask(0o22)
        os.umask(umask)
        staging.chmod(0o777 & ~umask)  # mkdtemp made it private; the result is an ordinary dir
        if out_dir.exists():
            out_dir.rmdir()
        staging.rename(out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return report


__all__ = [
    "CODEC_JSON",
    "DECODE_RTOL",
    "FILES",
    "ExportCheckError",
    "check_waveform",
    "codec_json",
    "export_codec",
    "load_codec",
    "state_entries",
    "whole_decode_frames",
]

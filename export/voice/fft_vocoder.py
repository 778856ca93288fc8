"""Rebuild a phoneme-mel bundle's vocoder in the FFT form, from the weights inside it (issue 28).

    python -m export.voice.fft_vocoder onnx_tts/models/voice [--out DIR] [--check-sentences 3]

The vocoder graph holds everything it was built from: the mel statistics, the neural
vocoder's weights (Griffin-Lim's starting phase, or the whole vocoder) and, in bundle.json, the
Griffin-Lim settings. This reads them back, proves they are complete by rebuilding the graph
in its own form (Conv or FFT) and getting the same bytes, builds the FFT form, checks that it
gives the same audio as the old graph on mels of the bundle's own speech (to float rounding:
at least MIN_SNR_DB), and writes the bundle with the new vocoder.onnx and bundle.json (sha256
of every file); encoder, embed and LM are kept byte for byte. No training checkpoint needed.
A bundle already in the FFT form is left as it is.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from export.voice import bundle as voice_bundle
from export.voice.codec import MEL_CONFIG
from export.voice.evaluate import snr_db
from export.voice.fft import FFTPlan
from onnx_tts.errors import ModelError

# The FFT form must reproduce the old graph's audio to float rounding; measured 83-90 dB on
# the default voice (benchmarks/README_voice.md), so 60 dB leaves room and still catches any
# real difference.
MIN_SNR_DB = 60.0
CHECK_SENTENCES = (
    "The weather was cold, so we stayed inside and read books.",
    "Please put the green cup on the kitchen table.",
    "My brother found a small dog near the river yesterday.",
)


@dataclass(frozen=True)
class BundleVocoder:
    """What a bundle's vocoder graph was built from."""

    kind: str  # bundle.json vocoder.kind: "griffin-lim" or "neural"
    dft: str  # the form the graph is in now
    stats: dict  # mel mean / std (Griffin-Lim only)
    settings: voice_bundle.VocoderConfig | None  # Griffin-Lim only
    network: object | None  # export.voice.vocoder.NeuralVocoder, if the graph has one
    section: dict
    streaming: dict

    def build(self, dft: str) -> voice_bundle.VocoderParts:
        if self.kind == "neural":
            graph = voice_bundle.build_neural_vocoder_graph(self.network, dft)
        else:
            assert self.settings is not None
            graph = voice_bundle.build_vocoder_graph(
                MEL_CONFIG, self.stats, self.settings, self.network, dft
            )
        return voice_bundle.VocoderParts(graph, dict(self.section, dft=dft), dict(self.streaming))


def read_bundle_vocoder(bundle_dir: Path) -> BundleVocoder:
    """The vocoder of a phoneme-mel bundle, from its graph's initializers and bundle.json.
    Raises ModelError for a bundle this cannot rebuild."""
    manifest = voice_bundle.read_manifest(bundle_dir)
    if manifest.get("family") != "phoneme-mel":
        raise ModelError(
            f"{bundle_dir} is a {manifest.get('family')!r} bundle: only phoneme-mel vocoders "
            "are rebuilt here"
        )
    section = dict(manifest["vocoder"])
    kind = section.get("kind")
    if kind not in ("griffin-lim", "neural"):
        raise ModelError(f"{bundle_dir}: unknown vocoder kind {kind!r}")
    values = voice_bundle.bundle_initializers(bundle_dir, manifest, "vocoder")
    dft = "conv" if "istft.kernel" in values else "fft"
    network = _network(values, dft, manifest["frames"]["hop_length"])
    if kind == "neural" and network is None:
        raise ModelError(f"{bundle_dir}: a neural vocoder graph without the network's weights")
    settings, stats = None, {}
    if kind == "griffin-lim":
        settings = voice_bundle.VocoderConfig(
            iterations=int(section["griffin_lim_iterations"]),
            power=float(section.get("griffin_lim_power", 1.0)),
        )
        stats = {
            "mean": values["mel.mean"].astype(np.float64).tolist(),
            "std": values["mel.std"].astype(np.float64).tolist(),
        }
    section.pop("dft", None)
    return BundleVocoder(kind, dft, stats, settings, network, section, manifest["streaming"])


def _network(values: dict[str, np.ndarray], dft: str, hop: int) -> object | None:
    """The NeuralVocoder whose weights the graph holds (None for Griffin-Lim from the hash)."""
    if "embed.weight" not in values:
        return None
    import torch

    from export.voice.vocoder import NeuralVocoder, VocoderNetConfig

    blocks = sum(1 for name in values if name.endswith(".gamma"))
    hidden, n_mels, kernel = values["embed.weight"].shape
    head_w, head_b = values["head.weight"], values["head.bias"]
    if dft == "conv":  # the head gives log-magnitude and phase of n_fft / 2 + 1 bins
        n_fft = head_b.shape[0] - 2
    else:  # the head's columns are in the FFT spectrum's bin order: put them back
        rows, cols2 = values["istft.synthesis_cols"].shape[:2]
        plan = FFTPlan(rows * cols2 // 2, hop, cols2 // 2)
        n_fft = plan.n_fft
        halves = np.split(head_w, 2, axis=1), np.split(head_b, 2)
        head_w = np.concatenate([plan.from_spectrum_order(h, axis=1) for h in halves[0]], 1)
        head_b = np.concatenate([plan.from_spectrum_order(h, axis=0) for h in halves[1]])
    cfg = VocoderNetConfig(
        n_mels=n_mels,
        hidden=hidden,
        intermediate=values["block0/pw1.weight"].shape[1],
        blocks=blocks,
        kernel=kernel,
        hop=hop,
        n_fft=n_fft,
    )
    state = {
        "embed.weight": values["embed.weight"],
        "embed.bias": values["embed.bias"],
        "norm.weight": values["embed/Norm.weight"],
        "norm.bias": values["embed/Norm.bias"],
        "final_norm.weight": values["head/Norm.weight"],
        "final_norm.bias": values["head/Norm.bias"],
        "head.weight": head_w.T,
        "head.bias": head_b,
    }
    for i in range(blocks):
        for ours, graph in (("dwconv", "dwconv"), ("norm", "Norm")):
            state[f"blocks.{i}.{ours}.weight"] = values[f"block{i}/{graph}.weight"]
            state[f"blocks.{i}.{ours}.bias"] = values[f"block{i}/{graph}.bias"]
        for layer in ("pw1", "pw2"):  # the graph keeps x @ W: torch's weight transposed
            state[f"blocks.{i}.{layer}.weight"] = values[f"block{i}/{layer}.weight"].T
            state[f"blocks.{i}.{layer}.bias"] = values[f"block{i}/{layer}.bias"]
        state[f"blocks.{i}.gamma"] = values[f"block{i}.gamma"]
    model = NeuralVocoder(cfg).eval()
    model.load_state_dict({k: torch.from_numpy(np.array(v, np.float32)) for k, v in state.items()})
    return model


def speech_mels(bundle_dir: Path, sentences: tuple[str, ...] | list[str]) -> list[np.ndarray]:
    """The mel frames [F, n_mels] the bundle's LM speaks for each sentence (what its vocoder
    sees one-shot), recorded at the engine's vocoder call."""
    import onnx_tts

    engine = onnx_tts.load(str(bundle_dir), cache_dir=None, threads=1)
    mels: list[np.ndarray] = []
    vocode = engine.executor.vocode

    def record(frames: np.ndarray, voice: object) -> np.ndarray:
        mels.append(np.asarray(frames, np.float32).reshape(len(frames), -1))
        return vocode(frames, voice)  # type: ignore[arg-type]

    engine.executor.vocode = record  # type: ignore[method-assign]
    for sentence in sentences:
        engine.synthesize(sentence)
    return mels


def vocoder_session(model: onnx.ModelProto | bytes, threads: int = 1) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    data = model if isinstance(model, bytes) else model.SerializeToString(deterministic=True)
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def compare(old: ort.InferenceSession, new: ort.InferenceSession, mels: list[np.ndarray]) -> dict:
    """Max |new - old| over all mels, and the SNR of the old audio (all clips) against it."""
    olds, news = [], []
    for mel in mels:
        a = old.run(["waveform"], {"mel": mel[None]})[0][0]
        b = new.run(["waveform"], {"mel": mel[None]})[0][0]
        if a.shape != b.shape:
            raise ModelError(f"the FFT vocoder gives {b.shape} samples, the old one {a.shape}")
        olds.append(a)
        news.append(b)
    if not mels:
        return {"clips": 0, "max_abs_diff": 0.0, "snr_db": math.inf}
    before, after = np.concatenate(olds), np.concatenate(news)
    return {
        "clips": len(mels),
        "max_abs_diff": float(np.abs(after.astype(np.float64) - before).max()),
        "snr_db": snr_db(before, after),
    }


def convert(bundle_dir: Path, out_dir: Path | None = None, sentences: int = 3) -> dict:
    """Writes `bundle_dir` (or `out_dir`) with its vocoder in the FFT form; returns what was
    done and measured."""
    bundle_dir = Path(bundle_dir)
    out_dir = Path(out_dir) if out_dir is not None else bundle_dir
    source = read_bundle_vocoder(bundle_dir)
    manifest = voice_bundle.read_manifest(bundle_dir)
    old_bytes = (bundle_dir / manifest["graphs"]["vocoder"]).read_bytes()
    rebuilt = source.build(source.dft).graph.SerializeToString(deterministic=True)
    if rebuilt != old_bytes:
        raise ModelError(
            f"rebuilding {bundle_dir}'s vocoder from its own weights does not give the same "
            f"graph (it was built by other code or settings): not converting it"
        )
    if source.dft == "fft":
        if out_dir != bundle_dir:
            shutil.copytree(bundle_dir, out_dir, dirs_exist_ok=True)
        return {"converted": False, "reason": "the vocoder is already in the FFT form"}
    parts = source.build("fft")
    mels = speech_mels(bundle_dir, CHECK_SENTENCES[:sentences]) if sentences else []
    check = compare(vocoder_session(old_bytes), vocoder_session(parts.graph), mels)
    if mels and check["snr_db"] < MIN_SNR_DB:
        raise ModelError(
            f"the FFT vocoder differs from the old one by {check['snr_db']:.1f} dB SNR "
            f"(< {MIN_SNR_DB}): not writing it"
        )
    sizes = voice_bundle.rebundle_with_vocoder(out_dir, bundle_dir, parts)
    return {
        "converted": True,
        "vocoder_bytes": {"before": len(old_bytes), "after": sizes[manifest["graphs"]["vocoder"]]},
        "check": check,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m export.voice.fft_vocoder", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("bundle", type=Path, help="a phoneme-mel bundle directory")
    parser.add_argument("--out", type=Path, help="write here instead of in place")
    parser.add_argument(
        "--check-sentences",
        type=int,
        default=len(CHECK_SENTENCES),
        choices=range(len(CHECK_SENTENCES) + 1),
        help="sentences of the bundle's own speech to compare old and new vocoder on",
    )
    args = parser.parse_args(argv)
    if not (args.bundle / "bundle.json").is_file():
        print(f"error: {args.bundle} has no bundle.json: pass a bundle directory", file=sys.stderr)
        return 2
    try:
        if args.out is not None and args.out.resolve() != args.bundle.resolve():
            # Build beside the target, then move in: no half-written bundle on an error.
            with tempfile.TemporaryDirectory(dir=args.out.parent) as tmp:
                result = convert(args.bundle, Path(tmp) / "bundle", args.check_sentences)
                shutil.copytree(Path(tmp) / "bundle", args.out, dirs_exist_ok=True)
        else:
            result = convert(args.bundle, None, args.check_sentences)
    except ModelError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not result["converted"]:
        print(f"{args.bundle}: {result['reason']}")
        return 0
    check, size = result["check"], result["vocoder_bytes"]
    print(
        f"vocoder.onnx: FFT form, {size['before']:,d} -> {size['after']:,d} bytes; on "
        f"{check['clips']} clips of the bundle's speech: max |diff| {check['max_abs_diff']:.2e}, "
        f"SNR {check['snr_db']:.1f} dB -> {args.out or args.bundle}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["BundleVocoder", "compare", "convert", "read_bundle_vocoder", "speech_mels"]

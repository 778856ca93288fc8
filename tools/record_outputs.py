"""Record the audio of a fixed matrix of requests, or compare against a recording.

    python tools/record_outputs.py record OUT.npz [--work DIR]
    python tools/record_outputs.py compare OLD.npz NEW.npz

Used to prove that a restructuring changed no output (one ORT thread per session, so the
reduction order is the same on every machine): every family (the default voice, the
codec-lm bundle, synthetic Chatterbox Turbo / original with guidance / converted in place),
every KV mode, cloned voices, streamed, batched and result-cached requests. The models are
built into `--work` (deterministic builders), so two recordings made on one machine compare
bit for bit.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

TEXTS = ["Hello there.", "How are you today? Fine, thanks.", "The year 1999 cost $5.20."]


def _models(work: Path) -> dict[str, tuple[Path | None, dict]]:
    """name -> (model dir, load options)."""
    from export import synthetic_chatterbox as synth
    from export.build_codec_lm import build_codec_lm
    from onnx_tts.tools.convert import convert_bundle_inplace_kv

    codec = work / "codec-lm"
    if not (codec / "bundle.json").is_file():
        build_codec_lm(codec, seed=0)
    turbo, original = work / "turbo", work / "original"
    if not turbo.is_dir():
        synth.export(synth.SyntheticConfig(variant="turbo", precisions=("fp32",)), turbo)
    if not original.is_dir():
        synth.export(synth.SyntheticConfig(variant="original", precisions=("fp32",)), original)
    converted = work / "turbo-inplace"
    if not converted.is_dir():
        convert_bundle_inplace_kv(turbo, converted, check=False)
    original_inplace = work / "original-inplace"
    if not original_inplace.is_dir():
        convert_bundle_inplace_kv(original, original_inplace, check=False)
    models: dict[str, tuple[Path | None, dict]] = {}
    for kv in ("inplace", "chain", "copy"):
        models[f"voice-{kv}"] = (None, {"kv": kv})
        models[f"codec-{kv}"] = (codec, {"kv": kv})
    for kv in ("chain", "copy"):
        models[f"codec-concat-{kv}"] = (codec, {"kv": kv, "lm_graph": "lm_concat"})
        models[f"turbo-{kv}"] = (turbo, {"kv": kv})
        models[f"original-{kv}"] = (original, {"kv": kv})
        models[f"original-cfg-{kv}"] = (original, {"kv": kv, "cfg_weight": 0.5})
    moss = work / "moss"
    if not (moss / "MOSS-TTS-Nano-100M-ONNX").is_dir():
        from dataclasses import replace

        from export.moss_tts_nano import build, small

        build(moss, replace(small(), greedy_frame=True))
    moss_inplace = work / "moss-inplace"
    if not moss_inplace.is_dir():
        from onnx_tts.tools.convert import convert_bundle_inplace_kv

        convert_bundle_inplace_kv(moss, moss_inplace, check=False)
    for kv in ("chain", "copy"):
        models[f"moss-{kv}"] = (moss, {"kv": kv, "max_new_frames": 24})
        models[f"moss-full-{kv}"] = (moss, {"kv": kv, "max_new_frames": 24, "sample_mode": "full"})
    models["moss-inplace"] = (moss_inplace, {"kv": "inplace", "max_new_frames": 24})
    models["turbo-inplace"] = (converted, {"kv": "inplace"})
    models["original-inplace"] = (original_inplace, {"kv": "inplace"})
    models["original-cfg-inplace"] = (original_inplace, {"kv": "inplace", "cfg_weight": 0.5})
    return models


def _record_model(name: str, model_dir, options: dict, voice_wav: Path, out: dict) -> None:
    import onnx_tts

    def run(label: str, make: Callable[[], np.ndarray]) -> None:
        try:
            out[f"{name}/{label}"] = np.asarray(make(), np.float32)
        except Exception as error:  # recorded: a failure must stay the same failure
            out[f"{name}/{label}"] = np.frombuffer(
                f"{type(error).__name__}: {error}".encode()[:200], np.uint8
            )

    # Turbo exports carry no default voice: every request of theirs is cloned.
    voice = str(voice_wav) if name.startswith("turbo") else None
    if name.startswith("moss"):
        voice_wav = voice_wav.with_name("voice48k.wav")
    solo = onnx_tts.load(model_dir, cache_dir=None, max_batch=1, threads=1, **options)
    for i, text in enumerate(TEXTS):
        run(f"solo/{i}", lambda t=text, i=i: solo.synthesize(t, voice=voice, seed=i + 1).samples)
    run("clone", lambda: solo.synthesize(TEXTS[1], voice=str(voice_wav), seed=7).samples)
    run("greedy", lambda: solo.synthesize(TEXTS[0], voice=voice, temperature=0.0).samples)
    run("stream", lambda: np.concatenate(list(solo.stream(TEXTS[1], voice=voice, seed=3))))
    if name.startswith("moss"):  # several text chunks (the family's token budget per chunk)
        few = {"voice_clone_max_text_tokens": 6}
        for seed in (1, 5):
            run(f"chunks/{seed}", lambda s=seed: solo.synthesize(TEXTS[1], seed=s, **few).samples)
            run(
                f"chunks/stream/{seed}",
                lambda s=seed: np.concatenate(list(solo.stream(TEXTS[1], seed=s, **few))),
            )
            run(
                f"chunks/clone/{seed}",
                lambda s=seed: (
                    solo.synthesize(TEXTS[1], voice=str(voice_wav), seed=s, **few).samples
                ),
            )
    solo.close()
    batched = onnx_tts.load(model_dir, cache_dir=None, max_batch=4, threads=1, **options)

    def together() -> np.ndarray:
        with ThreadPoolExecutor(4) as pool:
            audios = pool.map(
                lambda i: batched.synthesize(TEXTS[i % 3], voice=voice, seed=i + 1), range(4)
            )
            return np.concatenate([a.samples for a in audios])

    run("batched", together)
    if name.startswith("moss"):  # seeds for which the random stand-in speaks every request

        def speaking() -> np.ndarray:
            jobs = [(TEXTS[0], 1), (TEXTS[1], 1), (TEXTS[1], 5), (TEXTS[2], 1)]
            with ThreadPoolExecutor(4) as pool:
                audios = pool.map(lambda job: batched.synthesize(job[0], seed=job[1]), jobs)
                return np.concatenate([a.samples for a in audios])

        run("batched/speaking", speaking)
    batched.close()
    cached = onnx_tts.load(
        model_dir, cache_dir=None, result_cache_bytes=16 << 20, threads=1, **options
    )
    run("cached/first", lambda: cached.synthesize(TEXTS[1], voice=voice, seed=5).samples)
    run("cached/hit", lambda: cached.synthesize(TEXTS[1], voice=voice, seed=5).samples)
    run(
        "cached/stream",
        lambda: np.concatenate(list(cached.stream(TEXTS[1], voice=voice, seed=5))),
    )
    cached.close()


def record(path: Path, work: Path) -> None:
    import soundfile

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.conftest import speechlike

    work.mkdir(parents=True, exist_ok=True)
    voice_wav = work / "voice.wav"
    soundfile.write(str(voice_wav), speechlike(3.0), 24000, subtype="FLOAT")
    # MOSS-TTS-Nano's codec runs at 48 kHz: a reference at its own rate (no resampling).
    soundfile.write(
        str(work / "voice48k.wav"), speechlike(0.7, 48000, seed=3), 48000, subtype="FLOAT"
    )
    out: dict[str, np.ndarray] = {}
    for name, (model_dir, options) in _models(work).items():
        print(f"recording {name}", file=sys.stderr)
        _record_model(name, model_dir, options, voice_wav, out)
    np.savez(path, **out)
    print(f"{len(out)} outputs -> {path}")


def compare(old_path: Path, new_path: Path) -> int:
    old, new = np.load(old_path), np.load(new_path)
    differ = 0
    for key in sorted(set(old.files) | set(new.files)):
        if key not in old.files or key not in new.files:
            print(f"only in one: {key}")
            differ += 1
        elif old[key].dtype != new[key].dtype or not np.array_equal(old[key], new[key]):
            a, b = old[key], new[key]
            what = (
                (bytes(a).decode(errors="replace") if a.dtype == np.uint8 else f"{a.shape}")
                + " vs "
                + (bytes(b).decode(errors="replace") if b.dtype == np.uint8 else f"{b.shape}")
            )
            print(f"DIFFERS: {key}: {what}")
            differ += 1
    print(f"{len(old.files)} recorded, {differ} differ")
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record")
    rec.add_argument("out", type=Path)
    rec.add_argument("--work", type=Path, default=Path("/tmp/onnx-tts-record"))
    cmp_ = commands.add_parser("compare")
    cmp_.add_argument("old", type=Path)
    cmp_.add_argument("new", type=Path)
    args = parser.parse_args(argv)
    if args.command == "record":
        record(args.out, args.work)
        return 0
    return compare(args.old, args.new)


if __name__ == "__main__":
    sys.exit(main())

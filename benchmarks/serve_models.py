"""The models `bench serve` and `bench api` run: the bundled default voice, and a Turbo-shape
Chatterbox bundle (the project's synthetic Chatterbox export at Turbo's LM size: 24 layers,
hidden 1024, 16 heads, fp32, random weights; its LM converted for the in-place KV cache so
requests batch; with a `default_voice.wav` so requests need no upload).

The Turbo bundle is built once into the build cache (``export.build_cache``), under a key of
its recipe's sources and settings, and renamed into place complete, like
``export.build_codec_lm.codec_lm_bundle``.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from export.build_cache import build_cache_root

REPO_ROOT = Path(__file__).resolve().parents[1]
# The sources whose bytes decide the bundle's bytes (with the settings below).
RECIPE_SOURCES = (
    "export/synthetic_chatterbox.py",
    "onnx_tts/tools/convert/inplace_kv.py",
    "benchmarks/serve_models.py",
)
TURBO_SHAPE = {"layers": 24, "hidden": 1024, "heads": 16}
# The LM's stop token wins after this absolute position: with the 3 s default voice (75 prompt
# tokens) and a short sentence, about 2.4 s of speech per request (25 tokens a second).
TURBO_STOP_AFTER = 150
DEFAULT_VOICE_SECONDS = 3.0


def turbo_config(**overrides: object):  # -> synthetic_chatterbox.SyntheticConfig
    from export import synthetic_chatterbox as synthetic

    settings = {
        "variant": "turbo",
        **TURBO_SHAPE,
        "stop_after": TURBO_STOP_AFTER,
        "precisions": ("fp32",),
    }
    return replace(synthetic.SyntheticConfig(**settings), **overrides)  # type: ignore[arg-type]


def recipe_key(config: object) -> str:
    digest = hashlib.sha256(repr(config).encode())
    digest.update(repr(DEFAULT_VOICE_SECONDS).encode())
    for source in RECIPE_SOURCES:
        digest.update((REPO_ROOT / source).read_bytes())
    return digest.hexdigest()[:16]


def turbo_bundle(cache_root: Path | None = None, log=print, **overrides: object) -> Path:
    """The Turbo-shape bundle directory, built on first use (about a minute and 1.3 GB)."""
    from export import synthetic_chatterbox as synthetic
    from onnx_tts.tools.convert import convert_bundle_inplace_kv

    config = turbo_config(**overrides)
    root = Path(cache_root) if cache_root is not None else build_cache_root()
    target = root / "chatterbox-turbo-serve" / recipe_key(config)
    if (target / "tokenizer.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    log(f"building the Turbo-shape Chatterbox bundle into {target} (once)", flush=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        source, converted = staging / "source", staging / "converted"
        synthetic.export(config, source)
        synthetic.write_default_voice(source / "default_voice.wav", DEFAULT_VOICE_SECONDS)
        convert_bundle_inplace_kv(source, converted, check=False)
        converted.chmod(0o755)
        try:
            converted.rename(target)
        except OSError:  # another process built it first (the same bytes)
            if not (target / "tokenizer.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


if __name__ == "__main__":
    print(turbo_bundle())

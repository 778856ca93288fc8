"""Recognising and checking a MOSS-TTS-Nano ONNX export in its published layout.

Everything is read once here, before any session exists: the manifest (prompt templates,
generation defaults, builtin voices), both metas (files, external data, model/codec config,
tensor names, streaming state specs), the declared I/O of every graph and the byte ranges of
its external weights. Every value a file controls is typed and bounded, every path stays in
its directory (the codec meta may be in a sibling directory, as published), and any missing
or inconsistent piece is one ModelError line naming the file and the fix.
"""

from __future__ import annotations

from pathlib import Path

from onnx_tts.errors import ModelError
from onnx_tts.families.moss_tts_nano.codec_meta import inspect_codec
from onnx_tts.families.moss_tts_nano.json_files import JsonFile, inside, resolve_relative
from onnx_tts.families.moss_tts_nano.layout import (
    DOWNLOAD_HINT,
    MANIFEST,
    MANIFEST_CANDIDATES,
    MossLayout,
    PromptTemplates,
)
from onnx_tts.families.moss_tts_nano.tts_meta import (
    builtin_voices,
    generation_defaults,
    inspect_tts,
)
from onnx_tts.regular_files import real_path


def find_manifest(root: Path) -> Path | None:
    """The manifest of `root` (the models/ parent or the TTS directory), as the published
    runtime looks for it."""
    for candidate in MANIFEST_CANDIDATES:
        path = root / candidate
        if path.is_file():
            return path
    return None


def looks_like_moss(root: Path) -> bool:
    return find_manifest(root) is not None


def inspect_layout(root: Path) -> MossLayout:
    """Read and check a MOSS-TTS-Nano directory (the models/ parent or the TTS directory)."""
    root = Path(root)
    manifest_path = find_manifest(root)
    if manifest_path is None:
        raise ModelError(
            f"{root} has no {MANIFEST} (tried {', '.join(MANIFEST_CANDIDATES)}); {DOWNLOAD_HINT}"
        )
    fix = f"download {MANIFEST} again ({DOWNLOAD_HINT})"
    manifest = JsonFile.read(real_path(manifest_path), fix)
    version = manifest.get("format_version", None)
    if version != 1:
        raise ModelError(
            f"{manifest.path}: format_version {version!r} is not one this onnx-tts reads (1)"
        )
    tts_dir = manifest.path.parent
    model_files = manifest.section("model_files")
    tts_meta_path = inside(
        resolve_relative(manifest, "tts_meta", model_files.get("tts_meta")),
        [tts_dir],
        str(manifest.path),
        "model_files.tts_meta",
    )
    codec_meta_path = resolve_relative(manifest, "codec_meta", model_files.get("codec_meta"))
    # The codec lives beside the TTS directory (or in it): nowhere else.
    siblings = [tts_dir]
    if codec_meta_path.parent.parent == tts_dir.parent:
        siblings.append(codec_meta_path.parent)
    inside(codec_meta_path, siblings, str(manifest.path), "model_files.codec_meta")
    tokenizer_path = inside(
        resolve_relative(
            manifest, "tokenizer_model", model_files.get("tokenizer_model", "tokenizer.model")
        ),
        [tts_dir],
        str(manifest.path),
        "model_files.tokenizer_model",
    )
    if not tokenizer_path.is_file():
        raise ModelError(
            f"missing tokenizer {tokenizer_path} (SentencePiece model); {DOWNLOAD_HINT}"
        )
    tts_meta = JsonFile.read(tts_meta_path, f"download {tts_meta_path.name} again")
    codec_meta = JsonFile.read(
        codec_meta_path,
        f"the codec meta is read from {codec_meta_path.parent}: {DOWNLOAD_HINT}",
    )
    config, names, tts_graphs, tts_data, fixed = inspect_tts(manifest, tts_meta, tts_dir)
    codec, state, codec_graphs, codec_data = inspect_codec(
        codec_meta, codec_meta_path.parent, config
    )
    vocab = config.vocab
    templates = PromptTemplates(
        tuple(manifest.token_ids("prompt_templates.user_prompt_prefix_token_ids", vocab)),
        tuple(manifest.token_ids("prompt_templates.user_prompt_after_reference_token_ids", vocab)),
        tuple(manifest.token_ids("prompt_templates.assistant_prompt_prefix_token_ids", vocab)),
    )
    return MossLayout(
        root=root,
        tts_dir=tts_dir,
        codec_dir=codec_meta_path.parent,
        manifest_path=manifest.path,
        tts_meta_path=tts_meta_path,
        codec_meta_path=codec_meta_path,
        tokenizer_path=tokenizer_path,
        config=config,
        codec=codec,
        templates=templates,
        defaults=generation_defaults(manifest),
        voices=builtin_voices(manifest, config),
        tts_graphs=tts_graphs,
        codec_graphs=codec_graphs,
        external_data={**tts_data, **codec_data},
        tts_names=names,
        fixed_frame_constants=fixed,
        state=state,
    )


__all__ = ["find_manifest", "inspect_layout", "looks_like_moss"]

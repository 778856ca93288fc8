"""The published MOSS-TTS configs, read and checked: which model a checkpoint is and its sizes.

Three releases, told apart by their config and tensor names (SEED_MODELS.md sections 1-3):

* ``local-v1.5`` (MOSS-TTS-Local-Transformer-v1.5, `model_type` "moss_tts_local"): a Qwen3
  backbone (`qwen3_config`) under `transformer.`, a GPT-2 style local block (`gpt2_config`)
  under `local_transformer.`, 12 audio embeddings tied to the audio heads, a 2-way
  continue/stop head; audio_start 151669, audio_end 151670.
* ``local-v1`` (MOSS-TTS-Local-Transformer, `model_type` "moss_tts_delay" but with
  `local_transformer.*` tensors): Qwen3 backbone `model.language_model.`, 33 input tables
  `model.embedding_list.*`, a 4-layer Qwen3 depth transformer without positions, 33 output
  MLPs, norms and heads.
* ``delay`` (MOSS-TTS / MOSS-TTS-v1.5): Qwen3 backbone `language_model.`, 32 audio tables
  `emb_ext.*`, 33 heads `lm_heads.*`, the delay pattern.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import Any

from export.backbones.qwen3 import Qwen3Config
from export.checkpoint import CheckpointError

VARIANTS = ("local-v1.5", "local-v1", "delay")
MAX_N_VQ = 64
MAX_CODEBOOK = 1 << 16
MAX_VOCAB = 1 << 22


def _int(config: Mapping[str, Any], key: str, default: int | None, low: int, high: int, what: str):
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise CheckpointError(f"{what}: {key} must be an integer in [{low}, {high}], got {value!r}")
    return value


@dataclass(frozen=True)
class TokenIds:
    """The special token ids of the prompt and of generation."""

    pad: int
    im_start: int
    im_end: int
    audio_start: int
    audio_end: int
    user_slot: int
    assistant_slot: int
    delay_slot: int | None  # the Delay pattern's slot (v1 and Delay configs carry it)

    def as_dict(self) -> dict[str, int | None]:
        return dict(vars(self))


@dataclass(frozen=True)
class LocalV1:
    """Local v1's depth transformer: a Qwen3 stack without positions (heads and head size of
    the backbone's config, as the published deepcopy gives), its input MLP and output MLPs."""

    hidden: int
    ffn: int
    layers: int
    mlp: int  # additional_mlp_ffn_hidden_size
    heads: int
    kv_heads: int
    head_dim: int
    eps: float

    def qwen3(self) -> Qwen3Config:
        return Qwen3Config(
            hidden_size=self.hidden,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            head_dim=self.head_dim,
            intermediate_size=self.ffn,
            rms_norm_eps=self.eps,
            max_position_embeddings=1,
        )


@dataclass(frozen=True)
class LocalGPT2:
    """Local v1.5's depth transformer: GPT-2 style blocks (LayerNorm, fused qkv with bias,
    a non-gated MLP), positions by interleaved RoPE or a learned table."""

    hidden: int
    heads: int
    inner: int
    layers: int
    eps: float
    positions: int  # n_vq + 1
    position_type: str  # "rope" | "absolute"
    rope_base: float
    activation: str

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


@dataclass(frozen=True)
class MossConfig:
    """One checkpoint's model: its variant, token ids, sizes and sub-configs."""

    variant: str
    backbone: Qwen3Config
    vocab: int
    hidden: int
    n_vq: int
    codebook: int  # audio codes per codebook (1024)
    audio_pad: int  # the pad code (1024)
    tokens: TokenIds
    sampling_rate: int
    local_v1: LocalV1 | None = None
    local_gpt2: LocalGPT2 | None = None

    @property
    def channels(self) -> int:
        return self.n_vq + 1


def _tokens(config: Mapping[str, Any], variant: str, what: str) -> TokenIds:
    v15 = variant == "local-v1.5"

    def token(key: str, default: int) -> int:
        return _int(config, key, default, 0, MAX_VOCAB, what)

    assistant = config.get("audio_assistant_gen_slot_token_id")
    if assistant is None:
        assistant = config.get("audio_assistant_slot_token_id", 151656)
    return TokenIds(
        pad=token("pad_token_id", 151643),
        im_start=token("im_start_token_id", 151644),
        im_end=token("im_end_token_id", 151645),
        audio_start=token("audio_start_token_id", 151669 if v15 else 151652),
        audio_end=token("audio_end_token_id", 151670 if v15 else 151653),
        user_slot=token("audio_user_slot_token_id", 151654),
        assistant_slot=_int({"slot": assistant}, "slot", None, 0, MAX_VOCAB, what),
        delay_slot=None if v15 else token("audio_assistant_delay_slot_token_id", 151662),
    )


def variant_of(config: Mapping[str, Any], names: Set[str], what: str) -> str:
    """Which release a checkpoint is, from its config and tensor names."""
    if config.get("model_type") == "moss_tts_local" or "gpt2_config" in config:
        return "local-v1.5"
    if (
        "local_transformer.norm.weight" in names
        or "speech_embedding_to_local_mlp.gate_proj.weight" in names
    ):
        return "local-v1"
    if "emb_ext.0.weight" in names:
        return "delay"
    raise CheckpointError(
        f"{what} is not a MOSS-TTS checkpoint this exporter knows: its config.json and tensors "
        "are neither MOSS-TTS-Local-Transformer-v1.5 (model_type moss_tts_local), "
        "MOSS-TTS-Local-Transformer (local_transformer.* tensors) nor MOSS-TTS Delay "
        "(emb_ext.* tensors)"
    )


def read_config(config: Mapping[str, Any], names: Set[str], what: str) -> MossConfig:
    """The MossConfig of a checkpoint's config.json and tensor names (CheckpointError naming
    what is wrong)."""
    variant = variant_of(config, names, what)
    language = config.get("qwen3_config") or config.get("language_config")
    if not isinstance(language, Mapping):
        raise CheckpointError(f"{what}: config.json has no language_config / qwen3_config object")
    backbone = Qwen3Config.from_dict(language, f"{what} language config")
    vocab = _int(language, "vocab_size", None, 1, MAX_VOCAB, f"{what} language config")
    n_vq = _int(config, "n_vq", 12 if variant == "local-v1.5" else 32, 1, MAX_N_VQ, what)
    codebook = _int(config, "audio_vocab_size", 1024, 2, MAX_CODEBOOK, what)
    sizes = config.get("audio_codebook_sizes")
    if sizes is not None and (not isinstance(sizes, list) or set(sizes) != {codebook}):
        raise CheckpointError(
            f"{what}: audio_codebook_sizes other than one size per codebook "
            f"({codebook}) are not supported, got {sizes!r}"
        )
    pad_key = "audio_pad_token_id" if variant == "local-v1.5" else "audio_pad_code"
    pad = _int(config, pad_key, codebook, codebook, MAX_CODEBOOK, what)
    if variant == "local-v1.5" and config.get("audio_pad_code") is not None:
        pad = _int(config, "audio_pad_code", pad, codebook, MAX_CODEBOOK, what)
    tokens = _tokens(config, variant, what)
    if max(t for t in tokens.as_dict().values() if t is not None) >= vocab:
        raise CheckpointError(f"{what}: a special token id is beyond the vocabulary ({vocab})")
    rate = _int(
        config, "sampling_rate", 48000 if variant == "local-v1.5" else 24000, 8000, 384000, what
    )
    common = dict(
        variant=variant,
        backbone=backbone,
        vocab=vocab,
        hidden=backbone.hidden_size,
        n_vq=n_vq,
        codebook=codebook,
        audio_pad=pad,
        tokens=tokens,
        sampling_rate=rate,
    )
    if variant == "local-v1.5":
        return MossConfig(**common, local_gpt2=_gpt2(config, backbone, n_vq, what))
    if variant == "local-v1":
        local = LocalV1(
            hidden=_int(config, "local_hidden_size", 1536, 1, 1 << 16, what),
            ffn=_int(config, "local_ffn_hidden_size", 8960, 1, 1 << 20, what),
            layers=_int(config, "local_num_layers", 4, 1, 64, what),
            mlp=_int(config, "additional_mlp_ffn_hidden_size", 2048, 1, 1 << 20, what),
            heads=backbone.num_attention_heads,
            kv_heads=backbone.num_key_value_heads,
            head_dim=backbone.head_dim,
            eps=backbone.rms_norm_eps,
        )
        return MossConfig(**common, local_v1=local)
    return MossConfig(**common)


def _gpt2(config: Mapping[str, Any], backbone: Qwen3Config, n_vq: int, what: str) -> LocalGPT2:
    gpt2 = config.get("gpt2_config") or {}
    if not isinstance(gpt2, Mapping):
        raise CheckpointError(f"{what}: gpt2_config must be an object")
    where = f"{what} gpt2_config"
    hidden = _int(gpt2, "n_embd", backbone.hidden_size, 1, 1 << 16, where)
    if hidden != backbone.hidden_size:
        raise CheckpointError(
            f"{where}: n_embd {hidden} must equal the backbone hidden size "
            f"{backbone.hidden_size} (embeddings and heads are tied)"
        )
    heads = _int(gpt2, "n_head", max(1, hidden // 80), 1, 1024, where)
    if hidden % heads or (hidden // heads) % 2:
        raise CheckpointError(f"{where}: n_embd {hidden} / n_head {heads} is not an even size")
    inner = gpt2.get("n_inner") or 4 * hidden
    position = str(gpt2.get("position_embedding_type", "absolute")).lower()
    if position not in ("rope", "absolute"):
        raise CheckpointError(f"{where}: position_embedding_type {position!r} is not rope/absolute")
    activation = str(gpt2.get("activation_function", "silu"))
    if activation != "silu":
        raise CheckpointError(f"{where}: activation_function {activation!r} is not supported")
    eps = gpt2.get("layer_norm_epsilon", 1e-6)
    base = gpt2.get("rope_base", 10000.0)
    if not all(
        isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in (eps, base)
    ):
        raise CheckpointError(f"{where}: layer_norm_epsilon and rope_base must be positive")
    layers = config.get("local_transformer_layers", gpt2.get("n_layer", 1))
    return LocalGPT2(
        hidden=hidden,
        heads=heads,
        inner=_int({"n_inner": inner}, "n_inner", None, 1, 1 << 20, where),
        layers=_int({"n_layer": layers}, "n_layer", None, 1, 64, where),
        eps=float(eps),
        positions=n_vq + 1,
        position_type=position,
        rope_base=float(base),
        activation=activation,
    )


__all__ = [
    "VARIANTS",
    "LocalGPT2",
    "LocalV1",
    "MossConfig",
    "TokenIds",
    "read_config",
    "variant_of",
]

"""A moss-tts model directory's bundle.json, read once and checked into typed values.

The exporter (`onnx-tts export moss-tts`, export/moss_tts/) writes:

    bundle.json     family "moss-tts", variant (local-v1.5 | local-v1 | delay), sizes, token
                    ids, the chat-template strings, sampling defaults, graphs by role
    tokenizer.json  the checkpoint's Qwen3 tokenizer
    backbone.onnx   the Qwen3 LM-with-past (inputs_embeds -> last_hidden_state)
    embed.onnx      the input tables (read by the host: `tables.py`)
    local.onnx      Local v1.5 / v1: the depth transformer step;  heads/channel_KK.onnx (v1)
    heads_text.onnx, heads_audio.onnx   Delay: its heads
    codec/          the audio tokenizer (codec.json and its graphs), when exported with one
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onnx_tts.bundle import Bundle, inside
from onnx_tts.errors import ModelError

FAMILY = "moss-tts"
VARIANTS = ("local-v1.5", "local-v1", "delay")
SECTIONS = ("graphs", "kv", "model", "tokens", "text", "sampling")
MAX_VOCAB = 1 << 22
MAX_HIDDEN = 1 << 16
MAX_N_VQ = 64
MAX_CODEBOOK = 1 << 16
TOKEN_NAMES = (
    "pad",
    "im_start",
    "im_end",
    "audio_start",
    "audio_end",
    "user_slot",
    "assistant_slot",
)
CHAT_KEYS = ("user_prefix", "user_suffix", "assistant_prefix", "assistant_suffix")
USER_END = "user_end"
SAMPLING_FLOATS = (
    "text_temperature",
    "text_top_p",
    "audio_temperature",
    "audio_top_p",
    "audio_repetition_penalty",
)
SAMPLING_INTS = ("text_top_k", "audio_top_k", "max_new_frames")


@dataclass(frozen=True)
class Tokens:
    pad: int
    im_start: int
    im_end: int
    audio_start: int
    audio_end: int
    user_slot: int
    assistant_slot: int
    delay_slot: int | None


@dataclass(frozen=True)
class MossLayout:
    """A checked moss-tts bundle."""

    bundle: Bundle
    variant: str
    hidden: int
    vocab: int
    n_vq: int
    codebook: int
    audio_pad: int
    local_hidden: int  # Local v1's depth-transformer width (the hidden size otherwise)
    local_layers: int
    local_heads: int
    local_head_dim: int
    max_positions: int
    tokens: Tokens
    chat: dict[str, str]
    sampling: dict[str, float]
    codec_dir: Path | None
    sample_rate: int
    channels: int  # audio channels of the codec (1 or 2)
    hop_length: int

    @property
    def root(self) -> Path:
        return self.bundle.root

    @property
    def row_width(self) -> int:
        return self.n_vq + 1

    def graph(self, role: str) -> Path:
        return self.bundle.graph_path(role)

    @property
    def roles(self) -> list[str]:
        return list(self.bundle.section("graphs"))


def _chat(chat: Any) -> dict[str, str]:
    """text.chat's strings; `user_end` (a user message without the generation prompt, for
    Local v1's continuation) only when the export wrote it (older exports did not)."""
    if not isinstance(chat, dict):
        return {}
    strings = {k: str(chat.get(k, "")) for k in CHAT_KEYS}
    if isinstance(chat.get(USER_END), str):
        strings[USER_END] = chat[USER_END]
    return strings


def read_layout(bundle: Bundle) -> MossLayout:
    """The typed layout of a validated bundle (ModelError naming any value out of bounds)."""
    b = bundle
    variant = b.value(None, "variant", str)
    if variant not in VARIANTS:
        raise ModelError(
            f"{b.root / 'bundle.json'}: variant must be one of {VARIANTS}, got {variant!r}"
        )
    n_vq = b.value("model", "n_vq", int, 1, MAX_N_VQ)
    codebook = b.value("model", "codebook", int, 2, MAX_CODEBOOK)
    vocab = b.value("model", "vocab", int, 1, MAX_VOCAB)
    tokens = Tokens(
        **{name: b.value("tokens", name, int, 0, vocab - 1) for name in TOKEN_NAMES},
        delay_slot=None
        if variant == "local-v1.5"
        else b.value("tokens", "delay_slot", int, 0, vocab - 1),
    )
    text = b.section("text")
    chat = text.get("chat", {})
    if variant != "local-v1.5" and not (
        isinstance(chat, dict) and all(isinstance(chat.get(k), str) for k in CHAT_KEYS)
    ):
        raise ModelError(f"{b.root / 'bundle.json'}: text.chat must give {', '.join(CHAT_KEYS)}")
    sampling: dict[str, float] = {}
    for name in SAMPLING_FLOATS:
        sampling[name] = b.value("sampling", name, float, 0.0, 100.0)
    for name in SAMPLING_INTS:
        sampling[name] = b.value("sampling", name, int, 0, 1 << 20)
    codec = b.manifest.get("codec")
    codec_dir = None
    if codec is not None:
        if not isinstance(codec, dict):
            raise ModelError(f"{b.root / 'bundle.json'}: codec must be an object")
        codec_dir = inside(b.root, codec.get("directory"), "codec.directory")
    hidden = b.value("model", "hidden", int, 1, MAX_HIDDEN)
    return MossLayout(
        bundle=b,
        variant=variant,
        hidden=hidden,
        vocab=vocab,
        n_vq=n_vq,
        codebook=codebook,
        audio_pad=b.value("model", "audio_pad", int, codebook, MAX_CODEBOOK),
        local_hidden=b.value("model", "local_hidden", int, 1, MAX_HIDDEN, hidden),
        local_layers=b.value("model", "local_layers", int, 0, 256, 0),
        local_heads=b.value("model", "local_kv_heads", int, 0, 1024, 0),
        local_head_dim=b.value("model", "local_head_dim", int, 0, 4096, 0),
        max_positions=b.value("kv", "max_positions", int, 16, 1 << 22),
        tokens=tokens,
        chat=_chat(chat),
        sampling=sampling,
        codec_dir=codec_dir,
        sample_rate=b.sample_rate,
        channels=b.value("audio", "channels", int, 1, 2),
        hop_length=b.value("audio", "hop_length", int, 1, 1 << 16),
    )


def describe(layout: MossLayout) -> dict[str, Any]:
    return {
        "variant": layout.variant,
        "hidden": layout.hidden,
        "vocab": layout.vocab,
        "n_vq": layout.n_vq,
        "codebook": layout.codebook,
        "tokens": vars(layout.tokens),
    }


__all__ = [
    "FAMILY",
    "SECTIONS",
    "USER_END",
    "VARIANTS",
    "MossLayout",
    "Tokens",
    "describe",
    "read_layout",
]

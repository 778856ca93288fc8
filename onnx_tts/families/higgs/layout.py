"""What a Higgs model directory's manifest says (written by `onnx-tts export higgs`), read
once, typed and bounded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from onnx_tts.bundle import Bundle
from onnx_tts.errors import ModelError

FAMILY = "higgs"
VERSIONS = ("v2", "v3")
SECTIONS = ("graphs", "higgs", "text", "codec", "sampling", "streaming")
ROLES = ("encoder", "embed", "lm", "head", "decoder")
MAX_POSITIONS = 1 << 20
MAX_NEW_TOKENS = 1 << 16


@dataclass(frozen=True)
class Sampling:
    """The published generation defaults (bundle.json "sampling")."""

    temperature: float
    top_k: int
    top_p: float
    ras_window: int
    ras_max_repeat: int


@dataclass(frozen=True)
class HiggsLayout:
    bundle: Bundle
    version: str  # "v2" (Llama + DualFFN, chat prompt) | "v3" (Qwen3, <|tts|> prompt)
    codebooks: int
    codebook_size: int  # with the stream begin/end codes
    hidden_size: int
    routing: bool  # the LM input carries the DualFFN audio flag column
    positions: int
    max_new_tokens: int
    hop_length: int
    frame_rate: int
    tokens: dict[str, int]
    sampling: Sampling
    streaming: dict[str, int]

    @property
    def codes(self) -> int:
        """Codes per codebook the codec decodes (without the begin/end codes)."""
        return self.codebook_size - 2

    @property
    def begin(self) -> int:
        return self.codebook_size - 2

    @property
    def end(self) -> int:
        return self.codebook_size - 1

    @classmethod
    def read(cls, bundle: Bundle) -> HiggsLayout:
        version = bundle.value("higgs", "version", str)
        if version not in VERSIONS:
            raise ModelError(f"{bundle.root}: higgs.version must be one of {VERSIONS}")
        missing = [role for role in ROLES if role not in bundle.section("graphs")]
        if missing:
            raise ModelError(f"{bundle.root}: bundle.json graphs lack {', '.join(missing)}")
        tokens = bundle.section("text").get("tokens")
        if not isinstance(tokens, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and 0 <= v < (1 << 24)
            for k, v in tokens.items()
        ):
            raise ModelError(f"{bundle.root}: text.tokens must map token names to ids")
        streaming = {
            key: bundle.value("streaming", key, int, 0, 1 << 16)
            for key in bundle.section("streaming")
        }
        return cls(
            bundle=bundle,
            version=version,
            codebooks=bundle.value("higgs", "codebooks", int, 1, 64),
            codebook_size=bundle.value("higgs", "codebook_size", int, 3, 1 << 16),
            hidden_size=bundle.value("higgs", "hidden_size", int, 1, 1 << 16),
            routing=bool(bundle.section("higgs").get("routing", False)),
            positions=bundle.value("higgs", "positions", int, 64, MAX_POSITIONS),
            max_new_tokens=bundle.value("higgs", "max_new_tokens", int, 1, MAX_NEW_TOKENS),
            hop_length=bundle.value("codec", "hop_length", int, 1, 1 << 16),
            frame_rate=bundle.value("codec", "frame_rate", int, 1, 1000),
            tokens=dict(tokens),
            sampling=Sampling(
                temperature=bundle.value("sampling", "temperature", float, 0.0, 100.0),
                top_k=bundle.value("sampling", "top_k", int, 0, 1 << 20),
                top_p=bundle.value("sampling", "top_p", float, 0.0, 1.0),
                ras_window=bundle.value("sampling", "ras_window", int, 0, 1024),
                ras_max_repeat=bundle.value("sampling", "ras_max_repeat", int, 1, 1024),
            ),
            streaming=streaming,
        )

    def token(self, name: str) -> int:
        if name not in self.tokens:
            raise ModelError(f"{self.bundle.root}: bundle.json text.tokens lacks {name}")
        return self.tokens[name]

    def describe(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "codebooks": self.codebooks,
            "codebook_size": self.codebook_size,
            "positions": self.positions,
            "max_new_tokens": self.max_new_tokens,
        }


__all__ = ["FAMILY", "ROLES", "SECTIONS", "VERSIONS", "HiggsLayout", "Sampling"]

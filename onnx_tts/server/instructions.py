"""OpenAI's free-text `instructions` ("speak slowly and calmly") mapped onto what a model can do.

The models here take no style prompt, so the words that have a meaning for them are applied:
pace words scale `speed` (WSOLA, pitch kept), and expressiveness words set a model's
`exaggeration` option when its family has one. Every clause with none of those words is
reported back as ignored (a response header and the log), never silently dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from onnx_tts.pipeline.timestretch import MAX_SPEED, MIN_SPEED

# Longest phrases first: "very slowly" must not be read as "slowly".
_PACE = (
    (("very slowly", "very slow", "much slower"), 0.7),
    (("slowly", "slower", "slow pace", "slow", "unhurried", "leisurely"), 0.85),
    (("very fast", "very quickly", "much faster"), 1.4),
    (("quickly", "faster", "fast", "rapidly", "quick", "brisk", "hurried"), 1.2),
)
_EXPRESSION = (
    (("very dramatic", "very excited", "very expressive", "over the top"), 1.0),
    (
        ("excited", "dramatic", "expressive", "energetic", "enthusiastic", "emotional", "lively"),
        0.75,
    ),
    (("monotone", "flat", "robotic"), 0.25),
    (("calm", "neutral", "soothing", "gentle", "relaxed", "soft"), 0.35),
)
MAX_HEADER_CHARS = 200


@dataclass
class Styling:
    """What `instructions` did: a speed factor, model options, and the clauses ignored."""

    speed_factor: float = 1.0
    options: dict[str, Any] = field(default_factory=dict)
    applied: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)

    def speed(self, requested: float) -> float:
        return min(MAX_SPEED, max(MIN_SPEED, requested * self.speed_factor))

    def headers(self) -> dict[str, str]:
        out = {}
        if self.applied:
            out["X-Instructions-Applied"] = _header_value("; ".join(self.applied))
        if self.ignored:
            out["X-Instructions-Ignored"] = _header_value(" | ".join(self.ignored))
        return out


def _header_value(text: str) -> str:
    # Header values travel as latin-1; keep them ASCII, one line, bounded.
    flat = " ".join(text.split()).encode("ascii", "replace").decode("ascii")
    return flat if len(flat) <= MAX_HEADER_CHARS else flat[: MAX_HEADER_CHARS - 3] + "..."


def _match(clause: str, table: tuple[tuple[tuple[str, ...], float], ...]) -> float | None:
    for words, value in table:
        for word in words:
            if re.search(rf"\b{re.escape(word)}\b", clause):
                return value
    return None


def interpret(instructions: str | None, model_options: dict[str, type]) -> Styling:
    """Read `instructions` for a model whose request options are `model_options`."""
    styling = Styling()
    if not instructions or not instructions.strip():
        return styling
    for clause in re.split(r"[.;,!?\n]+|\band\b", instructions):
        text = clause.strip()
        if not text:
            continue
        lowered = text.lower()
        used = False
        pace = _match(lowered, _PACE)
        if pace is not None and styling.speed_factor == 1.0:
            styling.speed_factor = pace
            styling.applied.append(f"speed x{pace:g}")
            used = True
        expression = _match(lowered, _EXPRESSION)
        if (
            expression is not None
            and "exaggeration" in model_options
            and "exaggeration" not in styling.options
        ):
            styling.options["exaggeration"] = expression
            styling.applied.append(f"exaggeration {expression:g}")
            used = True
        if not used:
            styling.ignored.append(text)
    return styling

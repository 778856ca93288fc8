"""Higgs text: the checkpoint's tokenizer, chunking, and the published prompts as LM rows.

Rows are what the embed graph takes: [text id, K codes] per position; an audio row has text id
-1 and its K (delayed) codes, a text row code 0s.

v2 (the chat format of Boson's examples, rendered as `transformers`' processor does):
    <|begin_of_text|><|start_header_id|>system<|end_header_id|>\\n\\n{system}\\n\\n
    <|scene_desc_start|>\\n{scene}\\n<|scene_desc_end|><|eot_id|>
    [<|start_header_id|>user<|end_header_id|>\\n\\n{reference text}<|eot_id|>
     <|start_header_id|>assistant<|end_header_id|>\\n\\n<|audio_out_bos|>{reference rows}
     <|audio_eos|><|eot_id|>]
    <|start_header_id|>user<|end_header_id|>\\n\\n{text}<|eot_id|>
    <|start_header_id|>assistant<|end_header_id|>\\n\\n<|audio_out_bos|>
  the reference rows: its codes with a begin and an end frame, delayed (T + 2 + K - 1 rows).
v3 (SGLang-Omni `higgs_tts/text_tokenizer.py`):
    <|tts|> [<|ref_text|> tok(reference text)] [<|ref_audio|> {delayed reference rows}]
    <|text|> tok(text) <|audio|>
  the reference rows: its codes delayed (T + K - 1 rows, begin/end codes around them).

Texts are spoken as given (the models read raw text); a text longer than `max_chunk_tokens`
is cut at sentence ends into chunks of at most that many tokens (sentences merged greedily).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from onnx_tts.decoding.delay import delay
from onnx_tts.errors import InputError, ModelError
from onnx_tts.families.base import TextFrontend
from onnx_tts.families.higgs.layout import HiggsLayout
from onnx_tts.frontend.sentences import split_sentences

DEFAULT_CHUNK_TOKENS = 300
MAX_CHUNK_TOKENS = 4096
SYSTEM_PROMPT = "Generate audio following instruction."
DEFAULT_SCENE = "Audio is recorded from a quiet room."
AUDIO_ROW = -1


class HiggsText(TextFrontend):
    """The tokenizer of the model directory and the chunking rule (module docstring)."""

    def __init__(self, path: Path, layout: HiggsLayout) -> None:
        from tokenizers import Tokenizer

        try:
            self.tokenizer = Tokenizer.from_file(str(path))
        except Exception as error:
            raise ModelError(f"{path} is not a tokenizer.json: {error}") from None
        self.layout = layout
        # Control strings a text may not carry (the tokenizer would read them as tokens).
        self.controls = tuple(
            token.content
            for token in self.tokenizer.get_added_tokens_decoder().values()
            if token.special and len(token.content) > 1
        )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def checked(self, text: str, what: str = "text") -> str:
        for control in self.controls:
            if control in text:
                raise InputError(
                    f"the {what} contains {control!r}, a control token of this model; remove it"
                )
        return text.strip()

    def chunks(self, text: str, options: Mapping[str, Any]) -> list[str]:
        text = self.checked(text)
        if not any(unicodedata.category(ch)[0] in "LN" for ch in text):
            raise InputError("text has nothing to speak (no letter or digit)")
        budget = int(options.get("max_chunk_tokens") or DEFAULT_CHUNK_TOKENS)
        if len(self.encode(text)) <= budget:
            return [text]
        chunks: list[str] = []
        for sentence in split_sentences(text, max_chars=1 << 20):
            joined = f"{chunks[-1]} {sentence}" if chunks else sentence
            if chunks and len(self.encode(joined)) <= budget:
                chunks[-1] = joined
            else:
                chunks.append(sentence)
        return chunks


def _text_rows(ids: list[int], books: int) -> np.ndarray:
    rows = np.zeros((len(ids), 1 + books), np.int64)
    rows[:, 0] = ids
    return rows


def _audio_rows(delayed: np.ndarray) -> np.ndarray:
    rows = np.zeros((len(delayed), 1 + delayed.shape[1]), np.int64)
    rows[:, 0] = AUDIO_ROW
    rows[:, 1:] = delayed
    return rows


def prompt_rows(
    text: HiggsText,
    chunk: str,
    codes: np.ndarray,
    reference_text: str | None,
    scene: str,
) -> tuple[np.ndarray, int, np.ndarray]:
    """The prompt of `chunk` spoken in the voice of reference `codes` [T, K] (T may be 0):
    (rows [P, 1 + K], how many leading rows depend only on the voice, the reference's delayed
    rows as the model saw them: the repetition window of v2 starts from them)."""
    layout = text.layout
    books = layout.codebooks
    codes = np.asarray(codes, np.int64).reshape(-1, books)
    reference = text.checked(reference_text, "reference text") if reference_text else ""
    chunk = text.checked(chunk)
    if layout.version == "v3":
        tok = layout.token
        head = [tok("<|tts|>")]
        if reference and len(codes) and "<|ref_text|>" in layout.tokens:
            head += [tok("<|ref_text|>"), *text.encode(reference)]
        parts = [_text_rows(head, books)]
        delayed = np.zeros((0, books), np.int64)
        if len(codes):
            delayed = delay(codes, layout.begin, layout.end)
            parts += [_text_rows([tok("<|ref_audio|>")], books), _audio_rows(delayed)]
        prefix = sum(len(p) for p in parts)
        tail = [tok("<|text|>"), *text.encode(chunk), tok("<|audio|>")]
        return np.concatenate([*parts, _text_rows(tail, books)]), prefix, delayed
    system = (
        f"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n{SYSTEM_PROMPT}"
        f"\n\n<|scene_desc_start|>\n{scene.strip()}\n<|scene_desc_end|><|eot_id|>"
    )
    user = "<|start_header_id|>user<|end_header_id|>\n\n{}<|eot_id|>"
    answer = "<|start_header_id|>assistant<|end_header_id|>\n\n<|audio_out_bos|>"
    delayed = np.zeros((0, books), np.int64)
    if len(codes):
        framed = np.concatenate(
            [np.full((1, books), layout.begin), codes, np.full((1, books), layout.end)]
        )
        delayed = delay(framed, layout.begin, layout.end)
        parts = [
            _text_rows(text.encode(system + user.format(reference) + answer), books),
            _audio_rows(delayed),
            _text_rows(text.encode("<|audio_eos|><|eot_id|>"), books),
        ]
    else:
        parts = [_text_rows(text.encode(system), books)]
    prefix = sum(len(p) for p in parts)
    parts.append(_text_rows(text.encode(user.format(chunk) + answer), books))
    return np.concatenate(parts), prefix, delayed


__all__ = [
    "DEFAULT_CHUNK_TOKENS",
    "DEFAULT_SCENE",
    "MAX_CHUNK_TOKENS",
    "SYSTEM_PROMPT",
    "HiggsText",
    "prompt_rows",
]

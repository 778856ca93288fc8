"""Text tokenization with a bundle's `tokenizers` tokenizer.json."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from onnx_tts.errors import ModelError


class TextTokenizer:
    """A `tokenizers` tokenizer.json with the bundle's special tokens."""

    def __init__(self, path: Path) -> None:
        if not path.is_file():
            raise ModelError(f"tokenizer not found: {path}")
        try:
            self._tokenizer = Tokenizer.from_file(str(path))
        except Exception as error:  # tokenizers raises a bare Exception on bad JSON
            raise ModelError(f"cannot read tokenizer {path}: {error}") from None
        self.unk_id = self._tokenizer.token_to_id("<unk>")

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size()

    def token_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

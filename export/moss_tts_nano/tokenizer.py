"""A SentencePiece `tokenizer.model` with the published special pieces, trained here.

The published tokenizer (../shared/MOSS_TTS_NANO.md section 4) is BPE with byte fallback and the
nmt_nfkc normaliser; ids 0-3 are <unk> <s> </s> <pad>, 4-14 the user-defined chat/audio pieces,
15-270 the byte pieces. The stand-in keeps that id layout and is trained on the docstrings of
Python's standard library plus a few CJK sentences (no downloads), so its ordinary pieces are
fewer (a few thousand) and differ from the real ones; prompt templates in the manifest are the
published token ids, which the model's 16384-entry embedding accepts whatever the tokenizer.
"""

from __future__ import annotations

import importlib
import io

SPECIAL_PIECES = (
    "<|im_start|>",
    "<|im_end|>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<|vision_pad|>",
    "<|video_pad|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|audio_pad|>",
    "<user_inst>",
    "</user_inst>",
)
CORPUS_MODULES = (
    "argparse",
    "collections",
    "dataclasses",
    "email",
    "functools",
    "json",
    "logging",
    "os",
    "pathlib",
    "pickle",
    "re",
    "string",
    "subprocess",
    "textwrap",
    "threading",
    "unittest",
    "urllib",
    "zipfile",
)
EXTRA_SENTENCES = (
    "今天天气很好，我们一起去公园散步吧。",
    "这是一个语音合成的测试句子。",
    "これは音声合成のテストです。",
    "The quick brown fox jumps over the lazy dog, 123 times!",
)


def corpus() -> list[str]:
    """Training sentences: standard-library docstrings, one non-empty line each."""
    lines: list[str] = []
    for name in CORPUS_MODULES:
        module = importlib.import_module(name)
        texts = [module.__doc__ or ""]
        texts += [getattr(module, attr).__doc__ or "" for attr in sorted(dir(module))[:200]]
        for text in texts:
            if not isinstance(text, str):
                continue
            lines += [line.strip() for line in text.splitlines() if line.strip()]
    return lines + list(EXTRA_SENTENCES)


def train_tokenizer(vocab_size: int = 4000) -> bytes:
    """The serialized SentencePiece model (deterministic: one thread, fixed corpus)."""
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()),
        model_writer=model,
        model_type="bpe",
        vocab_size=vocab_size,
        hard_vocab_limit=False,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=3,
        user_defined_symbols=list(SPECIAL_PIECES),
        byte_fallback=True,
        normalization_rule_name="nmt_nfkc",
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
    )
    data = model.getvalue()
    check_layout(data)
    return data


def check_layout(data: bytes) -> None:
    """The published id layout: specials 0-3, user pieces 4-14, bytes 15-270."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=data)
    expected = ["<unk>", "<s>", "</s>", "<pad>", *SPECIAL_PIECES, "<0x00>"]
    found = [sp.id_to_piece(i) for i in range(len(expected))]
    if found != expected or sp.id_to_piece(270) != "<0xFF>":
        raise RuntimeError(f"tokenizer id layout differs from the published one: {found}")


__all__ = ["SPECIAL_PIECES", "check_layout", "corpus", "train_tokenizer"]

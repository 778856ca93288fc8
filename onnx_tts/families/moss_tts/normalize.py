"""MOSS-TTS Delay's text clean-up (the published processor passes every text through its
robustness normalizer before the prompt; the Local releases do not). It does no reading of
numbers or dates, only clean-up, in this order:

1. newlines unified, the ideographic space made a space, zero-width and control characters
   dropped (newline, tab and space kept);
2. Markdown: `[text](url)` -> "text url"; per line, a heading `#`, a quote `>`, a list bullet or
   number taken off; empty lines dropped; lines joined with "。";
3. URLs, e-mail addresses, @mentions, u/ and r/ names, #hashtags, dot-names (.env) and
   file-like names (app.js.map, v2.3.1) put aside, untouched by what follows;
4. spaces: runs made one space; none between CJK characters, nor between CJK and digits; one
   between CJK and a Latin word or a put-aside name; none around CJK punctuation, none before
   ASCII , . ; ! ?;
5. structural punctuation: 【】〖〗『』「」 around a leading phrase become a sentence end (twice,
   for chains), a standalone 《title》 unwrapped, arrows (->, =>, →, ...) become "，", dash
   runs (——, --) become "。";
6. repeated punctuation: ellipses and dot runs -> "。", repeated ，!? collapsed, mixed ?! -> "？！";
7. spaces again, the put-aside spans restored, the ends stripped.
"""

from __future__ import annotations

import re
import unicodedata

CJK = "\u3400-\u4dbf\u4e00-\u9fff\u3040-\u30ff"
KEEP = r"___PROT\d+___"
LATINISH = rf"(?:{KEEP}|(?=[A-Za-z0-9._/+:-]*[A-Za-z])[A-Za-z0-9][A-Za-z0-9._/+:-]*)"
ZERO_WIDTH = re.compile(r"[\u200b-\u200d\ufeff]")
SPANS = (
    re.compile(r"https?://[^\s\u3000，。！？；、）】》〉」』]+"),
    re.compile(r"(?<![\w.+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}(?![\w.-])"),
    re.compile(r"(?<![A-Za-z0-9_])@[A-Za-z0-9_]{1,32}"),
    re.compile(r"(?<![A-Za-z0-9_])(?:u|r)/[A-Za-z0-9_]+"),
    re.compile(r"(?<![A-Za-z0-9_])#(?!\s)[^\s#]+"),
    re.compile(r"(?<![A-Za-z0-9_])\.(?=[A-Za-z0-9._-]*[A-Za-z0-9])[A-Za-z0-9._-]+"),
    re.compile(
        r"(?<![A-Za-z0-9_])(?=[A-Za-z0-9._/+:-]*[A-Za-z])(?=[A-Za-z0-9._/+:-]*[._/+:-])"
        r"[A-Za-z0-9](?:[A-Za-z0-9._/+:-]*[A-Za-z0-9])?(?![A-Za-z0-9_])"
    ),
)
LINE_PREFIXES = (r"^#{1,6}\s+", r"^>\s+", r"^[-*+]\s+", r"^\d+[.)]\s+")


def _cleaned(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\u3000", " ")
    text = ZERO_WIDTH.sub("", text)
    return "".join(ch for ch in text if ch in "\n\t " or unicodedata.category(ch)[0] != "C")


def _lines(text: str) -> str:
    text = re.sub(r"\[([^\[\]]+?)\]\((https?://[^)\s]+)\)", r"\1 \2", text)
    kept = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        for prefix in LINE_PREFIXES:
            line = re.sub(prefix, "", line)
        kept.append(line)
    return "。".join(kept)


def _spaces(text: str) -> str:
    text = re.sub(r"[ \t\r\f\v]+", " ", text)
    text = re.sub(rf"([{CJK}])\s+(?=[{CJK}])", r"\1", text)
    text = re.sub(rf"([{CJK}])\s+(?=\d)", r"\1", text)
    text = re.sub(rf"(\d)\s+(?=[{CJK}])", r"\1", text)
    text = re.sub(rf"([{CJK}])(?=({LATINISH}))", r"\1 ", text)
    text = re.sub(rf"(({LATINISH}))(?=[{CJK}])", r"\1 ", text)
    text = re.sub(r" {2,}", " ", text)
    text = re.sub(r"\s+([，。！？；：、”’」』】）》])", r"\1", text)
    text = re.sub(r"([（【「『《“‘])\s+", r"\1", text)
    text = re.sub(r"([，。！？；：、])\s*", r"\1", text)
    text = re.sub(r"\s+([,.;!?])", r"\1", text)
    return re.sub(r" {2,}", " ", text).strip()


def _structure(text: str) -> str:
    for _ in range(2):
        text = re.sub(r"(^|[。！？!?；;]\s*)[【〖『「]([^】〗』」]+)[】〗』」]\s*", r"\1\2。", text)
    text = re.sub(
        r"(^|[。！？!?；;]\s*)《([^》]+)》(?=\s*(?:___PROT\d+___|[—–―-]{2,}|$|[。！？!?；;，,]))",
        r"\1\2",
        text,
    )
    text = re.sub(r"\s*(?:<[-=]+>|[-=]+>|<[-=]+|[→←↔⇒⇐⇔⟶⟵⟷⟹⟸⟺↦↤↪↩])\s*", "，", text)
    return re.sub(r"\s*(?:—|–|―|-){2,}\s*", "。", text)


def _mixed(match: re.Match[str]) -> str:
    marks = match.group(0)
    question, exclaim = any(c in marks for c in "?？"), any(c in marks for c in "!！")
    return "？！" if question and exclaim else "？" if question else "！"


def _repeats(text: str) -> str:
    text = re.sub(r"(?:\.{3,}|…{2,}|……+)", "。", text)
    text = re.sub(r"[。．]{2,}", "。", text)
    text = re.sub(r"[，,]{2,}", "，", text)
    text = re.sub(r"[!！]{2,}", "！", text)
    text = re.sub(r"[?？]{2,}", "？", text)
    return re.sub(r"[!?！？]{2,}", _mixed, text)


def normalize_text(text: str) -> str:
    """The text as the published Delay processor feeds it to the prompt (module docstring)."""
    text = _lines(_cleaned(text))
    kept: list[str] = []

    def keep(match: re.Match[str]) -> str:
        kept.append(match.group(0))
        return f"___PROT{len(kept) - 1}___"

    for pattern in SPANS:
        text = pattern.sub(keep, text)
    text = _spaces(_repeats(_structure(_spaces(text))))
    for index, original in enumerate(kept):
        text = text.replace(f"___PROT{index}___", original)
    return text.strip()


__all__ = ["normalize_text"]

"""MOSS-TTS text: chunks, and the published prompt rows of each release.

Every release fills the `<user_inst>` template (Reference(s) / Instruction / Tokens / Quality /
Sound Event / Ambient Sound / Language / Text; a missing field reads "None"). Channel 0 holds
token ids, channels 1..n_vq the reference codes under the slot rows and the audio pad elsewhere.

* Local v1.5 builds its ids directly (processor `_build_generation_or_voice_clone_codes`):
  im_start, "user\\n", "<user_inst>\\n- Reference(s):\\n", then "None" or audio_start + one
  user-slot row per reference frame + audio_end, then the rest of the template, the text,
  "\\n</user_inst>", im_end, "\\n", im_start, "assistant\\n", audio_start; each piece encoded
  on its own. Continuation appends the prompt audio as assistant-slot rows.
* Local v1 and Delay render the template through the checkpoint's chat template (its strings
  around a lone user message and the generation prompt, rendered once at export:
  bundle.json text.chat), the reference as "[S1]:\\n<|audio|>" expanded to audio_start + one
  user-slot row per frame (Delay: + n_vq - 1 more, the delay pattern's tail, with the codes
  delayed: codebook i shifted down i rows) + audio_end. Local v1 appends an audio_start row.
  Delay's text goes through its robustness clean-up first (normalize.py). Continuation (both):
  the user message without the generation prompt, then the assistant's audio_start and the
  prompt audio's codes (Delay's delayed, cut to the frame count) as generation-slot rows.

Special tokens split the tokenizer's input, so encoding the text around an audio block apart
gives the ids of encoding the whole string. A text that spells one of the model's control
tokens is refused (it would change the prompt's structure).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnx_tts.errors import InputError
from onnx_tts.families.base import TextFrontend
from onnx_tts.families.moss_tts.layout import USER_END, MossLayout
from onnx_tts.families.moss_tts.normalize import normalize_text
from onnx_tts.frontend import TextTokenizer, split_sentences

FIELDS = ("instruction", "tokens", "quality", "sound_event", "ambient_sound", "language")
TEMPLATE = (
    "<user_inst>\n- Reference(s):\n{reference}\n- Instruction:\n{instruction}\n- Tokens:\n"
    "{tokens}\n- Quality:\n{quality}\n- Sound Event:\n{sound_event}\n- Ambient Sound:\n"
    "{ambient_sound}\n- Language:\n{language}\n- Text:\n{text}\n</user_inst>"
)
PLACEHOLDER = "<|audio|>"
CONTROL = re.compile(r"<\|[a-z_]+\|>|</?(user_inst|think|tool_call|tool_response)>")
DEFAULT_CHUNK_CHARS = 400
MAX_CHUNK_CHARS = 1 << 16


@dataclass(frozen=True)
class Prompt:
    """A request's prompt rows [T, 1 + n_vq] int64 and how many leading rows depend only on
    the voice (the reference block: a prefix the prefix cache may share)."""

    rows: np.ndarray
    prefix: int


class MossText(TextFrontend):
    """Chunks of a text (one chunk, exactly as given, when it fits `max_chunk_chars`; else
    sentences packed up to it; the published processors normalize nothing for the Local
    releases) and the prompt rows."""

    def __init__(self, layout: MossLayout, tokenizer: TextTokenizer) -> None:
        self.layout = layout
        self.tokenizer = tokenizer

    def chunks(self, text: str, options: Mapping[str, Any]) -> list[str]:
        limit = int(options.get("max_chunk_chars") or DEFAULT_CHUNK_CHARS)
        if not text.strip():
            raise InputError("text has nothing to speak")
        found = CONTROL.search(text)
        if found:
            raise InputError(
                f"text contains {found.group(0)!r}, a control token of the model's prompt; "
                "remove it"
            )
        if len(text) <= limit:
            return [text]  # as given, as the published processors take it
        chunks: list[str] = []
        for sentence in split_sentences(" ".join(text.split()), limit):
            if chunks and len(chunks[-1]) + 1 + len(sentence) <= limit:
                chunks[-1] = f"{chunks[-1]} {sentence}"
            else:
                chunks.append(sentence)
        return chunks

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    # -- prompt rows ---------------------------------------------------------------------------
    def _rows(self, ids: Sequence[int]) -> np.ndarray:
        out = np.full((len(ids), self.layout.row_width), self.layout.audio_pad, np.int64)
        out[:, 0] = ids
        return out

    def _audio(self, codes: np.ndarray, slot: int) -> np.ndarray:
        out = np.full((len(codes), self.layout.row_width), self.layout.audio_pad, np.int64)
        out[:, 0] = slot
        out[:, 1:] = codes
        return out

    def prompt(
        self,
        text: str,
        fields: Mapping[str, Any],
        reference: np.ndarray | None = None,
        continuation: np.ndarray | None = None,
    ) -> Prompt:
        """The prompt of `text` with the voice's `reference` codes [F, n_vq] (None: no
        reference), or `continuation` codes the speech continues (Local v1.5 and v1)."""
        if self.layout.variant == "local-v1.5":
            return self._prompt_v15(text, fields, reference, continuation)
        if continuation is not None:
            return self._continuation_chat(text, fields, continuation)
        return self._prompt_chat(text, fields, reference)

    def _prompt_v15(self, text, fields, reference, continuation) -> Prompt:
        t, encode = self.layout.tokens, self.encode

        def value(key: str) -> str:
            given = fields.get(key)
            return "None" if given is None or not str(given).strip() else str(given).strip()

        after = (
            "\n- Instruction:\n"
            + value("instruction")
            + "\n- Tokens:\n"
            + value("tokens")
            + "\n- Quality:\n"
            + value("quality")
            + "\n- Sound Event:\n"
            + value("sound_event")
            + "\n- Ambient Sound:\n"
            + value("ambient_sound")
            + "\n- Language:\n"
            + value("language")
            + "\n- Text:\n"
        )
        prefix = [t.im_start, *encode("user\n"), *encode("<user_inst>\n- Reference(s):\n")]
        tail = [
            *encode(after),
            *encode(text),
            *encode("\n</user_inst>"),
            t.im_end,
            *encode("\n"),
            t.im_start,
            *encode("assistant\n"),
            t.audio_start,
        ]
        if reference is not None:
            head = np.concatenate(
                [
                    self._rows([*prefix, t.audio_start]),
                    self._audio(reference, t.user_slot),
                    self._rows([t.audio_end]),
                ]
            )
            return Prompt(np.concatenate([head, self._rows(tail)]), len(head))
        rows = self._rows([*prefix, *encode("None"), *tail])
        if continuation is not None:
            rows = np.concatenate([rows, self._audio(continuation, t.assistant_slot)])
        return Prompt(rows, 0)

    def _continuation_chat(self, text, fields, codes) -> Prompt:
        """Mode "continuation" of Local v1 and Delay: the user message without the generation
        prompt, then the assistant message holding the codes as generation-slot rows after
        its audio_start, cut after them (the processor's truncation; Delay's codes delayed,
        so the last n_vq - 1 frames are there only in part and the model completes them)."""
        layout, chat, t = self.layout, self.layout.chat, self.layout.tokens
        codes = np.asarray(codes, np.int64)
        if layout.variant == "delay":
            text = normalize_text(text)
            codes = delay_pattern(codes, layout.audio_pad)[: len(codes)]
        content = TEMPLATE.format(
            reference="None", text=text, **{key: str(fields.get(key)) for key in FIELDS}
        )
        user = self.encode(chat["user_prefix"] + content + chat[USER_END])
        head = [*self.encode(chat["assistant_prefix"]), t.audio_start]
        rows = [self._rows(user), self._rows(head), self._audio(codes, t.assistant_slot)]
        return Prompt(np.concatenate(rows), 0)

    def _prompt_chat(self, text, fields, reference) -> Prompt:
        layout, t = self.layout, self.layout.tokens
        delay = layout.variant == "delay"
        if delay:  # the published Delay processor cleans every text up first
            text = normalize_text(text)
        content = TEMPLATE.format(
            reference="None" if reference is None else f"[S1]:\n{PLACEHOLDER}",
            text=text,
            **{key: str(fields.get(key)) for key in FIELDS},
        )
        rendered = layout.chat["user_prefix"] + content + layout.chat["user_suffix"]
        if reference is None:
            rows = self._rows(self.encode(rendered))
            prefix = 0
        else:
            before, after = rendered.split(PLACEHOLDER)
            head = self.encode(before)
            codes = np.asarray(reference, np.int64)
            if delay:
                codes = delay_pattern(codes, layout.audio_pad)
            block = np.concatenate(
                [
                    self._rows([*head, t.audio_start]),
                    self._audio(codes, t.user_slot),
                    self._rows([t.audio_end]),
                ]
            )
            rows = np.concatenate([block, self._rows(self.encode(after))])
            prefix = len(block)
        if layout.variant == "local-v1":
            rows = np.concatenate([rows, self._rows([t.audio_start])])
        return Prompt(rows, prefix)


def delay_pattern(codes: np.ndarray, pad: int) -> np.ndarray:
    """Delay's layout of codes [F, n_vq]: codebook i shifted down i rows, [F + n_vq - 1, n_vq]
    with the pad code around."""
    frames, n_vq = codes.shape
    delayed = np.full((frames + n_vq - 1, n_vq), pad, np.int64)
    for i in range(n_vq):
        delayed[i : i + frames, i] = codes[:, i]
    return delayed


def continuation_options(given: Mapping[str, Any], layout: MossLayout) -> dict[str, Any]:
    """A request's `continuation` and `reference_text`, checked: a continuation (the reference
    audio is the start of the speech) needs the reference's transcript,
    as the published apps require; the transcript alone means nothing. {} when it does not
    continue."""
    variant = layout.variant
    reference_text = given.get("reference_text")
    if not given.get("continuation"):
        if reference_text is not None:
            raise InputError(
                "reference_text is the transcript a continuation starts from; add "
                "continuation=True (--continuation) or drop it"
            )
        return {}
    if variant != "local-v1.5" and USER_END not in layout.chat:
        raise InputError(
            f"{layout.root} was exported before continuation was built: export it again "
            "(its bundle.json lacks text.chat.user_end)"
        )
    if reference_text is None or not reference_text.strip():
        raise InputError(
            "continuation needs reference_text, the transcript of the reference audio (it "
            "goes before the text, as the published apps require)"
        )
    if len(reference_text) > MAX_CHUNK_CHARS:
        raise InputError(f"reference_text is longer than {MAX_CHUNK_CHARS} characters")
    found = CONTROL.search(reference_text)
    if found:
        raise InputError(
            f"reference_text contains {found.group(0)!r}, a control token of the model's "
            "prompt; remove it"
        )
    return {"continuation": True, "reference_text": reference_text}


__all__ = [
    "DEFAULT_CHUNK_CHARS",
    "FIELDS",
    "MAX_CHUNK_CHARS",
    "MossText",
    "Prompt",
    "continuation_options",
    "delay_pattern",
]

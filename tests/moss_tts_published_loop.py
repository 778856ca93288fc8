"""A paraphrase of the published MOSS-TTS generation loops in torch (float32), the reference the
moss-tts family is tested against. Written from the published code (OpenMOSS/MOSS-TTS
`moss_tts_local_v1.5/{processing,modeling}_moss_tts.py`, `moss_tts_local/{processing,
modeling}_moss_tts.py` `CustomMixin._sample`, `moss_tts_delay/{processing,modeling}_moss_tts.py`
and `inference_utils.py`), with the project's torch modules (export/moss_tts/modules.py) for the
forward math. Batch of one, as each request of the engine is a row of its own.

One thing differs, by design: the published loops draw with `torch.multinomial`; here every
sampled token takes one uniform `u` from a numpy Generator (`np.random.default_rng(seed)`, one
draw per sampled token in the published order: Local v1.5 the continue/stop decision then codes
0..11; Local v1 channels 0..n; Delay the text token when it is sampled, then each sampled
codebook in order) and picks the first token, in vocabulary order, whose cumulative
probability exceeds `u` times the total: the same distribution as multinomial, and the same
draw the engine makes from the same seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from export.backbones.qwen3 import RopeTables
from export.checkpoint import Checkpoint
from export.moss_tts.config import MossConfig, read_config
from export.moss_tts.modules import build_module
from onnx_tts.families.moss_tts.normalize import normalize_text

NEG_INF = float("-inf")


def single_threaded(function):
    """Run a loop with the object's torch threads (`threads`, 1 by default: tiny tensors only
    wait on each other, badly so on a loaded machine), the process's setting restored after."""

    def run(self, *args, **kwargs):
        threads = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            return function(self, *args, **kwargs)
        finally:
            torch.set_num_threads(threads)

    return run


# -- sampling paraphrases ------------------------------------------------------------------------
def inverse_cdf(probs: torch.Tensor, u: float) -> int:
    cdf = torch.cumsum(probs.double(), dim=-1)
    index = int(
        torch.searchsorted(
            cdf, torch.tensor([u * float(cdf[-1])], dtype=torch.float64), right=True
        )[0]
    )
    return min(index, int(torch.nonzero(probs > 0)[-1]))


def sample_v15(logits, do_sample, temperature, top_k, top_p, history=None, penalty=1.0, u=None):
    """`MossTTSLocalModel._sample_next_token` (+ `_filter_logits`, `_apply_repetition_penalty`)."""
    scores = logits.float().clone()
    if history is not None and penalty != 1.0 and len(history):
        unique = torch.unique(torch.as_tensor(history))
        picked = scores[unique]
        scores[unique] = torch.where(picked < 0, picked * penalty, picked / penalty)
    if not do_sample:
        return int(torch.argmax(scores))
    scores = scores / temperature
    if top_k is not None and 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k).values[-1]
        scores = scores.masked_fill(scores < kth, NEG_INF)
    if top_p is not None and 0.0 < top_p < 1.0:
        ordered, order = torch.sort(scores, descending=True)
        cumulative = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
        remove = cumulative > top_p
        remove[1:] = remove[:-1].clone()
        remove[0] = False
        drop = torch.zeros_like(remove)
        drop[order] = remove
        scores = scores.masked_fill(drop, NEG_INF)
    return inverse_cdf(torch.softmax(scores, dim=-1), u)


def sample_hf(logits, history, penalty, temperature, top_k, top_p, do_sample, u):
    """Local v1: HF RepetitionPenalty (channels >= 1) -> Temperature -> TopK -> TopP
    (TopPLogitsWarper: ascending sort, cumulative <= 1 - top_p removed, the last kept) ->
    softmax -> multinomial; argmax without processors when the channel is greedy."""
    scores = logits.float().clone()
    if not do_sample:
        return int(torch.argmax(scores))
    if penalty is not None:
        ids = torch.as_tensor(history, dtype=torch.long)
        picked = torch.gather(scores, 0, ids)
        picked = torch.where(picked < 0, picked * penalty, picked / penalty)
        scores = scores.scatter(0, ids, picked)
    scores = scores / temperature
    k = min(top_k, scores.shape[-1])
    scores = scores.masked_fill(scores < torch.topk(scores, k).values[-1], NEG_INF)
    ordered, order = torch.sort(scores, descending=False)
    cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
    remove = cumulative <= (1 - top_p)
    remove[-1:] = False
    scores = scores.masked_fill(remove.scatter(0, order, remove), NEG_INF)
    return inverse_cdf(torch.softmax(scores, dim=-1), u)


def sample_delay(scaled, history, penalty, top_p, top_k, do_sample, u):
    """Delay `inference_utils.sample_token` on logits already divided by the temperature."""
    scores = scaled.float().clone()
    if history is not None and penalty != 1.0:
        unique = torch.unique(torch.as_tensor(history).reshape(-1))
        picked = scores[unique]
        scores[unique] = torch.where(picked > 0, picked / penalty, picked * penalty)
    if not do_sample:
        return int(torch.argmax(scores))
    if top_k is not None and top_k > 0:
        values, indices = torch.topk(scores, min(top_k, scores.shape[-1]))
        kept = torch.full_like(scores, NEG_INF)
        kept[indices] = values
        scores = kept
    if top_p is not None and top_p < 1.0:
        probs = torch.softmax(scores, dim=-1)
        ordered, order = torch.sort(probs, descending=True)
        remove = torch.cumsum(ordered, dim=-1) > top_p
        remove[1:] = remove[:-1].clone()
        remove[0] = False
        scores = scores.masked_fill(torch.zeros_like(remove).scatter(0, order, remove), NEG_INF)
    return inverse_cdf(torch.softmax(scores, dim=-1), u)


# -- prompts -------------------------------------------------------------------------------------
USER_PREFIX = "user\n"
REFERENCE_PREFIX = "<user_inst>\n- Reference(s):\n"
TEMPLATE = (
    "<user_inst>\n- Reference(s):\n{reference}\n- Instruction:\n{instruction}\n- Tokens:\n"
    "{tokens}\n- Quality:\n{quality}\n- Sound Event:\n{sound_event}\n- Ambient Sound:\n"
    "{ambient_sound}\n- Language:\n{language}\n- Text:\n{text}\n</user_inst>"
)
TEMPLATE_FIELDS = ("instruction", "tokens", "quality", "sound_event", "ambient_sound", "language")


def after_reference(fields: dict) -> str:
    def value(key):
        v = fields.get(key)
        return "None" if v is None or not str(v).strip() else str(v).strip()

    return (
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


@dataclass
class Published:
    """One stand-in checkpoint, loaded as the paraphrase runs it."""

    config: MossConfig
    module: torch.nn.Module
    tokenizer: Tokenizer
    chat: tuple[str, str, str, str]  # user prefix, user suffix + generation prompt, assistant
    threads: int = 1  # torch intra-op threads of the loops
    # What the Qwen3 chat template renders after a user message without the generation prompt.
    user_end: str = "<|im_end|>\n"

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    # Local v1.5 (processor `_build_generation_or_voice_clone_codes`, continuation).
    def prompt_v15(self, text, reference=None, fields=None, continuation=None) -> torch.Tensor:
        c, t = self.config, self.config.tokens
        fields = dict(fields or {})
        width = c.channels

        def rows(ids):
            out = torch.full((len(ids), width), c.audio_pad, dtype=torch.long)
            if ids:
                out[:, 0] = torch.tensor(ids)
            return out

        def audio(codes, slot):
            out = torch.full((len(codes), width), c.audio_pad, dtype=torch.long)
            out[:, 0] = slot
            out[:, 1:] = torch.as_tensor(codes)
            return out

        prefix = [t.im_start, *self.encode(USER_PREFIX), *self.encode(REFERENCE_PREFIX)]
        assistant = [
            *self.encode("\n</user_inst>"),
            t.im_end,
            *self.encode("\n"),
            t.im_start,
            *self.encode("assistant\n"),
        ]
        if reference is not None:
            return torch.cat(
                [
                    rows(prefix),
                    rows([t.audio_start]),
                    audio(reference, t.user_slot),
                    rows([t.audio_end]),
                    rows(
                        self.encode(after_reference(fields))
                        + self.encode(text)
                        + assistant
                        + [t.audio_start]
                    ),
                ]
            )
        ids = (
            prefix
            + self.encode("None")
            + self.encode(after_reference(fields))
            + self.encode(text)
            + assistant
            + [t.audio_start]
        )
        if continuation is None:
            return rows(ids)
        return torch.cat([rows(ids), audio(continuation, t.assistant_slot)])

    # Local v1 and Delay (chat template, `_get_unified_codes`).
    def prompt_chat(self, text, reference=None, fields=None, n_vq=None) -> torch.Tensor:
        c, t = self.config, self.config.tokens
        fields = dict(fields or {})
        delay = c.variant == "delay"
        if delay:  # `build_user_message` normalizes the text (checked against the published
            text = normalize_text(text)  # normalizer itself in tests/test_moss_tts.py)
        reference_text = "None" if reference is None else "[S1]:\n<|audio|>"
        content = TEMPLATE.format(
            reference=reference_text,
            text=text,
            **{
                k: str(fields.get(k))
                for k in (
                    "instruction",
                    "tokens",
                    "quality",
                    "sound_event",
                    "ambient_sound",
                    "language",
                )
            },
        )
        rendered = self.chat[0] + content + self.chat[1]
        if reference is None:
            ids = self.encode(rendered)
            codes = torch.full((len(ids), c.n_vq), c.audio_pad, dtype=torch.long)
        else:
            before, after = rendered.split("<|audio|>")
            reference = torch.as_tensor(reference)
            length = len(reference)
            block = [t.audio_start] + [t.user_slot] * length
            if delay:
                block += [t.user_slot] * (c.n_vq - 1)
            block += [t.audio_end]
            ids = self.encode(before) + block + self.encode(after)
            start = len(self.encode(before))
            if delay:
                delayed = torch.full((length + c.n_vq - 1, c.n_vq), c.audio_pad, dtype=torch.long)
                for i in range(c.n_vq):
                    delayed[i : i + length, i] = reference[:, i]
                inner = delayed
            else:
                inner = reference
            codes = torch.cat(
                [
                    torch.full((start + 1, c.n_vq), c.audio_pad, dtype=torch.long),
                    inner,
                    torch.full(
                        (len(ids) - (start + 1 + len(inner)), c.n_vq), c.audio_pad, dtype=torch.long
                    ),
                ]
            )
        rows = torch.cat([torch.tensor(ids)[:, None], codes], dim=1)
        if c.variant == "local-v1":
            start_row = torch.full((1, c.channels), c.audio_pad, dtype=torch.long)
            start_row[0, 0] = t.audio_start
            rows = torch.cat([rows, start_row])
        return rows

    # -- generation ---------------------------------------------------------------------------
    def _backbone(self, ids: torch.Tensor, state: dict, **embed) -> torch.Tensor:
        backbone = (
            self.module.transformer
            if self.config.variant == "local-v1.5"
            else self.module.model.language_model
            if self.config.variant == "local-v1"
            else self.module.language_model
        )
        embeds = self.module.embed(ids[None], **embed)
        length = state.get("length", 0)
        steps = ids.shape[0]
        mask = torch.ones(1, length + steps, dtype=torch.long)
        positions = torch.arange(length, length + steps)[None]
        hidden, state["past"] = backbone(embeds, mask, positions, state.get("past"))
        state["length"] = length + steps
        return hidden[0, -1]

    @single_threaded
    @torch.no_grad()
    def generate_v15(
        self,
        prompt,
        *,
        do_sample=True,
        text_temperature=1.0,
        text_top_p=1.0,
        text_top_k=50,
        audio_temperature=1.7,
        audio_top_p=0.8,
        audio_top_k=25,
        audio_repetition_penalty=1.0,
        max_new_frames=50,
        seed=0,
    ):
        c, t, m = self.config, self.config.tokens, self.module
        rng = np.random.default_rng(seed)
        draw = (lambda: rng.random()) if do_sample else (lambda: None)
        state: dict = {}
        inputs, frames = prompt, []
        for _ in range(max_new_frames):
            g = self._backbone(inputs, state)
            h, past = m.local_transformer(g[None, None], torch.tensor([[0]]))
            h = h[0, -1]
            choice = sample_v15(
                m.local_text_lm_head(h),
                do_sample,
                text_temperature,
                text_top_k,
                text_top_p,
                u=draw(),
            )
            if choice == 1:  # [assistant slot, audio_end][choice]
                break
            frame = []
            for k in range(c.n_vq):
                history = [f[k] for f in frames]
                token = sample_v15(
                    m.audio_logits(h, k),
                    do_sample,
                    audio_temperature,
                    audio_top_k,
                    audio_top_p,
                    history or None,
                    audio_repetition_penalty,
                    u=draw(),
                )
                frame.append(token)
                if k + 1 < c.n_vq:
                    x = m.audio_embeddings[k](torch.tensor([token]))[None]
                    h, past = m.local_transformer(x, torch.tensor([[k + 1]]), past)
                    h = h[0, -1]
            frames.append(frame)
            inputs = torch.tensor([[t.assistant_slot, *frame]])
        return frames

    @single_threaded
    @torch.no_grad()
    def generate_v1(
        self,
        prompt,
        *,
        text_temperature=1.5,
        text_top_p=1.0,
        text_top_k=50,
        audio_temperature=1.0,
        audio_top_p=0.95,
        audio_top_k=50,
        audio_repetition_penalty=1.1,
        n_vq_for_inference=None,
        max_new_tokens=50,
        seed=0,
    ):
        c, t, m = self.config, self.config.tokens, self.module
        rng = np.random.default_rng(seed)
        used = max(1, min(c.n_vq, n_vq_for_inference or c.n_vq))
        samples = [text_temperature > 0] + [audio_temperature > 0] * c.n_vq
        history = prompt.clone()
        state: dict = {}
        inputs, rows = prompt, []
        for _ in range(max_new_tokens):
            g = self._backbone(inputs, state, channels=used)
            # The published loop reruns the causal depth transformer over the whole prefix for
            # every channel; its last position equals a cached step's (the same math).
            x, past = m.speech_embedding_to_local_mlp(g), None
            tokens = []
            for layer in range(1 + used):
                length = 0 if past is None else past[0][0].shape[2]
                mask = torch.ones(1, length + 1, dtype=torch.long)
                out, past = m.local_transformer(x[None, None], mask, None, past)
                logits = m.channel_logits(out[0, -1], layer)
                if layer:
                    logits[c.audio_pad] = NEG_INF
                text = layer == 0
                token = sample_hf(
                    logits,
                    history[:, layer],
                    None if text else audio_repetition_penalty,
                    text_temperature if text else audio_temperature,
                    text_top_k if text else audio_top_k,
                    text_top_p if text else audio_top_p,
                    samples[layer],
                    rng.random() if samples[layer] else None,
                )
                tokens.append(token)
                x = m.speech_embedding_to_local_mlp(
                    m.model.embedding_list[layer](torch.tensor(token))
                )
            row = torch.tensor(tokens + [0] * (c.n_vq - used))
            rows.append(row.tolist())
            history = torch.cat([history, row[None]])
            inputs = row[None]
            if tokens[0] == t.audio_end:
                break
        return rows

    @single_threaded
    @torch.no_grad()
    def generate_delay(
        self,
        prompt,
        *,
        text_temperature=1.5,
        text_top_p=1.0,
        text_top_k=50,
        audio_temperature=1.7,
        audio_top_p=0.8,
        audio_top_k=25,
        audio_repetition_penalty=1.0,
        max_new_tokens=50,
        seed=0,
    ):
        c, t, m = self.config, self.config.tokens, self.module
        rng = np.random.default_rng(seed)
        n_vq, big = c.n_vq, torch.iinfo(torch.int64).max
        text_sample, audio_sample = text_temperature > 0, audio_temperature > 0
        text_temperature = text_temperature if text_sample else 1.0
        audio_temperature = audio_temperature if audio_sample else 1.0
        generation = prompt.clone()
        last = int(prompt[-1, 0])
        continuing = last in (t.audio_start, t.assistant_slot)
        starts = torch.nonzero(prompt[:, 0] == t.audio_start)
        audio_length = (len(prompt) - int(starts[-1])) if continuing and len(starts) else 0
        is_audio, delayed, stopping = bool(continuing and len(starts)), big, False
        state: dict = {}
        inputs = prompt
        for step in range(max_new_tokens):
            hidden = self._backbone(inputs, state)
            logits = [head(hidden) for head in m.lm_heads]
            for k in range(1, len(logits)):
                logits[k][-1] = NEG_INF
            text_logits = logits[0] / text_temperature
            audio_logits = [x / audio_temperature for x in logits[1:]]
            text = t.pad
            if not stopping and delayed < n_vq:
                text = t.delay_slot
            if not stopping and delayed == n_vq:
                text = t.audio_end
                is_audio = False
            if not is_audio:
                for token in (t.pad, t.assistant_slot, t.delay_slot, t.audio_end):
                    text_logits[token] = NEG_INF
            else:
                keep = text_logits[[t.assistant_slot, t.delay_slot]].clone()
                text_logits[:] = NEG_INF
                text_logits[[t.assistant_slot, t.delay_slot]] = keep
            if step == 0:
                text_logits[t.delay_slot] = NEG_INF
            if step <= n_vq:
                text_logits[t.im_end] = NEG_INF
            if not stopping and delayed > n_vq:
                text = sample_delay(
                    text_logits,
                    None,
                    1.0,
                    text_top_p,
                    text_top_k,
                    text_sample,
                    rng.random() if text_sample else None,
                )
            if text == t.audio_start:
                is_audio = True
            if text == t.im_end:
                stopping = True
            codes = [c.audio_pad] * n_vq
            for k in range(n_vq):
                if audio_length > k and (delayed == big or k > delayed - 1):
                    scaled = audio_logits[k].clone()
                    scaled[c.audio_pad] = NEG_INF
                    history = generation[:, 1] if k == 0 else generation[:, 2:]
                    codes[k] = sample_delay(
                        scaled,
                        history,
                        audio_repetition_penalty,
                        audio_top_p,
                        audio_top_k,
                        audio_sample,
                        rng.random() if audio_sample else None,
                    )
            if text in (t.audio_start, t.assistant_slot, t.delay_slot):
                audio_length += 1
            if text == t.audio_end:
                audio_length = 0
            if delayed == big and text == t.delay_slot:
                delayed = 0
            if delayed != big:
                delayed += 1
            if delayed > n_vq:
                delayed = big
            row = torch.tensor([[text, *codes]])
            generation = torch.cat([generation, row])
            inputs = row
            if stopping:
                break
        return generation[len(prompt) :].tolist()


def de_delay(rows: list[list[int]], n_vq: int, pad: int) -> list[list[int]]:
    """`apply_de_delay_pattern` of the generated rows' codes, all-pad frames dropped (the
    processor decodes the non-pad segments)."""
    codes = torch.tensor([r[1:] for r in rows])
    count = codes.shape[0] - n_vq + 1
    if count <= 0:
        return []
    frames = torch.stack([codes[i : i + count, i] for i in range(n_vq)], dim=1)
    return [f for f in frames.tolist() if not all(x == pad for x in f)]


def continuation_prompt(loop: Published, prompt_text: str, text: str, codes, fields=None):
    """Mode "continuation" with a prompt audio. Local v1.5 (streaming `build_processor_inputs`):
    the text is `prompt_text + text` (as written there), the prompt audio's codes follow as
    assistant-slot rows (`_build_continuation_codes`). Local v1 (the app's "Continuation": the
    transcript written before the text): the user message rendered without the generation
    prompt, then the assistant message `<|audio|>` as `_get_unified_codes` makes it with
    truncation: its ids up to audio_start, the codes under generation-slot rows, the text cut
    to the codes' length (audio_end and the message's end dropped)."""
    codes = np.array(codes)
    if loop.config.variant == "local-v1.5":
        return loop.prompt_v15(prompt_text + text, fields=fields, continuation=codes)
    if loop.config.variant == "delay":
        return delay_continuation_prompt(loop, prompt_text + text, codes, fields)
    c, t = loop.config, loop.config.tokens
    content = TEMPLATE.format(
        reference="None",
        text=prompt_text + text,
        **{k: str((fields or {}).get(k)) for k in TEMPLATE_FIELDS},
    )
    user = loop.encode(loop.chat[0] + content + loop.user_end)
    assistant = [*loop.encode(loop.chat[2]), t.audio_start]
    ids = torch.tensor(user + assistant + [t.assistant_slot] * len(codes))
    audio = torch.full((len(ids), c.n_vq), c.audio_pad, dtype=torch.long)
    audio[len(user) + len(assistant) :] = torch.as_tensor(codes)
    return torch.cat([ids[:, None], audio], dim=1)


def delay_continuation_prompt(loop: Published, text: str, codes, fields=None) -> torch.Tensor:
    """Delay's processor in mode "continuation" (`__call__`, `_get_unified_codes`): the user
    message (`build_user_message` normalizes the text) rendered without the generation prompt;
    the assistant message `<|audio|>` rendered and expanded to audio_start + gen_slot x P +
    delay_slot x (n_vq - 1) + audio_end; its codes delayed (`apply_delay_pattern`) after pad
    rows up to audio_start; truncation cuts the last n_vq - 1 rows of the delayed codes, then
    the ids to the codes' length."""
    c, t = loop.config, loop.config.tokens
    content = TEMPLATE.format(
        reference="None",
        text=normalize_text(text),
        **{k: str((fields or {}).get(k)) for k in TEMPLATE_FIELDS},
    )
    user = torch.tensor(loop.encode(loop.chat[0] + content + loop.user_end))
    user_rows = torch.cat(
        [user[:, None], torch.full((len(user), c.n_vq), c.audio_pad, dtype=torch.long)], dim=1
    )
    name = loop.tokenizer.id_to_token
    block = (
        name(t.audio_start)
        + name(t.assistant_slot) * len(codes)
        + name(t.delay_slot) * (c.n_vq - 1)
        + name(t.audio_end)
    )
    ids = torch.tensor(loop.encode(loop.chat[2] + block + loop.chat[3]))
    start = int(torch.nonzero(ids == t.audio_start)[0])
    codes = torch.as_tensor(codes)
    delayed = torch.full((len(codes) + c.n_vq - 1, c.n_vq), c.audio_pad, dtype=torch.long)
    for i in range(c.n_vq):
        delayed[i : i + len(codes), i] = codes[:, i]
    audio = torch.cat(
        [torch.full((start + 1, c.n_vq), c.audio_pad, dtype=torch.long), delayed[: -(c.n_vq - 1)]]
    )
    assistant = torch.cat([ids[: len(audio), None], audio], dim=1)
    return torch.cat([user_rows, assistant])


@torch.no_grad()
def delay_continuation_decode(
    loop: Published, codec, prompt, rows
) -> tuple[list[list[int]], np.ndarray]:
    """Delay's `generate` output and processor `decode` after a continuation prompt: the rows
    from the last im_start + 3 on (the prompt's audio_start row and reference rows, then the
    generated ones) de-delayed, the first segment of non-pad frames decoded whole by the torch
    codec and `int(samples * start_length / frames)` samples cut (`start_length` counts the
    rows from that audio_start row to the prompt's end). (frames, audio [samples, channels])."""
    c = loop.config
    n_vq, pad = c.n_vq, c.audio_pad
    whole = torch.cat([prompt, torch.tensor(rows, dtype=torch.long)])
    start = int(torch.nonzero(prompt[:, 0] == c.tokens.im_start)[-1]) + 3
    start_length = len(prompt) - start
    codes = whole[start:, 1:]
    count = codes.shape[0] - n_vq + 1
    frames = torch.stack([codes[i : i + count, i] for i in range(n_vq)], dim=1)
    real = (frames != pad).any(dim=1).tolist()
    first = real.index(True)
    end = real.index(False, first) if False in real[first:] else len(real)
    segment = frames[first:end]
    audio = codec.decode(segment.T[:, None, :])[0].T.numpy()
    ratio = max(0.0, min(float(start_length) / float(len(segment)), 1.0))
    return segment.tolist(), audio[int(audio.shape[0] * ratio) :]


@torch.no_grad()
def primed_stream_decode(codec, prime, frames) -> np.ndarray:
    """The published streaming codec worker (`synthesize_stream._codec_worker`) on the torch
    codec (export/moss_audio_tokenizer `decode_step`): one stream decodes the prompt audio's
    codes first, that audio dropped, then the generated frames. [samples, channels]."""

    def codes(rows) -> torch.Tensor:
        return torch.as_tensor(np.array(rows, np.int64)).T[:, None, :].contiguous()

    offsets, caches = codec.initial_state()
    _, offsets, caches = codec.decode_step(codes(prime), offsets, caches)
    audio, _, _ = codec.decode_step(codes(frames), offsets, caches)
    return audio[0].T.numpy()


def load(checkpoint_dir: Path, rope: str | None = "auto") -> Published:
    """The stand-in at `checkpoint_dir` as the paraphrase runs it. `rope` "auto": tables
    rounded through the checkpoint's stored dtype when it is bfloat16 (as the exporter does)."""
    with Checkpoint(checkpoint_dir) as checkpoint:
        config = read_config(checkpoint.config, checkpoint.names, str(checkpoint_dir))
        stored = checkpoint.config.get("torch_dtype")
        tables = RopeTables("bfloat16" if rope == "auto" and stored == "bfloat16" else None)
        module = build_module(config, tables).eval()
        checkpoint.load_into(module)
    tokenizer = Tokenizer.from_file(str(Path(checkpoint_dir) / "tokenizer.json"))
    # What the Qwen3 chat template renders for one user message with the generation prompt,
    # and for one assistant message.
    chat = (
        "<|im_start|>user\n",
        "<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>assistant\n",
        "<|im_end|>\n",
    )
    return Published(config, module, tokenizer, chat)


__all__ = [
    "Published",
    "continuation_prompt",
    "de_delay",
    "delay_continuation_decode",
    "load",
    "primed_stream_decode",
    "sample_delay",
    "sample_hf",
    "sample_v15",
]

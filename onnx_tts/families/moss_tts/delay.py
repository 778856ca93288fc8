"""MOSS-TTS Delay's step: the text channel's state machine and the delay pattern, per row
(the published `MossTTSDelayModel.generate`, batch-invariant: each row alone).

Text: outside audio every token but pad, the two slots and audio_end may be sampled (at step 0
not the delay slot, for the first n_vq + 1 steps not im_end); inside audio only the generation
or the delay slot; once the delay slot comes, n_vq - 1 more delay slots are forced, then
audio_end, and text is free again (im_end stops). Codebook k is sampled when k < the audio's
length so far and k >= the steps since the delay slot; pad (1024) otherwise.

Heads run only where the step reads them: `heads_text` (the whole vocabulary) for a free text
step outside audio, `heads_audio` (the two slot rows of the text head, every codebook's head)
otherwise; a forced text token reads no text logits. Inside audio the text token is drawn
from the two slot logits alone, which is the full distribution's draw exactly (every other
token is -inf there, and the two slots keep their vocabulary order).

Frames leave the pattern as soon as they are whole: frame t is codebook i of generated row
t + i, so it is complete with row t + n_vq - 1; frames of pad only (before and after the audio)
are not audio and are skipped. A continuation's prompt ends inside the pattern (its audio's
codes delayed, the last n_vq - 1 rows in the history as if generated): its last n_vq - 1
frames, each partly the prompt's codes and partly generated, leave first.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from onnx_tts.decoding.channel_sampling import sample_channel
from onnx_tts.families.moss_tts.layout import MossLayout
from onnx_tts.families.moss_tts.sampling import STEPS
from onnx_tts.session import LazySession, Session

NOT_DELAYED = np.iinfo(np.int64).max
STOPS = ("im_end", "audio_end")


@dataclass
class DelayState:
    is_audio: np.ndarray  # [rows] bool
    audio_length: np.ndarray  # [rows]
    delayed: np.ndarray  # [rows] steps since the delay slot (NOT_DELAYED: none)
    generated: np.ndarray  # [rows] rows generated
    history: np.ndarray  # [rows, n_vq, n_vq] the last n_vq generated codes, by row % n_vq
    stop_at_audio_end: np.ndarray  # [rows] bool


class DelayStep:
    def __init__(self, layout: MossLayout, heads_text, heads_audio) -> None:
        self.layout = layout
        self.heads_text, self.heads_audio = heads_text, heads_audio
        self.steps = STEPS["delay"]

    def new_state(self, rows: int) -> DelayState:
        n_vq = self.layout.n_vq
        return DelayState(
            is_audio=np.zeros(rows, bool),
            audio_length=np.zeros(rows, np.int64),
            delayed=np.full(rows, NOT_DELAYED, np.int64),
            generated=np.zeros(rows, np.int64),
            history=np.zeros((rows, n_vq, n_vq), np.int64),
            stop_at_audio_end=np.zeros(rows, bool),
        )

    def admit(self, state, row: int, prompt: np.ndarray, stop_at: str) -> None:
        t, d = self.layout.tokens, state.delay
        last = int(prompt[-1, 0])
        starts = np.flatnonzero(prompt[:, 0] == t.audio_start)
        continuing = last in (t.audio_start, t.assistant_slot) and len(starts)
        d.audio_length[row] = len(prompt) - starts[-1] if continuing else 0
        d.is_audio[row] = bool(continuing)
        d.delayed[row] = NOT_DELAYED
        d.generated[row] = 0
        if continuing:  # the prompt's last rows start the pattern (module docstring)
            n_vq = self.layout.n_vq
            tail = prompt[len(prompt) - min(len(prompt), n_vq - 1) :, 1:]
            d.history[row, : n_vq - 1] = self.layout.audio_pad
            d.history[row, n_vq - 1 - len(tail) : n_vq - 1] = tail
            d.generated[row] = n_vq - 1
        d.stop_at_audio_end[row] = stop_at == "audio_end"

    @staticmethod
    def _run(session: Session | LazySession, hidden: np.ndarray) -> dict[str, np.ndarray]:
        session = session.get() if isinstance(session, LazySession) else session
        return session.run({"hidden": np.ascontiguousarray(hidden, np.float32)})

    def step(self, state, rows: np.ndarray, hidden: np.ndarray):
        c, t, d, get = self.layout, self.layout.tokens, state.delay, state.settings.get
        n, n_vq = len(rows), c.n_vq
        time_step = state.steps[rows] - 1
        delayed = d.delayed[rows]
        is_audio = d.is_audio[rows].copy()
        text = np.full(n, t.pad, np.int64)
        forced_delay = delayed < n_vq
        forced_end = delayed == n_vq
        text[forced_delay] = t.delay_slot
        text[forced_end] = t.audio_end
        is_audio[forced_end] = False
        free = delayed > n_vq
        audio_mask = (d.audio_length[rows][:, None] > np.arange(n_vq)) & (
            (delayed == NOT_DELAYED)[:, None] | (np.arange(n_vq) >= delayed[:, None])
        )
        wide = free & ~is_audio
        narrow = free & is_audio
        needs_audio = narrow | audio_mask.any(axis=1)
        audio_out = self._run(self.heads_audio, hidden[needs_audio]) if needs_audio.any() else {}
        slots = np.zeros((n, 2), np.float32)
        audio_logits = np.zeros((n, n_vq, c.codebook + 1), np.float32)
        if needs_audio.any():
            slots[needs_audio] = audio_out["slot_logits"]
            audio_logits[needs_audio] = audio_out["audio_logits"]
        # Text draws come first in each row's order, then the codebooks.
        temperature = get("text_temperature", rows)
        draws = state.settings.draws(rows, free & (temperature > 0))
        if wide.any():
            logits = self._run(self.heads_text, hidden[wide])["text_logits"].astype(np.float32)
            for token in (t.pad, t.assistant_slot, t.delay_slot, t.audio_end):
                logits[:, token] = -np.inf
            logits[time_step[wide] == 0, t.delay_slot] = -np.inf
            logits[time_step[wide] <= n_vq, t.im_end] = -np.inf
            text[wide] = self._sample_text(logits, rows[wide], get, draws[wide])
        if narrow.any():
            pair = slots[narrow].copy()
            pair[time_step[narrow] == 0, 1] = -np.inf
            chosen = self._sample_text(pair, rows[narrow], get, draws[narrow])
            text[narrow] = np.array([t.assistant_slot, t.delay_slot])[chosen]
        is_audio |= text == t.audio_start
        stopping = text == t.im_end
        codes = np.full((n, n_vq), c.audio_pad, np.int64)
        temperature = get("audio_temperature", rows)
        for k in range(n_vq):
            which = np.flatnonzero(audio_mask[:, k])
            if not len(which):
                continue
            logits = audio_logits[which, k].copy()
            logits[:, c.audio_pad] = -np.inf
            seen = state.seen[rows[which], 0] if k == 0 else state.seen[rows[which], 1:].any(1)
            picked = rows[which]
            codes[which, k] = sample_channel(
                logits,
                self.steps,
                temperature[which],
                get("audio_top_k", picked),
                get("audio_top_p", picked),
                get("audio_repetition_penalty", picked),
                seen,
                state.settings.draws(picked, temperature[which] > 0),
            )
        # Counters, as published.
        length = d.audio_length[rows]
        length[np.isin(text, [t.audio_start, t.assistant_slot, t.delay_slot])] += 1
        length[text == t.audio_end] = 0
        delayed = delayed.copy()
        delayed[(delayed == NOT_DELAYED) & (text == t.delay_slot)] = 0
        delayed[delayed != NOT_DELAYED] += 1
        delayed[delayed > n_vq] = NOT_DELAYED
        d.audio_length[rows], d.delayed[rows], d.is_audio[rows] = length, delayed, is_audio
        state.last[rows, 0], state.last[rows, 1:] = text, codes
        state.seen[rows[:, None], np.arange(n_vq)[None, :], codes] = True
        return self._frames(state, rows, codes), stopping | (
            d.stop_at_audio_end[rows] & (text == t.audio_end)
        )

    def _sample_text(self, logits, rows, get, draws) -> np.ndarray:
        return sample_channel(
            logits,
            self.steps,
            get("text_temperature", rows),
            get("text_top_k", rows),
            get("text_top_p", rows),
            draws=draws,
        )

    def _frames(self, state, rows: np.ndarray, codes: np.ndarray) -> list[np.ndarray]:
        c, d = self.layout, state.delay
        n_vq = c.n_vq
        out = []
        for i, row in enumerate(rows):
            r = d.generated[row]
            d.history[row, r % n_vq] = codes[i]
            d.generated[row] = r + 1
            first = r - (n_vq - 1)
            frame = np.zeros((0, n_vq), np.int64)
            if first >= 0:
                picked = d.history[row, (first + np.arange(n_vq)) % n_vq, np.arange(n_vq)]
                if not (picked == c.audio_pad).any():
                    frame = picked[None]
            out.append(frame)
        return out


__all__ = ["NOT_DELAYED", "STOPS", "DelayState", "DelayStep"]

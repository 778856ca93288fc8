"""The per-frame part of the Local releases: the depth transformer over one frame's codes, for
all rows of a backbone step at once, its KV cache chained by the core and emptied every frame.

  LocalV15  `local.onnx` (one GPT-2 block): position 0 takes the backbone's hidden state and
            gives the continue/stop logits and code 0's; position k + 1 takes code k's
            embedding (its input table) and gives code k + 1's logits (the head tied to that
            table). 1 + 11 runs per frame.
  LocalV1   `local.onnx` (input MLP + the stack): position 0 takes the hidden state, position
            k + 1 the embedding of channel k's token (channel 0's is the text table);
            `heads/channel_KK.onnx` turn each position's output into channel K's logits.
            Channel 0 is text (the full vocabulary; audio_end stops after this frame).

Sampling (sampling.py) is the release's; a row's draws come from its own generator in the
published order, and a row that stops draws nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from onnx_tts.decoding.channel_sampling import sample_channel
from onnx_tts.families.moss_tts.layout import MossLayout
from onnx_tts.families.moss_tts.sampling import STEPS, RowSettings
from onnx_tts.families.moss_tts.tables import InputTables
from onnx_tts.session import KVCache, LazySession, Session


@dataclass
class FrameRows:
    """What a frame needs of the rows of one step (arrays in the step's row order)."""

    rows: np.ndarray  # the program's row indices
    hidden: np.ndarray  # [n, hidden] float32
    seen: np.ndarray  # [n, n_vq, codebook + 1] bool: what each codebook's penalty covers
    used: np.ndarray  # [n] codebooks generated (n_vq_for_inference for Local v1)


class _Caches:
    """One local KV cache per batch size, emptied before every frame."""

    def __init__(self, session: Session | LazySession, mode: str) -> None:
        self.session, self.mode = session, mode
        self._caches: dict[int, KVCache] = {}

    def fresh(self, batch: int) -> KVCache:
        cache = self._caches.get(batch)
        if cache is None:
            session = self.session.get() if isinstance(self.session, LazySession) else self.session
            cache = self._caches[batch] = KVCache(session, self.mode, batch_size=batch)
        cache.reset()
        return cache


class LocalV15:
    def __init__(self, layout: MossLayout, session, tables: InputTables, mode: str) -> None:
        self.layout, self.tables = layout, tables
        self.caches = _Caches(session, mode)
        self.steps = STEPS["local-v1.5"]

    def _run(self, cache: KVCache, embeds: np.ndarray, position: int, channel: int) -> dict:
        n = len(embeds)
        feeds = {
            "inputs_embeds": np.ascontiguousarray(embeds[:, None, :], np.float32),
            "position_ids": np.full((n, 1), position, np.int64),
            "channel": np.array(channel, np.int64),
        }
        out = cache.step(feeds, new_tokens=1, output_names=["text_logits", "audio_logits"])
        return {name: value[:, 0] for name, value in out.items()}

    def frames(self, f: FrameRows, settings: RowSettings) -> tuple[np.ndarray, np.ndarray]:
        """(continue [n] bool, codes [n, n_vq] int64) of the step's rows."""
        n, n_vq = len(f.rows), self.layout.n_vq
        get = settings.get
        codes = np.zeros((n, n_vq), np.int64)
        cache = self.caches.fresh(n)
        try:
            out = self._run(cache, f.hidden, 0, 0)
            temperature = get("text_temperature", f.rows)
            choice = sample_channel(
                out["text_logits"],
                self.steps,
                temperature,
                get("text_top_k", f.rows),
                get("text_top_p", f.rows),
                draws=settings.draws(f.rows, temperature > 0),
            )
            going = choice == 0  # [assistant slot, audio_end]
            if not going.any():
                return going, codes
            active = np.flatnonzero(going)
            for k in range(n_vq):
                if k:
                    embeds = self.tables.row(k, codes[:, k - 1])
                    out = self._run(cache, embeds, k, k)
                rows = f.rows[active]
                temperature = get("audio_temperature", rows)
                codes[active, k] = sample_channel(
                    out["audio_logits"][active],
                    self.steps,
                    temperature,
                    get("audio_top_k", rows),
                    get("audio_top_p", rows),
                    get("audio_repetition_penalty", rows),
                    f.seen[active, k, : self.layout.codebook],
                    settings.draws(rows, temperature > 0),
                )
            return going, codes
        finally:
            cache.reset()


class LocalV1:
    def __init__(self, layout: MossLayout, session, heads, tables: InputTables, mode: str):
        self.layout, self.tables, self.heads = layout, tables, heads
        self.caches = _Caches(session, mode)
        self.steps = STEPS["local-v1"]

    def _head(self, channel: int, hidden: np.ndarray) -> np.ndarray:
        session = self.heads[channel]
        session = session.get() if isinstance(session, LazySession) else session
        logits = session.run({"local_hidden": hidden}, ["logits"])["logits"]
        return np.asarray(logits, np.float32)

    def _step(self, cache: KVCache, embeds: np.ndarray) -> np.ndarray:
        n = len(embeds)
        feeds = {
            "inputs_embeds": np.ascontiguousarray(embeds[:, None, :], np.float32),
            "attention_mask": np.ones((n, cache.length + 1), np.int64),
        }
        return cache.step(feeds, new_tokens=1, output_names=["local_hidden"])["local_hidden"][:, 0]

    def frames(self, f: FrameRows, settings: RowSettings) -> np.ndarray:
        """Rows [n, 1 + n_vq] int64: the text token and every codebook (0 past `used`)."""
        n, layout, get = len(f.rows), self.layout, settings.get
        tokens = np.zeros((n, layout.row_width), np.int64)
        cache = self.caches.fresh(n)
        try:
            hidden = self._step(cache, f.hidden)
            for channel in range(1 + int(f.used.max())):
                which = np.flatnonzero(f.used >= channel)
                rows = f.rows[which]
                logits = self._head(channel, hidden)[which]
                text = channel == 0
                if not text:
                    logits[:, layout.audio_pad] = -np.inf
                group = "text" if text else "audio"
                temperature = get(f"{group}_temperature", rows)
                tokens[which, channel] = sample_channel(
                    logits,
                    self.steps,
                    temperature,
                    get(f"{group}_top_k", rows),
                    get(f"{group}_top_p", rows),
                    None if text else get("audio_repetition_penalty", rows),
                    None if text else f.seen[which, channel - 1],
                    settings.draws(rows, temperature > 0),
                )
                if channel < int(f.used.max()):
                    hidden = self._step(cache, self.tables.row(channel, tokens[:, channel]))
            return tokens
        finally:
            cache.reset()


__all__ = ["FrameRows", "LocalV1", "LocalV15"]

"""The local depth transformer of MOSS-TTS-Nano: one frame (continue decision + 16 codes) from
each row's global hidden state, through whichever published graph the directory offers.

Paths, in the published dispatch order (`ort_cpu_runtime.OrtCpuRuntime.generate_audio_frames`):
  greedy_frame        `moss_tts_local_greedy_frame` (not in the official export), greedy only:
                      one run per frame for all rows;
  fixed_frame         `moss_tts_local_fixed_sampled_frame`, sample mode "fixed": one run per
                      frame for all rows, sampling inside the graph from 1 + 16 uniforms per row;
  cached_step         `moss_tts_local_cached_step`: 17 runs per frame (global hidden, text token,
                      then each code), the local KV chained by the core and emptied every frame,
                      tokens sampled on the host;
  decoder             `moss_tts_local_decoder` (static batch 1): the 17 positions recomputed for
                      the text token and each code, per row, tokens sampled on the host.
Every path takes the rows of one step at once and returns their frames and continue flags; the
random draws of a row come only from that row's generator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from onnx_tts.families.moss_tts_nano.layout import MossLayout
from onnx_tts.families.moss_tts_nano.sampling import (
    frame_uniforms,
    greedy_audio,
    penalize,
    sample_rows,
)
from onnx_tts.session import KVCache, LazySession

PATHS = ("greedy_frame", "fixed_frame", "cached_step", "decoder")
PATH_CHOICES = ("auto", *PATHS)  # "auto": the published dispatch


@dataclass
class LocalRows:
    """What a local path needs of the rows of one step (arrays in the step's row order)."""

    hidden: np.ndarray  # [n, hidden] float32
    seen: np.ndarray  # [n, n_vq, codebook] bool: codes already produced in this chunk
    rngs: Sequence[np.random.Generator | None]
    do_sample: np.ndarray  # [n] bool
    text_temperature: np.ndarray
    text_top_k: np.ndarray
    text_top_p: np.ndarray
    audio_temperature: np.ndarray
    audio_top_k: np.ndarray
    audio_top_p: np.ndarray
    penalty: np.ndarray

    def draws(self, which: np.ndarray) -> np.ndarray:
        """One uniform from the generator of each row in `which` (row indices of this step)."""
        return np.array([self.rngs[i].random() for i in which])  # type: ignore[union-attr]


class LocalPath:
    """A way to make frames: `frames(rows)` -> (continue [n] bool, codes [n, n_vq] int32)."""

    name: str

    def __init__(self, layout: MossLayout, session: LazySession) -> None:
        self.config = layout.config
        self.session = session

    def frames(self, rows: LocalRows) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    # Host sampling shared by the recompute and cached-step paths.
    def _text_tokens(
        self, rows: LocalRows, text_logits: np.ndarray, which: np.ndarray
    ) -> np.ndarray:
        """The assistant-slot (continue) or audio-end token of each row in `which`."""
        c = self.config
        candidates = np.array([c.assistant_slot, c.audio_end])
        scores = text_logits[:, candidates].astype(np.float32)
        choice = scores.argmax(axis=1)
        sampled = which[rows.do_sample[which]]
        if len(sampled):
            pick = np.flatnonzero(rows.do_sample[which])
            choice[pick] = sample_rows(
                scores[pick],
                rows.text_temperature[sampled],
                np.minimum(rows.text_top_k[sampled], 2),
                rows.text_top_p[sampled],
                rows.draws(sampled),
            )
        return candidates[choice]

    def _audio_tokens(
        self, rows: LocalRows, logits: np.ndarray, channel: int, which: np.ndarray
    ) -> np.ndarray:
        """Channel `channel`'s code of each row in `which` from its logits [len(which), V]."""
        seen = rows.seen[which, channel]
        tokens = greedy_audio(logits, seen, rows.penalty[which])
        sampled = rows.do_sample[which]
        if sampled.any():
            pick = np.flatnonzero(sampled)
            chosen = which[pick]
            tokens[pick] = sample_rows(
                penalize(logits[pick], seen[pick], rows.penalty[chosen]),
                rows.audio_temperature[chosen],
                rows.audio_top_k[chosen],
                rows.audio_top_p[chosen],
                rows.draws(chosen),
            )
        return tokens


class FixedFrame(LocalPath):
    name = "fixed_frame"

    def frames(self, rows: LocalRows) -> tuple[np.ndarray, np.ndarray]:
        n_vq = self.config.n_vq
        text_u = np.zeros(len(rows.hidden), np.float32)
        audio_u = np.zeros((len(rows.hidden), n_vq), np.float32)
        for i, rng in enumerate(rows.rngs):
            text_u[i], audio_u[i] = frame_uniforms(rng, n_vq)  # type: ignore[arg-type]
        out = self.session.run(
            {
                "global_hidden": rows.hidden,
                "repetition_seen_mask": rows.seen.astype(np.int32),
                "assistant_random_u": text_u,
                "audio_random_u": audio_u,
            }
        )
        return out["should_continue"].reshape(-1) != 0, out["frame_token_ids"].astype(np.int32)


class GreedyFrame(LocalPath):
    name = "greedy_frame"

    def frames(self, rows: LocalRows) -> tuple[np.ndarray, np.ndarray]:
        out = self.session.run(
            {
                "global_hidden": rows.hidden,
                "repetition_seen_mask": rows.seen.astype(np.int32),
                "repetition_penalty": rows.penalty.astype(np.float32),
            }
        )
        return out["should_continue"].reshape(-1) != 0, out["frame_token_ids"].astype(np.int32)


class CachedStep(LocalPath):
    """17 single-position runs per frame over a local KV cache the core chains; the cache is
    emptied at every frame (one cache per batch size, kept between frames)."""

    name = "cached_step"

    def __init__(self, layout: MossLayout, session: LazySession, kv_mode: str) -> None:
        super().__init__(layout, session)
        names = layout.tts_names
        self.pairs = dict(
            zip(
                names["local_cached_input_names"][6:],
                names["local_cached_output_names"][2:],
                strict=True,
            )
        )
        self.kv_mode = kv_mode
        self._caches: dict[int, KVCache] = {}

    def _cache(self, batch: int) -> KVCache:
        cache = self._caches.get(batch)
        if cache is None:
            cache = self._caches[batch] = KVCache(
                self.session.get(), self.kv_mode, batch_size=batch, pairs=self.pairs
            )
        cache.reset()
        return cache

    def _step(self, cache, hidden, text, audio, channel, step_type) -> dict[str, np.ndarray]:
        n = len(hidden)
        feeds = {
            "global_hidden": hidden,
            "text_token_id": np.broadcast_to(np.asarray(text, np.int32), (n,)).copy(),
            "audio_token_id": np.broadcast_to(np.asarray(audio, np.int32), (n,)).copy(),
            "channel_index": np.full(n, channel, np.int32),
            "step_type": np.full(n, step_type, np.int32),
            "past_valid_lengths": np.full(n, cache.length, np.int32),
        }
        return cache.step(feeds, new_tokens=1, output_names=["text_logits", "audio_logits"])

    def frames(self, rows: LocalRows) -> tuple[np.ndarray, np.ndarray]:
        n, n_vq = len(rows.hidden), self.config.n_vq
        codes = np.zeros((n, n_vq), np.int32)
        everyone = np.arange(n)
        cache = self._cache(n)
        try:
            out = self._step(cache, rows.hidden, 0, 0, 0, 0)
            text = self._text_tokens(rows, out["text_logits"], everyone)
            going = text == self.config.assistant_slot
            if not going.any():
                return going, codes
            # Rows that stop draw nothing more; they ride along in the batch (cheaper than
            # reshaping the local cache) and their codes are dropped.
            active = np.flatnonzero(going)
            out = self._step(cache, rows.hidden, text, 0, 0, 1)
            token = np.zeros(n, np.int32)
            token[active] = self._audio_tokens(rows, out["audio_logits"][active, 0], 0, active)
            codes[:, 0] = token
            for channel in range(1, n_vq):
                out = self._step(cache, rows.hidden, 0, token, channel - 1, 2)
                token[active] = self._audio_tokens(
                    rows, out["audio_logits"][active, channel], channel, active
                )
                codes[:, channel] = token
            return going, codes
        finally:
            cache.reset()


class Decoder(LocalPath):
    """The recompute graph (static batch 1): per row, 1 + 16 runs over all 17 positions."""

    name = "decoder"

    def _run(self, hidden: np.ndarray, text: int, prefix: np.ndarray) -> dict[str, np.ndarray]:
        padded = np.full((1, self.config.n_vq - 1), self.config.audio_pad, np.int32)
        padded[0, : len(prefix)] = prefix[: self.config.n_vq - 1]
        return self.session.run(
            {
                "global_hidden": hidden[None],
                "text_token_id": np.array([text], np.int32),
                "audio_prefix_token_ids": padded,
            }
        )

    def frames(self, rows: LocalRows) -> tuple[np.ndarray, np.ndarray]:
        n, n_vq = len(rows.hidden), self.config.n_vq
        codes = np.zeros((n, n_vq), np.int32)
        going = np.zeros(n, bool)
        for i in range(n):
            one = np.array([i])
            out = self._run(rows.hidden[i], 0, codes[i, :0])
            text = int(self._text_tokens(rows, out["text_logits"], one)[0])
            if text != self.config.assistant_slot:
                continue
            going[i] = True
            for channel in range(n_vq):
                out = self._run(rows.hidden[i], text, codes[i, :channel])
                logits = out["audio_logits"][:, channel]
                codes[i, channel] = self._audio_tokens(rows, logits, channel, one)[0]
        return going, codes


def dispatch(available: Sequence[str], sample_mode: str) -> str:
    """The path the published runtime takes for `sample_mode` given the graphs present."""
    if "greedy_frame" in available and sample_mode == "greedy":
        return "greedy_frame"
    if "fixed_frame" in available and sample_mode == "fixed":
        return "fixed_frame"
    if "cached_step" in available:
        return "cached_step"
    return "decoder"


__all__ = [
    "PATHS",
    "PATH_CHOICES",
    "CachedStep",
    "Decoder",
    "FixedFrame",
    "GreedyFrame",
    "LocalPath",
    "LocalRows",
    "dispatch",
]

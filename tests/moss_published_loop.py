"""The published MOSS-TTS-Nano onnxruntime loop, paraphrased as the tests' reference.

Written from reading OpenMOSS/MOSS-TTS-Nano `ort_cpu_runtime.py` and `onnx_tts_runtime.py`
(HEAD 42b4645); nothing is imported from there and nothing of onnx-tts is used: this runs on
onnxruntime's own Python API, exactly the way the published runtime does, so onnx-tts can be
checked against it frame for frame:

* sessions with ORT_ENABLE_ALL, `threads` intra-op threads, one inter-op thread;
* `present_*` outputs copied to the host and fed back as `past_*` every step (names from the
  meta, `[1:]` / `[2:]` slices as published);
* local path dispatch: greedy frame graph (if present and not sampling) -> fixed sampled frame
  graph (if present and sample mode "fixed") -> local cached step (17 runs, local KV fed back
  from the host, started empty each frame) -> local decoder (recompute, 1 + 16 runs);
* one `np.random.default_rng(seed)` per synthesis (1234 when no seed), shared by the chunks in
  order: the fixed frame draws 1 + 16 float32 uniforms per frame (the stop frame too), clamped
  to [0, 0.99999994]; host sampling draws 1 for the text token and 1 per channel, consumed by
  subtracting probabilities in index order; greedy draws nothing;
* repetition penalty over every token already generated on the channel in this chunk;
* chunking of long text at 75 tokens (sentences, then clauses, then a token budget), pauses
  of 0.40 s (<= 4 words) or 0.24 s between chunks; WeTextProcessing / normalize_tts_text are
  off (they are separate text front ends, not part of the ONNX runtime).

`available` (a set of local graph roles) hides local graphs, as a model directory that lacks
them would, so each local path can be exercised on one stand-in directory.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import soundfile
import soxr

MANIFEST_CANDIDATES = (
    "browser_poc_manifest.json",
    "MOSS-TTS-Nano-100M-ONNX/browser_poc_manifest.json",
    "MOSS-TTS-Nano-ONNX-CPU/browser_poc_manifest.json",
)
SENTENCE_END = set(".!?。！？；;")
CLAUSE_SPLIT = set(",，、；;：:")
CLOSING = set("\"'”’)]}）】》」』")
PAUSE_SHORT, PAUSE_LONG = 0.40, 0.24
U_MAX = 0.99999994


# -- host sampling (as the published helpers do it, python floats and all) -------------------
def softmax64(values: np.ndarray) -> np.ndarray:
    top = float(np.max(values))
    exps = np.exp(np.asarray(values - top, dtype=np.float64))
    return exps / np.sum(exps, dtype=np.float64)


def host_sample(values, *, do_sample, temperature, top_k, top_p, rng) -> int:
    if not do_sample:
        return int(np.argmax(values))
    scores = np.asarray(values, dtype=np.float32).copy() / float(temperature)
    if 0 < top_k < scores.shape[0]:
        threshold = float(np.sort(scores)[::-1][top_k - 1])
        scores[scores < threshold] = float("-inf")
    if 0 < top_p < 1:
        ranked = sorted(enumerate(scores.tolist()), key=lambda item: item[1], reverse=True)
        probs = softmax64(np.asarray([s for _, s in ranked], dtype=np.float32))
        drop, total = [], 0.0
        for p in probs:
            total += float(p)
            drop.append(total > float(top_p))
        drop = [False, *drop[:-1]]
        for (index, _), remove in zip(ranked, drop, strict=True):
            if remove:
                scores[index] = float("-inf")
    remaining = float(rng.random())
    for index, p in enumerate(softmax64(scores)):
        remaining -= float(p)
        if remaining <= 0:
            return index
    return int(np.argmax(scores))


def penalize(values: np.ndarray, previous: Iterable[int], penalty: float) -> np.ndarray:
    previous = set(int(t) for t in previous)
    if not previous or penalty == 1.0:
        return values
    out = values.copy()
    for token in previous:
        if 0 <= token < out.shape[0]:
            out[token] = out[token] * penalty if out[token] < 0 else out[token] / penalty
    return out


def greedy_with_penalty(values: np.ndarray, seen: set[int], penalty: float) -> int:
    best, best_score = 0, float("-inf")
    apply = bool(seen) and penalty != 1.0
    for index, value in enumerate(values):
        score = float(value)
        if apply and index in seen:
            score = score * penalty if score < 0 else score / penalty
        if score > best_score:
            best, best_score = index, score
    return best


# -- text chunking --------------------------------------------------------------------------
def _has_cjk(text: str) -> bool:
    return any(
        "\u4e00" <= c <= "\u9fff"
        or "\u3400" <= c <= "\u4dbf"
        or "\u3040" <= c <= "\u30ff"
        or "\uac00" <= c <= "\ud7af"
        for c in text
    )


def _prepare(text: str) -> str:
    text = text.strip().replace("\r", " ").replace("\n", " ")
    while "  " in text:
        text = text.replace("  ", " ")
    if _has_cjk(text):
        return text if text[-1] in SENTENCE_END else text + "。"
    if text[:1].islower():
        text = text[:1].upper() + text[1:]
    if text[-1].isalnum():
        text += "."
    if len(text.split()) < 5:
        text = "        " + text
    return text


def _split(text: str, marks: set[str]) -> list[str]:
    pieces, current, i = [], [], 0
    while i < len(text):
        current.append(text[i])
        if text[i] in marks:
            j = i + 1
            while j < len(text) and text[j] in CLOSING:
                current.append(text[j])
                j += 1
            piece = "".join(current).strip()
            if piece:
                pieces.append(piece)
            current = []
            while j < len(text) and text[j].isspace():
                j += 1
            i = j
            continue
        i += 1
    tail = "".join(current).strip()
    if tail:
        pieces.append(tail)
    return pieces


def _join(left: str, right: str) -> str:
    if not left or not right:
        return left or right
    return left + right if _has_cjk(left) or _has_cjk(right) else f"{left} {right}"


class PublishedLoop:
    def __init__(
        self,
        model_dir: str | Path,
        *,
        threads: int = 1,
        available: set[str] | None = None,
    ) -> None:
        model_dir = Path(model_dir).resolve()
        manifest_path = next(
            (model_dir / c for c in MANIFEST_CANDIDATES if (model_dir / c).is_file()), None
        )
        if manifest_path is None:
            raise FileNotFoundError(f"no browser_poc_manifest.json under {model_dir}")
        self.manifest_dir = manifest_path.parent
        self.manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        files = self.manifest["model_files"]
        tts_meta_path = (self.manifest_dir / files["tts_meta"]).resolve()
        codec_meta_path = (self.manifest_dir / files["codec_meta"]).resolve()
        self.tts_meta = json.loads(tts_meta_path.read_text(encoding="utf-8"))
        self.codec_meta = json.loads(codec_meta_path.read_text(encoding="utf-8"))
        self.threads = threads
        tts_files = dict(self.tts_meta["files"])
        if available is not None:
            tts_files = {
                role: name
                for role, name in tts_files.items()
                if not role.startswith("local_") or role == "local_decoder" or role in available
            }
        tts_dir, codec_dir = tts_meta_path.parent, codec_meta_path.parent
        self.sessions = {
            "prefill": self._session(tts_dir / tts_files["prefill"]),
            "decode": self._session(tts_dir / tts_files["decode_step"]),
            "local_decoder": self._session(tts_dir / tts_files["local_decoder"]),
        }
        for role in ("local_greedy_frame", "local_fixed_sampled_frame", "local_cached_step"):
            if tts_files.get(role):
                self.sessions[role] = self._session(tts_dir / tts_files[role])
        codec = self.codec_meta["files"]
        self.sessions["codec_encode"] = self._session(codec_dir / codec["encode"])
        self.sessions["codec_decode"] = self._session(codec_dir / codec["decode_full"])
        self.sessions["codec_decode_step"] = self._session(codec_dir / codec["decode_step"])
        import sentencepiece

        tokenizer = self.manifest_dir / files.get("tokenizer_model", "tokenizer.model")
        self.sp = sentencepiece.SentencePieceProcessor(model_file=str(tokenizer))
        self.generation = dict(self.manifest["generation_defaults"])
        self.rng = np.random.default_rng(1234)
        self.config = self.manifest["tts_config"]

    def _session(self, path: Path) -> ort.InferenceSession:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    @staticmethod
    def _run(session: ort.InferenceSession, feeds: dict) -> dict[str, np.ndarray]:
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(None, feeds), strict=True))

    # -- text -----------------------------------------------------------------------------
    def encode_text(self, text: str) -> list[int]:
        return [int(t) for t in self.sp.encode(str(text or ""), out_type=int)]

    def count(self, text: str) -> int:
        return len(self.encode_text(text))

    def _budget_split(self, text: str, budget: int) -> list[str]:
        pieces, rest = [], text.strip()
        boundary = CLAUSE_SPLIT | SENTENCE_END | {" "}
        while rest:
            if self.count(rest) <= budget:
                pieces.append(rest)
                break
            low, high, best = 1, len(rest), 1
            while low <= high:
                middle = (low + high) // 2
                candidate = rest[:middle].strip()
                if candidate and self.count(candidate) <= budget:
                    best, low = middle, middle + 1
                elif not candidate:
                    low = middle + 1
                else:
                    high = middle - 1
            cut, prefix = best, rest[:best]
            for i in range(len(prefix) - 1, max(-1, len(prefix) - 25), -1):
                if prefix[i] in boundary:
                    cut = i + 1
                    break
            piece = rest[:cut].strip()
            if not piece:
                piece, cut = rest[:best].strip(), best
            pieces.append(piece)
            rest = rest[cut:].strip()
        return pieces

    def split_text(self, text: str, budget: int = 75) -> list[str]:
        text = str(text or "").strip()
        if not text:
            return []
        budget = max(1, int(budget))
        prepared = _prepare(text)
        slices: list[tuple[int, str]] = []
        for sentence in _split(prepared, SENTENCE_END) or [prepared.strip()]:
            sentence = sentence.strip()
            if not sentence:
                continue
            if (n := self.count(sentence)) <= budget:
                slices.append((n, sentence))
                continue
            clauses = _split(sentence, CLAUSE_SPLIT)
            for clause in clauses if len(clauses) > 1 else [sentence]:
                clause = clause.strip()
                if not clause:
                    continue
                if (n := self.count(clause)) <= budget:
                    slices.append((n, clause))
                    continue
                for piece in self._budget_split(clause, budget):
                    if piece.strip():
                        slices.append((self.count(piece.strip()), piece.strip()))
        chunks, current, tokens = [], "", 0
        for n, piece in slices:
            if not current:
                current, tokens = piece, n
            elif tokens + n > budget:
                chunks.append(current.strip())
                current, tokens = piece, n
            else:
                current = _join(current, piece)
                tokens = self.count(current)
        if current:
            chunks.append(current.strip())
        return chunks if len(chunks) > 1 else [text]

    # -- prompt ---------------------------------------------------------------------------
    def _text_rows(self, ids: list[int]) -> list[list[int]]:
        width = int(self.config["n_vq"]) + 1
        pad = int(self.config["audio_pad_token_id"])
        return [[int(t)] + [pad] * (width - 1) for t in ids]

    def rows(self, prompt_codes: list[list[int]], text_ids: list[int]) -> list[list[int]]:
        templates, c = self.manifest["prompt_templates"], self.config
        n_vq, pad = int(c["n_vq"]), int(c["audio_pad_token_id"])
        audio = []
        for codes in prompt_codes:
            row = [int(c["audio_user_slot_token_id"])] + [pad] * n_vq
            for i in range(min(len(codes), n_vq)):
                row[i + 1] = int(codes[i])
            audio.append(row)
        prefix = [*templates["user_prompt_prefix_token_ids"], int(c["audio_start_token_id"])]
        suffix = [
            int(c["audio_end_token_id"]),
            *templates["user_prompt_after_reference_token_ids"],
            *text_ids,
            *templates["assistant_prompt_prefix_token_ids"],
            int(c["audio_start_token_id"]),
        ]
        return [*self._text_rows(prefix), *audio, *self._text_rows(suffix)]

    # -- local paths ----------------------------------------------------------------------
    def _seen_mask(self, seen: list[set[int]]) -> np.ndarray:
        size = int(self.tts_meta["model_config"]["audio_codebook_sizes"][0])
        mask = np.zeros((1, len(seen), size), dtype=np.int32)
        for channel, tokens in enumerate(seen):
            for token in tokens:
                if 0 <= token < size:
                    mask[0, channel, token] = 1
        return mask

    def _fixed_frame(self, hidden, seen) -> tuple[bool, list[int]]:
        n_vq = int(self.config["n_vq"])
        text_u = np.asarray([min(U_MAX, max(0.0, float(self.rng.random())))], dtype=np.float32)
        audio_u = np.asarray(
            [[min(U_MAX, max(0.0, float(self.rng.random()))) for _ in range(n_vq)]],
            dtype=np.float32,
        )
        out = self._run(
            self.sessions["local_fixed_sampled_frame"],
            {
                "global_hidden": hidden.astype(np.float32, copy=False),
                "repetition_seen_mask": self._seen_mask(seen),
                "assistant_random_u": text_u,
                "audio_random_u": audio_u,
            },
        )
        keep = bool(int(np.asarray(out["should_continue"]).reshape(-1)[0]))
        return keep, [int(t) for t in np.asarray(out["frame_token_ids"]).reshape(-1)]

    def _greedy_frame(self, hidden, seen) -> tuple[bool, list[int]]:
        out = self._run(
            self.sessions["local_greedy_frame"],
            {
                "global_hidden": hidden.astype(np.float32, copy=False),
                "repetition_seen_mask": self._seen_mask(seen),
                "repetition_penalty": np.asarray(
                    [float(self.generation["audio_repetition_penalty"])], dtype=np.float32
                ),
            },
        )
        keep = bool(int(np.asarray(out["should_continue"]).reshape(-1)[0]))
        return keep, [int(t) for t in np.asarray(out["frame_token_ids"]).reshape(-1)]

    def _text_token(self, text_logits: np.ndarray) -> int:
        c, g = self.config, self.generation
        ids = np.asarray(
            [int(c["audio_assistant_slot_token_id"]), int(c["audio_end_token_id"])], np.int32
        )
        scores = text_logits[ids]
        index = host_sample(
            scores,
            do_sample=bool(g["do_sample"]),
            temperature=float(g["text_temperature"]),
            top_k=min(int(g["text_top_k"]), int(scores.shape[0])),
            top_p=float(g["text_top_p"]),
            rng=self.rng,
        )
        return int(ids[index])

    def _audio_token(self, logits: np.ndarray, previous: list[int], seen: set[int]) -> int:
        g = self.generation
        penalty = float(g["audio_repetition_penalty"])
        if not bool(g["do_sample"]):
            return greedy_with_penalty(logits, seen, penalty)
        return host_sample(
            penalize(logits, previous, penalty),
            do_sample=True,
            temperature=float(g["audio_temperature"]),
            top_k=int(g["audio_top_k"]),
            top_p=float(g["audio_top_p"]),
            rng=self.rng,
        )

    def _cached_step(self, hidden, past, *, text, audio, channel, step, length):
        session = self.sessions["local_cached_step"]
        feeds = {
            "global_hidden": hidden.astype(np.float32, copy=False),
            "text_token_id": np.asarray([text], np.int32),
            "audio_token_id": np.asarray([audio], np.int32),
            "channel_index": np.asarray([channel], np.int32),
            "step_type": np.asarray([step], np.int32),
            "past_valid_lengths": np.asarray([length], np.int32),
            **past,
        }
        out = self._run(session, feeds)
        past = {
            name.replace("local_present_", "local_past_"): out[name]
            for name in self.tts_meta["onnx"]["local_cached_output_names"][2:]
        }
        return out["text_logits"].reshape(-1), out["audio_logits"], past

    def _empty_local_past(self) -> dict[str, np.ndarray]:
        config = self.tts_meta["model_config"]
        shape = (1, 0, int(config["local_heads"]), int(config["local_head_dim"]))
        return {
            f"local_past_{kind}_{layer}": np.zeros(shape, np.float32)
            for layer in range(int(config["local_layers"]))
            for kind in ("key", "value")
        }

    @staticmethod
    def _channel(audio_logits: np.ndarray, channel: int) -> np.ndarray:
        width = int(audio_logits.shape[-1])
        return audio_logits.reshape(-1)[channel * width : (channel + 1) * width].astype(np.float32)

    def _local_decoder(self, hidden, text: int, prefix: list[int]):
        n_vq, pad = int(self.config["n_vq"]), int(self.config["audio_pad_token_id"])
        padded = np.full((1, n_vq - 1), pad, np.int32)
        for i in range(min(len(prefix), n_vq - 1)):
            padded[0, i] = int(prefix[i])
        out = self._run(
            self.sessions["local_decoder"],
            {
                "global_hidden": hidden.astype(np.float32, copy=False),
                "text_token_id": np.asarray([text], np.int32),
                "audio_prefix_token_ids": padded,
            },
        )
        return out["text_logits"].reshape(-1), out["audio_logits"]

    # -- generation -----------------------------------------------------------------------
    def generate(
        self, rows: list[list[int]], on_frame: Callable[[list[int]], None] | None = None
    ) -> list[list[int]]:
        c, g = self.config, self.generation
        n_vq, slot = int(c["n_vq"]), int(c["audio_assistant_slot_token_id"])
        onnx_names = self.tts_meta["onnx"]
        out = self._run(
            self.sessions["prefill"],
            {
                "input_ids": np.asarray([rows], np.int32),
                "attention_mask": np.ones((1, len(rows)), np.int32),
            },
        )
        hidden = out["global_hidden"][:, -1, :].astype(np.float32, copy=False)
        length = len(rows)
        past = {
            name.replace("present_", "past_"): out[name]
            for name in onnx_names["prefill_output_names"][1:]
        }
        frames: list[list[int]] = []
        previous: list[list[int]] = [[] for _ in range(n_vq)]
        seen: list[set[int]] = [set() for _ in range(n_vq)]

        def record(frame: list[int]) -> None:
            for channel, token in enumerate(frame):
                previous[channel].append(token)
                seen[channel].add(token)

        for _ in range(int(g["max_new_frames"])):
            frame: list[int] = []
            if "local_greedy_frame" in self.sessions and not bool(g["do_sample"]):
                keep, frame = self._greedy_frame(hidden, seen)
                if not keep:
                    break
                record(frame)
            elif "local_fixed_sampled_frame" in self.sessions and g["sample_mode"] == "fixed":
                keep, frame = self._fixed_frame(hidden, seen)
                if not keep:
                    break
                record(frame)
            elif "local_cached_step" in self.sessions:
                local = self._empty_local_past()
                text_logits, _, local = self._cached_step(
                    hidden, local, text=0, audio=0, channel=0, step=0, length=0
                )
                text = self._text_token(text_logits)
                if text != slot:
                    break
                _, audio_logits, local = self._cached_step(
                    hidden, local, text=text, audio=0, channel=0, step=1, length=1
                )
                token = self._audio_token(self._channel(audio_logits, 0), previous[0], seen[0])
                frame.append(token)
                previous[0].append(token)
                seen[0].add(token)
                for channel in range(1, n_vq):
                    _, audio_logits, local = self._cached_step(
                        hidden,
                        local,
                        text=0,
                        audio=token,
                        channel=channel - 1,
                        step=2,
                        length=channel + 1,
                    )
                    token = self._audio_token(
                        self._channel(audio_logits, channel), previous[channel], seen[channel]
                    )
                    frame.append(token)
                    previous[channel].append(token)
                    seen[channel].add(token)
            else:
                text_logits, _ = self._local_decoder(hidden, 0, [])
                text = self._text_token(text_logits)
                if text != slot:
                    break
                for channel in range(n_vq):
                    _, audio_logits = self._local_decoder(hidden, text, frame)
                    token = self._audio_token(
                        self._channel(audio_logits, channel), previous[channel], seen[channel]
                    )
                    frame.append(token)
                    previous[channel].append(token)
                    seen[channel].add(token)
            frames.append(frame)
            row = np.full((1, 1, n_vq + 1), int(c["audio_pad_token_id"]), np.int32)
            row[0, 0, 0] = slot
            row[0, 0, 1:] = frame
            feeds = {"input_ids": row, "past_valid_lengths": np.asarray([length], np.int32)}
            for name in onnx_names["decode_input_names"][2:]:
                feeds[name] = past[name]
            out = self._run(self.sessions["decode"], feeds)
            hidden = out["global_hidden"][:, -1, :].astype(np.float32, copy=False)
            length += 1
            past = {
                name.replace("present_", "past_"): out[name]
                for name in onnx_names["decode_output_names"][1:]
            }
            if on_frame is not None:
                on_frame(frame)
        return frames

    # -- codec ----------------------------------------------------------------------------
    def decode_full(self, frames: list[list[int]]) -> np.ndarray:
        if not frames:
            return np.zeros((0, int(self.codec_meta["codec_config"]["channels"])), np.float32)
        out = self._run(
            self.sessions["codec_decode"],
            {
                "audio_codes": np.asarray([frames], np.int32),
                "audio_code_lengths": np.asarray([len(frames)], np.int32),
            },
        )
        length = int(out["audio_lengths"].reshape(-1)[0])
        return np.stack([ch[:length] for ch in out["audio"][0]], axis=1).astype(np.float32)

    def initial_codec_state(self) -> dict[str, np.ndarray]:
        spec = self.codec_meta["streaming_decode"]
        state = {}
        for t in spec["transformer_offsets"]:
            state[t["input_name"]] = np.zeros(tuple(t["shape"]), np.int32)
        for a in spec["attention_caches"]:
            state[a["offset_input_name"]] = np.zeros(tuple(a["offset_shape"]), np.int32)
            state[a["cached_keys_input_name"]] = np.zeros(tuple(a["cache_shape"]), np.float32)
            state[a["cached_values_input_name"]] = np.zeros(tuple(a["cache_shape"]), np.float32)
            state[a["cached_positions_input_name"]] = np.full(
                tuple(a["positions_shape"]), -1, np.int32
            )
        return state

    def decode_stream(self, frames: list[list[int]], state: dict) -> np.ndarray:
        n_q = int(self.codec_meta["codec_config"]["num_quantizers"])
        codes = np.zeros((1, len(frames), n_q), np.int32)
        for i, frame in enumerate(frames):
            codes[0, i, : len(frame)] = frame[:n_q]
        out = self._run(
            self.sessions["codec_decode_step"],
            {
                "audio_codes": codes,
                "audio_code_lengths": np.asarray([len(frames)], np.int32),
                **state,
            },
        )
        spec = self.codec_meta["streaming_decode"]
        for t in spec["transformer_offsets"]:
            state[t["input_name"]] = out[t["output_name"]]
        for a in spec["attention_caches"]:
            for kind in ("offset", "cached_keys", "cached_values", "cached_positions"):
                state[a[f"{kind}_input_name"]] = out[a[f"{kind}_output_name"]]
        length = int(out["audio_lengths"].reshape(-1)[0])
        return np.stack([ch[:length] for ch in out["audio"][0]], axis=1).astype(np.float32)

    # -- reference audio ------------------------------------------------------------------
    def load_reference(self, path: str | Path) -> np.ndarray:
        """[1, channels, N] at the codec rate (soundfile + soxr here; the published runtime
        uses torchaudio, whose resampler differs: tests use files already at 48 kHz)."""
        data, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
        config = self.codec_meta["codec_config"]
        target, channels = int(config["sample_rate"]), int(config["channels"])
        if rate != target:
            data = soxr.resample(data, rate, target, quality="HQ").astype(np.float32)
        waveform = data.T  # [channels, N]
        if waveform.shape[0] == 1 and channels > 1:
            waveform = np.repeat(waveform, channels, axis=0)
        elif waveform.shape[0] > 1 and channels == 1:
            waveform = waveform.mean(axis=0, keepdims=True)
        elif waveform.shape[0] != channels:
            raise ValueError(f"cannot convert {waveform.shape[0]} channels to {channels}")
        return np.ascontiguousarray(waveform[None], dtype=np.float32)

    def encode_reference(self, path: str | Path) -> list[list[int]]:
        waveform = self.load_reference(path)
        out = self._run(
            self.sessions["codec_encode"],
            {
                "waveform": waveform,
                "input_lengths": np.asarray([waveform.shape[-1]], np.int32),
            },
        )
        n_q = int(self.codec_meta["codec_config"]["num_quantizers"])
        length = int(np.asarray(out["audio_code_lengths"]).reshape(-1)[0])
        codes = np.asarray(out["audio_codes"], np.int32)
        return [[int(codes[0, f, q]) for q in range(n_q)] for f in range(length)]

    # -- synthesis ------------------------------------------------------------------------
    def synthesize(
        self,
        text: str,
        *,
        voice: str | None = None,
        reference: str | Path | None = None,
        seed: int | None = None,
        sample_mode: str = "fixed",
        max_new_frames: int | None = None,
        streaming: bool = False,
        chunk_tokens: int = 75,
    ) -> dict[str, Any]:
        if sample_mode not in ("greedy", "fixed", "full"):
            raise ValueError(sample_mode)
        self.generation["sample_mode"] = sample_mode
        self.generation["do_sample"] = sample_mode != "greedy"
        if max_new_frames is not None:
            self.generation["max_new_frames"] = int(max_new_frames)
        if seed is not None:
            self.rng = np.random.default_rng(int(seed))
        if reference is not None:
            codes = self.encode_reference(reference)
        else:
            voices = self.manifest["builtin_voices"]
            name = voice or voices[0]["voice"]
            codes = next(v for v in voices if v["voice"] == name)["prompt_audio_codes"]
        chunks = self.split_text(text, chunk_tokens)
        config = self.codec_meta["codec_config"]
        rate, channels = int(config["sample_rate"]), int(config["channels"])
        pieces, all_frames = [], []
        for index, chunk in enumerate(chunks):
            rows = self.rows(codes, self.encode_text(chunk))
            if streaming:
                frames, audio = self._stream_chunk(rows)
            else:
                frames = self.generate(rows)
                audio = self.decode_full(frames)
            pieces.append(audio)
            all_frames.append(frames)
            if index < len(chunks) - 1:
                words = len(chunk.strip().split())
                pause = PAUSE_SHORT if words <= 4 else PAUSE_LONG
                pieces.append(np.zeros((round(rate * pause), channels), np.float32))
        waveform = np.concatenate([p for p in pieces if p.size] or [np.zeros((0, channels))])
        return {"frames": all_frames, "waveform": waveform.astype(np.float32), "chunks": chunks}

    def _stream_chunk(self, rows) -> tuple[list[list[int]], np.ndarray]:
        """Decode while generating, with the published frame budget (1 until first audio or
        while less than 0.2 s ahead of the clock, then 2 / 4 / 8)."""
        rate = int(self.codec_meta["codec_config"]["sample_rate"])
        state = self.initial_codec_state()
        pending: list[list[int]] = []
        emitted: list[np.ndarray] = []
        clock = {"first": None, "samples": 0}

        def budget() -> int:
            if clock["first"] is None:
                return 1
            lead = clock["samples"] / rate - (time.perf_counter() - clock["first"])
            return 1 if lead < 0.20 else 2 if lead < 0.55 else 4 if lead < 1.10 else 8

        def drain(force: bool) -> None:
            if not pending:
                return
            size = budget()
            if not force and len(pending) < size:
                return
            take = len(pending) if force else min(len(pending), size)
            chunk = pending[:take]
            del pending[:take]
            audio = self.decode_stream(chunk, state)
            if len(audio):
                if clock["first"] is None:
                    clock["first"] = time.perf_counter()
                clock["samples"] += len(audio)
                emitted.append(audio)

        def on_frame(frame: list[int]) -> None:
            pending.append(list(frame))
            drain(False)

        frames = self.generate(rows, on_frame)
        drain(True)
        channels = int(self.codec_meta["codec_config"]["channels"])
        audio = np.concatenate(emitted) if emitted else np.zeros((0, channels), np.float32)
        return frames, audio


__all__ = ["PublishedLoop", "greedy_with_penalty", "host_sample", "penalize", "softmax64"]

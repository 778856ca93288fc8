"""The trained voice's model and its training: a phoneme-pointer mel LM.

Every LM step speaks `reduction` mel frames (20 ms each). The runtime keeps a pointer into the
phoneme sequence, and the step's input is the sum of

* a prenet of the previous step's mel frames (zeros at the first step),
* embeddings of the phonemes around the pointer (pointer - 2 ... pointer + 2),
* an embedding of how many steps the pointer has already stayed on its phoneme,
* the speaker embedding (per-band mean and std of a reference's standardised log-mel),

and its output is the step's mel frames plus a 4-way "advance" classifier: move the pointer
by 0, 1, 2 or 3 phonemes after this step. The teacher's per-phoneme durations give both
targets exactly, so the LM never has to discover the alignment: it models acoustics and
when to move on. Speech ends when the pointer passes the last symbol ("$", the trailing
silence). The decoder is the codec-lm architecture (pre-norm GQA, RMSNorm, SwiGLU, rotary),
exported with GroupQueryAttention so the runtime runs it with an in-place KV cache.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
import unicodedata
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from export.codec_lm_model import CodecLMConfig, DecoderLayer, RMSNorm
from export.voice import data
from export.voice.codec import MEL_CONFIG, log_mel
from onnx_tts.families.phoneme_mel import phoneme_windows


@dataclass(frozen=True)
class TrainConfig:
    layers: int = 4
    hidden_size: int = 256
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    ffn_size: int = 768
    n_mels: int = 80
    reduction: int = 2  # mel frames per LM step
    context: tuple[int, ...] = (-2, -1, 0, 1, 2)  # phonemes around the pointer, by offset
    max_progress: int = 24  # steps on one phoneme beyond this share one embedding
    advance_classes: int = 4
    prenet_size: int = 256
    prenet_dropout: float = 0.5
    max_positions: int = 4096
    learning_rate: float = 1e-3
    warmup_steps: int = 300
    batch_steps: int = 3000  # LM steps (tokens) per batch
    # Issue 17: the voice dropped word-final consonants ("watched" -> "watch"). Steps that speak
    # a word's last phoneme weigh `final_weight` times in the mel loss, and an L1 on the
    # frame-to-frame change (weight `delta_weight`) keeps the LM from smoothing short bursts.
    final_weight: float = 1.0
    delta_weight: float = 0.0
    symbols: tuple[str, ...] = field(default_factory=tuple)  # phoneme table (id = index + 1)

    @property
    def frame_width(self) -> int:
        return self.reduction * self.n_mels

    @property
    def output_width(self) -> int:
        return self.frame_width + self.advance_classes

    @property
    def speaker_dim(self) -> int:
        return 2 * self.n_mels

    def decoder_config(self) -> CodecLMConfig:
        return CodecLMConfig(
            hidden_size=self.hidden_size,
            layers=self.layers,
            heads=self.heads,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            ffn_size=self.ffn_size,
            max_positions=self.max_positions,
        )


def speaker_stats(normed_mel: np.ndarray) -> np.ndarray:
    """Speaker embedding: per-band mean and std of standardised log-mel, float32 [2 * n_mels].

    Computed the same way in the exported encoder graph."""
    return np.concatenate([normed_mel.mean(0), normed_mel.std(0)]).astype(np.float32)


# -- model --------------------------------------------------------------------------------------
class VoiceEmbed(nn.Module):
    """(previous frames, phoneme window, progress, speaker) -> LM input vectors."""

    def __init__(self, cfg: TrainConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden_size
        self.prenet1 = nn.Linear(cfg.frame_width, cfg.prenet_size)
        self.prenet2 = nn.Linear(cfg.prenet_size, d)
        self.phonemes = nn.Parameter(torch.randn(len(cfg.context), len(cfg.symbols) + 1, d) * 0.3)
        self.progress = nn.Parameter(torch.randn(cfg.max_progress + 1, d) * 0.1)
        self.speaker = nn.Linear(cfg.speaker_dim, d)

    def forward(
        self,
        previous: torch.Tensor,  # [B,S,frame_width] standardised log-mel
        window: torch.Tensor,  # i64 [B,S,len(context)]
        progress: torch.Tensor,  # i64 [B,S]
        speaker: torch.Tensor,  # [B,speaker_dim]
    ) -> torch.Tensor:
        p = self.cfg.prenet_dropout if self.training else 0.0
        x = F.dropout(F.relu(self.prenet1(previous)), p, training=self.training)
        x = F.dropout(F.relu(self.prenet2(x)), p, training=self.training)
        for k in range(len(self.cfg.context)):
            x = x + self.phonemes[k][window[..., k]]
        x = x + self.progress[progress.clamp(max=self.cfg.max_progress)]
        return x + self.speaker(speaker).unsqueeze(1)


class VoiceLM(nn.Module):
    """The decoder: the codec-lm LM's layers with one linear head (frames + advance logits)."""

    def __init__(self, cfg: TrainConfig) -> None:
        super().__init__()
        decoder = cfg.decoder_config()
        self.layers = nn.ModuleList(DecoderLayer(decoder) for _ in range(cfg.layers))
        self.final_norm = RMSNorm(cfg.hidden_size, decoder.norm_eps)
        self.head = nn.Linear(cfg.hidden_size, cfg.output_width, bias=False)
        from onnx_tts.tools.graph_builder import rotary_tables

        cos, sin = rotary_tables(cfg.max_positions, cfg.head_dim, decoder.rope_theta)
        self.register_buffer("cos_table", torch.from_numpy(cos), persistent=False)
        self.register_buffer("sin_table", torch.from_numpy(sin), persistent=False)
        self.cfg = cfg

    def forward(
        self, x: torch.Tensor, past: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        b, s, _ = x.shape
        if past is None:
            shape = (b, self.cfg.kv_heads, 0, self.cfg.head_dim)
            past = [(x.new_zeros(shape), x.new_zeros(shape)) for _ in self.layers]
        start = past[0][0].shape[2]
        cos, sin = self.cos_table[start : start + s], self.sin_table[start : start + s]
        presents = []
        for layer, layer_past in zip(self.layers, past, strict=True):
            x, present = layer(x, layer_past, cos, sin)
            presents.append(present)
        return self.head(self.final_norm(x)), presents


class VoiceModel(nn.Module):
    def __init__(self, cfg: TrainConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = VoiceEmbed(cfg)
        self.lm = VoiceLM(cfg)


# -- features -----------------------------------------------------------------------------------
@dataclass
class Example:
    mel: np.ndarray  # float16 [steps * reduction, n_mels], standardised
    symbols: np.ndarray  # i64 [N] phoneme ids (1-based)
    pointer: np.ndarray  # i64 [steps] symbol index each step speaks
    voice: str
    stats: np.ndarray  # float32 [speaker_dim] of this utterance


def step_pointer(durations: np.ndarray, steps: int, samples_per_step: int) -> np.ndarray:
    """Index of the symbol whose span holds the middle of each step."""
    ends = np.cumsum(durations)
    middles = np.arange(steps) * samples_per_step + samples_per_step // 2
    return np.minimum(np.searchsorted(ends, middles, side="right"), len(durations) - 1)


def log_mel_frames(audio: np.ndarray) -> np.ndarray:
    return log_mel(torch.from_numpy(audio)[None], MEL_CONFIG)[0].numpy()


def make_example(
    utt: data.Utterance, ids: dict[str, int], mean: np.ndarray, std: np.ndarray, reduction: int
) -> Example:
    mel = (log_mel_frames(utt.audio) - mean) / std
    steps = math.ceil(len(mel) / reduction)
    padded = np.full((steps * reduction, mel.shape[1]), mel.min(initial=0.0), np.float32)
    padded[: len(mel)] = mel
    pointer = step_pointer(utt.durations, steps, MEL_CONFIG.hop_length * reduction)
    return Example(
        padded.astype(np.float16),
        np.array([ids[ch] for ch in utt.phonemes], np.int64),
        pointer.astype(np.int64),
        utt.voice,
        speaker_stats(mel),
    )


def step_inputs(
    symbols: np.ndarray, pointer: np.ndarray, cfg: TrainConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(window i64 [S,W], progress i64 [S], advance i64 [S]) for a pointer path."""
    n, steps = len(symbols), len(pointer)
    window = phoneme_windows(symbols, pointer, cfg.context)
    progress = np.zeros(steps, np.int64)
    for t in range(1, steps):
        progress[t] = progress[t - 1] + 1 if pointer[t] == pointer[t - 1] else 0
    following = np.append(pointer[1:], n)  # after the last step the pointer leaves the text
    advance = np.clip(following - pointer, 0, cfg.advance_classes - 1)
    return window, progress, advance


def word_final_steps(
    symbols: np.ndarray, pointer: np.ndarray, boundaries: np.ndarray
) -> np.ndarray:
    """1.0 for steps that speak a word's last phoneme, else 0.0 (float32 [steps]).

    A step counts when its pointer is on the last phoneme, on the phoneme before it (a short
    final stop is often skipped by the pointer, its burst heard in the step before) or on the
    boundary right after it (the release)."""
    boundary = np.isin(symbols, boundaries)
    following = np.append(boundary[1:], True)
    final = ~boundary & following
    before = np.append(final[1:], False)
    after = np.insert(final[:-1], 0, False) & boundary
    return (final | before | after)[pointer].astype(np.float32)


# -- batches ------------------------------------------------------------------------------------
class Batches:
    def __init__(self, examples: list[Example], cfg: TrainConfig, seed: int) -> None:
        self.examples = examples
        self.cfg = cfg
        self.rng = random.Random(seed)
        # Ids of the symbols that are not phonemes: space, punctuation, "^" and "$".
        self.boundaries = np.array(
            [i + 1 for i, ch in enumerate(cfg.symbols) if unicodedata.category(ch)[0] in "PZS"]
        )
        self.by_voice: dict[str, list[int]] = {}
        for index, example in enumerate(examples):
            self.by_voice.setdefault(example.voice, []).append(index)

    def epoch(self) -> list[list[int]]:
        """Batches of similar length, about `batch_steps` steps each, in random order."""
        order = sorted(
            range(len(self.examples)),
            key=lambda i: len(self.examples[i].pointer) + self.rng.random() * 8,
        )
        batches, current, longest = [], [], 0
        for index in order:
            steps = len(self.examples[index].pointer)
            if current and max(longest, steps) * (len(current) + 1) > self.cfg.batch_steps:
                batches.append(current)
                current, longest = [], 0
            current.append(index)
            longest = max(longest, steps)
        if current:
            batches.append(current)
        self.rng.shuffle(batches)
        return batches

    def tensors(self, indices: list[int]) -> dict[str, torch.Tensor]:
        cfg = self.cfg
        items = [self.examples[i] for i in indices]
        steps = max(len(e.pointer) for e in items)
        b, r, m = len(items), cfg.reduction, cfg.n_mels
        frames = np.zeros((b, steps, r * m), np.float32)
        window = np.zeros((b, steps, len(cfg.context)), np.int64)
        progress = np.zeros((b, steps), np.int64)
        advance = np.zeros((b, steps), np.int64)
        mask = np.zeros((b, steps), np.float32)
        weight = np.zeros((b, steps), np.float32)
        speaker = np.zeros((b, cfg.speaker_dim), np.float32)
        for row, e in enumerate(items):
            s = len(e.pointer)
            frames[row, :s] = e.mel.astype(np.float32).reshape(s, r * m)
            window[row, :s], progress[row, :s], advance[row, :s] = step_inputs(
                e.symbols, e.pointer, cfg
            )
            mask[row, :s] = 1.0
            weight[row, :s] = 1.0 + (cfg.final_weight - 1.0) * word_final_steps(
                e.symbols, e.pointer, self.boundaries
            )
            # Condition on another utterance of the same voice: the model must take the voice
            # from the embedding, not copy the target's own statistics.
            speaker[row] = self.examples[self.rng.choice(self.by_voice[e.voice])].stats
        previous = np.zeros_like(frames)
        previous[:, 1:] = frames[:, :-1]
        return {
            "previous": torch.from_numpy(previous),
            "frames": torch.from_numpy(frames),
            "window": torch.from_numpy(window),
            "progress": torch.from_numpy(progress),
            "advance": torch.from_numpy(advance),
            "mask": torch.from_numpy(mask),
            "weight": torch.from_numpy(weight),
            "speaker": torch.from_numpy(speaker),
        }


def batch_losses(model: VoiceModel, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    cfg = model.cfg
    x = model.embed(batch["previous"], batch["window"], batch["progress"], batch["speaker"])
    out, _ = model.lm(x)
    predicted = out[..., : cfg.frame_width]
    logits = out[..., cfg.frame_width :]
    mask = batch["mask"]
    real = mask.sum()
    weight = batch["weight"]  # 0 on padding, like the mask
    error = (predicted - batch["frames"]).abs().mean(-1)
    mel_l1 = (error * mask).sum() / real
    weighted_l1 = (error * weight).sum() / weight.sum()
    # Frame-to-frame change, in time order across the steps' reduction frames.
    b, s = mask.shape
    time_pred = predicted.reshape(b, s * cfg.reduction, cfg.n_mels)
    time_true = batch["frames"].reshape(b, s * cfg.reduction, cfg.n_mels)
    time_mask = mask.repeat_interleave(cfg.reduction, dim=1)[:, 1:]
    delta_error = (time_pred.diff(dim=1) - time_true.diff(dim=1)).abs().mean(-1) * time_mask
    delta_l1 = delta_error.sum() / time_mask.sum()
    advance_ce = (
        F.cross_entropy(logits.transpose(1, 2), batch["advance"], reduction="none") * mask
    ).sum() / real
    accuracy = ((logits.argmax(-1) == batch["advance"]).float() * mask).sum() / real
    return {
        "loss": weighted_l1 + cfg.delta_weight * delta_l1 + advance_ce,
        "mel_l1": mel_l1,
        "delta_l1": delta_l1,
        "advance_ce": advance_ce,
        "advance_acc": accuracy,
    }


# -- training loop ------------------------------------------------------------------------------
def load_examples(work: Path, cfg: TrainConfig | None) -> tuple[list[Example], TrainConfig, dict]:
    """Featurises every training shard (cached in WORK/features.npz-style files per shard)."""
    shards = sorted((work / "data" / "train").glob("shard-*.npz"))
    if not shards:
        raise SystemExit(f"no data shards in {work / 'data' / 'train'}: run stage data first")
    stats_path = work / "mel_stats.json"
    if stats_path.exists():
        stats = json.loads(stats_path.read_text())
    else:
        first = data.load_shard(shards[0])
        mels = np.concatenate([log_mel_frames(u.audio) for u in first])
        corpus = data.build_corpus()
        stats = {
            "mean": mels.mean(0).tolist(),
            "std": (mels.std(0) + 1e-3).tolist(),
            "symbols": data.phoneme_symbols(corpus["train"] + corpus["heldout"]),
        }
        stats_path.write_text(json.dumps(stats))
    cfg = cfg or TrainConfig()
    cfg = TrainConfig(**{**asdict(cfg), "symbols": tuple(stats["symbols"])})
    ids = {ch: i + 1 for i, ch in enumerate(cfg.symbols)}
    mean, std = np.array(stats["mean"], np.float32), np.array(stats["std"], np.float32)
    examples: list[Example] = []
    for shard in shards:
        cache = work / "features" / f"{shard.stem}-r{cfg.reduction}.pt"
        if cache.exists():
            examples += torch.load(cache, weights_only=False)
            continue
        utts = [u for u in data.load_shard(shard) if all(ch in ids for ch in u.phonemes)]
        made = [make_example(u, ids, mean, std, cfg.reduction) for u in utts]
        cache.parent.mkdir(parents=True, exist_ok=True)
        torch.save(made, cache.with_suffix(".tmp"))
        os.replace(cache.with_suffix(".tmp"), cache)
        examples += made
    if "default_speaker" not in stats:
        default = [e.stats for e in examples if e.voice == data.DEFAULT_VOICE]
        stats["default_speaker"] = np.mean(default, axis=0).tolist()
        stats_path.write_text(json.dumps(stats))
    return examples, cfg, stats


def save_checkpoint(path: Path, model: VoiceModel, optimizer, step: int, stats: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "config": asdict(model.cfg),
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "step": step,
            "stats": stats,
        },
        tmp,
    )
    os.replace(tmp, path)


def train(
    work: Path,
    cfg: TrainConfig,
    minutes: float,
    seed: int,
    init_from: Path | None = None,
    max_steps: int | None = None,
) -> None:
    """Trains WORK/lm/checkpoint.pt for `minutes` more, or until it has taken `max_steps` steps
    in all (a step count reproduces a run on any machine; minutes do not). Without a
    checkpoint the weights start random, or from the bundle `init_from` (its architecture
    replaces `cfg`'s)."""
    torch.manual_seed(seed)
    checkpoint = work / "lm" / "checkpoint.pt"
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    step = 0
    start = None
    if init_from is not None and not checkpoint.exists():
        start = model_from_bundle(init_from, cfg)
        cfg = start.cfg
    examples, cfg, stats = load_examples(work, cfg)
    model = VoiceModel(cfg)
    if start is not None:
        model.load_state_dict(start.state_dict())
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=0.01)
    if checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False)
        if tuple(state["config"]["symbols"]) != cfg.symbols:
            raise SystemExit("checkpoint was trained with another phoneme table")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = int(state["step"])
    params = sum(p.numel() for p in model.parameters())
    print(f"train: {len(examples)} utterances, {params / 1e6:.2f}M params, from step {step}")
    batches = Batches(examples, cfg, seed + step)
    log = (work / "lm" / "log.jsonl").open("a")
    deadline = time.monotonic() + minutes * 60
    last_save = time.monotonic()
    window: dict[str, list[float]] = {}
    model.train()

    def more() -> bool:
        return time.monotonic() < deadline and (max_steps is None or step < max_steps)

    while more():
        for indices in batches.epoch():
            if not more():
                break
            # Linear warm-up, then inverse square root decay.
            lr = cfg.learning_rate * min(
                (step + 1) / cfg.warmup_steps, math.sqrt(cfg.warmup_steps / (step + 1))
            )
            for group in optimizer.param_groups:
                group["lr"] = lr
            losses = batch_losses(model, batches.tensors(indices))
            optimizer.zero_grad(set_to_none=True)
            losses["loss"].backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            step += 1
            for key, value in losses.items():
                window.setdefault(key, []).append(value.item())
            if step % 50 == 0:
                record = {
                    "step": step,
                    "lr": lr,
                    **{k: float(np.mean(v)) for k, v in window.items()},
                }
                log.write(json.dumps(record) + "\n")
                log.flush()
                print(json.dumps(record), flush=True)
                window = {}
            if time.monotonic() - last_save > 300:
                save_checkpoint(checkpoint, model, optimizer, step, stats)
                last_save = time.monotonic()
    save_checkpoint(checkpoint, model, optimizer, step, stats)
    print(f"train: saved step {step}")


def config_from_manifest(manifest: dict, cfg: TrainConfig) -> TrainConfig:
    """`cfg` with the architecture and phoneme table a bundle.json records (the inverse of
    export.voice.bundle.bundle_manifest); the training settings stay `cfg`'s."""
    kv, text = manifest["kv"], manifest["text"]
    return TrainConfig(
        **{
            **asdict(cfg),
            "layers": kv["layers"],
            "heads": kv["heads"],
            "kv_heads": kv["kv_heads"],
            "head_dim": kv["head_dim"],
            "hidden_size": manifest["lm"]["hidden_size"],
            "max_positions": manifest["lm"]["max_positions"],
            "n_mels": manifest["frames"]["n_mels"],
            "reduction": manifest["frames"]["reduction"],
            "context": tuple(text["context"]),
            "max_progress": text["max_progress"],
            "advance_classes": manifest["pointer"]["advance_classes"],
            "symbols": tuple(text["phonemes"]),
        }
    )


# The decoder layers' linear layers: torch attribute -> graph initializer prefix.
_LAYER_LINEARS = {
    "q_proj": "q_proj",
    "k_proj": "k_proj",
    "v_proj": "v_proj",
    "o_proj": "o_proj",
    "gate": "mlp.gate",
    "up": "mlp.up",
    "down": "mlp.down",
}


def model_from_bundle(bundle_dir: Path, cfg: TrainConfig) -> VoiceModel:
    """A VoiceModel holding a built bundle's embed.onnx and lm.onnx weights, so training can
    continue from a bundle when its torch checkpoint is gone. The architecture comes from the
    bundle (`cfg` gives only the training settings); the graphs keep linear weights as
    [in, out], torch as [out, in]."""
    from export.voice.bundle import bundle_initializers, read_manifest

    manifest = read_manifest(bundle_dir)
    weights = bundle_initializers(bundle_dir, manifest, "embed", "lm")
    cfg = replace(
        config_from_manifest(manifest, cfg),
        ffn_size=weights["layers.0.mlp.gate.weight"].shape[1],
        prenet_size=weights["prenet1.weight"].shape[1],
    )
    model = VoiceModel(cfg)
    linear = {
        "embed.prenet1": "prenet1",
        "embed.prenet2": "prenet2",
        "embed.speaker": "speaker",
        "lm.head": "lm_head",
    }
    for i in range(cfg.layers):
        for ours, theirs in _LAYER_LINEARS.items():
            linear[f"lm.layers.{i}.{ours}"] = f"layers.{i}.{theirs}"
    state = {}
    for ours, theirs in linear.items():
        state[f"{ours}.weight"] = weights[f"{theirs}.weight"].T
        if f"{theirs}.bias" in weights:
            state[f"{ours}.bias"] = weights[f"{theirs}.bias"]
    for i in range(cfg.layers):
        for norm in ("attn_norm", "mlp_norm"):
            state[f"lm.layers.{i}.{norm}.weight"] = weights[f"layers.{i}.{norm}.weight"]
    state["lm.final_norm.weight"] = weights["final_norm.weight"]
    state["embed.phonemes"] = np.stack(
        [weights[f"phoneme.{k}.table"] for k in range(len(cfg.context))]
    )
    state["embed.progress"] = weights["progress.table"]
    model.load_state_dict({k: torch.tensor(np.asarray(v)) for k, v in state.items()})
    return model


def blend_weights(model: VoiceModel, base: VoiceModel, share: float) -> VoiceModel:
    """Weight-space interpolation (WiSE-FT): `share` x model + (1 - share) x base, for two
    models of one architecture. A fine-tune blended back toward the weights it started from
    keeps more of the start's robustness (here: following reference voices beyond the
    training warps) and most of the fine-tune's gain."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"blend share must be within [0, 1], got {share}")
    mine, theirs = model.state_dict(), base.state_dict()
    if mine.keys() != theirs.keys() or any(mine[k].shape != theirs[k].shape for k in mine):
        raise ValueError("blend needs two models of the same architecture")
    blended = VoiceModel(model.cfg)
    blended.load_state_dict(
        {
            k: share * mine[k] + (1 - share) * theirs[k] if mine[k].is_floating_point() else mine[k]
            for k in mine
        }
    )
    return blended.eval()


def load_trained(work: Path) -> tuple[VoiceModel, dict]:
    state = torch.load(work / "lm" / "checkpoint.pt", weights_only=False)
    config = dict(state["config"])
    config["context"] = tuple(config["context"])
    config["symbols"] = tuple(config["symbols"])
    model = VoiceModel(TrainConfig(**config))
    model.load_state_dict(state["model"])
    return model.eval(), state["stats"]

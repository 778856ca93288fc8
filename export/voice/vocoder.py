"""The voice's neural vocoder (issue 17): standardised log-mel -> waveform, trained here.

Vocos-style: a Conv1d embedding of the mel frames, ConvNeXt blocks (depthwise Conv1d, LayerNorm,
pointwise MLP with GELU, layer scale, residual) and a linear head that predicts, per mel frame,
the log-magnitude and the phase of one STFT frame with hop = the mel hop. The inverse STFT is
a windowed inverse-DFT ConvTranspose1d + window-envelope normalisation (``bundle.dft_kernels``),
what the ONNX graph computes as an FFT (export.voice.fft; equal to float rounding), so the
network never has to make up samples between frames.

Training: the teacher's audio from the data shards, the network's input is exactly what the LM
emits (log-mel of MEL_CONFIG, standardised with the bundle's statistics). Losses: multi-
resolution STFT (spectral convergence + log-magnitude L1) and L1 on the log-mel itself. No
discriminator: measured first without one (see benchmarks/README_voice.md).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from export.voice.codec import MEL_CONFIG, log_mel


@dataclass(frozen=True)
class VocoderNetConfig:
    n_mels: int = 80
    hidden: int = 192
    intermediate: int = 576
    blocks: int = 6
    kernel: int = 7
    hop: int = 320
    n_fft: int = 1024
    max_log_magnitude: float = math.log(100.0)  # exp() of the head is capped here, as in Vocos

    @property
    def bins(self) -> int:
        return self.n_fft // 2 + 1

    @property
    def receptive_field_frames(self) -> int:
        """Frames either side of a frame that can change its audio: the convolutions' reach
        plus the inverse STFT's (half a synthesis window)."""
        conv = (self.kernel // 2) * (self.blocks + 1)
        return conv + -(-self.n_fft // (2 * self.hop))


class ConvNeXtBlock(nn.Module):
    def __init__(self, cfg: VocoderNetConfig, layer_scale: float) -> None:
        super().__init__()
        self.dwconv = nn.Conv1d(
            cfg.hidden, cfg.hidden, cfg.kernel, padding=cfg.kernel // 2, groups=cfg.hidden
        )
        self.norm = nn.LayerNorm(cfg.hidden, eps=1e-6)
        self.pw1 = nn.Linear(cfg.hidden, cfg.intermediate)
        self.pw2 = nn.Linear(cfg.intermediate, cfg.hidden)
        self.gamma = nn.Parameter(torch.full((cfg.hidden,), layer_scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B,C,T]
        y = self.dwconv(x).transpose(1, 2)
        y = self.pw2(F.gelu(self.pw1(self.norm(y)))) * self.gamma
        return x + y.transpose(1, 2)


class InverseSTFT(nn.Module):
    """(re, im) [B,bins,T] -> audio [B, T*hop]; frame t is centred on sample t*hop, exactly the
    ONNX graph's `bundle.istft`."""

    def __init__(self, n_fft: int, hop: int) -> None:
        super().__init__()
        from export.voice.bundle import dft_kernels

        analysis, synthesis = dft_kernels(n_fft)
        self.register_buffer("kernel", torch.from_numpy(synthesis), persistent=False)
        self.register_buffer(
            "window_sq", torch.from_numpy(analysis[0:1] ** 2).float(), persistent=False
        )
        self.n_fft, self.hop = n_fft, hop

    def forward(self, re: torch.Tensor, im: torch.Tensor) -> torch.Tensor:
        frames = re.shape[-1]
        ola = F.conv_transpose1d(torch.cat([re, im], 1), self.kernel, stride=self.hop)
        ones = torch.ones(1, 1, frames, dtype=re.dtype)
        envelope = F.conv_transpose1d(ones, self.window_sq, stride=self.hop).clamp_min(1e-8)
        half = self.n_fft // 2
        return (ola / envelope)[:, 0, half : half + frames * self.hop]


class NeuralVocoder(nn.Module):
    def __init__(self, cfg: VocoderNetConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Conv1d(cfg.n_mels, cfg.hidden, cfg.kernel, padding=cfg.kernel // 2)
        self.norm = nn.LayerNorm(cfg.hidden, eps=1e-6)
        self.blocks = nn.ModuleList(
            ConvNeXtBlock(cfg, layer_scale=1.0 / cfg.blocks) for _ in range(cfg.blocks)
        )
        self.final_norm = nn.LayerNorm(cfg.hidden, eps=1e-6)
        self.head = nn.Linear(cfg.hidden, 2 * cfg.bins)
        self.istft = InverseSTFT(cfg.n_fft, cfg.hop)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """mel [B,T,n_mels] standardised log-mel -> audio [B, T*hop]."""
        return self.synthesize(mel)[0]

    def synthesize(self, mel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(audio [B, T*hop], predicted phase [B,bins,T]) (the phase for the phase losses)."""
        x = self.embed(mel.transpose(1, 2))
        x = self.norm(x.transpose(1, 2)).transpose(1, 2)
        for block in self.blocks:
            x = block(x)
        out = self.head(self.final_norm(x.transpose(1, 2))).transpose(1, 2)  # [B,2*bins,T]
        log_mag, phase = out[:, : self.cfg.bins], out[:, self.cfg.bins :]
        magnitude = torch.exp(log_mag.clamp(max=self.cfg.max_log_magnitude))
        return self.istft(magnitude * torch.cos(phase), magnitude * torch.sin(phase)), phase


# -- losses -------------------------------------------------------------------------------------
STFT_RESOLUTIONS = ((256, 64), (512, 128), (1024, 256), (2048, 512))


def _stft(audio: torch.Tensor, n_fft: int, hop: int) -> torch.Tensor:
    """Complex STFT with a Hann window, frame t centred on sample t * hop."""
    window = torch.hann_window(n_fft, dtype=audio.dtype)
    return torch.stft(audio, n_fft, hop_length=hop, window=window, return_complex=True)


def _stft_magnitude(audio: torch.Tensor, n_fft: int, hop: int) -> torch.Tensor:
    spec = _stft(audio, n_fft, hop)
    return (spec.real.square() + spec.imag.square()).clamp_min(1e-7).sqrt()


def vocoder_losses(
    predicted: torch.Tensor, target: torch.Tensor, mel_weight: float = 1.0
) -> dict[str, torch.Tensor]:
    """Multi-resolution STFT (spectral convergence + log-magnitude L1, averaged over
    resolutions) and L1 between the bundle's log-mel of both."""
    sc = mag = predicted.new_zeros(())
    for n_fft, hop in STFT_RESOLUTIONS:
        p, t = _stft_magnitude(predicted, n_fft, hop), _stft_magnitude(target, n_fft, hop)
        sc = sc + torch.linalg.norm(t - p) / torch.linalg.norm(t).clamp_min(1e-7)
        mag = mag + F.l1_loss(p.log(), t.log())
    sc, mag = sc / len(STFT_RESOLUTIONS), mag / len(STFT_RESOLUTIONS)
    mel = F.l1_loss(log_mel(predicted, MEL_CONFIG), log_mel(target, MEL_CONFIG))
    return {"loss": sc + mag + mel_weight * mel, "sc": sc, "log_mag": mag, "mel": mel}


def _anti_wrap(x: torch.Tensor) -> torch.Tensor:
    """|x| after wrapping to [-pi, pi]: the distance between two angles."""
    return torch.abs(x - 2 * math.pi * torch.round(x / (2 * math.pi)))


def phase_losses(
    phase: torch.Tensor, target: torch.Tensor, n_fft: int, hop: int
) -> dict[str, torch.Tensor]:
    """Direct supervision of the head's phase [B,bins,T] by the teacher's STFT phase at the
    vocoder's own frames (same window, frame t centred on sample t*hop): instantaneous phase,
    group delay (difference across frequency) and instantaneous frequency (across time), each
    anti-wrapped, weighted by the teacher's magnitude so silence and empty bins do not count."""
    spec = _stft(target, n_fft, hop)[..., : phase.shape[-1]]
    true = torch.angle(spec)
    weight = spec.abs()
    weight = weight / weight.sum(dim=(1, 2), keepdim=True).clamp_min(1e-7)

    def weighted(err: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (err * w).sum(dim=(1, 2)).mean() / w.sum(dim=(1, 2)).mean().clamp_min(1e-7)

    return {
        "ip": weighted(_anti_wrap(phase - true), weight),
        "gd": weighted(
            _anti_wrap(torch.diff(phase, dim=1) - torch.diff(true, dim=1)), weight[:, 1:]
        ),
        "iaf": weighted(
            _anti_wrap(torch.diff(phase, dim=2) - torch.diff(true, dim=2)), weight[..., 1:]
        ),
    }


class SpectrogramDiscriminator(nn.Module):
    """One resolution of a multi-resolution discriminator (as UnivNet/Vocos): 2-D convolutions
    over a log-magnitude spectrogram, strided along frequency. Returns (logits, features)."""

    def __init__(self, n_fft: int, hop: int, channels: int = 12) -> None:
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        kernel, pad = (3, 5), (1, 2)
        self.layers = nn.ModuleList(
            [
                nn.Conv2d(1, channels, kernel, padding=pad),
                nn.Conv2d(channels, channels, kernel, stride=(1, 2), padding=pad),
                nn.Conv2d(channels, channels, kernel, stride=(1, 2), padding=pad),
                nn.Conv2d(channels, channels, kernel, stride=(1, 2), padding=pad),
                nn.Conv2d(channels, channels, (3, 3), padding=(1, 1)),
            ]
        )
        self.out = nn.Conv2d(channels, 1, (3, 3), padding=(1, 1))

    def forward(self, audio: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        x = torch.log(_stft_magnitude(audio, self.n_fft, self.hop)).transpose(1, 2)[:, None]
        features = []
        for layer in self.layers:
            x = F.leaky_relu(layer(x), 0.1)
            features.append(x)
        return self.out(x), features


class MultiResolutionDiscriminator(nn.Module):
    def __init__(
        self, resolutions: tuple[tuple[int, int], ...] = ((1024, 256), (512, 128), (256, 64))
    ):
        super().__init__()
        self.discriminators = nn.ModuleList(SpectrogramDiscriminator(n, h) for n, h in resolutions)

    def forward(self, audio: torch.Tensor) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
        return [d(audio) for d in self.discriminators]


def discriminator_loss(disc: MultiResolutionDiscriminator, real, fake) -> torch.Tensor:
    """Least-squares GAN: real -> 1, generated -> 0."""
    loss = real.new_zeros(())
    for (r, _), (f, _) in zip(disc(real), disc(fake.detach()), strict=True):
        loss = loss + torch.mean((r - 1) ** 2) + torch.mean(f**2)
    return loss


def generator_adversarial_losses(
    disc: MultiResolutionDiscriminator, real: torch.Tensor, fake: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(least-squares adversarial loss, feature-matching L1) of the generated audio."""
    adv = fake.new_zeros(())
    fm = fake.new_zeros(())
    with torch.no_grad():
        real_out = disc(real)
    for (f, f_feats), (_, r_feats) in zip(disc(fake), real_out, strict=True):
        adv = adv + torch.mean((f - 1) ** 2)
        fm = fm + sum(F.l1_loss(a, b) for a, b in zip(f_feats, r_feats, strict=True)) / len(f_feats)
    return adv, fm


# -- data ---------------------------------------------------------------------------------------
def bundle_mel_stats(bundle_dir: Path) -> dict:
    """The bundle's own standardisation (encoder.onnx's mel.mean / mel.std), phoneme table and
    default speaker: what WORK/mel_stats.json holds after LM training, recovered from a bundle
    (the LM's training checkpoint need not exist)."""
    from export.voice.bundle import bundle_initializers, read_manifest

    manifest = read_manifest(bundle_dir)
    values = bundle_initializers(bundle_dir, manifest, "encoder")
    return {
        "mean": values["mel.mean"].astype(np.float64).tolist(),
        "std": values["mel.std"].astype(np.float64).tolist(),
        "symbols": list(manifest["text"]["phonemes"]),
        "default_speaker": list(manifest["default_speaker_embedding"]),
    }


def ensure_mel_stats(work: Path, bundle_dir: Path | None) -> dict:
    """WORK/mel_stats.json, written from `bundle_dir` when missing."""
    path = work / "mel_stats.json"
    if path.exists():
        return json.loads(path.read_text())
    if bundle_dir is None:
        raise SystemExit(f"{path} is missing: run stage train, or pass --lm-from BUNDLE_DIR")
    stats = bundle_mel_stats(bundle_dir)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(stats))
    os.replace(tmp, path)
    return stats


def standardised_mel(audio: np.ndarray, stats: dict) -> np.ndarray:
    mean, std = np.array(stats["mean"], np.float32), np.array(stats["std"], np.float32)
    mel = log_mel(torch.from_numpy(np.asarray(audio, np.float32))[None], MEL_CONFIG)[0].numpy()
    return ((mel - mean) / std).astype(np.float32)


class Clips:
    """Every training utterance as (standardised mel [F,80], audio [F*hop]); random crops."""

    def __init__(
        self, work: Path, stats: dict, hop: int, lm_bundle: Path | None = None, lm_share=0.0
    ) -> None:
        """With `lm_bundle`, a share `lm_share` of the clips (a fixed choice) takes its input
        mel from that bundle's LM run teacher-forced (lm_teacher_forced_mels)."""
        from export.voice import data

        self.hop = hop
        self.mels: list[np.ndarray] = []
        self.audio: list[np.ndarray] = []
        rng = np.random.default_rng(0)
        for shard in sorted((work / "data" / "train").glob("shard-*.npz")):
            utts = data.load_shard(shard)
            mels = [standardised_mel(u.audio, stats) for u in utts]
            if lm_bundle is not None:
                chosen = [k for k in range(len(utts)) if rng.random() < lm_share]
                lm_mels = lm_teacher_forced_mels(lm_bundle, [utts[k] for k in chosen], stats)
                for k, lm_mel in zip(chosen, lm_mels, strict=True):
                    mels[k][: len(lm_mel)] = lm_mel[: len(mels[k])]
            for utt, mel in zip(utts, mels, strict=True):
                self.mels.append(mel)
                self.audio.append(utt.audio[: len(mel) * hop])
        if not self.mels:
            raise SystemExit(f"no data shards in {work / 'data' / 'train'}: run stage data")

    def batch(
        self, rng: np.random.Generator, size: int, frames: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        mels, audio = [], []
        while len(mels) < size:
            k = int(rng.integers(len(self.mels)))
            if len(self.mels[k]) <= frames:
                continue
            t0 = int(rng.integers(len(self.mels[k]) - frames))
            mels.append(self.mels[k][t0 : t0 + frames])
            audio.append(self.audio[k][t0 * self.hop : (t0 + frames) * self.hop])
        return torch.from_numpy(np.stack(mels)), torch.from_numpy(np.stack(audio))


def lm_teacher_forced_mels(bundle_dir: Path, utterances: list, stats: dict) -> list[np.ndarray]:
    """What the bundle's LM emits for each utterance when fed the teacher's previous frames and
    phoneme pointer (one prefill run of embed.onnx + lm.onnx): standardised mel [F, n_mels],
    aligned with the teacher's audio, as smooth as the LM's own predictions. The vocoder
    fine-tuned on these learns the LM's frames rather than only ground truth."""
    import onnxruntime as ort

    from export.voice.bundle import read_manifest
    from export.voice.train import TrainConfig, config_from_manifest, make_example, step_inputs

    manifest = read_manifest(bundle_dir)
    cfg = config_from_manifest(manifest, TrainConfig())
    kv = manifest["kv"]
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    embed = ort.InferenceSession(str(Path(bundle_dir) / "embed.onnx"), options)
    lm = ort.InferenceSession(str(Path(bundle_dir) / "lm.onnx"), options)
    ids = {ch: i + 1 for i, ch in enumerate(cfg.symbols)}
    mean, std = np.array(stats["mean"], np.float32), np.array(stats["std"], np.float32)
    empty = np.zeros((1, kv["kv_heads"], 0, kv["head_dim"]), np.float32)
    past = {name.format(i=i): empty for i in range(kv["layers"]) for name in kv["past_names"]}
    out = []
    for utt in utterances:
        example = make_example(utt, ids, mean, std, cfg.reduction)
        steps = len(example.pointer)
        frames = example.mel.astype(np.float32).reshape(steps, cfg.frame_width)
        previous = np.zeros_like(frames)
        previous[1:] = frames[:-1]
        window, progress, _ = step_inputs(example.symbols, example.pointer, cfg)
        (embeds,) = embed.run(
            ["inputs_embeds"],
            {
                "previous_frames": previous[None],
                "phonemes": window[None],
                "progress": progress[None],
                "speaker_embedding": example.stats[None].astype(np.float32),
            },
        )
        (logits,) = lm.run(
            ["logits"],
            {
                "inputs_embeds": embeds,
                "seqlens_k": np.array([steps - 1], np.int32),
                "total_sequence_length": np.array(steps, np.int32),
                **past,
            },
        )
        mel = logits[0, :, : cfg.frame_width].reshape(steps * cfg.reduction, cfg.n_mels)
        out.append(mel[: len(utt.audio) // MEL_CONFIG.hop_length].astype(np.float32))
    return out


# -- training -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class VocoderTrainConfig:
    batch: int = 16
    frames: int = 48  # 0.96 s crops
    learning_rate: float = 1e-3
    final_learning_rate: float = 1e-4
    warmup_steps: int = 200
    save_seconds: float = 240.0
    # Weight of the direct phase losses (instantaneous phase, group delay, instantaneous
    # frequency): measured to matter, see benchmarks/README_voice.md.
    phase_weight: float = 0.3
    # Adversarial fine-tuning (multi-resolution spectrogram discriminator): the reconstruction
    # losses are scaled by `reconstruction_weight` against adversarial 1 and feature matching 2.
    gan: bool = False
    # Share of the clips whose input mel is the bundle's LM run teacher-forced (fine-tuning
    # stage; 0 = the teacher's mel only).
    lm_share: float = 0.0
    reconstruction_weight: float = 15.0
    discriminator_learning_rate: float = 2e-4


def save_checkpoint(
    path: Path, model: NeuralVocoder, optimizer, state: dict, disc=None, disc_optimizer=None
) -> None:
    tmp = path.with_name(path.name + ".tmp")
    extra = {}
    if disc is not None:
        extra = {
            "discriminator": disc.state_dict(),
            "discriminator_optimizer": disc_optimizer.state_dict(),
        }
    torch.save(
        {
            "config": asdict(model.cfg),
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            **state,
            **extra,
        },
        tmp,
    )
    os.replace(tmp, path)


def train_vocoder(
    work: Path,
    cfg: VocoderNetConfig,
    minutes: float,
    seed: int,
    bundle_dir: Path | None,
    train_cfg: VocoderTrainConfig = VocoderTrainConfig(),
    max_steps: int | None = None,
) -> None:
    """Trains for `minutes` more wall-clock minutes (resuming WORK/vocoder/checkpoint.pt); the
    learning rate decays by cosine over the total time asked for so far. With `max_steps` it
    stops at that step count in all and the cosine runs over this run's steps instead, so the
    run is the same on any machine (one thread; `minutes` then only caps it)."""
    torch.manual_seed(seed)
    stats = ensure_mel_stats(work, bundle_dir)
    lm_bundle = bundle_dir if train_cfg.lm_share > 0 else None
    if train_cfg.lm_share > 0 and bundle_dir is None:
        raise SystemExit("fine-tuning on the LM's mels needs --lm-from BUNDLE_DIR")
    clips = Clips(work, stats, cfg.hop, lm_bundle, train_cfg.lm_share)
    folder = work / "vocoder"
    folder.mkdir(parents=True, exist_ok=True)
    checkpoint = folder / "checkpoint.pt"
    model = NeuralVocoder(cfg)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=train_cfg.learning_rate, betas=(0.8, 0.99), weight_decay=0.01
    )
    state = {"step": 0, "seconds": 0.0, "planned_seconds": 0.0}
    disc = disc_optimizer = None
    if train_cfg.gan:
        disc = MultiResolutionDiscriminator()
        disc_optimizer = torch.optim.AdamW(
            disc.parameters(), lr=train_cfg.discriminator_learning_rate, betas=(0.8, 0.99)
        )
    if checkpoint.exists():
        saved = torch.load(checkpoint, weights_only=False)
        if saved["config"] != asdict(cfg):
            raise SystemExit(f"{checkpoint} has another configuration: {saved['config']}")
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        state = {k: saved[k] for k in state}
        if disc is not None and "discriminator" in saved:
            disc.load_state_dict(saved["discriminator"])
            disc_optimizer.load_state_dict(saved["discriminator_optimizer"])
    state["planned_seconds"] = state["seconds"] + minutes * 60
    params = sum(p.numel() for p in model.parameters())
    audio_hours = sum(len(a) for a in clips.audio) / cfg.hop / 50 / 3600
    print(
        f"vocoder: {len(clips.mels)} utterances ({audio_hours:.2f} h), {params / 1e6:.2f}M "
        f"params, from step {state['step']}",
        flush=True,
    )
    first_step = state["step"]
    rng = np.random.default_rng(seed + first_step)
    log = (folder / "log.jsonl").open("a")
    start, last_save = time.monotonic(), time.monotonic()
    base_seconds = state["seconds"]
    window: dict[str, list[float]] = {}
    model.train()
    while max_steps is None or state["step"] < max_steps:
        elapsed = base_seconds + time.monotonic() - start
        if elapsed >= state["planned_seconds"]:
            if max_steps is not None:
                print(f"vocoder: out of time at step {state['step']} of {max_steps}", flush=True)
            break
        if max_steps is None:
            progress = elapsed / max(state["planned_seconds"], 1.0)
        else:
            progress = (state["step"] - first_step) / max(max_steps - first_step, 1)
        lr = train_cfg.final_learning_rate + 0.5 * (
            train_cfg.learning_rate - train_cfg.final_learning_rate
        ) * (1 + math.cos(math.pi * progress))
        lr *= min(1.0, (state["step"] + 1) / train_cfg.warmup_steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        mel, audio = clips.batch(rng, train_cfg.batch, train_cfg.frames)
        predicted, phase = model.synthesize(mel)
        losses = vocoder_losses(predicted, audio)
        if train_cfg.phase_weight > 0:
            phased = phase_losses(phase, audio, cfg.n_fft, cfg.hop)
            losses.update(phased)
            losses["loss"] = losses["loss"] + train_cfg.phase_weight * sum(phased.values())
        if disc is not None:
            d_loss = discriminator_loss(disc, audio, predicted)
            disc_optimizer.zero_grad(set_to_none=True)
            d_loss.backward()
            disc_optimizer.step()
            adv, fm = generator_adversarial_losses(disc, audio, predicted)
            losses.update({"disc": d_loss.detach(), "adv": adv, "fm": fm})
            losses["loss"] = train_cfg.reconstruction_weight * losses["loss"] + adv + 2 * fm
        optimizer.zero_grad(set_to_none=True)
        losses["loss"].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        optimizer.step()
        state["step"] += 1
        for key, value in losses.items():
            window.setdefault(key, []).append(value.item())
        if state["step"] % 25 == 0:
            record = {
                "step": state["step"],
                "minutes": round(elapsed / 60, 2),
                "lr": lr,
                **{k: round(float(np.mean(v)), 4) for k, v in window.items()},
            }
            log.write(json.dumps(record) + "\n")
            log.flush()
            print(json.dumps(record), flush=True)
            window = {}
        if time.monotonic() - last_save > train_cfg.save_seconds:
            state["seconds"] = base_seconds + time.monotonic() - start
            save_checkpoint(checkpoint, model, optimizer, state, disc, disc_optimizer)
            last_save = time.monotonic()
    state["seconds"] = base_seconds + time.monotonic() - start
    save_checkpoint(checkpoint, model, optimizer, state, disc, disc_optimizer)
    print(f"vocoder: saved step {state['step']}", flush=True)


def load_vocoder(work: Path) -> NeuralVocoder:
    saved = torch.load(work / "vocoder" / "checkpoint.pt", weights_only=False)
    model = NeuralVocoder(VocoderNetConfig(**saved["config"]))
    model.load_state_dict(saved["model"])
    return model.eval()

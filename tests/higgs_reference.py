"""References for the Higgs tests: small random-weight checkpoints in the published layouts and
the published loops to compare onnx-tts with.

* v2: `transformers` 5.23's own `HiggsAudioV2ForConditionalGeneration` and
  `HiggsAudioV2TokenizerModel` built from small configs (random weights, random codebooks),
  saved with `save_pretrained`; generation through its own `generate()`, torch's multinomial
  replaced by draws from a numpy generator (so a sampled run can be reproduced: the engine
  draws from the same generator, one uniform per codebook, then one per resampled code).
* v3: a stand-in checkpoint with the published tensor names (reduced dims) and a paraphrase of
  SGLang-Omni's `higgs_tts` loop (prompt, fused embedding, Qwen3 body with bf16-rounded rotary
  tables, tied head, the delay/EOC sampler, reverse delay, codec decode), written here from
  reading sglang_omni/models/higgs_tts/{text_tokenizer,sampler,utils,modeling}.py; the body is
  `transformers`' own Qwen3Model.
* tokenizers: trained here (byte-level BPE on a few sentences) with the published special
  tokens, so prompts tokenize the same way in the engine and in the reference.

The only torchaudio wheel for torch 2.13 is CUDA-linked (and breaks `transformers` imports once
installed): the codec reference gets a stand-in `torchaudio` whose resampler is transcribed here
(the exporter's resampler was also checked against the real torchaudio 2.11.1 Python code).
"""

from __future__ import annotations

import contextlib
import json
import sys
import types
from pathlib import Path

import numpy as np

V2_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
    "<|audio_out_bos|>",
    "<|reserved_special_token_6|>",
    "<|AUDIO|>",
    "<|AUDIO_OUT|>",
    "<|scene_desc_start|>",
    "<|scene_desc_end|>",
]
V3_SPECIALS = ["<|endoftext|>", "<|tts|>", "<|ref_text|>", "<|ref_audio|>", "<|text|>", "<|audio|>"]
CORPUS = [
    "Hello there, how are you today? The sun rises in the east and sets in the west.",
    "Generate audio following instruction. Audio is recorded from a quiet room.",
    "It was the night before my birthday. Hooray! It's almost here!",
    "Numbers like 12 and 345 are read aloud; so are words such as voice and speech.",
]


def _resample(waveform, orig_freq: int, new_freq: int):
    """torchaudio.functional.resample's default (Hann-windowed sinc, 6 zero crossings, rolloff
    0.99), transcribed here from its documented algorithm (float32 kernel, polyphase conv)."""
    import math

    import torch

    if orig_freq == new_freq:
        return waveform
    gcd = math.gcd(orig_freq, new_freq)
    orig, new = orig_freq // gcd, new_freq // gcd
    base = min(orig, new) * 0.99
    width = math.ceil(6 * orig / base)
    taps = torch.arange(-width, width + orig, dtype=torch.float32)[None, None] / orig
    phases = torch.arange(0, -new, -1, dtype=torch.float32)[:, None, None] / new
    t = ((phases + taps) * base).clamp(-6, 6)
    window = torch.cos(t * math.pi / 6 / 2) ** 2
    t = t * math.pi
    kernel = torch.where(t == 0, torch.tensor(1.0), t.sin() / t) * (window * (base / orig))
    shape = waveform.shape
    flat = waveform.reshape(-1, shape[-1])
    padded = torch.nn.functional.pad(flat, (width, width + orig))
    out = torch.nn.functional.conv1d(padded[:, None], kernel, stride=orig)
    out = out.transpose(1, 2).reshape(flat.shape[0], -1)[..., : math.ceil(new * shape[-1] / orig)]
    return out.reshape(*shape[:-1], out.shape[-1])


def install_torchaudio() -> None:
    """A `torchaudio` with the one function the codec's reference calls (`functional.resample`):
    the only torchaudio wheel for torch 2.13 is CUDA-linked and, once installed, breaks every
    `transformers` import on a CPU machine, so it is not a dependency."""
    import importlib.machinery

    if "torchaudio" in sys.modules:
        return
    module = types.ModuleType("torchaudio")
    module.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)
    functional = types.ModuleType("torchaudio.functional")
    functional.resample = _resample  # type: ignore[attr-defined]
    module.functional = functional  # type: ignore[attr-defined]
    sys.modules["torchaudio"] = module
    sys.modules["torchaudio.functional"] = functional
    checks = sys.modules.get("transformers.utils.import_utils")
    if checks is not None:  # transformers came first: forget its "no torchaudio" answer
        checks.is_torchaudio_available.cache_clear()


install_torchaudio()  # before anything imports transformers' audio models


def tokenizer_json(specials: list[str]) -> bytes:
    """A byte-level BPE tokenizer.json with `specials` as special added tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return tokenizer.to_str().encode()


def token_ids(tokenizer_bytes: bytes, names: list[str]) -> dict[str, int]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_bytes.decode())
    return {name: tokenizer.token_to_id(name) for name in names}


# -- codec --------------------------------------------------------------------------------------
CODEC_DIMS = {
    "acoustic_model_config": {
        "encoder_hidden_size": 4,
        "downsampling_ratios": [8, 5, 4, 2, 3],
        "decoder_hidden_size": 64,
        "upsampling_ratios": [8, 5, 4, 2, 3],
        "hidden_size": 8,
    },
    "semantic_model_config": {
        "hidden_size": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 32,
        "conv_dim": [16] * 7,
        "num_conv_pos_embeddings": 16,
        "num_conv_pos_embedding_groups": 2,
    },
    "codebook_dim": 8,
    "target_bandwidths": [0.5, 1, 1.5, 2],
}


PUBLISHED_CODEC_DIMS = {
    "acoustic_model_config": {
        "encoder_hidden_size": 64,
        "downsampling_ratios": [8, 5, 4, 2, 3],
        "decoder_hidden_size": 1024,
        "upsampling_ratios": [8, 5, 4, 2, 3],
        "hidden_size": 256,
    },
    "semantic_model_config": {},  # HuBERT-base: 12 x 768
    "codebook_dim": 64,
    "target_bandwidths": [0.5, 1, 1.5, 2],
}


def build_codec(seed: int = 0, dims: dict | None = None):
    """transformers' HiggsAudioV2TokenizerModel (published architecture, small widths), random
    weights and codebooks (its init leaves the codebooks zero)."""
    install_torchaudio()
    import torch

    # From the modules themselves: `from transformers import ...` may give a placeholder
    # when transformers was imported before the torchaudio stand-in.
    from transformers.models.higgs_audio_v2_tokenizer.configuration_higgs_audio_v2_tokenizer import (  # noqa: E501
        HiggsAudioV2TokenizerConfig,
    )
    from transformers.models.higgs_audio_v2_tokenizer.modeling_higgs_audio_v2_tokenizer import (
        HiggsAudioV2TokenizerModel,
    )

    torch.manual_seed(seed)
    config = HiggsAudioV2TokenizerConfig(**(dims or CODEC_DIMS))
    model = HiggsAudioV2TokenizerModel(config).eval()
    with torch.no_grad():
        for quantizer in model.quantizer.quantizers:
            quantizer.codebook.embed.normal_()
        for name, parameter in model.named_parameters():
            if name.endswith("alpha"):
                parameter.uniform_(0.5, 1.5)
    return model


def reference_audio(seconds: float, seed: int = 0, rate: int = 24000) -> np.ndarray:
    """A voice-like test signal: a few harmonics with a wobbling pitch and some noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    pitch = 140 + 20 * np.sin(2 * np.pi * 1.5 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    wave = sum(np.sin(k * phase) / k for k in range(1, 6)) * 0.2
    return (wave + 0.01 * rng.standard_normal(len(t))).astype(np.float32)


# -- v2 -----------------------------------------------------------------------------------------
def build_v2(directory: Path, codec_dir: Path, seed: int = 0, eos_scale: float = 1.6):
    """transformers' HiggsAudioV2ForConditionalGeneration (2 layers, hidden 64, 8 x 1026
    codes) saved to `directory` with a tokenizer; the codec saved to `codec_dir`. Returns
    (model, codec, tokenizer bytes)."""
    import torch
    from transformers import HiggsAudioV2Config, HiggsAudioV2ForConditionalGeneration

    tokenizer = tokenizer_json(V2_SPECIALS)
    ids = token_ids(tokenizer, V2_SPECIALS)
    config = HiggsAudioV2Config(
        vocab_size=448,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
        codebook_size=1026,
        num_codebooks=8,
        audio_token_id=ids["<|AUDIO_OUT|>"],
        audio_bos_token_id=ids["<|audio_out_bos|>"],
        audio_delay_token_id=ids["<|reserved_special_token_6|>"],
        eos_token_id=ids["<|eot_id|>"],
        pad_token_id=ids["<|end_of_text|>"],
        bos_token_id=ids["<|begin_of_text|>"],
    )
    torch.manual_seed(seed)
    model = HiggsAudioV2ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.uniform_(0.5, 1.5)
            elif "lm_head" in name:
                parameter.normal_(0, 0.5)  # distinct logits: greedy rows are not ties
        # Codebook 1's end code a little likelier, so runs end by the published end rule.
        model.audio_lm_head.weight[1026 + 1025].normal_(0, 0.5 * eos_scale)
    model.generation_config.ras_win_len = 7
    model.generation_config.ras_win_max_num_repeat = 2
    model.save_pretrained(directory)
    (directory / "tokenizer.json").write_bytes(tokenizer)
    codec = build_codec(seed)
    codec.save_pretrained(codec_dir)
    return model, codec, tokenizer


@contextlib.contextmanager
def numpy_multinomial(generator: np.random.Generator):
    """torch.multinomial (one sample per row) drawing from `generator`: one uniform per row in
    order, the index where the cumulative distribution passes uniform * total."""
    import torch

    original = torch.multinomial, torch.Tensor.multinomial

    def draw(probs, num_samples=1, replacement=False, *, generator_=None, out=None):
        rows = probs.detach().reshape(-1, probs.shape[-1]).double().numpy()
        picks = []
        for row in rows:
            cdf = np.cumsum(row)
            index = np.searchsorted(cdf, generator.random() * cdf[-1], side="right")
            picks.append(min(int(index), len(row) - 1))
        return torch.tensor(picks, dtype=torch.long).reshape(*probs.shape[:-1], 1)

    torch.multinomial = draw
    torch.Tensor.multinomial = lambda self, *a, **k: draw(self, *a, **k)
    try:
        yield
    finally:
        torch.multinomial, torch.Tensor.multinomial = original


def v2_prompt_text(text: str, reference_text: str | None, scene: str) -> str:
    """The published chat rendering (system + scene, the clone turns, the generation prompt)."""
    prompt = (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Generate audio following instruction.\n\n<|scene_desc_start|>\n"
        f"{scene}\n<|scene_desc_end|><|eot_id|>"
    )
    if reference_text is not None:
        prompt += (
            f"<|start_header_id|>user<|end_header_id|>\n\n{reference_text}<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n"
            "<|audio_out_bos|><|AUDIO_OUT|><|audio_eos|><|eot_id|>"
        )
    return prompt + (
        f"<|start_header_id|>user<|end_header_id|>\n\n{text}<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n<|audio_out_bos|>"
    )


def v2_processor(directory: Path, codec):
    """transformers' HiggsAudioV2Processor assembled from local files (its from_pretrained
    would fetch the codec from the hub)."""
    install_torchaudio()
    from transformers import DacFeatureExtractor, HiggsAudioV2Processor, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"))
    tokenizer.pad_token = "<|end_of_text|>"
    features = DacFeatureExtractor(
        feature_size=1, hop_length=1, padding_side="right", padding_value=0.0, sampling_rate=24000
    )
    return HiggsAudioV2Processor(features, tokenizer, codec)


def v2_generate(
    model,
    processor,
    text: str,
    *,
    reference: np.ndarray | None = None,
    reference_text: str | None = None,
    scene: str = "Audio is recorded from a quiet room.",
    seed: int | None = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 50,
    top_p: float = 0.95,
    max_new_tokens: int = 60,
    ras: bool = True,
):
    """transformers' generate + its processor's decode: (delayed rows [L, 8], audio [N])."""
    import torch

    prompt = v2_prompt_text(text, reference_text if reference is not None else None, scene)
    inputs = processor(
        text=prompt,
        audio=None if reference is None else [reference],
        return_tensors="pt",
        add_special_tokens=False,
    )
    kwargs = {"do_sample": do_sample, "max_new_tokens": max_new_tokens}
    if do_sample:
        kwargs.update(temperature=temperature, top_k=top_k, top_p=top_p)
    if not ras:
        kwargs.update(ras_win_len=None, ras_win_max_num_repeat=None)
    with torch.no_grad(), numpy_multinomial(np.random.default_rng(seed)):
        rows = model.generate(**inputs, **kwargs)
    generated = rows[0, -_generated_rows(rows, inputs) :]
    audio = processor.decode(rows[:, -len(generated) :]) if len(generated) > 8 else None
    return generated.numpy(), None if audio is None else audio.numpy()


def _generated_rows(rows, inputs) -> int:
    prompt = inputs.get("audio_input_ids")
    return rows.shape[1] - (0 if prompt is None else prompt.shape[1])


# -- v3 -----------------------------------------------------------------------------------------
V3_TEXT_CONFIG = {
    "model_type": "qwen3",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 96,
    "vocab_size": 448,
    "max_position_embeddings": 2048,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
V3_CODEC_PREFIX = "tied.embedding.modality_embeddings.0.model."


def build_v3(
    directory: Path, seed: int = 0, text_config: dict | None = None, codec_dims: dict | None = None
):
    """A Higgs TTS 3 stand-in in the published layout (tensor names, config, bundled codec and
    its config file; reduced dims, random weights). Returns (tensors, codec, tokenizer bytes)."""
    import torch

    from export.checkpoint import write_checkpoint

    tokenizer = tokenizer_json(V3_SPECIALS)
    c = text_config or V3_TEXT_CONFIG
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.2):
        return torch.randn(*shape, generator=generator) * scale

    def mat(rows: int, columns: int):  # 0.2 at width 64, scaled with the fan-in
        return rand(rows, columns, scale=0.2 * (64 / columns) ** 0.5)

    d = c["head_dim"]
    h, f = c["hidden_size"], c["intermediate_size"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    tensors = {
        "tied.embedding.text_embedding.weight": rand(c["vocab_size"], h, scale=1.0),
        "tied.embedding.modality_embeddings.0.embedding.weight": rand(8 * 1026, h, scale=0.5),
        "body.norm.weight": 1 + rand(h, scale=0.1),
    }
    for i in range(c["num_hidden_layers"]):
        p = f"body.layers.{i}."
        tensors.update(
            {
                p + "input_layernorm.weight": 1 + rand(h, scale=0.1),
                p + "post_attention_layernorm.weight": 1 + rand(h, scale=0.1),
                p + "self_attn.q_proj.weight": mat(q, h),
                p + "self_attn.k_proj.weight": mat(kv, h),
                p + "self_attn.v_proj.weight": mat(kv, h),
                p + "self_attn.o_proj.weight": mat(h, q),
                p + "self_attn.q_norm.weight": 1 + rand(d, scale=0.1),
                p + "self_attn.k_norm.weight": 1 + rand(d, scale=0.1),
                p + "mlp.gate_proj.weight": mat(f, h),
                p + "mlp.up_proj.weight": mat(f, h),
                p + "mlp.down_proj.weight": mat(h, f),
            }
        )
    codec = build_codec(seed, codec_dims)
    tensors.update({V3_CODEC_PREFIX + k: v for k, v in codec.state_dict().items()})
    config = {
        "model_type": "higgs_multimodal_qwen3",
        "architectures": ["HiggsMultimodalQwen3ForConditionalGeneration"],
        "text_config": c,
        "audio_encoder_config": {
            "encoder_type": "discrete",
            "num_codebooks": 8,
            "vocab_size": 1026,
            "out_dim": h,
            "use_delay_pattern": True,
            "tie_word_embeddings": True,
        },
        "audio_token_id": -100,
        "sample_rate": 24000,
    }
    codec_config = codec.config.to_dict()
    write_checkpoint(
        directory,
        tensors,
        config,
        shards=2,
        extra_files={
            "tokenizer.json": tokenizer,
            "higgs_audio_v2_tokenizer_config.json": json.dumps(codec_config).encode(),
        },
    )
    return tensors, codec, tokenizer


class V3Reference:
    """A paraphrase of SGLang-Omni's Higgs TTS loop (module docstring) on a stand-in."""

    BOC, EOC = 1024, 1025

    def __init__(self, tensors, codec, tokenizer: bytes, text_config: dict | None = None) -> None:
        import torch
        from tokenizers import Tokenizer
        from transformers import Qwen3Config, Qwen3Model

        self.tokenizer = Tokenizer.from_str(tokenizer.decode())
        self.codec = codec
        self.body = Qwen3Model(Qwen3Config(**(text_config or V3_TEXT_CONFIG))).eval()
        state = {k[len("body.") :]: v for k, v in tensors.items() if k.startswith("body.")}
        state["embed_tokens.weight"] = tensors["tied.embedding.text_embedding.weight"]
        self.body.load_state_dict(state)
        rotary = self.body.rotary_emb.forward

        def bf16_rounded(x, position_ids):  # truncate_rope_to_bf16: .to(bfloat16) and back
            cos, sin = rotary(x, position_ids)
            return cos.to(torch.bfloat16).float(), sin.to(torch.bfloat16).float()

        self.body.rotary_emb.forward = bf16_rounded
        self.table = tensors["tied.embedding.modality_embeddings.0.embedding.weight"]
        self.text_table = tensors["tied.embedding.text_embedding.weight"]

    def special(self, name: str) -> int:
        return self.tokenizer.token_to_id(name)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def prompt(self, text: str, reference_rows: int, reference_text: str | None) -> list[int]:
        ids = [self.special("<|tts|>")]
        if reference_text and reference_rows:
            ids += [self.special("<|ref_text|>"), *self.encode(reference_text)]
        if reference_rows:
            ids += [self.special("<|ref_audio|>"), *([-100] * reference_rows)]
        return [*ids, self.special("<|text|>"), *self.encode(text), self.special("<|audio|>")]

    def fused(self, rows):
        import torch

        offsets = torch.arange(rows.shape[-1]) * 1026
        return self.table[torch.as_tensor(rows) + offsets].sum(dim=-2)

    def reference_codes(self, audio: np.ndarray) -> np.ndarray:
        import torch

        with torch.no_grad():
            codes = self.codec.encode(torch.from_numpy(audio)[None, None]).audio_codes
        return codes[0].T.numpy()

    @staticmethod
    def sample(logits, temperature, top_k, top_p, generator) -> np.ndarray:
        import torch

        if temperature <= 1e-5:
            return logits.argmax(-1).numpy()
        scores = logits / temperature
        if top_k and top_k > 0:
            kth = scores.topk(min(top_k, scores.shape[-1]), dim=-1).values[:, -1:]
            scores = torch.where(scores < kth, float("-inf"), scores)
        if top_p is not None and top_p < 1.0:
            ordered, order = torch.sort(scores, descending=True, dim=-1)
            remove = ordered.softmax(-1).cumsum(-1) > top_p
            remove[..., 1:] = remove[..., :-1].clone()
            remove[..., 0] = False
            scores = torch.where(torch.zeros_like(remove).scatter(-1, order, remove), -1e30, scores)
        probs = scores.softmax(-1).double().numpy()
        picks = []
        for row in probs:
            cdf = np.cumsum(row)
            index = np.searchsorted(cdf, generator.random() * cdf[-1], side="right")
            picks.append(min(int(index), len(row) - 1))
        return np.array(picks)

    def generate(
        self,
        text: str,
        *,
        reference: np.ndarray | None = None,
        reference_text: str | None = None,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = 0,
        max_new_tokens: int = 2048,
    ):
        """(delayed rows [L, 8], frames [T, 8], audio) as SGLang-Omni makes them."""
        import torch
        from transformers import DynamicCache

        from onnx_tts.decoding.delay import delay, undelay

        delayed = np.zeros((0, 8), np.int64)
        if reference is not None:
            delayed = delay(self.reference_codes(reference), self.BOC, self.EOC)
        ids = self.prompt(text, len(delayed), reference_text)
        ids_t = torch.tensor(ids)
        embeds = self.text_table[ids_t.clamp(min=0)]
        if len(delayed):
            embeds[ids_t == -100] = self.fused(delayed)
        generator = np.random.default_rng(seed)
        cache = DynamicCache(config=self.body.config)
        rows, delay_count, countdown, done = [], 0, -1, False
        inputs = embeds[None]
        with torch.no_grad():
            while not done and len(rows) < max_new_tokens:
                out = self.body(inputs_embeds=inputs, past_key_values=cache, use_cache=True)
                hidden = out.last_hidden_state[0, -1]
                logits = (hidden @ self.table.T).reshape(8, 1026)
                codes = self.sample(logits, temperature, top_k, top_p, generator)
                if delay_count < 8:
                    codes[delay_count + 1 :] = self.BOC
                    delay_count += 1
                elif countdown >= 0:
                    countdown -= 1
                    done = countdown <= 0
                elif codes[0] == self.EOC:
                    countdown = 6
                rows.append(codes.astype(np.int64))
                inputs = self.fused(torch.as_tensor(codes)[None])[None]
        rows = np.stack(rows)
        frames = undelay(rows)
        frames = np.where(frames >= 1024, 0, frames)
        with torch.no_grad():
            audio = self.codec.decode(torch.from_numpy(frames).T[None]).audio_values[0, 0].numpy()
        return rows, frames, audio


def write_json(path: Path, value) -> None:
    path.write_text(json.dumps(value, indent=2), encoding="utf-8")


__all__ = [
    "CODEC_DIMS",
    "V2_SPECIALS",
    "V3_SPECIALS",
    "V3Reference",
    "build_codec",
    "build_v2",
    "build_v3",
    "install_torchaudio",
    "numpy_multinomial",
    "reference_audio",
    "tokenizer_json",
    "v2_generate",
    "v2_processor",
    "v2_prompt_text",
]

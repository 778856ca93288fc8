"""Signature-identical synthetic Chatterbox ONNX bundles (random weights).

    python -m export.synthetic_chatterbox {turbo,original,multilingual} OUT_DIR
        [--layers N] [--hidden N] [--heads N] [--precisions fp32,fp16,q8,q4,q4f16]
        [--[no-]lm-position-ids] [--stop-after N] [--seed N] [--no-external-data]

The real weights are not reachable from this machine, so tests and benchmarks run the
Chatterbox adapter on bundles that have the same file names, graph input/output names, dtypes
and KV-cache behaviour as the published exports, with small random weights (dimensions are
configurable up to the real ones).

What the published layouts look like (learned from public code; nothing was copied)
--------------------------------------------------------------------------------------
Sources read: the onnx-community/chatterbox-multilingual-ONNX model card's inference script
(stored copy in the code corpus), the export module ``InputsEmbeds`` of
VladOS95-cyber/onnx_conversion_scripts (chatterbox), transformers.js
``models/chatterbox/modeling_chatterbox.js``, jamjamjon/usls ``chatterbox`` (Rust, all three
kinds), rsaranusc/chatterbox-onnx-gpu ``chatterbox_onnx/__init__.py`` (original, q4 LM), a
TypeScript Turbo client (q4f16), a file-size listing of ResembleAI/chatterbox-turbo-ONNX and
the KitsuMate mirrors' READMEs on Hugging Face.

* Repository layout: ``tokenizer.json`` (+ ``tokenizer_config.json``) at the root, graphs under
  ``onnx/``: ``speech_encoder``, ``embed_tokens``, ``language_model``, ``conditional_decoder``.
  Precision variants by file-name suffix: ``X.onnx`` (fp32), ``X_fp16.onnx``,
  ``X_quantized.onnx`` (8-bit, "q8"), ``X_q4.onnx``, ``X_q4f16.onnx``. Large graphs keep their
  weights in an ``X.onnx_data`` sidecar that the graph names internally (the name is
  load-bearing). Turbo ships every variant of every graph; the original export has the LM in
  several precisions but single-precision encoder/decoder. The original and multilingual repos
  also carry ``default_voice.wav``; multilingual adds ``Cangjie5_TC.json`` (zh).
* ``speech_encoder``: ``audio_values`` f32 [B, N] (24 kHz mono) -> ``audio_features`` f32
  [B, F, D], ``audio_tokens`` i64 [B, P] (25 Hz S3 tokens), ``speaker_embeddings`` f32 [B, 192],
  ``speaker_features`` f32 [B, T, 80] (50 Hz mel, T = 2 P). Older revisions of the original
  export name the same four outputs ``cond_emb, prompt_token, ref_x_vector/speaker_embeddings,
  prompt_feat`` (scripts unpack them by position). The original/multilingual ``audio_features``
  has a fixed length (speaker token + perceiver prompt, 34 in a Finnish fine-tune's notes);
  Turbo's grows with the reference.
* ``embed_tokens``: Turbo takes only ``input_ids`` i64 [B, S] -> ``inputs_embeds``. Original
  and multilingual take ``input_ids``, ``position_ids`` i64 [B, S] and ``exaggeration`` f32 [B];
  their tokenizer wraps the text as ``[6563 exaggeration] [START] text [STOP]=0 [6561 start of
  speech]`` and the scripts compute ``position_ids = where(ids >= 6561, 0, arange(S) - 1)``
  for the prefill, then ``i + 1`` for the i-th generated token. Inside the graph, tokens up
  to the first 0 are text, later ones speech, and 6563 receives the exaggeration vector.
* ``language_model``: ``inputs_embeds`` [B, S, D], ``attention_mask`` i64 [B, P+S],
  ``position_ids`` i64 [B, S] (Turbo's GPT-2; only some revisions of the Llama exports),
  ``past_key_values.{i}.key|value`` [B, 16, P, 64] -> ``logits`` [B, S, V], ``present.{i}.*``
  [B, 16, P+S, 64] grown by Concat; the first step feeds a zero-length past. Turbo: 24 layers,
  hidden 1024, V = 6563. Original: 30 layers (Llama), V = 8194; multilingual the same,
  30 layers, logits [1, S, 8194]. The multilingual fp16 files mix fp32 embeddings with fp16 KV;
  a discussion on the Turbo repo reports fp16 files whose I/O is fp32.
* Loop: prefill ``cat(audio_features, embed(text))``; greedy argmax after repetition penalty
  1.2 (divide positive / multiply negative logits of every token generated so far, the start
  token 6561 included); stop at 6562; feed each new token through ``embed_tokens``.
  Multilingual prefixes the text with ``[lang]`` (after per-language normalisation) and its
  ``generation_config.json`` lists eos ids {2, 6562}. The PyTorch multilingual model runs
  classifier-free guidance as a batch of two (the second row's text embeddings zeroed).
* ``conditional_decoder``: ``speech_tokens`` i64 [B, P+G], ``speaker_embeddings``,
  ``speaker_features`` -> ``waveform`` f32 [B, samples] at 24 kHz; the prompt part (the first
  T/2 tokens) is trimmed from the output. Turbo feeds ``audio_tokens + generated + 3 x 4299``
  (silence); the original scripts feed ``prompt_token + generated`` (no silence).
  25 Hz tokens at 24 kHz: 960 samples per token (75 tokens -> 72,000 samples measured by one
  user).
* Tokenizers: Turbo uses GPT-2 byte-level BPE (ids 0..50256) plus added paralinguistic tags
  (50257.., e.g. ``[laugh]``, ``[chuckle]``). Original/multilingual use a small BPE with
  ``[STOP]``=0, ``[UNK]``=1, ``[SPACE]``=2, a normaliser that replaces " " by ``[SPACE]``,
  case-sensitive; the multilingual vocabulary adds ``[lang]`` tokens.

Not established from the sources (so the synthetic graphs only match the signature): how
Turbo's ``embed_tokens`` tells GPT-2 text ids from speech ids (both start at 0; the loop
feeds text ids in the prefill and single speech ids afterwards), and the exact internals of
the encoder/decoder. The original/multilingual ``embed_tokens`` rule above is from the
export code.

What the synthetic bundles do
-----------------------------
Same names, dtypes and ranks as above; small dimensions by default (2 layers, hidden 64, 4
heads) so tests run in seconds. ``--layers 24 --hidden 1024 --heads 16`` gives Turbo's real LM
shape (about 1.3 GB in fp32; 4 such layers export in ~5 s and 360 MB with a q4 copy). Token
embeddings are one shared table (6563 rows for Turbo, 8194 for the Llama models, or the text
vocabulary if larger). The LM gives the start token and every id above the stop token a -1e4
logit bias, as a trained model never emits them. The LM has ``position_ids`` by default for
original and not for multilingual (``--[no-]lm-position-ids``); without it, positions come from
``cumsum(attention_mask) - 1``. The tokenizers are trained here with the ``tokenizers`` library
on docstrings of Python's standard library (no downloads). The LM adds a documented "stop
schedule" (``--stop-after``): the stop-token logit gets ``+5 * (position - N)``, so greedy
decoding ends after absolute position N (default 200) and tests exercise the stop path; Turbo's
``audio_features`` are capped at 150 tokens so a long reference still leaves room to speak. The
decoder is a token embedding + speaker conditioning + causal conv (kernel 3, i.e. 2 tokens of
left context) + a linear map to 960 samples per token; it trims the prompt (T // 2 tokens) like
the real one. fp16 variants: Turbo keeps fp32 I/O (fp16 weights inside), original is fp16 end
to end (``exaggeration`` stays fp32), multilingual keeps fp32 ``inputs_embeds``/``logits`` with
fp16 KV. q8 = ``onnxruntime.quantization.quantize_dynamic`` (QUInt8 MatMul weights), q4 =
``MatMulNBitsQuantizer`` (block 32), q4f16 = q4 of the fp16 graph. All graphs are written with
``.onnx_data`` sidecars unless ``--no-external-data``; IR version 10, opset 17.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper
from tokenizers import Tokenizer

from onnx_tts.tools.graph_builder import GraphBuilder, rms_norm
from onnx_tts.tools.quantize.weights import quiet_quantizer

START_SPEECH_TOKEN = 6561
STOP_SPEECH_TOKEN = 6562
EXAGGERATION_TOKEN = 6563
SILENCE_TOKEN = 4299
SPEECH_CODEBOOK = 6561  # valid decoder token ids are 0..6560
SAMPLE_RATE = 24000
SAMPLES_PER_TOKEN = 960  # 25 Hz tokens at 24 kHz
MEL_HOP = 480  # 50 Hz mel frames at 24 kHz
SPEAKER_DIM = 192
TURBO_PROMPT_TOKENS = 150  # synthetic cap of Turbo's audio_features length
MEL_BINS = 80
OPSET = 17
IR_VERSION = 10

VARIANTS = ("turbo", "original", "multilingual")
PRECISIONS = ("fp32", "fp16", "q8", "q4", "q4f16")
PRECISION_SUFFIX = {"fp32": "", "fp16": "_fp16", "q8": "_quantized", "q4": "_q4", "q4f16": "_q4f16"}
ROLES = ("speech_encoder", "embed_tokens", "language_model", "conditional_decoder")
TURBO_TAGS = (
    "[clear throat]",
    "[sigh]",
    "[shush]",
    "[cough]",
    "[groan]",
    "[sniff]",
    "[gasp]",
    "[chuckle]",
    "[laugh]",
)
LANGUAGES = (
    "ar", "da", "de", "el", "en", "es", "fi", "fr", "he", "hi", "it", "ja",
    "ko", "ms", "nl", "no", "pl", "pt", "ru", "sv", "sw", "tr", "zh",
)  # fmt: skip


@dataclass(frozen=True)
class SyntheticConfig:
    """Dimensions and options of one synthetic bundle."""

    variant: str
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    intermediate: int = 0  # 0 -> 4 * hidden
    max_positions: int = 4096
    cond_len: int = 34  # original/multilingual audio_features length
    decoder_channels: int = 32
    text_vocab: int = 0  # 0 -> variant default (BPE training target)
    lm_position_ids: bool | None = None  # Llama only; None: original yes, multilingual no
    stop_after: int = 200  # absolute LM position after which the stop token wins; 0 = off
    prompt_tokens: int = TURBO_PROMPT_TOKENS  # Turbo: cap of the audio_features length
    seed: int = 0
    external_data: bool = True
    precisions: tuple[str, ...] = PRECISIONS

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def ffn(self) -> int:
        return self.intermediate or 4 * self.hidden

    @property
    def speech_vocab(self) -> int:
        """Size of the LM's output (logits) vocabulary."""
        return 6563 if self.variant == "turbo" else 8194

    @property
    def has_lm_position_ids(self) -> bool:
        if self.variant == "turbo":
            return True
        if self.lm_position_ids is None:
            return self.variant == "original"
        return self.lm_position_ids

    @property
    def flavour(self) -> str:
        return "gpt2" if self.variant == "turbo" else "llama"


# --------------------------------------------------------------------------------------
# A tiny graph builder: named initializers, auto-named node outputs.
# --------------------------------------------------------------------------------------
PRODUCER = "onnx-tts export.synthetic_chatterbox"


def _weight(
    g: GraphBuilder, rng: np.random.Generator, shape: Sequence[int], scale: float, hint: str = "w"
) -> str:
    """A random initializer (drawn in call order, so a seed fixes every weight)."""
    return g.initializer(hint, rng.standard_normal(shape).astype(np.float32) * scale)


def _linear(
    g: GraphBuilder,
    rng: np.random.Generator,
    x: str,
    d_in: int,
    d_out: int,
    bias: bool = False,
    scale: float | None = None,
) -> str:
    """x @ W (+ zero bias) with W random, scaled 1/sqrt(d_in) unless told."""
    scale = scale if scale is not None else 1.0 / math.sqrt(d_in)
    y = g.node("MatMul", [x, _weight(g, rng, (d_in, d_out), scale)])
    if bias:
        y = g.node("Add", [y, g.initializer("b", np.zeros(d_out, np.float32))])
    return y


def _dim(g: GraphBuilder, tensor: str, axis: int) -> str:
    """Scalar int64 size of `tensor` along `axis`."""
    return g.node("Gather", [g.node("Shape", [tensor]), g.const(np.int64(axis))], axis=0)


def _finish(
    g: GraphBuilder, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto]
) -> onnx.ModelProto:
    g.inputs.extend(inputs)
    g.outputs.extend(outputs)
    return g.build()


def _vi(name: str, elem: int, shape: Sequence[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, list(shape))


# --------------------------------------------------------------------------------------
# speech_encoder
# --------------------------------------------------------------------------------------
def build_speech_encoder(cfg: SyntheticConfig) -> onnx.ModelProto:
    """audio_values [B, N] -> audio_features, audio_tokens, speaker_embeddings,
    speaker_features. P = N // 960 tokens, T = 2 P mel frames."""
    g = GraphBuilder("speech_encoder", OPSET, producer=PRODUCER)
    rng = np.random.default_rng(cfg.seed + 1)
    audio = "audio_values"
    n = _dim(g, audio, 1)
    tokens = g.node("Div", [n, g.const(np.int64(SAMPLES_PER_TOKEN))])
    usable = g.node("Mul", [tokens, g.const(np.int64(SAMPLES_PER_TOKEN))])
    trimmed = g.node(
        "Slice",
        [
            audio,
            g.const([0]),
            g.node("Unsqueeze", [usable, g.const([0])]),
            g.const([1]),
        ],
    )
    batch = g.shape_dims(audio, 0, 1)
    frames = g.node("Reshape", [trimmed, g.node("Concat", [batch, g.const([-1, MEL_HOP])], axis=0)])
    mel = g.node("Tanh", [_linear(g, rng, frames, MEL_HOP, MEL_BINS, bias=True, scale=0.5)])
    g.node("Identity", [mel], output_names=["speaker_features"])

    pairs = g.node(
        "Reshape", [trimmed, g.node("Concat", [batch, g.const([-1, SAMPLES_PER_TOKEN])], axis=0)]
    )
    # Speech tokens: a deterministic hash of each 40 ms window into 0..6560.
    proj = g.node(
        "Squeeze", [_linear(g, rng, pairs, SAMPLES_PER_TOKEN, 1, scale=1.0), g.const([2])]
    )
    scaled = g.node("Floor", [g.node("Mul", [g.node("Abs", [proj]), g.const(1000.0, np.float32)])])
    g.node(
        "Mod",
        [g.node("Cast", [scaled], to=TensorProto.INT64), g.const(np.int64(SPEECH_CODEBOOK))],
        output_names=["audio_tokens"],
    )

    pooled = g.node("ReduceMean", [mel], axes=[1], keepdims=0)
    g.node(
        "Tanh",
        [_linear(g, rng, pooled, MEL_BINS, SPEAKER_DIM, bias=True)],
        output_names=["speaker_embeddings"],
    )

    if cfg.variant == "turbo":
        features = g.node(
            "Tanh", [_linear(g, rng, pairs, SAMPLES_PER_TOKEN, cfg.hidden, scale=0.5)]
        )
        # Like T3's conditioning prompt, the prefix is capped (by default 150 tokens = 6 s).
        g.node(
            "Slice",
            [features, g.const([0]), g.const([cfg.prompt_tokens]), g.const([1])],
            output_names=["audio_features"],
        )
        feat_len: int | str = "audio_tokens_length"
    else:
        queries = _weight(g, rng, (1, cfg.cond_len, cfg.hidden), 0.5, "cond_queries")
        speaker = g.node("Unsqueeze", [_linear(g, rng, pooled, MEL_BINS, cfg.hidden), g.const([1])])
        g.node("Tanh", [g.node("Add", [queries, speaker])], output_names=["audio_features"])
        feat_len = cfg.cond_len

    inputs = [_vi(audio, TensorProto.FLOAT, ["batch_size", "num_samples"])]
    outputs = [
        _vi("audio_features", TensorProto.FLOAT, ["batch_size", feat_len, cfg.hidden]),
        _vi("audio_tokens", TensorProto.INT64, ["batch_size", "audio_tokens_length"]),
        _vi("speaker_embeddings", TensorProto.FLOAT, ["batch_size", SPEAKER_DIM]),
        _vi("speaker_features", TensorProto.FLOAT, ["batch_size", "feature_length", MEL_BINS]),
    ]
    return _finish(g, inputs, outputs)


# --------------------------------------------------------------------------------------
# embed_tokens
# --------------------------------------------------------------------------------------
def build_embed_tokens(cfg: SyntheticConfig, text_vocab: int) -> onnx.ModelProto:
    g = GraphBuilder("embed_tokens", OPSET, producer=PRODUCER)
    rng = np.random.default_rng(cfg.seed + 2)
    # Speech ids share the table: 6563 rows for Turbo, 8194 (speech_tokens_dict_size) else.
    table_rows = max(text_vocab, cfg.speech_vocab)
    table = _weight(g, rng, (table_rows, cfg.hidden), 1.0, "token_table")
    embeds = g.node("Gather", [table, "input_ids"], axis=0)
    inputs = [_vi("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"])]
    if cfg.variant == "turbo":
        g.node("Identity", [embeds], output_names=["inputs_embeds"])
    else:
        positions = g.node("Max", ["position_ids", g.const(np.int64(0))])
        pos_table = _weight(g, rng, (cfg.max_positions, cfg.hidden), 0.1, "position_table")
        with_pos = g.node("Add", [embeds, g.node("Gather", [pos_table, positions], axis=0)])
        # The exaggeration vector lands on the 6563 marker token, as in the real export.
        marker = g.node(
            "Cast",
            [g.node("Equal", ["input_ids", g.const(np.int64(EXAGGERATION_TOKEN))])],
            to=TensorProto.FLOAT,
        )
        marker = g.node("Unsqueeze", [marker, g.const([2])])
        exaggeration = g.node("Unsqueeze", ["exaggeration", g.const([1, 2])])
        emotion = g.node("Mul", [exaggeration, _weight(g, rng, (cfg.hidden,), 1.0, "emotion")])
        g.node("Add", [with_pos, g.node("Mul", [marker, emotion])], output_names=["inputs_embeds"])
        inputs += [
            _vi("position_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
            _vi("exaggeration", TensorProto.FLOAT, ["batch_size"]),
        ]
    outputs = [
        _vi("inputs_embeds", TensorProto.FLOAT, ["batch_size", "sequence_length", cfg.hidden])
    ]
    return _finish(g, inputs, outputs)


# --------------------------------------------------------------------------------------
# language_model (Concat KV cache)
# --------------------------------------------------------------------------------------
def _layer_norm(g: GraphBuilder, x: str, d: int) -> str:
    return g.node(
        "LayerNormalization",
        [
            x,
            g.initializer("ln_g", np.ones(d, np.float32)),
            g.initializer("ln_b", np.zeros(d, np.float32)),
        ],
        axis=-1,
        epsilon=1e-5,
    )


def _rms_norm(g: GraphBuilder, x: str, d: int) -> str:
    return rms_norm(g, x, np.ones(d, np.float32), 1e-5, "rms")


def _rotate_half(g: GraphBuilder, x: str, half: int) -> str:
    first, second = g.node("Split", [x, g.const([half, half])], num_outputs=2, axis=-1)
    return g.node("Concat", [g.node("Neg", [second]), first], axis=-1)


def build_language_model(cfg: SyntheticConfig) -> onnx.ModelProto:
    g = GraphBuilder("language_model", OPSET, producer=PRODUCER)
    rng = np.random.default_rng(cfg.seed + 3)
    d, h, dh = cfg.hidden, cfg.heads, cfg.head_dim
    x = "inputs_embeds"
    batch_seq = g.shape_dims(x, 0, 2)
    seq = _dim(g, x, 1)
    total = _dim(g, "attention_mask", 1)

    # Additive attention bias [B, 1, S, T]: causal over absolute positions + padding mask.
    q_pos = g.node("Range", [g.node("Sub", [total, seq]), total, g.const(np.int64(1))])
    k_pos = g.node("Range", [g.const(np.int64(0)), total, g.const(np.int64(1))])
    causal = g.node(
        "LessOrEqual",
        [g.node("Unsqueeze", [k_pos, g.const([0])]), g.node("Unsqueeze", [q_pos, g.const([1])])],
    )
    keep = g.node("Cast", ["attention_mask"], to=TensorProto.BOOL)
    allowed = g.node("And", [causal, g.node("Unsqueeze", [keep, g.const([1, 2])])])
    bias = g.node("Where", [allowed, g.const(0.0, np.float32), g.const(-1.0e4, np.float32)])

    uses_position_input = cfg.has_lm_position_ids
    if uses_position_input:
        positions = g.node("Max", ["position_ids", g.const(np.int64(0))])
    else:
        # HF-style exports without position_ids derive them from the mask.
        cumulative = g.node("CumSum", ["attention_mask", g.const(np.int64(1))])
        all_pos = g.node("Sub", [cumulative, g.const(np.int64(1))])
        last = g.node(
            "Slice",
            [
                all_pos,
                g.node("Unsqueeze", [g.node("Sub", [total, seq]), g.const([0])]),
                g.node("Unsqueeze", [total, g.const([0])]),
                g.const([1]),
            ],
        )
        positions = g.node("Max", [last, g.const(np.int64(0))])

    if cfg.flavour == "gpt2":
        wpe = _weight(g, rng, (cfg.max_positions, d), 0.02, "wpe")
        hidden = g.node("Add", [x, g.node("Gather", [wpe, positions], axis=0)])
        cos = sin = ""
    else:
        hidden = x
        inv_freq = 1.0 / (10000.0 ** (np.arange(0, dh, 2, dtype=np.float32) / dh))
        pos_f = g.node(
            "Unsqueeze", [g.node("Cast", [positions], to=TensorProto.FLOAT), g.const([2])]
        )
        freqs = g.node("Mul", [pos_f, g.initializer("inv_freq", inv_freq.astype(np.float32))])
        angles = g.node("Unsqueeze", [g.node("Concat", [freqs, freqs], axis=-1), g.const([1])])
        cos, sin = g.node("Cos", [angles]), g.node("Sin", [angles])

    split_heads = g.node("Concat", [batch_seq, g.const([h, dh])], axis=0)
    merge_heads = g.node("Concat", [batch_seq, g.const([d])], axis=0)
    norm = _layer_norm if cfg.flavour == "gpt2" else _rms_norm
    scale = g.const(1.0 / math.sqrt(dh), np.float32)

    for layer in range(cfg.layers):
        normed = norm(g, hidden, d)

        def project(name: str, normed: str = normed) -> str:
            y = _linear(g, rng, normed, d, d, bias=cfg.flavour == "gpt2")
            return g.node("Transpose", [g.node("Reshape", [y, split_heads])], perm=[0, 2, 1, 3])

        q, k, v = project("q"), project("k"), project("v")
        if cfg.flavour == "llama":
            q = g.node(
                "Add", [g.node("Mul", [q, cos]), g.node("Mul", [_rotate_half(g, q, dh // 2), sin])]
            )
            k = g.node(
                "Add", [g.node("Mul", [k, cos]), g.node("Mul", [_rotate_half(g, k, dh // 2), sin])]
            )
        keys = g.node(
            "Concat",
            [f"past_key_values.{layer}.key", k],
            axis=2,
            output_names=[f"present.{layer}.key"],
        )[0]
        values = g.node(
            "Concat",
            [f"past_key_values.{layer}.value", v],
            axis=2,
            output_names=[f"present.{layer}.value"],
        )[0]
        scores = g.node("MatMul", [q, g.node("Transpose", [keys], perm=[0, 1, 3, 2])])
        scores = g.node("Add", [g.node("Mul", [scores, scale]), bias])
        context = g.node("MatMul", [g.node("Softmax", [scores], axis=-1), values])
        context = g.node(
            "Reshape", [g.node("Transpose", [context], perm=[0, 2, 1, 3]), merge_heads]
        )
        hidden = g.node("Add", [hidden, _linear(g, rng, context, d, d, bias=cfg.flavour == "gpt2")])

        normed = norm(g, hidden, d)
        if cfg.flavour == "gpt2":
            up = _linear(g, rng, normed, d, cfg.ffn, bias=True)
            act = g.node(
                "Mul", [up, g.node("Sigmoid", [g.node("Mul", [up, g.const(1.702, np.float32)])])]
            )
        else:
            gate = _linear(g, rng, normed, d, cfg.ffn)
            act = g.node(
                "Mul",
                [
                    g.node("Mul", [gate, g.node("Sigmoid", [gate])]),
                    _linear(g, rng, normed, d, cfg.ffn),
                ],
            )
        hidden = g.node(
            "Add", [hidden, _linear(g, rng, act, cfg.ffn, d, bias=cfg.flavour == "gpt2")]
        )

    logits = _linear(g, rng, norm(g, hidden, d), d, cfg.speech_vocab, scale=2.0 / math.sqrt(d))
    # A trained model never emits the start token or ids past the stop token; random
    # weights would, so those logits get a large negative bias.
    never = np.zeros(cfg.speech_vocab, np.float32)
    never[START_SPEECH_TOKEN] = -1.0e4
    never[STOP_SPEECH_TOKEN + 1 :] = -1.0e4
    logits = g.node("Add", [logits, g.initializer("invalid_token_bias", never)])
    if cfg.stop_after > 0:
        # Synthetic stop schedule: the stop logit grows past absolute position `stop_after`.
        pos_f = g.node("Cast", [positions], to=TensorProto.FLOAT)
        ramp = g.node(
            "Mul",
            [g.node("Sub", [pos_f, g.const(cfg.stop_after, np.float32)]), g.const(5.0, np.float32)],
        )
        one_hot = np.zeros(cfg.speech_vocab, np.float32)
        one_hot[STOP_SPEECH_TOKEN] = 1.0
        logits = g.node(
            "Add",
            [
                logits,
                g.node(
                    "Mul", [g.node("Unsqueeze", [ramp, g.const([2])]), g.const(one_hot, np.float32)]
                ),
            ],
        )
    g.node("Identity", [logits], output_names=["logits"])

    inputs = [
        _vi("inputs_embeds", TensorProto.FLOAT, ["batch_size", "sequence_length", d]),
        _vi("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"]),
    ]
    if uses_position_input:
        inputs.append(_vi("position_ids", TensorProto.INT64, ["batch_size", "sequence_length"]))
    outputs = [
        _vi("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", cfg.speech_vocab])
    ]
    for layer in range(cfg.layers):
        for kind in ("key", "value"):
            inputs.append(
                _vi(
                    f"past_key_values.{layer}.{kind}",
                    TensorProto.FLOAT,
                    ["batch_size", h, "past_sequence_length", dh],
                )
            )
            outputs.append(
                _vi(
                    f"present.{layer}.{kind}",
                    TensorProto.FLOAT,
                    ["batch_size", h, "total_sequence_length", dh],
                )
            )
    return _finish(g, inputs, outputs)


# --------------------------------------------------------------------------------------
# conditional_decoder
# --------------------------------------------------------------------------------------
def build_conditional_decoder(cfg: SyntheticConfig) -> onnx.ModelProto:
    """speech_tokens [B, S] + speaker tensors -> waveform [B, (S - T // 2) * 960]."""
    g = GraphBuilder("conditional_decoder", OPSET, producer=PRODUCER)
    rng = np.random.default_rng(cfg.seed + 4)
    c = cfg.decoder_channels
    table = _weight(g, rng, (SPEECH_CODEBOOK, c), 1.0, "speech_table")
    x = g.node("Gather", [table, "speech_tokens"], axis=0)
    speaker = _linear(g, rng, "speaker_embeddings", SPEAKER_DIM, c)
    timbre = _linear(
        g, rng, g.node("ReduceMean", ["speaker_features"], axes=[1], keepdims=0), MEL_BINS, c
    )
    cond = g.node("Unsqueeze", [g.node("Add", [speaker, timbre]), g.const([1])])
    x = g.node("Transpose", [g.node("Add", [x, cond])], perm=[0, 2, 1])  # [B, C, S]
    # Causal conv: pad two tokens on the left only.
    x = g.node("Pad", [x, g.const([0, 0, 2, 0, 0, 0])], mode="constant")
    x = g.node(
        "Conv", [x, _weight(g, rng, (c, c, 3), 1.0 / math.sqrt(3 * c), "conv")], kernel_shape=[3]
    )
    x = g.node("Tanh", [g.node("Transpose", [x], perm=[0, 2, 1])])  # [B, S, C]
    frames = g.node(
        "Mul",
        [g.node("Tanh", [_linear(g, rng, x, c, SAMPLES_PER_TOKEN)]), g.const(0.5, np.float32)],
    )
    batch = g.shape_dims("speech_tokens", 0, 1)
    flat = g.node("Reshape", [frames, g.node("Concat", [batch, g.const([-1])], axis=0)])
    prompt_tokens = g.node("Div", [_dim(g, "speaker_features", 1), g.const(np.int64(2))])
    start = g.node("Mul", [prompt_tokens, g.const(np.int64(SAMPLES_PER_TOKEN))])
    g.node(
        "Slice",
        [
            flat,
            g.node("Unsqueeze", [start, g.const([0])]),
            g.const([np.iinfo(np.int64).max]),
            g.const([1]),
        ],
        output_names=["waveform"],
    )
    inputs = [
        _vi("speech_tokens", TensorProto.INT64, ["batch_size", "num_speech_tokens"]),
        _vi("speaker_embeddings", TensorProto.FLOAT, ["batch_size", SPEAKER_DIM]),
        _vi("speaker_features", TensorProto.FLOAT, ["batch_size", "feature_dim", MEL_BINS]),
    ]
    outputs = [_vi("waveform", TensorProto.FLOAT, ["batch_size", "num_samples"])]
    return _finish(g, inputs, outputs)


# --------------------------------------------------------------------------------------
# Tokenizers
# --------------------------------------------------------------------------------------
def training_text() -> list[str]:
    """Docstrings of standard-library modules: local, deterministic English-ish text."""
    import collections
    import email
    import functools
    import inspect
    import itertools
    import json as json_module
    import pathlib
    import re
    import string
    import textwrap
    import threading
    import typing
    import unittest

    modules = [
        collections, email, functools, inspect, itertools, json_module, logging, pathlib, re,
        string, textwrap, threading, typing, unittest, os, argparse, shutil, tempfile,
    ]  # fmt: skip
    lines: list[str] = []
    for module in modules:
        docs = [inspect.getdoc(module) or ""]
        with warnings.catch_warnings():  # deprecated aliases warn when touched
            warnings.simplefilter("ignore")
            for name in sorted(dir(module)):
                if name.startswith("_"):
                    continue
                docs.append(inspect.getdoc(getattr(module, name, None)) or "")
        for doc in docs:
            lines.extend(line.strip() for line in doc.splitlines() if line.strip())
    return lines


def build_turbo_tokenizer(vocab_size: int) -> str:
    """GPT-2 style byte-level BPE plus the paralinguistic tags as added tokens."""
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_text(), trainer=trainer)
    tokenizer.add_tokens([AddedToken(tag, normalized=False) for tag in TURBO_TAGS])
    return tokenizer.to_str(pretty=True)


def build_chatterbox_tokenizer(vocab_size: int, languages: Iterable[str]) -> str:
    """Original/multilingual layout: [STOP]=0, [UNK]=1, [SPACE]=2, " " -> [SPACE] normaliser,
    and the ONNX repos' template: [6563] [START] text [STOP] [6561]."""
    from tokenizers import (
        AddedToken,
        Tokenizer,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    specials = ["[STOP]", "[UNK]", "[SPACE]", "[START]"] + [f"[{code}]" for code in languages]
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.Replace(" ", "[SPACE]")
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, show_progress=False
    )
    tokenizer.train_from_iterator(training_text(), trainer=trainer)
    # [SPACE] must be matched after normalisation, where the spaces have become "[SPACE]".
    tokenizer.add_special_tokens([AddedToken("[SPACE]", normalized=True)])
    start_id = tokenizer.token_to_id("[START]")
    stop_id = tokenizer.token_to_id("[STOP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[EXAGGERATION] [START] $A [STOP] [START_SPEECH]",
        special_tokens=[
            ("[EXAGGERATION]", EXAGGERATION_TOKEN),
            ("[START]", start_id),
            ("[STOP]", stop_id),
            ("[START_SPEECH]", START_SPEECH_TOKEN),
        ],
    )
    return tokenizer.to_str(pretty=True)


# --------------------------------------------------------------------------------------
# Precision variants and writing
# --------------------------------------------------------------------------------------
def _fp16_keep_io(variant: str, role: str, model: onnx.ModelProto) -> bool | list[str]:
    """Which float I/O stays fp32 in a variant's fp16 graph (see module docstring)."""
    if variant == "turbo":
        return True
    if variant == "original":
        return ["exaggeration", "audio_values"] if role != "conditional_decoder" else True
    # multilingual: fp32 embeddings/logits, fp16 KV cache.
    if role == "language_model":
        return ["inputs_embeds", "logits"]
    return True


def topological_sort(model: onnx.ModelProto) -> onnx.ModelProto:
    """Reorder top-level nodes so each runs after its producers (the fp16 converter appends
    its I/O casts at the end, which onnx.checker rejects)."""
    graph = model.graph
    available = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    pending = list(graph.node)
    ordered: list[onnx.NodeProto] = []
    while pending:
        ready = [n for n in pending if all(i in available for i in n.input)]
        if not ready:
            raise ValueError(f"graph {graph.name} has a cycle or a dangling input")
        for node in ready:
            ordered.append(node)
            available.update(node.output)
        pending = [n for n in pending if n not in ready]
    del graph.node[:]
    graph.node.extend(ordered)
    return model


def to_fp16(model: onnx.ModelProto, keep_io: bool | list[str]) -> onnx.ModelProto:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    source = onnx.ModelProto()
    source.CopyFrom(model)
    converted = convert_float_to_float16(source, keep_io_types=keep_io, disable_shape_infer=False)
    converted.ir_version = IR_VERSION
    return topological_sort(converted)


def to_q4(model: onnx.ModelProto) -> onnx.ModelProto:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(model, bits=4, block_size=32, is_symmetric=True)
    with quiet_quantizer():
        quantizer.process()
    quantized = quantizer.model.model
    quantized.ir_version = IR_VERSION
    return quantized


def to_q8(model: onnx.ModelProto, work_dir: Path) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    source = work_dir / "q8_source.onnx"
    target = work_dir / "q8_target.onnx"
    onnx.save_model(model, source)
    with quiet_quantizer():
        quantize_dynamic(
            source, target, weight_type=QuantType.QUInt8, op_types_to_quantize=["MatMul"]
        )
    quantized = onnx.load(target)
    quantized.ir_version = IR_VERSION
    source.unlink()
    target.unlink()
    return quantized


def make_variant(
    cfg: SyntheticConfig, role: str, base: onnx.ModelProto, precision: str, work_dir: Path
) -> onnx.ModelProto:
    if precision == "fp32":
        return base
    if precision == "fp16":
        return to_fp16(base, _fp16_keep_io(cfg.variant, role, base))
    if precision == "q8":
        return to_q8(base, work_dir)
    if precision == "q4":
        return to_q4(base)
    if precision == "q4f16":
        return to_q4(to_fp16(base, _fp16_keep_io(cfg.variant, role, base)))
    raise ValueError(f"unknown precision {precision!r}; choose from {', '.join(PRECISIONS)}")


def roles_with_variants(variant: str) -> tuple[str, ...]:
    """Turbo ships every graph in every precision; the community exports vary only the
    text side (the encoder/decoder stay fp32, and loaders fall back to them)."""
    if variant == "turbo":
        return ROLES
    return ("embed_tokens", "language_model")


def save_graph(model: onnx.ModelProto, path: Path, external_data: bool) -> None:
    onnx.checker.check_model(model)
    if external_data:
        # onnx.save_model rewrites the initializers it externalises: work on a copy.
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        model = copy
        onnx.save_model(
            model,
            path,
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=path.name + "_data",
            size_threshold=1024,  # small (shape) constants stay inline, as in real exports
        )
    else:
        onnx.save_model(model, path)


def write_default_voice(path: Path, seconds: float = 3.0) -> None:
    import soundfile

    rng = np.random.default_rng(7)
    t = np.arange(int(SAMPLE_RATE * seconds)) / SAMPLE_RATE
    wave = 0.3 * np.sin(2 * np.pi * 140.0 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3.0 * t))
    wave += 0.01 * rng.standard_normal(t.shape)
    soundfile.write(path, wave.astype(np.float32), SAMPLE_RATE, subtype="PCM_16")


def export(cfg: SyntheticConfig, out_dir: Path) -> list[Path]:
    """Write one synthetic bundle into `out_dir` (created if needed). Returns written files.

    Every file is first written into a private temporary directory next to `out_dir`, then
    moved into place with os.replace, so a crash never leaves a half-written graph."""
    if cfg.variant not in VARIANTS:
        raise ValueError(f"unknown variant {cfg.variant!r}; choose from {', '.join(VARIANTS)}")
    unknown = [p for p in cfg.precisions if p not in PRECISIONS]
    if unknown or not cfg.precisions:
        raise ValueError(f"unknown precisions {unknown}; choose from {', '.join(PRECISIONS)}")
    if cfg.hidden % cfg.heads or cfg.head_dim % 2:
        raise ValueError("--hidden must be a multiple of --heads with an even head size")

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".synthetic-", dir=out_dir))
    try:
        (staging / "onnx").mkdir()
        if cfg.variant == "turbo":
            tokenizer_json = build_turbo_tokenizer(cfg.text_vocab or 2000)
        else:
            languages = LANGUAGES if cfg.variant == "multilingual" else ()
            tokenizer_json = build_chatterbox_tokenizer(
                cfg.text_vocab or (704 if cfg.variant == "original" else 1200), languages
            )
        (staging / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
        text_vocab = Tokenizer.from_str(tokenizer_json).get_vocab_size(with_added_tokens=True)
        (staging / "tokenizer_config.json").write_text(
            json.dumps({"model_max_length": 4096, "tokenizer_class": "PreTrainedTokenizerFast"}),
            encoding="utf-8",
        )
        (staging / "synthetic.json").write_text(
            json.dumps(
                {
                    "note": "synthetic Chatterbox-layout bundle with random weights",
                    "variant": cfg.variant,
                    "layers": cfg.layers,
                    "hidden": cfg.hidden,
                    "heads": cfg.heads,
                    "lm_position_ids": cfg.has_lm_position_ids,
                    "stop_after": cfg.stop_after,
                    "samples_per_token": SAMPLES_PER_TOKEN,
                    "seed": cfg.seed,
                },
                indent=2,
            ),
            encoding="utf-8",
        )
        if cfg.variant != "turbo":
            write_default_voice(staging / "default_voice.wav")

        builders = {
            "speech_encoder": lambda: build_speech_encoder(cfg),
            "embed_tokens": lambda: build_embed_tokens(cfg, text_vocab),
            "language_model": lambda: build_language_model(cfg),
            "conditional_decoder": lambda: build_conditional_decoder(cfg),
        }
        for role in ROLES:
            base = builders[role]()
            precisions = cfg.precisions if role in roles_with_variants(cfg.variant) else ("fp32",)
            for precision in precisions:
                model = make_variant(cfg, role, base, precision, staging)
                name = f"{role}{PRECISION_SUFFIX[precision]}.onnx"
                save_graph(model, staging / "onnx" / name, cfg.external_data)

        written: list[Path] = []
        (out_dir / "onnx").mkdir(exist_ok=True)
        for source in sorted(staging.rglob("*")):
            if source.is_dir():
                continue
            target = out_dir / source.relative_to(staging)
            source.chmod(0o644)
            os.replace(source, target)
            written.append(target)
        return written
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def parse_args(argv: Sequence[str] | None = None) -> tuple[SyntheticConfig, Path]:
    parser = argparse.ArgumentParser(
        prog="python -m export.synthetic_chatterbox",
        description="Write a synthetic (random-weight) Chatterbox ONNX bundle with the real "
        "file names, graph I/O names and dtypes.",
    )
    parser.add_argument("variant", choices=VARIANTS)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--layers", type=int, default=2, help="LM layers (real: 24 / 30)")
    parser.add_argument("--hidden", type=int, default=64, help="LM hidden size (real: 1024)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads (real: 16)")
    parser.add_argument("--intermediate", type=int, default=0, help="MLP size (0: 4 x hidden)")
    parser.add_argument("--text-vocab", type=int, default=0, help="BPE vocabulary to train")
    parser.add_argument(
        "--precisions",
        default=",".join(PRECISIONS),
        help="comma-separated subset of fp32,fp16,q8,q4,q4f16",
    )
    parser.add_argument(
        "--lm-position-ids",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="original/multilingual: give the LM a position_ids input (default: yes for "
        "original, no for multilingual, as in the published revisions)",
    )
    parser.add_argument(
        "--stop-after", type=int, default=200, help="absolute LM position where stop wins (0: off)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--no-external-data", action="store_true", help="inline weights (no .onnx_data sidecars)"
    )
    args = parser.parse_args(argv)
    precisions = tuple(p.strip() for p in args.precisions.split(",") if p.strip())
    bad = [p for p in precisions if p not in PRECISIONS]
    if bad or not precisions:
        parser.error(f"--precisions: unknown {bad}; choose from {', '.join(PRECISIONS)}")
    if args.heads <= 0 or args.hidden % args.heads or (args.hidden // args.heads) % 2:
        parser.error("--hidden must be a multiple of --heads with an even head size")
    if args.variant == "turbo" and args.lm_position_ids is False:
        parser.error("Turbo's GPT-2 LM always takes position_ids")
    cfg = SyntheticConfig(
        variant=args.variant,
        layers=args.layers,
        hidden=args.hidden,
        heads=args.heads,
        intermediate=args.intermediate,
        text_vocab=args.text_vocab,
        lm_position_ids=args.lm_position_ids,
        stop_after=args.stop_after,
        seed=args.seed,
        external_data=not args.no_external_data,
        precisions=precisions,
    )
    return cfg, args.out_dir


def main(argv: Sequence[str] | None = None) -> int:
    cfg, out_dir = parse_args(argv)
    written = export(cfg, out_dir)
    total = sum(p.stat().st_size for p in written)
    print(f"wrote {len(written)} files ({total / 1e6:.1f} MB) to {out_dir}", file=sys.stderr)
    return 0


__all__ = [
    "PRECISIONS",
    "PRECISION_SUFFIX",
    "VARIANTS",
    "SyntheticConfig",
    "export",
    "main",
]

if __name__ == "__main__":
    raise SystemExit(main())

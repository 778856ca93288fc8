"""Builds the codec-lm bundle (random weights) for tests and benchmarks.

    python -m export.build_codec_lm [OUT_DIR] [--seed 0]   # no OUT_DIR: the build cache

All graphs are written by hand with onnx.helper from the torch modules' weights, so the files
are byte-identical from build to build (checked by tests/test_codec_lm_export.py). The bundle
is not shipped in the wheel: `codec_lm_bundle()` builds it once into a content-addressed cache
directory (keyed by this recipe's sources, the seed and the torch/onnx/numpy versions) and
returns it from there afterwards.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import shutil
import string
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch

from export.build_cache import build_cache_root
from export.codec_lm_model import (
    LEAKY_SLOPE,
    CodecLMConfig,
    CodecLMModel,
    build_codec_lm_model,
)
from export.onnx_graphs import (
    LayerWeights,
    LMWeights,
    build_concat_lm,
    build_gqa_lm,
    kv_manifest,
    write_bundle,
)
from onnx_tts.tools.graph_builder import FLOAT, INT64, GraphBuilder, linear, reduce_op

REPO_ROOT = Path(__file__).resolve().parent.parent
# The sources whose bytes decide the bundle's bytes (with the seed and library versions).
RECIPE_SOURCES = (
    "export/build_codec_lm.py",
    "export/codec_lm_model.py",
    "export/onnx_graphs.py",
    "onnx_tts/tools/graph_builder.py",
)
RECIPE_LIBRARIES = ("torch", "onnx", "numpy", "tokenizers")
GRAPH_FILES = {
    "encoder": "encoder.onnx",
    "embed": "embed.onnx",
    "lm": "lm.onnx",
    "lm_concat": "lm_concat.onnx",
    "vocoder": "vocoder.onnx",
}
TOKENIZER_FILE = "tokenizer.json"
KV_CAPACITY = 2048

SPECIAL_TOKENS = ("<pad>", "<unk>", "<bos>", "<eos>")
PUNCTUATION = (".", ",", "?", "!", "'", "-", ":", ";", '"', "(", ")")


def tokenizer_vocab() -> dict[str, int]:
    symbols = [*SPECIAL_TOKENS, *string.ascii_lowercase, *string.digits, " ", *PUNCTUATION]
    return {symbol: index for index, symbol in enumerate(symbols)}


def build_tokenizer_json() -> str:
    """Character-level BPE with no merges; NFKC + lowercase; unknown characters -> <unk>."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    tokenizer = Tokenizer(models.BPE(vocab=tokenizer_vocab(), merges=[], unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return tokenizer.to_str(pretty=True) + "\n"


def _np(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.detach().cpu().numpy().astype(np.float32))


def _linear_weight(layer: torch.nn.Linear) -> np.ndarray:
    return _np(layer.weight.T)  # torch keeps [out, in]; the graph computes x @ W


def _bias(layer: torch.nn.Linear | torch.nn.Conv1d) -> np.ndarray:
    if layer.bias is None:
        raise ValueError(f"{layer} has no bias")
    return _np(layer.bias)


def _gather_codebook_sum(b: GraphBuilder, codes: str, tables: np.ndarray, name: str) -> str:
    """Sum over k of tables[k][codes[..., k]]; codes [B,S,K] -> [B,S,D].

    One Gather per codebook on its own table (not one on the flattened tables), so an id past
    the end of a table fails in ORT instead of silently reading the next codebook's rows.
    """
    total = ""
    for k, table in enumerate(tables):
        ids = b.node("Gather", [codes, b.const(k)], axis=2, name=f"{name}.{k}/Ids")
        rows = b.node(
            "Gather",
            [b.initializer(f"{name}.{k}.table", table), ids],
            axis=0,
            name=f"{name}.{k}/Gather",
        )
        total = rows if not total else b.node("Add", [total, rows], name=f"{name}.{k}/Sum")
    return total


def build_encoder_graph(model: CodecLMModel) -> onnx.ModelProto:
    enc, cfg = model.encoder, model.cfg
    b = GraphBuilder("encoder")
    audio = b.add_input("audio", FLOAT, ("batch", "samples"))
    hop = b.const([cfg.hop_length])
    batch = b.shape_dims(audio, 0, 1, "frames/B")
    frames = b.node("Div", [b.shape_dims(audio, 1, 2, "frames/N"), hop], name="frames/F")
    usable = b.node("Mul", [frames, hop], name="frames/Usable")
    trimmed = b.node("Slice", [audio, b.const([0]), usable, b.const([1])], name="frames/Trim")
    shape = b.node("Concat", [batch, frames, hop], axis=0, name="frames/Shape")
    x = b.node("Reshape", [trimmed, shape], name="frames/Reshape")  # [B,F,hop]
    x = b.node(
        "Tanh", [linear(b, x, _linear_weight(enc.frame_proj), _bias(enc.frame_proj), "frame_proj")]
    )
    x = b.node("Transpose", [x], perm=[0, 2, 1], name="context/In")
    x = b.node(
        "Conv",
        [
            x,
            b.initializer("context.weight", _np(enc.context.weight)),
            b.initializer("context.bias", _bias(enc.context)),
        ],
        pads=[1, 1],
        name="context/Conv",
    )
    x = b.node("LeakyRelu", [x], alpha=LEAKY_SLOPE, name="context/Act")
    x = b.node("Transpose", [x], perm=[0, 2, 1], name="context/Out")
    latent = linear(b, x, _linear_weight(enc.to_latent), _bias(enc.to_latent), "to_latent")

    residual = latent
    stage_codes = []
    for k, codebook in enumerate(_np(enc.rvq.codebooks)):
        table = b.initializer(f"rvq.{k}.codebook", codebook)
        # A Transpose node rather than a second copy: ORT folds it once at load time.
        table_t = b.node("Transpose", [table], perm=[1, 0], name=f"rvq.{k}/CodebookT")
        norms = b.initializer(f"rvq.{k}.norms", (codebook * codebook).sum(-1))
        dot = b.node("MatMul", [residual, table_t], name=f"rvq.{k}/Dot")
        twice = b.node("Mul", [dot, b.const(2.0, np.float32)], name=f"rvq.{k}/Twice")
        distance = b.node("Sub", [norms, twice], name=f"rvq.{k}/Distance")
        index = b.node("ArgMin", [distance], axis=-1, keepdims=0, name=f"rvq.{k}/ArgMin")
        chosen = b.node("Gather", [table, index], axis=0, name=f"rvq.{k}/Codeword")
        residual = b.node("Sub", [residual, chosen], name=f"rvq.{k}/Residual")
        stage_codes.append(b.node("Unsqueeze", [index, b.const([-1])], name=f"rvq.{k}/Code"))
    b.node("Concat", stage_codes, axis=-1, output_names=["codes"], name="codes/Concat")
    b.add_output("codes", INT64, ("batch", "frames", cfg.codebooks))

    pooled = reduce_op(b, "ReduceMean", latent, [1], keepdims=False, name="speaker/Mean")
    spk = linear(b, pooled, _linear_weight(enc.speaker), _bias(enc.speaker), "speaker")
    sq = reduce_op(
        b, "ReduceSum", b.node("Mul", [spk, spk]), [-1], keepdims=True, name="speaker/Sq"
    )
    norm = b.node("Sqrt", [b.node("Add", [sq, b.const(1e-12, np.float32)])], name="speaker/Norm")
    b.node("Div", [spk, norm], output_names=["speaker_embedding"], name="speaker/Normalize")
    b.add_output("speaker_embedding", FLOAT, ("batch", cfg.speaker_dim))
    # graph doc strings keep the pre-rename words: they are bytes of the checked-in bundle
    return b.build("reference encoder: frames -> conv stack -> latent -> residual VQ")


def build_embed_graph(model: CodecLMModel) -> onnx.ModelProto:
    emb, cfg = model.embed, model.cfg
    b = GraphBuilder("embed")
    text_ids = b.add_input("text_ids", INT64, ("batch", "text_length"))
    audio_codes = b.add_input("audio_codes", INT64, ("batch", "audio_length", cfg.codebooks))
    speaker = b.add_input("speaker_embedding", FLOAT, ("batch", cfg.speaker_dim))
    text_table = b.initializer("text.table", _np(emb.text))
    b.node(
        "Gather", [text_table, text_ids], axis=0, output_names=["text_embeds"], name="text/Gather"
    )
    audio = _gather_codebook_sum(b, audio_codes, _np(emb.audio), "audio")
    b.identity(audio, "audio_embeds")
    projected = linear(b, speaker, _linear_weight(emb.speaker), _bias(emb.speaker), "speaker")
    b.node(
        "Unsqueeze",
        [projected, b.const([1])],
        output_names=["speaker_embeds"],
        name="speaker/Unsqueeze",
    )
    b.add_output("text_embeds", FLOAT, ("batch", "text_length", cfg.hidden_size))
    b.add_output("audio_embeds", FLOAT, ("batch", "audio_length", cfg.hidden_size))
    b.add_output("speaker_embeds", FLOAT, ("batch", 1, cfg.hidden_size))
    return b.build("reference embeddings: text table, summed per-codebook audio tables, speaker")


def build_vocoder_graph(model: CodecLMModel) -> onnx.ModelProto:
    voc, cfg = model.vocoder, model.cfg
    b = GraphBuilder("vocoder")
    codes = b.add_input("codes", INT64, ("batch", "frames", cfg.codebooks))
    latent = _gather_codebook_sum(b, codes, _np(voc.rvq.codebooks), "dequantize")
    x = linear(b, latent, _linear_weight(voc.inp), _bias(voc.inp), "inp")
    x = b.node("LeakyRelu", [x], alpha=LEAKY_SLOPE, name="inp/Act")
    x = b.node("Transpose", [x], perm=[0, 2, 1], name="blocks/In")
    for i, block in enumerate(voc.blocks):
        y = b.node(
            "Conv",
            [
                x,
                b.initializer(f"blocks.{i}.weight", _np(block.conv.weight)),
                b.initializer(f"blocks.{i}.bias", _bias(block.conv)),
            ],
            dilations=[block.conv.dilation[0]],
            pads=[block.left_pad, 0],  # causal: left padding only
            name=f"blocks.{i}/Conv",
        )
        y = b.node("LeakyRelu", [y], alpha=LEAKY_SLOPE, name=f"blocks.{i}/Act")
        x = b.node("Add", [x, y], name=f"blocks.{i}/Residual")
    x = b.node("Transpose", [x], perm=[0, 2, 1], name="blocks/Out")
    x = b.node(
        "Tanh", [linear(b, x, _linear_weight(voc.out), _bias(voc.out), "out")], name="out/Tanh"
    )
    x = b.node("Mul", [x, b.const(0.5, np.float32)], name="out/Bound")
    samples = b.node(
        "Mul", [b.shape_dims(codes, 1, 2, "out/F"), b.const([cfg.hop_length])], name="out/Samples"
    )
    shape = b.node(
        "Concat", [b.shape_dims(codes, 0, 1, "out/B"), samples], axis=0, name="out/Shape"
    )
    b.node("Reshape", [x, shape], output_names=["waveform"], name="out/Reshape")
    b.add_output("waveform", FLOAT, ("batch", "samples"))
    return b.build(
        f"reference vocoder: causal, receptive field {cfg.vocoder_receptive_field_frames} frames"
    )


def lm_weights(model: CodecLMModel) -> LMWeights:
    lm = model.lm
    layers = [
        LayerWeights(
            attn_norm=_np(layer.attn_norm.weight),
            q=_linear_weight(layer.q_proj),
            k=_linear_weight(layer.k_proj),
            v=_linear_weight(layer.v_proj),
            o=_linear_weight(layer.o_proj),
            mlp_norm=_np(layer.mlp_norm.weight),
            gate=_linear_weight(layer.gate),
            up=_linear_weight(layer.up),
            down=_linear_weight(layer.down),
        )
        for layer in lm.layers
    ]
    return LMWeights(layers, _np(lm.final_norm.weight), _linear_weight(lm.head))


def bundle_manifest(cfg: CodecLMConfig) -> dict[str, object]:
    """bundle.json without the file hashes (write_bundle adds them)."""
    return {
        "format_version": 1,
        "family": "codec-lm",
        "name": "onnx-tts-codec-lm",
        "version": "1",
        "sample_rate": cfg.sample_rate,
        "graphs": dict(GRAPH_FILES),
        "kv": kv_manifest(cfg, KV_CAPACITY),
        "codec": {
            "frame_rate": cfg.sample_rate // cfg.hop_length,
            "hop_length": cfg.hop_length,
            "codebooks": cfg.codebooks,
            "codebook_size": cfg.codebook_size,
            "pattern": "delay",
            "pad_id": cfg.pad_id,
            "bos_id": cfg.bos_id,
            "eos_id": cfg.eos_id,
        },
        "text": {"tokenizer": TOKENIZER_FILE, "max_tokens_per_chunk": 200},
        "encoder": {"min_seconds": 0.5, "max_seconds": 30.0, "prompt_frames": 150},
        "lm": {"hidden_size": cfg.hidden_size, "max_positions": cfg.max_positions},
        "sampling": {
            "temperature": 0.8,
            "top_k": 50,
            "top_p": 0.95,
            "repetition_penalty": 1.1,
            "max_frames_per_token": 12,
            "min_frames_per_token": 3,
        },
        "streaming": {
            "first_chunk_frames": 8,
            "stride_frames": 24,
            "overlap_frames": 8,
            "holdback_frames": 2,
            "crossfade_samples": 480,
        },
        "vocoder": {
            "receptive_field_frames": cfg.vocoder_receptive_field_frames,
            "lookahead_frames": 0,
        },
    }


@dataclass
class BuildResult:
    out_dir: Path
    model: CodecLMModel
    sha256: dict[str, str]
    sizes: dict[str, int]


def build_codec_lm(out_dir: str | Path, seed: int = 0) -> BuildResult:
    """Builds every file of the bundle into out_dir (atomically, file by file)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    # One thread: the k-means reductions then run in one fixed order on any machine.
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        cfg = CodecLMConfig(text_vocab_size=len(tokenizer_vocab()))
        model = build_codec_lm_model(seed, cfg)
        weights = lm_weights(model)
        graphs = {
            "encoder": build_encoder_graph(model),
            "embed": build_embed_graph(model),
            "lm": build_gqa_lm(cfg.lm_spec(), weights, name="lm"),
            "lm_concat": build_concat_lm(cfg.lm_spec(), weights, name="lm_concat"),
            "vocoder": build_vocoder_graph(model),
        }
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)

    files: dict[str, onnx.ModelProto | bytes] = {
        filename: graphs[key] for key, filename in GRAPH_FILES.items()
    }
    files[TOKENIZER_FILE] = build_tokenizer_json().encode("utf-8")
    sha256, sizes = write_bundle(out, bundle_manifest(cfg), files)
    return BuildResult(out, model, sha256, sizes)


def recipe_key(seed: int = 0) -> str:
    """A digest of everything the bundle's bytes depend on: a new key means a new build."""
    digest = hashlib.sha256(f"codec-lm seed={seed}\n".encode())
    for name in RECIPE_LIBRARIES:
        digest.update(f"{name}=={importlib.metadata.version(name)}\n".encode())
    for source in RECIPE_SOURCES:
        digest.update(source.encode() + b"\0" + (REPO_ROOT / source).read_bytes())
    return digest.hexdigest()[:24]


def codec_lm_bundle(seed: int = 0, cache_root: str | Path | None = None) -> Path:
    """The codec-lm bundle directory for `seed`, built on first use.

    The build goes into a fresh temporary directory beside its final place and is renamed
    there when complete, so a reader never sees half a bundle; when two processes build at
    once, the first rename wins and the other build is dropped (the bytes are the same)."""
    root = Path(cache_root) if cache_root is not None else build_cache_root()
    target = root / "codec-lm" / recipe_key(seed)
    if (target / "bundle.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the files inside are world-readable
    try:
        build_codec_lm(staging, seed)
        try:
            staging.rename(target)
        except OSError:
            if not (target / "bundle.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", nargs="?", help="directory to build into (default: cache)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    if args.out_dir is None:
        print(codec_lm_bundle(args.seed))
        return
    result = build_codec_lm(args.out_dir, args.seed)
    elapsed = time.perf_counter() - start
    for name, size in sorted(result.sizes.items()):
        print(f"{size:>12,d}  {name}")
    print(
        f"{sum(result.sizes.values()):>12,d}  total, built in {elapsed:.1f} s -> {result.out_dir}"
    )


if __name__ == "__main__":
    main()

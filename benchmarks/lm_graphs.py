"""LM graph builders for the KV-handling benchmark (issue 6).

Each benchmark shape gets two ONNX graphs that share one set of random weights:

- ``concat.onnx``: a transformers ``GPT2LMHeadModel`` / ``LlamaForCausalLM`` with random init,
  exported in optimum's ``text-generation-with-past`` layout (export/hf_causal_lm.py), i.e. the
  Concat-KV layout that
  third-party LMs are published in. Inputs ``input_ids``, ``attention_mask``, ``position_ids``,
  ``past_key_values.N.key|value``; outputs ``logits``, ``present.N.key|value``.
- ``gqa.onnx``: the same weights read out of the torch model and written as a graph with
  ``com.microsoft.GroupQueryAttention``, so that one fixed-capacity buffer per KV tensor can be
  bound as both past and present. Inputs ``input_ids``, ``seqlens_k`` i32 [B] (total length - 1),
  ``total_sequence_length`` i32 scalar, ``past_key_values.N.key|value``; outputs ``logits``,
  ``present.N.key|value``.

Exports are cached under ``~/.cache/onnx-tts/bench-graphs/<config-hash>/`` (override with
``ONNX_TTS_BENCH_CACHE``): the fp32 graphs of the full-size shapes are 1.4-2 GB each.
torch and transformers are needed only to build graphs (the ``export`` extra).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from onnx_tts.errors import InputError, ModelError
from onnx_tts.tools.graph_builder import FLOAT, INT32, INT64, IR_VERSION, MS_DOMAIN, GraphBuilder

# Bump when the graph layout written by this module changes, so stale caches are not reused.
BUILDER_VERSION = "2"
GQA_OPSET = (
    23  # RMSNormalization (23) and Gelu(approximate="tanh") (20) are both in the ONNX domain
)
ORT_MAX_IR_VERSION = IR_VERSION  # onnx 1.23 writes IR 14 by default; ORT 1.31 reads <= 13


@dataclass(frozen=True)
class LMShape:
    """Architecture of one benchmark LM; weights are random (seeded)."""

    name: str
    family: str  # "gpt2" or "llama"
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    vocab: int
    intermediate: int
    max_positions: int = 2048
    rope_theta: float = 10000.0
    seed: int = 0

    def config_hash(self) -> str:
        """Cache key: every field plus the builder and exporter versions."""
        import onnxruntime

        payload = dataclasses.asdict(self) | {
            "builder": BUILDER_VERSION,
            "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__,
        }
        text = json.dumps(payload, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def weight_bytes(self) -> int:
        """Approximate fp32 weight size, to warn about disk and time before exporting."""
        d, f, v = self.hidden, self.intermediate, self.vocab
        kv = self.kv_heads * self.head_dim
        attention = d * (self.heads * self.head_dim + 2 * kv) + self.heads * self.head_dim * d
        mlp = (3 if self.family == "llama" else 2) * d * f
        head = 0 if self.family == "gpt2" else v * d  # GPT-2 ties lm_head to wte
        return 4 * (self.layers * (attention + mlp) + v * d + head)


# Full-size shapes of the issue, then the small stand-ins used by --quick and by the tests.
SHAPES: dict[str, LMShape] = {
    # Chatterbox Turbo LM: GPT-2 medium with the speech vocabulary.
    "turbo": LMShape("turbo", "gpt2", 24, 16, 16, 64, 1024, 6563, 4096),
    # Original Chatterbox LM: Llama 30 layers (the 520M "Llama_520M" config, speech vocab 8194).
    "chatterbox": LMShape(
        "chatterbox", "llama", 30, 16, 16, 64, 1024, 8194, 4096, rope_theta=500000.0
    ),
    "turbo-small": LMShape("turbo-small", "gpt2", 4, 4, 4, 64, 256, 6563, 1024),
    "chatterbox-small": LMShape(
        "chatterbox-small", "llama", 4, 4, 4, 64, 256, 8194, 1024, rope_theta=500000.0
    ),
    # Tiny configs for the logits-equivalence tests (one exports in well under a second).
    "gpt2-tiny": LMShape("gpt2-tiny", "gpt2", 2, 4, 4, 16, 64, 101, 128, max_positions=256),
    "llama-tiny": LMShape("llama-tiny", "llama", 2, 4, 2, 16, 64, 101, 128, max_positions=256),
}


def cache_root() -> Path:
    """Where exported benchmark graphs live (ONNX_TTS_BENCH_CACHE overrides the default)."""
    override = os.environ.get("ONNX_TTS_BENCH_CACHE")
    if override:
        return Path(override)
    return Path.home() / ".cache" / "onnx-tts" / "bench-graphs"


@dataclass(frozen=True)
class ShapeGraphs:
    """The two graphs of one shape (same weights) and where they were cached."""

    shape: LMShape
    directory: Path
    concat_path: Path
    gqa_path: Path


def build_torch_model(shape: LMShape) -> Any:
    """A transformers model with the shape's architecture and seeded random weights."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(shape.seed)
    if shape.family == "gpt2":
        if shape.kv_heads != shape.heads or shape.hidden != shape.heads * shape.head_dim:
            raise InputError(
                f"shape {shape.name!r}: GPT-2 needs kv_heads == heads and "
                "hidden == heads * head_dim; fix the LMShape"
            )
        config = GPT2Config(
            n_layer=shape.layers,
            n_head=shape.heads,
            n_embd=shape.hidden,
            n_inner=shape.intermediate,
            vocab_size=shape.vocab,
            n_positions=shape.max_positions,
            activation_function="gelu_new",
            attn_implementation="eager",
        )
        model = GPT2LMHeadModel(config)
    elif shape.family == "llama":
        config = LlamaConfig(
            num_hidden_layers=shape.layers,
            num_attention_heads=shape.heads,
            num_key_value_heads=shape.kv_heads,
            head_dim=shape.head_dim,
            hidden_size=shape.hidden,
            intermediate_size=shape.intermediate,
            vocab_size=shape.vocab,
            max_position_embeddings=shape.max_positions,
            rope_theta=shape.rope_theta,
            tie_word_embeddings=False,
            attn_implementation="eager",
        )
        model = LlamaForCausalLM(config)
    else:
        raise InputError(f"shape {shape.name!r}: unknown family {shape.family!r}; use gpt2|llama")
    return model.eval()


def export_concat(model: Any, out_dir: Path) -> Path:
    """Export the model the way third-party LMs are published: optimum's with-past layout
    (export/hf_causal_lm.py, the model's own attention code, Concat-grown cache)."""
    try:
        from export.hf_causal_lm import export_with_past
    except ImportError as exc:  # the runtime install does not carry the exporter
        raise ModelError(
            "building benchmark graphs needs torch and transformers; install the export "
            "extra (pip install 'onnx-tts[export]')"
        ) from exc
    return export_with_past(model, out_dir / "optimum")


# ---------------------------------------------------------------- GQA graph writer


def _affine(w: Any, x: str, state: dict, w_name: str, w_key: str, b_name: str, b_key: str) -> str:
    """x @ W + b with GPT-2 Conv1D weights ([in, out]) taken from the torch state dict."""
    weight = w.initializer(w_name, _numpy(state[w_key]))
    return w.node(
        "Add", [w.node("MatMul", [x, weight]), w.initializer(b_name, _numpy(state[b_key]))]
    )


def _layer_norm(
    w: Any, x: str, state: dict, g_name: str, g_key: str, b_name: str, b_key: str, eps: float
) -> str:
    scale, bias = (
        w.initializer(g_name, _numpy(state[g_key])),
        w.initializer(b_name, _numpy(state[b_key])),
    )
    return w.node("LayerNormalization", [x, scale, bias], axis=-1, epsilon=eps)


def _group_query_attention(
    w: GraphBuilder, packed_qkv: str, layer: int, attrs: dict[str, Any], rotary: bool
) -> str:
    """GQA node of one layer: packed QKV in, attention out, KV written to present.N.*."""
    name = f"l{layer}.attn"
    inputs = [packed_qkv, "", "", f"past_key_values.{layer}.key", f"past_key_values.{layer}.value"]
    inputs += ["seqlens_k", "total_sequence_length"]
    if rotary:  # Llama: rotate_half layout (not interleaved), positions taken from seqlens_k
        inputs += ["cos_cache", "sin_cache"]
    w.node(
        "GroupQueryAttention",
        inputs,
        name=name,
        output_names=[name, f"present.{layer}.key", f"present.{layer}.value"],
        domain=MS_DOMAIN,
        do_rotary=int(rotary),
        rotary_interleaved=0,
        **attrs,
    )
    return name


def _numpy(tensor: Any) -> np.ndarray:
    return tensor.detach().float().cpu().numpy()


def _kv_io(w: GraphBuilder, shape: LMShape) -> None:
    for i in range(shape.layers):
        for kind in ("key", "value"):
            dims = ("batch_size", shape.kv_heads, "past_sequence_length", shape.head_dim)
            w.add_input(f"past_key_values.{i}.{kind}", FLOAT, dims)
    for i in range(shape.layers):
        for kind in ("key", "value"):
            dims = ("batch_size", shape.kv_heads, "present_sequence_length", shape.head_dim)
            w.add_output(f"present.{i}.{kind}", FLOAT, dims)


def build_gqa_model(model: Any, shape: LMShape) -> onnx.ModelProto:
    """Write the torch model's weights into a GroupQueryAttention graph (see module doc)."""
    w = GraphBuilder(f"{shape.name}_gqa", opset=GQA_OPSET, producer="onnx-tts-bench")
    w.add_input("input_ids", INT64, ("batch_size", "sequence_length"))
    w.add_input("seqlens_k", INT32, ("batch_size",))
    w.add_input("total_sequence_length", INT32, ())
    w.add_output("logits", FLOAT, ("batch_size", "sequence_length", shape.vocab))
    _kv_io(w, shape)
    qkv_width = (shape.heads + 2 * shape.kv_heads) * shape.head_dim
    gqa_attrs = {
        "num_heads": shape.heads,
        "kv_num_heads": shape.kv_heads,
        "scale": float(shape.head_dim**-0.5),
    }
    state = model.state_dict()

    # seqlens_k is total length - 1, so the first new token sits at seqlens_k + 1 - S.
    seq_len = w.node(
        "Gather", [w.node("Shape", ["input_ids"]), w.initializer("one_i64", np.array(1))]
    )
    one = "one_i64"
    past_len = w.node(
        "Sub", [w.node("Add", [w.node("Cast", ["seqlens_k"], to=INT64), one]), seq_len]
    )
    offsets = w.node("Range", [w.initializer("zero_i64", np.array(0)), seq_len, one])
    positions = w.node(
        "Add", [w.node("Unsqueeze", [past_len, w.initializer("axis1", np.array([1]))]), offsets]
    )

    if shape.family == "gpt2":
        wte = w.initializer("wte", _numpy(state["transformer.wte.weight"]))
        wpe = w.initializer("wpe", _numpy(state["transformer.wpe.weight"]))
        hidden = w.node(
            "Add", [w.node("Gather", [wte, "input_ids"]), w.node("Gather", [wpe, positions])]
        )
    else:
        embed = w.initializer("embed_tokens", _numpy(state["model.embed_tokens.weight"]))
        hidden = w.node("Gather", [embed, "input_ids"])
        rotary = model.model.rotary_emb
        scaling = float(getattr(rotary, "attention_scaling", 1.0))
        inv_freq = rotary.inv_freq.detach().double().cpu().numpy()
        angles = np.outer(np.arange(shape.max_positions, dtype=np.float64), inv_freq)
        w.initializer("cos_cache", (np.cos(angles) * scaling).astype(np.float32))
        w.initializer("sin_cache", (np.sin(angles) * scaling).astype(np.float32))

    for i in range(shape.layers):
        if shape.family == "gpt2":
            p = f"transformer.h.{i}."
            normed = _layer_norm(
                w,
                hidden,
                state,
                f"l{i}.ln1.w",
                p + "ln_1.weight",
                f"l{i}.ln1.b",
                p + "ln_1.bias",
                float(model.config.layer_norm_epsilon),
            )
            # Conv1D stores [in, out] and c_attn's output is [q | k | v]: already GQA's packed QKV.
            qkv = _affine(
                w,
                normed,
                state,
                f"l{i}.qkv.w",
                p + "attn.c_attn.weight",
                f"l{i}.qkv.b",
                p + "attn.c_attn.bias",
            )
            attn = _group_query_attention(w, qkv, i, gqa_attrs, rotary=False)
            proj = _affine(
                w,
                attn,
                state,
                f"l{i}.o.w",
                p + "attn.c_proj.weight",
                f"l{i}.o.b",
                p + "attn.c_proj.bias",
            )
            hidden = w.node("Add", [hidden, proj])
            normed = _layer_norm(
                w,
                hidden,
                state,
                f"l{i}.ln2.w",
                p + "ln_2.weight",
                f"l{i}.ln2.b",
                p + "ln_2.bias",
                float(model.config.layer_norm_epsilon),
            )
            up = _affine(
                w,
                normed,
                state,
                f"l{i}.fc.w",
                p + "mlp.c_fc.weight",
                f"l{i}.fc.b",
                p + "mlp.c_fc.bias",
            )
            act = w.node("Gelu", [up], approximate="tanh")  # gelu_new is the tanh approximation
            down = _affine(
                w,
                act,
                state,
                f"l{i}.down.w",
                p + "mlp.c_proj.weight",
                f"l{i}.down.b",
                p + "mlp.c_proj.bias",
            )
            hidden = w.node("Add", [hidden, down])
        else:
            p = f"model.layers.{i}."
            eps = float(model.config.rms_norm_eps)
            normed = w.node(
                "RMSNormalization",
                [
                    hidden,
                    w.initializer(f"l{i}.in_norm", _numpy(state[p + "input_layernorm.weight"])),
                ],
                axis=-1,
                epsilon=eps,
            )
            # nn.Linear stores [out, in]; one packed [in, q+k+v] matmul feeds GQA's packed QKV.
            qkv_weight = np.concatenate(
                [_numpy(state[p + f"self_attn.{n}_proj.weight"]).T for n in ("q", "k", "v")], axis=1
            )
            assert qkv_weight.shape[1] == qkv_width
            qkv = w.node("MatMul", [normed, w.initializer(f"l{i}.qkv.w", qkv_weight)])
            attn = _group_query_attention(w, qkv, i, gqa_attrs, rotary=True)
            o_weight = _numpy(state[p + "self_attn.o_proj.weight"]).T
            hidden = w.node(
                "Add", [hidden, w.node("MatMul", [attn, w.initializer(f"l{i}.o.w", o_weight)])]
            )
            normed = w.node(
                "RMSNormalization",
                [
                    hidden,
                    w.initializer(
                        f"l{i}.post_norm", _numpy(state[p + "post_attention_layernorm.weight"])
                    ),
                ],
                axis=-1,
                epsilon=eps,
            )
            gate = w.node(
                "MatMul",
                [normed, w.initializer(f"l{i}.gate", _numpy(state[p + "mlp.gate_proj.weight"]).T)],
            )
            up = w.node(
                "MatMul",
                [normed, w.initializer(f"l{i}.up", _numpy(state[p + "mlp.up_proj.weight"]).T)],
            )
            swish = w.node("Mul", [gate, w.node("Sigmoid", [gate])])
            down_w = w.initializer(f"l{i}.down", _numpy(state[p + "mlp.down_proj.weight"]).T)
            hidden = w.node("Add", [hidden, w.node("MatMul", [w.node("Mul", [swish, up]), down_w])])

    if shape.family == "gpt2":
        normed = w.node(
            "LayerNormalization",
            [
                hidden,
                w.initializer("lnf.w", _numpy(state["transformer.ln_f.weight"])),
                w.initializer("lnf.b", _numpy(state["transformer.ln_f.bias"])),
            ],
            axis=-1,
            epsilon=float(model.config.layer_norm_epsilon),
        )
        head = w.initializer("lm_head", _numpy(state["transformer.wte.weight"]).T)  # tied to wte
    else:
        normed = w.node(
            "RMSNormalization",
            [hidden, w.initializer("norm", _numpy(state["model.norm.weight"]))],
            axis=-1,
            epsilon=float(model.config.rms_norm_eps),
        )
        head = w.initializer("lm_head", _numpy(state["lm_head.weight"]).T)
    w.node("MatMul", [normed, head], output_names=["logits"], name="lm_head")
    return w.build()


def save_model(model_proto: onnx.ModelProto, path: Path) -> None:
    """Save with weights in one sidecar file (fp32 graphs of the big shapes exceed 2 GB)."""
    onnx.save_model(
        model_proto,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=path.name + ".data",
        size_threshold=1024,
    )


def ensure_graphs(shape: LMShape, *, rebuild: bool = False, log: Any = None) -> ShapeGraphs:
    """Return the shape's cached graphs, exporting both first if they are not cached yet.

    The pair is built in a temporary directory beside the cache entry and moved into place with
    one rename, so an interrupted export never leaves a half-written entry behind.
    """
    root = cache_root()
    directory = root / f"{shape.name}-{shape.config_hash()}"
    concat_path = directory / "optimum" / "model.onnx"
    result = ShapeGraphs(shape, directory, concat_path, directory / "gqa.onnx")
    if not rebuild and result.concat_path.is_file() and result.gqa_path.is_file():
        return result
    root.mkdir(parents=True, exist_ok=True)
    needed = 2 * shape.weight_bytes()  # the optimum export + the GQA graph
    free = shutil.disk_usage(root).free
    if free < needed:
        raise ModelError(
            f"building graphs for {shape.name!r} needs ~{needed / 1e9:.1f} GB free under {root}, "
            f"only {free / 1e9:.1f} GB left; free space or set ONNX_TTS_BENCH_CACHE"
        )
    if log:
        log(
            f"[bench-kv] exporting {shape.name} (~{shape.weight_bytes() / 1e9:.2f} GB fp32) "
            f"to {directory}"
        )
    work = Path(tempfile.mkdtemp(prefix=f".{shape.name}-", dir=root))
    try:
        model = build_torch_model(shape)
        exported = export_concat(model, work)
        header = onnx.load(str(exported), load_external_data=False)
        if header.ir_version > ORT_MAX_IR_VERSION:
            # only the header is rewritten: the weights stay in the exporter's sidecar file
            header.ir_version = ORT_MAX_IR_VERSION
            onnx.save_model(header, str(exported))
        del header
        gqa_proto = build_gqa_model(model, shape)
        del model
        save_model(gqa_proto, work / "gqa.onnx")
        del gqa_proto
        (work / "shape.json").write_text(json.dumps(dataclasses.asdict(shape), indent=2))
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(work, directory)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return result


def shape_by_name(name: str) -> LMShape:
    """Look up a benchmark shape; a clear InputError lists the valid names otherwise."""
    try:
        return SHAPES[name]
    except KeyError:
        raise InputError(
            f"unknown LM shape {name!r}; choose from {', '.join(sorted(SHAPES))} or 'codec-lm'"
        ) from None

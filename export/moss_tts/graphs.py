"""The ONNX graphs of a MOSS-TTS model besides its backbone (which is export/backbones/qwen3.py):

* `embed.onnx`  `input_ids` int64 [B, T, 1 + n_vq] (Local v1 also `channels` int64 [B]: the
  codebooks its n_vq_for_inference sums) -> `inputs_embeds` [B, T, hidden]: the backbone input,
  summed in the published order. Its tables `channel.K` are also what the engine reads straight
  from `embed.onnx_data` to sum rows on the host.
* Local v1.5 `local.onnx`: one position of the depth transformer with its own KV cache:
  `inputs_embeds` [B, S, hidden], `position_ids` [B, S], `channel` int64 scalar, past ->
  `text_logits` [B, S, 2] (continue/stop), `audio_logits` [B, S, codebook] (the head tied to
  codebook `channel`'s embedding), presents.
* Local v1 `local.onnx`: the input MLP and the 4-layer stack without positions, one position
  at a time with its KV cache -> `local_hidden`; `heads/channel_KK.onnx`: channel K's output MLP,
  norm and head, `local_hidden` [B, local] -> `logits` [B, vocab or codebook + 1].
* Delay `heads_text.onnx`: `hidden` [B, hidden] -> `text_logits` [B, vocab];
  `heads_audio.onnx`: `hidden` -> `slot_logits` [B, 2] (the text head's rows of the generation
  and delay slots: all a text step inside audio may choose) and `audio_logits` [B, n_vq,
  codebook + 1].

Weights come by published tensor name from a `weights(name)` callable and stream into each
graph's data file; matrices are stored [in, out] for MatMul (what `onnx-tts quantize` turns
into MatMulNBits).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from export.backbones.qwen3 import PAST, PRESENT, RopeTables, build_backbone_graph, grow_cache
from export.external_weights import StreamingBuilder, save_streamed
from export.moss_tts.config import MossConfig
from export.moss_tts.modules import interleaved_rope_tables
from onnx_tts.tools.graph_builder import FLOAT, INT64, layer_norm, linear, rms_norm, silu

Weights = Callable[[str], np.ndarray]


def table_names(config: MossConfig) -> list[str]:
    """The published names of the backbone input tables, by channel."""
    if config.variant == "local-v1.5":
        return ["transformer.embed_tokens.weight"] + [
            f"audio_embeddings.{k}.weight" for k in range(config.n_vq)
        ]
    if config.variant == "local-v1":
        return [f"model.embedding_list.{k}.weight" for k in range(config.channels)]
    return ["language_model.embed_tokens.weight"] + [
        f"emb_ext.{k}.weight" for k in range(config.n_vq)
    ]


def _write(out_dir: Path, name: str, build: Callable[[StreamingBuilder], None], doc: str) -> Path:
    """`out_dir/name.onnx` with its weights in `name.onnx_data`; returns the graph path."""
    path = out_dir / f"{name}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".onnx_data"), "wb") as sink:
        b = StreamingBuilder(Path(name).name, sink, path.with_suffix(".onnx_data").name)
        build(b)
        model = b.build(doc_string=doc)
    save_streamed(model, path)
    return path


def _matrix(weights: Weights, name: str) -> np.ndarray:
    """A torch Linear weight [out, in] as a MatMul weight [in, out]."""
    return np.ascontiguousarray(weights(name).T)


def _linear(b, x: str, weights: Weights, name: str, bias: bool = False) -> str:
    return linear(
        b, x, _matrix(weights, f"{name}.weight"), weights(f"{name}.bias") if bias else None, name
    )


def _swiglu(b, x: str, weights: Weights, name: str) -> str:
    gate = silu(b, _linear(b, x, weights, f"{name}.gate_proj"), f"{name}/silu")
    up = _linear(b, x, weights, f"{name}.up_proj")
    return _linear(
        b, b.node("Mul", [gate, up], name=f"{name}/GateUp"), weights, f"{name}.down_proj"
    )


# -- embed ---------------------------------------------------------------------------------------
def write_embed(config: MossConfig, weights: Weights, out_dir: Path) -> Path:
    def build(b: StreamingBuilder) -> None:
        ids = b.add_input("input_ids", INT64, ("batch", "sequence", config.channels))
        channels = (
            b.add_input("channels", INT64, ("batch",)) if config.variant == "local-v1" else ""
        )
        tables = [
            b.initializer(f"channel.{k}", weights(name))
            for k, name in enumerate(table_names(config))
        ]

        def column(k: int) -> str:
            picked = b.node("Gather", [ids, b.const(k)], axis=2, name=f"ids/{k}")
            return picked

        x = b.node("Gather", [tables[0], column(0)], axis=0, name="embed/0")
        for k in range(1, config.channels):
            codes = column(k)
            if config.variant == "local-v1.5":
                valid = b.node(
                    "Not",
                    [b.node("Equal", [codes, b.const(config.audio_pad)], name=f"pad/{k}")],
                    name=f"valid/{k}",
                )
                safe = b.node("Where", [valid, codes, b.const(0)], name=f"safe/{k}")
                row = b.node("Gather", [tables[k], safe], axis=0, name=f"embed/{k}")
                keep = b.node(
                    "Unsqueeze",
                    [b.node("Cast", [valid], to=FLOAT, name=f"keep/{k}"), b.const([-1])],
                )
                row = b.node("Mul", [row, keep], name=f"masked/{k}")
            elif config.variant == "local-v1":
                row = b.node("Gather", [tables[k], codes], axis=0, name=f"embed/{k}")
                used = b.node(
                    "Cast",
                    [b.node("LessOrEqual", [b.const(k), channels], name=f"used/{k}")],
                    to=FLOAT,
                )
                used = b.node("Unsqueeze", [used, b.const([1, 2])], name=f"usedB/{k}")
                row = b.node("Mul", [row, used], name=f"masked/{k}")
            else:
                row = b.node("Gather", [tables[k], codes], axis=0, name=f"embed/{k}")
            x = b.node("Add", [x, row], name=f"sum/{k}")
        b.identity(x, "inputs_embeds")
        b.add_output("inputs_embeds", FLOAT, ("batch", "sequence", config.hidden))

    return _write(out_dir, "embed", build, f"MOSS-TTS {config.variant} input embedding sum")


# -- Local v1.5 ----------------------------------------------------------------------------------
def _rotate_pairs(b, x: str, heads: int, head_dim: int, name: str) -> str:
    pairs = b.node("Reshape", [x, b.const([0, 0, heads, head_dim // 2, 2])], name=f"{name}/pairs")
    even, odd = b.node(
        "Split", [pairs, b.const([1, 1])], num_outputs=2, axis=-1, name=f"{name}/Split"
    )
    turned = b.node(
        "Concat", [b.node("Neg", [odd], name=f"{name}/Neg"), even], axis=-1, name=f"{name}/Concat"
    )
    return b.node("Reshape", [turned, b.const([0, 0, heads, head_dim])], name=f"{name}/back")


def write_local_v15(config: MossConfig, weights: Weights, out_dir: Path, rope: RopeTables) -> Path:
    local = config.local_gpt2
    assert local is not None
    nh, hd, width = local.heads, local.head_dim, local.hidden

    def build(b: StreamingBuilder) -> None:
        x = b.add_input("inputs_embeds", FLOAT, ("batch", "sequence", width))
        positions = b.add_input("position_ids", INT64, ("batch", "sequence"))
        channel = b.add_input("channel", INT64, ())
        for i in range(local.layers):
            for kind in ("key", "value"):
                b.add_input(PAST.format(i=i, kind=kind), FLOAT, ("batch", nh, "past_sequence", hd))
        b.add_output("text_logits", FLOAT, ("batch", "sequence", 2))
        b.add_output("audio_logits", FLOAT, ("batch", "sequence", config.codebook))
        for i in range(local.layers):
            for kind in ("key", "value"):
                b.add_output(
                    PRESENT.format(i=i, kind=kind), FLOAT, ("batch", nh, "total_sequence", hd)
                )
        if local.position_type == "absolute":
            wpe = b.initializer("wpe", weights("local_transformer.wpe.weight"))
            x = b.node(
                "Add",
                [x, b.node("Gather", [wpe, positions], axis=0, name="wpe/Gather")],
                name="wpe/Add",
            )
        cos_table, sin_table = interleaved_rope_tables(local, rope)
        cos = b.node(
            "Unsqueeze",
            [
                b.node(
                    "Gather", [b.initializer("rotary.cos", cos_table.numpy()), positions], axis=0
                ),
                b.const([2]),
            ],
        )
        sin = b.node(
            "Unsqueeze",
            [
                b.node(
                    "Gather", [b.initializer("rotary.sin", sin_table.numpy()), positions], axis=0
                ),
                b.const([2]),
            ],
        )
        # Causal mask over the cache: query i sits at P + i.
        steps = b.node("Squeeze", [b.node("Shape", [x], start=1, end=2)], name="mask/S")
        first = b.node(
            "Squeeze",
            [b.node("Shape", [PAST.format(i=0, kind="key")], start=2, end=3)],
            name="mask/P",
        )
        total = b.node("Add", [first, steps], name="mask/T")
        query = b.node("Range", [first, total, b.const(1)], name="mask/Queries")
        key = b.node("Range", [b.const(0), total, b.const(1)], name="mask/Keys")
        allowed = b.node(
            "LessOrEqual",
            [b.node("Unsqueeze", [key, b.const([0])]), b.node("Unsqueeze", [query, b.const([1])])],
            name="mask/Causal",
        )
        lowest = b.const(np.finfo(np.float32).min, np.float32)
        scale = b.const(1.0 / np.sqrt(hd), np.float32)
        for i in range(local.layers):
            p = f"local_transformer.h.{i}"
            h = layer_norm(
                b, x, weights(f"{p}.ln_1.weight"), weights(f"{p}.ln_1.bias"), local.eps, f"{p}.ln_1"
            )
            qkv = _linear(b, h, weights, f"{p}.attn.c_attn", bias=True)
            q, k, v = b.node(
                "Split", [qkv, b.const([width] * 3)], num_outputs=3, axis=-1, name=f"{p}/qkv"
            )
            q, k, v = (
                b.node("Reshape", [t, b.const([0, 0, nh, hd])], name=f"{p}/{n}")
                for t, n in ((q, "q"), (k, "k"), (v, "v"))
            )
            if local.position_type == "rope":
                q = b.node(
                    "Add",
                    [
                        b.node("Mul", [q, cos]),
                        b.node("Mul", [_rotate_pairs(b, q, nh, hd, f"{p}/q_rot"), sin]),
                    ],
                    name=f"{p}/q_rope",
                )
                k = b.node(
                    "Add",
                    [
                        b.node("Mul", [k, cos]),
                        b.node("Mul", [_rotate_pairs(b, k, nh, hd, f"{p}/k_rot"), sin]),
                    ],
                    name=f"{p}/k_rope",
                )
            q, k, v = (
                b.node("Transpose", [t], perm=[0, 2, 1, 3], name=f"{p}/{n}T")
                for t, n in ((q, "q"), (k, "k"), (v, "v"))
            )
            k, v = grow_cache(b, i, k, v, p)
            kt = b.node("Transpose", [k], perm=[0, 1, 3, 2], name=f"{p}/kT")
            scores = b.node("Mul", [b.node("MatMul", [q, kt], name=f"{p}/QK"), scale])
            scores = b.node("Where", [allowed, scores, lowest], name=f"{p}/Mask")
            context = b.node("MatMul", [b.node("Softmax", [scores], axis=-1), v], name=f"{p}/PV")
            context = b.node(
                "Reshape",
                [b.node("Transpose", [context], perm=[0, 2, 1, 3]), b.const([0, 0, width])],
                name=f"{p}/context",
            )
            x = b.node(
                "Add",
                [x, _linear(b, context, weights, f"{p}.attn.c_proj", bias=True)],
                name=f"{p}/AttnResidual",
            )
            h = layer_norm(
                b, x, weights(f"{p}.ln_2.weight"), weights(f"{p}.ln_2.bias"), local.eps, f"{p}.ln_2"
            )
            inner = silu(b, _linear(b, h, weights, f"{p}.mlp.fc_in", bias=True), f"{p}/act")
            x = b.node(
                "Add",
                [x, _linear(b, inner, weights, f"{p}.mlp.fc_out", bias=True)],
                name=f"{p}/MlpResidual",
            )
        h = layer_norm(
            b,
            x,
            weights("local_transformer.ln_f.weight"),
            weights("local_transformer.ln_f.bias"),
            local.eps,
            "local_transformer.ln_f",
        )
        text = _linear(b, h, weights, "local_text_lm_head")
        b.identity(text, "text_logits")
        heads = np.stack(
            [
                np.ascontiguousarray(weights(f"audio_embeddings.{k}.weight").T)
                for k in range(config.n_vq)
            ]
        )  # [n_vq, hidden, codebook]
        head = b.node(
            "Gather",
            [b.initializer("audio_heads", heads), channel],
            axis=0,
            name="audio_head/Gather",
        )
        b.identity(b.node("MatMul", [h, head], name="audio_head/MatMul"), "audio_logits")

    return _write(out_dir, "local", build, "MOSS-TTS Local v1.5 depth transformer step")


# -- Local v1 ------------------------------------------------------------------------------------
def write_local_v1(config: MossConfig, weights: Weights, out_dir: Path) -> Path:
    local = config.local_v1
    assert local is not None

    def named(name: str) -> np.ndarray:
        return weights(f"local_transformer.{name}")

    def prelude(b, x: str) -> str:
        return _swiglu(b, x, weights, "speech_embedding_to_local_mlp")

    path = out_dir / "local.onnx"
    with open(out_dir / "local.onnx_data", "wb") as sink:
        model = build_backbone_graph(
            local.qwen3(),
            named,
            sink,
            "local.onnx_data",
            RopeTables(),
            "local",
            rotary=False,
            input_size=config.hidden,
            prelude=prelude,
            output="local_hidden",
        )
    save_streamed(model, path)
    return path


def write_heads_v1(config: MossConfig, weights: Weights, out_dir: Path) -> list[Path]:
    local = config.local_v1
    assert local is not None
    paths = []
    for k in range(config.channels):
        width = config.vocab if k == 0 else config.codebook + 1

        def build(b: StreamingBuilder, k: int = k, width: int = width) -> None:
            x = b.add_input("local_hidden", FLOAT, ("batch", local.hidden))
            h = _swiglu(b, x, weights, f"local_to_speech_embedding_mlps.{k}")
            h = rms_norm(
                b,
                h,
                weights(f"layer_norm_before_lm_heads.{k}.weight"),
                1e-6,
                f"layer_norm_before_lm_heads.{k}",
            )
            b.identity(_linear(b, h, weights, f"lm_heads.{k}"), "logits")
            b.add_output("logits", FLOAT, ("batch", width))

        paths.append(
            _write(
                out_dir, f"heads/channel_{k:02d}", build, f"MOSS-TTS Local v1 head of channel {k}"
            )
        )
    return paths


# -- Delay ---------------------------------------------------------------------------------------
def write_heads_delay(config: MossConfig, weights: Weights, out_dir: Path) -> list[Path]:
    tokens = config.tokens

    def text(b: StreamingBuilder) -> None:
        x = b.add_input("hidden", FLOAT, ("batch", config.hidden))
        b.identity(_linear(b, x, weights, "lm_heads.0"), "text_logits")
        b.add_output("text_logits", FLOAT, ("batch", config.vocab))

    def audio(b: StreamingBuilder) -> None:
        x = b.add_input("hidden", FLOAT, ("batch", config.hidden))
        rows = weights("lm_heads.0.weight")[[tokens.assistant_slot, tokens.delay_slot]]
        b.identity(linear(b, x, np.ascontiguousarray(rows.T), None, "slot_head"), "slot_logits")
        b.add_output("slot_logits", FLOAT, ("batch", 2))
        stacked = np.concatenate(
            [_matrix(weights, f"lm_heads.{k + 1}.weight") for k in range(config.n_vq)], axis=1
        )
        flat = linear(b, x, stacked, None, "audio_heads")
        b.node(
            "Reshape",
            [flat, b.const([0, config.n_vq, config.codebook + 1])],
            output_names=["audio_logits"],
            name="audio_heads/Reshape",
        )
        b.add_output("audio_logits", FLOAT, ("batch", config.n_vq, config.codebook + 1))

    return [
        _write(out_dir, "heads_text", text, "MOSS-TTS Delay text head"),
        _write(out_dir, "heads_audio", audio, "MOSS-TTS Delay audio heads (and slot rows)"),
    ]


__all__ = [
    "table_names",
    "write_embed",
    "write_heads_delay",
    "write_heads_v1",
    "write_local_v1",
    "write_local_v15",
]

"""The Higgs embedding-sum and audio-head graphs (v2 and v3 alike).

`embed`: `input_ids` int64 [B, S, 1 + K] -> `inputs_embeds` float32 [B, S, W]. Column 0 is a text
token id, or -1 for an audio row whose K codes (0..V-1, BOS/EOS included) are columns 1..K: a
text row is the text table's row, an audio row the sum over codebooks k of the fused audio
table's row k * V + code_k (as both versions embed a delayed audio row). With `routing` (v2's
DualFFN) one more column holds 1.0 on audio rows and 0.0 on text rows: the backbone routes each
position's FFN by it, so the engine's single LM input carries the mask.

`head`: `hidden_state` [B, hidden] (after the backbone's final norm) -> `logits` [B, K, V]:
hidden @ W^T, W the audio head [K * V, hidden] (v3: the fused audio table itself, tied).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import torch

from export.external_weights import StreamingBuilder
from onnx_tts.tools.graph_builder import FLOAT, INT64

INPUT_IDS = "input_ids"
INPUTS_EMBEDS = "inputs_embeds"
HIDDEN_STATE = "hidden_state"
LOGITS = "logits"
AUDIO_ROW = -1  # column 0 of an audio row


def build_embed_graph(
    text_table: np.ndarray,
    audio_table: np.ndarray,
    codebooks: int,
    codebook_size: int,
    routing: bool,
    sink,
    data_name: str,
) -> onnx.ModelProto:
    hidden = text_table.shape[1]
    width = hidden + 1 if routing else hidden
    b = StreamingBuilder("higgs_embed", sink, data_name)
    ids = b.add_input(INPUT_IDS, INT64, ("batch", "sequence", 1 + codebooks))
    b.add_output(INPUTS_EMBEDS, FLOAT, ("batch", "sequence", width))
    text_id = b.node("Gather", [ids, b.const(0)], axis=2, name="embed/TextColumn")  # [B, S]
    is_audio = b.node("Less", [text_id, b.const(0)], name="embed/IsAudio")
    text_rows = b.node(
        "Gather",
        [b.initializer("embed.text", text_table), b.node("Max", [text_id, b.const(0)])],
        axis=0,
        name="embed/Text",
    )
    codes = b.node(
        "Slice", [ids, b.const([1]), b.const([1 + codebooks]), b.const([2])], name="embed/Codes"
    )
    offsets = b.const(np.arange(codebooks, dtype=np.int64) * codebook_size)
    audio_rows = b.node(
        "Gather",
        [b.initializer("embed.audio", audio_table), b.node("Add", [codes, offsets])],
        axis=0,
        name="embed/Audio",
    )  # [B, S, K, hidden]
    audio_sum = b.node("ReduceSum", [audio_rows, b.const([2])], keepdims=0, name="embed/Sum")
    mask = b.node("Unsqueeze", [is_audio, b.const([2])], name="embed/Mask")
    embeds = b.node("Where", [mask, audio_sum, text_rows], name="embed/Select")
    if routing:
        flag = b.node("Cast", [mask], to=FLOAT, name="embed/Flag")
        embeds = b.node("Concat", [embeds, flag], axis=2, name="embed/WithFlag")
    b.identity(embeds, INPUTS_EMBEDS)
    return b.build(doc_string="Higgs embedding sum (text rows, summed delayed audio rows)")


def embed_reference(
    text_table: torch.Tensor, audio_table: torch.Tensor, codebook_size: int, routing: bool
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The torch computation the embed graph is checked against."""

    def embed(ids: torch.Tensor) -> torch.Tensor:
        text = text_table[ids[..., 0].clamp(min=0)]
        offsets = torch.arange(ids.shape[-1] - 1) * codebook_size
        audio = audio_table[ids[..., 1:] + offsets].sum(dim=-2)
        is_audio = (ids[..., 0] < 0)[..., None]
        out = torch.where(is_audio, audio, text)
        return torch.cat([out, is_audio.float()], dim=-1) if routing else out

    return embed


def build_head_graph(
    weight: np.ndarray, codebooks: int, codebook_size: int, sink, data_name: str
) -> onnx.ModelProto:
    hidden = weight.shape[1]
    b = StreamingBuilder("higgs_audio_head", sink, data_name)
    x = b.add_input(HIDDEN_STATE, FLOAT, ("batch", hidden))
    b.add_output(LOGITS, FLOAT, ("batch", codebooks, codebook_size))
    flat = b.node(
        "MatMul",
        [x, b.initializer("audio_head.weight", np.ascontiguousarray(weight.T))],
        name="audio_head/MatMul",
    )
    logits = b.node(
        "Reshape", [flat, b.const([0, codebooks, codebook_size])], name="audio_head/Reshape"
    )
    b.identity(logits, LOGITS)
    return b.build(doc_string="Higgs audio head: per-codebook logits")


def head_reference(weight: torch.Tensor, codebooks: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def head(hidden: torch.Tensor) -> torch.Tensor:
        return (hidden @ weight.T).reshape(hidden.shape[0], codebooks, -1)

    return head


__all__ = [
    "AUDIO_ROW",
    "HIDDEN_STATE",
    "INPUTS_EMBEDS",
    "INPUT_IDS",
    "LOGITS",
    "build_embed_graph",
    "build_head_graph",
    "embed_reference",
    "head_reference",
]

"""The stand-in MOSS-TTS-Nano builder (export/moss_tts_nano): published layout, names, metas,
tokenizer id layout, and graphs that compute what their torch modules compute."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import sentencepiece as spm
import torch

from export.moss_tts_nano import codec_model as cm
from export.moss_tts_nano import stand_in as builder
from export.moss_tts_nano import tts_model as tm
from export.moss_tts_nano.tokenizer import SPECIAL_PIECES, train_tokenizer

TTS = builder.TTS_DIR
CODEC = builder.CODEC_DIR
# READER's required file lists of both published repositories (+ the optional greedy graph).
PUBLISHED_TTS_FILES = {
    "browser_poc_manifest.json",
    "tts_browser_onnx_meta.json",
    "tokenizer.model",
    "moss_tts_prefill.onnx",
    "moss_tts_decode_step.onnx",
    "moss_tts_local_decoder.onnx",
    "moss_tts_local_cached_step.onnx",
    "moss_tts_local_fixed_sampled_frame.onnx",
    "moss_tts_global_shared.data",
    "moss_tts_local_shared.data",
}
PUBLISHED_CODEC_FILES = {
    "codec_browser_onnx_meta.json",
    "moss_audio_tokenizer_encode.onnx",
    "moss_audio_tokenizer_encode.data",
    "moss_audio_tokenizer_decode_full.onnx",
    "moss_audio_tokenizer_decode_step.onnx",
    "moss_audio_tokenizer_decode_shared.data",
}


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def modules():
    """The torch modules the session's stand-in was exported from (same seed, same order)."""
    spec = builder.small()
    torch.manual_seed(spec.seed)
    return tm.MossTTSStandIn(spec.tts).eval(), cm.CodecStandIn(spec.codec).eval(), spec


def test_files_are_the_published_ones(moss_models, moss_official):
    tts = {p.name for p in (moss_official / TTS).iterdir()}
    codec = {p.name for p in (moss_official / CODEC).iterdir()}
    assert tts == PUBLISHED_TTS_FILES
    assert codec == PUBLISHED_CODEC_FILES
    extra = {p.name for p in (moss_models / TTS).iterdir()} - PUBLISHED_TTS_FILES
    assert extra == {builder.GREEDY_FRAME_FILE}


def test_weights_live_in_the_shared_data_files(moss_official):
    meta = json.loads((moss_official / TTS / builder.TTS_META).read_text())
    groups: dict[str, set[str]] = {}
    for graph, data in meta["external_data_files"].items():
        model = onnx.load(str(moss_official / TTS / graph), load_external_data=False)
        locations = {
            entry.value
            for tensor in model.graph.initializer
            for entry in tensor.external_data
            if entry.key == "location"
        }
        assert locations == set(data), graph
        inline = [t.name for t in model.graph.initializer if len(t.raw_data) >= 1024]
        assert not inline, f"{graph} keeps large tensors inline: {inline}"
        groups.setdefault(data[0], set()).add(graph)
        assert model.ir_version <= 10
    assert groups == {
        "moss_tts_global_shared.data": {"moss_tts_prefill.onnx", "moss_tts_decode_step.onnx"},
        "moss_tts_local_shared.data": {
            "moss_tts_local_decoder.onnx",
            "moss_tts_local_cached_step.onnx",
            "moss_tts_local_fixed_sampled_frame.onnx",
        },
    }
    # Tensors the two global graphs share are stored once: the shared file is smaller than
    # the sum of both graphs' external tensors.
    sizes = []
    for graph in ("moss_tts_prefill.onnx", "moss_tts_decode_step.onnx"):
        model = onnx.load(str(moss_official / TTS / graph), load_external_data=False)
        sizes.append(
            sum(
                int({e.key: e.value for e in t.external_data}["length"])
                for t in model.graph.initializer
                if t.external_data
            )
        )
    assert (moss_official / TTS / "moss_tts_global_shared.data").stat().st_size < sum(sizes)


def test_tts_meta_keys_and_names_as_published(moss_official):
    text = (moss_official / TTS / builder.TTS_META).read_text()
    meta = json.loads(text)
    assert not text.endswith("\n")
    assert list(meta) == [
        "format_version",
        "checkpoint_path",
        "files",
        "external_data_files",
        "model_config",
        "onnx",
    ]
    io = meta["onnx"]
    layers = meta["model_config"]["global_layers"]
    assert io["prefill_output_names"][0] == "global_hidden"
    assert io["prefill_output_names"][1:3] == ["present_key_0", "present_value_0"]
    assert io["decode_input_names"][:4] == [
        "input_ids",
        "past_valid_lengths",
        "past_key_0",
        "past_value_0",
    ]
    assert len(io["decode_input_names"]) == 2 + 2 * layers
    assert io["local_cached_output_names"] == [
        "text_logits",
        "audio_logits",
        "local_present_key_0",
        "local_present_value_0",
    ]
    assert io["fixed_sampled_frame_constants"]["audio_top_k"] == 25


def test_published_dims_give_the_published_codec_meta():
    meta = builder.codec_meta(builder.published().codec)
    assert list(meta) == [
        "format_version",
        "checkpoint_path",
        "files",
        "external_data_files",
        "codec_config",
        "onnx",
        "streaming_decode",
    ]
    assert meta["codec_config"] == {
        "sample_rate": 48000,
        "channels": 2,
        "downsample_rate": 3840,
        "num_quantizers": 16,
    }
    caches = meta["streaming_decode"]["attention_caches"]
    assert [c["context"] for c in caches] == [500] * 4 + [800] * 2 + [1200] * 2 + [1600] * 4
    assert [c["decoder_index"] for c in caches] == [1] * 4 + [3] * 2 + [5] * 2 + [7] * 4
    assert caches[11]["cache_shape"] == [1, 4, 1600, 64]
    assert len(meta["onnx"]["decode_step_input_names"]) == 54
    assert len(meta["onnx"]["decode_step_output_names"]) == 54
    assert meta["onnx"]["decode_step_output_names"][2] == "transformer_offset_out_0"
    dims = builder.published().tts
    assert (dims.hidden, dims.global_layers, dims.heads, dims.head_dim) == (768, 12, 12, 64)


def test_tokenizer_has_the_published_id_layout():
    data = train_tokenizer()
    assert data == train_tokenizer()  # deterministic
    sp = spm.SentencePieceProcessor(model_proto=data)
    assert [sp.id_to_piece(i) for i in range(4)] == ["<unk>", "<s>", "</s>", "<pad>"]
    assert [sp.id_to_piece(i) for i in range(4, 15)] == list(SPECIAL_PIECES)
    assert sp.id_to_piece(15) == "<0x00>" and sp.id_to_piece(270) == "<0xFF>"
    assert sp.is_control(3)
    assert sp.encode("<|audio_start|>", out_type=int)[-1] == 6


def test_manifest_carries_templates_voices_and_defaults(moss_official):
    manifest = json.loads((moss_official / TTS / builder.MANIFEST).read_text())
    assert manifest["model_files"]["codec_meta"] == f"../{CODEC}/{builder.CODEC_META}"
    templates = manifest["prompt_templates"]
    assert templates["user_prompt_prefix_token_ids"][0] == 4  # <|im_start|>
    assert len(templates["user_prompt_after_reference_token_ids"]) == 56
    assert manifest["generation_defaults"]["sample_mode"] == "fixed"
    assert manifest["generation_defaults"]["max_new_frames"] == 375
    voice = manifest["builtin_voices"][0]
    assert voice["voice"] == "Junhao" and len(voice["prompt_audio_codes"][0]) == 16


def _close(ort_out, torch_out, atol=1e-5) -> None:
    for a, b in zip(ort_out, torch_out, strict=True):
        np.testing.assert_allclose(a, b.numpy(), atol=atol, rtol=1e-5)


def test_tts_graphs_compute_what_their_modules_compute(moss_models, modules):
    model, _codec, spec = modules
    d = moss_models / TTS
    rng = np.random.default_rng(3)
    dims = spec.tts
    ids = rng.integers(0, dims.codebook + 1, (2, 7, dims.row_width)).astype(np.int32)
    ids[..., 0] = rng.integers(0, 300, (2, 7))
    mask = np.ones((2, 7), np.int32)
    mask[1, :2] = 0  # left padding on one row
    prefill = _session(d / builder.TTS_FILES["prefill"]).run(
        None, {"input_ids": ids, "attention_mask": mask}
    )
    with torch.no_grad():
        _close(prefill, tm.Prefill(model)(torch.from_numpy(ids), torch.from_numpy(mask)))
        lengths = np.array([7, 7], np.int32)
        decode = _session(d / builder.TTS_FILES["decode_step"])
        names = [i.name for i in decode.get_inputs()]
        step = decode.run(None, dict(zip(names, [ids[:, :1], lengths, *prefill[1:]], strict=True)))
        expected = tm.DecodeStep(model)(
            torch.from_numpy(ids[:, :1]),
            torch.from_numpy(lengths),
            *[torch.from_numpy(p) for p in prefill[1:]],
        )
        _close(step, expected)
        hidden = rng.standard_normal((3, dims.hidden)).astype(np.float32)
        seen = (rng.random((3, dims.n_vq, dims.codebook)) < 0.1).astype(np.int32)
        text_u = rng.random(3).astype(np.float32)
        audio_u = rng.random((3, dims.n_vq)).astype(np.float32)
        fixed = _session(d / builder.TTS_FILES["local_fixed_sampled_frame"]).run(
            None,
            {
                "global_hidden": hidden,
                "repetition_seen_mask": seen,
                "assistant_random_u": text_u,
                "audio_random_u": audio_u,
            },
        )
        reference = tm.LocalFixedSampledFrame(model)(
            *(torch.from_numpy(a) for a in (hidden, seen, text_u, audio_u))
        )
        for a, b in zip(fixed, reference, strict=True):
            np.testing.assert_array_equal(a, b.numpy())
        kv_shape = (3, 4, dims.local_heads, dims.local_head_dim)
        past = [rng.standard_normal(kv_shape).astype(np.float32) for _ in range(2)]
        feeds = {
            "global_hidden": hidden,
            "text_token_id": np.array([9, 7, 9], np.int32),
            "audio_token_id": np.array([5, 6, 7], np.int32),
            "channel_index": np.array([0, 3, 15], np.int32),
            "step_type": np.array([0, 1, 2], np.int32),
            "past_valid_lengths": np.array([4, 4, 4], np.int32),
            "local_past_key_0": past[0],
            "local_past_value_0": past[1],
        }
        cached = _session(d / builder.TTS_FILES["local_cached_step"]).run(None, feeds)
        _close(cached, tm.LocalCachedStep(model)(*(torch.from_numpy(v) for v in feeds.values())))
        prefix = np.full((1, dims.n_vq - 1), dims.audio_pad, np.int32)
        prefix[0, :4] = [3, 4, 5, 6]
        local = _session(d / builder.TTS_FILES["local_decoder"]).run(
            None,
            {
                "global_hidden": hidden[:1],
                "text_token_id": np.array([9], np.int32),
                "audio_prefix_token_ids": prefix,
            },
        )
        _close(
            local,
            tm.LocalDecoder(model)(
                torch.from_numpy(hidden[:1]),
                torch.tensor([9], dtype=torch.int32),
                torch.from_numpy(prefix),
            ),
        )


def test_codec_graphs_and_streaming_state(moss_models, modules):
    _model, codec, spec = modules
    d = moss_models / CODEC
    rng = np.random.default_rng(4)
    frames = 9  # every stage runs past its (small) attention context
    codes = rng.integers(0, spec.codec.codebook, (1, frames, 16)).astype(np.int32)
    full = _session(d / builder.CODEC_FILES["decode_full"]).run(
        None, {"audio_codes": codes, "audio_code_lengths": np.array([frames], np.int32)}
    )
    with torch.no_grad():
        expected = cm.DecodeFull(codec)(
            torch.from_numpy(codes), torch.tensor([frames], dtype=torch.int32)
        )
    _close(full, expected)
    assert full[0].shape == (1, 2, frames * 3840) and full[1][0] == frames * 3840
    step = _session(d / builder.CODEC_FILES["decode_step"])
    names = [i.name for i in step.get_inputs()]
    state = [t.numpy() for t in builder.initial_codec_state(spec.codec)]
    pieces = []
    for start, stop in ((0, 1), (1, 4), (4, 5), (5, 9)):
        out = step.run(
            None,
            dict(
                zip(
                    names,
                    [codes[:, start:stop], np.array([stop - start], np.int32), *state],
                    strict=True,
                )
            ),
        )
        pieces.append(out[0])
        state = out[2:]
    np.testing.assert_allclose(np.concatenate(pieces, axis=2), full[0], atol=1e-5)
    positions = state[4 + 3]  # positions of the first attention cache
    assert positions.shape == (1, spec.codec.contexts[0]) and positions.max() == frames * 4 - 1
    waveform = rng.standard_normal((1, 2, 2 * 3840 + 5)).astype(np.float32) * 0.1
    encoded = _session(d / builder.CODEC_FILES["encode"]).run(
        None, {"waveform": waveform, "input_lengths": np.array([waveform.shape[2]], np.int32)}
    )
    assert encoded[0].dtype == np.int32 and encoded[0].shape == (1, 3, 16) and encoded[1][0] == 3

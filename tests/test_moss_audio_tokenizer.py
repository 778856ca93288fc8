"""MOSS-Audio-Tokenizer v1 and v2 from checkpoints in the published layout
(export/moss_audio_tokenizer) and the runtime codec (onnx_tts/families/moss_tts/codec.py).

Stand-in checkpoints (published config keys, tensor names, ranks and weight-norm
parametrisations; tiny sizes; random weights) are exported once per module; every graph is
compared with the torch modules the checkpoint loads into: codes identical, audio within
TOLERANCE of the decode's peak, streams of any chunking equal to the whole decode."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from safetensors.torch import load_file

from export.checkpoint import CheckpointError, write_checkpoint
from export.moss_audio_tokenizer import build_codec_checkpoint, export_codec, load_codec
from export.moss_audio_tokenizer.config import TransformerSpec, codec_spec
from export.moss_audio_tokenizer.stand_in import codec_config
from onnx_tts.errors import AudioError, InputError, ModelError
from onnx_tts.families.moss_tts.codec import AudioTokenizerCodec, codec_graphs, read_codec
from onnx_tts.session import LazySession, SessionOptions

TOLERANCE = 1e-5  # of the peak of the torch decode (float32; measured about 3e-7)
# Quantizers exported as the models use them: v1 all 32 (Local v1, Delay), v2 the first 12
# (Local v1.5).
QUANTIZERS = {"v1": 32, "v2": 12}


@pytest.fixture(scope="module", params=["v1", "v2"])
def exported(request, tmp_path_factory):
    version = request.param
    root = tmp_path_factory.mktemp(f"codec-{version}")
    checkpoint = build_codec_checkpoint(root / "checkpoint", version)
    report = export_codec(checkpoint, root / "onnx", quantizers=QUANTIZERS[version])
    torch_codec = load_codec(checkpoint)
    return version, checkpoint, root / "onnx", report, torch_codec


def _codec(directory: Path, mode: str = "chain", **changes) -> AudioTokenizerCodec:
    layout = read_codec(directory)
    if changes:
        layout = dataclasses.replace(layout, **changes)
    graphs = codec_graphs(layout)
    options = SessionOptions(intra_op_threads=1)
    sessions = {role: LazySession(graph.spec, options) for role, graph in graphs.items()}
    return AudioTokenizerCodec(layout, sessions, mode)


@pytest.fixture(scope="module")
def codec(exported):
    return _codec(exported[2])


def _torch_decode(module, codes: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        audio = module.decode(torch.from_numpy(np.ascontiguousarray(codes.T[:, None, :])))
    return audio[0].T.numpy()


def _close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= TOLERANCE * np.abs(want).max()


def _codes(codec: AudioTokenizerCodec, frames: int, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, codec.codebook_size, (frames, codec.quantizers))


# -- the export and its report ---------------------------------------------------------------
def test_every_graph_is_checked_against_torch(exported):
    version, _, directory, report, _ = exported
    assert report["encode"]["codes_equal"] and report["encode"]["mismatched_codes"] == 0
    for role in ("decode", "decode_step"):
        assert report[role]["max_rel_diff"] < TOLERANCE, role
    assert report["decode_step"]["chunks"] == [1, 2, 3]
    assert report["unread_tensors"] == []
    meta = json.loads((directory / "codec.json").read_text())
    assert meta["check"]["decode"] == report["decode"]
    assert meta["quantizers"] == QUANTIZERS[version]
    assert sorted(p.name for p in directory.iterdir()) == [
        "codec.json",
        "decode.onnx",
        "decode_step.onnx",
        "decoder.data",
        "encode.onnx",
        "encoder.data",
    ]


def test_the_codec_says_what_it_is(exported, codec):
    version = exported[0]
    rate, channels, hop = {"v1": (24000, 1, 1920), "v2": (48000, 2, 3840)}[version]
    assert (codec.sample_rate, codec.channels, codec.hop_length) == (rate, channels, hop)
    assert codec.quantizers == QUANTIZERS[version] and codec.codebook_size == 1024


# -- encode ----------------------------------------------------------------------------------
def test_reference_codes_are_the_torch_encode(exported, codec):
    module = exported[4]
    rng = np.random.default_rng(7)
    samples = 6 * codec.hop_length + codec.hop_length // 2  # a partial last frame
    waveform = (0.2 * rng.standard_normal((codec.channels, samples))).astype(np.float32)
    codes = codec.encode(waveform)
    assert codes.dtype == np.int64 and codes.shape == (6, codec.quantizers)
    with torch.no_grad():
        want = module.encode(torch.from_numpy(waveform[None]), codec.quantizers)
    np.testing.assert_array_equal(codes, want[:, 0].T.numpy())
    # The causal encoder: the cut tail changes none of the whole frames' codes.
    np.testing.assert_array_equal(codec.encode(waveform[:, : 6 * codec.hop_length]), codes)


def test_a_prepared_reference_matches_the_published_processing(codec):
    mono = (0.5 * np.sin(np.arange(9000) / 7.0)).astype(np.float32)
    prepared = codec.prepare_reference(mono)
    assert prepared.shape == (codec.channels, 9000) and prepared.dtype == np.float32
    if codec.channels == 2:
        np.testing.assert_array_equal(prepared[0], prepared[1])  # mono duplicated
    # 0.5 * sine is at -9 dBFS: brought down by the largest step, 3 dB.
    np.testing.assert_allclose(prepared[0], mono * 10 ** (-3 / 20), rtol=1e-6)
    quiet = codec.prepare_reference(np.stack([mono, mono]) * 0.24)  # -21.4 dBFS
    level = 10 * np.log10(np.mean(np.square(quiet.astype(np.float64))))
    assert -20.05 < level < -19.95  # within the clamp: exactly to -20 dBFS


def test_bad_references_are_refused(codec):
    good = np.zeros((codec.channels, 4 * codec.hop_length), np.float32)
    with pytest.raises(AudioError, match="needs at least"):
        codec.encode(good[:, : codec.hop_length - 1])
    with pytest.raises(AudioError, match="NaN"):
        bad = good.copy()
        bad[0, 5] = np.nan
        codec.encode(bad)
    with pytest.raises(AudioError, match=r"float samples \[\d, N\]"):
        codec.encode(np.zeros((3, 4 * codec.hop_length), np.float32))
    with pytest.raises(AudioError, match="longer than"):
        codec.encode(np.zeros((codec.channels, 61 * codec.sample_rate), np.float32))


# -- decode ----------------------------------------------------------------------------------
def test_decode_is_the_torch_decode(exported, codec):
    codes = _codes(codec, 11)
    audio = codec.decode(codes)
    assert audio.dtype == np.float32 and audio.shape == (11 * codec.hop_length, codec.channels)
    _close(audio, _torch_decode(exported[4], codes))
    assert codec.decode(codes[:0]).shape == (0, codec.channels)


def test_a_decode_longer_than_the_whole_graph_takes_streams_through_the_step(exported):
    codec = _codec(exported[2], whole_decode_frames=3)
    codes = _codes(codec, 10, seed=5)
    _close(codec.decode(codes), _torch_decode(exported[4], codes))


def test_streams_of_any_chunking_equal_the_whole_decode(exported, codec):
    """Three streams interleaved, each with its own state, frames pushed 1, 2, 3 ... at a time."""
    clips = [_codes(codec, frames, seed) for seed, frames in ((0, 13), (1, 9), (2, 16))]
    streams = [codec.open_stream() for _ in clips]
    pieces: list[list[np.ndarray]] = [[] for _ in clips]
    position, size, open_ = [0] * len(clips), [1, 2, 3], set(range(len(clips)))
    while open_:
        for index in sorted(open_):
            start = position[index]
            piece = streams[index].push(clips[index][start : start + size[index]])
            assert piece.shape == (
                min(size[index], len(clips[index]) - start) * codec.hop_length,
                codec.channels,
            )
            pieces[index].append(piece)
            position[index] += size[index]
            size[index] = size[index] % 4 + 1
            if position[index] >= len(clips[index]):
                streams[index].close()
                open_.discard(index)
    for clip, parts in zip(clips, pieces, strict=True):
        _close(np.concatenate(parts), _torch_decode(exported[4], clip))


def test_stream_state_is_chained_without_a_copy_and_copy_mode_agrees(exported, codec):
    codes = _codes(codec, 7, seed=9)
    with codec.open_stream() as stream:
        chained = np.concatenate([stream.push(codes[:4]), stream.push(codes[4:])])
        written = stream.chain.output_data_ptrs()
        assert stream.chain.state_data_ptrs() == written  # outputs became the next inputs
        assert stream.chain.steps == 2
    copying = _codec(exported[2], "copy")
    with copying.open_stream() as stream:
        copied = np.concatenate([stream.push(codes[:4]), stream.push(codes[4:])])
        assert set(stream.chain.state_data_ptrs()).isdisjoint(stream.chain.output_data_ptrs())
    np.testing.assert_array_equal(chained, copied)
    with pytest.raises(InputError, match="closed"):
        stream.push(codes[:1])


def test_several_streams_step_in_one_batch_exactly(exported):
    """decode_step at batch 3 (rows at different positions) gives each row bit for bit what
    that stream gives alone at batch 1."""
    directory = exported[2]
    meta = json.loads((directory / "codec.json").read_text())
    session = ort.InferenceSession(
        str(directory / "decode_step.onnx"), providers=["CPUExecutionProvider"]
    )
    entries, quantizers = meta["state"], meta["quantizers"]
    outputs = ["audio", *(e["output"] for e in entries)]

    def step(codes, state):
        values = session.run(outputs, {"audio_codes": codes, **state})
        return values[0], {e["input"]: v for e, v in zip(entries, values[1:], strict=True)}

    fresh = {e["input"]: np.zeros(e["shape"], e["dtype"]) for e in entries}
    rng = np.random.default_rng(4)
    clips = [rng.integers(0, 1024, (quantizers, 1, 5)) for _ in range(3)]
    alone, states = [], []
    for lead, clip in enumerate(clips):  # stream i has decoded i frames before the batch
        state, audio = fresh, []
        for frame in range(lead + 3):
            if frame == lead:
                states.append(state)
            piece, state = step(clip[:, :, frame : frame + 1], state)
            audio.append(piece)
        alone.append(np.concatenate(audio, axis=2))
    batched = {k: np.concatenate([s[k] for s in states]) for k in fresh}
    pieces = []
    for frame in range(3):  # two more frames for every stream, in one run
        codes = np.concatenate(
            [clip[:, :, lead + frame : lead + frame + 1] for lead, clip in enumerate(clips)], 1
        )
        piece, batched = step(codes, batched)
        pieces.append(piece)
    together = np.concatenate(pieces, axis=2)
    hop = meta["hop_length"]
    for lead, audio in enumerate(alone):
        np.testing.assert_array_equal(together[lead], audio[0, :, lead * hop : (lead + 3) * hop])


def test_bad_codes_are_refused_before_the_graph(codec):
    stream = codec.open_stream()
    for run in (codec.decode, stream.push):
        with pytest.raises(InputError, match=r"lie in \[0, 1024\); got 1024"):
            run(np.full((2, codec.quantizers), 1024))
        with pytest.raises(InputError, match="got -1"):
            run(np.full((2, codec.quantizers), -1))
        with pytest.raises(InputError, match="one code per quantizer"):
            run(np.zeros((2, codec.quantizers + 1), np.int64))
        with pytest.raises(InputError, match="must be integers"):
            run(np.zeros((2, codec.quantizers), np.float32))
    stream.close()


# -- the published layout --------------------------------------------------------------------
def test_checkpoints_use_the_published_names_and_parametrisations(exported):
    version, checkpoint = exported[0], exported[1]
    if version == "v1":  # two shards and an index, as published
        index = json.loads((checkpoint / "model.safetensors.index.json").read_text())
        names = set(index["weight_map"])
    else:
        names = set(load_file(str(checkpoint / "model.safetensors")))
    for name in (
        "encoder.1.transformer.layers.0.self_attn.in_projs.0.weight",
        "encoder.1.transformer.layers.0.self_attn.out_projs.0.weight",
        "encoder.1.transformer.layers.0.linear1.weight",
        "encoder.1.transformer.layers.0.layer_scale_2.scale",
        "decoder.0.transformer.layers.1.norm2.bias",
        "quantizer.input_proj.parametrizations.weight.original0",
        "quantizer.output_proj.parametrizations.weight.original1",
        "quantizer.quantizers.31.in_proj.parametrizations.weight.original1",
        "quantizer.quantizers.31.out_proj.bias",
        "quantizer.quantizers.31.codebook.weight",
    ):
        if version == "v2" and name.startswith("decoder.0."):
            name = name.replace("decoder.0.", "decoder.1.")  # v2's decoder starts with a patch
        assert name in names, name
    # v1 keeps a projection only where widths differ; v2 always has both.
    assert ("encoder.3.input_proj.weight" in names) == (version == "v2")


def test_v2_config_keys_are_read(tmp_path):
    spec = codec_spec(codec_config("v2"))
    assert spec.channels == 2 and spec.interleave and spec.hop == 3840
    windows = [t.context for _, t, _ in spec.encoder_transformers()]
    assert windows == [80, 40, 10, 10, 2]  # 0.2 s at 400/200/100/50/12.5 steps, one 0.1 s
    assert all(t.input_proj and t.output_proj for _, t, _ in spec.encoder_transformers())
    v1 = codec_spec(codec_config("v1"))
    stage = v1.encoder[3]
    assert isinstance(stage, TransformerSpec) and not stage.input_proj
    assert [t.context for _, t, _ in v1.decoder_transformers()] == [5, 10, 20, 40]


@pytest.mark.parametrize("exported", ["v2"], indirect=True)
def test_interleaved_stereo_keeps_its_channels_apart(exported, codec):
    """v2 interleaves L R L R into one stream: swapping channels changes the codes, and a
    decoded clip's channels are de-interleaved as the published code does."""
    rng = np.random.default_rng(8)
    left = rng.standard_normal(5 * codec.hop_length).astype(np.float32) * 0.2
    right = np.roll(left, 37) * 0.5
    codes = codec.encode(np.stack([left, right]))
    assert not np.array_equal(codes, codec.encode(np.stack([right, left])))
    with torch.no_grad():
        stream = exported[4].decode(torch.from_numpy(codes.T[:, None, :].copy()))
    assert stream.shape == (1, 2, 5 * codec.hop_length)


# -- bad inputs -------------------------------------------------------------------------------
def tensors_of(checkpoint: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for shard in sorted(checkpoint.glob("*.safetensors")):
        tensors.update(load_file(str(shard)))
    return tensors


def _rewrite(source: Path, target: Path, change) -> Path:
    config = json.loads((source / "config.json").read_text())
    tensors = tensors_of(source)
    change(tensors, config)
    return write_checkpoint(target, tensors, config)


def test_missing_and_misshaped_tensors_are_named_at_once(exported, tmp_path):
    gone = min(n for n in tensors_of(exported[1]) if n.endswith("layers.0.linear2.weight"))

    def damage(tensors, config):
        del tensors[gone]
        tensors["quantizer.quantizers.3.codebook.weight"] = torch.zeros(1024, 9)

    broken = _rewrite(exported[1], tmp_path / "broken", damage)
    with pytest.raises(CheckpointError) as caught:
        export_codec(broken, tmp_path / "out")
    message = str(caught.value)
    assert f"missing {gone}" in message
    assert "quantizer.quantizers.3.codebook.weight is [1024, 9], expected [1024, 8]" in message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c["decoder_kwargs"][0].update(num_layers=10**9), r"num_layers must be in"),
        (lambda c: c["decoder_kwargs"][0].update(gating="silu"), r"gating is 'silu'"),
        (lambda c: c["encoder_kwargs"][0].update(patch_size=241), r"frames/s but"),
        (lambda c: c["quantizer_kwargs"].update(input_dim=7), r"quantizer_kwargs.input_dim is 7"),
        (lambda c: c.update(causal_transformer_context_duration="10"), r"must be a number"),
    ],
)
def test_absurd_or_unpublished_configs_are_refused(tmp_path, change, message):
    config = codec_config("v1")
    change(config)
    with pytest.raises(CheckpointError, match=message):
        codec_spec(config)


def _edit_meta(exported, tmp_path, edit) -> Path:
    copy = tmp_path / "codec"
    shutil.copytree(exported[2], copy)
    meta = json.loads((copy / "codec.json").read_text())
    edit(meta)
    (copy / "codec.json").write_text(json.dumps(meta))
    return copy


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m["files"].update(encode="../encode.onnx"), "plain file name"),
        (lambda m: m["files"].update(decode="/etc/passwd"), "plain file name"),
        (lambda m: m["external_data"].update({"decode.onnx": ["../x.data"]}), "plain file"),
        (lambda m: m.update(quantizers=10**6), r"quantizers must be in \[1, 256\]"),
        (lambda m: m.update(quantizers=3), "dimension 0 is"),
        (lambda m: m.update(channels=3), r"channels must be in \[1, 2\]"),
        (lambda m: m.update(sample_rate=1.5), "must be an integer"),
        (lambda m: m["state"][-1].update(shape=[1, 4096, 4096, 4096]), "MiB; at most"),
        (lambda m: m["state"][0].update(dtype="float64"), "dtype must be one of"),
        (lambda m: m["state"].append(dict(m["state"][0])), "reuses a tensor name"),
        (lambda m: m.update(format_version=2), "format_version 2"),
        (lambda m: m.pop("files"), "files is missing"),
    ],
)
def test_a_bad_codec_json_is_one_clear_model_error(exported, tmp_path, edit, message):
    with pytest.raises(ModelError, match=message):
        read_codec(_edit_meta(exported, tmp_path, edit))


def test_a_graph_linked_from_outside_the_directory_is_refused(exported, tmp_path):
    copy = _edit_meta(exported, tmp_path, lambda m: None)
    outside = tmp_path / "elsewhere.onnx"
    (copy / "encode.onnx").rename(outside)
    (copy / "encode.onnx").symlink_to(outside)
    with pytest.raises(ModelError, match="lies outside the model directories"):
        read_codec(copy)


def test_a_truncated_weights_file_is_refused(exported, tmp_path):
    copy = _edit_meta(exported, tmp_path, lambda m: None)
    data = copy / "decoder.data"
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(ModelError, match="truncated"):
        read_codec(copy)


def test_quantizers_beyond_the_checkpoint_are_refused(exported, tmp_path):
    with pytest.raises(CheckpointError, match=r"quantizers must be an integer in \[1, 32\]"):
        export_codec(exported[1], tmp_path / "out", quantizers=33)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(CheckpointError, match="not an empty directory"):
        export_codec(exported[1], tmp_path / "full")

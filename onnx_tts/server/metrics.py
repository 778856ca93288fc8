"""Prometheus metrics of the server (the playback clock that defines an underrun is
onnx_tts.decoding.request.PlaybackClock)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger("onnx_tts.server")

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_RTF_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 5)


class _CacheCollector(Collector):
    """Per cache and model: lookups by the tier that answered (miss = computed), entries
    dropped on read per tier (rejected: corrupt, mis-signed or not a valid value for the
    model, then recomputed), and the entries and bytes it holds (its largest tier), from each
    engine's cache_stats()."""

    HELP: ClassVar[dict[str, str]] = {
        "reference": "Reference (voice) cache lookups by model and tier that answered "
        "(miss = encoded)",
        "result": "Result cache lookups by model and tier that answered (miss = synthesised)",
        "prefix": "Voice-prefix KV cache lookups by model and tier that answered "
        "(miss = prefilled)",
    }

    def __init__(self, stats: Callable[[], dict[str, dict[str, dict[str, Any]]]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        every = self._stats()
        entries = GaugeMetricFamily(
            "onnx_tts_cache_entries", "Entries held by each cache", labels=["cache", "model"]
        )
        held = GaugeMetricFamily(
            "onnx_tts_cache_bytes", "Bytes held by each cache", labels=["cache", "model"]
        )
        rejected = CounterMetricFamily(
            "onnx_tts_cache_rejected",
            "Cache entries dropped on read and recomputed (corrupt, mis-signed or not a valid "
            "value for the model), by cache, model and tier",
            labels=["cache", "model", "tier"],
        )
        for cache, help_text in self.HELP.items():
            lookups = CounterMetricFamily(
                f"onnx_tts_{cache}_cache_lookups", help_text, labels=["model", "tier"]
            )
            for model, caches in sorted(every.items()):
                stats = caches.get(cache) or {}
                if not stats:
                    continue
                for tier in stats["tiers"]:
                    lookups.add_metric([model, tier], int(stats[tier].get("hits", 0)))
                    rejected.add_metric([cache, model, tier], int(stats[tier].get("rejected", 0)))
                lookups.add_metric([model, "miss"], int(stats.get("misses", 0)))
                entries.add_metric([cache, model], int(stats.get("entries", 0)))
                held.add_metric([cache, model], int(stats.get("bytes", 0)))
            yield lookups
        yield entries
        yield held
        yield rejected


class _VoicesCollector(Collector):
    """Stored voices refused on read (a record unsigned or mis-signed with --cache-secret,
    audio that does not match its id, a file that is not a regular file)."""

    def __init__(self, rejected: Callable[[], int]) -> None:
        self._rejected = rejected

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(
            "onnx_tts_voices_rejected",
            "Stored voices refused on read: unsigned or mis-signed, audio that does not match "
            "its id, or a file that is not a regular file",
            value=self._rejected(),
        )


class _StageCollector(Collector):
    """Per model and stage (decode: the scheduler's worker, vocoder: the vocoder stage's):
    seconds busy, work done (row steps, windows) and runs; with the admission's view of
    capacity. Busy seconds over wall time is a stage's utilisation (1.0 = a full core)."""

    def __init__(self, stats: Callable[[], dict[str, dict[str, Any]]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        busy = CounterMetricFamily(
            "onnx_tts_stage_busy_seconds",
            "Seconds a stage's worker was busy",
            labels=["model", "stage"],
        )
        work = CounterMetricFamily(
            "onnx_tts_stage_items",
            "Items a stage processed (decode: row steps; vocoder: windows)",
            labels=["model", "stage"],
        )
        runs = CounterMetricFamily(
            "onnx_tts_stage_runs",
            "Runs of a stage (decode: LM steps; vocoder: vocoder calls); items / runs is its "
            "mean batch",
            labels=["model", "stage"],
        )
        capacity = GaugeMetricFamily(
            "onnx_tts_admission_capacity",
            "Streams the model is estimated to sustain in real time",
            labels=["model"],
        )
        for model, stats in sorted(self._stats().items()):
            vocoder = stats.get("vocoder", {})
            busy.add_metric([model, "decode"], float(stats.get("busy_seconds", 0.0)))
            busy.add_metric([model, "vocoder"], float(vocoder.get("busy_seconds", 0.0)))
            work.add_metric([model, "decode"], int(stats.get("row_steps", 0)))
            work.add_metric([model, "vocoder"], int(vocoder.get("windows", 0)))
            runs.add_metric([model, "decode"], int(stats.get("steps", 0)))
            runs.add_metric([model, "vocoder"], int(vocoder.get("calls", 0)))
            if "admission" in stats:
                capacity.add_metric([model], int(stats["admission"]["capacity"]))
        yield from (busy, work, runs, capacity)


class ServerMetrics:
    def __init__(
        self,
        queue_depth: Callable[[], float],
        active: Callable[[], float],
        cache_stats: Callable[[], dict[str, dict[str, dict[str, Any]]]],
        stage_stats: Callable[[], dict[str, dict[str, Any]]] | None = None,
        voices_rejected: Callable[[], int] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "onnx_tts_requests", "HTTP requests by path and status", ["path", "status"], registry=r
        )
        self.time_to_first_audio = Histogram(
            "onnx_tts_time_to_first_audio_seconds",
            "Speech requests: arrival to the first audio bytes",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.latency = Histogram(
            "onnx_tts_request_duration_seconds",
            "Speech requests: arrival to the last byte (end-to-end latency)",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.rtf = Histogram(
            "onnx_tts_real_time_factor",
            "Speech requests: generation time / audio duration",
            buckets=_RTF_BUCKETS,
            registry=r,
        )
        self.audio_seconds = Counter(
            "onnx_tts_audio_seconds", "Seconds of audio sent to clients", registry=r
        )
        self.underruns = Counter(
            "onnx_tts_stream_underruns",
            "Stream chunks that arrived after the player ran dry",
            registry=r,
        )
        self.underrun_seconds = Counter(
            "onnx_tts_stream_underrun_seconds", "Time streamed players sat silent", registry=r
        )
        self.cancelled = Counter(
            "onnx_tts_cancelled_generations",
            "Generations stopped by a client disconnect",
            registry=r,
        )
        self.refused = Counter(
            "onnx_tts_refused_requests",
            "Requests answered 429: the queue was full, or no stream could start in time "
            "without stalling the listeners already playing",
            registry=r,
        )
        self.batch_size = Histogram(
            "onnx_tts_batch_size",
            "LM rows sharing the decode step when a request got its first audio",
            buckets=(1, 2, 4, 8, 16, 32),
            registry=r,
        )
        Gauge("onnx_tts_queue_depth", "Requests waiting to start", registry=r).set_function(
            queue_depth
        )
        Gauge("onnx_tts_active_generations", "Requests generating now", registry=r).set_function(
            active
        )
        r.register(_CacheCollector(cache_stats))
        if stage_stats is not None:
            r.register(_StageCollector(stage_stats))
        if voices_rejected is not None:
            r.register(_VoicesCollector(voices_rejected))


@dataclass
class SynthesisRecord:
    """The one log line per synthesis (HTTP and Wyoming), filled in as the audio streams."""

    request_id: str
    model: str
    voice: str
    characters: int
    response_format: str
    audio_seconds: float = 0.0
    first_audio: float | None = None
    outcome: str = "cancelled"

    def log(self, cache_hit: bool | None) -> None:
        first = "-" if self.first_audio is None else f"{self.first_audio:.3f}s"
        hit = {None: "-", True: "hit", False: "miss"}[cache_hit]
        log.info(
            "synthesis id=%s model=%s voice=%s chars=%d format=%s audio=%.2fs "
            "first_audio=%s cache=%s outcome=%s",
            self.request_id,
            self.model,
            self.voice,
            self.characters,
            self.response_format,
            self.audio_seconds,
            first,
            hit,
            self.outcome,
            extra={
                "event": "synthesis",
                "request_id": self.request_id,
                "model": self.model,
                "voice": self.voice,
                "characters": self.characters,
                "format": self.response_format,
                "audio_seconds": round(self.audio_seconds, 3),
                "time_to_first_audio": self.first_audio,
                "cache_hit": cache_hit,
                "outcome": self.outcome,
            },
        )

"""Stand-in MOSS-TTS-Nano model directories (random weights, the published layout and graph
interface) for tests and benchmarks: `python -m export.moss_tts_nano OUT_PARENT`."""

from export.moss_tts_nano.stand_in import StandIn, build, published, small

__all__ = ["StandIn", "build", "published", "small"]

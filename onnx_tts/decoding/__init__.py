"""Generic decoding: sampling, KV caches and their homes, stop rules, the decode-program seam
and the one scheduler that drives every request of a model."""

from onnx_tts.decoding.kv_pool import CapacityPolicy, KVPool, resolve_kv_mode
from onnx_tts.decoding.program import (
    INPUTS_EMBEDS,
    LOGITS,
    Admission,
    DecodeProgram,
    StepOutput,
    length_feeds,
)
from onnx_tts.decoding.sampling import SAMPLING_KEYS, RowSampler, SamplingOptions, check_seed
from onnx_tts.decoding.stopping import StopRules, StopTracker

__all__ = [
    "INPUTS_EMBEDS",
    "LOGITS",
    "SAMPLING_KEYS",
    "Admission",
    "CapacityPolicy",
    "DecodeProgram",
    "KVPool",
    "RowSampler",
    "SamplingOptions",
    "StepOutput",
    "StopRules",
    "StopTracker",
    "check_seed",
    "length_feeds",
    "resolve_kv_mode",
]

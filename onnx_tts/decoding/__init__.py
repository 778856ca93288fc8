"""Generic decoding: sampling, KV caches, stop rules, and the loops that drive a family's
decode program (one sequence on its own cache, or many as rows of one LM batch)."""

from onnx_tts.decoding.kv_pool import CapacityPolicy, KVPool, resolve_kv_mode
from onnx_tts.decoding.program import (
    Admission,
    DecodeProgram,
    Request,
    StepOutput,
    decode_solo,
    lm_feeds,
)
from onnx_tts.decoding.sampling import SAMPLING_KEYS, RowSampler, SamplingOptions, check_seed
from onnx_tts.decoding.stopping import StopRules, StopTracker

__all__ = [
    "SAMPLING_KEYS",
    "Admission",
    "CapacityPolicy",
    "DecodeProgram",
    "KVPool",
    "Request",
    "RowSampler",
    "SamplingOptions",
    "StepOutput",
    "StopRules",
    "StopTracker",
    "check_seed",
    "decode_solo",
    "lm_feeds",
    "resolve_kv_mode",
]

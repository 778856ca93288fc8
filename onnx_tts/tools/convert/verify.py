"""Check, by running graphs, that a rewrite computes what the source computes.

* `probe`: before rewriting, the source runs once on random inputs with every matched tensor
  as an extra output; that gives the head counts and the scale and checks that each matched
  block really is causal ``softmax(scale * Q K^T) V``.
* `compare_logits`: after rewriting, source and converted graph run side by side (prefill +
  decode steps; source with numpy-fed growing cache, converted with `KVCache` in ``inplace``
  and ``chain`` mode) and the logits must agree.

Both run on the project's own session core (`onnx_tts.session`), never on the Python
``onnxruntime`` module: one ONNX Runtime per process.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from onnx_tts.errors import ModelError, SessionError
from onnx_tts.graph_io import PAST_VALID_LENGTHS, kv_pairs, parse_kv_name
from onnx_tts.session import KVCache, Session, SessionOptions
from onnx_tts.tools.convert.match import AttentionMatch, GraphIndex, layer_error

PROTOBUF_LIMIT = (1 << 31) - (1 << 26)  # leave headroom under protobuf's 2 GiB
# Ops that quantize activations (q8's dynamic int8, MatMulNBits with int8 compute).
INT8_ACTIVATION_OPS = frozenset({"DynamicQuantizeLinear", "MatMulInteger", "MatMulNBits"})


# ---------------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerAttention:
    """What one rewritten attention block computes."""

    layer: int
    num_heads: int
    kv_num_heads: int
    head_dim: int
    scale: float
    probe_max_abs_diff: float  # matched block vs numpy causal attention, on the probe run


@dataclass(frozen=True)
class LogitsCheck:
    """Source vs converted logits over one prefill + `decode_steps` single-token steps."""

    prefill_tokens: int
    decode_steps: int
    max_abs_diff_inplace: float
    max_abs_diff_chain: float
    max_abs_diff_unmasked: (
        float  # both modes, entries with |logit| <= 100 x median (no -1e4 biases)
    )
    typical_abs_logit: float  # median |logit| of the source
    tolerance: float  # allowed |diff| beyond rtol x |logit|

    @property
    def max_abs_diff(self) -> float:
        return max(self.max_abs_diff_inplace, self.max_abs_diff_chain)


# ---------------------------------------------------------------------------------------------
# Feeds and the probe run
# ---------------------------------------------------------------------------------------------
def value_dtype(value: onnx.ValueInfoProto) -> np.dtype:
    elem = value.type.tensor_type.elem_type
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem))


def _value_dims(value: onnx.ValueInfoProto) -> list[int | None]:
    return [
        d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim
    ]


def _vocab_size(model: onnx.ModelProto, input_name: str) -> int:
    """Rows of the embedding table gathered by `input_name` (ids must stay inside it)."""
    initializers = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == input_name:
            table = initializers.get(node.input[0])
            if table is not None and table.dims:
                return int(table.dims[0])
    return 2


@dataclass(frozen=True)
class FeedSpec:
    """How to build numpy feeds for one LM graph."""

    inputs: tuple[onnx.ValueInfoProto, ...]
    vocab: int

    @property
    def single_token(self) -> bool:
        """A step graph whose queries all sit at `past_valid_lengths` runs one token per step:
        its prefill is a sequence of single steps."""
        return any(v.name == PAST_VALID_LENGTHS for v in self.inputs)

    @classmethod
    def of(cls, model: onnx.ModelProto) -> FeedSpec:
        vocab = (
            _vocab_size(model, "input_ids")
            if any(i.name == "input_ids" for i in model.graph.input)
            else 0
        )
        return cls(tuple(model.graph.input), vocab)

    def token_inputs(self, rng: np.random.Generator, batch: int, new: int) -> dict[str, Any]:
        """The per-step content: inputs_embeds or input_ids."""
        feeds: dict[str, Any] = {}
        for value in self.inputs:
            if value.name == "inputs_embeds":
                dims = _value_dims(value)
                if len(dims) != 3 or dims[2] is None:
                    raise ModelError(
                        "inputs_embeds must be [batch, sequence, hidden] with fixed hidden"
                    )
                feeds[value.name] = rng.standard_normal((batch, new, dims[2])).astype(
                    value_dtype(value)
                )
            elif value.name == "input_ids":
                # [batch, tokens], or [batch, tokens, width] rows of ids (a text
                # column beside codebook columns).
                dims = _value_dims(value)
                shape = (batch, new) if len(dims) < 3 else (batch, new, dims[2] or 1)
                feeds[value.name] = rng.integers(0, max(self.vocab, 1), shape).astype(
                    value_dtype(value)
                )
        if not feeds:
            raise ModelError("the graph takes neither 'inputs_embeds' nor 'input_ids'")
        return feeds

    def step_inputs(self, batch: int, past: int, new: int) -> dict[str, np.ndarray]:
        """attention_mask / position_ids as a published loop feeds them (no padding), or
        past_valid_lengths (the cached positions) for a graph that takes those."""
        feeds: dict[str, np.ndarray] = {}
        for value in self.inputs:
            if value.name == PAST_VALID_LENGTHS:
                feeds[value.name] = np.full((batch,), past, value_dtype(value))
            elif value.name == "attention_mask":
                feeds[value.name] = np.ones((batch, past + new), value_dtype(value))
            elif value.name == "position_ids":
                positions = np.arange(past, past + new, dtype=value_dtype(value))
                feeds[value.name] = np.ascontiguousarray(np.broadcast_to(positions, (batch, new)))
        return feeds

    def kv_shape(self, name: str, batch: int, length: int) -> tuple[int, int, int, int]:
        value = next(v for v in self.inputs if v.name == name)
        dims = _value_dims(value)
        if len(dims) == 4 and dims[1] is None and dims[2] is not None and dims[3] is not None:
            return batch, length, int(dims[2]), int(dims[3])  # [batch, past, heads, head_dim]
        if len(dims) != 4 or dims[1] is None or dims[3] is None:
            raise ModelError(
                f"input {name!r} must be [batch, kv_heads, past, head_dim] (or [batch, past, "
                f"kv_heads, head_dim]) with fixed kv_heads and head_dim, found {dims}"
            )
        return batch, int(dims[1]), length, int(dims[3])

    def kv_dtype(self, name: str) -> np.dtype:
        return value_dtype(next(v for v in self.inputs if v.name == name))

    def check_known(self, extra: Iterable[str] = ()) -> None:
        known = {
            "inputs_embeds",
            "input_ids",
            "attention_mask",
            "position_ids",
            PAST_VALID_LENGTHS,
            *extra,
        }
        unknown = [
            v.name for v in self.inputs if v.name not in known and parse_kv_name(v.name) is None
        ]
        if unknown:
            raise ModelError(
                f"cannot build test inputs for graph input(s) {unknown}: the converter knows "
                "inputs_embeds, input_ids, attention_mask, position_ids, past_valid_lengths "
                "and past_key_values.*"
            )


def _probe_session(model: onnx.ModelProto, work_dir: Path) -> Session:
    """The in-memory model on the project's own core (one ONNX Runtime per process), saved to
    `work_dir` first: inline when it fits in one protobuf, else with a weights sidecar."""
    path = work_dir / "probe.onnx"
    if model.ByteSize() < PROTOBUF_LIMIT:
        onnx.save_model(model, str(path))
    else:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        onnx.save_model(copy, str(path), save_as_external_data=True, location="probe.onnx_data")
    return Session(path, SessionOptions(graph_optimization_level="disable"))


def _expected_attention(
    query: np.ndarray, key: np.ndarray, value: np.ndarray, scale: float
) -> np.ndarray:
    """Causal softmax(scale Q K^T) V in float64; query i sits at position T - S + i."""
    q, k, v = (np.asarray(a, np.float64) for a in (query, key, value))
    heads, kv_heads = q.shape[1], k.shape[1]
    group = heads // kv_heads
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    scores = scale * q @ np.swapaxes(k, -1, -2)
    new, total = q.shape[2], k.shape[2]
    allowed = np.arange(total)[None, :] <= (total - new + np.arange(new))[:, None]
    scores = np.where(allowed, scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    return probs @ v


def probe(
    model: onnx.ModelProto, matches: Sequence[AttentionMatch], work_dir: Path
) -> tuple[list[LayerAttention], dict[str, np.dtype]]:
    """Run the source once with the matched tensors as extra outputs: head counts, scale, and
    a numeric check that each block is causal softmax(scale Q K^T) V."""
    graph = model.graph
    wanted: list[str] = []
    for match in matches:
        wanted += [match.query, match.inner["key"], match.inner["value"]]
        wanted += [match.context_node.output[0], *(f.tensor for f in match.factors)]
    existing = {o.name for o in graph.output}
    extra = [name for name in dict.fromkeys(wanted) if name not in existing]
    index = GraphIndex(graph)
    for name in extra:
        if name in index.initializers or index.constant_value(name) is not None:
            continue
        graph.output.append(helper.make_empty_tensor_value_info(name))
    spec = FeedSpec.of(model)
    spec.check_known()
    rng = np.random.default_rng(1234)
    batch, past_len, new_len = 1, 3, 1 if spec.single_token else 4
    feeds: dict[str, Any] = spec.token_inputs(rng, batch, new_len)
    feeds.update(spec.step_inputs(batch, past_len, new_len))
    for value in spec.inputs:
        if parse_kv_name(value.name) is not None:
            shape = spec.kv_shape(value.name, batch, past_len)
            feeds[value.name] = rng.standard_normal(shape).astype(value_dtype(value))
    try:
        values = _probe_session(model, work_dir).run(feeds)
    except (ModelError, SessionError) as error:
        raise ModelError(f"the source graph does not run on ONNX Runtime: {error}") from None
    finally:
        for _ in range(len(graph.output) - len(existing)):
            graph.output.pop()

    def tensor(name: str) -> np.ndarray:
        if name in values:
            return values[name]
        constant = index.constant_value(name)
        if constant is None:
            raise ModelError(f"probe run did not produce {name!r}")
        return constant

    layers: list[LayerAttention] = []
    dtypes: dict[str, np.dtype] = {}
    for match in matches:
        query = tensor(match.query)
        key, value = tensor(match.inner["key"]), tensor(match.inner["value"])
        if match.sequence_axis == 1 and key.ndim == 4 and value.ndim == 4:
            key, value = key.transpose(0, 2, 1, 3), value.transpose(0, 2, 1, 3)
        context = tensor(match.context_node.output[0])
        if context.ndim == 5:  # grouped-query export: [B, kv heads, groups, S, D]
            context = context.reshape(context.shape[0], -1, *context.shape[3:])
        if query.ndim != 4 or key.ndim != 4 or query.shape[2] != new_len:
            raise layer_error(
                match.layer,
                f"query {match.query!r} has shape {query.shape} and present key {key.shape}; "
                "expected [batch, heads, new tokens, head_dim] and [batch, kv_heads, total, "
                "head_dim]",
            )
        heads, head_dim, kv_heads = query.shape[1], query.shape[3], key.shape[1]
        if heads % kv_heads or key.shape[3] != head_dim or key.shape[2] != past_len + new_len:
            raise layer_error(
                match.layer, f"query {query.shape} and present key {key.shape} do not pair up"
            )
        scale = 1.0
        for factor in match.factors:
            factor_value = np.asarray(tensor(factor.tensor), np.float64)
            if factor_value.size != 1:
                raise layer_error(
                    match.layer,
                    f"scale factor {factor.tensor!r} is not a scalar {factor_value.shape}",
                )
            number = float(factor_value.ravel()[0])
            scale = scale / number if factor.divides else scale * number
        expected = _expected_attention(query, key, value, scale)
        if context.shape != expected.shape:
            raise layer_error(
                match.layer,
                f"context {match.context_node.output[0]!r} has shape {context.shape}, expected "
                f"{expected.shape} [batch, heads, new tokens, head_dim]",
            )
        diff = float(np.max(np.abs(context.astype(np.float64) - expected)))
        loose = query.dtype == np.float16 or key.dtype == np.float16
        limit = (2e-2 if loose else 1e-4) * max(1.0, float(np.max(np.abs(expected))))
        if not np.isfinite(diff) or diff > limit:
            raise layer_error(
                match.layer,
                f"the matched block is not causal softmax({scale:g} * Q K^T) V (max |diff| "
                f"{diff:.3g} on a probe run); masks other than causal, softcapping, ALiBi or "
                "sliding windows are not supported",
            )
        layers.append(LayerAttention(match.layer, heads, kv_heads, head_dim, scale, diff))
        dtypes[match.query] = query.dtype
        dtypes[match.inner["key"]] = key.dtype
        dtypes[match.inner["value"]] = value.dtype
        dtypes[match.context_node.output[0]] = context.dtype
    return layers, dtypes


# ---------------------------------------------------------------------------------------------
# Logits check
# ---------------------------------------------------------------------------------------------
def compare_logits(
    source: Path,
    converted: Path,
    *,
    prefill_tokens: int = 8,
    decode_steps: int = 20,
    batch_size: int = 1,
    seed: int = 0,
    tolerance: float | None = None,
) -> LogitsCheck:
    """Run both graphs on the same random token sequence and compare the logits.

    The source runs with numpy-fed growing past tensors (what published scripts do); the
    converted graph runs with `KVCache` in 'inplace' (one fixed buffer) and 'chain' mode.
    Raises ModelError when some |diff| exceeds `tolerance` + rtol x |logit| (rtol 1e-4 for
    float32 graphs, 3e-2 with float16 inside, 1e-1 with int8-quantized activations; default
    tolerance: rtol x median |logit|)."""
    source_model = onnx.load(str(source), load_external_data=False)
    spec = FeedSpec.of(source_model)
    spec.check_known()
    present_of = dict(
        kv_pairs(
            (i.name for i in source_model.graph.input), (o.name for o in source_model.graph.output)
        )
    )
    past_names = list(present_of)
    half = any(
        t.data_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16)
        for t in source_model.graph.initializer
    ) or any(spec.kv_dtype(name) == np.float16 for name in past_names)
    # Activations quantized to int8 inside the graph turn float-rounding differences upstream
    # (the rewritten attention's) into whole quantization steps, which the next layers carry
    # on: on CPUs without VNNI (u8s8 products that saturate, e.g. AVX2 only) a step flip was
    # measured at 4.6% of the typical logit on a 24-layer stand-in. A broken rewrite is off by
    # the logit's own size.
    int8 = any(n.op_type in INT8_ACTIVATION_OPS for n in source_model.graph.node)
    output_name = "logits" if any(o.name == "logits" for o in source_model.graph.output) else None
    if output_name is None:
        output_name = next(
            o.name for o in source_model.graph.output if o.name not in present_of.values()
        )
    del source_model

    rng = np.random.default_rng(seed)
    if spec.single_token:
        lengths = [1] * (prefill_tokens + decode_steps)
    else:
        lengths = [prefill_tokens] + [1] * decode_steps
    tokens = [spec.token_inputs(rng, batch_size, n) for n in lengths]

    source_session = Session(source)
    pasts = {
        name: np.zeros(spec.kv_shape(name, batch_size, 0), spec.kv_dtype(name))
        for name in past_names
    }
    expected: list[np.ndarray] = []
    length = 0
    for step_tokens, new in zip(tokens, lengths, strict=True):
        feeds = {**step_tokens, **spec.step_inputs(batch_size, length, new), **pasts}
        outputs = source_session.run(feeds, [output_name, *present_of.values()])
        expected.append(outputs[output_name].astype(np.float64))
        pasts = {name: outputs[present_of[name]] for name in past_names}
        length += new
    del source_session

    # Tolerance as in np.allclose: atol from the typical logit size (huge masking biases
    # such as -1e4 would make a max-based scale meaningless), rtol for the large entries.
    typical = max(1.0, float(np.median(np.abs(np.concatenate([r.ravel() for r in expected])))))
    rtol = 1e-1 if int8 else 3e-2 if half else 1e-4
    limit = tolerance if tolerance is not None else rtol * typical

    converted_session = Session(converted)
    diffs: dict[str, float] = {}
    excess = unmasked = 0.0
    for mode in ("inplace", "chain"):
        capacity = sum(lengths) if mode == "inplace" else None
        cache = KVCache(converted_session, mode, batch_size=batch_size, capacity=capacity)
        worst = 0.0
        for step, (step_tokens, new) in enumerate(zip(tokens, lengths, strict=True)):
            feeds = {**step_tokens, **spec.step_inputs(batch_size, cache.length, new)}
            logits = cache.step(feeds, output_names=[output_name])[output_name]
            if not np.all(np.isfinite(logits)):
                worst = excess = math.inf
                break
            diff = np.abs(logits.astype(np.float64) - expected[step])
            worst = max(worst, float(np.max(diff)))
            ordinary = np.abs(expected[step]) <= 100.0 * typical
            if np.any(ordinary):
                unmasked = max(unmasked, float(np.max(diff[ordinary])))
            excess = max(excess, float(np.max(diff - rtol * np.abs(expected[step]))))
        diffs[mode] = worst
    check = LogitsCheck(
        prefill_tokens=prefill_tokens,
        decode_steps=decode_steps,
        max_abs_diff_inplace=diffs["inplace"],
        max_abs_diff_chain=diffs["chain"],
        max_abs_diff_unmasked=unmasked,
        typical_abs_logit=typical,
        tolerance=limit,
    )
    if not excess <= limit:
        raise ModelError(
            f"the converted graph's logits differ from the source's: max |diff| "
            f"{check.max_abs_diff_inplace:.3g} (inplace) / {check.max_abs_diff_chain:.3g} (chain), "
            f"allowed {limit:.3g} + {rtol:g} x |logit|; nothing was written"
        )
    return check

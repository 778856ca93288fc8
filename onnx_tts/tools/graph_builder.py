"""The one ONNX graph builder of the project: export recipes, benchmarks, tests and the
converter write graphs with it (needs only `onnx` and numpy, no torch).

Everything is deterministic: node and tensor names come from counters and the caller's hints,
never from ids or addresses, so building the same graph twice gives identical bytes.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

DEFAULT_OPSET = 17
MS_DOMAIN = "com.microsoft"
# ORT 1.31 refuses the IR version onnx 1.23 writes by default (14).
IR_VERSION = 10

FLOAT = TensorProto.FLOAT
FLOAT16 = TensorProto.FLOAT16
INT64 = TensorProto.INT64
INT32 = TensorProto.INT32
BOOL = TensorProto.BOOL

Dim = int | str | None


class GraphBuilder:
    """Collects nodes, initializers and graph I/O; names every node deterministically."""

    def __init__(
        self,
        name: str,
        opset: int = DEFAULT_OPSET,
        *,
        producer: str = "onnx-tts-export",
        reserved: Iterable[str] = (),
    ) -> None:
        """`reserved`: names already taken, when the nodes go into an existing graph (see
        `reserved_names`); new nodes and initializers never collide with them."""
        self.name = name
        self.opset = opset
        self.producer = producer
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._used_names: set[str] = set(reserved)
        self._counter = 0
        self._uses_ms_domain = False
        self._const_cache: dict[tuple[str, bytes, tuple[int, ...]], str] = {}

    def unique(self, hint: str) -> str:
        """`hint`, or `hint_N` when taken; the name is reserved from then on."""
        name = hint
        while name in self._used_names:
            self._counter += 1
            name = f"{hint}_{self._counter}"
        self._used_names.add(name)
        return name

    # graph I/O -------------------------------------------------------------------------
    def add_input(self, name: str, elem_type: int, shape: tuple[Dim, ...]) -> str:
        self._used_names.add(name)
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    def add_output(self, name: str, elem_type: int, shape: tuple[Dim, ...] | None) -> str:
        self.outputs.append(
            helper.make_tensor_value_info(name, elem_type, None if shape is None else list(shape))
        )
        return name

    # tensors ---------------------------------------------------------------------------
    def initializer(self, name: str, array: np.ndarray) -> str:
        unique = self.unique(name)
        self.initializers.append(numpy_helper.from_array(np.asarray(array, order="C"), unique))
        return unique

    def const(self, value: np.ndarray | list | int | float, dtype: type = np.int64) -> str:
        """A small constant initializer, shared between identical uses."""
        array = np.asarray(value, dtype=dtype)
        key = (str(array.dtype), array.tobytes(), array.shape)
        if key not in self._const_cache:
            self._const_cache[key] = self.initializer("const", array)
        return self._const_cache[key]

    # nodes -----------------------------------------------------------------------------
    def node(
        self,
        op_type: str,
        inputs: list[str],
        num_outputs: int = 1,
        domain: str = "",
        name: str | None = None,
        output_names: list[str] | None = None,
        **attrs: object,
    ) -> str | list[str]:
        """Adds one node. Returns its output name, or the list of output names when
        num_outputs > 1 or output_names is given (graph outputs are named by the caller)."""
        node_name = self.unique(name or op_type)
        if output_names is None:
            outputs = [self.unique(f"{node_name}/out{i}") for i in range(num_outputs)]
        else:
            outputs = list(output_names)
            self._used_names.update(outputs)
        if domain == MS_DOMAIN:
            self._uses_ms_domain = True
        self.nodes.append(
            helper.make_node(
                op_type, inputs, outputs, name=node_name, domain=domain or None, **attrs
            )
        )
        return outputs[0] if num_outputs == 1 and output_names is None else outputs

    def shape_dims(self, x: str, start: int, end: int, name: str | None = None) -> str:
        """1-D int64 sizes of `x` along axes start..end-1 (Shape with start/end, opset 15+)."""
        return self.node("Shape", [x], start=start, end=end, name=name)

    def identity(self, x: str, output_name: str) -> str:
        self.node("Identity", [x], output_names=[output_name], name=f"{output_name}/Identity")
        return output_name

    def take_nodes(self) -> list[onnx.NodeProto]:
        """The nodes added since the last take (they leave the builder): for rewrites that
        place new nodes among an existing graph's, in its order."""
        taken, self.nodes = self.nodes, []
        return taken

    # build -----------------------------------------------------------------------------
    def build(self, doc_string: str = "") -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, self.name, self.inputs, self.outputs, initializer=self.initializers
        )
        opsets = [helper.make_opsetid("", self.opset)]
        if self._uses_ms_domain:
            opsets.append(helper.make_opsetid(MS_DOMAIN, 1))
        model = helper.make_model(
            graph, opset_imports=opsets, producer_name=self.producer, doc_string=doc_string
        )
        model.ir_version = IR_VERSION
        return model


def reserved_names(graph: onnx.GraphProto) -> set[str]:
    """Every node, tensor and I/O name of an existing graph (for GraphBuilder(reserved=...))."""
    names = {n.name for n in graph.node} | {t.name for t in graph.initializer}
    for node in graph.node:
        names.update(node.output)
    names.update(i.name for i in graph.input)
    names.update(o.name for o in graph.output)
    return names


def value_info(
    name: str, elem_type: int, shape: tuple[Dim, ...] | list[Dim] | None
) -> onnx.ValueInfoProto:
    """A graph input/output declaration (symbolic dims by name, None for unnamed)."""
    return helper.make_tensor_value_info(name, elem_type, None if shape is None else list(shape))


def add_initializer(graph: onnx.GraphProto, array: np.ndarray, name: str) -> onnx.TensorProto:
    """`array` as a new initializer of `graph`, built in place: appending a made tensor copies
    it through serialization, which fails past protobuf's 2 GB (a 151,936 x 4096 float head)."""
    array = np.ascontiguousarray(array)
    tensor = graph.initializer.add()
    tensor.name = name
    tensor.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
    tensor.dims.extend(array.shape)
    tensor.raw_data = array.tobytes()
    return tensor


def builder_into(model: onnx.ModelProto) -> GraphBuilder:
    """A builder for nodes that go into `model`'s graph: its default-domain opset, and no name
    the graph already uses."""
    opset = next(
        (o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), DEFAULT_OPSET
    )
    return GraphBuilder(model.graph.name, opset, reserved=reserved_names(model.graph))


# small op helpers --------------------------------------------------------------------------
def reduce_op(
    b: GraphBuilder, op: str, x: str, axes: list[int], keepdims: bool, name: str | None = None
) -> str:
    """Reduce* with axes as an input or attribute, whichever the builder's opset wants."""
    axes_as_input = (op == "ReduceSum" and b.opset >= 13) or b.opset >= 18
    if axes_as_input:
        return b.node(op, [x, b.const(axes)], keepdims=int(keepdims), name=name)
    return b.node(op, [x], axes=axes, keepdims=int(keepdims), name=name)


def linear(b: GraphBuilder, x: str, weight: np.ndarray, bias: np.ndarray | None, name: str) -> str:
    """x @ weight (+ bias); weight is [in, out]."""
    y = b.node("MatMul", [x, b.initializer(f"{name}.weight", weight)], name=f"{name}/MatMul")
    if bias is not None:
        y = b.node("Add", [y, b.initializer(f"{name}.bias", bias)], name=f"{name}/Add")
    return y


def rms_norm(b: GraphBuilder, x: str, weight: np.ndarray, eps: float, name: str) -> str:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis. ORT fuses this pattern into one
    SimplifiedLayerNormalization only when the square is a Pow (with Mul(x, x) it runs six
    nodes per norm: a fifth of the voice LM's decode step)."""
    squared = b.node("Pow", [x, b.const(2.0, np.float32)], name=f"{name}/Square")
    mean = reduce_op(b, "ReduceMean", squared, [-1], keepdims=True, name=f"{name}/Mean")
    denom = b.node("Sqrt", [b.node("Add", [mean, b.const(eps, np.float32)], name=f"{name}/Eps")])
    normed = b.node("Div", [x, denom], name=f"{name}/Div")
    return b.node("Mul", [normed, b.initializer(f"{name}.weight", weight)], name=f"{name}/Scale")


def layer_norm(
    b: GraphBuilder, x: str, weight: np.ndarray, bias: np.ndarray, eps: float, name: str
) -> str:
    return b.node(
        "LayerNormalization",
        [x, b.initializer(f"{name}.weight", weight), b.initializer(f"{name}.bias", bias)],
        axis=-1,
        epsilon=eps,
        name=name,
    )


def silu(b: GraphBuilder, x: str, name: str) -> str:
    return b.node("Mul", [x, b.node("Sigmoid", [x], name=f"{name}/Sigmoid")], name=f"{name}/Mul")


def rotary_tables(
    max_positions: int, rotary_dim: int, theta: float = 10000.0
) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin tables [max_positions, rotary_dim / 2] (half-split, Llama convention).

    The angle is formed in float32 (position * inv_freq), as an in-graph Mul would, so the
    table and a graph that computes angles from position_ids agree to the last bit of the angle.
    """
    inv_freq = rotary_inv_freq(rotary_dim, theta)
    positions = np.arange(max_positions, dtype=np.float32)
    angles = positions[:, None] * inv_freq[None, :]
    return (
        np.cos(angles.astype(np.float64)).astype(np.float32),
        np.sin(angles.astype(np.float64)).astype(np.float32),
    )


def rotary_inv_freq(rotary_dim: int, theta: float = 10000.0) -> np.ndarray:
    exponents = np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim
    return (1.0 / theta**exponents).astype(np.float32)

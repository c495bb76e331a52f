"""Give a voice's 1-D convolutions a unit height axis, so ONNX Runtime runs them on its fast path.

ONNX Runtime's CPU optimizer rewrites 2-D convolutions (and the element-wise ops and residual
adds between them) into its blocked ``NCHWc`` layout, whose direct-convolution kernels are
faster than the im2col + GEMM path every 1-D convolution takes; it leaves 1-D convolutions
alone. A ``[N, C, T]`` convolution is the same computation as ``[N, C, 1, T]`` with a ``1 x k``
kernel, so the rewrite changes layout, not arithmetic: the compile step's check against the
original graph (and the window-context measurement after it) runs on the rewritten engines.

The rewrite lifts connected regions, not single convolutions: a tensor a lifted node produces
stays 4-D for every lifted consumer, and is squeezed back only where an op outside the region
(a reduction, a reshape, a graph output) reads it. That keeps the layout conversions ONNX
Runtime inserts at the region's edges instead of around every convolution.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ttsvc.backends.base import STATE_IN, TOTAL_INPUT

CONVS = frozenset({"Conv", "ConvTranspose"})
# Element-wise ops whose meaning does not depend on rank once every operand is 4-D or a scalar.
ELEMENTWISE = frozenset({
    "Add", "Sub", "Mul", "Div", "LeakyRelu", "Relu", "Tanh", "Sigmoid", "Neg", "Exp", "Identity",
})  # fmt: skip
# Attributes of a 1-D convolution and how each becomes its 2-D form.
_WIDEN = {
    "kernel_shape": lambda v: [1, *v],
    "strides": lambda v: [1, *v],
    "dilations": lambda v: [1, *v],
    "output_padding": lambda v: [0, *v],
    "output_shape": lambda v: [1, *v],
    "pads": lambda v: [0, v[0], 0, v[1]],
}
SUFFIX = "__2d"
CONV1D = "conv1d"
CONV2D = "conv2d"
"""Manifest names of the two layouts an ONNX Runtime engine can be kept in."""


def _ranks(model: onnx.ModelProto) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(model)
    graph = inferred.graph
    ranks = {init.name: len(init.dims) for init in graph.initializer}
    for value in [*graph.input, *graph.output, *graph.value_info]:
        if value.type.tensor_type.HasField("shape"):
            ranks[value.name] = len(value.type.tensor_type.shape.dim)
    return ranks


def _scalars(model: onnx.ModelProto) -> set[str]:
    """Constants with one element: they broadcast the same against any rank."""
    out = {i.name for i in model.graph.initializer if _size(list(i.dims)) == 1}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute:
            value = helper.get_attribute_value(node.attribute[0])
            if isinstance(value, onnx.TensorProto) and _size(list(value.dims)) == 1:
                out.add(node.output[0])
    return out


def _size(dims: list[int]) -> int:
    size = 1
    for d in dims:
        size *= d
    return size


def lift_convolutions(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` with its 1-D convolutions (and the element-wise ops between them) as
    2-D ones over a unit height axis; also returns how many convolutions were lifted."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
           for node in graph.node for a in node.attribute):  # fmt: skip
        return out, 0  # a branch or loop body may read a tensor by a name this would change
    ranks = _ranks(out)
    scalars = _scalars(out)
    initializers = {init.name: init for init in graph.initializer}
    uses: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1

    lifted: set[str] = set()  # original names of tensors that have a 4-D twin
    plan: list[onnx.NodeProto] = []
    added: list[onnx.NodeProto] = []
    unsqueezed: dict[str, str] = {}
    axis = "__lift_axis"
    convs = 0

    def four_d(name: str) -> str:
        if name in lifted:
            return name + SUFFIX
        if name not in unsqueezed:
            unsqueezed[name] = f"{name}{SUFFIX}_in"
            added.append(helper.make_node("Unsqueeze", [name, axis], [unsqueezed[name]]))
        return unsqueezed[name]

    for node in graph.node:
        data = [i for i in node.input if i]
        if node.op_type in CONVS:
            weight = node.input[1] if len(node.input) > 1 else ""
            ok = ranks.get(node.input[0]) == 3 and ranks.get(weight) == 3
        elif node.op_type in ELEMENTWISE:
            ok = any(i in lifted for i in data) and all(
                i in lifted or i in scalars or ranks.get(i) == 3 for i in data
            )
        else:
            ok = False
        if not ok:
            plan.append(node)
            continue
        new = onnx.NodeProto()
        new.CopyFrom(node)
        if node.op_type in CONVS:
            convs += 1
            new.input[0] = four_d(node.input[0])
            weight = node.input[1]
            init = initializers.get(weight)
            if init is not None and uses.get(weight) == 1:
                init.CopyFrom(numpy_helper.from_array(
                    numpy_helper.to_array(init)[:, :, None, :], weight))  # fmt: skip
            else:
                new.input[1] = four_d(weight)
            for attr in new.attribute:
                if attr.name in _WIDEN and len(attr.ints):
                    widened = _WIDEN[attr.name](list(attr.ints))
                    del attr.ints[:]
                    attr.ints.extend(widened)
        else:
            for i, name in enumerate(node.input):
                if name and name not in scalars:
                    new.input[i] = four_d(name)
        for i, name in enumerate(node.output):
            new.output[i] = name + SUFFIX
            lifted.add(name)
        plan.append(new)

    if not convs:
        return out, 0
    # squeeze back where something outside the region (or the graph's caller) reads a tensor
    readers = {i for n in plan if not any(o.endswith(SUFFIX) for o in n.output) for i in n.input}
    readers |= {o.name for o in graph.output}
    squeezes = [helper.make_node("Squeeze", [name + SUFFIX, axis], [name])
                for name in sorted(lifted & readers)]  # fmt: skip
    graph.initializer.append(numpy_helper.from_array(np.array([2], dtype=np.int64), axis))
    ordered = _topological([*added, *plan, *squeezes])
    del graph.node[:]
    graph.node.extend(ordered)
    del graph.value_info[:]  # shapes of renamed tensors changed; runtimes infer them again
    return out, convs



def _topological(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """Order nodes so each comes after the producers of its inputs (ONNX requires it)."""
    produced_by = {o: i for i, n in enumerate(nodes) for o in n.output}
    order: list[onnx.NodeProto] = []
    state = [0] * len(nodes)  # 0 new, 1 visiting, 2 done
    for start in range(len(nodes)):
        stack = [(start, False)]
        while stack:
            index, expanded = stack.pop()
            if expanded:
                state[index] = 2
                order.append(nodes[index])
                continue
            if state[index]:
                continue
            state[index] = 1
            stack.append((index, True))
            for name in nodes[index].input:
                producer = produced_by.get(name)
                if producer is not None and state[producer] == 0:
                    stack.append((producer, False))
    return order


TIMING_FRAMES = 64
"""Frames of the synthetic window the two layouts are timed on: a mid-sized streaming window."""
KEEP_LIFTED = 1.02
"""How much faster (plain time over lifted time) the lifted engine must run to be kept: below
this the two are within the noise of a shared machine, and the plain graph is the simpler one."""


def timing_feeds(model: onnx.ModelProto, ids: list[int]) -> dict[str, np.ndarray]:
    """Inputs for timing one split engine: the canary's ids for the sentence engine, a
    ``TIMING_FRAMES`` window of noise (and a full mask) for a frame engine."""
    rng = np.random.default_rng(0)
    constant = {init.name for init in model.graph.initializer}
    feeds: dict[str, np.ndarray] = {}
    for value in model.graph.input:
        if value.name in constant:
            continue
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
        if value.name.startswith(STATE_IN):  # a stateful engine's state: zeros, its own size
            feeds[value.name] = np.zeros((1, dims[1], dims[2]), dtype=np.float32)
        elif value.name == TOTAL_INPUT:
            feeds[value.name] = np.asarray([TIMING_FRAMES], dtype=np.int64)
        elif value.name == "input":
            feeds[value.name] = np.asarray([ids], dtype=np.int64)
        elif value.name == "input_lengths":
            feeds[value.name] = np.asarray([len(ids)], dtype=np.int64)
        elif value.name == "scales":  # no noise: every run predicts the same durations
            feeds[value.name] = np.asarray([0.0, 1.0, 0.0], dtype=np.float32)
        elif value.type.tensor_type.elem_type == onnx.TensorProto.INT64:  # the speaker id
            feeds[value.name] = np.zeros([max(d, 1) for d in dims], dtype=np.int64)
        elif len(dims) == 3 and dims[1] == 1:  # the frame mask
            feeds[value.name] = np.ones((1, 1, TIMING_FRAMES), dtype=np.float32)
        else:
            shape = (1, dims[1] if len(dims) == 3 else 1, TIMING_FRAMES)
            feeds[value.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def speedup(plain: Path, lifted: Path, feeds: dict[str, np.ndarray], pairs: int = 7) -> float:
    """Median of plain time over lifted time, the two runs of each pair back to back, so a
    neighbour's load slows both alike."""
    from ttsvc.backends.onnxruntime import create_session  # noqa: PLC0415

    sessions = [create_session(path, 1) for path in (plain, lifted)]
    for session in sessions:  # first runs allocate
        session.run(None, feeds)
    ratios = []
    for _ in range(pairs):
        times = []
        for session in sessions:
            started = time.perf_counter()
            session.run(None, feeds)
            times.append(time.perf_counter() - started)
        ratios.append(times[0] / max(times[1], 1e-9))
    return float(np.median(ratios))

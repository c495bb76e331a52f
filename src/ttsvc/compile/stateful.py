"""Turn a frame engine (flow or vocoder) into a stateful streaming engine.

Why: a windowed engine recomputes its context frames on every window and crops them away, so a
streamed sentence costs more engine time than a one-shot run (17-23 % measured, issue 26), and
the more so the smaller the windows. A stateful engine takes what the stream's previous window
left as extra inputs and returns the new state, so each call computes only its new frames, and
its output equals the one-shot output (the compile checks it before it publishes).

The transform walks the graph in topological order and gives every time-varying tensor a *lag*:
the call that reads input frames ``[p, p + n)`` yields, for a tensor of lag ``d`` and ``s``
samples per input frame, the one-shot values ``[p*s - d, (p + n)*s - d)``. Then:

* a padded convolution (stride 1) reads its input with the last ``(k - 1) * dilation`` values of
  the previous call prepended (a cache) and no padding; it lags its input by its right padding;
* a transposed convolution runs without padding or bias, adds the overlap-add tail the previous
  call left to its first ``k - s`` samples, keeps the last ``k - s`` as the next tail, then adds
  its bias; it lags ``input lag * s + left padding``;
* an element-wise op (or a channel concat) joining tensors of different lags delays the less
  lagged ones by a delay line, so the branches it joins line up again (residual and skip sums);
* before every convolution that mixes frames, its input is multiplied by a mask that is zero
  where the one-shot input is outside the sentence (a position before the first frame or past
  the last one), which is exactly the zero padding a one-shot run gives that layer. The mask is
  computed in the graph from two inputs, ``position`` (the first input frame of this call) and
  ``total`` (the sentence's frames), so the sentence's end is flushed by feeding ``lag`` more
  frames (any values: they are masked) and the start needs no special form of the graph.

States are ordinary inputs and outputs (``state_in.N`` / ``state_out.N``, ``[batch, C, n]``,
zero at a stream's start), so ONNX Runtime and TensorRT run them as any other binding, and a
stream's state lives with the stream in the worker. Anything the transform cannot prove exact
(a strided convolution, a slice along time, an unknown op) raises ``NotStreamable``; the compile
then keeps the context engines and says why.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import count
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ttsvc.backends.base import (
    POSITION_INPUT,
    STATE_IN,
    STATE_OUT,
    STREAM_LAG_KEY,
    STREAM_SCALE_KEY,
    TOTAL_INPUT,
)
from ttsvc.errors import GraphShapeError

_INT64_MAX = np.iinfo(np.int64).max
_TIME = -1
"""Time is the last axis of every time-varying tensor of a frame engine."""
_PASS_THROUGH = frozenset(
    {"LeakyRelu", "Relu", "Tanh", "Sigmoid", "Exp", "Neg", "Identity", "Cast", "Sqrt", "Abs"}
)
_JOINING = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Concat", "Max", "Min", "Where"})
_SHAPE_ONLY = frozenset({"Shape", "ConstantOfShape", "Constant"})
_ZERO_KEEPING = frozenset({"LeakyRelu", "Relu"})
"""Activations that map 0 to 0, so a convolution may cache their input in their stead."""


class NotStreamable(GraphShapeError):
    """The graph has a part the transform cannot make exact: keep the context engines."""


@dataclass(frozen=True)
class StreamingGraph:
    """A stateful engine and what its caller needs to know to run it."""

    model: onnx.ModelProto
    lag: int
    """The output lags the input by this many output samples (frames for the flow)."""
    scale: int
    """Output samples per input frame (1 for the flow, the hop for the vocoder)."""
    states: int
    """How many state tensors a call takes and returns."""

    @property
    def flush_frames(self) -> int:
        """Input frames to feed past the sentence's end so its last output comes out."""
        return -(-self.lag // self.scale)


@dataclass
class _Timed:
    lag: int
    scale: int


class _Builder:
    """The rewritten graph, node by node, with the state inputs and outputs it grows."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.state_inputs: list[onnx.ValueInfoProto] = []
        self.state_outputs: list[onnx.ValueInfoProto] = []
        self._ids = count()
        self._consts: dict[tuple[str, bytes], str] = {}
        self._index: dict[int, str] = {}
        self._masks: dict[tuple[int, int], str] = {}
        self.producer = {out: node for node in model.graph.node for out in node.output}
        """The original graph's producer of each tensor."""
        self.timed: dict[str, _Timed] = {}
        """Each time-varying tensor's lag and rate, as the walk assigns them."""
        self.views: dict[str, tuple[str, int]] = {}
        """Tensors a convolution caches as they are: its buffer (cache, then the call's
        values) and the cache's length."""

    def name(self, stem: str) -> str:
        return f"stream/{stem}_{next(self._ids)}"

    def node(self, op: str, inputs: list[str], **attrs: Any) -> str:
        out = self.name(op)
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def const(self, value: np.ndarray) -> str:
        key = (str(value.dtype) + str(value.shape), value.tobytes())
        if key not in self._consts:
            name = self.name("const")
            self.inits.append(numpy_helper.from_array(value, name))
            self._consts[key] = name
        return self._consts[key]

    def i64(self, *values: int) -> str:
        return self.const(np.asarray(values, dtype=np.int64))

    def slice_time(self, x: str, start: int, end: int) -> str:
        return self.node("Slice", [x, self.i64(start), self.i64(end), self.i64(_TIME)])

    def state(self, channels: int, length: int) -> tuple[str, str]:
        """A new state tensor ``[batch, channels, length]``: its input and output names."""
        index = len(self.state_inputs)
        shape: list[str | int | None] = ["batch", channels, length]
        name_in, name_out = f"{STATE_IN}{index}", f"{STATE_OUT}{index}"
        self.state_inputs.append(helper.make_tensor_value_info(name_in, TensorProto.FLOAT, shape))
        self.state_outputs.append(
            helper.make_tensor_value_info(name_out, TensorProto.FLOAT, shape)
        )
        return name_in, name_out

    def carry(self, x: str, channels: int, length: int) -> tuple[str, str]:
        """Prepend the state to ``x`` (time axis); the last ``length`` values become the next
        state. Returns the joined tensor and its name before the state output."""
        name_in, name_out = self.state(channels, length)
        joined = self.node("Concat", [name_in, x], axis=_TIME)
        self.nodes.append(
            helper.make_node("Slice", [joined, self.i64(-length), self.i64(_INT64_MAX),
                                       self.i64(_TIME)], [name_out], name=self.name("keep"))
        )  # fmt: skip
        return joined, name_out

    def delay(self, x: str, channels: int, frames: int) -> str:
        """``x`` delayed by ``frames`` values along time (a delay line of zeros at the start)."""
        joined, _ = self.carry(x, channels, frames)
        return self.slice_time(joined, 0, -frames)

    def delayed(self, x: str, channels_of: Callable[[str], int], frames: int) -> str:
        """``x`` delayed by ``frames``: from a convolution's cached buffer of ``x`` where one
        holds enough of its past (one copy: HiFi-GAN's residual branches), else by a delay
        line (two copies). The buffer holds ``x`` masked outside the sentence: what is added
        there is outside the sentence too, and masked before any convolution reads it."""
        view = self.views.get(x)
        if view is not None and view[1] >= frames:
            joined, span = view
            return self.slice_time(joined, span - frames, -frames)
        return self.delay(x, channels_of(x), frames)

    def index(self, scale: int, like: str) -> str:
        """Sentence indices ``[position*scale + i]`` of a call's values at ``scale`` (int64
        ``[L]``, ``L`` read from ``like``, a tensor at that scale)."""
        if scale not in self._index:
            length = self.node("Shape", [like], start=_TIME)
            scalar = self.node("Squeeze", [length])
            steps = self.node("Range", [self.const(np.asarray(0, dtype=np.int64)), scalar,
                                        self.const(np.asarray(1, dtype=np.int64))])  # fmt: skip
            first = self.node("Mul", [POSITION_INPUT, self.i64(scale)])
            self._index[scale] = self.node("Add", [steps, first])
        return self._index[scale]

    def mask(self, x: str, timed: _Timed) -> str:
        """``x`` with its values outside the one-shot tensor's span set to zero."""
        key = (timed.scale, timed.lag)
        if key not in self._masks:
            index = self.index(timed.scale, x)
            end = self.node("Add", [self.node("Mul", [TOTAL_INPUT, self.i64(timed.scale)]),
                                    self.i64(timed.lag)])  # fmt: skip
            inside = self.node("And", [self.node("GreaterOrEqual", [index, self.i64(timed.lag)]),
                                       self.node("Less", [index, end])])  # fmt: skip
            self._masks[key] = self.node("Cast", [inside], to=TensorProto.FLOAT)
        return self.node("Mul", [x, self._masks[key]])


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    values = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    values[node.output[0]] = numpy_helper.to_array(attr.t)
    return values


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _channels(model: onnx.ModelProto) -> dict[str, int]:
    """Channel count (axis 1) of every tensor shape inference can tell."""
    inferred = onnx.shape_inference.infer_shapes(model)
    out: dict[str, int] = {}
    for value in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        dims = value.type.tensor_type.shape.dim
        if len(dims) >= 2 and dims[1].HasField("dim_value"):
            out[value.name] = dims[1].dim_value
    return out


def make_stateful(model: onnx.ModelProto, time_inputs: tuple[str, ...]) -> StreamingGraph:
    """The stateful streaming form of frame engine ``model``.

    ``time_inputs`` are its inputs indexed by frame (``latents`` and ``mask``, or ``frames``);
    any other input (a speaker id) is constant over time. Raises ``NotStreamable`` for a graph
    the transform cannot make exact.
    """
    if len(model.graph.output) != 1:
        raise NotStreamable("a frame engine with more than one output")
    consts = _constants(model)
    channels = _channels(model)
    b = _Builder(model)
    timed = b.timed
    timed.update({name: _Timed(0, 1) for name in time_inputs})

    def channels_of(name: str) -> int:
        if name not in channels:
            raise NotStreamable(f"the channels of {name} are unknown: cannot size its state")
        return channels[name]

    for node in model.graph.node:
        ins = [i for i in node.input if i]
        moving = [timed[i] for i in ins if i in timed]
        op = node.op_type
        if op in _SHAPE_ONLY or not moving:
            b.nodes.append(node)  # constant over time (or only the length): lag does not apply
            continue
        if op == "Conv":
            timed[node.output[0]] = _conv(b, node, consts, timed[node.input[0]])
        elif op == "ConvTranspose":
            timed[node.output[0]] = _conv_transpose(b, node, consts, timed[node.input[0]])
        elif op in _JOINING:
            timed[node.output[0]] = _join(b, node, timed, channels_of)
        elif op in _PASS_THROUGH:
            b.nodes.append(node)
            timed[node.output[0]] = moving[0]
        elif op in ("Slice", "Split", "Squeeze", "Unsqueeze"):
            _check_not_time(node, consts)
            b.nodes.append(node)
            for out in node.output:
                timed[out] = timed[node.input[0]]
        else:
            raise NotStreamable(f"{op} ({node.name}) has no streaming form")

    output = model.graph.output[0].name
    if output not in timed:
        raise NotStreamable("the output does not depend on the frames")
    result = _assemble(model, b)
    lag, scale = timed[output].lag, timed[output].scale
    helper.set_model_props(result, {STREAM_LAG_KEY: str(lag), STREAM_SCALE_KEY: str(scale)})
    return StreamingGraph(result, lag, scale, len(b.state_inputs))


def _kernel(
    node: onnx.NodeProto, consts: dict[str, np.ndarray]
) -> tuple[dict[str, Any], np.ndarray, int, int, int]:
    """A 1-D (transposed) convolution's attributes, constant weight, kernel size, stride and
    groups (``NotStreamable`` when its weight is not a constant ``[out, in, k]`` tensor)."""
    attrs = _attrs(node)
    weight = consts.get(node.input[1])
    if weight is None or weight.ndim != 3:
        raise NotStreamable(f"{node.name}: a 1-D {node.op_type} with constant weights is expected")
    stride = int(attrs.get("strides", [1])[0])
    return attrs, weight, int(weight.shape[2]), stride, int(attrs.get("group", 1))


def _conv(b: _Builder, node: onnx.NodeProto, consts: dict[str, np.ndarray], x: _Timed) -> _Timed:
    attrs, weight, k, stride, group = _kernel(node, consts)
    dilation = int(attrs.get("dilations", [1])[0])
    pads = list(attrs.get("pads", [0, 0]))
    if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise NotStreamable(f"{node.name}: auto_pad")
    if stride != 1:
        raise NotStreamable(f"{node.name}: a strided convolution")
    span = (k - 1) * dilation
    left, right = int(pads[0]), int(pads[1])
    if left + right != span:
        raise NotStreamable(f"{node.name}: padding {pads} does not keep the length")
    if span == 0:
        b.nodes.append(node)
        return x
    channels = int(weight.shape[1]) * group
    activation = b.producer.get(node.input[0])
    source = activation.input[0] if activation is not None else ""
    if activation is not None and activation.op_type in _ZERO_KEEPING and b.timed.get(source) == x:
        # cache the activation's input instead of its output: the same zeros at the edges
        # (the activation keeps 0 at 0), and a residual branch that delays that input takes
        # it from this buffer (``_Builder.delayed``) instead of a delay line of its own
        joined, _ = b.carry(b.mask(source, x), channels, span)
        b.views[source] = (joined, span)
        data = b.node(activation.op_type, [joined], **_attrs(activation))
    else:
        data, _ = b.carry(b.mask(node.input[0], x), channels, span)
        b.views[node.input[0]] = (data, span)
    kept = {k_: v for k_, v in attrs.items() if k_ != "pads"}
    b.nodes.append(helper.make_node("Conv", [data, *node.input[1:]], list(node.output),
                                    name=node.name, pads=[0, 0], **kept))  # fmt: skip
    return _Timed(x.lag + right, x.scale)


def _conv_transpose(
    b: _Builder, node: onnx.NodeProto, consts: dict[str, np.ndarray], x: _Timed
) -> _Timed:
    attrs, weight, k, stride, group = _kernel(node, consts)
    pads = [int(p) for p in attrs.get("pads", [0, 0])]
    extra = int(attrs.get("output_padding", [0])[0])
    if list(attrs.get("dilations", [1])) != [1] or "output_shape" in attrs:
        raise NotStreamable(f"{node.name}: a dilated or shaped transposed convolution")
    if k < stride or k - pads[0] - pads[1] + extra != stride:
        raise NotStreamable(f"{node.name}: output length is not input length x stride")
    channels = int(weight.shape[1]) * group
    masked = b.mask(node.input[0], x)
    plain = {k_: v for k_, v in attrs.items() if k_ not in ("pads", "output_padding")}
    full = b.node("ConvTranspose", [masked, node.input[1]], pads=[0, 0], **plain)
    tail = k - stride
    if tail > stride:
        raise NotStreamable(f"{node.name}: a kernel over twice the stride")
    if tail:
        # emitted: the first ``tail`` samples plus the previous call's tail, then the middle;
        # the last ``tail`` samples are owed to the next call
        name_in, name_out = b.state(channels, tail)
        head = b.node("Add", [b.slice_time(full, 0, tail), name_in])
        emitted = b.node("Concat", [head, b.slice_time(full, tail, -tail)], axis=_TIME)
        b.nodes.append(helper.make_node("Slice", [full, b.i64(-tail), b.i64(_INT64_MAX),
                                                  b.i64(_TIME)], [name_out],
                                        name=b.name("tail")))  # fmt: skip
    else:
        emitted = full
    if len(node.input) > 2 and node.input[2]:
        bias = consts.get(node.input[2])
        if bias is None:
            raise NotStreamable(f"{node.name}: a bias that is not a constant")
        b.nodes.append(helper.make_node("Add", [emitted, b.const(bias.reshape(-1, 1))],
                                        list(node.output), name=node.name))  # fmt: skip
    else:
        b.nodes.append(helper.make_node("Identity", [emitted], list(node.output), name=node.name))
    return _Timed(x.lag * stride + pads[0], x.scale * stride)


def _join(
    b: _Builder, node: onnx.NodeProto, timed: dict[str, _Timed], channels_of: Callable[[str], int]
) -> _Timed:
    if node.op_type == "Concat" and int(_attrs(node).get("axis", 0)) in (-1, 2):
        raise NotStreamable(f"{node.name}: a concat along time")
    moving = {i: timed[i] for i in node.input if i in timed}
    scales = {t.scale for t in moving.values()}
    if len(scales) != 1:
        raise NotStreamable(f"{node.name}: joins tensors at different sample rates")
    lag = max(t.lag for t in moving.values())
    inputs = list(node.input)
    for i, name in enumerate(inputs):
        if name in moving and moving[name].lag < lag:
            inputs[i] = b.delayed(name, channels_of, lag - moving[name].lag)
    out = onnx.NodeProto()
    out.CopyFrom(node)
    del out.input[:]
    out.input.extend(inputs)
    b.nodes.append(out)
    return _Timed(lag, scales.pop())


def _check_not_time(node: onnx.NodeProto, consts: dict[str, np.ndarray]) -> None:
    """A slice, split or (un)squeeze must leave the time axis alone (and last)."""
    attrs = _attrs(node)
    if node.op_type == "Split":
        axes = [int(attrs.get("axis", 0))]
    elif node.op_type == "Slice":
        axes_name = node.input[3] if len(node.input) > 3 else ""
        if not axes_name:
            raise NotStreamable(f"{node.name}: a slice over every axis")
        axes_value = consts.get(axes_name)
        if axes_value is None:
            raise NotStreamable(f"{node.name}: slice axes that are not constant")
        axes = [int(a) for a in np.ravel(axes_value)]
    else:
        axes_name = node.input[1] if len(node.input) > 1 else ""
        axes_value = consts.get(axes_name) if axes_name else None
        if axes_value is None:
            raise NotStreamable(f"{node.name}: (un)squeeze axes that are not constant")
        axes = [int(a) for a in np.ravel(axes_value)]
    beyond = node.op_type != "Unsqueeze" and any(a > 2 for a in axes)
    if beyond or any(a in (-1, 2) for a in axes):
        raise NotStreamable(f"{node.name}: {node.op_type} along the time axis")


def _live(nodes: list[onnx.NodeProto], outputs: list[str]) -> list[onnx.NodeProto]:
    """``nodes`` without those nothing reads any more (an activation a convolution now applies
    to its cached buffer instead), in their order."""
    needed = set(outputs)
    kept = []
    for node in reversed(nodes):
        if any(out in needed for out in node.output):
            kept.append(node)
            needed.update(i for i in node.input if i)
    return kept[::-1]


def _assemble(model: onnx.ModelProto, b: _Builder) -> onnx.ModelProto:
    graph = model.graph
    outputs = [o.name for o in graph.output] + [o.name for o in b.state_outputs]
    b.nodes = _live(b.nodes, outputs)
    position = helper.make_tensor_value_info(POSITION_INPUT, TensorProto.INT64, [1])
    total = helper.make_tensor_value_info(TOTAL_INPUT, TensorProto.INT64, [1])
    new_graph = helper.make_graph(
        b.nodes,
        graph.name + "_stateful",
        [*graph.input, position, total, *b.state_inputs],
        [*graph.output, *b.state_outputs],
        initializer=[*graph.initializer, *b.inits],
    )
    out = helper.make_model(new_graph, opset_imports=list(model.opset_import))
    out.ir_version = model.ir_version
    return out


def state_shapes(model: onnx.ModelProto) -> Iterator[tuple[str, int, int]]:
    """``(name, channels, length)`` of each state input, in order."""
    for value in model.graph.input:
        if value.name.startswith(STATE_IN):
            dims = value.type.tensor_type.shape.dim
            yield value.name, dims[1].dim_value, dims[2].dim_value

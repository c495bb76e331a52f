"""The stateful transform: streamed output equals one-shot output, for any call sizes.

On a small synthetic stack with every construct the voices have (dilated and padded
convolutions, a residual branch, two branches of different receptive fields summed, transposed
convolutions with an overlap-add tail, a frame mask) and on the real voice's flow and vocoder.
A transform with a misaligned branch or a missing flush must fail these checks.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ttsvc.backends.base import EngineSet, StreamingEngine, run_streamed
from ttsvc.backends.onnxruntime import OrtStreamingVocoder, flow_engine, vocoder_engine
from ttsvc.compile import stateful
from ttsvc.compile.build import default_checkpoint
from ttsvc.compile.reference import STREAM_SCHEDULES, STREAM_TOLERANCE
from ttsvc.compile.split import split_model
from ttsvc.compile.stateful import NotStreamable, make_stateful

SIZES = [(1,), (2, 5), (3, 1, 7), (64,)]


def _conv(
    nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], x: str, name: str,
    cin: int, cout: int, k: int, dilation: int = 1, transpose_stride: int = 0,
) -> str:  # fmt: skip
    rng = np.random.default_rng(len(inits))
    shape = (cin, cout, k) if transpose_stride else (cout, cin, k)
    inits.append(numpy_helper.from_array((rng.standard_normal(shape) * 0.4).astype(np.float32),
                                         f"{name}.w"))  # fmt: skip
    inits.append(numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32) * 0.1,
                                         f"{name}.b"))  # fmt: skip
    if transpose_stride:
        pad = (k - transpose_stride) // 2
        nodes.append(helper.make_node("ConvTranspose", [x, f"{name}.w", f"{name}.b"], [name],
                                      strides=[transpose_stride], pads=[pad, pad],
                                      kernel_shape=[k]))  # fmt: skip
    else:
        pad = (k - 1) * dilation // 2
        nodes.append(helper.make_node("Conv", [x, f"{name}.w", f"{name}.b"], [name],
                                      dilations=[dilation], pads=[pad, pad],
                                      kernel_shape=[k]))  # fmt: skip
    return name


def synthetic_stack() -> onnx.ModelProto:
    """frames [1, 4, T] (and a mask [1, 1, T]) -> samples [1, 1, 4 T]: the shapes of a HiFi-GAN."""
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    x = _conv(nodes, inits, "frames", "pre", 4, 6, 7)
    nodes.append(helper.make_node("Mul", [x, "mask"], ["masked"]))
    up = _conv(nodes, inits, "masked", "up1", 6, 6, 4, transpose_stride=2)
    # two residual blocks of different receptive fields, summed and averaged
    branches = []
    for i, (k, dilation) in enumerate([(3, 1), (5, 3)]):
        nodes.append(helper.make_node("LeakyRelu", [up], [f"act{i}"], alpha=0.1))
        y = _conv(nodes, inits, f"act{i}", f"res{i}", 6, 6, k, dilation)
        nodes.append(helper.make_node("Add", [y, up], [f"sum{i}"]))
        branches.append(f"sum{i}")
    nodes.append(helper.make_node("Add", branches, ["both"]))
    inits.append(numpy_helper.from_array(np.array(2.0, np.float32), "two"))
    nodes.append(helper.make_node("Div", ["both", "two"], ["mean"]))
    up2 = _conv(nodes, inits, "mean", "up2", 6, 3, 4, transpose_stride=2)
    post = _conv(nodes, inits, up2, "post", 3, 1, 3)
    nodes.append(helper.make_node("Tanh", [post], ["output"]))
    graph = helper.make_graph(
        nodes, "stack",
        [helper.make_tensor_value_info("frames", TensorProto.FLOAT, [1, 4, "T"]),
         helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 1, "T"])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 1, "S"])],
        initializer=inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)], ir_version=8)


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


class _MaskedStack(OrtStreamingVocoder):
    """The synthetic stack as a stateful engine: its mask is one inside the sentence."""

    def _feed(self, inputs: np.ndarray, carry: object) -> dict[str, np.ndarray]:
        total, position = carry.total, carry.position  # type: ignore[attr-defined]
        mask = np.zeros((1, 1, inputs.shape[-1]), np.float32)
        mask[..., : max(0, min(inputs.shape[-1], total - position))] = 1.0
        return {"frames": np.ascontiguousarray(inputs), "mask": mask}


def _stack_error(model: onnx.ModelProto, x: np.ndarray) -> float:
    whole = _session(model).run(None, {"frames": x, "mask": np.ones((1, 1, x.shape[2]),
                                                                    np.float32)})[0]  # fmt: skip
    engine = _MaskedStack(_session(make_stateful(model, ("frames", "mask")).model))
    return max(float(np.max(np.abs(run_streamed(engine, x, sizes) - whole.reshape(-1))))
               for sizes in SIZES)  # fmt: skip


@pytest.fixture(scope="module")
def stack_input() -> np.ndarray:
    return np.random.default_rng(7).standard_normal((1, 4, 37)).astype(np.float32)


def test_synthetic_stack_streams_exactly(stack_input: np.ndarray) -> None:
    graph = make_stateful(synthetic_stack(), ("frames", "mask"))
    # lag: pre 3 frames -> x2 + 1 (up1) = 7, res1 right 6 -> 13, x2 + 1 (up2) = 27, post 1 -> 28
    assert (graph.lag, graph.scale, graph.flush_frames) == (28, 4, 7)
    assert _stack_error(synthetic_stack(), stack_input) < 1e-5


@contextmanager
def _sabotaged(name: str, replacement: object) -> Iterator[None]:
    original = getattr(stateful._Builder, name)
    setattr(stateful._Builder, name, replacement)
    try:
        yield
    finally:
        setattr(stateful._Builder, name, original)


def test_a_misaligned_branch_is_caught(stack_input: np.ndarray) -> None:
    """Without delays the residual and the averaged branches join out of step."""

    def no_delay(self: stateful._Builder, x: str, channels_of: object, frames: int) -> str:
        return x

    with _sabotaged("delayed", no_delay):
        assert _stack_error(synthetic_stack(), stack_input) > 1e-2


def test_a_delay_one_frame_short_is_caught(stack_input: np.ndarray) -> None:
    """Off by one in the residual's delay (taken from the convolution's buffer): caught."""
    original = stateful._Builder.delayed

    def short(self: stateful._Builder, x: str, channels_of: object, frames: int) -> str:
        return original(self, x, channels_of, frames - 1) if frames > 1 else x  # type: ignore[arg-type]

    with _sabotaged("delayed", short):
        assert _stack_error(synthetic_stack(), stack_input) > 1e-2


def test_a_missing_mask_at_the_edges_is_caught(stack_input: np.ndarray) -> None:
    """Without the mask, layers see their neighbours' garbage where one-shot sees padding."""

    def no_mask(self: stateful._Builder, x: str, timed: object) -> str:
        return x

    with _sabotaged("mask", no_mask):
        assert _stack_error(synthetic_stack(), stack_input) > 1e-2


def test_a_missing_flush_is_caught(stack_input: np.ndarray) -> None:
    model = synthetic_stack()
    feed = {"frames": stack_input, "mask": np.ones((1, 1, 37), np.float32)}
    whole = _session(model).run(None, feed)[0].reshape(-1)
    engine = _MaskedStack(_session(make_stateful(model, ("frames", "mask")).model))
    engine.lag = 0  # a caller that believes there is nothing to flush
    out = run_streamed(engine, stack_input, (5,))
    assert np.max(np.abs(out - whole)) > 1e-2


def _with_node(model: onnx.ModelProto, index: int, node: onnx.NodeProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.node[index].CopyFrom(node)
    return out


def test_what_cannot_be_made_exact_is_refused() -> None:
    model = synthetic_stack()
    strided = helper.make_node("Conv", ["frames", "pre.w", "pre.b"], ["pre"], strides=[2],
                               pads=[3, 3], kernel_shape=[7])  # fmt: skip
    with pytest.raises(NotStreamable, match="strided"):
        make_stateful(_with_node(model, 0, strided), ("frames", "mask"))
    shortened = helper.make_node("Conv", ["frames", "pre.w", "pre.b"], ["pre"], pads=[0, 0],
                                 kernel_shape=[7])  # fmt: skip
    with pytest.raises(NotStreamable, match="length"):
        make_stateful(_with_node(model, 0, shortened), ("frames", "mask"))
    cumulative = helper.make_node("CumSum", ["masked", "axis"], ["up1"])
    sums = _with_node(model, 2, cumulative)
    sums.graph.initializer.append(numpy_helper.from_array(np.array(2, np.int64), "axis"))
    with pytest.raises(NotStreamable, match="CumSum"):
        make_stateful(sums, ("frames", "mask"))


@pytest.fixture(scope="module")
def voice_engines() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    model, _ = default_checkpoint()
    split = split_model(onnx.load(str(model)))
    assert split.flow is not None
    return split.flow, split.vocoder


def test_voice_vocoder_streams_exactly(
    voice_engines: tuple[onnx.ModelProto, onnx.ModelProto], engine_set: EngineSet
) -> None:
    """The transform on the packaged voice's vocoder, from the graph (not the published file)."""
    latents = engine_set.acoustic.latents(np.array([[1, 0, 41, 0, 120, 0, 59, 0, 21, 0, 88, 0,
                                                     16, 0, 2]], np.int64),
                                          np.array([0.0, 1.0, 0.0], np.float32))  # fmt: skip
    frames = engine_set.flow.frames(latents) if engine_set.flow is not None else latents
    plain = vocoder_engine(_session(voice_engines[1]))
    whole = plain.waveform(frames)
    graph = make_stateful(voice_engines[1], ("frames",))
    engine = vocoder_engine(_session(graph.model))
    assert isinstance(engine, StreamingEngine) and graph.scale == 256
    for sizes in STREAM_SCHEDULES:
        assert np.max(np.abs(run_streamed(engine, frames, sizes) - whole)) < 1e-5, sizes
    flow = flow_engine(_session(make_stateful(voice_engines[0], ("latents", "mask")).model))
    assert isinstance(flow, StreamingEngine) and flow.lag == 32
    for sizes in STREAM_SCHEDULES:
        streamed = run_streamed(flow, latents, sizes)
        assert np.max(np.abs(plain.waveform(streamed) - whole)) <= STREAM_TOLERANCE, sizes

"""One TensorRT plan from one ONNX engine graph: the builder side of TensorRT (``ttsvc compile``).

Compile time only: ``compile/trt.py`` decides which engines become plans, with which profiles,
precision and timing cache, and calls ``build_plan`` for each; this module holds what talks to
TensorRT's builder (parsing, the optimization profile, FP16 with overflow-prone layers pinned to
FP32). Workers never import it: running plans is ``backends/tensorrt.py``. TensorRT itself is
imported lazily, through ``backends/gpu.py``, as the runtime imports it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from ttsvc.backends import gpu
from ttsvc.compile.profiles import TensorProfile
from ttsvc.errors import GraphShapeError

WORKSPACE_BYTES = 2 << 30
"""Builder scratch per plan: enough for HiFi-GAN tactics at batch 8 x 800 frames."""

FP32_LAYER_TYPES = frozenset({"REDUCE", "NORMALIZATION", "SOFTMAX"})
FP32_UNARY_OPS = frozenset({"EXP", "LOG", "SQRT", "ERF", "RECIP"})
FP32_ACTIVATIONS = frozenset({"SOFTPLUS"})
FP32_ELEMENTWISE_OPS = frozenset({"POW", "DIV"})


def keeps_fp32(layer_type: str, op: str | None) -> bool:
    """Whether a layer stays in FP32 in an FP16 plan.

    FP16 overflows above 65504 and loses small values: the layers that can do that here are
    reductions and normalisation (layer norm's mean of squares, its division and square root),
    softmax, ``exp`` (the duration predictor's ``exp(logw)`` and the flow's scales), softplus and
    ``pow``. They are a small share of the work; convolutions, the bulk of the flow and
    HiFi-GAN, run in FP16. Pinned per layer with ``OBEY_PRECISION_CONSTRAINTS``, so TensorRT
    cannot override the choice for speed.
    """
    if layer_type in FP32_LAYER_TYPES:
        return True
    if layer_type == "UNARY":
        return op in FP32_UNARY_OPS
    if layer_type == "ACTIVATION":
        return op in FP32_ACTIVATIONS
    if layer_type == "ELEMENTWISE":
        return op in FP32_ELEMENTWISE_OPS
    return False


FP32_ONNX_OPS = frozenset({
    "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2",
    "ReduceSumSquare", "ReduceLogSumExp", "LayerNormalization", "InstanceNormalization",
    "Softmax", "LogSoftmax", "Exp", "Log", "Sqrt", "Erf", "Reciprocal", "Softplus", "Pow", "Div",
})  # fmt: skip
"""``keeps_fp32``'s layers as the ONNX operators they are parsed from (TensorRT 11 path)."""


def strongly_typed(trt: Any) -> bool:
    """Whether this TensorRT only builds strongly typed networks (11 and later).

    TensorRT 11 removed weak typing: ``BuilderFlag.FP16`` and ``OBEY_PRECISION_CONSTRAINTS``
    are gone, and a network computes in the types its graph declares. FP16 then has to be in
    the ONNX graph itself (``fp16_graph``); TensorRT 10 still takes the flags and per-layer
    precision (``_pin_fp32_layers``)."""
    return not hasattr(trt.BuilderFlag, "FP16")


def fp16_graph(onnx_model: bytes) -> bytes:
    """The graph computing in FP16 except the overflow-prone operators ``keeps_fp32`` names,
    with FP32 inputs and outputs (casts at the edges), for a strongly typed TensorRT build.

    The same split of precision as the TensorRT 10 build, expressed in the graph instead of in
    builder flags (``onnxconverter-common``'s converter, from the ``trt`` extra)."""
    import onnx  # noqa: PLC0415 - compile time only
    from onnxconverter_common import float16  # noqa: PLC0415 - the trt extra

    model = onnx.load_from_string(onnx_model)
    with warnings.catch_warnings():  # weights below FP16's range are clamped, which it says
        warnings.simplefilter("ignore", UserWarning)
        converted = float16.convert_float_to_float16(
            model, keep_io_types=True, op_block_list=sorted(FP32_ONNX_OPS)
        )
    return bytes(converted.SerializeToString())


def _pin_fp32_layers(trt: Any, network: Any) -> int:
    """Mark the layers ``keeps_fp32`` selects as FP32 (precision and outputs); returns how many."""
    typed = {
        "UNARY": trt.IUnaryLayer,
        "ACTIVATION": trt.IActivationLayer,
        "ELEMENTWISE": trt.IElementWiseLayer,
    }
    floats = {trt.float32, trt.float16}
    pinned = 0
    for index in range(network.num_layers):
        layer = network.get_layer(index)
        kind = str(layer.type.name)
        op: str | None = None
        if kind in typed:
            layer.__class__ = typed[kind]  # TensorRT's Python idiom to reach the subclass fields
            op = str((layer.type if kind == "ACTIVATION" else layer.op).name)
        if not keeps_fp32(kind, op):
            continue
        if not all(layer.get_output(i).dtype in floats for i in range(layer.num_outputs)):
            continue  # shape or index arithmetic: not a precision question
        layer.precision = trt.float32
        for i in range(layer.num_outputs):
            layer.set_output_type(i, trt.float32)
        pinned += 1
    return pinned


@dataclass(frozen=True)
class BuiltPlan:
    """A serialized plan and what building it left behind."""

    plan: bytes
    timing_cache: bytes
    """The builder's timing cache after this build: reused by the next one (minutes saved)."""
    fp32_layers: int
    """Layers pinned to FP32 in an FP16 plan."""



def build_plan(
    onnx_model: bytes,
    profiles: list[TensorProfile],
    *,
    fp16: bool,
    timing_cache: bytes | None,
    workspace_bytes: int = WORKSPACE_BYTES,
) -> BuiltPlan:
    """Parse one ONNX engine and build a serialized plan with one optimization profile."""
    trt = gpu.import_trt()
    logger = gpu.trt_logger()
    typed = strongly_typed(trt)
    if fp16 and typed:
        onnx_model = fp16_graph(onnx_model)
    builder = trt.Builder(logger)
    # explicit batch is the only mode since TensorRT 10; 11 makes every network strongly typed
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_model):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise GraphShapeError(f"TensorRT could not parse the graph: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    pinned = 0
    if fp16 and not typed:
        config.set_flag(trt.BuilderFlag.FP16)
        config.set_flag(trt.BuilderFlag.OBEY_PRECISION_CONSTRAINTS)
        pinned = _pin_fp32_layers(trt, network)
    profile = builder.create_optimization_profile()
    by_name = {p.name: p for p in profiles}
    for index in range(network.num_inputs):
        tensor = network.get_input(index)
        wanted = by_name.get(tensor.name)
        if wanted is None:
            raise GraphShapeError(f"no optimization profile for input {tensor.name!r}")
        if any(d < 0 for d in tensor.shape):  # static inputs (scales [3]) take no profile
            profile.set_shape(tensor.name, wanted.min, wanted.opt, wanted.max)
    config.add_optimization_profile(profile)
    cache = config.create_timing_cache(timing_cache or b"")
    config.set_timing_cache(cache, False)  # a cache from another GPU/TensorRT is refused
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise GraphShapeError("TensorRT could not build a plan (see its log above)")
    return BuiltPlan(bytes(serialized), bytes(cache.serialize()), pinned)

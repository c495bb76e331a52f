"""`ttsvc compile --backend trt` on a machine without TensorRT or a GPU, and the parts of the
TensorRT build that need neither: the batch-axis export (checked with ONNX Runtime), the FP32
layer choice, where the timing cache lives."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from ttsvc.backends import gpu
from ttsvc.compile import trt_plan
from ttsvc.compile.build import compile_voice, default_checkpoint
from ttsvc.compile.inputs import CompileOptions
from ttsvc.compile.split import BATCH_AXIS, split_model, with_batch_axis
from ttsvc.compile.trt import TIMING_CACHE_PREFIX, check_trt_options, timing_cache_path
from ttsvc.errors import BackendUnavailable, GraphShapeError, InvalidParameter
from ttsvc.repository.layout import EngineRepository
from ttsvc.repository.watcher import relevant

HAVE_TENSORRT = gpu.tensorrt_installed()


@pytest.fixture(scope="module")
def split() -> Any:
    model, _ = default_checkpoint()
    return split_model(onnx.load(str(model)), "flow")


@pytest.mark.skipif(HAVE_TENSORRT, reason="TensorRT installed: this checks the refusal without it")
def test_cli_without_tensorrt_exits_1_with_the_reason(tmp_path: Path) -> None:
    env = {**os.environ, "TTSVC_ENGINES_DIR": str(tmp_path / "engines")}
    done = subprocess.run(
        [sys.executable, "-m", "ttsvc.cli", "compile", "--backend", "trt", "--quantize", "fp16",
         "--max-batch", "8", "--seq-len", "512"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert "ttsvc compile: TensorRT is not installed" in done.stderr
    assert "pip install 'ttsvc[trt]'" in done.stderr and "--backend ort" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "engines").exists()  # refused before any work


def test_refusal_is_in_the_error_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_trt() -> Any:
        raise BackendUnavailable(gpu.NO_TENSORRT)

    monkeypatch.setattr(gpu, "import_trt", no_trt)
    model, config = default_checkpoint()
    opts = CompileOptions(model, config, tmp_path, "v", quantize="fp16", max_batch=8,
                          backend="trt")  # fmt: skip
    with pytest.raises(BackendUnavailable) as err:
        compile_voice(opts)
    assert err.value.status == 501 and err.value.type == "backend_unavailable"
    assert not any(tmp_path.iterdir())


class FakeCudartNoGpu:
    """cuda-python's runtime module as it answers on a machine with no usable GPU (the one
    thing this test cannot have for real is the GPU)."""

    class cudaError_t:  # mirrors cuda-python's names
        cudaSuccess = types.SimpleNamespace(name="cudaSuccess")
        cudaErrorNoDevice = types.SimpleNamespace(name="cudaErrorNoDevice")

    def __init__(self, count: int, error: Any = None) -> None:
        self._count, self._error = count, error or self.cudaError_t.cudaSuccess

    def cudaGetDeviceCount(self) -> tuple[Any, int]:
        return self._error, self._count


@pytest.mark.parametrize(
    ("count", "error", "detail"),
    [(0, "cudaErrorNoDevice", "cudaErrorNoDevice"), (0, None, "0 devices")],
)
def test_no_gpu_is_refused_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, count: int, error: str | None, detail: str
) -> None:
    fake = FakeCudartNoGpu(count, getattr(FakeCudartNoGpu.cudaError_t, error) if error else None)
    monkeypatch.setattr(gpu, "import_trt", lambda: types.SimpleNamespace(__version__="10.0"))
    monkeypatch.setattr(gpu, "import_cudart", lambda: fake)
    with pytest.raises(BackendUnavailable, match=f"no CUDA GPU is visible \\({detail}\\)"):
        check_trt_options("fp16", 8, 512)


def test_missing_cuda_python_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cuda", None)  # makes `import cuda...` fail here
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    with pytest.raises(BackendUnavailable, match="cuda-python is not installed"):
        gpu.import_cudart()


def test_int8_and_bad_limits_are_refused_before_looking_for_a_gpu() -> None:
    with pytest.raises(InvalidParameter, match="int8"):
        check_trt_options("int8", 8, 512)
    with pytest.raises(InvalidParameter, match="max-batch"):
        check_trt_options("fp16", 0, 512)


@pytest.mark.parametrize("stage", ["flow", "vocoder"])
def test_batch_axis_export_runs_batches_equal_to_single_runs(split: Any, stage: str) -> None:
    """The re-axised split graph (what TensorRT parses) run with ONNX Runtime: a batch of two
    windows equals the two windows run alone."""
    model = with_batch_axis(getattr(split, stage))
    for value in [*model.graph.input, *model.graph.output]:
        assert value.type.tensor_type.shape.dim[0].dim_param == BATCH_AXIS
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 192, 40)).astype(np.float32)
    feeds = {"frames": x} if stage == "vocoder" else {
        "latents": x, "mask": np.ones((2, 1, 40), np.float32)}  # fmt: skip
    both = session.run(None, feeds)[0]
    assert both.shape[0] == 2
    for i in range(2):
        alone = session.run(None, {k: v[i : i + 1] for k, v in feeds.items()})[0]
        np.testing.assert_allclose(both[i : i + 1], alone, atol=1e-5)


def test_batch_axis_refuses_a_sentence_level_graph(split: Any) -> None:
    with pytest.raises(GraphShapeError, match="not a frame-local engine"):
        with_batch_axis(split.acoustic)


def test_batch_axis_replaces_a_fixed_batch_of_one() -> None:
    x = helper.make_tensor_value_info("frames", TensorProto.FLOAT, [1, 4, 8])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 4, 8])
    graph = helper.make_graph([helper.make_node("Relu", ["frames"], ["output"])], "g", [x], [y])
    fixed = with_batch_axis(helper.make_model(graph))
    session = ort.InferenceSession(fixed.SerializeToString(), providers=["CPUExecutionProvider"])
    out = session.run(None, {"frames": -np.ones((3, 4, 8), np.float32)})[0]
    assert out.shape == (3, 4, 8) and not out.any()


@pytest.mark.parametrize(
    ("layer", "op", "fp32"),
    [("REDUCE", None, True), ("NORMALIZATION", None, True), ("SOFTMAX", None, True),
     ("UNARY", "EXP", True), ("UNARY", "SQRT", True), ("UNARY", "ABS", False),
     ("ACTIVATION", "SOFTPLUS", True), ("ACTIVATION", "LEAKY_RELU", False),
     ("ELEMENTWISE", "POW", True), ("ELEMENTWISE", "SUM", False),
     ("CONVOLUTION", None, False), ("DECONVOLUTION", None, False)],
)  # fmt: skip
def test_layers_kept_in_fp32(layer: str, op: str | None, fp32: bool) -> None:
    assert trt_plan.keeps_fp32(layer, op) is fp32


def test_tensorrt_11_is_told_from_10_by_its_missing_weak_typing() -> None:
    ten = types.SimpleNamespace(BuilderFlag=types.SimpleNamespace(FP16=1, TF32=2))
    eleven = types.SimpleNamespace(BuilderFlag=types.SimpleNamespace(TF32=2))
    assert not trt_plan.strongly_typed(ten) and trt_plan.strongly_typed(eleven)


@pytest.mark.parametrize("stage", ["flow", "vocoder", "acoustic"])
def test_fp16_graph_keeps_the_edges_and_overflow_prone_ops_in_fp32(split: Any, stage: str) -> None:
    """TensorRT 11's FP16: the precision is the graph's. Convolutions in FP16, the operators
    ``keeps_fp32`` names (exp, div, reductions ...) and the inputs and outputs in FP32."""
    graph = getattr(split, stage)
    converted = onnx.load_from_string(trt_plan.fp16_graph(graph.SerializeToString()))
    assert [i.type.tensor_type.elem_type for i in converted.graph.input] == [
        i.type.tensor_type.elem_type for i in graph.graph.input]  # fmt: skip
    assert {o.type.tensor_type.elem_type for o in converted.graph.output} <= {
        TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64}  # fmt: skip
    inferred = onnx.shape_inference.infer_shapes(converted)
    types_of = {v.name: v.type.tensor_type.elem_type for v in inferred.graph.value_info}
    ops = {"Conv": TensorProto.FLOAT16,
           **dict.fromkeys(trt_plan.FP32_ONNX_OPS, TensorProto.FLOAT)}  # fmt: skip
    seen = set()
    for node in converted.graph.node:
        floats = (TensorProto.FLOAT, TensorProto.FLOAT16)  # not shape or index arithmetic
        if node.op_type in ops and types_of.get(node.output[0]) in floats:
            assert types_of[node.output[0]] == ops[node.op_type], (node.op_type, node.name)
            seen.add(node.op_type)
    assert "Conv" in seen


def test_timing_cache_is_hidden_from_the_repository_and_the_watcher(tmp_path: Path) -> None:
    fingerprint = {"tensorrt": "10.3.0", "compute_capability": "8.9", "gpu": "NVIDIA L4"}
    path = timing_cache_path(tmp_path / "voice", fingerprint)
    assert path.name.startswith(TIMING_CACHE_PREFIX) and path.name.startswith(".")
    assert path != timing_cache_path(tmp_path / "voice", {**fingerprint, "tensorrt": "10.4.0"})
    path.parent.mkdir()
    path.write_bytes(b"cache")
    assert EngineRepository(tmp_path).versions("voice") == []
    assert not relevant(None, str(path))  # type: ignore[arg-type]

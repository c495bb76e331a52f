"""Whether this process can use TensorRT on an NVIDIA GPU, and what a plan built here is for.

The probe shared by the compiler's plan builder (``compile/trt_plan.py``) and the worker runtime
(``tensorrt.py``): the lazy imports of ``tensorrt`` and ``cuda`` (cuda-python), the one place
either is imported, and only inside functions, so importing ttsvc never needs them and every
path that does need them fails first with a ``BackendUnavailable`` saying what is missing; the
device query, the fingerprint a plan is specific to (TensorRT release, GPU architecture) and
its check on loading, with the ``ttsvc compile`` line that rebuilds a refused plan; the
TensorRT logger both sides pass to TensorRT.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ttsvc.errors import BackendUnavailable, EngineError
from ttsvc.repository.manifest import Manifest

NO_TENSORRT = (
    "TensorRT is not installed: --backend trt needs an NVIDIA GPU with TensorRT 10 and "
    "cuda-python (`pip install 'ttsvc[trt]'`, TensorRT wheels come from NVIDIA's package index). "
    "Use --backend ort on machines without them."
)
NO_CUDA_PYTHON = (
    "cuda-python is not installed: the TensorRT backend moves buffers with it "
    "(`pip install 'ttsvc[trt]'`)."
)
NO_GPU = (
    "no CUDA GPU is visible ({detail}): TensorRT plans are built and run on the GPU they are "
    "meant for. Run on an NVIDIA machine (check `nvidia-smi`, CUDA_VISIBLE_DEVICES) or use "
    "--backend ort."
)


# ---------------------------------------------------------------------------------------------
# Imports and CUDA calls


def import_trt() -> Any:
    try:
        import tensorrt  # noqa: PLC0415 - optional, GPU machines only
    except ImportError as exc:
        raise BackendUnavailable(NO_TENSORRT) from exc
    return tensorrt


def import_cudart() -> Any:
    try:
        from cuda.bindings import runtime  # noqa: PLC0415 - cuda-python >= 12.6 layout
    except ImportError:
        try:
            from cuda import cudart as runtime  # noqa: PLC0415 - older cuda-python layout
        except ImportError as exc:
            raise BackendUnavailable(NO_CUDA_PYTHON) from exc
    return runtime


def cuda(result: Any, what: str) -> Any:
    """Unpack a cuda-python call's ``(error, *values)``; raise an engine error naming the call."""
    cudart = import_cudart()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cudart.cudaError_t.cudaSuccess:
        raise EngineError(f"CUDA {what} failed: {getattr(err, 'name', err)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


@functools.cache
def trt_logger() -> Any:
    """The process's TensorRT logger (warnings and errors), shared by builder and runtime."""
    trt = import_trt()
    return trt.Logger(trt.Logger.WARNING)


# ---------------------------------------------------------------------------------------------
# The device and a plan's fingerprint


@dataclass(frozen=True)
class GpuInfo:
    """The GPU this process runs on (device 0), as a plan's fingerprint records it."""

    name: str
    compute_capability: str
    cuda_runtime: str
    cuda_driver: str


def _cuda_version(number: int) -> str:
    return f"{number // 1000}.{(number % 1000) // 10}"


def gpu_info() -> GpuInfo:
    """Device 0's name and compute capability, and the CUDA versions; refuses without a GPU."""
    cudart = import_cudart()
    err, count = cudart.cudaGetDeviceCount()
    if err != cudart.cudaError_t.cudaSuccess:  # no driver, no device node, driver too old
        raise BackendUnavailable(NO_GPU.format(detail=getattr(err, "name", str(err))))
    if count < 1:
        raise BackendUnavailable(NO_GPU.format(detail="0 devices"))
    props = cuda(cudart.cudaGetDeviceProperties(0), "cudaGetDeviceProperties")
    name = props.name.decode() if isinstance(props.name, bytes) else str(props.name)
    runtime = cuda(cudart.cudaRuntimeGetVersion(), "cudaRuntimeGetVersion")
    driver = cuda(cudart.cudaDriverGetVersion(), "cudaDriverGetVersion")
    return GpuInfo(
        name=name.rstrip("\x00"),
        compute_capability=f"{props.major}.{props.minor}",
        cuda_runtime=_cuda_version(int(runtime)),
        cuda_driver=_cuda_version(int(driver)),
    )


def tensorrt_installed() -> bool:
    """Whether the ``tensorrt`` package can be imported (without importing it)."""
    return importlib.util.find_spec("tensorrt") is not None


def gpu_unavailable_reason() -> str | None:
    """Why TensorRT plans cannot be built or run here, or ``None`` when they can (tests, tools)."""
    try:
        require_gpu()
    except BackendUnavailable as exc:
        return exc.message
    return None


def require_gpu() -> GpuInfo:
    """Check TensorRT, cuda-python and a GPU are all present, naming the first that is not."""
    import_trt()
    return gpu_info()


def trt_fingerprint() -> dict[str, str]:
    """What a serialized plan is specific to: the TensorRT release and the GPU architecture."""
    trt = import_trt()
    gpu = gpu_info()
    return {
        "tensorrt": str(trt.__version__),
        "cuda_runtime": gpu.cuda_runtime,
        "compute_capability": gpu.compute_capability,
        "gpu": gpu.name,
    }


def check_trt_fingerprint(directory: Path, manifest: Manifest, here: dict[str, str]) -> None:
    """Refuse plans built for another TensorRT release or GPU architecture.

    A plan holds kernels chosen for one compute capability and is serialized in one TensorRT
    release's format; deserializing it elsewhere fails inside TensorRT or, worse, runs slowly.
    The CUDA version is recorded for the operator but not compared: TensorRT checks its own needs.
    """
    built = manifest.runtime
    wrong = [
        f"{key} {built.get(key)!r} (this machine: {here[key]!r})"
        for key in ("tensorrt", "compute_capability")
        if built.get(key) != here[key]
    ]
    if wrong:
        raise EngineError(
            f"{directory}: TensorRT plans built for another machine: {'; '.join(wrong)}. "
            f"Rebuild them here with `{rebuild_command(manifest)}`"
        )


def rebuild_command(manifest: Manifest) -> str:
    """The ``ttsvc compile`` line that rebuilds ``manifest``'s plans with the same flags."""
    # no acoustic profile when the acoustic engine stayed on ONNX Runtime: the CLI default
    seq_len = manifest.profiles.get("acoustic", {}).get("input", [[1, 512]] * 3)[2][-1]
    fp16 = "fp16" if "fp16" in manifest.precision.values() else "fp32"
    return (
        f"ttsvc compile --backend trt --quantize {fp16} --max-batch {manifest.max_batch} "
        f"--seq-len {seq_len} --split-at {manifest.split_at} --voice {manifest.voice} "
        "--checkpoint <voice.onnx>"
    )

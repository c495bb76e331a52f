"""TensorRT on an NVIDIA GPU: build serialized plans (``ttsvc compile``) and run them (workers).

The only module that imports ``tensorrt`` and ``cuda`` (cuda-python), and only inside functions:
importing ttsvc never needs them, and every path that does need them fails first with a
``BackendUnavailable`` saying what is missing. Written against the TensorRT 10 Python API
(``create_network(0)`` is explicit batch, ``execute_async_v3`` with tensor addresses) and
cuda-python's runtime bindings; see docs/gpu.md for what was verified where.

Lifetimes, per worker process:

* one ``trt.Runtime`` (a lazily created module singleton): the seed's lesson was that creating a
  runtime per load and deserializing repeatedly leaks device memory;
* each plan is deserialized once per content (``_ENGINES``, keyed by the plan's sha256 and held
  only while an engine set uses it, so a hot swap frees the old version when its last stream ends);
* one execution context per concurrent caller ("stream slot"), each with its own CUDA stream and
  device buffers that grow and are reused. The worker's compute thread is one caller, however
  many streams it batches into a call; a candidate staged for a hot swap is another.

The untyped TensorRT and CUDA objects stay inside the small classes below (``Any`` does not leak
into their signatures).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import queue
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ttsvc.backends.base import (
    DURATIONS_OUTPUT,
    EngineSet,
    EngineSource,
    FloatArray,
    IntArray,
    SentenceRun,
    run_in_windows,
)
from ttsvc.compile.profiles import TensorProfile
from ttsvc.errors import BackendUnavailable, EngineError, GraphShapeError, TextTooLong
from ttsvc.repository.manifest import Manifest
from ttsvc.voice import VOICE_FILE, VoiceConfig

ACOUSTIC_PLAN = "acoustic.plan"
FLOW_PLAN = "flow.plan"
VOCODER_PLAN = "vocoder.plan"
WORKSPACE_BYTES = 2 << 30
"""Builder scratch per plan: enough for HiFi-GAN tactics at batch 8 x 800 frames."""

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


def _import_trt() -> Any:
    try:
        import tensorrt  # noqa: PLC0415 - optional, GPU machines only
    except ImportError as exc:
        raise BackendUnavailable(NO_TENSORRT) from exc
    return tensorrt


def _import_cudart() -> Any:
    try:
        from cuda.bindings import runtime  # noqa: PLC0415 - cuda-python >= 12.6 layout
    except ImportError:
        try:
            from cuda import cudart as runtime  # noqa: PLC0415 - older cuda-python layout
        except ImportError as exc:
            raise BackendUnavailable(NO_CUDA_PYTHON) from exc
    return runtime


def _cuda(result: Any, what: str) -> Any:
    """Unpack a cuda-python call's ``(error, *values)``; raise an engine error naming the call."""
    cudart = _import_cudart()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cudart.cudaError_t.cudaSuccess:
        raise EngineError(f"CUDA {what} failed: {getattr(err, 'name', err)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


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
    cudart = _import_cudart()
    err, count = cudart.cudaGetDeviceCount()
    if err != cudart.cudaError_t.cudaSuccess:  # no driver, no device node, driver too old
        raise BackendUnavailable(NO_GPU.format(detail=getattr(err, "name", str(err))))
    if count < 1:
        raise BackendUnavailable(NO_GPU.format(detail="0 devices"))
    props = _cuda(cudart.cudaGetDeviceProperties(0), "cudaGetDeviceProperties")
    name = props.name.decode() if isinstance(props.name, bytes) else str(props.name)
    runtime = _cuda(cudart.cudaRuntimeGetVersion(), "cudaRuntimeGetVersion")
    driver = _cuda(cudart.cudaDriverGetVersion(), "cudaDriverGetVersion")
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
    _import_trt()
    return gpu_info()


def trt_fingerprint() -> dict[str, str]:
    """What a serialized plan is specific to: the TensorRT release and the GPU architecture."""
    trt = _import_trt()
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


# ---------------------------------------------------------------------------------------------
# Building plans (ttsvc compile)

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


@functools.cache
def _trt_logger() -> Any:
    trt = _import_trt()
    return trt.Logger(trt.Logger.WARNING)


def build_plan(
    onnx_model: bytes,
    profiles: list[TensorProfile],
    *,
    fp16: bool,
    timing_cache: bytes | None,
    workspace_bytes: int = WORKSPACE_BYTES,
) -> BuiltPlan:
    """Parse one ONNX engine and build a serialized plan with one optimization profile."""
    trt = _import_trt()
    logger = _trt_logger()
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # TensorRT 10: explicit batch is the only mode
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_model):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise GraphShapeError(f"TensorRT could not parse the graph: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    pinned = 0
    if fp16:
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


# ---------------------------------------------------------------------------------------------
# Running plans (workers)

_RUNTIME_LOCK = threading.Lock()
_RUNTIME: list[Any] = []
"""The process's one ``trt.Runtime`` (a one-element list: created on first use, never again)."""
_ENGINES: weakref.WeakValueDictionary[str, TrtEngine] = weakref.WeakValueDictionary()
"""Deserialized plans by sha256, alive while an engine set holds them."""


def trt_runtime() -> Any:
    """The process-wide ``trt.Runtime``, created on first use."""
    with _RUNTIME_LOCK:
        if not _RUNTIME:
            _RUNTIME.append(_import_trt().Runtime(_trt_logger()))
        return _RUNTIME[0]


class DeviceBuffer:
    """GPU memory that grows on demand and is reused across calls; freed explicitly."""

    def __init__(self) -> None:
        self.ptr = 0
        self.nbytes = 0

    def ensure(self, nbytes: int) -> int:
        """A device pointer with at least ``nbytes`` (never a null pointer, even for 0)."""
        if nbytes > self.nbytes or self.ptr == 0:
            self.free()
            size = max(nbytes, 256)
            self.ptr = int(_cuda(_import_cudart().cudaMalloc(size), "cudaMalloc"))
            self.nbytes = size
        return self.ptr

    def free(self) -> None:
        if self.ptr:
            _cuda(_import_cudart().cudaFree(self.ptr), "cudaFree")
            self.ptr, self.nbytes = 0, 0


@functools.cache
def _allocator_class() -> type[Any]:
    """An ``IOutputAllocator`` subclass (defined lazily: TensorRT is imported only here).

    Every output goes through it, the acoustic plan's data-dependent latents (their frame count
    comes from the predicted durations) as much as the frame plans' outputs, so one code path
    serves all three: TensorRT asks for the bytes it needs and reports the shape it produced.
    """
    trt = _import_trt()
    base: Any = trt.IOutputAllocator

    class GrowingOutputAllocator(base):  # type: ignore[misc]
        def __init__(self) -> None:
            base.__init__(self)
            self.buffers: dict[str, DeviceBuffer] = {}
            self.shapes: dict[str, tuple[int, ...]] = {}

        def reallocate_output(
            self, tensor_name: str, memory: Any, size: int, alignment: int
        ) -> int:
            return self.buffers.setdefault(tensor_name, DeviceBuffer()).ensure(size)

        def reallocate_output_async(
            self, tensor_name: str, memory: Any, size: int, alignment: int, stream: Any
        ) -> int:
            return self.reallocate_output(tensor_name, memory, size, alignment)

        def notify_shape(self, tensor_name: str, shape: Any) -> None:
            self.shapes[tensor_name] = tuple(int(d) for d in shape)

    return GrowingOutputAllocator


class _ExecutionSlot:
    """One execution context, its CUDA stream and device buffers; one caller at a time."""

    def __init__(self, engine: Any, io: _TensorIO) -> None:
        cudart = _import_cudart()
        self._cudart = cudart
        self.io = io
        self.context = engine.create_execution_context()
        if self.context is None:
            raise EngineError("TensorRT could not create an execution context (device memory?)")
        self.stream = _cuda(cudart.cudaStreamCreate(), "cudaStreamCreate")
        self.inputs = {name: DeviceBuffer() for name in io.inputs}
        self.allocator = _allocator_class()()
        for name in io.outputs:
            self.context.set_output_allocator(name, self.allocator)

    def run(self, feeds: dict[str, npt.NDArray[Any]]) -> dict[str, npt.NDArray[Any]]:
        cudart = self._cudart
        staged = []  # host arrays must outlive their asynchronous copies
        for name in self.io.inputs:
            host = np.ascontiguousarray(feeds[name], dtype=self.io.dtypes[name])
            if not self.context.set_input_shape(name, host.shape):
                raise EngineError(f"input {name} {host.shape} is outside the plan's profile")
            ptr = self.inputs[name].ensure(host.nbytes)
            _cuda(cudart.cudaMemcpyAsync(ptr, host.ctypes.data, host.nbytes,
                                         cudart.cudaMemcpyKind.cudaMemcpyHostToDevice,
                                         self.stream), "cudaMemcpyAsync to the device")  # fmt: skip
            self.context.set_tensor_address(name, ptr)
            staged.append(host)
        if not self.context.execute_async_v3(int(self.stream)):
            raise EngineError("TensorRT execute_async_v3 failed (see its log)")
        outputs: dict[str, npt.NDArray[Any]] = {}
        for name in self.io.outputs:
            host = np.empty(self.allocator.shapes[name], dtype=self.io.dtypes[name])
            _cuda(cudart.cudaMemcpyAsync(host.ctypes.data, self.allocator.buffers[name].ptr,
                                         host.nbytes, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost,
                                         self.stream), "cudaMemcpyAsync to the host")  # fmt: skip
            outputs[name] = host
        _cuda(cudart.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
        return outputs

    def close(self) -> None:
        for buffer in [*self.inputs.values(), *self.allocator.buffers.values()]:
            buffer.free()
        _cuda(self._cudart.cudaStreamDestroy(self.stream), "cudaStreamDestroy")


@dataclass(frozen=True)
class _TensorIO:
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    dtypes: dict[str, np.dtype[Any]]


class TrtEngine:
    """One deserialized plan and its execution slots; lives in a worker process.

    Callable from any thread: each concurrent caller takes an idle slot (its own execution
    context, stream and buffers) or creates one, so a candidate's canary on the staging thread
    never shares a context with the compute thread.
    """

    def __init__(self, engine: Any, name: str) -> None:
        trt = _import_trt()
        self.name = name
        self._engine = engine
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.io = _TensorIO(
            inputs=tuple(inputs),
            outputs=tuple(n for n in names if n not in inputs),
            dtypes={n: np.dtype(trt.nptype(engine.get_tensor_dtype(n))) for n in names},
        )
        self._idle: queue.SimpleQueue[_ExecutionSlot] = queue.SimpleQueue()
        self._slots: list[_ExecutionSlot] = []
        self._lock = threading.Lock()
        # freed when the last engine set using this plan goes (a swapped-out version); not at
        # interpreter exit, when CUDA may already be torn down and the process frees it anyway
        finalizer = weakref.finalize(self, _close_slots, self._slots)
        setattr(finalizer, "atexit", False)  # noqa: B010 - typeshed marks the documented flag read-only

    @property
    def slots(self) -> int:
        """Execution contexts created so far (one per concurrent caller)."""
        return len(self._slots)

    def run(self, feeds: dict[str, npt.NDArray[Any]]) -> dict[str, npt.NDArray[Any]]:
        """Run the plan on host arrays, returning host arrays (synchronous for the caller)."""
        try:
            slot = self._idle.get_nowait()
        except queue.Empty:
            slot = _ExecutionSlot(self._engine, self.io)
            with self._lock:
                self._slots.append(slot)
        try:
            return slot.run(feeds)
        finally:
            self._idle.put(slot)


def _close_slots(slots: list[_ExecutionSlot]) -> None:
    for slot in slots:
        try:
            slot.close()
        except EngineError:  # a failing free must not raise from a finalizer; the log says it
            _trt_logger().log(_import_trt().Logger.WARNING, "ttsvc: freeing a TensorRT slot failed")


def deserialize(data: bytes, path: Path) -> TrtEngine:
    """The plan in ``data`` (already verified), deserialized once per content per process."""
    key = hashlib.sha256(data).hexdigest()
    with _RUNTIME_LOCK:
        cached = _ENGINES.get(key)
    if cached is not None:
        return cached
    engine = trt_runtime().deserialize_cuda_engine(data)
    if engine is None:
        raise EngineError(f"{path}: TensorRT could not deserialize it (see its log)")
    loaded = TrtEngine(engine, path.name)
    with _RUNTIME_LOCK:
        return _ENGINES.setdefault(key, loaded)


class TrtAcoustic:
    """Sentence engine on a TensorRT plan (batch 1); lives in a worker's compute thread."""

    def __init__(self, engine: TrtEngine, seq_len: int) -> None:
        self._engine = engine
        self._seq_len = seq_len
        self._output = "latents" if "latents" in engine.io.outputs else "frames"

    def latents(self, ids: IntArray, scales: FloatArray, speaker: int = 0) -> FloatArray:
        return self.run(ids, scales, speaker).latents

    def run(self, ids: IntArray, scales: FloatArray, speaker: int = 0) -> SentenceRun:
        _single_speaker(speaker)
        if ids.shape[1] > self._seq_len:
            raise TextTooLong(
                f"a sentence of {ids.shape[1]} phoneme ids exceeds the engines' --seq-len "
                f"{self._seq_len}: shorten it or rebuild the plans with a larger --seq-len"
            )
        lengths = np.array([ids.shape[1]], dtype=np.int64)
        out = self._engine.run({"input": ids, "input_lengths": lengths, "scales": scales})
        durations = out.get(DURATIONS_OUTPUT)  # absent from plans built before it was an output
        return SentenceRun(
            np.asarray(out[self._output], dtype=np.float32),
            None if durations is None else np.asarray(durations, dtype=np.int64).reshape(-1),
        )


MULTI_SPEAKER_UNSUPPORTED = (
    "multi-speaker voices are not supported by the TensorRT backend (its plans are built "
    "without the speaker input): compile this voice with --backend ort"
)


def _single_speaker(speaker: int) -> None:
    """Plans are single-speaker (``assemble`` refuses others): any other speaker is a bug."""
    if speaker != 0:
        raise EngineError(f"speaker {speaker}: {MULTI_SPEAKER_UNSUPPORTED}")


class _FramePlan:
    """A frame engine's plan with its batch and width limits; calls beyond them are split."""

    def __init__(self, engine: TrtEngine, max_batch: int, max_frames: int,
                 left: int, right: int, scale: int) -> None:  # fmt: skip
        self.engine = engine
        self.max_batch = max_batch
        self._max_frames = max_frames
        self._left, self._right, self._scale = left, right, scale

    def batched(self, x: FloatArray, run: Callable[[FloatArray], FloatArray]) -> FloatArray:
        parts = [
            run_in_windows(
                run, x[i : i + self.max_batch], self._max_frames, self._left, self._right,
                self._scale,
            )
            for i in range(0, x.shape[0], self.max_batch)
        ]
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)


class TrtFlow(_FramePlan):
    """Flow engine on a TensorRT plan, batched across streams; lives in a worker's compute
    thread."""

    def frames(self, latents: FloatArray, speaker: int = 0) -> FloatArray:
        _single_speaker(speaker)
        return self.frames_batch(latents)

    def frames_batch(self, latents: FloatArray) -> FloatArray:
        return self.batched(latents, self._run)

    def _run(self, latents: FloatArray) -> FloatArray:
        # every frame of every window is a real frame, so the mask is all ones
        mask = np.ones((latents.shape[0], 1, latents.shape[2]), dtype=np.float32)
        out = self.engine.run({"latents": latents, "mask": mask})
        return np.asarray(out["frames"], dtype=np.float32)


class TrtVocoder(_FramePlan):
    """Vocoder engine on a TensorRT plan, batched across streams; lives in a worker's compute
    thread."""

    def waveform(self, frames: FloatArray, speaker: int = 0) -> FloatArray:
        _single_speaker(speaker)
        return self.waveform_batch(frames).reshape(-1)

    def waveform_batch(self, frames: FloatArray) -> FloatArray:
        return self.batched(frames, self._run)

    def _run(self, frames: FloatArray) -> FloatArray:
        out = self.engine.run({"frames": frames})["output"]
        return np.asarray(out, dtype=np.float32).reshape(frames.shape[0], -1)


def _profile_max(manifest: Manifest, engine: str, tensor: str) -> list[int]:
    try:
        return manifest.profiles[engine][tensor][2]
    except (KeyError, IndexError) as exc:
        raise EngineError(f"manifest has no {engine} profile for {tensor}") from exc


def assemble(source: EngineSource, threads: int = 1) -> EngineSet:
    """Check the fingerprint, then deserialize each plan from bytes that were just verified.

    The acoustic engine is a plan when TensorRT could build one; otherwise the compiler kept
    ``acoustic.onnx`` and it runs on ONNX Runtime on the CPU (see docs/gpu.md).
    """
    from ttsvc.backends import onnxruntime as ortb  # noqa: PLC0415 - the acoustic fallback

    manifest, directory = source.manifest, source.directory
    if manifest.backend != "trt":
        raise EngineError(f"{directory}: built for backend {manifest.backend!r}, not 'trt'")
    if manifest.num_speakers > 1:
        raise EngineError(f"{directory}: {manifest.num_speakers} speakers: "
                          f"{MULTI_SPEAKER_UNSUPPORTED}")  # fmt: skip
    check_trt_fingerprint(directory, manifest, trt_fingerprint())
    if ortb.ACOUSTIC_FILE in manifest.files:
        ortb.check_fingerprint(directory, manifest)
    for name in (VOCODER_PLAN, VOICE_FILE):
        if name not in manifest.files:
            raise EngineError(f"{directory}: manifest does not list {name}")
    voice = VoiceConfig.from_piper(json.loads(source.read(VOICE_FILE).decode("utf-8")),
                                  manifest.voice)
    hop = manifest.hop_length

    def plan(name: str) -> TrtEngine:
        return deserialize(source.read(name), directory / name)

    if ACOUSTIC_PLAN in manifest.files:
        seq_len = _profile_max(manifest, "acoustic", "input")[-1]
        acoustic: Any = TrtAcoustic(plan(ACOUSTIC_PLAN), seq_len)
    elif ortb.ACOUSTIC_FILE in manifest.files:
        with source.open_file(ortb.ACOUSTIC_FILE) as handle:
            acoustic = ortb.OrtAcoustic(ortb.create_session(directory / ortb.ACOUSTIC_FILE,
                                                            threads, handle))  # fmt: skip
    else:
        raise EngineError(f"{directory}: manifest lists no acoustic engine")
    vctx = manifest.contexts["vocoder"]
    vocoder = TrtVocoder(plan(VOCODER_PLAN), manifest.max_batch,
                         _profile_max(manifest, "vocoder", "frames")[-1],
                         vctx.left, vctx.right, hop)  # fmt: skip
    flow = None
    if FLOW_PLAN in manifest.files:
        fctx = manifest.contexts["flow"]
        flow = TrtFlow(plan(FLOW_PLAN), manifest.max_batch,
                       _profile_max(manifest, "flow", "latents")[-1],
                       fctx.left, fctx.right, 1)  # fmt: skip
    return EngineSet(
        acoustic=acoustic,
        flow=flow,
        vocoder=vocoder,
        manifest=manifest,
        voice=voice,
        path=directory,
        label=source.label,
    )

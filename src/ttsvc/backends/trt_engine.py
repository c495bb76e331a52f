"""TensorRT engine mechanics on an NVIDIA GPU: runtime, device memory, execution contexts.

Kept apart from ``tensorrt.py``, which holds the engine roles the synthesizer calls (acoustic,
flow, vocoder) and ``assemble``: this module is the plan-agnostic machinery underneath them.

The runtime only: plans are built at compile time (``compile/trt_plan.py``), and whether this
process has TensorRT, cuda-python and a GPU, and whether a plan was built for them, is
``gpu.py``'s probe. ``tensorrt`` and ``cuda`` (cuda-python) are imported through that module's
lazy imports, only inside functions: importing ttsvc never needs them, and every path that does
need them fails first with a ``BackendUnavailable`` saying what is missing. Written against the
TensorRT 10 Python API (``execute_async_v3`` with tensor addresses) and cuda-python's runtime
bindings; see docs/gpu.md for what was verified where.

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
import queue
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ttsvc.backends import gpu  # through the module: tests fake the probe in this one place
from ttsvc.errors import EngineError

_RUNTIME_LOCK = threading.Lock()
_RUNTIME: list[Any] = []
"""The process's one ``trt.Runtime`` (a one-element list: created on first use, never again)."""
_ENGINES: weakref.WeakValueDictionary[str, TrtEngine] = weakref.WeakValueDictionary()
"""Deserialized plans by sha256, alive while an engine set holds them."""


def trt_runtime() -> Any:
    """The process-wide ``trt.Runtime``, created on first use."""
    with _RUNTIME_LOCK:
        if not _RUNTIME:
            _RUNTIME.append(gpu.import_trt().Runtime(gpu.trt_logger()))
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
            self.ptr = int(gpu.cuda(gpu.import_cudart().cudaMalloc(size), "cudaMalloc"))
            self.nbytes = size
        return self.ptr

    def free(self) -> None:
        if self.ptr:
            gpu.cuda(gpu.import_cudart().cudaFree(self.ptr), "cudaFree")
            self.ptr, self.nbytes = 0, 0


@functools.cache
def _allocator_class() -> type[Any]:
    """An ``IOutputAllocator`` subclass (defined lazily: TensorRT is imported only here).

    Every output goes through it, the acoustic plan's data-dependent latents (their frame count
    comes from the predicted durations) as much as the frame plans' outputs, so one code path
    serves all three: TensorRT asks for the bytes it needs and reports the shape it produced.
    """
    trt = gpu.import_trt()
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
        cudart = gpu.import_cudart()
        self._cudart = cudart
        self.io = io
        self.context = engine.create_execution_context()
        if self.context is None:
            raise EngineError("TensorRT could not create an execution context (device memory?)")
        self.stream = gpu.cuda(cudart.cudaStreamCreate(), "cudaStreamCreate")
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
            gpu.cuda(
                cudart.cudaMemcpyAsync(ptr, host.ctypes.data, host.nbytes,
                                       cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, self.stream),
                "cudaMemcpyAsync to the device",
            )  # fmt: skip
            self.context.set_tensor_address(name, ptr)
            staged.append(host)
        if not self.context.execute_async_v3(int(self.stream)):
            raise EngineError("TensorRT execute_async_v3 failed (see its log)")
        outputs: dict[str, npt.NDArray[Any]] = {}
        for name in self.io.outputs:
            host = np.empty(self.allocator.shapes[name], dtype=self.io.dtypes[name])
            gpu.cuda(
                cudart.cudaMemcpyAsync(host.ctypes.data, self.allocator.buffers[name].ptr,
                                       host.nbytes, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost,
                                       self.stream),
                "cudaMemcpyAsync to the host",
            )  # fmt: skip
            outputs[name] = host
        gpu.cuda(cudart.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
        return outputs

    def close(self) -> None:
        for buffer in [*self.inputs.values(), *self.allocator.buffers.values()]:
            buffer.free()
        gpu.cuda(self._cudart.cudaStreamDestroy(self.stream), "cudaStreamDestroy")


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
        trt = gpu.import_trt()
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
            gpu.trt_logger().log(gpu.import_trt().Logger.WARNING,
                                 "ttsvc: freeing a TensorRT slot failed")  # fmt: skip


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

"""Load an engine version with the backend its manifest names.

Workers, ``ttsvc synth`` and the compiler's final check call this, so a TensorRT version
published into the engines directory is loaded (and hot-swapped) by the same machinery as a CPU
one. The TensorRT module is imported only for a ``trt`` manifest.
"""

from __future__ import annotations

from pathlib import Path

from ttsvc.backends import onnxruntime
from ttsvc.backends.base import EngineSet, EngineSource
from ttsvc.protocol import EngineSpec


def load_engines(source: EngineSource, threads: int = 1) -> EngineSet:
    """Verify and load ``source`` with the backend its manifest was built for."""
    if source.manifest.backend == "trt":
        from ttsvc.backends import tensorrt  # noqa: PLC0415 - GPU machines only

        return tensorrt.assemble(source, threads)
    return onnxruntime.assemble(source, threads)


def load_engine_set(directory: Path, threads: int = 1) -> EngineSet:
    """A version directory, any backend."""
    return load_engines(EngineSource.from_directory(directory), threads)


def load_engine_spec(spec: EngineSpec, threads: int = 1) -> EngineSet:
    """The cached files of an ``EngineSpec``, any backend."""
    return load_engines(EngineSource.from_spec(spec), threads)

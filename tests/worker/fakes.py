"""Stand-ins for what cannot run here: the GPU.

``FakeGpuBatchFlow`` / ``FakeGpuBatchVocoder`` implement the batch protocols the TensorRT
plans implement, with ONNX Runtime on the CPU running the same batched windows. The batching
scheduler's behaviour (order, grouping, audio identical to unbatched streaming) is therefore
tested with real engines and real audio; only the device is missing.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from ttsvc.backends.base import EngineSet, FloatArray
from ttsvc.backends.onnxruntime import FLOW_FILE, VOCODER_FILE, create_session


class FakeGpuBatchFlow:
    """The flow plan's batch interface on ONNX Runtime (CPU); records each call's batch size."""

    def __init__(self, path: Path, max_batch: int, calls: list[tuple[str, int]]) -> None:
        self._session = create_session(path, 1)
        self.max_batch = max_batch
        self._calls = calls

    def frames(self, latents: FloatArray, speaker: int = 0) -> FloatArray:
        assert speaker == 0  # batch engines are single-speaker
        return self.frames_batch(latents)

    def frames_batch(self, latents: FloatArray) -> FloatArray:
        assert latents.shape[0] <= self.max_batch
        self._calls.append(("flow", latents.shape[0]))
        mask = np.ones((latents.shape[0], 1, latents.shape[2]), dtype=np.float32)
        out = self._session.run(None, {"latents": np.ascontiguousarray(latents), "mask": mask})
        return np.asarray(out[0], dtype=np.float32)


class FakeGpuBatchVocoder:
    """The vocoder plan's batch interface on ONNX Runtime (CPU); records each call's size."""

    def __init__(self, path: Path, max_batch: int, calls: list[tuple[str, int]]) -> None:
        self._session = create_session(path, 1)
        self.max_batch = max_batch
        self._calls = calls
        self.fail = False
        """Set to make every batched call raise (a device fault)."""

    def waveform(self, frames: FloatArray, speaker: int = 0) -> FloatArray:
        assert speaker == 0  # batch engines are single-speaker
        return self.waveform_batch(frames).reshape(-1)

    def waveform_batch(self, frames: FloatArray) -> FloatArray:
        assert frames.shape[0] <= self.max_batch
        if self.fail:
            raise RuntimeError("simulated device fault")
        self._calls.append(("vocoder", frames.shape[0]))
        out = self._session.run(None, {"frames": np.ascontiguousarray(frames)})
        return np.asarray(out[0], dtype=np.float32).reshape(frames.shape[0], -1)


def fake_gpu_batch_engines(
    engines: EngineSet, max_batch: int, calls: list[tuple[str, int]]
) -> EngineSet:
    """``engines`` with flow and vocoder replaced by the batch stand-ins (``max_batch`` in the
    manifest, as a TensorRT build records it)."""
    manifest = engines.manifest.model_copy(update={"max_batch": max_batch})
    return dataclasses.replace(
        engines,
        flow=FakeGpuBatchFlow(engines.path / FLOW_FILE, max_batch, calls),
        vocoder=FakeGpuBatchVocoder(engines.path / VOCODER_FILE, max_batch, calls),
        manifest=manifest,
    )

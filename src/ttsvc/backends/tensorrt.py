"""TensorRT on an NVIDIA GPU: run serialized plans (workers).

The engine roles the synthesizer calls (``TrtAcoustic``, ``TrtFlow``, ``TrtVocoder``) and
``assemble``, which checks a version and builds its engine set; the mechanics underneath them
(runtime, device buffers, execution contexts, deserialization) are ``trt_engine.py``. Plans are
built at compile time (``compile/trt_plan.py``); whether this process has TensorRT, cuda-python
and a GPU is ``gpu.py``'s probe. Nothing here imports ``tensorrt`` or ``cuda``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

from ttsvc.backends import (
    gpu,  # through the module: tests fake the probe in this one place
    trt_engine,  # through the module: tests fake ``deserialize`` there
)
from ttsvc.backends.base import (
    DURATIONS_OUTPUT,
    EngineSet,
    EngineSource,
    FloatArray,
    IntArray,
    SentenceRun,
    run_in_windows,
)
from ttsvc.backends.trt_engine import TrtEngine
from ttsvc.errors import EngineError, TextTooLong
from ttsvc.repository.manifest import Manifest
from ttsvc.voice import VOICE_FILE, VoiceConfig

ACOUSTIC_PLAN = "acoustic.plan"
FLOW_PLAN = "flow.plan"
VOCODER_PLAN = "vocoder.plan"


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
    gpu.check_trt_fingerprint(directory, manifest, gpu.trt_fingerprint())
    if ortb.ACOUSTIC_FILE in manifest.files:
        ortb.check_fingerprint(directory, manifest)
    for name in (VOCODER_PLAN, VOICE_FILE):
        if name not in manifest.files:
            raise EngineError(f"{directory}: manifest does not list {name}")
    voice = VoiceConfig.from_piper(json.loads(source.read(VOICE_FILE).decode("utf-8")),
                                  manifest.voice)
    hop = manifest.hop_length

    def plan(name: str) -> TrtEngine:
        return trt_engine.deserialize(source.read(name), directory / name)

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

"""What a backend provides: a sentence engine and a frame engine behind two small protocols.

The synthesizer only ever calls these two methods, so a backend (ONNX Runtime, TensorRT) is free
in how it allocates buffers or threads. Engine objects live in a worker process and are used from
its one compute thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from ttsvc.repository.manifest import Manifest
from ttsvc.voice import VoiceConfig

FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]


class AcousticEngine(Protocol):
    """Sentence-level part: phoneme ids → latents (text encoder, durations, noise)."""

    def latents(self, ids: IntArray, scales: FloatArray) -> FloatArray:
        """Return latents ``[1, C, T]`` for ids ``[1, N]`` and scales ``[3]``: the flow's input,
        or the decoder frames themselves when there is no flow engine."""
        ...


class FlowEngine(Protocol):
    """Frame-level, cheap, wide receptive field: a window of latents z_p → decoder frames z."""

    def frames(self, latents: FloatArray) -> FloatArray:
        """Return decoder frames ``[1, C, T]`` for latents ``[1, C, T]``."""
        ...


class VocoderEngine(Protocol):
    """Frame-level, costly, narrow receptive field: a window of decoder frames → waveform."""

    def waveform(self, frames: FloatArray) -> FloatArray:
        """Return ``hop * T`` float samples in [-1, 1] for frames ``[1, C, T]``."""
        ...


@dataclass(frozen=True)
class EngineSet:
    """A loaded, verified engine version: what one stream is synthesized with from start to end."""

    acoustic: AcousticEngine
    flow: FlowEngine | None
    """``None`` when the acoustic engine already includes the flow (split at the decoder)."""
    vocoder: VocoderEngine
    manifest: Manifest
    voice: VoiceConfig
    path: Path
    label: str
    """The engine version as clients see it (response header, logs, metrics)."""

    @property
    def version(self) -> int:
        """The manifest's numeric version."""
        return self.manifest.version

"""Request parameters: what a caller may set per synthesis, with validated ranges.

Its own module because it is a contract, apart from how audio is made: the worker builds one
per stream from the job it was sent, the CLI from its flags, and ``scales`` maps it onto the
input of the voice's acoustic engine.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ttsvc.backends.base import EngineSet, FloatArray
from ttsvc.ranges import SENTENCE_SILENCE, SPEED, Noise, Silence, Speed


class SynthesisParams(BaseModel):
    """Per-request knobs with validated ranges; ``None`` takes the voice's default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    speed: Speed = SPEED
    """Speaking rate: 2.0 is twice as fast (divides the voice's length scale)."""
    noise_scale: Noise | None = None
    """Latent noise; 0 makes the audio deterministic."""
    noise_w: Noise | None = None
    """Duration noise; 0 makes the rhythm deterministic."""
    sentence_silence: Silence = SENTENCE_SILENCE
    """Seconds of silence after each sentence but the last."""
    speaker: int | None = Field(None, ge=0)
    """Speaker id of a multi-speaker voice (``voice.speaker_id`` resolves a name); ``None`` is
    speaker 0, the only one of a single-speaker voice."""
    timestamps: bool = False
    """Give each chunk the words whose audio starts in it (``AudioChunk.words``)."""

    def scales(self, engines: EngineSet) -> FloatArray:
        """The ``scales`` input of a Piper graph: noise scale, length scale, noise width."""
        inf = engines.voice.inference
        return np.array(
            [
                inf.noise_scale if self.noise_scale is None else self.noise_scale,
                inf.length_scale / self.speed,
                inf.noise_w if self.noise_w is None else self.noise_w,
            ],
            dtype=np.float32,
        )

"""The canary: a fixed sentence every engine set must say, and check, before it serves.

Its own module because loading and cost measurement use it apart from synthesis itself:
``Synthesizer.calibrate`` and ``seconds_per_id`` measure on ``CANARY_TEXT``, and the worker
refuses an engine set whose canary fails (``canary_failure``).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt

from ttsvc.synthesis.params import SynthesisParams
from ttsvc.text.frontend import Sentence


class Speaker(Protocol):
    """What the canary asks of a synthesizer (the synthesizer imports ``CANARY_TEXT`` from here,
    so it is described, not imported)."""

    @property
    def sample_rate(self) -> int: ...

    def sentences(self, text: str) -> list[Sentence]: ...

    def one_shot(
        self, ids: tuple[int, ...] | list[int], params: SynthesisParams
    ) -> npt.NDArray[np.float32]: ...


CANARY_TEXT = "The quick brown fox jumps over the lazy dog."
"""What every engine set must say before it serves."""


def canary_failure(synth: Speaker) -> str | None:
    """Why ``synth``'s engines must not serve, or ``None`` when the canary passes.

    Loading proves the graph parses, not that it speaks: a corrupted weight can load and output
    silence or noise. The canary is deterministic (noise 0), so its checks are stable: finite,
    clearly audible, and of a duration plausible for the sentence (0.3-1.5 s per ten phonemes'
    worth of the text would be voice-specific; the bounds here are generous on purpose).
    """
    params = SynthesisParams(noise_scale=0.0, noise_w=0.0)
    sentences = synth.sentences(CANARY_TEXT)
    audio = np.concatenate([synth.one_shot(s.ids, params) for s in sentences])
    seconds = len(audio) / synth.sample_rate
    if not np.all(np.isfinite(audio)):
        return "canary audio has NaN or infinite samples"
    rms = float(np.sqrt(np.mean(np.square(audio, dtype=np.float64))))
    if rms < 0.01:
        return f"canary audio is silent (RMS {rms:.4f})"
    if not 1.0 <= seconds <= 8.0:
        return f"canary audio lasts {seconds:.2f} s, implausible for its sentence"
    return None

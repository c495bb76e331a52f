"""The canary: a fixed sentence every engine set must say, and check, before it serves.

Its own module because loading and cost measurement use it apart from synthesis itself:
``Synthesizer.calibrate`` and ``seconds_per_id`` measure on ``CANARY_TEXT``, and the worker
refuses an engine set whose canary fails (``canary_failure``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ttsvc.synthesis.params import SynthesisParams

if TYPE_CHECKING:  # type only: the synthesizer imports CANARY_TEXT from here
    from ttsvc.synthesis.synthesizer import Synthesizer


CANARY_TEXT = "The quick brown fox jumps over the lazy dog."
"""What every engine set must say before it serves."""


def canary_failure(synth: Synthesizer) -> str | None:
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

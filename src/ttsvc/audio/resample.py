"""Sample-rate conversion for streamed audio, through soxr.

A stream is resampled chunk by chunk with one ``soxr.ResampleStream`` whose filter state carries
across chunks, so the concatenated output is one continuous signal (no clicks at chunk edges) and
its length matches resampling the whole utterance at once.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import soxr

SUPPORTED_RATES = (8000, 16000, 22050, 24000, 44100, 48000)
"""Output rates clients may ask for: telephony, wideband, the voice's own, and studio rates."""


class StreamResampler:
    """Resamples one stream's PCM16 chunks; lives with the stream in a worker's compute thread."""

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._stream = soxr.ResampleStream(in_rate, out_rate, 1, dtype="int16", quality="HQ")

    def process(self, pcm: npt.NDArray[np.int16], last: bool) -> npt.NDArray[np.int16]:
        """Resample the next chunk; ``last`` flushes the filter's tail."""
        out: npt.NDArray[np.int16] = self._stream.resample_chunk(pcm, last=last)
        return out

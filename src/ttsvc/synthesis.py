"""The streaming synthesizer: one sentence engine run, then frame windows through the vocoder.

Why windows reproduce the one-shot audio exactly: the frame engine (flow + HiFi-GAN) is pure
convolution, so a window's samples depend only on a bounded neighbourhood of frames. Each window
is computed with ``frame_context`` frames of real latents on each side (measured at compile time
and recorded in the manifest) and cropped to its own frames. The first window is small so audio
starts early; later windows grow so the overlap's cost stays small against throughput.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from ttsvc.backends.base import EngineSet, FloatArray
from ttsvc.text.frontend import Sentence, TextFrontEnd

Pcm16 = npt.NDArray[np.int16]


class SynthesisParams(BaseModel):
    """Per-request knobs with validated ranges; ``None`` takes the voice's default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    speed: float = Field(1.0, ge=0.25, le=4.0)
    """Speaking rate: 2.0 is twice as fast (divides the voice's length scale)."""
    noise_scale: float | None = Field(None, ge=0.0, le=2.0)
    """Latent noise; 0 makes the audio deterministic."""
    noise_w: float | None = Field(None, ge=0.0, le=2.0)
    """Duration noise; 0 makes the rhythm deterministic."""
    sentence_silence: float = Field(0.2, ge=0.0, le=5.0)
    """Seconds of silence after each sentence but the last."""

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


@dataclass(frozen=True)
class WindowSchedule:
    """Frame window sizes: small first (time to first audio), then growing (throughput)."""

    first: int = 8
    """Frames in the first window of a sentence (one frame = hop samples, 11.6 ms at 22050 Hz)."""
    growth: float = 2.0
    """Each window is this many times the previous one..."""
    max: int = 128
    """...up to this many frames."""

    def __post_init__(self) -> None:
        if self.first < 1 or self.max < self.first or self.growth < 1.0:
            raise ValueError(f"invalid window schedule {self}")

    def windows(self, frames: int) -> list[tuple[int, int]]:
        """``[start, end)`` frame ranges covering ``frames`` frames."""
        out: list[tuple[int, int]] = []
        start, size = 0, self.first
        while start < frames:
            end = min(frames, start + size)
            size = min(self.max, max(size + 1, int(size * self.growth)))
            if start > 0 and frames - end < size // 2:
                end = frames  # a short tail costs a window's context for little audio: merge it
            out.append((start, end))
            start = end
        return out


@dataclass(frozen=True)
class AudioChunk:
    """A piece of an utterance's audio, in order."""

    samples: Pcm16
    """Mono PCM16 at the voice's sample rate."""
    offset: int
    """Index of the first sample within the whole utterance."""
    sentence: int
    """Index of the sentence this chunk belongs to."""
    last: bool
    """True on the final chunk of the utterance."""


def to_pcm16(audio: FloatArray) -> Pcm16:
    """Float [-1, 1] to PCM16, without Piper's per-sentence peak normalization.

    Streaming cannot know a sentence's peak before its last window, and the voice's output is
    already within [-1, 1] (a tanh), so the samples are only scaled.
    """
    pcm: Pcm16 = np.rint(np.clip(audio, -1.0, 1.0) * 32767.0).astype(np.int16)
    return pcm


class Synthesizer:
    """Text to streamed PCM for one engine set; used from one compute thread."""

    def __init__(
        self,
        engines: EngineSet,
        schedule: WindowSchedule | None = None,
        max_sentence_chars: int = 200,
    ) -> None:
        self.engines = engines
        self.schedule = schedule or WindowSchedule()
        self.frontend = TextFrontEnd(engines.voice, max_sentence_chars)
        self.hop = engines.manifest.hop_length
        self.context = engines.manifest.frame_context

    @property
    def sample_rate(self) -> int:
        """Output rate of the engines."""
        return self.engines.manifest.sample_rate

    def sentences(self, text: str) -> list[Sentence]:
        """Front end only; raises ``NothingToSay`` for text with nothing to speak."""
        return self.frontend.sentences(text)

    def latents(self, ids: tuple[int, ...] | list[int], params: SynthesisParams) -> FloatArray:
        """Run the sentence engine once."""
        arr = np.asarray([ids], dtype=np.int64)
        return self.engines.acoustic.latents(arr, params.scales(self.engines))

    def one_shot(self, ids: tuple[int, ...] | list[int], params: SynthesisParams) -> FloatArray:
        """The whole sentence through both engines in one call each: the reference for streaming."""
        return self.engines.vocoder.waveform(self.latents(ids, params))

    def windows(
        self, latents: FloatArray, schedule: WindowSchedule | None = None
    ) -> Iterator[FloatArray]:
        """Float audio of ``latents`` window by window; concatenated, it equals one-shot audio."""
        frames = latents.shape[2]
        left, right, hop = self.context.left, self.context.right, self.hop
        for start, end in (schedule or self.schedule).windows(frames):
            lo, hi = max(0, start - left), min(frames, end + right)
            audio = self.engines.vocoder.waveform(latents[:, :, lo:hi])
            yield audio[(start - lo) * hop : (end - lo) * hop]

    def stream(
        self,
        text: str,
        params: SynthesisParams | None = None,
        schedule: WindowSchedule | None = None,
    ) -> Iterator[AudioChunk]:
        """PCM16 chunks of ``text`` as soon as each window is computed."""
        params = params or SynthesisParams()
        sentences = self.sentences(text)
        silence = np.zeros(round(params.sentence_silence * self.sample_rate), np.int16)
        offset = 0
        schedule = schedule or self.schedule
        for index, sentence in enumerate(sentences):
            last_sentence = index == len(sentences) - 1
            latents = self.latents(sentence.ids, params)
            count = len(schedule.windows(latents.shape[2]))
            # no look-ahead: each window is sent as soon as it is computed
            for number, audio in enumerate(self.windows(latents, schedule), start=1):
                pcm = to_pcm16(audio)
                if number == count and not last_sentence and len(silence):
                    pcm = np.concatenate([pcm, silence])
                yield AudioChunk(pcm, offset, index, last=last_sentence and number == count)
                offset += len(pcm)

    def synthesize(self, text: str, params: SynthesisParams | None = None) -> Pcm16:
        """The whole utterance at once (one-shot per sentence), with the same silences."""
        params = params or SynthesisParams()
        silence = np.zeros(round(params.sentence_silence * self.sample_rate), np.int16)
        pieces: list[Pcm16] = []
        sentences = self.sentences(text)
        for index, sentence in enumerate(sentences):
            pieces.append(to_pcm16(self.one_shot(sentence.ids, params)))
            if index < len(sentences) - 1:
                pieces.append(silence)
        return np.concatenate(pieces)

"""What a synthesis stream yields: the engine runs it waits for, and its audio.

The synthesizer is written as a generator of steps (``Steps``) rather than calling the engines
itself: each engine run it needs is yielded as a ``FrameCall`` and answered by the caller, so
that a GPU worker can batch the same call of several streams and a CPU worker can order each
run on its deadline queue; ``drive`` answers them one by one, at once. Between the calls come
the items, ``AudioChunk``s of PCM16 (``to_pcm16``).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import numpy as np
import numpy.typing as npt

from ttsvc.backends.base import EngineSet, FloatArray, SentenceRun, StreamCarry
from ttsvc.protocol import WordTime

Pcm16 = npt.NDArray[np.int16]


@dataclass(frozen=True)
class FrameCall:
    """An engine run one stream waits for: ``inputs`` through ``stage``.

    The synthesizer yields these instead of calling the engine, so that on a GPU the worker can
    gather the same call of several streams into one batched run, and on a CPU each engine run
    is one step of its own that the worker's deadline queue orders (a sentence's acoustic run
    too, so it never rides along with another stream's window). The answer sent back is the
    engine's output for ``inputs``: latents ``[1, C, T]`` for the phoneme ids ``[1, N]`` of an
    acoustic call (with ``scales``), ``[1, C, T]`` frames from the flow, or the flat samples of
    the vocoder.
    """

    stage: Literal["acoustic", "flow", "vocoder"]
    inputs: npt.NDArray[Any]
    scales: FloatArray | None = None
    """The acoustic call's noise and length scales."""
    speaker: int = 0
    """The stream's speaker id: a multi-speaker voice conditions every engine on it."""
    carry: StreamCarry | None = None
    """A stateful engine's state for this stream's sentence (``None``: a windowed engine, run
    on ``inputs`` alone). The call advances it; it never leaves the stream."""
    engines: EngineSet | None = None
    """The engines to run it on when not the stream's own: a run of a script in another voice
    (SSML's ``voice``)."""
    window: int = 0
    """For a flow call: the frames of the vocoder window it feeds, which comes next (0: not
    said). The scheduler prices the stream's next chunk with it (``worker.costs``)."""
    plain: bool = False
    """Run it on the engine set's plain graphs (``EngineSet.one_shot``): a whole sentence in
    one call, with no state (``frame_steps.whole_steps``)."""


T = TypeVar("T")
Answer = FloatArray | SentenceRun
"""What a ``FrameCall`` is answered with: a ``SentenceRun`` for an acoustic call, else the
engine's output array."""
Steps = Generator["FrameCall | T", "Answer | None", None]
"""Items of type ``T``, with the engine runs they need yielded as ``FrameCall``s in between."""


def drive(steps: Steps[T], run: Callable[[FrameCall], Answer]) -> Iterator[T]:
    """The items of ``steps``, answering each ``FrameCall`` at once with ``run``."""
    answer: Answer | None = None
    while True:
        try:
            item = steps.send(answer)
        except StopIteration:
            return
        if isinstance(item, FrameCall):
            answer = run(item)
        else:
            answer = None
            yield item


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
    offset_s: float = 0.0
    """``offset`` in seconds."""
    words: tuple[WordTime, ...] = ()
    """Words whose audio starts in this chunk (when timestamps were asked for)."""


def to_pcm16(audio: FloatArray) -> Pcm16:
    """Float [-1, 1] to PCM16, without Piper's per-sentence peak normalization.

    Streaming cannot know a sentence's peak before its last window, and the voice's output is
    already within [-1, 1] (a tanh), so the samples are only scaled.
    """
    pcm: Pcm16 = np.rint(np.clip(audio, -1.0, 1.0) * 32767.0).astype(np.int16)
    return pcm

"""What a backend provides: a sentence engine and a frame engine behind two small protocols.

The synthesizer only ever calls these two methods, so a backend (ONNX Runtime, TensorRT) is free
in how it allocates buffers or threads. Engine objects live in a worker process and are used from
its one compute thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from ttsvc.errors import EngineError
from ttsvc.protocol import EngineSpec
from ttsvc.repository.manifest import Manifest, load_manifest, open_checked, open_verified
from ttsvc.voice import VoiceConfig

FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]

SPEAKER_INPUT = "sid"
"""Piper's speaker id input (int64 ``[1]``): multi-speaker voices only, kept under this name on
every split engine that reads the speaker."""


DURATIONS_OUTPUT = "durations"
"""The sentence engine's output of frames per phoneme id (``ttsvc.compile.split``)."""


STREAM_LAG_KEY = "ttsvc.stream_lag"
"""Metadata of a stateful engine: its output's lag, in output samples (frames for the flow)."""
STREAM_SCALE_KEY = "ttsvc.stream_scale"
"""Metadata of a stateful engine: output samples per input frame."""
POSITION_INPUT = "position"
"""A stateful engine's int64 ``[1]`` input: the sentence frame of the call's first input frame."""
TOTAL_INPUT = "total"
"""A stateful engine's int64 ``[1]`` input: the sentence's frames."""
STATE_IN, STATE_OUT = "state_in.", "state_out."
"""Name prefixes of a stateful engine's state inputs and outputs (``state_in.0`` ...)."""


@dataclass(frozen=True)
class SentenceRun:
    """What one sentence engine run gives: the latents, and where the engine has them, the
    frames each phoneme id lasts (word timestamps are made of them)."""

    latents: FloatArray
    """``[1, C, T]``: the flow's input, or the decoder frames when there is no flow engine."""
    durations: IntArray | None
    """``[N]`` frames per input id, summing to ``T``; ``None`` for engines compiled without
    them."""


class AcousticEngine(Protocol):
    """Sentence-level part: phoneme ids → latents (text encoder, durations, noise).

    ``speaker`` is the speaker id of a multi-speaker voice (0 for a single-speaker one); every
    engine takes it because a multi-speaker graph conditions all three parts on it.
    """

    def latents(self, ids: IntArray, scales: FloatArray, speaker: int = 0) -> FloatArray:
        """Return latents ``[1, C, T]`` for ids ``[1, N]`` and scales ``[3]``: the flow's input,
        or the decoder frames themselves when there is no flow engine."""
        ...

    def run(self, ids: IntArray, scales: FloatArray, speaker: int = 0) -> SentenceRun:
        """The latents of ``latents`` and, from the same run, each id's frame count."""
        ...


class FlowEngine(Protocol):
    """Frame-level, cheap, wide receptive field: a window of latents z_p → decoder frames z."""

    def frames(self, latents: FloatArray, speaker: int = 0) -> FloatArray:
        """Return decoder frames ``[1, C, T]`` for latents ``[1, C, T]``."""
        ...


class VocoderEngine(Protocol):
    """Frame-level, costly, narrow receptive field: a window of decoder frames → waveform."""

    def waveform(self, frames: FloatArray, speaker: int = 0) -> FloatArray:
        """Return ``hop * T`` float samples in [-1, 1] for frames ``[1, C, T]``."""
        ...


@dataclass
class StreamCarry:
    """What one stream's stateful engine keeps between its calls for one sentence.

    It lives with the stream (in the synthesizer's steps for that sentence), so no state ever
    crosses between streams, and it is dropped with them when the stream ends or is cancelled.
    """

    total: int
    """The sentence's frames: where the engine's one-shot input ends."""
    position: int = 0
    """Input frames fed so far: the sentence frame of the next call's first input frame."""
    states: list[FloatArray] | None = None
    """The engine's state tensors after the last call; ``None`` before the first (zeros)."""


@runtime_checkable
class StreamingEngine(Protocol):
    """A stateful frame engine (``compile/stateful.py``): each call computes only new frames.

    Its output lags its input by ``lag`` output samples (frames for the flow), so the call that
    feeds input frames ``[p, p + n)`` returns the one-shot output ``[p*scale - lag,
    (p + n)*scale - lag)``; ``flush_frames`` more input frames (zeros) bring out the end."""

    lag: int
    scale: int

    @property
    def flush_frames(self) -> int:
        """Input frames to feed past the sentence's end."""
        ...

    def step(self, inputs: FloatArray, carry: StreamCarry, speaker: int = 0) -> FloatArray:
        """Run ``inputs`` (the frames from ``carry.position``, zero past ``carry.total``) and
        advance ``carry``; returns this call's output (``[1, C, n]`` or flat samples)."""
        ...


def run_streamed(
    engine: StreamingEngine, x: FloatArray, sizes: Sequence[int], speaker: int = 0
) -> FloatArray:
    """``x`` (``[1, C, T]``) through a stateful engine in calls of ``sizes`` input frames (the
    last size repeats), flushed and cropped: what a stream computes, for checks against the
    one-shot output (the compiler's, the tests', the benchmarks')."""
    total = x.shape[-1]
    padded = np.concatenate(
        [x, np.zeros((*x.shape[:-1], engine.flush_frames), dtype=np.float32)], axis=-1
    )
    carry, parts, index = StreamCarry(total), [], 0
    while carry.position < padded.shape[-1]:
        size = sizes[min(index, len(sizes) - 1)]
        index += 1
        chunk = padded[..., carry.position : carry.position + size]
        parts.append(engine.step(np.ascontiguousarray(chunk), carry, speaker))
    out = np.concatenate(parts, axis=-1)
    return out[..., engine.lag : engine.lag + total * engine.scale]


@runtime_checkable
class BatchFlowEngine(Protocol):
    """A flow engine that also runs windows of several streams in one call (GPU backends).

    Single-speaker engines only: a batch carries no speaker ids."""

    max_batch: int

    def frames_batch(self, latents: FloatArray) -> FloatArray:
        """Decoder frames ``[B, C, T]`` for latents ``[B, C, T]``, ``B <= max_batch``."""
        ...


@runtime_checkable
class BatchVocoderEngine(Protocol):
    """A vocoder engine that also runs windows of several streams in one call (GPU backends).

    Single-speaker engines only: a batch carries no speaker ids."""

    max_batch: int

    def waveform_batch(self, frames: FloatArray) -> FloatArray:
        """Samples ``[B, hop * T]`` for frames ``[B, C, T]``, ``B <= max_batch``."""
        ...


def run_in_windows(
    run: Callable[[FloatArray], FloatArray],
    x: FloatArray,
    max_width: int,
    left: int,
    right: int,
    scale: int,
) -> FloatArray:
    """``run(x)`` for an ``x`` wider (last axis) than ``run`` accepts, cut into windows.

    A compiled plan accepts frames only up to its profile's maximum, but a whole-sentence call
    (the canary, ``stream: false``) can be longer. Frame engines are convolutional with a
    measured context, so overlapping windows cropped to their centre give the one-shot result;
    ``scale`` is output samples per input frame along the last axis.
    """
    if x.shape[-1] <= max_width:
        return run(x)
    step = max_width - left - right
    if step < 1:
        raise EngineError(f"windows of {max_width} frames leave no room beside the context")
    return overlap_and_crop(run, x, step, left, right, scale)


def overlap_and_crop(
    run: Callable[[FloatArray], FloatArray],
    x: FloatArray,
    step: int,
    left: int,
    right: int,
    scale: int,
) -> FloatArray:
    """``run`` over windows of ``step`` frames of ``x`` (last axis), each run with ``left`` and
    ``right`` frames of context and cropped back to its own frames: the one overlap-and-crop
    that both a plan too narrow for a call and the compiler's context check use."""
    total = x.shape[-1]
    parts = []
    for start in range(0, total, step):
        end = min(total, start + step)
        lo, hi = max(0, start - left), min(total, end + right)
        out = run(np.ascontiguousarray(x[..., lo:hi]))
        parts.append(out[..., (start - lo) * scale : (end - lo) * scale])
    return np.concatenate(parts, axis=-1)


@dataclass(frozen=True)
class EngineSource:
    """Where a loader gets an engine version's verified files: a version directory, or the
    gateway's content-addressed cache through an ``EngineSpec``. Every file is checked against
    a hash before any runtime parses a byte."""

    manifest: Manifest
    open_file: Callable[[str], BinaryIO]
    """An open handle on a listed file whose content was just checked (the caller closes it):
    parsing from the handle parses exactly what was hashed."""
    directory: Path
    """For messages: the version directory the engines came from."""
    label: str
    replaced: tuple[str, ...] = ()
    """Files whose bytes differ from their manifest entry (replaced in place): what the manifest
    says of them (their precision) may not hold."""

    def read(self, name: str) -> bytes:
        """The checked content of a listed file (for runtimes that parse from memory)."""
        with self.open_file(name) as handle:
            return handle.read()

    @classmethod
    def from_directory(cls, directory: Path) -> EngineSource:
        """A published (or staged) version directory, checked against its manifest."""
        manifest = load_manifest(directory)

        def open_file(name: str) -> BinaryIO:
            return open_verified(directory, manifest, name)

        return cls(manifest, open_file, directory, str(manifest.version))

    @classmethod
    def from_spec(cls, spec: EngineSpec) -> EngineSource:
        """The cached files an ``EngineSpec`` names, each checked against its hash."""
        manifest = Manifest.model_validate_json(spec.manifest)
        cache = Path(spec.cache_dir)

        def open_file(name: str) -> BinaryIO:
            sha = spec.files.get(name)
            if sha is None:
                raise EngineError(f"{spec.source}: engine spec does not list {name}", file=name,
                                  reason="not in the engine set")  # fmt: skip
            try:
                return open_checked(cache / sha, sha, immutable=True)
            except EngineError as exc:  # name the engine file, not its cache entry
                raise type(exc)(exc.message, file=name, reason=exc.reason) from exc

        return cls(manifest, open_file, Path(spec.source), spec.label, spec.replaced)


@dataclass(frozen=True)
class PlainFrames:
    """A version's frame engines as plain graphs, for a whole sentence in one call each.

    Why beside the stateful ones: a stateful engine pays for its state on every call (the
    concatenations, delay lines and masks are 25-30 % of its time), even on a whole sentence;
    the plain graph computes the same sentence from zero padding alone. A stream that can wait
    for a whole sentence (one queued behind others, or a later sentence with seconds of audio
    buffered) gets it for about three quarters of the engine time."""

    flow: FlowEngine | None
    vocoder: VocoderEngine


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
    measured_precision: dict[str, str] = field(default_factory=dict)
    """Per engine, the precision read from the loaded graph where the manifest cannot say (a
    file replaced in place)."""
    plain: PlainFrames | None = None
    """The plain frame graphs a stateful version carries beside its stateful ones (None: a
    version compiled before they were, or context engines, which are plain themselves)."""

    @property
    def one_shot(self) -> PlainFrames | None:
        """The frame engines that run a whole sentence cheapest in one call each: the plain
        graphs a stateful version carries, a context version's own engines, or None (a
        stateful version without plain graphs)."""
        if self.plain is not None:
            return self.plain
        if isinstance(self.vocoder, StreamingEngine):
            return None
        return PlainFrames(self.flow, self.vocoder)

    @property
    def version(self) -> int:
        """The manifest's numeric version."""
        return self.manifest.version

    @property
    def precision(self) -> dict[str, str]:
        """Per engine, the precision it really runs in."""
        return {**self.manifest.precision, **self.measured_precision}

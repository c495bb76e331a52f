"""Batching frame windows across streams: one engine call serves several streams (GPU workers).

On a GPU a batch of 8 windows costs little more than one, so a worker that runs each stream's
window alone wastes most of the device. The order stays the CPU scheduler's (``compute.py``):
a stream that has sent nothing goes first (oldest first), then the earliest playback deadline.
What batching adds is company: the stream at the head of that order is always served, and the
streams next in the same order whose pending call has the same shape (same engine set, same
stage, same window width) ride along, up to the plan's ``max_batch``. Calls of equal shape only,
because padding a window would change its output near the sentence end (the vocoder has no
frame mask); the schedule's fixed first window makes fresh streams' first calls share a shape.

Never starving: the head is served every step, and a served stream's deadline moves later, so a
waiting stream's turn comes within a bounded number of steps; fresh streams are never
overtaken by running ones.

The CPU path does not use this module: ``scheduler_for`` picks it only for engine sets that run
batches (``BatchFlowEngine`` / ``BatchVocoderEngine``, ``max_batch`` > 1 in the manifest).
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from ttsvc.backends.base import (
    BatchFlowEngine,
    BatchVocoderEngine,
    EngineSet,
    FloatArray,
    StreamingEngine,
)
from ttsvc.errors import EngineError
from ttsvc.synthesis import Answer, AudioChunk, FrameCall, Synthesizer
from ttsvc.worker.compute import StreamScheduler
from ttsvc.worker.streams import ActiveStream, Send


@dataclass(frozen=True)
class PendingWindow:
    """One stream's next frame-engine call, as the batch policy sees it."""

    uid: str
    key: Hashable
    """Calls with equal keys can run as one batch (engine set, stage, input shape, speaker)."""
    fresh: bool
    """Nothing sent yet: its first window decides its time to first audio."""
    arrived: float
    deadline: float
    """When its client's buffered audio runs out at real-time playback (running streams)."""
    limit: int = 1
    """Most windows its engine set takes in one call."""


def priority(window: PendingWindow) -> tuple[int, float]:
    """Fresh streams first, oldest first; then running streams, earliest deadline first."""
    return (0, window.arrived) if window.fresh else (1, window.deadline)


def select_batch(pending: Sequence[PendingWindow], max_batch: int) -> list[PendingWindow]:
    """The windows to run now: the highest-priority one and, in priority order, others of the
    same key, at most ``max_batch`` (and the head's engine ``limit``) in all."""
    if not pending:
        return []
    order = sorted(pending, key=priority)
    head = order[0]
    size = max(1, min(max_batch, head.limit))
    return [w for w in order if w.key == head.key][:size]


def batch_limit(engines: EngineSet) -> int:
    """How many windows one call of ``engines`` may carry (1: it does not batch).

    Stateful engines do not batch: their states would have to be gathered and scattered per
    stream, which only a TensorRT build of them would pay for (not built yet: docs/gpu.md)."""
    if isinstance(engines.vocoder, StreamingEngine):
        return 1
    flow_ok = engines.flow is None or isinstance(engines.flow, BatchFlowEngine)
    if not flow_ok or not isinstance(engines.vocoder, BatchVocoderEngine):
        return 1
    return max(1, engines.manifest.max_batch)


def run_batch(engines: EngineSet, calls: Sequence[FrameCall]) -> list[FloatArray]:
    """Run equal-shaped calls of one stage as one batched engine call; answers in call order."""
    if any(call.speaker for call in calls):  # the batch protocols carry no speaker ids
        raise EngineError("batched engines are single-speaker: cannot run a speaker's windows")
    stacked = np.concatenate([call.inputs for call in calls], axis=0)
    if calls[0].stage == "flow":
        assert isinstance(engines.flow, BatchFlowEngine)
        frames = engines.flow.frames_batch(stacked)
        return [frames[i : i + 1] for i in range(len(calls))]
    assert isinstance(engines.vocoder, BatchVocoderEngine)
    samples = engines.vocoder.waveform_batch(stacked)
    return [samples[i] for i in range(len(calls))]


class BatchStreamScheduler(StreamScheduler):
    """Multiplexes streams over one synthesizer, batching their windows; lives in a GPU
    worker's compute thread.

    Each stream runs as ``Synthesizer.stream_steps``: it stops at every engine call it needs
    (``FrameCall``); a step gathers the pending calls, picks a batch with ``select_batch``, runs
    it once and hands each stream its answer, which carries it to its next call, sending any
    audio chunk it completes on the way.
    """

    def __init__(self, synth: Synthesizer, max_batch: int) -> None:
        super().__init__(synth, multiplex=True)
        self.max_batch = max_batch
        self.batch_sizes: list[int] = []
        """Size of every batch run, in order (for tests and benchmarks)."""

    def _pending(self, stream: ActiveStream) -> PendingWindow:
        call = stream.pending
        assert call is not None
        engines = call.engines or stream.synth.engines
        fresh = stream.first_sent_at is None
        return PendingWindow(
            uid=stream.job.uid,
            key=(id(engines), call.stage, call.inputs.shape, call.speaker),
            fresh=fresh,
            arrived=stream.arrived,
            deadline=0.0 if fresh else self._deadline(stream),
            limit=batch_limit(engines),
        )

    def step(self, send: Send) -> None:
        """Start fresh streams, then run one batch and advance the streams it served."""
        self._prime(send)
        pending = [self._pending(s) for s in self.streams.values() if s.pending is not None]
        batch = [self.streams[w.uid] for w in select_batch(pending, self.max_batch)]
        if not batch:
            return
        calls = [s.pending for s in batch if s.pending is not None]
        started = time.perf_counter()
        try:
            engines = calls[0].engines or batch[0].synth.engines
            answers: Sequence[Answer]
            if len(calls) == 1:
                answers = [batch[0].synth.run_call(calls[0])]
            else:
                answers = run_batch(engines, calls)
        except Exception as exc:
            for stream in batch:  # they shared the call: each gets the error
                self._fail(stream, exc, send)
            return
        elapsed = time.perf_counter() - started
        self.batch_sizes.append(len(batch))
        for stream, answer in zip(batch, answers, strict=True):
            stream.compute_s += elapsed / len(batch)
            self._advance(stream, answer, elapsed, send)

    def _prime(self, send: Send) -> None:
        """Run the front end and first sentence engine of fresh streams, oldest first, at most
        a batch of them per step, so their first windows can run as one batch."""
        fresh = sorted(
            (s for s in self.streams.values() if s.steps is None), key=lambda s: s.arrived
        )
        for stream in fresh[: self.max_batch]:
            stream.started_at = time.monotonic()
            started = time.perf_counter()
            try:
                stream.steps = stream.synth.stream_steps(stream.job.text, stream.params(),
                                                         max_audio_s=stream.job.max_audio_s,
                                                         script=stream.job.script,
                                                         voices=stream.voices)
            except Exception as exc:
                self._fail(stream, exc, send)
                continue
            self._advance(stream, None, 0.0, send)  # front end + sentence engine run here
            stream.compute_s += time.perf_counter() - started

    def _advance(
        self,
        stream: ActiveStream,
        answer: Answer | None,
        elapsed: float,
        send: Send,
    ) -> None:
        """Hand ``stream`` its answer and run it to its next frame-engine call, sending the chunks
        it completes on the way (a sentence's acoustic run is answered here: it is once per
        sentence and its shapes differ from stream to stream, so it does not batch)."""
        assert stream.steps is not None
        stream.pending = None
        try:
            item = stream.steps.send(answer)
            while isinstance(item, AudioChunk) or item.stage == "acoustic":
                if not isinstance(item, AudioChunk):
                    item = stream.steps.send(stream.synth.run_call(item))
                    continue
                samples = stream.resample(item)
                self._emit(stream, item, samples, elapsed, send)
                if item.last or stream.job.uid not in self.streams:
                    return
                item = stream.steps.send(None)
        except StopIteration:
            if stream.job.uid in self.streams:
                self._done(stream, send)
            return
        except Exception as exc:
            self._fail(stream, exc, send)
            return
        stream.pending = item


def scheduler_for(synth: Synthesizer, multiplex: bool) -> StreamScheduler:
    """The batching scheduler for engines that batch (GPU plans), else the CPU scheduler."""
    limit = batch_limit(synth.engines)
    if multiplex and limit > 1:
        return BatchStreamScheduler(synth, limit)
    return StreamScheduler(synth, multiplex)

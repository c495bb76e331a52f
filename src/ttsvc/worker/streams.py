"""A request's progress inside a worker, and the messages that report it.

Why a module of its own: the cost model (``worker.costs``) prices a stream's steps and the
scheduler (``worker.deadline``) orders and runs them, and both read the same record; what the
gateway hears of a stream is said once here: the first chunk carries the queue wait, every
chunk its engine version and step cost, and the stream ends with one final message (an error
in its public form, a crash logged with its traceback), whether its step ran alone or in a
batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ttsvc.audio.resample import StreamResampler
from ttsvc.errors import TTSError
from ttsvc.observability.logs import get_logger
from ttsvc.protocol import AudioChunkMsg, FromWorker, StreamDone, StreamError, SynthesisJob
from ttsvc.synthesis import AudioChunk, FrameCall, Pcm16, Steps, SynthesisParams, Synthesizer

log = get_logger("worker")

Send = Callable[[FromWorker], None]
"""Hands a message to the gateway (the worker's pipe; a list's ``append`` in tests)."""


@dataclass
class ActiveStream:
    """One request's progress inside a worker."""

    job: SynthesisJob
    synth: Synthesizer
    """The engines this stream started on: it finishes on them even if the worker swaps."""
    first_sent_at: float | None = None
    samples_sent: int = 0
    compute_s: float = 0.0
    arrived: float = field(default_factory=time.monotonic)
    started_at: float | None = None
    """When its first step began (``arrived`` to here is its queue wait)."""
    resampler: StreamResampler | None = None
    steps: Steps[AudioChunk] | None = None
    """The stream as steps (``Synthesizer.stream_steps``)."""
    pending: FrameCall | None = None
    """The engine run the stream waits for."""
    voices: Mapping[str, Synthesizer] = field(default_factory=dict)
    """Other voices its script's runs are said in (SSML's ``voice``), held for it: it finishes
    on them whatever the worker evicts meanwhile."""

    def release(self) -> None:
        """Drop the stream's generators as it leaves its scheduler.

        A stream's generator refers back to the stream (its window budget is a closure over
        it), and the stream to its engines: left alone, that cycle keeps the engine set of
        every finished stream resident until Python's cyclic collector happens to run, so a
        hot swap would leave the old engines in memory, hundreds of megabytes each.
        """
        self.steps = None
        self.pending = None

    def params(self) -> SynthesisParams:
        """The stream's synthesis parameters; sets up its resampler (first step only)."""
        job = self.job
        rate = self.synth.sample_rate
        if job.sample_rate is not None and job.sample_rate != rate:
            self.resampler = StreamResampler(rate, job.sample_rate)
        return SynthesisParams(
            speed=job.speed,
            noise_scale=job.noise_scale,
            noise_w=job.noise_w,
            sentence_silence=job.sentence_silence,
            speaker=job.speaker,
            timestamps=job.timestamps,
        )

    def resample(self, chunk: AudioChunk) -> Pcm16:
        """The chunk's samples at the rate the client asked for."""
        if self.resampler is not None:
            return self.resampler.process(chunk.samples, chunk.last)
        return chunk.samples

    def final(self) -> StreamDone:
        """The message that ends the stream without an error: what it sent and what it cost."""
        return StreamDone(self.job.uid, self.samples_sent, self.compute_s)

    def send_chunk(self, chunk: AudioChunk, pcm: Pcm16, elapsed: float, now: float,
                   send: Send) -> None:  # fmt: skip
        """Send one chunk (``pcm``: its samples resampled) at ``now`` on the scheduler's clock;
        the first reports the stream's queue wait, every one the step's cost ``elapsed``."""
        first = self.first_sent_at is None
        if first:
            self.first_sent_at = now
        self.samples_sent += len(chunk.samples)  # at the voice's rate: playback deadlines
        queued = 0.0
        if first and self.started_at is not None:
            queued = self.started_at - self.arrived
        data = pcm.astype("<i2").tobytes()
        send(AudioChunkMsg(self.job.uid, data, chunk.offset, self.synth.engines.label, elapsed,
                           queued, chunk.offset_s, chunk.words))  # fmt: skip

    def send_done(self, send: Send) -> None:
        """End the stream after its last chunk (its scheduler has already let it go)."""
        log.info("stream_done", uid=self.job.uid, engine_version=self.synth.engines.label,
                 audio_samples=self.samples_sent,
                 compute_ms=round(1000 * self.compute_s, 1))  # fmt: skip
        send(self.final())

    def send_error(self, exc: Exception, send: Send) -> None:
        """End the stream with its error (call from an ``except`` block, its scheduler having
        let it go): a bug, not a ``TTSError``, fails the stream, never the worker, and is logged
        with its traceback while the gateway hears only its type."""
        uid = self.job.uid
        if isinstance(exc, TTSError):
            log.info("stream_failed", uid=uid, error_type=exc.type)
            send(StreamError.of(uid, exc))
            return
        log.exception("stream_crashed", uid=uid)  # called from the except block: traceback
        send(StreamError.of(uid, TTSError(f"synthesis failed: {type(exc).__name__}")))

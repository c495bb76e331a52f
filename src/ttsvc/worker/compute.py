"""The worker's compute loop, importable and testable without a process around it.

Many streams share one compute thread, advanced one window at a time:
a stream that has sent nothing goes first (time to first audio), then the stream whose audio
already sent would run out soonest if the client plays it in real time (earliest deadline).
Running one whole request at a time would make the tenth caller wait for nine.

Once a stream is late, streams of different API keys take turns by compute time before
deadlines count: on a worker past its real-time capacity every stream of a flooding key is late,
and deadlines alone would then serve the flood's streams before another key's. While every
stream keeps up, deadlines alone decide (turns would let one key's buffers run ahead while
another key's streams run dry).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ttsvc.audio.resample import StreamResampler
from ttsvc.errors import TTSError
from ttsvc.observability.logs import get_logger
from ttsvc.protocol import AudioChunkMsg, FromWorker, StreamDone, StreamError, SynthesisJob
from ttsvc.synthesis import AudioChunk, FrameCall, Pcm16, Steps, SynthesisParams, Synthesizer

log = get_logger("worker")


@dataclass
class _Stream:
    """One request's progress inside a worker."""

    job: SynthesisJob
    synth: Synthesizer
    """The engines this stream started on: it finishes on them even if the worker swaps."""
    chunks: Iterator[AudioChunk] | None = None
    first_sent_at: float | None = None
    samples_sent: int = 0
    compute_s: float = 0.0
    arrived: float = field(default_factory=time.monotonic)
    started_at: float | None = None
    """When its first step began (``arrived`` to here is its queue wait)."""
    resampler: StreamResampler | None = None
    steps: Steps[AudioChunk] | None = None
    """Batching scheduler only: the stream as steps (``Synthesizer.stream_steps``)."""
    pending: FrameCall | None = None
    """Batching scheduler only: the engine run the stream waits for."""


class StreamScheduler:
    """Multiplexes streams over one synthesizer; lives in a worker's compute thread."""

    def __init__(self, synth: Synthesizer, multiplex: bool = True) -> None:
        self.synth = synth
        self.multiplex = multiplex
        self.streams: dict[str, _Stream] = {}
        self._served: dict[str | None, float] = {}
        """Compute seconds each key's streams have had, among keys with streams here."""

    def add(self, job: SynthesisJob, synth: Synthesizer | None = None) -> None:
        """Queue a new stream on ``synth`` (its voice's engines; default: ``self.synth``); its
        first window runs before any other stream's next window."""
        active = {s.job.key for s in self.streams.values()}
        self._served = {k: v for k, v in self._served.items() if k in active}
        # a key that arrives starts level with the least served one, not owed its idle past
        self._served.setdefault(job.key, min(self._served.values(), default=0.0))
        self.streams[job.uid] = _Stream(job, synth or self.synth)

    def cancel(self, uid: str) -> StreamDone | None:
        """Drop a stream; returns its final message if it was known."""
        stream = self.streams.pop(uid, None)
        if stream is None:
            return None
        self._release(stream)
        return StreamDone(uid, stream.samples_sent, stream.compute_s)

    @staticmethod
    def _release(stream: _Stream) -> None:
        """Drop a stream's generators as it leaves the scheduler.

        A stream's generator refers back to the stream (its window budget is a closure over
        it), and the stream to its engines: left alone, that cycle keeps the engine set of
        every finished stream resident until Python's cyclic collector happens to run, so a
        hot swap would leave the old engines in memory, hundreds of megabytes each.
        """
        stream.chunks = None
        stream.steps = None
        stream.pending = None

    def _next(self) -> _Stream:
        """Fresh streams first (oldest first), then the earliest playback deadline: letting
        nearly-dry running streams go first bought no fewer gaps and cost fresh streams their
        first audio in overload (``docs/decisions.md``)."""
        if not self.multiplex:
            return next(iter(self.streams.values()))  # FIFO: one whole request at a time
        fresh = [s for s in self.streams.values() if s.first_sent_at is None]
        if fresh:
            return min(fresh, key=lambda s: s.arrived)
        streams = list(self.streams.values())
        urgent = min(streams, key=self._deadline)
        keys = {s.job.key for s in streams}
        if len(keys) == 1 or self._deadline(urgent) > time.monotonic():
            return urgent  # every stream keeps up: deadlines alone serve them all
        turn = min(keys, key=lambda k: self._served.get(k, 0.0))
        return min((s for s in streams if s.job.key == turn), key=self._deadline)

    @staticmethod
    def _deadline(stream: _Stream) -> float:
        """When the client's buffered audio runs out if it plays from the first chunk on."""
        assert stream.first_sent_at is not None
        return stream.first_sent_at + stream.samples_sent / stream.synth.sample_rate

    def _budget(self, stream: _Stream) -> float | None:
        """How long ``stream``'s next window may compute: a share of the audio the most pressed
        other stream still has buffered, so that one's next window runs before it goes dry.

        Streams already dry are left out: they have an underrun whatever happens, and shrinking
        windows for them would only pay the vocoder's context again and again. That keeps
        windows large in overload (throughput) and small enough under moderate load (no gaps).
        """
        now = time.monotonic()
        slack = [
            self._deadline(other) - now
            for other in self.streams.values()
            if other is not stream and other.first_sent_at is not None
        ]
        ahead = [s for s in slack if s > 0]
        share = stream.synth.schedule.budget_share
        if not self.multiplex or not ahead or share <= 0:
            return None
        return share * min(ahead)

    @staticmethod
    def _params(stream: _Stream) -> SynthesisParams:
        """The stream's synthesis parameters; sets up its resampler (first step only)."""
        job = stream.job
        rate = stream.synth.sample_rate
        if job.sample_rate is not None and job.sample_rate != rate:
            stream.resampler = StreamResampler(rate, job.sample_rate)
        return SynthesisParams(
            speed=job.speed,
            noise_scale=job.noise_scale,
            noise_w=job.noise_w,
            sentence_silence=job.sentence_silence,
            speaker=job.speaker,
            timestamps=job.timestamps,
        )

    def _start(self, stream: _Stream) -> Iterator[AudioChunk]:
        """Run the front end lazily, inside the stream's first step (its errors are its own)."""
        return stream.synth.stream(
            stream.job.text,
            self._params(stream),
            budget=lambda: self._budget(stream),
            max_audio_s=stream.job.max_audio_s,
        )

    @staticmethod
    def _resample(stream: _Stream, chunk: AudioChunk | None) -> Pcm16 | None:
        if chunk is None:
            return None
        if stream.resampler is not None:
            return stream.resampler.process(chunk.samples, chunk.last)
        return chunk.samples

    def step(self, send: Callable[[FromWorker], None]) -> None:
        """Advance one stream by one window and send what it produced."""
        stream = self._next()
        started = time.perf_counter()
        try:
            if stream.chunks is None:
                stream.started_at = time.monotonic()
                stream.chunks = self._start(stream)
            chunk = next(stream.chunks, None)
            samples = self._resample(stream, chunk)
        except Exception as exc:
            self._fail(stream, exc, send)
            return
        elapsed = time.perf_counter() - started
        stream.compute_s += elapsed
        self._served[stream.job.key] = self._served.get(stream.job.key, 0.0) + elapsed
        self._emit(stream, chunk, samples, elapsed, send)

    def _fail(self, stream: _Stream, exc: Exception, send: Callable[[FromWorker], None]) -> None:
        """End one stream with its error (call from an ``except`` block); a bug, not a
        ``TTSError``, fails the stream, never the worker."""
        uid = stream.job.uid
        del self.streams[uid]
        self._release(stream)
        if isinstance(exc, TTSError):
            log.info("stream_failed", uid=uid, error_type=exc.type)
            send(StreamError.of(uid, exc))
            return
        log.exception("stream_crashed", uid=uid)  # called from the except block: traceback
        send(StreamError.of(uid, TTSError(f"synthesis failed: {type(exc).__name__}")))

    def _emit(
        self,
        stream: _Stream,
        chunk: AudioChunk | None,
        samples: Pcm16 | None,
        elapsed: float,
        send: Callable[[FromWorker], None],
    ) -> None:
        """Send a chunk the stream produced (``None``: it has ended) and end it after its last."""
        if chunk is None or samples is None:
            self._done(stream, send)
            return
        if stream.first_sent_at is None:
            stream.first_sent_at = time.monotonic()
        stream.samples_sent += len(chunk.samples)  # at the voice's rate: playback deadlines
        pcm = samples.astype("<i2").tobytes()
        queued = 0.0
        if stream.started_at is not None and stream.samples_sent == len(chunk.samples):
            queued = stream.started_at - stream.arrived  # the first chunk reports the wait
        label = stream.synth.engines.label
        send(AudioChunkMsg(stream.job.uid, pcm, chunk.offset, label, elapsed, queued,
                           chunk.offset_s, chunk.words))  # fmt: skip
        if chunk.last:
            self._done(stream, send)

    def _done(self, stream: _Stream, send: Callable[[FromWorker], None]) -> None:
        del self.streams[stream.job.uid]
        self._release(stream)
        log.info(
            "stream_done",
            uid=stream.job.uid,
            engine_version=stream.synth.engines.label,
            audio_samples=stream.samples_sent,
            compute_ms=round(1000 * stream.compute_s, 1),
        )
        send(StreamDone(stream.job.uid, stream.samples_sent, stream.compute_s))

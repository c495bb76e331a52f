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
from collections.abc import Iterator, Mapping

from ttsvc.protocol import StreamDone, SynthesisJob
from ttsvc.synthesis import AudioChunk, Pcm16, Synthesizer
from ttsvc.worker.scheduling import Load
from ttsvc.worker.streams import ActiveStream, Send


class StreamScheduler:
    """Multiplexes streams over one synthesizer, stepped by the worker loop's own thread
    (``Scheduler.pump``): one step at a time, so its streams need no lock."""

    threads = 1
    """The worker loop's thread runs every step."""

    def __init__(self, synth: Synthesizer, multiplex: bool = True) -> None:
        self.synth = synth
        self.multiplex = multiplex
        self.streams: dict[str, ActiveStream] = {}
        self._served: dict[str | None, float] = {}
        """Compute seconds each key's streams have had, among keys with streams here."""

    # -- the worker loop's interface (``worker.scheduling``) ----------------------------------

    def add(self, job: SynthesisJob, synth: Synthesizer | None = None,
            voices: Mapping[str, Synthesizer] | None = None) -> None:  # fmt: skip
        """Queue a new stream on ``synth`` (its voice's engines; default: ``self.synth``); its
        first window runs before any other stream's next window."""
        active = {s.job.key for s in self.streams.values()}
        self._served = {k: v for k, v in self._served.items() if k in active}
        # a key that arrives starts level with the least served one, not owed its idle past
        self._served.setdefault(job.key, min(self._served.values(), default=0.0))
        self.streams[job.uid] = ActiveStream(job, synth or self.synth, voices=voices or {})

    def cancel(self, uid: str) -> StreamDone | None:
        """Drop a stream; returns its final message if it was known."""
        stream = self.streams.pop(uid, None)
        if stream is None:
            return None
        stream.release()
        return stream.final()

    def use(self, synth: Synthesizer) -> None:
        self.synth = synth

    def in_hand(self) -> int:
        return len(self.streams)

    def current_load(self, elsewhere: int) -> Load:
        """No admission here: capacity, demand and streams held back for capacity are the
        deadline scheduler's figures, and stay 0 (unknown) in this one's heartbeats."""
        return Load(len(self.streams) + elsewhere)

    def stalled_for(self) -> float:
        """Always 0: a step that hangs hangs the loop's thread, and its heartbeats with it."""
        return 0.0

    def start(self, send: Send) -> None:
        """Nothing to start: the loop's ``pump`` runs the steps."""

    def wants_turn(self) -> bool:
        return bool(self.streams)

    def pump(self, send: Send) -> None:
        """One step, if a stream is left (a cancel may have ended the last)."""
        if self.streams:
            self.step(send)

    def close(self) -> None:
        """Nothing to stop: no thread of its own."""

    # -- order and steps ----------------------------------------------------------------------

    def _next(self) -> ActiveStream:
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
    def _deadline(stream: ActiveStream) -> float:
        """When the client's buffered audio runs out if it plays from the first chunk on."""
        assert stream.first_sent_at is not None
        return stream.first_sent_at + stream.samples_sent / stream.synth.sample_rate

    def _budget(self, stream: ActiveStream) -> float | None:
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

    def _start(self, stream: ActiveStream) -> Iterator[AudioChunk]:
        """Run the front end lazily, inside the stream's first step (its errors are its own)."""
        return stream.synth.stream(
            stream.job.text,
            stream.params(),
            budget=lambda: self._budget(stream),
            max_audio_s=stream.job.max_audio_s,
            script=stream.job.script,
            voices=stream.voices,
        )

    def step(self, send: Send) -> None:
        """Advance one stream by one window and send what it produced."""
        stream = self._next()
        started = time.perf_counter()
        try:
            if stream.chunks is None:
                stream.started_at = time.monotonic()
                stream.chunks = self._start(stream)
            chunk = next(stream.chunks, None)
            samples = None if chunk is None else stream.resample(chunk)
        except Exception as exc:
            self._fail(stream, exc, send)
            return
        elapsed = time.perf_counter() - started
        stream.compute_s += elapsed
        self._served[stream.job.key] = self._served.get(stream.job.key, 0.0) + elapsed
        self._emit(stream, chunk, samples, elapsed, send)

    def _fail(self, stream: ActiveStream, exc: Exception, send: Send) -> None:
        """End one stream with its error (call from an ``except`` block)."""
        del self.streams[stream.job.uid]
        stream.release()
        stream.send_error(exc, send)

    def _emit(self, stream: ActiveStream, chunk: AudioChunk | None, samples: Pcm16 | None,
              elapsed: float, send: Send) -> None:  # fmt: skip
        """Send a chunk the stream produced (``None``: it has ended) and end it after its last."""
        if chunk is None or samples is None:
            self._done(stream, send)
            return
        stream.send_chunk(chunk, samples, elapsed, time.monotonic(), send)
        if chunk.last:
            self._done(stream, send)

    def _done(self, stream: ActiveStream, send: Send) -> None:
        del self.streams[stream.job.uid]
        stream.release()
        stream.send_done(send)

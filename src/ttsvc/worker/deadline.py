"""The real-time scheduler: K compute threads of one worker process over one deadline queue.

Why: a stream's audio is played as it arrives, so each stream has a deadline (the moment the
audio already sent runs out) and the only thing that matters is that its next chunk is sent
before it. A stream pinned to one compute thread stalls while that thread runs another stream's
window even when the next core idles; here any free thread takes the most urgent step of any
stream in the process (earliest deadline first). ONNX Runtime releases the GIL inside ``run``
and its sessions are safe to run from several threads, so K threads with one intra-op thread
each use K cores while the engine weights are loaded once per process.

Three rules keep streams playing:

* **Steps are single engine runs** (``FrameCall``: a sentence's acoustic run, a flow chunk, a
  vocoder window), so no step carries another's cost, except a fresh stream's first chunk (its
  front end, acoustic run and first window in one step: queued again between them behind
  playing streams, its first audio waited a step floor per call). The window and flow sizes
  are bounded by ``budget``: a step may last as long as the other threads can serve every
  other stream (and a newcomer, while one could be admitted) in time without it, with a floor
  that keeps the overlap cost small. Costs are estimated from those measured at start, scaled
  by how much slower steps run now (cores shared with the gateway and clients).
* **A fresh stream is due ``first_audio_s`` after it arrived**, so its first window goes before
  running streams that still have more audio buffered than that, and after those that do not.
* **Admission by real-time capacity.** An admitted stream needs up to one audio second per
  second: less when it is ahead of its listener (what it has left, spread over the time its
  buffer buys); the process knows how many it can compute (``Capacity``: measured at start,
  kept current from the real cost of every step). A new stream that would push demand past
  ``load_limit`` x capacity waits, oldest first (the key with the fewest admitted streams
  first, so one key's burst cannot hold every place), and its time to first audio grows instead
  of every running stream stalling.

It is the worker's one scheduler. On engines that run batches (GPU plans, ``worker.batching``)
a step is one engine call for the picked stream and the next ready streams whose call has the
same shape (``riders``); on the CPU's engines, which do not batch, every step is a single call.

The policy (``pick``, ``riders``, ``budget``, admission) reads time only through the injected
clock, so tests drive it with a fake one; the threads are plain ``threading.Thread``s started by
``start``. The estimates it rests on (what a step and a chunk cost, ``Capacity``, the layout
``first_late``, the canary's ``measure``) are the cost model in ``worker.costs``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ttsvc.errors import TTSError
from ttsvc.observability.logs import get_logger
from ttsvc.protocol import StreamDone, StreamError, SynthesisJob
from ttsvc.synthesis import Answer, AudioChunk, FrameCall, Pcm16, Synthesizer
from ttsvc.worker.batching import run_batch
from ttsvc.worker.costs import call_cost, slowdown_after
from ttsvc.worker.deadline_policy import AUDIO_PER_CHAR_MEMORY, DeadlinePolicy, Live
from ttsvc.worker.streams import Send

log = get_logger("worker")


@dataclass(frozen=True)
class Load:
    """The scheduler's figures for one heartbeat, read at one instant (as ``Heartbeat``'s)."""

    qsize: int
    """Streams here, running or waiting, and requests waiting for their voice to load."""
    capacity: float = 0.0
    demand: float = 0.0
    waiting: int = 0
    misses: int = 0
    late_s: float = 0.0


class DeadlineScheduler(DeadlinePolicy):
    """Streams of one worker process, stepped by K threads in deadline order: its own threads
    from ``start`` on, so the worker loop's ``pump`` has nothing to do."""

    _closed = False
    """Set by ``close``: the threads stop after their current step."""

    # -- streams ------------------------------------------------------------------------------

    def add(self, job: SynthesisJob, synth: Synthesizer | None = None,
            voices: Mapping[str, Synthesizer] | None = None) -> None:  # fmt: skip
        """Queue a new stream on ``synth`` (its voice's engines; default: ``self.synth``); it
        is admitted when it fits the capacity."""
        with self.lock:
            self.streams[job.uid] = Live(job, synth or self.synth, arrived=self.clock(),
                                         voices=voices or {})  # fmt: skip
            self.admit()
            self.lock.notify()

    def cancel(self, uid: str) -> StreamDone | None:
        """Drop a stream; its final message, or None when unknown or ended by its thread."""
        with self.lock:
            stream = self.streams.get(uid)
            if stream is None:
                return None
            if stream.running:
                stream.cancelled = True  # its thread sends the final message after the step
                return None
            self._remove(stream)
        return stream.final()

    def use(self, synth: Synthesizer) -> None:
        with self.lock:
            self.synth = synth

    def in_hand(self) -> int:
        return len(self.streams)

    def current_load(self, elsewhere: int) -> Load:
        """Read under the lock: the figures of one instant, as the gateway's admission and
        routing compare them with each other."""
        with self.lock:
            return Load(len(self.streams) + elsewhere, self.capacity.value, self.demand(),
                        self.waiting() + elsewhere, self.misses, self.late_s)  # fmt: skip

    def _remove(self, stream: Live) -> None:
        """Forget a stream (lock held) and admit whoever now fits."""
        if self.streams.get(stream.job.uid) is stream:
            del self.streams[stream.job.uid]
        stream.release()
        self.admit()
        self.lock.notify_all()

    # -- threads ------------------------------------------------------------------------------

    def start(self, send: Send) -> None:
        """Start the compute threads; each sends what its steps produce with ``send``."""
        for index in range(self.threads):
            threading.Thread(target=self.run, args=(send,), daemon=True,
                             name=f"compute-{index}").start()  # fmt: skip

    def close(self) -> None:
        """Stop the threads after their current step."""
        with self.lock:
            self._closed = True
            self.lock.notify_all()

    def take(self) -> tuple[Live, list[Live]] | None:
        """The next step's streams, marked running (lock held): ``pick``'s choice and, on
        engines that batch, the streams whose call rides along with it (``riders``); None when
        no stream is ready. Its thread frees when the head's step is expected to end."""
        stream = self.pick()
        if stream is None:
            return None
        riders = self.riders(stream)
        for each in (stream, *riders):
            each.running = True
            each.step_started = time.monotonic()
            each.estimate = 0.0
            each.busy_until = 0.0  # a rider holds no thread: the head's counts
        if not riders and stream.pending is not None:
            # a batch's wall time is no single call's: only lone calls teach slowdown
            stream.estimate = call_cost(stream, self.first_chunk_s)
        stream.busy_until = self.clock() + self.step_cost(stream)
        return stream, riders

    def run(self, send: Send) -> None:
        """One compute thread: take the most urgent step (``take``), run it, send its audio;
        repeat. Ends on ``close`` or when the pipe to the gateway is gone."""
        while True:
            with self.lock:
                taken = self.take()
                while taken is None and not self._closed:
                    self.lock.wait()
                    taken = self.take()
                if taken is None:
                    return
                stream, riders = taken
                del taken
            try:
                self.step(stream, send, riders)
            except (OSError, EOFError):
                return  # the gateway went away: the main thread ends the process
            except Exception:  # a bug outside the streams' own work: keep the thread serving
                for each in (stream, *riders):
                    log.exception("compute_step_crashed", uid=each.job.uid)
                    with self.lock:
                        each.running = False
                        known = self.streams.get(each.job.uid) is each
                        self._remove(each)
                    if known:  # its one final message, if nothing sent one yet
                        send(StreamError.of(each.job.uid, TTSError("synthesis failed")))
            finally:
                for each in (stream, *riders):
                    each.step_started = None
                # an idle thread must not keep its last streams, and through them their
                # engines, alive: after a swap they would stay resident until their next step
                del stream, riders, each

    def stalled_for(self) -> float:
        """How long the oldest step still running has run (0 when none): a step hung in native
        code shows here, and the worker then stops its heartbeats so the gateway replaces it."""
        with self.lock:
            started = [s.step_started for s in self.streams.values() if s.step_started is not None]
        return time.monotonic() - min(started) if started else 0.0

    def step(self, stream: Live, send: Send, riders: Sequence[Live] = ()) -> None:
        """Run one engine call of ``stream`` (marked running; a fresh one: every call up to its
        first chunk) and send the chunks it completes. With ``riders`` (marked running too),
        the same call of each runs with it as one batch, and each goes on to its own chunks."""
        started = time.perf_counter()
        batch = [stream, *riders]
        answers: Sequence[Answer | None] = [None] * len(batch)
        if riders:
            calls = [s.pending for s in batch if s.pending is not None]
            try:
                answers = run_batch(calls[0].engines or stream.synth.engines, calls)
            except Exception as exc:  # they shared the call: each gets the error
                for each in batch:
                    self._fail(each, exc, send)
                return
        done: list[tuple[Live, list[AudioChunk], list[Pcm16], bool]] = []
        for each, answer in zip(batch, answers, strict=True):
            chunks: list[AudioChunk] = []
            try:
                ended = self._advance(each, chunks, answer)
                # a fresh stream's first chunk is one step: its front end, acoustic run and
                # first window back to back on this thread, as ``busy_until`` and ``budget``
                # count it, never queued again behind playing streams between its calls
                while not (ended or chunks or each.cancelled) and each.first_sent_at is None:
                    ended = self._advance(each, chunks)
                samples = [each.resample(c) for c in chunks]
            except Exception as exc:  # a bug or a TTSError fails this stream, never the thread
                self._fail(each, exc, send)
                continue
            done.append((each, chunks, samples, ended))
        elapsed = (time.perf_counter() - started) / len(batch)
        for each, chunks, samples, ended in done:
            self._finish(each, chunks, samples, ended, elapsed, send)

    def _finish(self, stream: Live, chunks: list[AudioChunk], samples: list[Pcm16], ended: bool,
                elapsed: float, send: Send) -> None:  # fmt: skip
        """After a stream's step (``elapsed``: its share of the step's wall time): learn from
        it, send its chunks unless it was cancelled meanwhile, and end it or free it for the
        next step."""
        stream.compute_s += elapsed
        audio = sum(len(c.samples) for c in chunks) / stream.synth.sample_rate
        with self.lock:
            self.record(stream, audio, elapsed)
            self.admit()  # a capacity grown past the demand lets a held stream in
            cancelled = stream.cancelled
        if not cancelled:
            for chunk, pcm in zip(chunks, samples, strict=True):
                self._emit(stream, chunk, pcm, elapsed, send)
                elapsed = 0.0  # the step's cost is reported once
        with self.lock:
            stream.running = False
            if cancelled or ended or (chunks and chunks[-1].last):
                self._remove(stream)
            else:
                self.lock.notify()
        if cancelled:
            send(stream.final())
        elif ended or (chunks and chunks[-1].last):
            self._done(stream, send)

    def record(self, stream: Live, audio_s: float, elapsed: float) -> None:
        """Learn from one step (lock held): its audio and wall time refine the capacity, and
        its wall time over its estimate (an engine call's, not a stream's first step, which
        includes the front end) the slowdown every estimate is scaled by."""
        self.capacity.record(audio_s, elapsed)
        if stream.estimate > 0:
            self.slowdown = slowdown_after(self.slowdown, elapsed, stream.estimate)

    def _advance(self, stream: Live, chunks: list[AudioChunk],
                 answer: Answer | None = None) -> bool:  # fmt: skip
        """Run the stream's pending engine call (or start it) and carry it to its next call,
        collecting the chunks completed on the way; True when it has ended. ``answer``: the
        pending call's answer when a batch already ran it."""
        if stream.steps is None:
            stream.started_at = self.clock()
            job = stream.job
            alone = len(self.streams) <= 1  # nothing else plays: a smaller first window
            schedule = stream.synth.schedule.alone() if alone else None
            stream.steps = stream.synth.stream_steps(
                job.text, stream.params(), schedule,
                budget=lambda: self.budget(stream), max_audio_s=job.max_audio_s,
                script=job.script, voices=stream.voices,
                whole=lambda cost: self.whole(stream, cost))  # fmt: skip
            answer = None
        elif answer is None:
            assert stream.pending is not None
            answer = stream.synth.run_call(stream.pending)
        stream.pending = None
        try:
            item = stream.steps.send(answer)
            while isinstance(item, AudioChunk):
                chunks.append(item)
                if item.last:
                    return True
                item = stream.steps.send(None)
        except StopIteration:
            return True
        stream.pending = item if isinstance(item, FrameCall) else None
        return False

    def _emit(self, stream: Live, chunk: AudioChunk, pcm: Pcm16, elapsed: float,
              send: Send) -> None:  # fmt: skip
        """Send one chunk, counting it as a deadline miss if the client has run dry."""
        now = self.clock()
        if stream.first_sent_at is not None:
            late = now - self.due(stream)
            if late > 0:
                with self.lock:
                    self.misses += 1
                    self.late_s += late
        stream.send_chunk(chunk, pcm, elapsed, now, send)

    def _done(self, stream: Live, send: Send) -> None:
        """End a stream after its last chunk; its audio per character refines ``demand``'s
        estimate of how much the streams still playing have left."""
        if stream.job.text and stream.samples_sent:
            per_char = (stream.samples_sent / stream.synth.sample_rate * stream.job.speed
                        / len(stream.job.text))  # fmt: skip
            with self.lock:
                self.audio_per_char += (per_char - self.audio_per_char) / AUDIO_PER_CHAR_MEMORY
        stream.send_done(send)

    def _fail(self, stream: Live, exc: Exception, send: Send) -> None:
        """End one stream with its error (from an ``except`` block); a stream cancelled during
        the failing step ends as cancelled."""
        with self.lock:
            stream.running = False
            cancelled = stream.cancelled
            self._remove(stream)
        if cancelled:
            send(stream.final())
        else:
            stream.send_error(exc, send)

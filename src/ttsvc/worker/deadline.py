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
  vocoder window), so no step carries another's cost, and the window and flow sizes are bounded
  by ``budget``: a step may last as long as the other threads can serve every other stream
  (and a newcomer, while one could be admitted) in time without it, with a floor that keeps
  the overlap cost small. Costs are estimated from those measured at start, scaled by how much
  slower steps run now (cores shared with the gateway and clients).
* **A fresh stream is due ``first_audio_s`` after it arrived**, so its first window goes before
  running streams that still have more audio buffered than that, and after those that do not.
* **Admission by real-time capacity.** An admitted stream needs up to one audio second per
  second: less when it is ahead of its listener (what it has left, spread over the time its
  buffer buys); the process knows how many it can compute (``Capacity``: measured at start,
  kept current from the real cost of every step). A new stream that would push demand past
  ``load_limit`` x capacity waits, oldest first (the key with the fewest admitted streams
  first, so one key's burst cannot hold every place), and its time to first audio grows instead
  of every running stream stalling.

The policy (``pick``, ``budget``, admission) reads time only through the injected clock, so
tests drive it with a fake one; the threads are plain ``threading.Thread``s started by
``start``.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ttsvc.errors import TTSError
from ttsvc.observability.logs import get_logger
from ttsvc.protocol import AudioChunkMsg, FromWorker, StreamDone, StreamError, SynthesisJob
from ttsvc.synthesis import CANARY_TEXT, AudioChunk, FrameCall, Pcm16, SynthesisParams, Synthesizer
from ttsvc.worker.compute import StreamScheduler, _Stream

log = get_logger("worker")

Send = Callable[[FromWorker], None]

FIRST_AUDIO_S = 0.1
"""A fresh stream's first chunk is due this long after it arrived."""
HORIZON_S = 1.0
"""How far ahead ``budget`` lays out the other streams' steps: about the longest step worth
taking (past a few hundred frames a window costs no less per frame)."""
STEP_FLOOR_S = 0.1
"""No budget is smaller than this by default (``step_floor_s`` of a scheduler;
``TTSVC_STEP_FLOOR_MS``): a short window's overlap costs about as much as its audio, and on a
busy worker those costs add up to the capacity that keeps streams from running dry."""
LAYOUT_STEP_S = 0.03
"""The least audio ``first_late`` counts a laid-out step as buying its stream, so a layout of
streams whose steps buy almost nothing still ends."""
GUARD_S = 0.1
"""A playing stream whose next step must start within this goes before fresh streams: about
the longest step another thread may be in the middle of when it is picked."""
DELIVERY_S = 0.03
"""A chunk must reach the player, not only leave the worker, by its deadline: the pipe, the
gateway's event loop and the socket take about this long on a loaded machine."""
CAPACITY_MEMORY = 200
"""Steps over which the measured capacity averages (exponentially): a few seconds of work."""
AUDIO_PER_CHAR_S = 0.07
"""Seconds of audio per character of English text at speed 1, until the worker measures it."""
AUDIO_PER_CHAR_MEMORY = 50
"""Finished streams over which the audio per character averages (exponentially)."""
MIN_LEFT_S = 0.2
"""A playing stream counts as having at least this much audio left until it ends (the estimate
from its text length may run out before the stream does)."""
SLOWDOWN_RANGE = (0.5, 4.0)
"""One step's wall time over its estimate counts within these bounds (a step stopped by the
kernel for a second must not make every estimate absurd)."""


@dataclass
class _Live(_Stream):
    """A stream in the deadline scheduler."""

    admitted: bool = False
    running: bool = False
    """A thread is computing its step: no other thread may touch it."""
    cancelled: bool = False
    """The client left during a step: the thread that runs it ends it."""
    step_started: float | None = None
    """Monotonic time its running step began (real time, for hang detection)."""
    busy_until: float = 0.0
    """When its running step is expected to end (scheduler clock): its thread frees then."""
    estimate: float = 0.0
    """Its running engine call's cost measured alone (0: the stream's first step)."""


class Capacity:
    """Audio seconds per second one process computes with all its threads, from step costs.

    Measured from wall time per step rather than CPU time, so a core shared with the gateway or
    another tenant shows as less capacity, which is what admission needs to know.
    """

    def __init__(self, threads: int, per_thread: float) -> None:
        self.threads = threads
        self._audio = per_thread
        self._compute = 1.0

    def record(self, audio_s: float, compute_s: float) -> None:
        """One step's audio (0 for an acoustic or flow step) and its wall time."""
        keep = 1.0 - 1.0 / CAPACITY_MEMORY
        self._audio = keep * self._audio + audio_s
        self._compute = keep * self._compute + compute_s

    @property
    def value(self) -> float:
        """Audio seconds per second with every thread busy."""
        return self.threads * self._audio / max(self._compute, 1e-9)


class DeadlineScheduler:
    """Streams of one worker process, stepped by K threads in deadline order."""

    def __init__(
        self,
        synth: Synthesizer,
        threads: int = 1,
        load_limit: float = 0.9,
        per_thread: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        first_audio_s: float = FIRST_AUDIO_S,
        first_chunk_s: float = 0.0,
        audio_per_char: float = AUDIO_PER_CHAR_S,
        step_floor_s: float = STEP_FLOOR_S,
        guard_s: float = GUARD_S,
    ) -> None:
        self.synth = synth
        """Engines new streams start on (a swap replaces it; running streams keep theirs)."""
        self.threads = threads
        self.load_limit = load_limit
        self.clock = clock
        self.first_audio_s = first_audio_s
        self.capacity = Capacity(threads, per_thread)
        self.first_chunk_s = first_chunk_s
        """Compute seconds from a stream's arrival to its first chunk, alone (measured at
        start with the canary; 0 until then)."""
        self.audio_per_char = audio_per_char
        """Seconds of audio per character of text at speed 1 (from the canary, then from every
        stream that ends): how much a stream has left, for ``demand``."""
        self.step_floor_s = step_floor_s
        """The shortest bound ``budget`` sets: larger steps overlap less (throughput), at the
        price of a longer wait for a stream that needs a thread while one runs."""
        self.guard_s = guard_s
        """A playing stream whose next step must start within this goes before fresh ones
        (``GUARD_S``; ``benchmarks/scheduler_bench.py`` measures others)."""
        self.streams: dict[str, _Live] = {}
        """Every stream, admitted or waiting, in arrival order."""
        self.slowdown = 1.0
        """Wall time of recent engine calls over their cost measured alone at start: cores
        shared with the gateway, clients or other tenants make every step slower, and the
        estimates that order and bound steps follow (exponential over ``CAPACITY_MEMORY``)."""
        self.misses = 0
        """Chunks sent after their stream's playback deadline."""
        self.late_s = 0.0
        """Seconds those chunks were late, summed."""
        self.lock = threading.Condition()
        self._closed = False
        self._threads: list[threading.Thread] = []

    # -- policy (call with ``lock`` held) ---------------------------------------------------

    def demand(self) -> float:
        """Audio seconds per second the admitted streams need to finish without running dry:
        a fresh stream one; a playing one with ``b`` seconds buffered and about ``r`` left to
        compute, ``r / (r + b)`` (spread evenly over the time its buffer buys). A stream ahead
        of its listener needs less than one, so the ones behind it can be admitted; one near
        its deadline needs one, as before."""
        now = self.clock()
        return sum(self._need(s, now) for s in self.streams.values() if s.admitted)

    def _need(self, stream: _Stream, now: float) -> float:
        if stream.first_sent_at is None:
            return 1.0
        sent = stream.samples_sent / stream.synth.sample_rate
        estimate = len(stream.job.text) * self.audio_per_char / max(stream.job.speed, 1e-3)
        left = max(estimate - sent, MIN_LEFT_S)
        ahead = max(self.due(stream) - now, 0.0)
        return left / (left + ahead)

    def waiting(self) -> int:
        """Streams held back by admission."""
        return sum(1 for s in self.streams.values() if not s.admitted)

    def _room(self) -> bool:
        """Whether one more stream fits in the real-time capacity. As many streams as threads
        always do (and any number while the capacity is unknown): a machine measured slow
        still serves, only with less company per core."""
        admitted = sum(1 for s in self.streams.values() if s.admitted)
        capacity = self.capacity.value
        return (capacity <= 0 or admitted < self.threads
                or self.demand() + 1 <= self.load_limit * capacity)  # fmt: skip

    def admit(self) -> None:
        """Admit waiting streams while they fit: from the key with the fewest admitted streams,
        oldest first."""
        while True:
            waiting = [s for s in self.streams.values() if not s.admitted]
            if not waiting or not self._room():
                return
            held: dict[str | None, int] = {}
            for s in self.streams.values():
                if s.admitted:
                    held[s.job.key] = held.get(s.job.key, 0) + 1
            nxt = min(waiting, key=lambda s: (held.get(s.job.key, 0), s.arrived))
            nxt.admitted = True

    def due(self, stream: _Stream) -> float:
        """When the stream's next chunk must be sent: its first-audio target while it is fresh,
        else when the audio it has sent runs out for a client that plays it from the start."""
        if stream.first_sent_at is None:
            return stream.arrived + self.first_audio_s
        return stream.first_sent_at + stream.samples_sent / stream.synth.sample_rate

    def latest_start(self, stream: _Stream) -> float:
        """When the stream's next step must start for its next chunk to be sent by ``due``: the
        due time less what the steps up to that chunk cost (least laxity first). A stream that
        still has to run a flow chunk before its next window is more pressed than one whose
        window is all that is left, at the same deadline.

        Fresh streams are ordered by their due time alone: a burst of them shares one target,
        and subtracting what each has left would start every one's acoustic run before any
        first window, so all would start late; by due time (then arrival) they finish their
        first chunks one after another."""
        if stream.first_sent_at is None:
            return self.due(stream)
        return self.due(stream) - DELIVERY_S - self.cost_to_chunk(stream)

    def cost_to_chunk(self, stream: _Stream) -> float:
        """Estimated seconds from the stream's pending call to its next chunk, from the
        per-frame and per-phoneme costs the synthesizer measured at start, as slow as steps
        run now."""
        return self.slowdown * self._chunk_cost(stream)

    def _chunk_cost(self, stream: _Stream) -> float:
        synth, call = stream.synth, stream.pending
        first = synth.schedule.first
        vctx, fctx = synth.vocoder_context, synth.flow_context
        window = (first + vctx.left + vctx.right) * synth.vocoder_cost_s
        flow = 0.0 if fctx is None else (first + vctx.right + fctx.right) * synth.flow_cost_s
        if call is None:  # not started: front end, acoustic run, then the first window
            return self.first_chunk_s
        if call.stage == "acoustic":
            return int(call.inputs.shape[1]) * synth.acoustic_cost_s + flow + window
        frames = int(call.inputs.shape[2])
        if call.stage == "flow":
            return frames * synth.flow_cost_s + window
        return frames * synth.vocoder_cost_s

    def step_cost(self, stream: _Stream) -> float:
        """Estimated seconds of the stream's pending call alone (a stream not started: its
        front end, acoustic run and first window), as slow as steps run now."""
        return self.slowdown * self._call_cost(stream)

    def _call_cost(self, stream: _Stream) -> float:
        """The pending call's cost from the costs measured at start, alone on a core."""
        synth, call = stream.synth, stream.pending
        if call is None:
            return self.first_chunk_s
        if call.stage == "acoustic":
            return int(call.inputs.shape[1]) * synth.acoustic_cost_s
        cost = synth.flow_cost_s if call.stage == "flow" else synth.vocoder_cost_s
        return int(call.inputs.shape[2]) * cost

    def start_by(self, stream: _Stream) -> float:
        """When the stream's next step must start for its next chunk to be in time: for a
        playing stream ``latest_start``; for a fresh one its first-audio target less what a
        first chunk costs alone, so a burst of fresh streams keeps arrival order."""
        if stream.first_sent_at is None:
            return self.due(stream) - self.first_chunk_s
        return self.latest_start(stream)

    def pick(self) -> _Live | None:
        """The admitted, idle stream to step next.

        First a playing stream that must start its next step within ``guard_s`` (a stall is
        audible, so it goes before everything); then fresh streams, by due time (a late first
        chunk only lengthens a wait); then the other playing streams, least laxity first.
        Arrival breaks ties. Nothing starves: a playing stream's laxity shrinks as time passes
        until it is first in line, and a fresh stream's turn comes before any playing stream
        that is not about to run dry.
        """
        ready = [s for s in self.streams.values() if s.admitted and not s.running]
        if not ready:
            return None
        now = self.clock()
        return min(ready, key=lambda s: self.rank(s, now))

    def rank(self, stream: _Stream, now: float) -> tuple[int, float, float]:
        """``pick``'s order key: class (0 a playing stream inside the guard, 1 a fresh stream,
        2 another playing stream), then its start-by or due time, then arrival."""
        if stream.first_sent_at is None:
            return (1, self.due(stream), stream.arrived)
        start = self.latest_start(stream)
        return (0 if start <= now + self.guard_s else 2, start, stream.arrived)

    def _free_threads(self, now: float, exclude: _Stream | None) -> list[float]:
        """When each thread other than the caller's frees: now for an idle one, else when its
        step is expected to end (``exclude``: the caller's own stream, running)."""
        free = [now] * (self.threads - 1 if exclude is not None else self.threads)
        for s in self.streams.values():
            if s.running and s is not exclude and now in free:
                free[free.index(now)] = max(now, s.busy_until)
        return free

    def _task(self, stream: _Stream, now: float) -> tuple[float, float, float]:
        """The stream's next step for ``first_late``: start by, cost, and the audio a chunk
        buys per compute second (what one thread computes)."""
        rate = self.capacity.value / max(self.threads, 1)
        return (max(now, self.start_by(stream)), self.step_cost(stream), rate)

    def budget(self, stream: _Stream) -> float | None:
        """Longest step ``stream`` may take now (None: no bound).

        As long as the thread running it is away, the other threads must serve every other
        stream in time. So the other streams' next steps (and the ones after, each chunk buying
        its stream as much audio as a thread computes in that time) are laid out, least laxity
        first, on the other threads from when each frees; the step may last until the first
        one of them that would start late, which this thread then takes. While admission has
        room, a newcomer arriving now is among them. A stream already late is past helping and
        shrinking steps for it would only cost everyone overlap, so it is left out. Never below
        ``step_floor_s``. With a thread free for every other stream, steps grow freely
        (throughput).
        """
        with self.lock:
            now = self.clock()
            free = self._free_threads(now, exclude=stream)
            tasks = [self._task(s, now) for s in self.streams.values()
                     if s.admitted and not s.running and s is not stream and self.due(s) > now]
            rate = self.capacity.value / max(self.threads, 1)
            if self._room():
                first = self.slowdown * self.first_chunk_s
                tasks.append((now + self.first_audio_s - first, first, rate))
            late = first_late(tasks, free, now + HORIZON_S)
            if late is None:
                return None
            # the synthesizer sizes steps from the costs measured alone: scale to match
            return max(self.step_floor_s, (late - now) / self.slowdown)

    # -- streams ------------------------------------------------------------------------------

    def add(self, job: SynthesisJob, synth: Synthesizer | None = None) -> None:
        """Queue a new stream on ``synth`` (its voice's engines; default: ``self.synth``); it
        is admitted when it fits the capacity."""
        with self.lock:
            self.streams[job.uid] = _Live(job, synth or self.synth, arrived=self.clock())
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
        return StreamDone(uid, stream.samples_sent, stream.compute_s)

    def _remove(self, stream: _Live) -> None:
        """Forget a stream (lock held) and admit whoever now fits."""
        if self.streams.get(stream.job.uid) is stream:
            del self.streams[stream.job.uid]
        StreamScheduler._release(stream)
        self.admit()
        self.lock.notify_all()

    # -- threads ------------------------------------------------------------------------------

    def start(self, send: Send) -> None:
        """Start the compute threads; each sends what its steps produce with ``send``."""
        for index in range(self.threads):
            thread = threading.Thread(target=self.run, args=(send,), daemon=True,
                                      name=f"compute-{index}")  # fmt: skip
            thread.start()
            self._threads.append(thread)

    def close(self) -> None:
        """Stop the threads after their current step."""
        with self.lock:
            self._closed = True
            self.lock.notify_all()

    def run(self, send: Send) -> None:
        """One compute thread: take the most urgent step, run it, send its audio; repeat.
        Ends on ``close`` or when the pipe to the gateway is gone."""
        while True:
            with self.lock:
                stream = self.pick()
                while stream is None and not self._closed:
                    self.lock.wait()
                    stream = self.pick()
                if stream is None:
                    return
                stream.running = True
                stream.step_started = time.monotonic()
                stream.estimate = self._call_cost(stream) if stream.pending is not None else 0.0
                stream.busy_until = self.clock() + self.step_cost(stream)
            try:
                self.step(stream, send)
            except (OSError, EOFError):
                return  # the gateway went away: the main thread ends the process
            except Exception:  # a bug outside the stream's own work: keep the thread serving
                log.exception("compute_step_crashed", uid=stream.job.uid)
                with self.lock:
                    stream.running = False
                    known = self.streams.get(stream.job.uid) is stream
                    self._remove(stream)
                if known:  # its one final message, if nothing sent one yet
                    send(StreamError(stream.job.uid, 500, "internal_error", "synthesis failed"))
            finally:
                stream.step_started = None
                # an idle thread must not keep its last stream, and through it that stream's
                # engines, alive: after a swap they would stay resident until its next step
                del stream

    def stalled_for(self) -> float:
        """How long the oldest step still running has run (0 when none): a step hung in native
        code shows here, and the worker then stops its heartbeats so the gateway replaces it."""
        with self.lock:
            started = [s.step_started for s in self.streams.values() if s.step_started is not None]
        return time.monotonic() - min(started) if started else 0.0

    def step(self, stream: _Live, send: Send) -> None:
        """Run one engine call of ``stream`` (marked running) and send the chunks it completes."""
        started = time.perf_counter()
        chunks: list[AudioChunk] = []
        ended = False
        try:
            ended = self._advance(stream, chunks)
            samples = [StreamScheduler._resample(stream, c) for c in chunks]
        except Exception as exc:  # a bug or a TTSError fails this stream, never the thread
            self._fail(stream, exc, send)
            return
        elapsed = time.perf_counter() - started
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
            send(StreamDone(stream.job.uid, stream.samples_sent, stream.compute_s))
        elif ended or (chunks and chunks[-1].last):
            self._done(stream, send)

    def record(self, stream: _Live, audio_s: float, elapsed: float) -> None:
        """Learn from one step (lock held): its audio and wall time refine the capacity, and
        its wall time over its estimate (an engine call's, not a stream's first step, which
        includes the front end) the slowdown every estimate is scaled by."""
        self.capacity.record(audio_s, elapsed)
        if stream.estimate > 0:
            keep = 1.0 - 1.0 / CAPACITY_MEMORY
            ratio = min(max(elapsed / stream.estimate, SLOWDOWN_RANGE[0]), SLOWDOWN_RANGE[1])
            self.slowdown = keep * self.slowdown + (1.0 - keep) * ratio

    def _advance(self, stream: _Live, chunks: list[AudioChunk]) -> bool:
        """Run the stream's pending engine call (or start it) and carry it to its next call,
        collecting the chunks completed on the way; True when it has ended."""
        if stream.steps is None:
            stream.started_at = self.clock()
            job = stream.job
            stream.steps = stream.synth.stream_steps(
                job.text, StreamScheduler._params(stream), budget=lambda: self.budget(stream),
                max_audio_s=job.max_audio_s)  # fmt: skip
            answer = None
        else:
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

    def _emit(self, stream: _Live, chunk: AudioChunk, pcm: Pcm16 | None, elapsed: float,
              send: Send) -> None:  # fmt: skip
        """Send one chunk, counting it as a deadline miss if the client has run dry."""
        now = self.clock()
        if stream.first_sent_at is None:
            stream.first_sent_at = now
            queued = (stream.started_at or stream.arrived) - stream.arrived
        else:
            queued = 0.0
            late = now - self.due(stream)
            if late > 0:
                with self.lock:
                    self.misses += 1
                    self.late_s += late
        stream.samples_sent += len(chunk.samples)
        assert pcm is not None
        data = pcm.astype("<i2").tobytes()
        send(AudioChunkMsg(stream.job.uid, data, chunk.offset, stream.synth.engines.label,
                           elapsed, queued, chunk.offset_s, chunk.words))  # fmt: skip

    def _done(self, stream: _Live, send: Send) -> None:
        if stream.job.text and stream.samples_sent:
            per_char = (stream.samples_sent / stream.synth.sample_rate * stream.job.speed
                        / len(stream.job.text))  # fmt: skip
            with self.lock:
                self.audio_per_char += (per_char - self.audio_per_char) / AUDIO_PER_CHAR_MEMORY
        log.info("stream_done", uid=stream.job.uid, engine_version=stream.synth.engines.label,
                 audio_samples=stream.samples_sent,
                 compute_ms=round(1000 * stream.compute_s, 1))  # fmt: skip
        send(StreamDone(stream.job.uid, stream.samples_sent, stream.compute_s))

    def _fail(self, stream: _Live, exc: Exception, send: Send) -> None:
        """End one stream with its error (from an ``except`` block)."""
        with self.lock:
            stream.running = False
            cancelled = stream.cancelled
            self._remove(stream)
        uid = stream.job.uid
        if cancelled:
            send(StreamDone(uid, stream.samples_sent, stream.compute_s))
        elif isinstance(exc, TTSError):
            log.info("stream_failed", uid=uid, error_type=exc.type)
            send(StreamError(uid, exc.status, exc.type, exc.message, exc.field))
        else:
            log.exception("stream_crashed", uid=uid)
            send(StreamError(uid, 500, "internal_error",
                             f"synthesis failed: {type(exc).__name__}"))  # fmt: skip


def first_late(tasks: list[tuple[float, float, float]], free: list[float],
               horizon: float) -> float | None:  # fmt: skip
    """When the first of ``tasks`` would start late on threads that free at ``free``, or None.

    A task is ``(start_by, cost, rate)``: a stream whose next step must start by ``start_by``
    and costs ``cost`` compute seconds; its chunk then buys the stream ``cost * rate`` seconds
    of audio, so its following step is due that much later (and costs the same). Tasks go in
    order of ``start_by`` to the thread that frees first, until ``horizon``; with no thread at
    all, the first ``start_by``.
    """
    queue = list(tasks)
    heapq.heapify(queue)
    threads = sorted(free)
    while queue:
        start_by, cost, rate = heapq.heappop(queue)
        if start_by >= horizon:
            return None
        if not threads:
            return start_by
        begin = heapq.heappop(threads)
        if begin > start_by:
            return start_by
        heapq.heappush(threads, begin + cost)
        if rate > 0:  # each step buys at least a floor's worth, so the layout ends
            heapq.heappush(queue, (start_by + max(cost * rate, LAYOUT_STEP_S), cost, rate))
    return None


def measure(synth: Synthesizer) -> tuple[float, float, float]:
    """Stream the canary as a stream would: audio seconds one thread computes per second (the
    start of ``Capacity`` before real steps refine it), seconds to its first chunk, and audio
    seconds per character of text (the start of ``audio_per_char``)."""
    params = SynthesisParams(noise_scale=0.0, noise_w=0.0)
    started = time.perf_counter()
    first = 0.0
    samples = 0
    for chunk in synth.stream(CANARY_TEXT, params):
        first = first or time.perf_counter() - started
        samples += len(chunk.samples)
    audio = samples / synth.sample_rate
    rate = audio / max(time.perf_counter() - started, 1e-9)
    return rate, first, audio / len(CANARY_TEXT)

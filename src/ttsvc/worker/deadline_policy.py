"""The deadline scheduler's policy: stream order, step bounds and admission.

Why a module of its own: these are the scheduler's decisions (``worker.deadline`` says what they
are for), made from the streams' state, the injected clock and the cost model
(``worker.costs``) alone, with no thread or pipe: the lock here guards the streams for the
callers of the policy. ``DeadlineScheduler`` adds the compute threads that act on the decisions;
tests and the scheduler benchmark drive the policy with a fake clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ttsvc.synthesis import Synthesizer
from ttsvc.windows import DELIVERY_S
from ttsvc.worker.batching import batch_key, batch_limit
from ttsvc.worker.costs import Capacity, call_cost, chunk_cost, first_late
from ttsvc.worker.streams import ActiveStream

FIRST_AUDIO_S = 0.1
"""A fresh stream's first chunk is due this long after it arrived."""
HORIZON_S = 1.0
"""How far ahead ``budget`` lays out the other streams' steps: about the longest step worth
taking (past a few hundred frames a window costs no less per frame)."""
STEP_FLOOR_S = 0.05
"""No budget is smaller than this by default (``step_floor_s`` of a scheduler;
``TTSVC_STEP_FLOOR_MS``). A floor keeps steps from shrinking to nothing on a busy worker, where
each call's fixed cost adds up; 100 ms while context engines paid their overlap at every window,
50 ms since stateful engines cost the same per frame at any window size (``docs/decisions.md``:
closed loop of 16 in process, 0.6 % of streams stalled against 3.8 %, TTFA p99 319 against
794 ms)."""
GUARD_S = 0.1
"""A playing stream whose next step must start within this goes before fresh streams: about
the longest step another thread may be in the middle of when it is picked."""
AUDIO_PER_CHAR_S = 0.07
"""Seconds of audio per character of English text at speed 1, until the worker measures it."""
AUDIO_PER_CHAR_MEMORY = 50
"""Finished streams over which the audio per character averages (exponentially)."""
MIN_LEFT_S = 0.2
"""A playing stream counts as having at least this much audio left until it ends (the estimate
from its text length may run out before the stream does)."""


@dataclass
class Live(ActiveStream):
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


class DeadlinePolicy:
    """Which stream steps next, how long its step may run, and which streams are admitted:
    the deadline scheduler's decisions, apart from its threads (``DeadlineScheduler``)."""

    def __init__(
        self,
        synth: Synthesizer,
        threads: int = 1,
        load_limit: float = 0.75,
        per_thread: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        first_audio_s: float = FIRST_AUDIO_S,
        first_chunk_s: float = 0.0,
        audio_per_char: float = AUDIO_PER_CHAR_S,
        step_floor_s: float = STEP_FLOOR_S,
        guard_s: float = GUARD_S,
        max_batch: int = 1,
        whole_sentences: bool = True,
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
        self.max_batch = max_batch
        """Most streams one step serves with one engine call (``riders``), within each engine
        set's own limit (1 for engines that do not batch: the CPU's; ``worker.batching``)."""
        self.whole_sentences = whole_sentences
        """Run a sentence whole on the plain graphs where its listener can wait for it
        (``whole``); off: every sentence streams in windows."""
        self.streams: dict[str, Live] = {}
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
        """Guards the streams and every figure above: hold it to call the policy."""

    # -- policy (call with ``lock`` held) ---------------------------------------------------

    def demand(self) -> float:
        """Audio seconds per second the admitted streams need to finish without running dry:
        a fresh stream one; a playing one with ``b`` seconds buffered and about ``r`` left to
        compute, ``r / (r + b)`` (spread evenly over the time its buffer buys). A stream ahead
        of its listener needs less than one, so the ones behind it can be admitted; one near
        its deadline needs one, as before."""
        now = self.clock()
        return sum(self._need(s, now) for s in self.streams.values() if s.admitted)

    def _need(self, stream: ActiveStream, now: float) -> float:
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

    def due(self, stream: ActiveStream) -> float:
        """When the stream's next chunk must be sent: its first-audio target while it is fresh,
        else when the audio it has sent runs out for a client that plays it from the start."""
        if stream.first_sent_at is None:
            return stream.arrived + self.first_audio_s
        return stream.first_sent_at + stream.samples_sent / stream.synth.sample_rate

    def latest_start(self, stream: ActiveStream) -> float:
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

    def cost_to_chunk(self, stream: ActiveStream) -> float:
        """Estimated seconds from the stream's pending call to its next chunk, from the
        per-frame and per-phoneme costs the synthesizer measured at start, as slow as steps
        run now."""
        return self.slowdown * chunk_cost(stream, self.first_chunk_s)

    def step_cost(self, stream: ActiveStream) -> float:
        """Estimated seconds of the stream's pending call alone (a stream not started: its
        front end, acoustic run and first window, or its whole first sentence where ``whole``
        will run it so), as slow as steps run now."""
        cost = call_cost(stream, self.first_chunk_s)
        if stream.pending is None and stream.steps is None and self._whole_start(stream):
            synth = stream.synth
            chars = min(len(stream.job.text), synth.frontend.max_sentence_chars)
            audio_s = chars * self.audio_per_char / max(stream.job.speed, 1e-3)
            cost += synth.whole_cost(round(audio_s * synth.sample_rate / synth.hop))
        return self.slowdown * cost

    def _whole_start(self, stream: ActiveStream) -> bool:
        """Whether a stream's first sentence runs whole (``whole``), before it starts (lock
        held)."""
        return (self.whole_sentences and self.waiting() > 0
                and stream.synth.engines.one_shot is not None)  # fmt: skip

    def whole(self, stream: ActiveStream, cost: float) -> bool:
        """Whether the stream's next sentence, ``cost`` seconds whole alone (after its acoustic
        run), runs whole on the plain graphs rather than in windows: about three quarters of
        the engine time, its audio in one chunk at the end.

        A first sentence only while other streams wait for admission: the worker is saturated,
        so the cheaper audio lets the waiting in sooner, and the stream's own first audio,
        already late for its wait, comes with its sentence's end (measured: 1.18x the audio per
        second at a closed loop of 32, no stream run dry; ``docs/decisions.md``). A later
        sentence whenever the audio its stream has buffered covers twice the cost and the step
        ``budget`` allows it: its listener is still playing the sentence before."""
        if not self.whole_sentences or cost <= 0:
            return False
        with self.lock:
            if stream.first_sent_at is None:
                return self._whole_start(stream)
            slack = self.due(stream) - self.clock() - DELIVERY_S
            if self.slowdown * cost > slack / 2:
                return False
        budget = self.budget(stream)
        return budget is None or cost <= budget

    def start_by(self, stream: ActiveStream) -> float:
        """When the stream's next step must start for its next chunk to be in time: for a
        playing stream ``latest_start``; for a fresh one its first-audio target less what a
        first chunk costs alone, so a burst of fresh streams keeps arrival order."""
        if stream.first_sent_at is None:
            return self.due(stream) - self.first_chunk_s
        return self.latest_start(stream)

    def pick(self) -> Live | None:
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

    def riders(self, head: Live) -> list[Live]:
        """The streams that ride along with ``head``'s step: on engines that run batches, the
        next ready streams in ``pick``'s order whose pending call has the same shape on the
        same engines (``batch_key``), up to ``max_batch`` (and the engines' own limit) with the
        head. Empty on engines that do not batch (the CPU's), and for a stream not started:
        its first step runs its front end and acoustic run, which do not batch.

        The head is always ``pick``'s choice, so batching never reorders who goes first; a
        rider only gets its next call earlier than it would have, and the step's cost on a
        device that batches is about the head's alone."""
        if self.max_batch <= 1 or head.pending is None or head.pending.stage == "acoustic":
            return []
        engines = head.pending.engines or head.synth.engines
        room = min(self.max_batch, batch_limit(engines)) - 1
        if room <= 0:
            return []
        key = batch_key(head.pending, head.synth)
        ready = [s for s in self.streams.values()
                 if s.admitted and not s.running and s is not head and s.pending is not None
                 and batch_key(s.pending, s.synth) == key]  # fmt: skip
        now = self.clock()
        return sorted(ready, key=lambda s: self.rank(s, now))[:room]

    def rank(self, stream: ActiveStream, now: float) -> tuple[int, float, float]:
        """``pick``'s order key: class (0 a playing stream inside the guard, 1 a fresh stream,
        2 another playing stream), then its start-by or due time, then arrival."""
        if stream.first_sent_at is None:
            return (1, self.due(stream), stream.arrived)
        start = self.latest_start(stream)
        return (0 if start <= now + self.guard_s else 2, start, stream.arrived)

    def _free_threads(self, now: float, exclude: ActiveStream | None) -> list[float]:
        """When each thread other than the caller's frees: now for an idle one, else when its
        step is expected to end (``exclude``: the caller's own stream, running)."""
        free = [now] * (self.threads - 1 if exclude is not None else self.threads)
        for s in self.streams.values():
            if s.running and s is not exclude and now in free:
                free[free.index(now)] = max(now, s.busy_until)
        return free

    def _task(self, stream: ActiveStream, now: float) -> tuple[float, float, float]:
        """The stream's next step for ``first_late``: start by, cost, and the audio a chunk
        buys per compute second (what one thread computes)."""
        rate = self.capacity.value / max(self.threads, 1)
        return (max(now, self.start_by(stream)), self.step_cost(stream), rate)

    def budget(self, stream: ActiveStream) -> float | None:
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

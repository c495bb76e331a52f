"""Heat-score routing policy: which worker process gets the next synthesis stream.

Pure policy, no IO: the module owns no sockets, processes, threads, tasks or timers, and reads time
only through an injected clock, so it is exercised with a fake clock in unit tests and driven by a
simulated clock in ``benchmarks/balancer_sim.py``. The worker pool feeds it what it learns (worker
registrations, heartbeats, queue reports, measured time-to-first-audio, stream completions) and
asks it for a worker id; ``NoWorkerAvailable`` is a 503 in the error table.
"""

from __future__ import annotations

import math

from ttsvc.balancer.model import (
    CLOCK_EPSILON,
    COLD_VOICE_LOAD,
    MAX_SCORE,
    RATE_EPSILON,
    SEED_REFERENCE_MS,
    BalancerSettings,
    Clock,
    Worker,
    WorkerState,
    require_finite_non_negative,
)
from ttsvc.errors import NoHeadroom, NoWorkerAvailable

RELEASE_GAP_S = 1.0
"""Seconds between two streams' ends the balancer assumes until it has seen some: what a
``Retry-After`` is sized from before any stream ended."""
RELEASE_MEMORY = 0.2
"""Weight of the newest gap between two streams' ends in their exponential average."""
RETRY_AFTER_RANGE_S = (1.0, 30.0)
"""``Retry-After`` stays within these: HTTP's least whole second, and a wait past which a
client had better try another pod."""


class HeatScoreBalancer:
    """Routes each new stream to a worker with real-time capacity to spare, and among those to
    the one with the smallest ``(load + 1) / (score + 1)``.

    Lives in the gateway process and is owned by its asyncio event loop: every call is a short,
    synchronous bookkeeping step. It is not thread-safe by design, since a single loop owns it; do
    not share an instance across threads or processes.

    Rules (constants in :class:`BalancerSettings`):

    * A worker registers READY with score 100 (:meth:`add_worker`) and leaves on
      :meth:`remove_worker`. :meth:`set_ready` marks it draining (not routed to) and back.
    * Each observation yields a latency ``L`` (see fix 2); ``bonus = max(0, 100 - L)`` and
      ``score = min(100, decay * score + bonus)``.
    * Observations are buffered and folded into the scores, in arrival order, by :meth:`refresh`,
      at most once every ``refresh_interval`` (200 ms). Every read (:meth:`pick`,
      :meth:`snapshot`, :meth:`pool_score`, :meth:`live_workers`) calls :meth:`refresh` first, so
      scores never lag by more than one interval while the gateway is busy.
    * ``slow_strikes`` (3) consecutive observations with ``L > slow_latency_ms`` (1 s) halve the
      score after the formula is applied (cold standby); the counter then restarts at 0, and any
      observation with ``L <= slow_latency_ms`` resets it.
    * :meth:`pick` considers workers that are ready and whose heartbeat is younger than
      ``heartbeat_timeout`` (5 s); ties are broken by the lowest worker id; with none, it raises
      :class:`NoWorkerAvailable` (the gateway answers 503: circuit breaker).
    * Admission by capacity, the worker's own rule: a worker that reported its real-time
      capacity (audio seconds per second, measured by the worker) is *full* when one more
      stream would take its demand past ``realtime_load`` (0.75) times that capacity, unless it
      has fewer streams than compute threads (those it always takes: a machine measured slow
      still serves). :meth:`pick` chooses among live workers that are not full. When every one
      is full it raises :class:`NoHeadroom` (a 429 with a ``Retry-After`` from how often
      streams have been ending, :meth:`retry_after`), so the refusal costs no worker anything
      and no running stream runs dry; with ``overload="queue"`` it picks among the full ones
      instead (the worker then holds the stream until it has room, up to its queue deadline).
      A worker whose capacity is unknown (0) is never full, so without capacity reports
      routing is the heat score alone. Each stream is counted as one audio second per second:
      a stream plays in real time whatever its speed. :meth:`headroom` is the share of the
      live workers' room left (``/health``'s score, a gauge autoscaling reads).
    * Voice affinity: a worker that does not hold the request's voice (as it last reported,
      or picked for it since) counts ``COLD_VOICE_LOAD`` more streams, so each voice's traffic
      gathers on the workers that already loaded it, and spreads when they are busier.

    Fixes over the seed sketch:

    1. Heartbeats are explicit. The seed treated "last used" as the heartbeat, so a healthy but
       idle worker aged out and was evicted. Here only :meth:`heartbeat` (from the worker's
       periodic report) and registration refresh ``last_heartbeat``; dispatching does not, and
       idleness never evicts a worker that keeps reporting.
    2. Latency is normalized. A raw latency is not comparable across text lengths or across CPU
       and GPU deployments, so the caller reports time-to-first-audio (which depends on the first
       chunk only, not on the length of the text) and the formula is fed
       ``L = ttfa_ms * 50 / reference_ttfa_ms``: a worker exactly at the deployment's reference
       TTFA scores like the seed's 50 ms latency (bonus 50), twice the reference like 100 ms
       (bonus 0). The slow-strike rule compares the same ``L`` with ``slow_latency_ms``, i.e. 20x
       the reference by default.
    3. Dispatches count at once. The seed routed on the worker's reported queue size, which lags,
       so a burst between two reports landed on a single worker. :meth:`pick` increments the
       chosen worker's ``qsize`` and ``inflight`` immediately and :meth:`release` decrements both
       (never below 0). :meth:`report` overwrites ``qsize`` with the worker's own count, which is
       then kept current by the picks and releases that follow it (a report one second old does
       not keep counting streams that have ended since). ``inflight`` is the gateway's own count,
       which no report touches, and routing uses ``load = max(qsize, inflight)``: a report can
       raise the load (work the gateway does not know about) but cannot hide dispatches the
       worker had not seen yet when it reported. Demand is kept the same way: the reported
       demand, plus one per pick and minus one per release since, and never less than
       ``inflight``.

    Calls about an id that is not registered (a late report or release from a worker already
    removed) are ignored and return False, because on a live system they are a normal race, not a
    bug.
    """

    def __init__(self, settings: BalancerSettings, clock: Clock) -> None:
        """Create an empty pool; ``clock`` returns monotonic seconds (``time.monotonic``)."""
        self._settings = settings
        self._clock = clock
        self._workers: dict[int, Worker] = {}
        self._last_refresh = clock()
        self._last_release: float | None = None
        self._release_gap = RELEASE_GAP_S

    @property
    def settings(self) -> BalancerSettings:
        """The settings this balancer was built with."""
        return self._settings

    # -- membership ------------------------------------------------------------------------------

    def add_worker(
        self,
        worker_id: int,
        capacity: float = 0.0,
        threads: int = 1,
        voices: tuple[str, ...] = (),
    ) -> None:
        """Register a worker as READY: score 100, empty queue, heartbeat now, the real-time
        capacity it measured at start (audio seconds per second; 0: unknown), its compute
        threads and the voices it holds.

        Registering an id again (a restarted worker) starts it afresh.
        """
        require_finite_non_negative("capacity", capacity)
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be an int >= 1, got {threads!r}")
        self._workers[worker_id] = Worker(
            id=worker_id, last_heartbeat=self._clock(), capacity=capacity, threads=threads,
            voices=frozenset(voices),
        )  # fmt: skip

    def remove_worker(self, worker_id: int) -> bool:
        """Forget a dead worker; returns whether it was registered."""
        return self._workers.pop(worker_id, None) is not None

    def set_ready(self, worker_id: int, ready: bool) -> bool:
        """Mark a worker draining (``False``: no new streams) or ready again."""
        worker = self._workers.get(worker_id)
        if worker is None:
            return False
        worker.ready = ready
        return True

    # -- worker reports --------------------------------------------------------------------------

    def heartbeat(self, worker_id: int) -> bool:
        """Record a heartbeat from the worker at the current clock time."""
        worker = self._workers.get(worker_id)
        if worker is None:
            return False
        worker.last_heartbeat = self._clock()
        return True

    def report(
        self,
        worker_id: int,
        qsize: int,
        capacity: float | None = None,
        demand: float | None = None,
        voices: tuple[str, ...] | None = None,
        late: bool = False,
    ) -> bool:
        """Record the worker's own count of streams in flight and queued, and, when given, its
        real-time capacity (0: unknown), the demand of its streams (audio seconds per second,
        counting those it holds back for want of capacity, one each) and the voices it holds.
        ``late``: it sent a chunk past its stream's playback deadline since its last report,
        so it counts as full for ``strain_s`` whatever its figures say."""
        if qsize < 0:
            raise ValueError(f"qsize must be >= 0, got {qsize}")
        if capacity is not None:
            require_finite_non_negative("capacity", capacity)
        if demand is not None:
            require_finite_non_negative("demand", demand)
        worker = self._workers.get(worker_id)
        if worker is None:
            return False
        worker.qsize = qsize
        if capacity is not None:
            worker.capacity = capacity
        if demand is not None:
            worker.demand = demand
        if voices is not None:
            worker.voices = frozenset(voices)
        if late:
            worker.strained_until = self._clock() + self._settings.strain_s
        return True

    def observe(self, worker_id: int, ttfa_ms: float) -> bool:
        """Record a measured time-to-first-audio; folded into the score at the next refresh."""
        if isinstance(ttfa_ms, bool) or not math.isfinite(ttfa_ms) or ttfa_ms < 0:
            raise ValueError(f"ttfa_ms must be a finite number >= 0, got {ttfa_ms!r}")
        worker = self._workers.get(worker_id)
        if worker is None:
            return False
        worker.pending.append(self.normalized_latency_ms(ttfa_ms))
        return True

    def normalized_latency_ms(self, ttfa_ms: float) -> float:
        """The latency the score formula sees: ``ttfa_ms * 50 / reference_ttfa_ms``."""
        return ttfa_ms * (SEED_REFERENCE_MS / self._settings.reference_ttfa_ms)

    # -- scoring ---------------------------------------------------------------------------------

    def refresh(self) -> bool:
        """Fold buffered observations into the scores if ``refresh_interval`` has elapsed.

        Returns whether a refresh happened. Called by every read; calling it more often is
        harmless.
        """
        now = self._clock()
        if now - self._last_refresh < self._settings.refresh_interval - CLOCK_EPSILON:
            return False
        self._last_refresh = now
        s = self._settings
        for worker in self._workers.values():
            for latency_ms in worker.pending:
                bonus = max(0.0, MAX_SCORE - latency_ms)
                worker.score = min(MAX_SCORE, s.decay * worker.score + bonus)
                if latency_ms > s.slow_latency_ms:
                    worker.strikes += 1
                    if worker.strikes >= s.slow_strikes:
                        worker.score /= 2.0
                        worker.strikes = 0
                else:
                    worker.strikes = 0
            worker.pending.clear()
        return True

    # -- routing ---------------------------------------------------------------------------------

    def _is_live(self, worker: Worker, now: float) -> bool:
        return worker.ready and now - worker.last_heartbeat < self._settings.heartbeat_timeout

    def _is_full(self, worker: Worker) -> bool:
        """The worker would hold a new stream back: it has a stream per compute thread, and one
        more would take it past its share of a known capacity, or it sent a chunk late within
        ``strain_s``."""
        need = max(worker.demand, float(worker.inflight))
        if need < worker.threads:
            return False
        if self._strained(worker):
            return True
        if worker.capacity <= 0.0:
            return False
        return need + 1.0 > worker.capacity * self._settings.realtime_load + RATE_EPSILON

    def _strained(self, worker: Worker) -> bool:
        return self._clock() < worker.strained_until

    def pick(self, voice: str | None = None) -> int:
        """Choose a worker for a new stream (of ``voice``, when named) and count the dispatch
        on it at once.

        The caller must call :meth:`release` with the returned id when the stream ends (in a
        ``finally``), whatever the outcome.

        Raises:
            NoWorkerAvailable: no registered worker is ready with a fresh heartbeat.
            NoHeadroom: every live worker is full and ``overload`` is ``refuse``; no worker's
                count changes.
        """
        self.refresh()
        now = self._clock()
        best: Worker | None = None
        best_key: tuple[bool, float, int] = (True, math.inf, 0)
        for worker in self._workers.values():
            if not self._is_live(worker, now):
                continue
            load = max(worker.qsize, worker.inflight) + 1.0
            if voice is not None and voice not in worker.voices:
                load += COLD_VOICE_LOAD
            key = (self._is_full(worker), load / (worker.score + 1), worker.id)
            if best is None or key < best_key:
                best, best_key = worker, key
        if best is None:
            raise NoWorkerAvailable(registered=len(self._workers), live=0)
        if best_key[0] and self._settings.overload == "refuse":
            wait = self.retry_after()
            raise NoHeadroom(
                f"no worker has real-time headroom for another stream now; "
                f"retry in {max(1, math.ceil(wait))} s",
                retry_after_s=wait,
            )
        best.inflight += 1
        best.qsize += 1
        best.demand += 1.0
        if voice is not None:
            best.voices |= {voice}  # it loads the voice now: the next request finds it there
        return best.id

    def release(self, worker_id: int) -> bool:
        """A stream dispatched by :meth:`pick` ended: decrement ``inflight`` and ``qsize``, and
        its one audio second per second of ``demand``.

        None goes below 0.
        """
        worker = self._workers.get(worker_id)
        if worker is None:
            return False
        now = self._clock()
        if self._last_release is not None:
            gap = now - self._last_release
            self._release_gap += RELEASE_MEMORY * (gap - self._release_gap)
        self._last_release = now
        worker.inflight = max(0, worker.inflight - 1)
        worker.qsize = max(0, worker.qsize - 1)
        worker.demand = max(0.0, worker.demand - 1.0)
        return True

    def _room(self, worker: Worker) -> tuple[float, float]:
        """The worker's room for streams, in audio seconds per second, and what is left of it:
        its share of a known capacity (never less than its threads: those it always takes), or
        its threads while its capacity is unknown."""
        total = float(worker.threads)
        if worker.capacity > 0.0:
            total = max(total, worker.capacity * self._settings.realtime_load)
        need = max(worker.demand, float(worker.inflight))
        if self._strained(worker):  # late lately: no room beyond its threads
            return total, max(0.0, min(total, worker.threads) - need)
        return total, max(0.0, total - need)

    def headroom(self) -> float:
        """The share of the live workers' room for real-time streams still free, 0-1 (0 with
        no live worker): what ``/health`` scores and autoscaling reads (``ttsvc_headroom``)."""
        now = self._clock()
        rooms = [self._room(w) for w in self._workers.values() if self._is_live(w, now)]
        total = sum(t for t, _ in rooms)
        return sum(f for _, f in rooms) / total if total > 0 else 0.0

    def retry_after(self) -> float:
        """Seconds until a live worker likely has room for one more stream: the fewest streams
        any of them must finish first, times the average gap between two streams' ends (Little:
        streams end as often as they have been ending), within ``RETRY_AFTER_RANGE_S``."""
        now = self._clock()
        short = [max(worker.demand, float(worker.inflight)) + 1.0 - total
                 for worker in self._workers.values() if self._is_live(worker, now)
                 for total, _ in [self._room(worker)]]  # fmt: skip
        ends = max(1.0, math.ceil(min(short, default=1.0) - RATE_EPSILON))
        low, high = RETRY_AFTER_RANGE_S
        return min(max(ends * self._release_gap, low), high)

    # -- views -----------------------------------------------------------------------------------

    def live_workers(self) -> list[int]:
        """Ids of the workers :meth:`pick` may choose now, ascending."""
        self.refresh()
        now = self._clock()
        return sorted(w.id for w in self._workers.values() if self._is_live(w, now))

    def snapshot(self) -> list[WorkerState]:
        """State of every registered worker, by ascending id."""
        self.refresh()
        now = self._clock()
        return [
            WorkerState(
                id=w.id,
                score=w.score,
                qsize=w.qsize,
                inflight=w.inflight,
                last_heartbeat=w.last_heartbeat,
                ready=w.ready,
                live=self._is_live(w, now),
                capacity=w.capacity,
                threads=w.threads,
                demand=w.demand,
                voices=w.voices,
            )
            for w in sorted(self._workers.values(), key=lambda w: w.id)
        ]

    def load_of(self, worker_id: int) -> int:
        """One registered worker's load as routing counts it (``WorkerState.load``)."""
        worker = self._workers[worker_id]
        return max(worker.qsize, worker.inflight)

    def score(self, worker_id: int) -> float | None:
        """One worker's heat score (None if it is not registered): what its gauge shows, read on
        every report from it without building the whole pool's snapshot."""
        self.refresh()
        worker = self._workers.get(worker_id)
        return None if worker is None else worker.score

    def pool_score(self) -> float:
        """Mean heat score of live workers (0.0 when none)."""
        self.refresh()
        now = self._clock()
        scores = [w.score for w in self._workers.values() if self._is_live(w, now)]
        return sum(scores) / len(scores) if scores else 0.0

"""What the heat-score balancer knows: its settings, and each worker's state.

Plain data, validated on construction, apart from the routing rules (``balancer.heat``), so
that settings and reports can be built and read (``config.py``, ``/health``, the simulator)
without the policy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

Clock = Callable[[], float]
Overload = Literal["refuse", "queue"]
"""Monotonic seconds (``time.monotonic`` in production, a fake or simulated clock elsewhere)."""

MAX_SCORE = 100.0
"""Upper bound of a heat score, and the score a worker starts with when it registers READY."""

SEED_REFERENCE_MS = 50.0
"""Seed-formula milliseconds that a worker exactly at ``reference_ttfa_ms`` is scored as."""

CLOCK_EPSILON = 1e-9
"""Tolerance on interval comparisons, so 0.1 s + 0.1 s of float clock counts as 0.2 s."""

RATE_EPSILON = 1e-9
"""Tolerance on demand against capacity, so a worker exactly at its share is not full."""

COLD_VOICE_LOAD = 1.0
"""Streams a worker's load counts extra when it does not hold the request's voice: it must load
the voice first (tens of milliseconds, and memory another voice may have to give up), so a
worker that holds it wins unless it carries more than one stream more."""


def _require_finite_positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def require_finite_non_negative(name: str, value: float) -> None:
    if isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class BalancerSettings:
    """Tuning constants of :class:`HeatScoreBalancer`; validated on construction."""

    refresh_interval: float = 0.2
    """Seconds between score refreshes; observed latencies are folded in at most this often."""
    heartbeat_timeout: float = 5.0
    """A worker whose last heartbeat is this many seconds old (or older) is not routed to."""
    slow_latency_ms: float = 1000.0
    """Normalized latency (seed milliseconds) above which an observation counts as a slow strike."""
    slow_strikes: int = 3
    """Consecutive slow observations that halve a worker's score (cold standby)."""
    decay: float = 0.9
    """Weight of the previous score in ``score = min(100, decay * score + bonus)``; in (0, 1)."""
    reference_ttfa_ms: float = 50.0
    """Time-to-first-audio expected of a healthy worker on this deployment (CPU or GPU); it is
    scored like a 50 ms latency in the seed formula (bonus 50)."""
    realtime_load: float = 0.75
    """Share of a worker's real-time capacity that its streams may demand before it is full:
    a full worker gets a new stream only when every live worker is full (``overload``)."""
    strain_s: float = 2.0
    """Seconds a worker that reported a chunk sent past its playback deadline counts as full
    (no new stream beyond one per compute thread): its figures said it had room, and what it
    delivered says it had not."""
    overload: Overload = "refuse"
    """What :meth:`HeatScoreBalancer.pick` does when every live worker is full: ``refuse``
    (``NoHeadroom``, a 429 no worker sees) or ``queue`` (the least loaded full worker takes
    the stream and holds it until it has room, up to its queue deadline)."""

    def __post_init__(self) -> None:
        _require_finite_positive("refresh_interval", self.refresh_interval)
        _require_finite_positive("heartbeat_timeout", self.heartbeat_timeout)
        _require_finite_positive("slow_latency_ms", self.slow_latency_ms)
        _require_finite_positive("reference_ttfa_ms", self.reference_ttfa_ms)
        _require_finite_positive("realtime_load", self.realtime_load)
        _require_finite_positive("strain_s", self.strain_s)
        if (
            isinstance(self.slow_strikes, bool)
            or not isinstance(self.slow_strikes, int)
            or self.slow_strikes < 1
        ):
            raise ValueError(f"slow_strikes must be an int >= 1, got {self.slow_strikes!r}")
        if self.overload not in ("refuse", "queue"):
            raise ValueError(f"overload must be 'refuse' or 'queue', got {self.overload!r}")
        if isinstance(self.decay, bool) or not (0.0 < self.decay < 1.0):
            raise ValueError(f"decay must be in the open interval (0, 1), got {self.decay!r}")


@dataclass(frozen=True)
class WorkerState:
    """Read-only view of one worker as the balancer sees it (for /health, logs and tests)."""

    id: int
    """Worker id, as given to :meth:`HeatScoreBalancer.add_worker`."""
    score: float
    """Heat score in [0, 100]; higher is healthier."""
    qsize: int
    """Streams in flight and queued: the worker's last report, plus picks and minus releases
    since."""
    inflight: int
    """Streams the gateway dispatched to this worker and has not released yet."""
    last_heartbeat: float
    """Clock time of the worker's last heartbeat (or of its registration)."""
    ready: bool
    """Whether the worker accepts new streams (False while draining)."""
    live: bool
    """Ready and heartbeat younger than ``heartbeat_timeout`` at snapshot time: routable."""
    capacity: float = 0.0
    """Audio seconds per second the worker can compute, as it last reported (0: unknown)."""
    threads: int = 1
    """Compute threads the worker runs: it takes that many streams whatever its capacity."""
    demand: float = 0.0
    """Audio seconds per second its streams need: the worker's last report (admitted and
    waiting streams), plus picks and minus releases since."""
    voices: frozenset[str] = frozenset()
    """Voices the worker holds loaded: its last report, plus those picked for it since."""

    @property
    def load(self) -> int:
        """The queue size routing uses: ``max(qsize, inflight)``."""
        return max(self.qsize, self.inflight)

    @property
    def need(self) -> float:
        """The demand routing uses: ``max(demand, inflight)``, one audio second per second for
        each stream the gateway dispatched and has not released."""
        return max(self.demand, float(self.inflight))


@dataclass(slots=True)
class Worker:
    """Mutable per-worker bookkeeping; private to the balancer."""

    id: int
    last_heartbeat: float
    score: float = MAX_SCORE
    qsize: int = 0
    inflight: int = 0
    capacity: float = 0.0
    threads: int = 1
    demand: float = 0.0
    ready: bool = True
    voices: frozenset[str] = frozenset()
    strained_until: float = -math.inf
    """Until when the worker counts as full whatever its figures: it sent a chunk late."""
    strikes: int = 0
    pending: list[float] = field(default_factory=list)
    """Normalized latencies observed since the last refresh, oldest first."""

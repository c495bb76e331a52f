"""The gateway's view of its workers: how each is started, and what it last reported.

Plain records, shared by the supervisor (spawn, messages, deaths) and the rollout (engine swaps),
so neither owns the other's state.
"""

from __future__ import annotations

import math
import queue
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from ttsvc.protocol import EngineSpec, StartFailed, ToWorker, WorkerReady
from ttsvc.windows import WindowSchedule
from ttsvc.worker.plan import ComputePlan, WorkerConfig


@dataclass
class WorkerSpec:
    """How every worker of the pool is started."""

    engine: EngineSpec
    """The engines a new or respawned worker loads at start (the default voice's): always the
    last good ones."""
    threads: int
    schedule: WindowSchedule
    max_sentence_chars: int
    log_level: str = "info"
    start_timeout_s: float = 120.0
    """Not READY within this after spawn: killed and respawned."""
    silence_timeout_s: float = 10.0
    """No message for this long from a READY worker: killed (a hung worker never sends EOF)."""
    plan: ComputePlan = field(default_factory=ComputePlan)
    """Compute threads, admission limit and step floor of each worker."""
    log_format: str = "auto"
    """The gateway's log format, so a forced one (``json`` to a terminal, ``console`` to a
    file) holds for the workers' lines too: they write to the same stdout."""
    voices: dict[str, EngineSpec] = field(default_factory=dict)
    """The last good engines of every voice served, by name: a worker loads one when a request
    first needs it."""
    voice_budget: int = 0
    """Engine bytes a worker may hold loaded at once (0: no limit): past it, it lets go of the
    voice it used least recently."""
    memory_bytes: int = 0
    """Each worker's cap on its own memory (0: none; ``ttsvc.worker.limits``)."""

    def worker_config(self) -> WorkerConfig:
        """What a worker spawned now starts with: this spec as it stands (a rollout moves
        ``engine`` and ``voices`` to the last good engines), frozen for the process."""
        return WorkerConfig(self.engine, self.threads, self.schedule, self.max_sentence_chars,
                            self.plan, self.log_level, self.log_format, dict(self.voices),
                            self.voice_budget, self.memory_bytes)  # fmt: skip


def usable_rate(value: float) -> float:
    """A worker's capacity or demand as routing may use it: a figure that is not a finite
    number >= 0 (a measurement gone wrong) counts as unknown, so it neither takes a worker out
    of routing nor raises on the event loop."""
    return value if math.isfinite(value) and value > 0.0 else 0.0


@dataclass
class DeadlineTally:
    """Turns one worker process's cumulative deadline reports into counter increments.

    A worker reports its misses and seconds late summed since it started (one figure that any
    cadence of reports can read), while Prometheus counters take increments. The tally keeps the
    last report and hands out the difference; a value below the last one can only come from a
    process that started again from 0, so it counts whole.
    """

    misses: int = 0
    late_s: float = 0.0

    def advance(self, misses: int, late_s: float) -> tuple[int, float]:
        """The misses and seconds late added since the last report; ``(misses, late_s)`` is
        the new last report."""
        if misses < self.misses or late_s < self.late_s:
            added = misses, late_s
        else:
            added = misses - self.misses, late_s - self.late_s
        self.misses, self.late_s = misses, late_s
        return added


@dataclass
class WorkerHandle:
    """The gateway's view of one worker process."""

    id: int
    process: BaseProcess
    conn: Connection
    ready: WorkerReady | None = None
    streams: set[str] = field(default_factory=set)
    waiting: set[str] = field(default_factory=set)
    """Streams dispatched that have sent no audio yet (queued in the worker)."""
    started_at: float = field(default_factory=time.monotonic)
    last_seen: float = field(default_factory=time.monotonic)
    outbox: queue.SimpleQueue[ToWorker | None] = field(default_factory=queue.SimpleQueue)
    """Messages for the worker, sent in order by its own sender thread (``None`` stops it)."""
    killed_for: str | None = None
    """Why the pool killed it (``stalled``), so its streams fail with that reason."""
    deadlines: DeadlineTally = field(default_factory=DeadlineTally)
    """This process's deadline misses as last reported (a respawn gets a new handle)."""
    specs: dict[str, str] = field(default_factory=dict)
    """The label of the spec the worker serves (or would load) for every voice: those it was
    spawned with, then those it switched to (a voice swapped while it started is sent to it
    once it is READY)."""
    voices: tuple[str, ...] = ()
    """Voices the worker holds loaded, as it last reported."""
    settled: bool = False
    """The worker is idle at its resting size, as its last heartbeat said: False from the moment
    anything is sent to it or it answers, and a heartbeat sets it only while the pool has no
    stream or swap out on the worker (one sent before the worker received them may arrive
    after they were sent)."""

    start_failed: StartFailed | None = None
    """Why the engines it was started on could not serve (it exits after saying so)."""
    exitcode: int | None = None
    """Set once the pool has handled the worker's exit and released its process object
    (``supervisor._release``): from then on it cannot be killed or joined, nor need be."""

    @property
    def running(self) -> bool:
        """The process is alive (not known to have exited)."""
        return self.exitcode is None and self.process.is_alive()

    def kill(self) -> None:
        """SIGKILL the worker (its exit then runs the pool's death path); nothing once its exit
        was handled."""
        if self.exitcode is None:
            self.process.kill()

    def send(self, msg: ToWorker) -> None:
        """Queue ``msg`` for the worker's sender thread; whatever it asks, the worker is no
        longer known to be at rest."""
        self.settled = False
        self.outbox.put(msg)

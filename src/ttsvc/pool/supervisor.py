"""Spawns and watches worker processes; demultiplexes their messages into request mailboxes.

Lives in the gateway process. One reader thread per worker blocks on its pipe and hands each
message to the event loop (``call_soon_threadsafe``), so the loop never blocks on IO. A worker
that dies fails only its own streams and is respawned with backoff; it is routed to again only
after it says READY.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing as mp
import queue
import threading
import time
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from ttsvc.balancer import HeatScoreBalancer
from ttsvc.observability.logs import get_logger
from ttsvc.observability.metrics import ServiceMetrics
from ttsvc.protocol import (
    AudioChunkMsg,
    CancelStream,
    EngineSpec,
    EnginesSwapped,
    FromWorker,
    Heartbeat,
    Shutdown,
    StreamDone,
    StreamError,
    SwapEngines,
    SynthesisJob,
    ToWorker,
    WorkerReady,
)
from ttsvc.windows import WindowSchedule
from ttsvc.worker import entry
from ttsvc.worker.plan import ComputePlan

log = get_logger("pool")
Mailbox = asyncio.Queue[AudioChunkMsg | StreamDone | StreamError]

_EXIT_MESSAGES = {
    "worker_died": "the worker serving this request exited; retry shortly",
    "stalled": "the worker serving this request stopped responding; retry shortly",
}
"""What a stream's client is told when its worker is gone, by reason."""


@dataclass
class WorkerSpec:
    """How every worker of the pool is started."""

    engine: EngineSpec
    """The engines a new or respawned worker loads at start (the default voice's): always the
    last good ones."""
    threads: int
    schedule: WindowSchedule
    max_sentence_chars: int
    multiplex: bool = True
    log_level: str = "info"
    start_timeout_s: float = 120.0
    """Not READY within this after spawn: killed and respawned."""
    silence_timeout_s: float = 10.0
    """No message for this long from a READY worker: killed (a hung worker never sends EOF)."""
    plan: ComputePlan = field(default_factory=ComputePlan)
    """Scheduler, compute threads and admission limit of each worker."""
    log_format: str = "auto"
    """The gateway's log format, so a forced one (``json`` to a terminal, ``console`` to a
    file) holds for the workers' lines too: they write to the same stdout."""
    voices: dict[str, EngineSpec] = field(default_factory=dict)
    """The last good engines of every voice served, by name: a worker loads one when a request
    first needs it."""
    voice_budget: int = 0
    """Engine bytes a worker may hold loaded at once (0: no limit): past it, it lets go of the
    voice it used least recently."""


def _rate(value: float) -> float:
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
class _WorkerHandle:
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


class WorkerPool:
    """Owns the worker processes and the mailboxes of in-flight requests (gateway process)."""

    def __init__(
        self,
        spec: WorkerSpec,
        size: int,
        balancer: HeatScoreBalancer,
        loop: asyncio.AbstractEventLoop,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        self.spec = spec
        self.size = size
        self.balancer = balancer
        self.loop = loop
        self.metrics = metrics
        self.workers: dict[int, _WorkerHandle] = {}
        self.mailboxes: dict[str, Mailbox] = {}
        self.restarts = 0
        self._closing = False
        self._ctx = mp.get_context("spawn")
        self._failures: dict[int, int] = {}
        self._watchdog: asyncio.Task[None] | None = None
        self._swaps: dict[int, tuple[int, asyncio.Future[EnginesSwapped]]] = {}
        self._swap_seq = 0
        self._rollouts = asyncio.Lock()
        """One rollout at a time: a worker answers one swap at a time, and voices' swappers
        may find candidates at once."""

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Spawn every worker; READY arrives later through the reader threads."""
        for wid in range(self.size):
            self._spawn(wid)
        self._watchdog = self.loop.create_task(self._watch())

    async def _watch(self) -> None:
        """Kill workers that never got READY or went silent; their exit then runs the usual
        death path (fail their streams, respawn with backoff).

        Before that, a worker silent past the balancer's heartbeat timeout is no longer routed
        to, and the requests still waiting on it for their first audio are failed at once:
        otherwise they would wait out the queue deadline on a worker that may never answer.
        """
        spec = self.spec
        stale_after = self.balancer.settings.heartbeat_timeout
        period = min(0.5, spec.silence_timeout_s / 4, stale_after / 2)
        while not self._closing:
            await asyncio.sleep(period)
            now = time.monotonic()
            for handle in list(self.workers.values()):
                if not handle.process.is_alive():
                    continue
                if handle.ready is None:
                    stuck = now - handle.started_at > spec.start_timeout_s
                else:
                    stuck = now - handle.last_seen > spec.silence_timeout_s
                    if now - handle.last_seen > stale_after and handle.waiting:
                        self._fail_waiting(handle)
                if stuck:
                    log.warning("worker_unresponsive", worker=handle.id, ready=bool(handle.ready),
                                silent_s=round(now - handle.last_seen, 1))  # fmt: skip
                    handle.killed_for = "stalled"
                    handle.process.kill()

    def _fail_waiting(self, handle: _WorkerHandle) -> None:
        """Fail the streams queued on a silent worker that have no audio yet (503).

        They stay on the worker's books until the worker ends them: their exchanges cancel
        them, and a worker that wakes up drops them (and so releases their balancer slots).
        """
        log.warning("worker_heartbeat_stale", worker=handle.id, waiting=len(handle.waiting),
                    silent_s=round(time.monotonic() - handle.last_seen, 1))  # fmt: skip
        for uid in list(handle.waiting):
            box = self.mailboxes.get(uid)
            if box is not None:
                box.put_nowait(StreamError(uid, 503, "worker_unresponsive",
                                           "the worker this request waited on stopped "
                                           "responding; retry shortly"))  # fmt: skip
        handle.waiting.clear()
        self._gauges(handle)

    def _spawn(self, wid: int) -> None:
        parent, child = self._ctx.Pipe(duplex=True)
        spec = self.spec
        process = self._ctx.Process(
            target=entry.run,
            args=(wid, spec.engine, spec.threads, spec.schedule,
                  spec.max_sentence_chars, spec.multiplex, child, spec.log_level, spec.plan,
                  spec.log_format, dict(spec.voices), spec.voice_budget),
            name=f"ttsvc-worker-{wid}",
            daemon=True,
        )  # fmt: skip
        process.start()
        child.close()
        handle = _WorkerHandle(wid, process, parent)
        handle.specs = {voice: engine.label for voice, engine in spec.voices.items()}
        self.workers[wid] = handle
        threading.Thread(
            target=self._read, args=(handle,), name=f"reader-{wid}", daemon=True
        ).start()
        threading.Thread(
            target=self._write, args=(handle,), name=f"sender-{wid}", daemon=True
        ).start()
        log.info("worker_spawned", worker=wid, pid=process.pid)

    def _read(self, handle: _WorkerHandle) -> None:
        """Reader thread: forward every message to the loop; report EOF as the worker's death."""
        while True:
            try:
                msg = handle.conn.recv()
            except (EOFError, OSError):
                break
            self.loop.call_soon_threadsafe(self._on_message, handle, msg)
        handle.process.join()
        self.loop.call_soon_threadsafe(self._on_exit, handle)

    @staticmethod
    def _write(handle: _WorkerHandle) -> None:
        """Sender thread: one per worker, so messages keep their order and a worker whose pipe
        is full blocks only its own sender, never the event loop or other workers."""
        while (msg := handle.outbox.get()) is not None:
            try:
                handle.conn.send(msg)
            except (OSError, ValueError):
                return  # the worker is gone; its reader thread reports the exit

    def stop_respawning(self) -> None:
        """Draining: a worker that exits now is not replaced."""
        self._closing = True

    async def close(self, timeout: float = 1.0) -> None:
        """Ask workers to exit, then make sure they did.

        The wait is short because it is part of the drain's bound (grace plus two seconds): a
        worker has nothing to save, so one still busy after it is killed, and one already
        silent past the heartbeat timeout (hung, stopped) is killed without waiting at all.
        """
        self._closing = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        now = time.monotonic()
        for handle in list(self.workers.values()):
            self._send(handle, Shutdown())
            handle.outbox.put(None)
            if now - handle.last_seen > self.balancer.settings.heartbeat_timeout:
                handle.process.kill()
        deadline = time.monotonic() + timeout
        for handle in list(self.workers.values()):
            remaining = max(0.0, deadline - time.monotonic())
            await asyncio.to_thread(handle.process.join, remaining)
            if handle.process.is_alive():
                handle.process.kill()

    # --- messages (on the event loop) --------------------------------------------------------

    def _on_message(self, handle: _WorkerHandle, msg: FromWorker) -> None:
        if self.workers.get(handle.id) is not handle:
            return  # a message from a replaced worker
        handle.last_seen = time.monotonic()
        if isinstance(msg, WorkerReady):
            if msg.engine_version != self.spec.engine.label:
                # spawned before a swap finished: replace it rather than serve mixed versions
                log.info("worker_stale_engine", worker=handle.id, engine_version=msg.engine_version)
                handle.process.kill()
                return
            handle.ready = msg
            handle.voices = msg.voices
            self._failures[handle.id] = 0
            for voice, engine in self.spec.voices.items():
                if handle.specs.get(voice) != engine.label and voice != msg.voice:
                    self._swap_seq += 1  # swapped while it started
                    self._send(handle, SwapEngines(engine, self._swap_seq, load=False))
                    handle.specs[voice] = engine.label
            handle.specs[msg.voice] = msg.engine_version
            capacity = _rate(msg.capacity)
            self.balancer.add_worker(handle.id, capacity=capacity, threads=max(1, msg.threads),
                                     voices=msg.voices)  # fmt: skip
            self.balancer.heartbeat(handle.id)
            if self.metrics is not None:
                self.metrics.set_capacity(handle.id, capacity, 0.0, 0)
                self.metrics.set_voices(handle.id, msg.voices)
            log.info("worker_ready", worker=handle.id, engine_version=msg.engine_version,
                     capacity=round(msg.capacity, 2), threads=msg.threads)  # fmt: skip
        elif isinstance(msg, Heartbeat):
            self.balancer.heartbeat(handle.id)
            capacity, demand = _rate(msg.capacity), _rate(msg.demand)
            # streams held back for capacity will need it too: the worker is full for routing
            handle.voices = msg.voices
            self.balancer.report(handle.id, msg.qsize, capacity=capacity,
                                 demand=demand + msg.waiting, voices=msg.voices)  # fmt: skip
            misses, late_s = handle.deadlines.advance(msg.misses, msg.late_s)
            if self.metrics is not None:
                self.metrics.set_capacity(handle.id, capacity, demand, msg.waiting)
                self.metrics.set_voices(handle.id, msg.voices)
                self.metrics.count_deadlines(misses, late_s)
            self._gauges(handle)
        elif isinstance(msg, EnginesSwapped):
            pending = self._swaps.get(handle.id)
            if pending is not None and pending[0] == msg.seq and not pending[1].done():
                pending[1].set_result(msg)  # a late answer to an older request is ignored
        else:
            handle.waiting.discard(msg.uid)
            if isinstance(msg, StreamDone | StreamError):
                handle.streams.discard(msg.uid)
                self.balancer.release(handle.id)
            self._gauges(handle)
            box = self.mailboxes.get(msg.uid)
            if box is not None:
                box.put_nowait(msg)

    def _on_exit(self, handle: _WorkerHandle) -> None:
        if self.workers.get(handle.id) is not handle:
            return
        code = handle.process.exitcode
        self.balancer.remove_worker(handle.id)
        # clients learn why in words; the exit code stays in this process's log (worker_died)
        reason = handle.killed_for or "worker_died"
        message = _EXIT_MESSAGES[reason]
        for uid in list(handle.streams):
            box = self.mailboxes.get(uid)
            if box is not None:
                box.put_nowait(StreamError(uid, 503, reason, message))
        failed = len(handle.streams)
        handle.streams.clear()
        handle.waiting.clear()
        self._gauges(handle)
        if self.metrics is not None:
            self.metrics.set_capacity(handle.id, 0.0, 0.0, 0)
            self.metrics.set_voices(handle.id, ())
        handle.voices = ()
        pending = self._swaps.pop(handle.id, None)
        if pending is not None and not pending[1].done():
            pending[1].set_result(EnginesSwapped(-1, "", False, f"worker exited ({code})"))
        if self._closing:
            return
        failures = self._failures.get(handle.id, 0) + 1
        self._failures[handle.id] = failures
        self.restarts += 1
        if self.metrics is not None:
            self.metrics.worker_restarts.inc()
        delay = min(30.0, 0.5 * 2 ** (failures - 1))
        log.warning("worker_died", worker=handle.id, exitcode=code, reason=reason,
                    streams_failed=failed, respawn_in_s=delay)  # fmt: skip
        self.loop.call_later(delay, self._respawn, handle.id)

    def _respawn(self, wid: int) -> None:
        if not self._closing:
            self._spawn(wid)

    def _gauges(self, handle: _WorkerHandle) -> None:
        if self.metrics is None:
            return
        score = next((w.score for w in self.balancer.snapshot() if w.id == handle.id), None)
        self.metrics.set_worker(handle.id, len(handle.streams), len(handle.waiting), score)

    # --- engine swaps ----------------------------------------------------------------------

    async def rollout(self, engine: EngineSpec, timeout: float) -> EnginesSwapped:
        """Switch READY workers to ``engine`` (a voice's new version, or a new voice's first)
        without ever dropping capacity to zero.

        One worker is the staging slot (one that holds the voice, else the first): it loads the
        candidate beside its serving engines (on a side thread, still serving) and runs the
        canary; only if that passes does it switch. The others that hold the voice then load it
        the same way, side by side, each switching on its own when ready; the rest only learn
        the spec, for when a request needs the voice. From then on the candidate is the voice's
        last good engine set: workers spawned later start on it, and a worker that fails to
        switch (it died, say) is respawned onto it. Other voices are untouched.

        Returns the staging worker's answer (its reason, detail and the precision it found);
        ``worker`` is -1 when the candidate itself was not judged (no worker ready, a worker died
        or did not answer), so it is tried again later.
        """
        async with self._rollouts:
            return await self._rollout(engine, timeout)

    async def _rollout(self, engine: EngineSpec, timeout: float) -> EnginesSwapped:
        ready = [w for w in sorted(self.workers) if self.workers[w].ready is not None]
        if not ready:
            return EnginesSwapped(-1, engine.label, False, "no ready worker to stage the candidate")
        ready.sort(key=lambda w: engine.voice not in self.workers[w].voices)  # stable: by id
        first = await self._swap_one(ready[0], engine, timeout)
        if not first.ok:
            return first
        if engine.voice == self.spec.engine.voice:
            self.spec.engine = engine
        self.spec.voices[engine.voice] = engine
        # every worker READY now, not only those ready before the canary: one that said READY
        # while it ran started without the candidate (later ones start with it)
        others = [w for w in sorted(self.workers)
                  if w != ready[0] and self.workers[w].ready is not None]  # fmt: skip
        replies = await asyncio.gather(*(self._swap_one(w, engine, timeout, load=False)
                                         for w in others))  # fmt: skip
        for wid, reply in zip(others, replies, strict=True):
            if not reply.ok and wid in self.workers:
                log.warning("worker_swap_failed", worker=wid, reason=reply.reason)
                self.workers[wid].process.kill()  # respawns onto the verified candidate
        return first

    async def _swap_one(
        self, wid: int, engine: EngineSpec, timeout: float, load: bool = True
    ) -> EnginesSwapped:
        """Ask one worker to load ``engine`` and switch (``load=False``: only if it holds the
        voice, else to remember the spec); its answer, or a failure."""
        handle = self.workers.get(wid)
        if handle is None or handle.ready is None:
            return EnginesSwapped(-1, engine.label, False, "worker not ready")
        self._swap_seq += 1
        seq = self._swap_seq
        future: asyncio.Future[EnginesSwapped] = self.loop.create_future()
        self._swaps[wid] = (seq, future)
        self._send(handle, SwapEngines(engine, seq, load))
        try:
            reply = await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            # it may still switch later: replace it, so it respawns on the last good engines
            handle.process.kill()
            reply = EnginesSwapped(-1, engine.label, False, f"no answer in {timeout:g} s")
        finally:
            self._swaps.pop(wid, None)
        if reply.ok:
            handle.specs[engine.voice] = engine.label
        if reply.ok and handle.ready is not None and engine.voice == handle.ready.voice:
            handle.ready = replace(handle.ready, engine_version=engine.label)
            log.info("worker_swapped", worker=wid, engine_version=engine.label)
        return reply

    # --- requests ------------------------------------------------------------------------------

    @staticmethod
    def _send(handle: _WorkerHandle, msg: ToWorker) -> None:
        handle.outbox.put(msg)

    async def submit(self, wid: int, job: SynthesisJob) -> Mailbox:
        """Send a job to a worker chosen by the balancer; its messages arrive in the mailbox."""
        handle = self.workers[wid]
        box: Mailbox = asyncio.Queue()
        self.mailboxes[job.uid] = box
        handle.streams.add(job.uid)
        handle.waiting.add(job.uid)
        self._gauges(handle)
        self._send(handle, job)  # a dead worker's exit fails this stream like its others
        return box

    def cancel(self, wid: int, uid: str) -> None:
        """Tell a worker to drop a stream whose client went away."""
        handle = self.workers.get(wid)
        if handle is not None and uid in handle.streams:
            self._send(handle, CancelStream(uid))

    def forget(self, uid: str) -> None:
        """The request is over on the gateway side: drop its mailbox."""
        self.mailboxes.pop(uid, None)

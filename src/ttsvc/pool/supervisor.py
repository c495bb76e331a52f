"""Spawns and watches worker processes; demultiplexes their messages into request mailboxes.

Lives in the gateway process. One reader thread per worker blocks on its pipe and hands each
message to the event loop (``call_soon_threadsafe``), so the loop never blocks on IO. A worker
that dies fails only its own streams and is respawned with backoff; it is routed to again only
after it says READY.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import threading
import time
from collections.abc import Callable

from ttsvc.balancer import HeatScoreBalancer
from ttsvc.errors import TTSError, WorkerLost, WorkerStalled, WorkerUnresponsive
from ttsvc.observability.logs import get_logger
from ttsvc.observability.metrics import ServiceMetrics
from ttsvc.pool.handle import WorkerHandle, WorkerSpec, usable_rate
from ttsvc.pool.rollout import Rollouts
from ttsvc.protocol import (
    AudioChunkMsg,
    CancelStream,
    EngineSpec,
    EnginesSwapped,
    FromWorker,
    Heartbeat,
    Shutdown,
    StartFailed,
    StreamDone,
    StreamError,
    SwapEngines,
    SynthesisJob,
    WorkerReady,
)
from ttsvc.worker import entry

log = get_logger("pool")
Mailbox = asyncio.Queue[AudioChunkMsg | StreamDone | StreamError]

_EXITS: dict[str, TTSError] = {
    "worker_died": WorkerLost("the worker serving this request exited; retry shortly"),
    "stalled": WorkerStalled("the worker serving this request stopped responding; retry shortly"),
}
"""What a stream's client is told when its worker is gone, by reason."""


class WorkerPool:
    """Owns the worker processes and the mailboxes of in-flight requests (gateway process)."""

    def __init__(
        self,
        spec: WorkerSpec,
        size: int,
        balancer: HeatScoreBalancer,
        loop: asyncio.AbstractEventLoop,
        metrics: ServiceMetrics | None = None,
        on_start_failed: Callable[[StartFailed], None] | None = None,
    ) -> None:
        """``on_start_failed`` is told when workers could not start on the engines they were
        spawned with and no worker serves those (the engine lifecycle judges the version and
        calls ``retarget`` with the one to start on instead)."""
        self.spec = spec
        self.on_start_failed = on_start_failed
        self.size = size
        self.balancer = balancer
        self.loop = loop
        self.metrics = metrics
        self.workers: dict[int, WorkerHandle] = {}
        self.mailboxes: dict[str, Mailbox] = {}
        self.restarts = 0
        self._closing = False
        self._ctx = mp.get_context("spawn")
        self._failures: dict[int, int] = {}
        self._held: set[int] = set()
        """Workers not respawned after a failed start until ``retarget`` names other engines."""
        self._watchdog: asyncio.Task[None] | None = None
        self.rollouts = Rollouts(self.workers, spec, loop)

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
                if not handle.running:
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
                    handle.kill()

    def _fail_waiting(self, handle: WorkerHandle) -> None:
        """Fail the streams queued on a silent worker that have no audio yet (503).

        They stay on the worker's books until the worker ends them: their exchanges cancel
        them, and a worker that wakes up drops them (and so releases their balancer slots).
        """
        log.warning("worker_heartbeat_stale", worker=handle.id, waiting=len(handle.waiting),
                    silent_s=round(time.monotonic() - handle.last_seen, 1))  # fmt: skip
        for uid in list(handle.waiting):
            box = self.mailboxes.get(uid)
            if box is not None:
                box.put_nowait(StreamError.of(uid, WorkerUnresponsive(
                    "the worker this request waited on stopped responding; retry shortly")))
        handle.waiting.clear()
        self._gauges(handle)

    def _spawn(self, wid: int) -> None:
        parent, child = self._ctx.Pipe(duplex=True)
        spec = self.spec
        process = self._ctx.Process(
            target=entry.run,
            args=(wid, spec.worker_config(), child),
            name=f"ttsvc-worker-{wid}",
            daemon=True,
        )  # fmt: skip
        process.start()
        child.close()
        handle = WorkerHandle(wid, process, parent)
        self._adopt(handle)
        handle.specs = {voice: engine.label for voice, engine in spec.voices.items()}
        threading.Thread(
            target=self._read, args=(handle,), name=f"reader-{wid}", daemon=True
        ).start()
        threading.Thread(
            target=self._write, args=(handle,), name=f"sender-{wid}", daemon=True
        ).start()
        log.info("worker_spawned", worker=wid, pid=process.pid)

    def _adopt(self, handle: WorkerHandle) -> None:
        """Make ``handle`` the pool's view of its worker id (a respawn replaces the last)."""
        self.workers[handle.id] = handle
        if self.metrics is not None:
            self.metrics.watch_settled(handle.id, lambda: handle.settled)

    def _read(self, handle: WorkerHandle) -> None:
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
    def _write(handle: WorkerHandle) -> None:
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
        live = [h for h in self.workers.values() if h.exitcode is None]
        for handle in live:
            handle.send(Shutdown())
            handle.outbox.put(None)
            if now - handle.last_seen > self.balancer.settings.heartbeat_timeout:
                handle.kill()
        deadline = time.monotonic() + timeout
        for handle in live:
            remaining = max(0.0, deadline - time.monotonic())
            await asyncio.to_thread(handle.process.join, remaining)
            if handle.process.is_alive():
                handle.kill()

    # --- messages (on the event loop) --------------------------------------------------------

    def _on_message(self, handle: WorkerHandle, msg: FromWorker) -> None:
        if self.workers.get(handle.id) is not handle:
            return  # a message from a replaced worker
        handle.last_seen = time.monotonic()
        if isinstance(msg, WorkerReady):
            if msg.engine_version != self.spec.engine.label:
                # spawned before a swap finished: replace it rather than serve mixed versions
                log.info("worker_stale_engine", worker=handle.id, engine_version=msg.engine_version)
                handle.kill()
                return
            handle.ready = msg
            handle.voices = msg.voices
            self._failures[handle.id] = 0
            for voice, engine in self.spec.voices.items():
                if handle.specs.get(voice) != engine.label and voice != msg.voice:
                    # swapped while it started
                    handle.send(SwapEngines(engine, self.rollouts.next_seq(), load=False))
                    handle.specs[voice] = engine.label
            handle.specs[msg.voice] = msg.engine_version
            capacity = usable_rate(msg.capacity)
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
            capacity, demand = usable_rate(msg.capacity), usable_rate(msg.demand)
            # streams held back for capacity will need it too: the worker is full for routing
            handle.voices = msg.voices
            # a heartbeat sent before the worker received a job or a swap may arrive after
            # they were sent: it counts only while the pool has nothing out on the worker
            handle.settled = (msg.settled and not handle.streams
                              and not self.rollouts.waiting_on(handle.id))  # fmt: skip
            misses, late_s = handle.deadlines.advance(msg.misses, msg.late_s)
            self.balancer.report(handle.id, msg.qsize, capacity=capacity,
                                 demand=demand + msg.waiting, voices=msg.voices,
                                 late=misses > 0)  # fmt: skip
            if self.metrics is not None:
                self.metrics.set_capacity(handle.id, capacity, demand, msg.waiting)
                self.metrics.set_voices(handle.id, msg.voices)
                self.metrics.count_deadlines(misses, late_s)
            self._gauges(handle)
        elif isinstance(msg, EnginesSwapped):
            handle.settled = False
            self.rollouts.answered(handle.id, msg)
        elif isinstance(msg, StartFailed):
            handle.start_failed = msg  # the worker exits next; its exit decides what follows
        else:
            handle.settled = False
            handle.waiting.discard(msg.uid)
            if isinstance(msg, StreamDone | StreamError):
                handle.streams.discard(msg.uid)
                self.balancer.release(handle.id)
            self._gauges(handle)
            box = self.mailboxes.get(msg.uid)
            if box is not None:
                box.put_nowait(msg)

    def _on_exit(self, handle: WorkerHandle) -> None:
        code = handle.process.exitcode
        if not self._closing:  # closing joins every process itself, then the gateway exits
            _release(handle, -1 if code is None else code)
        if self.workers.get(handle.id) is not handle:
            return
        self.balancer.remove_worker(handle.id)
        # clients learn why in words; the exit code stays in this process's log (worker_died)
        reason = handle.killed_for or "worker_died"
        error = _EXITS[reason]
        for uid in list(handle.streams):
            box = self.mailboxes.get(uid)
            if box is not None:
                box.put_nowait(StreamError.of(uid, error))
        failed = len(handle.streams)
        handle.streams.clear()
        handle.waiting.clear()
        handle.settled = False
        self._gauges(handle)
        if self.metrics is not None:
            self.metrics.set_capacity(handle.id, 0.0, 0.0, 0)
            self.metrics.set_voices(handle.id, ())
        handle.voices = ()
        self.rollouts.answered(handle.id, EnginesSwapped(-1, "", False, f"worker exited ({code})"))
        if self._closing:
            return
        if handle.start_failed is not None and self._judge_start(handle, handle.start_failed):
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

    def _judge_start(self, handle: WorkerHandle, failed: StartFailed) -> bool:
        """A worker exited because its start engines could not serve. Unless a worker serves
        them anyway (then this was the process's trouble: it is respawned as after a crash, and
        this returns False), the engines are at fault: the worker is respawned at once if other
        engines were named since it started, else it waits, unspawned, for ``retarget`` while
        the engine lifecycle judges the version."""
        log.warning("worker_start_failed", worker=handle.id, voice=failed.voice,
                    engine_version=failed.label, reason=failed.reason)  # fmt: skip
        retargeted = self.spec.engine.label != failed.label
        served = any(w.ready is not None and w.specs.get(failed.voice) == failed.label
                     for w in self.workers.values())  # fmt: skip
        if not retargeted and (served or self.on_start_failed is None):
            return False
        self.restarts += 1
        if self.metrics is not None:
            self.metrics.worker_restarts.inc()
        if retargeted:
            self.loop.call_soon(self._respawn, handle.id)
        else:
            self._held.add(handle.id)
            assert self.on_start_failed is not None
            self.on_start_failed(failed)
        return True

    def retarget(self, engine: EngineSpec) -> None:
        """Start workers of ``engine.voice`` on ``engine`` from now on (the version they were
        started on could not serve), and spawn the workers held after a failed start."""
        if engine.voice == self.spec.engine.voice:
            self.spec.engine = engine
        self.spec.voices[engine.voice] = engine
        held, self._held = self._held, set()
        for wid in sorted(held):
            self._respawn(wid)

    def held_for(self, voice: str) -> bool:
        """Whether workers wait, unspawned, for other engines of ``voice`` to start on."""
        return bool(self._held) and voice == self.spec.engine.voice

    def _respawn(self, wid: int) -> None:
        if not self._closing:
            self._spawn(wid)

    def _gauges(self, handle: WorkerHandle) -> None:
        if self.metrics is None:
            return
        score = self.balancer.score(handle.id)
        self.metrics.set_worker(handle.id, len(handle.streams), len(handle.waiting), score)
        self.metrics.headroom.set(self.balancer.headroom())

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
        return await self.rollouts.run(engine, timeout)

    # --- requests ------------------------------------------------------------------------------

    def pick(self, voice: str | None) -> tuple[int, int]:
        """The worker the balancer routes a new stream of ``voice`` to, and its load counting
        that stream (raises ``NoWorkerAvailable``, or ``NoHeadroom`` when every worker is
        full). The pool is the balancer's one user for a stream's life: it picks here,
        ``submit`` dispatches, the worker's last message releases."""
        wid = self.balancer.pick(voice)  # NoHeadroom: every worker full, none touched
        if self.metrics is not None:
            self.metrics.headroom.set(self.balancer.headroom())
        return wid, self.balancer.load_of(wid)

    def serving(self, voice: str) -> tuple[list[str], list[int]]:
        """For ``voice``: the engine versions READY workers serve (or would load it from), and
        the READY workers that hold it loaded now, both sorted."""
        ready = [w for w in self.workers.values() if w.ready]
        versions = sorted({label for w in ready if (label := w.specs.get(voice)) is not None})
        return versions, sorted(w.id for w in ready if voice in w.voices)

    def observe(self, wid: int, ttfa_ms: float) -> None:
        """A stream's first audio took ``ttfa_ms`` of the worker's time: its heat score learns."""
        self.balancer.observe(wid, ttfa_ms)

    async def submit(self, wid: int, job: SynthesisJob) -> Mailbox:
        """Send a job to a worker chosen by the balancer; its messages arrive in the mailbox."""
        handle = self.workers[wid]
        box: Mailbox = asyncio.Queue()
        self.mailboxes[job.uid] = box
        handle.streams.add(job.uid)
        handle.waiting.add(job.uid)
        handle.send(job)  # a dead worker's exit fails this stream like its others
        self._gauges(handle)
        return box

    def cancel(self, wid: int, uid: str) -> None:
        """Tell a worker to drop a stream whose client went away."""
        handle = self.workers.get(wid)
        if handle is not None and uid in handle.streams:
            handle.send(CancelStream(uid))

    def forget(self, uid: str) -> None:
        """The request is over on the gateway side: drop its mailbox."""
        self.mailboxes.pop(uid, None)


def _release(handle: WorkerHandle, code: int) -> None:
    """Let go of everything a dead worker held in this process: its sender thread (woken to
    end), its end of the pipe and its process handle (the pipes ``multiprocessing`` keeps to
    know when it exits). Without this, a worker that dies and is respawned over and over (a
    bad engine, an out-of-memory loop) leaks a thread and three descriptors each time."""
    handle.exitcode = code
    handle.outbox.put(None)
    handle.conn.close()
    handle.process.close()  # the reader thread has joined it

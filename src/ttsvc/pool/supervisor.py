"""Spawns and watches worker processes; demultiplexes their messages into request mailboxes.

Lives in the gateway process. One reader thread per worker blocks on its pipe and hands each
message to the event loop (``call_soon_threadsafe``), so the loop never blocks on IO. A worker
that dies fails only its own streams and is respawned with backoff; it is routed to again only
after it says READY.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from ttsvc.balancer import HeatScoreBalancer
from ttsvc.observability.logs import get_logger
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
from ttsvc.worker.process import run_worker

log = get_logger("pool")
Mailbox = asyncio.Queue[AudioChunkMsg | StreamDone | StreamError]


@dataclass
class WorkerSpec:
    """How every worker of the pool is started."""

    engine: EngineSpec
    """The engines a new or respawned worker loads: always the last good ones."""
    threads: int
    schedule: tuple[int, float, int]
    max_sentence_chars: int
    multiplex: bool = True
    start_timeout_s: float = 120.0
    """Not READY within this after spawn: killed and respawned."""
    silence_timeout_s: float = 10.0
    """No message for this long from a READY worker: killed (a hung worker never sends EOF)."""


@dataclass
class _WorkerHandle:
    """The gateway's view of one worker process."""

    id: int
    process: BaseProcess
    conn: Connection
    ready: WorkerReady | None = None
    streams: set[str] = field(default_factory=set)
    started_at: float = field(default_factory=time.monotonic)
    last_seen: float = field(default_factory=time.monotonic)
    send_lock: threading.Lock = field(default_factory=threading.Lock)


class WorkerPool:
    """Owns the worker processes and the mailboxes of in-flight requests (gateway process)."""

    def __init__(
        self,
        spec: WorkerSpec,
        size: int,
        balancer: HeatScoreBalancer,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.spec = spec
        self.size = size
        self.balancer = balancer
        self.loop = loop
        self.workers: dict[int, _WorkerHandle] = {}
        self.mailboxes: dict[str, Mailbox] = {}
        self.restarts = 0
        self._closing = False
        self._ctx = mp.get_context("spawn")
        self._failures: dict[int, int] = {}
        self._watchdog: asyncio.Task[None] | None = None
        self._swaps: dict[int, asyncio.Future[EnginesSwapped]] = {}

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Spawn every worker; READY arrives later through the reader threads."""
        for wid in range(self.size):
            self._spawn(wid)
        self._watchdog = self.loop.create_task(self._watch())

    async def _watch(self) -> None:
        """Kill workers that never got READY or went silent; their exit then runs the usual
        death path (fail their streams, respawn with backoff)."""
        spec = self.spec
        period = min(0.5, spec.silence_timeout_s / 4)
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
                if stuck:
                    log.warning("worker_unresponsive", worker=handle.id, ready=bool(handle.ready),
                                silent_s=round(now - handle.last_seen, 1))  # fmt: skip
                    handle.process.kill()

    def _spawn(self, wid: int) -> None:
        parent, child = self._ctx.Pipe(duplex=True)
        spec = self.spec
        process = self._ctx.Process(
            target=run_worker,
            args=(wid, spec.engine, spec.threads, spec.schedule,
                  spec.max_sentence_chars, spec.multiplex, child),
            name=f"ttsvc-worker-{wid}",
            daemon=True,
        )  # fmt: skip
        process.start()
        child.close()
        handle = _WorkerHandle(wid, process, parent)
        self.workers[wid] = handle
        threading.Thread(
            target=self._read, args=(handle,), name=f"reader-{wid}", daemon=True
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

    def ready_count(self) -> int:
        """Workers that said READY and are alive."""
        return sum(1 for w in self.workers.values() if w.ready is not None)

    async def close(self, timeout: float = 5.0) -> None:
        """Ask workers to exit, then make sure they did."""
        self._closing = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        for handle in list(self.workers.values()):
            with contextlib.suppress(OSError, ValueError):
                self._send(handle, Shutdown())
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
            handle.ready = msg
            self._failures[handle.id] = 0
            self.balancer.add_worker(handle.id)
            self.balancer.heartbeat(handle.id)
            log.info("worker_ready", worker=handle.id, engine_version=msg.engine_version)
        elif isinstance(msg, Heartbeat):
            self.balancer.heartbeat(handle.id)
            self.balancer.report(handle.id, msg.qsize)
        elif isinstance(msg, EnginesSwapped):
            future = self._swaps.pop(handle.id, None)
            if future is not None and not future.done():
                future.set_result(msg)
        else:
            if isinstance(msg, StreamDone | StreamError):
                handle.streams.discard(msg.uid)
                self.balancer.release(handle.id)
            box = self.mailboxes.get(msg.uid)
            if box is not None:
                box.put_nowait(msg)

    def _on_exit(self, handle: _WorkerHandle) -> None:
        if self.workers.get(handle.id) is not handle:
            return
        code = handle.process.exitcode
        self.balancer.remove_worker(handle.id)
        for uid in list(handle.streams):
            box = self.mailboxes.get(uid)
            if box is not None:
                box.put_nowait(
                    StreamError(uid, 503, "worker_died", f"worker {handle.id} exited ({code})")
                )
        handle.streams.clear()
        future = self._swaps.pop(handle.id, None)
        if future is not None and not future.done():
            future.set_result(EnginesSwapped(handle.id, "", False, f"worker exited ({code})"))
        if self._closing:
            return
        failures = self._failures.get(handle.id, 0) + 1
        self._failures[handle.id] = failures
        self.restarts += 1
        delay = min(30.0, 0.5 * 2 ** (failures - 1))
        log.warning("worker_died", worker=handle.id, exitcode=code, respawn_in_s=delay)
        self.loop.call_later(delay, self._respawn, handle.id)

    def _respawn(self, wid: int) -> None:
        if not self._closing:
            self._spawn(wid)

    # --- engine swaps ----------------------------------------------------------------------

    async def rollout(self, engine: EngineSpec, timeout: float) -> tuple[bool, str]:
        """Switch READY workers to ``engine`` one at a time, so capacity never drops to zero.

        The first worker is the staging slot: it loads the candidate beside its serving engines
        and runs the canary; only if that passes does anything switch. From then on the
        candidate is the last good engine set: workers spawned later start on it, and a later
        worker that fails to switch (it died, say) is respawned onto it.
        """
        staged = False
        for wid in sorted(self.workers):
            handle = self.workers.get(wid)
            if handle is None or handle.ready is None:
                continue  # it will start on whatever spec is current when it (re)spawns
            future: asyncio.Future[EnginesSwapped] = self.loop.create_future()
            self._swaps[wid] = future
            try:
                await asyncio.to_thread(self._send, handle, SwapEngines(engine))
                reply = await asyncio.wait_for(future, timeout)
            except (OSError, ValueError):
                reply = EnginesSwapped(wid, engine.label, False, "worker unreachable")
            except asyncio.TimeoutError:
                reply = EnginesSwapped(wid, engine.label, False, f"no answer in {timeout:g} s")
            finally:
                self._swaps.pop(wid, None)
            if not reply.ok:
                if not staged:
                    return False, reply.reason
                log.warning("worker_swap_failed", worker=wid, reason=reply.reason)
                handle.process.kill()  # respawns onto the verified candidate
                continue
            staged = True
            self.spec.engine = engine
            handle.ready = WorkerReady(wid, handle.ready.voice, engine.label,
                                       handle.ready.sample_rate)  # fmt: skip
            log.info("worker_swapped", worker=wid, engine_version=engine.label)
        if not staged:  # no READY worker to stage on: try again on the next change
            return False, "no ready worker to stage the candidate"
        return True, ""

    # --- requests ------------------------------------------------------------------------------

    def _send(self, handle: _WorkerHandle, msg: ToWorker) -> None:
        with handle.send_lock:
            handle.conn.send(msg)

    async def submit(self, wid: int, job: SynthesisJob) -> Mailbox:
        """Send a job to a worker chosen by the balancer; its messages arrive in the mailbox."""
        handle = self.workers[wid]
        box: Mailbox = asyncio.Queue()
        self.mailboxes[job.uid] = box
        handle.streams.add(job.uid)
        try:
            await asyncio.to_thread(self._send, handle, job)
        except (OSError, ValueError):
            handle.streams.discard(job.uid)
            self.balancer.release(wid)
            box.put_nowait(StreamError(job.uid, 503, "worker_died", f"worker {wid} unreachable"))
        return box

    async def cancel(self, wid: int, uid: str) -> None:
        """Tell a worker to drop a stream whose client went away."""
        handle = self.workers.get(wid)
        if handle is not None and uid in handle.streams:
            with contextlib.suppress(OSError, ValueError):
                await asyncio.to_thread(self._send, handle, CancelStream(uid))

    def forget(self, uid: str) -> None:
        """The request is over on the gateway side: drop its mailbox."""
        self.mailboxes.pop(uid, None)

"""Worker process entry: load engines, pass the canary, say READY, then serve the pipe.

The compute loop (``StreamScheduler``) stays importable; this wrapper adds the pipe, heartbeats,
signals and the exit when the gateway goes away.
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection

import structlog

from ttsvc.errors import EngineError
from ttsvc.observability.logs import configure_logging
from ttsvc.protocol import (
    CancelStream,
    EngineSpec,
    EnginesSwapped,
    FromWorker,
    Heartbeat,
    Shutdown,
    SwapEngines,
    SynthesisJob,
    WorkerReady,
)
from ttsvc.synthesis import Synthesizer, WindowSchedule, canary_failure
from ttsvc.worker.batching import batch_limit, scheduler_for
from ttsvc.worker.compute import StreamScheduler
from ttsvc.worker.deadline import DeadlineScheduler, measure
from ttsvc.worker.heap import Heap

HEARTBEAT_INTERVAL_S = 0.5
STAGING_POLL_S = 0.05
"""How long an idle worker waits on its pipe before looking for a staged engine set."""


def _load(
    spec: EngineSpec,
    threads: int,
    schedule: WindowSchedule,
    max_sentence_chars: int,
    cost: tuple[float, float, float] = (0.0, 0.0, 0.0),
) -> Synthesizer:
    """Load, warm up and calibrate an engine set; raise if its canary fails.

    A swap passes the serving engines' measured costs per frame (flow and vocoder together, and
    the flow's part): the new set runs the same architecture on the same machine, and measuring
    again would compete with live streams.
    """
    # imported here, in the worker: the gateway imports this module only to name the spawn
    # target, and must not carry an inference runtime it never runs (20 MB RSS for ORT alone)
    from ttsvc.backends.loader import load_engine_spec  # noqa: PLC0415

    synth = Synthesizer(load_engine_spec(spec, threads), schedule,
                        max_sentence_chars)  # fmt: skip
    failure = canary_failure(synth)  # also the warm-up: first runs allocate
    if failure is not None:
        raise EngineError(f"{spec.source} ({spec.label}): {failure}",
                          reason=f"canary synthesis failed: {failure}")  # fmt: skip
    if cost[0] > 0:  # frame cost, flow's share of it, acoustic cost per id
        synth.frame_cost_s, synth.flow_cost_s, synth.acoustic_cost_s = cost
        synth.vocoder_cost_s = cost[0] - cost[1]
    else:
        synth.calibrate()  # window sizes then follow this machine's real speed
    return synth


@dataclass(frozen=True)
class ComputePlan:
    """How a worker computes: its scheduler, compute threads and admission limit."""

    threads: int = 1
    """Compute threads over the process's one deadline queue (``deadline`` scheduler)."""
    scheduler: str = "deadline"
    """``deadline`` (``worker.deadline``) or ``legacy`` (``worker.compute``: one thread)."""
    load_limit: float = 0.9
    """Share of the measured real-time capacity admitted streams may demand."""


HANG_S = 5.0
"""A step running longer than this is hung (the longest real ones take a fraction of a second):
the worker stops its heartbeats, and the gateway kills and replaces it."""


def run_worker(
    worker_id: int,
    spec: EngineSpec,
    threads: int,
    schedule: WindowSchedule,
    max_sentence_chars: int,
    multiplex: bool,
    conn: Connection,
    log_level: str = "info",
    plan: ComputePlan | None = None,
    log_format: str = "auto",
) -> None:
    """Process target (spawned). Returns when the gateway says so or its pipe closes."""
    # the gateway owns shutdown: a Ctrl-C in the terminal, or a SIGTERM sent to the whole
    # process group (systemd, tini -g), must not kill workers while the gateway drains
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    configure_logging(log_level, sys.stdout, log_format)
    structlog.contextvars.bind_contextvars(worker=worker_id)
    plan = plan or ComputePlan()
    heap = Heap()
    heap.pin_mmap_threshold()  # before the engines load: their weights are the large blocks
    synth = _load(spec, threads, schedule, max_sentence_chars)
    deadline = plan.scheduler == "deadline" and multiplex and batch_limit(synth.engines) == 1
    if deadline:
        rate, first_chunk_s, per_char = measure(synth)
        scheduler: StreamScheduler | DeadlineScheduler = DeadlineScheduler(
            synth, plan.threads, plan.load_limit, rate, first_chunk_s=first_chunk_s,
            audio_per_char=per_char)
    else:  # legacy, FIFO, or engines that batch windows (GPU plans): one compute loop
        scheduler = scheduler_for(synth, multiplex)
    pipe_lock = threading.Lock()

    def send(msg: FromWorker) -> None:
        with pipe_lock:  # compute threads and this one share the pipe
            conn.send(msg)

    capacity = scheduler.capacity.value if isinstance(scheduler, DeadlineScheduler) else 0.0
    send(WorkerReady(worker_id, synth.engines.manifest.voice, spec.label, synth.sample_rate,
                     capacity, plan.threads if deadline else 1))  # fmt: skip
    del synth  # the scheduler holds the serving engines: a local would keep the first set forever
    if isinstance(scheduler, DeadlineScheduler):
        scheduler.start(send)
        try:
            _serve(worker_id, scheduler, conn, send, heap, threads, schedule, max_sentence_chars)
        finally:
            scheduler.close()
        return
    _serve(worker_id, scheduler, conn, send, heap, threads, schedule, max_sentence_chars)


def _costs(synth: Synthesizer) -> tuple[float, float, float]:
    """The measured costs a candidate engine set takes over from the serving one."""
    return synth.frame_cost_s, synth.flow_cost_s, synth.acoustic_cost_s


def _heartbeat(worker_id: int, scheduler: StreamScheduler | DeadlineScheduler) -> Heartbeat:
    if not isinstance(scheduler, DeadlineScheduler):
        return Heartbeat(worker_id, len(scheduler.streams))
    with scheduler.lock:
        return Heartbeat(worker_id, len(scheduler.streams), scheduler.capacity.value,
                         scheduler.demand(), scheduler.waiting(), scheduler.misses,
                         scheduler.late_s)  # fmt: skip


def _serve(
    worker_id: int,
    scheduler: StreamScheduler | DeadlineScheduler,
    conn: Connection,
    send: Callable[[FromWorker], None],
    heap: Heap,
    threads: int,
    schedule: WindowSchedule,
    max_sentence_chars: int,
) -> None:
    """The worker's main loop: the pipe, heartbeats and staged swaps, and, for a single-loop
    scheduler, its steps (the deadline scheduler's own threads run its steps)."""
    threaded = scheduler if isinstance(scheduler, DeadlineScheduler) else None
    staged: queue.SimpleQueue[tuple[SwapEngines, Synthesizer | tuple[str, str]]]
    staged = queue.SimpleQueue()
    newest_swap = 0

    def stage(request: SwapEngines, cost: tuple[float, float, float]) -> None:
        """Load and canary a candidate beside the serving engines, off the compute loop, so the
        streams this worker is serving do not stall while it loads."""
        try:
            spec = request.spec
            staged.put((request, _load(spec, threads, schedule, max_sentence_chars, cost)))
        except Exception as exc:  # a bad candidate must never take the worker down
            # strings only: the exception's traceback would keep the failed candidate's
            # frames, and with them its loaded engines, alive until the next swap. The gateway
            # answers clients with the public reason; the detail is for its log.
            public = exc.public() if isinstance(exc, EngineError) else "could not be loaded"
            staged.put((request, (public, str(exc))))

    last_beat = 0.0
    parent = os.getppid()
    while True:
        now = time.monotonic()
        if now - last_beat >= HEARTBEAT_INTERVAL_S:
            if os.getppid() != parent:
                return  # the gateway died: do not linger as an orphan
            if threaded is None or threaded.stalled_for() < HANG_S:
                send(_heartbeat(worker_id, scheduler))
            last_beat = now
        while not staged.empty():
            request, result = staged.get()
            label = request.spec.label
            if request.seq != newest_swap:
                reply = EnginesSwapped(worker_id, label, False, "superseded", request.seq)
            elif isinstance(result, tuple):
                public, detail = result
                reply = EnginesSwapped(worker_id, label, False, public, request.seq,
                                       detail=detail)  # fmt: skip
            else:
                if isinstance(scheduler, DeadlineScheduler):
                    with scheduler.lock:
                        scheduler.synth = result  # running streams keep their own engines
                else:
                    scheduler.synth = result
                reply = EnginesSwapped(worker_id, label, True, "", request.seq,
                                       precision=result.engines.precision)  # fmt: skip
            del result  # a superseded candidate is freed now, not at the next swap
            heap.freed()
            send(reply)
        busy = bool(scheduler.streams)
        timeout = 0.0 if busy and threaded is None else STAGING_POLL_S
        try:
            if not busy and not conn.poll(0):
                heap.trim_if_due()  # idle: a trim's few milliseconds delay no window
            while conn.poll(timeout):
                msg = conn.recv()
                timeout = 0.0
                if isinstance(msg, SynthesisJob):
                    scheduler.add(msg)
                elif isinstance(msg, CancelStream):
                    done = scheduler.cancel(msg.uid)
                    heap.freed()
                    if done is not None:
                        send(done)
                elif isinstance(msg, SwapEngines):
                    newest_swap = msg.seq
                    cost = _costs(scheduler.synth)  # no local: it would pin the old engines
                    threading.Thread(target=stage, args=(msg, cost), daemon=True).start()
                elif isinstance(msg, Shutdown):
                    return
        except (EOFError, OSError):
            return
        if busy:
            heap.freed()
        if scheduler.streams and not isinstance(scheduler, DeadlineScheduler):
            scheduler.step(send)  # streams as they are now: a cancel may have ended the last

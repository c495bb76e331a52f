"""Worker process entry: load engines, pass the canary, say READY, then serve the pipe.

The scheduler stays importable; this wrapper adds the pipe, heartbeats, signals and the exit
when the gateway goes away around the worker's one scheduler (``worker.deadline``, whose
threads run every step; on engines that batch, a step serves several streams at once).
``run_worker`` sets the process up and
``WorkerLoop`` serves it; the loads themselves (at start, for a swap, for a voice a request
needs) are ``worker.loading``'s.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

import structlog

from ttsvc.errors import EngineError, UnknownVoice, VoiceUnavailable
from ttsvc.observability.logs import capture_stray_output, configure_logging, get_logger
from ttsvc.protocol import (
    CancelStream,
    EngineSpec,
    EnginesSwapped,
    FromWorker,
    Heartbeat,
    ScriptRun,
    Shutdown,
    StartFailed,
    StreamDone,
    StreamError,
    SwapEngines,
    SynthesisJob,
    WorkerReady,
)
from ttsvc.synthesis import Synthesizer
from ttsvc.text.phonemize import close_phonemizer
from ttsvc.worker.batching import MAX_BATCH
from ttsvc.worker.costs import measure
from ttsvc.worker.deadline import DeadlineScheduler
from ttsvc.worker.heap import Heap
from ttsvc.worker.limits import limit_memory
from ttsvc.worker.loading import Loader, Outcome, alike_costs, load, measured_costs
from ttsvc.worker.plan import ComputePlan, WorkerConfig
from ttsvc.worker.voices import VoiceSet, footprint, resident_bytes

log = get_logger("worker")

HEARTBEAT_INTERVAL_S = 0.5
STAGING_POLL_S = 0.05
"""How long an idle worker waits on its pipe before looking for a staged engine set."""
LOAD_HANG_S = 120.0
"""A load running longer than this is hung (a real one takes well under a second, a staged one
with its canary a few): the worker stops its heartbeats and the gateway replaces it, instead of
requests for voices it does not hold waiting behind the load forever."""
LOAD_POLL_S = 0.002
"""The same while a load runs: requests waiting for a voice start as soon as it is in."""
HANG_S = 5.0
"""A step running longer than this is hung (the longest real ones take a fraction of a second):
the worker stops its heartbeats, and the gateway kills and replaces it."""


def run_worker(worker_id: int, config: WorkerConfig, conn: Connection) -> None:
    """Process target (spawned). Returns when the gateway says so or its pipe closes.

    ``config.engine`` is the voice loaded at start (its canary also measures the process's
    capacity); ``config.voices`` are the others the gateway serves, loaded when a request first
    needs one, within ``config.voice_budget`` engine bytes held at once (0: no limit);
    ``config.memory_bytes`` caps the process's memory (0: no cap; ``worker.limits``).

    Whatever ends the process is logged as one JSON event (an exception with its traceback
    inside), never left to Python's raw traceback on stderr, which log collectors drop."""
    # the gateway owns shutdown: a Ctrl-C in the terminal, or a SIGTERM sent to the whole
    # process group (systemd, tini -g), must not kill workers while the gateway drains
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    relay = None
    if configure_logging(config.log_level, sys.stdout, config.log_format) == "json":
        relay = capture_stray_output(native=True)  # ONNX Runtime writes to fd 2 itself
    structlog.contextvars.bind_contextvars(worker=worker_id)
    try:
        limit_memory(config.memory_bytes)
        _serve(worker_id, config, conn)
    except Exception:
        log.exception("worker_failed")
        raise SystemExit(1) from None
    finally:
        close_phonemizer()  # before the relay: the child holds fd 2's pipe open too
        if relay is not None:
            relay.close()


def _serve(worker_id: int, config: WorkerConfig, conn: Connection) -> None:
    """Load the start engines, say READY (or why they cannot serve), then serve the pipe."""
    spec, threads, schedule = config.engine, config.threads, config.schedule
    max_sentence_chars = config.max_sentence_chars
    # imported before ``before``: the runtime's own memory is not a voice's
    import ttsvc.backends.loader  # noqa: F401, PLC0415
    from ttsvc.backends.onnxruntime import CPU_ARENA  # noqa: PLC0415

    heap = Heap(shrink_arena=CPU_ARENA.shrink)
    heap.pin_mmap_threshold()  # before the engines load: their weights are the large blocks

    before = resident_bytes()
    try:
        synth = load(spec, threads, schedule, max_sentence_chars)
    except EngineError as exc:  # the engines' fault, not the process's: the gateway judges them
        log.warning("start_failed", voice=spec.voice, engine_version=spec.label,
                    reason=exc.public(), detail=exc.message)  # fmt: skip
        conn.send(StartFailed(worker_id, spec.voice, spec.label, exc.public(), exc.message))
        return
    grown = resident_bytes() - before
    CPU_ARENA.prepare()  # now, not on the main thread's first idle turn (heartbeats wait)
    scheduler = _scheduler(synth, config.plan)
    pipe_lock = threading.Lock()

    def send(msg: FromWorker) -> None:
        with pipe_lock:  # compute threads and this one share the pipe
            conn.send(msg)

    held: VoiceSet[Synthesizer] = VoiceSet({**config.voices, spec.voice: spec},
                                           config.voice_budget,
                                           per_file_byte=footprint(spec, grown))  # fmt: skip
    held.put(spec.voice, synth, held.size(spec))
    capacity = scheduler.current_load(0).capacity
    send(WorkerReady(worker_id, spec.voice, spec.label, synth.sample_rate,
                     capacity, scheduler.threads, held.names()))  # fmt: skip
    del synth  # the voice set holds the serving engines: a local would keep them forever
    loader = Loader(threads, schedule, max_sentence_chars)
    scheduler.start(send)
    try:
        WorkerLoop(worker_id, scheduler, conn, send, heap, loader, held).run()
    finally:
        scheduler.close()


def _scheduler(synth: Synthesizer, plan: ComputePlan) -> DeadlineScheduler:
    """The worker's one scheduler, measured with the start voice's canary; its steps batch
    the windows of several streams on any engines it serves that run batches (GPU plans),
    those a hot swap brings included."""
    rate, first_chunk_s, per_char = measure(synth)
    return DeadlineScheduler(synth, plan.threads, plan.load_limit, rate,
                             first_chunk_s=first_chunk_s, audio_per_char=per_char,
                             step_floor_s=plan.step_floor_s, max_batch=MAX_BATCH,
                             whole_sentences=plan.whole_sentences)  # fmt: skip


def _heartbeat(worker_id: int, scheduler: DeadlineScheduler, held: VoiceSet[Synthesizer],
               settled: bool) -> Heartbeat:  # fmt: skip
    """``settled``: the heap has given back what the last work freed and no load is running;
    reported only while no stream is here either."""
    # requests waiting for their voice to load count as the worker's too
    load = scheduler.current_load(held.waiting_count())
    return Heartbeat(worker_id, load.qsize, load.capacity, load.demand, load.waiting, load.misses,
                     load.late_s, held.names(), settled and not load.qsize)  # fmt: skip


def _hold(scheduler: DeadlineScheduler, held: VoiceSet[Synthesizer], spec: EngineSpec,
          synth: Synthesizer) -> None:  # fmt: skip
    """Serve ``synth`` as ``spec``'s voice from now on; running streams keep their engines."""
    held.known[spec.voice] = spec
    evicted = held.put(spec.voice, synth, held.size(spec))
    scheduler.use(synth)  # the default must not pin an evicted voice's engines
    for voice in evicted:
        log.info("voice_evicted", voice=voice, held=list(held.names()),
                 held_mb=round(held.used() / 2**20, 1))  # fmt: skip


@dataclass
class WorkerLoop:
    """The worker's main loop: the pipe, heartbeats, voice loads and staged swaps (the
    scheduler's own threads run every step)."""

    worker_id: int
    scheduler: DeadlineScheduler
    conn: Connection
    send: Callable[[FromWorker], None]
    heap: Heap
    loader: Loader
    held: VoiceSet[Synthesizer]
    newest: dict[str, int] = field(default_factory=dict)
    """Newest swap request per voice: an older one still loading is superseded."""
    found: dict[str, dict[str, Synthesizer]] = field(default_factory=dict)
    """Per job waiting for a voice to load, the other voices it needs that were held when it
    was last looked at (``start``)."""

    def __post_init__(self) -> None:
        self.heap.freed()  # the start-up load, canary and measurement freed memory too
        self.primary = self.held.names()[0]

    def start(self, job: SynthesisJob) -> None:
        """Start ``job`` once every voice it speaks in is held (its own, and those its script's
        runs name): a voice not held is loaded first, one at a time, and the job looked at
        again when it is."""
        self.heap.freed()  # a stream short enough to end before the loop sees it busy still counts
        voice = job.voice or self.primary
        others = dict.fromkeys(item.voice for item in job.script or ()
                               if isinstance(item, ScriptRun) and item.voice not in (None, voice))
        # the voices found on an earlier look stay with the job: one evicted by the load of
        # the next would otherwise be loaded again, and evict that one, for ever
        held = self.found.pop(job.uid, {})
        for name in [voice, *(n for n in others if n is not None)]:
            synth = held.get(name) or self.held.get(name)
            if synth is not None:
                held[name] = synth
            elif name not in self.held.known:  # the gateway checks names: one removed meanwhile
                self.send(StreamError.of(job.uid, UnknownVoice(f"unknown voice {name!r}",
                                                               field="voice")))  # fmt: skip
                return
            else:
                if held:
                    self.found[job.uid] = held
                self.held.wait(job, name)
                self.load_next()
                return
        self.scheduler.add(job, held.pop(voice), held)

    def load_next(self) -> None:
        """Start loading the voice the oldest waiting request needs, one voice at a time: loads
        held at once would each take their memory before the budget could evict anything."""
        if self.loader.demand is None and self.held.waiting:
            spec = self.held.known[next(iter(self.held.waiting))]
            self.loader.demand = spec.voice
            self.loader.start(spec, alike_costs(self.held, spec))

    def finished(
        self, request: SwapEngines | EngineSpec, outcome: Outcome, seconds: float
    ) -> None:
        """A load ended: hold the voice and start its requests, or answer the swap."""
        scheduler, loader, held, send = self.scheduler, self.loader, self.held, self.send
        worker_id, load_next = self.worker_id, self.load_next
        loader.started.pop(id(request), None)
        if isinstance(request, EngineSpec):
            voice = request.voice
            loader.demand = None
            jobs = held.loaded(voice)
            current = held.get(voice)  # a swap that finished first holds a newer set
            if current is None and held.known.get(voice) is not request:
                # a newer version of the voice was announced while this one loaded: serve
                # its requests on that one, not on what is no longer the voice's version
                if jobs:
                    held.waiting[voice] = jobs
                load_next()
                return
            load_next()
            if isinstance(outcome, tuple):
                log.error("voice_load_failed", voice=voice, reason=outcome[0], detail=outcome[1])
                for job in jobs:
                    self.found.pop(job.uid, None)
                    send(StreamError.of(job.uid, VoiceUnavailable(
                        f"voice {voice!r} could not be loaded: {outcome[0]}", field="voice")))
                return
            if current is None:
                _hold(scheduler, held, request, outcome)
                current = outcome
                log.info("voice_loaded", voice=voice, engine_version=request.label,
                         load_ms=round(1000 * seconds, 1), held=list(held.names()),
                         held_mb=round(held.used() / 2**20, 1))  # fmt: skip
            for job in jobs:
                self.start(job)  # its other voices may still have to load
            return
        label = request.spec.label
        if request.seq != self.newest.get(request.spec.voice):
            reply = EnginesSwapped(worker_id, label, False, "superseded", request.seq)
        elif isinstance(outcome, tuple):
            public, detail = outcome
            reply = EnginesSwapped(worker_id, label, False, public, request.seq, detail=detail)
        else:
            _hold(scheduler, held, request.spec, outcome)
            for job in held.loaded(request.spec.voice):  # waited on an older load: start now
                self.start(job)
            reply = EnginesSwapped(worker_id, label, True, "", request.seq,
                                   precision=outcome.engines.precision)  # fmt: skip
        send(reply)

    def swap(self, msg: SwapEngines) -> None:
        voice = msg.spec.voice
        self.newest[voice] = msg.seq
        serving = self.held.held.get(voice)
        if not msg.load and serving is None and voice not in self.held.waiting:
            self.held.known[voice] = msg.spec  # not held here: loaded from this spec when needed
            self.send(EnginesSwapped(self.worker_id, msg.spec.label, True, "", msg.seq))
            return
        # the new set runs the same voice on the same machine: measuring again would compete
        # with live streams
        self.loader.start(msg, measured_costs(serving[0]) if serving else (0.0, 0.0, 0.0))

    def run(self) -> None:
        """Serve until the gateway says so, its pipe closes or it dies. Each turn, in this
        order: a heartbeat when due, the loads that ended, an idle trim, then the pipe."""
        worker_id, scheduler, conn, send = self.worker_id, self.scheduler, self.conn, self.send
        heap, loader, held = self.heap, self.loader, self.held
        start, finished, swap = self.start, self.finished, self.swap
        last_beat = 0.0
        parent = os.getppid()
        while True:
            now = time.monotonic()
            if now - last_beat >= HEARTBEAT_INTERVAL_S:
                if os.getppid() != parent:
                    return  # the gateway died: do not linger as an orphan
                loading_for = now - min(loader.started.values(), default=now)
                if scheduler.stalled_for() < HANG_S and loading_for < LOAD_HANG_S:
                    settled = heap.settled and not loader.started
                    send(_heartbeat(worker_id, scheduler, held, settled))
                last_beat = now
            while not loader.done.empty():
                finished(*loader.done.get())
                heap.freed()  # a superseded or replaced set is freed now, not at the next swap
            busy = scheduler.in_hand() > 0
            timeout = LOAD_POLL_S if loader.started else STAGING_POLL_S
            try:
                if not busy and not conn.poll(0):
                    heap.trim_if_due()  # idle: a trim's few milliseconds delay no window
                while conn.poll(timeout):
                    msg = conn.recv()
                    timeout = 0.0
                    if isinstance(msg, SynthesisJob):
                        start(msg)
                    elif isinstance(msg, CancelStream):
                        if held.drop_waiting(msg.uid):
                            self.found.pop(msg.uid, None)
                            send(StreamDone(msg.uid, 0, 0.0))
                            continue
                        done = scheduler.cancel(msg.uid)
                        heap.freed()
                        if done is not None:
                            send(done)
                    elif isinstance(msg, SwapEngines):
                        swap(msg)
                    elif isinstance(msg, Shutdown):
                        return
            except (EOFError, OSError):
                return
            if busy:
                heap.freed()

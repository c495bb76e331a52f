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
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

import structlog

from ttsvc.errors import EngineError, UnknownVoice, VoiceUnavailable
from ttsvc.observability.logs import configure_logging, get_logger
from ttsvc.protocol import (
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
    WorkerReady,
)
from ttsvc.repository.manifest import Manifest
from ttsvc.synthesis import Synthesizer, canary_failure
from ttsvc.windows import WindowSchedule
from ttsvc.worker.batching import batch_limit, scheduler_for
from ttsvc.worker.compute import StreamScheduler
from ttsvc.worker.deadline import DeadlineScheduler, measure
from ttsvc.worker.heap import Heap
from ttsvc.worker.plan import ComputePlan
from ttsvc.worker.voices import VoiceSet, footprint, resident_bytes, spec_bytes

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


def _load(
    spec: EngineSpec,
    threads: int,
    schedule: WindowSchedule,
    max_sentence_chars: int,
    cost: tuple[float, float, float] = (0.0, 0.0, 0.0),
    canary: bool = True,
) -> Synthesizer:
    """Load, warm up and calibrate an engine set; raise if its canary fails.

    A swap passes the serving engines' measured costs per frame (flow and vocoder together, and
    the flow's part): the new set runs the same architecture on the same machine, and measuring
    again would compete with live streams. A voice loaded for a request skips the canary
    (``canary=False``): a staging worker already ran it on these exact bytes (the load still
    checks every file's sha256), and the request is waiting.
    """
    # imported here, in the worker: the gateway imports this module only to name the spawn
    # target, and must not carry an inference runtime it never runs (20 MB RSS for ORT alone)
    from ttsvc.backends.loader import load_engine_spec  # noqa: PLC0415

    synth = Synthesizer(load_engine_spec(spec, threads), schedule,
                        max_sentence_chars)  # fmt: skip
    failure = canary_failure(synth) if canary else None  # also the warm-up: first runs allocate
    if failure is not None:
        raise EngineError(f"{spec.source} ({spec.label}): {failure}",
                          reason=f"canary synthesis failed: {failure}")  # fmt: skip
    if cost[0] > 0:  # frame cost, flow's share of it, acoustic cost per id
        synth.frame_cost_s, synth.flow_cost_s, synth.acoustic_cost_s = cost
        synth.vocoder_cost_s = cost[0] - cost[1]
    else:
        synth.calibrate()  # window sizes then follow this machine's real speed
    return synth


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
    voices: dict[str, EngineSpec] | None = None,
    voice_budget: int = 0,
) -> None:
    """Process target (spawned). Returns when the gateway says so or its pipe closes.

    ``spec`` is the voice loaded at start (its canary also measures the process's capacity);
    ``voices`` are the others the gateway serves, loaded when a request first needs one, and
    ``voice_budget`` the engine bytes the worker may hold at once (0: no limit)."""
    # the gateway owns shutdown: a Ctrl-C in the terminal, or a SIGTERM sent to the whole
    # process group (systemd, tini -g), must not kill workers while the gateway drains
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    configure_logging(log_level, sys.stdout, log_format)
    structlog.contextvars.bind_contextvars(worker=worker_id)
    plan = plan or ComputePlan()
    # imported before ``before``: the runtime's own memory is not a voice's
    import ttsvc.backends.loader  # noqa: F401, PLC0415
    from ttsvc.backends.onnxruntime import CPU_ARENA  # noqa: PLC0415

    heap = Heap(shrink_arena=CPU_ARENA.shrink)
    heap.pin_mmap_threshold()  # before the engines load: their weights are the large blocks

    before = resident_bytes()
    synth = _load(spec, threads, schedule, max_sentence_chars)
    grown = resident_bytes() - before
    deadline = plan.scheduler == "deadline" and multiplex and batch_limit(synth.engines) == 1
    if deadline:
        rate, first_chunk_s, per_char = measure(synth)
        scheduler: StreamScheduler | DeadlineScheduler = DeadlineScheduler(
            synth, plan.threads, plan.load_limit, rate, first_chunk_s=first_chunk_s,
            audio_per_char=per_char, step_floor_s=plan.step_floor_s)
    else:  # legacy, FIFO, or engines that batch windows (GPU plans): one compute loop
        scheduler = scheduler_for(synth, multiplex)
    pipe_lock = threading.Lock()

    def send(msg: FromWorker) -> None:
        with pipe_lock:  # compute threads and this one share the pipe
            conn.send(msg)

    capacity = scheduler.capacity.value if isinstance(scheduler, DeadlineScheduler) else 0.0
    held: VoiceSet[Synthesizer] = VoiceSet({**(voices or {}), spec.voice: spec}, voice_budget,
                                           per_file_byte=footprint(spec, grown))  # fmt: skip
    held.put(spec.voice, synth, held.size(spec))
    send(WorkerReady(worker_id, spec.voice, spec.label, synth.sample_rate,
                     capacity, plan.threads if deadline else 1, held.names()))  # fmt: skip
    del synth  # the voice set holds the serving engines: a local would keep them forever
    loader = _Loader(threads, schedule, max_sentence_chars)
    if isinstance(scheduler, DeadlineScheduler):
        scheduler.start(send)
        try:
            _serve(worker_id, scheduler, conn, send, heap, loader, held)
        finally:
            scheduler.close()
        return
    _serve(worker_id, scheduler, conn, send, heap, loader, held)


def _costs(synth: Synthesizer) -> tuple[float, float, float]:
    """The measured costs a candidate engine set takes over from the serving one."""
    return synth.frame_cost_s, synth.flow_cost_s, synth.acoustic_cost_s


Scheduler = StreamScheduler | DeadlineScheduler
Outcome = Synthesizer | tuple[str, str]
"""A loaded and canaried engine set, or why not: (reason for clients, detail for the log)."""


@dataclass
class _Loader:
    """Loads engine sets off the main loop, one thread per load, and queues what came of each:
    a swap's candidate (its ``SwapEngines``) or a voice a request needs (its ``EngineSpec``)."""

    threads: int
    schedule: WindowSchedule
    max_sentence_chars: int
    done: queue.SimpleQueue[tuple[SwapEngines | EngineSpec, Outcome, float]] = field(
        default_factory=queue.SimpleQueue
    )
    demand: str | None = None
    """The voice being loaded for waiting requests (one at a time)."""
    started: dict[int, float] = field(default_factory=dict)
    """Loads in progress (by their request's id) and when each started; kept by the main loop,
    which starts and finishes them. Meanwhile it polls its pipe briefly, so waiting requests
    start as soon as their voice is in."""

    def start(self, request: SwapEngines | EngineSpec, cost: tuple[float, float, float]) -> None:
        """Load ``request``'s engines beside the serving ones (a swap's candidate also runs the
        canary): the streams this worker is serving do not stall while it loads."""
        self.started[id(request)] = time.monotonic()
        threading.Thread(target=self._run, args=(request, cost), daemon=True).start()

    def _run(self, request: SwapEngines | EngineSpec, cost: tuple[float, float, float]) -> None:
        swap = isinstance(request, SwapEngines)
        spec = request.spec if isinstance(request, SwapEngines) else request
        started = time.perf_counter()
        outcome: Outcome
        try:
            outcome = _load(spec, self.threads, self.schedule, self.max_sentence_chars, cost,
                            canary=swap)  # fmt: skip
        except Exception as exc:  # a bad candidate must never take the worker down
            # strings only: the exception's traceback would keep the failed candidate's
            # frames, and with them its loaded engines, alive until the next swap. The gateway
            # answers clients with the public reason; the detail is for its log.
            public = exc.public() if isinstance(exc, EngineError) else "could not be loaded"
            outcome = (public, str(exc))
        self.done.put((request, outcome, time.perf_counter() - started))


ALIKE = 0.2
"""How far (as a share) two voices' engine sizes may differ for one's measured costs to stand
for the other's: Piper voices of one quality share their architecture, so their steps cost the
same; another quality is measured."""


def _alike_costs(held: VoiceSet[Synthesizer], spec: EngineSpec) -> tuple[float, float, float]:
    """The costs of a held voice built like ``spec`` (same latent and hop, engine sizes within
    ``ALIKE``), or zeros: measure them (a few hundred milliseconds the request waits)."""
    wanted = Manifest.model_validate_json(spec.manifest)
    size = spec_bytes(spec)
    for synth, _ in held.held.values():
        manifest = synth.engines.manifest
        held_size = sum(entry.size for entry in manifest.files.values())
        if (manifest.latent_channels == wanted.latent_channels
                and manifest.hop_length == wanted.hop_length
                and abs(held_size - size) <= ALIKE * size):  # fmt: skip
            return _costs(synth)
    return 0.0, 0.0, 0.0


def _heartbeat(worker_id: int, scheduler: Scheduler, held: VoiceSet[Synthesizer]) -> Heartbeat:
    waiting = held.waiting_count()  # requests waiting for their voice to load
    if not isinstance(scheduler, DeadlineScheduler):
        return Heartbeat(worker_id, len(scheduler.streams) + waiting, voices=held.names())
    with scheduler.lock:
        return Heartbeat(worker_id, len(scheduler.streams) + waiting, scheduler.capacity.value,
                         scheduler.demand(), scheduler.waiting() + waiting, scheduler.misses,
                         scheduler.late_s, held.names())  # fmt: skip


def _hold(scheduler: Scheduler, held: VoiceSet[Synthesizer], spec: EngineSpec,
          synth: Synthesizer) -> None:  # fmt: skip
    """Serve ``synth`` as ``spec``'s voice from now on; running streams keep their engines."""
    held.known[spec.voice] = spec
    evicted = held.put(spec.voice, synth, held.size(spec))
    if isinstance(scheduler, DeadlineScheduler):
        with scheduler.lock:
            scheduler.synth = synth  # the default must not pin an evicted voice's engines
    else:
        scheduler.synth = synth
    for voice in evicted:
        log.info("voice_evicted", voice=voice, held=list(held.names()),
                 held_mb=round(held.used() / 2**20, 1))  # fmt: skip


def _serve(
    worker_id: int,
    scheduler: Scheduler,
    conn: Connection,
    send: Callable[[FromWorker], None],
    heap: Heap,
    loader: _Loader,
    held: VoiceSet[Synthesizer],
) -> None:
    """The worker's main loop: the pipe, heartbeats, voice loads and staged swaps, and, for a
    single-loop scheduler, its steps (the deadline scheduler's own threads run its steps)."""
    threaded = scheduler if isinstance(scheduler, DeadlineScheduler) else None
    primary = held.names()[0]
    newest: dict[str, int] = {}
    """Newest swap request per voice: an older one still loading is superseded."""

    def start(job: SynthesisJob) -> None:
        voice = job.voice or primary
        synth = held.get(voice)
        if synth is not None:
            scheduler.add(job, synth)
        elif voice not in held.known:  # the gateway checks names: a voice removed meanwhile
            send(StreamError(job.uid, UnknownVoice.status, UnknownVoice.type,
                             f"unknown voice {voice!r}", "voice"))  # fmt: skip
        else:
            held.wait(job, voice)
            load_next()

    def load_next() -> None:
        """Start loading the voice the oldest waiting request needs, one voice at a time: loads
        held at once would each take their memory before the budget could evict anything."""
        if loader.demand is None and held.waiting:
            spec = held.known[next(iter(held.waiting))]
            loader.demand = spec.voice
            loader.start(spec, _alike_costs(held, spec))

    def finished(
        request: SwapEngines | EngineSpec, outcome: Outcome, seconds: float
    ) -> None:
        """A load ended: hold the voice and start its requests, or answer the swap."""
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
                    send(StreamError(job.uid, VoiceUnavailable.status, VoiceUnavailable.type,
                                     f"voice {voice!r} could not be loaded: {outcome[0]}",
                                     "voice"))  # fmt: skip
                return
            if current is None:
                _hold(scheduler, held, request, outcome)
                current = outcome
                log.info("voice_loaded", voice=voice, engine_version=request.label,
                         load_ms=round(1000 * seconds, 1), held=list(held.names()),
                         held_mb=round(held.used() / 2**20, 1))  # fmt: skip
            for job in jobs:
                scheduler.add(job, current)
            return
        label = request.spec.label
        if request.seq != newest.get(request.spec.voice):
            reply = EnginesSwapped(worker_id, label, False, "superseded", request.seq)
        elif isinstance(outcome, tuple):
            public, detail = outcome
            reply = EnginesSwapped(worker_id, label, False, public, request.seq, detail=detail)
        else:
            _hold(scheduler, held, request.spec, outcome)
            for job in held.loaded(request.spec.voice):  # waited on an older load: start now
                scheduler.add(job, outcome)
            reply = EnginesSwapped(worker_id, label, True, "", request.seq,
                                   precision=outcome.engines.precision)  # fmt: skip
        send(reply)

    def swap(msg: SwapEngines) -> None:
        voice = msg.spec.voice
        newest[voice] = msg.seq
        serving = held.held.get(voice)
        if not msg.load and serving is None and voice not in held.waiting:
            held.known[voice] = msg.spec  # not held here: loaded from this spec when needed
            send(EnginesSwapped(worker_id, msg.spec.label, True, "", msg.seq))
            return
        # the new set runs the same voice on the same machine: measuring again would compete
        # with live streams
        loader.start(msg, _costs(serving[0]) if serving else (0.0, 0.0, 0.0))

    last_beat = 0.0
    parent = os.getppid()
    while True:
        now = time.monotonic()
        if now - last_beat >= HEARTBEAT_INTERVAL_S:
            if os.getppid() != parent:
                return  # the gateway died: do not linger as an orphan
            loading_for = now - min(loader.started.values(), default=now)
            if (threaded is None or threaded.stalled_for() < HANG_S) and loading_for < LOAD_HANG_S:
                send(_heartbeat(worker_id, scheduler, held))
            last_beat = now
        while not loader.done.empty():
            finished(*loader.done.get())
            heap.released()  # a superseded or replaced set is freed now, not at the next swap
        busy = bool(scheduler.streams)
        timeout = STAGING_POLL_S
        if busy and threaded is None:
            timeout = 0.0
        elif loader.started:
            timeout = LOAD_POLL_S
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
        if scheduler.streams and not isinstance(scheduler, DeadlineScheduler):
            scheduler.step(send)  # streams as they are now: a cancel may have ended the last

"""Worker process entry: load engines, pass the canary, say READY, then serve the pipe.

The compute loop (``StreamScheduler``) stays importable; this wrapper adds the pipe, heartbeats,
signals and the exit when the gateway goes away.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from multiprocessing.connection import Connection

from ttsvc.backends.onnxruntime import load_engine_spec
from ttsvc.errors import EngineError
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
from ttsvc.worker.compute import StreamScheduler

HEARTBEAT_INTERVAL_S = 0.5
STAGING_POLL_S = 0.05
"""How long an idle worker waits on its pipe before looking for a staged engine set."""


def _load(spec: EngineSpec, threads: int, schedule: tuple[int, float, int],
          max_sentence_chars: int) -> Synthesizer:  # fmt: skip
    """Load, warm up and calibrate an engine set; raise if its canary fails."""
    synth = Synthesizer(load_engine_spec(spec, threads), WindowSchedule(*schedule),
                        max_sentence_chars)  # fmt: skip
    failure = canary_failure(synth)  # also the warm-up: first runs allocate
    if failure is not None:
        raise EngineError(f"{spec.source} ({spec.label}): {failure}")
    synth.calibrate()  # window sizes then follow this machine's real speed
    return synth


def run_worker(
    worker_id: int,
    spec: EngineSpec,
    threads: int,
    schedule: tuple[int, float, int],
    max_sentence_chars: int,
    multiplex: bool,
    conn: Connection,
) -> None:
    """Process target (spawned). Returns when the gateway says so or its pipe closes."""
    # the gateway owns shutdown; a Ctrl-C in the terminal must not kill workers mid-drain
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    synth = _load(spec, threads, schedule, max_sentence_chars)
    scheduler = StreamScheduler(synth, multiplex)

    def send(msg: FromWorker) -> None:
        conn.send(msg)

    send(WorkerReady(worker_id, synth.engines.manifest.voice, spec.label, synth.sample_rate))
    staged: queue.SimpleQueue[tuple[EngineSpec, Synthesizer | Exception]] = queue.SimpleQueue()

    def stage(candidate: EngineSpec) -> None:
        """Load and canary a candidate beside the serving engines, off the compute loop, so the
        streams this worker is serving do not stall while it loads."""
        try:
            staged.put((candidate, _load(candidate, threads, schedule, max_sentence_chars)))
        except Exception as exc:  # a bad candidate must never take the worker down
            staged.put((candidate, exc))

    last_beat = 0.0
    parent = os.getppid()
    while True:
        now = time.monotonic()
        if now - last_beat >= HEARTBEAT_INTERVAL_S:
            if os.getppid() != parent:
                return  # the gateway died: do not linger as an orphan
            send(Heartbeat(worker_id, len(scheduler.streams)))
            last_beat = now
        while not staged.empty():
            candidate, result = staged.get()
            if isinstance(result, Exception):
                send(EnginesSwapped(worker_id, candidate.label, False, str(result)))
            else:
                scheduler.synth = result  # running streams keep their own engines
                send(EnginesSwapped(worker_id, candidate.label, True))
        timeout = 0.0 if scheduler.streams else STAGING_POLL_S
        try:
            while conn.poll(timeout):
                msg = conn.recv()
                timeout = 0.0
                if isinstance(msg, SynthesisJob):
                    scheduler.add(msg)
                elif isinstance(msg, CancelStream):
                    done = scheduler.cancel(msg.uid)
                    if done is not None:
                        send(done)
                elif isinstance(msg, SwapEngines):
                    threading.Thread(target=stage, args=(msg.spec,), daemon=True).start()
                elif isinstance(msg, Shutdown):
                    return
        except (EOFError, OSError):
            return
        if scheduler.streams:
            scheduler.step(send)

"""Worker process entry: load engines, warm up, say READY, then serve the pipe.

The compute loop (``StreamScheduler``) stays importable; this wrapper adds the pipe, heartbeats,
signals and the exit when the gateway goes away.
"""

from __future__ import annotations

import os
import signal
import time
from multiprocessing.connection import Connection
from pathlib import Path

from ttsvc.backends.onnxruntime import load_engine_set
from ttsvc.protocol import (
    CancelStream,
    FromWorker,
    Heartbeat,
    Shutdown,
    SynthesisJob,
    WorkerReady,
)
from ttsvc.synthesis import SynthesisParams, Synthesizer, WindowSchedule
from ttsvc.worker.compute import StreamScheduler

HEARTBEAT_INTERVAL_S = 0.5


def run_worker(
    worker_id: int,
    engines_path: str,
    threads: int,
    schedule: tuple[int, float, int],
    max_sentence_chars: int,
    multiplex: bool,
    conn: Connection,
) -> None:
    """Process target (spawned). Returns when the gateway says so or its pipe closes."""
    # the gateway owns shutdown; a Ctrl-C in the terminal must not kill workers mid-drain
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    engines = load_engine_set(Path(engines_path), threads)
    synth = Synthesizer(engines, WindowSchedule(*schedule), max_sentence_chars)
    synth.synthesize("Warm up.", SynthesisParams(noise_scale=0.0, noise_w=0.0))
    synth.calibrate()  # window sizes then follow this machine's real speed
    scheduler = StreamScheduler(synth, multiplex)

    def send(msg: FromWorker) -> None:
        conn.send(msg)

    send(WorkerReady(worker_id, engines.manifest.voice, engines.version, synth.sample_rate))
    last_beat = 0.0
    parent = os.getppid()
    while True:
        now = time.monotonic()
        if now - last_beat >= HEARTBEAT_INTERVAL_S:
            if os.getppid() != parent:
                return  # the gateway died: do not linger as an orphan
            send(Heartbeat(worker_id, len(scheduler.streams)))
            last_beat = now
        timeout = 0.0 if scheduler.streams else HEARTBEAT_INTERVAL_S
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
                elif isinstance(msg, Shutdown):
                    return
        except (EOFError, OSError):
            return
        if scheduler.streams:
            scheduler.step(send)

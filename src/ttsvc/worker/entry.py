"""The worker processes' spawn target.

The pool names this function as the target of each worker process; the worker stack (ONNX
Runtime, the synthesizer, the schedulers) is imported here, in the spawned process, so the
gateway process that starts workers never loads it.
"""

from __future__ import annotations

from multiprocessing.connection import Connection

from ttsvc.worker.plan import WorkerConfig


def run(worker_id: int, config: WorkerConfig, conn: Connection) -> None:
    """``ttsvc.worker.process.run_worker`` in the spawned process (same arguments)."""
    from ttsvc.worker.process import run_worker  # noqa: PLC0415 - the worker process only

    run_worker(worker_id, config, conn)

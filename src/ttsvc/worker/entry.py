"""The worker processes' spawn target.

The pool names this function as the target of each worker process; the worker stack (ONNX
Runtime, the synthesizer, the schedulers) is imported here, in the spawned process, so the
gateway process that starts workers never loads it.
"""

from __future__ import annotations

from typing import Any


def run(*args: Any, **kwargs: Any) -> None:
    """``ttsvc.worker.process.run_worker`` in the spawned process (same arguments)."""
    from ttsvc.worker.process import run_worker  # noqa: PLC0415 - the worker process only

    run_worker(*args, **kwargs)

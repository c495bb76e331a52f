"""A worker process's own memory bounds: a cap on its data, and first in line for the OOM killer.

Why: a pod has one memory limit for the gateway and its workers together. A worker whose memory
runs away (a leak, an engine that allocates without bound) would get the whole pod OOM-killed,
gateway and every stream on the other workers included. So each worker caps itself
(``RLIMIT_DATA``: its heap and private mappings; past it an allocation fails, and the worker
fails the request or dies and is respawned) and raises its ``oom_score_adj`` above the
gateway's, so that when the pod's limit is hit anyway the kernel picks a worker, never the
gateway.

The cap is an rlimit rather than a cgroup of its own: a pod's cgroup is not writable from inside
the container, and a cgroup v2 parent cannot hold processes and also give its children their own
limits; an rlimit works everywhere a worker runs. It bounds address space the process writes,
which is more than its resident memory (ONNX Runtime's arena and glibc's per-thread arenas
reserve ahead): ``Settings.worker_memory_mb`` says how it is sized.

Runs in the worker process, at its start, before any engine loads.
"""

from __future__ import annotations

import resource
from pathlib import Path

from ttsvc.observability.logs import get_logger

log = get_logger("worker")

OOM_SCORE_RAISE = 500
"""How far above the gateway's ``oom_score_adj`` a worker puts its own (the kernel's range is
-1000 to 1000; raising one's own needs no privilege)."""
OOM_SCORE_ADJ = Path("/proc/self/oom_score_adj")


def limit_memory(memory_bytes: int) -> None:
    """Cap this process's data at ``memory_bytes`` (0: no cap) and make it the OOM killer's
    first choice over its parent. Where the platform has neither, it says so and goes on."""
    if memory_bytes > 0:
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        cap = memory_bytes if hard == resource.RLIM_INFINITY else min(memory_bytes, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
    try:
        inherited = int(OOM_SCORE_ADJ.read_text(encoding="ascii"))
        OOM_SCORE_ADJ.write_text(str(min(1000, inherited + OOM_SCORE_RAISE)), encoding="ascii")
    except (OSError, ValueError) as exc:  # not Linux, or /proc mounted read-only
        log.info("oom_score_unchanged", reason=str(exc))

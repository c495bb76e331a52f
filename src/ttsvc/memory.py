"""How much memory one worker process may take: the cap each worker puts on itself.

A pod has one memory limit for the gateway and its workers together; a worker whose memory runs
away must be stopped at its own share, before the kernel OOM-kills the pod (gateway included).
The share follows from the settings (the voices a worker may hold, ``voice_memory_mb``, plus the
runtime, its arenas and the streams beside them) and, inside a container with a memory limit,
from that limit split over the workers after the gateway's part.

Reads only ``memory.max`` (cgroup v2) or ``memory/memory.limit_in_bytes`` (cgroup v1) of the
process's own cgroup as a container sees it, with the root as a parameter so tests read real
files. The cap itself is applied in each worker (``ttsvc.worker.limits``).
"""

from __future__ import annotations

from pathlib import Path

from ttsvc.cpus import CGROUP_ROOT

WORKER_BASE_MB = 1024.0
"""What a worker takes beside the voices it holds, as its data-size limit counts it: the
runtime, ONNX Runtime's arena and glibc's per-thread arenas (reserved ahead of use), the streams'
buffers. A worker with one medium voice measured here: 288 MB idle and 503 MB serving eight
streams on two compute threads (``VmData``; resident 219 and 327 MB)."""
GATEWAY_MB = 256.0
"""The part of a container's memory limit left to the gateway process (100-150 MB measured)."""
WORKER_MIN_MB = 512.0
"""The least cap a worker gets: below it one medium voice does not load."""

_NO_LIMIT = 1 << 60
"""cgroup v1 writes a number near 2**63 for "no limit"."""


def cgroup_memory_limit(root: Path = CGROUP_ROOT) -> int | None:
    """The memory limit of the cgroup at ``root`` in bytes, or None when there is none or no
    readable cgroup (a file that cannot be parsed counts as none)."""
    for path in (root / "memory.max", root / "memory" / "memory.limit_in_bytes"):
        try:
            text = path.read_text(encoding="ascii").strip()
        except OSError:
            continue
        if not text.isdigit():  # "max": no limit
            return None
        value = int(text)
        return value if value < _NO_LIMIT else None
    return None


def worker_memory_mb(voice_memory_mb: float, workers: int, limit_bytes: int | None) -> float:
    """A worker's cap in megabytes (0: none): the voices it may hold plus ``WORKER_BASE_MB``,
    and within a container limit no more than its share of that limit after the gateway's part
    (never below ``WORKER_MIN_MB``). No voice budget and no container limit: no cap."""
    own = voice_memory_mb + WORKER_BASE_MB if voice_memory_mb > 0 else 0.0
    if limit_bytes is None:
        return own
    share = max(WORKER_MIN_MB, (limit_bytes / 2**20 - GATEWAY_MB) / max(1, workers))
    return min(own, share) if own else share

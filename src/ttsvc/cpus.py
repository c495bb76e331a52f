"""How many CPUs this process may really use, and how the pool splits them into processes x threads.

``os.cpu_count()`` counts the node's cores. A container gets its share through a CFS quota (a
Kubernetes CPU limit, ``docker --cpus``) and sometimes a cpuset (affinity mask); planning compute
threads for the node's cores would oversubscribe the share, and the quota then throttles the
whole container for the rest of each period: every stream in it stalls at once.

Reads only ``cpu.max`` (cgroup v2) or ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (cgroup v1) of
the process's own cgroup as a container sees it (the cgroup namespace makes ``/sys/fs/cgroup``
the container's own), with the root as a parameter so tests read real files, and reports where
the number came from for the start-up log.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
"""Where the container's own cgroup is mounted (v2 unified, or v1 controller directories)."""

THREADS_PER_PROCESS = 4
"""Cores one deadline-scheduled process spans by default before the pool adds a process."""

MAX_PROCESSES = 256
MAX_THREADS = 256
"""The ``workers`` and ``compute_threads`` settings' upper bounds: a split never exceeds them."""

_V1_DIRS = ("cpu", "cpu,cpuacct", "cpuacct,cpu")
"""Where cgroup v1 mounts the cpu controller (alone, or co-mounted with cpuacct)."""


@dataclass(frozen=True)
class CpuBudget:
    """The CPUs to plan compute for, and where that number came from (for the start-up log)."""

    cpus: int
    source: str
    """``cgroup v2 quota``, ``cgroup v1 quota``, ``affinity``, ``cpu count`` or ``cpus setting``."""


def cgroup_quota(root: Path = CGROUP_ROOT) -> tuple[float, str] | None:
    """The CPU quota of the cgroup at ``root`` in CPUs (1.5 for "150000 100000") and its cgroup
    version, or None when there is no limit or no readable cgroup.

    A file that cannot be parsed counts as no limit: a start-up that fails on an odd kernel file
    would be worse than one that plans for the affinity mask."""
    try:
        fields = (root / "cpu.max").read_text(encoding="ascii").split()
    except OSError:
        fields = None
    if fields is not None:
        # "max 100000": no limit; "200000 100000": 2 CPUs
        if len(fields) != 2 or fields[0] == "max":
            return None
        return _ratio(fields[0], fields[1], "cgroup v2 quota")
    for name in _V1_DIRS:
        directory = root / name
        try:
            quota = (directory / "cpu.cfs_quota_us").read_text(encoding="ascii").strip()
            period = (directory / "cpu.cfs_period_us").read_text(encoding="ascii").strip()
        except OSError:
            continue
        return _ratio(quota, period, "cgroup v1 quota")  # -1: no limit
    return None


def _ratio(quota: str, period: str, source: str) -> tuple[float, str] | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return (q / p, source) if q > 0 and p > 0 else None


def affinity_cpus() -> tuple[int, str]:
    """CPUs this process may be scheduled on (its affinity mask: a cpuset, ``taskset``), or the
    machine's count where the platform has no affinity call."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)), "affinity"
    return os.cpu_count() or 1, "cpu count"


def cpu_budget(root: Path = CGROUP_ROOT) -> CpuBudget:
    """The CPUs this process may really use: the cgroup CPU quota bounded by the affinity mask.

    A fractional quota rounds up (1.5 CPUs plan for 2): the half core is real time the
    container may use, and a compute thread too many only shares a core, where one too few
    leaves the share idle. Never below 1."""
    cores, source = affinity_cpus()
    quota = cgroup_quota(root)
    if quota is not None and math.ceil(quota[0]) <= cores:
        return CpuBudget(max(1, math.ceil(quota[0])), quota[1])
    return CpuBudget(max(1, cores), source)


def available_cpus(root: Path = CGROUP_ROOT) -> int:
    """The number of :func:`cpu_budget`."""
    return cpu_budget(root).cpus


def default_split(cpus: int) -> tuple[int, int]:
    """Worker processes x compute threads per process for ``cpus`` CPUs.

    A process's compute threads share one queue of steps ordered by playback
    deadline, so any free core of the process takes the most urgent step of any of its streams;
    across processes a stream stays pinned to its process. The larger one scheduling domain, the
    fewer streams wait while another core idles, and the engine weights are loaded once per
    process, not once per core. So up to ``THREADS_PER_PROCESS`` (4) CPUs run as one process with
    a thread per CPU; above, ``ceil(cpus / 4)`` processes (8 -> 2 x 4, 16 -> 4 x 4) keep crash
    isolation (a worker dying takes only its share of the streams) and bound the contention on
    one queue and one Python interpreter, with ``ceil(cpus / processes)`` threads each so no
    core is left without a thread (5 -> 2 x 3).
    """
    cpus = max(1, cpus)
    processes = min(math.ceil(cpus / THREADS_PER_PROCESS), MAX_PROCESSES)
    return processes, min(math.ceil(cpus / processes), MAX_THREADS)


def complete_split(cpus: int, processes: int | None, threads: int | None) -> tuple[int, int]:
    """The split with what the operator chose kept as chosen: given processes get the CPUs spread
    over them (``ceil(cpus / processes)`` threads each), given threads get as many processes as
    fill the CPUs."""
    if processes is not None and threads is not None:
        return processes, threads
    if processes is not None:
        return processes, min(max(1, math.ceil(cpus / processes)), MAX_THREADS)
    if threads is not None:
        return min(max(1, math.ceil(cpus / threads)), MAX_PROCESSES), threads
    return default_split(cpus)

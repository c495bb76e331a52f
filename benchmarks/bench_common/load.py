"""The load generator: closed, paced and open loops, the statistics of a level, and the
server's CPU and memory while it runs.

Why this exists: every load-driving benchmark (``seed_bench``, ``http_bench``) must pace
requests, summarize a level and account for the server's resources in exactly the same way.
The arithmetic lives in pure functions (``summarize_records``, ``poisson_arrivals``,
``meets_slo``) that ``tests/benchmarks`` checks on synthetic timings; the loops and the
resource monitor are thin around them. One request is ``bench_common.client.one_request``.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_common.client import Record, playback_end_s
from bench_common.stats import pct

MAX_IN_FLIGHT_OPEN_LOOP = 512
"""Open-loop arrivals beyond this many unanswered requests are counted, not sent: the generator
must stay bounded however far past saturation a rate is."""


REALTIME_TTFA_MS = 150.0
"""A stream counts as real-time when its audio starts within this and never stalls."""


def summarize_records(records: Sequence[Record], wall_s: float) -> dict[str, Any]:
    """The figures of one level: rates over ``wall_s``; latency and audio over ok requests only.

    Errors are counted by kind (``http_429``, an exception name, ``no_audio``,
    ``client_cap``). ``underrun_share`` is the fraction of ok streams with at least one underrun;
    ``cushion_p1_ms`` and ``cushion_p5_ms`` are low percentiles of each ok stream's least queued
    audio (``Playback.cushion_s``), how near the level ran to stalling.
    ``realtime_share`` is the fraction of all requests that were real-time streams: ok, first
    audio within ``REALTIME_TTFA_MS``, no underrun (a whole WAV after 9 s never underruns, but
    nobody would call it real-time); ``goodput_qps`` is those streams per second, and
    ``refused`` the 429s (``refused_share`` of all requests).
    """
    ok = [r for r in records if r.ok]
    ttfa = [r.ttfa_ms for r in ok if r.ttfa_ms is not None]
    latency = [r.latency_ms for r in ok if r.latency_ms is not None]
    errors: dict[str, int] = {}
    for r in records:
        if r.error is not None:
            errors[r.error] = errors.get(r.error, 0) + 1
    wall = wall_s if wall_s > 0 else float("nan")
    audio = sum(r.audio_s for r in ok)
    underrun_streams = sum(1 for r in ok if r.underruns > 0)
    cushions = [r.cushion_ms for r in ok if r.cushion_ms is not None]
    good = sum(1 for r in ok if r.underruns == 0 and r.ttfa_ms is not None
               and r.ttfa_ms <= REALTIME_TTFA_MS)  # fmt: skip
    refused = errors.get("http_429", 0)
    return {
        "sent": len(records),
        "ok": len(ok),
        "errors": sum(errors.values()),
        "errors_by_kind": errors,
        "wall_s": wall_s,
        "qps": len(ok) / wall,
        "ttfa_p50_ms": pct(ttfa, 50),
        "ttfa_p95_ms": pct(ttfa, 95),
        "ttfa_p99_ms": pct(ttfa, 99),
        "ttfa_max_ms": max(ttfa) if ttfa else None,
        "latency_p50_ms": pct(latency, 50),
        "latency_p99_ms": pct(latency, 99),
        "audio_s_total": audio,
        "audio_s_per_s": audio / wall,
        "underruns_total": sum(r.underruns for r in ok),
        "underrun_streams": underrun_streams,
        "underrun_share": underrun_streams / len(ok) if ok else None,
        "cushion_p1_ms": pct(cushions, 1),
        "cushion_p5_ms": pct(cushions, 5),
        "refused": refused,
        "refused_share": refused / len(records) if records else None,
        "goodput_qps": good / wall,
        "realtime_share": (
            sum(
                1
                for r in ok
                if r.underruns == 0 and r.ttfa_ms is not None and r.ttfa_ms <= REALTIME_TTFA_MS
            )
            / len(records)
            if records
            else None
        ),
    }


def meets_slo(summary: dict[str, Any], ttfa_p99_ms: float, max_error_share: float) -> bool:
    """A level keeps the SLO when its TTFA p99 is within the limit and errors are rare enough."""
    p99 = summary.get("ttfa_p99_ms")
    sent = summary.get("sent", 0)
    if p99 is None or not sent:
        return False
    return p99 <= ttfa_p99_ms and summary["errors"] / sent <= max_error_share


def poisson_arrivals(rate_qps: float, duration_s: float, seed: int) -> list[float]:
    """Send times (s from the start) of a Poisson process of ``rate_qps`` over ``duration_s``.

    Exponential gaps with a fixed seed, so every system sees the same arrival pattern at a rate.
    """
    if rate_qps <= 0 or duration_s <= 0:
        return []
    rng = random.Random(seed)
    times: list[float] = []
    t = rng.expovariate(rate_qps)
    while t < duration_s:
        times.append(t)
        t += rng.expovariate(rate_qps)
    return times


def text_draw(corpus_size: int, count: int, seed: int) -> list[int]:
    """Corpus indices drawn uniformly with a fixed seed (the same texts for every system)."""
    rng = random.Random(seed)
    return [rng.randrange(corpus_size) for _ in range(count)]


Send = Callable[[int, Record], Awaitable[None]]
"""Sends request ``index`` into ``rec`` (the caller picks the text, payload and server)."""


async def closed_loop(
    send: Send,
    make: Callable[[int], Record],
    level: int,
    planned: int,
    max_seconds: float,
    *,
    listen: bool = False,
    stagger_s: Sequence[float] = (0.0,),
    think_s: float = 0.0,
    seed: int = 0,
) -> tuple[list[Record], float, bool]:
    """``level`` clients send back to back until ``planned`` requests or ``max_seconds`` run out.

    Requests are claimed from a shared counter before they are sent, so request ``i`` is the
    same text for every system. After the deadline no new request starts; those in flight finish
    (bounded by the client's timeout). Returns the records, the wall time (start to last
    response) and whether the deadline stopped the level.

    ``listen``: each client is a caller that plays its answer in real time before asking again
    (``paced_loop``); client ``i`` starts after ``stagger_s[i]`` (cycled). The waits are the
    scheduler's timer, which is what pacing is. A listening caller then thinks a uniform
    ``0..think_s`` seconds (seeded per caller) before its next request; a refused one waits the
    refusal's ``Retry-After`` instead, as a well-behaved client does.
    """
    records: list[Record] = []
    next_index = 0
    deadline_hit = False
    started = time.perf_counter()
    deadline = started + max_seconds

    async def client_loop(caller: int, offset: float) -> None:
        nonlocal next_index, deadline_hit
        rng = random.Random(seed * 100_003 + caller)
        if offset > 0:
            await asyncio.sleep(offset)
        while next_index < planned:
            if time.perf_counter() >= deadline:
                deadline_hit = True
                return
            index = next_index
            next_index += 1
            rec = make(index)
            sent = time.perf_counter()
            rec.start_s = sent - started
            await send(index, rec)
            records.append(rec)
            wait = 0.0
            if listen and rec.retry_after_s is not None:
                wait = rec.retry_after_s
            elif listen:
                wait = sent + playback_end_s(rec) - time.perf_counter()
                wait += rng.uniform(0.0, think_s) if think_s > 0 else 0.0
            if wait > 0:
                await asyncio.sleep(wait)

    await asyncio.gather(*(client_loop(i, stagger_s[i % len(stagger_s)]) for i in range(level)))
    records.sort(key=lambda r: r.index)
    return records, time.perf_counter() - started, deadline_hit


async def paced_loop(
    send: Send,
    make: Callable[[int], Record],
    streams: int,
    planned: int,
    max_seconds: float,
    stagger_s: Sequence[float],
    think_s: float = 0.0,
    seed: int = 0,
) -> tuple[list[Record], float, bool]:
    """``streams`` callers that each play their audio in real time (then think up to
    ``think_s``) before asking again.

    A closed loop's client reads audio as fast as the server makes it, so four of them already
    saturate a server that is 5x faster than real time; a voice bot's caller listens. Callers
    start at their ``stagger_s`` offsets (so they do not all begin in the same instant). Load is
    then about ``streams`` audio-seconds per second, which is what "concurrent real-time
    streams" means.
    """
    return await closed_loop(
        send, make, streams, planned, max_seconds, listen=True, stagger_s=stagger_s,
        think_s=think_s, seed=seed,
    )


async def open_loop(
    send: Send, make: Callable[[int], Record], arrivals: Sequence[float]
) -> tuple[list[Record], float]:
    """Send request ``i`` at ``arrivals[i]`` whatever the server is doing (Poisson load).

    Arrivals that find ``MAX_IN_FLIGHT_OPEN_LOOP`` requests unanswered are recorded as
    ``client_cap`` errors instead of sent. The wait between arrivals is the scheduler's timer
    (``asyncio.sleep`` until the next send time), which is what an open-loop generator is.
    """
    records: list[Record] = []
    tasks: list[asyncio.Task[None]] = []
    in_flight = 0
    started = time.perf_counter()

    async def fire(index: int, rec: Record) -> None:
        nonlocal in_flight
        try:
            await send(index, rec)
        finally:
            in_flight -= 1

    for index, at in enumerate(arrivals):
        delay = started + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        rec = make(index)
        rec.start_s = time.perf_counter() - started
        records.append(rec)
        if in_flight >= MAX_IN_FLIGHT_OPEN_LOOP:
            rec.error = "client_cap"
            continue
        in_flight += 1
        tasks.append(asyncio.create_task(fire(index, rec)))
    if tasks:
        await asyncio.gather(*tasks)
    return records, time.perf_counter() - started


# --------------------------------------------------------------------------- server resources

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def machine_busy_s() -> float | None:
    """CPU seconds all cores have spent busy since boot (/proc/stat), None off Linux.

    Busy is everything but idle and iowait; steal is counted as busy (another tenant had it).
    """
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    ticks = [int(x) for x in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return (sum(ticks[:8]) - idle) / CLOCK_TICKS


@dataclass
class Usage:
    """CPU and memory of a server (its whole process tree) and of everyone else, over a level."""

    server_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    """This load generator's own CPU: it shares the machine with the server."""
    others_cpu_s: float | None = None
    """Busy CPU of the machine not used by the server or the generator: other tenants."""
    peak_rss_bytes: int = 0
    """Largest sum of resident set sizes over the tree (shared pages counted in each process)."""
    peak_pss_bytes: int = 0
    """Largest sum of proportional set sizes (shared pages split): the tree's real footprint."""
    samples: int = 0


class ResourceMonitor:
    """Samples one server's process tree from a thread while a level runs.

    Lives in the benchmark process, on its own thread, so sampling (reading /proc of every
    process, a few ms) never delays the asyncio loop that times requests. CPU comes from
    cumulative counters read at start and stop; memory is the peak over samples every
    ``interval_s``. Processes that appear during the level (a respawned worker) are picked up at
    the next sample; CPU of processes that exited meanwhile is lost, which only under-counts.
    """

    def __init__(self, pid: int, interval_s: float = 0.25) -> None:
        import psutil  # noqa: PLC0415 - the bench extra; the pure parts (tests) need only numpy

        self._psutil = psutil
        self.root = psutil.Process(pid)
        self.interval_s = interval_s
        self.usage = Usage()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cpu_start: dict[int, float] = {}
        self._cpu_last: dict[int, float] = {}
        self._busy_start: float | None = None
        self._self_start = 0.0

    def _tree(self) -> list[Any]:
        try:
            return [self.root, *self.root.children(recursive=True)]
        except self._psutil.Error:
            return []

    def _sample(self, first: bool) -> None:
        rss = pss = 0
        for proc in self._tree():
            try:
                times = proc.cpu_times()
                cpu = times.user + times.system
                if first or proc.pid not in self._cpu_start:
                    self._cpu_start.setdefault(proc.pid, cpu if first else 0.0)
                self._cpu_last[proc.pid] = cpu
                mem = proc.memory_full_info()
                rss += mem.rss
                pss += getattr(mem, "pss", mem.rss)
            except self._psutil.Error:
                continue
        self.usage.peak_rss_bytes = max(self.usage.peak_rss_bytes, rss)
        self.usage.peak_pss_bytes = max(self.usage.peak_pss_bytes, pss)
        self.usage.samples += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample(first=False)

    def start(self) -> None:
        """Take the starting counters and begin sampling."""
        self._sample(first=True)
        self._busy_start = machine_busy_s()
        own = self._psutil.Process().cpu_times()
        self._self_start = own.user + own.system
        self._thread = threading.Thread(target=self._run, name="resource-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> Usage:
        """Stop sampling and return the level's usage."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample(first=False)
        u = self.usage
        u.server_cpu_s = sum(
            max(0.0, self._cpu_last[pid] - self._cpu_start.get(pid, 0.0)) for pid in self._cpu_last
        )
        own = self._psutil.Process().cpu_times()
        u.client_cpu_s = own.user + own.system - self._self_start
        busy = machine_busy_s()
        if busy is not None and self._busy_start is not None:
            u.others_cpu_s = max(0.0, busy - self._busy_start - u.server_cpu_s - u.client_cpu_s)
        return u


def usage_figures(usage: Usage, wall_s: float) -> dict[str, Any]:
    """Usage as the table shows it: cores busy on average, memory in MiB."""
    wall = wall_s if wall_s > 0 else float("nan")
    return {
        "server_cores": usage.server_cpu_s / wall,
        "client_cores": usage.client_cpu_s / wall,
        "others_cores": None if usage.others_cpu_s is None else usage.others_cpu_s / wall,
        "peak_rss_mib": usage.peak_rss_bytes / 2**20,
        "peak_pss_mib": usage.peak_pss_bytes / 2**20,
    }


@dataclass
class LevelRun:
    """One (system, mode, level) measurement: its records, wall time and resource usage."""

    system: str
    kind: str
    """``closed`` (concurrency ramp) or ``open`` (Poisson arrivals)."""
    level: float
    """Clients for closed loops, target requests per second for open loops."""
    round: int
    wall_s: float
    stopped_by_deadline: bool
    records: list[Record] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """The level's figures plus its identity and resource usage."""
        out: dict[str, Any] = {
            "system": self.system,
            "kind": self.kind,
            "level": self.level,
            "round": self.round,
            "stopped_by_deadline": self.stopped_by_deadline,
        }
        out.update(summarize_records(self.records, self.wall_s))
        out.update(self.usage)
        return out

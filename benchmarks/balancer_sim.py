"""Discrete-event simulation of gateway routing policies: heat-score vs round-robin vs least-queue.

Model (pure Python, seeded, no IO besides the report; runs in a few seconds):

* 4 workers, ids 0-3. Worker 0 is 3x slower than the others (e.g. a CPU fallback or a throttled
  GPU). It has the lowest id on purpose: every policy breaks ties by the lowest id, so the slow
  worker is the one that wins ties (worst case).
* A worker synthesizes one stream at a time, FIFO (a worker process runs one synthesis at a
  time; later streams wait in its queue). A request's service time on a worker with slowdown ``k``
  is ``first_chunk + rest`` with ``first_chunk = 30 ms * k * U(0.8, 1.2)`` (time to first audio
  once started) and ``rest = audio_s * 0.02 * k`` (real-time factor 0.02, i.e. 50x real time on a
  fast worker), ``audio_s ~ U(1, 8)`` seconds of audio.
* TTFA, the figure reported, is queueing delay + first chunk, measured from dispatch.
* Arrivals are Poisson at a fraction (50 %, 80 %, 95 %) of the pool's total capacity (sum over
  workers of 1 / mean service time). Every policy at a given load sees the same arrivals and the
  same per-request draws (common random numbers), so the policies differ only by their routing.
* Policies:
  - ``heat-score/e2e`` and ``heat-score/svc``: the real :class:`ttsvc.balancer.HeatScoreBalancer`,
    driven by the simulated clock with default settings (reference TTFA 50 ms). Each worker
    heartbeats and reports its queue size every second (phase-shifted); ``observe`` is called at
    each first audio and ``release`` at each stream end. The two differ only in the TTFA fed to
    ``observe``: ``e2e`` is the TTFA the gateway measures (queueing included), ``svc`` is the
    worker's own time from starting the stream to its first audio (queueing excluded).
  - ``round-robin``: cycles over the workers.
  - ``least-queue``: fewest streams dispatched and not yet finished (the gateway's own count,
    exact and immediate), ties to the lowest id.

Usage: ``python benchmarks/balancer_sim.py [--seed N] [--requests N] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import sys
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from bench_common import RESULTS, markdown_table, pct, write_json
from ttsvc.balancer import BalancerSettings, HeatScoreBalancer

SLOWDOWNS = (3.0, 1.0, 1.0, 1.0)
"""Per-worker service-time multiplier; worker 0 is the slow one."""
FIRST_CHUNK_S = 0.030
"""Time to first audio of a fast worker once it starts a stream."""
RTF = 0.02
"""Compute seconds per second of audio on a fast worker."""
AUDIO_S = (1.0, 8.0)
"""Uniform range of a request's audio duration."""
JITTER = (0.8, 1.2)
"""Uniform multiplier on the first-chunk time."""
HEARTBEAT_S = 1.0
"""Period of each worker's heartbeat + queue report."""
LOADS = (0.5, 0.8, 0.95)
"""Offered load as a fraction of total capacity."""
POLICIES = ("heat-score/e2e", "heat-score/svc", "round-robin", "least-queue")


def mean_service_s(slowdown: float) -> float:
    mean_audio = sum(AUDIO_S) / 2
    return slowdown * (FIRST_CHUNK_S * sum(JITTER) / 2 + RTF * mean_audio)


CAPACITY_RPS = sum(1.0 / mean_service_s(k) for k in SLOWDOWNS)
"""Requests per second the pool completes when every worker is always busy."""


@dataclass(frozen=True)
class Request:
    arrival: float
    audio_s: float
    jitter: float


class SimClock:
    """The simulated clock; the balancer reads it through ``__call__``."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Policy(Protocol):
    def pick(self) -> int: ...
    def release(self, wid: int) -> None: ...
    def first_audio(self, wid: int, ttfa_ms: float, compute_ms: float) -> None: ...
    def heartbeat(self, wid: int, qsize: int) -> None: ...


class HeatScorePolicy:
    def __init__(self, clock: SimClock, n: int, *, end_to_end: bool) -> None:
        self.end_to_end = end_to_end
        self.balancer = HeatScoreBalancer(BalancerSettings(), clock)
        for wid in range(n):
            self.balancer.add_worker(wid)

    def pick(self) -> int:
        return self.balancer.pick()

    def release(self, wid: int) -> None:
        self.balancer.release(wid)

    def first_audio(self, wid: int, ttfa_ms: float, compute_ms: float) -> None:
        self.balancer.observe(wid, ttfa_ms=ttfa_ms if self.end_to_end else compute_ms)

    def heartbeat(self, wid: int, qsize: int) -> None:
        self.balancer.heartbeat(wid)
        self.balancer.report(wid, qsize=qsize)


class RoundRobinPolicy:
    def __init__(self, n: int) -> None:
        self.n = n
        self.next = 0

    def pick(self) -> int:
        wid = self.next
        self.next = (self.next + 1) % self.n
        return wid

    def release(self, wid: int) -> None:
        pass

    def first_audio(self, wid: int, ttfa_ms: float, compute_ms: float) -> None:
        pass

    def heartbeat(self, wid: int, qsize: int) -> None:
        pass


class LeastQueuePolicy:
    def __init__(self, n: int) -> None:
        self.inflight = [0] * n

    def pick(self) -> int:
        wid = min(range(len(self.inflight)), key=lambda w: (self.inflight[w], w))
        self.inflight[wid] += 1
        return wid

    def release(self, wid: int) -> None:
        self.inflight[wid] -= 1

    def first_audio(self, wid: int, ttfa_ms: float, compute_ms: float) -> None:
        pass

    def heartbeat(self, wid: int, qsize: int) -> None:
        pass


def make_policy(name: str, clock: SimClock) -> Policy:
    n = len(SLOWDOWNS)
    if name.startswith("heat-score/"):
        return HeatScorePolicy(clock, n, end_to_end=name == "heat-score/e2e")
    if name == "round-robin":
        return RoundRobinPolicy(n)
    if name == "least-queue":
        return LeastQueuePolicy(n)
    raise ValueError(name)


@dataclass
class Worker:
    slowdown: float
    queue: deque[int] = field(default_factory=deque)
    busy: bool = False


def make_requests(rng: random.Random, count: int, rate: float) -> list[Request]:
    t = 0.0
    out = []
    for _ in range(count):
        t += rng.expovariate(rate)
        out.append(Request(t, rng.uniform(*AUDIO_S), rng.uniform(*JITTER)))
    return out


# event kinds, ordered so that simultaneous events resolve deterministically
ARRIVAL, FIRST_AUDIO, DONE, HEARTBEAT = range(4)


def simulate(policy_name: str, requests: list[Request]) -> tuple[list[float], list[int]]:
    """Run one policy over ``requests``; return per-request TTFA (ms) and chosen worker."""
    clock = SimClock()
    policy = make_policy(policy_name, clock)
    workers = [Worker(k) for k in SLOWDOWNS]
    n = len(requests)
    ttfa_ms = [math.nan] * n
    chosen = [-1] * n
    events: list[tuple[float, int, int, int, int]] = []  # (time, kind, seq, worker, request)
    seq = 0

    def push(t: float, kind: int, wid: int, rid: int) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, kind, seq, wid, rid))

    def start_next(wid: int) -> None:
        w = workers[wid]
        if w.busy or not w.queue:
            return
        rid = w.queue.popleft()
        w.busy = True
        req = requests[rid]
        first = FIRST_CHUNK_S * w.slowdown * req.jitter
        rest = RTF * w.slowdown * req.audio_s
        push(clock.now + first, FIRST_AUDIO, wid, rid)
        push(clock.now + first + rest, DONE, wid, rid)

    push(requests[0].arrival, ARRIVAL, -1, 0)
    for wid in range(len(workers)):
        push(HEARTBEAT_S * (wid + 1) / len(workers), HEARTBEAT, wid, -1)

    done = 0
    max_steps = 10 * n + 100_000
    for _step in range(max_steps):
        if done == n:
            break
        t, kind, _, wid, rid = heapq.heappop(events)
        clock.now = t
        if kind == ARRIVAL:
            wid = policy.pick()
            chosen[rid] = wid
            workers[wid].queue.append(rid)
            start_next(wid)
            if rid + 1 < n:
                push(requests[rid + 1].arrival, ARRIVAL, -1, rid + 1)
        elif kind == FIRST_AUDIO:
            ttfa_ms[rid] = (t - requests[rid].arrival) * 1000.0
            req = requests[rid]
            compute_ms = FIRST_CHUNK_S * workers[wid].slowdown * req.jitter * 1000.0
            policy.first_audio(wid, ttfa_ms[rid], compute_ms)
        elif kind == DONE:
            done += 1
            workers[wid].busy = False
            policy.release(wid)
            start_next(wid)
        else:
            w = workers[wid]
            policy.heartbeat(wid, len(w.queue) + int(w.busy))
            push(t + HEARTBEAT_S, HEARTBEAT, wid, -1)
    else:
        raise RuntimeError(f"simulation did not finish within {max_steps} events")
    return ttfa_ms, chosen


@dataclass(frozen=True)
class Row:
    policy: str
    load: float
    arrival_rps: float
    requests: int
    ttfa_p50_ms: float
    ttfa_p99_ms: float
    ttfa_mean_ms: float
    slow_worker_share: float


def run(seed: int, count: int) -> list[Row]:
    rows = []
    for load in LOADS:
        rate = load * CAPACITY_RPS
        requests = make_requests(random.Random(f"{seed}:{load}"), count, rate)
        for name in POLICIES:
            ttfa, chosen = simulate(name, requests)
            ordered = sorted(ttfa)
            rows.append(
                Row(
                    policy=name,
                    load=load,
                    arrival_rps=round(rate, 3),
                    requests=count,
                    ttfa_p50_ms=round(pct(ordered, 50, "nearest_rank"), 1),
                    ttfa_p99_ms=round(pct(ordered, 99, "nearest_rank"), 1),
                    ttfa_mean_ms=round(sum(ttfa) / count, 1),
                    slow_worker_share=round(chosen.count(0) / count, 4),
                )
            )
    return rows


def markdown(rows: list[Row]) -> str:
    return markdown_table(
        ["load", "policy", "TTFA p50 (ms)", "TTFA p99 (ms)", "mean (ms)", "to slow worker"],
        "rlrrrr",
        (
            [f"{r.load:.0%}", r.policy, f"{r.ttfa_p50_ms:.1f}", f"{r.ttfa_p99_ms:.1f}",
             f"{r.ttfa_mean_ms:.1f}", f"{r.slow_worker_share:.1%}"]
            for r in rows
        ),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seed", type=int, default=1234, help="RNG seed (default 1234)")
    parser.add_argument(
        "--requests", type=int, default=20_000, help="requests per policy and load (default 20000)"
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=RESULTS / "balancer_sim.json",
        help="where to write the JSON results (default benchmarks/results/balancer_sim.json)",
    )
    args = parser.parse_args(argv)
    if args.requests < 1:
        parser.error("--requests must be >= 1")

    rows = run(args.seed, args.requests)
    print(
        f"capacity {CAPACITY_RPS:.2f} req/s; slowdowns {SLOWDOWNS}; seed {args.seed}; "
        f"{args.requests} requests per cell\n"
    )
    print(markdown(rows))
    payload = {
        "seed": args.seed,
        "requests": args.requests,
        "model": {
            "slowdowns": SLOWDOWNS,
            "first_chunk_s": FIRST_CHUNK_S,
            "rtf": RTF,
            "audio_s": AUDIO_S,
            "jitter": JITTER,
            "heartbeat_s": HEARTBEAT_S,
            "discipline": "FIFO, one stream at a time per worker",
            "capacity_rps": round(CAPACITY_RPS, 3),
        },
        "settings": asdict(BalancerSettings()),
        "results": [asdict(r) for r in rows],
    }
    write_json(args.json, payload, indent=2, clean_nan=False)
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

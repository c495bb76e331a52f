"""Deadline scheduler benchmark, in process: real-time callers and a closed loop on one worker's
scheduler, policy variants side by side, without HTTP.

Why this exists: the seed benchmark measures the whole service through HTTP, where the gateway,
the clients on the same cores and the spread of ~120 requests per level blur the scheduler's own
trade-offs. Here one worker's ``DeadlineScheduler`` (its compute threads, the real engines of the
default voice) is driven directly: each request's time to first audio is split into the wait for
admission and the rest, each stream is played from its first chunk by a simulated real-time
player (``bench_common.playback``), and every pick is classed (a playing stream inside the
guard, a fresh stream, another playing stream; counted over the whole level, warm-up included),
so a variant that starts fresh streams sooner shows what it costs the playing ones. Variants of
the policy (``guard_s``, ``step_floor_s``, ``load_limit``) run one after
another at each load, in rotating order, so drift on a shared machine lands on all alike.

Run from the repository root::

    python benchmarks/scheduler_bench.py --variant floor50=step_floor_s=0.05 \\
        --variant guard30=guard_s=0.03
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent / "src"))

from bench_common import (  # noqa: E402
    DEFAULT_ENGINES,
    fmt,
    load_corpus,
    machine_info,
    pct,
    playback,
    relative,
    utc_timestamp,
    write_atomic,
    write_json,
)
from ttsvc.backends.loader import load_engine_set  # noqa: E402
from ttsvc.compile.build import ensure_default_voice  # noqa: E402
from ttsvc.observability.logs import configure_logging  # noqa: E402
from ttsvc.protocol import AudioChunkMsg, FromWorker, StreamDone, StreamError, SynthesisJob  # noqa: E402
from ttsvc.synthesis import Synthesizer  # noqa: E402
from ttsvc.worker.costs import measure  # noqa: E402
from ttsvc.worker.deadline import DeadlineScheduler  # noqa: E402
from ttsvc.worker.deadline_policy import Live  # noqa: E402
from ttsvc.worker.streams import Send  # noqa: E402

POLICY = ("guard_s", "step_floor_s", "load_limit")
"""The scheduler's arguments a variant may set."""


class Observed(DeadlineScheduler):
    """The scheduler, unchanged, with when each stream was admitted, what each pick chose, and
    the CPU time its policy calls took (``pick``, ``admit``, ``budget``: the work done per step
    under the one lock, which grows with the streams in hand)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.admitted_at: dict[str, float] = {}
        self.picks: Counter[str] = Counter()
        self.policy_s: Counter[str] = Counter()
        """CPU seconds in each policy call, summed (thread time: a thread descheduled by the
        kernel on a busy machine does not count)."""
        self.steps = 0
        self.in_hand: list[int] = []
        """Streams in hand at each step."""

    def admit(self) -> None:
        started = time.thread_time()
        super().admit()
        self.policy_s["admit"] += time.thread_time() - started
        now = time.perf_counter()
        for uid, stream in self.streams.items():
            if stream.admitted:
                self.admitted_at.setdefault(uid, now)

    def budget(self, stream: Live) -> float | None:
        started = time.thread_time()
        bound = super().budget(stream)
        self.policy_s["budget"] += time.thread_time() - started
        return bound

    def step(self, stream: Live, send: Send) -> None:
        self.steps += 1
        self.in_hand.append(len(self.streams))
        super().step(stream, send)

    def pick(self) -> Live | None:
        started = time.thread_time()
        chosen = super().pick()
        self.policy_s["pick"] += time.thread_time() - started
        if chosen is not None:
            waiting = any(s.first_sent_at is None and s is not chosen and s.admitted
                          and not s.running for s in self.streams.values())  # fmt: skip
            kind = ("guard", "fresh", "ahead")[self.rank(chosen, self.clock())[0]]
            self.picks[kind] += 1
            if waiting and kind != "fresh":
                self.picks[f"{kind} before a fresh one"] += 1
        return chosen


@dataclass
class Request:
    """One stream as its caller saw it (times from ``time.perf_counter``)."""

    sent: float
    admitted: float | None = None
    reads: list[tuple[float, float]] = field(default_factory=list)
    failed: bool = False
    done: threading.Event = field(default_factory=threading.Event)


def run_level(synth: Synthesizer, measured: tuple[float, float, float], threads: int,
              policy: dict[str, float], kind: str, callers: int, seconds: float,
              texts: list[str], seed: int) -> dict[str, Any]:  # fmt: skip
    """``callers`` callers for ``seconds`` (after a warm-up) against a fresh scheduler: real-time
    callers play each answer from its first chunk before asking again, closed-loop ones ask at
    once. Requests sent during the warm-up or after the end are not counted."""
    rate, first_chunk, per_char = measured
    sched = Observed(synth, threads, per_thread=rate, first_chunk_s=first_chunk,
                     audio_per_char=per_char, **policy)  # fmt: skip
    requests: dict[str, Request] = {}
    lock = threading.Lock()
    rng = random.Random(seed)
    warmup = 3.0
    start = time.perf_counter()
    counted_from, stop_at = start + warmup, start + warmup + seconds

    def send(msg: FromWorker) -> None:
        now = time.perf_counter()
        if isinstance(msg, AudioChunkMsg):
            requests[msg.uid].reads.append((now, len(msg.pcm) / 2 / synth.sample_rate))
        elif isinstance(msg, (StreamDone, StreamError)):
            req = requests[msg.uid]
            req.failed = isinstance(msg, StreamError)
            req.done.set()

    def caller(index: int) -> None:
        pause = threading.Event()  # never set: its wait is the caller's think/playback time
        if kind == "rt":
            pause.wait(rng.random() * 2.0)
        n = 0
        while time.perf_counter() < stop_at:
            with lock:
                uid, text = f"c{index}-{n}", rng.choice(texts)
            n += 1
            req = requests[uid] = Request(time.perf_counter())
            sched.add(SynthesisJob(uid, text, 1.0, None, None, 0.2))
            req.done.wait()
            if kind == "rt" and req.reads:
                heard = playback(req.reads)
                end = req.reads[0][0] + sum(r[1] for r in req.reads) + heard.stall_s
                pause.wait(max(0.0, end - time.perf_counter()))

    sched.start(send)
    workers = [threading.Thread(target=caller, args=(i,)) for i in range(callers)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.perf_counter() - counted_from
    sched.close()
    counted = [(uid, r) for uid, r in requests.items() if counted_from <= r.sent < stop_at]
    ttfa = [1e3 * (r.reads[0][0] - r.sent) for _, r in counted if r.reads]
    admission = [1e3 * (sched.admitted_at[uid] - r.sent) for uid, r in counted
                 if uid in sched.admitted_at]  # fmt: skip
    stalled = [playback(r.reads).underruns > 0 or r.failed for _, r in counted]
    audio = sum(s for _, r in counted for _, s in r.reads)
    return {
        "kind": kind, "callers": callers, "policy": policy, "requests": len(counted),
        "stalled_pct": 100.0 * sum(stalled) / max(len(stalled), 1),
        "ttfa_ms": {q: pct(ttfa, q) for q in (50, 95, 99)},
        "admission_wait_ms": {q: pct(admission, q) for q in (50, 99)},
        "audio_s_per_s": audio / max(wall, 1e-9), "deadline_misses": sched.misses,
        "capacity": sched.capacity.value, "picks": dict(sched.picks),
        "steps": sched.steps, "in_hand_p50": pct(sched.in_hand, 50),
        "policy_us_per_step": {k: 1e6 * v / max(sched.steps, 1)
                               for k, v in sched.policy_s.items()},
    }  # fmt: skip


PARTS = ("pick", "admit", "budget")


def policy_us(row: dict[str, Any]) -> float:
    """CPU µs per step in the policy calls, all parts."""
    return sum(row["policy_us_per_step"].get(k, 0.0) for k in PARTS)


def parse_variant(text: str) -> tuple[str, dict[str, float]]:
    """``name=key=value,key=value`` (keys from ``POLICY``)."""
    name, _, rest = text.partition("=")
    policy: dict[str, float] = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        if key not in POLICY:
            raise SystemExit(f"variant {name}: {key!r} is not one of {', '.join(POLICY)}")
        policy[key] = float(value)
    return name, policy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loads", default="rt:8,rt:16,rt:24,closed:16",
                        help="kind:callers, kind rt (plays each answer) or closed")
    parser.add_argument("--seconds", type=float, default=25.0, help="counted time per level")
    parser.add_argument("--threads", type=int, default=2, help="the worker's compute threads")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=KEY=V,...",
                        help=f"a policy variant beside the defaults; keys: {', '.join(POLICY)}")
    parser.add_argument("--engines-dir", type=Path, default=DEFAULT_ENGINES)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--json", type=Path, default=ROOT / "results" / "scheduler_bench.json")
    args = parser.parse_args()
    configure_logging("warning", sys.stderr, "console")

    variants = [("default", {})] + [parse_variant(v) for v in args.variant]
    version = ensure_default_voice(args.engines_dir, lambda m: print(m, file=sys.stderr))
    synth = Synthesizer(load_engine_set(version.path))
    synth.calibrate()
    measured = measure(synth)
    texts = [t for t in load_corpus(ROOT / "corpus.txt") if 20 <= len(t) <= 60]
    rows: list[dict[str, Any]] = []
    for index, load in enumerate(args.loads.split(",")):
        kind, _, count = load.partition(":")
        shift = index % len(variants)
        for name, policy in variants[shift:] + variants[:shift]:
            row = run_level(synth, measured, args.threads, policy, kind, int(count),
                            args.seconds, texts, args.seed)  # fmt: skip
            rows.append({"variant": name, **row})
            print(f"{name:10s} {load:10s} n={row['requests']:4d} stalled "
                  f"{row['stalled_pct']:5.1f} % TTFA p50/p99 {fmt(row['ttfa_ms'][50], 0)}/"
                  f"{fmt(row['ttfa_ms'][99], 0)} ms, {row['audio_s_per_s']:.1f} audio-s/s, policy "
                  f"{policy_us(row):.0f} µs/step at {fmt(row['in_hand_p50'], 0)} in hand",
                  flush=True)  # fmt: skip

    lines = ["| load | variant | requests | stalled % | TTFA p50 | p95 | p99 ms | admission wait "
             "p99 ms | audio-s/s | deadline misses | picks: guard / fresh / ahead | guard picks "
             "with a fresh stream waiting | in hand p50 | policy µs/step (pick / admit / budget) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|"]  # fmt: skip
    for r in sorted(rows, key=lambda r: (r["kind"], r["callers"])):
        p, u = r["picks"], r["policy_us_per_step"]
        parts = " / ".join(f"{u.get(k, 0):.0f}" for k in PARTS)
        lines.append(
            f"| {r['kind']} {r['callers']} | {r['variant']} | {r['requests']} | "
            f"{r['stalled_pct']:.1f} | {fmt(r['ttfa_ms'][50], 0)} | {fmt(r['ttfa_ms'][95], 0)} | "
            f"{fmt(r['ttfa_ms'][99], 0)} | {fmt(r['admission_wait_ms'][99], 0)} | "
            f"{r['audio_s_per_s']:.1f} | {r['deadline_misses']} | {p.get('guard', 0)} / "
            f"{p.get('fresh', 0)} / {p.get('ahead', 0)} | "
            f"{p.get('guard before a fresh one', 0)} | {fmt(r['in_hand_p50'], 0)} | "
            f"{policy_us(r):.0f} ({parts}) |")  # fmt: skip
    table = "\n".join(lines)
    print(table)
    flags = " ".join(f"--variant {n}={','.join(f'{k}={v}' for k, v in p.items())}"
                     for n, p in variants[1:])  # fmt: skip
    report = {"benchmark": "scheduler_bench", "when": utc_timestamp(),
              "machine": machine_info({}), "threads": args.threads, "seconds": args.seconds,
              "measured": dict(zip(("rate", "first_chunk_s", "audio_per_char"), measured,
                                   strict=True)),
              "variants": dict(variants), "rows": rows}  # fmt: skip
    write_json(args.json, report, clean_nan=False, newline=False)
    write_atomic(args.json.with_suffix(".md"),
                 f"# Deadline scheduler in process, variants side by side\n\n"
                 f"`python benchmarks/scheduler_bench.py --loads {args.loads} --seconds "
                 f"{args.seconds:g} {flags}` ({report['when']}, {args.threads} compute threads; "
                 f"first chunk alone {1e3 * measured[1]:.1f} ms)\n\n{table}\n")  # fmt: skip
    print(f"wrote {relative(args.json)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Real time at scale (issue 37's benchmark of record): does every admitted stream play through,
and is the excess refused rather than stalled? ttsvc beside Piper's server, in one run.

Why this exists: time to first audio alone rewards a server that starts many streams and then
lets them run dry. What a voice agent's caller hears is whether a stream, played from its first
byte, ever stops. So each level here is a number of **real-time callers**: each asks for a short
sentence (2-3 s of audio, what agents send), plays the answer from its first byte, thinks a
uniform 0-0.5 s and asks again; a refused caller waits the refusal's ``Retry-After``. Per level
the table gives the streams admitted and refused, the share of admitted streams that ran dry
(any underrun, for a player with no jitter buffer), TTFA p50/p99 of the admitted streams, and
the **goodput**: streams per second that started within 150 ms and never stalled. A closed loop
of one client (no think time) comes first: the fast path alone.

Every system runs every level in the same run, taking turns (the order rotates per level), on
the same texts (``corpus.txt``, 20-60 characters, drawn per level with a fixed seed) and noise
scales 0. ``--systems`` and ``--variant NAME='flags'`` are ``seed_bench.py``'s: ttsvc variants
(``--overload queue``, another ``--realtime-load``) run beside the default.

    python benchmarks/realtime_bench.py                       # ttsvc and piper, 2-core levels
    python benchmarks/realtime_bench.py --levels 64,96,128,160,192,256   # a 16-core machine

Outputs: the table on stdout, ``results/realtime_bench.json`` (machine, CPU, versions, every
level's figures), ``results/raw/realtime_bench.json`` (every request, git-ignored).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench_common import (
    DEFAULT_CORPUS,
    DEFAULT_ENGINES,
    HOST,
    RESULTS,
    Record,
    fmt,
    load_corpus,
    machine_info,
    one_request,
    utc_timestamp,
    write_json,
    write_raw,
)
from bench_common.load import LevelRun, closed_loop, text_draw
from seed_bench import (
    System,
    counter_delta,
    deadline_counters,
    make_systems,
    serving,
    systems_record,
    versions,
    warm_up,
)
from ttsvc.compile.build import ensure_default_voice

DEFAULT_JSON = RESULTS / "realtime_bench.json"
TARGETS_2_CORES = {
    "closed_stalled_pct": 0.0,
    "closed_ttfa_p50_ms": 40.0,
    "closed_ttfa_p99_ms": 55.0,
    "stalled_pct": 0.5,
    "ttfa_p99_ms": 150.0,
}
"""Issue 37's 2-core targets: one client closed loop (stalled %, TTFA p50/p99), and at every
level of real-time callers (admitted streams stalled %, TTFA p99 of admitted streams)."""


SERVER_HISTOGRAMS = {"server_ttfa": "ttsvc_ttfa_seconds", "queue_wait": "ttsvc_queue_wait_seconds"}
"""ttsvc's own histograms read over each level: time to first audio as the gateway saw it (a
client on the same cores adds its own delays to what it measures) and the time a stream waited
in its worker before its first step."""


async def buckets(client: httpx.AsyncClient, system: System) -> dict[str, dict[float, float]]:
    """Each of ``SERVER_HISTOGRAMS``' cumulative bucket counts now (empty where the system has
    no metrics port)."""
    if system.metrics_port is None:
        return {}
    try:
        resp = await client.get(f"http://{HOST}:{system.metrics_port}/metrics", timeout=5.0)
        resp.raise_for_status()
    except httpx.HTTPError:
        return {}
    out: dict[str, dict[float, float]] = {key: {} for key in SERVER_HISTOGRAMS}
    for family in text_string_to_metric_families(resp.text):
        for key, name in SERVER_HISTOGRAMS.items():
            if family.name != name:
                continue
            for sample in family.samples:
                if sample.name == name + "_bucket":
                    le = float(sample.labels["le"])
                    out[key][le] = out[key].get(le, 0.0) + float(sample.value)
    return out


LOAD_GAUGES = {"capacity": "ttsvc_worker_capacity_audio_seconds_per_second",
               "demand": "ttsvc_worker_demand_audio_seconds_per_second",
               "held": "ttsvc_worker_admission_waiting_streams"}
"""ttsvc's workers' own view of their load (summed over the workers), sampled during each level:
the capacity admission trusts beside the audio the level really got."""
SAMPLE_S = 0.5
"""How often the load gauges are sampled (the workers report every 0.5 s)."""


async def load_samples(client: httpx.AsyncClient, system: System,
                       stop: asyncio.Event) -> dict[str, list[float]]:  # fmt: skip
    """``LOAD_GAUGES`` read every ``SAMPLE_S`` until ``stop`` (nothing where the system has no
    metrics port)."""
    out: dict[str, list[float]] = {key: [] for key in LOAD_GAUGES}
    while system.metrics_port is not None and not stop.is_set():
        try:
            resp = await client.get(f"http://{HOST}:{system.metrics_port}/metrics", timeout=5.0)
            resp.raise_for_status()
        except httpx.HTTPError:
            break
        sums = dict.fromkeys(LOAD_GAUGES, 0.0)
        for family in text_string_to_metric_families(resp.text):
            for key, name in LOAD_GAUGES.items():
                if family.name == name:
                    sums[key] += sum(float(x.value) for x in family.samples)
        for key, value in sums.items():
            out[key].append(value)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), SAMPLE_S)
    return out


def bucket_pct(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """The ``q``-th percentile (ms) of the observations between two readings of a cumulative
    histogram, interpolated linearly inside its bucket (None with no observation)."""
    edges = sorted(after)
    counts = [after[e] - before.get(e, 0.0) for e in edges]
    if not counts or counts[-1] <= 0:
        return None
    rank = q / 100.0 * counts[-1]
    low, below = 0.0, 0.0
    for edge, count in zip(edges, counts, strict=True):
        if count >= rank:
            if edge == float("inf"):
                return low * 1000.0
            share = (rank - below) / (count - below) if count > below else 1.0
            return (low + share * (edge - low)) * 1000.0
        low, below = edge, count
    return None


def row(run: LevelRun) -> dict[str, Any]:
    """One level's figures, as the table shows them."""
    s = run.summary()
    admitted = s["ok"]
    return {
        "system": run.system,
        "kind": run.kind,
        "callers": int(run.level),
        "sent": s["sent"],
        "admitted": admitted,
        "refused": s["refused"],
        "refused_pct": None if not s["sent"] else 100.0 * s["refused"] / s["sent"],
        "other_errors": s["errors"] - s["refused"],
        "errors_by_kind": s["errors_by_kind"],
        "stalled_pct": None if s["underrun_share"] is None else 100.0 * s["underrun_share"],
        "cushion_p1_ms": s["cushion_p1_ms"],
        "cushion_p5_ms": s["cushion_p5_ms"],
        "ttfa_p50_ms": s["ttfa_p50_ms"],
        "ttfa_p99_ms": s["ttfa_p99_ms"],
        "goodput_per_s": s["goodput_qps"],
        "audio_s_per_s": s["audio_s_per_s"],
        "wall_s": s["wall_s"],
        **{k: s.get(k) for k in ("deadline_misses", "deadline_late_s", "server_ttfa_p50_ms",
                                 "server_ttfa_p99_ms", "queue_wait_p99_ms", "capacity_mean",
                                 "demand_mean", "held_max")},
    }


def table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown table of every system at every level."""
    lines = [
        "| system | load | sent | admitted | refused % | other errors | admitted stalled % | "
        "cushion p1/p5 ms | TTFA p50 ms | TTFA p99 ms | server TTFA p50/p99 ms | "
        "queue wait p99 ms | goodput /s | audio-s/s | deadline misses | "
        "capacity / demand (mean) | held (max) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        load = "1 client, closed" if r["kind"] == "closed" else f"{r['callers']} callers"
        lines.append(
            f"| {r['system']} | {load} | {r['sent']} | {r['admitted']} | "
            f"{fmt(r['refused_pct'])} | {r['other_errors']} | {fmt(r['stalled_pct'], 2)} | "
            f"{fmt(r.get('cushion_p1_ms'))}/{fmt(r.get('cushion_p5_ms'))} | "
            f"{fmt(r['ttfa_p50_ms'])} | {fmt(r['ttfa_p99_ms'])} | "
            f"{fmt(r.get('server_ttfa_p50_ms'))}/{fmt(r.get('server_ttfa_p99_ms'))} | "
            f"{fmt(r.get('queue_wait_p99_ms'))} | {fmt(r['goodput_per_s'], 2)} | "
            f"{fmt(r['audio_s_per_s'], 1)} | {fmt(r.get('deadline_misses'), 0)} | "
            f"{fmt(r.get('capacity_mean'), 1)} / {fmt(r.get('demand_mean'), 1)} | "
            f"{fmt(r.get('held_max'), 0)} |"
        )
    return "\n".join(lines)


def verdicts(rows: Sequence[dict[str, Any]], system: str) -> list[str]:
    """The 2-core targets for one system: each met or missed, with its figure."""
    out = []
    t = TARGETS_2_CORES
    for r in rows:
        if r["system"] != system:
            continue
        if r["kind"] == "closed":
            checks = [("stalled %", r["stalled_pct"], t["closed_stalled_pct"]),
                      ("TTFA p50 ms", r["ttfa_p50_ms"], t["closed_ttfa_p50_ms"]),
                      ("TTFA p99 ms", r["ttfa_p99_ms"], t["closed_ttfa_p99_ms"])]  # fmt: skip
            where = "1 client"
        else:
            checks = [("admitted stalled %", r["stalled_pct"], t["stalled_pct"]),
                      ("TTFA p99 ms", r["ttfa_p99_ms"], t["ttfa_p99_ms"])]  # fmt: skip
            where = f"{r['callers']} callers"
        for label, value, limit in checks:
            verdict = "not measured" if value is None else ("met" if value <= limit else "missed")
            out.append(f"{system} {where}: {label} {fmt(value, 2)} (≤ {limit:g}): {verdict}")
    return out


async def level(system: System, client: httpx.AsyncClient, corpus: Sequence[str],
                kind: str, callers: int, args: argparse.Namespace) -> LevelRun:  # fmt: skip
    """One level against one system: ``args.streams`` requests or ``args.max_seconds``."""
    texts = text_draw(len(corpus), 4096, args.seed * 31 + callers)

    def make(index: int) -> Record:
        tid = texts[index % len(texts)]
        return Record(system.name, callers, index, tid, len(corpus[tid]))

    async def send(index: int, rec: Record) -> None:
        await one_request(client, system.url, system.payload(corpus[rec.text_index]), rec)

    before = await deadline_counters(client, system)
    hist_before = await buckets(client, system)
    stop = asyncio.Event()
    sampler = asyncio.create_task(load_samples(client, system, stop))
    if kind == "closed":
        records, wall, hit = await closed_loop(send, make, 1, args.closed_streams,
                                               args.max_seconds)  # fmt: skip
    else:
        rng = random.Random(args.seed + callers)
        stagger = [rng.uniform(0.0, args.stagger) for _ in range(callers)]
        records, wall, hit = await closed_loop(
            send, make, callers, args.streams, args.max_seconds, listen=True,
            stagger_s=stagger, think_s=args.think_s, seed=args.seed + callers,
        )  # fmt: skip
    stop.set()
    samples = await sampler
    usage: dict[str, Any] = dict(counter_delta(before, await deadline_counters(client, system)))
    if samples["capacity"]:
        usage["capacity_mean"] = statistics.fmean(samples["capacity"])
        usage["demand_mean"] = statistics.fmean(samples["demand"])
        usage["held_max"] = max(samples["held"])
    hist_after = await buckets(client, system)
    for key, after in hist_after.items():
        was = hist_before.get(key, {})
        if key == "server_ttfa":
            usage["server_ttfa_p50_ms"] = bucket_pct(was, after, 50)
            usage["server_ttfa_p99_ms"] = bucket_pct(was, after, 99)
        else:
            usage["queue_wait_p99_ms"] = bucket_pct(was, after, 99)
    run = LevelRun(system.name, kind, callers, 0, wall, hit, records, usage)
    r = row(run)
    print(f"  {system.name:14s} {kind} {callers:>4d}: {r['admitted']}/{r['sent']} admitted, "
          f"refused {fmt(r['refused_pct'])}%, stalled {fmt(r['stalled_pct'], 2)}% (cushion p1 "
          f"{fmt(r['cushion_p1_ms'])} ms), TTFA p50 "
          f"{fmt(r['ttfa_p50_ms'])} p99 {fmt(r['ttfa_p99_ms'])} ms, goodput "
          f"{fmt(r['goodput_per_s'], 2)}/s, {fmt(r['audio_s_per_s'], 1)} audio-s/s against "
          f"capacity {fmt(r.get('capacity_mean'), 1)} (demand {fmt(r.get('demand_mean'), 1)}, "
          f"held {fmt(r.get('held_max'), 0)})", file=sys.stderr, flush=True)  # fmt: skip
    return run


async def run_all(systems: Sequence[System], corpus: Sequence[str],
                  args: argparse.Namespace) -> list[LevelRun]:  # fmt: skip
    """The closed one-client level, then each level of callers, systems taking turns."""
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    most = max(levels, default=1) + 8
    limits = httpx.Limits(max_connections=most * len(systems), max_keepalive_connections=most)
    timeout = httpx.Timeout(args.timeout, connect=10.0)
    runs: list[LevelRun] = []
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
        for system in systems:
            await warm_up(system, client, corpus)
        plan = ([("closed", 1)] if args.closed_streams > 0 else []) + [
            ("paced", n) for n in levels]  # fmt: skip
        for turn, (kind, callers) in enumerate(plan):
            order = list(systems[turn % len(systems):]) + list(systems[:turn % len(systems)])
            for system in order:
                runs.append(await level(system, client, corpus, kind, callers, args))
    return runs


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--systems", default="ttsvc,piper",
                   help="ttsvc, ttsvc:NAME (with --variant), piper (seed_bench.py's systems)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                   help="a ttsvc variant: --variant queue='--overload queue'")
    p.add_argument("--levels", default="8,16,24,32,48", help="real-time callers per level")
    p.add_argument("--streams", type=int, default=300, help="requests per level of callers")
    p.add_argument("--closed-streams", type=int, default=300,
                   help="requests of the one-client closed loop (0: none)")
    p.add_argument("--max-seconds", type=float, default=240.0,
                   help="a level ends here even short of its requests")
    p.add_argument("--think-s", type=float, default=0.5,
                   help="a caller thinks a uniform 0..this after each answer")
    p.add_argument("--stagger", type=float, default=2.5,
                   help="callers start at uniform offsets 0..this")
    p.add_argument("--ttsvc-args", default="", help="flags for every ttsvc system")
    p.add_argument("--workers", type=int, default=None, help="--workers for the ttsvc system")
    p.add_argument("--engines-dir", type=Path, default=DEFAULT_ENGINES)
    p.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Start the systems, run every level, print the table and the verdicts, write the JSON."""
    args = build_arg_parser().parse_args(argv)
    # what seed_bench's make_systems reads
    args.no_traditional, args.traditional_max_level = True, None
    corpus = load_corpus(args.corpus)
    started = time.perf_counter()
    info = machine_info(versions())
    systems, notes = make_systems(args)
    for note in notes:
        print(f"skipped {note}", file=sys.stderr)
    engines_dir = Path(args.engines_dir).resolve()
    ensure_default_voice(Path(args.engines_dir), lambda m: print(m, file=sys.stderr))
    with serving(systems, engines_dir):
        runs = asyncio.run(run_all(systems, corpus, args))
    rows = [row(run) for run in runs]
    cpu = info.get("cpu_model") or info.get("processor") or info.get("machine")
    print(f"\n{cpu}, {info['cpu_count']} CPUs, {utc_timestamp()[:10]}; callers think 0-"
          f"{args.think_s:g} s, {args.streams} requests a level\n")  # fmt: skip
    print(table(rows))
    print()
    for system in systems:
        print("\n".join(verdicts(rows, system.name)))
    write_json(args.json, {
        "date": utc_timestamp(), "machine": info, "argv": sys.argv[1:],
        "elapsed_s": time.perf_counter() - started, "notes": notes,
        "systems": systems_record(systems, engines_dir), "levels": rows,
    })  # fmt: skip
    write_raw(args.json, [vars(r) for run in runs for r in run.records])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

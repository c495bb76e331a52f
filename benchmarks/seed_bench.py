"""The seed's benchmark, side by side: ttsvc, Piper's own HTTP server and a load-per-request
baseline, on the same voice, texts and machine, in one run.

Why this exists: users pick a TTS server on first-packet latency, tail latency and throughput
under concurrency, and the seed article published such figures (first packet 30 ms, P99 55 ms,
380 QPS on 8 GPU-backed cores) without a peer measured beside them. This script follows the
seed's method (texts of 20-60 characters drawn uniformly from a corpus, a closed-loop
concurrency ramp) and adds an open-loop mode (Poisson arrivals) that finds the highest request
rate each server sustains within the SLO. Every system runs on loopback on this machine; the
systems take turns at each level, in a rotating order, over several rounds, so drift on a shared
machine lands on all of them alike, and the CPU used by other tenants is recorded per level.

Systems (each skipped with a note where it cannot start):

* ``ttsvc``: ``ttsvc serve`` as an operator runs it (gateway + worker processes), with the
  service's own defaults for processes x compute threads (``--workers`` only if given here).
* ``ttsvc-2x1``: the same service split as two processes of one compute thread each
  (``--workers 2 --compute-threads 1``), against the default split.
* ``ttsvc:NAME``: any other ``ttsvc serve`` flags, given as ``--variant NAME=FLAGS``.
* ``piper``: ``python -m piper.http_server`` (the ``piper-tts`` package, Flask) with the same
  voice file; it answers a whole WAV.
* ``traditional``: ``baselines/traditional_server.py``: loads the model in every request and
  answers a whole WAV. Capped at ``--traditional-max-level`` clients (each request holds a fresh
  model session in memory).

After each level, each ttsvc system's ``/metrics`` (its metrics port) is read for the deadline
misses the workers counted (``ttsvc_deadline_misses_total``, ``ttsvc_deadline_late_seconds_total``;
the level's increase is recorded, or nothing where the service does not export them).

A focused run (about 12-15 minutes on a 2-core machine)::

    python benchmarks/seed_bench.py --systems ttsvc,ttsvc-2x1,piper \
        --closed-levels 1,4,16,32 --realtime-levels 8,16,24 --rounds 1

``--dry-run`` prints each system's command line and exits without starting anything.

Outputs: a markdown table on stdout, ``results/seed_bench.json`` (every request),
``results/seed_bench.png`` (TTFA and throughput versus concurrency, all systems on one chart) and
``results/seed_bench.md`` (machine, versions, date, headline table, targets met or missed).

Run from the repository root, with ``pip install -e '.[test,bench]'``::

    python benchmarks/seed_bench.py
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import random
import shlex
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench_common import (
    DEFAULT_CORPUS,
    DEFAULT_ENGINES,
    HERE,
    HOST,
    RESULTS,
    SERVER_LOG_DIR,
    Record,
    Server,
    ServerProcess,
    finite,
    fmt,
    free_port,
    load_corpus,
    machine_info,
    one_request,
    ratio,
    relative,
    serve_argv,
    utc_timestamp,
    write_atomic,
    write_json,
    write_raw,
)
from bench_common.load import (
    LevelRun,
    ResourceMonitor,
    closed_loop,
    meets_slo,
    open_loop,
    paced_loop,
    poisson_arrivals,
    summarize_records,
    text_draw,
    usage_figures,
)
from ttsvc.compile.build import default_checkpoint, ensure_default_voice

DEFAULT_JSON = RESULTS / "seed_bench.json"
READY_TIMEOUT_S = 180.0
DET = {"noise_scale": 0.0, "noise_w": 0.0}
"""Deterministic synthesis on every system: same texts, same scales, same amount of work."""

SLO_TTFA_P99_MS = 150.0
"""The open-loop SLO, and the real-time callers' start: TTFA p99 within 150 ms, at most 1 %
errors."""
SLO_MAX_ERROR_SHARE = 0.01

TARGETS: dict[str, tuple[str, float | None, str, str]] = {
    "realtime_streams": ("Real-time callers (≤ 1 % of streams stalled, TTFA p99 ≤ 150 ms)", 16.0,
                         "callers", "min"),
    "saturation_audio_s_per_s": ("Throughput at saturation", None, "audio-s/s", "min"),
    "saturation_x_piper": ("Throughput at saturation / Piper's, same run", 1.1, "×", "min"),
    "c16_ttfa_p99_ms": ("TTFA p99 at concurrency 16, closed loop", 250.0, "ms", "max"),
    "c1_ttfa_p50_ms": ("TTFA p50 at concurrency 1", 60.0, "ms", "max"),
    "c1_ttfa_p99_ms": ("TTFA p99 at concurrency 1", None, "ms", "max"),
    "c32_rss_gib": ("RSS of the whole service at concurrency 32", 0.6, "GiB", "max"),
}
"""Issue 14's pass lines on this 2-core machine: key -> (label, limit or None for a figure
without a target, unit, max/min)."""

REALTIME_MAX_STALLED = 0.01
"""A real-time level passes when at most 1 % of its streams stalled (an underrun, or no stream
at all: an error or a refusal is a caller who heard nothing)..."""
REALTIME_TTFA_P99_MS = 150.0
"""...and its TTFA p99 is within this."""

VARIANTS = {
    "ttsvc-2x1": "--workers 2 --compute-threads 1",
}
"""Built-in ttsvc variants: ``ttsvc serve`` flags added to ``--ttsvc-args``."""

DEADLINE_COUNTERS = {
    "deadline_misses": "ttsvc_deadline_misses_total",
    "deadline_late_s": "ttsvc_deadline_late_seconds_total",
}
"""Counters read from a ttsvc system's metrics after each level (summed over labels)."""


# --------------------------------------------------------------------------- systems


@dataclass
class System:
    """One server under test: how it is started, where it synthesizes, and its process."""

    name: str
    argv: list[str]
    path: str
    health: str
    port: int
    log: Path
    payload: Callable[[str], dict[str, Any]]
    max_level: int | None = None
    extra_args: list[str] = field(default_factory=list)
    """``ttsvc serve`` flags of this system (the shared ``--ttsvc-args`` plus its variant's)."""
    workers: int | None = None
    """``--workers`` for a ttsvc system; None leaves the split to the service's defaults."""
    metrics_port: int | None = None
    """A ttsvc system's metrics port (deadline counters are read from it)."""
    server: ServerProcess | None = None
    ready_s: float | None = None
    note: str = ""

    @property
    def url(self) -> str:
        """The synthesis URL on loopback."""
        return f"http://{HOST}:{self.port}{self.path}"

    @property
    def pid(self) -> int:
        """The server's root process."""
        assert self.server is not None
        return self.server.proc.pid

    def command(self, engines_dir: Path) -> list[str]:
        """The command line ``start`` runs (for ``--dry-run`` and the results)."""
        if not self.name.startswith("ttsvc"):
            return self.argv
        return serve_argv(engines_dir, self.workers, self.port, self.extra_args)

    def start(self, engines_dir: Path) -> None:
        """Start the server process, its output in ``log``."""
        if self.name.startswith("ttsvc"):
            self.server = Server(engines_dir, self.workers, self.log, port=self.port,
                                 extra_args=self.extra_args)  # fmt: skip
            self.argv = self.server.argv
            return
        self.server = ServerProcess(self.argv, self.log, port=self.port)

    def wait_ready(self) -> None:
        """Poll the health URL until it answers 200; a process that dies is reported at once."""
        assert self.server is not None
        self.ready_s = self.server.wait_ready(
            lambda c: c.get(self.health).status_code == 200,
            timeout_s=READY_TIMEOUT_S, poll_timeout_s=2.0, interval_s=0.2, name=self.name,
        )  # fmt: skip

    def stop(self) -> None:
        """SIGTERM, then kill if it lingers (ttsvc drains for longer than the others)."""
        if isinstance(self.server, Server):
            self.server.stop()
        elif self.server is not None:
            self.server.stop(20, announce_kill=False)


@contextlib.contextmanager
def serving(systems: Sequence[System], engines_dir: Path) -> Iterator[None]:
    """Every system started and ready (each one's start-up time on stderr); all stopped after,
    whatever happened."""
    try:
        for system in systems:
            system.start(engines_dir)
        for system in systems:
            system.wait_ready()
            print(f"{system.name} ready in {system.ready_s:.1f} s on :{system.port}",
                  file=sys.stderr)  # fmt: skip
        yield
    finally:
        for system in systems:
            system.stop()


def make_systems(args: argparse.Namespace) -> tuple[list[System], list[str]]:
    """The systems asked for that can run here, and a note for each one left out."""
    model, _config = default_checkpoint()
    wanted = [s.strip() for s in args.systems.split(",") if s.strip()]
    systems: list[System] = []
    notes: list[str] = []
    variants = {f"ttsvc:{k}": v for k, v in (v.split("=", 1) for v in args.variant)}
    variants.update(VARIANTS)
    if args.no_traditional:
        wanted = [name for name in wanted if name != "traditional"]
    for name in wanted:
        port = free_port()
        log = SERVER_LOG_DIR / f"seed_bench_{name.replace(':', '_')}.log"
        if name == "ttsvc" or name in variants or name.startswith("ttsvc:"):
            if name != "ttsvc" and name not in variants:
                raise SystemExit(f"--systems: {name}: no --variant {name.partition(':')[2]}=...")
            # each ttsvc gets its own metrics port, so variants can run side by side
            metrics_port = free_port()
            flags = variants.get(name, "").split()
            extra = ["--metrics-port", str(metrics_port), *args.ttsvc_args.split(), *flags]
            workers = args.workers if name == "ttsvc" else None  # variants carry their own
            systems.append(System(name, [], "/synthesize", "/health", port, log,
                                  lambda t: {"text": t, **DET}, extra_args=extra,
                                  workers=workers, metrics_port=metrics_port))  # fmt: skip
        elif name == "piper":
            if not all(importlib.util.find_spec(m) for m in ("piper", "flask")):
                notes.append("piper: piper-tts or flask not installed (pip install -e '.[bench]')")
                continue
            argv = [sys.executable, "-m", "piper.http_server", "-m", str(model),
                    "--host", HOST, "--port", str(port)]  # fmt: skip
            systems.append(System(name, argv, "/synthesize", "/info", port, log,
                                  lambda t: {"text": t, "noise_scale": 0.0,
                                             "noise_w_scale": 0.0}))  # fmt: skip
        elif name == "traditional":
            argv = [sys.executable, str(HERE / "baselines" / "traditional_server.py"),
                    "--host", HOST, "--port", str(port)]  # fmt: skip
            systems.append(System(name, argv, "/synthesize", "/health", port, log,
                                  lambda t: {"text": t, **DET},
                                  max_level=args.traditional_max_level))  # fmt: skip
        else:
            raise SystemExit(f"--systems: unknown system {name!r}")
    return systems, notes


# --------------------------------------------------------------------------- measuring


async def deadline_counters(client: httpx.AsyncClient, system: System) -> dict[str, float] | None:
    """The deadline counters a ttsvc system exports now, summed over labels; None where it has
    no metrics port or exports none of them (a service without deadline accounting)."""
    if system.metrics_port is None:
        return None
    try:
        resp = await client.get(f"http://{HOST}:{system.metrics_port}/metrics", timeout=5.0)
        resp.raise_for_status()
    except httpx.HTTPError:
        return None
    return parse_deadline_counters(resp.text)


def parse_deadline_counters(exposition: str) -> dict[str, float] | None:
    """``DEADLINE_COUNTERS`` from a Prometheus text exposition, each summed over its labels;
    None where none of them is there."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            for key, metric in DEADLINE_COUNTERS.items():
                if sample.name == metric:
                    found[key] = found.get(key, 0.0) + float(sample.value)
    return found or None


def counter_delta(
    before: dict[str, float] | None, after: dict[str, float] | None
) -> dict[str, float | None]:
    """Each counter's increase over a level (None where either reading lacks it; a counter that
    went down, a respawned worker's, counts from zero)."""
    out: dict[str, float | None] = {}
    for key in DEADLINE_COUNTERS:
        a = None if after is None else after.get(key)
        b = None if before is None else before.get(key)
        out[key] = None if a is None or b is None else (a - b if a >= b else a)
    return out


async def measure(
    system: System,
    client: httpx.AsyncClient,
    corpus: Sequence[str],
    texts: Sequence[int],
    kind: str,
    level: float,
    round_no: int,
    args: argparse.Namespace,
) -> LevelRun:
    """One closed-loop level or one open-loop rate against one system, with its resource use."""

    def make(index: int) -> Record:
        tid = texts[index % len(texts)]
        return Record(system.name, int(level) if kind != "open" else 0, index, tid,
                      len(corpus[tid]))  # fmt: skip

    async def send(index: int, rec: Record) -> None:
        await one_request(client, system.url, system.payload(corpus[rec.text_index]), rec)

    counters_before = await deadline_counters(client, system)
    monitor = ResourceMonitor(system.pid)
    monitor.start()
    try:
        if kind == "paced":
            n = int(level)
            rng = random.Random(args.seed + n)
            stagger = [rng.uniform(0.0, args.paced_stagger) for _ in range(n)]
            planned = 100_000  # bounded by the level's time
            records, wall, hit = await paced_loop(send, make, n, planned, args.paced_seconds,
                                                  stagger)  # fmt: skip
        elif kind == "closed":
            c = int(level)
            planned = max(args.min_requests, args.requests_per_client * c)
            records, wall, hit = await closed_loop(send, make, c, planned, args.max_seconds)
        else:
            arrivals = poisson_arrivals(level, args.open_seconds, args.seed + int(level * 1000))
            records, wall = await open_loop(send, make, arrivals)
            hit = False
    finally:
        usage = monitor.stop()
    usage_fig = usage_figures(usage, wall)
    usage_fig.update(counter_delta(counters_before, await deadline_counters(client, system)))
    run = LevelRun(system.name, kind, level, round_no, wall, hit, records, usage_fig)
    s = run.summary()
    others = s["others_cores"]
    misses = s.get("deadline_misses")
    print(
        f"  {system.name:12s} {kind} {level:>5g}: {s['ok']}/{s['sent']} ok, "
        f"TTFA p50 {fmt(s['ttfa_p50_ms'])} p99 {fmt(s['ttfa_p99_ms'])} ms, "
        f"{fmt(s['audio_s_per_s'], 1)} audio-s/s, "
        f"underrun {fmt(100 * (s['underrun_share'] or 0))}%,"
        f" server {fmt(s['server_cores'], 2)} cores, others {fmt(others, 2)}"
        + ("" if misses is None else f", deadline misses {misses:g}"),
        file=sys.stderr,
        flush=True,
    )
    return run


async def warm_up(system: System, client: httpx.AsyncClient, corpus: Sequence[str]) -> None:
    """A few unmeasured requests (one-off costs: arenas, kernel choice, connections)."""
    recs = [Record(system.name, 0, i, i, len(corpus[i])) for i in range(4)]
    await asyncio.gather(*(
        one_request(client, system.url, system.payload(corpus[r.text_index]), r) for r in recs
    ))  # fmt: skip
    bad = [r.error for r in recs if r.error]
    if bad:
        raise RuntimeError(f"{system.name}: warm-up failed: {bad}")


async def run_all(
    systems: Sequence[System], corpus: Sequence[str], args: argparse.Namespace
) -> list[LevelRun]:
    """The closed-loop ramp (systems rotating at each level, over rounds), then the open loop."""
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    limit = max(levels) + 8
    limits = httpx.Limits(max_connections=limit * len(systems),
                          max_keepalive_connections=limit)  # fmt: skip
    timeout = httpx.Timeout(args.timeout, connect=10.0)
    runs: list[LevelRun] = []
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
        for system in systems:
            await warm_up(system, client, corpus)
        turn = 0
        for round_no in range(args.rounds):
            for c in levels:
                texts = text_draw(len(corpus), 4096, args.seed * 1009 + c)
                order = [s for s in systems if s.max_level is None or c <= s.max_level]
                turn += 1
                order = order[turn % len(order) :] + order[: turn % len(order)] if order else []
                for system in order:
                    runs.append(
                        await measure(system, client, corpus, texts, "closed", c, round_no, args)
                    )
        for n in [int(x) for x in args.paced_levels.split(",") if x.strip()]:
            texts = text_draw(len(corpus), 4096, args.seed * 7 + n)
            for system in systems:
                if system.max_level is None:
                    runs.append(await measure(system, client, corpus, texts, "paced", n, 0, args))
        if args.open_steps > 0:
            runs.extend(await open_search(systems, client, corpus, args))
    return runs


async def open_search(
    systems: Sequence[System],
    client: httpx.AsyncClient,
    corpus: Sequence[str],
    args: argparse.Namespace,
) -> list[LevelRun]:
    """Raise the Poisson rate by ``--open-growth`` per step until a system breaks the SLO.

    Systems take turns at each rate; a system that broke the SLO sits out the higher rates.
    """
    candidates = [s for s in systems if s.max_level is None]
    alive = {s.name for s in candidates}
    runs: list[LevelRun] = []
    rate = args.open_start
    for _step in range(args.open_steps):
        texts = text_draw(len(corpus), 4096, args.seed + int(rate * 1000))
        for system in candidates:
            if system.name not in alive:
                continue
            run = await measure(system, client, corpus, texts, "open", round(rate, 2), 0, args)
            runs.append(run)
            if not meets_slo(run.summary(), SLO_TTFA_P99_MS, SLO_MAX_ERROR_SHARE):
                alive.discard(system.name)
        if not alive:
            break
        rate *= args.open_growth
    return runs


# --------------------------------------------------------------------------- results


def pooled(runs: Sequence[LevelRun]) -> list[dict[str, Any]]:
    """One row per (system, kind, level): records of all rounds pooled, usage averaged/peaked."""
    groups: dict[tuple[str, str, float], list[LevelRun]] = {}
    for r in runs:
        groups.setdefault((r.system, r.kind, r.level), []).append(r)
    rows = []
    for (system, kind, level), group in groups.items():
        records = [rec for r in group for rec in r.records]
        wall = sum(r.wall_s for r in group)
        row: dict[str, Any] = {"system": system, "kind": kind, "level": level,
                               "rounds": len(group)}  # fmt: skip
        row.update(summarize_records(records, wall))
        for key in ("server_cores", "client_cores", "others_cores"):
            values = [r.usage[key] for r in group if finite(r.usage.get(key))]
            row[key] = sum(values) / len(values) if values else None
        for key in ("peak_rss_mib", "peak_pss_mib"):
            row[key] = max((r.usage[key] for r in group), default=None)
        for key in DEADLINE_COUNTERS:
            counts = [r.usage.get(key) for r in group]
            row[key] = None if None in counts else sum(c for c in counts if c is not None)
        row["stalled_share"] = stalled_share(row)
        row["ttfa_p99_ms_by_round"] = [r.summary()["ttfa_p99_ms"] for r in group]
        rows.append(row)
    rows.sort(key=lambda r: (r["kind"], r["system"], r["level"]))
    return rows


def stalled_share(row: dict[str, Any]) -> float | None:
    """Share of a level's streams a caller would have heard stall: an underrun, or an error
    (a refused or failed request is a caller who heard nothing at all)."""
    sent = row.get("sent") or 0
    if not sent:
        return None
    return (row.get("underrun_streams", 0) + row.get("errors", 0)) / sent


def realtime_ok(row: dict[str, Any]) -> bool:
    """A real-time level passes: few enough stalled streams, and audio starts in time."""
    stalled, p99 = stalled_share(row), row.get("ttfa_p99_ms")
    return (
        stalled is not None and stalled <= REALTIME_MAX_STALLED
        and p99 is not None and p99 <= REALTIME_TTFA_P99_MS
    )  # fmt: skip


def headline(rows: Sequence[dict[str, Any]], system: str) -> dict[str, Any]:
    """The issue's figures for one system (None where its run does not reach a level).

    Real-time callers: the largest level that passes (``realtime_ok``) with every level below
    it passing too, so one lucky level above a failed one does not set the figure."""
    closed = {r["level"]: r for r in rows if r["system"] == system and r["kind"] == "closed"}
    paced = {r["level"]: r for r in rows if r["system"] == system and r["kind"] == "paced"}
    opened = [r for r in rows if r["system"] == system and r["kind"] == "open"]

    def at(level: int, key: str) -> Any:
        return closed[level][key] if level in closed else None

    realtime = 0
    for c in sorted(paced):
        if not realtime_ok(paced[c]):
            break
        realtime = int(c)
    best_open = max(
        (r["level"] for r in opened if meets_slo(r, SLO_TTFA_P99_MS, SLO_MAX_ERROR_SHARE)),
        default=None,
    )
    rss32 = at(32, "peak_rss_mib")
    saturation = max((r["audio_s_per_s"] for r in closed.values()), default=None)
    qps = max((r["qps"] for r in closed.values()), default=None)
    return {
        "system": system,
        "c1_ttfa_p50_ms": at(1, "ttfa_p50_ms"),
        "c1_ttfa_p99_ms": at(1, "ttfa_p99_ms"),
        "saturation_audio_s_per_s": saturation,
        "saturation_qps": qps,
        "c16_ttfa_p99_ms": at(16, "ttfa_p99_ms"),
        "realtime_streams": realtime if paced else None,
        "c32_rss_gib": None if rss32 is None else rss32 / 1024,
        "c32_pss_gib": None if at(32, "peak_pss_mib") is None else at(32, "peak_pss_mib") / 1024,
        "open_loop_max_qps_in_slo": best_open,
        "saturation_x_piper": None,  # filled in by ``compare`` once Piper's figure is known
    }


def compare(heads: list[dict[str, Any]]) -> None:
    """Fill in each system's throughput as a multiple of Piper's, measured in the same run."""
    piper = next((h for h in heads if h["system"] == "piper"), None)
    for h in heads:
        theirs = None if piper is None else piper["saturation_audio_s_per_s"]
        h["saturation_x_piper"] = ratio(h["saturation_audio_s_per_s"], theirs)


def verdicts(head: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target: met or missed, and the gap (value minus limit, in the target's unit)."""
    out = []
    for key, (label, limit, unit, sense) in TARGETS.items():
        value = head.get(key)
        if limit is None:
            continue
        if value is None:
            verdict, gap = "not measured", None
        else:
            ok = value <= limit if sense == "max" else value >= limit
            verdict, gap = ("met" if ok else "missed"), value - limit
        out.append({"key": key, "target": label, "limit": limit, "unit": unit, "sense": sense,
                    "value": value, "verdict": verdict, "gap": gap})  # fmt: skip
    return out


def level_table(rows: Sequence[dict[str, Any]], kind: str) -> str:
    """Markdown table of every system at every level of one kind."""
    head = (
        f"| system | {'rate QPS' if kind == 'open' else 'c'} | ok/sent | QPS | TTFA p50 | p95 | "
        "p99 ms | latency p50 | p99 ms | audio-s/s | underrun % | stalled % | deadline misses "
        "| late s | server cores | others cores | RSS MiB | PSS MiB | errors |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:"
        "|---:|---:|---:|---:|---|"
    )
    lines = [head]
    for r in rows:
        if r["kind"] != kind:
            continue
        errors = ", ".join(f"{k}×{v}" for k, v in sorted(r["errors_by_kind"].items())) or "0"
        share, stalled = r["underrun_share"], r.get("stalled_share")
        lines.append(
            f"| {r['system']} | {r['level']:g} | {r['ok']}/{r['sent']} | {fmt(r['qps'], 1)} | "
            f"{fmt(r['ttfa_p50_ms'])} | {fmt(r['ttfa_p95_ms'])} | {fmt(r['ttfa_p99_ms'])} | "
            f"{fmt(r['latency_p50_ms'])} | {fmt(r['latency_p99_ms'])} | "
            f"{fmt(r['audio_s_per_s'], 1)} | {fmt(None if share is None else 100 * share)} | "
            f"{fmt(None if stalled is None else 100 * stalled)} | "
            f"{fmt(r.get('deadline_misses'), 0)} | {fmt(r.get('deadline_late_s'), 2)} | "
            f"{fmt(r['server_cores'], 2)} | {fmt(r['others_cores'], 2)} | "
            f"{fmt(r['peak_rss_mib'], 0)} | {fmt(r['peak_pss_mib'], 0)} | {errors} |"
        )
    return "\n".join(lines)


def headline_table(heads: Sequence[dict[str, Any]]) -> str:
    """The issue's table: each system's figure per target, ttsvc's verdict, and ttsvc's figure
    as a ratio of every other system's (the other split's and Piper's above all), all from the
    same run."""
    names = [h["system"] for h in heads]
    ours = next((h for h in heads if h["system"] == "ttsvc"), None)
    cols = " | ".join(names)
    lines = [f"| figure | {cols} | target | ttsvc verdict | " + " | ".join(
        f"ttsvc / {n}" for n in names if n != "ttsvc") + " |"]  # fmt: skip
    lines.append("|---|" + "---:|" * (len(names) + 2) + "---:|" * (len(names) - 1))
    for key, (label, limit, unit, sense) in TARGETS.items():
        digits = {"GiB": 2, "×": 2, "callers": 0}.get(unit, 1)
        cells = [fmt(h.get(key), digits) for h in heads]
        verdict = next((v for v in verdicts(ours) if v["key"] == key), None) if ours else None
        mark = "–" if verdict is None else verdict["verdict"]
        ratios = [fmt(ratio(ours.get(key), h.get(key)) if ours else None, 2)
                  for h in heads if h["system"] != "ttsvc"]  # fmt: skip
        target = "–" if limit is None else f"{'≤' if sense == 'max' else '≥'} {limit:g}"
        lines.append(f"| {label} ({unit}) | " + " | ".join(cells)
                     + f" | {target} | {mark} | " + " | ".join(ratios) + " |")  # fmt: skip
    extra = " | ".join(fmt(h.get("open_loop_max_qps_in_slo"), 1) for h in heads)
    lines.append(f"| Highest Poisson rate within the SLO (QPS) | {extra} | | | "
                 + " | ".join("" for n in names if n != "ttsvc") + " |")  # fmt: skip
    return "\n".join(lines)


def plot(rows: Sequence[dict[str, Any]], path: Path, title: str) -> bool:
    """TTFA p50/p99 and throughput versus concurrency, and stalled streams versus real-time
    callers, every system on the same axes."""
    try:
        import matplotlib  # noqa: PLC0415 - the bench extra; plotting is optional

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415 - after choosing the Agg backend
    except ImportError:
        return False
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(17, 4.8))
    colors: dict[str, str | None] = {"ttsvc": "tab:blue", "piper": "tab:orange",
                                     "traditional": "tab:gray",
                                     "ttsvc-2x1": "tab:green"}  # fmt: skip
    spare = iter(["tab:red", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "black"])
    for system in sorted({r["system"] for r in rows} - colors.keys()):
        colors[system] = next(spare, None)  # variants: a colour each, none shared
    for system in sorted({r["system"] for r in rows}):
        mine = sorted((r for r in rows if r["system"] == system and r["kind"] == "closed"),
                      key=lambda r: r["level"])  # fmt: skip
        if not mine:
            continue
        xs = [r["level"] for r in mine]
        color = colors.get(system)
        ax1.plot(xs, [r["ttfa_p50_ms"] for r in mine], "o-", color=color, label=f"{system} p50")
        ax1.plot(xs, [r["ttfa_p99_ms"] for r in mine], "s--", color=color, label=f"{system} p99")
        ax2.plot(xs, [r["audio_s_per_s"] for r in mine], "o-", color=color, label=system)
    for system in sorted({r["system"] for r in rows}):
        callers = sorted((r for r in rows if r["system"] == system and r["kind"] == "paced"),
                         key=lambda r: r["level"])  # fmt: skip
        if callers:
            ax3.plot([r["level"] for r in callers],
                     [100 * (r.get("stalled_share") or 0.0) for r in callers], "o-",
                     color=colors.get(system), label=system)  # fmt: skip
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients (closed loop)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    ax1.set_yscale("log")
    ax1.set_ylabel("time to first audio (ms)")
    ax1.axhline(SLO_TTFA_P99_MS, color="red", lw=0.8, ls=":")
    ax1.set_title("TTFA p50 (solid) and p99 (dashed)")
    ax2.set_ylabel("audio seconds per second")
    ax2.set_title("Throughput")
    ax3.axhline(100 * REALTIME_MAX_STALLED, color="red", lw=0.8, ls=":")
    ax3.set_xlabel("real-time callers (each plays its answer, then asks again)")
    ax3.set_ylabel("streams stalled (%)")
    ax3.set_title("Stalled streams (underrun or error)")
    ax3.grid(True, alpha=0.3)
    if ax3.get_legend_handles_labels()[0]:
        ax3.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def system_flags(system: System) -> str:
    """A system's command line as the summary shows it: no interpreter, ports or paths."""
    if system.name.startswith("ttsvc"):
        workers = [] if system.workers is None else ["--workers", str(system.workers)]
        return shlex.join(["ttsvc", "serve", *workers, *strip_ports(system.extra_args)])
    return shlex.join([Path(a).name if "/" in a else a for a in strip_ports(system.argv[1:])])


def strip_ports(argv: Sequence[str]) -> list[str]:
    """``argv`` without port flags (free ports differ from run to run)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--port", "--metrics-port"):
            skip = True
        else:
            out.append(arg)
    return out


def versions() -> dict[str, str]:
    """Versions of everything the figures depend on (missing packages are left out)."""
    out = {}
    for name in ("ttsvc", "onnxruntime", "numpy", "piper-tts", "flask", "uvicorn", "httpx"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def systems_record(systems: Sequence[System], engines_dir: Path) -> list[dict[str, Any]]:
    """Each system's flags (paths repository-relative: no machine's layout is committed), its
    start-up time and its log."""
    return [{"name": s.name, "argv": [relative(Path(a)) if "/" in a else a
                                      for a in s.command(engines_dir)[1:]],
             "ready_s": s.ready_s, "log": relative(s.log)} for s in systems]  # fmt: skip


def build_arg_parser() -> argparse.ArgumentParser:
    """Flags; the defaults finish in about 10 minutes on a 2-core machine."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--systems", default="ttsvc,ttsvc-2x1,piper,traditional",
                   help="comma-separated: ttsvc, " + ", ".join(VARIANTS)
                   + ", ttsvc:NAME (see --variant), piper, traditional (default: %(default)s)")
    p.add_argument("--no-traditional", action="store_true",
                   help="leave the load-per-request server out")
    p.add_argument("--levels", "--closed-levels", dest="levels", default="1,2,4,8,16,24,32,64",
                   help="closed-loop concurrency ramp (default: %(default)s)")  # fmt: skip
    p.add_argument("--rounds", type=int, default=2, help="passes over the ramp (alternating)")
    p.add_argument("--max-seconds", type=float, default=6.0, help="time budget per level")
    p.add_argument("--min-requests", type=int, default=40)
    p.add_argument("--requests-per-client", type=int, default=6)
    p.add_argument("--traditional-max-level", type=int, default=8)
    p.add_argument("--paced-levels", "--realtime-levels", dest="paced_levels",
                   default="4,8,12,16,20,24,32",
                   help="real-time callers (each plays its audio before asking again; "
                   "default: %(default)s)")  # fmt: skip
    p.add_argument("--paced-seconds", type=float, default=20.0, help="time per paced level")
    p.add_argument("--paced-stagger", type=float, default=2.5,
                   help="callers start at random offsets within this many seconds")
    p.add_argument("--open-start", type=float, default=2.0, help="first Poisson rate, QPS")
    p.add_argument("--open-growth", type=float, default=1.5)
    p.add_argument("--open-steps", type=int, default=7)
    p.add_argument("--open-seconds", type=float, default=8.0)
    p.add_argument("--workers", type=int, default=None,
                   help="worker processes of the plain ttsvc system (default: the service's "
                   "own choice; variants carry their own)")  # fmt: skip
    p.add_argument("--ttsvc-args", default="--max-streams-per-worker 80",
                   help="extra `ttsvc serve` flags of every ttsvc system (default: %(default)s, "
                   "a slot for every client of the ramp even in one worker process)")  # fmt: skip
    p.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                   help="a ttsvc variant, run as system ttsvc:NAME")  # fmt: skip
    p.add_argument("--engines-dir", type=Path, default=DEFAULT_ENGINES)
    p.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    p.add_argument("--join", type=int, default=1, metavar="N",
                   help="each text is N consecutive corpus lines joined by spaces: 4 makes "
                   "texts of 80-240 characters, about 6-17 s of speech (issue 40's longer "
                   "texts; default %(default)s: the lines as they are)")  # fmt: skip
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    p.add_argument("--plot", type=Path, default=RESULTS / "seed_bench.png")
    p.add_argument("--summary", type=Path, default=RESULTS / "seed_bench.md")
    p.add_argument("--dry-run", action="store_true",
                   help="print each system's command line and exit, starting nothing")
    return p


def joined(corpus: Sequence[str], n: int) -> list[str]:
    """Texts of ``n`` consecutive lines each (wrapping around), one starting at every line: the
    same corpus read as longer texts, for as many texts as lines."""
    return [" ".join(corpus[(i + k) % len(corpus)] for k in range(n)) for i in range(len(corpus))]


def lengths(corpus: Sequence[str]) -> str:
    """The corpus's text lengths as a range, for the method line."""
    sizes = [len(text) for text in corpus]
    return f"{min(sizes)}–{max(sizes)}"


def main(argv: Sequence[str] | None = None) -> int:
    """Start the systems, run the ramp and the open loop, print and write the results."""
    args = build_arg_parser().parse_args(argv)
    if args.rounds < 1 or args.max_seconds <= 0 or args.open_growth <= 1:
        raise SystemExit("--rounds ≥ 1, --max-seconds > 0 and --open-growth > 1, please")
    if args.join < 1:
        raise SystemExit("--join ≥ 1, please")
    corpus = joined(load_corpus(args.corpus), args.join)
    started = time.perf_counter()
    date = utc_timestamp()
    info = machine_info(versions())
    systems, notes = make_systems(args)
    for note in notes:
        print(f"skipped {note}", file=sys.stderr)
    engines_dir = Path(args.engines_dir).resolve()
    if args.dry_run:
        for system in systems:
            print(f"{system.name}: {shlex.join(system.command(engines_dir))}")
        return 0
    ensure_default_voice(Path(args.engines_dir), lambda m: print(m, file=sys.stderr))
    with serving(systems, engines_dir):
        runs = asyncio.run(run_all(systems, corpus, args))
    rows = pooled(runs)
    heads = [headline(rows, s.name) for s in systems]
    compare(heads)
    ours = next((h for h in heads if h["system"] == "ttsvc"), None)
    elapsed = time.perf_counter() - started
    cpu = info.get("cpu_model") or info.get("processor") or info.get("machine")
    vers = ", ".join(f"{k} {v}" for k, v in info.items()
                     if k in versions())  # fmt: skip
    title = f"{cpu} × {info['cpu_count']} CPUs, Python {info['python']}, {vers}, {date[:10]}"
    others = [r["others_cores"] for r in rows if finite(r.get("others_cores"))]
    busy_note = (f"Other tenants used {fmt(max(others), 2)} cores at most "
                 f"(median {fmt(sorted(others)[len(others) // 2], 2)}) during the levels."
                 if others else "")  # fmt: skip

    text = [
        "# Seed benchmark: ttsvc (its default split, and two processes of one thread side by "
        "side) vs Piper's HTTP server vs a load-per-request server",
        "",
        f"Machine: {cpu}, {info['cpu_count']} CPUs, {info['platform']}. Python {info['python']}; "
        f"{vers}. Date {date}. Run time {elapsed / 60:.1f} min. {busy_note}",
        "",
        f"Method: texts of {lengths(corpus)} characters drawn uniformly from "
        f"`{relative(args.corpus)}`{f' ({args.join} lines joined each)' if args.join > 1 else ''}; "
        f"closed-loop ramp {args.levels} over {args.rounds} rounds (systems alternate at each "
        f"level, records pooled); open loop from {args.open_start:g} QPS ×{args.open_growth:g} "
        f"per step, {args.open_seconds:g} s each, SLO TTFA p99 ≤ {SLO_TTFA_P99_MS:g} ms with ≤ "
        f"{100 * SLO_MAX_ERROR_SHARE:g} % errors. TTFA is the first audio byte after the WAV "
        "header; underruns are counted for a client that plays from its first byte in real "
        f"time. Real-time callers ({args.paced_levels}, {args.paced_seconds:g} s each) play each "
        "answer before asking again, starting at random offsets; the headline is the largest "
        "level where (as at every level below it) at most "
        f"{100 * REALTIME_MAX_STALLED:g} % of streams stalled (an underrun or an error) and "
        f"TTFA p99 ≤ {REALTIME_TTFA_P99_MS:g} ms. Deadline misses and late "
        "seconds are the increase of the service's own counters over the level (– where it "
        "does not export them).",
        "",
        *[f"- {s.name}: `{system_flags(s)}`" for s in systems],
        "",
        "## Headline",
        "",
        headline_table(heads),
        "",
    ]
    if notes:
        text += ["Not run: " + "; ".join(notes), ""]
    text += ["## Closed loop", "", level_table(rows, "closed"), ""]
    if any(r["kind"] == "paced" for r in rows):
        text += ["## Real-time callers (each plays its audio before asking again)", "",
                 level_table(rows, "paced"), ""]  # fmt: skip
    if any(r["kind"] == "open" for r in rows):
        text += ["## Open loop (Poisson arrivals)", "", level_table(rows, "open"), ""]
    if plot(rows, Path(args.plot), title):
        text += [f"![TTFA and throughput]({Path(args.plot).name})", ""]
    summary = "\n".join(text)
    print(summary)
    write_atomic(Path(args.summary), summary)
    raw = write_raw(Path(args.json), [asdict(rec) | {"kind": r.kind, "round": r.round}
                                      for r in runs for rec in r.records])  # fmt: skip
    payload = {
        "benchmark": "seed_bench",
        "date": date,
        "machine": info,
        "elapsed_s": elapsed,
        "settings": {k: (relative(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "slo": {"ttfa_p99_ms": SLO_TTFA_P99_MS, "max_error_share": SLO_MAX_ERROR_SHARE},
        "systems": systems_record(systems, engines_dir),
        "skipped": notes,
        "headline": heads,
        "targets": verdicts(ours) if ours else [],
        "levels": rows,
        "runs": [{k: v for k, v in r.summary().items()} for r in runs],
        "raw_records": relative(raw),
    }  # fmt: skip
    write_json(Path(args.json), payload, allow_nan=False)
    print(f"\nwrote {relative(Path(args.json))}, {relative(Path(args.summary))}, "
          f"{relative(Path(args.plot))} in {elapsed / 60:.1f} min", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

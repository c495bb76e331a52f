"""End-to-end HTTP benchmark: time to first audio and throughput of ``ttsvc serve``.

Why this exists: the engine benchmark (``engine_bench.py``) shows what one synthesizer can do,
but a caller sees the whole path: HTTP parsing, admission, the balancer, the pipe to a worker
process, the worker's scheduling of concurrent streams (its deadline scheduler), and the
response stream back. The service's latency promises ("time to first audio p50/p99 at
concurrency 1, 4 and 16") are about that path, so this benchmark starts the real server as a
subprocess on loopback and drives it with a closed loop of concurrent clients, exactly as a
voice bot would call it.

One server is started, warmed up, and measured at each concurrency level. Each level is a
closed loop: ``c`` clients each send a request, read the streamed WAV to the end, and send the
next, until the level's request count is done or its time budget is spent. The texts are drawn
with a fixed seed from ``corpus.txt``, per level, so two runs (two commits, two machines) send
the same texts in the same order.

This is a benchmark, not a test: it prints markdown tables, marks the issue's targets as
pass/miss, and writes every per-request record to JSON; it never fails on a missed target.

Run from the repository root::

    python benchmarks/http_bench.py
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort

from bench_common import (
    DEFAULT_CORPUS,
    DEFAULT_ENGINES,
    HOST,
    RESULTS,
    SERVER_LOG_DIR,
    Record,
    Server,
    fmt,
    load_corpus,
    machine_info,
    markdown_table,
    one_request,
    relative,
    utc_timestamp,
    write_json,
    write_raw,
)
from bench_common.load import closed_loop, summarize_records
from ttsvc.compile.build import ensure_default_voice

DEFAULT_JSON = RESULTS / "http_bench.json"

READY_TIMEOUT_S = 120.0
"""How long a server gets to become ready (spawn workers, load engines)."""
HEALTH_POLL_TIMEOUT_S = 1.0
"""Socket timeout of one readiness poll: a poll must not hang on a server that is starting."""
MAX_REQUESTS_PER_LEVEL = 100_000
"""Upper bound on ``--requests``: every loop here is bounded."""

SYSTEM = "ttsvc"
"""The label of every measured record (``Record.system``); warm-up records are ``"warmup"``."""

TARGETS: list[tuple[str, int, str, float]] = [
    ("c=1 TTFA p50", 1, "ttfa_p50_ms", 30.0),
    ("c=1 TTFA p99", 1, "ttfa_p99_ms", 55.0),
    ("c=16 TTFA p99", 16, "ttfa_p99_ms", 150.0),
]
"""The issue's targets (2-core machine): label, concurrency, summary key, max ms."""


# --------------------------------------------------------------------------- inputs


def parse_levels(spec: str) -> list[int]:
    """``"1,4,16"`` to concurrency levels; each must be a positive integer."""
    levels: list[int] = []
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            continue
        try:
            level = int(item)
        except ValueError:
            raise SystemExit(f"--levels: {item!r} is not an integer") from None
        if not 1 <= level <= 1024:
            raise SystemExit(f"--levels: {level} is outside 1..1024")
        levels.append(level)
    if not levels:
        raise SystemExit("--levels: need at least one level")
    return levels


def requests_for(level: int, override: int | None) -> int:
    """Requests per level: enough samples for a p99 to mean something, scaled with ``c``.

    60 at ``c=1``; at higher concurrency ``max(60, 8*c)`` so each client sends several requests
    and the level is not dominated by its ramp-up and drain. ``--requests`` overrides all levels.
    """
    count = override if override is not None else (60 if level == 1 else max(60, 8 * level))
    return max(1, min(count, MAX_REQUESTS_PER_LEVEL))


def level_texts(corpus: Sequence[str], count: int, seed: int, level: int) -> list[int]:
    """Corpus indices for one level, uniform with a fixed seed.

    Seeded by (seed, level), so every run with the same seed sends the same texts in the same
    order at each level: runs of two commits or machines compare like for like.
    """
    rng = random.Random(seed * 1009 + level)
    return [rng.randrange(len(corpus)) for _ in range(count)]


# --------------------------------------------------------------------------- server process


def start_server(engines_dir: Path, workers: int, port: int, max_streams: int | None) -> Server:
    """Spawn the service exactly as an operator would run it (CLI, gateway + worker processes)."""
    extra: list[str] = []
    if max_streams is not None:
        extra += ["--max-streams-per-worker", str(max_streams)]
    log_path = SERVER_LOG_DIR / "http_bench_server.log"
    return Server(engines_dir, workers, log_path, port=port, extra_args=extra)


def health_ok(client: httpx.Client) -> bool:
    """Ready once ``/health`` answers 200 with ``"status": "ok"``."""
    resp = client.get("/health")
    return resp.status_code == 200 and resp.json().get("status") == "ok"


def wait_ready(server: Server) -> float:
    """Poll ``/health`` until a worker is ready; returns seconds waited."""
    return server.wait_ready(
        health_ok,
        timeout_s=READY_TIMEOUT_S,
        poll_timeout_s=HEALTH_POLL_TIMEOUT_S,
        interval_s=0.2,
    )


# --------------------------------------------------------------------------- one level


@dataclass
class LevelResult:
    """All records of one concurrency level and its wall time."""

    concurrency: int
    planned: int
    wall_s: float
    stopped_by_deadline: bool
    records: list[Record] = field(default_factory=list)


def payload(text: str) -> dict[str, Any]:
    """Deterministic synthesis: the same text gives the same work in every run."""
    return {"text": text, "noise_scale": 0, "noise_w": 0}


async def run_level(
    client: httpx.AsyncClient,
    url: str,
    level: int,
    corpus: Sequence[str],
    text_ids: Sequence[int],
    max_seconds: float,
) -> LevelResult:
    """Closed loop (``bench_common.load.closed_loop``): request ``i`` sends text
    ``text_ids[i]``; the level's wall time runs from the start to the last response."""

    def make(index: int) -> Record:
        tid = text_ids[index]
        return Record(SYSTEM, level, index, tid, len(corpus[tid]))

    async def send(index: int, rec: Record) -> None:
        await one_request(client, url, payload(corpus[rec.text_index]), rec)

    records, wall, hit = await closed_loop(send, make, level, len(text_ids), max_seconds)
    return LevelResult(level, len(text_ids), wall, hit, records)


async def warm_up(
    client: httpx.AsyncClient, url: str, corpus: Sequence[str], count: int, workers: int, seed: int
) -> list[Record]:
    """A few unmeasured requests, ``workers`` at a time so every worker process runs once.

    The first requests pay one-off costs (ONNX Runtime arena growth, first-call kernel selection,
    connection set-up) that are not what the levels measure.
    """
    rng = random.Random(seed - 1)
    records: list[Record] = []
    for start in range(0, count, max(1, workers)):
        batch = []
        for i in range(start, min(count, start + max(1, workers))):
            tid = rng.randrange(len(corpus))
            batch.append(Record("warmup", 0, i, tid, len(corpus[tid])))
        await asyncio.gather(
            *(one_request(client, url, payload(corpus[r.text_index]), r) for r in batch)
        )
        records.extend(batch)
    return records


# --------------------------------------------------------------------------- statistics


def summarize(level: LevelResult) -> dict[str, Any]:
    """The per-level figures of the table (``bench_common.load.summarize_records``)."""
    out: dict[str, Any] = {
        "concurrency": level.concurrency,
        "planned": level.planned,
        "stopped_by_deadline": level.stopped_by_deadline,
    }
    out.update(summarize_records(level.records, level.wall_s))
    return out


def results_table(summaries: Sequence[dict[str, Any]]) -> str:
    """The markdown table, one row per concurrency level."""
    rows = []
    for s in summaries:
        errors = ", ".join(f"{k}×{v}" for k, v in sorted(s["errors_by_kind"].items())) or "0"
        n = f"{s['ok']}/{s['sent']}" + (" (time limit)" if s["stopped_by_deadline"] else "")
        share = s["underrun_share"]
        rows.append([
            str(s["concurrency"]), n, fmt(s["qps"], 2),
            fmt(s["ttfa_p50_ms"]), fmt(s["ttfa_p95_ms"]), fmt(s["ttfa_p99_ms"]),
            fmt(s["latency_p50_ms"]), fmt(s["latency_p99_ms"]),
            fmt(s["audio_s_per_s"], 2), fmt(None if share is None else 100 * share), errors,
        ])  # fmt: skip
    return markdown_table(
        ["c", "n ok", "QPS", "TTFA p50 ms", "TTFA p95 ms", "TTFA p99 ms",
         "latency p50 ms", "latency p99 ms", "audio s/s", "underruns %", "errors"],
        "rrrrrrrrrrl", rows,
    )  # fmt: skip


def check_targets(summaries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets against the measured figures: pass, miss, or not run."""
    by = {s["concurrency"]: s for s in summaries}
    out = []
    for label, level, key, limit in TARGETS:
        s = by.get(level)
        value = s[key] if s else None
        verdict = "not run" if value is None else ("pass" if value <= limit else "miss")
        out.append({"target": label, "limit_ms": limit, "value_ms": value, "verdict": verdict})
    return out


# --------------------------------------------------------------------------- driver


async def run_levels(
    server: Server,
    args: argparse.Namespace,
    corpus: Sequence[str],
    levels: Sequence[int],
) -> tuple[list[Record], list[LevelResult]]:
    """Warm up one server, then run every level against it with one shared HTTP client.

    One ``AsyncClient`` with a connection per client (plus spare) keeps connections alive across
    requests, as a real caller would, so connection set-up is not in every TTFA.
    """
    url = f"{server.base_url}/synthesize"
    limit = max(levels) + 4
    limits = httpx.Limits(max_connections=limit, max_keepalive_connections=limit)
    timeout = httpx.Timeout(args.timeout, connect=min(10.0, args.timeout))
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
        warm = await warm_up(client, url, corpus, args.warmup, args.workers, args.seed)
        bad = [r.error for r in warm if r.error]
        print(f"  warm-up: {len(warm) - len(bad)}/{len(warm)} ok {bad or ''}", file=sys.stderr)
        results = []
        for level in levels:
            count = requests_for(level, args.requests)
            ids = level_texts(corpus, count, args.seed, level)
            result = await run_level(client, url, level, corpus, ids, args.max_seconds)
            s = summarize(result)
            print(
                f"  c={level}: {s['ok']}/{s['sent']} ok in {result.wall_s:.1f} s, "
                f"TTFA p50 {fmt(s['ttfa_p50_ms'])} ms p99 {fmt(s['ttfa_p99_ms'])} ms",
                file=sys.stderr,
            )
            results.append(result)
    return warm, results


def build_arg_parser() -> argparse.ArgumentParser:
    """Command-line flags; defaults reproduce the issue's measurement."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--engines-dir",
        type=Path,
        default=DEFAULT_ENGINES,
        help="engine repository; the default voice is compiled here if missing",
    )
    p.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    p.add_argument("--workers", type=int, default=2, help="worker processes of the server")
    p.add_argument("--levels", default="1,4,16", help="concurrency levels, comma-separated")
    p.add_argument(
        "--requests",
        type=int,
        default=None,
        help="requests per level (default 60 at c=1, max(60, 8*c) otherwise)",
    )
    p.add_argument("--max-seconds", type=float, default=60.0,
                   help="time budget per level: no new requests after it")  # fmt: skip
    p.add_argument("--warmup", type=int, default=6, help="unmeasured requests before the levels")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--timeout", type=float, default=30.0, help="per-request timeout, seconds")
    p.add_argument("--port", type=int, default=0, help="server port (default: a free one)")
    p.add_argument("--max-streams-per-worker", type=int, default=None,
                   help="passed to the server (default: the server's)")  # fmt: skip
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run every level, print the table, write the JSON."""
    args = build_arg_parser().parse_args(argv)
    levels = parse_levels(args.levels)
    if args.workers < 1 or args.max_seconds <= 0 or args.timeout <= 0 or args.warmup < 0:
        raise SystemExit("--workers, --max-seconds and --timeout must be positive")
    corpus = load_corpus(args.corpus)
    info = machine_info(
        {"onnxruntime": ort.__version__, "httpx": httpx.__version__, "numpy": np.__version__}
    )
    date = utc_timestamp()

    print(f"engines: {relative(args.engines_dir)}", file=sys.stderr)
    version = ensure_default_voice(Path(args.engines_dir), lambda m: print(m, file=sys.stderr))
    engines_dir = Path(args.engines_dir).resolve()

    print(f"starting server ({args.workers} workers)", file=sys.stderr)
    server = start_server(engines_dir, args.workers, args.port, args.max_streams_per_worker)
    exit_code: int | None = None
    try:
        ready_s = wait_ready(server)
        print(f"  ready in {ready_s:.1f} s on port {server.port}", file=sys.stderr)
        warm, results = asyncio.run(run_levels(server, args, corpus, levels))
    finally:
        exit_code = server.stop()
        print(f"  server stopped (exit {exit_code})", file=sys.stderr)
    server_info = {
        "argv": ["python", *[relative(Path(a)) if a == str(engines_dir) else a
                             for a in server.argv[1:]]],
        "ready_s": ready_s,
        "exit_code": exit_code,
        "log": relative(server.log_path),
    }  # fmt: skip

    summaries = [summarize(level) for level in results]
    targets = check_targets(summaries)

    processor = info["processor"] or info["cpu_model"] or info["machine"]
    print(
        f"HTTP benchmark — machine: {processor} ({info['cpu_count']} CPUs), "
        f"Python {info['python']}, ONNX Runtime {info['onnxruntime']}, "
        f"workers {args.workers}, {date}"
    )
    print()
    print(results_table(summaries))
    print()
    print("Targets (20–60-character texts, end to end over HTTP):")
    for t in targets:
        print(f"- {t['target']} ≤ {t['limit_ms']:.0f} ms: {fmt(t['value_ms'])} ms — {t['verdict']}")

    out = Path(args.json)
    raw = write_raw(out, {
        "warmup_records": [asdict(r) for r in warm],
        "records": [asdict(r) for level in results for r in level.records],
    })  # fmt: skip
    payload = {
        "benchmark": "http_bench",
        "date": date,
        "machine": info,
        "engine_version": version.version,
        "settings": {
            "workers": args.workers,
            "levels": levels,
            "requests": {str(c): requests_for(c, args.requests) for c in levels},
            "max_seconds": args.max_seconds,
            "warmup": args.warmup,
            "seed": args.seed,
            "timeout_s": args.timeout,
            "max_streams_per_worker": args.max_streams_per_worker,
            "corpus": relative(args.corpus),
            "engines_dir": relative(args.engines_dir),
            "host": HOST,
            "request_body": {"noise_scale": 0, "noise_w": 0},
        },
        "server": server_info,
        "summary": summaries,
        "targets": targets,
        "raw_records": relative(raw),
    }
    write_json(out, payload, allow_nan=False)
    print(f"\nwrote {relative(out)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

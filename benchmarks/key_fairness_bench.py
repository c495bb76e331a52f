"""Two API keys, one flooding: what the other key sees while the first holds everything it can.

Why this exists: per-key quotas bound requests per minute, but a minute's burst arrives at once,
and a key that sends long texts then holds stream slots for many seconds. Without a per-key
concurrency limit such a key can take every slot, and any other key gets 429 or waits behind it.
This benchmark starts the real service with a key file of two keys on loopback and measures the
quiet key twice: alone (idle), then while the flooding key sends long texts from many clients as
fast as its quota lets it.

The quiet key is one caller sending corpus prompts back to back; a 429 makes it wait the
``Retry-After`` the server gave and try again (counted, not timed). Its figures are time to
first audio and latency percentiles over the requests that got audio, plus the share refused.
``--label`` names the run (``before`` on the old code, ``after`` on the new): each label's
figures are merged into one JSON, so both sit side by side.

Run from the repository root::

    python benchmarks/key_fairness_bench.py --label after
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from bench_common import (
    DEFAULT_CORPUS,
    DEFAULT_ENGINES,
    RESULTS,
    SERVER_LOG_DIR,
    Record,
    Server,
    fmt,
    load_corpus,
    machine_info,
    one_request,
    pct,
    ratio,
    relative,
    utc_timestamp,
    write_json,
    write_raw,
)
from ttsvc.compile.build import ensure_default_voice
from ttsvc.gateway.core.keys import append_key, key_line, new_key
from ttsvc.gateway.core.quotas import Quota

DEFAULT_JSON = RESULTS / "key_fairness_bench.json"
READY_TIMEOUT_S = 180.0
FLOOD_BACKOFF_S = 0.5
"""A refused flooding client tries again after this (it ignores ``Retry-After``: a flood)."""
MAX_RETRY_AFTER_S = 5.0
"""The quiet caller honours ``Retry-After`` up to this, so one answer cannot stall the run."""


def payload(text: str) -> dict[str, Any]:
    return {"text": text, "noise_scale": 0, "noise_w": 0}


def key_file(directory: Path, rpm: int) -> dict[str, str]:
    """Two keys with the same requests-per-minute quota and no other limit set; name -> key."""
    path = directory / "keys"
    keys = {}
    for name in ("flood", "quiet"):
        keys[name] = new_key()
        append_key(path, key_line(name, keys[name], Quota(rpm)))
    return keys


def summarize(records: Sequence[Record], refused: int, wall_s: float) -> dict[str, Any]:
    ok = [r for r in records if r.ok]
    ttfa = [r.ttfa_ms for r in ok if r.ttfa_ms is not None]
    latency = [r.latency_ms for r in ok if r.latency_ms is not None]
    asked = len(ok) + refused + sum(1 for r in records if not r.ok and r.status != 429)
    return {
        "ok": len(ok),
        "refused_429": refused,
        "other_errors": sum(1 for r in records if not r.ok and r.status != 429),
        "refused_share": refused / asked if asked else None,
        "ttfa_p50_ms": pct(ttfa, 50),
        "ttfa_p95_ms": pct(ttfa, 95),
        "latency_p50_ms": pct(latency, 50),
        "latency_p95_ms": pct(latency, 95),
        "wall_s": wall_s,
    }


async def quiet_caller(
    client: httpx.AsyncClient, corpus: Sequence[str], order: Sequence[int], seconds: float
) -> tuple[list[Record], int, float]:
    """One caller sending prompts back to back for ``seconds``; 429s wait their Retry-After."""
    records: list[Record] = []
    refused = 0
    started = time.perf_counter()
    index = 0
    while time.perf_counter() - started < seconds:
        tid = order[index % len(order)]
        rec = Record("quiet", 1, index, tid, len(corpus[tid]))
        rec.start_s = time.perf_counter() - started
        await one_request(client, "/synthesize", payload(corpus[tid]), rec)
        index += 1
        if rec.status == 429:
            refused += 1
            await asyncio.sleep(min(MAX_RETRY_AFTER_S, 1.0))  # the service's Retry-After is 1
            continue
        records.append(rec)
    return records, refused, time.perf_counter() - started


async def flood(
    client: httpx.AsyncClient, text: str, clients: int, stop: asyncio.Event
) -> dict[str, int]:
    """``clients`` callers sending ``text`` back to back until ``stop``; counts by status."""
    counts: dict[str, int] = {}

    async def one(i: int) -> None:
        n = 0
        while not stop.is_set():
            rec = Record("flood", clients, n, 0, len(text))
            n += 1
            await one_request(client, "/synthesize", payload(text), rec)
            key = str(rec.status) if rec.status is not None else (rec.error or "error")
            counts[key] = counts.get(key, 0) + 1
            if rec.status != 200:
                try:
                    await asyncio.wait_for(stop.wait(), FLOOD_BACKOFF_S)
                except asyncio.TimeoutError:
                    pass

    await asyncio.gather(*(one(i) for i in range(clients)))
    return counts


async def run(args: argparse.Namespace, server: Server, keys: dict[str, str],
              corpus: Sequence[str]) -> dict[str, Any]:  # fmt: skip
    rng = random.Random(args.seed)
    order = [rng.randrange(len(corpus)) for _ in range(1000)]
    long_text = " ".join(corpus[i] for i in order[:args.flood_lines])
    limits = httpx.Limits(max_connections=args.flood_clients + 8)

    def client(name: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=server.base_url, timeout=120, limits=limits,
                                 headers={"Authorization": f"Bearer {keys[name]}"},
                                 trust_env=False)  # fmt: skip

    async with client("quiet") as quiet, client("flood") as flooder:
        for tid in order[:4]:  # warm-up, unmeasured: every worker runs once
            await one_request(quiet, "/synthesize", payload(corpus[tid]), Record("w", 1, 0, 0, 0))
        print(f"  idle: quiet key alone for {args.seconds:.0f} s", file=sys.stderr)
        idle = await quiet_caller(quiet, corpus, order, args.seconds)
        stop = asyncio.Event()
        print(f"  flood: {args.flood_clients} clients of {len(long_text)} characters",
              file=sys.stderr)  # fmt: skip
        flooding = asyncio.create_task(flood(flooder, long_text, args.flood_clients, stop))
        await asyncio.sleep(args.flood_head_start)  # the flood takes the slots first
        loaded = await quiet_caller(quiet, corpus, order, args.seconds)
        stop.set()
        flood_counts = await flooding
    return {
        "idle": summarize(*idle),
        "flooded": summarize(*loaded),
        "flood_statuses": flood_counts,
        "flood_text_chars": len(long_text),
        "records": {
            "idle": [asdict(r) for r in idle[0]],
            "flooded": [asdict(r) for r in loaded[0]],
        },  # main moves these to the raw file
    }


def table(runs: dict[str, Any]) -> str:
    rows = [
        "| run | phase | ok | 429 | TTFA p50 ms | TTFA p95 ms | latency p95 ms | p95 vs idle |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, run in runs.items():
        idle = run["idle"]
        for phase in ("idle", "flooded"):
            s = run[phase]
            rows.append(
                f"| {label} | {phase} | {s['ok']} | {s['refused_429']} | {fmt(s['ttfa_p50_ms'])} "
                f"| {fmt(s['ttfa_p95_ms'])} | {fmt(s['latency_p95_ms'])} "
                f"| {fmt(ratio(s['latency_p95_ms'], idle['latency_p95_ms']), 2)}x |"
            )
        rows.append(f"| {label} | flood statuses | {run['flood_statuses']} | | | | | |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--label", default="after", help="name of this run in the JSON")
    p.add_argument("--engines-dir", type=Path, default=DEFAULT_ENGINES)
    p.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rpm", type=int, default=60, help="both keys' requests per minute")
    p.add_argument("--seconds", type=float, default=30.0, help="each phase's length")
    p.add_argument("--flood-clients", type=int, default=40)
    p.add_argument("--flood-lines", type=int, default=8, help="corpus lines per flood text")
    p.add_argument("--flood-head-start", type=float, default=3.0)
    p.add_argument("--seed", type=int, default=13)
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = p.parse_args(argv)
    corpus = load_corpus(args.corpus)
    ensure_default_voice(args.engines_dir, lambda m: print(m, file=sys.stderr))
    with tempfile.TemporaryDirectory() as tmp:
        keys = key_file(Path(tmp), args.rpm)
        server = Server(args.engines_dir, args.workers,
                        SERVER_LOG_DIR / "key_fairness_bench_server.log",
                        extra_args=["--api-keys-file", str(Path(tmp) / "keys"),
                                    "--metrics-port", "0"])  # fmt: skip
        try:
            server.wait_ready(lambda c: c.get("/health").status_code == 200
                              and server.worker_count() == args.workers,
                              timeout_s=READY_TIMEOUT_S, poll_timeout_s=1.0,
                              interval_s=0.2)  # fmt: skip
            result = asyncio.run(run(args, server, keys, corpus))
        finally:
            server.stop()
    previous: dict[str, Any] = {}
    if args.json.exists():
        previous = json.loads(args.json.read_text(encoding="utf-8")).get("runs", {})
    raw = write_raw(args.json.with_name(f"{args.json.stem}.{args.label}.json"),
                    result.pop("records"))  # fmt: skip
    result["raw_records"] = relative(raw)
    result["date"] = utc_timestamp()
    result["settings"] = {k: (relative(v) if isinstance(v, Path) else v)
                          for k, v in vars(args).items()}  # fmt: skip
    runs = {**previous, args.label: result}
    doc = {"machine": machine_info({}), "runs": runs}
    write_json(args.json, doc)
    print(table(runs))
    print(f"\nJSON: {relative(args.json)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Many voices: a worker's memory with 1, 2 and 4 voices held, and what loading one on demand costs.

Why this exists: a service that serves every voice under its engines directory must not grow
without bound as users mount voices, and a request for a voice its worker does not hold waits for
the load. This measures both against the real ``ttsvc serve`` (one worker, so every number is one
process) on loopback:

1. **Memory per worker**: for each count N in ``--counts``, an engines directory of N voices
   (the compiled default voice, and copies of it under other names: every Piper medium voice has
   the same architecture and size, so a copy weighs what another voice would), no memory budget.
   After start-up (every voice verified) and after one request to each voice (every voice held),
   the worker's RSS and PSS are read from ``/proc/<pid>/smaps_rollup``.
2. **Loads on demand**: on the largest directory with ``--budget-mb`` (room for two voices), the
   voices are asked for in turn, ``--rounds`` times over, so each request finds its voice evicted
   and the worker loads it first. Time to first audio of those requests is compared with
   requests whose voice is held, side by side in the same run; the worker's own load times are
   read from its ``voice_loaded`` log lines.

Run from the repository root::

    python benchmarks/voices_bench.py

It prints markdown tables and writes every number to ``results/voices_bench.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import onnxruntime as ort

from bench_common import (
    DEFAULT_ENGINES,
    RESULTS,
    SERVER_LOG_DIR,
    Server,
    fmt,
    machine_info,
    relative,
    utc_timestamp,
    write_json,
)
from memory_bench import memory_mb
from ttsvc.compile.build import ensure_default_voice

DEFAULT_JSON = RESULTS / "voices_bench.json"
READY_TIMEOUT_S = 240.0
TEXT = "A voice loaded on demand."
DET = {"noise_scale": 0.0, "noise_w": 0.0}


def voice_names(n: int, default: str) -> list[str]:
    """The default voice and ``n - 1`` copies' names."""
    return [default] + [f"en_US-copy{k}-medium" for k in range(1, n)]


def make_engines(root: Path, source: Path, names: Sequence[str]) -> None:
    """One engines directory with every named voice at version 1 (copies of ``source``)."""
    for name in names:
        shutil.copytree(source, root / name / "1")


def all_serving(client: httpx.Client, count: int) -> bool:
    """Every voice verified and served (``GET /voices``), and the pool ready."""
    if client.get("/health").status_code != 200:
        return False
    voices = client.get("/voices").json()["voices"]
    return len(voices) == count and all(v["state"] == "serving" for v in voices)


def ttfa_ms(client: httpx.Client, voice: str) -> float:
    """Time to the first audio byte of one streamed request, in ms."""
    started = time.perf_counter()
    with client.stream("POST", "/synthesize", json={"text": TEXT, "voice": voice, **DET}) as r:
        r.raise_for_status()
        first: float | None = None
        for chunk in r.iter_bytes():
            if first is None and chunk:
                first = time.perf_counter()
    assert first is not None
    return 1000 * (first - started)


def held(client: httpx.Client) -> list[str]:
    """Voices the worker holds now, from ``GET /voices``."""
    return [v["name"] for v in client.get("/voices").json()["voices"] if v["loaded_on"]]


def load_times(log_path: Path) -> list[float]:
    """The worker's own load times (ms) from its ``voice_loaded`` lines."""
    found = []
    for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines():
        if '"voice_loaded"' in line:
            found.append(float(json.loads(line)["load_ms"]))
    return found


def start(engines: Path, log_path: Path, count: int, budget_mb: float, cache: Path) -> Server:
    server = Server(engines, 1, log_path,
                    extra_args=["--metrics-port", "0", "--voice-memory-mb", str(budget_mb)],
                    env={"TTSVC_COMPILE_DEFAULT_VOICE": "0", "TTSVC_LOG_FORMAT": "json",
                         "TTSVC_ENGINE_CACHE_DIR": str(cache)})  # fmt: skip
    server.wait_ready(lambda c: all_serving(c, count), timeout_s=READY_TIMEOUT_S,
                      poll_timeout_s=2.0, interval_s=0.1)  # fmt: skip
    return server


def memory_rows(
    source: Path, default: str, counts: Sequence[int], temp: Path
) -> list[dict[str, Any]]:
    rows = []
    for count in counts:
        engines = temp / f"engines-{count}"
        names = voice_names(count, default)
        make_engines(engines, source, names)
        log_path = SERVER_LOG_DIR / f"voices_bench_{count}_server.log"
        server = start(engines, log_path, count, 0.0, temp / f"cache-{count}")
        try:
            (pid,) = server.worker_pids() or [0]
            with httpx.Client(base_url=server.base_url, timeout=120, trust_env=False) as client:
                at_start = memory_mb(pid)
                for name in names:
                    ttfa_ms(client, name)
                after = memory_mb(pid)
                holding = held(client)
            rows.append({"voices": count, "held": len(holding), "start": at_start,
                         "after_requests": after,
                         "gateway_rss_mb": memory_mb(server.proc.pid)["rss_mb"]})  # fmt: skip
            print(f"| {count} | {len(holding)} | {fmt(at_start['rss_mb'], 0)} / "
                  f"{fmt(at_start['pss_mb'], 0)} | {fmt(after['rss_mb'], 0)} / "
                  f"{fmt(after['pss_mb'], 0)} |", flush=True)  # fmt: skip
        finally:
            server.stop()
    return rows


def demand_loads(source: Path, default: str, count: int, budget_mb: float, rounds: int,
                 temp: Path) -> dict[str, Any]:  # fmt: skip
    engines = temp / "engines-budget"
    names = voice_names(count, default)
    make_engines(engines, source, names)
    log_path = SERVER_LOG_DIR / "voices_bench_budget_server.log"
    server = start(engines, log_path, count, budget_mb, temp / "cache-budget")
    cold: list[float] = []
    warm: list[float] = []
    peak: float = 0.0
    try:
        (pid,) = server.worker_pids() or [0]
        with httpx.Client(base_url=server.base_url, timeout=120, trust_env=False) as client:
            for _ in range(rounds):
                for name in names:
                    was_held = name in held(client)
                    (warm if was_held else cold).append(ttfa_ms(client, name))
                    warm.append(ttfa_ms(client, name))  # now held: the same request again
                    peak = max(peak, memory_mb(pid)["rss_mb"] or 0.0)
        loads = load_times(log_path)
    finally:
        server.stop()
    result = {"voices": count, "budget_mb": budget_mb, "rounds": rounds,
              "ttfa_cold_ms": cold, "ttfa_held_ms": warm, "worker_load_ms": loads,
              "peak_rss_mb": peak}  # fmt: skip
    med = statistics.median
    print("\n| requests | n | TTFA p50 ms | TTFA max ms |\n|---|---:|---:|---:|")
    for label, values in (("voice evicted: loaded first", cold), ("voice held", warm)):
        if values:
            print(f"| {label} | {len(values)} | {fmt(med(values))} | {fmt(max(values))} |")
    if loads:
        print(f"\nworker load times (ms): p50 {fmt(med(loads))}, max {fmt(max(loads))} "
              f"over {len(loads)} loads; peak worker RSS {fmt(peak, 0)} MB "
              f"with a {budget_mb:g} MB budget over {count} voices")  # fmt: skip
    return result


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines-dir", default=str(DEFAULT_ENGINES),
                   help="engine repository; the default voice is compiled here if missing")
    p.add_argument("--counts", default="1,2,4", help="voice counts to measure memory at")
    p.add_argument("--budget-mb", type=float, default=300.0,
                   help="memory budget of the on-demand part (two medium voices: about 280 MB)")
    p.add_argument("--rounds", type=int, default=3, help="rounds over every voice, on demand")
    p.add_argument("--json", default=str(DEFAULT_JSON), help="where to write every number")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    counts = [int(c) for c in args.counts.split(",") if c.strip()]
    version = ensure_default_voice(Path(args.engines_dir), lambda m: print(m, file=sys.stderr))
    info = machine_info({"onnxruntime": ort.__version__, "httpx": httpx.__version__})
    date = utc_timestamp()
    print(f"Voices benchmark — {info['cpu_model'] or info['machine']} ({info['cpu_count']} "
          f"CPUs), ONNX Runtime {info['onnxruntime']}, one worker, {date}\n")  # fmt: skip
    print("| voices | held | worker RSS / PSS MB at start | after one request each |")
    print("|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="voices-bench-") as tmp:
        temp = Path(tmp)
        memory = memory_rows(version.path, version.voice, counts, temp)
        demand = demand_loads(version.path, version.voice, max(counts), args.budget_mb,
                              args.rounds, temp)  # fmt: skip
    out = Path(args.json)
    write_json(out, {"date": date, "machine": info, "memory": memory, "on_demand": demand},
               indent=2)
    print(f"\nwrote {relative(out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

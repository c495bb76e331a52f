"""Hot-swap benchmark: how fast a changed engine serves, and what a swap costs callers under load.

Why this exists: the hot-swap tests (``tests/lifecycle/test_swapper.py``) prove that a swap is
correct (no dropped stream, no half-copied engine served), but not how long it takes or what it
does to latency. Operators change engines two ways (an atomic ``ttsvc compile`` publish, and the
in-place ``mv x.onnx x.onnx.bak; cp new.onnx x.onnx``), and the gateway must detect, settle, hash,
stage, canary and roll the candidate out worker by worker while it keeps serving. The issue asks
for two figures, measured here against the real ``ttsvc serve`` on loopback:

1. **Swap latency**: time from a completed change (right after the publish rename, or after the
   ``cp`` has finished and closed the file) to the first ``POST /synthesize`` response that
   carries the new ``x-engine-version``; and, beside it, until ``GET /voices`` reports the new
   label as current (the rollout has finished on every worker).
2. **TTFA during swaps under load**: a closed loop of 4 clients against 2 workers, once without
   swaps (run A) and once with an in-place swap every 2 seconds (run B); time to first audio
   percentiles of both runs and their ratio.

Candidate engines are made from the compiled default voice the way the tests make them: a
"variant" scales the largest float weight of ``acoustic.onnx`` (a different, valid model), so
every change is a real one and passes the canary. Every server runs on a private copy of the
engines in a temporary directory; the cached engines in ``benchmarks/.cache`` are never changed.

This is a benchmark, not a test: it prints markdown tables and writes every raw number to JSON.
Run from the repository root::

    python benchmarks/swap_bench.py
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from bench_common import (
    DEFAULT_CORPUS,
    DEFAULT_ENGINES,
    HOST,
    RESULTS,
    SERVER_LOG_DIR,
    Server,
    fmt,
    load_corpus,
    machine_info,
    markdown_table,
    pct,
    ratio,
    read_wav,
    relative,
    utc_timestamp,
    write_json,
    write_raw,
)
from ttsvc.compile.build import ensure_default_voice
from ttsvc.repository.layout import EngineRepository
from ttsvc.repository.manifest import file_entry, load_manifest, write_manifest

DEFAULT_JSON = RESULTS / "swap_bench.json"

VOICE = "en_US-joe-medium"
"""The packaged default voice, the one ``ensure_default_voice`` compiles."""
DET = {"noise_scale": 0.0, "noise_w": 0.0}
"""Deterministic synthesis: the same text gives the same audio in every run."""
PROBE_TEXT = "Swap probe."
"""A short text, so a probe response comes back quickly and probes follow each other closely."""
ACOUSTIC = "acoustic.onnx"
"""The engine file the candidates replace."""
PUBLISH_FACTORS = (1.001, 0.999)
"""Weight scales of the two variants published atomically (alternating)."""
IN_PLACE_FACTORS = (1.002, 0.998)
"""Weight scales of the two in-place variants: different from the published ones, so an in-place
copy never matches the manifest and the label is always ``<version>+<hash>``."""

READY_TIMEOUT_S = 180.0
"""How long a server gets to become ready (spawn workers, load engines) on a busy machine."""
POLL_TIMEOUT_S = 2.0
"""Socket timeout of one readiness or ``/voices`` probe: a probe must not hang."""
PROBE_TIMEOUT_S = 15.0
"""Timeout of one synthesize probe (a short text takes well under a second)."""
SWAP_DEADLINE_S = 150.0
"""Longest wait for one swap to become visible (the server's per-worker swap timeout is 120 s)."""
MAX_PROBES = 100_000
"""Upper bound on probes per swap, on top of the deadline."""
REQUEST_TIMEOUT_S = 30.0
"""Per-request timeout of the load clients."""
MAX_REQUESTS_PER_CLIENT = 100_000
"""Upper bound on requests per load client, on top of the run's deadline."""


# --------------------------------------------------------------------------- candidates


def make_variant(src: Path, dst: Path, factor: float) -> None:
    """A different but valid engine: its largest float weight scaled by ``factor``.

    Same construction as the hot-swap tests, so the canary accepts it and the swap is real.
    """
    model = onnx.load(str(src))
    init = max(
        (i for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT),
        key=lambda i: int(np.prod(i.dims)),
    )
    scaled = numpy_helper.to_array(init) * np.float32(factor)
    init.CopyFrom(numpy_helper.from_array(scaled.astype(np.float32), init.name))
    onnx.save(model, str(dst))


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def in_place_label(version_dir: Path, candidate: Path) -> str:
    """The label the gateway will give ``version_dir`` once ``candidate`` is copied over its
    acoustic engine: ``<version>+`` and the first 8 hex digits of the sha256 of the files' hashes
    (mirrors ``ttsvc.repository.cache.snapshot``). Used only to cross-check what is observed and
    to know when run B's last swap has landed."""
    manifest = load_manifest(version_dir)
    files = {name: entry.sha256 for name, entry in manifest.files.items()}
    files[ACOUSTIC] = sha256_file(candidate)
    if all(files[n] == manifest.files[n].sha256 for n in files):
        return str(manifest.version)
    combined = hashlib.sha256("".join(files[n] for n in sorted(files)).encode()).hexdigest()
    return f"{manifest.version}+{combined[:8]}"


def publish(engines: Path, replace: dict[str, Path]) -> tuple[int, float]:
    """Publish a new version the way ``ttsvc compile`` does: staging dir, manifest, one rename.

    Returns the version and ``perf_counter()`` right after the rename: the change is complete.
    """
    repo = EngineRepository(engines)
    latest = repo.latest(VOICE)
    if latest is None:
        raise RuntimeError(f"no version of {VOICE} under the temporary engines root")
    version = repo.next_version(VOICE)
    staging = repo.staging_dir(VOICE)
    for item in latest.path.iterdir():
        if item.name != "manifest.json" and not item.name.endswith(".bak"):
            shutil.copyfile(replace.get(item.name, item), staging / item.name)
    manifest = load_manifest(latest.path)
    manifest.version = version
    for name in replace:
        manifest.files[name] = file_entry(staging / name)
    write_manifest(staging, manifest)
    repo.publish(VOICE, staging, version)
    return version, time.perf_counter()


def mv_cp(version_dir: Path, name: str, new: Path) -> float:
    """The operators' habit: ``mv x x.bak; cp new x``. Returns ``perf_counter()`` after the copy
    has finished and the file is closed (``shutil.copyfile`` closes it before returning)."""
    (version_dir / name).rename(version_dir / f"{name}.bak")
    shutil.copyfile(new, version_dir / name)
    return time.perf_counter()


# --------------------------------------------------------------------------- server process


def start_server(engines: Path, cache: Path, workers: int, name: str) -> Server:
    """A server with a private engines root and engine cache.

    The engine cache goes into the run's temporary directory, so a killed server leaves nothing
    in /tmp; never compile: the engines root already has its version.
    """
    env = {"TTSVC_COMPILE_DEFAULT_VOICE": "0", "TTSVC_ENGINE_CACHE_DIR": str(cache)}
    log_path = SERVER_LOG_DIR / f"swap_bench_server_{name}.log"
    return Server(engines, workers, log_path, env=env)


def wait_ready(server: Server) -> float:
    """Probe ``/health`` and ``/voices`` until every worker is up; returns seconds waited."""

    def all_workers_up(client: httpx.Client) -> bool:
        health = client.get("/health")
        voices = client.get("/voices")
        workers = server.worker_count()
        return (health.status_code == 200 and voices.status_code == 200
                and workers in (None, server.workers))  # fmt: skip

    return server.wait_ready(
        all_workers_up, timeout_s=READY_TIMEOUT_S, poll_timeout_s=POLL_TIMEOUT_S, interval_s=0.1
    )


async def engines_state(client: httpx.AsyncClient) -> dict[str, Any]:
    """The serving label, reload counts and last error, from ``GET /voices``."""
    resp = await client.get("/voices", timeout=POLL_TIMEOUT_S)
    resp.raise_for_status()
    engines = resp.json()["voices"][0]["engines"]
    if not isinstance(engines, dict):
        raise RuntimeError(f"unexpected /voices answer: {resp.text[:200]}")
    return engines


async def wait_current(client: httpx.AsyncClient, label: str, deadline_s: float) -> bool:
    """Probe ``/voices`` until ``label`` is current (bounded by probes and a deadline)."""
    deadline = time.perf_counter() + deadline_s
    for _ in range(MAX_PROBES):
        if time.perf_counter() >= deadline:
            return False
        try:
            if (await engines_state(client)).get("current") == label:
                return True
        except httpx.HTTPError:
            pass
    return False


# --------------------------------------------------------------------------- 1: swap latency


@dataclass
class SwapRecord:
    """One timed change: what was changed, and when the new version was first seen."""

    method: str
    repeat: int
    expected: str
    previous: str
    first_response_ms: float | None = None
    """t0 (change complete) to the response headers of the first probe with the new label."""
    voices_ms: float | None = None
    """t0 to the first ``/voices`` answer with the new label as current."""
    probes: int = 0
    """Synthesize probes sent, including the one that saw the new label."""
    old_label_responses: int = 0
    probe_errors: int = 0
    observed: str | None = None
    error: str | None = None


async def time_swap(
    client: httpx.AsyncClient, change: Callable[[], float], rec: SwapRecord
) -> None:
    """Make the change, then probe ``/synthesize`` and ``/voices`` side by side until both
    show ``rec.expected``. Both loops are bounded by a deadline and a probe count."""
    t0 = change()
    deadline = t0 + SWAP_DEADLINE_S

    async def synth_loop() -> None:
        for _ in range(MAX_PROBES):
            if time.perf_counter() >= deadline:
                rec.error = "no response with the new label before the deadline"
                return
            rec.probes += 1
            try:
                req = client.build_request(
                    "POST", "/synthesize", json={"text": PROBE_TEXT, **DET},
                    timeout=PROBE_TIMEOUT_S,
                )  # fmt: skip
                resp = await client.send(req, stream=True)
                t1 = time.perf_counter()
                try:
                    await resp.aread()
                finally:
                    await resp.aclose()
            except httpx.HTTPError:
                rec.probe_errors += 1
                continue
            label = resp.headers.get("x-engine-version")
            if resp.status_code != 200:
                rec.probe_errors += 1
            elif label == rec.expected:
                rec.first_response_ms = (t1 - t0) * 1000.0
                rec.observed = label
                return
            elif label == rec.previous:
                rec.old_label_responses += 1
            else:
                rec.observed = label  # an unexpected label: keep probing, but say so
        rec.error = rec.error or "probe limit reached"

    async def voices_loop() -> None:
        for _ in range(MAX_PROBES):
            if time.perf_counter() >= deadline:
                return
            try:
                state = await engines_state(client)
            except httpx.HTTPError:
                continue
            if state.get("current") == rec.expected:
                rec.voices_ms = (time.perf_counter() - t0) * 1000.0
                return

    await asyncio.gather(synth_loop(), voices_loop())


async def swap_latency(
    url: str, engines: Path, candidates: dict[str, list[Path]], repeats: int
) -> list[SwapRecord]:
    """Atomic publishes first, then in-place copies into the version they left serving.

    Each method alternates two variants, so every repeat changes the bytes; the next change is
    made only after ``/voices`` has reported the previous one as current (rollout finished).
    """
    records: list[SwapRecord] = []
    async with httpx.AsyncClient(base_url=url, timeout=PROBE_TIMEOUT_S, trust_env=False) as client:
        await warm(client, [PROBE_TEXT] * 4, 2)
        previous = str((await engines_state(client))["current"])
        for i in range(repeats):
            variant = candidates["publish"][i % 2]
            expected = str(EngineRepository(engines).next_version(VOICE))
            rec = SwapRecord("atomic publish", i + 1, expected, previous)
            await time_swap(client, lambda v=variant: publish(engines, {ACOUSTIC: v})[1], rec)
            records.append(rec)
            progress(rec)
            previous = expected
        latest = EngineRepository(engines).latest(VOICE)
        assert latest is not None
        for i in range(repeats):
            variant = candidates["in_place"][i % 2]
            expected = in_place_label(latest.path, variant)
            rec = SwapRecord("mv/cp in place", i + 1, expected, previous)
            await time_swap(client, lambda v=variant: mv_cp(latest.path, ACOUSTIC, v), rec)
            records.append(rec)
            progress(rec)
            previous = expected
    return records


def progress(rec: SwapRecord) -> None:
    """One stderr line per swap, so a long run shows where it is."""
    print(
        f"  {rec.method} #{rec.repeat}: {rec.previous} -> {rec.expected}: first response "
        f"{fmt(rec.first_response_ms)} ms, /voices {fmt(rec.voices_ms)} ms, {rec.probes} probes"
        + (f", ERROR {rec.error} (saw {rec.observed})" if rec.error else ""),
        file=sys.stderr,
    )


# --------------------------------------------------------------------------- 2: TTFA under load


@dataclass
class Request:
    """One load request as the client saw it."""

    run: str
    client: int
    text_index: int
    start_s: float = 0.0
    status: int | None = None
    ttfa_ms: float | None = None
    latency_ms: float | None = None
    pcm_bytes: int = 0
    label: str | None = None
    error: str | None = None


async def one_request(client: httpx.AsyncClient, text: str, rec: Request) -> None:
    """POST one text and time the first PCM byte after the WAV header (``read_wav``, as every
    benchmark does). Any non-200, exception or empty audio is an error; the engine label is
    kept."""
    sent = time.perf_counter()
    try:
        async with client.stream("POST", "/synthesize", json={"text": text, **DET}) as resp:
            rec.status = resp.status_code
            rec.label = resp.headers.get("x-engine-version")
            if resp.status_code != 200:
                await resp.aread()
                rec.error = f"http_{resp.status_code}"
                return
            got = await read_wav(resp, sent)
            rec.ttfa_ms = got.ttfa_ms
            rec.latency_ms = (time.perf_counter() - sent) * 1000.0
            rec.pcm_bytes = got.audio_bytes
            if rec.pcm_bytes == 0:
                rec.error = "no_audio"
    except httpx.HTTPError as exc:
        rec.error = f"{type(exc).__name__}: {exc}"[:200]


async def warm(client: httpx.AsyncClient, texts: Sequence[str], at_once: int) -> None:
    """Unmeasured requests first: the first ones pay arena growth and connection set-up."""
    for start in range(0, len(texts), at_once):
        batch = [Request("warmup", i, -1) for i in range(min(at_once, len(texts) - start))]
        await asyncio.gather(*(one_request(client, texts[start + r.client], r) for r in batch))
        bad = [r.error for r in batch if r.error]
        if bad:
            print(f"  warm-up errors: {bad}", file=sys.stderr)


@dataclass
class SwapEvent:
    """One in-place change made during run B."""

    at_s: float
    label: str


async def load_run(
    client: httpx.AsyncClient,
    run: str,
    corpus: Sequence[str],
    concurrency: int,
    seconds: float,
    seed: int,
    swap: Callable[[int], str] | None,
    interval_s: float,
) -> tuple[list[Request], list[SwapEvent], float]:
    """Closed loop: ``concurrency`` clients send back to back until ``seconds`` have passed.

    With ``swap``, a background task makes change ``k`` (in a thread, so copying does not stall
    the clients' event loop) every ``interval_s`` seconds: load pacing, not synchronization.
    Both runs draw texts with the same seed, so they send the same sequence per client.
    """
    records: list[Request] = []
    events: list[SwapEvent] = []
    started = time.perf_counter()
    deadline = started + seconds

    async def client_loop(cid: int) -> None:
        rng = random.Random(seed * 1009 + cid)
        for _ in range(MAX_REQUESTS_PER_CLIENT):
            if time.perf_counter() >= deadline:
                return
            tid = rng.randrange(len(corpus))
            rec = Request(run, cid, tid, start_s=time.perf_counter() - started)
            await one_request(client, corpus[tid], rec)
            records.append(rec)

    async def swap_loop() -> None:
        assert swap is not None
        for k in range(int(seconds / interval_s) + 1):
            next_at = started + (k + 1) * interval_s
            if next_at >= deadline:
                return
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            label = await asyncio.to_thread(swap, k)
            events.append(SwapEvent(time.perf_counter() - started, label))

    tasks = [client_loop(cid) for cid in range(concurrency)]
    if swap is not None:
        tasks.append(swap_loop())
    await asyncio.gather(*tasks)
    return records, events, time.perf_counter() - started


async def ttfa_runs(
    url: str, engines: Path, candidates: list[Path], corpus: Sequence[str], args: argparse.Namespace
) -> dict[str, Any]:
    """Run A (no swaps) then run B (an in-place swap every ``--swap-interval`` s) on one server."""
    version_dir = EngineRepository(engines).latest(VOICE)
    assert version_dir is not None
    vdir = version_dir.path
    labels = [in_place_label(vdir, c) for c in candidates]

    def swap(k: int) -> str:
        mv_cp(vdir, ACOUSTIC, candidates[k % 2])
        return labels[k % 2]

    limit = args.concurrency + 4
    limits = httpx.Limits(max_connections=limit, max_keepalive_connections=limit)
    timeout = httpx.Timeout(REQUEST_TIMEOUT_S, connect=10.0)
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(
        base_url=url, limits=limits, timeout=timeout, trust_env=False
    ) as client:
        rng = random.Random(args.seed - 1)
        await warm(client, [corpus[rng.randrange(len(corpus))] for _ in range(8)], 2)
        for run in ("A", "B"):
            before = await engines_state(client)
            print(f"  run {run}: {args.seconds:.0f} s, c={args.concurrency}"
                  + (f", swap every {args.swap_interval:g} s" if run == "B" else ""),
                  file=sys.stderr)  # fmt: skip
            records, events, wall = await load_run(
                client, run, corpus, args.concurrency, args.seconds, args.seed,
                swap if run == "B" else None, args.swap_interval,
            )  # fmt: skip
            after = await engines_state(client)
            settled = True
            if events:  # let the last change land so the server is not stopped mid-swap
                settled = await wait_current(client, events[-1].label, SWAP_DEADLINE_S)
            final = await engines_state(client)
            out[run] = {
                "records": records,
                "events": events,
                "wall_s": wall,
                "reloads_before": before.get("reloads", {}),
                "reloads_at_end": after.get("reloads", {}),
                "reloads_settled": final.get("reloads", {}),
                "last_change_settled": settled,
                "last_error": final.get("last_error"),
            }
    return out


# --------------------------------------------------------------------------- statistics, output


def swap_summary(records: Sequence[SwapRecord]) -> list[dict[str, Any]]:
    """Median, p90 and max of both swap latencies per method."""
    out = []
    for method in dict.fromkeys(r.method for r in records):
        rows = [r for r in records if r.method == method]
        first = [r.first_response_ms for r in rows if r.first_response_ms is not None]
        voices = [r.voices_ms for r in rows if r.voices_ms is not None]
        out.append({
            "method": method,
            "repeats": len(rows),
            "seen": len(first),
            "first_response_p50_ms": pct(first, 50),
            "first_response_p90_ms": pct(first, 90),
            "first_response_max_ms": max(first) if first else None,
            "voices_p50_ms": pct(voices, 50),
            "voices_p90_ms": pct(voices, 90),
            "voices_max_ms": max(voices) if voices else None,
            "probes_p50": pct([float(r.probes) for r in rows], 50),
            "old_label_responses": sum(r.old_label_responses for r in rows),
            "probe_errors": sum(r.probe_errors for r in rows),
            "errors": [r.error for r in rows if r.error],
        })  # fmt: skip
    return out


def swap_table(summary: Sequence[dict[str, Any]]) -> str:
    """Markdown: one row per method."""
    return markdown_table(
        ["method", "seen/repeats", "first new-version response ms: median / p90 / max",
         "/voices current ms: median / p90 / max", "probes median", "probe errors"],
        "lrrrrr",
        (
            [s["method"], f"{s['seen']}/{s['repeats']}",
             f"{fmt(s['first_response_p50_ms'])} / {fmt(s['first_response_p90_ms'])} / "
             f"{fmt(s['first_response_max_ms'])}",
             f"{fmt(s['voices_p50_ms'])} / {fmt(s['voices_p90_ms'])} / {fmt(s['voices_max_ms'])}",
             fmt(s["probes_p50"], 0), str(s["probe_errors"])]
            for s in summary
        ),
    )  # fmt: skip


def labels_served(ok: Sequence[Request]) -> dict[str, int]:
    """How many ok requests each engine label served: shows run B really spanned versions."""
    counts: dict[str, int] = {}
    for r in ok:
        counts[str(r.label)] = counts.get(str(r.label), 0) + 1
    return dict(sorted(counts.items()))


def load_summary(run: str, data: dict[str, Any]) -> dict[str, Any]:
    """Requests, errors, TTFA percentiles and swaps of one load run."""
    records: list[Request] = data["records"]
    ok = [r for r in records if r.error is None]
    ttfa = [r.ttfa_ms for r in ok if r.ttfa_ms is not None]
    base = int(data["reloads_before"].get("ok", 0))
    return {
        "run": run,
        "swaps_made": len(data["events"]),
        "swaps_completed": int(data["reloads_at_end"].get("ok", 0)) - base,
        "swaps_completed_after_settle": int(data["reloads_settled"].get("ok", 0)) - base,
        "rejected": int(data["reloads_settled"].get("rejected", 0))
        - int(data["reloads_before"].get("rejected", 0)),
        "requests": len(records),
        "errors": len(records) - len(ok),
        "error_list": [
            f"client {r.client} at {r.start_s:.2f} s: {r.error}" for r in records if r.error
        ],
        "wall_s": data["wall_s"],
        "labels_served": labels_served(ok),
        "ttfa_p50_ms": pct(ttfa, 50),
        "ttfa_p95_ms": pct(ttfa, 95),
        "ttfa_p99_ms": pct(ttfa, 99),
        "ttfa_max_ms": max(ttfa) if ttfa else None,
        "last_change_settled": data["last_change_settled"],
        "last_error": data["last_error"],
    }


def load_table(summaries: Sequence[dict[str, Any]]) -> str:
    """Markdown: one row per run."""
    names = {"A": "A: no swaps", "B": "B: swap every interval"}
    return markdown_table(
        ["run", "swaps made / ok during load / ok after", "requests", "errors", "TTFA p50 ms",
         "TTFA p95 ms", "TTFA p99 ms", "TTFA max ms"],
        "lrrrrrrr",
        (
            [names[s["run"]],
             f"{s['swaps_made']} / {s['swaps_completed']} / {s['swaps_completed_after_settle']}",
             str(s["requests"]), str(s["errors"]), fmt(s["ttfa_p50_ms"]), fmt(s["ttfa_p95_ms"]),
             fmt(s["ttfa_p99_ms"]), fmt(s["ttfa_max_ms"])]
            for s in summaries
        ),
    )  # fmt: skip


# --------------------------------------------------------------------------- driver


def build_arg_parser() -> argparse.ArgumentParser:
    """Command-line flags; defaults reproduce the issue's measurement."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--engines-dir",
        type=Path,
        default=DEFAULT_ENGINES,
        help="cached engines (copied, never changed); compiled here if missing",
    )
    p.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    p.add_argument("--repeats", type=int, default=5, help="swaps timed per method")
    p.add_argument("--workers", type=int, default=2, help="worker processes per server")
    p.add_argument("--concurrency", type=int, default=4, help="load clients in runs A and B")
    p.add_argument("--seconds", type=float, default=20.0, help="duration of each load run")
    p.add_argument("--swap-interval", type=float, default=2.0, help="seconds between swaps in B")
    p.add_argument("--seed", type=int, default=1234, help="seed of the load's text draw")
    p.add_argument("--skip-latency", action="store_true", help="only runs A and B")
    p.add_argument("--skip-load", action="store_true", help="only the swap latency")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    return p  # fmt: skip


def fresh_root(temp: Path, source: Path, name: str) -> tuple[Path, Path]:
    """A private engines root (a copy of the cached version as version 1) and engine cache."""
    engines = temp / name / "engines"
    shutil.copytree(source, engines / VOICE / "1")
    return engines, temp / name / "cache"


def run_server(engines: Path, cache: Path, workers: int, name: str,
               body: Callable[[str], Any]) -> tuple[Any, dict[str, Any]]:  # fmt: skip
    """Start a server, run ``body(url)`` against it, always stop it; returns the body's result."""
    print(f"{name}: starting server ({workers} workers)", file=sys.stderr)
    server = start_server(engines, cache, workers, name)
    info: dict[str, Any] = {"name": name, "log": relative(server.log_path)}
    try:
        info["ready_s"] = wait_ready(server)
        print(f"  ready in {info['ready_s']:.1f} s", file=sys.stderr)
        return body(server.base_url), info
    finally:
        info["exit_code"] = server.stop()
        print(f"  server stopped (exit {info['exit_code']})", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Build candidates, time the swaps, run the two loads, print the tables, write the JSON."""
    args = build_arg_parser().parse_args(argv)
    if args.repeats < 1 or args.workers < 1 or args.concurrency < 1:
        raise SystemExit("--repeats, --workers and --concurrency must be at least 1")
    if args.seconds <= 0 or args.swap_interval <= 0:
        raise SystemExit("--seconds and --swap-interval must be positive")
    corpus = load_corpus(args.corpus)
    info = machine_info(
        {"onnxruntime": ort.__version__, "httpx": httpx.__version__, "numpy": np.__version__},
        with_cpu_model=False,
    )
    date = utc_timestamp()
    version = ensure_default_voice(Path(args.engines_dir), lambda m: print(m, file=sys.stderr))

    swap_records: list[SwapRecord] = []
    load: dict[str, Any] = {}
    servers: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="swap-bench-") as tmp:
        temp = Path(tmp)
        cand_dir = temp / "candidates"
        cand_dir.mkdir()
        source = version.path / ACOUSTIC
        candidates: dict[str, list[Path]] = {"publish": [], "in_place": []}
        for kind, factors in (("publish", PUBLISH_FACTORS), ("in_place", IN_PLACE_FACTORS)):
            for factor in factors:
                dst = cand_dir / f"acoustic-{kind}-{factor}.onnx"
                make_variant(source, dst, factor)
                candidates[kind].append(dst)
        if not args.skip_latency:
            engines, cache = fresh_root(temp, version.path, "latency")
            swap_records, srv = run_server(
                engines, cache, args.workers, "latency",
                lambda url, e=engines: asyncio.run(
                    swap_latency(url, e, candidates, args.repeats)),
            )  # fmt: skip
            servers.append(srv)
        if not args.skip_load:
            engines, cache = fresh_root(temp, version.path, "load")
            load, srv = run_server(
                engines, cache, args.workers, "load",
                lambda url, e=engines: asyncio.run(
                    ttfa_runs(url, e, candidates["in_place"], corpus, args)),
            )  # fmt: skip
            servers.append(srv)

    swaps = swap_summary(swap_records)
    loads = [load_summary(run, data) for run, data in load.items()]
    by_run = {s["run"]: s for s in loads}
    ratios = {}
    if "A" in by_run and "B" in by_run:
        ratios = {
            "p50_B_over_A": ratio(by_run["B"]["ttfa_p50_ms"], by_run["A"]["ttfa_p50_ms"]),
            "p99_B_over_A": ratio(by_run["B"]["ttfa_p99_ms"], by_run["A"]["ttfa_p99_ms"]),
        }

    processor = info["processor"] or info["machine"]
    print(
        f"Swap benchmark — machine: {processor} ({info['cpu_count']} CPUs), "
        f"Python {info['python']}, ONNX Runtime {info['onnxruntime']}, "
        f"workers {args.workers}, {date}"
    )
    if swaps:
        print()
        print(f"Swap latency (t0 = change complete; {args.repeats} repeats per method)")
        print()
        print(swap_table(swaps))
        for s in swaps:
            for err in s["errors"]:
                print(f"- {s['method']}: {err}")
    if loads:
        print()
        print(
            f"TTFA under load (c={args.concurrency}, {args.seconds:g} s per run, 20–60-character "
            f"texts; B: an in-place mv/cp swap every {args.swap_interval:g} s)"
        )
        print()
        print(load_table(loads))
        if ratios:
            print()
            print(f"B/A: TTFA p50 ×{fmt(ratios['p50_B_over_A'], 2)}, "
                  f"TTFA p99 ×{fmt(ratios['p99_B_over_A'], 2)}")  # fmt: skip
        for s in loads:
            for err in s["error_list"]:
                print(f"- run {s['run']} error: {err}")

    out = Path(args.json)
    raw = write_raw(out, [asdict(r) for d in load.values() for r in d["records"]])
    payload = {
        "benchmark": "swap_bench",
        "date": date,
        "machine": info,
        "engine_version": version.version,
        "settings": {
            "repeats": args.repeats,
            "workers": args.workers,
            "concurrency": args.concurrency,
            "seconds": args.seconds,
            "swap_interval_s": args.swap_interval,
            "seed": args.seed,
            "corpus": relative(args.corpus),
            "engines_dir": relative(args.engines_dir),
            "host": HOST,
            "probe_text": PROBE_TEXT,
            "request_body": DET,
            "publish_factors": PUBLISH_FACTORS,
            "in_place_factors": IN_PLACE_FACTORS,
        },
        "servers": servers,
        "swap_latency": {"summary": swaps, "records": [asdict(r) for r in swap_records]},
        "load": {
            "summary": loads,
            "ratios": ratios,
            "swap_events": {run: [asdict(e) for e in d["events"]] for run, d in load.items()},
            "raw_records": relative(raw),
        },
    }
    write_json(out, payload, allow_nan=False)
    print(f"\nwrote {relative(out)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

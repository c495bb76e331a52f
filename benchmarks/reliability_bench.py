"""Reliability benchmark: what hostile text, a shutdown and a frozen worker do to the service.

Why this exists: the latency benchmarks only ever send well-formed prompts to healthy workers.
This one measures the four failure paths the service must survive, each against the real thing:

1. **poison**: the texts that crashed espeak-ng (``ttsvc.text.poison``, with their harmless
   neighbours) sent one at a time to a real ``ttsvc serve``; per text the answer (HTTP code, error
   type, audio seconds) and whether the worker was replaced; worker deaths from the server log.
2. **fuzz**: seeded random texts (few-symbol alphabets of letters, dots, spaces, punctuation,
   other scripts, suffixes and abbreviations; long runs of one shape) through ttsvc's
   ``normalize`` and ``split_sentences`` into the *raw* ``piper_phonemize.phonemize_espeak``, the
   path the guards protect, each text in a forked child so a segfault is counted, not fatal.
3. **drain**: SIGTERM to a server with ``--drain-grace G`` while one long stream runs, with the
   client reading and with a client that stops reading; how long the server takes to exit, its
   exit code, ERROR lines in its log, and how the stream ended.
4. **frozen**: SIGSTOP every worker, then requests at a few offsets after the stop; how long each
   took to be answered and how; then SIGCONT and a clean stop.

Each section is bounded in count (texts, graces, offsets) and in time (no new item after
``--section-seconds``; every request has a timeout). It prints markdown tables and writes summaries
(not per-request dumps) to JSON, merging into the sections an earlier run left there; it never
fails on a figure. Run from the repository root::

    python benchmarks/reliability_bench.py --only poison,fuzz --workers 1
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import multiprocessing
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx

from bench_common import (
    DEFAULT_ENGINES,
    HOST,
    RESULTS,
    SERVER_LOG_DIR,
    STOP_TIMEOUT_S,
    WAV_HEADER_BYTES,
    Server,
    chosen_sections,
    fmt,
    machine_info,
    relative,
    run_sections,
    sections_parser,
    utc_timestamp,
)
from ttsvc.compile.build import ensure_default_voice
from ttsvc.config import Settings
from ttsvc.text.normalize import normalize
from ttsvc.text.poison import NEIGHBOURS, POISON
from ttsvc.text.segment import split_sentences

DEFAULT_JSON = RESULTS / "reliability_bench.json"
SECTIONS = ("poison", "fuzz", "drain", "frozen")
READY_TIMEOUT_S = 240.0
POLL_TIMEOUT_S = 2.0
SERVER_ENV = {"TTSVC_COMPILE_DEFAULT_VOICE": "0"}
DEFAULT_MAX_SENTENCE_CHARS = int(Settings.model_fields["max_sentence_chars"].default)
ESPEAK_VOICE = "en-us"
"""The default voice's espeak-ng voice: what the workers phonemize with."""
SHOWN_CRASHERS = 5
REPR_CHARS = 120

FUZZ_PIECES = [
    *"aabbeisxyzAQZ", *".....", " ", " ", *"'''’,;:!?-_()\"19", "é", "ж", "中", "𝐚", "ø", "q̃", "ß",
    "İ", "ﬁ", "ness", "less", "ment", "s'", "'s", "ing", "un", "re", "e.g.", "Dr.", "St.", "a.m.",
    "U.S.",
]  # fmt: skip
"""What fuzz texts are made of; repeats weight a piece. Each text draws 1-5 pieces, so long runs
of one shape come out, as an attacker types them; without a space a text is one long token."""
FUZZ_MIN_CHARS, FUZZ_MAX_CHARS = 20, 1200

DRAIN_TEXT = "This long answer keeps the only worker busy well past the drain grace. " * 50
"""Minutes of audio: the stream is still running when the grace ends."""
DRAIN_RATE = 48000
"""Resampled to 48 kHz the stream is more bytes, so a client that stops reading fills its socket
buffers (and blocks the server's writes) within the first seconds."""
SMALL_RCVBUF = 4096
FROZEN_TEXT = "Anyone there?"


# --------------------------------------------------------------------------- pure helpers


def fuzz_texts(seed: int, count: int) -> list[str]:
    """``count`` random texts of 20-1200 characters, the same for the same seed: half drawn piece
    by piece, half one short unit repeated (the shapes that overflowed espeak-ng were all
    repeats)."""
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        pieces = rng.sample(FUZZ_PIECES, rng.randint(1, 5))
        n = rng.randint(FUZZ_MIN_CHARS, FUZZ_MAX_CHARS)
        if rng.random() < 0.5:
            unit = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 4)))
            text = unit * max(1, n // len(unit))
        else:
            text = "".join(rng.choice(pieces) for _ in range(n))[:n]
        texts.append(text)
    return texts


def log_events(lines: Iterable[str], event: str) -> int:
    """Lines of a JSON log whose ``event`` is ``event`` (a substring test: it never fails on a
    line that is not JSON, such as a traceback)."""
    needle = f'"event": "{event}"'
    return sum(needle in line for line in lines)


def error_lines(lines: Iterable[str]) -> list[str]:
    """Log lines at level error, and traceback starts: what an operator's alerting would see."""
    return [ln for ln in lines if '"level": "error"' in ln or ln.startswith("Traceback")]


def wav_audio_s(body: bytes) -> float:
    """Seconds of 16-bit mono audio in a streamed WAV (its header's sample rate)."""
    if len(body) < WAV_HEADER_BYTES or body[:4] != b"RIFF":
        return 0.0
    rate = int.from_bytes(body[24:28], "little")
    return (len(body) - WAV_HEADER_BYTES) / 2 / rate if rate else 0.0


def shown(text: str) -> str:
    """A text as a table cell or JSON value: repr, cut to ``REPR_CHARS``."""
    r = repr(text)
    return r if len(r) <= REPR_CHARS else r[: REPR_CHARS - 1] + "…"


def float_list(spec: str) -> list[float]:
    """``"0.2,3,6"`` → ``[0.2, 3.0, 6.0]``."""
    return [float(x) for x in spec.split(",") if x.strip()]


def signal_name(code: int) -> str:
    """A child's exit: ``SIGSEGV`` for a signal (negative code), else ``exit N``."""
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit {code}"


# --------------------------------------------------------------------------- servers


def read_log(server: Server) -> list[str]:
    return server.log_path.read_text(encoding="utf-8", errors="replace").splitlines()


def start_server(args: argparse.Namespace, name: str, extra: Sequence[str] = (),
                 env: dict[str, str] | None = None) -> Server:  # fmt: skip
    """A server on loopback with no metrics listener (no fixed port to collide on), ready when
    ``/health`` says so and every worker has logged READY."""
    server = Server(args.engines_dir, args.workers, SERVER_LOG_DIR / f"reliability_{name}.log",
                    extra_args=["--metrics-port", "0", *extra],
                    env={**SERVER_ENV, **(env or {})})  # fmt: skip
    try:
        wait_serving(server)
    except BaseException:
        server.stop()
        raise
    return server


def wait_serving(server: Server) -> None:
    """Bounded: the server's own ``wait_ready`` (polls, and notices a crashed server at once)."""
    server.wait_ready(
        lambda c: (c.get("/health").status_code == 200
                   and server.worker_count() == server.workers
                   and log_events(read_log(server), "worker_ready") >= server.workers),
        timeout_s=READY_TIMEOUT_S, poll_timeout_s=POLL_TIMEOUT_S, interval_s=0.1,
    )  # fmt: skip


def post(client: httpx.Client, text: str, **extra: Any) -> dict[str, Any]:
    """One request, read to its end: code, error type, audio seconds, seconds to the end."""
    sent = time.perf_counter()
    out: dict[str, Any] = {"code": None, "type": None, "audio_s": 0.0}
    try:
        with client.stream("POST", "/synthesize", json={"text": text, **extra}) as resp:
            body = resp.read()
            out["code"] = resp.status_code
            if resp.status_code == 200:
                out["audio_s"] = round(wav_audio_s(body), 2)
            else:
                try:
                    out["type"] = resp.json().get("type")
                except ValueError:
                    out["type"] = "not JSON"
    except httpx.HTTPError as exc:
        out["type"] = f"transport: {type(exc).__name__}"
    out["seconds"] = round(time.perf_counter() - sent, 2)
    return out


# --------------------------------------------------------------------------- sections


def run_poison(args: argparse.Namespace) -> dict[str, Any]:
    env = {}
    if args.max_sentence_chars is not None:
        env["TTSVC_MAX_SENTENCE_CHARS"] = str(args.max_sentence_chars)
    corpus = [("poison", n, t) for n, t in POISON.items()]
    corpus += [("neighbour", n, t) for n, t in NEIGHBOURS.items()]
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    server = start_server(args, "poison", env=env)
    try:
        with httpx.Client(base_url=server.base_url, timeout=args.timeout,
                          trust_env=False) as client:  # fmt: skip
            print("| group | text | chars | code | error type | audio s | s | worker deaths |")
            print("|---|---|---:|---:|---|---:|---:|---:|")
            for group, name, text in corpus:
                if time.perf_counter() - started > args.section_seconds:
                    print(f"- time budget spent: {len(corpus) - len(rows)} texts not sent")
                    break
                deaths = log_events(read_log(server), "worker_died")
                row = {"group": group, "name": name, "chars": len(text), **post(client, text)}
                # deaths logged from this send until the pool serves again; the supervisor may
                # kill a stalled worker well after its request was answered, so a death can show
                # on a later text than its cause (the summary's total is exact)
                wait_serving(server)
                row["worker_deaths"] = log_events(read_log(server), "worker_died") - deaths
                rows.append(row)
                print(f"| {group} | {name} | {row['chars']} | {row['code']} "
                      f"| {row['type'] or ''} | {fmt(row['audio_s'])} | {fmt(row['seconds'])} "
                      f"| {row['worker_deaths']} |", flush=True)  # fmt: skip
    finally:
        exit_code = server.stop()
    log = read_log(server)
    summary = {
        "texts": len(rows),
        "worker_died_lines": log_events(log, "worker_died"),
        "codes": count_by(rows, lambda r: str(r["code"])),
        "error_lines": len(error_lines(log)),
        "server_exit_code": exit_code,
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(f"\nworker_died lines in the log: {summary['worker_died_lines']}; "
          f"codes {summary['codes']}; ERROR lines {summary['error_lines']}\n")  # fmt: skip
    max_chars = args.max_sentence_chars or DEFAULT_MAX_SENTENCE_CHARS
    return {"summary": summary, "rows": rows, "max_sentence_chars": max_chars}


def count_by(rows: Iterable[dict[str, Any]],
             key: Callable[[dict[str, Any]], str]) -> dict[str, int]:  # fmt: skip
    """How many rows per ``key(row)``, keys sorted."""
    out: dict[str, int] = {}
    for row in rows:
        out[key(row)] = out.get(key(row), 0) + 1
    return dict(sorted(out.items()))


def _fuzz_child(text: str, max_chars: int, guarded: bool) -> None:
    """In the forked child: the service's path into espeak-ng, minus the process it runs in
    (``guarded=False`` leaves out ``normalize`` and its guards: the control that shows the fuzz
    finds crashes at all)."""
    from piper_phonemize import phonemize_espeak  # noqa: PLC0415 - loaded by the parent already

    for piece in split_sentences(normalize(text) if guarded else text, max_chars):
        phonemize_espeak(piece, ESPEAK_VOICE)


def run_fuzz(args: argparse.Namespace) -> dict[str, Any]:
    # loaded and warmed here, once: every fork inherits espeak-ng's data instead of reading it
    from piper_phonemize import phonemize_espeak  # noqa: PLC0415 - only this section needs it

    phonemize_espeak("warm up", ESPEAK_VOICE)
    max_chars = args.max_sentence_chars or DEFAULT_MAX_SENTENCE_CHARS
    texts = fuzz_texts(args.seed, args.fuzz_texts)
    ctx = multiprocessing.get_context("fork")
    outcomes: dict[str, int] = {}
    failures: list[dict[str, Any]] = []
    started = time.perf_counter()
    ran = 0
    for text in texts:
        if time.perf_counter() - started > args.section_seconds:
            break
        child = ctx.Process(target=_fuzz_child, args=(text, max_chars, not args.fuzz_unguarded))
        child.start()
        child.join(args.fuzz_timeout)
        if child.exitcode is None:
            child.kill()
            child.join()
            outcome = "hang"
        else:
            outcome = "ok" if child.exitcode == 0 else signal_name(child.exitcode)
        ran += 1
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        if outcome != "ok":
            failures.append({"outcome": outcome, "chars": len(text), "text": shown(text)})
    seconds = time.perf_counter() - started
    crashes = sum(n for k, n in outcomes.items() if k.startswith("SIG") or k.startswith("signal"))
    summary = {"texts": ran, "planned": len(texts), "crashes": crashes,
               "failures": len(failures), "outcomes": dict(sorted(outcomes.items())),
               "seconds": round(seconds, 1), "max_sentence_chars": max_chars,
               "seed": args.seed, "normalized": not args.fuzz_unguarded}  # fmt: skip
    print("| texts | normalized | ok | crashes (signal) | other failures | s "
          "| max sentence chars | seed |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    print(f"| {ran} | {'no' if args.fuzz_unguarded else 'yes'} | {outcomes.get('ok', 0)} "
          f"| {crashes} | {len(failures) - crashes} | {fmt(seconds)} | {max_chars} "
          f"| {args.seed} |")  # fmt: skip
    for f in failures[:SHOWN_CRASHERS]:
        print(f"- {f['outcome']}, {f['chars']} chars: {f['text']}")
    print()
    return {"summary": summary, "first_failures": failures[:SHOWN_CRASHERS]}


def drain_once(args: argparse.Namespace, grace: float, reading: bool) -> dict[str, Any]:
    """One server, one long stream, SIGTERM after its first bytes."""
    mode = "reading" if reading else "not reading"
    server = start_server(args, f"drain_{grace:g}_{'read' if reading else 'noread'}",
                          extra=["--drain-grace", str(grace)])  # fmt: skip
    try:
        conn = http.client.HTTPConnection(HOST, server.port, timeout=args.timeout)
        if not reading:  # a tiny receive window: the server's writes block almost at once
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_RCVBUF)
            sock.settimeout(args.timeout)
            sock.connect((HOST, server.port))
            conn.sock = sock
        body = json.dumps({"text": DRAIN_TEXT, "sample_rate": DRAIN_RATE})
        conn.request("POST", "/synthesize", body=body,
                     headers={"content-type": "application/json"})  # fmt: skip
        resp = conn.getresponse()
        received = len(resp.read1(65536))
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        exit_code: int | None = None
        if not reading:
            exit_code = wait_exit(server, grace)
        end = "complete"
        try:
            while chunk := resp.read1(65536):
                received += len(chunk)
        except (http.client.HTTPException, OSError) as exc:
            end = f"cut ({type(exc).__name__})"
        client_s = time.monotonic() - t0
        if reading:
            exit_code = wait_exit(server, grace)
        exit_s = time.monotonic() - t0
        conn.close()
    finally:
        server.stop()
    errors = error_lines(read_log(server))
    audio_s = max(0, received - WAV_HEADER_BYTES) / 2 / DRAIN_RATE
    row = {"grace_s": grace, "client": mode, "exit_after_s": round(exit_s, 2),
           "exit_code": exit_code, "error_lines": len(errors),
           "first_error": errors[0][:300] if errors else None, "stream_end": end,
           "stream_end_after_s": round(client_s, 2),
           "audio_s_received": round(audio_s, 2)}  # fmt: skip
    print(f"| {grace:g} | {mode} | {fmt(exit_s, 2)} | {exit_code} | {len(errors)} | {end} "
          f"| {fmt(client_s, 2)} | {fmt(row['audio_s_received'])} |", flush=True)  # fmt: skip
    return row


def wait_exit(server: Server, grace: float) -> int | None:
    """The drained server's exit code; None if it outlives grace + the usual stop bound."""
    try:
        return server.proc.wait(timeout=grace + STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None


def run_drain(args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    started = time.perf_counter()
    print("| grace s | client | exit after SIGTERM s | exit code | ERROR lines | stream end "
          "| stream end after s | audio s received |")
    print("|---:|---|---:|---:|---:|---|---:|---:|")
    for grace in float_list(args.drain_graces):
        for reading in (True, False):
            if time.perf_counter() - started > args.section_seconds:
                print("- time budget spent")
                break
            rows.append(drain_once(args, grace, reading))
    print()
    return {"rows": rows, "text_chars": len(DRAIN_TEXT), "sample_rate": DRAIN_RATE}


def run_frozen(args: argparse.Namespace) -> dict[str, Any]:
    offsets = sorted(float_list(args.frozen_offsets))
    server = start_server(args, "frozen")
    rows: list[dict[str, Any]] = []
    stopped: list[int] = []
    try:
        with httpx.Client(base_url=server.base_url, timeout=args.timeout,
                          trust_env=False) as client:  # fmt: skip
            post(client, "Warm up.")
            stopped = server.worker_pids() or []
            t0 = time.monotonic()
            for pid in stopped:
                os.kill(pid, signal.SIGSTOP)

            def probe(offset: float) -> None:
                # pacing, not synchronization: the offsets are what is measured against
                time.sleep(max(0.0, t0 + offset - time.monotonic()))
                rows.append({"offset_s": offset, **post(client, FROZEN_TEXT)})

            threads = [threading.Thread(target=probe, args=(o,)) for o in offsets]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass  # killed by the supervisor for its silence, as it should be
        exit_code = server.stop()
    rows.sort(key=lambda r: r["offset_s"])
    print("| sent after SIGSTOP s | answered after s | code | error type |")
    print("|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['offset_s']:g} | {fmt(r['seconds'], 2)} | {r['code']} | {r['type'] or ''} |")
    log = read_log(server)
    summary = {"workers_stopped": len(stopped), "worker_died_lines": log_events(log, "worker_died"),
               "error_lines": len(error_lines(log)), "server_exit_code": exit_code}  # fmt: skip
    print(f"\nworkers stopped {len(stopped)}; worker_died lines {summary['worker_died_lines']}; "
          f"ERROR lines {summary['error_lines']}; server exit code {exit_code}\n")  # fmt: skip
    return {"summary": summary, "rows": rows}


# --------------------------------------------------------------------------- main


def build_arg_parser() -> argparse.ArgumentParser:
    p = sections_parser(__doc__, SECTIONS, DEFAULT_ENGINES)
    p.add_argument("--workers", type=int, default=1, help="worker processes of each server")
    p.add_argument("--max-sentence-chars", type=int, default=None,
                   help="TTSVC_MAX_SENTENCE_CHARS for the poison server and fuzz's split "
                        f"(default: the service's, {DEFAULT_MAX_SENTENCE_CHARS})")
    p.add_argument("--fuzz-texts", type=int, default=2000, help="random texts in the fuzz section")
    p.add_argument("--fuzz-timeout", type=float, default=30.0,
                   help="seconds one fuzz child may take before it counts as a hang")
    p.add_argument("--fuzz-unguarded", action="store_true",
                   help="control run: fuzz texts skip normalize (and its espeak-ng guards)")
    p.add_argument("--seed", type=int, default=1234, help="seed of the fuzz texts")
    p.add_argument("--drain-graces", default="2", help="--drain-grace values, comma-separated")
    p.add_argument("--frozen-offsets", default="0.2,3,6,8,12",
                   help="seconds after SIGSTOP at which each probe is sent, comma-separated")
    p.add_argument("--timeout", type=float, default=300.0, help="per-request timeout, seconds")
    p.add_argument("--section-seconds", type=float, default=900.0,
                   help="time budget of one section: no new text, grace or server after it")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    return p  # fmt: skip


RUNNERS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "poison": run_poison, "fuzz": run_fuzz, "drain": run_drain, "frozen": run_frozen,
}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    only = chosen_sections(args.only, SECTIONS)
    if args.workers < 1 or args.fuzz_texts < 0:
        raise SystemExit("--workers must be at least 1, --fuzz-texts at least 0")
    info = machine_info({"httpx": httpx.__version__,
                         "piper_phonemize": version("piper-phonemize-fix")})  # fmt: skip
    if set(only) & {"poison", "drain", "frozen"}:
        ensure_default_voice(Path(args.engines_dir), lambda m: print(m, file=sys.stderr))
    print(f"Reliability benchmark — {info['cpu_model'] or info['machine']} "
          f"({info['cpu_count']} CPUs), {args.workers} worker(s), {utc_timestamp()}\n")
    settings = {k: (relative(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    run_sections(args.json, "reliability_bench", info,
                 {name: functools.partial(RUNNERS[name], args) for name in SECTIONS}, only,
                 settings)  # fmt: skip
    print(f"wrote {relative(args.json)}", file=sys.stderr)
    return 0

if __name__ == "__main__":
    sys.exit(main())

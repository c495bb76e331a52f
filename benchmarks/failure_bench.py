"""Failure benchmark: bad engine versions at start, worker deaths, Wyoming abuse, counting,
worker memory and engine file trust (issue 25); phoneme floods, log lines through a pipe, a
hostile voice catalogue, idle WebSockets and rollbacks (issue 36); each against a real
``ttsvc serve`` (or ``ttsvc voices pull``) on loopback.

Why this exists: the reliability benchmark covers hostile text, the drain and frozen workers;
this one measures the failures of issues 25 and 36, so that each can be compared before and after a
change (run it from a checkout of each, or with ``PYTHONPATH`` naming another ``src``):

1. **badstart**: the default voice's newest version matches its manifest but cannot serve
   (random bytes as ``acoustic.onnx``, a manifest built for ``aarch64``, a silent vocoder);
   over ``--observe-s`` seconds: worker deaths, when ``/health`` first said ok, the version a
   request was served by, the rejection ``GET /voices`` shows, and log lines that are not JSON.
2. **deaths**: the gateway's threads and open file descriptors before and after
   ``--kills`` worker kills (SIGKILL, each waited on until the replacement is READY).
3. **wyoming**: a ``payload_length`` of ``--payload-mb`` sent in full, malformed JSON,
   ``--sockets`` sockets stalled mid-header and as many idle ones; the gateway's RSS and file
   descriptors, what the client was told, how many sockets stayed open.
4. **counting**: uploads aborted mid-body, an empty text while every slot is busy, the
   ``X-Request-Id`` of a 422, a NaN speed: the codes and types the service records and answers.
5. **memory**: each worker's data-size limit and ``oom_score_adj`` against the gateway's.
6. **files**: a world-writable engine file, a file owned by another user, a voice directory
   that is a symlink out of the engines root: which version (or voice) serves.

And those of issue 36:

7. **phonemes**: an SSML ``phoneme`` of ``--phoneme-symbols`` symbols under one word, sent
   ``--floods`` times: what the client is told, how long it took, the worker's memory and
   whether it was replaced, an ordinary request meanwhile.
8. **logpipe**: the service's output through a real pipe (``serve 2>&1 | cat > log``) while
   ``--pipe-workers`` workers and the gateway write under ``--pipe-streams`` closed-loop streams
   for ``--pipe-s`` seconds: the lines that are not one JSON object.
9. **catalogue**: ``ttsvc voices pull`` against a loopback catalogue whose keys are paths
   (``../../../rel/pwned-voice``; a good key whose entry's own ``key`` is a path) and one that
   redirects a file to another origin over plain http: the exit code, what was written outside
   the engines directory, whether the other origin was asked, and the error line.
10. **websockets**: ``--idle-sockets`` idle WebSockets, split between ``/synthesize/stream``
    and ElevenLabs' ``multi-stream-input``, against a server with a short idle timeout
    (``--ws-idle-s``, set through the environment so that older checkouts run too): how many
    were admitted and how the rest were refused, the gateway's open descriptors and RSS before,
    with and after them, and how many the idle timeout closed within it and ``--ws-margin-s``.

It prints markdown tables and writes one JSON summary; it never fails on a figure. Run from
the repository root::

    python benchmarks/failure_bench.py --only badstart,deaths
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from bench_common import (
    DEFAULT_ENGINES,
    HOST,
    RESULTS,
    ROOT,
    SERVER_LOG_DIR,
    Server,
    chosen_sections,
    fmt,
    machine_info,
    markdown_table,
    relative,
    run_sections,
    sections_parser,
    utc_timestamp,
)
from bench_common.server import free_port
from ttsvc.compile.build import ensure_default_voice
from ttsvc.config import DEFAULT_VOICE

sys.path.insert(0, str(ROOT))  # the test suite's engine variants: one copy of how they are made
from tests.engine_files import publish, random_bytes, silent_vocoder, variant
from tests.voice_mirror import (
    MODEL_PATH,
    TEST_VOICE,
    Mirror,
    hostile_files,
    mirror_files,
    serve_mirror,
)

DEFAULT_JSON = RESULTS / "failure_bench.json"
SECTIONS = ("badstart", "deaths", "wyoming", "counting", "memory", "files", "phonemes",
            "logpipe", "catalogue", "websockets", "rollback")
BAD_STARTS = ("corrupt", "foreign", "silent")
SERVER_ENV = {"TTSVC_COMPILE_DEFAULT_VOICE": "0", "TTSVC_LOG_FORMAT": "json"}
READY_TIMEOUT_S = 240.0
LONG = "This answer keeps its worker busy for a good long while, sentence after sentence. " * 20


# --------------------------------------------------------------------------- helpers


def status_of(pid: int, field: str) -> int | None:
    """A number from ``/proc/<pid>/status`` (``VmRSS`` in kB, ``Threads``); None if gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def open_fds(pid: int) -> int | None:
    try:
        return sum(1 for _ in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return None


def log_lines(server: Server) -> list[str]:
    return server.log_path.read_text(encoding="utf-8", errors="replace").splitlines()


def events(server: Server, name: str | None = None) -> list[dict[str, Any]]:
    """The server's JSON log events (``name``: only those)."""
    found = []
    for line in log_lines(server):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and (name is None or event.get("event") == name):
            found.append(event)
    return found


def not_json(lines: Sequence[str]) -> list[str]:
    """Lines that do not parse as one JSON object (what Loki drops)."""
    bad = []
    for line in lines:
        try:
            ok = isinstance(json.loads(line), dict)
        except ValueError:
            ok = False
        if not ok:
            bad.append(line)
    return bad


def until(check: Callable[[], bool], timeout_s: float, server: Server | None = None) -> bool:
    """Whether ``check`` came true within ``timeout_s`` (blocking on the server in between)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, OSError):
            if check():
                return True
        if server is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.proc.wait(timeout=0.1)
                return False  # the server exited
        else:
            time.sleep(0.1)
    return False


def health(server: Server) -> int:
    return httpx.get(f"{server.base_url}/health", timeout=2).status_code


def default_voice_state(server: Server) -> dict[str, Any]:
    voices = httpx.get(f"{server.base_url}/voices", timeout=5).json()["voices"]
    entry = next(v for v in voices if v["name"] == DEFAULT_VOICE)
    return dict(entry)


@contextlib.contextmanager
def serving(engines: Path, name: str, workers: int, extra: Sequence[str] = (),
            ready: bool = True, pipe: bool = False,
            env: dict[str, str] | None = None) -> Iterator[Server]:  # fmt: skip
    server = Server(engines, workers, SERVER_LOG_DIR / f"failure_{name}.log",
                    extra_args=["--metrics-port", "0", *extra], env={**SERVER_ENV, **(env or {})},
                    pipe=pipe)  # fmt: skip
    try:
        if ready:
            server.wait_ready(lambda c: c.get("/health").status_code == 200
                              and server.worker_count() == workers,
                              timeout_s=READY_TIMEOUT_S, poll_timeout_s=2.0,
                              interval_s=0.1)  # fmt: skip
        yield server
    finally:
        server.stop()


def fresh_engines(args: argparse.Namespace, scratch: Path, name: str) -> Path:
    """An engines directory holding a copy of the default voice's serving version as 1."""
    source = ensure_default_voice(args.engines_dir, lambda m: print(m, file=sys.stderr))
    root = scratch / name
    shutil.copytree(source.path, root / DEFAULT_VOICE / "1")
    return root


def synth(server: Server, text: str = "Which version speaks?") -> tuple[int, str | None]:
    r = httpx.post(f"{server.base_url}/synthesize", json={"text": text, "stream": False},
                   timeout=60)  # fmt: skip
    return r.status_code, r.headers.get("x-engine-version")


# --------------------------------------------------------------------------- sections


def bad_version(engines: Path, case: str, scratch: Path) -> None:
    """Publish version 2 of the default voice, matching its manifest but unable to serve."""
    v1 = engines / DEFAULT_VOICE / "1"
    if case == "corrupt":
        size = (v1 / "acoustic.onnx").stat().st_size
        publish(engines, {"acoustic.onnx": random_bytes(scratch / "random.onnx", size)})
    elif case == "foreign":
        publish(engines, {}, runtime={"machine": "aarch64"})
    else:
        silent_vocoder(v1 / "vocoder.onnx", scratch / "silent.onnx")
        publish(engines, {"vocoder.onnx": scratch / "silent.onnx"})


def run_badstart(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    rows = []
    for case in BAD_STARTS:
        engines = fresh_engines(args, scratch, f"badstart-{case}")
        bad_version(engines, case, scratch)
        with serving(engines, f"badstart_{case}", 2, ready=False) as server:
            started = time.monotonic()
            ready_s = None
            deadline = started + args.observe_s
            while time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError):
                    if ready_s is None and health(server) == 200:
                        ready_s = time.monotonic() - started
                with contextlib.suppress(subprocess.TimeoutExpired):
                    server.proc.wait(timeout=0.25)
                    break
            code, version = synth(server) if ready_s is not None else (None, None)
            state = default_voice_state(server)
            lines = log_lines(server)
            rows.append({
                "case": case, "ready_s": None if ready_s is None else round(ready_s, 1),
                "served_by": version, "code": code,
                "worker_deaths": len(events(server, "worker_died"))
                + len(events(server, "worker_start_failed")),
                "rejected": state["engines"]["rejected"],
                "log_lines": len(lines), "not_json": len(not_json(lines)),
            })  # fmt: skip
    print(markdown_table(
        ["newest version", f"worker exits in {args.observe_s:g} s", "ready after (s)",
         "served by", "rejection shown", "log lines not JSON"], "lrrlll",
        [[r["case"], str(r["worker_deaths"]), fmt(r["ready_s"]), str(r["served_by"]),
          "; ".join(f"v{x['version']}: {x['reason']}"[:60] for x in r["rejected"]) or "none",
          f"{r['not_json']} of {r['log_lines']}"] for r in rows]))  # fmt: skip
    return {"observe_s": args.observe_s, "cases": rows}


def run_deaths(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    engines = fresh_engines(args, scratch, "deaths")
    with serving(engines, "deaths", 2) as server:
        gateway = server.proc.pid
        before = {"threads": status_of(gateway, "Threads"), "fds": open_fds(gateway)}
        respawned = 0
        for _ in range(args.kills):
            pids = server.worker_pids() or []
            if not pids:
                break
            victim = pids[0]
            readies = len(events(server, "worker_ready"))
            os.kill(victim, signal.SIGKILL)
            if not until(lambda v=victim, n=readies: v not in (server.worker_pids() or [v])
                         and len(events(server, "worker_ready")) > n
                         and health(server) == 200, 120, server):  # fmt: skip
                break
            respawned += 1
        after = {"threads": status_of(gateway, "Threads"), "fds": open_fds(gateway)}
    print(markdown_table(["", "gateway threads", "gateway fds"], "lrr",
                         [["before", str(before["threads"]), str(before["fds"])],
                          [f"after {respawned} kills", str(after["threads"]),
                           str(after["fds"])]]))  # fmt: skip
    return {"kills": respawned, "before": before, "after": after}


def wyoming_send(port: int, data: bytes, read_s: float = 5.0) -> dict[str, Any]:
    """Send ``data`` on a new connection; what came back within ``read_s`` and how it ended."""
    out: dict[str, Any] = {"reply": None, "closed": False}
    with socket.create_connection((HOST, port), timeout=read_s) as sock:
        sock.sendall(data)
        chunks = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                chunks += chunk
            out["closed"] = True
        out["reply"] = chunks.split(b"\n", 1)[0].decode("utf-8", "replace")[:200] or None
        if b'"error"' in chunks:
            header = json.loads(chunks.split(b"\n", 1)[0])
            rest = chunks.split(b"\n", 1)[1]
            data_len = int(header.get("data_length") or 0)
            out["error"] = json.loads(rest[:data_len]) if data_len else header.get("data")
    return out


def huge_payload(port: int, megabytes: int, gateway: int) -> dict[str, Any]:
    """A header announcing ``megabytes`` of payload, then that many bytes, as fast as the
    server takes them; the gateway's peak RSS meanwhile."""
    header = json.dumps({"type": "synthesize", "data": {"text": "hi"},
                         "payload_length": megabytes << 20}).encode() + b"\n"  # fmt: skip
    sent = 0
    peak = status_of(gateway, "VmRSS") or 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.05):
            peak = max(peak, status_of(gateway, "VmRSS") or 0)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    block = bytes(1 << 20)
    started = time.monotonic()
    ended = "sent in full"
    try:
        with socket.create_connection((HOST, port), timeout=10) as sock:
            sock.sendall(header)
            while sent < megabytes << 20 and time.monotonic() - started < 60:
                sock.sendall(block)
                sent += len(block)
            with contextlib.suppress(OSError):
                sock.settimeout(3)
                sock.recv(1)
    except OSError as exc:
        ended = f"refused after {sent >> 20} MB ({type(exc).__name__})"
    done.set()
    sampler.join()
    return {"sent_mb": sent >> 20, "ended": ended, "peak_rss_mb": round(peak / 1024, 1)}


def stalled_sockets(port: int, count: int, payload: bytes, wait_s: float,
                    gateway: int) -> dict[str, Any]:  # fmt: skip
    """``count`` sockets that send ``payload`` (a header cut short, or nothing) and stall; how
    many the server still holds after one second and after ``wait_s``."""
    socks = []
    for _ in range(count):
        try:
            s = socket.create_connection((HOST, port), timeout=5)
        except OSError:
            break
        if payload:
            with contextlib.suppress(OSError):
                s.sendall(payload)
        socks.append(s)

    def is_open(s: socket.socket) -> bool:
        s.setblocking(False)
        try:
            while s.recv(65536):  # an error event first, where the server sent one
                pass
        except BlockingIOError:
            return True
        except OSError:
            pass
        return False

    def still_open() -> int:
        return sum(is_open(s) for s in socks)

    time.sleep(1.0)
    at_1s, fds_1s = still_open(), open_fds(gateway)
    time.sleep(max(0.0, wait_s - 1.0))
    result = {"opened": len(socks), "open_after_1s": at_1s, "gateway_fds_1s": fds_1s,
              f"open_after_{wait_s:g}s": still_open(), "gateway_fds_end": open_fds(gateway)}
    for s in socks:
        s.close()
    return result


def run_wyoming(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    engines = fresh_engines(args, scratch, "wyoming")
    port = free_port()
    with serving(engines, "wyoming", 1, ["--wyoming-port", str(port)]) as server:
        gateway = server.proc.pid
        start = {"rss_mb": round((status_of(gateway, "VmRSS") or 0) / 1024, 1),
                 "fds": open_fds(gateway)}  # fmt: skip
        payload = huge_payload(port, args.payload_mb, gateway)
        malformed = wyoming_send(port, b"{this is not json\n")
        stalled = stalled_sockets(port, args.sockets, b'{"type": "descr', args.stall_s, gateway)
        idle = stalled_sockets(port, args.sockets, b"", args.stall_s, gateway)
        end = {"rss_mb": round((status_of(gateway, "VmRSS") or 0) / 1024, 1),
               "fds": open_fds(gateway)}  # fmt: skip
        served = wyoming_send(port, b'{"type": "describe"}\n', read_s=2)
    rows = [
        ["gateway at start", f"RSS {start['rss_mb']} MB, {start['fds']} fds"],
        [f"payload_length {args.payload_mb} MB",
         f"{payload['ended']}; peak RSS {payload['peak_rss_mb']} MB"],
        ["malformed JSON", f"error event: {'error' in malformed}; closed: {malformed['closed']}"],
        *[[f"{args.sockets} sockets {kind}",
           f"{r['opened']} opened; held after 1 s: {r['open_after_1s']}, after "
           f"{args.stall_s:g} s: {r[f'open_after_{args.stall_s:g}s']}; gateway fds "
           f"{r['gateway_fds_1s']} -> {r['gateway_fds_end']}"]
          for kind, r in (("stalled mid-header", stalled), ("idle", idle))],
        ["gateway at end", f"RSS {end['rss_mb']} MB, {end['fds']} fds"],
        ["describe afterwards", "answered" if served["reply"] else "no answer"],
    ]  # fmt: skip
    print(markdown_table(["case", "outcome"], "ll", rows))
    return {"start": start, "payload": payload, "malformed": malformed, "stalled": stalled,
            "idle": idle, "end": end, "describe_after": bool(served["reply"])}  # fmt: skip


def aborted_upload(port: int) -> None:
    """Headers announcing a body, a part of it, then the connection closed."""
    with socket.create_connection((HOST, port), timeout=5) as sock:
        sock.sendall(b"POST /synthesize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                     b"\r\nContent-Length: 200\r\n\r\n{\"text\": \"abc")  # fmt: skip
        time.sleep(0.2)  # the server reads the headers and starts on the body


def run_counting(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    engines = fresh_engines(args, scratch, "counting")
    extra = ["--max-streams-per-worker", "1"]
    with serving(engines, "counting", 1, extra) as server:
        url = server.base_url
        for _ in range(args.aborts):
            aborted_upload(server.port)
        until(lambda: len(events(server, "request")) >= args.aborts, 10, server)
        aborts = [(e.get("code"), e.get("status")) for e in events(server, "request")]
        idle_empty = httpx.post(f"{url}/synthesize", json={"text": "   "}, timeout=30)
        busy: dict[str, Any] = {}
        with httpx.Client(timeout=60) as holder, holder.stream(
            "POST", f"{url}/synthesize", json={"text": LONG}
        ) as held:
            chunks = held.iter_raw()  # kept: a dropped iterator closes the stream
            next(chunks)  # the one slot is taken and streaming
            r = httpx.post(f"{url}/synthesize", json={"text": "   "}, timeout=30)
            busy = {"code": r.status_code, "type": r.json().get("type"),
                    "request_id": r.headers.get("x-request-id")}  # fmt: skip
        nan = httpx.post(f"{url}/synthesize", content=b'{"text": "hi", "speed": NaN}',
                         headers={"content-type": "application/json"}, timeout=30)  # fmt: skip
    result = {
        "aborted_uploads": aborts,
        "empty_idle": {"code": idle_empty.status_code, "type": idle_empty.json().get("type"),
                       "request_id": idle_empty.headers.get("x-request-id")},
        "empty_busy": busy,
        "nan_speed": {"code": nan.status_code, **nan.json()},
    }  # fmt: skip
    print(markdown_table(["case", "answer"], "ll", [
        [f"{args.aborts} uploads aborted mid-body", ", ".join(f"{c} {s}" for c, s in aborts)],
        ["whitespace text, idle", f"{idle_empty.status_code} {idle_empty.json().get('type')}; "
         f"X-Request-Id: {'yes' if idle_empty.headers.get('x-request-id') else 'no'}"],
        ["whitespace text, every slot busy", f"{busy['code']} {busy['type']}; X-Request-Id: "
         f"{'yes' if busy['request_id'] else 'no'}"],
        ["speed NaN", f"{nan.status_code} {nan.json().get('error')}"],
    ]))  # fmt: skip
    return result


def limit_of(pid: int, name: str) -> str | None:
    """A soft limit from ``/proc/<pid>/limits`` (``Max data size``)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
            if line.startswith(name):
                return line[len(name):].split()[0]
    return None


def oom_adj(pid: int) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(Path(f"/proc/{pid}/oom_score_adj").read_text())
    return None


def run_memory(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    engines = fresh_engines(args, scratch, "memory")
    with serving(engines, "memory", 2) as server:
        gateway = server.proc.pid
        rows = [{"process": "gateway", "data_limit": limit_of(gateway, "Max data size"),
                 "oom_score_adj": oom_adj(gateway)}]  # fmt: skip
        for pid in server.worker_pids() or []:
            rows.append({"process": "worker", "data_limit": limit_of(pid, "Max data size"),
                         "oom_score_adj": oom_adj(pid)})  # fmt: skip
    print(markdown_table(["process", "max data size (bytes)", "oom_score_adj"], "llr",
                         [[r["process"], str(r["data_limit"]), str(r["oom_score_adj"])]
                          for r in rows]))  # fmt: skip
    return {"processes": rows}


def run_files(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    rows = []
    for case in ("world-writable", "foreign-owned"):
        engines = fresh_engines(args, scratch, f"files-{case}")
        publish(engines, {})
        target = engines / DEFAULT_VOICE / "2" / "acoustic.onnx"
        if case == "world-writable":
            target.chmod(0o666)
        else:
            os.chown(target, 54321, 54321)
        with serving(engines, f"files_{case}", 1) as server:
            _code, version = synth(server)
            state = default_voice_state(server)
        rows.append({"case": case, "served_by": version,
                     "rejected": state["engines"]["rejected"]})  # fmt: skip
    engines = fresh_engines(args, scratch, "files-symlink")
    outside = scratch / "outside" / "en_US-elsewhere-medium"
    shutil.copytree(engines / DEFAULT_VOICE, outside)
    (engines / "en_US-elsewhere-medium").symlink_to(outside, target_is_directory=True)
    with serving(engines, "files_symlink", 1) as server:
        elsewhere: dict[str, Any] = {}

        def judged() -> bool:
            voices = httpx.get(f"{server.base_url}/voices", timeout=5).json()["voices"]
            elsewhere.update(next((v for v in voices if v["name"] == "en_US-elsewhere-medium"),
                                  {}))  # fmt: skip
            engines = elsewhere.get("engines", {})
            return bool(engines.get("current") or engines.get("rejected"))

        until(judged, 30, server)
    rows.append({"case": "voice dir symlinked out of the root",
                 "served_by": elsewhere.get("engines", {}).get("current"),
                 "rejected": elsewhere.get("engines", {}).get("rejected", [])})  # fmt: skip
    print(markdown_table(["case", "served by", "refusal"], "lll",
                         [[r["case"], str(r["served_by"]),
                           "; ".join(str(x.get("reason", x) if isinstance(x, dict) else x)
                                     for x in r["rejected"])[:80] or "none"]
                          for r in rows]))  # fmt: skip
    return {"cases": rows}


def run_phonemes(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """The phoneme flood: one ``phoneme`` of ``--phoneme-symbols`` symbols under one word,
    sent ``--floods`` times, two at a time, while a client asks for an ordinary sentence."""
    engines = fresh_engines(args, scratch, "phonemes")
    flood = ("<speak><phoneme alphabet='ipa' ph='" + "ʔ" * args.phoneme_symbols
             + "'>x</phoneme></speak>")  # fmt: skip
    with serving(engines, "phonemes", 1) as server:
        pids = server.worker_pids() or []
        rss_before = [status_of(pid, "VmRSS") for pid in pids]

        def one(_: int) -> dict[str, Any]:
            start = time.monotonic()
            r = httpx.post(f"{server.base_url}/synthesize", json={"text": flood, "stream": False},
                           timeout=120)  # fmt: skip
            body = r.json() if r.headers.get("content-type", "").startswith("application/json") \
                else {}  # fmt: skip
            return {"code": r.status_code, "type": body.get("type"), "error": body.get("error"),
                    "s": time.monotonic() - start}  # fmt: skip

        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(one, range(args.floods)))
            ordinary = synth(server)
        rss_after = [status_of(pid, "VmRSS") for pid in pids]
        same_workers = server.worker_pids() == pids
    codes: dict[str, int] = {}
    for a in answers:
        key = f"{a['code']} {a['type']}"
        codes[key] = codes.get(key, 0) + 1
    slowest = max(a["s"] for a in answers)
    result = {"symbols": args.phoneme_symbols, "floods": args.floods, "answers": codes,
              "first_error": answers[0]["error"], "slowest_s": round(slowest, 3),
              "ordinary_request": ordinary[0], "worker_rss_kb_before": rss_before,
              "worker_rss_kb_after": rss_after, "same_workers": same_workers}  # fmt: skip
    print(markdown_table(["case", "answer"], "ll", [
        [f"{args.floods} × phoneme of {args.phoneme_symbols} symbols",
         ", ".join(f"{n} × {k}" for k, n in codes.items())],
        ["error", str(answers[0]["error"])],
        ["slowest answer", f"{slowest:.2f} s"],
        ["ordinary sentence meanwhile", str(ordinary[0])],
        ["worker RSS before → after (MB)", ", ".join(
            f"{(b or 0) / 1024:.0f} → {(a or 0) / 1024:.0f}"
            for b, a in zip(rss_before, rss_after, strict=True))],
        ["workers unchanged", str(same_workers)],
    ]))  # fmt: skip
    return result


def run_logpipe(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """Log integrity through a pipe: ``serve --workers N 2>&1 | cat > log`` under
    ``--pipe-streams`` closed-loop streams for ``--pipe-s`` seconds; every line of the log must
    be one JSON object (Loki drops or garbles the others)."""
    engines = fresh_engines(args, scratch, "logpipe")
    sentences = ("Turn left at the next light.", "Your table is ready for you now.",
                 "It is ten past four in the afternoon.", "Please hold while I check.")
    served = refused = failed = 0
    lock = threading.Lock()
    with serving(engines, "logpipe", args.pipe_workers, pipe=True) as server:
        stop_at = time.monotonic() + args.pipe_s

        def caller(k: int) -> None:
            nonlocal served, refused, failed
            n = 0
            with httpx.Client(base_url=server.base_url, timeout=60) as client:
                while time.monotonic() < stop_at:
                    n += 1
                    body = {"text": sentences[(k + n) % len(sentences)], "format": "pcm"}
                    try:
                        with client.stream("POST", "/synthesize", json=body) as r:
                            r.read()
                            code = r.status_code
                    except httpx.HTTPError:
                        code = 0
                    with lock:
                        if code == 200:
                            served += 1
                        elif code in (429, 503):
                            refused += 1
                        else:
                            failed += 1

        threads = [threading.Thread(target=caller, args=(k,)) for k in range(args.pipe_streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    lines = [line for line in log_lines(server) if line.strip()]
    broken = not_json(lines)
    result = {"workers": args.pipe_workers, "streams": args.pipe_streams, "seconds": args.pipe_s,
              "requests_served": served, "refused": refused, "failed": failed,
              "lines": len(lines), "broken_lines": len(broken),
              "broken_examples": [b[:200] for b in broken[:3]]}  # fmt: skip
    print(markdown_table(["workers", "streams", "s", "served", "lines", "broken lines"], "rrrrrr",
                         [[str(args.pipe_workers), str(args.pipe_streams), fmt(args.pipe_s, 0),
                           str(served), str(len(lines)), str(len(broken))]]))  # fmt: skip
    return result


HOSTILE_KEY = "../../../rel/pwned-voice"
"""The catalogue key seen publishing ``<engines>/../../../rel/pwned-voice/1``."""
DECOY_KEY = "en_US-decoy-medium"
"""A good key whose entry's own ``key`` (the name a pull publishes under) is a path."""


def tree(root: Path, skip: Path | None = None) -> set[str]:
    """Every path under ``root`` (those under ``skip`` left out), relative to ``root``."""
    return {str(p.relative_to(root)) for p in root.rglob("*")
            if skip is None or not p.is_relative_to(skip)}  # fmt: skip


def voices_pull(base: str, engines: Path, name: str, timeout_s: float) -> dict[str, Any]:
    """``ttsvc voices pull NAME`` from ``base`` into ``engines``: its exit code and the last
    line it wrote on stderr (the error, when it failed)."""
    env = {k: v for k, v in os.environ.items() if k != "TTSVC_VOICES_URL"}
    cmd = [sys.executable, "-m", "ttsvc.cli", "voices", "pull", name, "--base-url", base,
           "--engines-dir", str(engines)]  # fmt: skip
    try:
        done = subprocess.run(cmd, cwd=engines.parent, env=env, capture_output=True, text=True,
                              timeout=timeout_s, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"exit": None, "error": f"still running after {timeout_s:.0f} s: killed"}
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return {"exit": done.returncode, "error": lines[-1] if lines else ""}


def catalogue_case(case: str, scratch: Path, mirror: Mirror, name: str, timeout_s: float,
                   other: Mirror | None = None) -> dict[str, Any]:  # fmt: skip
    """One pull in a directory of its own: the engines directory two levels down, and the
    directory a ``../../../`` download would land in made, so the old code's escape shows."""
    home = scratch / "catalogue" / case
    engines = home / "a" / "b" / "engines"
    (home / "a" / "rel").mkdir(parents=True)
    engines.parent.mkdir(parents=True, exist_ok=True)
    before = tree(home)
    asked = len(mirror.requests)
    result = voices_pull(mirror.base, engines, name, timeout_s)
    outside = sorted(tree(home, skip=engines) - before)
    return {"case": case, "name": name, **result, "written_outside": outside,
            "files_fetched": sum(p != "voices.json" for p in mirror.requests[asked:]),
            "other_origin_asked": None if other is None else len(other.requests),
            "published": sorted(tree(engines)) if engines.is_dir() else []}  # fmt: skip


def run_catalogue(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    timeout_s = args.pull_timeout_s
    rows: list[dict[str, Any]] = []
    files = hostile_files(hostile_files(mirror_files(), HOSTILE_KEY), DECOY_KEY,
                          entry_key="../decoy")  # fmt: skip
    with serve_mirror(Mirror(files)) as hostile:
        rows.append(catalogue_case("path key asked for by name", scratch, hostile, HOSTILE_KEY,
                                   timeout_s))  # fmt: skip
        rows.append(catalogue_case("good key, entry key a path", scratch, hostile, DECOY_KEY,
                                   timeout_s))  # fmt: skip
    with serve_mirror(Mirror(mirror_files())) as other, \
            serve_mirror(Mirror(mirror_files())) as redirecting:  # fmt: skip
        # another port of 127.0.0.1 is another origin: plain http, so not to be followed
        redirecting.redirects[MODEL_PATH] = f"{other.base}/{MODEL_PATH}"
        rows.append(catalogue_case("file redirected off-origin over http", scratch, redirecting,
                                   TEST_VOICE, timeout_s, other))  # fmt: skip
    print(markdown_table(
        ["case", "exit", "written outside engines", "other origin asked", "error line"], "lrrrl",
        [[r["case"], str(r["exit"]), str(len(r["written_outside"])),
          "–" if r["other_origin_asked"] is None else str(r["other_origin_asked"]),
          (r["error"] or "")[:110]] for r in rows]))  # fmt: skip
    for r in rows:
        if r["written_outside"]:
            print(f"  {r['case']}: wrote {', '.join(r['written_outside'][:6])}")
    return {"cases": rows}


WS_OPEN_CONCURRENCY = 64
"""Handshakes in flight at once while the idle sockets are opened (loopback: bounded, quick)."""
WS_OPEN_TIMEOUT_S = 10.0


def add_websockets_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--idle-sockets", type=int, default=1000,
                   help="idle WebSockets opened, half on /synthesize/stream, half on "
                   "ElevenLabs' multi-stream-input")
    p.add_argument("--ws-idle-s", type=float, default=10.0,
                   help="the server's --ws-idle-timeout in the websockets section (longer than "
                   "opening the sockets takes)")
    p.add_argument("--ws-margin-s", type=float, default=10.0,
                   help="how long past the idle timeout the sockets are watched for its close")


def raise_fd_limit(wanted: int) -> tuple[int, int]:
    """This process's soft descriptor limit raised to ``wanted`` (at most the hard limit), so
    it can hold the sockets, and the server started after it inherits it; (before, now)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return soft, resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def gateway_usage(pid: int) -> dict[str, Any]:
    return {"fds": open_fds(pid), "rss_mb": round((status_of(pid, "VmRSS") or 0) / 1024, 1)}


async def open_idle(urls: list[str]) -> tuple[list[tuple[str, ClientConnection, float]],
                                              dict[str, int]]:  # fmt: skip
    """Open one WebSocket per url, sending nothing; the admitted ones (route, socket, when it
    opened) and how the rest ended (an HTTP status, or the error's name)."""
    gate = asyncio.Semaphore(WS_OPEN_CONCURRENCY)
    admitted: list[tuple[str, ClientConnection, float]] = []
    refused: dict[str, int] = {}

    async def one(url: str) -> None:
        route = "stream" if url.endswith("/synthesize/stream") else "elevenlabs"
        async with gate:
            try:
                ws = await connect(url, open_timeout=WS_OPEN_TIMEOUT_S, ping_interval=None,
                                   close_timeout=1)  # fmt: skip
            except InvalidStatus as exc:
                how = f"HTTP {exc.response.status_code}"
                with contextlib.suppress(ValueError, TypeError):
                    how += f" {json.loads(exc.response.body or b'')['type']}"
                refused[how] = refused.get(how, 0) + 1
                return
            except (OSError, TimeoutError) as exc:  # EMFILE, a reset, a handshake that hung
                name = type(exc).__name__ + (f" errno {exc.errno}" if getattr(exc, "errno", None)
                                             else "")  # fmt: skip
                refused[name] = refused.get(name, 0) + 1
                return
        admitted.append((route, ws, time.monotonic()))

    await asyncio.gather(*(one(url) for url in urls))
    return admitted, refused


async def watch_closes(admitted: list[tuple[str, ClientConnection, float]], idle_s: float,
                       margin_s: float) -> dict[str, Any]:  # fmt: skip
    """Wait (at most each socket's idle timeout + ``margin_s`` from its opening) for the server
    to close each admitted socket; how many it closed, with which code, and after how long."""
    codes: dict[str, int] = {}
    after_s: list[float] = []

    async def one(ws: ClientConnection, opened: float) -> None:
        left = opened + idle_s + margin_s - time.monotonic()
        try:
            await asyncio.wait_for(ws.wait_closed(), max(left, 0.01))
        except TimeoutError:
            codes["still open"] = codes.get("still open", 0) + 1
            return
        code = ws.close_code
        reason = ws.close_reason or ""
        key = f"{code} idle" if reason.startswith("idle") else str(code)
        codes[key] = codes.get(key, 0) + 1
        after_s.append(time.monotonic() - opened)

    await asyncio.gather(*(one(ws, opened) for _route, ws, opened in admitted))
    after_s.sort()
    return {"codes": codes, "closed_after_s": {
        "min": round(after_s[0], 2) if after_s else None,
        "median": round(after_s[len(after_s) // 2], 2) if after_s else None,
        "max": round(after_s[-1], 2) if after_s else None}}  # fmt: skip


async def close_all(admitted: list[tuple[str, ClientConnection, float]]) -> None:
    await asyncio.gather(*(ws.close() for _route, ws, _opened in admitted),
                         return_exceptions=True)  # fmt: skip


def run_websockets(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    count = args.idle_sockets
    limits = raise_fd_limit(2 * count + 256)  # before the server starts: it inherits the limit
    engines = fresh_engines(args, scratch, "websockets")
    # the environment rather than the flag, so that a checkout from before the setting (which
    # ignores it) can be measured the same way
    idle = {"TTSVC_WS_IDLE_TIMEOUT_S": f"{args.ws_idle_s:g}"}
    with serving(engines, "websockets", 1, env=idle) as server:
        gateway = server.proc.pid
        base = f"ws://{HOST}:{server.port}"
        routes = [f"{base}/synthesize/stream",
                  f"{base}/v1/text-to-speech/{DEFAULT_VOICE}/multi-stream-input"
                  "?output_format=pcm_22050"]  # fmt: skip
        urls = [routes[i % 2] for i in range(count)]
        before = gateway_usage(gateway)
        loop = asyncio.new_event_loop()
        try:
            started = time.monotonic()
            admitted, refused = loop.run_until_complete(open_idle(urls))
            open_s = time.monotonic() - started
            held = gateway_usage(gateway)
            closes = loop.run_until_complete(watch_closes(admitted, args.ws_idle_s,
                                                          args.ws_margin_s))  # fmt: skip
            loop.run_until_complete(close_all(admitted))
        finally:
            loop.close()
        until(lambda: (open_fds(gateway) or 0) <= (before["fds"] or 0) + 2, 10, server)
        after = gateway_usage(gateway)
        idle_lines = len(events(server, "websocket_idle"))
    by_route = {r: sum(1 for route, _ws, _t in admitted if route == r)
                for r in ("stream", "elevenlabs")}  # fmt: skip
    closed_idle = sum(n for code, n in closes["codes"].items() if code.endswith("idle"))
    result = {
        "sockets": count, "fd_limit": {"before": limits[0], "now": limits[1]},
        "idle_timeout_s": args.ws_idle_s, "margin_s": args.ws_margin_s,
        "open_s": round(open_s, 2), "admitted": len(admitted), "admitted_by_route": by_route,
        "refused": refused, "closes": closes, "closed_by_idle": closed_idle,
        "idle_log_lines": idle_lines, "before": before, "with": held, "after": after,
    }  # fmt: skip
    window = f"{args.ws_idle_s:g} + {args.ws_margin_s:g} s"
    print(markdown_table(["case", "outcome"], "ll", [
        [f"{count} idle WebSockets (half per route)",
         f"opened in {open_s:.1f} s; admitted {len(admitted)} (stream {by_route['stream']}, "
         f"ElevenLabs {by_route['elevenlabs']})"],
        ["refused", ", ".join(f"{n} × {how}" for how, n in sorted(refused.items())) or "none"],
        ["gateway before", f"{before['fds']} fds, RSS {before['rss_mb']} MB"],
        ["gateway with them", f"{held['fds']} fds, RSS {held['rss_mb']} MB"],
        [f"closed by the server within {window}",
         ", ".join(f"{n} × {code}" for code, n in sorted(closes["codes"].items())) or "none"],
        ["closed after (s from opening)",
         f"min {fmt(closes['closed_after_s']['min'])}, median "
         f"{fmt(closes['closed_after_s']['median'])}, max {fmt(closes['closed_after_s']['max'])}"],
        ["websocket_idle log lines", str(idle_lines)],
        ["gateway after", f"{after['fds']} fds, RSS {after['rss_mb']} MB"],
    ]))  # fmt: skip
    return result


ROLLBACK_WAIT_S = 90.0
"""Most seconds any one step of the rollback section waits (a swap, the settle and canary of a
file replaced in place, the fallback)."""


def serving_label(server: Server) -> str | None:
    """The default voice's serving engine label, as ``GET /voices`` shows it."""
    label = default_voice_state(server)["engines"]["current"]
    return None if label is None else str(label)


def serves(server: Server, label: str, prefix: bool = False) -> bool:
    """Whether the default voice serves ``label`` (``prefix``: a label starting so)."""
    current = serving_label(server) or ""
    return current.startswith(label) if prefix else current == label


def requests_during(server: Server, stop: threading.Event, limit_s: float,
                    seen: list[tuple[int | None, str | None]]) -> None:  # fmt: skip
    """Short requests one after another until ``stop`` is set or ``limit_s`` passes (at most
    200): each one's status (None: no answer) and ``X-Engine-Version``."""
    deadline = time.monotonic() + limit_s
    while not stop.is_set() and time.monotonic() < deadline and len(seen) < 200:
        try:
            seen.append(synth(server, "Who speaks now?"))
        except httpx.HTTPError:
            seen.append((None, None))


def run_rollback(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    engines = fresh_engines(args, scratch, "rollback")
    voice_dir = engines / DEFAULT_VOICE
    original = voice_dir / "1" / "acoustic.onnx"
    other = scratch / "rollback-acoustic.onnx"
    variant(original, other, 1.001)  # a different, valid acoustic engine
    steps: list[str] = []
    with serving(engines, "rollback", 1) as server:
        for _ in range(args.rollback_versions):
            version = publish(engines, {})  # a renumbered copy of the newest version
            ok = until(functools.partial(serves, server, str(version)), ROLLBACK_WAIT_S, server)
            steps.append(f"published {version}: {'serving' if ok else 'not serving'}")
        replaced = version
        target = voice_dir / str(replaced) / "acoustic.onnx"
        tmp = target.with_name("acoustic.onnx.tmp")
        shutil.copyfile(other, tmp)
        tmp.replace(target)  # an in-place replacement, the serving version's file
        ok = until(functools.partial(serves, server, f"{replaced}+", True), ROLLBACK_WAIT_S,
                   server)  # fmt: skip
        steps.append(f"replaced a file of {replaced}: "
                     f"{serving_label(server) if ok else 'not serving'}")  # fmt: skip
        newest = publish(engines, {"acoustic.onnx": original})  # the manifest's own bytes again
        ok = until(functools.partial(serves, server, str(newest)), ROLLBACK_WAIT_S, server)
        steps.append(f"published {newest}: {'serving' if ok else 'not serving'}")
        before = len(events(server))
        seen: list[tuple[int | None, str | None]] = []
        stop = threading.Event()
        caller = threading.Thread(target=requests_during,
                                  args=(server, stop, ROLLBACK_WAIT_S, seen))  # fmt: skip
        caller.start()
        try:
            shutil.rmtree(voice_dir / str(newest))
            withdrawn = time.monotonic()
            until(lambda: not serves(server, str(newest)), ROLLBACK_WAIT_S, server)
            moved_s = time.monotonic() - withdrawn
            # past the settle window (5 s) and a canary: a late refusal or swap shows up here
            until(lambda: time.monotonic() - withdrawn > args.rollback_observe_s,
                  args.rollback_observe_s + 1, server)  # fmt: skip
        finally:
            stop.set()
            caller.join(timeout=ROLLBACK_WAIT_S)
        code, served_by = synth(server)
        state = default_voice_state(server)["engines"]
        after = [e for e in events(server)[before:] if e.get("event") in
                 ("engine_fallback", "engine_rejected", "engine_swapped")]  # fmt: skip
    failed = [s for s in seen if s[0] != 200]
    result = {
        "versions_published": args.rollback_versions + 1, "replaced_in_place": replaced,
        "withdrawn": newest, "steps": steps, "served_after": served_by, "code_after": code,
        "moved_after_s": round(moved_s, 2),
        "fallbacks": [{k: e.get(k) for k in ("from_version", "to_version", "reason", "skipped")}
                      for e in after if e["event"] == "engine_fallback"],
        "after_withdrawal": [{"event": e["event"], "engine_version": e.get("engine_version"),
                              "version": e.get("version"), "file": e.get("file"),
                              "reason": e.get("reason")} for e in after],
        "rejected_listed": state.get("rejected", []), "pending_listed": state.get("pending", []),
        "requests": len(seen), "failed_requests": len(failed),
        "labels_seen": sorted({label for _c, label in seen if label}),
    }  # fmt: skip
    print("\n".join(steps), file=sys.stderr)
    print(markdown_table(
        ["withdrawn", "served after", "fallback line", "logged after the withdrawal",
         "requests (failed)"], "llllr",
        [[str(newest), str(served_by),
          "; ".join(f"{f['from_version']} -> {f['to_version']}, skipped: "
                    f"{', '.join(f['skipped'] or []) or 'none'}"
                    for f in result["fallbacks"]) or "none",
          "; ".join(f"{e['event']} {e['engine_version'] or e['version']}"
                    for e in result["after_withdrawal"]) or "none",
          f"{len(seen)} ({len(failed)})"]]))  # fmt: skip
    return result


def rollback_options(p: argparse.ArgumentParser) -> None:
    """The rollback section's options (merge into ``build_arg_parser``)."""
    p.add_argument("--rollback-versions", type=int, default=4,
                   help="versions published (each waited on) before a file of the last one is "
                   "replaced in place; one more is then published and withdrawn")
    p.add_argument("--rollback-observe-s", type=float, default=12.0,
                   help="seconds watched after the withdrawal (past the 5 s settle window)")


# --------------------------------------------------------------------------- main


def build_arg_parser() -> argparse.ArgumentParser:
    p = sections_parser(__doc__, SECTIONS, DEFAULT_ENGINES)
    p.add_argument("--observe-s", type=float, default=30.0,
                   help="seconds each bad start is watched")
    p.add_argument("--kills", type=int, default=20, help="worker kills in the deaths section")
    p.add_argument("--payload-mb", type=int, default=300, help="the announced Wyoming payload")
    p.add_argument("--sockets", type=int, default=300, help="stalled (and idle) Wyoming sockets")
    p.add_argument("--stall-s", type=float, default=35.0,
                   help="how long the stalled and idle sockets are watched (past the header "
                   "timeout, 10 s, and the Wyoming idle timeout, 30 s)")
    p.add_argument("--aborts", type=int, default=5, help="uploads aborted mid-body")
    p.add_argument("--phoneme-symbols", type=int, default=3000,
                   help="symbols in the flood's one phoneme")
    p.add_argument("--floods", type=int, default=6, help="phoneme floods sent")
    p.add_argument("--pipe-workers", type=int, default=4, help="workers writing to the pipe")
    p.add_argument("--pipe-streams", type=int, default=64, help="closed-loop streams, logpipe")
    p.add_argument("--pipe-s", type=float, default=90.0, help="seconds of load, logpipe")
    p.add_argument("--pull-timeout-s", type=float, default=240.0,
                   help="the most one `ttsvc voices pull` of the catalogue section may take "
                   "(a pull the old code lets through compiles for real: 10 to 60 s)")
    add_websockets_arguments(p)
    rollback_options(p)
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    return p  # fmt: skip


RUNNERS: dict[str, Callable[[argparse.Namespace, Path], dict[str, Any]]] = {
    "badstart": run_badstart, "deaths": run_deaths, "wyoming": run_wyoming,
    "counting": run_counting, "memory": run_memory, "files": run_files,
    "phonemes": run_phonemes, "logpipe": run_logpipe, "catalogue": run_catalogue,
    "websockets": run_websockets, "rollback": run_rollback,
}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    only = chosen_sections(args.only, SECTIONS)
    info = machine_info({"httpx": httpx.__version__})
    import ttsvc  # noqa: PLC0415 - which checkout is measured

    print(f"Failure benchmark — {info['cpu_model'] or info['machine']} ({info['cpu_count']} "
          f"CPUs), {utc_timestamp()}, code: {Path(ttsvc.__file__).parent}\n")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="failure-bench-") as tmp:
        runners = {name: functools.partial(RUNNERS[name], args, Path(tmp)) for name in SECTIONS}
        run_sections(args.json, "failure_bench", info, runners, only)
    print(f"wrote {relative(args.json)}", file=sys.stderr)
    return 0

if __name__ == "__main__":
    sys.exit(main())

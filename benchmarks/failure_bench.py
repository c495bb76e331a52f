"""Failure benchmark: bad engine versions at start, worker deaths, Wyoming abuse, counting,
worker memory and engine file trust, each against a real ``ttsvc serve`` on loopback.

Why this exists: the reliability benchmark covers hostile text, the drain and frozen workers;
this one measures the failures of issue 25, so that each can be compared before and after a
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

It prints markdown tables and writes one JSON summary; it never fails on a figure. Run from
the repository root::

    python benchmarks/failure_bench.py --only badstart,deaths
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

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
from tests.engine_files import publish, random_bytes, silent_vocoder

DEFAULT_JSON = RESULTS / "failure_bench.json"
SECTIONS = ("badstart", "deaths", "wyoming", "counting", "memory", "files")
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
            ready: bool = True) -> Iterator[Server]:  # fmt: skip
    server = Server(engines, workers, SERVER_LOG_DIR / f"failure_{name}.log",
                    extra_args=["--metrics-port", "0", *extra], env=SERVER_ENV)  # fmt: skip
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
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    return p  # fmt: skip


RUNNERS: dict[str, Callable[[argparse.Namespace, Path], dict[str, Any]]] = {
    "badstart": run_badstart, "deaths": run_deaths, "wyoming": run_wyoming,
    "counting": run_counting, "memory": run_memory, "files": run_files,
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

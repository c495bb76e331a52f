"""A stream that cannot finish never looks finished; requests nobody waits for are not served.

Real `ttsvc serve` processes with real workers: workers are killed (SIGKILL) or frozen
(SIGSTOP) mid-stream, the server is drained past its grace, clients hang up while queued. Each
client kind (curl, httpx, the standard library's http.client) must see an error for a cut
stream, the server's log must say why in the request's completion line without ERROR lines,
and the metrics must count it as what it was.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.serving import Server, metric, wait_until
from ttsvc.repository.layout import EngineVersion

LONG = "This answer keeps its worker busy for a good long while, sentence after sentence. " * 30
"""About three minutes of audio: far longer than any test waits for."""


ONE_AT_A_TIME = ("--workers", "1", "--compute-threads", "1", "--realtime-load", "0.01",
                 "--overload", "queue")  # fmt: skip
"""One worker that admits one stream at a time: its one compute thread always takes a stream,
and a capacity share of 1 % has room for no second, which waits in the worker's queue (sent
there by ``--overload queue`` rather than refused at the gateway)."""

def _events(srv: Server) -> list[dict[str, object]]:
    return [json.loads(line) for line in srv.log_lines() if line.startswith("{")]


def _completions(srv: Server) -> list[dict[str, object]]:
    return [e for e in _events(srv) if e["event"] == "request"]


def _assert_quiet(srv: Server) -> None:
    """No ERROR line and no traceback: the completion lines already say what happened."""
    lines = srv.log_lines()
    assert not [line for line in lines if "Traceback" in line]
    loud = [e for e in _events(srv) if e.get("level") in ("error", "critical")]
    assert not loud, loud



def _until(srv: Server, predicate: Callable[[], bool], what: str) -> None:
    """Wait for ``predicate`` with a bounded number of probes, blocking on the server process
    between them (it must not exit meanwhile)."""
    wait_until(srv, predicate, bool, what)


# --- clients: each reads a first chunk, waits at the barrier, then reads to the end ---------


def _httpx_client(url: str, started: threading.Barrier, seen: dict[str, str]) -> None:
    with httpx.Client(base_url=url, timeout=120) as client:
        with client.stream("POST", "/synthesize", json={"text": LONG}) as r:
            assert r.status_code == 200
            pieces = r.iter_raw()
            assert next(pieces)
            started.wait(timeout=120)
            try:
                for _ in pieces:
                    pass
                seen["httpx"] = "complete"
            except httpx.RemoteProtocolError:
                seen["httpx"] = "incomplete"


def _stdlib_client(port: int, started: threading.Barrier, seen: dict[str, str]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", "/synthesize", body=json.dumps({"text": LONG}),
                     headers={"content-type": "application/json"})  # fmt: skip
        response = conn.getresponse()
        assert response.status == 200
        assert response.read1(65536)
        started.wait(timeout=120)
        try:
            while response.read1(65536):
                pass
            seen["http.client"] = "complete"
        except http.client.IncompleteRead:
            seen["http.client"] = "incomplete"
    finally:
        conn.close()


def _curl_client(url: str, started: threading.Barrier, seen: dict[str, str]) -> None:
    curl = shutil.which("curl")
    assert curl is not None
    proc = subprocess.Popen(
        [curl, "-sS", "-N", "-o", "-", "-H", "content-type: application/json",
         "-d", json.dumps({"text": LONG}), f"{url}/synthesize"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.read(44)  # blocks until the stream has begun
    started.wait(timeout=120)
    while proc.stdout.read(65536):
        pass
    code = proc.wait(timeout=60)
    # 18: "transfer closed with outstanding read data remaining"
    seen["curl"] = {0: "complete", 18: "incomplete"}.get(code, f"exit {code}")


def _streams_under_fault(
    srv: Server, fault: Callable[[], None]
) -> tuple[dict[str, str], httpx.Response]:
    """Three streaming clients and one ``stream: false`` request on the only worker; once all
    are under way, ``fault`` is applied. Returns what each client saw, and the whole-file
    response."""
    seen: dict[str, str] = {}
    clients: list[Callable[[threading.Barrier, dict[str, str]], None]] = [
        lambda b, s: _httpx_client(srv.url, b, s),
        lambda b, s: _stdlib_client(srv.port, b, s),
    ]
    if shutil.which("curl"):
        clients.append(lambda b, s: _curl_client(srv.url, b, s))
    started = threading.Barrier(len(clients) + 1)
    whole: list[httpx.Response] = []

    def buffered() -> None:
        with httpx.Client(base_url=srv.url, timeout=120) as client:
            whole.append(client.post("/synthesize", json={"text": LONG, "stream": False}))

    threads = [threading.Thread(target=buffered)]
    threads[0].start()
    threads += [threading.Thread(target=c, args=(started, seen)) for c in clients]
    for t in threads[1:]:
        t.start()
    started.wait(timeout=120)  # every stream has audio flowing
    _until(srv, lambda: (metric(srv, "ttsvc_streams_in_flight", worker="0"),
                         metric(srv, "ttsvc_streams_queued", worker="0")) == (len(clients) + 1, 0),
           "the whole-file request under way too")  # fmt: skip
    fault()
    for t in threads:
        t.join(timeout=120)
    assert len(seen) == len(clients) and len(whole) == 1, seen  # no client thread failed
    return seen, whole[0]


@pytest.mark.parametrize(
    ("sig", "reason"), [(signal.SIGKILL, "worker_died"), (signal.SIGSTOP, "stalled")]
)
def test_a_stream_whose_worker_dies_or_stalls_ends_as_an_error(
    default_version: EngineVersion, engines_root: Path, sig: signal.Signals, reason: str
) -> None:
    env = {  # a frozen worker is declared stalled (and killed) after 4 s without a message
        "TTSVC_WORKER_SILENCE_TIMEOUT_S": "4",
        "TTSVC_BALANCER_HEARTBEAT_TIMEOUT_S": "3",
    }
    srv = Server(engines_root, "--workers", "1", env=env)
    try:
        srv.wait_ready(1)
        (victim,) = srv.worker_pids()
        seen, whole = _streams_under_fault(srv, lambda: os.kill(victim, sig))
        assert seen and set(seen.values()) == {"incomplete"}, seen
        # the whole file was never sent: it is a 5xx with the error body, in words only
        assert whole.status_code == 503, whole.text
        body = whole.json()
        assert body["type"] == reason
        assert not re.search(r"\d", body["error"])  # no worker number, pid or exit code

        _until(srv, lambda: len(_completions(srv)) == len(seen) + 1, "every completion line")
        lines = _completions(srv)
        assert {(e["status"], e["code"]) for e in lines} == {(reason, 503)}, lines
        assert metric(srv, "ttsvc_aborted_streams_total", reason=reason) == len(seen)
        assert metric(srv, "ttsvc_requests_total", code="503", outcome=reason) == len(seen) + 1
        assert metric(srv, "ttsvc_requests_total", code="200", outcome=reason) == 0
        _until(srv, lambda: any(e["event"] == "worker_died" for e in _events(srv)), "the exit")
        died = [e for e in _events(srv) if e["event"] == "worker_died"]
        assert died[0]["exitcode"] == -9  # the detail stays in the log
        _assert_quiet(srv)
    finally:
        srv.stop()


def test_drain_past_its_grace_aborts_what_runs_and_exits_quietly(
    default_version: EngineVersion, engines_root: Path
) -> None:
    # one request at a time: one stream runs, two wait in the worker's queue
    srv = Server(engines_root, *ONE_AT_A_TIME, "--drain-grace", "1")
    srv.wait_ready(1)
    try:
        started = threading.Barrier(2)
        seen: dict[str, str] = {}
        running = threading.Thread(target=_stdlib_client, args=(srv.port, started, seen))
        running.start()
        started.wait(timeout=120)
        queued: list[httpx.Response] = []

        def wait_in_queue(stream: bool) -> None:
            with httpx.Client(base_url=srv.url, timeout=120) as client:
                queued.append(client.post("/synthesize", json={"text": "Me next.",
                                                               "stream": stream}))  # fmt: skip

        waiting = [threading.Thread(target=wait_in_queue, args=(s,)) for s in (True, False)]
        for t in waiting:
            t.start()
        _until(srv, lambda: metric(srv, "ttsvc_streams_queued", worker="0") == 2,
               "two requests queued")  # fmt: skip
        srv.proc.send_signal(signal.SIGTERM)
        for t in (running, *waiting):
            t.join(timeout=120)
        assert srv.proc.wait(timeout=60) == 0
        assert seen == {"http.client": "incomplete"}
        # not started: a 503 with the error body, for streams and whole files alike
        assert [(r.status_code, r.json()["type"]) for r in queued] == [(503, "shutdown")] * 2

        events = _events(srv)
        lines = [e for e in events if e["event"] == "request"]
        assert {(e["status"], e["code"]) for e in lines} == {("shutdown", 503)}, lines
        assert len(lines) == 3
        drained = [e for e in events if e["event"] == "drained"]
        assert drained and drained[0]["aborted"] == 3
        # uvicorn's own shutdown timeout (which added seconds past the grace) never ran out
        assert not [e for e in events if "graceful shutdown exceeded" in str(e["event"])]
        _assert_quiet(srv)
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def one_at_a_time(default_version: EngineVersion, engines_root: Path) -> Iterator[Server]:
    """One worker serving one request at a time: a second request waits in its queue."""
    srv = Server(engines_root, *ONE_AT_A_TIME, "--queue-timeout", "120")
    srv.wait_ready(1)
    yield srv
    srv.stop()


def test_a_client_leaving_while_queued_is_dropped_unsynthesized(one_at_a_time: Server) -> None:
    srv = one_at_a_time
    before = len(_completions(srv))
    ttfa_before = metric(srv, "ttsvc_ttfa_seconds_count")
    with httpx.Client(base_url=srv.url, timeout=120) as client:
        with client.stream("POST", "/synthesize", json={"text": LONG}) as ahead:
            pieces = ahead.iter_raw()
            assert next(pieces)
            body = json.dumps({"text": "Nobody will hear this."}).encode()
            with socket.create_connection(("127.0.0.1", srv.port)) as leaver:
                leaver.sendall(b"POST /synthesize HTTP/1.1\r\nHost: t\r\n"
                               b"Content-Type: application/json\r\n"
                               b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
                _until(srv, lambda: metric(srv, "ttsvc_streams_queued", worker="0") == 1,
                       "the request queued behind the long stream")  # fmt: skip
            # hung up: dropped from the worker's queue while the stream ahead still runs
            _until(srv, lambda: metric(srv, "ttsvc_streams_queued", worker="0") == 0,
                   "the queued request dropped")  # fmt: skip
            _until(srv, lambda: len(_completions(srv)) == before + 1, "its completion line")
            for _ in pieces:
                pass  # the stream ahead still finishes whole
    _until(srv, lambda: len(_completions(srv)) == before + 2, "the long stream's line")
    left, whole = _completions(srv)[before:]
    assert (whole["status"], whole["code"]) == ("ok", 200)
    assert (left["status"], left["code"]) == ("cancelled", 499)
    assert left["ttfa_ms"] is None and left["audio_s"] == 0
    # it never ran: the worker reported no stream for it, and only one request got audio
    assert not [e for e in _events(srv)
                if e["event"] == "stream_done" and e.get("uid") == left["uid"]]  # fmt: skip
    assert metric(srv, "ttsvc_ttfa_seconds_count") == ttfa_before + 1
    _assert_quiet(srv)


def test_a_stream_its_client_cancels_is_not_counted_as_200(one_at_a_time: Server) -> None:
    srv = one_at_a_time
    before = metric(srv, "ttsvc_requests_total", code="499", outcome="cancelled")
    with httpx.Client(base_url=srv.url, timeout=120) as client:
        with client.stream("POST", "/synthesize", json={"text": LONG}) as r:
            assert next(r.iter_raw())
        # leaving the block hangs up mid-stream
    srv.wait_idle()
    assert metric(srv, "ttsvc_requests_total", code="499", outcome="cancelled") == before + 1
    assert metric(srv, "ttsvc_requests_total", code="200", outcome="cancelled") == 0
    assert _completions(srv)[-1]["code"] == 499


def test_requests_on_frozen_workers_fail_fast(
    default_version: EngineVersion, engines_root: Path
) -> None:
    env = {  # the queue deadline and the kill of a silent worker are both far away
        "TTSVC_BALANCER_HEARTBEAT_TIMEOUT_S": "2",
        "TTSVC_WORKER_SILENCE_TIMEOUT_S": "120",
        "TTSVC_QUEUE_TIMEOUT_S": "60",
    }
    srv = Server(engines_root, "--workers", "1", env=env)
    try:
        srv.wait_ready(1)
        (victim,) = srv.worker_pids()
        os.kill(victim, signal.SIGSTOP)
        try:
            # sent while its heartbeat is still fresh: dispatched, then failed once it is stale
            waited = srv.synth("Anyone there?")
            assert waited.status_code == 503
            assert waited.json()["type"] == "worker_unresponsive", waited.text
            assert _completions(srv)[-1]["worker"] == 0  # it was dispatched, then failed
            # now no worker has a heartbeat: refused without waiting at all
            refused = srv.synth("And now?")
            assert refused.status_code == 503
            assert refused.json()["type"] == "no_worker_available"
        finally:
            os.kill(victim, signal.SIGCONT)
        srv.wait_ready(1)  # it wakes, drops the abandoned request, and is routed to again
        assert srv.worker_pids() == [victim]
        assert srv.synth("Back again.").status_code == 200
        _assert_quiet(srv)
    finally:
        srv.stop()


def _gateway_usage(srv: Server) -> tuple[int, int]:
    """The gateway process's threads and open file descriptors."""
    status = Path(f"/proc/{srv.proc.pid}/status").read_text()
    found = re.search(r"^Threads:\s+(\d+)", status, re.M)
    assert found is not None
    return int(found.group(1)), sum(1 for _ in Path(f"/proc/{srv.proc.pid}/fd").iterdir())


def _kill_and_wait_respawn(srv: Server) -> None:
    """SIGKILL the worker and wait for its replacement's READY (a log event: bounded probes)."""
    (victim,) = srv.worker_pids()
    readies = sum(e["event"] == "worker_ready" for e in _events(srv))
    os.kill(victim, signal.SIGKILL)
    _until(srv, lambda: sum(e["event"] == "worker_ready" for e in _events(srv)) > readies
           and srv.worker_pids() not in ([], [victim]), "the respawned worker's READY")  # fmt: skip


def test_worker_deaths_leave_no_threads_or_descriptors_in_the_gateway(
    default_version: EngineVersion, engines_root: Path
) -> None:
    """Before: each death left its sender thread, its end of the pipe and the process's two
    sentinel pipes behind (20 kills: 13 -> 33 threads, 24 -> 84 descriptors)."""
    srv = Server(engines_root, "--workers", "1")
    try:
        srv.wait_ready(1)
        _kill_and_wait_respawn(srv)  # whatever a first respawn creates once (executor threads)
        threads, fds = _gateway_usage(srv)
        for _ in range(20):
            _kill_and_wait_respawn(srv)
        after = _gateway_usage(srv)
        # a leak is 20 threads and 60 descriptors; an HTTP connection or a pool thread is not
        assert after[0] <= threads + 2 and after[1] <= fds + 4, ((threads, fds), after)
        srv.wait_ready(1)
        assert srv.synth("Still speaking after twenty deaths.").status_code == 200
    finally:
        srv.stop()

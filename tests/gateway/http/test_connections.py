"""Slow clients against a real server: raw sockets on 127.0.0.1 that send nothing, half a request
head, a head or a body a byte at a time are all closed by the server, while a real request
streams on meanwhile, longer than any of the deadlines."""

from __future__ import annotations

import json
import re
import selectors
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect

from tests.audio.decoding import decode, rms
from tests.gateway.serving import Server
from ttsvc.repository.layout import EngineVersion

DEADLINE_S = 2.0
TICK_S = 0.25
"""How long one round waits on the sockets before the tricklers send their next byte."""
MAX_TICKS = 400
"""Bound on the rounds: far past the deadlines, so a server that never closes fails the test."""

HALF_HEAD = b"POST /synthesize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-"
BODY_HEAD = (b"POST /synthesize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             b"Content-Length: 4096\r\n\r\n")  # fmt: skip
LIVE = b"GET /live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
EARLY = b"POST /nope HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n\r\n"
"""Answered (404) before its body is sent; the body follows, then silence."""


@dataclass
class Slow:
    """One raw connection and what it does: ``first`` at once, then ``trickle`` a byte a round."""

    kind: str
    sock: socket.socket
    first: bytes = b""
    trickle: bytes = b""
    then: bytes = b""
    """Sent once the server's first response is in (a kept-alive connection's next head)."""
    received: bytearray = field(default_factory=bytearray)
    closed: bool = False


@pytest.fixture(scope="module")
def server(default_version: EngineVersion, engines_root: Path) -> Iterator[Server]:
    t = str(DEADLINE_S)
    srv = Server(engines_root, "--workers", "1",
                 "--idle-timeout", t, "--header-timeout", t, "--body-timeout", t)  # fmt: skip
    srv.wait_ready(1)
    yield srv
    srv.stop()


def open_slow(server: Server, kind: str, n: int, **what: bytes) -> list[Slow]:
    out = []
    for _ in range(n):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        slow = Slow(kind, sock, **what)
        if slow.first:
            sock.sendall(slow.first)
        sock.setblocking(False)
        out.append(slow)
    return out


def wait_closed(slow: list[Slow]) -> None:
    """Read every socket until the server closes it (EOF), sending the tricklers' bytes between
    rounds of at most ``TICK_S``; fails after ``MAX_TICKS`` rounds."""
    with selectors.DefaultSelector() as selector:
        for s in slow:
            selector.register(s.sock, selectors.EVENT_READ, s)
        for _ in range(MAX_TICKS):
            if all(s.closed for s in slow):
                return
            for key, _events in selector.select(timeout=TICK_S):
                s = key.data
                try:
                    data = s.sock.recv(65536)
                except ConnectionResetError:
                    data = b""
                if data:
                    s.received += data
                    if s.then and b"\r\n\r\n" in s.received:
                        s.sock.sendall(s.then)
                        s.then = b""
                else:
                    s.closed = True
                    selector.unregister(s.sock)
            for s in slow:
                if not s.closed and s.trickle:
                    try:
                        s.sock.send(s.trickle[:1])
                    except (BrokenPipeError, ConnectionResetError):
                        continue  # closed by the server: the next round reads the EOF
                    s.trickle = s.trickle[1:] or s.trickle  # a trickle that never ends
    open_kinds = sorted({s.kind for s in slow if not s.closed})
    raise AssertionError(f"the server kept connections open: {open_kinds}")


def timeouts(server: Server) -> dict[str, float]:
    """Connections the server closed for a deadline so far, by phase."""
    text = httpx.get(server.metrics_url).text
    found = re.finditer(r'ttsvc_connection_timeouts_total\{phase="(\w+)"\} (\S+)', text)
    return {m[1]: float(m[2]) for m in found}


def test_slow_clients_are_closed_while_a_stream_goes_on(server: Server) -> None:
    before = timeouts(server)
    slow = (
        open_slow(server, "nothing", 50)
        + open_slow(server, "half head", 50, first=HALF_HEAD)
        + open_slow(server, "trickled head", 50, first=HALF_HEAD, trickle=b"Type: text/plain")
        + open_slow(server, "trickled body", 30, first=BODY_HEAD, trickle=b'{"text": "hello"')
        + open_slow(server, "trickled OpenAI body", 10, trickle=b'{"input": "hello"',
                    first=BODY_HEAD.replace(b"/synthesize", b"/v1/audio/speech"))
        + open_slow(server, "kept alive, half head", 10, first=LIVE, then=HALF_HEAD)
        + open_slow(server, "answered early, then silent", 10, first=EARLY, then=b"hello")
    )
    assert len(slow) == 210
    # meanwhile a real stream, as long as its audio: several times the deadlines at 1x, and
    # however long it takes to synthesize, it is not a slow client and is not cut
    text = "This answer keeps streaming while slow clients come and go. " * 8
    result: dict[str, httpx.Response] = {}

    def listen() -> None:
        with httpx.Client(base_url=server.url, timeout=120) as client:
            result["r"] = client.post("/synthesize", json={"text": text, "format": "pcm"})

    listener = threading.Thread(target=listen)
    listener.start()
    try:
        wait_closed(slow)
    finally:
        listener.join(timeout=120)
        for s in slow:
            s.sock.close()
    r = result["r"]
    assert r.status_code == 200 and r.headers["transfer-encoding"] == "chunked"
    pcm, rate = decode(r.content, "pcm", 22050)
    assert len(pcm) / rate > 4 * DEADLINE_S and rms(pcm) > 300  # whole, not cut at a deadline

    for s in slow:  # no request was read: nothing to answer
        if s.kind in ("nothing", "half head", "trickled head"):
            assert s.received == b"", s.kind
    for s in slow:  # the app waited for the body: the connection answers for it, in the
        if "body" in s.kind:  # route's error shape
            assert s.received.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), s.received[:80]
            body = json.loads(s.received.partition(b"\r\n\r\n")[2])
            if "OpenAI" in s.kind:
                body = {"error": body["error"]["message"], "type": body["error"]["type"]}
            assert body["type"] == "request_timeout" and "body" in body["error"]
    for s in slow:  # the first request answered, the next head then closed like any other
        if s.kind.startswith("kept alive"):
            assert s.received.startswith(b"HTTP/1.1 200 OK") and s.received.count(b"HTTP/") == 1
        if s.kind.startswith("answered early"):
            assert s.received.startswith(b"HTTP/1.1 404") and s.received.count(b"HTTP/") == 1

    after = timeouts(server)
    counted = {phase: after.get(phase, 0) - before.get(phase, 0) for phase in after}
    assert counted == {"idle": 60, "header": 110, "body": 40}
    # each timed-out body is one request that ended in a 408, recorded once as what it was
    lines = completions(server)
    timed_out = [x for x in lines if x.get("error_type") == "request_timeout"]
    assert len(timed_out) == 40 and all(x["code"] == 408 for x in timed_out)
    assert not [x for x in lines if x.get("error_type") == "invalid_json"]
    assert server.client.get("/health").status_code == 200


def completions(server: Server) -> list[dict[str, object]]:
    """The server's completion lines (one per synthesis request) so far."""
    out = []
    for line in server.log_lines():
        if '"event": "request"' in line:
            out.append(json.loads(line))
    return out


def read_response(sock: socket.socket) -> bytes:
    """One whole response from a blocking socket (a length or a chunked body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        assert piece, "closed"
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    length = re.search(rb"content-length: (\d+)", head, re.IGNORECASE)
    while not (len(body) >= int(length[1]) if length else body.endswith(b"0\r\n\r\n")):
        piece = sock.recv(65536)
        assert piece, "closed"
        body += piece
    return head + b"\r\n\r\n" + body


def test_a_prompt_client_keeps_its_connection(server: Server) -> None:
    """Deadlines bound waiting on the client, not requests: one kept-alive connection serves
    requests back to back, a body sent in pieces within its deadline is read."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        for _ in range(3):
            sock.sendall(LIVE)
            assert read_response(sock).startswith(b"HTTP/1.1 200 OK")
        body = b'{"text": "In pieces.", "format": "pcm"}'
        sock.sendall(BODY_HEAD.replace(b"4096", str(len(body)).encode()) + body[:10])
        sock.sendall(body[10:])
        reply = read_response(sock)
        assert reply.startswith(b"HTTP/1.1 200 OK")
        assert b"transfer-encoding: chunked" in reply.lower()
        sock.sendall(LIVE)
        assert read_response(sock).startswith(b"HTTP/1.1 200 OK")


def test_a_websocket_outlives_every_deadline(server: Server) -> None:
    """An upgraded connection is the WebSocket's: a session that says nothing for longer than
    any deadline (an LLM thinking) is still open, and speaks when its text comes."""
    url = server.url.replace("http://", "ws://") + "/synthesize/stream"
    with connect(url, open_timeout=30) as ws:
        ws.send(json.dumps({"type": "start"}))
        assert json.loads(ws.recv(timeout=30))["type"] == "started"
        # connections opened after the session's: by the time the server has closed them all,
        # every deadline has passed for the session too
        wait_closed(open_slow(server, "nothing", 1)
                    + open_slow(server, "half head", 1, first=HALF_HEAD)
                    + open_slow(server, "silent body", 1, first=BODY_HEAD))  # fmt: skip
        ws.send(json.dumps({"type": "append", "text": "Still here."}))
        ws.send(json.dumps({"type": "end"}))
        kinds = []
        while kinds[-1:] != ["done"]:
            kinds.append(json.loads(ws.recv(timeout=60))["type"])
        assert set(kinds) == {"audio", "done"}

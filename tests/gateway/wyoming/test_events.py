"""Wyoming's bounds: events read within their caps and deadlines, in process against a real
``asyncio.StreamReader`` fed bytes, then the abuse that used to get through, against a real
``ttsvc serve --wyoming-port`` over TCP on loopback: a 300 MB payload announced, malformed JSON,
a header that never ends, idle sockets, more connections than the cap, a client outside the
allow-list, and the listener on its own address."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from wyoming.event import Event

from tests.gateway.serving import Server, wait_until
from ttsvc.errors import InvalidJson, PayloadTooLarge, RequestTimeout
from ttsvc.gateway.wyoming.events import EventLimits, EventReader, IdleConnection
from ttsvc.repository.layout import EngineVersion

LIMITS = EventLimits(max_bytes=1024, idle_s=0.05, header_s=0.05, body_s=0.05)


def _read(chunks: list[bytes], busy: bool = False, eof: bool = True) -> Event | None:
    """The first event a reader makes of ``chunks`` (then the end of the stream, if ``eof``)."""

    async def run() -> Event | None:
        stream = asyncio.StreamReader(limit=LIMITS.max_bytes)
        for chunk in chunks:
            stream.feed_data(chunk)
        if eof:
            stream.feed_eof()
        return await EventReader(stream, LIMITS, lambda: busy).next()

    return asyncio.run(run())


def _line(header: dict[str, object]) -> bytes:
    return json.dumps(header).encode() + b"\n"


def test_an_event_with_data_and_payload_is_read_whole() -> None:
    data = json.dumps({"text": "Hello."}).encode()
    event = _read([_line({"type": "synthesize", "data": {"voice": {"name": "x"}},
                          "data_length": len(data), "payload_length": 3}), data, b"abc"])
    assert event is not None and event.type == "synthesize"
    assert event.data == {"voice": {"name": "x"}, "text": "Hello."} and event.payload == b"abc"


def test_the_end_of_the_stream_is_no_event() -> None:
    assert _read([]) is None


@pytest.mark.parametrize(
    ("chunks", "error", "field"),
    [
        ([b"{this is not json\n"], InvalidJson, "header"),
        ([b"[1, 2]\n"], InvalidJson, "header"),
        ([_line({"data": {}})], InvalidJson, "type"),
        ([_line({"type": "x", "data": [1]})], InvalidJson, "data"),
        ([_line({"type": "x", "data_length": "ten"})], InvalidJson, "data_length"),
        ([_line({"type": "x", "data_length": 2}), b"[]"], InvalidJson, "data"),
        ([b'{"type": "' + b"x" * 2000 + b'"}\n'], PayloadTooLarge, "header"),
        ([_line({"type": "x", "data_length": 300 << 20})], PayloadTooLarge, "data_length"),
        ([_line({"type": "x", "payload_length": 300 << 20})], PayloadTooLarge, "payload_length"),
    ],
)
def test_a_malformed_or_oversized_event_is_refused_with_its_reason(
    chunks: list[bytes], error: type[Exception], field: str
) -> None:
    with pytest.raises(error) as refused:
        _read(chunks)
    assert getattr(refused.value, "field", None) == field


@pytest.mark.parametrize(
    "chunks", [[b'{"type": "descr'], [_line({"type": "x", "payload_length": 10}), b"abc"]]
)
def test_an_event_cut_short_times_out(chunks: list[bytes]) -> None:
    with pytest.raises(RequestTimeout):
        _read(chunks, eof=False)


def test_a_silent_connection_is_idle_unless_it_waits_for_audio() -> None:
    with pytest.raises(IdleConnection):
        _read([], eof=False)

    async def busy_then_event() -> Event | None:
        stream = asyncio.StreamReader(limit=LIMITS.max_bytes)
        turns = 0

        def busy() -> bool:  # the reader asks after each idle period: the event comes after two
            nonlocal turns
            turns += 1
            if turns == 2:
                stream.feed_data(_line({"type": "describe"}))
            return True

        return await EventReader(stream, LIMITS, busy).next()

    event = asyncio.run(busy_then_event())
    assert event is not None and event.type == "describe"


# --- a real server ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


MAX_CONNECTIONS = 4


@pytest.fixture(scope="module")
def server(default_version: EngineVersion, engines_root: Path) -> Iterator[Server]:
    """Timeouts of a second, so stalled sockets end within the test."""
    srv = Server(engines_root, "--workers", "1", "--wyoming-port", str(_free_port()),
                 "--header-timeout", "1", "--wyoming-max-connections", str(MAX_CONNECTIONS),
                 env={"TTSVC_WYOMING_IDLE_TIMEOUT_S": "1"})  # fmt: skip
    srv.wait_ready(1)
    yield srv
    srv.stop()


def _port(srv: Server) -> int:
    if not hasattr(srv, "wyoming_port"):
        (event,) = [e for e in srv.events() if e.get("event") == "wyoming_listening"]
        srv.wyoming_port = int(str(event["port"]))  # type: ignore[attr-defined]
    return int(srv.wyoming_port)  # type: ignore[attr-defined]


def _usage(srv: Server) -> tuple[int, int]:
    """The gateway's resident kB and open file descriptors."""
    status = Path(f"/proc/{srv.proc.pid}/status").read_text()
    rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
    return rss, sum(1 for _ in Path(f"/proc/{srv.proc.pid}/fd").iterdir())


def _reply(sock: socket.socket) -> tuple[dict[str, object] | None, bool]:
    """The error event the server sent on ``sock`` (if any), and whether it then closed it;
    blocks until the server closes it (bounded by the socket's timeout)."""
    received = b""
    closed = False
    try:
        while chunk := sock.recv(65536):
            received += chunk
        closed = True
    except (TimeoutError, ConnectionResetError):
        pass
    if not received:
        return None, closed
    header, _, rest = received.partition(b"\n")
    event = json.loads(header)
    size = int(event.get("data_length") or 0)
    data = json.loads(rest[:size]) if size else event.get("data", {})
    return ({"type": event["type"], **data}, closed)


def _connect(srv: Server, host: str = "127.0.0.1", source: str | None = None) -> socket.socket:
    sock = socket.create_connection((host, _port(srv)), timeout=30,
                                    source_address=(source, 0) if source else None)  # fmt: skip
    return sock


def test_a_300_mb_payload_is_refused_before_it_is_read(server: Server) -> None:
    """Before: it was buffered whole (gateway RSS 104 -> 391 MB)."""
    rss, _fds = _usage(server)
    with _connect(server) as sock:
        sock.sendall(_line({"type": "synthesize", "data": {"text": "hi"},
                            "payload_length": 300 << 20}))  # fmt: skip
        try:
            for _ in range(16):  # what a sender pushes before it learns it was refused
                sock.sendall(bytes(1 << 20))
        except OSError:
            pass
        error, closed = _reply(sock)
    assert error is not None and error["type"] == "error" and closed
    assert error["code"] == "payload_too_large" and "payload_length" in str(error["text"])
    assert _usage(server)[0] < rss + 32 * 1024  # not hundreds of megabytes


def test_malformed_json_is_answered_with_an_error_event(server: Server) -> None:
    """Before: the connection closed without a word."""
    with _connect(server) as sock:
        sock.sendall(b"{this is not json\n")
        error, closed = _reply(sock)
    assert error is not None and error["code"] == "invalid_json" and closed


def test_a_header_that_never_ends_times_out(server: Server) -> None:
    """Before: a socket stalled mid-header stayed open for good."""
    with _connect(server) as sock:
        sock.sendall(b'{"type": "descr')
        error, closed = _reply(sock)
    assert error is not None and error["code"] == "request_timeout" and closed


def test_an_idle_connection_is_closed(server: Server) -> None:
    with _connect(server) as sock:
        assert _reply(sock) == (None, True)


@pytest.fixture(scope="module")
def capped(default_version: EngineVersion, engines_root: Path) -> Iterator[Server]:
    """The default timeouts (idle sockets stay while the test counts them), a cap of four."""
    srv = Server(engines_root, "--workers", "1", "--wyoming-port", str(_free_port()),
                 "--wyoming-max-connections", str(MAX_CONNECTIONS))  # fmt: skip
    srv.wait_ready(1)
    yield srv
    srv.stop()


def test_300_sockets_take_no_more_than_the_connection_cap(capped: Server) -> None:
    """Before: 300 sockets held 300 descriptors in the gateway for as long as they stayed. Now
    it holds the cap's worth, and every socket past the cap is told why it was refused."""
    _rss, fds = _usage(capped)
    held = [_connect(capped) for _ in range(MAX_CONNECTIONS)]
    flood: list[socket.socket] = []
    try:
        wait_until(capped, lambda: _usage(capped)[1], lambda now: now >= fds + MAX_CONNECTIONS,
                   "the first connections held")  # fmt: skip
        flood = [_connect(capped) for _ in range(300 - MAX_CONNECTIONS)]
        replies = [_reply(sock) for sock in flood]  # each is told at once, then closed
        assert {(str(e["code"]) if e else None, closed) for e, closed in replies} == {
            ("overloaded", True)}
        assert "connections are open already" in str(replies[0][0])
        assert _usage(capped)[1] <= fds + MAX_CONNECTIONS + 2
    finally:
        for sock in [*held, *flood]:
            sock.close()
    wait_until(capped, lambda: _usage(capped)[1], lambda now: now <= fds + 2,
               "the gateway's descriptors back where they were")  # fmt: skip
    with _connect(capped) as describe:  # room again
        describe.sendall(_line({"type": "describe"}))
        header = describe.recv(65536).partition(b"\n")[0]
    assert json.loads(header)["type"] == "info"


@pytest.fixture(scope="module")
def private(default_version: EngineVersion, engines_root: Path) -> Iterator[Server]:
    """Wyoming on its own loopback address, for one client address only."""
    srv = Server(engines_root, "--workers", "1", "--wyoming-port", str(_free_port()),
                 "--wyoming-host", "127.0.0.2", "--wyoming-allow", "127.0.0.3")  # fmt: skip
    srv.wait_ready(1)
    yield srv
    srv.stop()


def test_the_listener_has_its_own_address_and_an_allow_list(private: Server) -> None:
    with pytest.raises(ConnectionRefusedError):  # not on the API's address
        _connect(private, "127.0.0.1")
    with _connect(private, "127.0.0.2") as sock:  # from 127.0.0.1: not allowed
        error, closed = _reply(sock)
    assert error is not None and error["code"] == "forbidden" and closed
    assert "127.0.0.1" in str(error["text"])
    with _connect(private, "127.0.0.2", source="127.0.0.3") as sock:
        sock.sendall(_line({"type": "describe"}))
        header = sock.recv(65536).partition(b"\n")[0]
    assert json.loads(header)["type"] == "info"

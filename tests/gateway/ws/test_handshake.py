"""The bounds every WebSocket route shares (``ws.handshake``), against a real ``ttsvc serve``
on loopback driven by the ``websockets`` client: the session cap counts ``/synthesize/stream``
and ElevenLabs' routes together, refuses one more at the handshake and admits again once one
closes; a session that sends nothing while nothing is spoken is closed after the idle timeout,
one that is speaking is not.

Before: neither bound existed, and 300 idle sessions held 300 descriptors for good."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.gateway.serving import Server, metric, wait_until
from ttsvc.repository.layout import EngineVersion

VOICE = "en_US-joe-medium"
CAP = 2
IDLE_S = 1.5
"""Short, so the idle sessions end within the test; far shorter than the speaking below, and
longer than a loaded machine takes between a session's handshake and its first message."""
LONG = ("This long sentence keeps the worker busy for many seconds of speech, far longer than "
        "the idle timeout, so a session waiting for its audio would be closed if it counted. ")
RECV_S = 120
Message = dict[str, Any]


@pytest.fixture(scope="module")
def capped(default_version: EngineVersion, engines_root: Path) -> Iterator[Server]:
    """A cap of two sessions; the default idle timeout (sessions stay while the test counts)."""
    srv = Server(engines_root, "--workers", "1", "--ws-max-sessions", str(CAP))
    srv.wait_ready(1)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def idling(default_version: EngineVersion, engines_root: Path) -> Iterator[Server]:
    srv = Server(engines_root, "--workers", "1", "--ws-idle-timeout", str(IDLE_S))
    srv.wait_ready(1)
    yield srv
    srv.stop()


def stream_url(srv: Server) -> str:
    return srv.url.replace("http://", "ws://") + "/synthesize/stream"


def elevenlabs_url(srv: Server) -> str:
    return (srv.url.replace("http://", "ws://")
            + f"/v1/text-to-speech/{VOICE}/multi-stream-input?output_format=pcm_22050")  # fmt: skip


def send(ws: ClientConnection, **fields: object) -> None:
    ws.send(json.dumps(fields))


def read_until(ws: ClientConnection, done: str) -> list[Message]:
    """Messages up to and including the first with a true ``done`` field (or of type ``done``);
    the socket must stay open meanwhile."""
    out: list[Message] = []
    while not out or not (out[-1].get(done) or out[-1].get("type") == done):
        out.append(json.loads(ws.recv(timeout=RECV_S)))
    return out


def closed(ws: ClientConnection) -> tuple[int | None, str | None]:
    """The close code and reason the server ends ``ws`` with, once nothing else comes."""
    with pytest.raises(ConnectionClosed):
        while True:
            message = json.loads(ws.recv(timeout=RECV_S))
            assert "audio" not in message, "audio after the session's end"
    return ws.close_code, ws.close_reason


def test_the_cap_counts_both_routes_refuses_one_more_and_admits_again(capped: Server) -> None:
    refused = metric(capped, "ttsvc_websocket_closed_total", reason="overloaded")
    with connect(stream_url(capped), open_timeout=30) as ours, \
            connect(elevenlabs_url(capped), open_timeout=30) as theirs:  # fmt: skip
        send(ours, type="start")
        assert read_until(ours, "started")
        assert metric(capped, "ttsvc_websocket_sessions") == CAP
        for url in (stream_url(capped), elevenlabs_url(capped)):
            with pytest.raises(InvalidStatus) as over:
                connect(url, open_timeout=30)
            response = over.value.response  # refused before it was accepted: a status to retry
            assert response.status_code == 429 and response.headers["Retry-After"] == "1"
            body = json.loads(response.body or b"")
            assert body["type"] == "overloaded" and f"{CAP} WebSocket sessions" in body["error"]
        assert metric(capped, "ttsvc_websocket_closed_total", reason="overloaded") == refused + 2
        theirs.close()
        wait_until(capped, lambda: metric(capped, "ttsvc_websocket_sessions"),
                   lambda open_now: open_now == CAP - 1, "the closed session's seat given back")
        with connect(stream_url(capped), open_timeout=30) as again:  # room again
            send(again, type="start")
            assert read_until(again, "started")
        send(ours, type="flush")  # the first session was left as it was
        assert read_until(ours, "flushed")
    wait_until(capped, lambda: metric(capped, "ttsvc_websocket_sessions"),
               lambda open_now: open_now == 0, "every seat given back")


def test_an_idle_session_is_closed_while_one_speaking_is_not(idling: Server) -> None:
    before = metric(idling, "ttsvc_websocket_closed_total", reason="idle")
    with connect(stream_url(idling), open_timeout=30) as speaking:
        send(speaking, type="append", text=LONG * 6)
        send(speaking, type="flush")  # then nothing: the client waits for its audio
        with connect(elevenlabs_url(idling), open_timeout=30) as speaking_el:
            send(speaking_el, text=LONG * 6, context_id="c")
            send(speaking_el, context_id="c", flush=True)
            send(speaking_el, context_id="c", close_context=True)  # the end of a turn
            with connect(stream_url(idling), open_timeout=30) as silent, \
                    connect(elevenlabs_url(idling), open_timeout=30) as silent_el:  # fmt: skip
                for ws in (silent, silent_el):
                    code, reason = closed(ws)
                    assert code == 1008 and reason is not None and "idle" in reason, (code, reason)
            ours = read_until(speaking, "flushed")  # every sentence spoken, the socket open
            assert {m["sentence"] for m in ours if m["type"] == "audio"} == set(range(6))
            theirs = read_until(speaking_el, "isFinal")
            assert sum(1 for m in theirs if m.get("audio")) >= 6
            assert not [m for m in theirs if "error" in m]
            for ws in (speaking, speaking_el):  # idle now that their audio is all sent
                assert closed(ws)[0] == 1008
    assert metric(idling, "ttsvc_websocket_closed_total", reason="idle") == before + 4
    lines = [e for e in idling.events() if e.get("event") == "websocket_idle"]
    assert sorted(str(e["route"]) for e in lines) == ["multi-stream-input"] * 2 + ["stream"] * 2


def test_an_elevenlabs_socket_may_ask_for_its_own_idle_timeout(idling: Server) -> None:
    """``inactivity_timeout`` (ElevenLabs': whole seconds, at most 180) replaces the server's
    for that socket: agents keep their socket between turns by asking for a long one."""
    with connect(elevenlabs_url(idling) + "&inactivity_timeout=1", open_timeout=30) as ws:
        code, reason = closed(ws)
    assert code == 1008 and reason is not None and "for 1 s" in reason, (code, reason)
    with connect(elevenlabs_url(idling) + "&inactivity_timeout=999", open_timeout=30) as ws:
        error = json.loads(ws.recv(timeout=RECV_S))
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=RECV_S)
    assert "inactivity_timeout" in error["error"] and ws.close_code == 1008

"""Deadlines for slow clients on uvicorn's HTTP/1.1 (h11) connections.

uvicorn's h11 protocol has one timer, keep-alive, and arms it only after a response: a
connection that sends nothing, half a request head, or a body a byte at a time holds its socket
(and, once its head is in, a task waiting for the body) for as long as the client likes. A few
hundred such sockets cost nothing to open and exhaust the server's descriptors (slow-loris).
This protocol bounds every phase in which the server waits on the client:

* **idle**: a connection with no request under way (just opened, or between keep-alive
  requests) is closed after ``idle_s`` without a byte. Between requests that is uvicorn's own
  keep-alive timer, set to the same value.
* **head**: from a request's first byte, its line and headers must be in within ``header_s``,
  however slowly they trickle; else the connection is closed. No request was read, so there is
  nothing to answer (nginx does the same).
* **body**: the whole body must be in within ``body_s`` of the head. A deadline on the whole
  body, not between reads, since a byte every few seconds never trips a per-read timer. The
  client is answered 408 with the route's error body (unless the app already answered) and the
  connection closed; the app's pending read sees a disconnect.

A response being sent is not bounded here: a stream is as long as its audio, and a client that
stops reading is the stream's own business (the transport's flow control stops the writer).
Nor is a connection upgraded to a WebSocket: its session lasts as long as its text does.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from ttsvc.errors import RequestTimeout
from ttsvc.gateway.http.caller import scope_caller
from ttsvc.gateway.http.errors import shaped
from ttsvc.observability.logs import get_logger

log = get_logger("connections")


@dataclass(frozen=True)
class ClientDeadlines:
    """How long the server waits on a client in each phase, in seconds."""

    idle_s: float
    header_s: float
    body_s: float


def deadline_protocol(
    deadlines: ClientDeadlines, on_timeout: Callable[[str], None]
) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with ``deadlines``; ``on_timeout(phase)`` is called on the event
    loop for each connection closed for one (``idle``, ``header`` or ``body``)."""

    class Protocol(DeadlineH11Protocol):
        pass

    Protocol.deadlines = deadlines
    Protocol.on_timeout = staticmethod(on_timeout)
    return Protocol


class DeadlineH11Protocol(H11Protocol):
    """One connection; use :func:`deadline_protocol`, which sets the class's deadlines."""

    deadlines: ClientDeadlines
    on_timeout: Callable[[str], None]

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._timer: asyncio.TimerHandle | None = None
        self._phase: str | None = None
        self._upgraded = False
        """Handed to the WebSocket protocol: no deadline of this one applies any more."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._arm("idle", self.deadlines.idle_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE and self._phase != "header":
            # the first byte of a request head: its whole head is due from now
            self._arm("header", self.deadlines.header_s)
        super().data_received(data)
        self._follow()

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        # the transport now belongs to the WebSocket protocol (its own pings find dead peers);
        # a deadline armed for the upgrade request would close a session in mid-sentence
        self._upgraded = True
        self._disarm()
        super().handle_websocket_upgrade(event)

    def on_response_complete(self) -> None:
        super().on_response_complete()  # arms uvicorn's keep-alive timer: the idle deadline
        self._follow()

    def _follow(self) -> None:
        """Move the deadline on with the request: head in, body due; body in, nothing due."""
        if self._upgraded:
            return
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            if self._phase != "body":
                self._arm("body", self.deadlines.body_s)
        elif state is h11.IDLE and self._phase == "header":
            pass  # a head has begun: its deadline runs
        elif self.timeout_keep_alive_task is None and (
            self.cycle is None or self.cycle.response_complete
        ):
            # answered, and uvicorn's keep-alive is not watching: an answer sent before its
            # request's body was in (404, 413) leaves none once the body arrives, and a silent
            # client would be kept forever
            if self._phase != "idle":
                self._arm("idle", self.deadlines.idle_s)
        else:
            self._disarm()  # a request in progress, or uvicorn's keep-alive watches

    def _arm(self, phase: str, seconds: float) -> None:
        self._disarm()
        self._phase = phase
        self._timer = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._phase = None

    def _expired(self) -> None:
        phase, self._timer, self._phase = self._phase, None, None
        if phase is None or self.transport.is_closing():
            return
        log.info("connection_timeout", phase=phase,
                 client=f"{self.client[0]}:{self.client[1]}" if self.client else None)  # fmt: skip
        self.on_timeout(phase)
        cycle = self.cycle
        if phase == "body" and cycle is not None and not cycle.response_started:
            # the app is still waiting for the body: it sees a disconnect, and sends nothing
            scope_caller(cycle.scope).timed_out = phase  # recorded as a 408
            cycle.disconnected = True
            cycle.message_event.set()
            self._answer(RequestTimeout(f"the request body took over {self.deadlines.body_s:g} s"))
        self.transport.close()

    def _answer(self, error: RequestTimeout) -> None:
        shape = error.to_body()
        # the error shape the route's clients read, as the app's handlers answer
        body = json.dumps(shaped(self.scope["path"] if self.scope else "", shape)).encode()
        headers = [(b"content-type", b"application/json"), (b"connection", b"close"),
                   (b"content-length", str(len(body)).encode())]  # fmt: skip
        try:
            for event in (h11.Response(status_code=error.status, headers=headers,
                                       reason=HTTPStatus(error.status).phrase),
                          h11.Data(data=body), h11.EndOfMessage()):  # fmt: skip
                self.transport.write(self.conn.send(event) or b"")
        except h11.LocalProtocolError:
            pass  # h11 will not answer in this state: the close alone tells the client

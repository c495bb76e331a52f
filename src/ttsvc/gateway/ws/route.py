"""``/synthesize/stream``: text over a WebSocket as an LLM writes it, audio back as it is made.

Runs on the gateway's event loop. Each sentence is spoken as soon as it is complete (text after
its end arrived) or flushed, and each one is one synthesis request on the path ``/synthesize``
takes (``start_exchange``): the same key quotas, slots, text cap, drain, metrics and one
completion log line each, so a session costs what its sentences sent one by one would.

The protocol is described with its messages (``stream_ws_messages``); a session's tasks are in
``stream_ws_session``.

A bad message gets an error naming its field and is otherwise ignored; a sentence that cannot
be spoken gets an error with its index and the session goes on. A shutdown ends a session with
an error and close 1012 (service restart), after the audio of sentences already under way.

Keys: ``Authorization: Bearer`` where the client can set headers; a browser offers the
subprotocols ``ttsvc`` and ``bearer.<key>`` instead (never a query string: it would land in
access logs). The server answers ``ttsvc``. The drain, the origin, the key and the session cap
are checked, a refusal answered, and an idle session closed, as on every WebSocket route
(``handshake``).
"""

from __future__ import annotations

import time

from fastapi import FastAPI, WebSocket

from ttsvc.errors import Busy, Draining, OriginNotAllowed, Unauthorized
from ttsvc.gateway.core.caller import Caller
from ttsvc.gateway.core.state import GatewayState
from ttsvc.gateway.ws.handshake import check_upgrade, refuse, take_seat
from ttsvc.gateway.ws.session import StreamSession
from ttsvc.observability.logs import get_logger

log = get_logger("stream_ws")

PATH = "/synthesize/stream"
SUBPROTOCOL = "ttsvc"
BEARER = "bearer."
"""Prefix of the subprotocol that carries a key (``bearer.<key>``)."""


def install(app: FastAPI, state: GatewayState) -> None:
    """Add the route to ``app``."""

    async def stream(ws: WebSocket) -> None:
        started = time.perf_counter()
        offered = list(ws.scope.get("subprotocols", ()))
        token = next((p[len(BEARER):] for p in offered if p.startswith(BEARER)), None)
        header = ws.headers.get("authorization")
        try:
            key = check_upgrade(state, ws, header or (f"Bearer {token}" if token else None))
            seat = take_seat(state)
        except (Busy, Draining, OriginNotAllowed, Unauthorized) as exc:
            await refuse(state, ws, exc, Caller(started=started))
            return
        with seat:
            await ws.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
            session = StreamSession(state, ws, key)
            try:
                await session.run()
            finally:
                log.info("websocket_session", session=session.sid,
                         key=None if key is None else key.name, sentences=session.sentences,
                         audio_s=round(session.spoken_s, 3),
                         duration_ms=round(1000 * (time.perf_counter() - started), 1),
                         close_code=session.close_code,
                         client_left=session.close_code is None
                         and session.gone.is_set())  # fmt: skip

    app.add_api_websocket_route(PATH, stream)

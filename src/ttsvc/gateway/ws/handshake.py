"""Admitting a WebSocket upgrade and bounding the session, for every WebSocket route (ttsvc's
own and ElevenLabs').

Why one place: the drain, the page's origin, the key and the session cap are checked the same
way on each route, before the socket is accepted, and a refusal is answered as HTTP answers it
(its status, body and headers: a client told 401 or 403 at the handshake knows why, where a
close code after accepting says little) and recorded as a refused request is.

CORS does not cover WebSockets, so a browser page of another origin is refused unless
``--cors-origin`` allows it, as it is kept from the HTTP API.

Every session holds a socket and its tasks in the gateway for as long as it stays, whatever it
sends, so sessions are bounded as Wyoming's connections are: a cap on those open at once, every
route's together (``ws_max_sessions``: one more is refused with 429 ``overloaded`` and
``Retry-After`` before it is accepted, which costs the gateway nothing and which every
WebSocket client reports as a failed connection with its status), and an idle timeout
(``ws_idle_timeout_s``, ``core.idle``: nothing sent while nothing is spoken), after which the
session is closed with 1008 and a reason, as ElevenLabs closes an idle socket.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from fastapi import WebSocket
from fastapi.responses import JSONResponse

from ttsvc.errors import Busy, Draining, OriginNotAllowed, TTSError
from ttsvc.gateway.core.caller import Caller
from ttsvc.gateway.core.keys import ApiKey
from ttsvc.gateway.core.records import record_refusal
from ttsvc.gateway.core.state import GatewayState
from ttsvc.observability.logs import get_logger

log = get_logger("websocket")

IDLE_CLOSE = 1008
"""The close code of a session closed for being idle: a policy of the server's (1000 says the
client's purpose was fulfilled, 1001 that the server goes away); ElevenLabs closes so too."""


def origin_allowed(origin: str, host: str | None, allowed: list[str]) -> bool:
    """Whether a browser page of ``origin`` may open a socket: one served by this host (the
    try-it page), or one that CORS lets read the HTTP API. A client that is not a browser sends
    no ``Origin`` and is not asked."""
    if "*" in allowed or origin in allowed:
        return True
    return host is not None and urlsplit(origin).netloc.lower() == host.lower()


def check_upgrade(state: GatewayState, ws: WebSocket, authorization: str | None) -> ApiKey | None:
    """The key an upgrade authenticates with (``authorization``: ``Bearer <key>`` as the route
    found it; ``None`` with keys off), after the drain and the origin; raises ``Draining``,
    ``OriginNotAllowed`` or ``Unauthorized``."""
    if state.draining:
        raise Draining("the server is shutting down")
    origin = ws.headers.get("origin")
    if origin is not None and not origin_allowed(origin, ws.headers.get("host"),
                                                 state.settings.cors_origins):  # fmt: skip
        raise OriginNotAllowed(f"origin {origin[:200]!r} may not open this WebSocket: "
                               "--cors-origin names the origins that may")  # fmt: skip
    if state.keys is None:
        return None
    return state.keys.authenticate(authorization)


async def refuse(state: GatewayState, ws: WebSocket, exc: TTSError, caller: Caller) -> None:
    """Refuse an upgrade with ``exc``'s HTTP answer, recorded as ``caller``'s refused request."""
    record_refusal(state, caller, exc.to_body(), exc.status)
    reply = JSONResponse(exc.to_body(), status_code=exc.status, headers=exc.headers())
    try:
        await ws.send_denial_response(reply)
    except RuntimeError:  # a server without the denial extension
        await ws.close(1013 if isinstance(exc, Busy) else 1008)  # 1013: try again later


class Seat:
    """One session's place under ``ws_max_sessions`` (``take_seat``), given back when the
    ``with`` block it guards ends, however it ends."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self.state.websockets -= 1
        self.state.metrics.websocket_sessions.dec()


def take_seat(state: GatewayState) -> Seat:
    """A place for one more session, taken now (before anything awaits, so no two upgrades
    take the last one), or ``Busy`` when ``ws_max_sessions`` are open. Enter its ``with`` at
    once: it is given back only on leaving it."""
    cap = state.settings.ws_max_sessions
    if state.websockets >= cap:
        state.metrics.websocket_closed.labels(Busy.type).inc()
        raise Busy(f"{cap} WebSocket sessions are open already; retry shortly")
    state.websockets += 1
    state.metrics.websocket_sessions.inc()
    return Seat(state)


def went_idle(state: GatewayState, session: str, route: str,
              idle_s: float | None = None) -> tuple[int, str]:  # fmt: skip
    """Count and log a session found idle (after ``idle_s``, default the server's timeout);
    the close code and reason to end it with."""
    idle_s = idle_s or state.settings.ws_idle_timeout_s
    state.metrics.websocket_closed.labels("idle").inc()
    log.info("websocket_idle", session=session, route=route, idle_s=idle_s)
    return IDLE_CLOSE, f"idle: nothing sent for {idle_s:g} s while nothing was being spoken"

"""Admitting a WebSocket upgrade, for every WebSocket route (ttsvc's own and ElevenLabs').

Why one place: the drain, the page's origin and the key are checked the same way on each route,
before the socket is accepted, and a refusal is answered as HTTP answers it (its status, body
and headers: a client told 401 or 403 at the handshake knows why, where a close code after
accepting says little) and recorded as a refused request is.

CORS does not cover WebSockets, so a browser page of another origin is refused unless
``--cors-origin`` allows it, as it is kept from the HTTP API.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from fastapi import WebSocket
from fastapi.responses import JSONResponse

from ttsvc.errors import Draining, OriginNotAllowed, TTSError
from ttsvc.gateway.core.caller import Caller
from ttsvc.gateway.core.keys import ApiKey
from ttsvc.gateway.core.records import record_refusal
from ttsvc.gateway.core.state import GatewayState


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


async def refuse(state: GatewayState, ws: WebSocket, exc: TTSError, started: float) -> None:
    """Refuse an upgrade with ``exc``'s HTTP answer, recorded as a refused request."""
    record_refusal(state, Caller(started=started), exc.to_body(), exc.status)
    reply = JSONResponse(exc.to_body(), status_code=exc.status, headers=exc.headers())
    try:
        await ws.send_denial_response(reply)
    except RuntimeError:  # a server without the denial extension
        await ws.close(1008)

"""An HTTP request as the request core's ``Caller``: the one thing a request carries in its
state (``request.state.caller``), made by the first layer that sees the request and filled in
as it is checked (its key, its format); the HTTP edge's own facts about it ride along."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import HTTPConnection, Request

from ttsvc.gateway.core.caller import Caller


@dataclass(eq=False)
class HttpCaller(Caller):
    """A ``Caller`` with what only HTTP's edge knows of it."""

    timed_out: str | None = None
    """The phase (``header``, ``body``) whose deadline the connection answered 408 for."""
    body_cut: bool = False
    """The client left before its body arrived (FastAPI turns that into a 400)."""


def scope_caller(scope: MutableMapping[str, Any] | Any) -> HttpCaller:
    """The caller of the request ``scope`` is for, made on first sight."""
    state = scope.setdefault("state", {})
    caller = state.get("caller")
    if not isinstance(caller, HttpCaller):
        caller = state["caller"] = HttpCaller()
    return caller


def http_caller(conn: HTTPConnection) -> HttpCaller:
    """``conn``'s caller; a request's tells the core when its client leaves, and carries the
    client's ``X-Request-Id``."""
    caller = scope_caller(conn.scope)
    caller.client_request_id = conn.headers.get("x-request-id") or None
    if isinstance(conn, Request):
        caller.gone = functools.partial(_client_gone, conn)
    return caller


async def _client_gone(request: Request) -> None:
    """Return once the client has closed its connection.

    The body was read before the handler ran, so the next ASGI message is the disconnect; the
    server delivers it as soon as the socket closes. A receive that fails means the same.
    """
    with contextlib.suppress(Exception):
        while (await request.receive())["type"] != "http.disconnect":
            pass

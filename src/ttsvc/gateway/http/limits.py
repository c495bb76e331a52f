"""Limits on the HTTP exchange itself: the body's size, and a streamed response that must fail.

ASGI and HTTP middleware that sit between uvicorn and the routes: a body over the cap is refused
(by its ``Content-Length`` before it is read, by the bytes counted as they arrive when it has
none), a stream that cannot finish is cut instead of ending like a whole one, and uvicorn's
error line for such a deliberate cut is kept out of the logs.
"""

from __future__ import annotations

import contextvars
import logging
import time

from fastapi import Request
from fastapi.responses import Response
from starlette.middleware.base import RequestResponseEndpoint
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ttsvc.errors import PayloadTooLarge
from ttsvc.gateway.core.state import GatewayState
from ttsvc.gateway.http.caller import scope_caller
from ttsvc.gateway.http.errors import error_response


async def body_cap(
    state: GatewayState, request: Request, call_next: RequestResponseEndpoint
) -> Response:
    """HTTP middleware (``create_app`` registers it): stamps the request's start (its latency
    in the completion line) and refuses a body whose ``Content-Length`` is over the cap before
    any of it is read; ``BodyLimit`` catches bodies that declare no length."""
    scope_caller(request.scope).started = time.perf_counter()
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > state.settings.max_body_bytes:
        exc = PayloadTooLarge(f"body over {state.settings.max_body_bytes} bytes")
        return error_response(state, request, exc.to_body(), exc.status)
    return await call_next(request)


class BodyLimit:
    """Counts request body bytes as they arrive, so a chunked upload (no Content-Length) is cut
    off at the cap too instead of being read into memory whole.

    Past the cap it answers 413 itself and tells the application the client left; anything the
    application still tries to send is dropped (FastAPI would turn an error raised while reading
    the body into a 400).
    """

    def __init__(self, app: ASGIApp, limit: int, state: GatewayState) -> None:
        self.app = app
        self.limit = limit
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        received = 0
        answered = whole = False

        async def counted() -> Message:
            nonlocal received, answered, whole
            message = await receive()
            if message["type"] == "http.disconnect" and not (answered or whole):
                # the client left mid-upload: a disconnect, not a bad body (``http_error``)
                scope_caller(scope).body_cut = True
            if message["type"] == "http.request":
                whole = not message.get("more_body", False)
            if message["type"] == "http.request" and not answered:
                received += len(message.get("body", b""))
                if received > self.limit:
                    answered = True
                    exc = PayloadTooLarge(f"body over {self.limit} bytes")
                    reply = error_response(self.state, Request(scope), exc.to_body(), exc.status)
                    await reply(scope, receive, send)
                    return {"type": "http.disconnect"}
            return message

        async def guarded(message: Message) -> None:
            if not answered:
                await send(message)

        try:
            await self.app(scope, counted, guarded)
        except Exception:
            if not answered:
                raise


_ABORTED: contextvars.ContextVar[bool] = contextvars.ContextVar("ttsvc_aborted", default=False)
"""Set in a request's task once its response was cut on purpose (read by ``QuietAborts``)."""


class StreamAbort:
    """Lets a streaming response end as a failure: without its terminating chunk.

    Once audio has gone out the status line said 200, so a stream that cannot finish (its
    worker died or stalled, the drain's grace ran out) must not end like a complete one: the
    request's caller is marked (``Caller.cut``) and this layer withholds the final body
    message. The server then sees an unfinished response and closes the connection, and every
    HTTP client reports an incomplete body instead of a short, well-formed file.

    It must sit outside ``BaseHTTPMiddleware`` layers: those end a body stream their app left
    unfinished with a terminator of their own.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        def cut() -> bool:
            return scope_caller(scope).cut

        async def guarded(message: Message) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body") and cut():
                if message.get("body"):
                    await send({**message, "more_body": True})
                return
            await send(message)

        await self.app(scope, receive, guarded)
        if cut():
            _ABORTED.set(True)  # seen by the server's log call right after this returns


class QuietAborts(logging.Filter):
    """Drops uvicorn's error line for a response this gateway cut on purpose.

    The request's own completion line already says why (``worker_died``, ``stalled``,
    ``shutdown``); an unfinished response that was not cut here still logs its error.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_ABORTED.get() and "without completing response" in record.getMessage())

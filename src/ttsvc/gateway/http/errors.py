"""HTTP's error answers: every refusal in the one ``{"error", "type"}`` shape, recorded once.

Whatever ends a request without audio, an error class of ``ttsvc.errors``, Starlette's own HTTP
errors, a body that does not validate or a crash, is answered here (in OpenAI's shape on /v1,
but for ElevenLabs' text-to-speech routes) and, for a synthesis request, counted and given its
one completion log line. The handlers are plain functions of the gateway's state;
``create_app`` registers them.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ttsvc.errors import (
    ClientClosedRequest,
    InvalidJson,
    InvalidParameter,
    RequestTimeout,
    TTSError,
)
from ttsvc.gateway.core.records import record_refusal
from ttsvc.gateway.core.state import GatewayState
from ttsvc.gateway.http.caller import scope_caller
from ttsvc.gateway.http.elevenlabs import PATHS as ELEVENLABS_PATHS
from ttsvc.gateway.http.openai import openai_error

SYNTHESIS_PATHS = ("/synthesize", "/v1/audio/speech", "/synthesize/with-timestamps")
"""Routes whose every request ends in exactly one completion log line (and ElevenLabs', whose
paths name the voice: ``ELEVENLABS_PATHS``)."""

_HTTP_TYPES = {400: InvalidJson.type, 404: "not_found", 405: "method_not_allowed"}
"""Error types of the HTTP errors Starlette and FastAPI raise themselves."""
_HTTP_MESSAGES = {
    "invalid_json": "body is not valid JSON (or not UTF-8)",
    "not_found": "no such route",
    "method_not_allowed": "method not allowed on this route",
}


def error_response(
    state: GatewayState,
    request: Request,
    body: dict[str, str],
    status: int,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """Answer a request that produced no audio; a synthesis request is recorded once (an
    exchange that failed recorded itself), and the answer names the uid its record carries."""
    caller = scope_caller(request.scope)
    path = request.url.path
    if path in SYNTHESIS_PATHS or ELEVENLABS_PATHS.fullmatch(path):
        record_refusal(state, caller, body, status)
    if caller.request_id is not None:
        headers = {**(headers or {}), "X-Request-Id": caller.request_id}
    return JSONResponse(shaped(path, body), status_code=status, headers=headers)


def shaped(path: str, body: dict[str, str]) -> dict[str, object]:
    """An error ``body`` in the shape the route's clients read: OpenAI's on /v1 routes, ttsvc's
    own on the others and on ElevenLabs' text-to-speech routes (as its WebSockets send errors:
    OpenAI's would rename their fields, ``text`` to ``input``)."""
    if path.startswith("/v1/") and not ELEVENLABS_PATHS.fullmatch(path):
        return openai_error(body)
    return dict(body)


async def tts_error(state: GatewayState, request: Request, exc: TTSError) -> JSONResponse:
    return error_response(state, request, exc.to_body(), exc.status, exc.headers())


async def http_error(state: GatewayState, request: Request, exc: HTTPException) -> JSONResponse:
    # Starlette's own answers (unknown route, wrong method) and FastAPI's 400 for a body it
    # could not decode, in the same shape as every other error
    caller = scope_caller(request.scope)
    if caller.timed_out == "body":
        # the connection already answered 408 and closed; the failed body read lands here
        timeout = RequestTimeout("the request body took too long")
        return error_response(state, request, timeout.to_body(), timeout.status)
    if caller.body_cut:
        # the client left before its body arrived (FastAPI turns the failed read into a 400):
        # a disconnect (499), not a body that is not JSON
        gone = ClientClosedRequest("the client closed the connection before its body arrived")
        return error_response(state, request, gone.to_body(), gone.status)
    kind = _HTTP_TYPES.get(exc.status_code, "http_error")
    body = {"error": _HTTP_MESSAGES.get(kind, str(exc.detail)), "type": kind}
    if kind == "invalid_json":
        body["field"] = "body"
    return error_response(state, request, body, exc.status_code, dict(exc.headers or {}))


async def crashed(state: GatewayState, request: Request, exc: Exception) -> JSONResponse:
    # uvicorn still logs the traceback; the client gets the shape, never the trace
    error = TTSError("internal error")
    return error_response(state, request, error.to_body(), error.status)


async def invalid(
    state: GatewayState, request: Request, exc: RequestValidationError
) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {}
    if first.get("type") == "json_invalid":  # its loc holds a character offset, no field
        reason = first.get("ctx", {}).get("error", "not JSON")
        at = first.get("loc", ("body", "?"))[-1]
        error: TTSError = InvalidJson(f"body is not valid JSON: {reason} at character {at}",
                                      field="body")  # fmt: skip
        return error_response(state, request, error.to_body(), error.status)
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    name = ".".join(loc) or "body"
    error = InvalidParameter(f"{name}: {first.get('msg', 'invalid')}", field=name)
    return error_response(state, request, error.to_body(), error.status)

"""Error answers: every refusal in the one ``{"error", "type"}`` shape, recorded once.

Whatever ends a request without audio, an error class of ``ttsvc.errors``, Starlette's own HTTP
errors, a body that does not validate or a crash, is answered here (in OpenAI's shape on /v1)
and, for a synthesis request, counted and given its one completion log line. The handlers are
plain functions of the gateway's state; ``create_app`` registers them.
"""

from __future__ import annotations

import time
import uuid

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import HTTPConnection

from ttsvc.errors import (
    ClientClosedRequest,
    InvalidJson,
    InvalidParameter,
    RequestTimeout,
    TTSError,
)
from ttsvc.gateway.openai_compat import openai_error
from ttsvc.gateway.state import GatewayState

SYNTHESIS_PATHS = ("/synthesize", "/v1/audio/speech", "/synthesize/with-timestamps")
"""Routes whose every request ends in exactly one completion log line."""

_HTTP_TYPES = {400: InvalidJson.type, 404: "not_found", 405: "method_not_allowed"}
"""Error types of the HTTP errors Starlette and FastAPI raise themselves."""
_HTTP_MESSAGES = {
    "invalid_json": "body is not valid JSON (or not UTF-8)",
    "not_found": "no such route",
    "method_not_allowed": "method not allowed on this route",
}


def log_labels(request: HTTPConnection) -> dict[str, object]:
    """The request's key name and format (and on /v1 its stream format), for its log line (set
    as the request is checked)."""
    labels = {"key": getattr(request.state, "key_name", None),
              "format": getattr(request.state, "format", None)}  # fmt: skip
    if (framing := getattr(request.state, "stream_format", None)) is not None:
        labels["stream_format"] = framing
    return labels


def error_response(
    state: GatewayState,
    request: Request,
    body: dict[str, str],
    status: int,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """Answer a synthesis request that produced no audio, and record it once."""
    recorded = getattr(request.state, "recorded", False)  # an exchange already logged it
    if request.url.path in SYNTHESIS_PATHS and not recorded:
        request.state.request_id = record_refusal(state, request, body, status,
                                                  _started(request),
                                                  getattr(request.state, "text_len", None))
        request.state.recorded = True  # a later error of the same request (a 400 after a 413)
    if (uid := getattr(request.state, "request_id", None)) is not None:
        headers = {**(headers or {}), "X-Request-Id": uid}  # the id its log line carries
    if request.url.path.startswith("/v1/"):
        return JSONResponse(openai_error(body), status_code=status, headers=headers)
    return JSONResponse(body, status_code=status, headers=headers)


def record_refusal(
    state: GatewayState,
    conn: HTTPConnection,
    body: dict[str, str],
    status: int,
    started: float,
    text_len: int | None,
) -> str:
    """Record a synthesis request refused before it reached a worker: its counters and its one
    completion line; returns the uid the line carries."""
    uid = uuid.uuid4().hex
    fields: dict[str, object] = {
        "uid": uid,
        "worker": None,  # refused before dispatch: no worker, queue, audio or engine
        "qsize": None,
        "text_len": text_len,
        "ttfa_ms": None,
        "latency": round(1000 * (time.perf_counter() - started), 1),
        "audio_s": 0.0,
        "rtf": None,
        "engine_version": None,
        "status": body["type"],
        "error_type": body["type"],
        **log_labels(conn),
    }
    state.complete(fields, status)
    return uid


def _started(request: Request) -> float:
    started = getattr(request.state, "started", None)
    return started if isinstance(started, float) else time.perf_counter()


async def tts_error(state: GatewayState, request: Request, exc: TTSError) -> JSONResponse:
    return error_response(state, request, exc.to_body(), exc.status, exc.headers())


async def http_error(state: GatewayState, request: Request, exc: HTTPException) -> JSONResponse:
    # Starlette's own answers (unknown route, wrong method) and FastAPI's 400 for a body it
    # could not decode, in the same shape as every other error
    if getattr(request.state, "timed_out", None) == "body":
        # the connection already answered 408 and closed; the failed body read lands here
        timeout = RequestTimeout("the request body took too long")
        return error_response(state, request, timeout.to_body(), timeout.status)
    if getattr(request.state, "body_cut", False):
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

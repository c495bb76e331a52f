"""Error taxonomy.

Each class carries the HTTP status and the short ``type`` string that clients see, so the gateway
maps every failure through one table instead of deciding per call site. Messages name the field or
file at fault because an operator reading a log line has nothing else to go on.
"""

from __future__ import annotations

import math


class TTSError(Exception):
    """Base of every error ttsvc raises on purpose."""

    status: int = 500
    type: str = "internal_error"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def headers(self) -> dict[str, str]:
        """Response headers this error requires (``Retry-After``, ``WWW-Authenticate``)."""
        return {}

    def to_body(self) -> dict[str, str]:
        """The JSON body a client receives: never a stack trace."""
        body = {"error": self.message, "type": self.type}
        if self.field is not None:
            body["field"] = self.field
        return body


class InvalidJson(TTSError):
    """The request body is not JSON (or not the JSON object a route takes)."""

    status = 400
    type = "invalid_json"


class InvalidParameter(TTSError):
    """A request parameter is outside its documented range."""

    status = 422
    type = "invalid_parameter"


class NothingToSay(InvalidParameter):
    """The text leaves nothing to speak once normalized (empty, whitespace, only symbols)."""

    type = "empty_text"


class TextTooLong(InvalidParameter):
    """The text exceeds the configured character cap."""

    type = "text_too_long"


class UnspeakableText(InvalidParameter):
    """The phonemizer crashed or hung on the text. Only this request fails: the phonemizer runs in
    its own process, which is replaced for the next request."""

    type = "unspeakable_text"


class UnsupportedScript(InvalidParameter):
    """The text has letters of a script the voice's language does not speak (Chinese to an
    English voice): refused rather than read out as letter names."""

    type = "unsupported_script"


class InvalidSsml(InvalidParameter):
    """An SSML document ttsvc will not speak: malformed, unsafe (a DTD, entities), an element or
    value it does not take, or past a cap. The message gives line, column and reason."""

    type = "invalid_ssml"

    def __init__(self, message: str, *, line: int, column: int, field: str = "text") -> None:
        super().__init__(message, field=field)
        self.line = line
        self.column = column


class AudioTooLong(InvalidParameter):
    """The text would make more audio than the configured cap: refused before any audio."""

    type = "audio_too_long"


class FormatUnavailable(InvalidParameter):
    """A response format the API names but this build cannot encode (AAC: no libsndfile codec)."""

    type = "format_unavailable"


class UnknownVoice(TTSError):
    """No engine set is published for the requested voice."""

    status = 404
    type = "unknown_voice"


class VoiceUnavailable(TTSError):
    """The voice is mounted but cannot serve now: no version of it verified yet, or a worker
    could not load it. Retrying later may work; ``GET /voices`` says why."""

    status = 503
    type = "voice_unavailable"


class TimestampsUnavailable(TTSError):
    """Word timestamps were asked of a voice whose engines were compiled without phoneme
    durations (before they were an output): its audio serves, its timestamps need a recompile.

    409, not 422: the request is valid, the engine version it would run on cannot answer it."""

    status = 409
    type = "timestamps_unavailable"


class EngineError(TTSError):
    """An engine set could not be used: missing, altered, truncated or failing to load.

    ``message`` is the detail for the log (host paths, the runtime's own words). ``file`` and
    ``reason``, where the raiser knows them, are what a client may be told (``GET /voices``):
    the file's name and a short reason, nothing about the host.
    """

    status = 503
    type = "engine_unavailable"

    def __init__(
        self, message: str, *, file: str | None = None, reason: str | None = None
    ) -> None:
        super().__init__(message)
        self.file = file
        self.reason = reason

    def public(self) -> str:
        """``file: reason`` for clients; a generic line when the raiser gave no reason."""
        reason = self.reason or "could not be loaded (the server log has the detail)"
        return f"{self.file}: {reason}" if self.file else reason


class EngineIntegrityError(EngineError):
    """An engine file does not match its manifest (size or sha256); it was never parsed."""

    type = "engine_integrity"


class LexiconError(TTSError):
    """A pronunciation lexicon (a W3C PLS file) that may not be used: malformed or unsafe XML,
    past a cap, or a lexeme it cannot apply.

    ``line`` and ``column`` (1-based) point at the fault: the XML parser's position for malformed
    XML, the ``lexeme`` element's start tag for a lexeme at fault; ``None`` where the file as a
    whole is (too large, unreadable). ``file`` is the file's name, never a host path, so
    ``public`` may be shown to clients (``GET /lexicons``).
    """

    status = 422
    type = "invalid_lexicon"

    def __init__(
        self, file: str, reason: str, *, line: int | None = None, column: int | None = None
    ) -> None:
        where = "".join(f":{n}" for n in (line, column) if n is not None)
        super().__init__(f"{file}{where}: {reason}")
        self.file = file
        self.reason = reason
        self.line = line
        self.column = column

    def public(self) -> dict[str, object]:
        """The ``GET /lexicons`` entry of a refused file."""
        return {"file": self.file, "line": self.line, "column": self.column,
                "reason": self.reason}  # fmt: skip


class UnknownLexicon(InvalidParameter):
    """A request names a lexicon no loaded file defines (names only, never a path)."""

    type = "unknown_lexicon"


class GraphShapeError(TTSError):
    """A checkpoint does not have the VITS shape `ttsvc compile` knows how to split."""

    status = 400
    type = "unsupported_graph"


class VoiceConfigError(TTSError):
    """A checkpoint's JSON config is not a usable Piper voice config (no phoneme map, an
    espeak-ng voice that does not exist ...); ``field`` names the part at fault."""

    status = 400
    type = "invalid_voice_config"


class BackendUnavailable(TTSError):
    """The requested backend cannot run on this machine (e.g. TensorRT without a GPU)."""

    status = 501
    type = "backend_unavailable"


class UnknownModel(TTSError):
    """``model`` of an OpenAI-style request is none of those ``GET /v1/models`` lists."""

    status = 404
    type = "unknown_model"


class Busy(TTSError):
    """Admission refused: every stream slot and queue place is taken (retry after
    ``retry_after_s``, in whole seconds on the wire)."""

    status = 429
    type = "overloaded"

    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(max(1, math.ceil(self.retry_after_s)))}


class NoHeadroom(Busy):
    """Every live worker's real-time capacity is taken: a new stream would make running ones
    run dry (or wait behind them), so it is refused at once, before any worker sees it."""

    type = "no_headroom"


class Unauthorized(TTSError):
    """No API key, or not one of the configured keys (the key itself is never echoed)."""

    status = 401
    type = "unauthorized"

    def __init__(self, message: str, *, presented: bool) -> None:
        super().__init__(message)
        self.presented = presented

    def headers(self) -> dict[str, str]:
        # RFC 6750: a request without credentials gets the bare challenge
        challenge = 'Bearer realm="ttsvc"'
        if self.presented:
            challenge += ', error="invalid_token"'
        return {"WWW-Authenticate": challenge}


class RateLimited(TTSError):
    """The key is over its requests or audio-seconds per minute."""

    status = 429
    type = "rate_limited"

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(max(1, math.ceil(self.retry_after_s)))}


class KeyStreamsExceeded(TTSError):
    """The key already holds as many concurrent streams as it may (its share of the slots)."""

    status = 429
    type = "key_streams_exceeded"

    def headers(self) -> dict[str, str]:
        return {"Retry-After": "1"}


class Draining(TTSError):
    """The gateway is shutting down and takes no new synthesis."""

    status = 503
    type = "draining"


class ShutDown(TTSError):
    """The server's drain grace ended while this request was still running: it is cut, and
    recorded as such, rather than cancelled later by the server's own shutdown timeout."""

    status = 503
    type = "shutdown"


class PayloadTooLarge(TTSError):
    """Request body over the configured cap."""

    status = 413
    type = "payload_too_large"


class RequestTimeout(TTSError):
    """The request body did not arrive within its deadline (answered by the connection, not the
    app: see ``gateway/http/connections.py``)."""

    status = 408
    type = "request_timeout"


class QueueTimeout(TTSError):
    """No audio within the queue-wait deadline; the job was cancelled, never half-synthesized."""

    status = 503
    type = "queue_timeout"


class ClientClosedRequest(TTSError):
    """The client went away before its first audio: nothing is sent, the job is cancelled.

    499 is nginx's "client closed request": it keeps such requests apart from successes (200)
    and from the service's own failures (5xx) in logs and metrics.
    """

    status = 499
    type = "cancelled"


class PortUnavailable(TTSError):
    """``ttsvc serve`` cannot listen where it was told to (a start-up error, never an HTTP
    answer: the message names the port and the flag that moves it)."""

    type = "port_unavailable"


class Forbidden(TTSError):
    """The client's address may not use this listener (the Wyoming allow-list)."""

    status = 403
    type = "forbidden"


class OriginNotAllowed(TTSError):
    """A browser page of another origin opened a WebSocket: CORS does not cover WebSockets, so
    the gateway applies the same origins to them that CORS lets read its HTTP answers."""

    status = 403
    type = "origin_not_allowed"


class NoWorkerAvailable(TTSError):
    """No registered worker is ready with a fresh heartbeat: the gateway answers 503.

    This is the circuit breaker (``ttsvc.balancer``): requests fail fast instead of queueing
    behind dead workers.
    """

    status: int = 503
    type: str = "no_worker_available"

    def __init__(self, registered: int, live: int) -> None:
        super().__init__(
            f"no worker available: {live} of {registered} registered workers are live "
            "(ready with a heartbeat younger than the timeout)"
        )
        self.registered = registered
        """Workers known to the balancer when the pick failed."""
        self.live = live
        """Workers that qualified (always 0 when raised by ``HeatScoreBalancer.pick``)."""


class WorkerLost(TTSError):
    """The worker serving a stream exited: only its own streams fail, and it is replaced."""

    status = 503
    type = "worker_died"


class WorkerStalled(WorkerLost):
    """The worker serving a stream stopped responding (killed and replaced), or the stream sent
    nothing for longer than its stall limit."""

    type = "stalled"


class WorkerUnresponsive(WorkerLost):
    """The worker a request waited on for its first audio went silent past the heartbeat
    timeout: the request fails at once instead of waiting out the queue deadline."""

    type = "worker_unresponsive"

"""FastAPI application: validate, admit, route to a worker, stream its audio back.

Runs in the gateway process on one asyncio loop. Nothing here synthesizes or phonemizes: that
happens in workers, so the loop only moves bytes. Every error body is ``{"error", "type"}`` from
the error classes' own status and type (one table, ``ttsvc.errors``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import json
import logging
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    Response,
    StreamingResponse,
)
from fastapi.staticfiles import StaticFiles
from prometheus_client import start_http_server
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ttsvc.audio.encode import FORMATS, Encoder, OutputFormat
from ttsvc.audio.resample import SUPPORTED_RATES
from ttsvc.backends.base import EngineSource
from ttsvc.balancer import HeatScoreBalancer
from ttsvc.config import Settings
from ttsvc.errors import (
    Busy,
    ClientClosedRequest,
    Draining,
    EngineError,
    FormatUnavailable,
    InvalidParameter,
    PayloadTooLarge,
    QueueTimeout,
    RequestTimeout,
    TextTooLong,
    TimestampsUnavailable,
    TTSError,
    UnknownModel,
    UnknownVoice,
)
from ttsvc.gateway.auth import KeyStore
from ttsvc.gateway.catalog import VoiceCatalog
from ttsvc.gateway.hotswap import EngineSwapper, Rejection, load_manifest_json
from ttsvc.gateway.openai_compat import (
    OPENAI_MODELS,
    OPENAI_RATE,
    OPENAI_VOICES,
    SpeechRequest,
    model_card,
    openai_error,
)
from ttsvc.gateway.ratelimit import KeyRateLimiter, Quota, Ticket
from ttsvc.gateway.sse import AudioBody, SpeechEventBody
from ttsvc.observability.logs import get_logger
from ttsvc.observability.metrics import ServiceMetrics
from ttsvc.pool.supervisor import Mailbox, WorkerPool, WorkerSpec
from ttsvc.protocol import AudioChunkMsg, EngineSpec, StreamDone, StreamError, SynthesisJob
from ttsvc.repository.cache import EngineCache
from ttsvc.voice import VOICE_FILE, VoiceConfig, describe, speaker_id
from ttsvc.worker.plan import ComputePlan

log = get_logger("gateway")

STATIC = Path(__file__).with_name("static")
"""The try-it page's files (package data): served by the service itself, no CDN."""
PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "media-src 'self' blob:; img-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
"""The page talks to its own origin only; its audio element plays blobs the page made."""


class VoiceSettings(BaseModel):
    """How to speak, apart from the text: the fields every ttsvc API takes (``/synthesize``
    and its timestamped form, the WebSocket's ``start``), declared once with their ranges."""

    model_config = ConfigDict(extra="forbid")

    voice: str | None = None
    speaker: int | str | None = None
    """A multi-speaker voice's speaker, by name or id (``None``: its first)."""
    speed: float = Field(1.0, ge=0.25, le=4.0)
    noise_scale: float | None = Field(None, ge=0.0, le=2.0)
    noise_w: float | None = Field(None, ge=0.0, le=2.0)
    sentence_silence: float = Field(0.2, ge=0.0, le=5.0)
    sample_rate: int | None = None


class SynthesizeRequest(VoiceSettings):
    """Body of ``POST /synthesize``."""

    text: str
    format: Literal["wav", "pcm", "mulaw", "mp3", "opus", "flac"] = "wav"
    stream: bool | None = None
    """Unset: streamed, except formats sent only whole (flac)."""


@dataclass(frozen=True)
class SpeechOrder:
    """What either API asks for, validated and resolved: the one input of the shared path."""

    text: str
    speed: float
    noise_scale: float | None
    noise_w: float | None
    sentence_silence: float
    sample_rate: int | None
    """Output rate, ``None`` for the voice's own."""
    format: OutputFormat
    stream: bool
    api: str
    """``synthesize`` or ``openai``, for metrics."""
    voice: str = ""
    """The served voice (resolved from the request's name or alias)."""
    speaker: int | None = None
    """Its speaker id (resolved from a name), ``None`` for its first."""
    timestamps: bool = False
    """Ask the worker for word timestamps (``AudioChunkMsg.words``)."""


SpeakerLookup = Callable[[str, "int | str | None"], Awaitable["int | None"]]
"""A voice's speaker id for a request's ``speaker`` (a 422 naming the speakers if none)."""


@dataclass
class GatewayState:
    """Mutable state of one gateway: the pool, the balancer, admission counters, drain flag."""

    settings: Settings
    voice: str
    pool: WorkerPool | None = None
    catalog: VoiceCatalog | None = None
    balancer: HeatScoreBalancer | None = None
    draining: bool = False
    inflight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    metrics: ServiceMetrics = field(default_factory=ServiceMetrics)
    keys: KeyStore | None = None
    """API keys in force; ``None``: no authentication."""
    limiter: KeyRateLimiter = field(default_factory=lambda: KeyRateLimiter(time.monotonic))
    exchanges: set[SynthesisExchange] = field(default_factory=set)
    """Synthesis requests in flight (dispatched to a worker, not yet finished)."""

    def abort_exchanges(self, reason: str, message: str) -> int:
        """End every request in flight with ``reason`` (the drain's grace is over); returns how
        many. Each is recorded at once; its response then ends as a failure (see ``abort``)."""
        exchanges = list(self.exchanges)
        for exchange in exchanges:
            exchange.abort(reason, message)
        return len(exchanges)

    def complete(self, fields: dict[str, object], code: int) -> None:
        """Record one finished synthesis request: counters, and its one completion log line."""
        outcome = str(fields.get("status", "ok"))
        self.metrics.requests.labels(str(code), outcome).inc()
        if code in (401, 429, 503):
            self.metrics.rejections.labels(outcome).inc()
        log.info("request", code=code, **{"voice": self.voice, **fields})

    @property
    def swapper(self) -> EngineSwapper | None:
        """The default voice's swapper (``None`` before start-up)."""
        return self.catalog.get(self.voice) if self.catalog is not None else None

    def native_rate(self, voice: str) -> int:
        """The sample rate ``voice`` speaks at (its serving manifest's)."""
        swapper = self.catalog.get(voice) if self.catalog is not None else None
        if swapper is None or swapper.current is None:
            return 22050
        return load_manifest_json(swapper.current.manifest).sample_rate

    def require_durations(self, voice: str) -> None:
        """Refuse word timestamps up front (409 on ``voice``) when the voice's serving engines
        were compiled without phoneme durations; a worker still refuses a stream whose engines
        turn out to lack them."""
        swapper = self.catalog.get(voice) if self.catalog is not None else None
        if swapper is None or swapper.current is None:
            return
        if not load_manifest_json(swapper.current.manifest).durations:
            raise TimestampsUnavailable(
                f"voice {voice!r} engine version {swapper.current.label} was compiled without "
                "phoneme durations: recompile it (`ttsvc compile`) for word timestamps",
                field="voice",
            )

    def frames_per_s(self, voice: str) -> float:
        """Acoustic frames ``voice`` generates per second of audio (its rate over its hop)."""
        swapper = self.catalog.get(voice) if self.catalog is not None else None
        if swapper is None or swapper.current is None:
            return 22050 / 256
        manifest = load_manifest_json(swapper.current.manifest)
        return manifest.sample_rate / manifest.hop_length

    def resolve_voice(self, name: str | None) -> str:
        """The served voice a request's ``voice`` names (OpenAI's names and aliases included):
        a voice with no verified engine yet is a 503 ``engine_unavailable``, as the whole
        service is before its first; a name nothing serves a 404 listing the voices that do."""
        if name is None:
            name = self.voice
        aliases = {alias: self.voice for alias in OPENAI_VOICES}
        aliases.update(self.settings.voice_aliases)
        target = aliases.get(name, name)
        catalog = self.catalog
        swapper = catalog.get(target) if catalog is not None else None
        if swapper is not None and swapper.current is not None:
            return target
        if swapper is not None:
            raise EngineError(f"voice {target!r} has no verified engine yet: GET /voices says "
                              "why")  # fmt: skip
        served = ", ".join(sorted(catalog.serving())) if catalog is not None else ""
        raise UnknownVoice(f"unknown voice {name!r}; served: {served or 'none'}", field="voice")


SYNTHESIS_PATHS = ("/synthesize", "/v1/audio/speech", "/synthesize/with-timestamps")
"""Routes whose every request ends in exactly one completion log line."""

_HTTP_TYPES = {400: "invalid_json", 404: "not_found", 405: "method_not_allowed"}
"""Error types of the HTTP errors Starlette and FastAPI raise themselves."""
_HTTP_MESSAGES = {
    "invalid_json": "body is not valid JSON (or not UTF-8)",
    "not_found": "no such route",
    "method_not_allowed": "method not allowed on this route",
}


def _labels(request: HTTPConnection) -> dict[str, object]:
    """The request's key name and format (and on /v1 its stream format), for its log line (set
    as the request is checked)."""
    labels = {"key": getattr(request.state, "key_name", None),
              "format": getattr(request.state, "format", None)}  # fmt: skip
    if (framing := getattr(request.state, "stream_format", None)) is not None:
        labels["stream_format"] = framing
    return labels




def _error(
    state: GatewayState,
    request: Request,
    body: dict[str, str],
    status: int,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """Answer a synthesis request that produced no audio, and record it once."""
    recorded = getattr(request.state, "recorded", False)  # an exchange already logged it
    if request.url.path in SYNTHESIS_PATHS and not recorded:
        uid = record_refusal(state, request, body, status, _started(request),
                             getattr(request.state, "text_len", None))  # fmt: skip
        request.state.recorded = True  # a later error of the same request (a 400 after a 413)
        headers = {**(headers or {}), "X-Request-Id": uid}
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
        **_labels(conn),
    }
    state.complete(fields, status)
    return uid


def _started(request: Request) -> float:
    started = getattr(request.state, "started", None)
    return started if isinstance(started, float) else time.perf_counter()


def create_app(settings: Settings, voice: str) -> FastAPI:
    """Build the app; the worker pool starts in the lifespan, not at import or construction."""
    slots = settings.workers * settings.max_streams_per_worker
    state = GatewayState(settings, voice, limiter=KeyRateLimiter(time.monotonic, slots))
    state.idle.set()
    if settings.api_keys_file is not None:
        default = Quota(settings.default_rpm, settings.default_audio_s_per_min,
                        settings.default_key_streams)  # fmt: skip
        state.keys = KeyStore(settings.api_keys_file, default, polling=settings.watch_polling)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        state.balancer = HeatScoreBalancer(settings.balancer_settings(), time.monotonic)
        scratch = settings.engine_cache_dir or Path(tempfile.mkdtemp(prefix="ttsvc-engines-"))
        balancer = state.balancer

        def start_pool(engine: EngineSpec) -> WorkerPool:
            """Start the workers on the first verified engine set (at start, or once one
            appears: until then the gateway is up but unready)."""
            spec = WorkerSpec(engine, settings.threads, settings.schedule(),
                              settings.max_sentence_chars, settings.multiplex, settings.log_level,
                              settings.worker_start_timeout_s,
                              settings.worker_silence_timeout_s,
                              ComputePlan(settings.compute_threads, settings.scheduler,
                                          settings.realtime_load,
                                          settings.step_floor_ms / 1000.0),
                              log_format=settings.log_format, voices={engine.voice: engine},
                              voice_budget=int(settings.voice_memory_mb * 2**20))  # fmt: skip
            pool = WorkerPool(spec, settings.workers, balancer, loop, state.metrics)
            state.pool = pool
            pool.start()
            if state.draining:
                pool.stop_respawning()
            return pool

        def swapper(name: str) -> EngineSwapper:
            # a cache per voice: a swap prunes the files its voice no longer needs, only those
            return EngineSwapper(settings.engines_dir, name, EngineCache(scratch / name),
                                 settle_s=settings.watch_settle_s,
                                 polling=settings.watch_polling,
                                 swap_timeout_s=settings.swap_timeout_s, metrics=state.metrics,
                                 start_pool=start_pool, running=lambda: state.pool)  # fmt: skip

        if settings.engine_cache_dir is not None:  # files of the flat layout before voices
            await asyncio.to_thread(_drop_loose_files, scratch)
        catalog = VoiceCatalog(settings.engines_dir, voice, swapper,
                               polling=settings.watch_polling)  # fmt: skip
        state.catalog = catalog
        metrics_server = None
        if settings.metrics_port:
            metrics_server, _thread = start_http_server(
                settings.metrics_port, settings.host, registry=state.metrics.registry
            )
        keys = state.keys
        tasks = []
        if keys is not None:
            await asyncio.to_thread(keys.load)  # a key file that does not parse stops start-up
            log.info("keys_loaded", path=str(keys.path), names=sorted(k.name for k in keys.keys))
            tasks.append(loop.create_task(keys.watch(state.limiter.forget)))
        # starts the pool if a version verifies; with none, the gateway waits (unready) for one
        await catalog.initial()
        tasks.append(loop.create_task(catalog.watch()))
        wyoming = None
        if settings.wyoming_port:
            from ttsvc.gateway.wyoming import WyomingServer  # noqa: PLC0415 - it imports this

            wyoming = WyomingServer(state, settings.host, settings.wyoming_port)
            await wyoming.start()
        try:
            yield
        finally:
            if wyoming is not None:
                await wyoming.stop()
            catalog.stop()
            if keys is not None:
                keys.stop()
            background = catalog.background
            for task in [*tasks, *background]:
                task.cancel()  # a rollout in progress must not hold up shutdown
            await asyncio.gather(*tasks, *background, return_exceptions=True)
            if state.pool is not None:
                await state.pool.close()
            if metrics_server is not None:
                metrics_server.shutdown()
                metrics_server.server_close()
            if settings.engine_cache_dir is None:
                await asyncio.to_thread(shutil.rmtree, scratch, True)

    # the documentation routes are added below, behind the key like every other route
    app = FastAPI(title="ttsvc", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)  # fmt: skip
    app.state.gateway = state

    @app.exception_handler(TTSError)
    async def _tts_error(request: Request, exc: TTSError) -> JSONResponse:
        return _error(state, request, exc.to_body(), exc.status, exc.headers())

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        # Starlette's own answers (unknown route, wrong method) and FastAPI's 400 for a body it
        # could not decode, in the same shape as every other error
        if getattr(request.state, "timed_out", None) == "body":
            # the connection already answered 408 and closed; the failed body read lands here
            timeout = RequestTimeout("the request body took too long")
            return _error(state, request, timeout.to_body(), timeout.status)
        kind = _HTTP_TYPES.get(exc.status_code, "http_error")
        body = {"error": _HTTP_MESSAGES.get(kind, str(exc.detail)), "type": kind}
        if kind == "invalid_json":
            body["field"] = "body"
        return _error(state, request, body, exc.status_code, dict(exc.headers or {}))

    @app.exception_handler(Exception)
    async def _crashed(request: Request, exc: Exception) -> JSONResponse:
        # uvicorn still logs the traceback; the client gets the shape, never the trace
        body = {"error": "internal error", "type": "internal_error"}
        return _error(state, request, body, 500)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":  # its loc holds a character offset, no field
            reason = first.get("ctx", {}).get("error", "not JSON")
            at = first.get("loc", ("body", "?"))[-1]
            body = {"error": f"body is not valid JSON: {reason} at character {at}",
                    "type": "invalid_json", "field": "body"}  # fmt: skip
            return _error(state, request, body, 400)
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        name = ".".join(loc) or "body"
        body = {"error": f"{name}: {first.get('msg', 'invalid')}", "type": "invalid_parameter",
                "field": name}  # fmt: skip
        return _error(state, request, body, 422)

    @app.middleware("http")
    async def _body_cap(request: Request, call_next):  # type: ignore[no-untyped-def]
        request.state.started = time.perf_counter()
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > settings.max_body_bytes:
            exc = PayloadTooLarge(f"body over {settings.max_body_bytes} bytes")
            return _error(state, request, exc.to_body(), exc.status)
        return await call_next(request)

    app.add_middleware(StreamAbort)  # outside the http middleware above (see its docstring)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes, state=state)
    if settings.cors_origins:  # added last, so outermost: refusals (401, 413) carry CORS too
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type", "x-request-id"],
            expose_headers=["x-request-id", "x-sample-rate", "x-engine-version", "retry-after"],
        )

    async def authenticate(request: Request) -> None:
        """Every route but /health and /live: the key's name is kept for logs, never the key."""
        if state.keys is not None:
            key = state.keys.authenticate(request.headers.get("authorization"))
            request.state.key = key
            request.state.key_name = key.name

    guarded = [Depends(authenticate)]

    if settings.api_docs:
        # FastAPI's own documentation routes take no dependencies: these are the same pages
        # behind the key (a browser cannot send one, so with keys on they serve curl and tools)

        @app.get("/openapi.json", dependencies=guarded, include_in_schema=False)
        async def openapi() -> JSONResponse:
            return JSONResponse(app.openapi())

        @app.get("/docs", dependencies=guarded, include_in_schema=False)
        async def docs() -> HTMLResponse:
            return get_swagger_ui_html(openapi_url="/openapi.json", title="ttsvc")

        @app.get("/redoc", dependencies=guarded, include_in_schema=False)
        async def redoc() -> HTMLResponse:
            return get_redoc_html(openapi_url="/openapi.json", title="ttsvc")

    # the page is static and holds no secret: public even with keys on (it asks for the key and
    # sends it with its own requests)
    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8",
                            headers={"Content-Security-Policy": PAGE_POLICY,
                                     "X-Content-Type-Options": "nosniff"})  # fmt: skip

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/live")
    async def live() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/health")
    async def health() -> JSONResponse:
        pool, balancer = state.pool, state.balancer
        if state.draining:
            return JSONResponse({"status": "draining", "score": 0.0}, status_code=503)
        if state.catalog is not None and not state.catalog.serving():
            # nothing verified to serve: GET /voices says which versions were refused and why
            return JSONResponse({"status": "no_verified_engine", "score": 0.0}, status_code=503)
        if pool is None or balancer is None or not balancer.live_workers():
            return JSONResponse({"status": "no_ready_worker", "score": 0.0}, status_code=503)
        return JSONResponse(
            {"status": "ok", "score": round(balancer.pool_score(), 2), "inflight": state.inflight}
        )

    configs: dict[tuple[str, str], dict[str, object]] = {}
    """Each served engine version's Piper config, by voice and label (read once, off the event
    loop)."""

    async def config(spec: EngineSpec) -> dict[str, object]:
        key = spec.voice, spec.label
        if key not in configs:
            raw = await asyncio.to_thread(EngineSource.from_spec(spec).read, VOICE_FILE)
            configs[key] = json.loads(raw.decode("utf-8"))
        return configs[key]

    async def details(spec: EngineSpec | None) -> dict[str, object]:
        return {} if spec is None else describe(await config(spec))

    async def speaker(voice: str, value: int | str | None) -> int | None:
        """The id of the speaker a request names, checked against its voice's config: a 422 on
        ``speaker`` naming the voice's speakers, before any worker is asked."""
        swapper = state.catalog.get(voice) if state.catalog is not None else None
        if value is None or swapper is None or swapper.current is None:
            return None
        try:
            return speaker_id(VoiceConfig.from_piper(await config(swapper.current), voice), value)
        except ValueError as exc:
            raise InvalidParameter(str(exc), field="speaker") from exc

    def voice_entry(name: str, swapper: EngineSwapper, details: dict[str, object],
                    aliases: list[str]) -> dict[str, object]:  # fmt: skip
        ready = [w for w in state.pool.workers.values() if w.ready] if state.pool else []
        serving = sorted({label for w in ready if (label := w.specs.get(name)) is not None})
        current = swapper.current

        def listed(found: dict[int, Rejection]) -> list[dict[str, object]]:
            return [r.public() for _, r in sorted(found.items(), reverse=True)]

        engines = {
            "current": current.label if current else None,
            "reloads": dict(swapper.reloads),
            "last_error": swapper.last_error,
            # versions present that may not serve, newest first: version, file name, reason
            "rejected": listed(swapper.rejected),
            # versions with a file still changing (a copy in progress), judged once it settles
            "pending": listed(swapper.pending),
        }
        return {"name": name, **details, "default": name == state.voice, "aliases": aliases,
                "state": "serving" if current and serving else "loading" if current
                else "verifying" if swapper.deferred else "no_engine",
                "engine_versions": serving,
                # workers holding it loaded now; the others load it when a request needs it
                "loaded_on": sorted(w.id for w in ready if name in w.voices),
                "engines": engines}  # fmt: skip

    @app.get("/voices", dependencies=guarded)
    async def voices() -> dict[str, object]:
        catalog = state.catalog
        if catalog is None:
            return {"voices": []}
        names = sorted(catalog.swappers, key=lambda n: (n != state.voice, n))
        aliases: dict[str, list[str]] = {}
        for alias, target in {**{a: state.voice for a in OPENAI_VOICES},
                              **settings.voice_aliases}.items():  # fmt: skip
            aliases.setdefault(target, []).append(alias)
        entries = []
        for name in names:
            swapper = catalog.swappers[name]
            if name != state.voice and not (swapper.present or swapper.current):
                continue  # no version at all yet (a compile in progress, lost+found)
            entries.append(voice_entry(name, swapper, await details(swapper.current),
                                       sorted(aliases.get(name, []))))  # fmt: skip
        return {"voices": entries}

    @app.post("/synthesize", dependencies=guarded)
    async def synthesize(body: SynthesizeRequest, request: Request) -> Response:
        request.state.format = body.format
        voice = state.resolve_voice(body.voice)
        fmt = FORMATS[body.format]
        order = SpeechOrder(body.text, body.speed, body.noise_scale, body.noise_w,
                            body.sentence_silence, _rate(fmt, body.sample_rate), fmt,
                            _streamed(fmt, body.stream), "synthesize", voice,
                            await speaker(voice, body.speaker))  # fmt: skip
        return await _synthesize(state, order, request)

    @app.post("/v1/audio/speech", dependencies=guarded)
    async def speech(body: SpeechRequest, request: Request) -> Response:
        request.state.format = body.response_format
        request.state.stream_format = body.stream_format
        if body.model not in OPENAI_MODELS:
            raise UnknownModel(f"unknown model {body.model!r}: GET /v1/models lists them",
                               field="model")  # fmt: skip
        voice = state.resolve_voice(body.voice if isinstance(body.voice, str) else body.voice.id)
        if body.response_format == "aac":
            raise FormatUnavailable("aac is not available (no AAC encoder here): use mp3, opus, "
                                    "flac, wav or pcm", field="response_format")  # fmt: skip
        fmt = FORMATS[body.response_format]
        if body.timestamps:
            if body.stream_format != "sse":
                raise InvalidParameter("timestamps travel in speech events: set stream_format "
                                       '"sse" (or use /synthesize/with-timestamps)',
                                       field="timestamps")  # fmt: skip
            state.require_durations(voice)
        order = SpeechOrder(body.input, body.speed, None, None, 0.2, OPENAI_RATE, fmt,
                            _streamed(fmt, body.stream), "openai", voice,
                            timestamps=body.timestamps)  # fmt: skip
        if body.stream_format == "sse":
            events = SpeechEventBody(len(body.input), state.frames_per_s(voice), body.timestamps)
            return await _synthesize(state, order, request, events)
        return await _synthesize(state, order, request)

    # imported here: the route's module builds on this one's shared path
    from ttsvc.gateway.stream_ws import install as install_stream  # noqa: PLC0415

    install_stream(app, state, speaker)
    from ttsvc.gateway.captions import add_timestamps_route  # noqa: PLC0415 - it imports this

    add_timestamps_route(app, state, guarded, speaker)

    @app.get("/v1/models", dependencies=guarded)
    async def models() -> dict[str, object]:
        return {"object": "list", "data": [model_card(m) for m in OPENAI_MODELS]}

    @app.get("/v1/models/{model_id}", dependencies=guarded)
    async def model(model_id: str) -> dict[str, object]:
        if model_id not in OPENAI_MODELS:
            raise UnknownModel(f"unknown model {model_id!r}", field="model")
        return model_card(model_id)

    return app


def _drop_loose_files(scratch: Path) -> None:
    """Delete engine-cache files left directly in the cache directory: the cache now keeps a
    directory per voice, and a kept cache directory from before would keep them forever."""
    for path in scratch.iterdir() if scratch.is_dir() else ():
        if path.is_file():
            path.unlink(missing_ok=True)


def _rate(fmt: OutputFormat, requested: int | None) -> int | None:
    """The output rate for ``fmt``: the requested one if the format takes it, else its default."""
    if requested is None:
        return fmt.default_rate
    if requested not in SUPPORTED_RATES:
        rates = ", ".join(str(r) for r in SUPPORTED_RATES)
        raise InvalidParameter(
            f"sample_rate {requested}: supported rates are {rates}", field="sample_rate"
        )
    if (why := fmt.rate_error(requested)) is not None:
        raise InvalidParameter(why, field="sample_rate")
    return requested


def _streamed(fmt: OutputFormat, requested: bool | None) -> bool:
    """Whether the response streams: as asked, else as the format allows. A whole-file format
    refuses an explicit ``stream: true`` rather than ignore it: the client asked for audio as it
    is made, and is told which formats give it."""
    if requested is None:
        return fmt.streams
    if requested and not fmt.streams:
        playable = ", ".join(name for name, f in FORMATS.items() if f.streams)
        raise InvalidParameter(
            f"{fmt.name} is sent only as a whole file (its header holds the sample count); "
            f"formats that stream: {playable}",
            field="stream",
        )
    return requested


def _close_later(encoder: Encoder) -> None:
    """Release an encoder off the loop (closing may flush a codec, or wait for a chunk being
    encoded); nothing waits for it."""

    def close() -> None:
        with contextlib.suppress(Exception):
            encoder.close()

    asyncio.get_running_loop().run_in_executor(None, close)


async def _encode(encoder: Encoder, pcm: bytes | None) -> bytes:
    """Encode a chunk (``None``: finish) in a thread, unless it only passes bytes through."""
    call = encoder.finish if pcm is None else (lambda: encoder.encode(pcm))
    if encoder.light:
        return call()
    return await asyncio.to_thread(call)


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
        answered = False

        async def counted() -> Message:
            nonlocal received, answered
            message = await receive()
            if message["type"] == "http.request" and not answered:
                received += len(message.get("body", b""))
                if received > self.limit:
                    answered = True
                    exc = PayloadTooLarge(f"body over {self.limit} bytes")
                    reply = _error(self.state, Request(scope), exc.to_body(), exc.status)
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
    request marks itself (``request.state.cut``) and this layer withholds the final body
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
            return bool(scope.get("state", {}).get("cut"))

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


class SynthesisExchange:
    """One request's life on the gateway: admitted, dispatched, streamed, finished exactly once.

    Finishing releases the admission slot and the mailbox, tells the worker to stop if the client
    left early, and writes the request's one completion log line. It is idempotent, so the
    normal end, an error, a disconnect and the drain can all call it.
    """

    def __init__(
        self,
        state: GatewayState,
        request: HTTPConnection,
        pool: WorkerPool,
        wid: int,
        job: SynthesisJob,
        qsize: int,
        gone: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        self.state = state
        self.request = request
        if gone is None:
            assert isinstance(request, Request), "a WebSocket's session says when it is gone"
            gone = functools.partial(_client_gone, request)
        self.gone = gone
        """Returns once the client has left (an HTTP request's disconnect by default)."""
        self.buffered = False
        """A ``stream: false`` request: nothing is sent before the end, so a failure is its code."""
        self.pool = pool
        self.wid = wid
        self.job = job
        self.qsize = qsize
        self.started = time.perf_counter()
        self.box: Mailbox | None = None
        self.first_audio_s: float | None = None
        self.failure: StreamError | None = None
        """Set when the stream failed after the first audio (it cannot finish)."""
        self.rate = 22050
        """Output sample rate, for turning bytes into playback time."""
        self.audio_s = 0.0
        self.compute_s: float | None = None
        self.engine_version: str | None = None
        self._last_chunk: float | None = None
        self._finished = False
        self.ticket: Ticket | None = None
        """The key's quota claim, settled with the audio really produced."""
        self.encoder: Encoder | None = None
        state.inflight += 1
        state.idle.clear()
        state.exchanges.add(self)

    async def first(self, timeout: float) -> AudioChunkMsg:
        """Dispatch and wait for the first audio; a failure before it becomes an HTTP error.

        The client is watched meanwhile: one that leaves while its request is queued gets it
        cancelled in the worker (dropped from its queue, never synthesized) and is recorded as
        499, not left to be synthesized for nobody.
        """
        self.box = await self.pool.submit(self.wid, self.job)
        audio = asyncio.ensure_future(self.box.get())
        gone = asyncio.ensure_future(self.gone())
        try:
            done, _ = await asyncio.wait({audio, gone}, timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        except asyncio.CancelledError:
            self.finish("cancelled", cancel=True)
            raise
        finally:
            audio.cancel()
            gone.cancel()
        if audio not in done:
            if gone in done:
                self.finish("cancelled", cancel=True)
                raise ClientClosedRequest("the client closed the request before its first audio")
            self.finish("queue_timeout", cancel=True)
            raise QueueTimeout(f"no audio within the {timeout:g} s queue deadline")
        msg = audio.result()
        if isinstance(msg, StreamError):
            self.finish(msg.type, cancel=True, code=msg.status)
            raise WorkerReportedError(msg)
        if isinstance(msg, StreamDone):
            self.finish("empty_audio", code=500)
            raise WorkerReportedError(
                StreamError(self.job.uid, 500, "internal_error", "the stream ended without audio")
            )
        self.first_audio_s = time.perf_counter() - self.started
        self.engine_version = msg.engine_version
        metrics = self.state.metrics
        metrics.ttfa.observe(self.first_audio_s)
        metrics.queue_wait.observe(msg.queued_s)
        return msg

    def received(self, msg: AudioChunkMsg) -> None:
        """Account one chunk as it goes out: gap since the last one, and whether a client playing
        in real time from the first chunk would have run out of audio before it (an underrun)."""
        now = time.perf_counter()
        metrics = self.state.metrics
        if self._last_chunk is not None and not self.buffered:
            metrics.chunk_gap.observe(now - self._last_chunk)
            assert self.first_audio_s is not None
            if now - (self.started + self.first_audio_s) > self.audio_s:
                metrics.underruns.inc()
        self._last_chunk = now
        self.audio_s += len(msg.pcm) / 2 / self.rate

    async def rest(self) -> AsyncIterator[AudioChunkMsg]:
        """The chunks after the first; ends early, with ``failure`` set, if the worker fails
        mid-stream, the stream is aborted, or the worker sends nothing for the stream for the
        worker silence timeout (it would be killed by then if the whole worker were silent;
        this catches a stream lost inside a live worker)."""
        assert self.box is not None
        timeout = self.state.settings.worker_silence_timeout_s
        while True:
            try:
                msg = await asyncio.wait_for(self.box.get(), timeout)
            except asyncio.TimeoutError:
                msg = StreamError(self.job.uid, 503, "stalled", "the stream stalled")
            if isinstance(msg, AudioChunkMsg):
                yield msg
                continue
            if isinstance(msg, StreamError):
                self.failure = self.failure or msg
                self.finish(msg.type, cancel=True)
                if not self.buffered:
                    self.request.state.cut = True  # see StreamAbort
            else:
                self.compute_s = msg.compute_s
                self.finish("ok")
            return

    def abort(self, reason: str, message: str) -> None:
        """End the request now as a failure (503 ``reason``): recorded at once, cancelled in
        its worker; whoever waits on its mailbox wakes to the error and ends the response."""
        if self._finished:
            return
        failure = StreamError(self.job.uid, 503, reason, message)
        if self.first_audio_s is not None:
            self.failure = failure
        self.finish(reason, cancel=True, code=503)
        if self.box is not None:
            self.box.put_nowait(failure)

    def release_encoder(self) -> None:
        """Count the encoder's time and free it (off the loop) if the response did not end it."""
        encoder, self.encoder = self.encoder, None
        if encoder is None:
            return
        self.state.metrics.encode_seconds.labels(encoder.format.name).inc(encoder.seconds)
        if not encoder.closed:
            _close_later(encoder)

    def finish(self, status: str, cancel: bool = False, code: int | None = None) -> None:
        """Release everything this request holds; only the first call counts.

        The recorded code is what the client experienced: 200 only for a stream that ended
        whole; a stream cut after its 200 status line counts as its failure's status (and in
        ``ttsvc_aborted_streams``), a client that left as 499.
        """
        if self._finished:
            return
        self._finished = True
        self.state.exchanges.discard(self)
        if cancel:
            self.pool.cancel(self.wid, self.job.uid)
        self.pool.forget(self.job.uid)
        self.state.inflight -= 1
        if self.state.inflight == 0:
            self.state.idle.set()
        latency = time.perf_counter() - self.started
        metrics = self.state.metrics
        if status == "ok":
            metrics.latency.observe(latency)
            metrics.characters.inc(len(self.job.text))
            if self.compute_s is not None and self.audio_s > 0:
                metrics.rtf.observe(self.compute_s / self.audio_s)
        if status == "cancelled":
            metrics.cancellations.inc()
        if self.failure is not None and not self.buffered:
            metrics.aborted_streams.labels(status).inc()
        metrics.audio_seconds.inc(self.audio_s)
        if self.ticket is not None:
            self.state.limiter.settle(self.ticket, self.audio_s)
        rtf = None
        if self.compute_s is not None and self.audio_s > 0:
            rtf = round(self.compute_s / self.audio_s, 4)
        fields: dict[str, object] = {
            "uid": self.job.uid,
            "voice": self.job.voice,
            "worker": self.wid,
            "qsize": self.qsize,
            "text_len": len(self.job.text),
            "ttfa_ms": None if self.first_audio_s is None else round(1000 * self.first_audio_s, 1),
            "latency": round(1000 * latency, 1),
            "audio_s": round(self.audio_s, 3),
            "rtf": rtf,
            "engine_version": self.engine_version,
            "status": status,
            **_labels(self.request),
        }
        if status != "ok":
            fields["error_type"] = status
        if code is None and self.failure is not None:
            code = self.failure.status
        if code is None:
            code = 200 if status == "ok" else _STATUS_OF.get(status, 503)
        self.state.complete(fields, code)
        self.request.state.recorded = True


async def _client_gone(request: Request) -> None:
    """Return once the client has closed its connection.

    The body was read before the handler ran, so the next ASGI message is the disconnect; the
    server delivers it as soon as the socket closes. A receive that fails means the same.
    """
    with contextlib.suppress(Exception):
        while (await request.receive())["type"] != "http.disconnect":
            pass


_STATUS_OF = {"queue_timeout": 503, "cancelled": 499}
"""HTTP code recorded for exchanges that end without audio or a worker's error
(499: client closed request)."""


class WorkerReportedError(TTSError):
    """A worker's ``StreamError`` before any byte was sent, answered with its own status/type."""

    def __init__(self, msg: StreamError) -> None:
        super().__init__(msg.message, field=msg.field)
        self.status = msg.status
        self.type = msg.type


class ExchangeStreamingResponse(StreamingResponse):
    """A streaming response that finishes its exchange however the response ends.

    Starlette may cancel a response whose client left before its body iterator ever ran, and then
    no ``finally`` inside the iterator runs; this wrapper's does.
    """

    def __init__(self, exchange: SynthesisExchange, content: AsyncIterator[bytes],
                 media_type: str, headers: dict[str, str]) -> None:  # fmt: skip
        super().__init__(content, media_type=media_type, headers=headers)
        self.exchange = exchange

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.exchange.finish("cancelled", cancel=True)  # no-op after a normal end
            self.exchange.release_encoder()


async def start_exchange(
    state: GatewayState,
    order: SpeechOrder,
    request: HTTPConnection,
    gone: Callable[[], Awaitable[object]] | None = None,
) -> tuple[SynthesisExchange, AudioChunkMsg]:
    """Admit ``order`` (drain, text cap, key quota, slots), dispatch it to a worker and wait for
    its first audio, which is already accounted (``received``); refusals raise their error.

    Every API's synthesis goes through here. The caller owns the exchange from then on: it must
    end in ``finish`` and ``release_encoder`` (its encoder is made for ``order.format``).
    ``gone`` returns once the client has left (an HTTP request's disconnect by default).
    """
    settings = state.settings
    if state.draining:
        raise Draining("the server is shutting down")
    if len(order.text) > settings.max_text_chars:
        field = "input" if order.api == "openai" else "text"
        raise TextTooLong(f"{field} is over {settings.max_text_chars} characters", field=field)
    pool, balancer = state.pool, state.balancer
    if pool is None or balancer is None:
        raise EngineError("no verified engine to serve yet: GET /voices says why")
    request.state.text_len = len(order.text)
    rate = order.sample_rate or state.native_rate(order.voice)
    if (why := order.format.rate_error(rate)) is not None:  # e.g. opus at a voice's own rate
        raise InvalidParameter(why, field="sample_rate")
    key = getattr(request.state, "key", None)
    ticket = None
    if key is not None and state.keys is not None:
        # before the shared slots: a key over its quota or its share of the slots never takes
        # one from another key
        ticket = state.limiter.admit(key.name, key.quota, len(order.text), order.speed,
                                     len(state.keys.keys))  # fmt: skip
    encoder: Encoder | None = None
    try:
        if state.inflight >= state.limiter.slots:
            raise Busy("all stream slots are busy, retry shortly")
        encoder = Encoder(order.format, rate, streamed=order.stream)
        wid = balancer.pick(order.voice)  # NoWorkerAvailable: a 503 from the error table
    except Exception:
        if ticket is not None:
            state.limiter.refund(ticket)  # the service's refusal, not the key's
        if encoder is not None:
            _close_later(encoder)
        raise
    qsize = next(w.load for w in balancer.snapshot() if w.id == wid)
    # ids are always ours: a client reusing an id must not reach another request's stream
    uid = uuid.uuid4().hex
    client_id = request.headers.get("x-request-id")
    if client_id:
        log.info("request_id", uid=uid, client_request_id=client_id[:128])
    # the rate the encoder was made for, always: a worker still on another version of the voice
    # (a swap rolling out) resamples to it instead of sending audio at another rate
    job = SynthesisJob(uid, order.text, order.speed, order.noise_scale, order.noise_w,
                       order.sentence_silence, rate, settings.max_audio_s,
                       None if key is None else key.name, order.voice,
                       order.speaker, order.timestamps)  # fmt: skip
    exchange = SynthesisExchange(state, request, pool, wid, job, qsize, gone)
    exchange.buffered = not order.stream
    exchange.ticket = ticket
    exchange.encoder = encoder
    state.metrics.format_requests.labels(order.format.name, order.api).inc()
    try:
        first = await exchange.first(settings.queue_timeout_s)
    except BaseException:
        exchange.release_encoder()
        raise
    balancer.observe(wid, first.compute_s * 1000.0)  # worker-side time: see balancer_sim
    exchange.rate = rate
    exchange.received(first)
    return exchange, first


async def _synthesize(
    state: GatewayState, order: SpeechOrder, request: Request, framing: AudioBody | None = None
) -> Response:
    """The one path of the HTTP APIs: admit, dispatch, then stream (or gather) the encoded
    audio, framed by ``framing`` (the audio as it is, OpenAI's speech events, or audio with word
    timestamps)."""
    body = framing or AudioBody()
    exchange, first = await start_exchange(state, order, request)
    encoder = exchange.encoder
    assert encoder is not None
    rate = exchange.rate
    headers = {
        "X-Request-Id": exchange.job.uid,
        "X-Engine-Version": str(first.engine_version),
        "X-Sample-Rate": str(rate),
        "X-Accel-Buffering": "no",
        "Cache-Control": "no-store",
    }
    media = body.media_type or order.format.media_type(rate)

    if not order.stream:
        try:
            await _encode(encoder, first.pcm)
            async for msg in exchange.rest():
                exchange.received(msg)
                await _encode(encoder, msg.pcm)
            if exchange.failure is None:
                data = await _encode(encoder, None)
        finally:
            exchange.finish("cancelled", cancel=True)  # no-op after a normal end
            exchange.release_encoder()
        if exchange.failure is not None:  # nothing was sent yet: answer with the error
            raise WorkerReportedError(exchange.failure)
        data = body.audio(data, None) + body.end(exchange.audio_s)
        return Response(data, media_type=media, headers=headers)

    async def body_iter() -> AsyncIterator[bytes]:
        if data := body.audio(await _encode(encoder, first.pcm), first):
            yield data
        async for msg in exchange.rest():
            exchange.received(msg)
            if data := body.audio(await _encode(encoder, msg.pcm), msg):
                yield data
        if exchange.failure is None:  # a stream that failed must not look finished: no tail
            if data := body.audio(await _encode(encoder, None), None) + body.end(exchange.audio_s):
                yield data
        elif data := body.failed(exchange.failure):
            yield data  # before the cut (StreamAbort): why the stream ends

    return ExchangeStreamingResponse(exchange, body_iter(), media, headers)

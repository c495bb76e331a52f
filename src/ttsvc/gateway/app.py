"""FastAPI application: validate, admit, route to a worker, stream its audio back.

Runs in the gateway process on one asyncio loop. Nothing here synthesizes or phonemizes: that
happens in workers, so the loop only moves bytes. Every error body is ``{"error", "type"}`` from
the error classes' own status and type (one table, ``ttsvc.errors``).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.types import Receive, Scope, Send

from ttsvc.audio.resample import SUPPORTED_RATES
from ttsvc.audio.wav import streaming_header, wav_bytes
from ttsvc.balancer import HeatScoreBalancer
from ttsvc.config import Settings
from ttsvc.errors import (
    Busy,
    Draining,
    InvalidParameter,
    PayloadTooLarge,
    QueueTimeout,
    TextTooLong,
    TTSError,
    UnknownVoice,
)
from ttsvc.gateway.hotswap import EngineSwapper
from ttsvc.observability.logs import get_logger
from ttsvc.pool.supervisor import Mailbox, WorkerPool, WorkerSpec
from ttsvc.protocol import AudioChunkMsg, StreamDone, StreamError, SynthesisJob
from ttsvc.repository.cache import EngineCache

log = get_logger("gateway")


class SynthesizeRequest(BaseModel):
    """Body of ``POST /synthesize``."""

    model_config = ConfigDict(extra="forbid")

    text: str
    voice: str | None = None
    speed: float = Field(1.0, ge=0.25, le=4.0)
    noise_scale: float | None = Field(None, ge=0.0, le=2.0)
    noise_w: float | None = Field(None, ge=0.0, le=2.0)
    sentence_silence: float = Field(0.2, ge=0.0, le=5.0)
    sample_rate: int | None = None
    format: Literal["wav", "pcm"] = "wav"
    stream: bool = True


@dataclass
class GatewayState:
    """Mutable state of one gateway: the pool, the balancer, admission counters, drain flag."""

    settings: Settings
    voice: str
    pool: WorkerPool | None = None
    swapper: EngineSwapper | None = None
    balancer: HeatScoreBalancer | None = None
    draining: bool = False
    inflight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)


def _error(exc: TTSError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(exc.to_body(), status_code=exc.status, headers=headers)


def create_app(settings: Settings, voice: str) -> FastAPI:
    """Build the app; the worker pool starts in the lifespan, not at import or construction."""
    state = GatewayState(settings, voice)
    state.idle.set()

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        state.balancer = HeatScoreBalancer(settings.balancer_settings(), time.monotonic)
        scratch = settings.engine_cache_dir or Path(tempfile.mkdtemp(prefix="ttsvc-engines-"))
        swapper = EngineSwapper(
            settings.engines_dir,
            voice,
            EngineCache(scratch),
            settle_s=settings.watch_settle_s,
            polling=settings.watch_polling,
            swap_timeout_s=settings.swap_timeout_s,
        )
        state.swapper = swapper
        spec = WorkerSpec(
            await swapper.initial(),
            settings.threads,
            (settings.first_window_frames, settings.window_growth, settings.max_window_frames),
            settings.max_sentence_chars,
            settings.multiplex,
            settings.worker_start_timeout_s,
            settings.worker_silence_timeout_s,
        )
        state.pool = WorkerPool(spec, settings.workers, state.balancer, loop)
        state.pool.start()
        watcher = loop.create_task(swapper.watch(state.pool))
        try:
            yield
        finally:
            swapper.stop()
            await asyncio.gather(watcher, return_exceptions=True)
            await state.pool.close()
            if settings.engine_cache_dir is None:
                await asyncio.to_thread(shutil.rmtree, scratch, True)

    app = FastAPI(title="ttsvc", lifespan=lifespan)
    app.state.gateway = state

    @app.exception_handler(TTSError)
    async def _tts_error(_req: Request, exc: TTSError) -> JSONResponse:
        return _error(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_req: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        name = ".".join(loc) or "body"
        return JSONResponse(
            {"error": f"{name}: {first.get('msg', 'invalid')}", "type": "invalid_parameter",
             "field": name},
            status_code=422,
        )  # fmt: skip

    @app.middleware("http")
    async def _body_cap(request: Request, call_next):  # type: ignore[no-untyped-def]
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > settings.max_body_bytes:
            return _error(PayloadTooLarge(f"body over {settings.max_body_bytes} bytes"))
        return await call_next(request)

    @app.get("/live")
    async def live() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/health")
    async def health() -> JSONResponse:
        pool, balancer = state.pool, state.balancer
        if state.draining:
            return JSONResponse({"status": "draining", "score": 0.0}, status_code=503)
        if pool is None or balancer is None or not balancer.live_workers():
            return JSONResponse({"status": "no_ready_worker", "score": 0.0}, status_code=503)
        return JSONResponse(
            {"status": "ok", "score": round(balancer.pool_score(), 2), "inflight": state.inflight}
        )

    @app.get("/voices")
    async def voices() -> dict[str, object]:
        pool, swapper = state.pool, state.swapper
        serving = sorted(
            {w.ready.engine_version for w in pool.workers.values() if w.ready} if pool else set()
        )
        engines = {
            "current": swapper.current.label if swapper and swapper.current else None,
            "reloads": dict(swapper.reloads) if swapper else {},
            "last_error": swapper.last_error if swapper else None,
        }
        return {"voices": [{"name": state.voice, "engine_versions": serving, "engines": engines}]}

    @app.post("/synthesize")
    async def synthesize(body: SynthesizeRequest, request: Request) -> Response:
        return await _synthesize(state, body, request)

    return app


class SynthesisExchange:
    """One request's life on the gateway: admitted, dispatched, streamed, finished exactly once.

    Finishing releases the admission slot and the mailbox, tells the worker to stop if the client
    left early, and writes the request's one completion log line. It is idempotent, so the
    normal end, an error and a disconnect can all call it.
    """

    def __init__(
        self, state: GatewayState, pool: WorkerPool, wid: int, job: SynthesisJob, qsize: int
    ) -> None:
        self.state = state
        self.pool = pool
        self.wid = wid
        self.job = job
        self.qsize = qsize
        self.started = time.perf_counter()
        self.box: Mailbox | None = None
        self.first_audio_s: float | None = None
        self.failure: StreamError | None = None
        """Set when the worker failed after the first audio (the stream ended early)."""
        self._finished = False
        state.inflight += 1
        state.idle.clear()

    async def first(self, timeout: float) -> AudioChunkMsg:
        """Dispatch and wait for the first audio; a failure before it becomes an HTTP error."""
        try:
            self.box = await self.pool.submit(self.wid, self.job)
            msg = await asyncio.wait_for(self.box.get(), timeout)
        except asyncio.TimeoutError:
            await self.finish("queue_timeout", cancel=True)
            raise QueueTimeout(f"no audio within the {timeout:g} s queue deadline") from None
        except asyncio.CancelledError:
            await self.finish("cancelled", cancel=True)
            raise
        if isinstance(msg, StreamError):
            await self.finish(msg.type)
            raise WorkerReportedError(msg)
        if isinstance(msg, StreamDone):
            await self.finish("empty_audio")
            raise WorkerReportedError(
                StreamError(self.job.uid, 500, "internal_error", "the stream ended without audio")
            )
        self.first_audio_s = time.perf_counter() - self.started
        return msg

    async def rest(self) -> AsyncIterator[AudioChunkMsg]:
        """The chunks after the first; ends early (logged) if the worker fails mid-stream."""
        assert self.box is not None
        while True:
            msg = await self.box.get()
            if isinstance(msg, AudioChunkMsg):
                yield msg
            elif isinstance(msg, StreamError):
                self.failure = msg
                await self.finish(msg.type)  # bytes already sent: the stream just ends
                return
            else:
                await self.finish("ok")
                return

    async def finish(self, status: str, cancel: bool = False) -> None:
        """Release everything this request holds; only the first call counts."""
        if self._finished:
            return
        self._finished = True
        if cancel:
            await self.pool.cancel(self.wid, self.job.uid)
        self.pool.forget(self.job.uid)
        self.state.inflight -= 1
        if self.state.inflight == 0:
            self.state.idle.set()
        ttfa = None if self.first_audio_s is None else round(1000 * self.first_audio_s, 1)
        log.info(
            "request",
            uid=self.job.uid,
            worker=self.wid,
            qsize=self.qsize,
            text_len=len(self.job.text),
            ttfa_ms=ttfa,
            latency=round(1000 * (time.perf_counter() - self.started), 1),
            status=status,
        )


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
            await self.exchange.finish("cancelled", cancel=True)  # no-op after a normal end


async def _synthesize(state: GatewayState, body: SynthesizeRequest, request: Request) -> Response:
    settings = state.settings
    if state.draining:
        raise Draining("the server is shutting down")
    if body.voice is not None and body.voice != state.voice:
        raise UnknownVoice(f"unknown voice {body.voice!r}", field="voice")
    if len(body.text) > settings.max_text_chars:
        raise TextTooLong(f"text is over {settings.max_text_chars} characters", field="text")
    if body.sample_rate is not None and body.sample_rate not in SUPPORTED_RATES:
        rates = ", ".join(str(r) for r in SUPPORTED_RATES)
        raise InvalidParameter(
            f"sample_rate {body.sample_rate}: supported rates are {rates}", field="sample_rate"
        )
    pool, balancer = state.pool, state.balancer
    if pool is None or balancer is None:
        raise Draining("no worker pool")
    if state.inflight >= settings.workers * settings.max_streams_per_worker:
        return _error(Busy("all stream slots are busy, retry shortly"), {"Retry-After": "1"})
    wid = balancer.pick()  # NoWorkerAvailable is a 503 from the error table
    qsize = next(w.load for w in balancer.snapshot() if w.id == wid)
    uid = request.headers.get("x-request-id") or uuid.uuid4().hex
    job = SynthesisJob(uid, body.text, body.speed, body.noise_scale, body.noise_w,
                       body.sentence_silence, body.sample_rate)  # fmt: skip
    exchange = SynthesisExchange(state, pool, wid, job, qsize)
    first = await exchange.first(settings.queue_timeout_s)
    balancer.observe(wid, first.compute_s * 1000.0)  # worker-side time: see balancer_sim

    native = next((w.ready.sample_rate for w in pool.workers.values() if w.ready), 22050)
    rate = body.sample_rate or native
    headers = {
        "X-Request-Id": uid,
        "X-Engine-Version": str(first.engine_version),
        "X-Sample-Rate": str(rate),
        "X-Accel-Buffering": "no",
        "Cache-Control": "no-store",
    }
    media = "audio/wav" if body.format == "wav" else f"audio/L16;rate={rate};channels=1"

    if not body.stream:
        pieces = [first.pcm]
        try:
            pieces.extend([msg.pcm async for msg in exchange.rest()])
        finally:
            await exchange.finish("cancelled", cancel=True)  # no-op after a normal end
        if exchange.failure is not None:  # nothing was sent yet: answer with the error
            raise WorkerReportedError(exchange.failure)
        pcm = np.frombuffer(b"".join(pieces), dtype="<i2")
        data = wav_bytes(pcm, rate) if body.format == "wav" else pcm.tobytes()
        return Response(data, media_type=media, headers=headers)

    async def body_iter() -> AsyncIterator[bytes]:
        if body.format == "wav":
            yield streaming_header(rate)
        yield first.pcm
        async for msg in exchange.rest():
            yield msg.pcm

    return ExchangeStreamingResponse(exchange, body_iter(), media, headers)

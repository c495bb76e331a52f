"""FastAPI application: validate, admit, route to a worker, stream its audio back.

Runs in the gateway process on one asyncio loop. Nothing here synthesizes or phonemizes: that
happens in workers, so the loop only moves bytes. Every error body is ``{"error", "type"}`` from
the error classes' own status and type (one table, ``ttsvc.errors``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from ttsvc.audio.wav import streaming_header, wav_bytes
from ttsvc.balancer import BalancerSettings, HeatScoreBalancer, NoWorkerAvailable
from ttsvc.config import Settings
from ttsvc.errors import Busy, Draining, PayloadTooLarge, TextTooLong, TTSError, UnknownVoice
from ttsvc.observability.logs import get_logger
from ttsvc.pool.supervisor import Mailbox, WorkerPool, WorkerSpec
from ttsvc.protocol import AudioChunkMsg, StreamDone, StreamError, SynthesisJob

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
    balancer: HeatScoreBalancer | None = None
    draining: bool = False
    inflight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)


def _error(exc: TTSError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(exc.to_body(), status_code=exc.status, headers=headers)


def create_app(settings: Settings, engines_path: Path, voice: str) -> FastAPI:
    """Build the app; the worker pool starts in the lifespan, not at import or construction."""
    state = GatewayState(settings, voice)
    state.idle.set()

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        state.balancer = HeatScoreBalancer(BalancerSettings(), time.monotonic)
        spec = WorkerSpec(
            engines_path,
            settings.threads,
            (settings.first_window_frames, settings.window_growth, settings.max_window_frames),
            settings.max_sentence_chars,
            settings.multiplex,
        )
        state.pool = WorkerPool(spec, settings.workers, state.balancer, loop)
        state.pool.start()
        yield
        await state.pool.close()

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
        return JSONResponse({"status": "ok", "score": round(balancer.pool_score(), 2)})

    @app.get("/voices")
    async def voices() -> dict[str, object]:
        pool = state.pool
        versions = sorted(
            {w.ready.engine_version for w in pool.workers.values() if w.ready} if pool else set()
        )
        return {"voices": [{"name": state.voice, "engine_versions": versions}]}

    @app.post("/synthesize")
    async def synthesize(body: SynthesizeRequest, request: Request) -> Response:
        return await _synthesize(state, body, request)

    return app


async def _first_message(box: Mailbox, timeout: float) -> AudioChunkMsg | StreamDone | StreamError:
    return await asyncio.wait_for(box.get(), timeout)


async def _synthesize(state: GatewayState, body: SynthesizeRequest, request: Request) -> Response:
    settings = state.settings
    if state.draining:
        raise Draining("the server is shutting down")
    if body.voice is not None and body.voice != state.voice:
        raise UnknownVoice(f"unknown voice {body.voice!r}", field="voice")
    if len(body.text) > settings.max_text_chars:
        raise TextTooLong(f"text is over {settings.max_text_chars} characters", field="text")
    pool, balancer = state.pool, state.balancer
    if pool is None or balancer is None:
        raise Draining("no worker pool")
    if body.sample_rate is not None:
        native = next((w.ready.sample_rate for w in pool.workers.values() if w.ready), None)
        if body.sample_rate != native:
            from ttsvc.errors import InvalidParameter  # noqa: PLC0415

            raise InvalidParameter(
                f"sample_rate {body.sample_rate}: this build serves only {native} Hz",
                field="sample_rate",
            )
    if state.inflight >= settings.workers * settings.max_streams_per_worker:
        return _error(Busy("all stream slots are busy, retry shortly"), {"Retry-After": "1"})
    try:
        wid = balancer.pick()
    except NoWorkerAvailable as exc:
        return JSONResponse({"error": str(exc), "type": "no_worker_available"}, status_code=503)

    uid = request.headers.get("x-request-id") or uuid.uuid4().hex
    state.inflight += 1
    state.idle.clear()
    job = SynthesisJob(uid, body.text, body.speed, body.noise_scale, body.noise_w,
                       body.sentence_silence)  # fmt: skip
    started = time.perf_counter()
    box = await pool.submit(wid, job)
    finished = False

    def finish() -> None:
        nonlocal finished
        if not finished:
            finished = True
            pool.forget(uid)
            state.inflight -= 1
            if state.inflight == 0:
                state.idle.set()

    try:
        first = await _first_message(box, settings.queue_timeout_s)
    except (asyncio.TimeoutError, asyncio.CancelledError):
        await pool.cancel(wid, uid)
        finish()
        return JSONResponse(
            {"error": "queued longer than the deadline", "type": "queue_timeout"}, status_code=503
        )
    if isinstance(first, StreamError):
        finish()
        body_json = {"error": first.message, "type": first.type}
        if first.field:
            body_json["field"] = first.field
        return JSONResponse(body_json, status_code=first.status, headers={"X-Request-Id": uid})
    if isinstance(first, StreamDone):  # nothing produced (cancelled before the first window)
        finish()
        return JSONResponse({"error": "no audio", "type": "empty_audio"}, status_code=500)

    balancer.observe(wid, first.compute_s * 1000.0)
    rate = next((w.ready.sample_rate for w in pool.workers.values() if w.ready), 22050)
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
            while True:
                msg = await box.get()
                if isinstance(msg, AudioChunkMsg):
                    pieces.append(msg.pcm)
                elif isinstance(msg, StreamError):
                    return JSONResponse({"error": msg.message, "type": msg.type},
                                        status_code=msg.status, headers=headers)  # fmt: skip
                else:
                    break
        finally:
            finish()
        pcm = b"".join(pieces)
        if body.format == "wav":
            import numpy as np  # noqa: PLC0415

            data = wav_bytes(np.frombuffer(pcm, dtype="<i2"), rate)
        else:
            data = pcm
        log.info("request", uid=uid, worker=wid, text_len=len(body.text),
                 latency=round(1000 * (time.perf_counter() - started), 1))  # fmt: skip
        return Response(data, media_type=media, headers=headers)

    async def body_iter() -> AsyncIterator[bytes]:
        status = "ok"
        try:
            if body.format == "wav":
                yield streaming_header(rate)
            yield first.pcm
            while True:
                msg = await box.get()
                if isinstance(msg, AudioChunkMsg):
                    yield msg.pcm
                elif isinstance(msg, StreamError):
                    status = msg.type  # bytes already sent: end the stream early, say why
                    log.warning("stream_failed", uid=uid, worker=wid, error_type=msg.type)
                    return
                else:
                    return
        except (asyncio.CancelledError, GeneratorExit):
            status = "cancelled"
            await pool.cancel(wid, uid)
            raise
        finally:
            finish()
            log.info("request", uid=uid, worker=wid, text_len=len(body.text), status=status,
                     latency=round(1000 * (time.perf_counter() - started), 1))  # fmt: skip

    return StreamingResponse(body_iter(), media_type=media, headers=headers)

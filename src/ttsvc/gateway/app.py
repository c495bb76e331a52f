"""FastAPI application: validate, admit, route to a worker, stream its audio back.

Runs in the gateway process on one asyncio loop. Nothing here synthesizes or phonemizes: that
happens in workers, so the loop only moves bytes. Every error body is ``{"error", "type"}`` from
the error classes' own status and type (one table, ``ttsvc.errors``).

This module only wires the app together (with ``server``, the gateway's composition root): the
lifespan (pool, voices, keys, metrics, Wyoming), the middleware, the error handlers
(``http.errors``) and the routes (``http.routes``). A request's way through lives in the request
core (``core.exchange``, the gateway's shared state in ``core.state``); each transport (``http``,
``ws``, ``wyoming``) only turns its own requests into the core's and its audio into its wire.
"""

from __future__ import annotations

import asyncio
import functools
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from prometheus_client import start_http_server
from starlette.exceptions import HTTPException

from ttsvc.balancer import HeatScoreBalancer
from ttsvc.config import Settings
from ttsvc.errors import TTSError
from ttsvc.gateway.core.keys import KeyStore
from ttsvc.gateway.core.quotas import KeyRateLimiter, Quota
from ttsvc.gateway.core.state import GatewayState
from ttsvc.gateway.http.errors import crashed, http_error, invalid, tts_error
from ttsvc.gateway.http.limits import BodyLimit, StreamAbort, body_cap
from ttsvc.gateway.http.openai import OPENAI_VOICES
from ttsvc.gateway.http.routes import add_routes
from ttsvc.gateway.ws.elevenlabs import install as install_elevenlabs
from ttsvc.gateway.ws.route import install as install_stream
from ttsvc.lifecycle.catalog import VoiceCatalog
from ttsvc.lifecycle.lexicons import LexiconStore
from ttsvc.lifecycle.swapper import EngineSwapper
from ttsvc.observability.logs import get_logger
from ttsvc.pool.handle import WorkerSpec
from ttsvc.pool.supervisor import WorkerPool
from ttsvc.protocol import EngineSpec, StartFailed
from ttsvc.repository.cache import EngineCache
from ttsvc.repository.trust import TrustPolicy
from ttsvc.worker.plan import ComputePlan

log = get_logger("gateway")


def create_app(settings: Settings, voice: str) -> FastAPI:
    """Build the app; the worker pool starts in the lifespan, not at import or construction."""
    slots = settings.workers * settings.max_streams_per_worker
    state = GatewayState(settings, voice, limiter=KeyRateLimiter(time.monotonic, slots))
    # OpenAI's voice names all mean the default voice; the settings may name more
    state.aliases = {**dict.fromkeys(OPENAI_VOICES, voice), **settings.voice_aliases}
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
                              settings.max_sentence_chars, settings.log_level,
                              settings.worker_start_timeout_s,
                              settings.worker_silence_timeout_s,
                              ComputePlan(settings.compute_threads, settings.realtime_load,
                                          settings.step_floor_ms / 1000.0,
                                          settings.whole_sentences),
                              log_format=settings.log_format, voices={engine.voice: engine},
                              voice_budget=int(settings.voice_memory_mb * 2**20),
                              memory_bytes=int(settings.worker_memory_mb * 2**20))  # fmt: skip
            pool = WorkerPool(spec, settings.workers, balancer, loop, state.metrics,
                              on_start_failed=start_failed)  # fmt: skip
            state.pool = pool
            pool.start()
            if state.draining:
                pool.stop_respawning()
            return pool

        def start_failed(failed: StartFailed) -> None:
            """Workers could not start on a version: its voice's swapper judges it."""
            if state.catalog is not None:
                state.catalog.start_failed(failed)

        def swapper(name: str) -> EngineSwapper:
            # a cache per voice: a swap prunes the files its voice no longer needs, only those
            return EngineSwapper(settings.engines_dir, name, EngineCache(scratch / name),
                                 settle_s=settings.watch_settle_s,
                                 polling=settings.watch_polling,
                                 swap_timeout_s=settings.swap_timeout_s, metrics=state.metrics,
                                 start_pool=start_pool, running=lambda: state.pool,
                                 trust=trust)  # fmt: skip

        trust = await asyncio.to_thread(TrustPolicy.of, settings.engines_dir,
                                        not settings.engine_trust_checks)  # fmt: skip
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
        # a lexicons directory of its own (the chart's ConfigMap) is trusted as its own root:
        # its files lead into it (through ..data), not into the engines directory
        lexicon_trust = trust if settings.lexicons_dir is None else await asyncio.to_thread(
            TrustPolicy.of, settings.lexicons_dir, not settings.engine_trust_checks)
        lexicons = LexiconStore(settings.engines_dir, settle_s=settings.watch_settle_s,
                                polling=settings.watch_polling, trust=lexicon_trust,
                                directory=settings.lexicons_dir)  # fmt: skip
        await asyncio.to_thread(lexicons.reload)  # a bad file is refused and logged, not fatal
        state.lexicons = lexicons
        tasks.append(loop.create_task(lexicons.watch()))
        # starts the pool if a version verifies; with none, the gateway waits (unready) for one
        await catalog.initial()
        tasks.append(loop.create_task(catalog.watch()))
        wyoming = None
        if settings.wyoming_port:
            # imported here: its protocol library is loaded only where the port is on
            from ttsvc.gateway.wyoming.server import WyomingServer  # noqa: PLC0415

            wyoming = WyomingServer(state, settings.wyoming_host or settings.host,
                                    settings.wyoming_port)  # fmt: skip
            await wyoming.start()
        try:
            yield
        finally:
            if wyoming is not None:
                await wyoming.stop()
            catalog.stop()
            lexicons.stop()
            if keys is not None:
                keys.stop()
            background = catalog.background + lexicons.background
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

    # the documentation routes are added with the others (add_routes), behind the key like
    # every other route
    app = FastAPI(title="ttsvc", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)  # fmt: skip
    app.state.gateway = state

    app.exception_handler(TTSError)(functools.partial(tts_error, state))
    app.exception_handler(HTTPException)(functools.partial(http_error, state))
    app.exception_handler(Exception)(functools.partial(crashed, state))
    app.exception_handler(RequestValidationError)(functools.partial(invalid, state))

    app.middleware("http")(functools.partial(body_cap, state))
    app.add_middleware(StreamAbort)  # outside the http middleware above (see its docstring)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes, state=state)
    if settings.cors_origins:  # added last, so outermost: refusals (401, 413) carry CORS too
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type", "x-request-id"],
            expose_headers=["x-request-id", "x-sample-rate", "x-engine-version", "x-empty-text",
                            "retry-after"],
        )

    add_routes(app, state)
    install_stream(app, state)  # the WebSocket: a transport of its own beside HTTP's routes
    install_elevenlabs(app, state)  # ElevenLabs' streaming-input WebSockets, for agent frameworks
    return app


def _drop_loose_files(scratch: Path) -> None:
    """Delete engine-cache files left directly in the cache directory: the cache now keeps a
    directory per voice, and a kept cache directory from before would keep them forever."""
    for path in scratch.iterdir() if scratch.is_dir() else ():
        if path.is_file():
            path.unlink(missing_ok=True)

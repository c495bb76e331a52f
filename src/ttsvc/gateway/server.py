"""uvicorn with a drain on SIGTERM: readiness and new synthesis go 503 at once, in-flight streams
get ``drain_grace_s`` to finish, then the server and its workers stop and the process exits 0.
A second SIGTERM exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import FrameType

import uvicorn

from ttsvc.config import Settings
from ttsvc.gateway.app import GatewayState, create_app
from ttsvc.gateway.connections import ClientDeadlines, deadline_protocol
from ttsvc.observability.logs import get_logger

log = get_logger("server")


class DrainingServer(uvicorn.Server):
    """uvicorn's server whose first exit signal drains instead of stopping."""

    def __init__(self, config: uvicorn.Config, state: GatewayState, grace_s: float) -> None:
        super().__init__(config)
        self.gateway = state
        self.grace_s = grace_s
        self._draining = False
        self._drain_task: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._draining:
            self.should_exit = True
            self.force_exit = True
            return
        self._draining = True
        self.gateway.draining = True
        if self.gateway.pool is not None:
            self.gateway.pool.stop_respawning()
        log.info("draining", signal=sig, inflight=self.gateway.inflight, grace_s=self.grace_s)
        loop = asyncio.get_event_loop()
        loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain_task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.gateway.idle.wait(), self.grace_s)
        log.info("drained", inflight=self.gateway.inflight)
        self.should_exit = True


def serve(settings: Settings, voice: str) -> int:
    """Run the gateway until drained; returns the process exit code."""
    app = create_app(settings, voice)
    state: GatewayState = app.state.gateway
    deadlines = ClientDeadlines(
        settings.idle_timeout_s, settings.header_timeout_s, settings.body_timeout_s
    )
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        # h11 with deadlines on every wait for the client (uvicorn's only bounds the idle time
        # after a response): slow-loris sockets are closed, not kept forever
        http=deadline_protocol(
            deadlines, lambda phase: state.metrics.connection_timeouts.labels(phase).inc()
        ),
        timeout_keep_alive=settings.idle_timeout_s,  # type: ignore[arg-type]  # a float works
        log_config=None,  # logging is ours: uvicorn's records go through the JSON renderer
        access_log=True,
        lifespan="on",
        timeout_graceful_shutdown=5,  # after the drain: only idle connections are left
    )
    server = DrainingServer(config, app.state.gateway, settings.drain_grace_s)
    server.run()
    return 0

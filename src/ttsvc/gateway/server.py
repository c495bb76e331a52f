"""uvicorn with a drain on SIGTERM: readiness and new synthesis go 503 at once, in-flight streams
get ``drain_grace_s`` to finish, then the server and its workers stop and the process exits 0.
A stream still running when the grace ends is aborted (its client sees an incomplete response,
never a complete-looking one) and the process exits within about two seconds of the grace.
A second SIGTERM exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
from types import FrameType

import uvicorn

from ttsvc.config import Settings
from ttsvc.errors import PortUnavailable, ShutDown
from ttsvc.gateway.app import create_app
from ttsvc.gateway.core.state import GatewayState
from ttsvc.gateway.http.connections import ClientDeadlines, deadline_protocol
from ttsvc.gateway.http.limits import QuietAborts
from ttsvc.observability.logs import get_logger

log = get_logger("server")

CUT_WAIT_S = 0.25
"""After the grace, how long aborted responses get to end before their connections are dropped."""


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
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.gateway.idle.wait(), self.grace_s)
            # what is still running now would otherwise be cancelled by uvicorn's own shutdown
            # timeout (seconds later, with a traceback each, and a stream that may look complete)
            aborted = self.gateway.abort_exchanges(
                ShutDown("the server shut down before this request finished; retry")
            )
            dropped = await self._end_responses() if aborted else 0
            log.info("drained", aborted=aborted, dropped_connections=dropped)
        finally:
            self.should_exit = True  # whatever went wrong above, the drain ends

    async def _end_responses(self) -> int:
        """Let the aborted responses end, then drop the connections whose response still has
        not (a client that does not read keeps its response blocked on a full socket); returns
        how many were dropped."""
        tasks = set(self.server_state.tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=CUT_WAIT_S)
        dropped = 0
        for connection in list(self.server_state.connections):
            cycle = getattr(connection, "cycle", None)
            if cycle is not None and not cycle.response_complete and not cycle.disconnected:
                connection.transport.abort()  # no terminator, no flush: an incomplete response
                dropped += 1
        return dropped


def _try_bind(host: str, port: int) -> int:
    """Bind ``host:port`` as uvicorn and the metrics server will (SO_REUSEADDR, so a socket of
    a previous run in TIME_WAIT does not count as taken) and let go; returns the bound port (the
    one picked for port 0). Raises ``OSError`` where it cannot."""
    family, kind, proto, _name, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        return int(sock.getsockname()[1])


def _unavailable(host: str, port: int, flag: str, exc: OSError) -> PortUnavailable:
    reason = "is in use" if exc.errno == errno.EADDRINUSE else f"cannot be used ({exc.strerror})"
    return PortUnavailable(f"port {port} on {host} {reason}: choose another with {flag}")


def claim_ports(settings: Settings) -> Settings:
    """Check, before anything slow starts, that the API, Wyoming and metrics ports can be
    listened on.

    A taken API or Wyoming port is an error (clients need to know where the service is); so is a
    taken metrics port that was set (flag or environment), since a scraper is pointed at it. A taken
    default metrics port falls back to a free one, logged, so a second instance on a workstation
    just works. Returns the settings to serve with. The ports are let go again: another process
    could take one in between, which uvicorn or the metrics server then report themselves.
    """
    try:
        _try_bind(settings.host, settings.port)
    except OSError as exc:
        raise _unavailable(settings.host, settings.port, "--port or TTSVC_PORT", exc) from None
    if settings.wyoming_port:
        host = settings.wyoming_host or settings.host
        try:
            _try_bind(host, settings.wyoming_port)
        except OSError as exc:
            flag = "--wyoming-port or TTSVC_WYOMING_PORT (0: off)"
            raise _unavailable(host, settings.wyoming_port, flag, exc) from None
    if not settings.metrics_port:
        return settings
    try:
        _try_bind(settings.host, settings.metrics_port)
    except OSError as exc:
        if "metrics_port" in settings.model_fields_set or exc.errno != errno.EADDRINUSE:
            flag = "--metrics-port or TTSVC_METRICS_PORT (0: off)"
            raise _unavailable(settings.host, settings.metrics_port, flag, exc) from None
        free = _try_bind(settings.host, 0)
        log.warning("metrics_port_taken", taken=settings.metrics_port, metrics_port=free,
                    hint="set --metrics-port to choose one")  # fmt: skip
        return settings.model_copy(update={"metrics_port": free})
    return settings


def serve(settings: Settings, voice: str) -> int:
    """Run the gateway until drained; returns the process exit code."""
    app = create_app(settings, voice)
    state: GatewayState = app.state.gateway
    deadlines = ClientDeadlines(
        settings.idle_timeout_s, settings.header_timeout_s, settings.body_timeout_s
    )
    logging.getLogger("uvicorn.error").addFilter(QuietAborts())
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
        # WebSockets (/synthesize/stream) on wsproto, named so that another WebSocket library
        # installed beside it never changes the server; a message is capped like a body
        ws="wsproto",
        ws_max_size=settings.max_body_bytes,
        log_config=None,  # logging is ours: uvicorn's records go through the JSON renderer
        access_log=True,
        lifespan="on",
        timeout_graceful_shutdown=1,  # after the drain: only idle or aborted connections are left
    )
    server = DrainingServer(config, app.state.gateway, settings.drain_grace_s)
    server.run()
    return 0

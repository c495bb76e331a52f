"""The Wyoming protocol (Home Assistant's voice pipeline) on its own TCP port.

Runs on the gateway's event loop, started and stopped in the app's lifespan, and serves every
synthesis through the request core every transport takes (``ttsvc.gateway.core``): the same
admission, stream slots, key quotas, balancer, worker pool, metrics and completion log line, and
the same errors. Each synthesis is a ``Caller`` and a ``SpeechOrder`` handed to the core, its PCM
going out as ``audio-chunk`` events as the worker's windows arrive, not once a sentence is whole.

This module is the server: its listener, the voices it describes and resolves, and the caller a
Wyoming synthesis is; one connection's events are handled in ``handler``.

The protocol carries no credentials: with API keys on, Wyoming requests are charged to a key
named ``wyoming`` with the default quota, like any key whose line sets none. So the listener is
the service's most exposed side and is bounded on every axis: its own address
(``wyoming_host``), an allow-list of client networks (``wyoming_allow``), a cap on connections
open at once (``wyoming_max_connections``), and each event's size and arrival time
(``wyoming_events``). A connection refused or closed for any of them is told why in an ``error``
event where one can still be sent, and counted (``ttsvc_wyoming_closed_total``).
"""

from __future__ import annotations

import asyncio
import contextlib
from ipaddress import IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network

from wyoming.error import Error
from wyoming.event import async_write_event

from ttsvc.errors import Busy, Forbidden, TTSError
from ttsvc.gateway.core.state import GatewayState
from ttsvc.gateway.wyoming.events import EventLimits
from ttsvc.gateway.wyoming.handler import WyomingHandler
from ttsvc.gateway.wyoming.voices import WyomingVoices
from ttsvc.observability.logs import get_logger

log = get_logger("wyoming")



class WyomingServer:
    """The gateway's Wyoming listener (``--wyoming-port``); one handler per connection."""

    def __init__(self, state: GatewayState, host: str, port: int) -> None:
        settings = state.settings
        self.state = state
        self.host = host
        self.port = port
        self.limits = EventLimits(settings.max_body_bytes, settings.wyoming_idle_timeout_s,
                                  settings.header_timeout_s, settings.body_timeout_s)  # fmt: skip
        self.allowed = [ip_network(net, strict=False) for net in settings.wyoming_allow]
        """Client networks that may connect (empty: any)."""
        self.max_connections = settings.wyoming_max_connections
        self._server: asyncio.Server | None = None
        self.handlers: set[WyomingHandler] = set()
        """Connections open now."""
        self.voices = WyomingVoices(state)

    async def start(self) -> None:
        # the stream limit caps a header line (readuntil refuses a longer one)
        self._server = await asyncio.start_server(self._connected, self.host, self.port,
                                                  limit=self.limits.max_bytes)  # fmt: skip
        log.info("wyoming_listening", host=self.host, port=self.port, authenticated=False,
                 allow=[str(n) for n in self.allowed] or "any",
                 max_connections=self.max_connections)  # fmt: skip

    async def _connected(self, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:  # fmt: skip
        """One connection: refused at once (allow-list, connection cap) or served to its end."""
        peer = writer.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        refusal: TTSError | None = None
        if self.allowed and not _allowed(address, self.allowed):
            refusal = Forbidden(f"client {address} is not allowed to connect (wyoming_allow)")
        elif len(self.handlers) >= self.max_connections:
            refusal = Busy(f"{self.max_connections} Wyoming connections are open already; "
                           "retry shortly")  # fmt: skip
        if refusal is not None:
            self.closed(refusal.type)
            log.warning("wyoming_refused", client=address, reason=refusal.type)
            with contextlib.suppress(OSError, RuntimeError):
                await async_write_event(Error(text=refusal.message, code=refusal.type).event(),
                                        writer)  # fmt: skip
            writer.close()
            return
        handler = WyomingHandler(self.state, self.voices, self.limits, reader, writer,
                                 closed=self.closed, gone=self.handlers.discard)  # fmt: skip
        self.handlers.add(handler)
        self.state.metrics.wyoming_connections.inc()
        try:
            await handler.run()
        finally:
            self.state.metrics.wyoming_connections.dec()

    def closed(self, reason: str) -> None:
        """Count a connection the server ended because of its client (``reason``: an error
        ``type``, or ``idle``)."""
        self.state.metrics.wyoming_closed.labels(reason).inc()

    async def stop(self) -> None:
        """Stop listening and end every connection (their requests are cancelled)."""
        if self._server is not None:
            self._server.close()
        handlers = list(self.handlers)
        await asyncio.gather(*(h.disconnect() for h in handlers))
        for handler in handlers:
            handler.writer.close()
        if self._server is not None:
            await self._server.wait_closed()

def _allowed(address: str, networks: list[IPv4Network | IPv6Network]) -> bool:
    """Whether the client ``address`` is in one of ``networks`` (an IPv4 client reaching an
    IPv6 listener is matched by its IPv4 address)."""
    try:
        ip = ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip.version == net.version and ip in net for net in networks)

"""The Wyoming protocol (Home Assistant's voice pipeline) on its own TCP port.

Runs on the gateway's event loop, started and stopped in the app's lifespan, and serves every
synthesis through the very path ``POST /synthesize`` takes
(``ttsvc.gateway.encoding.synthesis_response``): the same admission, stream slots, key quotas,
balancer, worker pool, metrics and completion log line, and the same errors. A Wyoming request
is handed to it as an HTTP request whose scope this module makes, and the streaming response it
returns is driven the way uvicorn drives one, its body (raw PCM) going out as ``audio-chunk``
events. So audio starts when the worker's first window arrives, not once a sentence is whole,
and no second route to the workers exists.

This module is the server: its listener, the voices it describes and resolves, and the HTTP
request a Wyoming synthesis becomes; one connection's events are handled in
``wyoming_handler``.

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
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network

from starlette.requests import Request
from starlette.types import Message, Scope
from wyoming.error import Error
from wyoming.event import async_write_event
from wyoming.info import Attribution, Info, TtsProgram, TtsVoice, TtsVoiceSpeaker
from wyoming.tts import SynthesizeVoice

from ttsvc import __version__
from ttsvc.backends.base import EngineSource
from ttsvc.errors import Busy, Forbidden, InvalidParameter, TTSError, UnknownVoice
from ttsvc.gateway.auth import ApiKey
from ttsvc.gateway.state import GatewayState
from ttsvc.gateway.wyoming_events import EventLimits
from ttsvc.gateway.wyoming_handler import WyomingHandler
from ttsvc.observability.logs import get_logger
from ttsvc.protocol import EngineSpec
from ttsvc.voice import VOICE_FILE, VoiceConfig, describe, speaker_id

log = get_logger("wyoming")

WYOMING_KEY = "wyoming"
"""The key name Wyoming requests are charged to when API keys are on."""
PIPER_URL = "https://github.com/OHF-Voice/piper1-gpl"


@dataclass(frozen=True)
class Voice:
    """A request's voice resolved: the served voice and its speaker id."""

    name: str
    speaker: int | None


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
        self._configs: dict[tuple[str, str], dict[str, object]] = {}

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
        handler = WyomingHandler(self, reader, writer)
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

    async def config(self, spec: EngineSpec) -> dict[str, object]:
        """A served engine version's Piper config (read once, off the event loop)."""
        key = spec.voice, spec.label
        if key not in self._configs:
            raw = await asyncio.to_thread(EngineSource.from_spec(spec).read, VOICE_FILE)
            self._configs[key] = json.loads(raw.decode("utf-8"))
        return self._configs[key]

    async def info(self) -> Info:
        """Every voice served now, the default first, with its language and speakers."""
        catalog, default = self.state.catalog, self.state.voice
        served = catalog.serving() if catalog is not None else {}
        voices = []
        for name in sorted(served, key=lambda n: (n != default, n)):
            spec = served[name]
            about = describe(await self.config(spec))
            language = about["language"]
            assert isinstance(language, dict)
            code = language.get("code") or language.get("espeak_voice") or "und"
            speakers = about["speakers"]
            assert isinstance(speakers, list)
            many = isinstance(about["num_speakers"], int) and about["num_speakers"] > 1
            details = (language.get("name") or code, about["quality"])
            voices.append(TtsVoice(
                name=name, attribution=Attribution(name="Piper", url=PIPER_URL), installed=True,
                description=f"{name} ({', '.join(str(x) for x in details if x)})",
                version=spec.label, languages=[str(code)],
                speakers=[TtsVoiceSpeaker(str(s)) for s in speakers] if many else None,
            ))  # fmt: skip
        program = TtsProgram(
            name="ttsvc", attribution=Attribution(name="ttsvc", url=""), installed=True,
            description="ttsvc streaming text to speech", version=__version__, voices=voices,
            supports_synthesize_streaming=True,
        )  # fmt: skip
        return Info(tts=[program])

    async def resolve(self, wanted: SynthesizeVoice | None) -> Voice:
        """The served voice and speaker a request names (by name, else by language), checked
        as ``/synthesize`` checks them: an unknown voice or speaker is the same error."""
        name = None if wanted is None else wanted.name
        if wanted is not None and name is None and wanted.language:
            name = await self._by_language(wanted.language)
        voice = self.state.resolve_voice(name)
        spoken = None if wanted is None else wanted.speaker
        swapper = self.state.catalog.get(voice) if self.state.catalog is not None else None
        if spoken is None or swapper is None or swapper.current is None:
            return Voice(voice, None)
        config = VoiceConfig.from_piper(await self.config(swapper.current), voice)
        try:
            return Voice(voice, speaker_id(config, spoken))
        except ValueError as exc:
            raise InvalidParameter(str(exc), field="speaker") from exc

    async def _by_language(self, language: str) -> str:
        """The default voice if it speaks ``language`` (``en_US``, ``en-us`` or ``en``), else the
        first served voice that does."""
        catalog = self.state.catalog
        served = catalog.serving() if catalog is not None else {}

        def norm(code: str) -> str:
            return code.replace("-", "_").lower()

        wanted = norm(language)
        for name in sorted(served, key=lambda n: (n != self.state.voice, n)):
            code = describe(await self.config(served[name]))["language"]
            assert isinstance(code, dict)
            spoken = norm(str(code.get("code") or code.get("espeak_voice") or ""))
            if spoken == wanted or spoken.split("_")[0] == wanted:
                return name
        raise UnknownVoice(f"no served voice speaks {language!r}", field="voice")

    def request(self, receive: Callable[[], Awaitable[Message]]) -> Request:
        """An HTTP request as ``synthesis_response`` takes it, for one Wyoming synthesis (its path
        is the one it takes, so a refusal is recorded as that route's are)."""
        scope: Scope = {
            "type": "http",
            # 2.4: the response streams without listening for a disconnect itself (the
            # connection's handler cancels the request when its client leaves)
            "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/synthesize",
            "raw_path": b"/synthesize",
            "query_string": b"",
            "headers": [],
            "server": (self.host, self.port),
            "state": {"started": time.perf_counter(), "format": "pcm"},
        }
        request = Request(scope, receive)
        keys = self.state.keys
        if keys is not None:
            request.state.key = ApiKey(WYOMING_KEY, b"", keys.default)
            request.state.key_name = WYOMING_KEY
        return request


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

"""One gateway's shared state: its pool, voices, balancer, admission counters and drain flag.

Every route, the WebSocket, Wyoming and the server's drain read and change the same
``GatewayState``, on the gateway's one event loop; what answers for a voice (its rate, its
durations, which served voice a name means) is asked of it here.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ttsvc.balancer import HeatScoreBalancer
from ttsvc.config import Settings
from ttsvc.errors import EngineError, TimestampsUnavailable, TTSError, UnknownVoice
from ttsvc.gateway.auth import KeyStore
from ttsvc.gateway.catalog import VoiceCatalog
from ttsvc.gateway.hotswap import EngineSwapper
from ttsvc.gateway.openai_compat import OPENAI_VOICES
from ttsvc.gateway.ratelimit import KeyRateLimiter
from ttsvc.observability.logs import get_logger
from ttsvc.observability.metrics import ServiceMetrics
from ttsvc.pool.supervisor import WorkerPool
from ttsvc.repository.watcher import load_manifest_json
from ttsvc.voice import HOP_LENGTH, SAMPLE_RATE

if TYPE_CHECKING:
    from ttsvc.gateway.exchange import SynthesisExchange

log = get_logger("gateway")


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

    def abort_exchanges(self, error: TTSError) -> int:
        """End every request in flight with ``error`` (the drain's grace is over); returns how
        many. Each is recorded at once; its response then ends as a failure (see ``abort``)."""
        exchanges = list(self.exchanges)
        for exchange in exchanges:
            exchange.abort(error)
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
            return SAMPLE_RATE
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
            return SAMPLE_RATE / HOP_LENGTH
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

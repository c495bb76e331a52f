"""One gateway's shared state: its pool, voices, balancer, admission counters and drain flag.

Every route, the WebSocket, Wyoming and the server's drain read and change the same
``GatewayState``, on the gateway's one event loop; what answers for a voice (its rate, its
durations, which served voice a name means) is asked of it here.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from ttsvc.backends.base import EngineSource
from ttsvc.balancer import HeatScoreBalancer
from ttsvc.config import Settings
from ttsvc.errors import (
    ClientClosedRequest,
    EngineError,
    InvalidParameter,
    TimestampsUnavailable,
    TTSError,
    UnknownVoice,
)
from ttsvc.gateway.core.caller import Caller
from ttsvc.gateway.core.keys import KeyStore
from ttsvc.gateway.core.quotas import KeyRateLimiter
from ttsvc.lifecycle.catalog import VoiceCatalog
from ttsvc.lifecycle.lexicons import LexiconStore
from ttsvc.lifecycle.swapper import EngineSwapper
from ttsvc.observability.logs import get_logger
from ttsvc.observability.metrics import ServiceMetrics
from ttsvc.pool.supervisor import WorkerPool
from ttsvc.protocol import EngineSpec
from ttsvc.repository.watcher import load_manifest_json
from ttsvc.voice import HOP_LENGTH, SAMPLE_RATE, VOICE_FILE, VoiceConfig, speaker_id

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
    websockets: int = 0
    """WebSocket sessions open now, every route's (``ws.handshake``: their cap)."""
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    metrics: ServiceMetrics = field(default_factory=ServiceMetrics)
    keys: KeyStore | None = None
    """API keys in force; ``None``: no authentication."""
    limiter: KeyRateLimiter = field(default_factory=lambda: KeyRateLimiter(time.monotonic))
    aborts: dict[object, Callable[[TTSError], None]] = field(default_factory=dict)
    """How to end each synthesis request in flight (dispatched to a worker, not yet finished):
    the exchanges register themselves, so the state needs to know nothing of them."""
    aliases: dict[str, str] = field(default_factory=dict)
    """Other names a request may give a served voice (OpenAI's voice names, the settings'
    ``voice_aliases``), set by the app."""

    lexicons: LexiconStore | None = None
    """The pronunciation lexicons loaded from the engines directory (``None``: none served)."""
    configs: dict[tuple[str, str], dict[str, object]] = field(default_factory=dict)
    """Each served engine version's Piper config, by voice and label (read once, off the event
    loop): what ``/voices``, Wyoming's ``info`` and the speaker checks read."""

    async def voice_config(self, spec: EngineSpec) -> dict[str, object]:
        """The Piper config of the engine version ``spec``."""
        key = spec.voice, spec.label
        if key not in self.configs:
            raw = await asyncio.to_thread(EngineSource.from_spec(spec).read, VOICE_FILE)
            self.configs[key] = json.loads(raw.decode("utf-8"))
        return self.configs[key]

    async def speaker_of(self, voice: str, value: int | str | None) -> int | None:
        """The id of the speaker a request names, checked against its served voice's config: a
        422 on ``speaker`` naming the voice's speakers, before any worker is asked."""
        swapper = self.catalog.get(voice) if self.catalog is not None else None
        if value is None or swapper is None or swapper.current is None:
            return None
        config = VoiceConfig.from_piper(await self.voice_config(swapper.current), voice)
        try:
            return speaker_id(config, value)
        except ValueError as exc:
            raise InvalidParameter(str(exc), field="speaker") from exc

    def abort_exchanges(self, error: TTSError) -> int:
        """End every request in flight with ``error`` (the drain's grace is over); returns how
        many. Each is recorded at once; its response then ends as a failure."""
        aborts = list(self.aborts.values())
        for abort in aborts:
            abort(error)
        return len(aborts)

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

    async def resolve_voice(self, name: str | None, caller: Caller | None = None) -> str:
        """The served voice a request's ``voice`` names (OpenAI's names and aliases included).

        A voice that serves answers at once. One still being verified (just published, or
        found at start-up after the default voice) is waited for up to ``voice_wait_s``, then
        is a 503 ``engine_unavailable``, as the whole service is before its first engine; a
        name nothing serves is a 404 listing the voices that do. ``caller``'s completion line,
        if the request is refused before dispatch, names the voice asked for."""
        if name is None:
            name = self.voice
        target = self.aliases.get(name, name)
        if caller is not None:
            caller.voice = target if len(target) <= 80 else f"{target[:77]}..."
        catalog = self.catalog
        swapper = catalog.get(target) if catalog is not None else None
        if swapper is not None and swapper.current is not None:
            return target
        if catalog is not None:
            swapper = await catalog.find(target)
        if swapper is not None:
            if await _unless_gone(swapper.until_serving(self.settings.voice_wait_s), caller):
                return target
            raise EngineError(f"voice {target!r} has no verified engine yet: GET /voices says "
                              "why")  # fmt: skip
        served = ", ".join(sorted(catalog.serving())) if catalog is not None else ""
        raise UnknownVoice(f"unknown voice {name!r}; served: {served or 'none'}", field="voice")

    def voice_state(self, name: str) -> str:
        """Where ``name`` stands, as ``GET /voices`` and ``/health`` both say it: ``serving``
        (a verified version that READY workers serve: a request answers at once),
        ``loading`` (verified, no READY worker yet), ``verifying`` (a version is being judged:
        a request waits for it) or ``no_engine``."""
        swapper = self.catalog.get(name) if self.catalog is not None else None
        if swapper is None:
            return "no_engine"
        if swapper.current is not None:
            versions = self.pool.serving(name)[0] if self.pool is not None else []
            return "serving" if versions else "loading"
        return "verifying" if swapper.verifying else "no_engine"

    def ready_voices(self) -> list[str]:
        """The voices that serve now (``voice_state`` ``serving``), the default first."""
        names = self.catalog.swappers if self.catalog is not None else {}
        ready = [n for n in names if self.voice_state(n) == "serving"]
        return sorted(ready, key=lambda n: (n != self.voice, n))


async def _unless_gone(wait: Coroutine[Any, Any, bool], caller: Caller | None) -> bool:
    """``wait``'s answer, unless ``caller``'s client leaves first: a 499, and the wait is given
    up (nobody is left to answer)."""
    if caller is None:
        return await wait
    waited, gone = asyncio.ensure_future(wait), asyncio.ensure_future(caller.gone())
    try:
        await asyncio.wait({waited, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waited.cancel()
        gone.cancel()
    if not waited.done():
        raise ClientClosedRequest("the client closed the request while its voice was verified")
    return waited.result()


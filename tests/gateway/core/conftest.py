"""A gateway's request core on the scripted pool (``tests.pool.scripted``): a real
``GatewayState`` over a real ``WorkerPool``, balancer and metrics registry, whose one worker is
spoken for by the test. No server, no worker process, no engines: admission, the exchange and
the records run in process, on the pool's own event loop, in milliseconds."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.pool.scripted import LABEL, Pool, sent
from ttsvc.audio.encode import FORMATS
from ttsvc.config import Settings
from ttsvc.gateway.core.keys import ApiKey, KeyStore
from ttsvc.gateway.core.order import EmptyText, SpeechOrder
from ttsvc.gateway.core.quotas import KeyRateLimiter, Quota
from ttsvc.gateway.core.state import GatewayState
from ttsvc.pool.handle import WorkerHandle
from ttsvc.protocol import AudioChunkMsg, SynthesisJob, WorkerReady

T = TypeVar("T")

VOICE = "voice"
"""The scripted pool's voice (its engine spec's)."""
SLOTS = 2
"""The service's stream slots in these tests."""
MAX_TEXT = 40
"""The text cap in these tests."""
QUEUE_TIMEOUT_S = 10.0
REQUESTS = "ttsvc_requests_total"


class FakeClock:
    """A clock the test moves by hand (the key limiter's)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Core:
    """A ``GatewayState`` on the scripted pool, with one worker handle the test speaks for."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.settings = Settings(workers=1, compute_threads=1, max_streams_per_worker=SLOTS,
                                 max_text_chars=MAX_TEXT, queue_timeout_s=QUEUE_TIMEOUT_S,
                                 max_audio_s=60.0)  # fmt: skip
        self.clock = FakeClock()
        self.state = GatewayState(self.settings, VOICE, pool=pool.pool, balancer=pool.balancer,
                                  metrics=pool.metrics,
                                  limiter=KeyRateLimiter(self.clock, SLOTS))  # fmt: skip
        self.state.idle.set()  # as the app starts it
        self.handle: WorkerHandle = pool.handle(0)

    def ready(self) -> None:
        """The worker says READY: it is live and routed to."""
        self.pool.pool._on_message(self.handle, WorkerReady(0, VOICE, LABEL, 22050, capacity=3.0,
                                                            voices=(VOICE,)))  # fmt: skip

    def say(self, msg: object) -> None:
        """The worker sends ``msg``."""
        self.pool.pool._on_message(self.handle, msg)  # type: ignore[arg-type]

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def sent(self) -> list[object]:
        """What the pool queued for the worker since the last look."""
        return sent(self.handle)

    async def dispatched(self) -> SynthesisJob:
        """The job the pool sends the worker next, once it is sent (the loop is yielded to, no
        time passes)."""
        for _ in range(20):
            if not self.handle.outbox.empty():
                (job,) = self.sent()
                assert isinstance(job, SynthesisJob)
                return job
            await asyncio.sleep(0)
        raise AssertionError("no job was dispatched")

    def keyed(self, quota: Quota, name: str = "alice") -> ApiKey:
        """Turn keys on with one key of ``quota``; returns it."""
        key = ApiKey(name, bytes(32), quota)
        store = KeyStore(Path("unused-keys"), Quota())
        store.keys = [key]
        self.state.keys = store
        return key

    def records(self, code: str | None = None, outcome: str | None = None) -> float:
        """Completion records counted (``ttsvc_requests_total``), all, or of one code/outcome."""
        total = 0.0
        for metric in self.pool.metrics.registry.collect():
            for sample in metric.samples:
                if sample.name != REQUESTS:
                    continue
                if code is not None and sample.labels["code"] != code:
                    continue
                if outcome is not None and sample.labels["outcome"] != outcome:
                    continue
                total += sample.value
        return total

    def value(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        return self.pool.metrics.registry.get_sample_value(name, labels)


def order(text: str = "Hello there.", *, format: str = "pcm", stream: bool = True,
          api: str = "synthesize", sample_rate: int | None = None,
          empty_text: EmptyText = "silence", ssml: bool = False) -> SpeechOrder:  # fmt: skip
    """An order for the scripted voice."""
    return SpeechOrder(text=text, voice=VOICE, format=FORMATS[format], stream=stream, api=api,
                       sample_rate=sample_rate, empty_text=empty_text, ssml=ssml)  # fmt: skip


def chunk(uid: str, pcm: bytes, offset: int = 0, *, queued_s: float = 0.0) -> AudioChunkMsg:
    """A window of audio from the worker."""
    return AudioChunkMsg(uid, pcm, offset, LABEL, compute_s=0.01, queued_s=queued_s)


@pytest.fixture
def core(monkeypatch: pytest.MonkeyPatch) -> Iterator[Core]:
    for name in [k for k in os.environ if k.startswith("TTSVC_")]:
        monkeypatch.delenv(name)  # the settings here are the test's, not the environment's
    pool = Pool()
    built = Core(pool)
    yield built
    pool.loop.run_until_complete(pool.loop.shutdown_default_executor())
    pool.close()

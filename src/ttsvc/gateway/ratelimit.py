"""Per-key quotas: requests per minute and audio seconds per minute, checked at admission.

Pure: no IO, an injected clock; lives on the gateway's event loop. Each key has two token
buckets that refill continuously at their per-minute rate and hold at most one minute's worth
(so a quiet key may burst up to its minute, never more).

Audio length is unknown until a stream ends, so admission charges an estimate from the text and
the stream's end settles the difference. A key is admitted while its audio bucket is not in
debt; one request may overdraw it, and the key then waits until the debt is paid off. This way a
long text is never impossible under a small quota, and a key that floods is refused before any
of its requests reach a worker, so it cannot take stream slots from other keys.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ttsvc.errors import RateLimited

CHARS_PER_AUDIO_SECOND = 15.0
"""Admission's guess of speech per character at speed 1 (the default voice reads ~14-16)."""


@dataclass(frozen=True)
class Quota:
    """One key's limits; ``None`` is unlimited."""

    requests_per_minute: int | None = None
    audio_s_per_minute: float | None = None

    @property
    def unlimited(self) -> bool:
        return self.requests_per_minute is None and self.audio_s_per_minute is None


@dataclass
class _Bucket:
    level: float
    updated: float

    def refill(self, now: float, per_minute: float) -> None:
        self.level = min(per_minute, self.level + (now - self.updated) * per_minute / 60.0)
        self.updated = now


@dataclass
class Ticket:
    """An admitted request's claim on its key's audio quota, settled when the stream ends."""

    key: str
    estimate_s: float
    settled: bool = field(default=False)


class KeyRateLimiter:
    """Token buckets per key name (so a reloaded key file keeps each key's state)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._requests: dict[str, _Bucket] = {}
        self._audio: dict[str, _Bucket] = {}

    def admit(self, key: str, quota: Quota, text_chars: int, speed: float = 1.0) -> Ticket:
        """Take one request and an audio estimate from ``key``'s buckets, or raise
        ``RateLimited`` with the seconds until the request would be admitted."""
        now = self._clock()
        estimate = text_chars / CHARS_PER_AUDIO_SECOND / speed
        rpm, audio = quota.requests_per_minute, quota.audio_s_per_minute
        req_bucket = audio_bucket = None
        waits: list[tuple[float, str]] = []
        if rpm is not None:
            req_bucket = self._requests.setdefault(key, _Bucket(float(rpm), now))
            req_bucket.refill(now, rpm)
            if req_bucket.level < 1.0:
                waits.append(((1.0 - req_bucket.level) * 60.0 / rpm, "requests per minute"))
        if audio is not None:
            audio_bucket = self._audio.setdefault(key, _Bucket(audio, now))
            audio_bucket.refill(now, audio)
            if audio_bucket.level <= 0.0:
                waits.append(((-audio_bucket.level) * 60.0 / audio, "audio seconds per minute"))
        if waits:
            wait, what = max(waits)
            raise RateLimited(f"key over its {what} quota; retry in {math.ceil(wait)} s",
                              retry_after_s=wait)  # fmt: skip
        if req_bucket is not None:
            req_bucket.level -= 1.0
        if audio_bucket is not None:
            audio_bucket.level -= estimate
        return Ticket(key, estimate if audio_bucket is not None else 0.0)

    def settle(self, ticket: Ticket, audio_s: float) -> None:
        """Charge the audio a stream really produced instead of its estimate (once)."""
        if ticket.settled:
            return
        ticket.settled = True
        bucket = self._audio.get(ticket.key)
        if bucket is not None and ticket.estimate_s:
            bucket.level += ticket.estimate_s - audio_s

    def refund(self, ticket: Ticket) -> None:
        """Give back a request refused after admission for reasons not the key's (overload)."""
        if ticket.settled:
            return
        self.settle(ticket, 0.0)
        bucket = self._requests.get(ticket.key)
        if bucket is not None:
            bucket.level += 1.0

    def forget(self, keep: set[str]) -> None:
        """Drop the state of keys no longer in the key file."""
        for table in (self._requests, self._audio):
            for name in set(table) - keep:
                del table[name]

"""Per-key quotas: requests per minute, audio seconds per minute and concurrent streams,
checked at admission.

Pure: no IO, an injected clock; lives on the gateway's event loop. Each key has two token
buckets that refill continuously at their per-minute rate and hold at most one minute's worth
(so a quiet key may burst up to its minute, never more).

A minute's burst arrives at once, though, and long texts hold their stream slots for many
seconds, so rates alone let one key take every slot. Each key therefore also holds at most a
number of streams at a time: its own ``streams=N``, or else its fair share of the service's
slots (``fair_share``), so a flooding key is refused with its own 429 while another key still
finds a free slot.

Audio length is unknown until a stream ends, so admission charges an estimate from the text and
the stream's end settles the difference. A key is admitted while its audio bucket is not in
debt; one request may overdraw it, and the key then waits until the debt is paid off. This way a
long text is never impossible under a small quota, and a key that floods is refused before any
of its requests reach a worker.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ttsvc.errors import KeyStreamsExceeded, RateLimited

CHARS_PER_AUDIO_SECOND = 15.0
"""Admission's guess of speech per character at speed 1 (the default voice reads ~14-16)."""
ACTIVE_WINDOW_S = 60.0
"""A key that asked for synthesis this recently counts as active for the fair share."""


@dataclass(frozen=True)
class Quota:
    """One key's limits; ``None`` is unlimited, except ``streams``: ``None`` is the fair share."""

    requests_per_minute: int | None = None
    audio_s_per_minute: float | None = None
    streams: int | None = None
    """Streams the key may hold at once."""


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
    stream: bool = field(default=False)
    """It holds one of the key's concurrent streams (given back when it is settled)."""


class KeyRateLimiter:
    """Token buckets and stream counts per key name (so a reloaded key file keeps each key's
    state). ``slots`` is the service's stream slots (workers x streams per worker); 0 turns the
    concurrent-stream limit off."""

    def __init__(self, clock: Callable[[], float], slots: int = 0) -> None:
        self._clock = clock
        self.slots = slots
        self._requests: dict[str, _Bucket] = {}
        self._audio: dict[str, _Bucket] = {}
        self._streams: dict[str, int] = {}
        self._asked: dict[str, float] = {}
        """When each key last asked for synthesis."""

    def streams(self, key: str) -> int:
        """Streams ``key`` holds now."""
        return self._streams.get(key, 0)

    def fair_share(self, key: str, keys_total: int) -> int:
        """Streams a key without its own limit may hold: the slots divided among the keys
        active now (holding a stream or asking within ``ACTIVE_WINDOW_S``, this one included)
        plus one share kept free for a key that comes next, at least 1.

        The kept share is what protects a newcomer: streams cannot be taken back, so a key that
        held every slot would refuse the next key until its streams end. No share is kept for
        keys that do not exist: with one key in the file it may use every slot, with two each
        gets half, with more a key alone gets half and the shares shrink as keys join.
        """
        now = self._clock()
        active = {k for k, n in self._streams.items() if n > 0}
        active |= {k for k, t in self._asked.items() if now - t < ACTIVE_WINDOW_S}
        active.add(key)
        shares = max(1, min(keys_total, len(active) + 1))
        return max(1, self.slots // shares)

    def admit(
        self,
        key: str,
        quota: Quota,
        text_chars: int,
        speed: float = 1.0,
        keys_total: int = 1,
    ) -> Ticket:
        """Take one request, an audio estimate and a stream from ``key``'s limits, or raise
        ``RateLimited`` (with the seconds until the request would be admitted) or
        ``KeyStreamsExceeded``. ``keys_total``: keys in the key file, for the fair share."""
        now = self._clock()
        self._asked[key] = now
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
        if self.slots:
            limit = quota.streams or self.fair_share(key, keys_total)
            if self.streams(key) >= limit:
                raise KeyStreamsExceeded(
                    f"this key already holds {limit} concurrent streams, its limit; "
                    "retry when one ends"
                )
            self._streams[key] = self.streams(key) + 1
        if req_bucket is not None:
            req_bucket.level -= 1.0
        if audio_bucket is not None:
            audio_bucket.level -= estimate
        return Ticket(key, estimate if audio_bucket is not None else 0.0, stream=bool(self.slots))

    def settle(self, ticket: Ticket, audio_s: float) -> None:
        """Charge the audio a stream really produced instead of its estimate, and give its
        stream back (once)."""
        if ticket.settled:
            return
        ticket.settled = True
        if ticket.stream:
            left = self.streams(ticket.key) - 1
            if left > 0:
                self._streams[ticket.key] = left
            else:
                self._streams.pop(ticket.key, None)
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
        """Drop the state of keys no longer in the key file (their streams in flight still
        count until they end)."""
        for table in (self._requests, self._audio, self._asked):
            for name in set(table) - keep:
                del table[name]

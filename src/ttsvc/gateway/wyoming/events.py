"""Reading Wyoming events off a connection with bounds, as the HTTP server bounds requests.

Why not the ``wyoming`` package's reader: it reads a header line of any length, then as many
data and payload bytes as the header announces (a ``payload_length`` of 300 MB is buffered
whole), waits forever on a header cut short, and ends the connection silently on a line that is
not JSON. The protocol has no authentication, so the side that anyone on the network may reach
must be the hardest to abuse: here every part of an event is capped (a TTS client sends text; no
Wyoming TTS event carries a payload), an event must arrive whole within the header and body
timeouts of its first byte, a connection that sends nothing while nothing is being spoken is
closed after the idle timeout, and a malformed event is answered with a reason.

Lives on the gateway's event loop; one ``EventReader`` per connection.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from wyoming.event import Event

from ttsvc.errors import InvalidJson, PayloadTooLarge, RequestTimeout
from ttsvc.gateway.core.idle import IdleClock, IdleConnection

__all__ = ["EventLimits", "EventReader", "IdleConnection"]  # IdleConnection: what it raises


@dataclass(frozen=True)
class EventLimits:
    """How much of a Wyoming event the server takes, and how long it waits for one."""

    max_bytes: int
    """The header line, the data and the payload may each be this long (``max_body_bytes``)."""
    idle_s: float
    """No byte for this long while nothing is being spoken: the connection is closed."""
    header_s: float
    """From an event's first byte, its header line must arrive within this."""
    body_s: float
    """After its header line, an event's data and payload must arrive within this."""


class EventReader:
    """Reads one connection's events within ``limits`` (gateway event loop)."""

    def __init__(self, reader: asyncio.StreamReader, limits: EventLimits,
                 busy: Callable[[], bool]) -> None:  # fmt: skip
        """``busy``: whether the connection has work in progress (a reply being spoken); the
        idle timeout only runs while it has none (``idle``: touch it when the work ends)."""
        self.reader = reader
        self.limits = limits
        self.idle = IdleClock(limits.idle_s, busy)

    async def next(self) -> Event | None:
        """The next event, or ``None`` at the end of the stream. Raises ``IdleConnection``, or a
        ``TTSError`` (``invalid_json``, ``payload_too_large``, ``request_timeout``) for the
        client to be told before the connection is closed."""
        first = await self._first_byte()
        if first is None:
            return None
        started = time.monotonic()
        line = first + await self._within(self._line(), self.limits.header_s, started,
                                          "the event's header line")  # fmt: skip
        header = _json_object(line, "header")
        kind = header.get("type")
        if not isinstance(kind, str):
            raise InvalidJson("event header has no string 'type'", field="type")
        data = header.get("data") or {}
        if not isinstance(data, dict):
            raise InvalidJson("event 'data' is not an object", field="data")
        body_started = time.monotonic()
        extra = self._length(header, "data_length")
        if extra:
            more = await self._within(self.reader.readexactly(extra), self.limits.body_s,
                                      body_started, "the event's data")  # fmt: skip
            data = {**data, **_json_object(more, "data")}
        payload = None
        if size := self._length(header, "payload_length"):
            payload = await self._within(self.reader.readexactly(size), self.limits.body_s,
                                         body_started, "the event's payload")  # fmt: skip
        self.idle.touch()  # the idle time counts from the end of the client's last event
        return Event(type=kind, data=data, payload=payload)

    async def _first_byte(self) -> bytes | None:
        """The first byte of the next event; waits indefinitely while the connection is busy
        (its client is waiting for audio), at most the idle timeout otherwise."""
        try:
            return await self.idle.wait(lambda: self.reader.readexactly(1))
        except asyncio.IncompleteReadError:
            return None

    async def _line(self) -> bytes:
        try:
            return await self.reader.readuntil(b"\n")
        except asyncio.LimitOverrunError:
            raise PayloadTooLarge(f"event header line over {self.limits.max_bytes} bytes",
                                  field="header") from None  # fmt: skip
        except asyncio.IncompleteReadError as exc:
            return exc.partial  # the client ended the stream: parse what came

    async def _within(self, read: Awaitable[bytes], seconds: float, since: float,
                      what: str) -> bytes:  # fmt: skip
        remaining = max(0.0, since + seconds - time.monotonic())
        try:
            result = await asyncio.wait_for(read, remaining)
        except asyncio.TimeoutError:
            raise RequestTimeout(f"{what} did not arrive within {seconds:g} s") from None
        except asyncio.IncompleteReadError:
            raise InvalidJson(f"the connection ended inside {what}") from None
        return result

    def _length(self, header: dict[str, object], name: str) -> int:
        value = header.get(name) or 0
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InvalidJson(f"event {name} is not a byte count", field=name)
        if value > self.limits.max_bytes:
            raise PayloadTooLarge(f"event {name} {value} is over {self.limits.max_bytes} bytes "
                                  "(a speech request carries text only)", field=name)  # fmt: skip
        return value


def _json_object(raw: bytes, part: str) -> dict[str, object]:
    """``raw`` as a JSON object, or the ``invalid_json`` error naming the part and the fault."""
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidJson(f"event {part} is not JSON: {exc}", field=part) from None
    if not isinstance(value, dict):
        raise InvalidJson(f"event {part} is not a JSON object", field=part)
    return value


"""The idle timeout of a long-lived connection, for every transport that keeps one (Wyoming's
TCP connections, the WebSocket sessions).

Why one place: the rule is the same on each, and subtle: a connection is idle when its client
has sent nothing for the timeout *and* nothing is being done for it (a reply spoken, a sentence
waiting for its first audio), so a client that listens to a long answer is never cut off, and
the time counts from whichever came last, the client's last message or the end of the work it
asked for. A transport reads through ``IdleClock.wait``, says what "busy" means, and touches
the clock when its work ends.

Runs on the gateway's event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class IdleConnection(Exception):
    """The client sent nothing for the idle timeout while nothing was being done for it."""


class IdleClock:
    """When a connection last saw its client or finished work for it (gateway event loop)."""

    def __init__(self, idle_s: float, busy: Callable[[], bool]) -> None:
        """``busy``: whether the client is waiting on the connection (a reply is spoken or
        queued); the timeout runs only while it is not."""
        self.idle_s = idle_s
        self.busy = busy
        self.since = time.monotonic()

    def touch(self) -> None:
        """Something happened for the client (its message came, its work ended): the idle time
        counts from now."""
        self.since = time.monotonic()

    async def wait(self, read: Callable[[], Awaitable[T]]) -> T:
        """What ``read()`` returns, waiting indefinitely while the connection is busy; raises
        ``IdleConnection`` once it has been idle ``idle_s``. ``read`` is called again after each
        idle period and must lose nothing when cancelled (a queue's ``get``, a stream's read)."""
        while True:
            remaining = self.since + self.idle_s - time.monotonic()
            if remaining <= 0:
                if not self.busy():
                    raise IdleConnection
                self.touch()  # busy: look again after a full period (its end touches too)
                continue
            try:
                result = await asyncio.wait_for(read(), remaining)
            except asyncio.TimeoutError:
                continue
            task = asyncio.current_task()
            if task is not None and getattr(task, "cancelling", lambda: 0)():
                # Python 3.11's wait_for returns a read that finished as its caller was
                # cancelled, swallowing the cancellation: the session must still end
                raise asyncio.CancelledError
            self.touch()
            return result

"""The idle timeout every long-lived connection shares (``core.idle``), in process: a silent
connection is idle, a busy one waits for its client however long, and the period counts from
the end of the work as well as from the client's last message."""

from __future__ import annotations

import asyncio

import pytest

from ttsvc.gateway.core.idle import IdleClock, IdleConnection


def test_a_silent_connection_with_nothing_to_do_is_idle() -> None:
    async def run() -> None:
        silent: asyncio.Queue[str] = asyncio.Queue()
        await IdleClock(0.01, lambda: False).wait(silent.get)

    with pytest.raises(IdleConnection):
        asyncio.run(run())


def test_a_busy_connection_waits_for_its_client_past_the_period() -> None:
    async def run() -> str:
        messages: asyncio.Queue[str] = asyncio.Queue()
        asked = 0

        def busy() -> bool:  # asked at the end of each period: the message comes after two
            nonlocal asked
            asked += 1
            if asked == 2:
                messages.put_nowait("append")
            return True

        return await IdleClock(0.01, busy).wait(messages.get)

    assert asyncio.run(run()) == "append"


def test_the_period_counts_from_the_end_of_the_last_work() -> None:
    """A client that listened to a long reply is not cut off the moment it ends: before, the
    period counted from its last message only."""

    async def run(touched: bool) -> str:
        messages: asyncio.Queue[str] = asyncio.Queue()
        clock = IdleClock(3600.0, lambda: False)
        clock.since -= 3600.0  # the client's last message is a period old...
        if touched:
            clock.touch()  # ...but the reply it asked for has just been sent
        asyncio.get_running_loop().call_soon(messages.put_nowait, "next turn")
        return await clock.wait(messages.get)

    assert asyncio.run(run(touched=True)) == "next turn"
    with pytest.raises(IdleConnection):
        asyncio.run(run(touched=False))

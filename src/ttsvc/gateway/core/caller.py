"""Who asks for speech, as the request core sees any transport's client.

The core (admission, the exchange, the records) needs a few facts of a request and writes a few
back; an HTTP request, a WebSocket session and a Wyoming connection each make one ``Caller`` and
hand it in, so the core reads no transport's objects (no ``request.state``, no ASGI scope) and
Wyoming needs no HTTP request made up for it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ttsvc.gateway.core.keys import ApiKey


async def _never() -> None:
    """A client that is never seen to leave (its transport cancels the request instead)."""
    await asyncio.Event().wait()


@dataclass(eq=False)
class Caller:
    """One client's request as the core sees it: what it brings, and what the core says of it."""

    started: float = field(default_factory=time.perf_counter)
    """When the request arrived: its latency in the completion line counts from here."""
    key: ApiKey | None = None
    """The key it authenticated with (its quota and share of the slots); ``None``: keys off."""
    labels: dict[str, object] = field(default_factory=dict)
    """What its completion line says of it besides the core's fields (``format``, and on OpenAI's
    route ``stream_format``)."""
    gone: Callable[[], Awaitable[object]] = _never
    """Returns once the client has left: a request queued for it is then cancelled (a 499)."""
    client_request_id: str | None = None
    """The client's own ``X-Request-Id``, logged beside ours (never used as ours)."""

    # what the core writes back as the request goes
    voice: str | None = None
    """The voice it asked for, once resolved (``GatewayState.resolve_voice``): what its
    completion line names if it is refused before dispatch (unset: the default voice)."""
    text_len: int | None = None
    """Its text's length once admission read it (the completion line's ``text_len``)."""
    request_id: str | None = None
    """The uid its completion line carries: an error answered after it was recorded names it."""
    recorded: bool = False
    """Its one completion line is written: a later error of the same request is not recorded."""
    cut: bool = False
    """Its stream failed after the first audio went out: the transport must not end it as if
    it were whole (HTTP withholds the final chunk, see ``http.limits.StreamAbort``)."""

    def log_labels(self) -> dict[str, object]:
        """The key's name and the caller's labels, for its completion line."""
        return {"key": None if self.key is None else self.key.name, "format": None,
                **self.labels}  # fmt: skip

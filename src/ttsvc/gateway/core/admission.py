"""Admission: whether a synthesis request may start, and on which worker.

Every API's request passes the same checks in the same order before anything is dispatched —
the drain, the text cap and a text with nothing to speak, a voice with verified engines, the
output rate, the key's quota and its share of the slots, the shared slots, then the pool's pick —
so a refusal is the same 4xx or 503 whichever API was called, and a key's quota is refunded when
the service, not the key, refuses. A text with nothing to speak needs no worker: it is admitted
as silence (no slot, no quota, no worker), or refused where the request asks for the error.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from dataclasses import dataclass

from ttsvc.audio.encode import Encoder
from ttsvc.errors import (
    Busy,
    Draining,
    EngineError,
    InvalidParameter,
    NothingToSay,
    TextTooLong,
)
from ttsvc.gateway.core.caller import Caller
from ttsvc.gateway.core.order import SpeechOrder
from ttsvc.gateway.core.quotas import Ticket
from ttsvc.gateway.core.state import GatewayState
from ttsvc.pool.supervisor import WorkerPool
from ttsvc.text.normalize import has_speakable

SHORT_TEXT = 256
"""Texts up to this long with no letter or digit are normalized here to see whether they say
anything (a fraction of a millisecond); longer ones are left to the worker, which knows too."""
_ALNUM = re.compile(r"[^\W_]")


@dataclass(frozen=True)
class Admitted:
    """A request that may start: its worker, the worker's load counting it, its output rate,
    the key's ticket (refunded if the stream never starts) and its encoder. A request with
    nothing to speak has no worker (``pool`` ``None``): its silence is made in the gateway."""

    pool: WorkerPool | None
    wid: int | None
    qsize: int
    rate: int
    ticket: Ticket | None
    encoder: Encoder

    @property
    def silent(self) -> bool:
        """Nothing to speak: answered with silence, no worker involved."""
        return self.pool is None


def nothing_to_speak(text: str) -> bool:
    """Whether plain ``text`` surely says nothing (blank, or a short text of only symbols or
    emoji that normalization leaves without a letter or digit): cheap enough for the loop. A
    ``False`` is not a promise: the worker finds the rest (``NothingToSay``)."""
    if not text.strip():
        return True
    return len(text) <= SHORT_TEXT and _ALNUM.search(text) is None and not has_speakable(text)


def admit(
    state: GatewayState, order: SpeechOrder, caller: Caller, *, plain: bool = True,
    nothing: bool = False,
) -> Admitted:  # fmt: skip
    """Admit ``order`` or raise its refusal (drain, text cap, nothing to speak where the order
    asks for the error, engines, rate, key quota, slots, no worker).

    ``plain``: the worker reads the text as it is (no SSML, no lexicon word), so a text of only
    symbols is known here to say nothing; ``nothing``: the script found nothing to speak
    (SSML of only markup)."""
    settings = state.settings
    caller.text_len = len(order.text)  # its record says it, whatever refuses it
    if state.draining:
        raise Draining("the server is shutting down")
    field = "input" if order.api == "openai" else "text"
    if len(order.text) > settings.max_text_chars:
        raise TextTooLong(f"{field} is over {settings.max_text_chars} characters", field=field)
    # known at once: it must not wait for (or be refused) a slot, nor take a worker's time
    silent = nothing or (nothing_to_speak(order.text) if plain else not order.text.strip())
    if silent and order.empty_text == "error":
        said = "is empty" if not order.text.strip() else "has nothing to speak (only symbols)"
        raise NothingToSay(f"{field} {said}", field=field)
    pool = state.pool
    if pool is None and not silent:
        raise EngineError("no verified engine to serve yet: GET /voices says why")
    rate = order.sample_rate or state.native_rate(order.voice)
    if (why := order.format.rate_error(rate)) is not None:  # e.g. opus at a voice's own rate
        raise InvalidParameter(why, field="sample_rate")
    if silent:
        return Admitted(None, None, 0, rate, None, Encoder(order.format, rate,
                                                            streamed=order.stream))  # fmt: skip
    assert pool is not None
    key = caller.key
    ticket = None
    if key is not None and state.keys is not None:
        # before the shared slots: a key over its quota or its share of the slots never takes
        # one from another key
        ticket = state.limiter.admit(key.name, key.quota, len(order.text), order.speed,
                                     len(state.keys.keys))  # fmt: skip
    encoder: Encoder | None = None
    try:
        if state.inflight >= state.limiter.slots:
            raise Busy("all stream slots are busy, retry shortly")
        encoder = Encoder(order.format, rate, streamed=order.stream)
        wid, qsize = pool.pick(order.voice)  # NoWorkerAvailable: a 503 from the error table
    except Exception:
        if ticket is not None:
            state.limiter.refund(ticket)  # the service's refusal, not the key's
        if encoder is not None:
            close_later(encoder)
        raise
    return Admitted(pool, wid, qsize, rate, ticket, encoder)


def close_later(encoder: Encoder) -> None:
    """Release an encoder off the loop (closing may flush a codec, or wait for a chunk being
    encoded); nothing waits for it."""

    def close() -> None:
        with contextlib.suppress(Exception):
            encoder.close()

    asyncio.get_running_loop().run_in_executor(None, close)

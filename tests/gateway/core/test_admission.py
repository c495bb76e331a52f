"""Admission in process: which refusal a request gets, in which order, and what a key is charged.

Every API's synthesis passes ``admit``; the end-to-end tests (tests/gateway/core/test_quotas.py,
test_server.py ...) prove the HTTP answers through a real server, which takes seconds per case.
Here each refusal is set up together with the ones checked after it, so a test fails if the
order changes, and a key's quota is read back from the limiter itself.
"""

from __future__ import annotations

import pytest

from tests.gateway.core.conftest import MAX_TEXT, SLOTS, VOICE, Core, order
from ttsvc.errors import (
    Busy,
    Draining,
    EngineError,
    InvalidParameter,
    KeyStreamsExceeded,
    NoHeadroom,
    NothingToSay,
    NoWorkerAvailable,
    RateLimited,
    TextTooLong,
    TTSError,
)
from ttsvc.gateway.core.admission import SHORT_TEXT, Admitted, admit
from ttsvc.gateway.core.caller import Caller
from ttsvc.gateway.core.order import SpeechOrder
from ttsvc.gateway.core.quotas import Quota
from ttsvc.protocol import Heartbeat

TOO_LONG = "x" * (MAX_TEXT + 1)


def admit_on_loop(core: Core, speech: SpeechOrder, caller: Caller | None = None) -> Admitted:
    """``admit`` as a route calls it: on the gateway's loop (a refused encoder closes there)."""

    async def call() -> Admitted:
        return admit(core.state, speech, caller or Caller())

    return core.run(call())


def refusal(core: Core, speech: SpeechOrder, caller: Caller | None = None) -> TTSError:
    with pytest.raises(TTSError) as refused:
        admit_on_loop(core, speech, caller)
    return refused.value


def test_a_draining_gateway_refuses_before_anything_else(core: Core) -> None:
    core.state.draining = True
    core.state.pool = None
    error = refusal(core, order(TOO_LONG))
    assert isinstance(error, Draining)
    assert (error.status, error.type) == (503, "draining")


def test_a_text_over_the_cap_is_refused_naming_text(core: Core) -> None:
    core.state.pool = None  # checked later: the cap answers first
    error = refusal(core, order(TOO_LONG))
    assert isinstance(error, TextTooLong)
    assert (error.status, error.type, error.field) == (422, "text_too_long", "text")
    assert str(MAX_TEXT) in error.message


def test_openai_s_text_over_the_cap_is_refused_naming_input(core: Core) -> None:
    error = refusal(core, order(TOO_LONG, api="openai"))
    assert isinstance(error, TextTooLong)
    assert error.field == "input"


def test_a_text_of_exactly_the_cap_passes_the_cap(core: Core) -> None:
    core.state.pool = None
    error = refusal(core, order("x" * MAX_TEXT))
    assert isinstance(error, EngineError)  # the next check: the cap let it through


@pytest.mark.parametrize("text", ["", "   \n\t ", "🙂", " ... 🙂!"])
def test_nothing_to_speak_asked_as_an_error_is_nothing_to_say(core: Core, text: str) -> None:
    """Known at once, before the pool and the slots: with ``empty_text: "error"`` a text with
    nothing to speak is the client's error even while the service could not take it anyway."""
    core.state.pool = None
    core.state.inflight = SLOTS
    error = refusal(core, order(text, empty_text="error"))
    assert isinstance(error, NothingToSay)
    assert (error.status, error.type, error.field) == (422, "empty_text", "text")


def test_blank_openai_input_is_nothing_to_say_naming_input(core: Core) -> None:
    error = refusal(core, order(" ", api="openai", empty_text="error"))
    assert isinstance(error, NothingToSay)
    assert error.field == "input"


@pytest.mark.parametrize("text", ["", "   \n\t ", "🙂", " ... 🙂!"])
def test_nothing_to_speak_is_admitted_as_silence_with_no_worker_slot_or_quota(
    core: Core, text: str
) -> None:
    """The default: admitted without a worker (none is live, every slot is busy) and without
    charging the key, at the rate and in the format asked for."""
    core.state.inflight = SLOTS
    key = core.keyed(Quota(requests_per_minute=1))
    admitted = admit_on_loop(core, order(text, format="opus", sample_rate=24000),
                             Caller(key=key))  # fmt: skip
    assert admitted.silent and (admitted.pool, admitted.wid, admitted.ticket) == (None, None, None)
    assert (admitted.rate, admitted.encoder.format.name) == (24000, "opus")
    admitted.encoder.close()
    assert core.state.limiter.streams("alice") == 0
    core.state.inflight = 0
    core.ready()
    spoken = admit_on_loop(core, order(), Caller(key=key))  # its one request a minute is unspent
    assert not spoken.silent and spoken.ticket is not None
    spoken.encoder.close()


def test_silence_is_still_refused_a_rate_its_format_does_not_take(core: Core) -> None:
    error = refusal(core, order("🙂", format="opus", sample_rate=22050))
    assert isinstance(error, InvalidParameter) and error.field == "sample_rate"


@pytest.mark.parametrize("text", ["&", "#1", "🙂" * (SHORT_TEXT + 1)])
def test_symbols_that_say_something_or_a_long_text_go_to_a_worker(
    core: Core, text: str
) -> None:
    """``&`` is read "and", a digit is a word; a long text is not normalized on the loop (its
    worker finds whether it says anything): none of them is silence here."""
    core.state.settings = core.settings.model_copy(update={"max_text_chars": 4096})
    core.ready()
    admitted = admit_on_loop(core, SpeechOrder(text=text, voice=VOICE, format=order().format,
                                               stream=True, api="synthesize"))  # fmt: skip
    assert not admitted.silent and admitted.wid == 0
    admitted.encoder.close()


def test_ssml_or_a_lexicon_s_text_is_never_judged_by_its_symbols_here(core: Core) -> None:
    """A lexicon may say a symbol: a text that is not read as it is goes to its worker."""
    core.ready()

    async def call() -> Admitted:
        return admit(core.state, order("🙂"), Caller(), plain=False)

    admitted = core.run(call())
    assert not admitted.silent
    admitted.encoder.close()


def test_no_pool_yet_is_an_engine_error(core: Core) -> None:
    core.state.pool = None
    error = refusal(core, order(format="opus", sample_rate=22050))  # a bad rate is checked later
    assert isinstance(error, EngineError)
    assert (error.status, error.type) == (503, "engine_unavailable")


def test_a_rate_the_format_refuses_is_an_invalid_sample_rate(core: Core) -> None:
    """Opus at the voice's own 22050 Hz (no rate asked): refused before a slot is looked at."""
    core.state.inflight = SLOTS
    error = refusal(core, order(format="opus"))
    assert isinstance(error, InvalidParameter) and not isinstance(error, NothingToSay)
    assert (error.status, error.type, error.field) == (422, "invalid_parameter", "sample_rate")
    assert "22050" in error.message


def test_all_slots_busy_is_busy_even_with_no_worker(core: Core) -> None:
    core.state.inflight = SLOTS  # and no worker is READY: the slots answer first
    error = refusal(core, order())
    assert isinstance(error, Busy)
    assert (error.status, error.type, error.headers()) == (429, "overloaded", {"Retry-After": "1"})


def test_no_live_worker_is_no_worker_available(core: Core) -> None:
    error = refusal(core, order())
    assert isinstance(error, NoWorkerAvailable)
    assert (error.status, error.type) == (503, "no_worker_available")


def test_an_admitted_request_gets_the_picked_worker_its_rate_and_encoder(core: Core) -> None:
    core.ready()
    caller = Caller()
    admitted = admit_on_loop(core, order("Hi.", format="opus", sample_rate=16000), caller)
    assert (admitted.pool, admitted.wid, admitted.qsize) == (core.state.pool, 0, 1)
    assert admitted.rate == 16000  # the order's rate, not the voice's 22050
    assert (admitted.encoder.format.name, admitted.encoder.rate) == ("opus", 16000)
    assert admitted.ticket is None  # keys off
    assert caller.text_len == 3
    assert core.state.inflight == 0  # admission takes no slot: the exchange does
    admitted.encoder.close()


def test_a_request_with_no_rate_is_encoded_at_the_voice_s_own(core: Core) -> None:
    core.ready()
    admitted = admit_on_loop(core, order(format="wav"))
    assert admitted.rate == 22050 and admitted.encoder.rate == 22050


def test_a_key_over_its_requests_per_minute_is_rate_limited_before_the_slots(core: Core) -> None:
    core.ready()
    key = core.keyed(Quota(requests_per_minute=1))
    first = admit_on_loop(core, order(), Caller(key=key))
    assert first.ticket is not None and first.ticket.key == "alice"
    core.state.inflight = SLOTS  # busy too: the key's own refusal comes first
    error = refusal(core, order(), Caller(key=key))
    assert isinstance(error, RateLimited)
    assert (error.status, error.type, error.headers()) == (429, "rate_limited",
                                                          {"Retry-After": "60"})  # fmt: skip


def test_a_key_at_its_stream_limit_is_refused_with_its_own_error(core: Core) -> None:
    core.ready()
    key = core.keyed(Quota(streams=1))
    admit_on_loop(core, order(), Caller(key=key))
    assert core.state.limiter.streams("alice") == 1
    error = refusal(core, order(), Caller(key=key))
    assert isinstance(error, KeyStreamsExceeded)
    assert (error.status, error.type) == (429, "key_streams_exceeded")


def test_a_key_s_ticket_is_refunded_when_the_slots_are_busy(core: Core) -> None:
    """The service refused, not the key: its one request a minute and its stream come back."""
    core.ready()
    key = core.keyed(Quota(requests_per_minute=1, streams=1))
    core.state.inflight = SLOTS
    assert isinstance(refusal(core, order(), Caller(key=key)), Busy)
    assert core.state.limiter.streams("alice") == 0
    core.state.inflight = 0
    admitted = admit_on_loop(core, order(), Caller(key=key))  # not RateLimited: refunded
    assert admitted.ticket is not None and core.state.limiter.streams("alice") == 1


def test_no_worker_with_headroom_is_a_429_no_worker_sees_and_the_key_gets_back(
    core: Core,
) -> None:
    core.ready()  # capacity 3.0 on 1 thread: room 2.7 audio-s/s
    key = core.keyed(Quota(requests_per_minute=1, streams=2))
    core.say(Heartbeat(0, qsize=2, capacity=3.0, demand=2.0, voices=(VOICE,)))  # 2 + 1 > 2.7
    before = core.state.balancer.snapshot()
    error = refusal(core, order(), Caller(key=key))
    assert isinstance(error, NoHeadroom)
    assert (error.status, error.type) == (429, "no_headroom")
    assert int(error.headers()["Retry-After"]) >= 1
    assert core.sent() == [] and core.state.balancer.snapshot() == before  # no worker touched
    assert core.state.limiter.streams("alice") == 0  # the service refused, not the key
    assert core.value("ttsvc_headroom_ratio") is not None
    core.say(Heartbeat(0, qsize=1, capacity=3.0, demand=1.0, voices=(VOICE,)))  # one ended
    admitted = admit_on_loop(core, order(), Caller(key=key))  # not RateLimited: refunded
    assert admitted.wid == 0 and admitted.ticket is not None
    admitted.encoder.close()


def test_a_key_s_ticket_is_refunded_when_no_worker_is_live(core: Core) -> None:
    key = core.keyed(Quota(requests_per_minute=1, streams=1))
    assert isinstance(refusal(core, order(), Caller(key=key)), NoWorkerAvailable)
    assert core.state.limiter.streams("alice") == 0
    core.ready()
    admitted = admit_on_loop(core, order(), Caller(key=key))
    assert admitted.ticket is not None and admitted.wid == 0


def test_a_key_refused_for_its_text_is_not_charged(core: Core) -> None:
    core.ready()
    key = core.keyed(Quota(requests_per_minute=1))
    assert isinstance(refusal(core, order(TOO_LONG), Caller(key=key)), TextTooLong)
    assert isinstance(refusal(core, order(format="opus"), Caller(key=key)), InvalidParameter)
    admitted = admit_on_loop(core, order(), Caller(key=key))
    assert admitted.ticket is not None

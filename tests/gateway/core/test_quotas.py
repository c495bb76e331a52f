"""Per-key quotas and concurrent streams, driven by a fake clock (no waiting, exact arithmetic);
the two-key test against a real server is in ``test_auth``."""

from __future__ import annotations

import pytest

from ttsvc.errors import KeyStreamsExceeded, RateLimited
from ttsvc.gateway.core.quotas import ACTIVE_WINDOW_S, CHARS_PER_AUDIO_SECOND, KeyRateLimiter, Quota


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_requests_per_minute_burst_then_refill() -> None:
    clock = FakeClock()
    limiter = KeyRateLimiter(clock)
    quota = Quota(requests_per_minute=6)
    for _ in range(6):  # a quiet key may spend its whole minute at once
        limiter.admit("a", quota, 10)
    with pytest.raises(RateLimited) as refused:
        limiter.admit("a", quota, 10)
    assert refused.value.retry_after_s == pytest.approx(10.0)  # one request every 10 s
    assert refused.value.headers() == {"Retry-After": "10"}
    clock.now += 9.9
    with pytest.raises(RateLimited):
        limiter.admit("a", quota, 10)
    clock.now += 0.1
    limiter.admit("a", quota, 10)


def test_audio_quota_charges_an_estimate_then_settles_the_real_length() -> None:
    clock = FakeClock()
    limiter = KeyRateLimiter(clock)
    quota = Quota(audio_s_per_minute=30.0)
    chars = int(20 * CHARS_PER_AUDIO_SECOND)  # estimated at 20 s of audio
    first = limiter.admit("a", quota, chars)
    assert first.estimate_s == pytest.approx(20.0)
    second = limiter.admit("a", quota, chars)  # 10 s left: admitted, overdraws to -10
    with pytest.raises(RateLimited) as refused:
        limiter.admit("a", quota, chars)
    assert refused.value.retry_after_s == pytest.approx(20.0)  # 10 s of debt at 0.5 s/s
    limiter.settle(first, 5.0)  # it was short: 15 s back
    limiter.settle(first, 0.0)  # settling twice changes nothing
    limiter.admit("a", quota, chars)  # 5 s left: admitted again
    limiter.settle(second, 40.0)  # longer than guessed: 20 s more debt
    with pytest.raises(RateLimited) as refused:
        limiter.admit("a", quota, chars)
    assert refused.value.retry_after_s == pytest.approx(70.0)  # -35 s at 0.5 s/s


def test_speed_shortens_the_estimate() -> None:
    limiter = KeyRateLimiter(FakeClock())
    ticket = limiter.admit("a", Quota(audio_s_per_minute=60.0), 150, speed=2.0)
    assert ticket.estimate_s == pytest.approx(150 / CHARS_PER_AUDIO_SECOND / 2)


def test_keys_do_not_share_buckets_and_unlimited_keys_pass() -> None:
    clock = FakeClock()
    limiter = KeyRateLimiter(clock)
    tight = Quota(requests_per_minute=1)
    limiter.admit("flood", tight, 10)
    with pytest.raises(RateLimited):
        limiter.admit("flood", tight, 10)
    limiter.admit("other", tight, 10)
    for _ in range(1000):
        limiter.admit("free", Quota(), 4096)


def test_refund_returns_the_request_and_the_estimate() -> None:
    clock = FakeClock()
    limiter = KeyRateLimiter(clock)
    quota = Quota(requests_per_minute=1, audio_s_per_minute=1.0)
    ticket = limiter.admit("a", quota, 100)
    limiter.refund(ticket)  # e.g. the service was overloaded
    limiter.admit("a", quota, 100)


def test_the_wait_is_the_longer_of_both_limits() -> None:
    clock = FakeClock()
    limiter = KeyRateLimiter(clock)
    quota = Quota(requests_per_minute=60, audio_s_per_minute=6.0)
    limiter.admit("a", quota, int(12 * CHARS_PER_AUDIO_SECOND))  # 6 s of debt: 60 s to pay
    with pytest.raises(RateLimited) as refused:
        limiter.admit("a", quota, 10)
    assert refused.value.retry_after_s == pytest.approx(60.0)
    assert "audio seconds" in refused.value.message


def test_forgotten_keys_start_afresh() -> None:
    clock = FakeClock()
    limiter = KeyRateLimiter(clock)
    quota = Quota(requests_per_minute=1)
    limiter.admit("gone", quota, 1)
    limiter.forget({"kept"})
    limiter.admit("gone", quota, 1)


def test_a_key_holds_at_most_its_fair_share_of_the_slots() -> None:
    limiter = KeyRateLimiter(FakeClock(), slots=16)
    tickets = [limiter.admit("flood", Quota(), 10, keys_total=2) for _ in range(8)]
    with pytest.raises(KeyStreamsExceeded) as refused:
        limiter.admit("flood", Quota(), 10, keys_total=2)  # half of 16 with two keys
    assert refused.value.status == 429 and refused.value.headers() == {"Retry-After": "1"}
    for _ in range(8):
        limiter.admit("quiet", Quota(), 10, keys_total=2)  # the other half stays for it
    limiter.settle(tickets[0], 1.0)
    limiter.settle(tickets[0], 1.0)  # settling twice gives back one stream, not two
    assert limiter.streams("flood") == 7
    limiter.admit("flood", Quota(), 10, keys_total=2)
    with pytest.raises(KeyStreamsExceeded):
        limiter.admit("flood", Quota(), 10, keys_total=2)


def test_fair_share_follows_the_keys_in_the_file_and_those_active() -> None:
    clock = FakeClock()
    limiter = KeyRateLimiter(clock, slots=16)
    assert limiter.fair_share("only", keys_total=1) == 16  # nobody else to keep a share for
    assert limiter.fair_share("a", keys_total=2) == 8
    assert limiter.fair_share("a", keys_total=10) == 8  # alone: half kept for a newcomer
    limiter.admit("b", Quota(), 10, keys_total=10)
    assert limiter.fair_share("a", keys_total=10) == 5  # a, b and one kept share
    once = Quota(requests_per_minute=1)
    limiter.settle(limiter.admit("c", once, 10, keys_total=10), 0.5)
    with pytest.raises(RateLimited):
        limiter.admit("c", once, 10, keys_total=10)
    assert limiter.fair_share("a", keys_total=10) == 4  # c asked, even if refused
    clock.now += ACTIVE_WINDOW_S
    assert limiter.fair_share("a", keys_total=10) == 5  # c went quiet; b still holds a stream
    assert limiter.fair_share("a", keys_total=1) == 16  # the file shrank to one key
    assert KeyRateLimiter(clock, slots=3).fair_share("a", keys_total=100) == 1  # never 0


def test_a_key_line_limit_overrides_the_fair_share_and_refunds_release() -> None:
    limiter = KeyRateLimiter(FakeClock(), slots=16)
    one = Quota(streams=1)
    ticket = limiter.admit("one", one, 10, keys_total=2)
    with pytest.raises(KeyStreamsExceeded):
        limiter.admit("one", one, 10, keys_total=2)
    limiter.refund(ticket)  # refused by the service after admission: the stream comes back
    limiter.admit("one", one, 10, keys_total=2)
    big = Quota(streams=12)
    for _ in range(12):  # above the fair share of 8: the operator said so
        limiter.admit("big", big, 10, keys_total=2)
    with pytest.raises(KeyStreamsExceeded):
        limiter.admit("big", big, 10, keys_total=2)


def test_a_refused_stream_takes_no_request_from_the_quota() -> None:
    limiter = KeyRateLimiter(FakeClock(), slots=2)
    quota = Quota(requests_per_minute=2, streams=1)
    first = limiter.admit("a", quota, 10)
    with pytest.raises(KeyStreamsExceeded):
        limiter.admit("a", quota, 10)
    limiter.settle(first, 0.5)
    limiter.admit("a", quota, 10)  # the minute's second request is still there
    with pytest.raises(RateLimited):
        limiter.admit("a", quota, 10)


def test_streams_in_flight_outlive_a_key_file_reload() -> None:
    limiter = KeyRateLimiter(FakeClock(), slots=4)
    ticket = limiter.admit("gone", Quota(streams=1), 1)
    limiter.forget({"kept"})
    with pytest.raises(KeyStreamsExceeded):  # its stream still runs
        limiter.admit("gone", Quota(streams=1), 1)
    limiter.settle(ticket, 0.0)
    limiter.admit("gone", Quota(streams=1), 1)

"""Per-key quotas, driven by a fake clock (no waiting, exact arithmetic)."""

from __future__ import annotations

import pytest

from ttsvc.errors import RateLimited
from ttsvc.gateway.ratelimit import CHARS_PER_AUDIO_SECOND, KeyRateLimiter, Quota


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

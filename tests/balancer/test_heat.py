"""Unit tests of the heat-score routing policy, driven by an injected fake clock (no sleeps)."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import Any

import pytest

from ttsvc.balancer import BalancerSettings, HeatScoreBalancer, WorkerState
from ttsvc.config import Settings
from ttsvc.errors import NoHeadroom, NoWorkerAvailable


class FakeClock:
    """Monotonic seconds that only move when a test says so."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make(clock: FakeClock, *ids: int, **overrides: Any) -> HeatScoreBalancer:
    settings = dataclasses.replace(BalancerSettings(), **overrides)
    balancer = HeatScoreBalancer(settings, clock)
    for wid in ids:
        balancer.add_worker(wid)
    return balancer


def state(balancer: HeatScoreBalancer, wid: int) -> WorkerState:
    (found,) = [w for w in balancer.snapshot() if w.id == wid]
    return found


def score_after(balancer: HeatScoreBalancer, clock: FakeClock, wid: int, *ttfas: float) -> float:
    """Observe ``ttfas`` on ``wid``, let one refresh interval pass, return the refreshed score."""
    for ttfa in ttfas:
        balancer.observe(wid, ttfa_ms=ttfa)
    clock.advance(balancer.settings.refresh_interval)
    return state(balancer, wid).score


# -- settings ----------------------------------------------------------------------------------


def test_default_settings_are_the_documented_constants() -> None:
    s = BalancerSettings()
    assert (s.refresh_interval, s.heartbeat_timeout) == (0.2, 5.0)
    assert (s.slow_latency_ms, s.slow_strikes, s.decay, s.reference_ttfa_ms) == (
        1000.0,
        3,
        0.9,
        50.0,
    )
    assert s.realtime_load == 0.75
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.decay = 0.5  # type: ignore[misc]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("refresh_interval", 0.0),
        ("refresh_interval", -0.2),
        ("refresh_interval", float("nan")),
        ("heartbeat_timeout", 0.0),
        ("heartbeat_timeout", float("inf")),
        ("slow_latency_ms", -1.0),
        ("reference_ttfa_ms", 0.0),
        ("slow_strikes", 0),
        ("slow_strikes", 2.5),
        ("slow_strikes", True),
        ("decay", 0.0),
        ("decay", 1.0),
        ("decay", 1.5),
        ("decay", float("nan")),
        ("realtime_load", 0.0),
        ("realtime_load", -0.5),
        ("realtime_load", float("inf")),
    ],
)
def test_settings_validation_refuses(name: str, value: float) -> None:
    with pytest.raises(ValueError, match=name):
        BalancerSettings(**{name: value})  # type: ignore[arg-type]


# -- score formula -----------------------------------------------------------------------------


def test_new_worker_starts_ready_at_100(clock: FakeClock) -> None:
    b = make(clock, 7)
    assert state(b, 7) == WorkerState(
        id=7, score=100.0, qsize=0, inflight=0, last_heartbeat=clock.now, ready=True, live=True
    )


def test_score_formula_exact_values(clock: FakeClock) -> None:
    # reference 50 ms: ttfa_ms maps 1:1 to the seed formula's latency_ms
    b = make(clock, 1)
    # 0.9 * 100 + max(0, 100 - 500) = 90
    assert score_after(b, clock, 1, 500.0) == pytest.approx(90.0)
    # 0.9 * 90 + 0 = 81, then 0.9 * 81 + 0 = 72.9 (two observations, folded in order)
    assert score_after(b, clock, 1, 300.0, 100.0) == pytest.approx(72.9)
    # 0.9 * 72.9 + (100 - 80) = 85.61
    assert score_after(b, clock, 1, 80.0) == pytest.approx(85.61)
    # capped at 100: 0.9 * 85.61 + 100 = 177.05 -> 100
    assert score_after(b, clock, 1, 0.0) == pytest.approx(100.0)


def test_score_never_negative_nor_above_100(clock: FakeClock) -> None:
    b = make(clock, 1)
    for _ in range(50):
        score_after(b, clock, 1, 5000.0)
    assert 0.0 <= state(b, 1).score < 1.0
    for _ in range(50):
        score_after(b, clock, 1, 0.0)
    assert state(b, 1).score == 100.0


def test_observe_refuses_bad_values(clock: FakeClock) -> None:
    b = make(clock, 1)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="ttfa_ms"):
            b.observe(1, ttfa_ms=bad)


# -- 200 ms refresh cadence --------------------------------------------------------------------


def test_observations_fold_in_only_every_refresh_interval(clock: FakeClock) -> None:
    b = make(clock, 1)  # construction at t0 is the last refresh
    b.observe(1, ttfa_ms=1000.0)
    clock.advance(0.1)
    assert b.refresh() is False
    assert state(b, 1).score == 100.0  # 100 ms: not yet
    clock.advance(0.099)
    assert state(b, 1).score == 100.0  # 199 ms: still not
    clock.advance(0.001)
    assert state(b, 1).score == pytest.approx(90.0)  # 200 ms: folded in

    # a new observation right after a refresh waits for the next 200 ms boundary
    b.observe(1, ttfa_ms=1000.0)
    clock.advance(0.15)
    assert b.refresh() is False
    assert state(b, 1).score == pytest.approx(90.0)
    clock.advance(0.05)
    assert b.refresh() is True
    assert state(b, 1).score == pytest.approx(81.0)


def test_pick_between_refreshes_uses_the_last_refreshed_score(clock: FakeClock) -> None:
    b = make(clock, 1, 2)
    b.observe(1, ttfa_ms=2000.0)  # worker 1 will drop to 90
    assert b.pick() == 1  # not folded yet: tie at 100 -> lowest id
    b.release(1)
    clock.advance(0.2)
    assert b.pick() == 2  # refreshed by pick itself: 1/91 > 1/101


def test_refresh_interval_is_configurable(clock: FakeClock) -> None:
    b = make(clock, 1, refresh_interval=1.0)
    b.observe(1, ttfa_ms=1000.0)
    clock.advance(0.5)
    assert state(b, 1).score == 100.0
    clock.advance(0.5)
    assert state(b, 1).score == pytest.approx(90.0)


# -- heartbeats --------------------------------------------------------------------------------


def test_heartbeat_timeout_excludes_and_fresh_heartbeat_readmits(clock: FakeClock) -> None:
    b = make(clock, 1, 2)
    clock.advance(4.0)
    b.heartbeat(2)
    clock.advance(0.75)  # worker 1: 4.75 s old -> still live
    assert b.live_workers() == [1, 2]
    clock.advance(0.25)  # worker 1: exactly 5 s old -> out
    assert b.live_workers() == [2]
    assert b.pick() == 2
    assert not state(b, 1).live
    b.heartbeat(1)
    assert b.live_workers() == [1, 2]
    assert b.pick() == 1  # back in, and idle


def test_idle_worker_with_heartbeats_is_never_evicted(clock: FakeClock) -> None:
    b = make(clock, 1, 2)
    for _ in range(600):  # 10 minutes without a single request, only periodic reports
        clock.advance(1.0)
        b.heartbeat(1)
        b.heartbeat(2)
        b.report(1, qsize=0)
        assert b.live_workers() == [1, 2]
    assert [w.live for w in b.snapshot()] == [True, True]
    assert b.pick() == 1


def test_dispatch_does_not_count_as_heartbeat(clock: FakeClock) -> None:
    b = make(clock, 1)
    for _ in range(9):  # picked and released every 0.5 s for 4.5 s, never heartbeating
        clock.advance(0.5)
        b.release(b.pick())
    clock.advance(0.5)
    assert clock.now - state(b, 1).last_heartbeat == 5.0
    with pytest.raises(NoWorkerAvailable):
        b.pick()


# -- pick formula ------------------------------------------------------------------------------


def test_pick_smallest_load_over_score_ratio(clock: FakeClock) -> None:
    b = make(clock, 1, 2, 3)
    # scores: w1 = 100, w2 = 0.9 * 100 + 0 = 90, w3 = 0.9 * 90 + 0 = 81
    b.observe(2, ttfa_ms=500.0)
    b.observe(3, ttfa_ms=500.0)
    b.observe(3, ttfa_ms=500.0)
    clock.advance(0.2)
    assert [w.score for w in b.snapshot()] == pytest.approx([100.0, 90.0, 81.0])
    # qsize 3/2/0 -> ratios 4/101 = 0.0396, 3/91 = 0.0330, 1/82 = 0.0122 -> 3
    b.report(1, qsize=3)
    b.report(2, qsize=2)
    assert b.pick() == 3  # w3 load becomes 1 -> 2/82 = 0.0244
    assert b.pick() == 3  # 2/82 < 3/91; w3 load becomes 2 -> 3/82 = 0.0366
    assert b.pick() == 2  # 3/91 = 0.0330 < 3/82 = 0.0366 < 4/101 = 0.0396


def test_pick_prefers_higher_score_at_equal_load(clock: FakeClock) -> None:
    b = make(clock, 1, 2)
    b.observe(1, ttfa_ms=200.0)
    clock.advance(0.2)
    assert b.pick() == 2


def test_pick_ties_go_to_lowest_id(clock: FakeClock) -> None:
    b = HeatScoreBalancer(BalancerSettings(), clock)
    for wid in (9, 4, 6):
        b.add_worker(wid)
    assert b.pick() == 4
    b.release(4)
    b.report(4, qsize=1)
    assert b.pick() == 6


def test_reported_qsize_counts_but_cannot_hide_dispatches(clock: FakeClock) -> None:
    b = make(clock, 1, 2)
    assert b.pick() == 1
    assert b.pick() == 2
    assert b.pick() == 1  # inflight 2 on worker 1
    b.report(1, qsize=0)  # worker has not seen them yet: routing still uses inflight 2
    assert state(b, 1).load == 2
    assert b.pick() == 2  # worker 2 inflight 1 -> 2
    b.report(2, qsize=5)  # worker 2 knows more work than the gateway
    assert state(b, 2).load == 5
    assert b.pick() == 1
    with pytest.raises(ValueError, match="qsize"):
        b.report(1, qsize=-1)


def test_picks_and_releases_adjust_the_reported_qsize(clock: FakeClock) -> None:
    b = make(clock, 1)
    b.report(1, qsize=3)  # three streams from before (e.g. a gateway restart)
    assert b.pick() == 1
    assert (state(b, 1).qsize, state(b, 1).inflight, state(b, 1).load) == (4, 1, 4)
    for _ in range(3):  # streams end before the next report: the stale count does not linger
        b.release(1)
    assert (state(b, 1).qsize, state(b, 1).inflight, state(b, 1).load) == (1, 0, 1)
    b.release(1)
    b.release(1)
    assert (state(b, 1).qsize, state(b, 1).inflight) == (0, 0)


# -- bursts ------------------------------------------------------------------------------------


def test_burst_of_ten_picks_spreads_across_workers(clock: FakeClock) -> None:
    b = make(clock, 0, 1, 2, 3)
    picks = [b.pick() for _ in range(10)]  # no reports, no clock movement
    assert picks == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert Counter(picks) == {0: 3, 1: 3, 2: 2, 3: 2}
    assert [w.inflight for w in b.snapshot()] == [3, 3, 2, 2]


def test_burst_weighs_scores(clock: FakeClock) -> None:
    b = make(clock, 0, 1)
    for _ in range(20):  # drive worker 0 down: 0.9^n * 100
        score_after(b, clock, 0, 100.0)
    assert state(b, 0).score == pytest.approx(100.0 * 0.9**20)  # ~12.2
    picks = Counter(b.pick() for _ in range(10))
    assert picks[1] > picks[0] >= 1


# -- release -----------------------------------------------------------------------------------


def test_release_never_below_zero(clock: FakeClock) -> None:
    b = make(clock, 1)
    assert b.release(1) is True
    assert state(b, 1).inflight == 0
    b.pick()
    b.release(1)
    b.release(1)
    assert state(b, 1).inflight == 0


def test_unknown_worker_calls_are_ignored(clock: FakeClock) -> None:
    b = make(clock, 1)
    assert b.remove_worker(1) is True
    assert b.remove_worker(1) is False
    assert b.release(1) is False  # late release after the worker died
    assert b.heartbeat(1) is False
    assert b.report(1, qsize=2) is False
    assert b.report(1, qsize=2, capacity=3.0, demand=1.0) is False
    assert b.observe(1, ttfa_ms=10.0) is False
    assert b.set_ready(1, ready=False) is False
    assert b.snapshot() == []


# -- circuit breaker ---------------------------------------------------------------------------


def test_no_worker_registered_raises(clock: FakeClock) -> None:
    b = make(clock)
    with pytest.raises(NoWorkerAvailable) as info:
        b.pick()
    assert info.value.status == 503
    assert (info.value.registered, info.value.live) == (0, 0)


def test_no_worker_live_raises_and_recovers(clock: FakeClock) -> None:
    b = make(clock, 1, 2)
    clock.advance(5.0)
    with pytest.raises(NoWorkerAvailable) as info:
        b.pick()
    assert (info.value.registered, info.value.live) == (2, 0)
    assert b.pool_score() == 0.0
    b.heartbeat(2)
    assert b.pick() == 2


def test_removed_and_draining_workers_are_not_picked(clock: FakeClock) -> None:
    b = make(clock, 1, 2)
    b.remove_worker(1)
    assert b.pick() == 2
    b.set_ready(2, ready=False)
    assert not state(b, 2).live
    with pytest.raises(NoWorkerAvailable):
        b.pick()
    b.set_ready(2, ready=True)
    assert b.pick() == 2


def test_re_registration_starts_afresh(clock: FakeClock) -> None:
    b = make(clock, 1)
    score_after(b, clock, 1, 1000.0)
    b.pick()
    b.add_worker(1)
    assert state(b, 1).score == 100.0
    assert state(b, 1).inflight == 0


# -- slow strikes (cold standby) ---------------------------------------------------------------


def test_three_consecutive_slow_latencies_halve_the_score(clock: FakeClock) -> None:
    b = make(clock, 1)
    # 100 -> 90 -> 81 -> 72.9, then halved on the third strike
    assert score_after(b, clock, 1, 1001.0, 1500.0, 2000.0) == pytest.approx(72.9 / 2)


def test_strikes_accumulate_across_refreshes(clock: FakeClock) -> None:
    b = make(clock, 1)
    assert score_after(b, clock, 1, 1200.0) == pytest.approx(90.0)
    assert score_after(b, clock, 1, 1200.0) == pytest.approx(81.0)
    assert score_after(b, clock, 1, 1200.0) == pytest.approx(72.9 / 2)


def test_two_slow_latencies_do_not_halve(clock: FakeClock) -> None:
    b = make(clock, 1)
    assert score_after(b, clock, 1, 1200.0, 1200.0) == pytest.approx(81.0)


def test_exactly_one_second_is_not_slow(clock: FakeClock) -> None:
    b = make(clock, 1)
    assert score_after(b, clock, 1, 1000.0, 1000.0, 1000.0) == pytest.approx(72.9)


def test_fast_latency_resets_the_strike_counter(clock: FakeClock) -> None:
    b = make(clock, 1)
    # slow, slow, fast (bonus 0 at 500 ms but <= 1 s), slow, slow: never three in a row
    assert score_after(b, clock, 1, 1200.0, 1200.0, 500.0, 1200.0, 1200.0) == pytest.approx(
        100.0 * 0.9**5
    )


def test_counter_restarts_after_halving(clock: FakeClock) -> None:
    b = make(clock, 1)
    after_three = score_after(b, clock, 1, 1200.0, 1200.0, 1200.0)
    assert after_three == pytest.approx(72.9 / 2)
    # two more slow ones: no second halving yet; the third of the new run halves again
    assert score_after(b, clock, 1, 1200.0, 1200.0) == pytest.approx(after_three * 0.81)
    assert score_after(b, clock, 1, 1200.0) == pytest.approx(after_three * 0.729 / 2)


def test_slow_threshold_and_strikes_are_configurable(clock: FakeClock) -> None:
    b = make(clock, 1, slow_latency_ms=200.0, slow_strikes=2)
    assert score_after(b, clock, 1, 300.0, 300.0) == pytest.approx(81.0 / 2)


# -- normalization (fix 2) ---------------------------------------------------------------------


@pytest.mark.parametrize("reference", [20.0, 50.0, 400.0, 2500.0])
@pytest.mark.parametrize("ratio", [0.5, 1.0, 1.6, 2.0, 3.0])
def test_same_ttfa_relative_to_reference_gives_same_bonus(
    clock: FakeClock, reference: float, ratio: float
) -> None:
    b = make(clock, 1, reference_ttfa_ms=reference)
    # bring the score below the cap with bonus-0, non-slow samples (L = 500 seed ms)
    low = score_after(b, clock, 1, *[reference * 10] * 10)
    assert low == pytest.approx(100.0 * 0.9**10)
    # one sample at ratio x reference: L = 50 * ratio whatever the reference
    got = score_after(b, clock, 1, reference * ratio)
    assert got == pytest.approx(min(100.0, 0.9 * low + max(0.0, 100.0 - 50.0 * ratio)))


def test_normalized_latency_maps_reference_to_50(clock: FakeClock) -> None:
    gpu = make(clock, reference_ttfa_ms=40.0)
    cpu = make(clock, reference_ttfa_ms=400.0)
    assert gpu.normalized_latency_ms(40.0) == pytest.approx(50.0)
    assert cpu.normalized_latency_ms(400.0) == pytest.approx(50.0)
    assert cpu.normalized_latency_ms(800.0) == pytest.approx(100.0)  # bonus 0
    # slow-strike threshold applies to the normalized value: 1000 seed ms = 20x the reference
    assert cpu.normalized_latency_ms(8000.0) == pytest.approx(1000.0)


def test_slow_rule_uses_normalized_latency(clock: FakeClock) -> None:
    # a 3 s TTFA is not slow for a CPU deployment whose reference is 200 ms (L = 750)
    cpu = make(clock, 1, reference_ttfa_ms=200.0)
    assert score_after(cpu, clock, 1, 3000.0, 3000.0, 3000.0) == pytest.approx(72.9)
    # but 4.1 s is (L = 1025)
    assert score_after(cpu, clock, 1, 4100.0, 4100.0, 4100.0) == pytest.approx(72.9 * 0.729 / 2)


# -- pool score ------------------------------------------------------------------------------


def test_pool_score_is_mean_of_live_workers(clock: FakeClock) -> None:
    b = make(clock, 1, 2, 3)
    b.observe(2, ttfa_ms=500.0)
    clock.advance(0.2)
    assert b.pool_score() == pytest.approx((100.0 + 90.0 + 100.0) / 3)
    clock.advance(4.9)
    b.heartbeat(1)
    b.heartbeat(2)
    assert b.pool_score() == pytest.approx(95.0)  # worker 3 timed out
    assert b.live_workers() == [1, 2]


def test_one_workers_score_is_its_snapshot_score(clock: FakeClock) -> None:
    b = make(clock, 1, 2)
    b.observe(2, ttfa_ms=500.0)
    clock.advance(0.2)  # past the refresh interval: the read folds the observation in
    assert b.score(2) == pytest.approx(90.0) == state(b, 2).score
    assert b.score(1) == 100.0
    assert b.score(3) is None  # not registered


def test_the_service_settings_pass_their_realtime_load() -> None:
    assert Settings(realtime_load=0.7).balancer_settings().realtime_load == 0.7


# -- admission by real-time capacity -----------------------------------------------------------


def test_pick_prefers_a_worker_with_capacity_to_spare_over_the_heat_score(clock: FakeClock) -> None:
    b = make(clock)
    b.add_worker(1, capacity=2.0)  # room for 1.5 audio-s/s at realtime_load 0.75
    b.add_worker(2, capacity=8.0)  # room for 6
    b.report(1, qsize=1, capacity=2.0, demand=1.0)
    b.report(2, qsize=3, capacity=8.0, demand=3.0)
    # heat score alone: 2/101 on worker 1 < 4/101 on worker 2; but 1 + 1 > 1.5 on worker 1
    assert b.pick() == 2
    assert (state(b, 2).demand, state(b, 2).need) == (4.0, 4.0)
    without_capacity = make(clock, 1, 2)
    without_capacity.report(1, qsize=1)
    without_capacity.report(2, qsize=3)
    assert without_capacity.pick() == 1


def test_when_every_worker_is_full_the_heat_score_decides_if_asked_to_queue(
    clock: FakeClock,
) -> None:
    b = make(clock, overload="queue")
    for wid in (1, 2):
        b.add_worker(wid, capacity=2.0)
    b.report(1, qsize=2, capacity=2.0, demand=2.0)
    b.report(2, qsize=4, capacity=2.0, demand=4.0)
    assert b.pick() == 1  # 3/101 < 5/101: the worker then holds the stream until it has room
    assert b.pick() == 1  # 4/101 < 5/101


def test_when_every_worker_is_full_a_new_stream_is_refused_and_no_worker_counts_it(
    clock: FakeClock,
) -> None:
    b = make(clock, realtime_load=0.9)  # overload="refuse", the default
    for wid in (1, 2):
        b.add_worker(wid, capacity=4.0)
    b.report(1, qsize=3, capacity=4.0, demand=3.0)  # 3 + 1 > 0.9 x 4: full
    assert b.pick() == 2
    b.report(2, qsize=3, capacity=4.0, demand=3.0)
    before = b.snapshot()
    with pytest.raises(NoHeadroom) as refused:
        b.pick()
    assert refused.value.status == 429 and refused.value.type == "no_headroom"
    assert b.snapshot() == before  # the refusal touched no worker's count
    assert b.headroom() == pytest.approx((0.6 + 0.6) / (3.6 + 3.6))
    b.release(1)  # a stream ends: worker 1 has room again
    assert b.pick() == 1


def test_retry_after_counts_the_streams_that_must_end_at_the_pace_they_have_been_ending(
    clock: FakeClock,
) -> None:
    b = make(clock, realtime_load=0.9)
    b.add_worker(1, capacity=4.0, threads=2)
    b.report(1, qsize=5, capacity=4.0, demand=5.0)  # 5 + 1 - 3.6: 3 streams must end first
    for _ in range(4):  # streams have been ending every 0.5 s
        clock.advance(0.5)
        b.report(1, qsize=6, capacity=4.0, demand=6.0)
        b.release(1)
    b.report(1, qsize=5, capacity=4.0, demand=5.0)
    with pytest.raises(NoHeadroom) as refused:
        b.pick()
    assert 1.0 <= refused.value.retry_after_s < 3 * 1.0  # 3 ends, the gap near 0.5 s
    assert refused.value.headers() == {"Retry-After": str(math.ceil(refused.value.retry_after_s))}


def test_headroom_is_the_share_of_room_left_and_zero_without_a_live_worker(
    clock: FakeClock,
) -> None:
    b = make(clock, realtime_load=0.9)
    assert b.headroom() == 0.0
    b.add_worker(1, capacity=10.0, threads=2)  # room 9
    b.add_worker(2, threads=2)  # capacity unknown: its threads
    assert b.headroom() == 1.0
    b.report(1, qsize=3, capacity=10.0, demand=4.5)
    b.report(2, qsize=1, demand=1.0)
    assert b.headroom() == pytest.approx((4.5 + 1.0) / (9.0 + 2.0))
    clock.advance(b.settings.heartbeat_timeout)  # both silent: none live
    assert b.headroom() == 0.0


def test_unknown_capacity_routes_exactly_by_the_heat_score(clock: FakeClock) -> None:
    def script(b: HeatScoreBalancer, reports: dict[str, float]) -> list[int]:
        picks = []
        for _ in range(5):  # worker 0 scores 59
            score_after(b, clock, 0, 100.0)
        b.report(1, qsize=5, **reports)
        for i in range(12):
            picks.append(b.pick())
            if i % 3 == 2:
                b.release(picks[-1])
        return picks

    plain = script(make(clock, 0, 1, 2), {})
    unknown = script(make(clock, 0, 1, 2), {"capacity": 0.0, "demand": 50.0})
    assert unknown == plain
    assert set(plain) == {0, 1, 2}  # the script exercises every worker


def test_a_worker_of_unknown_capacity_is_never_full(clock: FakeClock) -> None:
    b = make(clock)
    b.add_worker(1, capacity=2.0)
    b.add_worker(2)  # capacity unknown
    b.report(1, qsize=1, capacity=2.0, demand=1.0)  # full
    b.report(2, qsize=6, demand=6.0)
    assert b.pick() == 2


def test_picks_and_releases_count_demand_between_reports(clock: FakeClock) -> None:
    b = make(clock, 0)
    for _ in range(20):  # worker 0 is a poor second on the heat score, with capacity unknown
        score_after(b, clock, 0, 100.0)
    b.add_worker(1, capacity=3.0)  # room for 2.25 audio-s/s
    assert [b.pick(), b.pick()] == [1, 1]  # demand 0 -> 1 -> 2
    assert b.pick() == 0  # 2 + 1 > 2.25
    b.release(1)
    assert state(b, 1).demand == 1.0
    assert b.pick() == 1
    # a report that has not seen the dispatches yet cannot hide them: routing counts inflight
    b.report(1, qsize=0, capacity=2.5, demand=0.0)
    assert (state(b, 1).demand, state(b, 1).need) == (0.0, 2.0)
    assert b.pick() == 0
    # a report of more demand than the gateway knows of counts too
    for _ in range(2):
        b.release(1)
    b.report(1, qsize=2, capacity=2.5, demand=2.0)
    assert state(b, 1).need == 2.0
    assert b.pick() == 0


def test_exactly_at_the_share_of_capacity_is_not_full(clock: FakeClock) -> None:
    b = make(clock, 0, realtime_load=0.5)
    for _ in range(20):
        score_after(b, clock, 0, 100.0)
    b.add_worker(1, capacity=4.0)  # room for 2.0 audio-s/s
    b.report(1, qsize=1, capacity=4.0, demand=1.0)
    assert b.pick() == 1  # 1 + 1 == 2.0
    assert b.pick() == 0  # 2 + 1 > 2.0


def test_capacity_reports_update_and_unknown_again_means_heat_score_alone(
    clock: FakeClock,
) -> None:
    b = make(clock, 0)
    for _ in range(20):
        score_after(b, clock, 0, 100.0)
    b.add_worker(1, capacity=1.0)  # room for 0.9: only the stream its one thread always takes
    assert state(b, 1).capacity == 1.0
    assert [b.pick(), b.pick()] == [1, 0]
    b.report(1, qsize=1, capacity=4.0)  # measured faster since: demand unchanged
    assert (state(b, 1).capacity, state(b, 1).demand) == (4.0, 1.0)
    assert b.pick() == 1  # 1 + 1 <= 3.6
    b.report(1, qsize=2, capacity=0.0, demand=9.0)
    assert b.pick() == 1  # 3/101 < 2/13.2 on worker 0: the heat score alone


def test_a_worker_takes_a_stream_per_compute_thread_whatever_its_capacity(
    clock: FakeClock,
) -> None:
    b = make(clock, 0)
    for _ in range(20):
        score_after(b, clock, 0, 100.0)
    b.add_worker(1, capacity=1.5, threads=3)  # measured slow: room for 1.35 audio-s/s
    assert state(b, 1).threads == 3
    assert [b.pick() for _ in range(4)] == [1, 1, 1, 0]  # like the worker's own admission


def test_re_registration_forgets_demand(clock: FakeClock) -> None:
    b = make(clock)
    b.add_worker(1, capacity=3.0)
    b.report(1, qsize=2, capacity=3.0, demand=2.0)
    b.add_worker(1, capacity=5.0)
    assert (state(b, 1).capacity, state(b, 1).demand) == (5.0, 0.0)


@pytest.mark.parametrize(
    ("name", "value"),
    [("capacity", -1.0), ("capacity", float("nan")), ("demand", -0.5), ("demand", float("inf"))],
)
def test_capacity_and_demand_reports_refuse_bad_values(
    clock: FakeClock, name: str, value: float
) -> None:
    b = make(clock, 1)
    with pytest.raises(ValueError, match=name):
        b.report(1, qsize=0, **{name: value})
    if name == "capacity":
        with pytest.raises(ValueError, match=name):
            b.add_worker(2, capacity=value)


@pytest.mark.parametrize("threads", [0, -1, 1.5, True])
def test_add_worker_refuses_bad_thread_counts(clock: FakeClock, threads: Any) -> None:
    b = make(clock)
    with pytest.raises(ValueError, match="threads"):
        b.add_worker(1, capacity=2.0, threads=threads)


# -- voice affinity ----------------------------------------------------------------------------


def test_a_voice_goes_to_the_worker_that_holds_it(clock: FakeClock) -> None:
    balancer = make(clock)
    balancer.add_worker(0, voices=("a",))
    balancer.add_worker(1, voices=("a", "b"))
    assert balancer.pick("b") == 1  # worker 0 would have to load it first
    assert balancer.pick("a") == 0  # both hold it: the less loaded


def test_a_voice_no_worker_holds_gathers_where_it_was_first_sent(clock: FakeClock) -> None:
    balancer = make(clock, 0, 1)
    first = balancer.pick("c")
    balancer.release(first)
    assert state(balancer, first).voices == frozenset({"c"})
    assert balancer.pick("c") == first  # already loading or loaded there


def test_affinity_gives_way_when_the_holder_is_busier_by_more_than_one_stream(
    clock: FakeClock,
) -> None:
    balancer = make(clock)
    balancer.add_worker(0, voices=("b",))
    balancer.add_worker(1, voices=())
    balancer.pick("b")
    assert balancer.pick("b") == 0  # one stream more than an idle non-holder: still the holder
    assert balancer.pick("b") == 1  # two more: load it on the idle worker


def test_reports_replace_the_voices_a_worker_holds(clock: FakeClock) -> None:
    balancer = make(clock)
    balancer.add_worker(0, voices=("a",))
    balancer.add_worker(1, voices=("b",))
    assert balancer.pick("a") == 0
    balancer.release(0)
    balancer.report(1, 0, voices=("a", "b"))
    balancer.report(0, 0, voices=())  # it let go of a (evicted under its memory budget)
    assert balancer.pick("a") == 1


def test_without_a_voice_routing_ignores_what_workers_hold(clock: FakeClock) -> None:
    balancer = make(clock)
    balancer.add_worker(0, voices=())
    balancer.add_worker(1, voices=("a",))
    assert balancer.pick() == 0


def test_a_worker_that_sent_a_chunk_late_is_full_for_a_while_whatever_its_figures(
    clock: FakeClock,
) -> None:
    b = make(clock)
    b.add_worker(1, capacity=20.0, threads=2)  # room 18: plenty by its figures
    b.report(1, qsize=2, capacity=20.0, demand=2.0, late=True)
    with pytest.raises(NoHeadroom):
        b.pick()  # its streams already run late: one more would make it worse
    assert b.headroom() == 0.0
    clock.advance(b.settings.strain_s)
    b.heartbeat(1)
    assert b.pick() == 1  # what it delivers since says it has room again
    b.report(1, qsize=1, capacity=20.0, demand=1.0, late=True)
    assert b.pick() == 1  # a stream per compute thread it always takes

"""The load generator's own arithmetic, on synthetic timings: if these are wrong, every
benchmark table is wrong with them."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from bench_common import Record, pct, playback, playback_end_s
from bench_common.load import (
    closed_loop,
    meets_slo,
    paced_loop,
    poisson_arrivals,
    summarize_records,
    text_draw,
)


def test_percentile_is_linear_interpolation() -> None:
    values = [float(v) for v in range(1, 101)]
    assert pct(values, 50) == pytest.approx(50.5)
    assert pct(values, 99) == pytest.approx(99.01)
    assert pct([7.0], 99) == 7.0
    assert pct([], 50) is None


def test_playback_on_time_reads_never_underrun() -> None:
    # 100 ms of audio every 90 ms: the buffer only grows
    reads = [(0.09 * i, 0.1) for i in range(20)]
    assert playback(reads).underruns == 0
    assert playback(reads).stall_s == 0.0


def test_playback_counts_a_late_read_once_and_sums_the_gap() -> None:
    # 0.1 s plays until t=0.1; the next read comes at 0.25 (stall 0.15), then on time again
    reads = [(0.0, 0.1), (0.25, 0.1), (0.30, 0.1), (0.40, 0.1)]
    heard = playback(reads)
    assert heard.underruns == 1
    assert heard.stall_s == pytest.approx(0.15)


def test_playback_resumes_from_the_late_read() -> None:
    # after a stall, playback restarts at the late read's arrival: the clock does not run on
    # from the old end, so the read right after it is on time
    reads = [(0.0, 0.05), (1.0, 0.5), (1.4, 0.5), (2.5, 0.1)]
    heard = playback(reads)
    assert heard.underruns == 2  # at 1.0 (buffer ran dry at 0.05) and at 2.5 (dry at 2.0)
    assert heard.stall_s == pytest.approx(0.95 + 0.5)


def test_playback_cushion_is_the_least_audio_queued_when_a_read_arrived() -> None:
    # 0.1 s queued at 0, 0.04 s of it left at 0.06; the queue then plays until 0.25, so a
    # read at 0.23 finds 0.02 s left: the least, and no underrun
    heard = playback([(0.0, 0.1), (0.06, 0.1), (0.1, 0.05), (0.23, 0.1)])
    assert heard.underruns == 0
    assert heard.cushion_s == pytest.approx(0.02)
    late = playback([(0.0, 0.1), (0.25, 0.1)])
    assert late.cushion_s == pytest.approx(-0.15)  # a stall: negative, by how long
    assert playback([(0.0, 0.1)]).cushion_s is None  # one read: nothing to wait for
    assert playback([]).cushion_s is None


def test_playback_ignores_reads_without_audio() -> None:
    assert playback([(0.0, 0.0), (5.0, 0.1), (5.05, 0.0), (5.08, 0.1)]).underruns == 0
    assert playback([]).underruns == 0


def rec(i: int, **kw: object) -> Record:
    r = Record("x", 1, i, i, 30)
    for k, v in kw.items():
        setattr(r, k, v)
    return r


def test_summary_counts_errors_by_kind_and_uses_ok_requests_only() -> None:
    records = [
        rec(0, ttfa_ms=10.0, latency_ms=100.0, audio_s=2.0),
        rec(1, ttfa_ms=30.0, latency_ms=300.0, audio_s=1.0, underruns=2),
        rec(2, error="http_429", status=429, latency_ms=1.0),
        rec(3, error="ReadTimeout", latency_ms=60000.0),
        rec(4, error="http_429", status=429, latency_ms=1.0),
    ]
    s = summarize_records(records, wall_s=2.0)
    assert (s["sent"], s["ok"], s["errors"]) == (5, 2, 3)
    assert s["errors_by_kind"] == {"http_429": 2, "ReadTimeout": 1}
    assert s["qps"] == pytest.approx(1.0)
    assert s["ttfa_p50_ms"] == pytest.approx(20.0)
    assert s["latency_p99_ms"] == pytest.approx(298.0)  # the timeout's 60 s is not in it
    assert s["audio_s_per_s"] == pytest.approx(1.5)
    assert s["underrun_streams"] == 1
    assert s["underrun_share"] == pytest.approx(0.5)
    # real-time: ok, first audio within 150 ms, no underrun; over all 5 requests sent
    assert s["realtime_share"] == pytest.approx(1 / 5)


def test_late_first_audio_is_not_realtime_even_without_underruns() -> None:
    late = [rec(0, ttfa_ms=151.0, latency_ms=151.0, audio_s=2.0), rec(1, ttfa_ms=149.0)]
    assert summarize_records(late, wall_s=1.0)["realtime_share"] == pytest.approx(0.5)


def test_summary_of_nothing_has_no_percentiles() -> None:
    s = summarize_records([rec(0, error="no_audio")], wall_s=1.0)
    assert s["ok"] == 0
    assert s["ttfa_p99_ms"] is None
    assert s["underrun_share"] is None


def test_slo_needs_the_tail_and_few_errors() -> None:
    good = summarize_records([rec(i, ttfa_ms=50.0 + i) for i in range(100)], wall_s=10.0)
    assert meets_slo(good, ttfa_p99_ms=150.0, max_error_share=0.01)
    assert not meets_slo(good, ttfa_p99_ms=100.0, max_error_share=0.01)
    failing = [rec(i, ttfa_ms=50.0) for i in range(95)] + [rec(95 + i, error="x") for i in range(5)]
    assert not meets_slo(summarize_records(failing, 10.0), 150.0, 0.01)
    assert not meets_slo(summarize_records([], 1.0), 150.0, 0.01)


def test_poisson_arrivals_have_the_asked_rate_and_repeat_with_the_seed() -> None:
    times = poisson_arrivals(50.0, 200.0, seed=7)
    assert times == poisson_arrivals(50.0, 200.0, seed=7)
    assert times != poisson_arrivals(50.0, 200.0, seed=8)
    assert all(b > a for a, b in itertools.pairwise(times))
    assert times[0] >= 0 and times[-1] < 200.0
    # 10,000 expected arrivals: a Poisson count's sd is 100, so ±4 % is 4 sd
    assert len(times) == pytest.approx(10_000, rel=0.04)
    assert poisson_arrivals(0.0, 10.0, seed=1) == []


def test_text_draw_is_uniform_and_seeded() -> None:
    draw = text_draw(10, 10_000, seed=3)
    assert draw == text_draw(10, 10_000, seed=3)
    counts = [draw.count(i) for i in range(10)]
    assert min(counts) > 850 and max(counts) < 1150


def test_closed_loop_sends_each_planned_request_once_with_at_most_c_in_flight() -> None:
    in_flight = 0
    peak = 0
    sent: list[int] = []

    async def synthetic_send(index: int, r: Record) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0)  # yield so the other clients interleave
        sent.append(index)
        r.ttfa_ms = 1.0
        in_flight -= 1

    records, wall, hit = asyncio.run(
        closed_loop(synthetic_send, lambda i: Record("x", 3, i, i, 20), 3, 20, 60.0)
    )
    assert sorted(sent) == list(range(20))
    assert [r.index for r in records] == list(range(20))
    assert peak == 3
    assert not hit and wall >= 0


def test_paced_callers_wait_for_playback_before_asking_again() -> None:
    sent_at: dict[int, float] = {}
    t0 = 0.0

    async def synthetic_send(index: int, r: Record) -> None:
        sent_at[index] = time.perf_counter() - t0
        r.ttfa_ms, r.audio_s, r.stall_ms = 1.0, 0.05, 0.0  # 50 ms of audio, answered at once

    async def main() -> tuple[list[Record], float, bool]:
        nonlocal t0
        t0 = time.perf_counter()
        return await paced_loop(synthetic_send, lambda i: Record("x", 1, i, i, 20), 1, 4, 60.0,
                                [0.0])  # fmt: skip

    records, _, hit = asyncio.run(main())
    assert [r.index for r in records] == [0, 1, 2, 3] and not hit
    gaps = [b - a for a, b in itertools.pairwise([sent_at[i] for i in range(4)])]
    assert all(gap >= 0.05 for gap in gaps)  # each next request after the 51 ms of playback
    assert playback_end_s(records[0]) == pytest.approx(0.051)
    assert playback_end_s(Record("x", 1, 9, 9, 20, error="http_429")) == 0.0


def test_closed_loop_stops_sending_at_its_deadline() -> None:
    async def synthetic_send(index: int, r: Record) -> None:
        r.ttfa_ms = 1.0

    records, _, hit = asyncio.run(
        closed_loop(synthetic_send, lambda i: Record("x", 1, i, i, 20), 1, 1000, 0.0)
    )
    assert hit and records == []

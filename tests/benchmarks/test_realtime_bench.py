"""The real-time benchmark's arithmetic: percentiles read back from two readings of a cumulative
Prometheus histogram, and the 2-core verdicts from synthetic level rows."""

from __future__ import annotations

from typing import Any

import pytest

from realtime_bench import TARGETS_2_CORES, bucket_pct, verdicts

INF = float("inf")


def test_a_percentile_is_read_from_the_observations_between_two_readings() -> None:
    # 100 observations before the level, all under 10 ms: they must not count
    before = {0.01: 100.0, 0.05: 100.0, 0.1: 100.0, INF: 100.0}
    # during the level: 50 more under 10 ms, 40 in 10-50 ms, 10 in 50-100 ms
    after = {0.01: 150.0, 0.05: 190.0, 0.1: 200.0, INF: 200.0}
    # rank 50 of 100 falls at the top of the first bucket
    assert bucket_pct(before, after, 50) == pytest.approx(10.0)
    # rank 70: 20 of the 40 in the second bucket, half way from 10 to 50 ms
    assert bucket_pct(before, after, 70) == pytest.approx(30.0)
    # rank 99: 9 of the 10 in the third bucket
    assert bucket_pct(before, after, 99) == pytest.approx(95.0)


def test_observations_past_the_last_edge_read_as_that_edge_and_none_read_as_none() -> None:
    after = {0.01: 1.0, 0.1: 1.0, INF: 10.0}
    assert bucket_pct({}, after, 99) == pytest.approx(100.0)  # a floor, not a guess
    assert bucket_pct(after, after, 99) is None
    assert bucket_pct({}, {}, 50) is None


def row(kind: str, callers: int, **figures: Any) -> dict[str, Any]:
    return {"system": "ttsvc", "kind": kind, "callers": callers, **figures}


def test_verdicts_name_each_target_met_missed_or_not_measured() -> None:
    limit = TARGETS_2_CORES["ttfa_p99_ms"]
    rows = [
        row("closed", 1, stalled_pct=0.0, ttfa_p50_ms=35.0, ttfa_p99_ms=80.0),
        row("paced", 16, stalled_pct=0.0, ttfa_p99_ms=limit),
        row("paced", 32, stalled_pct=2.0, ttfa_p99_ms=None),
        {**row("paced", 16, stalled_pct=50.0, ttfa_p99_ms=900.0), "system": "piper"},
    ]
    lines = verdicts(rows, "ttsvc")
    assert len(lines) == 3 + 2 + 2  # piper's row is not ttsvc's
    assert "1 client: TTFA p50 ms 35.00 (≤ 40): met" in lines[1]
    assert lines[2].endswith("missed")  # 80 ms past the 55 ms closed-loop p99
    assert lines[4].endswith("met")  # exactly at the limit meets it
    assert lines[5].endswith("missed") and lines[6].endswith("not measured")

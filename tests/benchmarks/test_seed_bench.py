"""The comparison benchmark's verdicts, from synthetic level rows: which level counts as
real-time, which figure meets its target, and the gap when it does not."""

from __future__ import annotations

from typing import Any

import pytest

from seed_bench import headline, verdicts


def row(level: int, *, share: float = 1.0, errors: int = 0, **kw: Any) -> dict[str, Any]:
    base = {
        "system": "ttsvc", "kind": "closed", "level": level, "sent": 100, "ok": 100 - errors,
        "errors": errors, "realtime_share": share, "ttfa_p50_ms": 20.0, "ttfa_p99_ms": 40.0,
        "audio_s_per_s": 10.0, "qps": 4.0, "peak_rss_mib": 500.0, "peak_pss_mib": 400.0,
    }  # fmt: skip
    base.update(kw)
    return base


def test_realtime_streams_is_the_last_level_of_an_unbroken_run_of_realtime_levels() -> None:
    rows = [row(1), row(2), row(4, share=0.995), row(8, share=0.8), row(16)]
    rows = [{**r, "kind": "paced"} for r in rows]
    # 16 is clean again, but 8 broke the run: the figure is 4
    assert headline(rows, "ttsvc")["realtime_streams"] == 4
    rows = [{**row(1), "kind": "paced"}, {**row(2, share=0.9), "kind": "paced"}]
    assert headline(rows, "ttsvc")["realtime_streams"] == 1
    # closed-loop clients read as fast as the server writes: they never count as real-time
    assert headline([row(64)], "ttsvc")["realtime_streams"] is None


def test_headline_takes_each_figure_from_its_level() -> None:
    rows = [
        row(1, ttfa_p50_ms=25.0, ttfa_p99_ms=50.0, audio_s_per_s=11.0),
        row(16, ttfa_p99_ms=140.0, audio_s_per_s=31.0),
        row(32, peak_rss_mib=1024.0, audio_s_per_s=29.0),
        {**row(8), "system": "piper", "audio_s_per_s": 99.0},
        {**row(4), "kind": "open", "level": 4.0},
    ]
    head = headline(rows, "ttsvc")
    assert head["c1_ttfa_p50_ms"] == 25.0
    assert head["c16_ttfa_p99_ms"] == 140.0
    assert head["saturation_audio_s_per_s"] == 31.0  # the best level, and only ttsvc's
    assert head["c32_rss_gib"] == pytest.approx(1.0)
    assert head["open_loop_max_qps_in_slo"] == 4.0


def test_verdicts_say_met_missed_or_not_measured_with_the_gap() -> None:
    head = {"c1_ttfa_p50_ms": 25.0, "c1_ttfa_p99_ms": 70.0, "saturation_audio_s_per_s": 21.0,
            "c16_ttfa_p99_ms": None, "realtime_streams": 24, "c32_rss_gib": 0.5}  # fmt: skip
    by = {v["key"]: v for v in verdicts(head)}
    assert by["c1_ttfa_p50_ms"]["verdict"] == "met"
    assert by["c1_ttfa_p99_ms"]["verdict"] == "missed"
    assert by["c1_ttfa_p99_ms"]["gap"] == pytest.approx(15.0)
    assert by["saturation_audio_s_per_s"]["verdict"] == "missed"  # a floor: 21 < 30
    assert by["saturation_audio_s_per_s"]["gap"] == pytest.approx(-9.0)
    assert by["c16_ttfa_p99_ms"]["verdict"] == "not measured"
    assert by["realtime_streams"]["verdict"] == "met"
    assert by["c32_rss_gib"]["verdict"] == "met"

"""The comparison benchmark's verdicts, from synthetic level rows: which level counts as
real-time, which figure meets its target, and the gap when it does not; and the systems it
starts, from its flags."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from seed_bench import (
    build_arg_parser,
    compare,
    counter_delta,
    headline,
    joined,
    lengths,
    make_systems,
    parse_deadline_counters,
    verdicts,
)


def row(level: int, *, stalled: int = 0, errors: int = 0, **kw: Any) -> dict[str, Any]:
    base = {
        "system": "ttsvc", "kind": "closed", "level": level, "sent": 100, "ok": 100 - errors,
        "errors": errors, "underrun_streams": stalled, "ttfa_p50_ms": 20.0, "ttfa_p99_ms": 40.0,
        "audio_s_per_s": 10.0, "qps": 4.0, "peak_rss_mib": 500.0, "peak_pss_mib": 400.0,
    }  # fmt: skip
    base.update(kw)
    return base


def paced(*rows: dict[str, Any]) -> list[dict[str, Any]]:
    return [{**r, "kind": "paced"} for r in rows]


def test_realtime_callers_is_the_last_level_of_an_unbroken_run_of_passing_levels() -> None:
    rows = paced(row(4), row(8, stalled=1), row(16, ttfa_p99_ms=200.0), row(24))
    # 1 % stalled passes; TTFA p99 past 150 ms breaks the run, and 24 passing again does not count
    assert headline(rows, "ttsvc")["realtime_streams"] == 8
    assert headline(paced(row(4), row(8, stalled=2)), "ttsvc")["realtime_streams"] == 4
    # a refused or failed request is a caller who heard nothing: it counts as stalled
    assert headline(paced(row(4), row(8, errors=2)), "ttsvc")["realtime_streams"] == 4
    assert headline(paced(row(4, errors=1, stalled=1)), "ttsvc")["realtime_streams"] == 0
    # closed-loop clients read as fast as the server writes: they never count as real-time
    assert headline([row(64)], "ttsvc")["realtime_streams"] is None


def test_headline_takes_each_figure_from_its_level_and_compares_throughput_with_piper() -> None:
    rows = [
        row(1, ttfa_p50_ms=25.0, ttfa_p99_ms=50.0, audio_s_per_s=11.0),
        row(16, ttfa_p99_ms=140.0, audio_s_per_s=31.0),
        row(32, peak_rss_mib=1024.0, audio_s_per_s=29.0),
        {**row(8), "system": "piper", "audio_s_per_s": 20.0},
        {**row(4), "kind": "open", "level": 4.0},
    ]
    heads = [headline(rows, "ttsvc"), headline(rows, "piper")]
    compare(heads)
    head = heads[0]
    assert head["c1_ttfa_p50_ms"] == 25.0
    assert head["c16_ttfa_p99_ms"] == 140.0
    assert head["saturation_audio_s_per_s"] == 31.0  # the best level, and only ttsvc's
    assert head["saturation_x_piper"] == pytest.approx(31.0 / 20.0)
    assert heads[1]["saturation_x_piper"] == pytest.approx(1.0)
    assert head["c32_rss_gib"] == pytest.approx(1.0)
    assert head["open_loop_max_qps_in_slo"] == 4.0
    solo = [headline(rows, "ttsvc")]
    compare(solo)  # no Piper in the run: no ratio, rather than a made-up one
    assert solo[0]["saturation_x_piper"] is None


def test_verdicts_use_the_issue_targets_and_say_met_missed_or_not_measured() -> None:
    head = {"c1_ttfa_p50_ms": 61.0, "c1_ttfa_p99_ms": 500.0, "saturation_audio_s_per_s": 21.0,
            "saturation_x_piper": 1.05, "c16_ttfa_p99_ms": None, "realtime_streams": 16,
            "c32_rss_gib": 0.5}  # fmt: skip
    by = {v["key"]: v for v in verdicts(head)}
    assert by["c1_ttfa_p50_ms"]["verdict"] == "missed"  # ≤ 60 ms
    assert by["c1_ttfa_p50_ms"]["gap"] == pytest.approx(1.0)
    assert by["saturation_x_piper"]["verdict"] == "missed"  # a floor: ≥ 1.1x Piper
    assert by["saturation_x_piper"]["gap"] == pytest.approx(-0.05)
    assert by["c16_ttfa_p99_ms"]["verdict"] == "not measured"
    assert by["realtime_streams"]["verdict"] == "met"  # ≥ 16
    assert by["c32_rss_gib"]["verdict"] == "met"  # ≤ 0.6 GiB
    # figures shown without a target of their own get no verdict
    assert "c1_ttfa_p99_ms" not in by and "saturation_audio_s_per_s" not in by


def test_deadline_counters_are_summed_over_labels_and_absent_without_them() -> None:
    text = (
        "# TYPE ttsvc_deadline_misses counter\n"
        'ttsvc_deadline_misses_total{worker="0"} 3.0\n'
        'ttsvc_deadline_misses_total{worker="1"} 2.0\n'
        "# TYPE ttsvc_deadline_late_seconds counter\n"
        'ttsvc_deadline_late_seconds_total{worker="0"} 0.25\n'
        "# TYPE ttsvc_requests counter\n"
        "ttsvc_requests_total 9.0\n"
    )
    assert parse_deadline_counters(text) == {"deadline_misses": 5.0, "deadline_late_s": 0.25}
    assert parse_deadline_counters("# TYPE ttsvc_up gauge\nttsvc_up 1\n") is None
    before = {"deadline_misses": 5.0, "deadline_late_s": 0.25}
    after = {"deadline_misses": 7.0, "deadline_late_s": 1.0}
    assert counter_delta(before, after) == {"deadline_misses": 2.0, "deadline_late_s": 0.75}
    assert counter_delta(None, after) == {"deadline_misses": None, "deadline_late_s": None}
    # a respawned worker starts its counters again: the level's count is what it has now
    assert counter_delta(after, before)["deadline_misses"] == 5.0


def test_systems_run_the_defaults_and_the_two_by_one_split() -> None:
    args = build_arg_parser().parse_args(
        ["--systems", "ttsvc,ttsvc-2x1,traditional", "--no-traditional"]
    )
    systems = {s.name: s for s in make_systems(args)[0]}
    assert set(systems) == {"ttsvc", "ttsvc-2x1"}
    assert systems["ttsvc"].workers is None  # the service picks processes x threads itself
    split = systems["ttsvc-2x1"].command(Path("engines"))
    assert split[split.index("--workers") + 1] == "2"
    assert split[split.index("--compute-threads") + 1] == "1"
    assert split.count("--workers") == 1
    for system in systems.values():  # the service has one scheduler: no flag picks one
        assert "--scheduler" not in system.command(Path("engines"))
    metrics = {s.metrics_port for s in systems.values()}
    assert len(metrics) == 2 and None not in metrics  # each variant its own metrics port


def test_joined_texts_read_the_corpus_as_longer_texts() -> None:
    corpus = ["one two three.", "four five.", "six."]
    assert joined(corpus, 1) == corpus
    assert joined(corpus, 2) == ["one two three. four five.", "four five. six.",
                                 "six. one two three."]  # fmt: skip
    assert lengths(joined(corpus, 2)) == "15–25"

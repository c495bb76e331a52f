"""Metrics and logs after a scripted run against a real `ttsvc serve` with known outcomes.

The script: 3 successes, 2 invalid requests (422), 2 overloaded (429) while the only slot is
held, that held stream cancelled by its client, and a stream whose worker is killed mid-way.
Every counter must equal the script's own count, every queue gauge must return to zero, every
log line must be JSON, and each request must have exactly one complete completion line.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.serving import Server
from ttsvc.repository.layout import EngineVersion

LONG = "Hold the only slot while I keep on talking for a good long while. " * 40
COMPLETION_FIELDS = {"uid", "qsize", "latency", "text_len", "ttfa_ms", "audio_s", "rtf",
                     "worker", "voice", "engine_version", "status"}  # fmt: skip


@dataclass
class Run:
    """What the script did and what the server exported afterwards."""

    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]
    families: set[str]
    log_lines: list[str]
    api_metrics_status: int


FP32 = "acoustic:fp32/flow:fp32/flow_plain:fp32/vocoder:fp32/vocoder_plain:fp32"
"""The default version's engines, its plain graphs for whole sentences included."""

def _scrape(url: str) -> tuple[dict[tuple[str, tuple[tuple[str, str], ...]], float], set[str]]:
    text = httpx.get(url, timeout=10).text
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    families: set[str] = set()
    for family in text_string_to_metric_families(text):
        families.add(family.name)
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, families


@pytest.fixture(scope="module")
def run(default_version: EngineVersion, engines_root: Path) -> Iterator[Run]:
    srv = Server(engines_root, "--workers", "1", "--max-streams-per-worker", "1")
    try:
        srv.wait_ready(1)
        for text in ("One.", "Two, please.", "Three is the last."):
            assert srv.synth(text).status_code == 200
        assert srv.synth("x", speed=99).status_code == 422
        assert srv.synth("🎉", empty_text="error").status_code == 422
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            with c.stream("POST", "/synthesize", json={"text": LONG}) as held:
                chunks = held.iter_bytes()
                assert next(chunks)
                assert srv.synth("No room.").status_code == 429
                assert srv.synth("Still no room.").status_code == 429
            # leaving the block closes the connection mid-stream: a cancellation
        srv.wait_idle()
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            with c.stream("POST", "/synthesize", json={"text": LONG}) as doomed:
                chunks = doomed.iter_bytes()
                assert next(chunks)
                (victim,) = srv.worker_pids()
                os.kill(victim, signal.SIGKILL)
                try:
                    for _ in chunks:
                        pass
                except httpx.HTTPError:
                    pass  # the stream ends early: that is what a killed worker does to it
        srv.wait_ready(1)
        srv.wait_idle()
        samples, families = _scrape(srv.metrics_url)
        api_metrics = srv.client.get("/metrics").status_code
        yield Run(samples, families, srv.log_lines(), api_metrics)
    finally:
        srv.stop()


def _value(run: Run, name: str, **labels: str) -> float:
    return run.samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_counters_equal_the_scripts_counts(run: Run) -> None:
    assert _value(run, "ttsvc_requests_total", code="200", outcome="ok") == 3
    assert _value(run, "ttsvc_requests_total", code="422", outcome="invalid_parameter") == 1
    assert _value(run, "ttsvc_requests_total", code="422", outcome="empty_text") == 1
    assert _value(run, "ttsvc_requests_total", code="429", outcome="overloaded") == 2
    # neither counts as a success: the client left (499), the stream was cut (its error's 503)
    assert _value(run, "ttsvc_requests_total", code="499", outcome="cancelled") == 1
    assert _value(run, "ttsvc_requests_total", code="503", outcome="worker_died") == 1
    assert _value(run, "ttsvc_aborted_streams_total", reason="worker_died") == 1
    assert _value(run, "ttsvc_rejections_total", reason="overloaded") == 2
    assert _value(run, "ttsvc_cancellations_total") == 1
    assert _value(run, "ttsvc_worker_restarts_total") == 1
    assert _value(run, "ttsvc_ttfa_seconds_count") == 5  # every stream that produced audio
    assert _value(run, "ttsvc_request_latency_seconds_count") == 3  # completed ones
    assert _value(run, "ttsvc_characters_total") == len("One.Two, please.Three is the last.")
    assert _value(run, "ttsvc_audio_seconds_total") > 3 * 0.5
    assert _value(run, "ttsvc_engine_info", voice="en_US-joe-medium", version="1",
                  backend="ort", precision=FP32) == 1  # fmt: skip


def test_queue_gauges_return_to_zero(run: Run) -> None:
    gauges = [
        (name, labels, value)
        for (name, labels), value in run.samples.items()
        if name in ("ttsvc_streams_in_flight", "ttsvc_streams_queued")
    ]
    assert gauges  # the worker's series exist
    assert all(value == 0 for _, _, value in gauges), gauges


def test_capacity_demand_and_deadline_series(run: Run) -> None:
    # the worker respawned after the kill measured its capacity before it said READY
    assert _value(run, "ttsvc_worker_capacity_audio_seconds_per_second", worker="0") > 0
    for name in ("ttsvc_worker_demand_audio_seconds_per_second",
                 "ttsvc_worker_admission_waiting_streams"):  # fmt: skip
        assert run.samples[(name, (("worker", "0"),))] >= 0
    # service-wide, since the first scrape: a respawn adds to them, never restarts them
    assert run.samples[("ttsvc_deadline_misses_total", ())] >= 0
    assert run.samples[("ttsvc_deadline_late_seconds_total", ())] >= 0


def test_every_log_line_is_json_and_each_request_has_one_full_completion_line(run: Run) -> None:
    events = [json.loads(line) for line in run.log_lines if line.strip()]
    assert all(isinstance(e, dict) and "event" in e and "timestamp" in e for e in events)
    completions = [e for e in events if e["event"] == "request"]
    assert len(completions) == 3 + 2 + 2 + 1 + 1
    for line in completions:
        assert set(line) >= COMPLETION_FIELDS, line
        if line["status"] != "ok":
            assert line["error_type"] == line["status"]
    uids = [line["uid"] for line in completions]
    assert len(set(uids)) == len(uids)
    # the worker's own lines carry the same ids as the gateway's completion lines
    worker_uids = {e["uid"] for e in events if e["event"] == "stream_done"}
    assert worker_uids and worker_uids <= set(uids)
    assert any(e.get("logger") == "uvicorn.access" for e in events)  # uvicorn's lines are JSON
    assert all(LONG not in line for line in run.log_lines)  # user text is not logged


def test_metrics_are_not_served_on_the_api_port(run: Run) -> None:
    assert run.api_metrics_status == 404


def test_dashboard_queries_only_use_exported_metrics(run: Run) -> None:
    dashboard = Path(__file__).parents[2] / "helm" / "ttsvc" / "dashboards" / "ttsvc.json"
    data = json.loads(dashboard.read_text(encoding="utf-8"))
    targets = [
        t
        for panel in data["panels"]
        for t in panel.get("targets", [])
        if panel["datasource"]["type"] == "prometheus"
    ]
    exprs = [t["expr"] for t in targets]
    assert exprs
    used = {m for e in exprs for m in re.findall(r"\bttsvc_[a-z_]+", e)}
    exported = set(run.families) | {
        f"{f}{suffix}" for f in run.families for suffix in ("_total", "_bucket", "_count", "_sum")
    }
    assert used <= exported, used - exported

    # worker numbers restart at 0 in every pod: a query that keeps the worker label must keep
    # the pod's too (Prometheus adds `pod` when it scrapes), or it adds up every pod's worker 0
    per_worker = {name for name, labels in run.samples if "worker" in dict(labels)}
    assert per_worker
    kept = 0
    for target in targets:
        if not per_worker & set(re.findall(r"\bttsvc_[a-z_]+", target["expr"])):
            continue
        groupings = [{label.strip() for label in by.split(",")}
                     for by in re.findall(r"\bby \(([^)]*)\)", target["expr"])]  # fmt: skip
        assert groupings, target["expr"]  # explicit: a bare selector keeps labels unnamed
        if any("worker" in grouping for grouping in groupings):
            assert all("pod" in g for g in groupings if "worker" in g), target["expr"]
            assert {"{{pod}}", "{{worker}}"} <= set(re.findall(r"{{\w+}}", target["legendFormat"]))
            kept += 1
    assert kept  # the per-worker panels exist
    loki = [t["expr"] for p in data["panels"] for t in p.get("targets", [])
            if p["datasource"]["type"] == "loki"]  # fmt: skip
    assert loki and all('event="request"' in e for e in loki)

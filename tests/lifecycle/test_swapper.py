"""Hot swap against a real `ttsvc serve`: real files, real renames, real copies.

Candidate engines are made from the compiled default voice: a "variant" scales one weight of
the acoustic engine by 1.001 (a different, valid model), a "silent" vocoder has its last
convolution zeroed (it loads and outputs silence), and corruption overwrites bytes with 0xFF
(NaN floats).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.engine_files import (
    VOICE,
    int8_vocoder,
    publish,
    random_bytes,
    rewrite,
    silent_vocoder,
    variant,
)
from tests.gateway.serving import HEALTH_POLLS, Server, engines_state, wait_engines, wait_until
from ttsvc.lifecycle.swapper import WITHDRAWN
from ttsvc.repository.layout import EngineRepository, EngineVersion
from ttsvc.repository.manifest import load_manifest, write_manifest

DET = {"noise_scale": 0.0, "noise_w": 0.0}



@pytest.fixture(scope="module")
def candidates(default_version: EngineVersion, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("candidates")
    variant(default_version.path / "acoustic.onnx", out / "acoustic-a.onnx", 1.001)
    variant(default_version.path / "acoustic.onnx", out / "acoustic-b.onnx", 0.999)
    variant(default_version.path / "vocoder.onnx", out / "vocoder-b.onnx", 0.999)
    silent_vocoder(default_version.path / "vocoder.onnx", out / "vocoder-silent.onnx")
    int8_vocoder(out / "vocoder-int8.onnx")
    return out


@pytest.fixture
def engines(default_version: EngineVersion, tmp_path: Path) -> Path:
    """A private engines directory holding a copy of version 1."""
    root = tmp_path / "engines"
    shutil.copytree(default_version.path, root / VOICE / "1")
    return root


@pytest.fixture
def server_factory(engines: Path) -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for srv in started:
        srv.stop()


SETTLE_S = "0.5"
"""Tests' settle window: their copies do not pause (the burst test keeps the default)."""


def _start(
    engines: Path, started: list[Server], workers: int = 1, *, ready: bool = True,
    settle_s: str | None = SETTLE_S,
) -> Server:  # fmt: skip
    env = {"TTSVC_COMPILE_DEFAULT_VOICE": "0"}
    if settle_s is not None:
        env["TTSVC_WATCH_SETTLE_S"] = settle_s
    srv = Server(engines, "--workers", str(workers), env=env)
    started.append(srv)
    if ready:
        srv.wait_ready(workers)
    return srv



def _mv_cp(version_dir: Path, name: str, new: Path) -> None:
    """The operators' habit: keep a backup by renaming, then copy the new file in place."""
    (version_dir / name).rename(version_dir / f"{name}.bak")
    shutil.copyfile(new, version_dir / name)


def _streams_during(srv: Server, action: object, n: int = 8) -> list[httpx.Response]:
    """Run ``n`` concurrent long streams and ``action`` while they are all in flight."""
    assert callable(action)
    text = "Every caller keeps talking while the engine changes underneath. " * 3
    results: list[httpx.Response | BaseException] = [None] * n  # type: ignore[list-item]
    flowing = threading.Barrier(n + 1)

    def call(i: int) -> None:
        try:
            with httpx.Client(base_url=srv.url, timeout=120) as c:
                with c.stream("POST", "/synthesize", json={"text": text, **DET}) as r:
                    chunks = r.iter_bytes()
                    first = next(chunks)
                    flowing.wait(timeout=120)
                    r._content = first + b"".join(chunks)  # keep the whole body for checks
                    results[i] = r
        except BaseException as exc:
            results[i] = exc
            flowing.abort()

    threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    flowing.wait(timeout=120)
    action()
    for t in threads:
        t.join()
    assert all(isinstance(r, httpx.Response) for r in results), results
    return results  # type: ignore[return-value]


def _check_whole_wavs(responses: list[httpx.Response], labels: set[str]) -> None:
    for r in responses:
        assert r.status_code == 200, r.text
        assert r.headers["x-engine-version"] in labels
        body = r.content
        assert body[:4] == b"RIFF" and len(body) > 44 + 22050  # a full utterance, > 0.5 s
        assert (len(body) - 44) % 2 == 0


def test_atomic_publish_under_load(engines: Path, server_factory: list[Server],
                                   candidates: Path) -> None:  # fmt: skip
    srv = _start(engines, server_factory, workers=2)
    responses = _streams_during(
        srv, lambda: publish(engines, {"acoustic.onnx": candidates / "acoustic-a.onnx"})
    )
    wait_engines(srv, lambda s: s["current"] == "2", "version 2 serving")
    _check_whole_wavs(responses, {"1", "2"})
    after = srv.synth("Now on the new version.")
    assert after.status_code == 200 and after.headers["x-engine-version"] == "2"
    assert engines_state(srv)["reloads"] == {"ok": 1}


def _publish_copy(engines: Path, source: Path) -> int:
    """Publish a copy of another compiled version (its own manifest, renumbered) as
    `ttsvc compile` does: staging directory, manifest last, rename."""
    repo = EngineRepository(engines)
    version = repo.next_version(VOICE)
    staging = repo.staging_dir(VOICE)
    for item in source.iterdir():
        if item.name != "manifest.json":
            shutil.copyfile(item, staging / item.name)
    manifest = load_manifest(source)
    manifest.version = version
    write_manifest(staging, manifest)
    repo.publish(VOICE, staging, version)
    return version


def test_swaps_between_stateful_and_context_engines_lose_nothing(
    engines: Path, server_factory: list[Server], context_version: EngineVersion,
    default_version: EngineVersion,
) -> None:  # fmt: skip
    """A worker serves both kinds: streams in flight finish on the kind they started on."""
    srv = _start(engines, server_factory, workers=2)
    responses = _streams_during(srv, lambda: _publish_copy(engines, context_version.path))
    wait_engines(srv, lambda s: s["current"] == "2", "context engines serving")
    _check_whole_wavs(responses, {"1", "2"})
    on_context = srv.synth("Both kinds say the same.", **DET)
    responses = _streams_during(srv, lambda: _publish_copy(engines, default_version.path))
    wait_engines(srv, lambda s: s["current"] == "3", "stateful engines serving again")
    _check_whole_wavs(responses, {"2", "3"})
    on_stateful = srv.synth("Both kinds say the same.", **DET)
    assert on_context.headers["x-engine-version"] == "2"
    assert on_stateful.headers["x-engine-version"] == "3"
    assert len(on_context.content) == len(on_stateful.content)
    assert engines_state(srv)["reloads"] == {"ok": 2}


def test_mv_cp_habit_under_load_and_rollback(engines: Path, server_factory: list[Server],
                                             candidates: Path) -> None:  # fmt: skip
    srv = _start(engines, server_factory, workers=2)
    version_dir = engines / VOICE / "1"
    responses = _streams_during(
        srv, lambda: _mv_cp(version_dir, "acoustic.onnx", candidates / "acoustic-a.onnx")
    )
    state = wait_engines(srv, lambda s: str(s["current"]).startswith("1+"), "in-place swap")
    label = str(state["current"])
    _check_whole_wavs(responses, {"1", label})
    assert srv.synth("Replaced in place.").headers["x-engine-version"] == label
    # rollback: the backup renamed back is the manifest's own file again
    (version_dir / "acoustic.onnx.bak").replace(version_dir / "acoustic.onnx")
    wait_engines(srv, lambda s: s["current"] == "1", "rollback to 1")
    assert srv.synth("Rolled back.").headers["x-engine-version"] == "1"
    assert engines_state(srv)["reloads"] == {"ok": 2}


def test_withdrawing_the_newest_falls_back_to_the_newest_version_that_verifies(
    engines: Path, server_factory: list[Server], candidates: Path
) -> None:
    """Issue 36's outside run: versions published one after another, a file of the serving one
    replaced in place (it passes the canary and serves), a newer version published, then the
    newest withdrawn. The replaced version no longer serves and no longer matches its manifest:
    it is refused at once, as a restarted pod refuses it, and the newest version below it that
    verifies serves, one ``engine_fallback`` line saying from what, to what and why each version
    between was skipped. Before: the replaced version was skipped silently as still changing
    (its settle clock started anew though the file had long been final), an older version
    served with no line saying why, and the refusal came a settle window later."""
    srv = _start(engines, server_factory)
    source = engines / VOICE / "1"
    for version in (2, 3):
        assert _publish_copy(engines, source) == version
        wait_engines(srv, lambda s, v=version: s["current"] == str(v), f"version {version}")
    _mv_cp(engines / VOICE / "3", "acoustic.onnx", candidates / "acoustic-a.onnx")
    wait_engines(srv, lambda s: str(s["current"]).startswith("3+"), "version 3 replaced in place")
    assert _publish_copy(engines, source) == 4
    wait_engines(srv, lambda s: s["current"] == "4", "version 4")
    responses = _streams_during(srv, lambda: shutil.rmtree(engines / VOICE / "4"), n=2)
    (fell,) = wait_until(srv, lambda: _events(srv, "engine_fallback"), bool, "the fallback")
    assert (fell["from_version"], fell["to_version"]) == ("4", "2")
    assert fell["reason"] == WITHDRAWN
    assert fell["skipped"] == ["version 3: acoustic.onnx: sha256 does not match the manifest"]
    state = engines_state(srv)
    assert state["current"] == "2" and state["pending"] == []
    assert state["rejected"] == [{"version": 3, "file": "acoustic.onnx",
                                  "reason": "sha256 does not match the manifest"}]  # fmt: skip
    assert [e["version"] for e in _events(srv, "engine_rejected")] == [3]
    _check_whole_wavs(responses, {"4"})  # no request failed across the fallback
    assert srv.synth("Rolled back.", **DET).headers["x-engine-version"] == "2"


def test_slow_copy_loads_once_after_it_completes(engines: Path, server_factory: list[Server],
                                                 candidates: Path) -> None:  # fmt: skip
    srv = _start(engines, server_factory)
    target = engines / VOICE / "1" / "acoustic.onnx"
    data = (candidates / "acoustic-b.onnx").read_bytes()
    target.rename(target.with_name("acoustic.onnx.bak"))
    with target.open("wb") as out:  # a throttled copy: 64 writes, each flushed to the file
        step = len(data) // 64 + 1
        for start in range(0, len(data), step):
            out.write(data[start : start + step])
            out.flush()
            os.fsync(out.fileno())
            threading.Event().wait(0.02)  # the writer's throttle, not test synchronization
    state = wait_engines(srv, lambda s: str(s["current"]).startswith("1+"), "the copied engine")
    assert state["reloads"] == {"ok": 1}  # loaded exactly once, never while half written


@pytest.mark.parametrize("fault", ["truncated", "corrupted", "silent", "incompatible"])
def test_bad_candidate_is_refused_and_old_engine_keeps_serving(
    engines: Path, server_factory: list[Server], candidates: Path, fault: str
) -> None:
    srv = _start(engines, server_factory)
    version_dir = engines / VOICE / "1"
    if fault == "truncated":
        data = (candidates / "acoustic-a.onnx").read_bytes()
        (version_dir / "acoustic.onnx").write_bytes(data[: len(data) // 2])
        reason = "acoustic.onnx"
    elif fault == "corrupted":
        vocoder = version_dir / "vocoder.onnx"
        data = bytearray(vocoder.read_bytes())
        middle = len(data) // 2
        data[middle : middle + 65536] = b"\xff" * 65536  # same size; NaN weights or bad protobuf
        vocoder.write_bytes(bytes(data))
        reason = ""
    elif fault == "silent":
        _mv_cp(version_dir, "vocoder.onnx", candidates / "vocoder-silent.onnx")
        reason = "silent"
    else:
        publish(engines, {}, runtime={"machine": "riscv128"})
        reason = "recompile"
    state = wait_engines(srv, lambda s: s["reloads"].get("rejected") == 1, f"{fault} refused")
    assert state["current"] == "1" and "ok" not in state["reloads"]
    assert reason in str(state["last_error"])
    # clients get a file name and a short reason; host paths and runtime messages stay in logs
    assert "/" not in str(state["last_error"]) and "ONNXRuntimeError" not in str(state)
    assert srv.client.get("/health").status_code == 200
    r = srv.synth("The old engine still answers.", **DET)
    assert r.status_code == 200 and r.headers["x-engine-version"] == "1"
    if fault == "truncated":  # a worker respawned now starts on the last good engine
        (victim,) = srv.worker_pids()
        os.kill(victim, signal.SIGKILL)
        srv.wait_ready(1)
        assert srv.worker_pids() != [victim]
        r = srv.synth("A respawned worker, on the old engine.", **DET)
        assert r.status_code == 200 and r.headers["x-engine-version"] == "1"


def test_noise_files_trigger_no_reload(engines: Path, server_factory: list[Server],
                                       candidates: Path) -> None:  # fmt: skip
    srv = _start(engines, server_factory)
    version_dir = engines / VOICE / "1"
    (version_dir / "acoustic.onnx.bak").write_bytes(b"backup")
    (version_dir / ".acoustic.onnx.swp").write_bytes(b"vim")
    (version_dir / "vocoder.onnx.tmp").write_bytes(b"partial")
    (version_dir / "notes.txt~").write_bytes(b"editor")
    os.utime(version_dir / "acoustic.onnx")  # touch: new mtime, same bytes
    os.utime(version_dir / "manifest.json")
    # a real change afterwards proves the watcher saw (and ignored) everything before it
    publish(engines, {"acoustic.onnx": candidates / "acoustic-a.onnx"})
    state = wait_engines(srv, lambda s: s["current"] == "2", "version 2")
    assert state["reloads"] == {"ok": 1}


def _rss_kib(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total


def test_ten_alternating_swaps_end_on_the_last_with_bounded_memory(
    engines: Path, server_factory: list[Server], candidates: Path
) -> None:
    srv = _start(engines, server_factory)
    version_dir = engines / VOICE / "1"
    files = [candidates / "acoustic-a.onnx", candidates / "acoustic-b.onnx"]
    labels: list[str] = []
    rss: list[int] = []
    for i in range(10):
        target = version_dir / "acoustic.onnx"
        tmp = version_dir / "acoustic.onnx.tmp"
        shutil.copyfile(files[i % 2], tmp)
        tmp.replace(target)  # an atomic in-place replacement
        previous = labels[-1] if labels else "1"
        state = wait_engines(
            srv, lambda s, p=previous: s["current"] not in (p, "1"), f"swap {i + 1}"
        )
        labels.append(str(state["current"]))
        rss.append(_rss_kib(srv.worker_pids()))
    assert len(set(labels)) == 2 and labels[0] != labels[1]
    assert engines_state(srv)["reloads"] == {"ok": 10}
    assert srv.synth("Still here.").headers["x-engine-version"] == labels[-1]
    assert rss[-1] - rss[3] < 150 * 1024  # memory settles: old engines are released
    cached = json.loads(json.dumps(engines_state(srv)))  # the state is plain JSON
    assert cached["current"] == labels[-1]


def _events(srv: Server, event: str) -> list[dict[str, object]]:
    """The server's JSON log lines of one event."""
    lines = [json.loads(ln) for ln in srv.log_lines() if ln.startswith("{")]
    return [ln for ln in lines if ln.get("event") == event]


def _wait_up(srv: Server) -> None:
    """Probe /live until the gateway answers (bounded); fail if the server exits meanwhile."""
    for _ in range(HEALTH_POLLS):
        assert srv.proc.poll() is None, f"server exited: {srv.log_tail()}"
        try:
            if httpx.get(f"{srv.url}/live", timeout=0.1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        try:  # block on the child for a moment instead of sleeping
            srv.proc.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            pass
    raise AssertionError("server never answered")


def _replace_atomically(target: Path, data: bytes) -> None:
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(target)


def _gauge(srv: Server, name: str) -> list[dict[str, str]]:
    """The label sets of a gauge's series that are set (value 1) on the server."""
    text = httpx.get(srv.metrics_url, timeout=10).text
    return [sample.labels for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == name and sample.value == 1]  # fmt: skip


def test_start_serves_the_newest_good_version_and_reports_a_truncated_one(
    engines: Path, server_factory: list[Server], candidates: Path
) -> None:
    version = publish(engines, {"acoustic.onnx": candidates / "acoustic-a.onnx"})
    acoustic = engines / VOICE / str(version) / "acoustic.onnx"
    whole = acoustic.read_bytes()
    acoustic.write_bytes(whole[: len(whole) // 2])
    srv = _start(engines, server_factory)  # before the fix: workers crash-looped on version 2
    state = wait_engines(srv, lambda s: s["rejected"], "version 2 reported")
    assert state["current"] == "1"
    assert state["rejected"] == [{"version": 2, "file": "acoustic.onnx",
                                  "reason": f"size {len(whole) // 2} bytes, the manifest says "
                                            f"{len(whole)}"}]  # fmt: skip
    assert str(engines) not in json.dumps(state)
    r = srv.synth("Served by the older version.", **DET)
    assert r.status_code == 200 and r.headers["x-engine-version"] == "1"
    assert [(e["version"], e["file"]) for e in _events(srv, "engine_rejected")] == [
        (2, "acoustic.onnx")
    ]
    assert _events(srv, "engine_candidate") == []  # no worker was handed version 2
    refused = {"voice": VOICE, "version": "2", "file": "acoustic.onnx"}
    assert _gauge(srv, "ttsvc_engine_rejected") == [refused]
    # still watching: once the file is whole, version 2 serves and the report clears
    _replace_atomically(acoustic, whole)
    state = wait_engines(srv, lambda s: s["current"] == "2", "version 2 once whole")
    assert state["rejected"] == [] and state["reloads"] == {"rejected": 1, "ok": 1}
    assert _gauge(srv, "ttsvc_engine_rejected") == []


def test_no_good_version_keeps_the_gateway_up_until_one_appears(
    engines: Path, server_factory: list[Server]
) -> None:
    acoustic = engines / VOICE / "1" / "acoustic.onnx"
    whole = acoustic.read_bytes()
    acoustic.write_bytes(whole[: len(whole) // 3])
    srv = _start(engines, server_factory, ready=False)
    _wait_up(srv)
    state = wait_engines(srv, lambda s: s["rejected"], "version 1 reported")
    assert state["current"] is None
    assert state["rejected"] == [{"version": 1, "file": "acoustic.onnx",
                                  "reason": f"size {len(whole) // 3} bytes, the manifest says "
                                            f"{len(whole)}"}]  # fmt: skip
    health = srv.client.get("/health")
    assert health.status_code == 503 and health.json()["status"] == "no_verified_engine"
    refused = srv.synth("Nothing to say it with yet.")
    assert refused.status_code == 503 and refused.json()["type"] == "engine_unavailable"
    assert srv.worker_pids() == []  # no worker was started on bytes its manifest disproves
    _replace_atomically(acoustic, whole)
    srv.wait_ready(1)
    r = srv.synth("Now there is an engine.", **DET)
    assert r.status_code == 200 and r.headers["x-engine-version"] == "1"
    assert engines_state(srv)["rejected"] == []


@pytest.mark.parametrize("older", [True, False], ids=["older-version", "only-version"])
def test_a_file_missing_at_start_does_not_stop_the_gateway(
    engines: Path, server_factory: list[Server], candidates: Path, older: bool
) -> None:
    version = publish(engines, {"acoustic.onnx": candidates / "acoustic-a.onnx"}) if older else 1
    vocoder = engines / VOICE / str(version) / "vocoder.onnx"
    backup = vocoder.with_name("vocoder.onnx.bak")
    vocoder.rename(backup)  # the operator's `mv`; the `cp` has not started (before: exit 3)
    srv = _start(engines, server_factory, ready=older)
    if older:
        assert engines_state(srv)["current"] == "1"
    else:
        _wait_up(srv)
        health = srv.client.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "no_verified_engine"
    shutil.copyfile(backup, vocoder)  # the `cp` (of the same bytes here)
    wait_engines(srv, lambda s: s["current"] == str(version), f"version {version}")
    srv.wait_ready(1)
    r = srv.synth("The copy finished.", **DET)
    assert r.status_code == 200 and r.headers["x-engine-version"] == str(version)


def test_a_new_version_not_matching_its_manifest_is_refused_unparsed(
    engines: Path, server_factory: list[Server], candidates: Path
) -> None:
    srv = _start(engines, server_factory)
    publish(engines, {"acoustic.onnx": candidates / "acoustic-a.onnx"},
             content={"acoustic.onnx": candidates / "acoustic-b.onnx"})  # fmt: skip
    state = wait_engines(srv, lambda s: s["reloads"].get("rejected") == 1, "version 2 refused")
    assert state["current"] == "1" and state["reloads"] == {"rejected": 1}
    assert state["rejected"] == [
        {"version": 2, "file": "acoustic.onnx", "reason": "sha256 does not match the manifest"}
    ]
    assert _events(srv, "engine_candidate") == []  # a valid model, but never handed to a worker
    assert srv.synth("Still the first.", **DET).headers["x-engine-version"] == "1"


def test_a_copy_in_paced_bursts_is_judged_once_when_complete(
    engines: Path, server_factory: list[Server], candidates: Path
) -> None:
    srv = _start(engines, server_factory, settle_s=None)  # the default settle window
    target = engines / VOICE / "1" / "vocoder.onnx"
    data = (candidates / "vocoder-b.onnx").read_bytes()
    target.rename(target.with_name("vocoder.onnx.bak"))
    burst = 1 << 20
    with target.open("wb") as out:  # 1 MiB each second, as a throttled copy writes
        for start in range(0, len(data), burst):
            if start:
                threading.Event().wait(1.0)  # the writer's pacing (fault injection)
            out.write(data[start : start + burst])
            out.flush()
            os.fsync(out.fileno())
    state = wait_engines(srv, lambda s: str(s["current"]).startswith("1+"), "the copied vocoder")
    assert state["reloads"] == {"ok": 1}  # never judged half-copied: no rejection, one reload
    assert len(_events(srv, "engine_candidate")) == 1
    assert _events(srv, "engine_rejected") == []


def test_int8_vocoder_replaced_in_place_reports_its_real_precision(
    engines: Path, server_factory: list[Server], candidates: Path
) -> None:
    srv = _start(engines, server_factory)
    (info,) = _gauge(srv, "ttsvc_engine_info")
    # the plain graphs beside, not replaced
    assert info["precision"] == "acoustic:fp32/flow:fp32/flow_plain:fp32/vocoder:fp32/" \
        "vocoder_plain:fp32"
    _mv_cp(engines / VOICE / "1", "vocoder.onnx", candidates / "vocoder-int8.onnx")
    state = wait_engines(srv, lambda s: str(s["current"]).startswith("1+"), "the int8 vocoder")
    assert state["reloads"] == {"ok": 1}
    (info,) = _gauge(srv, "ttsvc_engine_info")  # the fp32 series is gone
    assert info["precision"] == "acoustic:fp32/flow:fp32/flow_plain:fp32/vocoder:int8/" \
        "vocoder_plain:fp32"


@pytest.mark.parametrize(
    ("fault", "file", "reason"),
    [
        ("corrupt", "acoustic.onnx", "ONNX Runtime could not load it"),
        ("foreign", "manifest.json", "built for another machine"),
        ("silent", None, "canary audio is silent"),
    ],
)
def test_a_newest_version_that_cannot_serve_is_rejected_at_start(
    engines: Path, server_factory: list[Server], candidates: Path, tmp_path: Path,
    fault: str, file: str | None, reason: str,
) -> None:  # fmt: skip
    """Version 2 matches its manifest but cannot serve: random bytes for an engine, a build for
    another CPU kind, a vocoder that says nothing. Before: both workers died and were respawned
    on it over and over, the older version never served and nothing said why."""
    if fault == "corrupt":
        size = (engines / VOICE / "1" / "acoustic.onnx").stat().st_size
        publish(engines, {"acoustic.onnx": random_bytes(tmp_path / "noise.onnx", size)})
    elif fault == "foreign":
        publish(engines, {}, runtime={"machine": "aarch64"})
    else:
        publish(engines, {"vocoder.onnx": candidates / "vocoder-silent.onnx"})
    srv = _start(engines, server_factory, workers=2)
    state = engines_state(srv)
    assert state["current"] == "1"
    (rejected,) = state["rejected"]
    assert (rejected["version"], rejected["file"]) == (2, file)
    assert reason in str(rejected["reason"]) and "/" not in str(rejected["reason"])
    r = srv.synth("The older version serves.", **DET)
    assert r.status_code == 200 and r.headers["x-engine-version"] == "1"
    (logged,) = _events(srv, "engine_rejected")
    assert logged["version"] == 2 and logged["detail"]  # the runtime's own words, in the log
    (fell,) = _events(srv, "engine_fallback")  # said once, with why it left version 2
    assert (fell["from_version"], fell["to_version"]) == ("2", "1")
    why = (f"{file}: " if file else "") + str(rejected["reason"])
    assert fell["reason"] == f"workers could not start on it: {why}"
    assert fell["skipped"] == [f"version 2: {why}"]
    assert _events(srv, "worker_died") == []
    assert 1 <= len(_events(srv, "worker_start_failed")) <= 2  # each worker once at most
    # every line written through the failing loads is one JSON object (tracebacks inside)
    for line in srv.log_lines():
        assert isinstance(json.loads(line), dict), line


def test_a_version_no_worker_can_start_on_leaves_the_gateway_up_until_one_appears(
    engines: Path, server_factory: list[Server], tmp_path: Path
) -> None:
    """The only version cannot load: the gateway stays up, unready, with no worker respawning
    in a loop, and serves as soon as a good version is published."""
    version_dir = engines / VOICE / "1"
    good = shutil.copyfile(version_dir / "acoustic.onnx", tmp_path / "acoustic.onnx")
    noise = random_bytes(tmp_path / "noise.onnx", good.stat().st_size)
    rewrite(version_dir, {"acoustic.onnx": noise})  # its manifest says these bytes
    srv = _start(engines, server_factory, ready=False)
    _wait_up(srv)
    state = wait_engines(srv, lambda s: s["rejected"], "version 1 rejected")
    assert state["current"] is None
    health = srv.client.get("/health")
    assert health.status_code == 503 and health.json()["status"] == "no_verified_engine"
    publish(engines, {"acoustic.onnx": good})
    srv.wait_ready(1)
    assert srv.synth("Now it speaks.", **DET).headers["x-engine-version"] == "2"
    assert _events(srv, "worker_died") == []
    assert len(_events(srv, "worker_start_failed")) == 1


@pytest.mark.parametrize("fault", ["world-writable", "foreign-owned"])
def test_engine_files_a_stranger_may_have_written_are_refused(
    engines: Path, server_factory: list[Server], fault: str
) -> None:
    """Before: a file anyone may write, or one a stranger owns, was loaded and served."""
    publish(engines, {})  # version 2: the same engines, published anew
    if fault == "world-writable":
        target, reason = engines / VOICE / "2" / "acoustic.onnx", "writable by anyone (mode 0666)"
        target.chmod(0o666)
    else:
        if os.geteuid() != 0:
            pytest.skip("giving a file to another user needs root")
        target, reason = engines / VOICE / "2" / "vocoder.onnx", "owned by user 54321"
        os.chown(target, 54321, 54321)
    srv = _start(engines, server_factory)
    state = engines_state(srv)
    assert state["current"] == "1"
    assert state["rejected"] == [{"version": 2, "file": target.name,
                                  "reason": state["rejected"][0]["reason"]}]  # fmt: skip
    assert reason in state["rejected"][0]["reason"]
    assert srv.synth("The trusted version.", **DET).headers["x-engine-version"] == "1"
    # mended, it is judged again and served
    if fault == "world-writable":
        target.chmod(0o644)
    else:
        os.chown(target, 0, 0)
    wait_engines(srv, lambda s: s["current"] == "2", "version 2 once mended")


def test_a_voice_directory_that_leads_out_of_the_engines_directory_is_refused(
    engines: Path, server_factory: list[Server], tmp_path: Path
) -> None:
    """Before: a voice directory symlinked to a place outside the engines root was served."""
    outside = tmp_path / "elsewhere" / "en_US-elsewhere-medium"
    shutil.copytree(engines / VOICE, outside)
    (engines / outside.name).symlink_to(outside, target_is_directory=True)
    srv = _start(engines, server_factory)

    def elsewhere() -> dict[str, object]:
        listed = srv.client.get("/voices").json()["voices"]
        return next((v for v in listed if v["name"] == outside.name), {})

    entry = wait_until(srv, elsewhere, lambda v: bool(v and v["engines"]["rejected"]),
                       "the linked voice judged")  # fmt: skip
    assert entry["state"] == "no_engine" and entry["engines"]["current"] is None
    (rejected,) = entry["engines"]["rejected"]
    assert rejected["reason"].startswith("voice directory: leads outside the engines directory")
    refused = srv.client.post("/synthesize", json={"text": "Hi.", "voice": outside.name})
    assert refused.status_code == 503

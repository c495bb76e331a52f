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
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tests.gateway.serving import Server, engines_state, wait_engines
from ttsvc.repository.layout import EngineRepository, EngineVersion
from ttsvc.repository.manifest import file_entry, load_manifest, write_manifest

VOICE = "en_US-joe-medium"
DET = {"noise_scale": 0.0, "noise_w": 0.0}


def _variant(src: Path, dst: Path, factor: float) -> None:
    """A different but valid engine: its largest float weight scaled by ``factor``."""
    model = onnx.load(str(src))
    init = max(
        (i for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT),
        key=lambda i: int(np.prod(i.dims)),
    )
    scaled = numpy_helper.to_array(init) * np.float32(factor)
    init.CopyFrom(numpy_helper.from_array(scaled.astype(np.float32), init.name))
    onnx.save(model, str(dst))


def _silent(src: Path, dst: Path) -> None:
    """A vocoder that loads and runs but outputs silence: its last convolution (which ONNX
    Runtime fused with the final tanh) has zero weights, so every sample is tanh(0)."""
    model = onnx.load(str(src))
    last_conv = [node for node in model.graph.node if "Conv" in node.op_type][-1]
    weights = {init.name: init for init in model.graph.initializer}
    for name in last_conv.input[1:]:
        init = weights[name]
        zero = np.zeros(numpy_helper.to_array(init).shape, np.float32)
        init.CopyFrom(numpy_helper.from_array(zero, name))
    onnx.save(model, str(dst))


@pytest.fixture(scope="module")
def candidates(default_version: EngineVersion, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("candidates")
    _variant(default_version.path / "acoustic.onnx", out / "acoustic-a.onnx", 1.001)
    _variant(default_version.path / "acoustic.onnx", out / "acoustic-b.onnx", 0.999)
    _silent(default_version.path / "vocoder.onnx", out / "vocoder-silent.onnx")
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


def _start(engines: Path, started: list[Server], workers: int = 1) -> Server:
    srv = Server(engines, "--workers", str(workers), env={"TTSVC_COMPILE_DEFAULT_VOICE": "0"})
    started.append(srv)
    srv.wait_ready(workers)
    return srv


def _publish(engines: Path, replace: dict[str, Path], runtime: dict[str, str] | None = None) -> int:
    """Publish a new version the way `ttsvc compile` does: staging directory, manifest, rename."""
    repo = EngineRepository(engines)
    latest = repo.latest(VOICE)
    assert latest is not None
    version = repo.next_version(VOICE)
    staging = repo.staging_dir(VOICE)
    for item in latest.path.iterdir():
        if item.name != "manifest.json":
            shutil.copyfile(replace.get(item.name, item), staging / item.name)
    manifest = load_manifest(latest.path)
    manifest.version = version
    for name in replace:
        manifest.files[name] = file_entry(staging / name)
    if runtime:
        manifest.runtime.update(runtime)
    write_manifest(staging, manifest)
    repo.publish(VOICE, staging, version)
    return version


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
        assert r.status_code == 200
        assert r.headers["x-engine-version"] in labels
        body = r.content
        assert body[:4] == b"RIFF" and len(body) > 44 + 22050  # a full utterance, > 0.5 s
        assert (len(body) - 44) % 2 == 0


def test_atomic_publish_under_load(engines: Path, server_factory: list[Server],
                                   candidates: Path) -> None:  # fmt: skip
    srv = _start(engines, server_factory, workers=2)
    responses = _streams_during(
        srv, lambda: _publish(engines, {"acoustic.onnx": candidates / "acoustic-a.onnx"})
    )
    wait_engines(srv, lambda s: s["current"] == "2", "version 2 serving")
    _check_whole_wavs(responses, {"1", "2"})
    after = srv.synth("Now on the new version.")
    assert after.status_code == 200 and after.headers["x-engine-version"] == "2"
    assert engines_state(srv)["reloads"] == {"ok": 1}


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
        _publish(engines, {}, runtime={"machine": "riscv128"})
        reason = "recompile"
    state = wait_engines(srv, lambda s: s["reloads"].get("rejected") == 1, f"{fault} refused")
    assert state["current"] == "1" and "ok" not in state["reloads"]
    assert reason in str(state["last_error"])
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
    _publish(engines, {"acoustic.onnx": candidates / "acoustic-a.onnx"})
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

"""The chart's engines volume, as far as a machine without a cluster can show it: the very
commands its containers run (read from the rendered chart), in directories laid out as the
volume would be, with real files and renames, beside real ``ttsvc serve`` processes.

* Seeding (the ``seed-engines`` init container): the image's engines published into an empty
  volume once, however many pods start on it.
* A shared claim (``engines.storage=pvc``): an operator publishes a new version with
  ``ttsvc engines copy`` (what a Job or ``kubectl exec`` runs); every replica, each polling as the
  chart tells it to, swaps it in without a restart.
* Per-pod volumes (the default): a new voice by name reaches the pod's volume through its
  ``voices`` sidecar when the voices ConfigMap changes (updated the way the kubelet updates a
  ConfigMap mount: a new hidden directory and one rename of ``..data``), and the running
  service serves it without a restart.

What it cannot show: the kubelet, the scheduler, a real ReadWriteMany filesystem (NFS's
attribute caching), fsGroup's ownership change. docs/deploy.md says so.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import helm_python as helm
import pytest

from tests.deploy.test_chart import CHART, IMAGE_ENGINES, one, render, settings_configmap
from tests.engine_files import VOICE, publish, variant
from tests.gateway.serving import Server, engines_state, voices, wait_engines, wait_voices
from tests.lifecycle.test_lexicons import configmap_update
from tests.voice_mirror import TEST_VOICE, Mirror, mirror_files, serve_mirror
from ttsvc.repository.layout import EngineRepository, EngineVersion

SERVER_ENV = {"TTSVC_COMPILE_DEFAULT_VOICE": "0", "TTSVC_WATCH_SETTLE_S": "0.5"}
"""As the swap tests start theirs: a missing voice is an error (the chart's setting), and a
short settle window (their copies do not pause)."""


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def pod_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(objects, "Deployment")["spec"]["template"]["spec"]
    return spec


def named(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == name]
    return found


def encoded(configmap: dict[str, Any]) -> dict[str, bytes]:
    return {key: text.encode() for key, text in configmap["data"].items()}


def init_container(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (found,) = [c for c in pod_of(objects)["initContainers"] if c["name"] == name]
    return found


def here(args: list[str], paths: dict[str, Path]) -> list[str]:
    """A container's arguments with its paths mapped onto this machine's directories."""
    mapped = []
    for arg in args:
        found = [(i, o) for i, o in paths.items() if arg == i or arg.startswith(i + "/")]
        mapped.append(str(found[0][1]) + arg[len(found[0][0]):] if found else arg)
    return mapped


def ttsvc(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TTSVC_")}
    return subprocess.run([sys.executable, "-m", "ttsvc.cli", *args], env=environ | (env or {}),
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip


@pytest.fixture
def image(default_version: EngineVersion, tmp_path: Path) -> Path:
    """The engines the cpu image holds: the default voice, version 1."""
    root = tmp_path / "image"
    shutil.copytree(default_version.path, root / VOICE / "1")
    return root


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for srv in started:
        srv.stop()


def serve(volume: Path, env: dict[str, str], started: list[Server]) -> Server:
    """A replica's service container on ``volume``, with the chart's settings ``env``."""
    srv = Server(volume, "--workers", "1", env=SERVER_ENV | env)
    started.append(srv)
    srv.wait_ready(1)
    return srv


def test_seed_publishes_the_images_engines_once(chart: helm.Chart, image: Path,
                                                tmp_path: Path) -> None:  # fmt: skip
    objects = render(chart, {})
    engines_dir = settings_configmap(objects)["TTSVC_ENGINES_DIR"]
    volume = tmp_path / "volume"  # an emptyDir: there, empty
    volume.mkdir()
    args = here(init_container(objects, "seed-engines")["args"],
                {IMAGE_ENGINES: image, engines_dir: volume})  # fmt: skip
    first = ttsvc(args)
    assert first.returncode == 0, first.stderr
    assert f"published {VOICE} version 1 at {volume / VOICE / '1'}" in first.stdout
    again = ttsvc(args)  # the pod restarted, or another replica of a shared claim
    assert again.returncode == 0, again.stderr
    assert f"{VOICE}: a version with the same files is in {volume}; skipped" in again.stdout
    assert [v.version for v in EngineRepository(volume).versions(VOICE)] == [1]
    listed = ttsvc(["engines", "ls", "--engines-dir", str(volume)])
    assert listed.stdout.startswith(f"* {VOICE} v1 ort ")
    nothing = ttsvc(here(args, {str(image): tmp_path / "gpu-image"}))  # an image without engines
    assert nothing.returncode == 1 and "nothing copied" in nothing.stderr


def test_a_version_published_into_a_shared_claim_reaches_every_replica(
    chart: helm.Chart, image: Path, tmp_path: Path, servers: list[Server]
) -> None:
    """Two replicas on one claim, each with the chart's settings (polling the shared
    filesystem); the operator publishes version 2, built elsewhere, with ``engines copy``: both
    serve it, neither restarts."""
    objects = render(chart, {"engines": {"storage": "pvc"}})
    data = settings_configmap(objects)
    volume = tmp_path / "claim"
    seed = here(init_container(objects, "seed-engines")["args"],
                {IMAGE_ENGINES: image, data["TTSVC_ENGINES_DIR"]: volume})  # fmt: skip
    assert ttsvc(seed).returncode == 0
    env = {k: v for k, v in data.items() if k == "TTSVC_WATCH_POLLING"}
    assert env == {"TTSVC_WATCH_POLLING": "true"}
    replicas = [serve(volume, env, servers) for _ in range(2)]
    pids = [(srv.proc.pid, srv.worker_pids()) for srv in replicas]
    for srv in replicas:
        assert srv.synth("Before.").headers["x-engine-version"] == "1"

    build = tmp_path / "build"  # the operator's machine: a new version of the voice
    shutil.copytree(image, build)
    variant(build / VOICE / "1" / "acoustic.onnx", tmp_path / "acoustic.onnx", 1.001)
    publish(build, {"acoustic.onnx": tmp_path / "acoustic.onnx"})
    result = ttsvc(["engines", "copy", str(build), "--engines-dir", str(volume)])
    assert result.returncode == 0, result.stderr
    assert f"published {VOICE} version 2" in result.stdout

    for srv in replicas:
        wait_engines(srv, lambda s: s["current"] == "2", "version 2 serving")
        assert srv.synth("After.").headers["x-engine-version"] == "2"
        assert engines_state(srv)["reloads"] == {"ok": 1}
    assert [(srv.proc.pid, srv.worker_pids()) for srv in replicas] == pids  # no restart


def lines_until(stream: IO[str], wanted: str) -> list[str]:
    """Lines read from ``stream`` up to the first that holds ``wanted`` (blocking on each)."""
    seen = []
    for line in stream:
        seen.append(line)
        if wanted in line:
            return seen
    raise AssertionError(f"the stream ended before {wanted!r}: {''.join(seen)}")


def test_a_voice_named_in_the_configmap_reaches_a_running_pod_without_a_restart(
    chart: helm.Chart, image: Path, tmp_path: Path, servers: list[Server]
) -> None:
    """The default per-pod volume: the pod's seed, its service, its voices sidecar following
    the voices ConfigMap. ``helm upgrade --set voices.pull=...`` changes only the ConfigMap;
    the sidecar pulls the voice (from a loopback mirror here), the service serves it."""
    objects = render(chart, {})
    data = settings_configmap(objects)
    engines_dir = data["TTSVC_ENGINES_DIR"]
    sidecar = init_container(objects, "voices")
    (mount,) = [m for m in sidecar["volumeMounts"] if m["name"] == "voices"]
    volume, names = tmp_path / "volume", tmp_path / "voices-configmap"
    volume.mkdir()
    names.mkdir()
    paths = {IMAGE_ENGINES: image, engines_dir: volume, mount["mountPath"]: names}
    assert ttsvc(here(init_container(objects, "seed-engines")["args"], paths)).returncode == 0
    (volume_cm,) = [v for v in pod_of(objects)["volumes"] if v["name"] == "voices"]
    configmap_name = volume_cm["configMap"]["name"]
    configmap_update(names, encoded(named(objects, configmap_name)), 1)  # as installed: none
    srv = serve(volume, {}, servers)
    pid, workers = srv.proc.pid, srv.worker_pids()

    with serve_mirror(Mirror(mirror_files())) as mirror:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("TTSVC_")}
        env = environ | {e["name"]: e["value"] for e in sidecar["env"]} | {
            "TTSVC_VOICES_URL": mirror.base, "HOME": str(tmp_path)}  # fmt: skip
        proc = subprocess.Popen([sys.executable, "-m", "ttsvc.cli", *here(sidecar["args"], paths)],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True)  # fmt: skip
        try:
            assert proc.stdout is not None
            started = lines_until(proc.stdout, "every voice listed is published")
            assert "lists no voice" in started[0]
            upgraded = render(chart, {"voices": {"pull": [TEST_VOICE]}})
            assert pod_of(upgraded) == pod_of(objects)  # the upgrade rolls no pod
            configmap_update(names, encoded(named(upgraded, configmap_name)), 2)
            pulled = "".join(lines_until(proc.stdout, "every voice listed is published"))
            assert f"lists {TEST_VOICE}" in pulled
            assert f"published {TEST_VOICE} version 1" in pulled
        finally:
            proc.send_signal(signal.SIGTERM)  # the pod stops: the sidecar ends cleanly
            assert proc.wait(timeout=60) == 0

    wait_voices(srv, lambda v: TEST_VOICE in v and v[TEST_VOICE]["state"] == "serving",
                "the pulled voice serving")  # fmt: skip
    response = srv.synth("A voice from the catalogue.", voice=TEST_VOICE, stream=False)
    assert response.status_code == 200, response.text
    assert set(voices(srv)) == {VOICE, TEST_VOICE}
    assert (srv.proc.pid, srv.worker_pids()) == (pid, workers)  # no restart

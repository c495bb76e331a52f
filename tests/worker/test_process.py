"""A real worker process driven over its pipe: voices loaded on demand, and a version announced
while one loads.

The test speaks for the gateway (jobs, cancels, swaps on the pipe) to one spawned worker holding
real engines, so the interleavings the gateway cannot force on cue are sent in a fixed order.
"""

from __future__ import annotations

import multiprocessing as mp
import shutil
from collections.abc import Iterator
from multiprocessing.connection import Connection

import pytest

from tests.engine_files import VOICE, variant
from ttsvc.protocol import (
    AudioChunkMsg,
    CancelStream,
    EngineSpec,
    FromWorker,
    Shutdown,
    StreamDone,
    StreamError,
    SwapEngines,
    SynthesisJob,
    WorkerReady,
)
from ttsvc.repository.cache import EngineCache, snapshot
from ttsvc.repository.layout import EngineVersion
from ttsvc.repository.manifest import file_entry, load_manifest, write_manifest
from ttsvc.windows import WindowSchedule
from ttsvc.worker.plan import WorkerConfig
from ttsvc.worker.process import run_worker

OTHER = "en_US-other-medium"
WAIT_S = 120.0
"""Longest wait for one message from the worker (a load on a busy two-core machine)."""


def job(uid: str, voice: str) -> SynthesisJob:
    return SynthesisJob(uid, "A short test.", 1.0, 0.0, 0.0, 0.2, voice=voice)


def receive(conn: Connection, uid: str) -> FromWorker:
    """The worker's next message about ``uid`` (skipping heartbeats and other streams')."""
    while conn.poll(WAIT_S):
        msg = conn.recv()
        if getattr(msg, "uid", None) == uid:
            return msg
    raise AssertionError(f"no message about {uid} in {WAIT_S} s")


def finish(conn: Connection, uid: str) -> tuple[str, StreamDone | StreamError]:
    """Read ``uid`` to its end: the engine version of its audio, and its final message."""
    label = ""
    while isinstance(msg := receive(conn, uid), AudioChunkMsg):
        label = msg.engine_version
    assert isinstance(msg, StreamDone | StreamError)
    return label, msg


@pytest.fixture(scope="module")
def specs(default_version: EngineVersion, tmp_path_factory: pytest.TempPathFactory
          ) -> tuple[EngineSpec, EngineSpec, EngineSpec]:  # fmt: skip
    """The default voice, another voice at version 1, and its version 2 (a different vocoder),
    as the gateway hands them to workers: specs of files in an engine cache."""
    root = tmp_path_factory.mktemp("worker-voices")
    other1 = root / "src" / OTHER / "1"
    shutil.copytree(default_version.path, other1)
    other2 = root / "src" / OTHER / "2"
    shutil.copytree(other1, other2)
    variant(other1 / "vocoder.onnx", other2 / "vocoder.onnx", 0.9)
    manifest = load_manifest(other2)
    manifest.version = 2
    manifest.files["vocoder.onnx"] = file_entry(other2 / "vocoder.onnx")
    write_manifest(other2, manifest)
    default = snapshot(EngineCache(root / "cache" / VOICE), default_version.path, VOICE)
    cache = EngineCache(root / "cache" / OTHER)
    return default, snapshot(cache, other1, OTHER), snapshot(cache, other2, OTHER)


@pytest.fixture
def worker(specs: tuple[EngineSpec, EngineSpec, EngineSpec]) -> Iterator[Connection]:
    """One spawned worker on the default voice that knows the other voice's version 1."""
    default, other1, _ = specs
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=True)
    config = WorkerConfig(default, 1, WindowSchedule(), 200, log_level="warning",
                          log_format="json", voices={OTHER: other1})  # fmt: skip
    process = ctx.Process(target=run_worker, daemon=True, args=(0, config, child))
    process.start()
    child.close()
    assert parent.poll(WAIT_S) and isinstance(parent.recv(), WorkerReady)
    yield parent
    parent.send(Shutdown())
    process.join(timeout=30)
    if process.is_alive():
        process.kill()
    parent.close()


def test_a_voice_the_worker_does_not_hold_is_loaded_for_its_request(
    worker: Connection, specs: tuple[EngineSpec, EngineSpec, EngineSpec]
) -> None:
    worker.send(job("a", OTHER))
    label, end = finish(worker, "a")
    assert isinstance(end, StreamDone) and end.audio_samples > 0
    assert label == specs[1].label


def test_a_version_announced_while_the_old_one_loads_is_the_one_served(
    worker: Connection, specs: tuple[EngineSpec, EngineSpec, EngineSpec]
) -> None:
    _, _, other2 = specs
    worker.send(job("first", OTHER))  # starts loading version 1
    worker.send(CancelStream("first"))  # its client leaves while it loads
    worker.send(SwapEngines(other2, seq=7, load=False))  # not held here: remembered only
    worker.send(job("second", OTHER))  # waits for the load in progress
    cancelled = receive(worker, "first")
    assert isinstance(cancelled, StreamDone) and cancelled.audio_samples == 0
    label, end = finish(worker, "second")
    assert isinstance(end, StreamDone) and end.audio_samples > 0
    assert label == other2.label  # not the version that was loading when 2 was announced

"""A worker's memory stays flat over hot swaps and long texts (real server, real swaps).

The sizes are read from ``/proc/<pid>/status`` of the real worker process. The bound is +10 %:
over the swaps, of the size the worker had before its first swap (a replaced engine set, the
first one included, must not stay resident); over the long texts, of its size after the first.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engine_files import VOICE, publish, variant
from tests.gateway.serving import Server, metric, wait_engines, wait_until
from ttsvc.repository.layout import EngineVersion
from ttsvc.worker.heap import Heap

DET = {"noise_scale": 0.0, "noise_w": 0.0}
BOUND = 1.10
SWAPS = 6
"""A worker that kept even part of each replaced engine set would pass
the bound several times over; few enough for a test (the benchmark runs 20)."""
LONG_REQUESTS = 2
"""Long requests after the first (each about 1,650 characters, over a minute of audio; the
benchmark runs 100)."""
LONG_TEXT = (
    "Thank you for calling, how can I help you today? Please hold while I transfer your call. "
    "Press one for billing, or two for technical support. Your estimated wait time is four "
    "minutes. "
) * 9

glibc_only = pytest.mark.skipif(not Heap().available, reason="the heap calls are glibc's")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")




@pytest.fixture
def engines(default_version: EngineVersion, tmp_path: Path) -> Path:
    """A private engines directory holding a copy of version 1."""
    root = tmp_path / "engines"
    shutil.copytree(default_version.path, root / VOICE / "1")
    return root


@pytest.fixture
def server(engines: Path) -> Iterator[Server]:
    srv = Server(engines, "--workers", "1", env={"TTSVC_COMPILE_DEFAULT_VOICE": "0"})
    try:
        srv.wait_ready(1)
        yield srv
    finally:
        srv.stop()


def _settled_rss(srv: Server, pid: int) -> float:
    """The worker's RSS at rest: once it reports (in a heartbeat sent after its last stream
    ended) that it trimmed its heap and shrank its arena. Not at the instant a response ends,
    nor after a fixed number of probes, either of which may come before or after the give-back."""
    srv.wait_idle()
    wait_until(srv, lambda: metric(srv, "ttsvc_worker_memory_settled", worker="0"),
               lambda settled: settled == 1, "the worker at its resting size")  # fmt: skip
    return rss_mb(pid)


@glibc_only
def test_worker_memory_is_flat_over_swaps_and_long_texts(
    server: Server, engines: Path, default_version: EngineVersion, tmp_path: Path
) -> None:
    variants = [tmp_path / "acoustic-a.onnx", tmp_path / "acoustic-b.onnx"]
    variant(default_version.path / "acoustic.onnx", variants[0], 1.001)
    variant(default_version.path / "acoustic.onnx", variants[1], 0.999)
    (pid,) = server.worker_pids()

    def swap(i: int) -> None:
        label = str(publish(engines, {"acoustic.onnx": variants[i % 2]}))
        wait_engines(server, lambda s: s["current"] == label, f"version {label} current")
        assert server.synth("Memory probe.", **DET).status_code == 200

    assert server.synth("Memory probe.", **DET).status_code == 200
    first = _settled_rss(server, pid)
    for i in range(SWAPS):
        swap(i)
    after_swaps = _settled_rss(server, pid)
    assert server.worker_pids() == [pid]  # the same process all along, never respawned
    assert after_swaps <= BOUND * first, f"{first:.0f} MB before the swaps, {after_swaps:.0f} after"

    assert server.synth(LONG_TEXT, **DET).status_code == 200
    first_long = _settled_rss(server, pid)
    for i in range(LONG_REQUESTS):
        assert server.synth(f"Request {i}. " + LONG_TEXT, **DET).status_code == 200
    after_long = _settled_rss(server, pid)
    assert server.worker_pids() == [pid]
    assert after_long <= BOUND * first_long, f"{first_long:.0f} MB, then {after_long:.0f} MB"


@glibc_only
def test_trim_runs_only_after_memory_was_freed_and_not_more_often_than_its_interval() -> None:
    heap = Heap(trim_interval_s=3600.0)
    assert heap.pin_mmap_threshold()
    assert not heap.trim_if_due()  # nothing freed yet
    heap.freed()
    assert heap.trim_if_due()
    heap.freed()
    assert not heap.trim_if_due()  # within the interval
    assert heap.trims == 1


def test_the_runtime_arena_shrinks_once_the_worker_has_been_idle_for_the_shrink_delay() -> None:
    shrinks: list[None] = []
    heap = Heap(trim_interval_s=0.0, shrink_arena=lambda: shrinks.append(None),
                shrink_idle_s=3600.0)  # fmt: skip
    heap.freed()  # a stream ran: trims, but keeps the arena the next request will use
    assert heap.trim_if_due()
    assert not shrinks
    assert not heap.settled  # the arena still holds what the stream grew it to
    assert not heap.trim_if_due()  # nothing more freed, and not idle long enough to shrink

    heap = Heap(trim_interval_s=3600.0, shrink_arena=lambda: shrinks.append(None),
                shrink_idle_s=0.0)  # fmt: skip
    assert heap.settled  # nothing ran yet
    heap.freed()
    assert heap.trim_if_due()
    assert len(shrinks) == 1
    assert heap.settled
    assert not heap.trim_if_due()  # once per idle spell, not at every idle moment after it
    heap.freed()  # more work: the next idle spell shrinks again, whatever the trim interval
    assert heap.trim_if_due()
    assert len(shrinks) == 2


def test_without_an_arena_to_shrink_a_trim_settles_the_heap() -> None:
    heap = Heap(trim_interval_s=0.0)
    heap.freed()
    assert not heap.settled
    assert heap.trim_if_due()
    assert heap.settled

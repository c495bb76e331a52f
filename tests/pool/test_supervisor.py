"""The pool's bookkeeping of worker reports: capacity, demand and deadline misses.

Workers report deadline misses cumulatively; these tests drive the pool's message handler with
such reports directly (a worker that misses deadlines on cue cannot be spawned), on a real
pool, balancer and metrics registry. A real worker's reports reaching /metrics are checked
end to end in tests/observability/test_scripted_run.py.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
from collections.abc import Iterator

import pytest

from ttsvc.balancer import BalancerSettings, HeatScoreBalancer
from ttsvc.observability.metrics import ServiceMetrics
from ttsvc.pool.supervisor import DeadlineTally, WorkerPool, WorkerSpec, _WorkerHandle
from ttsvc.protocol import EngineSpec, EnginesSwapped, Heartbeat, SwapEngines, WorkerReady
from ttsvc.windows import WindowSchedule

LABEL = "1"


def test_tally_hands_out_what_was_added_since_the_last_report() -> None:
    tally = DeadlineTally()
    assert tally.advance(0, 0.0) == (0, 0.0)
    assert tally.advance(3, 0.25) == (3, 0.25)
    assert tally.advance(3, 0.25) == (0, 0.0)
    assert tally.advance(5, 0.75) == (2, 0.5)


@pytest.mark.parametrize(("misses", "late_s"), [(1, 0.1), (5, 0.5), (9, 0.5)])
def test_tally_counts_a_report_below_the_last_whole(misses: int, late_s: float) -> None:
    # below in either figure: a process that started again from 0
    tally = DeadlineTally(misses=5, late_s=0.75)
    assert tally.advance(misses, late_s) == (misses, late_s)
    assert (tally.misses, tally.late_s) == (misses, late_s)


class Pool:
    """A pool whose worker handles have no process running behind them: the test speaks for
    the worker by handing the pool its messages."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        engine = EngineSpec(LABEL, "voice", 1, "", {}, (), "{}", "")
        spec = WorkerSpec(engine, threads=1, schedule=WindowSchedule(), max_sentence_chars=200)
        self.metrics = ServiceMetrics()
        self.balancer = HeatScoreBalancer(BalancerSettings(), self.loop.time)
        self.pool = WorkerPool(spec, 1, self.balancer, self.loop, self.metrics)
        self.pool.stop_respawning()  # an exit must not spawn a real worker

    def handle(self, wid: int) -> _WorkerHandle:
        """A new worker process's handle, as a spawn would register it."""
        parent, child = mp.Pipe()
        child.close()
        process = mp.get_context("spawn").Process(target=print)  # never started
        handle = _WorkerHandle(wid, process, parent)
        self.pool.workers[wid] = handle
        return handle

    def value(self, name: str, worker: int | None = None) -> float | None:
        labels = None if worker is None else {"worker": str(worker)}
        return self.metrics.registry.get_sample_value(name, labels)

    def close(self) -> None:
        for handle in self.pool.workers.values():
            handle.conn.close()
        self.loop.close()


@pytest.fixture
def pool() -> Iterator[Pool]:
    p = Pool()
    yield p
    p.close()


CAPACITY = "ttsvc_worker_capacity_audio_seconds_per_second"
DEMAND = "ttsvc_worker_demand_audio_seconds_per_second"
WAITING = "ttsvc_worker_admission_waiting_streams"
MISSES = "ttsvc_deadline_misses_total"
LATE = "ttsvc_deadline_late_seconds_total"


def test_reports_set_capacity_gauges_and_routing(pool: Pool) -> None:
    first = pool.handle(0)
    pool.pool._on_message(first, WorkerReady(0, "voice", LABEL, 22050, capacity=3.0, threads=2))
    (state,) = pool.balancer.snapshot()
    assert (state.capacity, state.threads, state.demand) == (3.0, 2, 0.0)
    assert (pool.value(CAPACITY, 0), pool.value(DEMAND, 0), pool.value(WAITING, 0)) == (3, 0, 0)

    pool.pool._on_message(first, Heartbeat(0, 3, capacity=2.5, demand=2.0, waiting=1))
    (state,) = pool.balancer.snapshot()
    # the stream held back will need its share too: routing counts it in the demand
    assert (state.capacity, state.demand, state.qsize) == (2.5, 3.0, 3)
    assert (pool.value(CAPACITY, 0), pool.value(DEMAND, 0), pool.value(WAITING, 0)) == (2.5, 2, 1)

    pool.pool._on_exit(first)
    assert (pool.value(CAPACITY, 0), pool.value(DEMAND, 0), pool.value(WAITING, 0)) == (0, 0, 0)
    assert pool.balancer.snapshot() == []


def test_cumulative_misses_count_once_and_a_respawned_worker_counts_from_zero(pool: Pool) -> None:
    assert (pool.value(MISSES), pool.value(LATE)) == (0, 0)
    first = pool.handle(0)
    pool.pool._on_message(first, WorkerReady(0, "voice", LABEL, 22050, capacity=3.0))
    for misses, late_s in ((4, 0.5), (6, 0.75), (6, 0.75)):
        pool.pool._on_message(first, Heartbeat(0, 1, 3.0, 1.0, 0, misses, late_s))
    assert (pool.value(MISSES), pool.value(LATE)) == (6, 0.75)
    pool.pool._on_exit(first)

    second = pool.handle(0)  # the respawn: a new process, counting from 0
    pool.pool._on_message(second, WorkerReady(0, "voice", LABEL, 22050, capacity=3.0))
    pool.pool._on_message(second, Heartbeat(0, 1, 3.0, 1.0, 0, 7, 1.0))
    assert (pool.value(MISSES), pool.value(LATE)) == (13, 1.75)
    pool.pool._on_message(first, Heartbeat(0, 1, 3.0, 1.0, 0, 50, 9.0))  # the old one, late
    assert (pool.value(MISSES), pool.value(LATE)) == (13, 1.75)


def test_a_capacity_that_is_not_a_finite_figure_counts_as_unknown(pool: Pool) -> None:
    handle = pool.handle(0)
    pool.pool._on_message(handle, WorkerReady(0, "voice", LABEL, 22050, capacity=float("nan")))
    assert [w.id for w in pool.balancer.snapshot()] == [0]  # still registered, still routed
    assert pool.value(CAPACITY, 0) == 0
    pool.pool._on_message(handle, Heartbeat(0, 1, float("inf"), -1.0, 0, 0, 0.0))
    (state,) = pool.balancer.snapshot()
    assert (state.capacity, state.demand, state.qsize) == (0.0, 0.0, 1)
    assert pool.balancer.pick() == 0


def _sent(handle: _WorkerHandle) -> list[object]:
    """What the pool queued for a worker so far (no sender thread runs in these tests)."""
    found = []
    while not handle.outbox.empty():
        found.append(handle.outbox.get())
    return found


def test_a_worker_ready_while_a_voice_is_staged_learns_it_too(pool: Pool) -> None:
    """A new voice is staged on the one worker READY then; a worker that says READY during the
    canary started without it and must be told once the candidate passed, or it would answer
    unknown_voice for a voice GET /voices lists as served."""
    first, second = pool.handle(0), pool.handle(1)
    pool.pool._on_message(first, WorkerReady(0, "voice", LABEL, 22050, voices=("voice",)))
    engine = EngineSpec("1", "other", 1, "", {}, (), "{}", "")

    async def scenario() -> EnginesSwapped:
        rollout = asyncio.ensure_future(pool.pool.rollout(engine, timeout=5))
        await asyncio.sleep(0)  # the staging request goes out to worker 0
        (staging,) = _sent(first)
        assert isinstance(staging, SwapEngines) and staging.load
        # worker 1 comes up during the canary, spawned before the voice passed
        pool.pool._on_message(second, WorkerReady(1, "voice", LABEL, 22050, voices=("voice",)))
        assert _sent(second) == []
        pool.pool._on_message(first, EnginesSwapped(0, "1", True, "", staging.seq))
        for _ in range(3):
            await asyncio.sleep(0)
        (told,) = _sent(second)
        assert isinstance(told, SwapEngines) and told.spec == engine and not told.load
        pool.pool._on_message(second, EnginesSwapped(1, "1", True, "", told.seq))
        return await rollout

    reply = pool.loop.run_until_complete(scenario())
    assert reply.ok
    assert pool.pool.spec.voices["other"] == engine
    assert second.specs["other"] == "1"

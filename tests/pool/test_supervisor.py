"""The pool's bookkeeping of worker reports: capacity, demand, deadline misses and rest.

Workers report deadline misses cumulatively; these tests drive the pool's message handler with
such reports directly (see ``tests.pool.scripted``). A real worker's reports reaching /metrics
are checked end to end in tests/observability/test_scripted_run.py.
"""

from __future__ import annotations

import asyncio

from tests.pool.scripted import LABEL, Pool, sent
from ttsvc.protocol import (
    EngineSpec,
    EnginesSwapped,
    Heartbeat,
    StartFailed,
    StreamDone,
    SynthesisJob,
    WorkerReady,
)

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


SETTLED = "ttsvc_worker_memory_settled"


def test_a_worker_counts_as_settled_only_on_a_heartbeat_after_its_last_work(pool: Pool) -> None:
    """A heartbeat the worker sent before it received a job arrives before that job's end; the
    pool must not go on showing it as settled once the job has ended."""
    handle = pool.handle(0)
    pool.pool._on_message(handle, WorkerReady(0, "voice", LABEL, 22050, capacity=3.0))
    pool.pool._on_message(handle, Heartbeat(0, 0, settled=True))
    assert pool.value(SETTLED, 0) == 1
    job = SynthesisJob("u1", "Hello.", 1.0, None, None, 0.2)
    pool.loop.run_until_complete(pool.pool.submit(0, job))
    assert pool.value(SETTLED, 0) == 0  # work sent
    pool.pool._on_message(handle, Heartbeat(0, 0, settled=True))  # sent before the job arrived
    assert pool.value(SETTLED, 0) == 0  # the stream is still out on the worker
    pool.pool._on_message(handle, StreamDone("u1", 1, 0.5))
    assert pool.value(SETTLED, 0) == 0  # the stale report does not outlive the stream's end
    pool.pool._on_message(handle, Heartbeat(0, 0, settled=False))  # trimming is still due
    assert pool.value(SETTLED, 0) == 0
    pool.pool._on_message(handle, Heartbeat(0, 0, settled=True))
    assert pool.value(SETTLED, 0) == 1
    pool.pool._on_exit(handle)
    assert pool.value(SETTLED, 0) == 0


def test_a_swap_unsettles_a_worker_until_a_heartbeat_after_its_answer(pool: Pool) -> None:
    handle = pool.handle(0)
    pool.pool._on_message(handle, WorkerReady(0, "voice", LABEL, 22050, voices=("voice",)))
    pool.pool._on_message(handle, Heartbeat(0, 0, settled=True))
    engine = EngineSpec("2", "voice", 1, "", {}, (), "{}", "")

    async def scenario() -> None:
        rollout = asyncio.ensure_future(pool.pool.rollout(engine, timeout=5))
        await asyncio.sleep(0)  # the swap request goes out
        assert pool.value(SETTLED, 0) == 0  # at once, not at the next report
        (swap,) = sent(handle)
        pool.pool._on_message(handle, Heartbeat(0, 0, settled=True))  # sent before the swap
        assert pool.value(SETTLED, 0) == 0
        pool.pool._on_message(handle, EnginesSwapped(0, "2", True, "", swap.seq))
        await rollout
        assert pool.value(SETTLED, 0) == 0  # the replaced set is not given back yet
        pool.pool._on_message(handle, Heartbeat(0, 0, settled=True))
        assert pool.value(SETTLED, 0) == 1

    pool.loop.run_until_complete(scenario())


def test_the_pool_picks_for_the_gateway_and_says_which_versions_serve_a_voice(pool: Pool) -> None:
    handle = pool.handle(0)
    assert pool.pool.serving("voice") == ([], [])  # not READY yet
    pool.pool._on_message(handle, WorkerReady(0, "voice", LABEL, 22050, voices=("voice",)))
    assert pool.pool.serving("voice") == ([LABEL], [0])
    assert pool.pool.serving("other") == ([], [])
    assert pool.pool.pick("voice") == (0, 1)  # the load counts the stream picked
    assert pool.pool.pick("voice") == (0, 2)


def _failed(label: str = LABEL) -> StartFailed:
    return StartFailed(0, "voice", label, "acoustic.onnx: ONNX Runtime could not load it")


def test_a_start_no_worker_survives_holds_the_worker_for_other_engines(pool: Pool) -> None:
    """The engines every worker starts on cannot serve: respawning onto them again would loop
    for ever. The worker waits, the lifecycle is told, and a retarget starts it on others."""
    told: list[StartFailed] = []
    pool.pool.on_start_failed = told.append
    handle = pool.handle(0)
    assert pool.pool._judge_start(handle, _failed())
    assert told == [_failed()] and pool.pool.held_for("voice")
    assert pool.pool.restarts == 1
    older = EngineSpec("0", "voice", 0, "", {}, (), "{}", "")
    pool.pool.retarget(older)
    assert pool.pool.spec.engine is older and pool.pool.spec.voices["voice"] is older
    assert not pool.pool.held_for("voice")


def test_a_start_failure_on_engines_another_worker_serves_is_the_process_s_own(
    pool: Pool,
) -> None:
    told: list[StartFailed] = []
    pool.pool.on_start_failed = told.append
    serving = pool.handle(1)
    pool.pool._on_message(serving, WorkerReady(1, "voice", LABEL, 22050, capacity=3.0))
    serving.specs["voice"] = LABEL
    assert not pool.pool._judge_start(pool.handle(0), _failed())  # respawned as after a crash
    assert told == [] and not pool.pool.held_for("voice")


def test_a_start_failure_on_engines_replaced_meanwhile_respawns_at_once(pool: Pool) -> None:
    told: list[StartFailed] = []
    pool.pool.on_start_failed = told.append
    assert pool.pool._judge_start(pool.handle(0), _failed("2"))  # it started on version 2
    assert told == [] and not pool.pool.held_for("voice")  # the spec already says version 1

"""The deadline scheduler's cost model on its own: the capacity estimate and the layout of
steps on threads that bounds a step (``first_late``)."""

from __future__ import annotations

import pytest

from ttsvc.worker.costs import Capacity, first_late


def test_first_late_lays_steps_out_on_the_threads_in_laxity_order() -> None:
    # one thread free now: tasks due to start at 0.1 and 0.12, each 0.05 long: the second
    # would start at 0.15, late; with a second thread both start in time
    tasks = [(0.1, 0.05, 0.0), (0.12, 0.05, 0.0)]
    assert first_late(tasks, [0.0], horizon=1.0) is None  # 0.0-0.05, 0.05-0.1: in time
    tasks = [(0.01, 0.05, 0.0), (0.02, 0.05, 0.0)]
    assert first_late(tasks, [0.0], horizon=1.0) == 0.02
    assert first_late(tasks, [0.0, 0.0], horizon=1.0) is None
    assert first_late(tasks, [], horizon=1.0) == 0.01  # no other thread: the first start_by
    assert first_late(tasks, [0.5], horizon=1.0) == 0.01  # the thread is away until 0.5
    # a stream's later steps count: each 50 ms step buys 100 ms of audio (rate 2), so it
    # needs half a thread; three of them need one and a half, and one thread falls behind
    tasks = [(0.1, 0.05, 2.0), (0.1, 0.05, 2.0), (0.1, 0.05, 2.0)]
    late = first_late(tasks, [0.0], horizon=1.0)
    assert late is not None and 0.1 < late < 1.0
    assert first_late(tasks, [0.0, 0.0], horizon=1.0) is None


def test_capacity_follows_real_step_costs() -> None:
    capacity = Capacity(threads=2, per_thread=10.0)
    for _ in range(2000):
        capacity.record(audio_s=0.5, compute_s=0.1)  # 5 audio-s per compute second
    assert capacity.value == pytest.approx(10.0, rel=0.01)


@pytest.mark.parametrize("canary", [1.0, 100.0])  # a start 10x too low, and 10x too high
def test_no_start_up_figure_outlives_a_few_seconds_of_real_steps(canary: float) -> None:
    # issue 36: the canary read 6.1 in one start and 21.6 in another for the same worker
    capacity = Capacity(threads=2, per_thread=canary)
    assert capacity.value == pytest.approx(2 * canary)  # before any step: the canary's
    for step in range(1, 101):  # 100 steps of 50 ms: PRIOR_FADE_S, 2.5 s of a busy 2-thread worker
        capacity.record(audio_s=0.5, compute_s=0.05)  # the live rate: 10 audio-s a second
        if step == 50:
            midway = capacity.value
    assert capacity.prior_weight == pytest.approx(0.0, abs=1e-9)
    assert capacity.value == pytest.approx(20.0)  # the live figure alone, 2 threads x 10
    # halfway through, the prior weighs half a second against ~2.2 s of live steps
    assert abs(midway - 20.0) < abs(2 * canary - 20.0) / 4


def test_the_canary_figure_is_clamped_and_zero_means_unknown() -> None:
    assert Capacity(threads=2, per_thread=0.1).value == pytest.approx(2.0)  # 1 a thread
    assert Capacity(threads=2, per_thread=1e6).value == pytest.approx(200.0)
    unknown = Capacity(threads=2, per_thread=0.0)
    assert unknown.value == 0.0 and unknown.prior_weight == 0.0
    unknown.record(audio_s=0.5, compute_s=0.05)
    assert unknown.value == pytest.approx(20.0)

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

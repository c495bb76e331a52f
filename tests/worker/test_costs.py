"""The deadline scheduler's cost model on its own: the capacity estimate (the canary's figure
only a prior that real steps replace) and the layout of steps on threads that bounds a step
(``first_late``)."""

from __future__ import annotations

import pytest

from ttsvc.worker.costs import (
    CAPACITY_MEMORY_S,
    CAPACITY_PRIOR_S,
    PRIOR_PER_THREAD,
    Capacity,
    first_late,
)

TRUE_RATE = 10.0
"""Audio seconds per second one thread really computes, in the scripted steps below."""


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


def work(capacity: Capacity, compute_s: float, step_s: float, rate: float = TRUE_RATE) -> None:
    """Scripted steps of ``step_s`` each, ``compute_s`` of them in all, computing ``rate``
    audio seconds per second."""
    for _ in range(round(compute_s / step_s)):
        capacity.record(audio_s=rate * step_s, compute_s=step_s)


@pytest.mark.parametrize("off", [1 / 3.5, 3.5], ids=["started-low", "started-high"])
@pytest.mark.parametrize("step_s", [0.005, 0.05, 0.25])
def test_a_start_figure_gives_way_to_real_steps_after_two_seconds_of_their_compute(
    off: float, step_s: float
) -> None:
    """The canary ran on a machine busy starting other workers (3.5x too low: the worker would
    be refused streams it could serve) or idle (3.5x too high): after ``CAPACITY_PRIOR_S`` of
    real steps, whatever their size, the figure is the steps' own."""
    capacity = Capacity(threads=2, per_thread=off * TRUE_RATE)
    assert capacity.value == pytest.approx(2 * off * TRUE_RATE)  # the canary's, until work
    work(capacity, CAPACITY_PRIOR_S / 2, step_s)
    halfway = capacity.value
    assert min(off, 1.0) * 20.0 < halfway < max(off, 1.0) * 20.0  # on its way
    work(capacity, CAPACITY_PRIOR_S / 2, step_s)
    assert capacity.value == pytest.approx(2 * TRUE_RATE, rel=0.01)


def test_the_live_figure_follows_a_change_of_load_over_its_memory() -> None:
    capacity = Capacity(threads=2, per_thread=TRUE_RATE)
    work(capacity, 20.0, 0.05)
    work(capacity, 4 * CAPACITY_MEMORY_S, 0.05, rate=TRUE_RATE / 2)  # a neighbour took half
    assert capacity.value == pytest.approx(TRUE_RATE, rel=0.05)


def test_the_start_figure_is_clamped_per_thread_and_unknown_has_no_weight() -> None:
    high, low = PRIOR_PER_THREAD[1], PRIOR_PER_THREAD[0]
    assert Capacity(threads=2, per_thread=1e6).value == 2 * high  # a timing gone wrong
    assert Capacity(threads=2, per_thread=0.01).value == 2 * low  # still one stream a thread
    unknown = Capacity(threads=2, per_thread=0.0)
    assert unknown.value == 0.0
    unknown.record(audio_s=1.0, compute_s=0.1)  # the first real step is all there is to know
    assert unknown.value == pytest.approx(2 * TRUE_RATE)

"""Window schedules on their own: every frame covered once, the playback cap, the budget."""

from __future__ import annotations

import dataclasses
import itertools

from ttsvc.windows import WindowSchedule

SCHEDULES = [
    WindowSchedule(first=1, growth=2.0, max=64),
    WindowSchedule(first=8, growth=2.0, max=128),
    WindowSchedule(first=12, growth=1.5, max=48),
    WindowSchedule(first=512, growth=1.0, max=512),
    WindowSchedule(),
]


def test_windows_cover_every_frame_once() -> None:
    for frames in (1, 7, 8, 9, 100, 181, 700, 3000):
        for schedule in SCHEDULES:
            plan = list(schedule.windows(frames))
            assert plan[0][0] == 0 and plan[-1][1] == frames
            assert all(a[1] == b[0] for a, b in itertools.pairwise(plan))
            assert all(end > start for start, end in plan)


def test_playback_cap_keeps_each_window_inside_the_audio_already_sent() -> None:
    schedule = WindowSchedule(first=8, growth=8.0, max=512, realtime_share=0.5)
    cost, frame_s, context = 0.0006, 256 / 22050, 68
    plan = list(schedule.windows(3000, frame_cost_s=cost, frame_s=frame_s, context=context))
    uncapped = list(schedule.windows(3000))
    assert len(plan) > len(uncapped)  # the cap made later windows smaller
    sent = 0
    for start, end in plan:  # a merged tail too stays within the cap
        if sent >= 16:  # the first windows are at least ``first`` frames whatever the cap says
            usable = sent * frame_s - schedule.delivery_s
            assert (end - start + context) * cost <= 0.5 * usable + 1e-9
        sent = end


def test_the_window_after_a_lone_first_chunk_leaves_its_audio_time_to_travel() -> None:
    """Issue 37: after a lone stream's 4-frame first chunk (46 ms of audio) the cap let the
    second window grow to 32 frames (~23 ms of compute with its flow call), and 1-2 % of one
    client's streams ran dry there; the audio the chunk's delivery takes is not the window's."""
    cost, frame_s = 0.0006, 256 / 22050  # the default voice's figures on a 2-core Xeon
    lone = WindowSchedule().alone()
    plan = list(lone.windows(215, frame_cost_s=cost, frame_s=frame_s))
    (s1, e1), (s2, e2) = plan[:2]
    assert e1 - s1 == 4
    assert (e2 - s2) * cost <= 0.5 * (e1 * frame_s - lone.delivery_s) + 1e-9
    assert e2 - s2 >= lone.first  # never below the first window
    ignoring = dataclasses.replace(lone, delivery_s=0.0)
    old = list(ignoring.windows(215, frame_cost_s=cost, frame_s=frame_s))
    assert old[1][1] - old[1][0] > e2 - s2  # what counting the whole chunk allowed
    # after a shared 16-frame first chunk (186 ms) the growth, not the cap, sizes window 2
    shared = list(WindowSchedule().windows(2000, frame_cost_s=cost, frame_s=frame_s))
    assert shared[1][1] - shared[1][0] == WindowSchedule().first * 8


def test_budget_caps_each_later_window_but_never_below_shared_min() -> None:
    # no delivery time to leave: the playback cap out of the way of the budget's figures
    schedule = WindowSchedule(first=8, growth=8.0, max=512, shared_min=32, delivery_s=0.0)
    cost, frame_s, context = 0.0006, 256 / 22050, 24
    asked: list[int] = []
    budgets = iter([0.030, None, 0.001, 10.0] + [0.030] * 100)

    def budget() -> float | None:
        asked.append(len(asked))
        return next(budgets)

    kw = {"frame_cost_s": cost, "frame_s": frame_s, "context": context}
    plan = list(schedule.windows(2000, budget=budget, **kw))
    free = list(schedule.windows(2000, **kw))
    sizes = [end - start for start, end in plan]
    assert plan[0] == free[0]  # the first window is never asked about: time to first audio
    assert len(asked) == len(plan) - 1  # asked once before each later window
    # 30 ms at 0.6 ms per frame with 24 frames of context: 26 frames fit, below the floor of 32
    assert sizes[1] == 32
    assert sizes[2] == 256  # no limit: the window grows again (8x)
    assert sizes[3] == 32  # a 1 ms budget cannot push below the floor either
    assert sizes[4] == 256  # a generous budget leaves the schedule's own size
    assert max(sizes[5:]) <= 32  # 30 ms budgets from then on, the tail included
    assert all(a[1] == b[0] for a, b in itertools.pairwise(plan)) and plan[-1][1] == 2000


def test_no_budget_or_an_unlimited_one_changes_nothing() -> None:
    schedule = WindowSchedule(first=8, growth=8.0, max=512)
    kw = {"frame_cost_s": 0.0006, "frame_s": 256 / 22050, "context": 24}
    free = list(schedule.windows(3000, **kw))
    assert list(schedule.windows(3000, budget=lambda: None, **kw)) == free
    assert list(schedule.windows(3000, budget=lambda: 1e9, **kw)) == free


def test_no_window_is_a_sliver_whatever_the_budget_or_the_cap() -> None:
    # issue 37: budget-capped tails left 1-frame last windows, each paying a whole window's
    # context (and a step) for 12 ms of audio
    kw = {"frame_cost_s": 0.0006, "frame_s": 256 / 22050, "context": 24}
    for schedule in (WindowSchedule(first=4, shared_min=32), WindowSchedule(first=16),
                     WindowSchedule(first=8, growth=2.0, max=128)):  # fmt: skip
        for budget_s in (None, 0.001, 0.03, 0.2):
            for frames in range(1, 400):
                plan = list(schedule.windows(frames, budget=lambda b=budget_s: b, **kw))
                assert plan[0][0] == 0 and plan[-1][1] == frames
                assert all(a[1] == b[0] for a, b in itertools.pairwise(plan))
                if len(plan) > 1:
                    least = min(end - start for start, end in plan)
                    assert least >= schedule.first // 2, (schedule.first, budget_s, frames, plan)

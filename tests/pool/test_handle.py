"""What the pool keeps of a worker: its cumulative deadline reports turned into increments."""

from __future__ import annotations

import pytest

from ttsvc.pool.handle import DeadlineTally


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

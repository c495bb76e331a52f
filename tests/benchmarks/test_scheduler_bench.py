"""The scheduler benchmark's variant flags: a variant sets only the scheduler's policy
arguments, and a misspelt one stops the run before its minutes are spent."""

from __future__ import annotations

import pytest

from scheduler_bench import POLICY, parse_variant
from ttsvc.worker.deadline import DeadlineScheduler


def test_a_variant_names_policy_arguments_of_the_scheduler() -> None:
    assert parse_variant("tight=guard_s=0.03,step_floor_s=0.05") == (
        "tight", {"guard_s": 0.03, "step_floor_s": 0.05})
    arguments = DeadlineScheduler.__init__.__code__.co_varnames
    assert all(key in arguments for key in POLICY)


def test_an_unknown_policy_key_stops_the_run() -> None:
    with pytest.raises(SystemExit, match="guard"):
        parse_variant("typo=gaurd_s=0.03")

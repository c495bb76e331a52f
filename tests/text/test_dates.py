"""Tests for ttsvc.text.dates: dates and times of day, as ``normalize`` says them.

Through the public entry point, because the date and time passes must take their digits before
the number passes do, and "a.m." before the abbreviation pass.
"""

from __future__ import annotations

import pytest

from ttsvc.text.normalize import normalize


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10:30", "ten thirty"),
        ("6:05", "six oh five"),
        ("7:00", "seven o'clock"),
        ("Meet at 10:30 a.m. tomorrow.", "Meet at ten thirty A M tomorrow."),
        ("Meet at 10:30 a.m.", "Meet at ten thirty A M."),
        ("Call at 7:00 pm today", "Call at seven P M today"),
        ("at 4:15 PM", "at four fifteen P M"),
        ("10am", "ten A M"),
        ("at 5 p.m. Then we ate.", "at five P M. Then we ate."),
        ("10:30:15", "ten thirty and fifteen seconds"),
        ("in the a.m. hours", "in the A M hours"),
    ],
)
def test_times(text: str, expected: str) -> None:
    assert normalize(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-03-15", "March fifteenth, twenty twenty-four"),
        ("3/15/2024", "March fifteenth, twenty twenty-four"),
        ("On 2024-03-15 we met.", "On March fifteenth, twenty twenty-four we met."),
        ("12/1/1999", "December first, nineteen ninety-nine"),
        ("Jan. 5, 2024", "January fifth, twenty twenty-four"),
        ("March 15", "March fifteenth"),
        # Not a date: month 13 is left to the generic number rules.
        ("2024-13-15", "twenty twenty-four-13-15"),
    ],
)
def test_dates(text: str, expected: str) -> None:
    assert normalize(text) == expected

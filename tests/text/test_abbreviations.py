"""Tests for ttsvc.text.abbreviations: abbreviations, acronyms and initials, as ``normalize``
says them.

Through the public entry point, because whether a period survives depends on the text around it
once the other passes have run.
"""

from __future__ import annotations

import pytest

from ttsvc.text.normalize import normalize


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Dr. Smith is in.", "Doctor Smith is in."),
        ("Call Dr. Smith", "Call Doctor Smith"),
        ("Oak Dr.", "Oak Drive."),
        ("Mr. and Mrs. Jones", "Mister and Missus Jones"),
        ("Ms. Lee", "Miz Lee"),
        ("St. Louis", "Saint Louis"),
        ("We went to St. Louis.", "We went to Saint Louis."),
        ("Elm St.", "Elm Street."),
        ("I live on Elm St. in town.", "I live on Elm Street in town."),
        ("Martin Luther King Jr. was born", "Martin Luther King Junior was born"),
        ("John Smith Sr.", "John Smith Senior."),
        ("Prof. Xavier", "Professor Xavier"),
        ("Mt. Everest", "Mount Everest"),
        (
            "5th Ave. and Sunset Blvd. near Main Rd.",
            "fifth Avenue and Sunset Boulevard near Main Road.",
        ),
        ("apples, pears, etc.", "apples, pears, et cetera."),
        ("apples, etc. Then more.", "apples, et cetera. Then more."),
        ("apples, etc., and more", "apples, et cetera, and more"),
        ("(apples, etc.)", "(apples, et cetera.)"),
        ("cats vs. dogs", "cats versus dogs"),
        ("cats vs dogs", "cats versus dogs"),
        ("fruit, e.g. apples", "fruit, for example apples"),
        ("fruit, i.e., apples", "fruit, that is, apples"),
        ("approx. 5 km", "approximately 5 km"),
        ("Feb. and Sept. and Dec.", "February and September and December."),
        ("the U.S. Army", "the U S Army"),
        ("in the U.S.", "in the U S."),
        ("U.S.A.", "U S A."),
        ("J. R. R. Tolkien", "J R R Tolkien"),
        ("John F. Kennedy", "John F Kennedy"),
        # A lone capital after a lowercase word may end the sentence: keep its period.
        ("plan B. Then we left.", "plan B. Then we left."),
        # Not an abbreviation in lowercase: case-sensitive on purpose.
        ("dr. who", "dr. who"),
    ],
)
def test_abbreviations(text: str, expected: str) -> None:
    assert normalize(text) == expected

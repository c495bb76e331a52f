"""Tests for ttsvc.text.money: amounts of money, as ``normalize`` says them.

Through the public entry point, because the money passes must take their digits before the
generic number pass does.
"""

from __future__ import annotations

import pytest

from ttsvc.text.normalize import normalize


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$3.50", "three dollars and fifty cents"),
        ("$1", "one dollar"),
        ("$0.99", "ninety-nine cents"),
        ("$0.01", "one cent"),
        ("$1.01", "one dollar and one cent"),
        ("$3.00", "three dollars"),
        ("$1,000", "one thousand dollars"),
        ("$1,234.56", "one thousand two hundred thirty-four dollars and fifty-six cents"),
        ("€5", "five euros"),
        ("€1", "one euro"),
        ("5 €", "five euros"),
        ("£20", "twenty pounds"),
        ("£2.50", "two pounds and fifty pence"),
        ("¥100", "one hundred yen"),
        ("$2.5 million", "two point five million dollars"),
        ("$1 billion", "one billion dollars"),
        ("$5k", "five thousand dollars"),
        ("-$5", "minus five dollars"),
        ("It costs $3.50.", "It costs three dollars and fifty cents."),
    ],
)
def test_currency(text: str, expected: str) -> None:
    assert normalize(text) == expected

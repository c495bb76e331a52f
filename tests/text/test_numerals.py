"""Tests for ttsvc.text.numerals: numbers, years, decades, number signs, percentages, ordinals
and fractions, as ``normalize`` says them.

Through the public entry point, because a numeric form is only right once the passes before it
(dates, times, money) have left it alone.
"""

from __future__ import annotations

import pytest

from ttsvc.text.normalize import normalize


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1,234,567", "one million two hundred thirty-four thousand five hundred sixty-seven"),
        ("1,000", "one thousand"),
        ("3.14", "three point one four"),
        ("0.5", "zero point five"),
        (".5", "point five"),
        ("-5", "minus five"),
        ("It was -3.5 outside.", "It was minus three point five outside."),
        ("−7", "minus seven"),
        # Small stand-alone integers are left as digits: espeak-ng reads them correctly.
        ("0", "0"),
        ("112 cats", "112 cats"),
        ("4000", "four thousand"),
        ("112,", "112,"),
        ("12.", "12."),
        ("(7)", "(7)"),
        ("1000000000000000", "one quadrillion"),
        (
            "999999999999999",
            "nine hundred ninety-nine trillion nine hundred ninety-nine billion nine hundred "
            "ninety-nine million nine hundred ninety-nine thousand nine hundred ninety-nine",
        ),
        (
            "1234567890123456789012",
            "one two three four five six seven eight nine zero one two three four five six seven "
            "eight nine zero one two",
        ),
        ("0042", "zero zero four two"),
        ("1,2,3", "one, two, three"),
        ("version 1.2.3", "version one point two point three"),
        ("well-known 5-star", "well-known 5-star"),
    ],
)
def test_numbers(text: str, expected: str) -> None:
    assert normalize(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1999", "nineteen ninety-nine"),
        ("In 1999, it rained.", "In nineteen ninety-nine, it rained."),
        ("2023", "twenty twenty-three"),
        ("2010", "twenty ten"),
        ("2099", "twenty ninety-nine"),
        ("1100", "eleven hundred"),
        ("1905", "nineteen oh five"),
        ("2000", "two thousand"),
        ("2005", "two thousand five"),
        ("1099", "one thousand ninety-nine"),
        ("2100", "two thousand one hundred"),
        ("the 1990s", "the nineteen nineties"),
        ("the '80s", "the eighties"),
    ],
)
def test_years(text: str, expected: str) -> None:
    assert normalize(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("#5", "number 5"),
        ("We're #1!", "We're number 1!"),
        ("B12", "B twelve"),
        ("vitamin B12 and MP3 in 3D", "vitamin B twelve and MP three in three D"),
        ("No. 5", "number 5"),
        ("No. I won't.", "No. I won't."),
    ],
)
def test_alphanumerics_and_number_signs(text: str, expected: str) -> None:
    assert normalize(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("45%", "forty-five percent"),
        ("2.1%", "two point one percent"),
        ("-3%", "minus three percent"),
        ("100 %", "one hundred percent"),
    ],
)
def test_percentages(text: str, expected: str) -> None:
    assert normalize(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "1st 2nd 3rd 21st 5th 112th",
            "first second third twenty-first fifth one hundred twelfth",
        ),
        ("8th 9th 12th 20th 100th", "eighth ninth twelfth twentieth one hundredth"),
        ("the 1,000th visitor", "the one thousandth visitor"),
    ],
)
def test_ordinals(text: str, expected: str) -> None:
    assert normalize(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1/2 cup", "one half cup"),
        ("3/4", "three quarters"),
        ("2/3", "two thirds"),
        ("24/7", "twenty-four seven"),
    ],
)
def test_fractions(text: str, expected: str) -> None:
    assert normalize(text) == expected

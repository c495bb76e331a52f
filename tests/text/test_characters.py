"""Tests for ttsvc.text.characters: symbols said as words, and emoji, controls and other Unicode
torture inputs cleaned up or dropped, through ``normalize``.

Through the public entry point, because these passes run first and last around every rewrite.
"""

from __future__ import annotations

import pytest

from ttsvc.text.normalize import normalize


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("R&D", "R and D"),
        ("salt & pepper", "salt and pepper"),
        ("2+2=4", "2 plus 2 equals 4"),
        ("C++", "C plus plus"),
        ("me@example.com", "me at example.com"),
        ("25°C", "25 degrees Celsius"),
        ("98.6°F", "ninety-eight point six degrees Fahrenheit"),
        ("90° angle", "90 degrees angle"),
        ("3×4", "3 times 4"),
        ("a * b / c", "a b c"),
        ("and/or", "and or"),
        ("snake_case", "snake case"),
        ("I love 😀 pizza!", "I love pizza!"),
        ("Great 👍🏽!", "Great!"),
        ("it's ~5", "it's 5"),
    ],
)
def test_symbols(text: str, expected: str) -> None:
    assert normalize(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", ""),
        ("   \n\t  ", ""),
        ("😀🎉", ""),
        ("\x00\x07abc\x1b", "abc"),
        ("a", "a"),
        ("text..", "text.."),
        ("?!", "?!"),
        ("Hello мир 世界", "Hello мир 世界"),
        ("$$$", ""),
        ("1,2,3", "one, two, three"),
        ("line one\nline two\ttabbed", "line one line two tabbed"),
        ("zero\u200bwidth\u200d join\ufeff", "zerowidth join"),
        ("\u202eevil\u202c bidi", "evil bidi"),
        ("soft\u00adhyphen", "softhyphen"),
        ("e\u0301", "é"),
        ("\u0301stranded", "stranded"),
        ("a\u00a0b", "a b"),
        ("\ud800lone surrogate", "lone surrogate"),
    ],
)
def test_torture_inputs(text: str, expected: str) -> None:
    assert normalize(text) == expected

"""Tests for ttsvc.text.normalize: the whole pass on plain, long and adversarial text,
idempotence, the speakable checks and a seeded fuzz loop.

The spoken forms of each rule are tested beside its module: test_numerals.py, test_money.py,
test_dates.py, test_abbreviations.py, test_characters.py and test_espeak_guards.py.
"""

from __future__ import annotations

import random
import unicodedata

import pytest

from ttsvc.errors import NothingToSay
from ttsvc.text.normalize import has_speakable, normalize, require_speakable

# Shared with test_segment.py in spirit: digits, punctuation, symbols, emoji, combining marks,
# controls, invisible format characters and several scripts.
FUZZ_ALPHABET = (
    "abcxyzABCXYZ0123456789     .,;:!?'\"-—()$€£¥%#&@+=/*°×_"
    "😀🎉👍🏽‍❤️\u0301\u0308\u20e3\x00\x07\x1b\n\t\r\u200b\u200d\ufeff\u200e\u202e"
    "мирПривет世界日本語عربيह\u093fन्दी"
)


def _fuzz_strings(count: int = 300) -> list[str]:
    rng = random.Random(1234)
    return [
        "".join(rng.choice(FUZZ_ALPHABET) for _ in range(rng.randint(0, 80))) for _ in range(count)
    ]


@pytest.mark.parametrize(
    "text",
    [
        "Hello, world! How are you today?",
        "I have 3 cats and 12 dogs.",
        'She said: "Yes; no." Then she left!',
        "Hello мир 世界",
        "a",
        "text..",
        "Wait... what?!",
    ],
)
def test_plain_text_passes_through_unchanged(text: str) -> None:
    assert normalize(text) == text


def test_long_mixed_text() -> None:
    unit = "Dr. Smith paid $3.50 on 2024-03-15 at 10:30 a.m., i.e. 45% of 1,234 😀 мир. "
    text = (unit * (5000 // len(unit) + 1))[:5000]
    result = normalize(text)
    assert result.startswith(
        "Doctor Smith paid three dollars and fifty cents on March fifteenth, twenty twenty-four "
        "at ten thirty A M, that is forty-five percent of one thousand two hundred thirty-four мир."
    )
    assert not any(ch.isdigit() for ch in result if ch.isascii())
    assert normalize(result) == result


@pytest.mark.parametrize(
    "text",
    [
        "9" * 5000,
        "." * 5000,
        "1," * 2500,
        "1.1." * 1250,
        "a." * 2500,
        "J. " * 1700,
        "$" * 5000,
        "'" * 5000,
        "10:30 " * 800,
        "-" * 5000,
        "😀" * 5000,
    ],
)
def test_long_adversarial_inputs_complete(text: str) -> None:
    # No timing assertion: a pathological regex would show up as a pytest-timeout failure.
    assert isinstance(normalize(text), str)


@pytest.mark.parametrize(
    "text",
    [
        "Hello, world! How are you today?",
        "Doctor Smith paid three dollars and fifty cents.",
        "March fifteenth, twenty twenty-four",
        "ten thirty A M. Then we left.",
        "J R R Tolkien",
        "apples, et cetera.",
        "seven o'clock",
        "one, two, three",
    ],
)
def test_idempotent_on_normal_text(text: str) -> None:
    assert normalize(text) == text
    assert normalize(normalize(text)) == normalize(text)


@pytest.mark.parametrize(
    "text",
    ["Dr. Smith paid $3.50 on 2024-03-15.", "1st & 2nd at 10:30 p.m. Then e.g. 45%!", "St. Louis"],
)
def test_idempotent_on_own_output(text: str) -> None:
    once = normalize(text)
    assert normalize(once) == once


@pytest.mark.parametrize(
    ("text", "speakable"),
    [
        ("Hello", True),
        ("5", True),
        ("$5", True),
        ("мир", True),
        ("世界", True),
        ("", False),
        ("   ", False),
        ("😀🎉", False),
        ("$$$", False),
        ("?!", False),
        ("...", False),
        ("*#%", False),
        ("\x00\x07\x1b", False),
        ("\u0301\u0308", False),
    ],
)
def test_has_speakable(text: str, speakable: bool) -> None:
    assert has_speakable(text) is speakable


@pytest.mark.parametrize(
    "text", ["", "   \n\t", "😀🎉", "$$$", "?!", "...", "*#%", "\x00\x07\x1b", "\u200b\ufeff"]
)
def test_require_speakable_raises_nothing_to_say(text: str) -> None:
    with pytest.raises(NothingToSay) as excinfo:
        require_speakable(text)
    assert excinfo.value.field == "text"
    assert excinfo.value.message == "text has nothing to speak after normalization"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("Hi!", "Hi!"), ("  $5 😀 ", "five dollars"), ("\x00abc", "abc")],
)
def test_require_speakable_returns_normalized(text: str, expected: str) -> None:
    assert require_speakable(text) == expected


def test_fuzz_normalize_never_raises() -> None:
    # Idempotence is only promised for realistic text (tested above): on random soup, dropping a
    # symbol late can bring a digit and a word together that the first pass saw apart.
    for text in _fuzz_strings():
        result = normalize(text)
        assert isinstance(result, str)
        assert result == result.strip()
        assert "  " not in result
        assert not any(unicodedata.category(ch) in ("Cc", "Cf", "Cs") for ch in result), text
        assert has_speakable(text) == any(ch.isalnum() for ch in result)

"""Tests for ttsvc.text.segment.split_sentences: boundaries, length cap, torture and fuzz."""

from __future__ import annotations

import random

import pytest

from ttsvc.text.normalize import normalize
from ttsvc.text.segment import ends_at_its_end, split_sentences

FUZZ_ALPHABET = (
    "abcxyzABCXYZ0123456789     .,;:!?'\"-—()…$%#&@/*"
    "😀🎉👍🏽‍\u0301\u0308\x00\x07\x1b\n\t\r\u200b\ufeff"
    "мирПривет世界。！？日本語عربي"
)


def _fuzz_strings(count: int = 300) -> list[str]:
    rng = random.Random(1234)
    return [
        "".join(rng.choice(FUZZ_ALPHABET) for _ in range(rng.randint(0, 300))) for _ in range(count)
    ]


def _check_pieces(pieces: list[str], max_chars: int) -> None:
    for piece in pieces:
        assert piece
        assert piece == piece.strip()
        assert len(piece) <= max_chars


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Hello there. How are you? Fine!", ["Hello there.", "How are you?", "Fine!"]),
        ("One sentence only", ["One sentence only"]),
        ("Wait?! Really?", ["Wait?!", "Really?"]),
        ("Well... Maybe. Yes.", ["Well...", "Maybe.", "Yes."]),
        ("I was... thinking. OK", ["I was... thinking.", "OK"]),
        ("Trailing text.. More.", ["Trailing text..", "More."]),
        ("Ellipsis… Next.", ["Ellipsis…", "Next."]),
        ('He said "Hi." Then left.', ['He said "Hi."', "Then left."]),
        ("(An aside.) Next one.", ["(An aside.)", "Next one."]),
        ("She asked “Why?” He shrugged.", ["She asked “Why?”", "He shrugged."]),
        ("Line one.\nLine two.", ["Line one.", "Line two."]),
        ("你好。世界！", ["你好。", "世界！"]),
        ("  Padded.   Out.  ", ["Padded.", "Out."]),
        ("The end.", ["The end."]),
    ],
)
def test_splits_at_sentence_ends(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Pi is 3.14 today. Yes.", ["Pi is 3.14 today.", "Yes."]),
        ("It costs 1,000 dollars. Cheap.", ["It costs 1,000 dollars.", "Cheap."]),
        ("Visit example.com today. Now.", ["Visit example.com today.", "Now."]),
        ("Dr. Smith is here. OK.", ["Dr. Smith is here.", "OK."]),
        ("Mr. and Mrs. Jones left.", ["Mr. and Mrs. Jones left."]),
        ("Fruit, e.g. apples, i.e. food. Next.", ["Fruit, e.g. apples, i.e. food.", "Next."]),
        ("See Fig. 3 below.", ["See Fig. 3 below."]),
        ("J. R. R. Tolkien wrote it. Yes.", ["J. R. R. Tolkien wrote it.", "Yes."]),
        ("The U.S. Army is big. Yes.", ["The U.S. Army is big.", "Yes."]),
        ("Unknown abbr. here stays. Done.", ["Unknown abbr. here stays.", "Done."]),
    ],
)
def test_does_not_split_inside_numbers_or_abbreviations(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


@pytest.mark.parametrize(
    ("text", "max_chars", "expected"),
    [
        (
            "alpha beta; gamma delta, epsilon zeta — eta theta",
            20,
            ["alpha beta;", "gamma delta,", "epsilon zeta —", "eta theta"],
        ),
        # Clauses that fit together are packed into one piece.
        ("one, two, three, four, five", 12, ["one, two,", "three, four,", "five"]),
        # Strongest boundary first: the semicolon wins over the commas.
        ("a, b, c; d, e, f", 10, ["a, b, c;", "d, e, f"]),
        # No clause punctuation: cut at spaces.
        ("aaa bbb ccc ddd", 8, ["aaa bbb", "ccc ddd"]),
        # No spaces either: hard split.
        ("abcdefghij", 4, ["abcd", "efgh", "ij"]),
        # Times and thousands are not clause boundaries.
        ("at 10:30 we paid 1,000 dollars", 20, ["at 10:30 we paid", "1,000 dollars"]),
        ("Short. " + "x" * 10, 5, ["Short", ".", "xxxxx", "xxxxx"]),
    ],
)
def test_long_sentences_are_split(text: str, max_chars: int, expected: list[str]) -> None:
    assert split_sentences(text, max_chars=max_chars) == expected


def test_hard_split_keeps_combining_marks_with_their_letter() -> None:
    pieces = split_sentences("abce\u0301fg", max_chars=4)
    assert pieces == ["abc", "e\u0301fg"]


def test_default_cap_is_200() -> None:
    text = " ".join(["word"] * 100)
    pieces = split_sentences(text)
    assert len(pieces) == 3
    _check_pieces(pieces, 200)
    assert " ".join(pieces) == text


@pytest.mark.parametrize("max_chars", [0, -5])
def test_rejects_non_positive_cap(max_chars: int) -> None:
    with pytest.raises(ValueError, match="max_chars"):
        split_sentences("Hello.", max_chars=max_chars)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", []),
        ("   \n\t ", []),
        ("a", ["a"]),
        ("text..", ["text.."]),
        ("?!", ["?!"]),
        ("Hello мир 世界", ["Hello мир 世界"]),
        ("😀🎉", ["😀🎉"]),
        ("$$$", ["$$$"]),
        ("1,2,3", ["1,2,3"]),
        (". . .", [".", ".", "."]),
    ],
)
def test_torture_inputs(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "word " * 1000,
        "x" * 5000,
        "!" * 5000,
        "." * 5000,
        ". " * 2500,
        ".,;:!?" * 834,
        "a." * 2500,
        " " * 5000,
        "J. " * 1700,
        "?!" * 2500 + " end",
    ],
)
def test_long_adversarial_inputs(text: str) -> None:
    # No timing assertion: a hang would show up as a pytest-timeout failure.
    pieces = split_sentences(text, max_chars=200)
    _check_pieces(pieces, 200)
    assert "".join("".join(pieces).split()) == "".join(text.split())


def test_long_mixed_normalized_text() -> None:
    unit = "Dr. Smith paid $3.50 on 2024-03-15 at 10:30 a.m., i.e. 45% of 1,234 😀 мир! "
    text = normalize((unit * (5000 // len(unit) + 1))[:5000])
    pieces = split_sentences(text, max_chars=200)
    _check_pieces(pieces, 200)
    assert pieces[0] == (
        "Doctor Smith paid three dollars and fifty cents on March fifteenth, twenty twenty-four "
        "at ten thirty A M, that is forty-five percent of one thousand two hundred thirty-four мир!"
    )
    # Too long for a 120-character cap: cut at its strongest clause boundary, the comma.
    assert split_sentences(pieces[0], max_chars=120) == [
        "Doctor Smith paid three dollars and fifty cents on March fifteenth, twenty twenty-four "
        "at ten thirty A M,",
        "that is forty-five percent of one thousand two hundred thirty-four мир!",
    ]


@pytest.mark.parametrize("max_chars", [1, 7, 40, 200])
def test_fuzz_pieces_are_nonempty_stripped_and_capped(max_chars: int) -> None:
    for text in _fuzz_strings():
        pieces = split_sentences(text, max_chars=max_chars)
        _check_pieces(pieces, max_chars)
        # Nothing but whitespace is ever lost.
        assert "".join("".join(pieces).split()) == "".join(text.split())
        normalized_pieces = split_sentences(normalize(text), max_chars=max_chars)
        _check_pieces(normalized_pieces, max_chars)


@pytest.mark.parametrize("text,ends", [
    ("Hello there.", True), ("Hello there. ", True), ("Really?", True), ("Stop!", True),
    ('He said "go."', True), ("It costs 3.", True),
    ("I saw Dr.", False), ("e.g.", False), ("and...", False), ("Wait…", False), ("Hello", False),
    ("", False), ("One. Two", False),
])  # fmt: skip
def test_a_text_taken_as_all_there_is_ends_a_sentence_only_where_no_word_could_go_on(
    text: str, ends: bool
) -> None:
    assert ends_at_its_end(text) is ends

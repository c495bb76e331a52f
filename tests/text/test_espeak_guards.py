"""Tests for ttsvc.text.espeak_guards: dot-joined letter chains and over-long words are cut short,
and text within both bounds is not, through ``normalize``.

Through the public entry point, because the guards must hold on the text espeak-ng finally gets.
"""

from __future__ import annotations

import re
import unicodedata

import pytest

from ttsvc.text.normalize import normalize


def _longest_dotted_chain(text: str) -> int:
    """Most single letters one espeak-ng abbreviation joins: a dot joins them ("a.b", "a .b",
    "a. b") unless it ends the clause before a word that is not lowercase; ", " always ends it."""
    longest = chain = 0
    dotted = False  # a dot since the last single letter
    tokens = re.findall(r"\w+|\s+|.", text)
    for k, token in enumerate(tokens):
        after = [*tokens[k + 1 : k + 3], "", ""]
        if token.isalpha() and len(token) == 1:
            chain = chain + 1 if dotted else 1
            longest, dotted = max(longest, chain), False
        elif token[0].isalnum() or (token in ",;:!?" and after[0].isspace()):
            chain = 0  # a word, a digit or the end of a clause
        elif token == "." and after[0].isspace() and not after[1][:1].islower():
            chain = 0  # a full stop: the next word is not lowercase
        elif token == ".":
            dotted = True
    return longest


@pytest.mark.parametrize(
    "text",
    ["a." * 90, ".A" * 90, " .b" * 90, "b . " * 90, "a.b. " * 60, "a. " * 90, "é." * 60,
     "𝐚." * 30, "a.," * 90, "a.b." * 50, "Hello " + "a." * 90 + " world."],
)  # fmt: skip
def test_dotted_letter_chains_are_cut_short(text: str) -> None:
    # espeak-ng spells such a chain from an 80-byte buffer and overflows it past ~20 letters
    result = normalize(text)
    assert _longest_dotted_chain(result) <= 8
    assert sum(ch.isalpha() for ch in result) == sum(ch.isalpha() for ch in text)


def test_dotted_letter_chain_breaks_with_a_comma() -> None:
    assert normalize("a." * 10) == "a.a.a.a.a.a.a.a, a.a."


@pytest.mark.parametrize("text", ["s'" * 80, "s?" * 80, "ness" * 80, "x" * 500, "ø" * 300])
def test_words_are_cut_to_64_characters(text: str) -> None:
    # one word that stacks suffixes ("s's's'...") overflows espeak-ng's 200-byte phoneme buffer
    words = normalize(text).split()
    assert max(len(w) for w in words) <= 64
    assert "".join(words) == text


def test_words_keep_their_combining_marks_when_cut() -> None:
    words = normalize("q\u0303" * 40).split()
    assert all(unicodedata.category(w[0])[0] != "M" for w in words)
    assert max(len(w) for w in words) <= 64


@pytest.mark.parametrize(
    "text",
    ["a. b. c. d. e. f. g. h. Then i. j.", "a. B. c. D. e. F. g. H. i. J. k. L.", "x.y.z",
     "a.b.c.d.e.f.g.h", "ж.б.в", "Ph.D", "pneumonoultramicroscopicsilicovolcanoconiosis", "x" * 64],
)  # fmt: skip
def test_text_within_both_bounds_is_not_cut(text: str) -> None:
    assert normalize(text) == text

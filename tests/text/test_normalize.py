"""Tests for ttsvc.text.normalize: exact spoken forms, torture inputs and a seeded fuzz loop."""

from __future__ import annotations

import random
import re
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

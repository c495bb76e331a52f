"""Digit runs read as quantities: integers, decimals, versions, percentages, ordinals ("21st"),
decades ("1990s"), fractions ("3/4") and number signs ("#5").

Why this exists: espeak-ng reads some written numbers the way nobody says them ("1,234" as two
numbers), so each numeric form is matched here and spelled out with
:mod:`ttsvc.text.number_words`. ``NUMBER_RE`` is the generic pass, run after every more specific
form has taken its digits. ``INT`` and ``NEG`` are pattern pieces shared with
:mod:`ttsvc.text.money`.

ASCII digits only: digits of other scripts are left for espeak's own language rules.
"""

from __future__ import annotations

import re

from ttsvc.text.number_words import (
    cardinal,
    digit_words,
    integer_words,
    is_year,
    number_phrase,
    ordinalize,
    pluralize,
    year_words,
)

__all__ = [
    "DECADE_RE",
    "FRACTION_RE",
    "HASH_NUMBER_RE",
    "INT",
    "LEADING_DOT_DECIMAL_RE",
    "NEG",
    "NUMBER_RE",
    "ORDINAL_RE",
    "PERCENT_RE",
    "render_decade",
    "render_fraction",
    "render_leading_dot_decimal",
    "render_number",
    "render_ordinal",
    "render_percent",
]

INT = r"(?:[0-9]{1,3}(?:,[0-9]{3})+(?!,?[0-9])|[0-9]+)"
# A minus sign only where it cannot be a hyphen: not after a word, a dot or another dash.
NEG = r"(?P<neg>(?<![\w.\-])-)?"

# Stand-alone integers this short are left as digits: espeak-ng says them right.
_PLAIN_INTEGER_DIGITS = 3

PERCENT_RE = re.compile(rf"{NEG}(?<![0-9.,])(?P<int>{INT})(?:\.(?P<frac>[0-9]+))?\s?%")
ORDINAL_RE = re.compile(
    r"(?<![0-9.,])(?P<int>[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?i:st|nd|rd|th)(?![A-Za-z0-9])"
)
DECADE_RE = re.compile(r"(?<![\w.,])['’]?(?P<int>[1-9][0-9]{0,2}0)s(?![A-Za-z0-9])")
HASH_NUMBER_RE = re.compile(r"#\s?(?=[0-9])")
FRACTION_RE = re.compile(r"(?<![0-9/.,])(?P<n>[0-9]{1,3})/(?P<d>[0-9]{1,3})(?![0-9/])")
LEADING_DOT_DECIMAL_RE = re.compile(r"(?<![\w.])\.(?P<frac>[0-9]+)")
NUMBER_RE = re.compile(rf"(?<![0-9]){NEG}(?P<int>{INT})(?P<frac>(?:\.[0-9]+)+)?")


def render_percent(match: re.Match[str]) -> str:
    minus = "minus " if match["neg"] else ""
    return f"{minus}{number_phrase(match['int'], match['frac'])} percent"


def render_ordinal(match: re.Match[str]) -> str:
    return ordinalize(integer_words(match["int"]))


def render_decade(match: re.Match[str]) -> str:
    n = int(match["int"])
    words = year_words(n) if len(match["int"]) == 4 and is_year(n) else cardinal(n)
    return pluralize(words)


def render_fraction(match: re.Match[str]) -> str:
    num, den = int(match["n"]), int(match["d"])
    if 0 < num < den <= 10 and match["n"][0] != "0" and match["d"][0] != "0":
        if den == 2:
            unit = "half" if num == 1 else "halves"
        elif den == 4:
            unit = "quarter" if num == 1 else "quarters"
        else:
            unit = ordinalize(cardinal(den)) + ("" if num == 1 else "s")
        return f"{cardinal(num)} {unit}"
    # "24/7", "50/50": said as two numbers.
    return f"{integer_words(match['n'])} {integer_words(match['d'])}"


def render_leading_dot_decimal(match: re.Match[str]) -> str:
    return f"point {digit_words(match['frac'])}"


def _stands_alone(text: str, start: int, end: int) -> bool:
    """Whether a digit run is a word of its own, not part of "B12", "1,2,3" or "1.5"."""
    if start > 0:
        before = text[start - 1]
        if before.isalnum() or (before in ",." and start > 1 and text[start - 2].isdigit()):
            return False
    if end < len(text):
        after = text[end]
        if after.isalnum() or (after in ",." and end + 1 < len(text) and text[end + 1].isdigit()):
            return False
    return True


def render_number(match: re.Match[str]) -> str | None:
    int_part, frac, minus = match["int"], match["frac"], "minus " if match["neg"] else ""
    if (
        not minus
        and frac is None
        and len(int_part) <= _PLAIN_INTEGER_DIGITS
        and (int_part == "0" or int_part[0] != "0")
        and _stands_alone(match.string, match.start(), match.end())
    ):
        # espeak-ng reads a small stand-alone integer correctly; leaving it keeps plain text
        # untouched.
        return None
    if frac is None:
        if not minus and len(int_part) == 4 and int_part[0] != "0" and is_year(int(int_part)):
            return year_words(int(int_part))
        return minus + integer_words(int_part)
    parts = frac[1:].split(".")
    if len(parts) == 1:
        return minus + number_phrase(int_part, parts[0])
    # Versions and addresses ("1.2.3"): each part is its own number.
    return minus + " point ".join([integer_words(int_part), *map(integer_words, parts)])

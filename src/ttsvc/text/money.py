"""Amounts of money: "$3.50", "€5", "5 €", "$2.5 million", "$5k", "-$5".

Why this exists: espeak-ng reads "$3.50" roughly as "dollar three point five zero", where a person
says "three dollars and fifty cents". The currency table names each symbol's unit and subunit,
singular and plural.
"""

from __future__ import annotations

import re

from ttsvc.text.number_words import cardinal, integer_words, number_phrase
from ttsvc.text.numerals import INT, NEG

__all__ = ["CURRENCY_RE", "TRAILING_CURRENCY_RE", "render_currency"]

_CURRENCY = {
    "$": ("dollar", "dollars", "cent", "cents"),
    "€": ("euro", "euros", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
    "¥": ("yen", "yen", "", ""),
    "₹": ("rupee", "rupees", "paisa", "paise"),
}
_SCALE_ABBR = {"k": "thousand", "K": "thousand", "M": "million", "mn": "million", "B": "billion",
               "bn": "billion"}  # fmt: skip
CURRENCY_RE = re.compile(
    rf"{NEG}(?P<sym>[$€£¥₹])\s?(?P<int>{INT})(?:\.(?P<frac>[0-9]+))?"
    r"(?:\s(?P<word>(?i:thousand|million|billion|trillion))(?![A-Za-z])"
    r"|(?P<abbr>k|K|M|B|bn|mn)(?![A-Za-z0-9]))?"
)
# "5 €" / "5€": the usual European order.
TRAILING_CURRENCY_RE = re.compile(
    rf"{NEG}(?<![0-9.,])(?P<int>{INT})(?:\.(?P<frac>[0-9]+))?\s?(?P<sym>[€£¥₹])(?![\w$€£¥₹])"
)


def render_currency(match: re.Match[str]) -> str:
    one, many, sub_one, sub_many = _CURRENCY[match["sym"]]
    int_part, frac = match["int"], match["frac"]
    groups = match.groupdict()
    scale = groups.get("word") or groups.get("abbr")
    minus = "minus " if match["neg"] else ""
    if scale:
        scale_word = _SCALE_ABBR.get(scale, scale.lower())
        return f"{minus}{number_phrase(int_part, frac)} {scale_word} {many}"
    if frac is None:
        unit = one if int_part == "1" else many
        return f"{minus}{integer_words(int_part)} {unit}"
    if len(frac) > 2 or not sub_one:
        return f"{minus}{number_phrase(int_part, frac)} {many}"
    whole = int(int_part.replace(",", ""))
    cents = int(frac.ljust(2, "0"))
    whole_words = f"{integer_words(int_part)} {one if whole == 1 else many}"
    cents_words = f"{cardinal(cents)} {sub_one if cents == 1 else sub_many}"
    if cents == 0:
        return minus + whole_words
    if whole == 0:
        return minus + cents_words
    return f"{minus}{whole_words} and {cents_words}"

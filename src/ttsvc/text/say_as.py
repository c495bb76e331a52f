"""SSML ``say-as``: the words a marked-up value is read as, by its ``interpret-as``.

Why its own words and not the normalizer's guess: ``say-as`` exists for the values the
normalizer would misread, so each kind here reads the content exactly one way ("1234" as digits
is "one two three four" whatever the context). The words it returns then pass through the usual
normalization unchanged (plain words are left as they are). en-US words, like the normalizer.

Pure: a bad value raises ``ValueError`` with the reason, which the SSML parser reports with the
element's line and column.
"""

from __future__ import annotations

import re

from ttsvc.text.dates import _MONTHS, TIME_RE, render_time
from ttsvc.text.money import CURRENCY_RE, TRAILING_CURRENCY_RE, render_currency
from ttsvc.text.number_words import cardinal, digit_words, integer_words, ordinalize, year_words

__all__ = ["KINDS", "say_as"]

_DIGIT_NAMES = dict(zip("0123456789", digit_words("0123456789").split(), strict=True))
_CHARACTER_NAMES = {
    "&": "and", "+": "plus", "-": "dash", "@": "at", "#": "hash", "*": "star", "/": "slash",
    ".": "dot", "_": "underscore", "%": "percent", "$": "dollar", "=": "equals",
}  # fmt: skip
_INTEGER_RE = re.compile(r"[+-]?[0-9]{1,3}(?:,[0-9]{3})+|[+-]?[0-9]+")
_DATE_PART_RE = re.compile(r"[0-9]+|[A-Za-z]+")
_DATE_FORMATS = frozenset({"mdy", "dmy", "ymd", "ydm", "md", "dm", "ym", "my", "y", "m", "d"})
_DAYS_IN_MONTH = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _characters(content: str) -> str:
    """Each character by its name: letters as capitals (a capital alone is read as its letter
    name; "a" would be read as the article), digits as digit words, a few symbols by name."""
    words = []
    for ch in content:
        if ch.isspace():
            continue
        if ch.isalpha():
            words.append(ch.upper())
        elif ch in _DIGIT_NAMES:
            words.append(_DIGIT_NAMES[ch])
        elif ch in _CHARACTER_NAMES:
            words.append(_CHARACTER_NAMES[ch])
    if not words:
        raise ValueError("nothing to spell out")
    return " ".join(words)


def _integer(content: str) -> int:
    value = content.strip()
    if not _INTEGER_RE.fullmatch(value):
        raise ValueError(f"{value!r} is not a whole number")
    return int(value.replace(",", ""))


def _cardinal(content: str) -> str:
    return cardinal(_integer(content))


def _ordinal(content: str) -> str:
    value = content.strip().removesuffix(".")
    value = re.sub(r"(?<=[0-9])(?:st|nd|rd|th)$", "", value, flags=re.IGNORECASE)
    n = _integer(value)
    if n < 0:
        raise ValueError(f"{content.strip()!r} is not an ordinal (it is negative)")
    return ordinalize(cardinal(n))


def _digits(content: str) -> str:
    digits = [ch for ch in content if not ch.isspace()]
    if not digits or any(ch not in _DIGIT_NAMES for ch in digits):
        raise ValueError(f"{content.strip()!r} is not a string of digits")
    return " ".join(_DIGIT_NAMES[ch] for ch in digits)


def _telephone(content: str) -> str:
    """Digit by digit, a pause (a comma) between the groups as written ("555-0123")."""
    value = content.strip()
    groups = re.findall(r"[0-9]+", value)
    if not groups or re.search(r"[^0-9\s().+\-]", value):
        raise ValueError(f"{value!r} is not a telephone number")
    spoken = ", ".join(" ".join(_DIGIT_NAMES[ch] for ch in group) for group in groups)
    return ("plus " if value.startswith("+") else "") + spoken


def _month(part: str) -> int:
    if part.isdigit():
        month = int(part)
    else:
        names = [m.lower() for m in _MONTHS]
        matches = [i + 1 for i, name in enumerate(names) if name.startswith(part.lower())]
        if len(part) < 3 or len(matches) != 1:
            raise ValueError(f"{part!r} is not a month")
        month = matches[0]
    if not 1 <= month <= 12:
        raise ValueError(f"{part!r} is not a month")
    return month


def _date(content: str, fmt: str | None) -> str:
    """A date in the order ``format`` names (``mdy``, ``dmy``, ``ymd``, ``md``, ``dm``, ``ym``,
    ``my``, ``y``, ``m``, ``d``; default ``mdy`` for three parts, ``md`` for two): read as
    "March fifteenth, twenty twenty-four"."""
    parts = _DATE_PART_RE.findall(content)
    order = (fmt or {3: "mdy", 2: "md", 1: "y"}.get(len(parts), "")).lower()
    if order not in _DATE_FORMATS:
        raise ValueError(f"format {fmt!r} is not one of {', '.join(sorted(_DATE_FORMATS))}")
    if len(parts) != len(order):
        raise ValueError(f"{content.strip()!r} does not have the {len(order)} parts of {order!r}")
    found = dict(zip(order, parts, strict=True))
    month = _month(found["m"]) if "m" in found else None
    day = year = None
    if "d" in found:
        if not found["d"].isdigit():
            raise ValueError(f"{found['d']!r} is not a day")
        day = int(found["d"])
        limit = _DAYS_IN_MONTH[month - 1] if month else 31
        if not 1 <= day <= limit:
            raise ValueError(f"{found['d']!r} is not a day of that month")
    if "y" in found:
        if not found["y"].isdigit():
            raise ValueError(f"{found['y']!r} is not a year")
        year = int(found["y"])
    words = []
    if month is not None:
        words.append(_MONTHS[month - 1])
    if day is not None:
        nth = ordinalize(cardinal(day))
        words.append(nth if month is not None else f"the {nth}")
    spoken = " ".join(words)
    if year is not None:
        spoken = f"{spoken}, {year_words(year)}" if spoken else year_words(year)
    return spoken


def _time(content: str) -> str:
    value = content.strip()
    match = TIME_RE.fullmatch(value)
    spoken = render_time(match) if match else None
    if spoken is None:
        raise ValueError(f"{value!r} is not a time of day (hh:mm, hh:mm:ss, with am/pm or not)")
    return spoken


def _currency(content: str) -> str:
    value = content.strip()
    for pattern in (CURRENCY_RE, TRAILING_CURRENCY_RE):
        match = pattern.fullmatch(value)
        if match:
            return render_currency(match)
    if _INTEGER_RE.fullmatch(value) or re.fullmatch(r"[0-9]+\.[0-9]{1,2}", value):
        return render_currency(CURRENCY_RE.fullmatch(f"${value}"))  # type: ignore[arg-type]
    raise ValueError(f"{value!r} is not an amount of money ($12.50, 12.50 EUR)")


def _number(content: str) -> str:
    value = content.strip()
    if re.fullmatch(r"[0-9]+\.[0-9]+", value):
        whole, frac = value.split(".")
        return f"{integer_words(whole)} point {digit_words(frac)}"
    return _cardinal(value)


KINDS = {
    "characters": _characters, "spell-out": _characters, "cardinal": _number, "number": _number,
    "ordinal": _ordinal, "digits": _digits, "telephone": _telephone, "time": _time,
    "currency": _currency,
}  # fmt: skip
"""``interpret-as`` values and their readers (``date`` takes a format too)."""


def say_as(interpret_as: str, content: str, fmt: str | None = None) -> str:
    """The words ``content`` is read as; ``ValueError`` with the reason when it is not one."""
    kind = interpret_as.strip().lower()
    if kind == "date":
        return _date(content, fmt)
    reader = KINDS.get(kind)
    if reader is None:
        known = ", ".join(sorted([*KINDS, "date"]))
        raise ValueError(f"interpret-as {interpret_as!r} is not one of {known}")
    return reader(content)

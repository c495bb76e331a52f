"""English number words: cardinals, ordinals, plurals, years and digit-by-digit readings.

Why this exists: every written number the normalizer rewrites (money, dates, times, percentages,
plain digit runs) ends up in these same words, so they are built in one place. Written here rather
than pulled from num2words: it is ~60 lines and the service should not grow a dependency (and its
locale machinery) for one language.

Pure functions of ints and ASCII digit strings: no patterns, no text positions.
"""

from __future__ import annotations

__all__ = [
    "ONES",
    "cardinal",
    "digit_words",
    "integer_words",
    "is_year",
    "number_phrase",
    "ordinalize",
    "pluralize",
    "year_words",
]

ONES = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
    "nineteen",
)  # fmt: skip
_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_SCALES = (
    (10**15, "quadrillion"),
    (10**12, "trillion"),
    (10**9, "billion"),
    (10**6, "million"),
    (10**3, "thousand"),
)
# Past the quadrillions nobody says the number as a quantity; reading digits is what people do
# with long identifiers, card numbers and the like.
_MAX_CARDINAL_DIGITS = 18

_ORDINAL_IRREGULAR = {
    "one": "first",
    "two": "second",
    "three": "third",
    "five": "fifth",
    "eight": "eighth",
    "nine": "ninth",
    "twelve": "twelfth",
}


def _two_digits(n: int) -> str:
    if n < 20:
        return ONES[n]
    tens, ones = divmod(n, 10)
    return _TENS[tens] if ones == 0 else f"{_TENS[tens]}-{ONES[ones]}"


def _three_digits(n: int) -> str:
    hundreds, rest = divmod(n, 100)
    if not hundreds:
        return _two_digits(rest)
    head = f"{ONES[hundreds]} hundred"
    return head if rest == 0 else f"{head} {_two_digits(rest)}"


def digit_words(digits: str) -> str:
    return " ".join(ONES[ord(c) - 48] for c in digits)


def cardinal(n: int) -> str:
    if n < 0:
        return f"minus {cardinal(-n)}"
    if n == 0:
        return "zero"
    if n >= 10**_MAX_CARDINAL_DIGITS:
        return digit_words(str(n))
    parts: list[str] = []
    for value, name in _SCALES:
        count, n = divmod(n, value)
        if count:
            parts.append(f"{_three_digits(count)} {name}")
    if n:
        parts.append(_three_digits(n))
    return " ".join(parts)


def integer_words(digits: str) -> str:
    """Words for an ASCII digit string that may carry thousands commas."""
    plain = digits.replace(",", "")
    # A leading zero ("007", "0042") marks a code, not a quantity; so does sheer length.
    if (len(plain) > 1 and plain[0] == "0") or len(plain) > _MAX_CARDINAL_DIGITS:
        return digit_words(plain)
    return cardinal(int(plain))


def number_phrase(int_part: str, frac: str | None) -> str:
    words = integer_words(int_part)
    return words if not frac else f"{words} point {digit_words(frac)}"


def year_words(n: int) -> str:
    if 2000 <= n <= 2009 or n % 1000 == 0 or not 1000 <= n <= 9999:
        return cardinal(n)
    century, rest = divmod(n, 100)
    if rest == 0:
        return f"{_two_digits(century)} hundred"
    if rest < 10:
        return f"{_two_digits(century)} oh {ONES[rest]}"
    return f"{_two_digits(century)} {_two_digits(rest)}"


def is_year(n: int) -> bool:
    # 2000-2009 read as plain cardinals anyway ("two thousand five"), so one range covers all.
    return 1100 <= n <= 2099


def _split_last_word(words: str) -> tuple[str, str]:
    cut = max(words.rfind(" "), words.rfind("-")) + 1
    return words[:cut], words[cut:]


def ordinalize(words: str) -> str:
    head, last = _split_last_word(words)
    if last in _ORDINAL_IRREGULAR:
        return head + _ORDINAL_IRREGULAR[last]
    if last.endswith("y"):
        return f"{head}{last[:-1]}ieth"
    return f"{head}{last}th"


def pluralize(words: str) -> str:
    head, last = _split_last_word(words)
    if last.endswith("y"):
        return f"{head}{last[:-1]}ies"
    if last.endswith("x"):
        return f"{head}{last}es"
    return f"{head}{last}s"

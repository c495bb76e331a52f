"""Dates and times of day: "2024-03-15", "3/15/2024", "March 15, 1999", "10:30 a.m.", "10am".

Why this exists: espeak-ng reads "2024-03-15" as a subtraction. Dates and times are said as words
instead ("March fifteenth, twenty twenty-four", "ten thirty A M"); an impossible one (month 13,
"25:00") is left as written, for the number rules that run later.
"""

from __future__ import annotations

import re

from ttsvc.text.abbreviations import kept_period
from ttsvc.text.number_words import ONES, cardinal, ordinalize, year_words

__all__ = [
    "HOUR_AMPM_RE",
    "ISO_DATE_RE",
    "MONTH_DAY_RE",
    "TIME_RE",
    "US_DATE_RE",
    "render_date",
    "render_hour_ampm",
    "render_month_day",
    "render_time",
]

_MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)  # fmt: skip
_DAYS_IN_MONTH = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)

ISO_DATE_RE = re.compile(r"(?<![0-9\-./])(?P<y>[0-9]{4})-(?P<mo>[0-9]{2})-(?P<d>[0-9]{2})(?![0-9])")
US_DATE_RE = re.compile(
    r"(?<![0-9/.])(?P<mo>[0-9]{1,2})/(?P<d>[0-9]{1,2})/(?P<y>[0-9]{4})(?![0-9/])"
)
_AMPM = r"(?P<ampm>[AaPp]\.[Mm]\.|[AaPp][Mm](?![A-Za-z0-9]))"
TIME_RE = re.compile(
    r"(?<![0-9:.,])(?P<h>[0-9]{1,2}):(?P<m>[0-5][0-9])(?::(?P<s>[0-5][0-9]))?(?![0-9:])"
    rf"(?:\s?{_AMPM})?"
)
HOUR_AMPM_RE = re.compile(rf"(?<![0-9:.,])(?P<h>[0-9]{{1,2}})\s?{_AMPM}")

MONTH_DAY_RE = re.compile(
    r"\b(?P<mon>" + "|".join(_MONTHS) + r") (?P<d>[0-9]{1,2})(?i:st|nd|rd|th)?"
    r"(?![0-9A-Za-z]|[.,][0-9])(?:,? (?P<y>[0-9]{4})(?![0-9]))?"
)


def render_date(match: re.Match[str]) -> str | None:
    year, month, day = int(match["y"]), int(match["mo"]), int(match["d"])
    if not (1 <= month <= 12 and 1 <= day <= _DAYS_IN_MONTH[month - 1]):
        return None
    return f"{_MONTHS[month - 1]} {ordinalize(cardinal(day))}, {year_words(year)}"


def _ampm_words(match: re.Match[str]) -> str:
    ampm = match["ampm"]
    words = " A M" if ampm[0] in "Aa" else " P M"
    if "." in ampm:
        words += kept_period(match.string, match.end(), terminal=True)
    return words


def render_time(match: re.Match[str]) -> str | None:
    hour, minute = int(match["h"]), int(match["m"])
    if hour > (12 if match["ampm"] else 24) or (match["ampm"] and hour == 0):
        return None
    words = cardinal(hour)
    if minute == 0:
        words += "" if match["ampm"] else " o'clock"
    elif minute < 10:
        words += f" oh {ONES[minute]}"
    else:
        words += f" {cardinal(minute)}"
    if match["s"] is not None and int(match["s"]) > 0:
        seconds = int(match["s"])
        words += f" and {cardinal(seconds)} second{'' if seconds == 1 else 's'}"
    if match["ampm"]:
        words += _ampm_words(match)
    return words


def render_hour_ampm(match: re.Match[str]) -> str | None:
    hour = int(match["h"])
    if not 1 <= hour <= 12:
        return None
    return cardinal(hour) + _ampm_words(match)


def render_month_day(match: re.Match[str]) -> str | None:
    day = int(match["d"])
    month = _MONTHS.index(match["mon"])
    if not 1 <= day <= _DAYS_IN_MONTH[month]:
        return None
    words = f"{match['mon']} {ordinalize(cardinal(day))}"
    if match["y"]:
        words += f", {year_words(int(match['y']))}"
    return words

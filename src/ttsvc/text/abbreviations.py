"""Abbreviations, dotted acronyms and initials: "Dr. Smith", "Elm St.", "etc.", "U.S.A.",
"J. R. R. Tolkien", "No. 5".

Why this exists: to espeak-ng the dot of "Dr." looks like the end of a sentence. Expanding an
abbreviation removes its dot so "Dr. Smith" is not cut in two; :func:`kept_period` keeps a
terminal period only where the abbreviation really ends the sentence (:mod:`ttsvc.text.dates`
uses it for "a.m." and "p.m." too).
"""

from __future__ import annotations

import re

__all__ = [
    "ABBREVIATION_RE",
    "ACRONYM_RE",
    "BARE_VS_RE",
    "INITIALS_RE",
    "NUMBER_ABBR_RE",
    "kept_period",
    "render_abbreviation",
    "render_acronym",
    "render_initials",
]

_CLOSERS = "\"'”’)]»"
_OPENERS = "\"'“‘(["

_ABBREVIATIONS = {
    "Mr": "Mister",
    "Mrs": "Missus",
    "Ms": "Miz",
    "Prof": "Professor",
    "Mt": "Mount",
    "Capt": "Captain",
    "Lt": "Lieutenant",
    "Sgt": "Sergeant",
    "Gov": "Governor",
    "Rev": "Reverend",
    "Ft": "Fort",
    "Jr": "Junior",
    "Sr": "Senior",
    "Ave": "Avenue",
    "Blvd": "Boulevard",
    "Rd": "Road",
    "Inc": "Incorporated",
    "Ltd": "Limited",
    "Corp": "Corporation",
    "Dept": "Department",
    "etc": "et cetera",
    "vs": "versus",
    "approx": "approximately",
    "e.g": "for example",
    "i.e": "that is",
    "a.m": "A M",
    "p.m": "P M",
    "Jan": "January",
    "Feb": "February",
    "Mar": "March",
    "Apr": "April",
    "Jun": "June",
    "Jul": "July",
    "Aug": "August",
    "Sep": "September",
    "Sept": "September",
    "Oct": "October",
    "Nov": "November",
    "Dec": "December",
    # Resolved by context in render_abbreviation.
    "Dr": "",
    "St": "",
}
# Abbreviations that often close a sentence ("..., etc. Then"): these keep a period when the next
# word is capitalized. Titles and months precede what they qualify, so they never do.
_TERMINAL_ABBREVIATIONS = frozenset(
    {"Jr", "Sr", "Ave", "Blvd", "Rd", "Inc", "Ltd", "Corp", "Dept", "etc", "a.m", "p.m"}
)
ABBREVIATION_RE = re.compile(
    r"(?<![\w.])(?P<abbr>"
    + "|".join(re.escape(a) for a in sorted(_ABBREVIATIONS, key=len, reverse=True))
    + r")\."
)
BARE_VS_RE = re.compile(r"(?<![\w.])vs(?![\w.])")
NUMBER_ABBR_RE = re.compile(r"(?<![\w.])No\.(?=\s?[0-9])")
ACRONYM_RE = re.compile(r"(?<![\w.])[A-Z]\.(?:[A-Z]\.)+")
INITIALS_RE = re.compile(r"(?<![\w.'’])(?:[A-Z]\. ){1,8}(?=[A-Z])")


def kept_period(text: str, end: int, terminal: bool) -> str:
    """The period to keep after an expanded abbreviation whose dot ended at ``end``.

    At the very end of the text the dot was also the full stop. Mid-text it is only kept for
    abbreviations that commonly close a sentence, when a capitalized word follows.
    """
    i, n = end, len(text)
    while i < n and text[i] in _CLOSERS:
        i += 1
    if i == n:
        return "."
    if not terminal or not text[i].isspace():
        return ""
    j = i + 1
    if j < n and text[j] in _OPENERS:
        j += 1
    return "." if j < n and text[j].isupper() else ""


def _word_before(text: str, start: int) -> tuple[str, bool]:
    """The word just before ``start`` (one space apart) and whether it opens a sentence."""
    i = start - 1
    if i >= 0 and text[i] == " ":
        i -= 1
    end = i + 1
    limit = max(0, end - 40)
    while i >= limit and text[i].isalpha():
        i -= 1
    word = text[i + 1 : end]
    k = i
    while k >= 0 and text[k] == " ":
        k -= 1
    return word, k < 0 or text[k] in ".!?"


def _next_is_capitalized(text: str, end: int) -> bool:
    return end + 1 < len(text) and text[end] == " " and text[end + 1].isupper()


def render_abbreviation(match: re.Match[str]) -> str:
    abbr, text = match["abbr"], match.string
    expansion = _ABBREVIATIONS[abbr]
    terminal = abbr in _TERMINAL_ABBREVIATIONS
    if abbr in ("St", "Dr"):
        # "St. Louis" / "Dr. Smith" precede a name; "Elm St." / "Oak Dr." follow one. A capitalized
        # word before means the street reading, unless that word merely opens the sentence and a
        # name follows ("Call Dr. Smith").
        previous, opens_sentence = _word_before(text, match.start())
        next_capitalized = _next_is_capitalized(text, match.end())
        after_name = previous[:1].isupper() and (not opens_sentence or not next_capitalized)
        street = after_name or not next_capitalized
        if abbr == "St":
            expansion = "Street" if street else "Saint"
        else:
            expansion = "Drive" if after_name else "Doctor"
        terminal = after_name or (abbr == "St" and street)
    return expansion + kept_period(text, match.end(), terminal)


def render_acronym(match: re.Match[str]) -> str:
    letters = " ".join(match.group(0).replace(".", ""))
    return letters + kept_period(match.string, match.end(), terminal=False)


def render_initials(match: re.Match[str]) -> str | None:
    run = match.group(0)
    previous, _ = _word_before(match.string, match.start())
    # "J. R. R. Tolkien", "John F. Kennedy": the dots are not sentence ends. A lone letter after a
    # lowercase word ("plan B. Then") may well end the sentence, so it keeps its dot.
    if run.count(".") >= 2 or (len(previous) >= 2 and previous[0].isupper()):
        return run.replace(".", "")
    return None

"""English (en-US) text normalization, run before the espeak-ng phonemizer.

Why this exists: the voice only ever hears what espeak-ng (through piper-phonemize) makes of the
text, and espeak-ng reads many written forms the way nobody says them: "$3.50" comes out roughly as
"dollar three point five zero", "Dr." looks like the end of a sentence, "1,234" is read as two
numbers, "2024-03-15" as a subtraction, and a stray "*", "#" or emoji may be spoken as a symbol
name or derail the intonation. Rewriting those forms into the words a person would say, before
phonemization, is cheaper and far more predictable than patching espeak's rules.

This module is the pipeline: the public entry points and the order in which the rules apply. The
rules live in sibling modules, one concern each: :mod:`ttsvc.text.dates` (dates, times of day),
:mod:`ttsvc.text.abbreviations` (abbreviations, acronyms, initials), :mod:`ttsvc.text.money`,
:mod:`ttsvc.text.numerals` (every other numeric form), :mod:`ttsvc.text.characters` (Unicode
clean-up, symbols) and :mod:`ttsvc.text.espeak_guards` (shapes that crash espeak-ng), on top of
:mod:`ttsvc.text.number_words` (the words) and :mod:`ttsvc.text.tracked` (source spans).

Constraints the normalization keeps, in this module and in each rule module:

* Pure and deterministic, no IO, and it never raises on any Unicode input: the text comes straight
  from API clients, so anything a client can send must produce *some* string.
* Linear-ish time. Every pattern is anchored (look-behinds stop a match starting inside a run) so
  nothing backtracks catastrophically on long adversarial input.
* Sentence punctuation (. , ; : ! ? and quotes) survives, because the phonemizer turns it into
  pauses and intonation and the segmenter splits on it. Expanding an abbreviation removes its dot
  so "Dr. Smith" is not cut in two; a terminal period is kept only where the abbreviation really
  ends the sentence.
* Text espeak already reads well (plain words, small integers) passes through unchanged, so the
  pass is idempotent on its own output.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from ttsvc.errors import NothingToSay
from ttsvc.text.abbreviations import (
    ABBREVIATION_RE,
    ACRONYM_RE,
    BARE_VS_RE,
    INITIALS_RE,
    NUMBER_ABBR_RE,
    render_abbreviation,
    render_acronym,
    render_initials,
)
from ttsvc.text.characters import (
    DEGREES_RE,
    SYMBOL_RE,
    WS_RE,
    clean,
    drop_unspeakable,
    render_degrees,
    render_symbol,
)
from ttsvc.text.dates import (
    HOUR_AMPM_RE,
    ISO_DATE_RE,
    MONTH_DAY_RE,
    TIME_RE,
    US_DATE_RE,
    render_date,
    render_hour_ampm,
    render_month_day,
    render_time,
)
from ttsvc.text.espeak_guards import bound_dotted_letters, bound_words
from ttsvc.text.money import CURRENCY_RE, TRAILING_CURRENCY_RE, render_currency
from ttsvc.text.numerals import (
    DECADE_RE,
    FRACTION_RE,
    HASH_NUMBER_RE,
    LEADING_DOT_DECIMAL_RE,
    NUMBER_RE,
    ORDINAL_RE,
    PERCENT_RE,
    render_decade,
    render_fraction,
    render_leading_dot_decimal,
    render_number,
    render_ordinal,
    render_percent,
)
from ttsvc.text.tracked import Edit, Normalized, Span, Tracked

__all__ = [
    "has_speakable",
    "normalize",
    "normalize_mapped",
    "require_speakable",
    "require_speakable_mapped",
]

_SPACE_BEFORE_PUNCT_RE = re.compile(r" +(?=[.,;:!?])")
_WORD_COMMA_RE = re.compile(r"(?<=[A-Za-z]),(?=[A-Za-z])")

Render = Callable[["re.Match[str]"], "str | None"]


def _substitute(pattern: re.Pattern[str], render: Render, text: Tracked) -> None:
    """Replace each match with its spoken form, keeping words apart ("B12" -> "B twelve").

    ``render`` returns None to leave a match as written (an impossible date, say).
    """
    edits: list[Edit] = []
    for match in pattern.finditer(text.text):
        spoken = render(match)
        if spoken is None:
            continue
        source, start, end = match.string, match.start(), match.end()
        if start > 0 and source[start - 1].isalnum():
            spoken = " " + spoken
        if end < len(source) and source[end].isalnum():
            spoken += " "
        edits.append((start, end, spoken))
    text.edit(edits)


# --------------------------------------------------------------------------------------------------
# Public API.

# Order matters: the specific forms (dates, times, money, ...) must see their digits before the
# generic number pass turns every remaining digit run into words.
_PASSES: tuple[tuple[re.Pattern[str], Render], ...] = (
    (ISO_DATE_RE, render_date),
    (US_DATE_RE, render_date),
    (TIME_RE, render_time),
    (HOUR_AMPM_RE, render_hour_ampm),
    (NUMBER_ABBR_RE, lambda _m: "number"),
    (ABBREVIATION_RE, render_abbreviation),
    (BARE_VS_RE, lambda _m: "versus"),
    (ACRONYM_RE, render_acronym),
    (INITIALS_RE, render_initials),
    (MONTH_DAY_RE, render_month_day),
    (CURRENCY_RE, render_currency),
    (TRAILING_CURRENCY_RE, render_currency),
    (PERCENT_RE, render_percent),
    (ORDINAL_RE, render_ordinal),
    (DECADE_RE, render_decade),
    (HASH_NUMBER_RE, lambda _m: "number"),
    (FRACTION_RE, render_fraction),
    (LEADING_DOT_DECIMAL_RE, render_leading_dot_decimal),
    (NUMBER_RE, render_number),
    (DEGREES_RE, render_degrees),
    (SYMBOL_RE, render_symbol),
)


def normalize(text: str) -> str:
    """Rewrite ``text`` as the words an en-US speaker would say, ready for espeak-ng.

    Never raises; may return "" when nothing speakable is left (see :func:`require_speakable`).
    """
    return _normalize(Tracked(text, track=False)).text


def normalize_mapped(text: str) -> Normalized:
    """``normalize(text)`` with the span of ``text`` each of its characters came from."""
    tracked = _normalize(Tracked(text))
    return Normalized(tracked.text, tuple(tracked.spans))


def _normalize(tracked: Tracked) -> Tracked:
    clean(tracked)
    for pattern, render in _PASSES:
        _substitute(pattern, render, tracked)
    drop_unspeakable(tracked)
    tracked.sub(WS_RE, " ")
    tracked.sub(_SPACE_BEFORE_PUNCT_RE, "")
    # "1,2,3" became "one,two,three": give the phonemizer the pause a reader would make.
    tracked.sub(_WORD_COMMA_RE, ", ")
    tracked.nfc()
    tracked.strip()
    bound_words(tracked)
    bound_dotted_letters(tracked)
    return tracked


def _speakable(normalized: str) -> bool:
    return any(ch.isalnum() for ch in normalized)


def has_speakable(text: str) -> bool:
    """Whether ``text`` leaves at least one letter or digit (any script) once normalized."""
    return _speakable(normalize(text))


def require_speakable(text: str) -> str:
    """``normalize(text)``, or :class:`NothingToSay` when there is nothing left to speak.

    Raised up front, before any engine runs: the gateway answers such a request with a short
    silence marked ``empty_text`` (or a 422 where the caller asked ``empty_text: "error"``)
    rather than a stream that never ends its first chunk.
    """
    return require_speakable_mapped(text, track=False).text


def require_speakable_mapped(
    text: str, track: bool = True, spans: Sequence[Span] | None = None
) -> Normalized:
    """``normalize_mapped(text)`` (spans only if ``track``), or :class:`NothingToSay`.

    ``spans``: where each character of ``text`` came from, when that is not ``text`` itself
    (an SSML document's text pieces: the spans point into the document)."""
    start = Tracked(text, track)
    if track and spans is not None:
        start.spans = list(spans)
    tracked = _normalize(start)
    if not _speakable(tracked.text):
        raise NothingToSay("text has nothing to speak after normalization", field="text")
    return Normalized(tracked.text, tuple(tracked.spans))

"""English (en-US) text normalization, run before the espeak-ng phonemizer.

Why this exists: the voice only ever hears what espeak-ng (through piper-phonemize) makes of the
text, and espeak-ng reads many written forms the way nobody says them: "$3.50" comes out roughly as
"dollar three point five zero", "Dr." looks like the end of a sentence, "1,234" is read as two
numbers, "2024-03-15" as a subtraction, and a stray "*", "#" or emoji may be spoken as a symbol
name or derail the intonation. Rewriting those forms into the words a person would say, before
phonemization, is cheaper and far more predictable than patching espeak's rules.

Constraints this module keeps:

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

import itertools
import re
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ttsvc.errors import NothingToSay

__all__ = [
    "Normalized",
    "has_speakable",
    "normalize",
    "normalize_mapped",
    "require_speakable",
    "require_speakable_mapped",
]

# --------------------------------------------------------------------------------------------------
# Number words. Written here rather than pulled from num2words: it is ~60 lines and the service
# should not grow a dependency (and its locale machinery) for one language.

_ONES = (
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
# Stand-alone integers this short are left as digits: espeak-ng says them right.
_PLAIN_INTEGER_DIGITS = 3

_ORDINAL_IRREGULAR = {
    "one": "first",
    "two": "second",
    "three": "third",
    "five": "fifth",
    "eight": "eighth",
    "nine": "ninth",
    "twelve": "twelfth",
}
_MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)  # fmt: skip
_DAYS_IN_MONTH = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _two_digits(n: int) -> str:
    if n < 20:
        return _ONES[n]
    tens, ones = divmod(n, 10)
    return _TENS[tens] if ones == 0 else f"{_TENS[tens]}-{_ONES[ones]}"


def _three_digits(n: int) -> str:
    hundreds, rest = divmod(n, 100)
    if not hundreds:
        return _two_digits(rest)
    head = f"{_ONES[hundreds]} hundred"
    return head if rest == 0 else f"{head} {_two_digits(rest)}"


def _digits(digits: str) -> str:
    return " ".join(_ONES[ord(c) - 48] for c in digits)


def _cardinal(n: int) -> str:
    if n < 0:
        return f"minus {_cardinal(-n)}"
    if n == 0:
        return "zero"
    if n >= 10**_MAX_CARDINAL_DIGITS:
        return _digits(str(n))
    parts: list[str] = []
    for value, name in _SCALES:
        count, n = divmod(n, value)
        if count:
            parts.append(f"{_three_digits(count)} {name}")
    if n:
        parts.append(_three_digits(n))
    return " ".join(parts)


def _integer_words(digits: str) -> str:
    """Words for an ASCII digit string that may carry thousands commas."""
    plain = digits.replace(",", "")
    # A leading zero ("007", "0042") marks a code, not a quantity; so does sheer length.
    if (len(plain) > 1 and plain[0] == "0") or len(plain) > _MAX_CARDINAL_DIGITS:
        return _digits(plain)
    return _cardinal(int(plain))


def _number_phrase(int_part: str, frac: str | None) -> str:
    words = _integer_words(int_part)
    return words if not frac else f"{words} point {_digits(frac)}"


def _year_words(n: int) -> str:
    if 2000 <= n <= 2009 or n % 1000 == 0 or not 1000 <= n <= 9999:
        return _cardinal(n)
    century, rest = divmod(n, 100)
    if rest == 0:
        return f"{_two_digits(century)} hundred"
    if rest < 10:
        return f"{_two_digits(century)} oh {_ONES[rest]}"
    return f"{_two_digits(century)} {_two_digits(rest)}"


def _is_year(n: int) -> bool:
    # 2000-2009 read as plain cardinals anyway ("two thousand five"), so one range covers all.
    return 1100 <= n <= 2099


def _split_last_word(words: str) -> tuple[str, str]:
    cut = max(words.rfind(" "), words.rfind("-")) + 1
    return words[:cut], words[cut:]


def _ordinalize(words: str) -> str:
    head, last = _split_last_word(words)
    if last in _ORDINAL_IRREGULAR:
        return head + _ORDINAL_IRREGULAR[last]
    if last.endswith("y"):
        return f"{head}{last[:-1]}ieth"
    return f"{head}{last}th"


def _pluralize(words: str) -> str:
    head, last = _split_last_word(words)
    if last.endswith("y"):
        return f"{head}{last[:-1]}ies"
    if last.endswith("x"):
        return f"{head}{last}es"
    return f"{head}{last}s"



# --------------------------------------------------------------------------------------------------
# Source spans. Word timestamps name the span of the request text each spoken word came from, so
# every rewrite below edits a ``_Tracked`` text that keeps, per character, the span of the
# original text it stands for: kept characters keep theirs, a rewritten match ("$12.50" ->
# "twelve dollars and fifty cents") gives each of its new characters the span of the whole match.

Span = tuple[int, int]
Edit = tuple[int, int, str]
"""Replace ``text[start:end]`` with the string."""


@dataclass(frozen=True)
class Normalized:
    """Normalized text with, per character, the ``[start, end)`` span of the text it came from."""

    text: str
    spans: tuple[Span, ...]

    def source(self, start: int, end: int) -> Span:
        """The span of the original text that ``text[start:end]`` came from."""
        if start >= end:
            at = self.spans[start][0] if start < len(self.spans) else self._end()
            return at, at
        covered = self.spans[start:end]
        return min(a for a, _ in covered), max(b for _, b in covered)

    def _end(self) -> int:
        return self.spans[-1][1] if self.spans else 0


_WORD_RE = re.compile(r"\w+")


class _Tracked:
    """A text being rewritten, with the source span of each of its characters (``track``; not
    kept otherwise: plain ``normalize`` pays nothing for them)."""

    def __init__(self, text: str, track: bool = True) -> None:
        self.text = text
        self.track = track
        self.spans: list[Span] = [(i, i + 1) for i in range(len(text))] if track else []

    def edit(self, edits: Iterable[Edit]) -> None:
        """Apply non-overlapping ``edits`` in increasing order of position."""
        out: list[str] = []
        spans: list[Span] = []
        pos = 0
        for start, end, new in edits:
            out.append(self.text[pos:start])
            out.append(new)
            if self.track:
                spans.extend(self.spans[pos:start])
                spans.extend(self._new_spans(start, end, new))
            pos = end
        if not out:
            return
        out.append(self.text[pos:])
        self.text = "".join(out)
        if self.track:
            spans.extend(self.spans[pos:])
            self.spans = spans

    def _new_spans(self, start: int, end: int, new: str) -> list[Span]:
        """Spans for ``new`` replacing ``text[start:end]``: a word of ``new`` written the same in
        the replaced text keeps its own span ("J. R." -> "J R"), anything else the whole's."""
        if start < end:
            covered = self.spans[start:end]
            whole = (min(a for a, _ in covered), max(b for _, b in covered))
        else:  # an insertion: zero width where it was inserted
            at = self.spans[start][0] if start < len(self.spans) else (
                self.spans[-1][1] if self.spans else 0)  # fmt: skip
            whole = (at, at)
        spans = [whole] * len(new)
        old, cursor = self.text[start:end], 0
        for word in _WORD_RE.finditer(new):
            found = old.find(word.group(0), cursor)
            if found < 0:
                continue
            for k in range(len(word.group(0))):
                spans[word.start() + k] = self.spans[start + found + k]
            cursor = found + len(word.group(0))
        return spans

    def sub(self, pattern: re.Pattern[str], repl: str | Callable[[re.Match[str]], str]) -> None:
        """``pattern.sub(repl, text)``, tracked."""
        render = repl if callable(repl) else (lambda _m: repl)
        self.edit((m.start(), m.end(), render(m)) for m in pattern.finditer(self.text))

    def chars(self, mapping: Callable[[str], str | None]) -> None:
        """Replace single characters: ``mapping`` gives the replacement, ``None`` to keep one."""
        edits = []
        for i, ch in enumerate(self.text):
            new = mapping(ch)
            if new is not None and new != ch:
                edits.append((i, i + 1, new))
        self.edit(edits)

    def strip(self) -> None:
        kept = self.text.strip()
        if kept == self.text:
            return
        start = len(self.text) - len(self.text.lstrip())
        self.edit([(0, start, ""), (start + len(kept), len(self.text), "")])

    def nfc(self) -> None:
        """Unicode NFC, run by runs that start at a character of combining class 0 (only those
        change); the whole text at once where that would not give NFC's exact result."""
        target = unicodedata.normalize("NFC", self.text)
        if target == self.text:
            return
        if not self.track:
            self.text = target
            return
        edits: list[Edit] = []
        starts = [i for i, ch in enumerate(self.text) if unicodedata.combining(ch) == 0]
        bounds = [0, *[i for i in starts if i > 0], len(self.text)]
        for a, b in itertools.pairwise(bounds):
            run = self.text[a:b]
            composed = unicodedata.normalize("NFC", run)
            if composed != run:
                edits.append((a, b, composed))
        trial = _Tracked(self.text)
        trial.spans = list(self.spans)
        trial.edit(edits)
        if trial.text != target:
            trial = _Tracked(self.text)
            trial.spans = list(self.spans)
            trial.edit([(0, len(self.text), target)])
        self.text, self.spans = trial.text, trial.spans


# --------------------------------------------------------------------------------------------------
# Patterns. ASCII digits only: digits of other scripts are left for espeak's own language rules.

_INT = r"(?:[0-9]{1,3}(?:,[0-9]{3})+(?!,?[0-9])|[0-9]+)"
# A minus sign only where it cannot be a hyphen: not after a word, a dot or another dash.
_NEG = r"(?P<neg>(?<![\w.\-])-)?"
_CLOSERS = "\"'”’)]»"
_OPENERS = "\"'“‘(["

_WS_RE = re.compile(r"\s+")
_SPACE_BEFORE_PUNCT_RE = re.compile(r" +(?=[.,;:!?])")
_WORD_COMMA_RE = re.compile(r"(?<=[A-Za-z]),(?=[A-Za-z])")

_ISO_DATE_RE = re.compile(
    r"(?<![0-9\-./])(?P<y>[0-9]{4})-(?P<mo>[0-9]{2})-(?P<d>[0-9]{2})(?![0-9])"
)
_US_DATE_RE = re.compile(
    r"(?<![0-9/.])(?P<mo>[0-9]{1,2})/(?P<d>[0-9]{1,2})/(?P<y>[0-9]{4})(?![0-9/])"
)
_AMPM = r"(?P<ampm>[AaPp]\.[Mm]\.|[AaPp][Mm](?![A-Za-z0-9]))"
_TIME_RE = re.compile(
    r"(?<![0-9:.,])(?P<h>[0-9]{1,2}):(?P<m>[0-5][0-9])(?::(?P<s>[0-5][0-9]))?(?![0-9:])"
    rf"(?:\s?{_AMPM})?"
)
_HOUR_AMPM_RE = re.compile(rf"(?<![0-9:.,])(?P<h>[0-9]{{1,2}})\s?{_AMPM}")

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
    # Resolved by context in _render_abbreviation.
    "Dr": "",
    "St": "",
}
# Abbreviations that often close a sentence ("..., etc. Then"): these keep a period when the next
# word is capitalized. Titles and months precede what they qualify, so they never do.
_TERMINAL_ABBREVIATIONS = frozenset(
    {"Jr", "Sr", "Ave", "Blvd", "Rd", "Inc", "Ltd", "Corp", "Dept", "etc", "a.m", "p.m"}
)
_ABBREVIATION_RE = re.compile(
    r"(?<![\w.])(?P<abbr>"
    + "|".join(re.escape(a) for a in sorted(_ABBREVIATIONS, key=len, reverse=True))
    + r")\."
)
_BARE_VS_RE = re.compile(r"(?<![\w.])vs(?![\w.])")
_NUMBER_ABBR_RE = re.compile(r"(?<![\w.])No\.(?=\s?[0-9])")
_ACRONYM_RE = re.compile(r"(?<![\w.])[A-Z]\.(?:[A-Z]\.)+")
_INITIALS_RE = re.compile(r"(?<![\w.'’])(?:[A-Z]\. ){1,8}(?=[A-Z])")
_MONTH_DAY_RE = re.compile(
    r"\b(?P<mon>" + "|".join(_MONTHS) + r") (?P<d>[0-9]{1,2})(?i:st|nd|rd|th)?"
    r"(?![0-9A-Za-z]|[.,][0-9])(?:,? (?P<y>[0-9]{4})(?![0-9]))?"
)

_CURRENCY = {
    "$": ("dollar", "dollars", "cent", "cents"),
    "€": ("euro", "euros", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
    "¥": ("yen", "yen", "", ""),
    "₹": ("rupee", "rupees", "paisa", "paise"),
}
_SCALE_ABBR = {"k": "thousand", "K": "thousand", "M": "million", "mn": "million", "B": "billion",
               "bn": "billion"}  # fmt: skip
_CURRENCY_RE = re.compile(
    rf"{_NEG}(?P<sym>[$€£¥₹])\s?(?P<int>{_INT})(?:\.(?P<frac>[0-9]+))?"
    r"(?:\s(?P<word>(?i:thousand|million|billion|trillion))(?![A-Za-z])"
    r"|(?P<abbr>k|K|M|B|bn|mn)(?![A-Za-z0-9]))?"
)
# "5 €" / "5€": the usual European order.
_TRAILING_CURRENCY_RE = re.compile(
    rf"{_NEG}(?<![0-9.,])(?P<int>{_INT})(?:\.(?P<frac>[0-9]+))?\s?(?P<sym>[€£¥₹])(?![\w$€£¥₹])"
)
_PERCENT_RE = re.compile(rf"{_NEG}(?<![0-9.,])(?P<int>{_INT})(?:\.(?P<frac>[0-9]+))?\s?%")
_ORDINAL_RE = re.compile(
    r"(?<![0-9.,])(?P<int>[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?i:st|nd|rd|th)(?![A-Za-z0-9])"
)
_DECADE_RE = re.compile(r"(?<![\w.,])['’]?(?P<int>[1-9][0-9]{0,2}0)s(?![A-Za-z0-9])")
_HASH_NUMBER_RE = re.compile(r"#\s?(?=[0-9])")
_FRACTION_RE = re.compile(r"(?<![0-9/.,])(?P<n>[0-9]{1,3})/(?P<d>[0-9]{1,3})(?![0-9/])")
_LEADING_DOT_DECIMAL_RE = re.compile(r"(?<![\w.])\.(?P<frac>[0-9]+)")
_NUMBER_RE = re.compile(rf"(?<![0-9]){_NEG}(?P<int>{_INT})(?P<frac>(?:\.[0-9]+)+)?")
_DEGREES_RE = re.compile(r"°\s?(?P<unit>[CF])(?![A-Za-z])")
_SYMBOL_RE = re.compile(r"[&+=@×°]")
_SYMBOL_WORDS = {"&": "and", "+": "plus", "=": "equals", "@": "at", "×": "times", "°": "degrees"}

# Punctuation espeak may name aloud ("asterisk", "slash") or that carries no prosody; the
# symbols it expands have been turned into words by the time this is applied.
_DROP_PUNCTUATION = frozenset("#%*/\\_|~^`<>{}§¶†‡•‰‱′″‴※·")

Render = Callable[["re.Match[str]"], "str | None"]


def _substitute(pattern: re.Pattern[str], render: Render, text: _Tracked) -> None:
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


def _kept_period(text: str, end: int, terminal: bool) -> str:
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


# --------------------------------------------------------------------------------------------------
# Renderers, one per written form.


def _render_date(match: re.Match[str]) -> str | None:
    year, month, day = int(match["y"]), int(match["mo"]), int(match["d"])
    if not (1 <= month <= 12 and 1 <= day <= _DAYS_IN_MONTH[month - 1]):
        return None
    return f"{_MONTHS[month - 1]} {_ordinalize(_cardinal(day))}, {_year_words(year)}"


def _ampm_words(match: re.Match[str]) -> str:
    ampm = match["ampm"]
    words = " A M" if ampm[0] in "Aa" else " P M"
    if "." in ampm:
        words += _kept_period(match.string, match.end(), terminal=True)
    return words


def _render_time(match: re.Match[str]) -> str | None:
    hour, minute = int(match["h"]), int(match["m"])
    if hour > (12 if match["ampm"] else 24) or (match["ampm"] and hour == 0):
        return None
    words = _cardinal(hour)
    if minute == 0:
        words += "" if match["ampm"] else " o'clock"
    elif minute < 10:
        words += f" oh {_ONES[minute]}"
    else:
        words += f" {_cardinal(minute)}"
    if match["s"] is not None and int(match["s"]) > 0:
        seconds = int(match["s"])
        words += f" and {_cardinal(seconds)} second{'' if seconds == 1 else 's'}"
    if match["ampm"]:
        words += _ampm_words(match)
    return words


def _render_hour_ampm(match: re.Match[str]) -> str | None:
    hour = int(match["h"])
    if not 1 <= hour <= 12:
        return None
    return _cardinal(hour) + _ampm_words(match)


def _render_abbreviation(match: re.Match[str]) -> str:
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
    return expansion + _kept_period(text, match.end(), terminal)


def _render_acronym(match: re.Match[str]) -> str:
    letters = " ".join(match.group(0).replace(".", ""))
    return letters + _kept_period(match.string, match.end(), terminal=False)


def _render_initials(match: re.Match[str]) -> str | None:
    run = match.group(0)
    previous, _ = _word_before(match.string, match.start())
    # "J. R. R. Tolkien", "John F. Kennedy": the dots are not sentence ends. A lone letter after a
    # lowercase word ("plan B. Then") may well end the sentence, so it keeps its dot.
    if run.count(".") >= 2 or (len(previous) >= 2 and previous[0].isupper()):
        return run.replace(".", "")
    return None


def _render_month_day(match: re.Match[str]) -> str | None:
    day = int(match["d"])
    month = _MONTHS.index(match["mon"])
    if not 1 <= day <= _DAYS_IN_MONTH[month]:
        return None
    words = f"{match['mon']} {_ordinalize(_cardinal(day))}"
    if match["y"]:
        words += f", {_year_words(int(match['y']))}"
    return words


def _render_currency(match: re.Match[str]) -> str:
    one, many, sub_one, sub_many = _CURRENCY[match["sym"]]
    int_part, frac = match["int"], match["frac"]
    groups = match.groupdict()
    scale = groups.get("word") or groups.get("abbr")
    minus = "minus " if match["neg"] else ""
    if scale:
        scale_word = _SCALE_ABBR.get(scale, scale.lower())
        return f"{minus}{_number_phrase(int_part, frac)} {scale_word} {many}"
    if frac is None:
        unit = one if int_part == "1" else many
        return f"{minus}{_integer_words(int_part)} {unit}"
    if len(frac) > 2 or not sub_one:
        return f"{minus}{_number_phrase(int_part, frac)} {many}"
    whole = int(int_part.replace(",", ""))
    cents = int(frac.ljust(2, "0"))
    whole_words = f"{_integer_words(int_part)} {one if whole == 1 else many}"
    cents_words = f"{_cardinal(cents)} {sub_one if cents == 1 else sub_many}"
    if cents == 0:
        return minus + whole_words
    if whole == 0:
        return minus + cents_words
    return f"{minus}{whole_words} and {cents_words}"


def _render_percent(match: re.Match[str]) -> str:
    minus = "minus " if match["neg"] else ""
    return f"{minus}{_number_phrase(match['int'], match['frac'])} percent"


def _render_ordinal(match: re.Match[str]) -> str:
    return _ordinalize(_integer_words(match["int"]))


def _render_decade(match: re.Match[str]) -> str:
    n = int(match["int"])
    words = _year_words(n) if len(match["int"]) == 4 and _is_year(n) else _cardinal(n)
    return _pluralize(words)


def _render_fraction(match: re.Match[str]) -> str:
    num, den = int(match["n"]), int(match["d"])
    if 0 < num < den <= 10 and match["n"][0] != "0" and match["d"][0] != "0":
        if den == 2:
            unit = "half" if num == 1 else "halves"
        elif den == 4:
            unit = "quarter" if num == 1 else "quarters"
        else:
            unit = _ordinalize(_cardinal(den)) + ("" if num == 1 else "s")
        return f"{_cardinal(num)} {unit}"
    # "24/7", "50/50": said as two numbers.
    return f"{_integer_words(match['n'])} {_integer_words(match['d'])}"


def _render_leading_dot_decimal(match: re.Match[str]) -> str:
    return f"point {_digits(match['frac'])}"


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


def _render_number(match: re.Match[str]) -> str | None:
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
        if not minus and len(int_part) == 4 and int_part[0] != "0" and _is_year(int(int_part)):
            return _year_words(int(int_part))
        return minus + _integer_words(int_part)
    parts = frac[1:].split(".")
    if len(parts) == 1:
        return minus + _number_phrase(int_part, parts[0])
    # Versions and addresses ("1.2.3"): each part is its own number.
    return minus + " point ".join([_integer_words(int_part), *map(_integer_words, parts)])


def _render_degrees(match: re.Match[str]) -> str:
    return " degrees Celsius " if match["unit"] == "C" else " degrees Fahrenheit "


def _render_symbol(match: re.Match[str]) -> str:
    return f" {_SYMBOL_WORDS[match.group(0)]} "


# --------------------------------------------------------------------------------------------------
# Character-level passes.


def _is_selector(ch: str) -> bool:
    # Variation selectors only pick emoji or text presentation; keycap and other enclosing marks
    # (category Me) only decorate. Removed first so "7\ufe0f\u20e3" is just "7".
    return 0xFE00 <= ord(ch) <= 0xFE0F or 0xE0100 <= ord(ch) <= 0xE01EF


def _clean(text: _Tracked) -> None:
    """NFC; controls, invisible format characters and selectors out; whitespace folded."""
    text.nfc()
    edits: list[Edit] = []
    on_letter = False
    for i, ch in enumerate(text.text):
        category = unicodedata.category(ch)
        if ch.isspace():
            if ch != " ":
                edits.append((i, i + 1, " "))
        elif category in ("Cc", "Cf", "Cs", "Me") or _is_selector(ch):
            edits.append((i, i + 1, ""))
            continue
        elif category[0] == "M":
            # Only a letter carries a mark through the rewrites below. On a digit, symbol or
            # nothing it would end up glued to whatever word replaces its neighbour.
            if not on_letter:
                edits.append((i, i + 1, " "))
            continue
        elif ch == "−":  # U+2212 MINUS SIGN: one spelling of minus for the number patterns
            edits.append((i, i + 1, "-"))
        on_letter = ch.isalpha()
    text.edit(edits)
    text.sub(_WS_RE, " ")
    text.strip()


def _drop_unspeakable(text: _Tracked) -> None:
    """Symbols, emoji and unassigned or private code points become spaces.

    A combining mark is kept only on a letter or digit: stranded (its emoji base dropped, say) it
    would otherwise be read as a character name or break the phonemizer's word segmentation.
    """
    edits: list[Edit] = []
    on_base = False
    for i, ch in enumerate(text.text):
        category = unicodedata.category(ch)
        if category[0] == "M":
            # A space, not nothing, so the neighbours of a stranded mark stay apart.
            if not on_base:
                edits.append((i, i + 1, " "))
            continue
        if category[0] == "S" or category in ("Co", "Cn", "Cs") or ch in _DROP_PUNCTUATION:
            edits.append((i, i + 1, " "))
            on_base = False
            continue
        on_base = ch.isalnum()
    text.edit(edits)


# --------------------------------------------------------------------------------------------------
# espeak-ng guards. The espeak-ng 1.51 fork the voice was trained with keeps some per-word work in
# fixed-size stack buffers and overflows them on shapes any client can type, killing the process
# that runs it. The two shapes found are bounded here, far beyond any real word or abbreviation, so
# text a person would write passes unchanged. ``ttsvc.text.phonemize`` contains whatever is left.

_MAX_DOTTED_LETTERS = 8
"""Single letters one dotted abbreviation may join ("a.b.c", ". b . c" alike). espeak-ng copies
them into an 80-byte buffer to spell them; 8 letters of at most 4 UTF-8 bytes each stay far inside
it, and real abbreviations ("U.S.A.", "R.S.V.P.") are shorter."""
_MAX_WORD_CHARS = 64
"""Longest run without whitespace handed to espeak-ng. One word that repeats a suffix ("s's's'",
"s?s?s?") grows a 200-byte phoneme buffer by a few bytes per suffix; 32 two-character suffixes
stay inside it. The longest English dictionary words have 45 letters."""
_NON_SPACE_RUN_RE = re.compile(rf"\S{{{_MAX_WORD_CHARS + 1},}}")
# Where espeak-ng may end a clause: punctuation right after a word and before a space. A dot ends
# it only before a word that is not lowercase ("b. C"): "b. c" reads as an abbreviation going on,
# as does a dot anywhere else between two single letters ("b.c", "b .c", "b . c").
_CLAUSE_END_RE = re.compile(r"\S([.,;:!?])\s+")


def _in_word(ch: str) -> bool:
    return ch.isalnum() or unicodedata.category(ch)[0] == "M"


def _bound_words(text: _Tracked) -> None:
    """Cut every run of more than ``_MAX_WORD_CHARS`` non-space characters with spaces."""

    def cut(match: re.Match[str]) -> str:
        run, pieces, start = match.group(0), [], 0
        while len(run) - start > _MAX_WORD_CHARS:
            end = start + _MAX_WORD_CHARS
            # keep combining marks with their base letter
            while end - 1 > start and unicodedata.category(run[end])[0] == "M":
                end -= 1
            pieces.append(run[start:end])
            start = end
        pieces.append(run[start:])
        return " ".join(pieces)

    text.sub(_NON_SPACE_RUN_RE, cut)


def _ends_clause(text: str, start: int, end: int) -> bool:
    """Whether espeak-ng may end a clause in ``text[start:end]`` (``text[end]`` is not a space)."""
    return any(
        m.group(1) != "." or not text[m.end()].islower()
        for m in _CLAUSE_END_RE.finditer(text, start, end)
    )


def _bound_dotted_letters(tracked: _Tracked) -> None:
    """Break chains of more than ``_MAX_DOTTED_LETTERS`` dot-joined single letters with ", ".

    A single letter is one with no letter, digit or mark on either side. The comma ends espeak-ng's
    clause, and with it the abbreviation it was collecting.
    """
    text = tracked.text
    edits: list[Edit] = []
    chain = 0
    previous = -1  # index just past the previous single letter; -1: none yet
    last = len(text) - 1
    for i, ch in enumerate(text):
        if not ch.isalpha() or (i > 0 and _in_word(text[i - 1])):
            continue
        if i < last and _in_word(text[i + 1]):
            continue
        link = text[previous:i] if previous >= 0 else ""
        joined = (
            "." in link
            and not any(_in_word(c) for c in link)
            and not _ends_clause(text, previous - 1, i)
        )
        if not joined:
            chain = 1
        elif chain < _MAX_DOTTED_LETTERS:
            chain += 1
        else:
            edits.append((previous, i, ", "))
            chain = 1
        previous = i + 1
    tracked.edit(edits)


# --------------------------------------------------------------------------------------------------
# Public API.

# Order matters: the specific forms (dates, times, money, ...) must see their digits before the
# generic number pass turns every remaining digit run into words.
_PASSES: tuple[tuple[re.Pattern[str], Render], ...] = (
    (_ISO_DATE_RE, _render_date),
    (_US_DATE_RE, _render_date),
    (_TIME_RE, _render_time),
    (_HOUR_AMPM_RE, _render_hour_ampm),
    (_NUMBER_ABBR_RE, lambda _m: "number"),
    (_ABBREVIATION_RE, _render_abbreviation),
    (_BARE_VS_RE, lambda _m: "versus"),
    (_ACRONYM_RE, _render_acronym),
    (_INITIALS_RE, _render_initials),
    (_MONTH_DAY_RE, _render_month_day),
    (_CURRENCY_RE, _render_currency),
    (_TRAILING_CURRENCY_RE, _render_currency),
    (_PERCENT_RE, _render_percent),
    (_ORDINAL_RE, _render_ordinal),
    (_DECADE_RE, _render_decade),
    (_HASH_NUMBER_RE, lambda _m: "number"),
    (_FRACTION_RE, _render_fraction),
    (_LEADING_DOT_DECIMAL_RE, _render_leading_dot_decimal),
    (_NUMBER_RE, _render_number),
    (_DEGREES_RE, _render_degrees),
    (_SYMBOL_RE, _render_symbol),
)


def normalize(text: str) -> str:
    """Rewrite ``text`` as the words an en-US speaker would say, ready for espeak-ng.

    Never raises; may return "" when nothing speakable is left (see :func:`require_speakable`).
    """
    return _normalize(_Tracked(text, track=False)).text


def normalize_mapped(text: str) -> Normalized:
    """``normalize(text)`` with the span of ``text`` each of its characters came from."""
    tracked = _normalize(_Tracked(text))
    return Normalized(tracked.text, tuple(tracked.spans))


def _normalize(tracked: _Tracked) -> _Tracked:
    _clean(tracked)
    for pattern, render in _PASSES:
        _substitute(pattern, render, tracked)
    _drop_unspeakable(tracked)
    tracked.sub(_WS_RE, " ")
    tracked.sub(_SPACE_BEFORE_PUNCT_RE, "")
    # "1,2,3" became "one,two,three": give the phonemizer the pause a reader would make.
    tracked.sub(_WORD_COMMA_RE, ", ")
    tracked.nfc()
    tracked.strip()
    _bound_words(tracked)
    _bound_dotted_letters(tracked)
    return tracked


def _speakable(normalized: str) -> bool:
    return any(ch.isalnum() for ch in normalized)


def has_speakable(text: str) -> bool:
    """Whether ``text`` leaves at least one letter or digit (any script) once normalized."""
    return _speakable(normalize(text))


def require_speakable(text: str) -> str:
    """``normalize(text)``, or :class:`NothingToSay` when there is nothing left to speak.

    Raised up front so a request of only emoji or punctuation fails with a clear 422 instead of
    producing a silent (or empty) audio stream.
    """
    return require_speakable_mapped(text, track=False).text


def require_speakable_mapped(text: str, track: bool = True) -> Normalized:
    """``normalize_mapped(text)`` (spans only if ``track``), or :class:`NothingToSay`."""
    tracked = _normalize(_Tracked(text, track))
    if not _speakable(tracked.text):
        raise NothingToSay("text has nothing to speak after normalization", field="text")
    return Normalized(tracked.text, tuple(tracked.spans))
